"""What ``numbaconv bench`` shows while it runs: the table, a line per row, and a progress bar."""
import sys

from .rows import TORCH_MISMATCH, label


class Counter:
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


def progress(total, enabled):
    """A tqdm bar on stderr (rows are written above it), else a counter, else nothing."""
    if not enabled:
        return Counter(total, live=False)
    try:
        from tqdm import tqdm
    except ImportError:
        return Counter(total)

    class _Bar(tqdm):
        def write(self, line):
            tqdm.write(line, file=sys.stdout)

    # disable=None: tqdm turns itself off when stderr is not a terminal (logs, CI).
    return _Bar(total=total, file=sys.stderr, unit="pass", disable=None, leave=False)


def _fmt(v, spec, width):
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{spec}}"


class Table:
    def __init__(self, layers, torch_on):
        self.dw = max([len(lay.descriptor()) for lay in layers] + [10])
        self.torch_on = torch_on

    def header(self):
        h = (f"{'pass':<6} {'descriptor':<{self.dw}} {'strategy':<17} {'ms':>9} "
             f"{'GFLOP/s':>8} {'%peak':>6} {'roof':>5} {'error':>8}")
        if self.torch_on:
            h += f" | {'torch ms':>9} {'layout':>6} {'GFLOP/s':>8} {'ratio':>6} {'vs torch':>8}"
        return h

    def row(self, r):
        s = (f"{r.direction:<6} {r.descriptor:<{self.dw}} {label(r):<17} "
             f"{_fmt(r.ms, '.2f', 9)} {_fmt(r.gflops, '.2f', 8)} {_fmt(r.peak_pct, '.1f', 6)} "
             f"{_fmt(r.roof, '.2f', 5)} "
             f"{_fmt(r.error, '.1e', 8)}")
        if self.torch_on:
            lay = {"channels-last": "NHWC", "nchw": "NCHW"}.get(r.torch_layout, "-")
            s += (f" | {_fmt(r.torch_ms, '.2f', 9)} {lay:>6} {_fmt(r.torch_gflops, '.2f', 8)} "
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
