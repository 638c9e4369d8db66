"""Energy-descent and training plots of a run: ``python -m experiments.plot_energy RUN_DIR``.

Redraws, from the files a training run saved (``energy_trace.pt``, ``history.json``,
``metrics.json``):

* ``energy_descent.png``: for each layer t, the distribution over test examples of
  ``E(Y^t) - E_min`` as box plots with the mean curve (as the paper's figures 5-6), log scale, where
  E_min is each example's lowest energy after the shared step is unrolled 32 more layers (guaranteed
  mode) or its lowest over the layers (untied modes); then one panel per energy term with its mean
  and inter-quartile band per layer;
* ``training_curves.png``: loss and accuracy per epoch (train and validation).
"""
from __future__ import annotations

import json
import math
import os
import sys

from unfold.plot import pyplot, save_figure

from .checkpoint import safe_load


def plot_energy_descent(energies, path: str, title: str = "", energy_min=None, extra_layers=None) -> str:
    import numpy as np

    plt = pyplot()

    names = list(energies)
    total = sum(energies[k] for k in names).numpy()
    N, T1 = total.shape
    e_min = total.min(axis=1)
    how = "lowest over the layers"
    if energy_min is not None:
        e_min = np.minimum(e_min, energy_min.numpy())
        how = f"after {extra_layers} more layers of the shared step"
    gap = total - e_min[:, None]
    scale = np.abs(total).max(axis=1, keepdims=True)
    floor = 1e-12 * scale
    gap_plot = np.maximum(gap, floor)
    ncols = min(3, 1 + len(names))
    nrows = math.ceil((1 + len(names)) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows), squeeze=False)
    axes = axes.reshape(-1)
    for ax in axes[1 + len(names):]:
        ax.set_visible(False)
    ax = axes[0]
    ax.boxplot([gap_plot[:, t] for t in range(T1)], positions=list(range(T1)), widths=0.5, showfliers=True,
               flierprops={"markersize": 2, "alpha": 0.4})
    ax.plot(range(T1), gap_plot.mean(0), color="tab:red", marker="o", ms=3, label="mean")
    ax.set_yscale("log")
    ax.set_xlabel("layer t")
    ax.set_ylabel("E(Y^t) - E_min")
    ax.set_title(f"total energy, {N} test examples\nE_min: {how}", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    for j, name in enumerate(names, start=1):
        v = energies[name].numpy()
        v = np.where(np.isfinite(v), v, np.nan)
        ax = axes[j]
        q1, med, q3 = np.nanpercentile(v, [25, 50, 75], axis=0)
        ax.fill_between(range(T1), q1, q3, alpha=0.3, label="25-75%")
        ax.plot(range(T1), np.nanmean(v, 0), marker="o", ms=3, label="mean")
        ax.plot(range(T1), med, ls="--", lw=1, label="median")
        ax.set_xlabel("layer t")
        ax.set_xticks(range(T1))
        ax.set_title(f"term: {name}")
        ax.legend(loc="best", fontsize=8)
    return save_figure(fig, path, title, dpi=100)


def plot_training_curves(history, path: str, title: str = "") -> str:
    plt = pyplot()
    ep = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(ep, [h["train_loss"] for h in history], marker="o", label="train")
    axes[0].plot(ep, [h["val_loss"] for h in history], marker="o", label="validation")
    axes[0].set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    axes[1].plot(ep, [h["train_accuracy"] for h in history], marker="o", label="train")
    axes[1].plot(ep, [h["val_accuracy"] for h in history], marker="o", label="validation")
    axes[1].set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in axes:
        ax.legend()
    return save_figure(fig, path, title, dpi=100)


def plot_run(run_dir: str):
    """Redraw both plots of ``run_dir`` from its saved files; returns their paths."""
    trace_path = os.path.join(run_dir, "energy_trace.pt")
    hist_path = os.path.join(run_dir, "history.json")
    for p in (trace_path, hist_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p} is missing: is {run_dir!r} a finished training run?")
    trace = safe_load(trace_path)
    with open(hist_path) as fh:
        history = json.load(fh)
    metrics = {}
    if os.path.isfile(os.path.join(run_dir, "metrics.json")):
        with open(os.path.join(run_dir, "metrics.json")) as fh:
            metrics = json.load(fh)
    name = metrics.get("name", os.path.basename(os.path.normpath(run_dir)))
    head = (f"{name} ({trace.get('mode')}): {metrics.get('energy_increases', '?')} increases in "
            f"{metrics.get('energy_steps', '?')} layer-steps ({trace.get('dtype')}), "
            f"test accuracy {metrics.get('test_accuracy', float('nan')):.4f}")
    return (plot_energy_descent(trace["energies"], os.path.join(run_dir, "energy_descent.png"), head,
                                trace.get("energy_min"), trace.get("extra_layers")),
            plot_training_curves(history, os.path.join(run_dir, "training_curves.png"), name))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m experiments.plot_energy RUN_DIR", file=sys.stderr)
        return 2
    try:
        paths = plot_run(argv[0])
    except FileNotFoundError as exc:
        print(f"python -m experiments.plot_energy: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
