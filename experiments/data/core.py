"""What every dataset loader shares: `DataError`, the `Splits` a loader returns, cleaning
(strip, dedupe, drop texts whose duplicates disagree on the label), the seeded 80/10/10 split, the mapping
of raw label values to ids, and the checks every loaded dataset passes (`check_classes`).

Labels: two raw label values *collide* when they are one class written two ways (`label_key`): equal
as numbers (``1``, ``1.0``, ``true``, ``"1"``, ``"01"``, ``"+1"``, ``"1e0"``), or equal as text once stripped
and Unicode-normalised (NFC). Taken as they are they would train as two classes under the same name (a
3-class model for a binary set, a bundle whose label names repeat, probabilities per name that sum to less
than one); merged silently they would hide a broken file. Both the label values of a file
(`label_table`) and a list of label names (``labels.json``, a ``ClassLabel``: `check_label_names`)
are refused with a `DataError` naming the file, the field and the two colliding values.

Cleaning: the text is stripped; two rows are the same text when they agree after collapsing whitespace and
case-folding (what `experiments.data.text.tokenize` cannot tell apart). Of each such group the first
row (file order) is kept; a group whose rows carry different labels is dropped altogether, since no label
for it is right. The cleaned examples, in file order, are then split 80/10/10 by
``numpy.random.RandomState(seed).permutation`` (stable across numpy releases): train, validation and test
are disjoint and depend on the seed only. What cleaning dropped is counted by reason in ``Splits.dropped``
(``unfold-data inspect`` shows it).

Missing labels (`missing_label`): a label that is absent, empty, or, stripped and compared ignoring case,
one of `MISSING_LABELS` (the strings pandas reads as a missing value: ``NA``, ``N/A``, ``nan``, ``null``,
``None``, ...), or a number that is not finite (``inf``), is a missing value, never a class: the loaders refuse
it naming the file and the record.
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import reprlib
import shlex
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from energies.errors import UnfoldError
from unfold.cli import seed_int

SPLIT_NAMES = ("train", "val", "test")
#: the splits in words, for messages
SPLIT_WORDS = {"train": "training", "val": "validation", "test": "test"}

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlong, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 60, 60, 40, 6, 6, 3


def show(value) -> str:
    """A bounded repr for messages (a 10,000-character label prints in a few dozen)."""
    return _REPR.repr(value)

csv.field_size_limit(1 << 24)       # the CSV readers (corpora, files): one field may hold a long text


#: column names that usually hold the text, and the label, of a dataset: used only to suggest a fix
_TEXT_NAMES = ("text", "sentence", "sentence1", "body", "content", "review", "document", "comment", "tweet", "message",
               "question", "title", "abstract", "description", "passage", "utterance")
_LABEL_NAMES = ("label", "labels", "topic", "class", "category", "target", "y", "sentiment", "stars", "rating",
                "intent", "tag", "polarity", "score", "coarse_label", "fine_label")


def column_fix(missing, found, text_field: str, label_field: str) -> str:
    """What a refusal for ``missing`` columns adds: the config keys that choose other columns,
    ``data.text_field`` and ``data.label_field``, with a column found for each missing one where its name says
    which it is (or where one column is left), ``COLUMN`` otherwise, and the columns found as the candidates."""
    found = [str(c) for c in found]
    free = [c for c in found if c not in (text_field, label_field)]
    keys = []
    for key, column, names in (("data.text_field", text_field, _TEXT_NAMES), ("data.label_field", label_field, _LABEL_NAMES)):
        if column not in missing:
            continue
        pick = next((c for c in free if c.strip().lower() in names), None)
        if pick is None and len(free) == 1 and len(missing) == 1:
            pick = free[0]
        if pick is not None:
            free = [c for c in free if c != pick]
        keys.append(f"{key}={pick if pick is not None else 'COLUMN'}")
    if not keys:
        return ""
    candidates = [c for c in found if c not in (text_field, label_field)]
    return (f"; to read other columns set {' '.join(keys)} (config keys, or overrides on the command line)"
            + (f", candidates: {candidates}" if candidates else ""))


def fix(*settings: str, why: str = "") -> str:
    """What a data refusal ends with: ``"; fix: set data.KEY=VALUE ..."``, the config keys that fix it written as the
    overrides to paste on the command line (``unfold-train``, ``unfold-data inspect``) or to write in a config's
    ``data`` section, each quoted for the shell where it needs it; ``why`` (optional) says what the setting does."""
    shown = " ".join(s if re.fullmatch(r"[\w.=:/@%+,-]+", s) else shlex.quote(s) for s in settings)
    return f"; fix: set {shown}" + (f" ({why})" if why else "")


def label_column_fix(label_field: str) -> str:
    """The fix of a refusal about the label values: ``data.label_field`` names the column of classes."""
    return fix("data.label_field=COLUMN", why=f"if {label_field!r} is not the column of classes; otherwise correct "
                                               "the file")


class DataError(UnfoldError):
    """A dataset is missing, corrupt, unknown, or malformed; the message says what to do."""


#: label values that are a missing value, not a class (compared stripped and case-folded): the strings pandas
#: reads as NA by default (``pandas.read_csv``'s ``na_values``), the empty string included
MISSING_LABELS = ("", "NA", "N/A", "nan", "null", "None", "#N/A", "#N/A N/A", "#NA", "<NA>", "-nan", "1.#IND",
                  "1.#QNAN", "-1.#IND", "-1.#QNAN")
_MISSING = frozenset(m.casefold() for m in MISSING_LABELS)


def missing_label(value) -> bool:
    """Whether the raw label ``value`` is a missing value (module docstring): ``None``, a float that is not
    finite, or a string that, stripped and case-folded, is one of `MISSING_LABELS` or spells a number that
    is not finite (``inf``, ``-Infinity``); a number too large for a float (``1e400``) is a number."""
    if value is None:
        return True
    if isinstance(value, (float, np.floating)):
        return not math.isfinite(value)
    if not isinstance(value, str):
        return False
    text = value.strip()
    if text.casefold() in _MISSING:
        return True
    try:
        return not math.isfinite(float(text)) and any(c.isalpha() and c not in "eE" for c in text)
    except ValueError:
        return False


def missing_rule() -> str:
    """The rule of `missing_label` in words, for refusals."""
    shown = " ".join(m for m in MISSING_LABELS if m)
    return f"empty, one of {shown} (any case: pandas' missing values), or a number that is not finite (inf)"


@dataclass
class Splits:
    """A labelled text dataset split three ways.

    Each split is a list of ``(text, label)`` with ``label`` in ``0 .. num_classes - 1``;
    ``label_names[k]`` is the original name of label ``k``. ``derived`` names the splits drawn by ``data.seed``
    (the seeded 80/10/10 rule) rather than given by the dataset, ``origin`` says where each split's examples come
    from (``{"train": "train.csv"}``), ``columns`` the columns the loader found in the data (for a file or a folder;
    the text and label columns were chosen among them by ``data.text_field`` and ``data.label_field``); ``dropped``
    the rows read but left out, ``{reason: count}`` (cleaning, unlabelled rows); for messages and
    ``unfold-data inspect``, none takes part in equality.
    """

    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    test: list[tuple[str, int]]
    num_classes: int
    label_names: list[str]
    name: str
    derived: tuple = field(default=(), compare=False)
    origin: dict = field(default_factory=dict, compare=False)
    columns: tuple = field(default=(), compare=False)
    dropped: dict = field(default_factory=dict, compare=False)

    def sizes(self) -> dict:
        """Number of examples per split, e.g. ``{"train": 8, "val": 1, "test": 1}``."""
        return {s: len(getattr(self, s)) for s in SPLIT_NAMES}


def _dedupe_key(text: str) -> str:
    """Texts with the same key are duplicates: whitespace collapsed, case folded."""
    return " ".join(text.split()).casefold()


#: the reasons `clean` drops a row, as ``Splits.dropped`` names them
DROP_EMPTY = "empty text"
DROP_REPEATED = "repeated text, same label (the first is kept)"
DROP_CONFLICT = "repeated text with different labels (all dropped)"


def clean(rows: Sequence[tuple[str, int]]) -> tuple[list[tuple[str, int]], dict]:
    """``(examples, dropped)``: ``rows`` with texts stripped, empty texts dropped and duplicates removed (module
    docstring), file order kept; ``dropped`` counts the rows left out by reason (`DROP_EMPTY`,
    `DROP_REPEATED`, `DROP_CONFLICT`; only reasons that occurred)."""
    groups: dict[str, list] = {}
    empty = 0
    for text, label in rows:
        text = text.strip()
        if not text:
            empty += 1
            continue
        key = _dedupe_key(text)
        if key in groups:
            groups[key][1].add(label)
            groups[key][2] += 1
        else:
            groups[key] = [(text, label), {label}, 1]
    kept = [first for first, labels, _ in groups.values() if len(labels) == 1]
    repeated = sum(n - 1 for _, labels, n in groups.values() if len(labels) == 1)
    conflict = sum(n for _, labels, n in groups.values() if len(labels) > 1)
    dropped = {DROP_EMPTY: empty, DROP_REPEATED: repeated, DROP_CONFLICT: conflict}
    return kept, {k: n for k, n in dropped.items() if n}


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


def complete_splits(mapped: dict, seed, train_from: str) -> tuple[dict, tuple]:
    """``({split: examples}, derived)``: ``mapped`` (the ``train`` split and any of ``val``, ``test``, as given)
    with a missing ``val`` or ``test`` carved out of ``train`` by the seeded 80/10/10 rule (`split_examples`;
    a given one is kept and what would have gone to it stays in train); ``derived`` names the splits the seed
    decided. ``train_from`` names the training data in a refusal (fewer than 3 examples to carve from)."""
    if "val" in mapped and "test" in mapped:
        return dict(mapped), ()
    if len(mapped["train"]) < 3:
        raise DataError(f"{train_from}: need at least 3 training examples to carve "
                        f"{' and '.join(SPLIT_WORDS[s] for s in ('val', 'test') if s not in mapped)} out of them, got "
                        f"{len(mapped['train'])}" + fix("data.splits.val=NAME", "data.splits.test=NAME",
                                                        why="hf: datasets: name the dataset's own splits") +
                        " or give val and test files")
    out = dict(mapped)
    tr, va, te = split_examples(mapped["train"], seed)
    if "val" in mapped:                    # carve test only; the rest stays in train
        out["train"], out["test"] = tr + va, te
        return out, ("train", "test")
    if "test" in mapped:                   # carve validation only
        out["train"], out["val"] = tr + te, va
        return out, ("train", "val")
    out["train"], out["val"], out["test"] = tr, va, te
    return out, SPLIT_NAMES


def make_splits(rows, seed, label_names, name, columns=()) -> Splits:
    """Clean ``rows`` (text, label id) and split them into a `Splits`; fewer than 3 examples left after
    cleaning is a `DataError` naming the dataset and both counts."""
    examples, dropped = clean(rows)
    if len(examples) < 3:
        why = ", ".join(f"{n} {reason}" for reason, n in dropped.items()) or "none dropped"
        raise DataError(f"{name}: need at least 3 examples to split 80/10/10, got {len(examples)} after cleaning "
                        f"({len(rows)} rows read; dropped: {why})"
                        + fix("data.text_field=COLUMN", why="if the texts are in another column; otherwise give "
                                                            "more rows"))
    train, val, test = split_examples(examples, seed)
    drawn = f"drawn from {name} (80/10/10, data.seed={seed})"
    return Splits(train, val, test, len(label_names), list(label_names), name, SPLIT_NAMES,
                  {s: drawn for s in SPLIT_NAMES}, tuple(columns), dropped)


#: a number written as text: ASCII digits, optional sign, fraction and exponent (``-3``, ``1.0``, ``2e3``)
_NUMBER_TEXT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,9})?")


def _numeric(v) -> Decimal | None:
    """The exact numeric value of a label that is a number (bool, int, finite float) or a text that reads as
    one (`_NUMBER_TEXT`, surrounding space allowed), else ``None``."""
    if isinstance(v, (bool, int, np.integer)):
        return Decimal(int(v))
    if isinstance(v, (float, np.floating)):
        return Decimal(float(v)) if math.isfinite(v) else None
    if isinstance(v, str) and _NUMBER_TEXT.fullmatch(v.strip()):
        try:
            return Decimal(v.strip())
        except ArithmeticError:        # an exponent beyond what Decimal holds: treated as text
            return None
    return None


def label_key(v) -> tuple:
    """The class a raw label value (or a label name) stands for: ``("number", value)`` for numbers and numeric
    text (``1``, ``1.0``, ``True``, ``"01"`` are one class), ``("text", NFC-normalised stripped text)`` for
    any other value. Two distinct values with one key *collide* (module docstring)."""
    n = _numeric(v)
    if n is not None:
        return ("number", n)
    return ("text", unicodedata.normalize("NFC", str(v).strip()))


def _name(v) -> str:
    return unicodedata.normalize("NFC", str(v).strip())


def _label_keys(v) -> tuple:
    """What must be unique among the distinct labels of a dataset: the class (`label_key`) and the name it
    prints as (``True`` and ``"True"`` print alike)."""
    return label_key(v), ("name", _name(v))


def _collision(a, a_at: str, b, b_at: str, field, where) -> DataError:
    key = label_key(a)
    if key == label_key(b):
        num = str(a).strip()
        what = (f"the number {num if len(num) <= 40 else num[:37] + '...'}" if key[0] == "number"
                else f"the text {show(key[1])}")
    else:
        what = f"named {show(_name(a))}"
    return DataError(f"{where}: label values {show(a)}{a_at} and {show(b)}{b_at} of {field!r} collide: both are "
                     f"{what}, one class written two ways (they would train as two classes of one name); write "
                     "each class one way" + (label_column_fix(field) if field != "label names" else ""))


def label_table(values, where: str = "dataset", field: str = "label", origin=None) -> tuple[dict, list[str]]:
    """Map label values to ids: sorted unique values -> 0..K-1 (numeric order when all are integers).

    Returns ``(value -> id, label_names)``, names being the original values as strings. Two distinct values
    that collide (`label_key`: ``1`` and ``"1"``, ``1`` and ``1.0`` or ``True``, ``"1"`` and ``"01"``,
    NFC variants of one text, ``True`` and ``"True"``) are a `DataError` naming ``where`` (the file),
    ``field`` and both values, each with ``origin(i)`` (e.g. ``"record 3"`` for the ``i``-th value) when given.
    """
    spellings: dict = {}               # (type, value) -> (value, where first seen): 1, 1.0 and True stay apart
    for i, v in enumerate(values):
        spellings.setdefault((type(v).__name__, v), (v, i))
    by_key: dict = {}
    for v, i in spellings.values():
        for k in _label_keys(v):
            if k in by_key:
                (u, j) = by_key[k]
                at = (lambda n: f" ({origin(n)})") if origin is not None else (lambda n: "")
                raise _collision(u, at(j), v, at(i), field, where)
        for k in _label_keys(v):
            by_key[k] = (v, i)
    uniq = [v for v, _ in spellings.values()]

    def as_int(v):
        n = _numeric(v)
        if n is None or (isinstance(v, str) and not re.fullmatch(r"\s*[-+]?[0-9]+\s*", v)):
            return None                # numeric order for integers only, as written
        return n if n == n.to_integral_value() else None

    ints = {i: as_int(v) for i, v in enumerate(uniq)}
    if all(n is not None for n in ints.values()):
        order = [uniq[i] for i in sorted(ints, key=lambda i: ints[i])]
    else:
        order = sorted(uniq, key=lambda v: (str(v), type(v).__name__))
    return {v: k for k, v in enumerate(order)}, [str(v) for v in order]


def check_label_names(names, where: str, field: str = "label") -> list[str]:
    """``names`` (a list of label names in class-id order: ``labels.json``, a ``ClassLabel``) as strings, each a
    non-empty string or an integer, no two colliding (`label_key`: ``"pos"`` and ``" pos"``, ``"1"`` and
    ``1``, ``"1"`` and ``"01"``); otherwise a `DataError` naming ``where``, ``field`` and the values."""
    if not isinstance(names, (list, tuple)) or not names:
        raise DataError(f"{where}: the label names of {field!r} must be a non-empty list, got {show(names)}")
    seen: dict = {}
    for i, n in enumerate(names):
        if isinstance(n, bool) or not isinstance(n, (str, int)):
            raise DataError(f"{where}: label name {i} of {field!r} is {show(n)} ({type(n).__name__}), expected a "
                            "string")
        if not str(n).strip():
            raise DataError(f"{where}: label name {i} of {field!r} is empty ({n!r})")
        for k in _label_keys(n):
            if k in seen:
                j = seen[k]
                raise _collision(names[j], f" (class {j})", n, f" (class {i})", field, where)
        for k in _label_keys(n):
            seen[k] = i
    return [str(n) for n in names]


def check_classes(splits: Splits, label_field: str = "label") -> Splits:
    """``splits`` unchanged when it is fit to train and evaluate on; otherwise a `DataError` naming the
    dataset, what is wrong and the config keys that fix it (`fix`). Every loaded dataset passes here
    (`experiments.data.load.load_dataset`):

    * no split is empty (an empty validation or test split would report a made-up accuracy of 0; the loaders
      name the file first where there is one);
    * the label names are unique (`check_label_names`), one per class, and every label is a class id;
    * the examples carry at least two classes, and the training split too (a classifier trained on one class
      predicts it everywhere and reports a meaningless 100 % accuracy).

    ``label_field`` (the column the labels were read from) and ``splits.derived`` (splits drawn by ``data.seed``:
    another seed draws others) choose the fix named. Returns ``splits``."""
    def one(examples) -> str | None:
        labels = {lab for _, lab in examples}
        if len(labels) != 1:
            return None
        (lab,) = labels
        name = repr(splits.label_names[lab]) if 0 <= lab < len(splits.label_names) else repr(lab)
        return f"{name}, {len(examples)} example{'s' if len(examples) != 1 else ''}"

    for s in SPLIT_NAMES:
        if not getattr(splits, s):
            raise DataError(f"dataset {splits.name}: the {SPLIT_WORDS[s]} split is empty: {s} holds no example"
                            + fix("data.dataset=FILE", why="one file with all the examples, split 80/10/10 by "
                                                           "data.seed; or add examples to the split"))
    names = check_label_names(list(splits.label_names), f"dataset {splits.name}", "label names")
    if isinstance(splits.num_classes, bool) or splits.num_classes != len(names):
        raise DataError(f"dataset {splits.name}: num_classes={splits.num_classes!r} but {len(names)} label names "
                        f"{show(names)}")
    for s in SPLIT_NAMES:
        for i, (_, lab) in enumerate(getattr(splits, s)):
            if isinstance(lab, bool) or not isinstance(lab, (int, np.integer)) or not 0 <= lab < len(names):
                raise DataError(f"dataset {splits.name}: {s} example {i} has label {show(lab)}, expected a class "
                                f"id in [0, {len(names)})")
    every = one(splits.train + splits.val + splits.test)
    if every is not None:
        raise DataError(f"dataset {splits.name} holds one class only ({every}): a classifier needs at least two"
                        + fix("data.label_field=COLUMN", why=f"the column of classes, if not {label_field!r}; "
                                                             "otherwise add examples of another class"))
    train = one(splits.train)
    if train is not None:
        again = (fix("data.seed=1", why="another 80/10/10 draw; or add examples of the other classes")
                 if "train" in splits.derived else
                 fix("data.label_field=COLUMN", why=f"the column of classes, if not {label_field!r}; otherwise add "
                                                    "examples of another class to the training split"))
        raise DataError(f"dataset {splits.name}: its training split holds one class only ({train}): a classifier "
                        "needs at least two" + again)
    return splits


#: the pairs of splits `split_overlap` compares: (held-out split, split it may repeat)
OVERLAP_PAIRS = (("val", "train"), ("test", "train"), ("test", "val"))


def split_overlap(splits: Splits) -> dict:
    """``{"val_in_train": n, "test_in_train": n, "test_in_val": n}``: for each pair of `OVERLAP_PAIRS`,
    the number of examples of the first split whose text is, character for character, the text of an example of
    the second (a held-out example seen in training inflates the accuracy measured on it). A single file is
    deduplicated before it is split, so only given splits (a folder, an ``hf:`` dataset) can overlap."""
    texts = {s: {t for t, _ in getattr(splits, s)} for s in SPLIT_NAMES}
    return {f"{a}_in_{b}": sum(t in texts[b] for t, _ in getattr(splits, a)) for a, b in OVERLAP_PAIRS}


def overlap_warning(splits: Splits) -> str | None:
    """A sentence naming the held-out examples that repeat another split's text (`split_overlap`), or
    ``None`` when there is none."""
    found = {k: n for k, n in split_overlap(splits).items() if n}
    if not found:
        return None
    sizes = splits.sizes()
    shown = ", ".join(f"{n} of the {sizes[k.split('_')[0]]} {k.split('_')[0]} examples repeat a "
                      f"{k.split('_')[-1]} text" for k, n in found.items())
    return (f"dataset {splits.name}: {shown} (exact duplicates): the accuracy measured on them overstates what the "
            "model does on unseen text; remove them from the held-out split")


def split_seed_arg(text: str) -> int:
    """argparse ``type=``: a split seed, an integer in ``[0, 2**32)`` (what ``RandomState`` accepts)."""
    seed = seed_int(text)
    if seed >= 2 ** 32:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in [0, 2**32) (a split seed)")
    return seed
