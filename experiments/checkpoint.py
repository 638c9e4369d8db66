"""Crash-safe training checkpoints and safe loading.

``last.pt`` (and the one before it, ``prev.pt``) in a run folder. :func:`save_checkpoint` never puts the
only good checkpoint at risk:

1. the new state is written to a temporary file beside them (flush, fsync);
2. it is read back with :func:`safe_load` (verified loadable) or deleted;
3. ``last.pt`` is moved to ``prev.pt`` only if it is itself loadable (a corrupt ``last.pt`` is set aside as
   ``last.pt.corrupt`` and ``prev.pt`` kept);
4. the temporary file is renamed to ``last.pt`` (atomic).

Killed at any instant, the folder holds a loadable checkpoint: before 3 the old ``last.pt`` or ``prev.pt``;
between 3 and 4 ``prev.pt`` (the old ``last.pt``); after 4 both (tested by killing a process at every
stage, ``tests/test_run_safety.py``). Temporary files a killed save left behind are removed by
:func:`clean_temporaries` when a run (re)starts in the folder.

A checkpoint holds everything a resumed run needs to continue bit for bit: model, optimiser, scheduler,
the torch (and CUDA) RNG states, the data order generator, the epoch, history and counters, the config
and the vocabulary. Loading tries ``last.pt`` and, when it cannot be read, says why and falls back to
``prev.pt``.

**Loading never executes code.** Every ``.pt`` the project reads goes through :func:`safe_load`:
``torch.load(..., weights_only=True)``, which accepts tensors and plain containers (dict, list, tuple,
str, numbers, None) only; anything else is refused with a :class:`~energies.errors.CheckpointError`
saying so (a pickled object from someone else could run arbitrary code when loaded).
"""
from __future__ import annotations

import glob
import os
import pickle
import sys
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from energies.errors import CheckpointError

from .atomic import atomic_open

__all__ = ["save_checkpoint", "load_checkpoint", "safe_load", "clean_temporaries", "LAST", "PREV", "REQUIRED"]

LAST, PREV = "last.pt", "prev.pt"
REQUIRED = ("model", "optimizer", "scheduler", "torch_rng", "data_rng", "epoch", "config")
#: test hook: called with the name of each stage of a save ("written", "verified", "rotated", "done")
STAGE_HOOK: Optional[Callable[[str], None]] = None


def safe_load(path: str, map_location="cpu") -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never code. A file that
    holds anything else, or cannot be read, raises :class:`CheckpointError` naming the file and why."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        glob_line = [ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln]
        if glob_line:    # a class or function reference: loading it would run its code
            what = glob_line[0].split("Unsupported global:", 1)[-1].split(" was not", 1)[0].strip()
            raise CheckpointError(f"{path} holds objects other than tensors and plain containers ({what}); it is "
                                  "not loaded (weights_only=True refused it, loading could execute code)") from None
        raise CheckpointError(f"{path} cannot be read as a checkpoint (not a torch.save file, or truncated)") from None
    except Exception as exc:   # noqa: BLE001 -- truncated, garbage, wrong format: all mean unreadable
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise CheckpointError(f"{path} cannot be read as a checkpoint ({type(exc).__name__}: {first})") from None


def _stage(name: str) -> None:
    if STAGE_HOOK is not None:
        STAGE_HOOK(name)


def _loadable(path: str) -> bool:
    try:
        state = safe_load(path)
    except CheckpointError:
        return False
    return isinstance(state, dict) and all(k in state for k in REQUIRED)


def clean_temporaries(run_dir: str) -> None:
    """Remove temporary files that a killed save left in ``run_dir`` (only the run holding the folder's lock
    calls this)."""
    for tmp in glob.glob(os.path.join(run_dir, ".*.tmp")):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def save_checkpoint(run_dir: str, state: Dict[str, Any]) -> str:
    """Write ``state`` as ``last.pt`` by the four stages of the module docstring; returns its path."""
    last, prev = os.path.join(run_dir, LAST), os.path.join(run_dir, PREV)
    staged = os.path.join(run_dir, ".last.pt.new.tmp")
    with atomic_open(staged) as fh:           # temporary file + fsync, renamed to the staged name
        torch.save(state, fh)
    _stage("written")
    if not _loadable(staged):
        os.unlink(staged)
        raise CheckpointError(f"the checkpoint just written to {staged} does not load back; {last} is kept")
    _stage("verified")
    if os.path.exists(last):
        if _loadable(last):
            os.replace(last, prev)
        else:
            os.replace(last, last + ".corrupt")
            print(f"checkpoint {last} cannot be loaded; set aside as {last}.corrupt, {prev} kept", file=sys.stderr)
    _stage("rotated")
    os.replace(staged, last)
    _fsync_dir(run_dir)
    _stage("done")
    return last


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(run_dir: str, map_location="cpu") -> Tuple[Dict[str, Any], str]:
    """``(state, path)`` of the newest loadable checkpoint; a clear error when none is."""
    tried = []
    for name in (LAST, PREV):
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            tried.append(f"{name}: missing")
            continue
        try:
            state = safe_load(path, map_location=map_location)
            missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
            if missing:
                raise CheckpointError(f"keys {missing} missing")
            return state, path
        except CheckpointError as exc:
            why = str(exc)
            tried.append(f"{name}: {why}")
            print(f"checkpoint {path} cannot be loaded ({why}); trying the previous one", file=sys.stderr)
    raise CheckpointError(f"no loadable checkpoint in {run_dir} ({'; '.join(tried)})")
