"""Crash-safe, checksummed, validated training checkpoints, and safe loading.

``last.pt`` (and the one before it, ``prev.pt``) in a run folder. `save_checkpoint` never puts the
only good checkpoint at risk:

1. the new state is written to a temporary file beside them (flush, fsync);
2. it is read back with `safe_load` and verified (checksum and every field, as on load) or deleted;
3. ``last.pt`` is moved to ``prev.pt`` only if it is itself loadable and verified (a corrupt or tampered
   ``last.pt`` is set aside as ``last.pt.corrupt`` and ``prev.pt`` kept);
4. the temporary file is renamed to ``last.pt`` (atomic).

Killed at any instant, the folder holds a loadable checkpoint: before 3 the old ``last.pt`` or ``prev.pt``;
between 3 and 4 ``prev.pt`` (the old ``last.pt``); after 4 both (tested by killing a process at every
stage, ``tests/test_run_safety.py``). Temporary files a killed save left behind are removed by
`clean_temporaries` when a run (re)starts in the folder, and when a run is interrupted (Ctrl-C).

A checkpoint holds everything a resumed run needs to continue bit for bit: model, optimiser, scheduler,
the torch (and CUDA) RNG states, the data order generator, the epoch, history and counters, the config
and the vocabulary. Loading tries ``last.pt`` and, when it cannot be read or does not verify, says why and
falls back to ``prev.pt``.

**Checksum.** Every checkpoint carries ``sha256``: the SHA-256 of a canonical encoding of everything else in
it (`state_digest`: every tensor's dtype, shape and bytes, every number, string and container, in
order). It is computed when the checkpoint is saved and recomputed when it is loaded; a checkpoint whose
checksum is missing or differs (a weight scaled after the save, a field edited, bits flipped) is refused
like an unreadable one. The checksum is not a signature: it catches changed files, not a writer who
recomputes it, which is why every field is validated as well.

**Validation** (`validate_checkpoint`, on every load, naming the file, the field and the value):
every tensor of the model and of the optimiser state is finite (and the optimiser's second moments
>= 0); ``epoch`` is an integer in [1, train.epochs]; ``history`` holds exactly one record per finished
epoch, numbered 1..epoch, with finite losses >= 0, accuracies in [0, 1], seconds >= 0 and energy counts
that are integers >= 0 (increases <= steps, steps never decreasing); ``best_val`` and ``best_epoch`` are
the history's best validation accuracy and the first epoch that reached it (``-1`` / ``-1``, the
trainer's "none yet", only with an empty history); ``train_inc``/``train_steps`` and the descent monitor's
counters are integers >= 0 that fit together; ``elapsed`` is finite and >= 0; the untrained model's
energy report has counts >= 0 and a verdict that agrees with them ("descent" only with no increase and no
non-finite step); RNG states are byte tensors. A key the trainer does not write is refused.
`check_resume_state` then checks the optimiser and scheduler state against the ones the resumed
run builds (the same hyper-parameters, one moment per parameter of the parameter's shape, the scheduler at
step ``epoch * steps_per_epoch`` of the same schedule).

**Never a non-finite checkpoint.** `save_checkpoint` refuses ([`CheckpointError`][energies.CheckpointError] naming the
parameter) to write a state whose model weights or optimiser moments are not finite, so ``last.pt``, which
messages call "the last good checkpoint", never holds NaN or inf weights.

**Loading never executes code.** Every ``.pt`` the project reads goes through `safe_load`:
``torch.load(..., weights_only=True)``, which accepts tensors and plain containers (dict, list, tuple,
str, numbers, None) only; anything else is refused with a [`CheckpointError`][energies.CheckpointError]
saying so (a pickled object from someone else could run arbitrary code when loaded). Whatever torch's
wording of the refusal (it changed between versions: "Unsupported global: GLOBAL x.y", "unsupported
GLOBAL x.y", or an unsupported opcode before any global was reached), a file whose pickle references a
class or function other than torch's own tensor rebuilders is reported as holding code -- found by a
static scan of its pickle opcodes (`pickletools`, which never executes anything) -- and never as
"truncated".
"""
from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import sys
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from energies.errors import CheckpointError

from ..runfolder.atomic import atomic_save, clean_temporaries, fsync_dir
from ..runfolder.checkpoint_fields import (DIGEST, REQUIRED, TRAINER_KEYS, check_fingerprint, check_resume_state,
                                nonfinite_tensor, seal, show, state_digest, validate_checkpoint)

__all__ = ["save_checkpoint", "load_checkpoint", "safe_load", "clean_temporaries", "state_digest", "seal",
           "validate_checkpoint", "check_resume_state", "check_fingerprint", "nonfinite_tensor", "show", "LAST",
           "PREV", "REQUIRED", "TRAINER_KEYS", "DIGEST"]

LAST, PREV = "last.pt", "prev.pt"
#: bytes of a refused file's pickle that are scanned for the globals it references
SCAN_LIMIT = 256 * 2 ** 20
#: test hook: called with the name of each stage of a save ("written", "verified", "rotated", "done")
STAGE_HOOK: Optional[Callable[[str], None]] = None

# ----------------------------------------------------------------------------------------------- safe loading
_GLOBAL_RE = re.compile(r"(?:unsupported|not an allowed|not allowed|blocked|forbidden)[^\n]*?\bglobal\b[:\s]*"
                        r"(?:GLOBAL\s+)?([A-Za-z_][\w.]*)", re.IGNORECASE)
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"}


def _harmless_global(qualified: str) -> bool:
    """A global that ``torch.save`` itself writes (tensor rebuilders, storages, dtypes, OrderedDict)."""
    module = qualified.rsplit(".", 1)[0] if "." in qualified else qualified
    return module == "torch" or module.startswith("torch.") or qualified == "collections.OrderedDict"


def _pickle_globals(data: bytes) -> List[str]:
    """The ``module.name`` globals referenced by the pickle stream(s) at the start of ``data``, found by
    `pickletools.genops` (a parser: nothing is imported or executed). Several pickles in a row (torch's
    legacy format) are followed until the first one that does not parse."""
    found: List[str] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        pushed: List[Any] = []
        memo: Dict[int, Any] = {}
        try:
            for op, arg, _ in pickletools.genops(stream):
                name = op.name
                if name in _STRING_OPS:
                    pushed.append(arg)
                elif name in ("GLOBAL", "INST") and isinstance(arg, str):
                    found.append(arg.replace(" ", "."))
                elif name == "STACK_GLOBAL" and len(pushed) >= 2:
                    found.append(f"{pushed[-2]}.{pushed[-1]}")
                elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                    memo[arg] = pushed[-1] if pushed else None
                elif name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1] if pushed else None
                elif name in ("GET", "BINGET", "LONG_BINGET"):
                    pushed.append(memo.get(arg))
                if name == "STOP":
                    break
            else:
                break
        except Exception:  # noqa: BLE001 -- the end of the pickles (or garbage): stop scanning
            break
    return found


def _code_globals(source) -> List[str]:
    """Globals other than torch's own that the pickle in ``source`` (a path, or a seekable binary file) references
    (a torch zip archive's ``data.pkl``, or the file itself read as a pickle); empty when none are found or it
    cannot be scanned."""
    try:
        if not isinstance(source, (str, os.PathLike)):
            source.seek(0)
        if zipfile.is_zipfile(source):
            if not isinstance(source, (str, os.PathLike)):
                source.seek(0)
            with zipfile.ZipFile(source) as zf:
                names = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
                if not names or zf.getinfo(names[0]).file_size > SCAN_LIMIT:
                    return []
                data = zf.read(names[0])
        elif isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as fh:
                data = fh.read(SCAN_LIMIT)
        else:
            source.seek(0)
            data = source.read(SCAN_LIMIT)
    except Exception:  # noqa: BLE001 -- unreadable: nothing found
        return []
    return [g for g in _pickle_globals(data) if not _harmless_global(g)]


def _holds_code(path: str, what: str) -> CheckpointError:
    return CheckpointError(f"{path} holds objects other than tensors and plain containers ({what}); it is "
                           "not loaded (weights_only=True refused it, loading could execute code)")


def safe_load(path, map_location="cpu", name: Optional[str] = None) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never code. A file that
    holds anything else, or cannot be read, raises [`CheckpointError`][energies.CheckpointError] naming the file and why: a
    reference to a class or function is reported as code (module docstring), never as truncation. ``path``
    may also be an open, seekable binary file, named in messages by ``name``."""
    if isinstance(path, (str, os.PathLike)):
        path = os.fspath(path)
        name = path
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: no such file")
    elif name is None:
        name = str(getattr(path, "name", "the file"))
    try:
        with warnings.catch_warnings():   # torch warns about pickle protocols it may not read: the refusal says it
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:   # noqa: BLE001 -- code, truncated, garbage, wrong format: all mean not loaded
        text = str(exc)
        match = _GLOBAL_RE.search(text)
        if match:          # a class or function reference: loading it would run its code
            raise _holds_code(name, match.group(1)) from None
        scanned = _code_globals(path)
        if scanned:
            raise _holds_code(name, ", ".join(dict.fromkeys(scanned))) from None
        if isinstance(exc, pickle.UnpicklingError):
            raise CheckpointError(f"{name} cannot be read as a checkpoint (not a torch.save file, or "
                                  "truncated)") from None
        first = text.strip().splitlines()[0][:200] if text.strip() else ""
        raise CheckpointError(f"{name} cannot be read as a checkpoint ({type(exc).__name__}: {first})") from None


def _stage(name: str) -> None:
    if STAGE_HOOK is not None:
        STAGE_HOOK(name)


def _problem(path: str, epochs: Optional[int] = None, require: Sequence[str] = REQUIRED) -> Optional[str]:
    """Why the checkpoint at ``path`` cannot be used (unreadable, or it does not verify), or None."""
    try:
        validate_checkpoint(safe_load(path), path, epochs, require)
    except CheckpointError as exc:
        return str(exc)
    return None


def _loadable(path: str) -> bool:
    return _problem(path) is None


def save_checkpoint(run_dir: str, state: Dict[str, Any]) -> str:
    """Write ``state`` (sealed with its checksum, `seal`) as ``last.pt`` by the four stages of the module
    docstring; returns its path. A state whose model weights or optimiser moments are not finite is refused
    before anything is written ([`CheckpointError`][energies.CheckpointError] naming the parameter): a diverged model never becomes
    the last good checkpoint."""
    last, prev = os.path.join(run_dir, LAST), os.path.join(run_dir, PREV)
    model = state.get("model")
    bad = nonfinite_tensor(model) if isinstance(model, dict) else None
    if bad:
        raise CheckpointError(f"checkpoint not written: model weight {bad[0]!r} is not finite ({bad[1]}); "
                              f"{last} is kept")
    opt_state = state.get("optimizer", {}).get("state", {}) if isinstance(state.get("optimizer"), dict) else {}
    for pid, entry in (opt_state.items() if isinstance(opt_state, dict) else ()):
        bad = nonfinite_tensor(entry) if isinstance(entry, dict) else None
        if bad:
            raise CheckpointError(f"checkpoint not written: optimizer state {bad[0]!r} of parameter {pid} is not "
                                  f"finite ({bad[1]}); {last} is kept")
    sealed = seal(state)
    staged = os.path.join(run_dir, ".last.pt.new.tmp")
    try:                                      # an exception or Ctrl-C from here on leaves no staged file behind
        atomic_save(sealed, staged)           # temporary file + fsync, renamed to the staged name
        _stage("written")
        if not _loadable(staged):
            why = _problem(staged)
            raise CheckpointError(f"the checkpoint just written to {staged} does not load back"
                                  f"{f' ({why})' if why else ''}; {last} is kept")
        _stage("verified")
        if os.path.exists(last):
            if _loadable(last):
                os.replace(last, prev)
            else:
                os.replace(last, last + ".corrupt")
                print(f"checkpoint {last} cannot be loaded; set aside as {last}.corrupt, {prev} kept", file=sys.stderr)
        _stage("rotated")
        os.replace(staged, last)
    except BaseException:
        if os.path.exists(staged):
            os.unlink(staged)
        raise
    fsync_dir(run_dir)
    _stage("done")
    return last


def load_checkpoint(run_dir: str, map_location="cpu", epochs: Optional[int] = None,
                    require: Sequence[str] = REQUIRED) -> Tuple[Dict[str, Any], str]:
    """``(state, path)`` of the newest checkpoint that loads and verifies (`validate_checkpoint` with
    ``epochs`` and ``require``): ``last.pt``, else ``prev.pt`` (the reason ``last.pt`` was passed over is printed);
    a [`CheckpointError`][energies.CheckpointError] listing what was tried when neither does."""
    tried = []
    for name in (LAST, PREV):
        path = os.path.join(run_dir, name)
        if not os.path.lexists(path):
            tried.append(f"{name}: missing")
            continue
        try:
            state = validate_checkpoint(safe_load(path, map_location=map_location), path, epochs, require)
            return state, path
        except CheckpointError as exc:
            why = str(exc)
            tried.append(f"{name}: {why}")
            print(f"checkpoint {path} cannot be loaded ({why}); trying the previous one", file=sys.stderr)
    raise CheckpointError(f"no loadable checkpoint in {run_dir} ({'; '.join(tried)})")
