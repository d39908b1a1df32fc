"""The results of a bench run: one :class:`Row` per layer and pass, and their geometric means."""
from dataclasses import dataclass
import math

#: Relative difference from PyTorch above which a row is flagged. Both compute the same
#: float sums in different orders, so they agree to a few ulps times sqrt(terms); float16
#: and bfloat16 results are rounded to 11 and 8 bits, so their rows get wider tolerances.
TORCH_MISMATCH = {"float64": 1e-3, "float32": 1e-3, "float16": 1e-2, "bfloat16": 2e-2}


def label(r):
    """The implementation a row ran, as ``strategy[variant]``."""
    if not r.strategy:
        return "-"
    return f"{r.strategy}[{r.variant}]" if r.variant else r.strategy


@dataclass
class Row:
    """One layer and pass. Times in ms; ``None`` where a number does not apply.

    ``bytes`` is the least traffic of the pass (operands read once, result written once,
    :func:`numbaconv.bench.timing.traffic_bytes`); ``roof`` the fraction of the row's roofline
    reached: ``max(flops at the dtype's compute peak, bytes at the measured bandwidth) / time`` (1: at
    the roof; Winograd, which does fewer multiplies than ``flops`` counts, can pass 1).
    ``ratio`` is ``torch_ms / ms``: above 1, numbaconv is faster. ``error`` is the normalised
    error against the float64 reference on the batch-1 slice of the layer, ``tolerance``
    the bound of docs/contract.md section 10 for the dtype and strategy, ``torch_diff`` the normalised difference from
    PyTorch's result on the full layer (the larger over the layouts timed), ``torch_layout``
    the PyTorch memory format whose time counts (``channels-last`` or ``nchw``). ``variant`` names the strategy's implementation
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
    bytes: int = 0
    roof: float = None
    error: float = None
    tolerance: float = None
    torch_ms: float = None
    torch_gflops: float = None
    ratio: float = None
    torch_diff: float = None
    torch_layout: str = ""
    note: str = ""

    @property
    def error_ok(self):
        return self.error is None or self.error <= self.tolerance

    @property
    def torch_ok(self):
        return self.torch_diff is None or self.torch_diff <= TORCH_MISMATCH[self.dtype]


def _geomean(values):
    v = [x for x in values if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def summarize(rows):
    """Geometric means per pass: ``{pass: {"gflops", "roof", "torch_gflops", "ratio", "n"}}``."""
    out = {}
    for direction in dict.fromkeys(r.direction for r in rows):
        rs = [r for r in rows if r.direction == direction and r.ms is not None]
        out[direction] = {"n": len(rs),
                          "gflops": _geomean(r.gflops for r in rs),
                          "roof": _geomean(r.roof for r in rs),
                          "torch_gflops": _geomean(r.torch_gflops for r in rs),
                          "ratio": _geomean(r.ratio for r in rs)}
    return out


def summary_lines(summary, peak):
    lines = ["geometric means:"]
    for direction, s in summary.items():
        if not s["n"]:
            lines.append(f"  {direction:<6} no timed rows")
            continue
        line = f"  {direction:<6} numbaconv {s['gflops']:.2f} GFLOP/s"
        if peak:
            line += f" ({100 * s['gflops'] / peak:.1f}% of peak)"
        if s.get("roof") is not None:
            line += f", {s['roof']:.2f} of the roofline"
        if s["torch_gflops"] is not None:
            line += (f", torch {s['torch_gflops']:.2f} GFLOP/s, "
                     f"ratio torch_ms/numbaconv_ms {s['ratio']:.2f}")
        lines.append(line + f"  [{s['n']} layer(s)]")
    return lines
