"""Datasets given by path, and `export`, which writes them.

* A single ``.csv`` (header row), ``.jsonl``, ``.json`` or ``.parquet`` file with a text and a label column:
  labels mapped by `experiments.data.core.label_table`, cleaned and split 80/10/10.
* A folder of splits (``train.jsonl``, ``val.jsonl``, ``test.jsonl``, optionally ``labels.json``, as `export`
  writes it; or ``train``/``val`` (``validation``, ``dev``)/``test`` files of any of those kinds): used as-is, no
  cleaning, no resplitting; a missing val or test file is carved out of train by the seeded 80/10/10 rule.

Text files (CSV, JSON lines, JSON, ``labels.json``) are UTF-8 (a CSV may start with a byte-order mark): a byte
that is not UTF-8 is a `DataError` naming the file, the line, the byte offset and the byte
(`read_utf8`); nothing is read in another encoding. A column name repeated in a CSV header or a parquet
schema, a key repeated in a JSON object, and a CSV row with more or fewer fields than its header are refused
naming the file, the line and the column (they would otherwise lose a value silently).

Every record is checked (`records_to_examples`): a missing column, a missing label
(`experiments.data.core.missing_label`: empty, ``NA``, ``N/A``, ``nan``, ``null``, ``None``, ... or not
finite), text that is not valid Unicode is a `DataError` naming the file and the record. Label values that
collide (one class written two ways: ``1`` and ``"1"``, ``1`` and ``1.0`` or ``true``, ``"1"`` and ``"01"``;
`experiments.data.core.label_table`) and repeated names in ``labels.json``
(`experiments.data.core.check_label_names`) are refused naming the file, the column and both values. A
split file with no record (empty, or blank lines only) is refused naming the split and the file. Every refusal
ends with the config keys that fix it (`experiments.data.core.fix`).
"""
from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import shutil

from energies.checks import one_line
from unfold.strict_json import dumps as json_dumps

from .arrow import read_columns, read_schema
from .core import (SPLIT_NAMES, SPLIT_WORDS, DataError, Splits, check_label_names, column_fix, complete_splits, fix,
                   label_column_fix, label_table, make_splits, missing_label, missing_rule, show)

#: the files a dataset may be given as (one file, split 80/10/10), and the split files of a folder of splits
FILE_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")
#: the names a split file of a folder of splits may have (its stem), first the one ``export`` writes
SPLIT_STEMS = {"train": ("train",), "val": ("val", "validation", "dev"), "test": ("test",)}
from ..runfolder.atomic import fsync_dir
from ..runfolder.runlock import exchange
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
            raise DataError(f"{where}: record {i} is not an object: {rec!r:.80}; each record needs a text and a label "
                            "column" + fix("data.dataset=FILE", why="a .csv with a header row, or .jsonl with one "
                                                                    "{\"text\": ..., \"label\": ...} object a line"))
        missing = [c for c in (text_field, label_field) if c not in rec]
        if missing:
            raise DataError(f"{where}: record {i} has no column(s) {missing}; columns found: {sorted(map(str, rec))}"
                            + column_fix(missing, sorted(map(str, rec)), text_field, label_field))
        label = rec[label_field]
        if label is None or (isinstance(label, str) and not label.strip()):
            raise DataError(f"{where}: record {i} has an empty label ({label_field!r}): a missing value; labels that "
                            f"are {missing_rule()} are missing values, not classes: give the record a class or "
                            "remove it" + label_column_fix(label_field))
        if missing_label(label):
            raise DataError(f"{where}: record {i} has label {show(label.strip() if isinstance(label, str) else label)}"
                            f" ({label_field!r}), a missing value, not a class: labels that are {missing_rule()} are "
                            "missing values; give the record a class or remove it" + label_column_fix(label_field))
        if not isinstance(label, (str, int, float)) or (isinstance(label, float) and not label.is_integer()):
            raise DataError(f"{where}: record {i} has an unusable label {show(label)} ({label_field!r}): expected a "
                            "string or an integer" + label_column_fix(label_field))
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


def read_utf8(path: pathlib.Path) -> str:
    """The text of the file ``path``, decoded as UTF-8. A byte that is not UTF-8 is a `DataError` naming
    the file, the line, the byte offset and the byte (`not_utf8`); nothing is read in another encoding. An
    unreadable file is a `DataError` too."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise _unreadable(path, e) from None


def _unreadable(path: pathlib.Path, e: OSError) -> DataError:
    return DataError(f"{path}: cannot read ({e.strerror or e})" + fix("data.dataset=PATH", why="a readable file"))


def not_utf8(path: pathlib.Path) -> DataError:
    """The refusal of the file ``path``, which a UTF-8 reader could not decode: the line (from 1; a line ends at
    ``\\n``, ``\\r\\n`` or ``\\r``) and the byte offset (from 0) of the first byte that is not UTF-8, the byte, the
    text before it on its line, and how to convert the file. (Found again from the file's bytes: a streaming
    reader's offsets count from its buffer.)"""
    try:
        data = path.read_bytes()
    except OSError as e:
        return _unreadable(path, e)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start
    else:                                                # changed since it was read
        return DataError(f"{path}: not UTF-8 when read; read it again")
    head = data[:at]
    line = head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1
    before = head[max(head.rfind(b"\n"), head.rfind(b"\r")) + 1:].decode("utf-8", "replace")[-30:]
    utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
    return DataError(
        f"{path}: line {line}, byte offset {at}: byte 0x{data[at]:02X} is not UTF-8"
        + (" (the file starts with a UTF-16 byte-order mark)" if utf16 else f", after {show(before)}")
        + f"; the file must be UTF-8 (no other encoding is guessed): convert it, e.g. `iconv -f "
          f"{'UTF-16' if utf16 else 'LATIN1'} -t UTF-8 {path} > {converted}` if it is "
          f"{'UTF-16' if utf16 else 'latin-1'}, and read the converted file" + fix(f"data.dataset={converted}"))


class _RepeatedKey(Exception):
    """A JSON object names one key twice (raised by `_unique_keys`)."""


def _unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of the JSON readers: the object as a dict, a repeated key raised as
    `_RepeatedKey` (``json`` alone keeps the last value silently)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        raise _RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)


def _repeated_key(path: pathlib.Path, line: int, key: str, record: str = "") -> DataError:
    return DataError(f"{path}:{line}: key {show(key)} appears twice in one object{record}: only one of its values "
                     "would be read; remove or rename the other")


def _read_jsonl(path: pathlib.Path, text: str | None = None) -> list:
    """Objects of a JSON-lines file (blank lines skipped), read line by line; ``text``: its content, when read
    already. Not UTF-8, a line that is no JSON, a key repeated in an object: a `DataError` naming the
    line."""
    out = []
    try:
        with (io.StringIO(text, newline=None) if text is not None else open(path, encoding="utf-8")) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    out.append(_json_line(path, n, line))
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise _unreadable(path, e) from None
    return out


def _json_line(path: pathlib.Path, n: int, line: str):
    """The JSON value of line ``n`` of the JSON-lines file ``path``."""
    try:
        return _DECODER.decode(line)
    except _RepeatedKey as e:
        raise _repeated_key(path, n, e.args[0]) from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path}:{n}: not valid JSON ({e}); a {path.suffix} file holds one JSON object a line: "
                        f"correct line {n}" + _other_format(path, line)) from None


def _other_format(path: pathlib.Path, line: str) -> str:
    """A fix for a JSON-lines file whose line is no JSON: when the line reads as a CSV row (a header, say), the
    setting that reads the file as CSV once renamed."""
    if "," in line and not line.lstrip().startswith(("{", "[")):
        return ", or, since it reads as CSV, rename it" + fix(f"data.dataset={path.with_suffix('.csv')}")
    return ""


def record_columns(records) -> tuple:
    """The columns of dict records, in the order first seen (a CSV's header order)."""
    seen: dict = {}
    for rec in records:
        if isinstance(rec, dict):
            seen.update(dict.fromkeys(map(str, rec)))
    return tuple(seen)


def _read_parquet(path: pathlib.Path, text_field: str, label_field: str) -> tuple[list, tuple]:
    """``(records, columns)`` of a .parquet file, refusing a missing text or label column."""
    unreadable = fix("data.dataset=PATH", why="a readable parquet file, or the data as .csv or .jsonl")
    try:
        names = read_schema(path).names
    except DataError as e:
        raise DataError(f"{e}{unreadable}") from None
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        raise DataError(f"{path}: column(s) {repeated} appear more than once in the schema: only one copy would be "
                        "read; rename or remove the others" + unreadable)
    missing = [c for c in (text_field, label_field) if c not in names]
    if missing:
        raise DataError(f"{path}: no column(s) {missing}; columns found: {names}"
                        + column_fix(missing, names, text_field, label_field))
    try:
        cols = read_columns(path, [text_field, label_field])
    except DataError as e:
        raise DataError(f"{e}{unreadable}") from None
    return [{text_field: t, label_field: lab} for t, lab in zip(cols[text_field], cols[label_field])], tuple(names)


def _read_csv(path: pathlib.Path, text_field: str, label_field: str) -> tuple[list, tuple]:
    """``(records, columns)`` of a UTF-8 .csv file (a leading byte-order mark dropped; a byte that is not UTF-8
    refused by `not_utf8`), refusing a missing or repeated column and a row whose number of fields is not
    the header's (`_csv_rows`)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            return _read_csv_from(path, csv.reader(f), text_field, label_field)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except OSError as e:
        raise _unreadable(path, e) from None


def _read_csv_from(path: pathlib.Path, reader, text_field: str, label_field: str) -> tuple[list, tuple]:
    """`_read_csv` of the open file's ``reader``."""
    try:
        columns = next(reader, None) or []
        repeated = sorted({c for c in columns if c.strip() and columns.count(c) > 1})
        if repeated:
            where = {c: [i + 1 for i, x in enumerate(columns) if x == c] for c in repeated}
            raise DataError(f"{path}: line 1: column(s) {repeated} appear more than once in the header (positions "
                            f"{where}): only one copy would be read; rename or remove the others")
        missing = [c for c in (text_field, label_field) if c not in columns]
        if missing:
            raise DataError(f"{path}: no column(s) {missing}; columns found: {columns}"
                            + column_fix(missing, columns, text_field, label_field))
        return _csv_rows(path, reader, columns), tuple(columns)
    except csv.Error as e:
        raise DataError(f"{path}: line {reader.line_num}: cannot read as CSV ({e})"
                        + fix("data.dataset=PATH", why="a readable file")) from None


def _csv_rows(path: pathlib.Path, reader, columns: list) -> list[dict]:
    """The rows of ``reader`` (after the header ``columns``) as dicts; blank lines skipped; a row with more or
    fewer fields than the header is a `DataError` naming its line (an extra field would be dropped, a
    missing one read as empty)."""
    records = []
    while True:
        line = reader.line_num + 1                      # the line the next row starts on
        row = next(reader, None)
        if row is None:
            return records
        if not row:
            continue
        if len(row) != len(columns):
            extra = (f": the extra field(s) {show(row[len(columns):])} would be dropped (a field that holds a comma "
                     'must be quoted: "a, b")' if len(row) > len(columns) else
                     f": no value for {columns[len(row):]}")
            raise DataError(f"{path}: line {line} has {len(row)} field(s), the header has {len(columns)}{extra}; "
                            "correct the row")
        records.append(dict(zip(columns, row)))


def _read_json(path: pathlib.Path) -> tuple[list, tuple]:
    """``(records, columns)`` of a .json file: a list of objects (or one), or JSON lines if not one document."""
    text = read_utf8(path)
    try:
        data = _DECODER.decode(text)
    except _RepeatedKey:
        raise _repeated_in_document(path, text) from None
    except (ValueError, RecursionError):
        return _read_jsonl(path, text)
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects, got {type(data).__name__}"
                        + fix(f"data.dataset={path.with_suffix('.jsonl')}",
                              why="one {\"text\": ..., \"label\": ...} object a line"))
    return data, record_columns(data)


def _repeated_in_document(path: pathlib.Path, text: str) -> DataError:
    """The refusal of the JSON document ``text`` that repeats a key: the key, and, when the document is a list of
    records, the record that holds it and the line the record starts on (line of the document otherwise)."""
    pos = len(text) - len(text.lstrip())
    if text.startswith("[", pos):                      # a list of records: decode them one by one
        i, pos = 0, pos + 1
        while True:
            pos = len(text) - len(text[pos:].lstrip(" \t\r\n,"))
            try:
                pos = _DECODER.raw_decode(text, pos)[1]
            except _RepeatedKey as e:
                return _repeated_key(path, text.count("\n", 0, pos) + 1, e.args[0], f" (record {i})")
            except (ValueError, RecursionError):
                break
            i += 1
    try:
        _DECODER.decode(text)
    except _RepeatedKey as e:
        return _repeated_key(path, text.count("\n", 0, len(text) - len(text.lstrip())) + 1, e.args[0])
    return DataError(f"{path}: a key appears twice in one object: only one of its values would be read")


def _read_records(path: pathlib.Path, text_field: str, label_field: str) -> tuple[list, tuple]:
    """Records of a .csv (header row; UTF-8), .jsonl, .json or .parquet file.

    A .json file holds a list of objects, or is read as JSON lines otherwise. A missing column is refused here
    for the files with a header (CSV, parquet), naming the columns found and the keys that choose others.
    Returns ``(records, columns found)``.
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path, text_field, label_field)
    if suffix == ".csv":
        return _read_csv(path, text_field, label_field)
    if suffix == ".json":
        return _read_json(path)
    data = _read_jsonl(path)
    return data, record_columns(data)


def load_file(path: pathlib.Path, seed, text_field, label_field) -> Splits:
    """A single .csv/.jsonl/.json/.parquet file: labels mapped by `label_table`, cleaned, split 80/10/10
    by ``seed``."""
    if not path.is_file():
        raise DataError(f"dataset file {path} not found (looked at {path.absolute()})"
                        + fix("data.dataset=PATH", why="an existing file or folder; a relative path is read from "
                                                       "the folder the command runs in"))
    records, columns = _read_records(path, text_field, label_field)
    pairs = records_to_examples(records, text_field, label_field, path)
    if not pairs:
        raise DataError(f"{path}: no examples (the file holds no record)" + fix("data.dataset=PATH",
                                                                               why="a file with examples"))
    table, names = label_table((label for _, label in pairs), path, label_field, lambda i: f"record {i}")
    return make_splits([(t, table[lab]) for t, lab in pairs], seed, names, str(path), columns)


def split_files(path: pathlib.Path) -> dict[str, pathlib.Path]:
    """``{split: file}`` of a folder of splits: for each of ``train``, ``val``, ``test`` the file whose stem is one
    of `SPLIT_STEMS` (``val``, ``validation`` or ``dev`` for ``val``) and whose suffix one of
    `FILE_SUFFIXES`, any case; a split with none is left out, a split with two files is a `DataError`
    naming both."""
    out: dict[str, pathlib.Path] = {}
    for f in sorted(path.iterdir()):
        if not f.is_file() or f.suffix.lower() not in FILE_SUFFIXES:
            continue
        for split, stems in SPLIT_STEMS.items():
            if f.stem.lower() in stems:
                if split in out:
                    raise DataError(f"{path}: two files for the {SPLIT_WORDS[split]} split, {out[split].name} and "
                                    f"{f.name}; keep one")
                out[split] = f
    return out


def _no_split_files(path: pathlib.Path, found: list[str]) -> DataError:
    """The refusal of a folder with no training file: what the folder looks like, and the setting that reads it."""
    data = [n for n in found if pathlib.Path(n).suffix.lower() in FILE_SUFFIXES]
    hf_marks = [n for n in found if n in ("dataset_dict.json", "state.json", "README.md", "data")
                or n.endswith((".arrow", ".parquet"))]
    if hf_marks:
        hint = fix(f"data.dataset=hf:{path}", why="a Hugging Face dataset folder (save_to_disk output or a hub "
                                                  "snapshot)")
    elif len(data) == 1:
        hint = fix(f"data.dataset={path / data[0]}", why="one file, split 80/10/10 by data.seed")
    else:
        hint = fix(f"data.dataset={path}/FILE", why="one file, split 80/10/10 by data.seed; or name the split "
                                                     "files train.csv, val.csv, test.csv (or .jsonl, .parquet)")
    return DataError(f"{path}: a folder of splits needs a training file, train.jsonl (or train.csv, .json, "
                     f".parquet), beside val and test files (optional); found {found}" + hint)


def _check_split_names(path: pathlib.Path, files: dict[str, pathlib.Path]) -> None:
    """Refuse a folder without a training file, or with a data file that is no split file while a split lacks one."""
    if "train" not in files:
        raise _no_split_files(path, sorted(p.name for p in path.iterdir()))
    stray = sorted(f.name for f in path.iterdir() if f.is_file() and f.suffix.lower() in FILE_SUFFIXES
                   and f not in files.values() and f.name != "labels.json")
    if len(files) < 3 and stray:               # a misspelt split file would otherwise be carved out of train
        lacking = [s for s in SPLIT_NAMES if s not in files]
        named = " nor ".join(f"{s} ({'|'.join(SPLIT_STEMS[s])})" for s in lacking)
        rename = SPLIT_STEMS[lacking[0]][0] + pathlib.Path(stray[0]).suffix
        raise DataError(f"{path}: no {named} file, and {stray} is no split file: rename {stray[0]} {rename}, or "
                        "move it out (a missing val or test split is then carved out of the training file by "
                        "data.seed)")


def _empty_split(path: pathlib.Path, files: dict[str, pathlib.Path], s: str, file: pathlib.Path) -> DataError:
    """The refusal of the split file ``file`` of split ``s`` holding no record."""
    blank = " (every line is blank)" if file.stat().st_size else ""
    return DataError(f"{file}: the {SPLIT_WORDS[s]} split is empty: {file.name} holds no record{blank}; "
                     "every split needs examples (an empty one would report a made-up accuracy): add "
                     f"examples, or remove {file.name} (the split is then carved out of the training file)"
                     + fix(f"data.dataset={files['train']}", why="the training file alone, split 80/10/10 "
                                                                 "by data.seed")
                     if s != "train" else
                     f"{file}: the training split is empty: {file.name} holds no record{blank}"
                     + fix(f"data.dataset={path}/FILE", why="one file with all the examples, split "
                                                           "80/10/10 by data.seed"))


def _read_split_files(path: pathlib.Path, files: dict[str, pathlib.Path], text_field, label_field
                      ) -> tuple[dict[str, list], dict]:
    """``({split: (text, label) pairs}, {column: None})`` of the split files, each required to hold a record."""
    raw, columns = {}, {}
    for s, file in files.items():
        if file.suffix.lower() == ".jsonl":
            records = _read_jsonl(file)
            columns.update(dict.fromkeys(record_columns(records)))
        else:
            records, found = _read_records(file, text_field, label_field)
            columns.update(dict.fromkeys(found))
        if not records:
            raise _empty_split(path, files, s, file)
        raw[s] = records_to_examples(records, text_field, label_field, file)
    return raw, columns


def _labels_from_file(labels_file: pathlib.Path, raw: dict[str, list], files: dict[str, pathlib.Path],
                      label_field) -> tuple[dict[str, list], list]:
    """``(split lists, names)`` with the names of ``labels.json`` and every label an id into them."""
    text = read_utf8(labels_file)
    try:
        names = _DECODER.decode(text)
    except _RepeatedKey as e:
        raise _repeated_key(labels_file, 1, e.args[0]) from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"{labels_file}: cannot read ({one_line(e, 200)}); correct it, or remove it to take the "
                        "label names from the values") from None
    if not isinstance(names, list) or not names:
        raise DataError(f"{labels_file}: expected a non-empty list of label names; correct it, or remove it "
                        "to take the label names from the values")
    names = check_label_names(names, labels_file, label_field)
    split_lists = {}
    for s, pairs in raw.items():
        out = []
        for i, (text, lab) in enumerate(pairs):
            if isinstance(lab, bool) or not isinstance(lab, int) or not 0 <= lab < len(names):
                raise DataError(f"{files[s]}: record {i} has label {lab!r}, expected an integer in "
                                f"[0, {len(names)}) (labels.json); remove {labels_file.name} to take the label "
                                "names from the values" + label_column_fix(label_field))
            out.append((text, lab))
        split_lists[s] = out
    return split_lists, names


def _labels_from_values(path: pathlib.Path, raw: dict[str, list], files: dict[str, pathlib.Path],
                        label_field) -> tuple[dict[str, list], list]:
    """``(split lists, names)`` with the label values mapped jointly over the splits by `label_table`."""
    def origin(i: int) -> str:             # the i-th label over the splits, in file order
        for s, pairs in raw.items():
            if i < len(pairs):
                return f"{files[s].name} record {i}"
            i -= len(pairs)
        return "?"

    table, names = label_table((lab for pairs in raw.values() for _, lab in pairs), path, label_field, origin)
    return {s: [(t, table[lab]) for t, lab in pairs] for s, pairs in raw.items()}, names


def load_directory(path: pathlib.Path, text_field, label_field, seed: int = 0) -> Splits:
    """A folder of splits: ``train``, ``val`` (or ``validation``, ``dev``) and ``test`` files (`split_files`,
    any of `FILE_SUFFIXES`), used as-is (no cleaning, no resplitting); a missing ``val`` or ``test`` file is
    carved out of ``train`` by the seeded 80/10/10 rule (`complete_splits`), ``train`` is required.

    With a ``labels.json`` (as written by export) the labels must be ids ``0..K-1`` into it, its names unique
    (`check_label_names`); without one, label values are mapped jointly over the splits by
    `label_table` (colliding values refused). Every split file must hold at least one record.
    """
    files = split_files(path)
    _check_split_names(path, files)
    raw, columns = _read_split_files(path, files, text_field, label_field)
    labels_file = path / "labels.json"
    if labels_file.is_file():
        split_lists, names = _labels_from_file(labels_file, raw, files, label_field)
    else:
        split_lists, names = _labels_from_values(path, raw, files, label_field)
    split_lists, derived = complete_splits(split_lists, seed, str(files["train"]))
    origins = {s: (files[s].name if s not in derived else
                   f"drawn from {files['train'].name} (80/10/10, data.seed={seed})") for s in SPLIT_NAMES}
    return Splits(split_lists["train"], split_lists["val"], split_lists["test"], len(names), names, str(path),
                  derived, origins, tuple(columns))


#: the files `export` writes, and the only ones a folder it replaces (``overwrite``) may hold
EXPORT_FILES = tuple(f"{s}.jsonl" for s in SPLIT_NAMES) + ("labels.json",)


def export(splits: Splits, out, overwrite: bool = False, sources=()) -> pathlib.Path:
    """Write ``splits`` to the folder ``out``: train/val/test.jsonl and labels.json; returns ``out``.

    Each line is ``{"text": ..., "label": int}``; the order is the order of the splits. All or nothing: the
    files are written into a staging folder beside ``out`` and read back (they must give ``splits`` again); only
    then does the staging folder become ``out``, by one rename (a new ``out``) or one atomic exchange of the two
    folders (an existing one, which is then removed). On any error the staging folder and the parent folders made
    for it are removed and ``out`` is left as it was. ``out`` must not be a file (`check_folder`).

    Never lost: an existing ``out`` that holds anything is refused unless ``overwrite``, and even then it may hold
    only the files an export writes (`EXPORT_FILES`: a previous export); ``out`` may not be, nor hold, any of
    ``sources`` (the files or folders the dataset was read from, `experiments.data.load.source_paths`),
    compared by real path and by inode (a link, a bind mount, a hard link). A link at ``out`` is followed: the
    folder it points to is replaced.
    """
    out, real = check_export_target(out, overwrite, sources)
    files = _export_bytes(splits)
    made = []                                    # parent folders created here, removed again on failure
    tmp = None
    try:
        for parent in reversed(real.parents):
            if not parent.exists():
                parent.mkdir()
                made.append(parent)
        tmp = real.parent / f".{real.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        tmp.mkdir()                             # (not mkdtemp: an export is an ordinary folder, not a private one)
        for name, data in files.items():
            atomic_write_bytes(tmp / name, data)
        _verify_export(tmp, splits, out)
        _check_export_target(out, real, overwrite, sources)      # again: nothing came in meanwhile
        if real.exists():
            exchange(str(tmp), str(real))
            old, tmp = tmp, None                # the replaced folder, now at the staging name
            _remove_export(old)
        else:
            os.rename(tmp, real)
            tmp = None
        fsync_dir(real.parent)
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


def _remove_export(folder: pathlib.Path) -> None:
    """Remove the folder an export replaced: its export files, then the folder itself; a file that came in
    since it was checked stays, with the folder, under its staging name (never removed unseen)."""
    for name in EXPORT_FILES:
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass


def _export_bytes(splits: Splits) -> dict[str, bytes]:
    """``{file name: content}`` of the export of ``splits`` (``export``)."""
    files = {f"{s}.jsonl": "".join(json_dumps({"text": t, "label": int(lab)}, ensure_ascii=False) + "\n"
                                   for t, lab in getattr(splits, s)).encode("utf-8") for s in SPLIT_NAMES}
    files["labels.json"] = (json_dumps(splits.label_names, ensure_ascii=False) + "\n").encode("utf-8")
    return files


def check_export_target(out, overwrite: bool = False, sources=()) -> tuple[pathlib.Path, pathlib.Path]:
    """``(out, its real path)`` when `export` may write the folder ``out`` (a folder that can be written,
    not a source, empty or an earlier export with ``overwrite``), else a `DataError` saying why; a command
    calls it before reading the dataset, `export` again before it writes."""
    out = check_folder(out, "export folder", writable=True)
    real = pathlib.Path(os.path.realpath(out))
    if real.is_symlink():
        raise DataError(f"export folder {out} is a link that leads to no folder (a loop of links): choose another "
                        "folder for --out")
    _check_export_target(out, real, overwrite, sources)
    return out, real


def _check_export_target(out: pathlib.Path, real: pathlib.Path, overwrite: bool, sources) -> None:
    """Refuse to export into ``out`` (its real path ``real``) when it is or holds one of ``sources``, or exists
    holding anything without ``overwrite``, or anything but `EXPORT_FILES` with it (`export`)."""
    for src in map(pathlib.Path, sources):
        if not src.exists():
            continue
        folder = src if src.is_dir() else src.parent
        if _same(real, folder) or any(_same(real / name, src) for name in EXPORT_FILES):
            what = "the folder the dataset is read from" if src.is_dir() else "the folder that holds the dataset's file"
            raise DataError(f"export folder {out} is {what} ({src}): an export never replaces its own source; "
                            "choose another folder for --out")
    if not real.is_dir():
        return
    names = sorted(os.listdir(real))
    other = [n for n in names if n not in EXPORT_FILES or not _plain_file(real / n)]
    if names and not overwrite:
        raise DataError(f"export folder {out} is not empty ({_listed(names)}): its files are kept; choose an empty "
                        "or new folder" + ("" if other else ", or pass --overwrite to replace this earlier export"))
    if other:
        raise DataError(f"export folder {out} holds files that no export writes ({_listed(other)}): they may be "
                        "someone else's, so it is not replaced, even with --overwrite; move them away or choose "
                        "an empty or new folder")


def _same(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Whether ``a`` and ``b`` are one file or folder (real path, or device and inode); ``False`` when either is
    missing."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except OSError:
        return False


def _plain_file(path: pathlib.Path) -> bool:
    """A regular file or a link (removing a link leaves what it points to), not a folder."""
    return path.is_symlink() or path.is_file()


def _listed(names: list) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _verify_export(folder: pathlib.Path, splits: Splits, out: pathlib.Path) -> None:
    """Read the staged export ``folder`` back (`load_directory`): it must give the examples and the label
    names of ``splits``, else a `DataError` (nothing replaced)."""
    back = load_directory(folder, "text", "label")
    if (back.train, back.val, back.test, back.label_names) != (splits.train, splits.val, splits.test,
                                                               list(splits.label_names)):
        raise DataError(f"export folder {out}: the files written do not read back as the dataset "
                        f"{splits.name}; nothing was replaced")
