"""The files a bench run writes: JSON with every number, and a bar chart."""
from dataclasses import asdict
import json

import numpy as np

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
