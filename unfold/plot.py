"""Energy-descent plots of a [`DescentReport`][unfold.DescentReport] (matplotlib, Agg backend)."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, title: Optional[str] = None, dpi: int = 110, bottom: float = 0.0) -> str:
    """Title, tight layout (above ``bottom``, the figure fraction kept free for a caption), write a PNG at
    ``path`` (folders created), close; returns ``path``."""
    plt = pyplot()
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0.0, bottom, 1.0, 1.0))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_report(report, path: str, title: Optional[str] = None, max_samples: int = 32) -> str:
    """Two panels: total energy per example against layer (increases marked in red), and the mean
    of every term against layer. Writes a PNG at ``path`` and returns it."""
    plt = pyplot()
    tot = report.totals.detach().cpu().numpy()
    inc = report.increases.detach().cpu().numpy()
    T = tot.shape[1] - 1
    layers = np.arange(T + 1)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    for s in range(min(tot.shape[0], max_samples)):
        ax.plot(layers, tot[s], color="tab:blue", alpha=0.35, lw=1)
        bad = np.nonzero(inc[s])[0]
        if bad.size:
            ax.scatter(bad + 1, tot[s, bad + 1], color="red", marker="x", zorder=3, s=30)
    ax.plot(layers, tot.mean(0), color="black", lw=2, label="mean over examples")
    ax.set_xlabel("layer t")
    ax.set_ylabel("total energy E(Y_t)")
    ax.set_title(f"total energy: {int(inc.sum())} increases in {inc.size} steps")
    ax.legend(loc="best")
    ax = axes[1]
    for name, v in report.terms.items():
        arr = v.detach().cpu().numpy()
        arr = np.where(np.isfinite(arr), arr, np.nan)
        ax.plot(layers, np.nanmean(arr, 0), marker="o", ms=3, label=name)
    ax.set_xlabel("layer t")
    ax.set_ylabel("mean term value")
    ax.set_title("energy terms")
    ax.legend(loc="best")
    return save_figure(fig, path, title)
