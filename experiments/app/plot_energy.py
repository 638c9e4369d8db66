"""Energy-descent and training plots of a run: ``python -m experiments.app.plot_energy RUN_DIR``.

Redraws, from the files a training run saved (``energy_trace.pt``, ``history.json``,
``metrics.json``):

* ``energy_descent.png``: for each layer t, the distribution over test examples of
  ``E(Y^t) - E_min`` as box plots with the mean curve (as the paper's figures 5-6), log scale, where
  E_min is each example's lowest energy after the shared step is unrolled 32 more layers (guaranteed
  mode) or its lowest over the layers (untied modes), titled as the quantity that must fall; then one
  panel per energy term with its mean and inter-quartile band per layer, each marked as a part of the
  total that may rise; a term unchanged at every layer for every example (the ReLU indicator, 0 on the
  non-negative states the ReLU prox returns) is not drawn but named with its value in the caption, which
  says how to read the figure;
* ``training_curves.png``: loss and accuracy per epoch (train and validation).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

import torch

from energies.errors import UnfoldError
from unfold.cli import run_main
from unfold.documents import read_document
from unfold.plugins import add_import_arg
from unfold.plot import pyplot, save_figure

from .checkpoint import safe_load


#: the energy figure's text sizes (points; drawn at 100 dpi, 4.6 inches a panel): readable where the figure is shown
#: at 1280 px wide (the README's first figure): every text at least 13 px high there (tests/test_energy_plot.py)
FIGURE_FONTS = {"font.size": 12, "axes.titlesize": 12.5, "axes.labelsize": 12, "xtick.labelsize": 11.5,
                "ytick.labelsize": 11.5, "legend.fontsize": 11, "figure.titlesize": 15}


def plot_energy_descent(energies, path: str, title: str = "", energy_min=None, extra_layers=None) -> str:
    """Box plots of ``E(Y^t) - E_min`` per layer and one panel per term (module docstring). Non-finite
    energies (a diverged run) are left out of every statistic, never drawn; a panel with nothing finite
    says so instead of drawing an empty log axis. Text at the sizes of `FIGURE_FONTS`."""
    import numpy as np

    plt = pyplot()

    names = list(energies)
    with np.errstate(all="ignore"), warnings.catch_warnings(), plt.rc_context(FIGURE_FONTS):
        warnings.simplefilter("ignore", RuntimeWarning)        # all-NaN columns of a diverged run
        total = _finite(sum(energies[k].double() for k in names).numpy())
        N, T1 = total.shape
        e_min = np.fmin.reduce(total, axis=1)                  # NaN (non-finite) entries ignored
        how = "lowest over the layers"
        if energy_min is not None:
            e_min = np.fmin(e_min, _finite(energy_min.double().numpy()))
            how = f"after {extra_layers} more layers of the shared step"
        gap = total - e_min[:, None]
        scale = np.nan_to_num(np.fmax.reduce(np.abs(total), axis=1, keepdims=True), nan=0.0)
        floor = np.maximum(1e-12 * scale, np.finfo(np.float64).tiny)
        gap_plot = _finite(np.maximum(gap, floor))
        values = {name: _finite(energies[name].double().numpy()) for name in names}
        constant = {name: v for name, v in values.items() if _constant(v)}
        drawn = [name for name in names if name not in constant]
        ncols = min(3, 1 + len(drawn))
        nrows = math.ceil((1 + len(drawn)) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.8 * nrows + 0.6), squeeze=False)
        axes = axes.reshape(-1)
        for ax in axes[1 + len(drawn):]:
            ax.set_visible(False)
        _draw_total(axes[0], gap_plot, f"{N} test examples\nE_min: {how}")
        for j, name in enumerate(drawn, start=1):
            _draw_term(axes[j], values[name], name)
        import textwrap

        caption = textwrap.fill(energy_caption(constant), 40 + 32 * ncols)
        height = 3.8 * nrows + 0.6
        fig.text(0.5, 0.01, _plain(caption), ha="center", va="bottom", fontsize=11.5)
        return save_figure(fig, path, title, dpi=100, bottom=(0.2 + 0.2 * (caption.count("\n") + 1)) / height)


def _draw_total(ax, gap, subtitle: str) -> None:
    """The first panel: box plots of ``E(Y^t) - E_min`` per layer with the mean curve, log scale, framed and titled
    as the quantity that must fall."""
    import numpy as np

    T1 = gap.shape[1]
    ax.set_xlabel("layer t")
    ax.set_xticks(range(T1))
    ax.set_ylabel("E(Y^t) - E_min  (log scale)")
    ax.set_title(f"TOTAL energy: must fall at every layer\n{subtitle}", fontweight="bold")
    for side in ax.spines.values():
        side.set_linewidth(2.0)
    if not _drawable(gap):
        _nothing_to_draw(ax)
        return
    cols = [gap[:, t][np.isfinite(gap[:, t])] for t in range(T1)]
    ax.boxplot(cols, positions=list(range(T1)), widths=0.5, showfliers=True, flierprops={"markersize": 2, "alpha": 0.4})
    ax.plot(range(T1), np.nanmean(gap, 0), color="tab:red", marker="o", ms=3, label="mean")
    ax.set_yscale("log")
    ax.legend(loc="best")


def _draw_term(ax, v, name: str) -> None:
    """One term's panel: its mean, median and inter-quartile band per layer, marked as a part of the total."""
    import numpy as np

    T1 = v.shape[1]
    ax.set_xlabel("layer t")
    ax.set_xticks(range(T1))
    ax.set_title(_plain(f"term: {name}") + "\n(one part of the total: may rise)")
    if not _drawable(v):
        _nothing_to_draw(ax)
        return
    q1, med, q3 = np.nanpercentile(v, [25, 50, 75], axis=0)
    ax.fill_between(range(T1), q1, q3, alpha=0.3, label="25-75%")
    ax.plot(range(T1), np.nanmean(v, 0), marker="o", ms=3, label="mean")
    ax.plot(range(T1), med, ls="--", lw=1, label="median")
    ax.legend(loc="best")


def _constant(v) -> bool:
    """Whether a term's values (N examples x T+1 layers, numpy, non-finite as NaN) are the same at every layer for
    every example -- exactly, so that nothing a step did to it is hidden: such a term cannot show descent."""
    import numpy as np

    return bool(np.isfinite(v).all() and (v == v[:, :1]).all())


def energy_caption(constant) -> str:
    """The line under an energy-descent figure that says how to read it: each layer is one MM step on
    E = the sum of the terms, so the total (first panel) must fall at every layer while a single term may rise
    when others fall more; and the terms not drawn because they are constant, each with its value."""
    text = ("Each layer is one majorization-minimization step on E = the sum of the terms: the TOTAL (first panel) "
            "must fall at every layer; a single term may rise when the others fall more.")
    if constant:
        import numpy as np

        def value(v) -> str:
            lo, hi = float(np.min(v)), float(np.max(v))
            return f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g} across examples"
        text += " Not drawn, unchanged at every layer: " + "; ".join(
            f"{name} = {value(v)}" for name, v in constant.items()) + "."
    return text


#: beyond this magnitude matplotlib cannot lay out an axis (its tick arithmetic overflows)
_PLOTTABLE = 1e300


def _finite(a):
    """``a`` (numpy) with every entry that is not finite, or too large to lay out on an axis, set to NaN."""
    import numpy as np

    return np.where(np.isfinite(a) & (np.abs(a) < _PLOTTABLE), a, np.nan)


def _drawable(a) -> bool:
    import numpy as np

    return bool(np.isfinite(a).any())


def _plain(text: str) -> str:
    """``text`` for a matplotlib title: every ``$`` escaped (a name read from a file is not mathtext)."""
    return text.replace("$", r"\$")


def _nothing_to_draw(ax) -> None:
    ax.text(0.5, 0.5, "no finite energies", ha="center", va="center", transform=ax.transAxes)


def plot_training_curves(history, path: str, title: str = "") -> str:
    """Loss and accuracy per epoch, train and validation; non-finite values are left out."""
    import numpy as np

    plt = pyplot()
    ep = _finite(np.array([h["epoch"] for h in history], dtype=np.float64))
    col = lambda key: _finite(np.array([h[key] for h in history], dtype=np.float64))  # noqa: E731
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].plot(ep, col("train_loss"), marker="o", label="train")
    axes[0].plot(ep, col("val_loss"), marker="o", label="validation")
    axes[0].set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    axes[1].plot(ep, col("train_accuracy"), marker="o", label="train")
    axes[1].plot(ep, col("val_accuracy"), marker="o", label="validation")
    axes[1].set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in axes:
        ax.legend()
    return save_figure(fig, path, title, dpi=100)


class RunFileError(UnfoldError):
    """A file of a run folder is missing, unreadable, or not what a training run writes there."""


def read_json(path: str, kind: type = dict):
    """The JSON value in ``path``, checked to be a ``kind`` (``dict``: an object, ``list``: an array).
    Missing, a folder, not UTF-8, not JSON, or another kind of value: `RunFileError` naming the file."""
    value = read_document(path, json.load, RunFileError, path, "JSON", (ValueError, RecursionError))
    if not isinstance(value, kind):
        raise RunFileError(f"{path} holds a JSON {_json_kind(value)}, expected a JSON "
                           f"{'object' if kind is dict else 'array'}")
    return value


def _json_kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def number_of(value, where: str, key: str) -> float:
    """``value`` as a float: a JSON number, or ``"nan"`` / ``"inf"`` / ``"-inf"`` (how strict JSON writes
    non-finite numbers); anything else is a `RunFileError` naming ``where`` and ``key``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if value in ("nan", "inf", "-inf"):
        return float(value)
    raise RunFileError(f"{where}: {key!r} must be a number, got {value!r:.80}")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def load_trace(path: str) -> dict:
    """``energy_trace.pt`` of a run (`experiments.app.checkpoint.safe_load`), checked: a dict whose
    ``energies`` map term names to float tensors of one shape ``(examples >= 1, layers + 1 >= 1)``, an
    ``energy_min`` that is None or a float tensor ``(examples,)``, ``extra_layers`` None or an integer
    >= 0, ``mode`` and ``dtype`` None or strings. Anything else: `RunFileError` naming the file."""
    trace = safe_load(path)
    if not isinstance(trace, dict):
        raise RunFileError(f"{path} holds {_describe(trace)}, not an energy trace (a dict with 'energies')")
    energies = trace.get("energies")
    if not isinstance(energies, dict) or not energies:
        raise RunFileError(f"{path}: 'energies' must be a non-empty dict of term name -> tensor, got "
                           f"{'nothing' if energies is None else _describe(energies)}")
    shape = None
    for name, v in energies.items():
        if not (isinstance(name, str) and isinstance(v, torch.Tensor) and v.layout == torch.strided
                and v.is_floating_point() and v.ndim == 2 and v.numel() > 0):
            raise RunFileError(f"{path}: energies[{name!r}] must be a non-empty dense 2-D float tensor "
                               f"(examples, layers + 1), got {_describe(v)}")
        if shape is not None and v.shape != shape:
            raise RunFileError(f"{path}: energies[{name!r}] has shape {tuple(v.shape)}, the other terms "
                               f"{tuple(shape)}")
        shape = v.shape
    e_min = trace.get("energy_min")
    if e_min is not None and not (isinstance(e_min, torch.Tensor) and e_min.layout == torch.strided
                                  and e_min.is_floating_point()
                                  and tuple(e_min.shape) == (shape[0],)):
        raise RunFileError(f"{path}: 'energy_min' must be None or a float tensor of shape ({shape[0]},), got "
                           f"{_describe(e_min)}")
    extra = trace.get("extra_layers")
    if extra is not None and (isinstance(extra, bool) or not isinstance(extra, int) or extra < 0):
        raise RunFileError(f"{path}: 'extra_layers' must be None or an integer >= 0, got {extra!r:.80}")
    for key in ("mode", "dtype"):
        if trace.get(key) is not None and not isinstance(trace[key], str):
            raise RunFileError(f"{path}: {key!r} must be a string, got {trace[key]!r:.80}")
    return trace


HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "train_accuracy", "val_accuracy")


def load_history(path: str) -> list:
    """``history.json`` of a run, checked: a non-empty array of objects, each with the numbers
    `HISTORY_KEYS` (non-finite ones as strict JSON writes them); returns the records as floats."""
    history = read_json(path, list)
    if not history:
        raise RunFileError(f"{path} holds no epoch (an empty array)")
    out = []
    for i, rec in enumerate(history):
        if not isinstance(rec, dict):
            raise RunFileError(f"{path}: record {i} is a JSON {_json_kind(rec)}, expected an object")
        missing = [k for k in HISTORY_KEYS if k not in rec]
        if missing:
            raise RunFileError(f"{path}: record {i} has no {missing}; keys found: {sorted(rec)}")
        out.append({k: number_of(rec[k], f"{path}: record {i}", k) for k in HISTORY_KEYS})
    return out


def load_metrics(path: str) -> dict:
    """``metrics.json`` of a run (optional: ``{}`` when absent), checked where the plots read it: an
    object whose ``name`` is a string, ``test_accuracy`` a number, ``energy_increases`` and
    ``energy_steps`` integers."""
    if not os.path.lexists(path):
        return {}
    metrics = read_json(path, dict)
    if "name" in metrics and not isinstance(metrics["name"], str):
        raise RunFileError(f"{path}: 'name' must be a string, got {metrics['name']!r:.80}")
    if "test_accuracy" in metrics:
        metrics["test_accuracy"] = number_of(metrics["test_accuracy"], path, "test_accuracy")
    for key in ("energy_increases", "energy_steps"):
        if key in metrics and (isinstance(metrics[key], bool) or not isinstance(metrics[key], int)):
            raise RunFileError(f"{path}: {key!r} must be an integer, got {metrics[key]!r:.80}")
    return metrics


def plot_run(run_dir: str):
    """Redraw both plots of ``run_dir`` from its saved files; returns their paths. Every file is read and
    checked (`load_trace`, `load_history`, `load_metrics`) before anything is drawn."""
    if not os.path.isdir(run_dir):
        raise RunFileError(f"run folder {run_dir!r} " + ("is a file, not a folder" if os.path.lexists(run_dir)
                                                           else "does not exist"))
    trace_path = os.path.join(run_dir, "energy_trace.pt")
    hist_path = os.path.join(run_dir, "history.json")
    for path in (trace_path, hist_path):
        if not os.path.isfile(path):
            raise RunFileError(f"{path} is missing: is {run_dir!r} a finished training run?")
    trace = load_trace(trace_path)
    history = load_history(hist_path)
    metrics = load_metrics(os.path.join(run_dir, "metrics.json"))
    name = metrics.get("name", os.path.basename(os.path.normpath(run_dir)))
    head = (f"{name} ({trace.get('mode')}): {metrics.get('energy_increases', '?')} increases in "
            f"{metrics.get('energy_steps', '?')} layer-steps ({trace.get('dtype')}), "
            f"test accuracy {metrics.get('test_accuracy', float('nan')):.4f}")
    energies = {k: v.double() for k, v in trace["energies"].items()}
    e_min = trace.get("energy_min")
    return (plot_energy_descent(energies, os.path.join(run_dir, "energy_descent.png"), _plain(head),
                                None if e_min is None else e_min.double(), trace.get("extra_layers")),
            plot_training_curves(history, os.path.join(run_dir, "training_curves.png"), _plain(name)))


PROG = "python -m experiments.app.plot_energy"


def main(argv=None) -> int:
    """``RUN_DIR``: redraw its plots; errors under `unfold.cli.run_main` (one line, exit 2)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a training run folder (runs/NAME)")
    args = p.parse_args(argv)

    def body() -> int:
        print("\n".join(plot_run(args.run_dir)))
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
