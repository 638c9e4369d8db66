"""Datasets given by path, and :func:`export`, which writes them.

* A single ``.csv`` (header row; UTF-8, latin-1 as fallback), ``.jsonl`` or ``.json`` file with a text and a
  label column: labels mapped by :func:`experiments.data.core.label_table`, cleaned and split 80/10/10.
* A split directory (``train.jsonl``, ``val.jsonl``, ``test.jsonl``, optionally ``labels.json``), as
  :func:`export` writes it: used as-is, no cleaning, no resplitting.

Every record is checked (:func:`records_to_examples`): a missing column, an empty or non-finite label,
text that is not valid Unicode is a :class:`DataError` naming the file and the record. Label values that
collide (one class written two ways: ``1`` and ``"1"``, ``1`` and ``1.0`` or ``true``, ``"1"`` and ``"01"``;
:func:`experiments.data.core.label_table`) and repeated names in ``labels.json``
(:func:`experiments.data.core.check_label_names`) are refused naming the file, the column and both values. A
split file with no record (empty, or blank lines only) is refused naming the split and the file.
"""
from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import shutil

from energies.checks import one_line
from unfold.strict_json import dumps as json_dumps

from .core import (SPLIT_NAMES, SPLIT_WORDS, DataError, Splits, check_label_names, column_fix, label_table, make_splits,
                   show)
from .store import atomic_write_bytes, check_folder


def records_to_examples(records, text_field, label_field, where) -> list[tuple[str, object]]:
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
            raise DataError(f"{where}: record {i} has no column(s) {missing}; columns found: {sorted(map(str, rec))}"
                            + column_fix(missing, sorted(map(str, rec)), text_field, label_field))
        label = rec[label_field]
        if label is None or (isinstance(label, str) and not label.strip()):
            raise DataError(f"{where}: record {i} has an empty label ({label_field!r})")
        if isinstance(label, str) and _non_finite_number(label):
            raise DataError(f"{where}: record {i} has label {show(label.strip())} ({label_field!r}), not a class: "
                            "a missing value?")
        if not isinstance(label, (str, int, float)) or (isinstance(label, float) and not label.is_integer()):
            raise DataError(f"{where}: record {i} has an unusable label {show(label)} ({label_field!r}): expected a "
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
    """Whether ``text`` spells a number that is not finite (``nan``, ``-inf``, ``Infinity``, ...); a number too
    large for a float (``1e400``, 400 digits) is a number, not a missing value."""
    try:
        return not math.isfinite(float(text)) and any(c.isalpha() and c not in "eE" for c in text)
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
                        raise DataError(f"{path}: no column(s) {missing}; columns found: {columns}"
                                        + column_fix(missing, columns, text_field, label_field))
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


def load_file(path: pathlib.Path, seed, text_field, label_field) -> Splits:
    """A single .csv/.jsonl/.json file: labels mapped by :func:`label_table`, cleaned, split 80/10/10."""
    if not path.is_file():
        raise DataError(f"dataset file {path} not found")
    pairs = records_to_examples(_read_records(path, text_field, label_field), text_field, label_field, path)
    if not pairs:
        raise DataError(f"{path}: no examples")
    table, names = label_table((label for _, label in pairs), path, label_field, lambda i: f"record {i}")
    return make_splits([(t, table[lab]) for t, lab in pairs], seed, names, str(path))


def load_directory(path: pathlib.Path, text_field, label_field) -> Splits:
    """A directory with train/val/test.jsonl, used as-is (no cleaning, no resplitting).

    With a ``labels.json`` (as written by export) the labels must be ids ``0..K-1`` into it, its names unique
    (:func:`check_label_names`); without one, label values are mapped jointly over the three splits by
    :func:`label_table` (colliding values refused). Every split must hold at least one record.
    """
    missing = [f"{s}.jsonl" for s in SPLIT_NAMES if not (path / f"{s}.jsonl").is_file()]
    if missing:
        found = sorted(p.name for p in path.iterdir())
        raise DataError(f"{path}: a split directory needs train.jsonl, val.jsonl and test.jsonl; "
                        f"missing {missing}, found {found}")
    raw = {}
    for s in SPLIT_NAMES:
        file = path / f"{s}.jsonl"
        records = _read_jsonl(file)
        if not records:
            blank = " (every line is blank)" if file.stat().st_size else ""
            raise DataError(f"{file}: the {SPLIT_WORDS[s]} split is empty: {file.name} holds no record{blank}; "
                            "every split needs examples (an empty one would report a made-up accuracy)")
        raw[s] = records_to_examples(records, text_field, label_field, file)
    labels_file = path / "labels.json"
    if labels_file.is_file():
        try:
            names = json.loads(labels_file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise DataError(f"{labels_file}: cannot read ({one_line(e, 200)})") from None
        if not isinstance(names, list) or not names:
            raise DataError(f"{labels_file}: expected a non-empty list of label names")
        names = check_label_names(names, labels_file, label_field)
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
        def origin(i: int) -> str:             # the i-th label over the three splits, in file order
            for s, pairs in raw.items():
                if i < len(pairs):
                    return f"{s}.jsonl record {i}"
                i -= len(pairs)
            return "?"

        table, names = label_table((lab for pairs in raw.values() for _, lab in pairs), path, label_field, origin)
        split_lists = {s: [(t, table[lab]) for t, lab in pairs] for s, pairs in raw.items()}
    return Splits(split_lists["train"], split_lists["val"], split_lists["test"], len(names), names, str(path))


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
            atomic_write_bytes(tmp / name, data)
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
