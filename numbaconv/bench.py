"""``numbaconv bench``: time the passes of real layers, check them, compare with PyTorch.

Per layer and pass one row: the benchdnn-style descriptor, the strategy the planner chose,
the best time of ``repeat`` calls (more for fast layers, until a block has lasted
``MIN_BLOCK_SECONDS``) after a warm-up call (so compilation is excluded), GFLOP/s,
the share of the machine's measured sgemm peak, the error against the float64 reference
(normalised as SPEC section 3) and, with ``--compare torch``, PyTorch's time on the same data
in the same process, each timed in blocks of its own after an untimed call (so that one
library's spinning idle threads do not land in the other's timings), two rounds each
(``--rounds``). The
end of the table gives geometric means per pass.

The core loop is :func:`run`, which takes an explicit list of
:class:`numbaconv.suites.Layer` objects; :func:`main` only selects the layers, measures the
peak and writes the outputs.
"""
import argparse
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
import json
import math
import os
import platform
import sys
import time

import numpy as np

from . import reference as R
from . import suites
from .planner import STRATEGY_NAMES

DTYPES = ("float32", "float16", "float64")
DEFAULT_REPEAT = 5
#: Rounds of timed blocks per pass (numbaconv's and PyTorch's blocks alternate in each).
DEFAULT_ROUNDS = 2

#: Size of the square float32 matmul whose best time defines "100 %" (PERF_NOTES: numpy's
#: sgemm 2048^3 is the practical peak). Tests shrink it.
SGEMM_N = 2048
SGEMM_REPEAT = 3

#: Relative difference from PyTorch above which a row is flagged. Both compute the same
#: float sums in different orders, so they agree to a few ulps times sqrt(terms); float16
#: results are rounded to 11 bits, so a float16 row gets float16's own tolerance.
TORCH_MISMATCH = {"float64": 1e-3, "float32": 1e-3, "float16": 1e-2}

TORCH_HINT = ("--compare torch: PyTorch is not installed; `pip install torch==2.13.0` "
              "installs the CPU build (from PyPI on Linux/x86-64 use "
              "`--index-url https://download.pytorch.org/whl/cpu` to skip the CUDA libraries). "
              "Benchmarking numbaconv alone.")
PLOT_HINT = ("--plot: matplotlib is not installed; `pip install matplotlib` (or "
             "`pip install numbaconv[bench]`). Running without the plot.")


def _label(r):
    if not r.strategy:
        return "-"
    return f"{r.strategy}[{r.variant}]" if r.variant else r.strategy


@dataclass
class Row:
    """One layer and pass. Times in ms; ``None`` where a number does not apply.

    ``ratio`` is ``torch_ms / ms``: above 1, numbaconv is faster. ``error`` is the normalised
    error against the float64 reference on the batch-1 slice of the layer, ``tolerance``
    SPEC's bound for the dtype and strategy, ``torch_diff`` the normalised difference from
    PyTorch's result on the full layer. ``variant`` names the strategy's implementation
    where several share its name (``gemm`` ``col2im``, ``direct`` ``depthwise``).
    """

    suite: str
    layer: str
    descriptor: str
    direction: str
    dtype: str
    strategy: str = None
    variant: str = ""
    threads: int = None
    flops: int = 0
    ms: float = None
    gflops: float = None
    peak_pct: float = None
    error: float = None
    tolerance: float = None
    torch_ms: float = None
    torch_gflops: float = None
    ratio: float = None
    torch_diff: float = None
    note: str = ""

    @property
    def error_ok(self):
        return self.error is None or self.error <= self.tolerance

    @property
    def torch_ok(self):
        return self.torch_diff is None or self.torch_diff <= TORCH_MISMATCH[self.dtype]


# ---------------------------------------------------------------------------- arguments

def add_arguments(parser):
    """Add the options of ``numbaconv bench`` to an :class:`argparse.ArgumentParser`."""
    parser.add_argument("--suite", default="resnet50", choices=[*suites.SUITES, "all"],
                        help="layer suite (default: resnet50)")
    parser.add_argument("--layers", nargs="+", metavar="NAME",
                        help="only these layers of the suite (by name, e.g. res4b_branch2b)")
    parser.add_argument("--pass", dest="passes", nargs="+", default=["bwd_d", "bwd_w"],
                        choices=list(suites.PASSES), metavar="PASS",
                        help="passes to time: bwd_d bwd_w fwd (default: bwd_d bwd_w)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="threads for numbaconv, PyTorch and the sgemm peak (default: "
                             "Numba's default)")
    parser.add_argument("--strategy", default=None, choices=list(STRATEGY_NAMES),
                        help="force a strategy (layers it declines are reported and skipped)")
    parser.add_argument("--compare", default=None, choices=["torch"],
                        help="also time PyTorch (CPU) on the same data, in the same process")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help=f"timed calls per pass after the warm-up, best is reported "
                             f"(default: {DEFAULT_REPEAT}, 1 with --quick)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, metavar="N",
                        help=f"rounds of timed blocks per pass, numbaconv's and PyTorch's "
                             f"alternating (default: {DEFAULT_ROUNDS}); more rounds ride out "
                             f"a host whose memory bandwidth comes and goes")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one timed call per pass and a one-shot sgemm peak")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the error against the float64 reference")
    parser.add_argument("--json", metavar="FILE", help="write machine info and all rows")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="bar chart of GFLOP/s per layer (needs matplotlib)")
    parser.add_argument("--malloc", default="steady", choices=["steady", "as-is"],
                        help="steady (default): fix glibc's mmap threshold at 32 MiB and its "
                             "trim threshold at 64 MiB, the state a long-running process "
                             "reaches, for both libraries; as-is: leave malloc alone")
    return parser


def select_layers(suite="resnet50", names=None):
    """The layers of ``suite`` (or ``"all"``), restricted to ``names`` in that order.

    Raises
    ------
    ValueError
        For a name the suite does not have (the message lists the suite's names).
    """
    pool = suites.layers(suite)
    if not names:
        return tuple(pool)
    by_name = {lay.name: lay for lay in pool}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"--layers: {', '.join(unknown)} not in suite {suite!r}; its layers: "
                         f"{' '.join(by_name)}")
    return tuple(by_name[n] for n in names)


# ---------------------------------------------------------------------------- measuring

def sgemm_peak(threads=None, repeat=SGEMM_REPEAT, n=None):
    """Best GFLOP/s of numpy float32 ``n x n x n`` matmuls: the practical 100 %.

    Parameters
    ----------
    threads : int, optional
        Limit NumPy's BLAS to this many threads (needs ``threadpoolctl``; without it the
        BLAS runs with its default thread count, which the second result says).
    repeat : int
        Timed matmuls after one warm-up; the best counts.
    n : int, optional
        Matrix size (default :data:`SGEMM_N`).

    Returns
    -------
    (float, str)
        GFLOP/s and how the BLAS threads were set.
    """
    n = n or SGEMM_N
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    limit, how = nullcontext(), "BLAS default threads (install threadpoolctl to match --threads)"
    if threads is not None:
        try:
            from threadpoolctl import threadpool_limits
            limit, how = threadpool_limits(limits=threads, user_api="blas"), \
                f"{threads} BLAS thread(s)"
        except ImportError:
            pass
    best = math.inf
    with limit:
        a @ b  # warm-up: BLAS thread start-up and page faults of the result
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9, how


def import_torch():
    """PyTorch, or ``None`` when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


class _TorchPass:
    """One pass of a layer in PyTorch: tensors converted once, outside the timed region.

    Data goes to NCHW (NCDHW, NCW) tensors in ``channels_last`` (``channels_last_3d``) memory
    format, as a user of a channels-last model would run it; filters go from XIO to OIX.
    Asymmetric pads (TF's SAME at stride 2) are not expressible in PyTorch's convolution, so
    the input is pre-padded once and PyTorch runs with padding 0: the arithmetic is the same.
    """

    def __init__(self, torch, layer, direction, arrays):
        F = torch.nn.functional
        x, w, dy = arrays
        nd = layer.nd
        fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(nd)

        def tensor(a):
            t = torch.from_numpy(np.ascontiguousarray(a))
            return t.contiguous(memory_format=fmt) if fmt is not None else t

        xt = tensor(np.moveaxis(x, -1, 1))
        dyt = tensor(np.moveaxis(dy, -1, 1))
        wt = tensor(np.transpose(w, (nd + 1, nd, *range(nd))))
        self.crop = None
        if layer.symmetric:
            padding = list(layer.pad_begin)
        else:
            # F.pad takes (begin, end) pairs from the last dim backwards.
            pads = [v for b, e in zip(reversed(layer.pad_begin), reversed(layer.pad_end))
                    for v in (b, e)]
            xt = F.pad(xt, pads)
            if fmt is not None:
                xt = xt.contiguous(memory_format=fmt)
            padding = [0] * nd
            self.crop = tuple(slice(b, b + i) for b, i in zip(layer.pad_begin, layer.isz))
        stride, dilation, g = list(layer.stride), list(layer.dilation), layer.g
        backward = torch.ops.aten.convolution_backward
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        if direction == "fwd":
            self.fn = lambda: conv(xt, wt, None, stride, padding, dilation, g)
        elif direction == "bwd_d":
            self.fn = lambda: backward(dyt, xt, wt, None, stride, padding, dilation, False,
                                       [0] * nd, g, [True, False, False])[0]
        else:
            self.fn = lambda: backward(dyt, xt, wt, None, stride, padding, dilation, False,
                                       [0] * nd, g, [False, True, False])[1]
        self.direction, self.nd = direction, nd

    def as_numbaconv(self, result):
        """PyTorch's result in numbaconv's layout (channels last, XIO filters)."""
        a = result.detach().numpy()
        if self.direction == "bwd_w":
            return np.transpose(a, (*range(2, self.nd + 2), 1, 0))
        a = np.moveaxis(a, 1, -1)
        if self.direction == "bwd_d" and self.crop is not None:
            a = a[(slice(None), *self.crop)]
        return a


def _reference(layer, direction, arrays):
    """Float64 reference and its on-absolute-values companion (SPEC section 3's scale)."""
    x, w, dy = (np.asarray(a, np.float64) for a in arrays)
    geo = (layer.stride, layer.dilation, layer.pad_begin, layer.pad_end, layer.g)
    if direction == "fwd":
        return R.conv_fwd(x, w, *geo), R.conv_fwd(abs(x), abs(w), *geo)
    if direction == "bwd_d":
        return (R.conv_bwd_data(dy, w, layer.isz, *geo),
                R.conv_bwd_data(abs(dy), abs(w), layer.isz, *geo))
    return (R.conv_bwd_filter(x, dy, layer.ksz, *geo),
            R.conv_bwd_filter(abs(x), abs(dy), layer.ksz, *geo))


def _numbaconv_fn(c, strategy):
    import numbaconv
    fn = getattr(numbaconv, c.op)
    return lambda: fn(*c.args, strategy=strategy, **c.kwargs)


def check_error(layer, direction, arrays, strategy, full_result=None):
    """Normalised error of numbaconv against the float64 reference on the batch-1 slice.

    The float64 reference of a whole layer is slow, so only batch entry 0 is checked. Batch
    entries are independent in ``fwd`` and ``bwd_d``, so there the first entry of the timed
    call's own result is compared; ``bwd_w`` sums over the batch, so it is called again on the
    slice with the same strategy forced.

    Returns
    -------
    (float, str)
        The error and a note (empty unless the slice had to use another strategy).
    """
    x, w, dy = arrays
    one = replace(layer, mb=1)
    sliced = (x[:1], w, dy[:1])
    note = ""
    if direction in ("fwd", "bwd_d") and full_result is not None:
        got = np.asarray(full_result)[:1]
    else:
        c = suites.call(one, direction, arrays=sliced)
        try:
            got = _numbaconv_fn(c, strategy)()
        except ValueError as exc:  # the forced strategy declines the batch-1 problem
            got = _numbaconv_fn(c, None)()
            note = f"checked with the default strategy ({exc})"
    ref, ref_abs = _reference(one, direction, sliced)
    return R.normalized_error(got, ref, ref_abs), note


#: Seconds of rest before each contender's block: OpenBLAS workers busy-wait for about
#: 2^28 cycles after a call and OpenMP workers spin too; resting lets them go to sleep.
IDLE_PAUSE = 0.3


#: Each contender's timed calls in a block last at least this long (more calls than
#: ``repeat`` for fast layers). After the idle pause a virtual CPU comes back slowly: a
#: 1.3 ms call measured 2.1 ms as the best of 10 right after a 0.3 s rest, 1.6 ms as the
#: best of 30 and 1.3 ms as the best of 100, for numbaconv and PyTorch alike.
MIN_BLOCK_SECONDS = 0.25
#: ... but never more calls than this per block.
MAX_BLOCK_CALLS = 400


def _blocked(fns, repeat, rounds=2):
    """Best ``time.perf_counter`` seconds of each function: ``rounds`` rounds in which each
    function gets an untimed call and then timed calls in a row: ``repeat`` of them, and
    more until the block has lasted ``MIN_BLOCK_SECONDS`` (at most ``MAX_BLOCK_CALLS``).

    Timing each contender in a block of its own, after an untimed call, keeps one library's
    idle worker threads (OpenMP and OpenBLAS pools spin for a while after each parallel
    call) from landing in the other's timed calls: measured here, alternating call by call
    slowed both sides by up to 1.6x. Two rounds spread a noisy neighbour over both.
    """
    best = [math.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            if len(fns) > 1:
                time.sleep(IDLE_PAUSE)
            fn()
            start, calls = time.perf_counter(), 0
            while calls < max(repeat, 1) or (time.perf_counter() - start < MIN_BLOCK_SECONDS
                                             and calls < MAX_BLOCK_CALLS):
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
                calls += 1
    return best


# ---------------------------------------------------------------------------- progress

class _Counter:
    """The fallback when tqdm is missing: ``[i/n] label`` on stderr (terminals only)."""

    def __init__(self, total, live=None):
        self.total, self.n, self.label = total, 0, ""
        self.live = sys.stderr.isatty() if live is None else live

    def _draw(self):
        if self.live:
            sys.stderr.write(f"\r\x1b[K[{self.n}/{self.total}] {self.label}")
            sys.stderr.flush()

    def set_description_str(self, label):
        self.label = label
        self._draw()

    def update(self, k=1):
        self.n += k
        self._draw()

    def write(self, line):
        if self.live:
            sys.stderr.write("\r\x1b[K")
        print(line, flush=True)
        self._draw()

    def close(self):
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _progress(total, enabled):
    """A tqdm bar on stderr (rows are written above it), else a counter, else nothing."""
    if not enabled:
        return _Counter(total, live=False)
    try:
        from tqdm import tqdm
    except ImportError:
        return _Counter(total)

    class _Bar(tqdm):
        def write(self, line):
            tqdm.write(line, file=sys.stdout)

    # disable=None: tqdm turns itself off when stderr is not a terminal (logs, CI).
    return _Bar(total=total, file=sys.stderr, unit="pass", disable=None, leave=False)


# ---------------------------------------------------------------------------- table

def _fmt(v, spec, width):
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{spec}}"


class _Table:
    def __init__(self, layers, torch_on):
        self.dw = max([len(lay.descriptor()) for lay in layers] + [10])
        self.torch_on = torch_on

    def header(self):
        h = (f"{'pass':<6} {'descriptor':<{self.dw}} {'strategy':<17} {'ms':>9} "
             f"{'GFLOP/s':>8} {'%peak':>6} {'error':>8}")
        if self.torch_on:
            h += f" | {'torch ms':>9} {'GFLOP/s':>8} {'ratio':>6} {'vs torch':>8}"
        return h

    def row(self, r):
        s = (f"{r.direction:<6} {r.descriptor:<{self.dw}} {_label(r):<17} "
             f"{_fmt(r.ms, '.2f', 9)} {_fmt(r.gflops, '.2f', 8)} {_fmt(r.peak_pct, '.1f', 6)} "
             f"{_fmt(r.error, '.1e', 8)}")
        if self.torch_on:
            s += (f" | {_fmt(r.torch_ms, '.2f', 9)} {_fmt(r.torch_gflops, '.2f', 8)} "
                  f"{_fmt(r.ratio, '.2f', 6)} {_fmt(r.torch_diff, '.1e', 8)}")
        flags = []
        if not r.error_ok:
            flags.append(f"ERROR {r.error:.1e} > tolerance {r.tolerance:.0e}")
        if not r.torch_ok:
            flags.append(f"DIFFERS FROM TORCH by {r.torch_diff:.1e} "
                         f"(> {TORCH_MISMATCH[r.dtype]:.0e})")
        if r.note:
            flags.append(r.note)
        return s + ("  " + "; ".join(flags) if flags else "")


# ---------------------------------------------------------------------------- core loop

def run(layers, passes=("bwd_d", "bwd_w"), dtype="float32", repeat=DEFAULT_REPEAT,
        strategy=None, check=True, torch=None, peak=None, progress=True, echo=True,
        rounds=DEFAULT_ROUNDS):
    """Time ``passes`` of ``layers``; the core of ``numbaconv bench``.

    Parameters
    ----------
    layers : sequence of numbaconv.suites.Layer
        The layers (any, not only the suites'); data are seeded random.
    passes : sequence of {"bwd_d", "bwd_w", "fwd"}
    dtype : {"float32", "float16", "float64"}
    repeat : int
        Timed calls after the warm-up call; the best counts.
    strategy : {"direct", "gemm", "winograd"}, optional
        Force a strategy; a layer it declines gets a row with a note and no numbers.
    check : bool
        Compute the error against the float64 reference (batch-1 slice, see
        :func:`check_error`).
    torch : module, optional
        PyTorch to time alongside (from :func:`import_torch`); ``None``: numbaconv alone.
    peak : float, optional
        sgemm GFLOP/s for the ``peak_pct`` column.
    progress : bool
        Show a progress bar (tqdm, else a counter) on stderr while it runs.
    echo : bool
        Print the table (header, one line per row as it completes) on stdout.
    rounds : int
        Rounds of timed blocks per pass (see :func:`_blocked`); the best call counts.

    Returns
    -------
    list of Row
    """
    import numbaconv

    passes = list(passes)
    bad = [p for p in passes if p not in suites.PASSES]
    if bad:
        raise ValueError(f"passes: expected some of {list(suites.PASSES)}, got {bad}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {dtype!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected a positive count, got {rounds!r}")
    table = _Table(layers, torch is not None)
    bar = _progress(len(layers) * len(passes), progress)
    emit = bar.write if echo else (lambda line: None)
    emit(table.header())
    rows = []
    no_grad = torch.no_grad() if torch is not None else nullcontext()
    try:
        with no_grad:
            for layer in layers:
                # One set of seeded data per layer, shared by its passes and by PyTorch.
                arrays = suites.tensors(layer, dtype)
                for direction in passes:
                    bar.set_description_str(f"{layer.name} {direction}")
                    row = _run_one(numbaconv, layer, direction, dtype, arrays, repeat,
                                   strategy, check, torch, peak, rounds)
                    rows.append(row)
                    emit(table.row(row))
                    bar.update(1)
    finally:
        bar.close()
    return rows


def _run_one(numbaconv, layer, direction, dtype, arrays, repeat, strategy, check, torch,
             peak, rounds=DEFAULT_ROUNDS):
    c = suites.call(layer, direction, dtype, arrays=arrays)
    row = Row(suite=layer.suite, layer=layer.name, descriptor=layer.descriptor(),
              direction=direction, dtype=dtype, flops=layer.flops,
              threads=numbaconv.get_num_threads())
    try:
        plan = numbaconv.plan(c.op, *c.args, strategy=strategy, **c.kwargs)
    except ValueError as exc:  # a forced strategy that declines this layer
        row.note = f"skipped: {exc}"
        return row
    row.strategy = plan.strategy
    row.variant = plan.variant
    row.tolerance = (R.WINOGRAD_TOLERANCE if plan.strategy == "winograd"
                     else R.TOLERANCE)[dtype]
    nc_fn = _numbaconv_fn(c, strategy)
    got = nc_fn()  # warm-up: compiles (or loads) the kernels; its result is checked below

    tp = None
    if torch is not None:
        try:
            tp = _TorchPass(torch, layer, direction, arrays)
            want = tp.as_numbaconv(tp.fn())  # warm-up, and the sanity check's operand
            if want.shape == np.shape(got):
                row.torch_diff = R.normalized_error(got, want.astype(np.float64), want)
            else:
                row.note = f"torch result shape {want.shape} != {np.shape(got)}: not compared"
            del want
        except Exception as exc:  # e.g. a dtype PyTorch's CPU convolution lacks
            tp = None
            row.note = f"torch failed: {type(exc).__name__}: {exc}"

    if check:
        row.error, note = check_error(layer, direction, arrays, plan.strategy, got)
        row.note = "; ".join(n for n in (row.note, note) if n)
    del got

    fns = [nc_fn] + ([tp.fn] if tp is not None else [])
    best = _blocked(fns, repeat, rounds)
    row.ms = best[0] * 1e3
    row.gflops = layer.flops / best[0] / 1e9
    if peak:
        row.peak_pct = 100.0 * row.gflops / peak
    if tp is not None:
        row.torch_ms = best[1] * 1e3
        row.torch_gflops = layer.flops / best[1] / 1e9
        row.ratio = best[1] / best[0]
    return row


# ---------------------------------------------------------------------------- summary

def _geomean(values):
    v = [x for x in values if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def summarize(rows):
    """Geometric means per pass: ``{pass: {"gflops", "torch_gflops", "ratio", "n"}}``."""
    out = {}
    for direction in dict.fromkeys(r.direction for r in rows):
        rs = [r for r in rows if r.direction == direction and r.ms is not None]
        out[direction] = {"n": len(rs),
                          "gflops": _geomean(r.gflops for r in rs),
                          "torch_gflops": _geomean(r.torch_gflops for r in rs),
                          "ratio": _geomean(r.ratio for r in rs)}
    return out


def _summary_lines(summary, peak):
    lines = ["geometric means:"]
    for direction, s in summary.items():
        if not s["n"]:
            lines.append(f"  {direction:<6} no timed rows")
            continue
        line = f"  {direction:<6} numbaconv {s['gflops']:.2f} GFLOP/s"
        if peak:
            line += f" ({100 * s['gflops'] / peak:.1f}% of sgemm)"
        if s["torch_gflops"] is not None:
            line += (f", torch {s['torch_gflops']:.2f} GFLOP/s, "
                     f"ratio torch_ms/numbaconv_ms {s['ratio']:.2f}")
        lines.append(line + f"  [{s['n']} layer(s)]")
    return lines


# ---------------------------------------------------------------------------- outputs

#: glibc's ``mallopt`` parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


def steady_allocator():
    """Put glibc's malloc in the state a long-running process reaches; returns a note
    (``None`` where this is not glibc).

    glibc serves allocations above its mmap threshold with fresh mappings, faulted in and
    zero-filled page by page, and raises the threshold (to at most 32 MiB, the trim
    threshold to twice that) each time such a block is freed. So a library's time for a
    10-30 MB result depended on what the process had freed before: PyTorch's wavenet_4
    backward data took 7.5-11.5 ms in a fresh process (3000 page faults per call) and
    2.5-2.8 ms once the threshold had risen, as it had in a full bench run when earlier
    layers happened to free larger blocks. Fixing both thresholds at their adapted values
    makes every row independent of the rows before it, for both libraries alike (blocks
    over 32 MiB are still fresh mappings: numbaconv recycles its own, see
    :mod:`numbaconv.memory`)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version().decode()
        ok = (libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
              and libc.mallopt(M_TRIM_THRESHOLD, 64 << 20) == 1)
    except (OSError, AttributeError):
        return None
    return f"glibc {version}: mmap threshold 32 MiB, trim threshold 64 MiB" if ok else None


def machine_info(threads, peak=None, peak_how="", torch=None, allocator=None):
    """What the numbers were measured on, for the JSON file."""
    import numba
    import numbaconv
    from .machine import machine

    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel function has run yet
        layer = None
    info = {
        "cpu": machine().cpu_name,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "threads": threads,
        "threading_layer": layer,
        "python": platform.python_version(),
        "numbaconv": numbaconv.__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "sgemm_peak_gflops": peak,
        "sgemm_peak_how": peak_how,
        "allocator": allocator,
    }
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def write_json(path, info, rows, summary, options):
    """Write machine info, options, rows (all their numbers) and the per-pass summary."""
    doc = {"machine": info, "options": options,
           "rows": [dict(asdict(r), error_ok=r.error_ok, torch_ok=r.torch_ok) for r in rows],
           "summary": summary}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def plot(path, rows, peak=None):
    """Bar chart of GFLOP/s per layer, one panel per pass, numbaconv beside PyTorch.

    Uses matplotlib's object API (no pyplot), so no global backend is touched.
    """
    from matplotlib.figure import Figure

    directions = list(dict.fromkeys(r.direction for r in rows))
    fig = Figure(figsize=(max(6.0, 0.55 * len(rows) / max(len(directions), 1) + 2),
                          3.2 * len(directions)), layout="constrained")
    axes = fig.subplots(len(directions), 1, squeeze=False)[:, 0]
    for ax, direction in zip(axes, directions):
        rs = [r for r in rows if r.direction == direction]
        pos = np.arange(len(rs))
        has_torch = any(r.torch_gflops is not None for r in rs)
        width = 0.4 if has_torch else 0.8
        ax.bar(pos - (width / 2 if has_torch else 0), [r.gflops or 0 for r in rs], width,
               label="numbaconv")
        if has_torch:
            ax.bar(pos + width / 2, [r.torch_gflops or 0 for r in rs], width, label="PyTorch")
        if peak:
            ax.axhline(peak, color="gray", linestyle="--", linewidth=1,
                       label=f"sgemm {peak:.0f}")
        ax.set_xticks(pos, [r.layer for r in rs], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("GFLOP/s")
        ax.set_title(f"{direction} ({rs[0].dtype})" if rs else direction)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------- main

def main(args, layers=None):
    """Run ``numbaconv bench`` with parsed arguments (see :func:`add_arguments`).

    Parameters
    ----------
    args : argparse.Namespace
    layers : sequence of numbaconv.suites.Layer, optional
        Benchmark these instead of the suite's (tests, scripts).

    Returns
    -------
    int
        0; 1 when a row's error exceeds its tolerance; 2 for bad arguments.
    """
    import numbaconv

    try:
        if layers is None:
            layers = select_layers(args.suite, args.layers)
        if args.threads is not None:
            numbaconv.set_num_threads(args.threads)
        repeat = args.repeat if args.repeat is not None else (1 if args.quick else
                                                              DEFAULT_REPEAT)
        if repeat < 1:
            raise ValueError(f"--repeat: expected a positive count, got {repeat}")
        rounds = getattr(args, "rounds", DEFAULT_ROUNDS)
        if rounds < 1:
            raise ValueError(f"--rounds: expected a positive count, got {rounds}")
    except (TypeError, ValueError) as exc:
        print(f"numbaconv bench: {exc}", file=sys.stderr)
        return 2
    threads = numbaconv.get_num_threads()

    torch = None
    if args.compare == "torch":
        torch = import_torch()
        if torch is None:
            print(TORCH_HINT, file=sys.stderr)
        else:
            # Same thread count for both, or the ratio compares thread pools, not kernels.
            torch.set_num_threads(threads)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(PLOT_HINT, file=sys.stderr)
            args.plot = None

    allocator = steady_allocator() if getattr(args, "malloc", "steady") == "steady" else None
    peak, how = sgemm_peak(threads, repeat=1 if args.quick else SGEMM_REPEAT)
    print(f"numbaconv {numbaconv.__version__}: {len(layers)} layer(s), "
          f"{' '.join(args.passes)}, {args.dtype}, {threads} thread(s), best of {repeat} "
          f"or more calls (blocks of at least {MIN_BLOCK_SECONDS:g} s, {rounds} round(s)) "
          f"after a warm-up" + (f", strategy {args.strategy}" if args.strategy else ""))
    print(f"sgemm peak {peak:.1f} GFLOP/s (numpy float32 matmul {SGEMM_N}^3, {how})")
    print(f"malloc: {allocator or 'as it is'}")
    if torch is not None:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
              f"channels-last; ratio = torch ms / numbaconv ms (> 1: numbaconv faster); "
              f"vs torch = normalised difference of the results")
    if args.check:
        print("error: vs the float64 reference on the batch-1 slice (SPEC section 3)")

    rows = run(layers, args.passes, args.dtype, repeat=repeat, strategy=args.strategy,
               check=args.check, torch=torch, peak=peak, rounds=rounds)
    summary = summarize(rows)
    for line in _summary_lines(summary, peak):
        print(line)

    failed = [r for r in rows if not r.error_ok]
    differ = [r for r in rows if not r.torch_ok]
    if failed:
        print(f"numbaconv bench: {len(failed)} row(s) above the error tolerance: "
              f"{', '.join(f'{r.layer} {r.direction}' for r in failed)}", file=sys.stderr)
    if differ:
        print(f"numbaconv bench: WARNING: {len(differ)} row(s) differ from PyTorch by more than "
              f"{TORCH_MISMATCH[args.dtype]:.0e}: "
              f"{', '.join(f'{r.layer} {r.direction}' for r in differ)}", file=sys.stderr)

    if args.json:
        options = {k: v for k, v in vars(args).items() if k not in ("func", "cmd")}
        options["repeat"] = repeat
        options["rounds"] = rounds
        write_json(args.json, machine_info(threads, peak, how, torch, allocator), rows, summary,
                   options)
        print(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, rows, peak)
        print(f"wrote {args.plot}")
    return 1 if failed else 0


def parse_args(argv=None):
    """Parse ``numbaconv bench`` options on their own (``python -m numbaconv.bench``)."""
    parser = argparse.ArgumentParser(prog="numbaconv bench", description=__doc__.split("\n")[0])
    return add_arguments(parser).parse_args(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(parse_args()))
