"""One owner per run folder, and a run replaced only by a complete one.

`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``RUN_DIR/.lock`` and keeps the file open until
the run ends; the operating system releases it on any exit, SIGKILL included, so a stale lock cannot
outlive its process. A second run into the same folder (training, resume) is refused at once with a
`RunFolderError` naming the folder and the pid that holds it. The lock file is opened without following
a link (`open_no_follow`): a ``.lock`` that links elsewhere is refused, never truncated.
The holder writes its owner into the file, one JSON line ``{"pid", "host", "user", "started"}`` (``started``: UTC,
ISO 8601, when it took the lock; a lock written before this holds the pid alone), and the file stays when the
run ends: `lock_owner` reads it without taking or writing anything, and says whether that owner still
holds the lock (a run in progress) or not (the run ended, or its process died: a stale owner).

`check_fresh` refuses to start a new run in a folder that holds anything but a lock: a run (finished or
interrupted), or files of something else (a ``config.yaml`` of another tool, notes): refused unless
``overwrite``; it never removes anything.

``--overwrite`` (`Replacement`) never deletes before the new run is complete: the new run is trained in a
staging folder beside the old one (``PARENT/.NAME.overwrite``), and only when it has finished (metrics, bundle,
plots written and the bundle verified) is it swapped in, by one ``renameat2(RENAME_EXCHANGE)`` of the two
folders (atomic: at every instant ``RUN_DIR`` is the old run or the new one, whole). Files in the old folder
that a run does not write (`RUN_OUTPUTS`) are then moved into the new one, and the old run removed. The
same swap replaces only a model bundle's own files when a bundle is saved over a folder
(``Replacement(folder, replaces=BUNDLE_FILES)``: a run's checkpoints, metrics, logs and plots are moved back
and kept); the names replaced are recorded in the markers, so that a recovery replaces the same ones. A
failure or Ctrl-C before the swap removes the staging folder and leaves the old run as it was; after a kill,
`Replacement.recover` (run under the lock by the next run into the folder) finishes a swap whose new run
was complete or discards one that was not.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import getpass
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from energies.errors import UnfoldError
from unfold.cli import folder_problem

from .atomic import atomic_open, fsync_dir, open_no_follow

__all__ = ["RunLock", "RunFolderError", "check_fresh", "refuse_links", "check_writable", "RUN_FILES", "RUN_OUTPUTS", "Replacement",
           "folder_content", "LockOwner", "lock_owner"]

LOCK = ".lock"
#: files that mark a folder as holding a run (its results or checkpoints)
RUN_FILES = ("metrics.json", "last.pt", "prev.pt", "best.pt", "history.json", "energy_trace.pt", "bundle.json",
             "model.pt", "model.safetensors")
#: what a run writes besides: replaced with it by ``--overwrite`` (two runs never share a log or a metrics file)
RUN_LOGS = ("train.log", "metrics.csv", "tensorboard")
#: every name a run writes in its folder: what ``--overwrite`` replaces; anything else is not the run's and is kept
RUN_OUTPUTS = RUN_FILES + RUN_LOGS + ("config.yaml", "config.json", "README.md", "vocab.json", "tokenizer.json",
                                      "energy_descent.png",
                                      "training_curves.png", "last.pt.corrupt", "prev.pt.corrupt")
#: written into a seed's folder by the sweep before the trainer starts: not content (kept, moved with the folder)
SWEEP_LOG = "sweep.log"
#: test hook: called with the name of each stage of a replacement ("complete", "swapped", "moved", "done")
STAGE_HOOK: Optional[Callable[[str], None]] = None


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
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise RunFolderError(f"run folder {self.run_dir!r} cannot be written: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_owner(fd, held=True)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderError(f"run folder {self.run_dir!r} is in use by another run"
                                     f"{f' (pid {holder.pid})' if holder.pid else ''}{holder.whose()}: one run per "
                                     "folder") from None
            raise RunFolderError(f"run folder {self.run_dir!r} cannot be locked: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_me(), ensure_ascii=True) + "\n").encode(), 0)
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


@dataclass
class LockOwner:
    """Who took a run folder's lock (the lock file's JSON line; fields ``""`` where not recorded) and whether it
    still holds it (``held``: a run in progress; else the run ended or its process died)."""

    pid: str
    host: str
    user: str
    started: str
    held: bool

    def whose(self) -> str:
        """`` of user U on host H since T`` (the parts recorded), or ``""``."""
        return "".join(part for part in (f" of user {self.user}" if self.user else "",
                                         f" on host {self.host}" if self.host else "",
                                         f" since {self.started}" if self.started else ""))

    def describe(self) -> str:
        """``pid P of user U on host H since T`` (the parts recorded), or ``an unrecorded owner``."""
        text = (f"pid {self.pid}" if self.pid else "") + self.whose()
        return text.strip() or "an unrecorded owner"


#: the most of a lock file read (its owner line is far shorter; anything longer is not read whole)
OWNER_BYTES = 4096


def _me() -> dict:
    """This process as a lock's owner: pid, host, user (``""`` where the system cannot say), start (UTC)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 -- no user name in the environment nor the password database
        user = ""
    return {"pid": os.getpid(), "host": socket.gethostname(), "user": user,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _clean(value, limit: int = 100) -> str:
    """A recorded field as printable text of at most ``limit`` characters (a lock file is anyone's to write)."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text[:limit]


def _read_owner(fd: int, held: bool) -> LockOwner:
    """The owner recorded in an open lock file: the JSON line, or an older lock's pid alone."""
    try:
        raw = os.pread(fd, OWNER_BYTES, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        raw = ""
    try:
        rec = json.loads(raw) if raw.startswith("{") else {"pid": raw if raw.isdigit() else ""}
    except ValueError:
        rec = {}
    if not isinstance(rec, dict):
        rec = {}
    return LockOwner(*(_clean(rec.get(k)) for k in ("pid", "host", "user", "started")), held=held)


def lock_owner(run_dir: str) -> Optional[LockOwner]:
    """The owner of ``run_dir``'s run lock as recorded in its lock file, and whether a live process holds the lock
    now (a shared lock tried without waiting); None where there is no lock file. Reads only: the file is opened
    read-only without following a link, no lock is kept, nothing is written."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            held = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            held = False
        return _read_owner(fd, held)
    finally:
        os.close(fd)


def refuse_links(run_dir: str) -> None:
    """Refuse a run folder where a name the run writes (`RUN_OUTPUTS`, the lock) is a symbolic link: the
    project never writes through one (a link to someone else's file would be overwritten or appended to)."""
    links = [n for n in (LOCK, SWEEP_LOG) + RUN_OUTPUTS if os.path.islink(os.path.join(run_dir, n))]
    if links:
        raise RunFolderError(f"run folder {run_dir!r}: {', '.join(links)} "
                             f"{'is a symbolic link' if len(links) == 1 else 'are symbolic links'}; a run never "
                             "writes through a link (it could overwrite a file elsewhere): remove the link")


def folder_content(run_dir: str) -> list:
    """The names in ``run_dir`` but its lock and a killed save's temporary files (sorted; [] for no folder)."""
    try:
        names = os.listdir(run_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    def ignored(n: str) -> bool:
        path = os.path.join(run_dir, n)
        return (n == LOCK or (n.startswith(".") and n.endswith(".tmp"))
                or (n == SWEEP_LOG and os.path.isfile(path) and not os.path.islink(path)))
    return sorted(n for n in names if not ignored(n))


def check_fresh(run_dir: str, overwrite: bool = False) -> bool:
    """Refuse to start a new run in a folder that holds anything (module docstring) unless ``overwrite``; never
    removes anything. Returns whether there is something to replace (then train into a `Replacement`)."""
    names = folder_content(run_dir)
    if not names:
        return False
    if overwrite:
        return True
    present = [f for f in RUN_FILES if f in names]
    if present:
        _refuse_run(run_dir, present)
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    raise RunFolderError(f"run folder {run_dir!r} is not empty and holds no run ({shown}): these may be someone "
                         "else's files; choose an empty or new folder, or use --overwrite (a run's own files there "
                         "are replaced once the new run is complete, others are kept)")


def _refuse_run(run_dir: str, present: list) -> None:
    """Refuse a folder holding a run: finished where it holds ``bundle.json`` (the last file a run writes, so a run
    killed anywhere before it, even after ``metrics.json``, is unfinished), which only ``--overwrite`` replaces;
    unfinished otherwise, which ``--resume`` continues where a checkpoint is there to resume from."""
    shown = ", ".join(present)
    if "bundle.json" in present:
        raise RunFolderError(f"run folder {run_dir!r} already holds a finished run ({shown}): use --overwrite to "
                             "replace it")
    if "last.pt" in present or "prev.pt" in present:
        raise RunFolderError(f"run folder {run_dir!r} holds an unfinished run ({shown}): continue it with --resume "
                             f"{run_dir} (nothing trained is lost), or use --overwrite to replace it")
    raise RunFolderError(f"run folder {run_dir!r} holds an unfinished run without a checkpoint to resume from "
                         f"({shown}): use --overwrite to replace it")


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def exchange(a: str, b: str) -> None:
    """Swap the folders ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``). Where the system or
    the file system has no exchange, two renames through a third name (a short window in which ``a`` is
    missing; `Replacement.recover` finishes it after a kill)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), a)
    side = b + ".swap"
    os.rename(a, side)
    os.rename(b, a)
    os.rename(side, b)


class Replacement:
    """``--overwrite`` of a folder holding something (module docstring): the new run goes to `stage`
    (call `begin` under the run folder's lock), `commit` swaps it in once complete, `abort`
    drops it. The staging folder is locked too, so that after the swap the folder's lock is still held.
    ``replaces``: the names the new content replaces (default: every name a run writes); every other name of
    the old folder is moved into the new one after the swap."""

    SUFFIX = ".overwrite"
    COMPLETE, OLD = ".complete", ".replaced"     # markers in the staging folder: new run complete / old run

    def __init__(self, run_dir: str, replaces: Sequence[str] = RUN_OUTPUTS):
        self.run_dir = os.path.normpath(run_dir)
        parent, name = os.path.split(os.path.abspath(self.run_dir))
        self.stage = os.path.join(parent, f".{name}{self.SUFFIX}")
        self.lock = RunLock(self.stage)
        self.replaces = tuple(replaces)

    def check(self) -> None:
        """Before any work: the staging folder can be made beside the run folder."""
        why = folder_problem(os.path.dirname(self.stage), writable=True)
        if why:
            raise RunFolderError(f"--overwrite trains the new run beside {self.run_dir!r} and swaps it in when "
                                 f"complete, but its parent folder {why}")

    def begin(self) -> str:
        """Create the staging folder (removing a stale one: the caller holds the run folder's lock and has run
        `recover`); its path."""
        self.check()
        if os.path.exists(os.path.join(self.stage, self.OLD)):
            raise RunFolderError(f"{self.stage} holds files of a folder replaced earlier; move them away first")
        self._remove_stage()
        self.lock.acquire()
        return self.stage

    def release(self) -> None:
        self.lock.release()

    def _remove_stage(self) -> None:
        if os.path.islink(self.stage) or os.path.isfile(self.stage):
            os.unlink(self.stage)
        elif os.path.isdir(self.stage):
            shutil.rmtree(self.stage)

    def abort(self) -> None:
        """The new run did not complete: drop it; the old run is untouched."""
        self.lock.release()
        if not os.path.exists(os.path.join(self.stage, self.OLD)):     # never the old run's folder after a swap
            self._remove_stage()

    def commit(self) -> None:
        """Swap the complete new run in (module docstring)."""
        replaces = list(self.replaces)     # recorded: a recovery after a kill replaces exactly these names
        with atomic_open(os.path.join(self.stage, self.COMPLETE), "w") as fh:
            fh.write(json.dumps({"run_dir": self.run_dir, "replaces": replaces}) + "\n")
        fsync_dir(self.stage)
        _hook("complete")
        with atomic_open(os.path.join(self.run_dir, self.OLD), "w") as fh:   # marks the old folder once swapped
            fh.write(json.dumps({"replaced_by_overwrite": True, "replaces": replaces}) + "\n")
        exchange(self.run_dir, self.stage)
        _hook("swapped")
        self._finish()

    def _finish(self) -> None:
        """After the swap: the old folder (now at `stage`) gives back every name the new content does not
        replace (its marker's ``replaces``), then goes."""
        replaced = set(_recorded_replaces(os.path.join(self.stage, self.OLD))) | {self.OLD, self.COMPLETE}
        for name in folder_content(self.stage):
            if name in replaced:
                continue
            target = os.path.join(self.run_dir, name)
            if not os.path.lexists(target):
                os.rename(os.path.join(self.stage, name), target)
        _hook("moved")
        try:
            os.unlink(os.path.join(self.run_dir, self.COMPLETE))
        except FileNotFoundError:
            pass
        fsync_dir(self.run_dir)
        leftover = [n for n in folder_content(self.stage) if n not in replaced]
        if leftover:    # a name the new run has too: kept where it is, never deleted
            print(f"--overwrite: {', '.join(leftover)} of the replaced folder also exist in the new run; the old "
                  f"ones are kept in {self.stage}", flush=True)
            return
        self._remove_stage()
        _hook("done")

    def recover(self) -> Optional[str]:
        """Under the run folder's lock: finish what a killed replacement left (module docstring); a sentence
        saying what was done, or None when there was nothing to do."""
        if not os.path.lexists(self.stage):
            return None
        if os.path.islink(self.stage) or not os.path.isdir(self.stage):
            return None      # not ours: never touched
        self.lock.acquire()
        try:
            if os.path.exists(os.path.join(self.stage, self.OLD)):           # swapped: the old folder's leftovers
                self._finish()
                return f"finished an --overwrite of {self.run_dir} that was stopped after the swap"
            if os.path.exists(os.path.join(self.stage, self.COMPLETE)):     # complete, not yet swapped
                self.replaces = _recorded_replaces(os.path.join(self.stage, self.COMPLETE))
                self.commit()
                return f"installed the complete new run of an --overwrite of {self.run_dir} that was stopped"
            self.abort()
            return f"discarded the incomplete new run of an --overwrite of {self.run_dir} (the old run is unchanged)"
        finally:
            self.lock.release()


def _recorded_replaces(marker: str) -> tuple:
    """The names a replacement's marker file says the new content replaces: its ``replaces`` list; a marker of
    the trainer from before markers recorded it (no such key): `RUN_OUTPUTS`; a marker that cannot be read:
    none (every old name that the new folder also holds is then kept aside, never deleted)."""
    try:       # never through a link, never a FIFO (open_no_follow refuses both)
        with os.fdopen(open_no_follow(marker, os.O_RDONLY), "rb") as fh:
            doc = json.loads(fh.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError):
        return ()
    if not isinstance(doc, dict):
        return ()
    if "replaces" not in doc:
        return RUN_OUTPUTS
    names = doc["replaces"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return ()
    return tuple(names)


def _hook(stage: str) -> None:
    if STAGE_HOOK is not None:
        STAGE_HOOK(stage)


def check_writable(run_dir: str, need_bytes: int = 0) -> None:
    """Before any work: refuse a run folder that is a file (or lies under one) or cannot be written
    (`unfold.cli.folder_problem`: a real write probe, nothing left behind), or whose disk has less than
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
