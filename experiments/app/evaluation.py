"""Evaluation of a model during and after training: accuracy and loss of a split (`evaluate`), the energy trace's
statistics (`energy_stats`), the energy floor of a weight-shared encoder (`energy_floor`) and the float64 descent
check every run ends with (`check_descent`). Each takes the run's task (`experiments.app.tasks`): how a split's
encoded texts become batches of inputs and targets, and what is scored (``classify``: a label per text;
``masked_tokens``: the masked positions, masked the same way at every call).
"""
from __future__ import annotations

import copy
import logging
import math
from typing import Any, Dict

import torch

from energies.errors import UnfoldError
from unfold.trace import EnergyTrace, report_from_values, settle

from ..runfolder.runlog import LOGGER, progress
from .tasks.classify import Classify

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class TrainingError(UnfoldError):
    """Training cannot go on: the loss became NaN or infinite."""


def _task(task):
    """``task``, or ``classify`` where None (its batches and scores need no config)."""
    return Classify({}) if task is None else task


@torch.no_grad()
def evaluate(model: torch.nn.Module, tensors, batch_size: int, device, trace: bool = False, split: str = "eval",
             bar=None, task=None):
    """Accuracy, mean loss (per scored prediction: a text for ``classify``, a masked position for
    ``masked_tokens``) and (with ``trace``) the per-example energy trace ``{term: (N, T+1)}``. A logit or a loss
    that is not finite is never a metric: `TrainingError` naming the split, how many predictions and the
    first one (an accuracy of argmax over NaN would be a number that means nothing). ``bar``: a progress bar
    (`experiments.runfolder.runlog.progress`) advanced by one per batch. ``task``: the run's task (default:
    ``classify``)."""
    task = _task(task)
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    traces: list = []
    for ids, mask, targets in task.batches(tensors, batch_size):
        kwargs = task.forward_args(targets, device)
        ids, mask, labels = ids.to(device), mask.to(device), task.scored(targets).to(device)
        out = model(ids, mask, trace=trace, **kwargs)
        losses = task.losses(out, labels)
        bad = ~(torch.isfinite(out.logits).all(-1) & torch.isfinite(losses))
        if bad.any():    # evaluation, not the hot path: one read per batch
            first = total + int(bad.nonzero()[0, 0])
            raise TrainingError(f"the model gives non-finite logits or loss on {int(bad.sum())} example(s) of the "
                                f"{split} split (first: example {first}, logits "
                                f"{out.logits[first - total].tolist()}, {str(out.logits.dtype).replace('torch.', '')}): "
                                "no metric is computed from them; the weights or the config (e.g. a tiny model.tau) "
                                "give a model that cannot be evaluated")
        loss_sum += float(losses.sum())
        correct += int(task.hits(out, labels))
        total += int(labels.numel())
        if trace:       # flagged steps decided by the exact evaluation now, while this batch's states exist
            traces.append(settle(out.energies, out.states_dtype, guaranteed=out.guaranteed))
        if bar is not None:
            bar.update(1)
    energies = EnergyTrace.cat(traces) if trace and traces else None
    return correct / max(total, 1), loss_sum / max(total, 1), energies


def energy_stats(energies: Dict[str, torch.Tensor], dtype: torch.dtype, guaranteed: bool) -> Dict[str, Any]:
    """The figures of a trace's verdict (`unfold.trace.report_from_values`) for ``metrics.json``."""
    rep = report_from_values(energies, dtype, guaranteed=guaranteed)
    return {"energy_verdict": rep.verdict, "energy_steps": rep.steps, "energy_increases": rep.num_increases,
            "energy_nonfinite": rep.num_nonfinite,
            "energy_term_nonfinite": {k: int(v.sum()) for k, v in rep.term_nonfinite.items()},
            "energy_max_rel_increase": rep.max_rel_increase(), "energy_tol_rule": rep.tol_rule,
            "energy_term_increases": {k: int(v.sum()) for k, v in rep.term_increases.items()},
            "energy_first_mean": float(rep.totals[:, 0].mean()), "energy_last_mean": float(rep.totals[:, -1].mean())}


EXTRA_LAYERS = 32


@torch.no_grad()
def energy_floor(model: torch.nn.Module, tensors, batch_size: int, device, extra: int = EXTRA_LAYERS, bar=None,
                 task=None):
    """Per-example estimate of min E: the shared step unrolled ``extra`` layers past the trained depth
    (guaranteed mode; E is bounded below there); ``None`` for untied modes. ``bar``, ``task`` as in
    `evaluate` (the inputs the task gives)."""
    if not model.encoder.guaranteed:
        return None
    task = _task(task)
    out = []
    for ids, mask, targets in task.batches(tensors, batch_size):
        energies = model(ids.to(device), mask.to(device), layers=model.encoder.layers + extra,
                         **task.forward_args(targets, device)).energies
        out.append(sum(energies.values()).min(dim=1).values.cpu())
        if bar is not None:
            bar.update(1)
    return torch.cat(out)


def check_descent(model: torch.nn.Module, tensors, cfg, device, what: str = "the model", task=None):
    """The float64 (``train.check_dtype``) descent check on a copy of the model: every example, every layer
    (``task``: the run's, whose inputs are checked; ``masked_tokens``: the held-out texts, masked).
    Returns ``(stats, energies, accuracy, energy_min)``. Says what it does in the log and shows its progress
    (``train.progress``): on a CPU it is the longest silent stretch of a run otherwise."""
    tc = cfg["train"]
    dtype = DTYPES[tc["check_dtype"]]
    checker = copy.deepcopy(model).to(dtype)
    n, batches = len(tensors[2]), math.ceil(len(tensors[2]) / tc["batch_size"])
    logging.getLogger(LOGGER).info(f"checking the descent of {what}: {tc['check_dtype']}, every layer of {n} test "
                                   "examples" + (f", then {EXTRA_LAYERS} more layers for E_min"
                                                 if model.encoder.guaranteed else ""))
    with progress(batches * (2 if model.encoder.guaranteed else 1), f"descent check ({what})",
                  tc["progress"]) as bar:
        acc, _, energies = evaluate(checker, tensors, tc["batch_size"], device, trace=True,
                                    split=f"test ({tc['check_dtype']} check)", bar=bar, task=task)
        stats = energy_stats(energies, dtype, guaranteed=model.encoder.guaranteed)
        floor = energy_floor(checker, tensors, tc["batch_size"], device, bar=bar, task=task)
    return stats, energies, acc, floor


