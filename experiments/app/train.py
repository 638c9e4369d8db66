"""Train an unfolded transformer on a text task: ``python -m experiments.train --config FILE [k=v ...]``.

Writes to ``--run-dir`` (default ``runs/NAME``): ``config.yaml``, ``vocab.json``, ``best.pt`` (best
validation epoch), ``history.json``, ``energy_trace.pt`` (float64 per-example, per-layer, per-term
energies on the test set, checked in ``train.check_dtype``), ``metrics.json`` and the plots
``energy_descent.png`` and ``training_curves.png``.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import logging
import math
import os
import sys
import time
from typing import Any, Dict, Optional

import torch

from energies.errors import CheckpointError, ConfigError, EnergyError, StepError, TokenError, UnfoldError
from energies.memory import memory_available  # the one memory rule's reading (energies.memory)
from unfold.classifier import SequenceClassifier, upgrade_state_dict
from unfold.monitor import DescentMonitor
from unfold.cli import check_device as _check_device, run_main
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps
from unfold.trace import EnergyTrace, report_from_values, settle

from .atomic import atomic_save, atomic_write_text
from .build import build_data, build_model, check_buildable, fingerprint
from .graph_pin import GRAPH_FILE, is_graph_file, pin, read_edges, write_edges
from . import distributed
from .checkpoint import LAST, clean_temporaries, load_checkpoint, safe_load, save_checkpoint
from .config import (DEFAULTS, dump_config, dump_config_sources, load_config, load_config_sources, monitor_mode,
                     with_defaults)
from .fingerprint import compare_fingerprints
from .runlock import Replacement, RunLock, check_fresh, check_writable, refuse_links
from .runlog import LOGGER, MetricsLog, attach_log_file, close_logger, progress, run_logger
from .throughput import PassMeter, run_metrics

DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: ``train.precision``: the autocast dtype of the training passes (None: none, the model's own float32)
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}


def check_precision(precision: str, device: torch.device) -> None:
    """``train.precision`` on ``device``, before any work: bfloat16 on a CUDA device needs one that supports it
    (compute capability 8.0 and up), else a :class:`ConfigError` naming the key, the value and the device."""
    if PRECISIONS[precision] is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"config key 'train.precision'={precision!r}: {torch.cuda.get_device_name(device)} "
                          f"(train.device={str(device)!r}) has no bfloat16 support; use train.precision=float32")


def training_precision(precision: str, device: torch.device):
    """The context of a training forward for ``train.precision``: ``torch.autocast(device.type, bfloat16)`` for
    bfloat16, nothing for float32. Only the training forward runs in it: the loss is taken of float32 logits, the
    backward and the optimiser step run outside it (as autocast asks), and validation, test accuracy and the
    test-set descent check (``train.check_dtype``, float64) run in full precision. The trace's energies stay
    float32 under it (:meth:`unfold.encoders.Encoder.trace_values`)."""
    dtype = PRECISIONS[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def check_device(spec: str) -> torch.device:
    """``train.device`` as a device this machine has, before any work (:func:`unfold.cli.check_device`)."""
    return _check_device(spec, "train.device", ConfigError)


def check_memory(cfg: Dict[str, Any], params: int, device: torch.device) -> None:
    """Before any work (CPU runs): the model's weights, gradients and two Adam moments (float32), plus the
    float64 copy of the descent check, must fit in the memory this process may allocate -- a config that
    cannot is refused naming its size keys, not left to the allocator's error mid-run. A lower bound: the
    activations come on top."""
    if device.type != "cpu":
        return
    need = params * (4 * 4 + 8)
    free = memory_available()
    if free is not None and need > free:
        mc = cfg["model"]
        raise ConfigError(f"model.d={mc['d']}, model.heads={mc['heads']}, model.layers={mc['layers']}: the model has "
                          f"{params:,} parameters, whose weights, gradients and optimiser state need about "
                          f"{need / 2 ** 30:.2f} GiB, and this process may allocate {max(free, 0) / 2 ** 30:.2f} GiB "
                          "(memory limit or available memory); use a smaller model.d")


def allocation_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocator's out-of-memory error (host or device)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("DefaultCPUAllocator" in text or "out of memory" in text
                                               or "can't allocate memory" in text)


#: bytes a run needs on disk beyond its checkpoints (plots, JSON, vocabulary)
RUN_OVERHEAD_BYTES = 16 * 2 ** 20


def iterate(tensors, batch_size: int, shuffle: bool = False, generator: Optional[torch.Generator] = None):
    from ..data import batches

    ids, mask, labels = tensors
    return batches(ids, mask, labels, batch_size, shuffle=shuffle, generator=generator)


@torch.no_grad()
def evaluate(model: SequenceClassifier, tensors, batch_size: int, device, trace: bool = False, split: str = "eval",
             bar=None):
    """Accuracy, mean loss and (with ``trace``) the per-example energy trace ``{term: (N, T+1)}``. A logit or a
    loss that is not finite is never a metric: :class:`TrainingError` naming the split, how many examples and
    the first one (an accuracy of argmax over NaN would be a number that means nothing). ``bar``: a progress bar
    (:func:`experiments.app.runlog.progress`) advanced by one per batch."""
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    traces: list = []
    for ids, mask, labels in iterate(tensors, batch_size):
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        out = model(ids, mask, trace=trace)
        losses = torch.nn.functional.cross_entropy(out.logits.float(), labels, reduction="none")
        bad = ~(torch.isfinite(out.logits).all(-1) & torch.isfinite(losses))
        if bad.any():    # evaluation, not the hot path: one read per batch
            first = total + int(bad.nonzero()[0, 0])
            raise TrainingError(f"the model gives non-finite logits or loss on {int(bad.sum())} example(s) of the "
                                f"{split} split (first: example {first}, logits "
                                f"{out.logits[first - total].tolist()}, {str(out.logits.dtype).replace('torch.', '')}): "
                                "no metric is computed from them; the weights or the config (e.g. a tiny model.tau) "
                                "give a model that cannot be evaluated")
        loss_sum += float(losses.sum())
        correct += int((out.logits.argmax(-1) == labels).sum())
        total += int(labels.numel())
        if trace:       # flagged steps decided by the exact evaluation now, while this batch's states exist
            traces.append(settle(out.energies, out.states_dtype, guaranteed=out.guaranteed))
        if bar is not None:
            bar.update(1)
    energies = EnergyTrace.cat(traces) if trace and traces else None
    return correct / max(total, 1), loss_sum / max(total, 1), energies


def energy_stats(energies: Dict[str, torch.Tensor], dtype: torch.dtype, guaranteed: bool) -> Dict[str, Any]:
    rep = report_from_values(energies, dtype, guaranteed=guaranteed)
    return {"energy_verdict": rep.verdict, "energy_steps": rep.steps, "energy_increases": rep.num_increases,
            "energy_nonfinite": rep.num_nonfinite,
            "energy_term_nonfinite": {k: int(v.sum()) for k, v in rep.term_nonfinite.items()},
            "energy_max_rel_increase": rep.max_rel_increase(), "energy_tol_rule": rep.tol_rule,
            "energy_term_increases": {k: int(v.sum()) for k, v in rep.term_increases.items()},
            "energy_first_mean": float(rep.totals[:, 0].mean()), "energy_last_mean": float(rep.totals[:, -1].mean())}


EXTRA_LAYERS = 32


@torch.no_grad()
def energy_floor(model: SequenceClassifier, tensors, batch_size: int, device, extra: int = EXTRA_LAYERS, bar=None):
    """Per-example estimate of min E: the shared step unrolled ``extra`` layers past the trained depth
    (guaranteed mode; E is bounded below there); ``None`` for untied modes. ``bar`` as in :func:`evaluate`."""
    if not model.encoder.guaranteed:
        return None
    out = []
    for ids, mask, _ in iterate(tensors, batch_size):
        energies = model(ids.to(device), mask.to(device), layers=model.encoder.layers + extra).energies
        out.append(sum(energies.values()).min(dim=1).values.cpu())
        if bar is not None:
            bar.update(1)
    return torch.cat(out)


def check_descent(model: SequenceClassifier, tensors, cfg, device, what: str = "the model"):
    """The float64 (``train.check_dtype``) descent check on a copy of the model: every example, every layer.
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
                                    split=f"test ({tc['check_dtype']} check)", bar=bar)
        stats = energy_stats(energies, dtype, guaranteed=model.encoder.guaranteed)
        floor = energy_floor(checker, tensors, tc["batch_size"], device, bar=bar)
    return stats, energies, acc, floor


def upgrade_checkpoint(ck: Dict[str, Any], model: torch.nn.Module) -> None:
    """A checkpoint written before the encoders were modules of their own, brought to today's layout in place: the
    model keys renamed (:func:`unfold.classifier.upgrade_state_dict`) and the optimizer's per-parameter state
    permuted from the old parameter order (the checkpoint's key order) to the model's, so that every Adam moment
    stays with its parameter. A checkpoint of today's layout is left unchanged."""
    names = list(ck["model"])
    renamed = upgrade_state_dict({name: name for name in names})      # new name -> old name
    if all(new == old for new, old in renamed.items()):
        return
    ck["model"] = upgrade_state_dict(dict(ck["model"]))
    new_of = {old: new for new, old in renamed.items()}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    position = {name: j for j, name in enumerate(trainable)}
    old_order = [name for name in names if new_of[name] in position]   # the old optimizer's parameter order
    osd = ck["optimizer"]
    groups = osd["param_groups"]
    if len(groups) != 1 or len(groups[0]["params"]) != len(old_order) or len(old_order) != len(trainable):
        raise CheckpointError("the checkpoint's optimizer state does not match the model's parameters; start a new run")
    ids = groups[0]["params"]
    osd["state"] = {position[new_of[old]]: osd["state"][ids[i]] for i, old in enumerate(old_order) if ids[i] in osd["state"]}
    groups[0]["params"] = list(range(len(trainable)))


class TrainingError(UnfoldError):
    """Training cannot go on: the loss became NaN or infinite."""


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
    return f"The last good checkpoint is {last} (resume: python -m experiments.train --resume {run_dir}), " \
           f"the best model {best}."


def make_scheduler(opt, lr: float, total_steps: int):
    """One-cycle schedule with 10 % warm-up (at least two steps of it: torch's OneCycleLR divides by
    zero when the warm-up is under two steps); a constant rate for runs of fewer than 4 steps."""
    if total_steps < 4:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps,
                                               pct_start=max(0.1, 2.5 / total_steps))


def train(cfg: Dict[str, Any], run_dir: str, resume: bool = False, overwrite: bool = False) -> Dict[str, Any]:
    """Train and evaluate (module docstring). ``resume``: continue from the run's last checkpoint
    (:mod:`experiments.app.checkpoint`), to the same result as an uninterrupted run. The run folder is locked for
    the whole run (:mod:`experiments.app.runlock`): a second run into it is refused; a folder that holds a run
    already is refused unless ``overwrite``."""
    device = check_device(cfg["train"]["device"])
    check_precision(cfg["train"]["precision"], device)
    params = check_buildable(cfg)
    check_memory(cfg, params, device)
    # best + last + prev + the staged checkpoint, each model + two Adam moments in float32
    check_writable(run_dir, need_bytes=RUN_OVERHEAD_BYTES + 4 * 3 * 4 * params)
    lock = RunLock(run_dir)

    def claim() -> bool:
        """Hold the folder (creating it), finish or drop what a killed ``--overwrite`` left there, and refuse a
        folder that holds anything, unless resuming or overwriting; whether there is something to replace."""
        refuse_links(run_dir)
        lock.acquire()
        done = Replacement(run_dir).recover()
        if done:
            logging.getLogger(LOGGER).info(done)
        return False if resume else check_fresh(run_dir, overwrite)

    target, claim_target, replacement = run_dir, claim, None
    try:
        if os.path.isdir(run_dir) and distributed.rank_from_env() == 0:   # refuse a second run at once
            if claim():     # --overwrite of a folder holding something: the new run is staged, swapped in complete
                replacement = Replacement(run_dir)
                replacement.check()
                target, claim_target = replacement.stage, replacement.begin
        metrics = _train(cfg, target, resume, claim_target, device)
        if replacement is not None and metrics:
            from .bundle import load_model

            load_model(target)          # the new run loads as a bundle before it replaces anything
            replacement.commit()
        return metrics
    except BaseException:
        if replacement is not None:
            replacement.abort()         # nothing of the old run was touched
        raise
    finally:
        close_logger()
        if replacement is not None:
            replacement.release()
        lock.release()


def majority_class_accuracy(examples) -> float:
    """The accuracy of always predicting the most frequent label of ``examples`` (``(text, label)`` pairs): the
    score a model must beat to have learned anything (0.0 for no example)."""
    counts: Dict[Any, int] = {}
    for _, label in examples:
        counts[label] = counts.get(label, 0) + 1
    return max(counts.values()) / len(examples) if counts else 0.0


def _train(cfg: Dict[str, Any], run_dir: str, resume: bool, claim, device: torch.device) -> Dict[str, Any]:
    tc = cfg["train"]
    if tc["threads"]:
        torch.set_num_threads(tc["threads"])
    torch.manual_seed(tc["seed"])
    dd = distributed.setup(device.type)
    if dd.enabled and device.type == "cuda":
        device = torch.device("cuda", dd.local_rank)
    log = run_logger()           # stderr, and RUN_DIR/train.log once the run is under way
    splits, vocab, tensors, glove = build_data(cfg)  # a data error leaves the run folder untouched
    data_fp = fingerprint(cfg, splits, vocab)
    graph = None         # an edge-list graph is read once, trained on and copied into the run (so into its bundle)
    if is_graph_file(cfg["model"]["graph"]):
        kept = os.path.join(run_dir, GRAPH_FILE)
        source = kept if resume and os.path.isfile(kept) else cfg["model"]["graph"]
        graph = read_edges(source, ConfigError)
    try:
        model = pin(build_model(cfg, len(vocab), splits.num_classes, glove), graph[0] if graph else None).to(device)
    except Exception as exc:     # noqa: BLE001 -- only the allocator's errors are turned into a refusal
        if not allocation_failed(exc):
            raise
        raise ConfigError(f"model.d={cfg['model']['d']}: building the model ran out of memory on {device} "
                          f"({type(exc).__name__}); use a smaller model.d or model.layers") from None
    if dd.is_main:
        claim()                 # a second run into the folder is refused from here on
        clean_temporaries(run_dir)
        if not resume:
            atomic_write_text(dump_config(cfg), os.path.join(run_dir, "config.yaml"))
            vocab.save(os.path.join(run_dir, "vocab.json"))
        if graph is not None and (not resume or not os.path.isfile(os.path.join(run_dir, GRAPH_FILE))):
            write_edges(graph[1], run_dir)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info(f"{cfg['name']}: mode={cfg['model']['mode']} params={params} train/val/test="
             f"{len(tensors['train'][2])}/{len(tensors['val'][2])}/{len(tensors['test'][2])} vocab={len(vocab)}")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc["lr"],
                            weight_decay=tc["weight_decay"])
    steps_per_epoch = math.ceil(len(tensors["train"][2]) / tc["batch_size"])
    sched = make_scheduler(opt, tc["lr"], tc["epochs"] * steps_per_epoch)
    gen = torch.Generator().manual_seed(tc["seed"])
    history = []
    best_val, best_epoch = -1.0, -1
    train_inc = train_steps = 0
    monitor = DescentMonitor(monitor_mode(cfg))
    start_epoch, elapsed = 1, 0.0
    if resume:
        from .checkpoint import TRAINER_KEYS, check_resume_state

        # checksum and every field verified, epoch in [1, train.epochs]; else prev.pt, else refused
        ck, ck_path = load_checkpoint(run_dir, map_location=device, epochs=tc["epochs"], require=TRAINER_KEYS)
        ck["config"] = with_defaults(ck["config"], DEFAULTS)   # keys added since it was written: their defaults
        upgrade_checkpoint(ck, model)
        if ck["config"] != cfg:
            raise CheckpointError(f"{ck_path} was written by another config than {run_dir}/config.yaml")
        stored_fp = ck.get("data_fingerprint")
        if not isinstance(stored_fp, dict):
            raise CheckpointError(f"{ck_path} holds no data fingerprint (written before fingerprints were stored, "
                                  "or damaged): the data it was trained on cannot be checked; start a new run")
        changed = compare_fingerprints(stored_fp, data_fp)
        if changed:
            raise CheckpointError(f"the data of {splits.name} changed since {run_dir} started ({', '.join(changed)} "
                                  "differ from the fingerprint in its checkpoint): resuming would bind the trained "
                                  "weights to other words or examples; restore the data or start a new run")
        check_resume_state(ck, ck_path, opt, sched, steps_per_epoch)   # optimizer and schedule fit this run
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            gen.set_state(ck["data_rng"])
            torch.set_rng_state(ck["torch_rng"])
            if ck.get("cuda_rng") is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(ck["cuda_rng"])
            history, best_val, best_epoch = list(ck["history"]), float(ck["best_val"]), int(ck["best_epoch"])
            train_inc, train_steps = int(ck["train_inc"]), int(ck["train_steps"])
            untrained, elapsed = dict(ck["untrained"]), float(ck["elapsed"])
            monitor.load_state(ck["monitor"])
            start_epoch = int(ck["epoch"]) + 1
        except (RuntimeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise CheckpointError(f"{ck_path} does not fit this run ({type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:300]})") from None
        log.info(f"resuming {run_dir} from {ck_path} after epoch {ck['epoch']}")
    else:
        untrained = check_descent(model, tensors["test"], cfg, device, "the untrained model")[0] if dd.is_main else None
    if dd.is_main:
        attach_log_file(run_dir)
    net = model
    if dd.enabled:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if tc["compile"]:   # the training forward only: the same parameters, saved and evaluated through model itself
        net = torch.compile(net)
    t_start = time.perf_counter() - elapsed
    csv_log = MetricsLog(run_dir, tc["tensorboard"], resume_after=start_epoch - 1 if resume else None,
                         logger=log) if dd.is_main else None
    where = {"epoch": start_epoch, "batch": 0}   # for the message when interrupted
    try:
        for epoch in range(start_epoch, tc["epochs"] + 1):
            model.train()
            bar = progress(steps_per_epoch, f"epoch {epoch}/{tc['epochs']}", tc["progress"] and dd.is_main)
            loss_sum = correct = seen = 0
            inc0, steps0 = train_inc, train_steps
            where["epoch"] = epoch
            meter, tokens = PassMeter(device), 0    # the training passes only (experiments.app.throughput)
            meter.start()
            for i, batch in enumerate(iterate(tensors["train"], tc["batch_size"], True, gen), start=1):
                where["batch"] = i
                global_size = len(batch[2])
                ids, mask, labels, weight = distributed.shard(batch, dd)
                tokens += int(mask.sum()) if weight else 0      # real tokens, on the host: no device sync
                ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
                with training_precision(tc["precision"], device):
                    out = net(ids, mask, trace=tc["trace"])
                logits = out.logits.float()     # the loss in float32 (a no-op at train.precision=float32)
                if dd.enabled:   # sum over this rank's share / global batch x world: DDP's average is the global mean
                    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum") * (
                        weight * dd.world / global_size)
                else:
                    loss = torch.nn.functional.cross_entropy(logits, labels)
                if not torch.isfinite(loss):
                    raise TrainingError(f"loss is {loss.item()} at epoch {epoch}, batch {i}: stopping. "
                                        + last_good(run_dir) + " Lower train.lr or set train.grad_clip.")
                lr = opt.param_groups[0]["lr"]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if tc["grad_clip"]:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
                opt.step()
                sched.step()
                loss_value = loss.item()
                hits = int((out.logits.argmax(-1) == labels).sum())
                loss_sum += loss_value * (global_size / dd.world if dd.enabled else labels.numel())
                correct += hits * int(weight)
                seen += labels.numel() * int(weight)
                energy = {}
                row = csv_log is not None and not dd.enabled    # distributed: epoch rows only (global figures)
                if out.energies is not None and weight:     # a filler row (distributed, weight 0) is not counted
                    rep = out.report(monitor.tol_factor)
                    train_inc += rep.num_increases
                    train_steps += rep.steps
                    monitor.observe(model, out, f"epoch {epoch}, batch {i}", report=rep)
                    if row:
                        totals = rep.totals
                        energy = {"energy_increases": rep.num_increases, "energy_steps": rep.steps,
                                  "energy_first_mean": float(totals[:, 0].mean()),
                                  "energy_last_mean": float(totals[:, -1].mean())}
                if row:
                    csv_log.write("step", epoch, (epoch - 1) * steps_per_epoch + i, loss=loss_value,
                                  accuracy=hits / labels.numel(), lr=lr,
                                  seconds=time.perf_counter() - t_start, **energy)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.4f}", refresh=False)
            bar.close()
            passes = meter.record(int(distributed.all_sum(tokens, dd)))    # before validation: not timed
            loss_sum, correct, seen = (distributed.all_sum(v, dd) for v in (loss_sum, correct, seen))
            g_inc, g_steps, e_inc, e_steps = (int(distributed.all_sum(v, dd)) for v in (
                train_inc, train_steps, train_inc - inc0, train_steps - steps0))    # collectives: every rank
            if not dd.is_main:
                continue
            try:
                val_acc, val_loss, _ = evaluate(model, tensors["val"], tc["batch_size"], device, split="validation")
            except TrainingError as exc:
                raise TrainingError(f"{exc}: stopping after epoch {epoch}. {last_good(run_dir)}") from None
            rec = {"epoch": epoch, "train_loss": loss_sum / seen, "train_accuracy": correct / seen,
                   "val_loss": val_loss, "val_accuracy": val_acc, "seconds": time.perf_counter() - t_start,
                   "train_energy_increases": g_inc, "train_energy_steps": g_steps, **passes}
            history.append(rec)
            log.info(f"epoch {epoch}: train loss {rec['train_loss']:.4f} acc {rec['train_accuracy']:.4f} | "
                     f"val loss {val_loss:.4f} acc {val_acc:.4f}")
            csv_log.write("epoch", epoch, epoch * steps_per_epoch, loss=rec["train_loss"],
                          accuracy=rec["train_accuracy"], lr=opt.param_groups[0]["lr"], val_loss=val_loss,
                          val_accuracy=val_acc, seconds=rec["seconds"],
                          energy_increases=e_inc, energy_steps=e_steps)
            if val_acc > best_val:
                best_val, best_epoch = val_acc, epoch
                atomic_save({"model": model.state_dict(), "config": cfg, "epoch": epoch, "val_accuracy": val_acc},
                            os.path.join(run_dir, "best.pt"))
            atomic_write_text(json_dumps(history, indent=1), os.path.join(run_dir, "history.json"))
            save_checkpoint(run_dir, {
                "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "torch_rng": torch.get_rng_state(), "data_rng": gen.get_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "epoch": epoch, "history": history, "best_val": best_val, "best_epoch": best_epoch,
                "train_inc": train_inc, "train_steps": train_steps, "untrained": untrained,
                "monitor": monitor.state(), "elapsed": time.perf_counter() - t_start, "config": cfg,
                "vocab": vocab.itos, "data_fingerprint": data_fp})
    except TrainingError:
        raise
    except (MemoryError, RuntimeError) as exc:
        if not allocation_failed(exc):
            raise
        raise TrainingError(f"out of memory on {device} at epoch {where['epoch']}, batch {where['batch']} "
                            f"({type(exc).__name__}): lower train.batch_size, data.max_len or model.d. "
                            + last_good(run_dir)) from None
    except UnfoldError as exc:   # e.g. diverged weights that the forward pass's input checks refuse
        # the forward's input checks on values computed from the weights (the data are token ids): divergence
        diverged = isinstance(exc, (TokenError, EnergyError, StepError))
        raise TrainingError(f"{exc}: stopping at epoch {where['epoch']}, batch {where['batch']}. "
                            + ("The weights have diverged: lower train.lr or set train.grad_clip. "
                               if diverged else "") + last_good(run_dir)) from None
    except KeyboardInterrupt:
        if dd.is_main:
            # this process holds the folder's lock: whatever write the Ctrl-C cut short leaves no temporary file
            clean_temporaries(run_dir)
            log.info(f"interrupted at epoch {where['epoch']}, batch {where['batch']}. {last_good(run_dir)}")
        raise
    finally:
        if csv_log is not None:
            csv_log.close()
    train_seconds = time.perf_counter() - t_start
    if dd.enabled:
        # the DDP wrapper's reducer holds the process group: free it now, on every rank while all are alive, so
        # that the group's last reference goes in teardown (after its barrier). Freed with this frame instead,
        # after the other rank had exited, ProcessGroupGloo's destructor waited on its worker threads for ever
        # (rank 0 hung after writing metrics.json; seen once in the suite).
        net = None
        gc.collect()
    train_inc, train_steps = (int(distributed.all_sum(v, dd)) for v in (train_inc, train_steps))
    monitor.steps, monitor.flagged, monitor.confirmed, monitor.cleared = (
        int(distributed.all_sum(v, dd)) for v in (monitor.steps, monitor.flagged, monitor.confirmed, monitor.cleared))
    if not dd.is_main:
        distributed.teardown(dd)
        return {}
    state = safe_load(os.path.join(run_dir, "best.pt"), map_location=device)
    model.load_state_dict(state["model"])
    test_acc, test_loss, _ = evaluate(model, tensors["test"], tc["batch_size"], device, split="test")
    trained, energies, check_acc, floor = check_descent(model, tensors["test"], cfg, device, "the trained model")
    atomic_save({"energies": dict(energies), "resolution": energies.resolution, "indicators": list(energies.indicators),
                 "energy_min": floor, "extra_layers": EXTRA_LAYERS,
                 "dtype": tc["check_dtype"], "mode": cfg["model"]["mode"], "guaranteed": model.encoder.guaranteed},
                os.path.join(run_dir, "energy_trace.pt"))
    metrics = {
        "name": cfg["name"], "mode": cfg["model"]["mode"], "dataset": splits.name,
        "test_accuracy": test_acc, "test_loss": test_loss, "val_accuracy": best_val, "best_epoch": best_epoch,
        "check_dtype_test_accuracy": check_acc,
        "train_seconds": train_seconds, "params": params, "device": str(device),
        **trained,
        # steps of the check the kernels' own values flagged, decided by the exact evaluation (unfold.trace.settle)
        "energy_rechecked": energies.rechecked, "energy_cleared_exactly": energies.cleared,
        "untrained": untrained,
        "train_energy_increases": train_inc, "train_energy_steps": train_steps,
        "descent_monitor": monitor.summary(), "world_size": dd.world,
        "train_energy_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "train_precision": tc["precision"],     # the training passes' (autocast) precision; the trace stays float32
        **run_metrics(history, device),     # tokens/s and peak memory of the training passes, all epochs
    }
    majority = majority_class_accuracy(splits.test)
    metrics["majority_class_accuracy"] = majority
    metrics["no_better_than_majority"] = bool(test_acc <= majority + 1e-12)
    if metrics["no_better_than_majority"]:
        log.warning(f"test accuracy {test_acc:.4f} is no better than always predicting the test set's most frequent "
                    f"class ({majority:.4f}): this model has not learned the task (more epochs, another learning "
                    "rate, or more data?)")
    atomic_write_text(json_dumps(metrics, indent=1), os.path.join(run_dir, "metrics.json"))
    from .bundle import write_run_bundle     # here: the Hub mixin's import is not paid before training starts

    write_run_bundle(run_dir, state["model"], cfg, splits.label_names, data_fp, splits.name,  # the folder is a
                     metrics=metrics)                                # bundle: model.safetensors, config.json, card
    from .plot_energy import plot_run

    plot_run(run_dir)
    distributed.teardown(dd)
    return metrics


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.train", description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--config", default=None, help="YAML config (experiments/configs/NAME.yaml)")
    p.add_argument("--run-dir", default=None, help="where the run writes (default runs/NAME)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what a folder holds (refused otherwise): the new run is trained beside it and "
                        "swapped in only when complete; files a run does not write are kept")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (after extends and overrides) as YAML, each key with where its "
                        "value came from, and exit without training or writing anything")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. model.layers=6 (anywhere on the "
                                                "line, before or after the options)")
    args = p.parse_intermixed_args(argv)
    return run_main("python -m experiments.train", lambda: _main(args), argv)


def _main(args) -> int:
    for flag, value in (("--resume", args.resume), ("--run-dir", args.run_dir)):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} must name a folder, got an empty path")
    if args.resume is not None:
        if args.config or args.overrides or args.run_dir is not None or args.overwrite:
            raise ConfigError("--resume RUN_DIR takes the run's own config.yaml: no --config, --run-dir, "
                              "--overwrite or overrides")
        run_dir = args.resume
        if not os.path.isdir(run_dir):
            raise CheckpointError(f"--resume {run_dir!r}: no such run folder")
        if args.print_config:
            print(dump_config_sources(*load_config_sources(os.path.join(run_dir, "config.yaml"))), end="")
            return 0
        cfg = load_config(os.path.join(run_dir, "config.yaml"))
        metrics = train(cfg, run_dir, resume=True)
    else:
        if args.print_config:      # nothing trained, nothing written
            print(dump_config_sources(*load_config_sources(args.config, args.overrides)), end="")
            return 0
        cfg = load_config(args.config, args.overrides)
        run_dir = args.run_dir if args.run_dir is not None else os.path.join("runs", cfg["name"])
        if not args.overwrite and distributed.rank_from_env() == 0:
            done = finished_run(cfg, run_dir)
            if done is not None:      # the same command again: say what is there, touch nothing, exit 0
                print(summary_line(done))
                return 0
        metrics = train(cfg, run_dir, overwrite=args.overwrite)
    if not metrics:      # a rank other than 0 of a distributed run: rank 0 reports
        return 0
    print(f"wrote {run_dir}/metrics.json, energy_descent.png, training_curves.png")
    print(summary_line(metrics))
    return 0


SUMMARY_KEYS = ("name", "mode", "test_accuracy", "val_accuracy", "train_seconds", "params", "energy_verdict",
                "energy_steps", "energy_increases", "energy_nonfinite", "energy_max_rel_increase")


def summary_line(metrics: Dict[str, Any]) -> str:
    """The one JSON line a finished run prints: its headline figures from ``metrics.json``."""
    summary = {k: metrics.get(k) for k in SUMMARY_KEYS}
    summary["untrained_energy_increases"] = (metrics.get("untrained") or {}).get("energy_increases")
    return json_dumps(summary)


def config_differences(a: Dict[str, Any], b: Dict[str, Any], prefix: str = "") -> list:
    """The dotted keys whose values differ between two configs (a key missing on one side counts)."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += config_differences(x, y, f"{prefix}{key}.")
        elif x != y or type(x) is not type(y):
            out.append(f"{prefix}{key}")
    return out


def finished_run(cfg: Dict[str, Any], run_dir: str) -> Optional[Dict[str, Any]]:
    """The ``metrics.json`` of a finished run in ``run_dir`` trained with exactly ``cfg`` (the same command pasted
    again), after telling the user on stderr what is there and how to train again; ``None`` when ``run_dir``
    holds no finished run (training goes ahead, or the folder check refuses it as before). A finished run of
    another config is a :class:`RunFolderError` naming the keys that differ. Reads only: no lock taken, nothing
    written, so the finished run stays byte-identical."""
    from .plot_energy import RunFileError, read_json
    from .runlock import RunFolderError

    metrics_path, config_path = (os.path.join(run_dir, f) for f in ("metrics.json", "config.yaml"))
    if not (os.path.isfile(metrics_path) and os.path.isfile(os.path.join(run_dir, "bundle.json"))):
        return None
    if os.path.lexists(Replacement(run_dir).stage) or _lock_held(run_dir):
        return None     # a killed --overwrite to finish, or a run holding the folder: the usual path says which
    try:
        stored, metrics = load_config(config_path), read_json(metrics_path)
    except (ConfigError, RunFileError, OSError):
        return None         # not a readable finished run: the folder check says what it holds
    differ = config_differences(stored, cfg)
    if differ:
        shown = ", ".join(f"{k} ({_dotted(stored, k)!r} there, {_dotted(cfg, k)!r} now)" for k in differ[:5])
        raise RunFolderError(f"run folder {run_dir!r} holds a finished run of another config: {shown}"
                             f"{f' and {len(differ) - 5} more' if len(differ) > 5 else ''}; train into a new "
                             "folder with --run-dir, or replace it with --overwrite")
    acc = metrics.get("test_accuracy")
    print(f"{run_dir} already holds this finished run (same config; test accuracy "
          f"{acc if not isinstance(acc, float) else f'{acc:.4f}'}, energy verdict "
          f"{metrics.get('energy_verdict')!r}, {metrics.get('energy_increases')} increases in "
          f"{metrics.get('energy_steps')} layer-steps): nothing was trained or changed. Use it: "
          f"unfold-predict {run_dir} --text '...'. Train again: the same command with --run-dir NEW_FOLDER, "
          "or with --overwrite to replace it once the new run is complete.", file=sys.stderr)
    return metrics


def _lock_held(run_dir: str) -> bool:
    """Whether a live process holds ``run_dir``'s run lock (:class:`RunLock`), found without taking it or writing:
    the lock file opened read-only and a shared lock tried without waiting."""
    import fcntl

    from .runlock import LOCK

    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _dotted(cfg: Dict[str, Any], key: str):
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return None
        cfg = cfg[part]
    return cfg


if __name__ == "__main__":
    sys.exit(main())
