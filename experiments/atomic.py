"""Crash-safe file writes: everything the experiments write goes through :func:`atomic_open`."""
from __future__ import annotations

import os
import pathlib
import tempfile
from contextlib import contextmanager

FILE_MODE = 0o644  # mkstemp creates 0600 files


@contextmanager
def atomic_open(path, mode: str = "wb", file_mode: int = FILE_MODE):
    """Open a temporary file beside ``path`` for writing; on a clean exit flush, fsync and rename it
    over ``path``; on an exception delete it, so ``path`` is never left half written."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
