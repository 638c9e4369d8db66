"""Pretrain, then fine-tune: ``python -m experiments.studies.pretraining [--datasets rotten_tomatoes,listops]
[--modes guaranteed,baseline] [--seeds 3] [--run-dir runs/pretraining] [--out docs/pretraining/results.json]``.

For each dataset and each ``model.mode``, over the seeds ``0 .. K-1``:

* **pretrain**: the config ``pretrain_<dataset>`` (``task: masked_tokens`` on the training split's texts), a seed
  sweep in ``RUN_DIR/<dataset>/<mode>/pretrain`` ([run_sweep][experiments.app.sweep.run_sweep]);
* **scratch**: ``finetune_<dataset>`` with ``model.init_from=null``: the same recipe from random weights
  (``RUN_DIR/.../scratch``);
* **pretrained**: ``finetune_<dataset>`` with ``model.init_from`` the pretraining run of the same seed
  (``RUN_DIR/.../pretrained-s<seed>``).

Every run is traced at every layer and ends with the float64 descent check; the study records, per dataset and mode,
the test accuracy (fractions) of scratch and pretrained (mean, std, per seed), the pretraining time, the masked-token
accuracy on the held-out training texts (and that of always guessing the most frequent masked token), the
fine-tuned model's parameter count and the training accuracy of the scratch runs' last epoch (how much of the
training split the recipe fits), and the energy increases counted over every traced step (training trace and
final checks) of pretraining and fine-tuning. ``--out`` gets the JSON (written atomically after each row;
the rows of other datasets and modes already in it are kept, so that a study can run in parts); the Markdown table
of the documentation is generated from it (`markdown`, ``--table``), never typed by hand. Each row names its own
seeds.

Sweeps resume as [run_sweep][experiments.app.sweep.run_sweep] does: the same command again keeps finished runs.
``--quick``: the ``tiny`` config on a synthetic text set, one seed (a smoke run; its JSON goes to
``RUN_DIR/results.json`` unless ``--out`` names a file).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any, Dict, List, Optional, Sequence

from energies.errors import ConfigError
from unfold.cli import run_main
from unfold.strict_json import dumps as json_dumps

from ..app.plot_energy import load_history
from ..app.sweep import run_sweep, seed_dir
from ..runfolder.atomic import atomic_open

PROG = "python -m experiments.studies.pretraining"
#: the committed results the documentation's table is generated from
OUT = os.path.join("docs", "pretraining", "results.json")
DATASETS = ("rotten_tomatoes", "listops")
MODES = ("guaranteed", "baseline")
#: the config pair of each dataset: (pretraining, fine-tuning)
CONFIGS = {"rotten_tomatoes": ("pretrain_rt", "finetune_rt"), "listops": ("pretrain_listops", "finetune_listops")}
#: metrics.json keys counted as energy increases of a run (its training trace, the trained and untrained checks)
INCREASE_KEYS = ("train_energy_increases", "energy_increases", "energy_nonfinite")
SEED_KEYS = ("train.seed",)
#: ``--quick``'s overrides of the ``tiny`` config (with ``data.dataset`` a synthetic text set)
QUICK_OVERRIDES = ("data.glove=none", "model.layers=1", "train.epochs=1", "train.progress=false",
                   "train.tensorboard=false")


def _increases(metrics: Dict[str, Any]) -> int:
    """Every energy increase and non-finite step a run's metrics record (the training trace and both checks)."""
    total = sum(int(metrics.get(k) or 0) for k in INCREASE_KEYS)
    untrained = metrics.get("untrained") or {}
    return total + sum(int(untrained.get(k) or 0) for k in INCREASE_KEYS)


def _stat(values: Sequence[float]) -> Dict[str, Any]:
    vals = [float(v) for v in values]
    return {"mean": statistics.fmean(vals) if vals else None,
            "std": statistics.stdev(vals) if len(vals) > 1 else None, "values": vals}   # one seed: no spread


def _metrics(folder: str) -> Dict[str, Any]:
    with open(os.path.join(folder, "metrics.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _last_train_accuracy(folder: str) -> Optional[float]:
    """The training accuracy of a run's last epoch (its ``history.json``, read by
    [load_history][experiments.app.plot_energy.load_history]), or None for a run without one."""
    path = os.path.join(folder, "history.json")
    return load_history(path)[-1]["train_accuracy"] if os.path.exists(path) else None


def _masked_accuracy(metrics: Dict[str, Any]) -> Optional[float]:
    """A pretraining run's masked-token accuracy on its held-out texts, or None where it records none."""
    value = metrics.get("masked_accuracy")
    return float(value) if isinstance(value, (int, float)) else None


def run_pair(root: str, dataset: str, mode: str, seeds: Sequence[int], overrides: Sequence[str] = (),
             configs: Optional[tuple] = None, say=print) -> Dict[str, Any]:
    """Pretrain, fine-tune from scratch and from the pretrained run, for one dataset and mode (module docstring);
    returns the row of the results. ``configs``: ``(pretraining config, fine-tuning config)`` (default:
    `CONFIGS`); ``overrides``: applied to every run (``--quick``'s)."""
    pre_cfg, fine_cfg = configs or CONFIGS[dataset]
    base = [*overrides, f"model.mode={mode}"]
    where = os.path.join(root, dataset, mode)
    pre_root = os.path.join(where, "pretrain")
    run_sweep(pre_root, seeds, pre_cfg, [*base, "task=masked_tokens"], seed_keys=SEED_KEYS, say=say)
    run_sweep(os.path.join(where, "scratch"), seeds, fine_cfg, [*base, "model.init_from=null"], seed_keys=SEED_KEYS,
              say=say)
    for s in seeds:
        run_sweep(os.path.join(where, f"pretrained-s{s}"), [s], fine_cfg,
                  [*base, f"model.init_from={seed_dir(pre_root, s)}"], seed_keys=SEED_KEYS, say=say)
    pre = {s: _metrics(seed_dir(pre_root, s)) for s in seeds}
    scratch_root = os.path.join(where, "scratch")
    scratch = {s: _metrics(seed_dir(scratch_root, s)) for s in seeds}
    tuned = {s: _metrics(seed_dir(os.path.join(where, f"pretrained-s{s}"), s)) for s in seeds}
    return {"seeds": list(seeds),
            "scratch": _stat([scratch[s]["test_accuracy"] for s in seeds]),
            "pretrained": _stat([tuned[s]["test_accuracy"] for s in seeds]),
            "params": int(scratch[seeds[0]]["params"]),
            "scratch_train_accuracy": _stat([v for v in (_last_train_accuracy(seed_dir(scratch_root, s)) for s in seeds)
                                             if v is not None]),
            "pretrain_seconds": _stat([pre[s]["train_seconds"] for s in seeds]),
            "masked_accuracy": _stat([v for v in (_masked_accuracy(pre[s]) for s in seeds) if v is not None]),
            "unigram_masked_accuracy": _stat([pre[s]["unigram_masked_accuracy"] for s in seeds
                                              if isinstance(pre[s].get("unigram_masked_accuracy"), (int, float))]),
            "energy_increases": {"pretrain": sum(_increases(pre[s]) for s in seeds),
                                 "scratch": sum(_increases(scratch[s]) for s in seeds),
                                 "pretrained": sum(_increases(tuned[s]) for s in seeds)},
            "traced_steps": {"pretrain": sum(int(pre[s].get("train_energy_steps") or 0) for s in seeds),
                             "fine_tune": sum(int(m.get("train_energy_steps") or 0)
                                              for m in [*scratch.values(), *tuned.values()])}}


def _pct(stat: Dict[str, Any]) -> str:
    if stat.get("mean") is None:
        return "-"
    if stat.get("std") is None:
        return f"{100 * stat['mean']:.2f}"
    return f"{100 * stat['mean']:.2f} ± {100 * stat['std']:.2f}"


def markdown(results: Dict[str, Any]) -> str:
    """The documentation's table of ``results`` (test accuracy in %, mean ± std over the seeds)."""
    lines = ["| dataset | mode | params | scratch (%) | pretrained (%) | masked-token acc. (%) | pretraining (s) | "
             "energy increases | seeds |", "|---|---|---|---|---|---|---|---|---|"]     # mean ± std (one seed: mean)
    for dataset, modes in results["results"].items():
        for mode, row in modes.items():
            sec = row["pretrain_seconds"]
            inc = sum(row["energy_increases"].values())
            params = f"{row['params']:,}" if isinstance(row.get("params"), int) else "-"
            lines.append(f"| {dataset} | {mode} | {params} | {_pct(row['scratch'])} | {_pct(row['pretrained'])} | "
                         f"{_pct(row['masked_accuracy'])} | {sec['mean']:.0f} | {inc} | {len(row['seeds'])} |")
    return "\n".join(lines) + "\n"


def write_json(path: str, results: Dict[str, Any]) -> None:
    """``results`` as JSON at ``path``, atomically (the folder is created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path, "w") as fh:
        fh.write(json_dumps(results, indent=1) + "\n")


def _previous(path: str) -> Dict[str, Any]:
    """The results already in ``path`` (its rows of other datasets and modes are kept: a study run in parts, one
    ``--datasets``/``--modes`` at a time, fills one file), or empty results where there is no such file."""
    if not os.path.exists(path):
        return {"results": {}}
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise ConfigError(f"--out {path!r} holds no study results (a JSON object with 'results'): name another file")
    return {"results": doc["results"]}


def _list(text: str, valid: Sequence[str], flag: str) -> List[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in valid]
    if not items or bad or len(set(items)) != len(items):
        raise ConfigError(f"{flag} {text!r}: expected distinct names among {list(valid)}")
    return items


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Pretrain, then fine-tune: scratch against pretrained.")
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--run-dir", default=os.path.join("runs", "pretraining"))
    p.add_argument("--out", help=f"the results JSON (default: {OUT}; with --quick: RUN_DIR/results.json)")
    p.add_argument("--table", metavar="JSON", help="print the Markdown table of a results file and stop")
    p.add_argument("--quick", action="store_true", help="tiny config on synthetic texts, one seed")
    return p


def _run(args: argparse.Namespace) -> int:
    if args.table:
        with open(args.table, encoding="utf-8") as fh:
            sys.stdout.write(markdown(json.load(fh)))
        return 0
    if not 1 <= args.seeds <= 100:
        raise ConfigError(f"--seeds {args.seeds}: expected 1 .. 100")
    datasets = _list(args.datasets, DATASETS, "--datasets")
    modes = _list(args.modes, MODES, "--modes")
    seeds = list(range(args.seeds))
    args.out = args.out or (os.path.join(args.run_dir, "results.json") if args.quick else OUT)
    results = _previous(args.out)
    overrides, configs = [], None
    if args.quick:                                  # the test suite's smoke run: offline, seconds
        from .variants import write_toy_data

        toy = write_toy_data(os.path.join(args.run_dir, "toy-data"), 160, 40, 0)
        overrides, configs = [f"data.dataset={toy}", *QUICK_OVERRIDES], ("tiny", "tiny")
        datasets, seeds = datasets[:1], seeds[:1]
    for dataset in datasets:
        for mode in modes:
            results["results"].setdefault(dataset, {})[mode] = run_pair(args.run_dir, dataset, mode, seeds,
                                                                        overrides, configs)
            write_json(args.out, results)          # after each row: a long study keeps what it finished
    sys.stdout.write(markdown(results))
    return 0


def main(argv=None) -> int:
    """Command line (module docstring); errors under [run_main][unfold.cli.run_main] (one line, exit 2)."""
    args = _parser().parse_args(argv)
    return run_main(PROG, lambda: _run(args), argv)


if __name__ == "__main__":
    sys.exit(main())
