"""Crash-safe file writes: everything the experiments write goes through `atomic_open` (whole files) or
`open_append` (logs), and neither ever writes through a symbolic link.

* `atomic_open` writes a temporary file beside the target and renames it over the target: a link at the
  target's name is replaced by the new file (``rename`` does not follow links), never written through.
* `open_append` (``train.log``, ``metrics.csv``, ``sweep.log``) and `open_no_follow` (a run folder's
  ``.lock``) open with ``O_NOFOLLOW``: a link at the name is refused with an `OSError` naming the path
  (a link to someone else's file must not be appended to, truncated or locked), and so is anything that is not
  a regular file (a FIFO, a device).
"""
from __future__ import annotations

import errno
import glob
import io
import os
import pathlib
import secrets
import stat
from contextlib import contextmanager

FILE_MODE = 0o644  # the temporary file is created 0600


def _temporary_name(path: pathlib.Path) -> str:
    """A fresh name beside ``path`` for its temporary file: ``.NAME.<12 hex digits>.tmp`` (what
    `clean_temporaries` recognises)."""
    return str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")


@contextmanager
def atomic_open(path, mode: str = "wb", file_mode: int = FILE_MODE):
    """Open a temporary file beside ``path`` for writing; on a clean exit flush, fsync and rename it
    over ``path``; on any exception (Ctrl-C included) delete it, so ``path`` is never left half written and no
    temporary file is left behind.

    The temporary file's name is chosen before the file exists and the file is created (``O_EXCL``) inside the
    ``try`` that removes it: ``tempfile.mkstemp`` creates the file and only then returns its name, so a Ctrl-C
    landing inside ``mkstemp`` (seen: a third of 300 interrupts timed at random, and once in the suite) left a
    file that nothing knew to remove."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        while True:
            tmp = _temporary_name(path)        # named first: an interrupt from here on finds it in `finally`
            try:
                fd = os.open(tmp, flags, 0o600)
                break
            except FileExistsError:            # someone else's temporary file (48 random bits): not ours
                tmp = None
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode)
        os.replace(tmp, path)
    except OSError as exc:     # disk full, file size limit, quota: the error names the file being written
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from None
        raise
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def clean_temporaries(folder) -> list:
    """Remove the temporary files (``.*.tmp``) that a killed writer left in ``folder``; returns their paths.
    Only the one process that owns the folder (a run folder's lock holder) may call this: another writer's
    temporary file in the same folder would be removed under it."""
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(str(folder)), ".*.tmp")):
        try:
            os.unlink(tmp)                     # a folder so named is not ours: unlink refuses it
            removed.append(tmp)
        except OSError:
            pass
    return removed


def atomic_save(obj, path) -> None:
    """``torch.save(obj)`` to ``path`` through `atomic_open`. The object is serialised in memory first and
    written with one ``write``: torch's own file writer turns a full disk or a file size limit (``ulimit -f``)
    into a bare RuntimeError, a plain write into an `OSError` (ENOSPC, EFBIG) naming ``path``."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_open(path) as fh:
        fh.write(buf.getbuffer())


def fsync_dir(path) -> None:
    """fsync a folder, so that a rename into it survives a power loss; a folder that cannot be opened or synced
    (some file systems refuse) is left as it is: the rename itself is still atomic."""
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


def open_no_follow(path, flags: int, file_mode: int = FILE_MODE) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)`` of a regular file: a symbolic link at ``path`` or a file
    that is not regular (FIFO, device, folder) raises `OSError` naming the path; returns the descriptor."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), file_mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise OSError(errno.ELOOP, "is a symbolic link, which the project never writes through", str(path)) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR) or (os.path.exists(path) and not os.path.isfile(path)):
            raise OSError(errno.EINVAL, "is not a regular file, which the project never writes to", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "is not a regular file, which the project never writes to", str(path))
    if hasattr(os, "O_NONBLOCK"):      # O_NONBLOCK only so that opening a FIFO cannot hang; regular I/O after
        os.set_blocking(fd, True)
    return fd


def open_append(path, binary: bool = False):
    """A file object appending to ``path`` (created if missing) through `open_no_follow`."""
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "ab") if binary else io.open(fd, "a", encoding="utf-8", newline="")


def atomic_write_text(text: str, path: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (`atomic_open`)."""
    with atomic_open(path, "w") as fh:
        fh.write(text)
