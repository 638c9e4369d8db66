"""Hostile data for the loaders and ``unfold-data``: what would pass silently is refused or reported.

* ``unfold-data export --out``: an existing folder that holds anything is refused (its ``train.jsonl`` is never
  replaced); ``--overwrite`` replaces an earlier export and nothing else; the folder the dataset is read from (or
  that holds its file) is refused whatever the path that names it (a folder of ``.csv`` splits exported onto
  itself would get ``.jsonl`` files beside them and could not be read); the new folder is staged, read back, then
  swapped in.
* A byte that is not UTF-8 is refused naming the file, the line, the byte offset and the byte, in every text
  file the loader reads (CSV, JSON lines, JSON, ``labels.json``; a CSV is never re-read as latin-1 whole,
  ``café`` turning into ``cafÃ©``).
* A column named twice in a CSV header or a parquet schema, a key given twice in a JSON object, a CSV row with
  more or fewer fields than the header: refused naming the file, the line and the column (the last copy never
  wins, extra fields are never dropped).
* Missing labels: ``NA``, ``N/A``, ``null``, ``None``, ... are refused as ``nan`` is (``NA`` never becomes a
  class); ``unfold-data inspect`` reports the rows cleaning dropped, by reason, and the held-out texts that repeat
  a training text, which `experiments.data.load.load_dataset` also logs as a warning.

Names of the checks are looked up inside the tests, so one that is missing fails its own tests only.
"""
import json
import logging
import os
import pathlib

import pytest

from clifuzz import expect_refusal, run_cli
from experiments import data as D
from experiments.data import DataError, load_dataset

DATA = "experiments.app.data_cli"
FILES = ["labels.json", "test.jsonl", "train.jsonl", "val.jsonl"]
WORDS = ["good", "bad", "great", "awful", "fine", "dull", "lovely", "boring", "superb", "poor", "nice", "weak"]
TEXTS = [f"a {w} film number {i}" for i, w in enumerate(WORDS * 2)]      # 24 distinct texts


def csv_text(texts=TEXTS, labels=("neg", "pos")) -> str:
    return "text,label\n" + "".join(f"{t},{labels[i % len(labels)]}\n" for i, t in enumerate(texts))


def jsonl(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def labelled(texts=TEXTS, labels=("neg", "pos")):
    return [{"text": t, "label": labels[i % len(labels)]} for i, t in enumerate(texts)]


def tree(folder) -> dict:
    """``{relative path: bytes}`` of every file under ``folder`` (links read through)."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


def export(dataset, out, *more):
    return ["export", "--dataset", str(dataset), "--out", str(out), *more]


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.csv"
    path.write_text(csv_text(), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# export never loses a user's files
# --------------------------------------------------------------------------------------------

def test_export_refuses_a_folder_that_holds_files(good, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.jsonl").write_text('{"text": "my own work", "label": 1}\n')
    (out / "notes.txt").write_text("keep me")
    before = tree(out)
    line = expect_refusal(DATA, export(good, out), str(tmp_path), names=["mine", "not empty", "train.jsonl"],
                          writes=True)
    assert tree(out) == before and "--overwrite" not in line          # notes.txt: --overwrite would not help
    line = expect_refusal(DATA, export(good, out, "--overwrite"), str(tmp_path),
                          names=["mine", "notes.txt", "even with --overwrite"], writes=True)
    assert tree(out) == before
    assert sorted(os.listdir(tmp_path)) == ["good.csv", "mine"]       # no staging folder left behind


def test_export_overwrite_replaces_an_earlier_export_only(good, tmp_path):
    out = tmp_path / "exp"
    code, _, err = run_cli(DATA, export(good, out), str(tmp_path))
    assert code == 0, err
    first = tree(out)
    line = expect_refusal(DATA, export(good, out, "--seed", "7"), str(tmp_path),
                          names=["exp", "not empty", "--overwrite"], writes=True)
    assert tree(out) == first and line
    code, _, err = run_cli(DATA, export(good, out, "--seed", "7", "--overwrite"), str(tmp_path))
    assert code == 0, err
    assert tree(out) != first and sorted(os.listdir(out)) == sorted(D.files.EXPORT_FILES)
    again = load_dataset(str(good), seed=7)
    back = load_dataset(str(out))
    assert (back.train, back.val, back.test) == (again.train, again.val, again.test)
    assert sorted(os.listdir(tmp_path)) == ["exp", "good.csv"]


def test_export_into_an_empty_folder_and_through_a_link(good, tmp_path):
    """Positive controls: an empty existing folder is written without --overwrite; a link is followed."""
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(DATA, export(good, empty), str(tmp_path))
    assert code == 0, err
    assert sorted(os.listdir(empty)) == FILES
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    code, _, err = run_cli(DATA, export(good, tmp_path / "link"), str(tmp_path))
    assert code == 0, err
    assert (tmp_path / "link").is_symlink() and sorted(os.listdir(real)) == FILES


def _csv_splits(folder):
    folder.mkdir()
    (folder / "train.csv").write_text(csv_text(TEXTS[:16]))
    (folder / "test.csv").write_text(csv_text(TEXTS[16:]))
    return folder


def test_export_onto_its_own_source_folder_is_refused(tmp_path):
    src = _csv_splits(tmp_path / "splits")
    before = tree(src)
    (tmp_path / "alias").symlink_to(src, target_is_directory=True)
    for out, dataset in ((src, src), (tmp_path / "alias", src), (src, tmp_path / "alias"),
                         (str(src) + "/./", src), ("splits", "alias/")):
        for more in ((), ("--overwrite",)):
            expect_refusal(DATA, export(dataset, out, *more), str(tmp_path), names=["export folder", "source"],
                           writes=True)
            assert tree(src) == before
    assert load_dataset(str(src)).sizes()["test"] == 8                 # still readable


def test_export_onto_the_folder_of_its_own_file_or_an_earlier_export_is_refused(good, tmp_path):
    expect_refusal(DATA, export(good, tmp_path, "--overwrite"), str(tmp_path), names=["source", "good.csv"],
                   writes=True)
    out = tmp_path / "exp"
    assert run_cli(DATA, export(good, out), str(tmp_path))[0] == 0
    before = tree(out)
    # an export folder is a dataset too: exported onto itself (it holds only export files) is still refused
    expect_refusal(DATA, export(out, out, "--overwrite"), str(tmp_path), names=["source"], writes=True)
    # a hard link of the dataset file inside --out: the same file by inode
    single = tmp_path / "single"
    single.mkdir()
    os.link(out / "train.jsonl", single / "train.jsonl")
    expect_refusal(DATA, export(out / "train.jsonl", single, "--overwrite"), str(tmp_path), names=["source"],
                   writes=True)
    assert tree(out) == before


def test_export_onto_the_source_of_an_hf_dataset_or_through_a_loop_is_refused(good, tmp_path):
    (tmp_path / "sub").mkdir()
    expect_refusal(DATA, export("./good.csv", "sub/..", "--overwrite"), str(tmp_path), names=["source", "good.csv"],
                   writes=True)
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    for split, part in (("train", TEXTS[:16]), ("test", TEXTS[16:])):
        pq.write_table(pa.table({"text": part, "label": [i % 2 for i in range(len(part))]}),
                       hub / "data" / f"{split}-00000-of-00001.parquet")
    before = tree(hub)
    for more in ((), ("--overwrite",)):
        expect_refusal(DATA, export(f"hf:{hub}", hub, *more), str(tmp_path), names=["source", "hub"], writes=True)
    assert tree(hub) == before
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    expect_refusal(DATA, export(good, tmp_path / "loop1"), str(tmp_path), names=["loop1", "loop"], writes=True)
    assert sorted(os.listdir(tmp_path)) == ["good.csv", "hub", "loop1", "loop2", "sub"]


def test_a_file_that_comes_into_a_replaced_export_is_not_removed(good, tmp_path, monkeypatch):
    """Between the last check and the swap a file lands in the old folder: it is kept (under the staging
    name), never removed with the export it was put beside."""
    files = pytest.importorskip("experiments.data.files")
    out = tmp_path / "exp"
    files.export(load_dataset(str(good)), out)
    real_exchange = files.exchange

    def late(a, b):
        (pathlib.Path(b) / "late.txt").write_text("arrived late")
        real_exchange(a, b)

    monkeypatch.setattr(files, "exchange", late)
    files.export(load_dataset(str(good), seed=2), out, overwrite=True)
    assert sorted(os.listdir(out)) == FILES
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".exp.")]
    assert len(kept) == 1 and os.listdir(kept[0]) == ["late.txt"]


def test_export_is_read_back_before_it_replaces_anything(good, tmp_path, monkeypatch):
    files = pytest.importorskip("experiments.data.files")
    assert hasattr(files, "EXPORT_FILES")
    out = tmp_path / "exp"
    splits = load_dataset(str(good))
    files.export(splits, out)
    before = tree(out)
    real = files.load_directory

    def corrupt(folder, *a, **k):                       # what a bad disk or a writer bug would read back
        s = real(folder, *a, **k)
        s.train = s.train[1:]
        return s

    monkeypatch.setattr(files, "load_directory", corrupt)
    with pytest.raises(DataError, match="do not read back"):
        files.export(load_dataset(str(good), seed=3), out, overwrite=True)
    assert tree(out) == before and sorted(os.listdir(tmp_path)) == ["exp", "good.csv"]


# --------------------------------------------------------------------------------------------
# bytes that are not UTF-8: refused where they are, never re-read as latin-1
# --------------------------------------------------------------------------------------------

def test_one_bad_byte_in_a_utf8_csv_is_refused_naming_line_offset_and_byte(tmp_path):
    text = csv_text().replace("a good film number 0", "a café film")
    data = text.encode("utf-8").replace("a dull film".encode(), b"a d\xfcll film")
    path = tmp_path / "mixed.csv"
    path.write_bytes(data)
    at = data.index(b"\xfc")
    with pytest.raises(DataError) as e:
        load_dataset(str(path))
    msg = str(e.value)
    assert "mixed.csv" in msg and "line 7" in msg and f"byte offset {at}" in msg and "0xFC" in msg, msg
    assert "not UTF-8" in msg and "iconv" in msg
    path.write_bytes(text.encode("utf-8"))                               # positive control: café stays café
    assert any("café" in t for t, _ in load_dataset(str(path)).train + load_dataset(str(path)).val
               + load_dataset(str(path)).test)


@pytest.mark.parametrize("name, content", [
    ("latin.csv", csv_text().replace("awful", "\xe0wful").encode("latin-1")),
    ("bad.jsonl", jsonl(labelled()).encode().replace(b"lovely", b"lov\xe9ly")),
    ("bad.json", json.dumps(labelled(), indent=1).encode().replace(b"boring", b"bor\xffing")),
    ("bom16.csv", csv_text().encode("utf-16")),
    ("bom_crlf.csv", b"\xef\xbb\xbf" + csv_text().replace("\n", "\r\n").replace("nice", "n\xefce").encode("latin-1")),
])
def test_every_text_format_refuses_a_bad_byte(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UnicodeDecodeError) as e:
        content.decode("utf-8")
    at = e.value.start
    lineno = content.count(b"\n", 0, at) + 1
    line = expect_refusal(DATA, export(path, tmp_path / "out"), str(tmp_path),
                          names=[name, f"line {lineno},", f"byte offset {at}:",
                                 f"0x{content[at]:02X}", "not UTF-8"])
    assert line


def test_a_bad_byte_in_a_file_with_old_mac_line_ends(tmp_path):
    """Lines ended by a lone ``\\r`` are counted as lines too."""
    data = csv_text().replace("\n", "\r").replace("fine", "f\xeene").encode("latin-1")
    (tmp_path / "mac.csv").write_bytes(data)
    expect_refusal(DATA, export(tmp_path / "mac.csv", tmp_path / "out"), str(tmp_path),
                   names=["mac.csv", "line 6,", f"byte offset {data.index(bytes([0xee]))}:", "0xEE"])


def test_bad_bytes_in_split_files_and_labels_json(tmp_path):
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.csv").write_text(csv_text(TEXTS[:16]))
    (folder / "test.csv").write_bytes(csv_text(TEXTS[16:]).encode().replace(b"superb", b"sup\xe8rb"))
    expect_refusal(DATA, export(folder, tmp_path / "out"), str(tmp_path), names=["test.csv", "line", "0xE8"])
    (folder / "test.csv").write_text(csv_text(TEXTS[16:]))
    ids = tmp_path / "ids"
    ids.mkdir()
    for s, part in (("train", TEXTS[:16]), ("val", TEXTS[16:20]), ("test", TEXTS[20:])):
        (ids / f"{s}.jsonl").write_text(jsonl(labelled(part, (0, 1))))
    (ids / "labels.json").write_bytes('["n\u00e9g",\n "pos"]'.encode("latin-1"))
    expect_refusal(DATA, export(ids, tmp_path / "out"), str(tmp_path), names=["labels.json", "line 1", "0xE9"])
    (ids / "labels.json").write_text('["n\u00e9g", "pos"]', encoding="utf-8")        # positive control
    assert load_dataset(str(ids)).label_names == ["n\u00e9g", "pos"]
    assert load_dataset(str(folder)).num_classes == 2


# --------------------------------------------------------------------------------------------
# repeated columns and keys, ragged rows
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("header, row, names", [
    ("text,label,label", "{t},{y},other", ["'label'", "line 1", "more than once"]),
    ("text,text,label", "{t},other,{y}", ["'text'", "line 1", "more than once"]),
    ("text,label,note,note", "{t},{y},a,b", ["'note'", "line 1", "more than once"]),
])
def test_a_repeated_csv_column_is_refused(tmp_path, header, row, names):
    path = tmp_path / "rep.csv"
    path.write_text(header + "\n" + "".join(row.format(t=t, y=i % 2) + "\n" for i, t in enumerate(TEXTS)))
    expect_refusal(DATA, export(path, tmp_path / "out"), str(tmp_path), names=["rep.csv", *names])


def test_blank_trailing_header_cells_are_not_repeats(tmp_path):
    """Positive control: a spreadsheet's empty trailing columns (``text,label,,``) are no repeated name."""
    path = tmp_path / "sheet.csv"
    path.write_text("text,label,,\n" + "".join(f"{t},{i % 2},,\n" for i, t in enumerate(TEXTS)))
    assert load_dataset(str(path)).num_classes == 2


@pytest.mark.parametrize("rows, line, names", [
    (["a film, with a comma,pos"], 4, ["3 field(s)", "extra", "'pos'", "quoted"]),
    (["just a text"], 4, ["1 field(s)", "no value for ['label']"]),
    (['"a quoted\ntext over two lines",neg', "one,two,three"], 6, ["3 field(s)"]),
])
def test_a_ragged_csv_row_is_refused_naming_its_line(tmp_path, rows, line, names):
    path = tmp_path / "ragged.csv"
    body = [f"{t},{i % 2}" for i, t in enumerate(TEXTS)]
    path.write_text("\n".join(["text,label", *body[:2], *rows, *body[2:]]) + "\n")
    expect_refusal(DATA, export(path, tmp_path / "out"), str(tmp_path),
                   names=["ragged.csv", f"line {line}", "the header has 2", *names])


def test_a_repeated_json_key_is_refused_naming_line_and_key(tmp_path):
    lines = jsonl(labelled()).splitlines()
    lines[2] = '{"text": "a film", "label": "neg", "label": "pos"}'
    (tmp_path / "rep.jsonl").write_text("\n".join(lines) + "\n")
    expect_refusal(DATA, export(tmp_path / "rep.jsonl", tmp_path / "out"), str(tmp_path),
                   names=["rep.jsonl:3", "'label'", "twice"])
    lines[2] = '{"text": "a film", "label": "neg", "meta": {"a": 1, "a": 2}}'
    (tmp_path / "nested.jsonl").write_text("\n".join(lines) + "\n")
    expect_refusal(DATA, export(tmp_path / "nested.jsonl", tmp_path / "out"), str(tmp_path),
                   names=["nested.jsonl:3", "'a'", "twice"])
    records = [json.dumps(r) for r in labelled()]
    records[4] = '{"text": "a film",\n  "text": "another", "label": "neg"}'
    (tmp_path / "rep.json").write_text("[\n" + ",\n".join(records) + "\n]\n")
    expect_refusal(DATA, export(tmp_path / "rep.json", tmp_path / "out"), str(tmp_path),
                   names=["rep.json:6", "record 4", "'text'", "twice"])
    split = tmp_path / "split"
    split.mkdir()
    (split / "train.jsonl").write_text(jsonl(labelled(TEXTS[:16])))
    (split / "test.jsonl").write_text('{"text": "x", "text": "y", "label": "pos"}\n')
    expect_refusal(DATA, export(split, tmp_path / "out"), str(tmp_path), names=["test.jsonl:1", "'text'"])


def test_a_repeated_parquet_column_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    n = len(TEXTS)
    table = pa.Table.from_arrays([pa.array(TEXTS), pa.array([i % 2 for i in range(n)]),
                                  pa.array([(i + 1) % 2 for i in range(n)])], names=["text", "label", "label"])
    pq.write_table(table, tmp_path / "rep.parquet")
    expect_refusal(DATA, export(tmp_path / "rep.parquet", tmp_path / "out"), str(tmp_path),
                   names=["rep.parquet", "'label'", "more than once"])


# --------------------------------------------------------------------------------------------
# missing labels: one rule
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker", ["NA", "N/A", "n/a", "null", "NULL", "None", "nan", "NaN", "#N/A", "<NA>", " na ",
                                    "inf", "-Infinity"])
def test_every_missing_value_marker_is_refused_alike(tmp_path, marker):
    labels = ("neg", "pos", "neg", marker)
    (tmp_path / "m.csv").write_text(csv_text(labels=labels))
    line = expect_refusal(DATA, export(tmp_path / "m.csv", tmp_path / "out"), str(tmp_path),
                          names=["m.csv", "record 3", repr(marker.strip()), "missing value"])
    assert "NA N/A nan null None" in line                               # the rule is stated in the refusal
    (tmp_path / "m.jsonl").write_text(jsonl(labelled(labels=labels)))
    expect_refusal(DATA, export(tmp_path / "m.jsonl", tmp_path / "out"), str(tmp_path),
                   names=["m.jsonl", "record 3", "missing value"])


def test_labels_that_merely_contain_a_marker_are_classes(tmp_path):
    """Positive control: ``NAB``, ``none of these``, ``nana``, ``1e400`` are classes."""
    for labels in (("NAB", "none of these"), ("nana", "n"), ("1e400", "2")):
        (tmp_path / "ok.csv").write_text(csv_text(labels=labels))
        assert sorted(load_dataset(str(tmp_path / "ok.csv")).label_names) == sorted(labels)


def test_the_missing_label_rule_is_one_function():
    core = pytest.importorskip("experiments.data.core")
    missing = getattr(core, "missing_label")
    assert all(missing(m) for m in core.MISSING_LABELS) and missing(None) and missing(float("nan"))
    assert not any(missing(v) for v in ("NAB", "n", 0, 1, "0", "none of these", "1e400"))


# --------------------------------------------------------------------------------------------
# inspect: dropped rows, held-out texts seen in training
# --------------------------------------------------------------------------------------------

def _inspect(path, tmp_path, *more):
    code, out, err = run_cli(DATA, ["inspect", str(path), "--json", *more], str(tmp_path))
    assert code == 0, err
    return json.loads(out), err


def test_inspect_reports_the_rows_cleaning_dropped(tmp_path):
    rows = [(t, i % 2) for i, t in enumerate(TEXTS)]
    rows += [("   ", 0), ("", 1)]                                       # 2 empty texts
    rows += [(TEXTS[0], 0), (TEXTS[1].upper(), 1), ("  " + TEXTS[2], 0)]   # 3 repeats, same label
    rows += [(TEXTS[3], 0), (TEXTS[3], 1)]              # TEXTS[3] (label 1) now disagrees: its 3 rows dropped
    path = tmp_path / "dirty.csv"
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    report, _ = _inspect(path, tmp_path)
    core = pytest.importorskip("experiments.data.core")
    assert report["dropped"] == {"rows": 8, "reasons": {core.DROP_EMPTY: 2, core.DROP_REPEATED: 3,
                                                        core.DROP_CONFLICT: 3}}
    assert sum(s["size"] for s in report["splits"].values()) == len(rows) - 8
    assert any("8 row(s) read were left out" in n for n in report["notes"])
    code, text, err = run_cli(DATA, ["inspect", str(path)], str(tmp_path))
    assert code == 0 and "dropped 8 row(s)" in text and "2 empty text" in text, err
    (tmp_path / "clean.csv").write_text(csv_text())
    clean, _ = _inspect(tmp_path / "clean.csv", tmp_path)
    assert clean["dropped"] == {"rows": 0, "reasons": {}}                # negative control


def test_held_out_texts_seen_in_training_are_counted_and_logged(tmp_path, caplog):
    folder = tmp_path / "leaky"
    folder.mkdir()
    (folder / "train.jsonl").write_text(jsonl(labelled(TEXTS[:16])))
    (folder / "val.jsonl").write_text(jsonl(labelled(TEXTS[16:18] + TEXTS[:2])))      # 2 repeat train
    (folder / "test.jsonl").write_text(jsonl(labelled(TEXTS[18:22] + [TEXTS[5], TEXTS[16]])))  # 1 train, 1 val
    with caplog.at_level(logging.WARNING, logger="experiments.data"):
        load_dataset(str(folder))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "2 of the 4 val examples repeat a train text" in warned[0], warned
    assert "1 of the 6 test examples repeat a train text" in warned[0]
    assert "1 of the 6 test examples repeat a val text" in warned[0]
    report, _ = _inspect(folder, tmp_path)
    assert report["overlap"] == {"val_in_train": 2, "test_in_train": 1, "test_in_val": 1}
    assert any("exact duplicates" in n for n in report["notes"])
    caplog.clear()
    (folder / "val.jsonl").write_text(jsonl(labelled(TEXTS[16:18])))                  # negative control
    (folder / "test.jsonl").write_text(jsonl(labelled(TEXTS[18:22])))
    with caplog.at_level(logging.WARNING, logger="experiments.data"):
        load_dataset(str(folder))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert _inspect(folder, tmp_path)[0]["overlap"] == {"val_in_train": 0, "test_in_train": 0, "test_in_val": 0}


def test_inspect_reports_unlabelled_hf_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    labels = [i % 2 for i in range(16)]
    labels[3] = labels[7] = -1                                            # the hub's "no label"
    pq.write_table(pa.table({"text": TEXTS[:16], "label": labels}), hub / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": TEXTS[16:], "label": [i % 2 for i in range(8)]}),
                   hub / "data" / "test-00000-of-00001.parquet")
    (hub / "README.md").write_text("\n".join([
        "---", "dataset_info:", "  features:", "  - name: text", "    dtype: string", "  - name: label",
        "    dtype:", "      class_label:", "        names:", "          '0': neg", "          '1': pos", "---", ""]))
    report, _ = _inspect(f"hf:{hub}", tmp_path)
    assert report["dropped"]["rows"] == 2 and list(report["dropped"]["reasons"].values()) == [2]
    assert "-1" in next(iter(report["dropped"]["reasons"]))
