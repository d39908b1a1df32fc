"""``numbaconv bench``: time the passes of real layers, check them, compare with PyTorch.

The command line: its options, the choice of layers, and :func:`main`, which measures the
peak, runs the core loop (:func:`numbaconv.bench.runner.run`) and writes the outputs.
"""
import argparse
import sys

from .. import suites
from ..planner import STRATEGY_NAMES
from . import timing
from .host import machine_info, steady_allocator
from .outputs import plot, write_json
from .rows import TORCH_MISMATCH, summarize, summary_lines
from .runner import DEFAULT_REPEAT, DEFAULT_ROUNDS, DTYPES, run
from .torch_peer import TORCH_HINT, TORCH_LAYOUTS, import_torch

PLOT_HINT = ("--plot: matplotlib is not installed; `pip install matplotlib` (or "
             "`pip install numbaconv[bench]`). Running without the plot.")


def add_arguments(parser):
    """Add the options of ``numbaconv bench`` to an :class:`argparse.ArgumentParser`."""
    parser.add_argument("--suite", default="resnet50", choices=[*suites.SUITES, *suites.EXTRA_SUITES, "all"],
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
    parser.add_argument("--torch-layout", default="faster", choices=list(TORCH_LAYOUTS),
                        help="PyTorch's memory format with --compare torch: faster (default) "
                             "times channels-last and NCHW and keeps the faster per row")
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
    peak, how = timing.sgemm_peak(threads, repeat=1 if args.quick else timing.SGEMM_REPEAT)
    cpeak, cpeak_how = timing.compute_peak(peak, args.dtype, threads,
                                           repeat=1 if args.quick else timing.SGEMM_REPEAT)
    bandwidth, bw_how = timing.stream_bandwidth(threads, repeat=1 if args.quick else
                                                timing.STREAM_REPEAT)
    print(f"numbaconv {numbaconv.__version__}: {len(layers)} layer(s), "
          f"{' '.join(args.passes)}, {args.dtype}, {threads} thread(s), best of {repeat} "
          f"or more calls (blocks of at least {timing.MIN_BLOCK_SECONDS:g} s, {rounds} round(s)) "
          f"after a warm-up" + (f", strategy {args.strategy}" if args.strategy else ""))
    print(f"sgemm peak {peak:.1f} GFLOP/s (numpy float32 matmul {timing.SGEMM_N}^3, {how})")
    if cpeak != peak:
        print(f"{args.dtype} peak {cpeak:.1f} GFLOP/s ({cpeak_how}): the %peak column's 100 %")
    print(f"bandwidth {bandwidth:.1f} GB/s ({bw_how}); roof = max(FLOPs at the "
          f"{'sgemm' if cpeak == peak else args.dtype} peak, least bytes at the bandwidth) / time")
    print(f"malloc: {allocator or 'as it is'}")
    if torch is not None:
        layout = getattr(args, "torch_layout", "faster")
        what = ("the faster of channels-last (NHWC) and NCHW per row" if layout == "faster"
                else layout)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
              f"{what}; ratio = torch ms / numbaconv ms (> 1: numbaconv faster); "
              f"vs torch = normalised difference of the results")
    if args.check:
        print("error: vs the float64 reference on the batch-1 slice (docs/contract.md section 10)")

    rows = run(layers, args.passes, args.dtype, repeat=repeat, strategy=args.strategy,
               check=args.check, torch=torch, peak=cpeak, rounds=rounds,
               bandwidth=bandwidth, torch_layout=getattr(args, "torch_layout", "faster"))
    summary = summarize(rows)
    for line in summary_lines(summary, cpeak):
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
        info = machine_info(threads, peak, how, torch, allocator)
        info["bandwidth_gbs"], info["bandwidth_how"] = bandwidth, bw_how
        info["peak_gflops"], info["peak_how"] = cpeak, cpeak_how
        write_json(args.json, info, rows, summary, options)
        print(f"wrote {args.json}")
    if args.plot:
        plot(args.plot, rows, peak)
        print(f"wrote {args.plot}")
    return 1 if failed else 0


def parse_args(argv=None):
    """Parse ``numbaconv bench`` options on their own (``python -m numbaconv.bench``)."""
    parser = argparse.ArgumentParser(prog="numbaconv bench", description=__doc__.split("\n")[0])
    return add_arguments(parser).parse_args(argv)
