"""What every dataset loader shares: :class:`DataError`, the :class:`Splits` a loader returns, cleaning
(strip, dedupe, drop texts whose duplicates disagree on the label), the seeded 80/10/10 split, the mapping
of raw label values to ids, and the check that a dataset holds at least two classes.

Cleaning: the text is stripped; two rows are the same text when they agree after collapsing whitespace and
case-folding (what :func:`experiments.data.text.tokenize` cannot tell apart). Of each such group the first
row (file order) is kept; a group whose rows carry different labels is dropped altogether, since no label
for it is right. The cleaned examples, in file order, are then split 80/10/10 by
``numpy.random.RandomState(seed).permutation`` (stable across numpy releases): train, validation and test
are disjoint and depend on the seed only.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from energies.errors import UnfoldError

SPLIT_NAMES = ("train", "val", "test")

csv.field_size_limit(1 << 24)       # the CSV readers (corpora, files): one field may hold a long text


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


def make_splits(rows, seed, label_names, name) -> Splits:
    """Clean ``rows`` (text, label id) and split them into a :class:`Splits`."""
    train, val, test = split_examples(_clean(rows), seed)
    return Splits(train, val, test, len(label_names), list(label_names), name)


def label_table(values) -> tuple[dict, list[str]]:
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
