"""The core loop: every pass of every layer planned, checked, and timed (beside PyTorch)."""
from contextlib import nullcontext

import numpy as np

from .. import reference as R
from .. import suites
from .accuracy import check_error, numbaconv_fn
from .console import Table, progress as _progress
from .rows import Row
from .timing import blocked, roof_fraction, traffic_bytes
from .torch_peer import TorchPass, torch_layouts

DTYPES = ("float32", "float16", "float64", "bfloat16")
DEFAULT_REPEAT = 5
#: Rounds of timed blocks per pass (numbaconv's and PyTorch's blocks alternate in each).
DEFAULT_ROUNDS = 2


def run(layers, passes=("bwd_d", "bwd_w"), dtype="float32", repeat=DEFAULT_REPEAT,
        strategy=None, check=True, torch=None, peak=None, progress=True, echo=True,
        rounds=DEFAULT_ROUNDS, bandwidth=None, torch_layout="faster"):
    """Time ``passes`` of ``layers``; the core of ``numbaconv bench``.

    Parameters
    ----------
    layers : sequence of numbaconv.suites.Layer
        The layers (any, not only the suites'); data are seeded random.
    passes : sequence of {"bwd_d", "bwd_w", "fwd"}
    dtype : {"float32", "float16", "float64", "bfloat16"}
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
        The dtype's compute peak, GFLOP/s (:func:`numbaconv.bench.timing.compute_peak`), for
        the ``peak_pct`` column and the roofline's compute roof.
    bandwidth : float, optional
        Memory GB/s (:func:`numbaconv.bench.timing.stream_bandwidth`): with ``peak``, the
        ``roof`` column.
    progress : bool
        Show a progress bar (tqdm, else a counter) on stderr while it runs.
    echo : bool
        Print the table (header, one line per row as it completes) on stdout.
    rounds : int
        Rounds of timed blocks per pass (see :func:`numbaconv.bench.timing.blocked`); the best call counts.
    torch_layout : {"faster", "channels-last", "nchw"}
        PyTorch's memory format: ``faster`` times both, each in blocks of its own, and keeps
        the faster per row (its name in the row's ``torch_layout``).

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
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: F401  (registers the dtype the operands are cast to)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected a positive count, got {rounds!r}")
    torch_layouts(torch_layout, 2)  # a bad choice fails before any layer runs
    table = Table(layers, torch is not None)
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
                                   strategy, check, torch, peak, rounds, bandwidth,
                                   torch_layout)
                    rows.append(row)
                    emit(table.row(row))
                    bar.update(1)
    finally:
        bar.close()
    return rows


def _run_one(numbaconv, layer, direction, dtype, arrays, repeat, strategy, check, torch,
             peak, rounds=DEFAULT_ROUNDS, bandwidth=None, torch_layout="faster"):
    c = suites.call(layer, direction, dtype, arrays=arrays)
    row = Row(suite=layer.suite, layer=layer.name, descriptor=layer.descriptor(),
              direction=direction, dtype=dtype, flops=layer.flops,
              threads=numbaconv.get_num_threads(),
              bytes=traffic_bytes(layer, direction, np.dtype(dtype).itemsize))
    try:
        plan = numbaconv.plan(c.op, *c.args, strategy=strategy, **c.kwargs)
    except ValueError as exc:  # a forced strategy that declines this layer
        row.note = f"skipped: {exc}"
        return row
    row.strategy = plan.strategy
    row.variant = plan.variant
    row.tolerance = (R.WINOGRAD_TOLERANCE if plan.strategy == "winograd"
                     else R.TOLERANCE)[dtype]
    nc_fn = numbaconv_fn(c, strategy)
    got = nc_fn()  # warm-up: compiles (or loads) the kernels; its result is checked below

    tps = []
    if torch is not None:
        try:
            for layout in torch_layouts(torch_layout, layer.nd):
                tp = TorchPass(torch, layer, direction, arrays, layout)
                want = tp.as_numbaconv(tp.fn())  # warm-up, and the sanity check's operand
                if want.shape == np.shape(got):
                    diff = R.normalized_error(got, want.astype(np.float64), want)
                    row.torch_diff = max(diff, row.torch_diff or 0.0)
                else:
                    row.note = (f"torch result shape {want.shape} != {np.shape(got)}: "
                                f"not compared")
                del want
                tps.append(tp)
        except Exception as exc:  # e.g. a dtype PyTorch's CPU convolution lacks
            tps = []
            row.note = f"torch failed: {type(exc).__name__}: {exc}"

    if check:
        row.error, note = check_error(layer, direction, arrays, plan.strategy, got)
        row.note = "; ".join(n for n in (row.note, note) if n)
    del got

    fns = [nc_fn] + [tp.fn for tp in tps]
    best = blocked(fns, repeat, rounds)
    row.ms = best[0] * 1e3
    row.gflops = layer.flops / best[0] / 1e9
    if peak:
        row.peak_pct = 100.0 * row.gflops / peak
    row.roof = roof_fraction(layer.flops, row.bytes, best[0], peak, bandwidth)
    if tps:
        i = min(range(len(tps)), key=lambda j: best[1 + j])
        row.torch_layout = tps[i].layout
        row.torch_ms = best[1 + i] * 1e3
        row.torch_gflops = layer.flops / best[1 + i] / 1e9
        row.ratio = best[1 + i] / best[0]
    return row
