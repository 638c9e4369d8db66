"""Hostile data, fifth round: what the loaders and ``unfold-data`` did silently, now refused or reported.

* ``unfold-data export --out``: an existing folder that holds anything is refused (before: its ``train.jsonl``
  was replaced); ``--overwrite`` replaces an earlier export and nothing else; the folder the dataset is read
  from (or that holds its file) is refused whatever the path that names it (before: a folder of ``.csv`` splits
  exported onto itself got ``.jsonl`` files beside them and could no longer be read); the new folder is staged,
  read back, then swapped in.
* A byte that is not UTF-8 is refused naming the file, the line, the byte offset and the byte, in every text
  file the loader reads (CSV, JSON lines, JSON, ``labels.json``; before: a CSV was re-read as latin-1 whole,
  ``café`` turning into ``cafÃ©``).
* A column named twice in a CSV header or a parquet schema, a key given twice in a JSON object, a CSV row with
  more or fewer fields than the header: refused naming the file, the line and the column (before: the last copy
  won, extra fields were dropped).
* Missing labels: ``NA``, ``N/A``, ``null``, ``None``, ... are refused as ``nan`` was (before: ``NA`` became a
  class); ``unfold-data inspect`` reports the rows cleaning dropped, by reason, and the held-out texts that repeat
  a training text, which :func:`experiments.data.load.load_dataset` also logs as a warning.

Every test fails on the code before these changes (names that the changes add are looked up inside the tests).
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
