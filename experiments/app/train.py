"""Train an unfolded transformer on a text task: ``unfold-train --config FILE [k=v ...]``.

Writes to ``--run-dir`` (default ``runs/NAME``): ``config.yaml``, ``vocab.json``, ``best.pt`` (best
validation epoch), ``history.json``, ``energy_trace.pt`` (float64 per-example, per-layer, per-term
energies on the test set, checked in ``train.check_dtype``), ``metrics.json``, the plots
``energy_descent.png`` and ``training_curves.png``, and last the bundle (``bundle.json`` written last of all:
a folder without it holds an unfinished run, which ``--resume`` finishes).

This module is the loop (set-up, data, model, optimiser, epochs, resume, DDP); what the run learns is its task
(`experiments.app.tasks`: ``classify``, ``masked_tokens``), evaluation is `experiments.app.evaluation` and the
run folder's files `experiments.app.runfiles`.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import math
import os
import sys
import time
from typing import Any, Dict

import torch

from energies.errors import CheckpointError, ConfigError, EnergyError, StepError, TokenError, UnfoldError
from energies.memory import memory_available  # the one memory rule's reading (energies.memory)
from unfold.classifier import upgrade_state_dict
from unfold.monitor import DescentMonitor
from unfold.cli import run_main
from unfold.devices import check_device as _check_device
from unfold.plugins import add_import_arg

from .build import build_data, build_model, check_buildable, fingerprint
from .init_from import TRANSFERRED, check_compatible, read_pretrained, transfer_weights
from .graph_pin import GRAPH_FILE, is_graph_file, pin, read_edges, write_edges
from . import distributed
from .checkpoint import clean_temporaries, load_checkpoint, safe_load
from .config import (DEFAULTS, dump_config, dump_config_sources, load_config, load_config_sources, monitor_mode,
                     with_defaults)
from .evaluation import EXTRA_LAYERS, TrainingError, check_descent, evaluate
from .runfiles import finished_run, last_good, save_epoch, save_results, summary_line
from .tasks import task_of
from ..runfolder.atomic import atomic_write_text
from ..runfolder.fingerprint import compare_fingerprints
from ..runfolder.runlock import Replacement, RunLock, check_fresh, check_writable, refuse_links
from ..runfolder.runlog import LOGGER, MetricsLog, attach_log_file, close_logger, progress, run_logger
from .throughput import PassMeter, run_metrics

#: ``train.precision``: the autocast dtype of the training passes (None: none, the model's own float32)
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}


def check_precision(precision: str, device: torch.device) -> None:
    """``train.precision`` on ``device``, before any work: bfloat16 on a CUDA device needs one that supports it
    (compute capability 8.0 and up), else a [`ConfigError`][energies.ConfigError] naming the key, the value and the device."""
    if PRECISIONS[precision] is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"config key 'train.precision'={precision!r}: {torch.cuda.get_device_name(device)} "
                          f"(train.device={str(device)!r}) has no bfloat16 support; use train.precision=float32")


def training_precision(precision: str, device: torch.device):
    """The context of a training forward for ``train.precision``: ``torch.autocast(device.type, bfloat16)`` for
    bfloat16, nothing for float32. Only the training forward runs in it: the loss is taken of float32 logits, the
    backward and the optimiser step run outside it (as autocast asks), and validation, test accuracy and the
    test-set descent check (``train.check_dtype``, float64) run in full precision. The trace's energies stay
    float32 under it ([`unfold.Encoder.trace_values`][unfold.Encoder.trace_values])."""
    dtype = PRECISIONS[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def check_device(spec: str) -> torch.device:
    """``train.device`` as a device this machine has, before any work (`unfold.devices.check_device`)."""
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


def upgrade_checkpoint(ck: Dict[str, Any], model: torch.nn.Module) -> None:
    """A checkpoint written before the encoders were modules of their own, brought to today's layout in place: the
    model keys renamed (`unfold.classifier.upgrade_state_dict`) and the optimizer's per-parameter state
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


def make_scheduler(opt, lr: float, total_steps: int):
    """One-cycle schedule with 10 % warm-up (at least two steps of it: torch's OneCycleLR divides by
    zero when the warm-up is under two steps); a constant rate for runs of fewer than 4 steps."""
    if total_steps < 4:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps,
                                               pct_start=max(0.1, 2.5 / total_steps))


def train(cfg: Dict[str, Any], run_dir: str, resume: bool = False, overwrite: bool = False) -> Dict[str, Any]:
    """Train and evaluate (module docstring). ``resume``: continue from the run's last checkpoint
    (`experiments.app.checkpoint`), to the same result as an uninterrupted run. The run folder is locked for
    the whole run (`experiments.runfolder.runlock`): a second run into it is refused; a folder that holds a run
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


@dataclasses.dataclass
class Run:
    """What the phases of a training run share (`_train`): the config and folder, the data, the model and its
    optimiser, and the state that a checkpoint saves and ``--resume`` restores."""
    cfg: Dict[str, Any]
    run_dir: str
    resume: bool
    device: torch.device
    dd: Any = None                      # distributed.Dist
    log: Any = None                     # the run's logger (experiments.runfolder.runlog)
    splits: Any = None
    vocab: Any = None
    tensors: Dict[str, Any] = dataclasses.field(default_factory=dict)
    glove: Any = None
    data_fp: Any = None
    graph: Any = None                   # (edges, raw) of an edge-list graph, or None
    model: Any = None
    params: int = 0
    opt: Any = None
    sched: Any = None
    gen: Any = None
    steps_per_epoch: int = 0
    monitor: Any = None
    history: list = dataclasses.field(default_factory=list)
    best_val: float = -1.0
    best_epoch: int = -1
    train_inc: int = 0
    train_steps: int = 0
    untrained: Any = None
    start_epoch: int = 1
    task: Any = None                    # what the run learns (experiments.app.tasks)
    task_info: Dict[str, Any] = dataclasses.field(default_factory=dict)   # the task's data figures
    pretrained: Any = None              # what model.init_from gives (experiments.app.init_from), or None
    elapsed: float = 0.0


def _train(cfg: Dict[str, Any], run_dir: str, resume: bool, claim, device: torch.device) -> Dict[str, Any]:
    """One training run, phase by phase: set-up, data, model, the folder claimed, the optimiser and the state
    (fresh or resumed), the epochs, and the finish (test metrics, the float64 check, bundle, plots)."""
    run = Run(cfg, run_dir, resume, device)
    _set_up(run)
    _read_data(run)                      # a data error leaves the run folder untouched
    _build(run)
    if run.dd.is_main:
        _claim_folder(run, claim)        # a second run into the folder is refused from here on
    _optimiser(run)
    if resume:
        _restore(run)
    else:
        run.untrained = (check_descent(run.model, run.tensors["test"], cfg, run.device, "the untrained model",
                                       task=run.task)[0] if run.dd.is_main else None)
    if run.dd.is_main:
        attach_log_file(run_dir)
    train_seconds = _epochs(run)
    if not run.dd.is_main:
        distributed.teardown(run.dd)
        return {}
    return _finish(run, train_seconds)


def _set_up(run: Run) -> None:
    """Threads, seed, the distributed group (a CUDA rank's own device) and the logger."""
    tc = run.cfg["train"]
    if tc["threads"]:
        torch.set_num_threads(tc["threads"])
    torch.manual_seed(tc["seed"])
    run.dd = distributed.setup(run.device.type)
    if run.dd.enabled and run.device.type == "cuda":
        run.device = torch.device("cuda", run.dd.local_rank)
    run.log = run_logger()           # stderr, and RUN_DIR/train.log once the run is under way


def _read_data(run: Run) -> None:
    """The task, splits, vocabulary (with a mask token where the task needs one), the tensors the task trains,
    validates and tests on, GloVe matrix and data fingerprint; an edge-list graph read once
    (on resume, the run's own copy), trained on and copied into the run (so into its bundle)."""
    cfg = run.cfg
    run.task = task_of(cfg)
    vocab = shape = None
    if cfg["model"]["init_from"] is not None:       # its tokenizer and encoder, checked before anything is written
        run.pretrained = read_pretrained(cfg["model"]["init_from"])
        check_compatible(cfg, run.pretrained)
        vocab, shape = run.pretrained.vocab, tuple(run.pretrained.state["embedding.embed.weight"].shape)
    run.splits, run.vocab, tensors, run.glove = build_data(cfg, mask_token=run.task.mask_token, vocab=vocab,
                                                           embed_shape=shape)
    run.tensors, run.task_info = run.task.data(run.splits, run.vocab, tensors)
    run.data_fp = run.task.fingerprint(run.vocab) or fingerprint(cfg, run.splits, run.vocab)
    if is_graph_file(cfg["model"]["graph"]):
        kept = os.path.join(run.run_dir, GRAPH_FILE)
        source = kept if run.resume and os.path.isfile(kept) else cfg["model"]["graph"]
        run.graph = read_edges(source, ConfigError)


def _build(run: Run) -> None:
    """The model on its device; the allocator's failure is a refusal naming the size keys."""
    cfg = run.cfg
    try:
        model = build_model(cfg, len(run.vocab), run.splits.num_classes, run.glove, task=run.task)
        if run.pretrained is not None and not run.resume:       # (resumed: the checkpoint holds the weights)
            copied = transfer_weights(model, run.pretrained)
            run.log.info(f"model.init_from={cfg['model']['init_from']}: {len(copied)} embedding and encoder "
                         f"tensors loaded; a new {run.task.name} head")
        run.model = pin(model, run.graph[0] if run.graph else None).to(run.device)
    except Exception as exc:     # noqa: BLE001 -- only the allocator's errors are turned into a refusal
        if not allocation_failed(exc):
            raise
        raise ConfigError(f"model.d={cfg['model']['d']}: building the model ran out of memory on {run.device} "
                          f"({type(exc).__name__}); use a smaller model.d or model.layers") from None
    run.params = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    sizes = "/".join(str(run.task.size(run.tensors[part])) for part in ("train", "val", "test"))
    run.log.info(f"{cfg['name']}: mode={cfg['model']['mode']} params={run.params} train/val/test={sizes} "
                 f"vocab={len(run.vocab)}")


def _claim_folder(run: Run, claim) -> None:
    """Hold the run folder, drop a killed save's temporaries, and write what the run is (config, vocabulary,
    graph copy) -- on resume only what is missing."""
    claim()
    clean_temporaries(run.run_dir)
    if not run.resume:
        atomic_write_text(dump_config(run.cfg), os.path.join(run.run_dir, "config.yaml"))
        run.vocab.save(os.path.join(run.run_dir, run.vocab.file_name))    # vocab.json or tokenizer.json
    if run.graph is not None and (not run.resume or not os.path.isfile(os.path.join(run.run_dir, GRAPH_FILE))):
        write_edges(run.graph[1], run.run_dir)


def _optimiser(run: Run) -> None:
    """AdamW, the warm-up/cosine schedule, the data order's generator and the descent monitor."""
    tc = run.cfg["train"]
    run.opt = torch.optim.AdamW([p for p in run.model.parameters() if p.requires_grad], lr=tc["lr"],
                                weight_decay=tc["weight_decay"])
    run.steps_per_epoch = math.ceil(run.task.size(run.tensors["train"]) / tc["batch_size"])
    run.sched = make_scheduler(run.opt, tc["lr"], tc["epochs"] * run.steps_per_epoch)
    run.gen = torch.Generator().manual_seed(tc["seed"])
    run.monitor = DescentMonitor(monitor_mode(run.cfg))


def _restore(run: Run) -> None:
    """``--resume``: the last checkpoint (checksum and every field verified; else prev.pt; else refused), checked to
    belong to this config and these data, then every piece of state restored, so that the run ends as an
    uninterrupted one would."""
    from .checkpoint import TRAINER_KEYS, check_resume_state

    cfg, run_dir = run.cfg, run.run_dir
    ck, ck_path = load_checkpoint(run_dir, map_location=run.device, epochs=cfg["train"]["epochs"],
                                  require=TRAINER_KEYS)
    ck["config"] = with_defaults(ck["config"], DEFAULTS)   # keys added since it was written: their defaults
    upgrade_checkpoint(ck, run.model)
    if ck["config"] != cfg:
        raise CheckpointError(f"{ck_path} was written by another config than {run_dir}/config.yaml")
    stored_fp = ck.get("data_fingerprint")
    if not isinstance(stored_fp, dict):
        raise CheckpointError(f"{ck_path} holds no data fingerprint (written before fingerprints were stored, "
                              "or damaged): the data it was trained on cannot be checked; start a new run")
    changed = compare_fingerprints(stored_fp, run.data_fp)
    if changed:
        raise CheckpointError(f"the data of {run.splits.name} changed since {run_dir} started ({', '.join(changed)} "
                              "differ from the fingerprint in its checkpoint): resuming would bind the trained "
                              "weights to other words or examples; restore the data or start a new run")
    check_resume_state(ck, ck_path, run.opt, run.sched, run.steps_per_epoch)   # optimizer and schedule fit this run
    try:
        run.model.load_state_dict(ck["model"])
        run.opt.load_state_dict(ck["optimizer"])
        run.sched.load_state_dict(ck["scheduler"])
        run.gen.set_state(ck["data_rng"])
        torch.set_rng_state(ck["torch_rng"])
        if ck.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["cuda_rng"])
        run.history, run.best_val, run.best_epoch = list(ck["history"]), float(ck["best_val"]), int(ck["best_epoch"])
        run.train_inc, run.train_steps = int(ck["train_inc"]), int(ck["train_steps"])
        run.untrained, run.elapsed = dict(ck["untrained"]), float(ck["elapsed"])
        run.monitor.load_state(ck["monitor"])
        run.start_epoch = int(ck["epoch"]) + 1
    except (RuntimeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise CheckpointError(f"{ck_path} does not fit this run ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]})") from None
    run.log.info(f"resuming {run_dir} from {ck_path} after epoch {ck['epoch']}")


def _epochs(run: Run) -> float:
    """Every remaining epoch (`_epoch`, then `_end_epoch` on rank 0); a failure mid-run becomes a
    `TrainingError` saying where it stopped and what was kept. Returns the training seconds, the time trained
    before each interruption of a resumed run included."""
    tc, dd = run.cfg["train"], run.dd
    net = _training_net(run)
    t_start = time.perf_counter() - run.elapsed
    csv_log = MetricsLog(run.run_dir, tc["tensorboard"], resume_after=run.start_epoch - 1 if run.resume else None,
                         logger=run.log) if dd.is_main else None
    where = {"epoch": run.start_epoch, "batch": 0}   # for the message when interrupted
    try:
        for epoch in range(run.start_epoch, tc["epochs"] + 1):
            where["epoch"] = epoch
            sums = _epoch(run, net, epoch, where, csv_log, t_start)
            if dd.is_main:
                _end_epoch(run, epoch, sums, csv_log, t_start)
    except TrainingError:
        raise
    except (MemoryError, RuntimeError) as exc:
        if not allocation_failed(exc):
            raise
        raise TrainingError(f"out of memory on {run.device} at epoch {where['epoch']}, batch {where['batch']} "
                            f"({type(exc).__name__}): lower train.batch_size, data.max_len or model.d. "
                            + last_good(run.run_dir)) from None
    except UnfoldError as exc:   # e.g. diverged weights that the forward pass's input checks refuse
        # the forward's input checks on values computed from the weights (the data are token ids): divergence
        diverged = isinstance(exc, (TokenError, EnergyError, StepError))
        raise TrainingError(f"{exc}: stopping at epoch {where['epoch']}, batch {where['batch']}. "
                            + ("The weights have diverged: lower train.lr or set train.grad_clip. "
                               if diverged else "") + last_good(run.run_dir)) from None
    except KeyboardInterrupt:
        if dd.is_main:
            # this process holds the folder's lock: whatever write the Ctrl-C cut short leaves no temporary file
            clean_temporaries(run.run_dir)
            run.log.info(f"interrupted at epoch {where['epoch']}, batch {where['batch']}. {last_good(run.run_dir)}")
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
    _reduce_counts(run)
    return train_seconds


def _training_net(run: Run):
    """What the training forward runs: the model, wrapped for distributed training, compiled with
    ``train.compile`` (the same parameters, saved and evaluated through the model itself)."""
    net = run.model
    if run.dd.enabled:
        net = torch.nn.parallel.DistributedDataParallel(run.model, device_ids=[run.device.index]
                                                        if run.device.type == "cuda" else None)
    return torch.compile(net) if run.cfg["train"]["compile"] else net


def _reduce_counts(run: Run) -> None:
    """The trace's counts and the descent monitor's summed over the ranks (a collective: every rank calls it)."""
    dd, m = run.dd, run.monitor
    run.train_inc, run.train_steps = (int(distributed.all_sum(v, dd)) for v in (run.train_inc, run.train_steps))
    m.steps, m.flagged, m.confirmed, m.cleared = (int(distributed.all_sum(v, dd))
                                                  for v in (m.steps, m.flagged, m.confirmed, m.cleared))


def _epoch(run: Run, net, epoch: int, where: Dict[str, int], csv_log, t_start: float) -> Dict[str, Any]:
    """One epoch of training passes (shuffled by the run's generator; the trace's verdict on every batch, watched
    by the descent monitor); returns the epoch's sums, reduced over the ranks."""
    tc, dd, model = run.cfg["train"], run.dd, run.model
    model.train()
    bar = progress(run.steps_per_epoch, f"epoch {epoch}/{tc['epochs']}", tc["progress"] and dd.is_main)
    loss_sum = correct = seen = 0
    inc0, steps0 = run.train_inc, run.train_steps
    meter, tokens = PassMeter(run.device), 0    # the training passes only (experiments.app.throughput)
    meter.start()
    task = run.task
    frozen = ([p for name, p in model.named_parameters() if name.startswith(TRANSFERRED)]
              if epoch <= tc["freeze_encoder_epochs"] else [])     # train.freeze_encoder_epochs: the head alone
    for i, batch in enumerate(task.batches(run.tensors["train"], tc["batch_size"], run.gen, epoch), start=1):
        where["batch"] = i
        global_size = task.units(batch[2])      # what the global batch scores: texts, or masked positions
        ids, mask, targets, weight = distributed.shard(batch, dd)
        tokens += int(mask.sum()) if weight else 0      # real tokens, on the host: no device sync
        kwargs = task.forward_args(targets, run.device)     # from host tensors: no device sync
        ids, mask, labels = ids.to(run.device), mask.to(run.device), task.scored(targets).to(run.device)
        with training_precision(tc["precision"], run.device):
            out = net(ids, mask, trace=tc["trace"], **kwargs)
        loss = task.loss(out, labels, dd, weight, global_size)
        if not torch.isfinite(loss):
            raise TrainingError(f"loss is {loss.item()} at epoch {epoch}, batch {i}: stopping. "
                                + last_good(run.run_dir) + " Lower train.lr or set train.grad_clip.")
        lr = run.opt.param_groups[0]["lr"]
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in frozen:                                # the head alone: no step, no weight decay for the rest
            p.grad = None
        if tc["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        run.opt.step()
        run.sched.step()
        loss_value = loss.item()
        hits, units = int(task.hits(out, labels)), labels.numel()
        loss_sum += loss_value * (global_size / dd.world if dd.enabled else units)
        correct += hits * int(weight)
        seen += units * int(weight)
        row = csv_log is not None and not dd.enabled    # distributed: epoch rows only (global figures)
        energy = _count_energy(run, out, f"epoch {epoch}, batch {i}") if out.energies is not None and weight else {}
        if row:
            csv_log.write("step", epoch, (epoch - 1) * run.steps_per_epoch + i, loss=loss_value,
                          accuracy=hits / max(units, 1), lr=lr,
                          seconds=time.perf_counter() - t_start, **energy)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.4f}", acc=f"{correct / max(seen, 1):.4f}", refresh=False)
    bar.close()
    passes = meter.record(int(distributed.all_sum(tokens, dd)))    # before validation: not timed
    loss_sum, correct, seen = (distributed.all_sum(v, dd) for v in (loss_sum, correct, seen))
    g_inc, g_steps, e_inc, e_steps = (int(distributed.all_sum(v, dd)) for v in (
        run.train_inc, run.train_steps, run.train_inc - inc0, run.train_steps - steps0))    # collectives: every rank
    return {"loss_sum": loss_sum, "correct": correct, "seen": seen, "passes": passes, "g_inc": g_inc,
            "g_steps": g_steps, "e_inc": e_inc, "e_steps": e_steps}


def _count_energy(run: Run, out, where: str) -> Dict[str, Any]:
    """One batch's trace counted into the run (its steps and increases) and watched by the descent monitor; the
    figures of its ``metrics.csv`` row. A filler row (distributed, weight 0) is never counted (the caller's rule)."""
    rep = out.report(run.monitor.tol_factor)
    run.train_inc += rep.num_increases
    run.train_steps += rep.steps
    run.monitor.observe(run.model, out, where, report=rep)
    totals = rep.totals
    return {"energy_increases": rep.num_increases, "energy_steps": rep.steps,
            "energy_first_mean": float(totals[:, 0].mean()), "energy_last_mean": float(totals[:, -1].mean())}


def _end_epoch(run: Run, epoch: int, sums: Dict[str, Any], csv_log, t_start: float) -> None:
    """Rank 0 after an epoch: validation (the task's: held-out texts for ``masked_tokens``), the history row and
    log line, then the epoch's files (`experiments.app.runfiles.save_epoch`: ``best.pt`` when validation
    improved, ``history.json``, the resumable checkpoint)."""
    tc = run.cfg["train"]
    try:
        val_acc, val_loss, _ = evaluate(run.model, run.tensors["val"], tc["batch_size"], run.device,
                                        split="validation", task=run.task)
    except TrainingError as exc:
        raise TrainingError(f"{exc}: stopping after epoch {epoch}. {last_good(run.run_dir)}") from None
    seen = max(sums["seen"], 1)
    rec = {"epoch": epoch, "train_loss": sums["loss_sum"] / seen, "train_accuracy": sums["correct"] / seen,
           "val_loss": val_loss, "val_accuracy": val_acc, "seconds": time.perf_counter() - t_start,
           "train_energy_increases": sums["g_inc"], "train_energy_steps": sums["g_steps"], **sums["passes"]}
    run.history.append(rec)
    run.log.info(f"epoch {epoch}: train loss {rec['train_loss']:.4f} acc {rec['train_accuracy']:.4f} | "
                 f"val loss {val_loss:.4f} acc {val_acc:.4f}")
    csv_log.write("epoch", epoch, epoch * run.steps_per_epoch, loss=rec["train_loss"],
                  accuracy=rec["train_accuracy"], lr=run.opt.param_groups[0]["lr"], val_loss=val_loss,
                  val_accuracy=val_acc, seconds=rec["seconds"],
                  energy_increases=sums["e_inc"], energy_steps=sums["e_steps"])
    save_epoch(run, epoch, val_acc, time.perf_counter() - t_start)


def _finish(run: Run, train_seconds: float) -> Dict[str, Any]:
    """The best weights on the test split (``masked_tokens``: the held-out texts), the float64 descent check,
    ``metrics.json`` with the task's figures (``classify``: the majority-class comparison; ``masked_tokens``:
    masked accuracy, loss, perplexity and the unigram baseline), then the files
    (`experiments.app.runfiles.save_results`: the trace, metrics, plots and, last, the bundle)."""
    cfg, tc, model, log, task = run.cfg, run.cfg["train"], run.model, run.log, run.task
    state = safe_load(os.path.join(run.run_dir, "best.pt"), map_location=run.device)
    model.load_state_dict(state["model"])
    test_acc, test_loss, _ = evaluate(model, run.tensors["test"], tc["batch_size"], run.device, split="test",
                                      task=task)
    trained, energies, check_acc, floor = check_descent(model, run.tensors["test"], cfg, run.device,
                                                        "the trained model", task=task)
    scores = {"test_accuracy": test_acc, "test_loss": test_loss} if task.labelled else {}
    metrics = {
        "name": cfg["name"], "mode": cfg["model"]["mode"], "task": task.name, "dataset": run.splits.name,
        **scores, "val_accuracy": run.best_val, "best_epoch": run.best_epoch,
        ("check_dtype_test_accuracy" if task.labelled else "check_dtype_accuracy"): check_acc,
        "train_seconds": train_seconds, "params": run.params, "device": str(run.device),
        **trained,
        # steps of the check the kernels' own values flagged, decided by the exact evaluation (unfold.trace.settle)
        "energy_rechecked": energies.rechecked, "energy_cleared_exactly": energies.cleared,
        "untrained": run.untrained,
        "train_energy_increases": run.train_inc, "train_energy_steps": run.train_steps,
        "descent_monitor": run.monitor.summary(), "world_size": run.dd.world,
        "train_energy_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "train_precision": tc["precision"],     # the training passes' (autocast) precision; the trace stays float32
        **run_metrics(run.history, run.device),     # tokens/s and peak memory of the training passes, all epochs
    }
    metrics.update(task.metrics(test_acc, test_loss, run.task_info, run.tensors, run.splits))
    if run.pretrained is not None:
        metrics.update(run.pretrained.record())
    _warn_unlearned(metrics, log)
    save_results(run, metrics, energies, floor, state, EXTRA_LAYERS)
    from .bundle.card import checkpoint_sentence      # (the bundle, just written, has loaded it)

    log.info(checkpoint_sentence(metrics, tc["epochs"]))      # the log's last line: which weights were tested
    distributed.teardown(run.dd)
    return metrics


def _warn_unlearned(metrics: Dict[str, Any], log) -> None:
    """A warning where the model does no better than the trivial guess: the test set's most frequent class
    (``classify``), the most frequent masked token (``masked_tokens``)."""
    if metrics.get("no_better_than_majority"):
        log.warning(f"test accuracy {metrics['test_accuracy']:.4f} is no better than always predicting the test "
                    f"set's most frequent class ({metrics['majority_class_accuracy']:.4f}): this model has not "
                    "learned the task (more epochs, another learning rate, or more data?)")
    if "unigram_masked_accuracy" in metrics and metrics["masked_accuracy"] <= metrics["unigram_masked_accuracy"]:
        log.warning(f"masked-token accuracy {metrics['masked_accuracy']:.4f} is no better than always predicting "
                    f"the most frequent masked token ({metrics['unigram_masked_accuracy']:.4f}): this model has not "
                    "learned the task (more epochs, another learning rate, or more data?)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="unfold-train", description=__doc__.splitlines()[0])
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
    return run_main("unfold-train", lambda: _main(args), argv)


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


if __name__ == "__main__":
    sys.exit(main())
