"""``numbaconv bench``: time the passes of real layers, check them, compare with PyTorch.

Per layer and pass one row: the benchdnn-style descriptor, the strategy the planner chose,
the best time of ``repeat`` calls (more for fast layers, until a block has lasted
``timing.MIN_BLOCK_SECONDS``) after a warm-up call (so compilation is excluded), GFLOP/s,
the share of the dtype's compute peak (the machine's measured sgemm peak; float64's matmul;
twice the sgemm for bfloat16 where AVX512_BF16 does the dot products), the fraction of the
row's roofline (its FLOPs at that peak or its least bytes at the measured memory bandwidth, whichever takes
longer, over the measured time), the error against the float64 reference
(normalised as in docs/contract.md section 10) and, with ``--compare torch``, PyTorch's time on the same data
in the same process, each timed in blocks of its own after an untimed call (so that one
library's spinning idle threads do not land in the other's timings), two rounds each
(``--rounds``). The end of the table gives geometric means per pass.

One module per part:

* :mod:`.cli`: the options, the choice of layers, :func:`main`;
* :mod:`.runner`: the core loop :func:`run`, over an explicit list of
  :class:`numbaconv.suites.Layer` objects;
* :mod:`.timing`: the sgemm and compute peaks, the memory bandwidth, the roofline and the timed blocks;
* :mod:`.accuracy`: the error against the float64 reference;
* :mod:`.torch_peer`: PyTorch's side of a comparison;
* :mod:`.rows`: the :class:`Row` of each layer and pass, and the geometric means;
* :mod:`.console`: the table and the progress bar while it runs;
* :mod:`.host`: the allocator's state and the machine's description;
* :mod:`.outputs`: the JSON file and the plot.
"""
from .accuracy import check_error
from .cli import add_arguments, main, parse_args, select_layers
from .host import machine_info, steady_allocator
from .outputs import plot, write_json
from .rows import Row, summarize
from .runner import DEFAULT_REPEAT, DEFAULT_ROUNDS, DTYPES, run
from .timing import compute_peak, roof_fraction, sgemm_peak, stream_bandwidth, traffic_bytes
from .torch_peer import import_torch

__all__ = ["Row", "add_arguments", "check_error", "compute_peak", "import_torch", "machine_info", "main",
           "parse_args", "plot", "roof_fraction", "run", "select_layers", "sgemm_peak",
           "steady_allocator", "stream_bandwidth", "summarize", "traffic_bytes", "write_json", "DEFAULT_REPEAT", "DEFAULT_ROUNDS", "DTYPES"]
