"""One owner per run folder: an exclusive OS lock held for the whole run.

:class:`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``RUN_DIR/.lock`` and keeps the file open until
the run ends; the operating system releases it on any exit, SIGKILL included, so a stale lock cannot
outlive its process. A second run into the same folder (training, resume) is refused at once with a
:class:`RunFolderError` naming the folder and the pid that holds it. :func:`check_fresh` refuses to start
a new run in a folder that already holds one (finished or interrupted) unless ``overwrite`` is given.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
from typing import Optional

from energies.errors import UnfoldError
from unfold.cli import folder_problem

__all__ = ["RunLock", "RunFolderError", "check_fresh", "check_writable", "RUN_FILES"]

LOCK = ".lock"
#: files that mark a folder as holding a run (its results or checkpoints)
RUN_FILES = ("metrics.json", "last.pt", "prev.pt", "best.pt", "history.json", "energy_trace.pt", "bundle.json",
             "model.pt")
#: what a run writes besides: removed with it by ``--overwrite`` (two runs never share a log or a metrics file)
RUN_LOGS = ("train.log", "metrics.csv", "tensorboard")


class RunFolderError(UnfoldError):
    """A run folder is in use by another run, holds a run already, or cannot be written."""


class RunLock:
    """``with RunLock(run_dir):`` the folder is this process's until the block ends (or the process dies)."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, LOCK)
        self.fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        if self.fd is not None:
            return self
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunFolderError(f"run folder {self.run_dir!r} cannot be written: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderError(f"run folder {self.run_dir!r} is in use by another run"
                                     f"{f' (pid {holder})' if holder else ''}: one run per folder") from None
            raise RunFolderError(f"run folder {self.run_dir!r} cannot be locked: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def check_fresh(run_dir: str, overwrite: bool = False) -> None:
    """Refuse to start a new run in a folder holding one (finished: metrics.json; interrupted: checkpoints),
    unless ``overwrite``: then its run files are removed (call under the folder's lock)."""
    present = [f for f in RUN_FILES if os.path.exists(os.path.join(run_dir, f))]
    if not present:
        return
    if not overwrite:
        finished = "metrics.json" in present
        raise RunFolderError(f"run folder {run_dir!r} already holds a {'finished' if finished else 'interrupted'} "
                             f"run ({', '.join(present)}): use --overwrite to replace it"
                             + ("" if finished else f", or --resume {run_dir} to continue it"))
    for f in present + ["prev.pt.corrupt", "last.pt.corrupt", *RUN_LOGS]:
        path = os.path.join(run_dir, f)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def check_writable(run_dir: str, need_bytes: int = 0) -> None:
    """Before any work: refuse a run folder that is a file (or lies under one) or cannot be written
    (:func:`unfold.cli.folder_problem`: a real write probe, nothing left behind), or whose disk has less than
    ``need_bytes`` free."""
    why = folder_problem(run_dir, writable=True)
    if why:
        raise RunFolderError(f"run folder {run_dir!r} {why}")
    probe = os.path.abspath(run_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < need_bytes:
        raise RunFolderError(f"run folder {run_dir!r}: {free / 2 ** 20:.1f} MiB free on its disk, the run needs "
                             f"about {need_bytes / 2 ** 20:.1f} MiB (checkpoints and results)")
