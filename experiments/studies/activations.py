"""Softmax, ReLU and softplus attention, standard and MM forms, trained side by side.

``python -m experiments.studies.activations [--out runs/activations] [--epochs N] [--only NAME ...] [--force]
[--set section.key=value ...]``

Trains every variant in `VARIANTS` on the default text task (``experiments/configs/default.yaml``
for the MM forms, ``free.yaml`` for the standard ones, with the overrides listed), then probes each
trained model's first layer with `experiments.studies.spline_probe` and writes ``table.md`` (the table
in the README) and ``results.json`` to ``--out``. Each run keeps its own folder
(``--out/NAME``: checkpoint, metrics, energy plots); a run whose ``metrics.json`` exists for the
same config is reused, so an interrupted sweep resumes where it stopped (``--force`` retrains).

Columns: test accuracy; the float64 energy check on the test set (increases over all layer steps
of every test example, and the mean energy before the first and after the last layer); for the MM forms the energy is the one
every layer descends, for the standard forms the token-space attention energy E1 traced for
comparison (nothing promises descent). Spline probe on the first layer, along a ray through the
embedded first test sentence with ``--probe-n`` tokens (t in [-1, 1]): verdict, degree, pieces;
the static degree bound of the whole stack (3^T where Lai, Lim, Liu's Lemma 3.2 / Theorem 3.3
apply), and what makes a model no spline.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List

import torch

from energies.errors import ConfigError
from unfold.cli import positive_int, run_main
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from .. import data as D
from ..app.config import load_config
from ..data import output_folder_arg
from ..app.plot_energy import RunFileError, number_of, read_json
from ..runfolder.runlock import RunFolderError
from .spline_probe import degree_analysis, load_model, probe_model
from ..runfolder.atomic import atomic_write_text
from ..app.train import train

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
MM, STANDARD = os.path.join(CONFIGS, "default.yaml"), os.path.join(CONFIGS, "free.yaml")

#: name -> (form, activation, base config, overrides)
VARIANTS: Dict[str, tuple] = {
    "std-softmax": ("standard", "softmax", STANDARD, ["model.attention=softmax"]),
    "std-relu": ("standard", "relu", STANDARD, ["model.attention=relu"]),
    "std-softplus": ("standard", "softplus", STANDARD, ["model.attention=softplus"]),
    "std-relu-nonorm": ("standard, no LayerNorm", "relu", STANDARD, ["model.attention=relu", "model.norm=none"]),
    "mm-softmax": ("MM", "softmax (rho=exp)", MM, ["model.rho=exp"]),
    "mm-relu": ("MM", "relu (rho=relu:2)", MM, ["model.rho=relu:2"]),
    "mm-softplus": ("MM", "softplus (rho=softplus:2:0.5)", MM, ["model.rho=softplus:2:0.5"]),
    "mm-relu-const": ("MM, constant curvature", "relu (rho=relu:2)", MM,
                      ["model.rho=relu:2", "model.curvature=constant"]),
}


def probe_sentence(cfg, run_dir: str, n: int) -> torch.Tensor:
    """The first n tokens of the first test text with at least n, in the run's vocabulary: the probe's
    ray starts at a real sentence (a trained ReLU kernel can be zero on every pair of random tokens)."""
    dc = cfg["data"]
    splits = D.load_configured(dc)
    ids, mask, _ = D.encode(splits.test[:200], D.Vocab.load(os.path.join(run_dir, "vocab.json")), dc["max_len"])
    long_enough = (mask.sum(1) >= n).nonzero()
    if not len(long_enough):
        raise ConfigError(f"no test text has {n} tokens for the probe; lower --probe-n")
    return ids[int(long_enough[0])][:n]


def variant_config(name: str, epochs: int, common=()) -> Dict[str, Any]:
    """The validated config of one variant (`VARIANTS`); ``common`` overrides apply on top."""
    form, activation, base, overrides = VARIANTS[name]
    return load_config(base, [f"name={name}", f"train.epochs={epochs}", "train.progress=false", *overrides, *common])


#: what the table reads from a run's metrics.json
METRIC_NUMBERS = ("test_accuracy", "val_accuracy", "energy_first_mean", "energy_last_mean", "train_seconds")
METRIC_COUNTS = ("energy_steps", "energy_increases")


def read_metrics(path: str) -> Dict[str, Any]:
    """A reused run's ``metrics.json``, checked to hold what the table reads (`METRIC_NUMBERS` as
    numbers, `METRIC_COUNTS` as integers, ``mode`` a string), else a `RunFileError` naming
    the file and the key (``--force`` retrains)."""
    metrics = read_json(path, dict)
    missing = [k for k in METRIC_NUMBERS + METRIC_COUNTS + ("mode",) if k not in metrics]
    if missing:
        raise RunFileError(f"{path} has no {missing}; retrain with --force")
    for key in METRIC_NUMBERS:
        metrics[key] = number_of(metrics[key], path, key)
    for key in METRIC_COUNTS:
        if isinstance(metrics[key], bool) or not isinstance(metrics[key], int) or metrics[key] < 0:
            raise RunFileError(f"{path}: {key!r} must be an integer >= 0, got {metrics[key]!r:.80}")
    if not isinstance(metrics["mode"], str):
        raise RunFileError(f"{path}: 'mode' must be a string, got {metrics['mode']!r:.80}")
    return metrics


def run_variant(name: str, out: str, epochs: int, force: bool, probe_n: int, common=()) -> Dict[str, Any]:
    """Train (or reuse) one variant and probe it; ``common`` overrides apply on top (e.g. a dataset)."""
    form, activation, base, overrides = VARIANTS[name]
    cfg = variant_config(name, epochs, common)
    run_dir = os.path.join(out, name)
    metrics_path = os.path.join(run_dir, "metrics.json")
    cfg_path = os.path.join(run_dir, "config.yaml")
    best_path = os.path.join(run_dir, "best.pt")
    reuse = (not force and all(os.path.isfile(f) for f in (metrics_path, cfg_path, best_path))
             and load_config(cfg_path) == cfg                       # keys added since then take their defaults
             and os.path.getmtime(best_path) <= os.path.getmtime(metrics_path))   # not an interrupted retraining
    if reuse:
        metrics = read_metrics(metrics_path)
        print(f"{name}: reusing {metrics_path}", file=sys.stderr)
    else:
        print(f"{name}: training ({' '.join(overrides)})", file=sys.stderr)
        try:
            metrics = train(cfg, run_dir, overwrite=force)       # --force replaces the folder's run
        except RunFolderError as exc:
            raise RunFolderError(f"{exc} (here: --force retrains)") from None
    model = load_model(checkpoint=os.path.join(run_dir, "best.pt"))
    first = probe_model(model, layers=1, ids=probe_sentence(cfg, run_dir, probe_n), t_max=1.0)
    bound, reasons = degree_analysis(model)
    return {"name": name, "form": form, "activation": activation, "overrides": overrides,
            "test_accuracy": metrics["test_accuracy"], "val_accuracy": metrics["val_accuracy"],
            "energy_steps": metrics["energy_steps"], "energy_increases": metrics["energy_increases"],
            "energy_first": metrics["energy_first_mean"], "energy_last": metrics["energy_last_mean"],
            "guaranteed": metrics["mode"] == "guaranteed", "train_seconds": metrics["train_seconds"],
            "probe_layer1": {k: first[k] for k in ("verdict", "degree", "pieces", "max_residual", "static_degree_bound")},
            "static_degree_bound": bound, "non_spline_parts": reasons, "layers": model.encoder.layers}


def markdown(rows: List[Dict[str, Any]], epochs: int) -> str:
    head = ("| form | activation | test acc | energy increases / steps | mean E(Y_0) -> E(Y_T) | probe, layer 1 "
            "| static bound, all layers | not a spline because |\n|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        p = r["probe_layer1"]
        probe = p["verdict"] + (f", degree {p['degree']}" if p["degree"] is not None else "") + f", {p['pieces']} pieces"
        energy = "descended" if r["guaranteed"] else "traced E1"
        bound = "none" if r["static_degree_bound"] is None else f"3^{r['layers']} = {r['static_degree_bound']}"
        why = "; ".join(r["non_spline_parts"]) or "-"
        lines.append(f"| {r['form']} | {r['activation']} | {r['test_accuracy']:.4f} | {r['energy_increases']} / "
                     f"{r['energy_steps']} ({energy}) | {r['energy_first']:.4g} -> {r['energy_last']:.4g} | {probe} | {bound} | "
                     f"{why} |")
    return (f"{epochs} epochs, seed 0; energies checked in float64 on the test set.\n\n" + head + "\n".join(lines) + "\n")


PROG = "python -m experiments.studies.activations"


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2). Every
    variant's config (``--set`` included) is checked before the first one trains."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--out", type=output_folder_arg, default="runs/activations")
    p.add_argument("--epochs", type=positive_int, default=6)
    p.add_argument("--only", nargs="+", metavar="NAME", choices=list(VARIANTS),
                   help=f"a subset of: {' '.join(VARIANTS)}")
    p.add_argument("--force", action="store_true", help="retrain runs that already have metrics")
    p.add_argument("--probe-n", type=positive_int, default=6, help="tokens of the probed sentence")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides for every variant")
    args = p.parse_args(argv)
    names = list(dict.fromkeys(args.only or VARIANTS))

    def body() -> int:
        for name in names:             # a bad --set fails here, before hours of training
            variant_config(name, args.epochs, args.set)
        rows = [run_variant(n, args.out, args.epochs, args.force, args.probe_n, args.set) for n in names]
        table = markdown(rows, args.epochs)
        atomic_write_text(table, os.path.join(args.out, "table.md"))
        atomic_write_text(json_dumps(rows, indent=1), os.path.join(args.out, "results.json"))
        print(table)
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
