"""Crash-safe training checkpoints: ``last.pt`` (and the one before it, ``prev.pt``) in a run folder.

Each is written through :func:`~experiments.atomic.atomic_open` (temporary file, flush, fsync,
rename), after the previous ``last.pt`` is renamed to ``prev.pt``: whenever a process dies, the
folder holds at least one complete checkpoint. A checkpoint holds everything a resumed run needs
to continue bit for bit: model, optimiser, scheduler, the torch (and CUDA) RNG states, the data
order generator, the epoch, history and counters, the config and the vocabulary. Loading tries
``last.pt`` and, when it cannot be read, says why and falls back to ``prev.pt``.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Tuple

import torch

from energies.errors import CheckpointError

from .atomic import atomic_open

__all__ = ["save_checkpoint", "load_checkpoint", "LAST", "PREV", "REQUIRED"]

LAST, PREV = "last.pt", "prev.pt"
REQUIRED = ("model", "optimizer", "scheduler", "torch_rng", "data_rng", "epoch", "config")


def save_checkpoint(run_dir: str, state: Dict[str, Any]) -> str:
    last, prev = os.path.join(run_dir, LAST), os.path.join(run_dir, PREV)
    if os.path.exists(last):
        os.replace(last, prev)
    with atomic_open(last) as fh:
        torch.save(state, fh)
    return last


def load_checkpoint(run_dir: str, map_location="cpu") -> Tuple[Dict[str, Any], str]:
    """``(state, path)`` of the newest loadable checkpoint; a clear error when none is."""
    tried = []
    for name in (LAST, PREV):
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            tried.append(f"{name}: missing")
            continue
        try:
            state = torch.load(path, map_location=map_location, weights_only=False)
            missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
            if missing:
                raise CheckpointError(f"keys {missing} missing")
            return state, path
        except Exception as exc:   # noqa: BLE001 -- any failure to read means: use the previous one
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            tried.append(f"{name}: {why}")
            print(f"checkpoint {path} cannot be loaded ({why}); trying the previous one", file=sys.stderr)
    raise CheckpointError(f"no loadable checkpoint in {run_dir} ({'; '.join(tried)})")
