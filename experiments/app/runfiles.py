"""A run folder's files, written and read by the training loop (`experiments.app.train`): the files of each epoch
(`save_epoch`: ``best.pt`` when validation improved, ``history.json``, the resumable checkpoint), the results of
a finished run (`save_results`: ``energy_trace.pt``, ``metrics.json``, the plots and, last, the bundle with its
model card, ``bundle.json`` written last of all), the line a finished run prints (`summary_line`), what is
said when a run stops (`last_good`) and the check that the same command pasted again finds its finished run
(`finished_run`).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

import torch

from energies.errors import ConfigError
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_save, atomic_write_text
from ..runfolder.runlock import Replacement, lock_owner
from .checkpoint import LAST, save_checkpoint
from .config import load_config


def last_good(run_dir: str) -> str:
    """A sentence naming the run's last good checkpoint and best model, or saying there are none yet (for the
    staging folder of an ``--overwrite``: that nothing was replaced)."""
    parent, name = os.path.split(os.path.abspath(run_dir))
    if name.startswith(".") and name.endswith(Replacement.SUFFIX):
        old = os.path.join(parent, name[1:-len(Replacement.SUFFIX)])
        return f"--overwrite: the new run did not complete, so nothing in {old} was replaced (its run is unchanged)."
    last, best = os.path.join(run_dir, LAST), os.path.join(run_dir, "best.pt")
    if not os.path.exists(last):
        return "No epoch finished: there is no checkpoint."
    return f"The last good checkpoint is {last} (resume: unfold-train --resume {run_dir}), " \
           f"the best model {best}."



def save_epoch(run, epoch: int, val_acc: float, elapsed: float) -> None:
    """The files of epoch ``epoch`` of ``run`` (`experiments.app.train.Run`), its history row already appended:
    ``best.pt`` when validation improved (the run's best updated), ``history.json`` and the resumable checkpoint
    (every piece of state ``--resume`` restores, the RNGs included; ``elapsed``: the training seconds so far)."""
    cfg, model = run.cfg, run.model
    if val_acc > run.best_val:
        run.best_val, run.best_epoch = val_acc, epoch
        atomic_save({"model": model.state_dict(), "config": cfg, "epoch": epoch, "val_accuracy": val_acc},
                    os.path.join(run.run_dir, "best.pt"))
    atomic_write_text(json_dumps(run.history, indent=1), os.path.join(run.run_dir, "history.json"))
    save_checkpoint(run.run_dir, {
        "model": model.state_dict(), "optimizer": run.opt.state_dict(), "scheduler": run.sched.state_dict(),
        "torch_rng": torch.get_rng_state(), "data_rng": run.gen.get_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "epoch": epoch, "history": run.history, "best_val": run.best_val, "best_epoch": run.best_epoch,
        "train_inc": run.train_inc, "train_steps": run.train_steps, "untrained": run.untrained,
        "monitor": run.monitor.state(), "elapsed": elapsed, "config": cfg,
        "vocab": run.vocab.itos, "data_fingerprint": run.data_fp})


def save_results(run, metrics: Dict[str, Any], energies, floor, state: Dict[str, Any], extra_layers: int) -> None:
    """A finished run's results: ``energy_trace.pt`` (the float64 check's trace), ``metrics.json``, the plots,
    and last the run folder made a bundle (``model.safetensors``, ``config.json``, the card; a task without
    labels, ``masked_tokens``, has no label names): ``bundle.json`` is the last file a run writes, so its
    presence is what says the run finished (`experiments.runfolder.runlock.check_fresh`, `finished_run`)."""
    cfg, run_dir = run.cfg, run.run_dir
    atomic_save({"energies": dict(energies), "resolution": energies.resolution, "indicators": list(energies.indicators),
                 "energy_min": floor, "extra_layers": extra_layers,
                 "dtype": cfg["train"]["check_dtype"], "mode": cfg["model"]["mode"],
                 "guaranteed": run.model.encoder.guaranteed}, os.path.join(run_dir, "energy_trace.pt"))
    atomic_write_text(json_dumps(metrics, indent=1), os.path.join(run_dir, "metrics.json"))
    from .plot_energy import plot_run

    plot_run(run_dir)
    from .bundle import write_run_bundle     # here: the Hub mixin's import is not paid before training starts

    labels = run.splits.label_names if run.task.labelled else []
    # last: bundle.json, the file that marks the run finished (a run killed before it is resumed, not replaced)
    write_run_bundle(run_dir, state["model"], cfg, labels, run.data_fp,  # the folder is a bundle:
                     run.splits.name, metrics=metrics)                   # model.safetensors, config.json, card


SUMMARY_KEYS = ("name", "mode", "test_accuracy", "val_accuracy", "train_seconds", "params", "energy_verdict",
                "energy_steps", "energy_increases", "energy_nonfinite", "energy_max_rel_increase")


#: the headline figures of a task other than classify, printed where metrics.json has them
TASK_SUMMARY_KEYS = ("task", "masked_accuracy", "masked_loss", "unigram_masked_accuracy")


def summary_line(metrics: Dict[str, Any]) -> str:
    """The one JSON line a finished run prints: its headline figures from ``metrics.json``."""
    summary = {k: metrics.get(k) for k in SUMMARY_KEYS}
    summary["untrained_energy_increases"] = (metrics.get("untrained") or {}).get("energy_increases")
    if metrics.get("task", "classify") != "classify":
        summary.update({k: metrics[k] for k in TASK_SUMMARY_KEYS if k in metrics})
    return json_dumps(summary)


def config_differences(a: Dict[str, Any], b: Dict[str, Any], prefix: str = "") -> list:
    """``(dotted key, a's value, b's value)`` for every leaf where two configs differ (a key missing on one side
    counts, its value None)."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += config_differences(x, y, f"{prefix}{key}.")
        elif x != y or type(x) is not type(y):
            out.append((f"{prefix}{key}", x, y))
    return out


def finished_run(cfg: Dict[str, Any], run_dir: str) -> Optional[Dict[str, Any]]:
    """The ``metrics.json`` of a finished run in ``run_dir`` trained with exactly ``cfg`` (the same command pasted
    again), after telling the user on stderr what is there and how to train again; ``None`` when ``run_dir``
    holds no finished run (training goes ahead, or the folder check refuses it as before). A finished run of
    another config is a `RunFolderError` naming the keys that differ. Reads only: no lock taken, nothing
    written, so the finished run stays byte-identical."""
    from .plot_energy import RunFileError, read_json
    from ..runfolder.runlock import RunFolderError

    metrics_path, config_path = (os.path.join(run_dir, f) for f in ("metrics.json", "config.yaml"))
    if not (os.path.isfile(metrics_path) and os.path.isfile(os.path.join(run_dir, "bundle.json"))):
        return None
    owner = lock_owner(run_dir)
    if os.path.lexists(Replacement(run_dir).stage) or (owner is not None and owner.held):
        return None     # a killed --overwrite to finish, or a run holding the folder: the usual path says which
    try:
        stored, metrics = load_config(config_path), read_json(metrics_path)
    except (ConfigError, RunFileError, OSError):
        return None         # not a readable finished run: the folder check says what it holds
    differ = config_differences(stored, cfg)
    if differ:
        shown = ", ".join(f"{k} ({there!r} there, {now!r} now)" for k, there, now in differ[:5])
        raise RunFolderError(f"run folder {run_dir!r} holds a finished run of another config: {shown}"
                             f"{f' and {len(differ) - 5} more' if len(differ) > 5 else ''}; train into a new "
                             "folder with --run-dir, or replace it with --overwrite")
    acc = metrics.get("test_accuracy", metrics.get("masked_accuracy"))
    print(f"{run_dir} already holds this finished run (same config; test accuracy "
          f"{acc if not isinstance(acc, float) else f'{acc:.4f}'}, energy verdict "
          f"{metrics.get('energy_verdict')!r}, {metrics.get('energy_increases')} increases in "
          f"{metrics.get('energy_steps')} layer-steps): nothing was trained or changed. Use it: "
          f"unfold-predict {run_dir} --text '...'. Train again: the same command with --run-dir NEW_FOLDER, "
          "or with --overwrite to replace it once the new run is complete.", file=sys.stderr)
    return metrics
