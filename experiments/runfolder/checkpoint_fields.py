"""What a checkpoint may hold, checked field by field, and its checksum (split from `experiments.app.checkpoint`).

`state_digest` is the SHA-256 of a canonical encoding of every field (tensors by dtype, shape and bytes);
`seal` stores it under `DIGEST`; `validate_checkpoint` checks every field the trainer writes
(types, ranges, consistency between the history, the best epoch and the counters, finite weights and moments)
and names the file, the field and the value of the first that fails; `check_resume_state` checks the
optimiser and scheduler against the ones a resumed run builds.
"""
from __future__ import annotations

import hashlib
import math
import re
import reprlib
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from energies.errors import CheckpointError

REQUIRED = ("model", "optimizer", "scheduler", "torch_rng", "data_rng", "epoch", "config")
#: every key the trainer writes (a resumed run needs them all); ``DIGEST`` comes on top
TRAINER_KEYS = REQUIRED + ("cuda_rng", "history", "best_val", "best_epoch", "train_inc", "train_steps", "untrained",
                           "monitor", "elapsed", "vocab", "data_fingerprint")
#: the key holding the checkpoint's checksum (`state_digest` of everything else)
DIGEST = "sha256"
HISTORY_KEYS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "seconds",
                "train_energy_increases", "train_energy_steps")
#: the training-pass figures of `experiments.app.throughput`, in every record written since they exist (all or
#: none: a record of an older checkpoint has none of them)
THROUGHPUT_KEYS = ("train_tokens", "train_pass_seconds", "peak_memory_bytes", "peak_memory_growth_bytes")
#: containers nested deeper than this are refused before anything walks them (a crafted pickle can nest
#: lists 100,000 deep; the trainer's deepest value is 4 levels down)
MAX_NESTING = 32
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


def show(value: Any) -> str:
    """A short, safe ``repr`` for messages (bounded in length and depth, never recursing without end)."""
    if isinstance(value, torch.Tensor):
        return f"tensor(dtype={value.dtype}, shape={tuple(value.shape)})"
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 -- a message must never fail
        return f"<{type(value).__name__}>"


# -------------------------------------------------------------------------------------------------- checksum
def _nesting_problem(obj: Any, limit: int = MAX_NESTING) -> Optional[str]:
    """Why ``obj`` is too deeply nested to be walked, or None (iterative: never recurses itself)."""
    stack = [(obj, 0)]
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (dict, list, tuple)):
            if depth >= limit:
                return f"containers nested more than {limit} levels deep"
            items = x.values() if isinstance(x, dict) else x
            stack.extend((v, depth + 1) for v in items if isinstance(v, (dict, list, tuple)))
            if isinstance(x, dict):
                stack.extend((k, depth + 1) for k in x if isinstance(k, tuple))
    return None


def _feed(h, obj: Any) -> None:
    """Feed the canonical encoding of ``obj`` to the hash ``h`` (type tags, lengths, values, in order)."""
    if obj is None:
        h.update(b"N")
    elif isinstance(obj, bool):
        h.update(b"B1" if obj else b"B0")
    elif isinstance(obj, int):
        text = str(obj).encode()
        h.update(b"I" + struct.pack("<Q", len(text)) + text)
    elif isinstance(obj, float):
        h.update(b"F" + struct.pack("<d", obj))
    elif isinstance(obj, complex):
        h.update(b"C" + struct.pack("<dd", obj.real, obj.imag))
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(b"S" + struct.pack("<Q", len(data)) + data)
    elif isinstance(obj, (bytes, bytearray)):
        h.update(b"Y" + struct.pack("<Q", len(obj)) + bytes(obj))
    elif isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.cpu().contiguous()
        head = f"{t.dtype}|{tuple(t.shape)}".encode()
        h.update(b"T" + struct.pack("<Q", len(head)) + head)
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, dict):
        h.update(b"D" + struct.pack("<Q", len(obj)))
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update((b"L" if isinstance(obj, list) else b"U") + struct.pack("<Q", len(obj)))
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, (torch.dtype, torch.device, torch.Size)):
        text = repr(obj).encode()
        h.update(b"O" + struct.pack("<Q", len(text)) + text)
    else:   # not plain data: torch.save writes it, and safe_load refuses the file anyway (weights_only)
        text = f"{type(obj).__module__}.{type(obj).__qualname__}".encode()
        h.update(b"X" + struct.pack("<Q", len(text)) + text)


def state_digest(state: Dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical encoding of ``state`` without its `DIGEST` key (module docstring)."""
    problem = _nesting_problem(state)
    if problem:
        raise CheckpointError(f"the checkpoint holds {problem}")
    h = hashlib.sha256(b"unfolded-transformers/checkpoint/1\n")
    _feed(h, {k: v for k, v in state.items() if k != DIGEST})
    return h.hexdigest()


def seal(state: Dict[str, Any]) -> Dict[str, Any]:
    """A shallow copy of ``state`` with its checksum (`DIGEST`) set: what `save_checkpoint` writes."""
    out = {k: v for k, v in state.items() if k != DIGEST}
    out[DIGEST] = state_digest(out)
    return out


# ------------------------------------------------------------------------------------------------ validation
def _fail(path: str, field: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(f"{path}: {field} = {show(value)} {rule}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _count(path: str, field: str, x: Any) -> int:
    if not _is_int(x) or x < 0:
        raise _fail(path, field, x, "must be an integer >= 0")
    return x


def _finite(path: str, field: str, x: Any, lo: float = -math.inf, hi: float = math.inf) -> float:
    if not _is_num(x) or not math.isfinite(x) or not lo <= x <= hi:
        rule = "a finite number" + (f" in [{lo:g}, {hi:g}]" if math.isfinite(lo) and math.isfinite(hi) else
                                    f" >= {lo:g}" if math.isfinite(lo) else "")
        raise _fail(path, field, x, f"must be {rule}")
    return float(x)


def nonfinite_tensor(tensors: Dict[Any, Any]) -> Optional[Tuple[Any, str]]:
    """``(name, what)`` of the first floating tensor of ``tensors`` (a state dict) holding NaN or inf, or None."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            bad = ~torch.isfinite(t.detach())
            if bool(bad.any()):
                first = tuple(int(i) for i in bad.nonzero()[0]) if t.dim() else ()
                return name, f"{float(t.detach().reshape(-1)[bad.reshape(-1)][0].real)} at index {first}"
    return None


def _check_model(path: str, model: Any) -> None:
    if not isinstance(model, dict) or not model:
        raise _fail(path, "model", model, "must be a non-empty mapping of parameter names to tensors")
    for name, t in model.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise _fail(path, f"model[{show(name)}]", t, "must be a tensor under a parameter name")
    bad = nonfinite_tensor(model)
    if bad:
        raise CheckpointError(f"{path}: model weight {bad[0]!r} is not finite ({bad[1]})")


def _check_optimizer(path: str, opt: Any) -> None:
    if not isinstance(opt, dict):
        raise _fail(path, "optimizer", opt, "must be a mapping (an optimizer state_dict)")
    unknown = set(opt) - {"state", "param_groups"}
    if unknown:
        raise _fail(path, "optimizer", sorted(map(str, unknown)), "are keys an optimizer state_dict does not have")
    state = opt.get("state", {})
    if not isinstance(state, dict):
        raise _fail(path, "optimizer.state", state, "must be a mapping")
    for pid, entry in state.items():
        where = f"optimizer.state[{show(pid)}]"
        if not _is_int(pid) or pid < 0 or not isinstance(entry, dict):
            raise _fail(path, where, entry, "must be a mapping under a parameter index >= 0")
        for key, t in entry.items():
            f = f"{where}[{show(key)}]"
            if isinstance(t, torch.Tensor):
                if not (t.is_floating_point() or t.is_complex()):
                    continue
                bad = nonfinite_tensor({key: t})
                if bad:
                    raise CheckpointError(f"{path}: {f} is not finite ({bad[1]})")
                if key in ("step", "exp_avg_sq", "max_exp_avg_sq") and bool((t < 0).any()):
                    raise _fail(path, f, float(t.min()), "(its smallest value) must be >= 0")
            elif _is_num(t):
                _finite(path, f, t)
            elif not (t is None or isinstance(t, (bool, str))):
                raise _fail(path, f, t, "must be a tensor, a number or a string")
    groups = opt.get("param_groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise _fail(path, "optimizer.param_groups", groups, "must be a list of mappings")
    for i, g in enumerate(groups):
        for key, v in g.items():
            f = f"optimizer.param_groups[{i}][{show(key)}]"
            if key == "params":
                if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
                    raise _fail(path, f, v, "must be a list of parameter indices >= 0")
            elif key == "betas":
                if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(
                        _is_num(b) and math.isfinite(b) and 0 <= b < 1 for b in v):
                    raise _fail(path, f, v, "must be two numbers in [0, 1)")
            elif _is_num(v):
                _finite(path, f, v, lo=0.0) if key in ("lr", "eps", "weight_decay", "initial_lr", "max_lr",
                                                       "min_lr") else _finite(path, f, v)
            elif not (v is None or isinstance(v, (bool, str))):
                raise _fail(path, f, v, "must be a number, a flag or None")


def _check_plain_numbers(path: str, field: str, x: Any) -> None:
    """Every number in ``x`` (a scheduler state) is finite; every value is plain data."""
    stack = [(field, x)]
    while stack:
        f, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{f}[{show(k)}]", w) for k, w in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{f}[{i}]", w) for i, w in enumerate(v))
        elif _is_num(v):
            _finite(path, f, v)
        elif not (v is None or isinstance(v, (bool, str))):
            raise _fail(path, f, v, "must be plain data (numbers, strings, lists, mappings)")


def _check_rng(path: str, field: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1 or t.numel() == 0:
        raise _fail(path, field, t, "must be a non-empty 1-d byte tensor (a generator state)")


def _check_history(path: str, history: Any, epoch: Optional[int]) -> List[Dict[str, Any]]:
    if not isinstance(history, list):
        raise _fail(path, "history", history, "must be a list of one record per finished epoch")
    if epoch is not None and len(history) != epoch:
        raise _fail(path, "history", f"<{len(history)} records>", f"must hold one record per finished epoch ({epoch})")
    steps_before = 0
    for i, rec in enumerate(history):
        where = f"history[{i}]"
        if not isinstance(rec, dict) or set(rec) not in (set(HISTORY_KEYS), set(HISTORY_KEYS + THROUGHPUT_KEYS)):
            raise _fail(path, where, rec, f"must be a record with exactly the keys {list(HISTORY_KEYS)} (and "
                        f"{list(THROUGHPUT_KEYS)}, or none of those)")
        if not _is_int(rec["epoch"]) or rec["epoch"] != i + 1:
            raise _fail(path, f"{where}.epoch", rec["epoch"], f"must be {i + 1} (records are numbered 1, 2, ...)")
        timed = "train_pass_seconds" in rec
        for key in ("train_loss", "val_loss", "seconds") + (("train_pass_seconds",) if timed else ()):
            _finite(path, f"{where}.{key}", rec[key], lo=0.0)
        for key in ("train_tokens", "peak_memory_bytes", "peak_memory_growth_bytes") if timed else ():
            _count(path, f"{where}.{key}", rec[key])
        for key in ("train_accuracy", "val_accuracy"):
            _finite(path, f"{where}.{key}", rec[key], 0.0, 1.0)
        inc = _count(path, f"{where}.train_energy_increases", rec["train_energy_increases"])
        steps = _count(path, f"{where}.train_energy_steps", rec["train_energy_steps"])
        if inc > steps:
            raise _fail(path, f"{where}.train_energy_increases", inc, f"must be <= train_energy_steps ({steps})")
        if steps < steps_before:
            raise _fail(path, f"{where}.train_energy_steps", steps, f"must not fall below the epoch before's "
                        f"({steps_before}): the counts are cumulative")
        steps_before = steps
    return history


def _check_report(path: str, field: str, rep: Any) -> None:
    """The untrained model's energy report (``experiments.app.train.energy_stats``): counts >= 0 that agree with
    its verdict; a non-finite number only under the verdict "nonfinite"."""
    keys = ("energy_verdict", "energy_steps", "energy_increases", "energy_nonfinite", "energy_term_nonfinite",
            "energy_max_rel_increase", "energy_tol_rule", "energy_term_increases", "energy_first_mean",
            "energy_last_mean")
    if not isinstance(rep, dict) or set(rep) != set(keys):
        raise _fail(path, field, rep, f"must be an energy report with exactly the keys {list(keys)}")
    steps = _count(path, f"{field}.energy_steps", rep["energy_steps"])
    inc = _count(path, f"{field}.energy_increases", rep["energy_increases"])
    nonfinite = _count(path, f"{field}.energy_nonfinite", rep["energy_nonfinite"])
    for key, n in (("energy_increases", inc), ("energy_nonfinite", nonfinite)):
        if n > steps:
            raise _fail(path, f"{field}.{key}", n, f"must be <= energy_steps ({steps})")
    for key in ("energy_term_nonfinite", "energy_term_increases"):
        terms = rep[key]
        if not isinstance(terms, dict) or not all(isinstance(k, str) for k in terms):
            raise _fail(path, f"{field}.{key}", terms, "must map term names to counts")
        for k, v in terms.items():
            _count(path, f"{field}.{key}[{k!r}]", v)
    verdict = rep["energy_verdict"]
    right = "nonfinite" if nonfinite else ("increase" if inc else "descent")
    if verdict != right:
        raise _fail(path, f"{field}.energy_verdict", verdict, f"contradicts its counts ({inc} increases, "
                    f"{nonfinite} non-finite of {steps} steps: the verdict is {right!r})")
    if not isinstance(rep["energy_tol_rule"], str):
        raise _fail(path, f"{field}.energy_tol_rule", rep["energy_tol_rule"], "must be a string")
    rel = rep["energy_max_rel_increase"]
    if not _is_num(rel) or math.isnan(rel) or rel < 0 or (math.isinf(rel) and not nonfinite):
        raise _fail(path, f"{field}.energy_max_rel_increase", rel, "must be a number >= 0 (inf only with a "
                    "non-finite step)")
    for key in ("energy_first_mean", "energy_last_mean"):
        v = rep[key]
        if not _is_num(v) or (not math.isfinite(v) and not nonfinite):
            raise _fail(path, f"{field}.{key}", v, "must be a finite number (NaN or inf only with a non-finite step)")


def _check_monitor(path: str, mon: Any) -> None:
    from unfold.monitor import DescentMonitor

    keys = DescentMonitor.COUNTERS
    if not isinstance(mon, dict) or set(mon) != set(keys):
        raise _fail(path, "monitor", mon, f"must be the descent monitor's state with exactly the keys {list(keys)}")
    n = {k: _count(path, f"monitor.{k}", mon[k]) for k in ("steps", "flagged", "confirmed", "cleared")}
    if n["confirmed"] + n["cleared"] > n["flagged"]:
        raise _fail(path, "monitor.confirmed", n["confirmed"], f"+ cleared ({n['cleared']}) must be <= flagged "
                    f"({n['flagged']})")
    if not isinstance(mon["tol_rule"], str):
        raise _fail(path, "monitor.tol_rule", mon["tol_rule"], "must be a string")
    if not isinstance(mon["messages"], list) or not all(isinstance(m, str) for m in mon["messages"]):
        raise _fail(path, "monitor.messages", mon["messages"], "must be a list of strings")


def check_fingerprint(path: str, fp: Any) -> None:
    from .fingerprint import PARTS

    ok = isinstance(fp, dict) and set(fp) == set(PARTS) | {"sizes"} and all(
        isinstance(fp[p], str) and re.fullmatch(r"[0-9a-f]{64}", fp[p]) for p in PARTS)
    sizes = fp.get("sizes") if isinstance(fp, dict) else None
    ok = ok and isinstance(sizes, dict) and all(isinstance(k, str) and _is_int(v) and v >= 0 for k, v in sizes.items())
    if not ok:
        raise _fail(path, "data_fingerprint", fp, f"must map {list(PARTS)} to sha256 hex digests, and 'sizes' to "
                    "counts >= 0")


def _check_envelope(state: Any, path: str, require: Sequence[str]) -> None:
    """Check that ``state`` is a mapping, not nested too deep, with the required keys only, and its checksum."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint (a mapping)")
    problem = _nesting_problem(state)
    if problem:
        raise CheckpointError(f"{path} holds {problem}")
    missing = [k for k in require if k not in state]
    if missing:
        raise CheckpointError(f"{path}: keys {missing} missing")
    unknown = sorted(str(k) for k in state if k not in TRAINER_KEYS and k != DIGEST)
    if unknown:
        raise CheckpointError(f"{path}: keys {unknown} are not checkpoint fields")
    stored = state.get(DIGEST)
    if stored is None:
        raise CheckpointError(f"{path} has no checksum ({DIGEST!r}; written before checksums, or damaged): its "
                              "weights cannot be verified")
    if not isinstance(stored, str) or not re.fullmatch(r"[0-9a-f]{64}", stored):
        raise _fail(path, DIGEST, stored, "must be a 64-digit hex SHA-256")
    if state_digest(state) != stored:
        raise CheckpointError(f"{path}: checksum ({DIGEST}) differs from its content: the checkpoint was changed "
                              "after it was written (a weight or field edited, or bits flipped)")


def _check_training_state(path: str, state: Dict[str, Any]) -> None:
    """Check the model, optimizer, scheduler and generator states of ``state``."""
    _check_model(path, state["model"])
    _check_optimizer(path, state["optimizer"])
    if not isinstance(state["scheduler"], dict):
        raise _fail(path, "scheduler", state["scheduler"], "must be a mapping (a scheduler state_dict)")
    _check_plain_numbers(path, "scheduler", state["scheduler"])
    _check_rng(path, "torch_rng", state["torch_rng"])
    _check_rng(path, "data_rng", state["data_rng"])
    cuda = state.get("cuda_rng")
    if cuda is not None:
        if not isinstance(cuda, list):
            raise _fail(path, "cuda_rng", cuda, "must be None or a list of generator states")
        for i, t in enumerate(cuda):
            _check_rng(path, f"cuda_rng[{i}]", t)


def _check_epoch(path: str, state: Dict[str, Any], epochs: Optional[int]) -> int:
    """Check the config's shape and the last finished epoch against ``epochs`` (default: the config's); return it."""
    cfg = state["config"]
    if not isinstance(cfg, dict) or not all(isinstance(k, str) for k in cfg):
        raise _fail(path, "config", cfg, "must be a mapping of config sections")
    if epochs is None:
        own = cfg.get("train", {}).get("epochs") if isinstance(cfg.get("train"), dict) else None
        if own is not None:
            if not _is_int(own) or own < 1:
                raise _fail(path, "config.train.epochs", own, "must be an integer >= 1")
            epochs = own
    epoch = state["epoch"]
    if not _is_int(epoch) or epoch < 1 or (epochs is not None and epoch > epochs):
        span = f"[1, {epochs}] (train.epochs)" if epochs is not None else ">= 1"
        raise _fail(path, "epoch", epoch, f"must be an integer in {span}: the last finished epoch")
    return epoch


def _check_best(path: str, state: Dict[str, Any], epoch: int, history: Optional[List[Dict[str, Any]]]) -> None:
    """Check ``best_val`` and ``best_epoch`` against each other, the epoch and the history."""
    best_val, best_epoch = state.get("best_val"), state.get("best_epoch")
    if not _is_num(best_val) or not (best_val == -1 or 0 <= best_val <= 1) or math.isnan(best_val):
        raise _fail(path, "best_val", best_val, "must be a validation accuracy in [0, 1] (or -1: none yet)")
    if not _is_int(best_epoch) or not (best_epoch == -1 or 1 <= best_epoch <= epoch):
        raise _fail(path, "best_epoch", best_epoch, f"must be an epoch in [1, {epoch}] (or -1: none yet)")
    if history is not None:
        if history:
            top = max(r["val_accuracy"] for r in history)
            first = next(r["epoch"] for r in history if r["val_accuracy"] == top)
            if best_val != top:
                raise _fail(path, "best_val", best_val, f"must be the history's best validation accuracy ({top})")
            if best_epoch != first:
                raise _fail(path, "best_epoch", best_epoch, f"must be the first epoch that reached best_val "
                            f"({first})")
    if (best_val == -1) != (best_epoch == -1) or (best_val == -1 and history):
        raise _fail(path, "best_epoch", best_epoch, f"does not fit best_val = {show(best_val)} (-1 and -1 mean "
                    "no epoch evaluated yet)")


def _check_train_counts(path: str, state: Dict[str, Any], history: Optional[List[Dict[str, Any]]]) -> None:
    """Check ``train_inc`` <= ``train_steps``, neither beyond the last epoch's record."""
    inc = _count(path, "train_inc", state.get("train_inc"))
    steps = _count(path, "train_steps", state.get("train_steps"))
    if inc > steps:
        raise _fail(path, "train_inc", inc, f"must be <= train_steps ({steps})")
    if history:
        last = history[-1]
        if steps > last["train_energy_steps"] or inc > last["train_energy_increases"]:
            raise _fail(path, "train_steps", steps, f"(train_inc {inc}) must not exceed the last epoch's record "
                        f"({last['train_energy_steps']}, {last['train_energy_increases']})")


def _check_extras(path: str, state: Dict[str, Any]) -> None:
    """Check the optional fields present: the untrained report, monitor, elapsed time, vocabulary, fingerprint."""
    if "untrained" in state:
        _check_report(path, "untrained", state["untrained"])
    if "monitor" in state:
        _check_monitor(path, state["monitor"])
    if "elapsed" in state:
        _finite(path, "elapsed", state["elapsed"], lo=0.0)
    if "vocab" in state:
        vocab = state["vocab"]
        if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab) or len(set(vocab)) != len(vocab):
            raise _fail(path, "vocab", vocab, "must be a list of distinct token strings")
    if "data_fingerprint" in state:
        check_fingerprint(path, state["data_fingerprint"])


def validate_checkpoint(state: Any, path: str, epochs: Optional[int] = None,
                        require: Sequence[str] = REQUIRED) -> Dict[str, Any]:
    """``state`` if it is a checkpoint that can be trusted (module docstring: checksum, then every field);
    otherwise [`CheckpointError`][energies.CheckpointError] naming ``path``, the field and its value. ``epochs``: the run's
    ``train.epochs`` (default: the checkpoint's own config's); ``require``: the keys that must be present
    (`REQUIRED`, or `TRAINER_KEYS` to resume). Every key present is validated."""
    _check_envelope(state, path, require)
    _check_training_state(path, state)
    epoch = _check_epoch(path, state, epochs)
    history = _check_history(path, state["history"], epoch) if "history" in state else None
    if "best_val" in state or "best_epoch" in state:
        _check_best(path, state, epoch, history)
    if "train_inc" in state or "train_steps" in state:
        _check_train_counts(path, state, history)
    _check_extras(path, state)
    return state


def _check_resume_optimizer(ck: Dict[str, Any], path: str, optimizer: torch.optim.Optimizer) -> None:
    """Check the checkpoint's optimizer groups, hyper-parameters and moment shapes against ``optimizer``'s."""
    fresh = optimizer.state_dict()
    osd = ck["optimizer"]
    moving = {"lr", "betas", "params"}
    groups = osd.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(fresh["param_groups"]):
        raise _fail(path, "optimizer.param_groups", groups, f"must be {len(fresh['param_groups'])} parameter group(s)")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, (g, f) in enumerate(zip(groups, fresh["param_groups"])):
        if set(g) != set(f):
            raise _fail(path, f"optimizer.param_groups[{i}]", sorted(map(str, g)), f"must have the keys {sorted(f)}")
        for key in set(f) - moving:
            if g[key] != f[key] or type(g[key]) is not type(f[key]):
                raise _fail(path, f"optimizer.param_groups[{i}].{key}", g[key], f"must be {f[key]!r} (this run's)")
        if g["params"] != f["params"]:
            raise _fail(path, f"optimizer.param_groups[{i}].params", g["params"], f"must be {f['params']} (one index "
                        "per trainable parameter)")
        if list(g["betas"])[1:] != list(f["betas"])[1:]:
            raise _fail(path, f"optimizer.param_groups[{i}].betas", g["betas"], f"must keep beta2 = {f['betas'][1]}")
    state = osd.get("state", {})
    for pid, entry in state.items():
        if not _is_int(pid) or not 0 <= pid < len(params):
            raise _fail(path, "optimizer.state", pid, f"must index a parameter in [0, {len(params) - 1}]")
        shape = tuple(params[pid].shape)
        for key, t in entry.items():
            if isinstance(t, torch.Tensor) and t.dim() and tuple(t.shape) != shape:
                raise _fail(path, f"optimizer.state[{pid}][{key!r}]", t, f"must have the parameter's shape {shape}")


def _check_resume_scheduler(ck: Dict[str, Any], path: str, scheduler: Any, steps_per_epoch: int) -> None:
    """Check the checkpoint's scheduler keys, settings and counters against ``scheduler`` at the saved epoch."""
    fresh_s, ssd = scheduler.state_dict(), ck["scheduler"]
    if set(ssd) != set(fresh_s):
        raise _fail(path, "scheduler", sorted(map(str, ssd)), f"must have the keys {sorted(fresh_s)}")
    counters = {"last_epoch", "_step_count", "_last_lr", "_is_initial", "_get_lr_called_within_step"}
    for key in set(fresh_s) - counters:
        if ssd[key] != fresh_s[key]:
            raise _fail(path, f"scheduler.{key}", ssd[key], f"must be {show(fresh_s[key])} (this run's schedule)")
    step = int(ck["epoch"]) * steps_per_epoch
    if ssd.get("last_epoch") != step or not _is_int(ssd.get("last_epoch")):
        raise _fail(path, "scheduler.last_epoch", ssd.get("last_epoch"), f"must be {step} (epoch {ck['epoch']} x "
                    f"{steps_per_epoch} steps)")
    if "_step_count" in ssd and (not _is_int(ssd["_step_count"]) or ssd["_step_count"] != step + 1):
        raise _fail(path, "scheduler._step_count", ssd["_step_count"], f"must be {step + 1}")
    last_lr = ssd.get("_last_lr")
    if last_lr is not None and (not isinstance(last_lr, list) or len(last_lr) != len(fresh_s.get("_last_lr", [])) or
                                not all(_is_num(v) and math.isfinite(v) and v >= 0 for v in last_lr)):
        raise _fail(path, "scheduler._last_lr", last_lr, "must be one finite learning rate >= 0 per parameter group")
    for key in ("_is_initial", "_get_lr_called_within_step"):
        if key in ssd and not isinstance(ssd[key], bool):
            raise _fail(path, f"scheduler.{key}", ssd[key], "must be true or false")


def check_resume_state(ck: Dict[str, Any], path: str, optimizer: torch.optim.Optimizer, scheduler: Any,
                       steps_per_epoch: int) -> None:
    """Check the optimiser and scheduler state of the checkpoint ``ck`` (already `validate_checkpoint`-ed)
    against the ``optimizer`` and ``scheduler`` a resumed run has just built, before they are loaded: the same
    parameter groups and hyper-parameters (the learning rate and Adam's first beta move with the schedule), one
    moment per parameter with the parameter's shape, and the scheduler's own keys and settings with its step at
    ``epoch * steps_per_epoch`` (the checkpoint is written after an epoch's last step)."""
    _check_resume_optimizer(ck, path, optimizer)
    _check_resume_scheduler(ck, path, scheduler, steps_per_epoch)


# --------------------------------------------------------------------------------------------- save and load
