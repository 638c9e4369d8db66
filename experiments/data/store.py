"""The data directory and what keeps it honest: where it is, its ``manifest.json`` (sha256, size and origin
of every file that ``fetch`` wrote), the checksum test of a file before it is read, and atomic writes.

A file listed in the manifest is checked against its sha256 whenever it is read; a file put there by hand
(no manifest entry) is trusted.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib

from unfold.cli import folder_problem
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_open
from .core import DataError

DATA_DIR_ENV = "UNFOLD_DATA"
DEFAULT_DATA_DIR = pathlib.Path("~/.cache/unfolded-transformers")
MANIFEST = "manifest.json"


def data_dir(path=None) -> pathlib.Path:
    """The data directory: ``path`` if given, else ``$UNFOLD_DATA``, else ``~/.cache/unfolded-transformers``.

    The directory is not created here (``fetch`` creates it); one that exists but is not a folder is a
    `DataError`.
    """
    if path is None or str(path) == "":
        path = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    path = pathlib.Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise DataError(f"the data directory {path} is not a folder")
    return path


def check_folder(path, what: str, writable: bool = False) -> pathlib.Path:
    """``path`` as a `pathlib.Path` when `folder_problem` finds nothing wrong, else a
    `DataError` naming ``what`` (e.g. ``--out``) and the path."""
    why = folder_problem(path, writable)
    if why:
        raise DataError(f"{what} {str(path)!r} {why}")
    return pathlib.Path(path).expanduser()


def sha256_file(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_manifest(root: pathlib.Path) -> dict:
    """The manifest of ``root`` as ``{"files": {relpath: record}}`` (empty if absent).

    An unreadable manifest is a `DataError`: it would silently disable the checksums.
    """
    p = root / MANIFEST
    if not p.exists():
        return {"files": {}}
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
            raise ValueError("no 'files' table")  # noqa: TRY004 - reported as corrupt below
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"the manifest {p} is corrupt ({e}); re-run "
                        f"`unfold-data fetch --force --data-dir {root}`") from None
    return m


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    with atomic_open(path) as f:
        f.write(data)


def write_manifest(root: pathlib.Path, manifest: dict) -> None:
    """Write the manifest atomically, keys sorted."""
    atomic_write_bytes(root / MANIFEST, (json_dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def fetch_command(dataset: str, root: pathlib.Path, force: bool = False) -> str:
    """The exact command that (re)creates the files of ``dataset`` in ``root``."""
    return (f"unfold-data fetch --dataset {dataset} --data-dir {root}"
            + (" --force" if force else ""))


def require_file(root: pathlib.Path, rel: str, dataset: str) -> pathlib.Path:
    """Path of data file ``rel``, checked to exist and to match its manifest checksum.

    Missing -> `DataError` with the fetch command; checksum mismatch -> `DataError`
    saying the file is corrupt and to re-run fetch with ``--force``.
    """
    path = root / rel
    if not path.is_file():
        raise DataError(f"{dataset}: {path} not found; get it with `{fetch_command(dataset, root)}`")
    record = read_manifest(root)["files"].get(rel)
    if record is not None and sha256_file(path) != record.get("sha256"):
        raise DataError(f"{dataset}: {path} is corrupt (sha256 differs from {root / MANIFEST}); "
                        f"re-run `{fetch_command(dataset, root, force=True)}`")
    return path


def corrupt(dataset: str, path: pathlib.Path, root: pathlib.Path, why) -> DataError:
    """The `DataError` for a data file that cannot be parsed."""
    return DataError(f"{dataset}: {path} is corrupt ({why}); re-run `{fetch_command(dataset, root, force=True)}`")
