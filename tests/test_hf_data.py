"""Tests of ``hf:NAME[:CONFIG]`` datasets (experiments.data.hf): Hugging Face-format folders read offline with
pyarrow, without the ``datasets`` package.

The fixtures under ``tests/data/hf/`` were written by the real ``datasets`` library (5.2.0; see
``tests/data/hf/make_fixtures.py``, which says what each holds) and read back by it (``load_from_disk``,
``load_dataset(folder, config)``, ``load_dataset("parquet", data_files=...)``) with the same rows:

* ``reviews_disk``: ``DatasetDict.save_to_disk``; 3 classes; train 25 rows of which one is labelled -1,
  validation 6, test 6. Row ``i`` reads "... review number i." and has label ``i % 3``.
* ``reviews_hub``: the same rows as a hub snapshot (README.md configs + parquet per split) in config
  ``sentiment`` (the default), and config ``topic`` (film/music; train 20, test 4, no validation).
* ``plain_hub``: one default config in ``data/`` (no/yes; train 12, validation 3, test 3).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clifuzz import expect_refusal, run_cli
from experiments import data as D
from experiments.data import DataError, load_dataset
from experiments.data import hf as H

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "data" / "hf"
DISK, HUB, PLAIN = FIX / "reviews_disk", FIX / "reviews_hub", FIX / "plain_hub"
SENTIMENT = ["negative", "neutral", "positive"]


@pytest.fixture(autouse=True)
def no_datasets_package(monkeypatch):
    """Every test runs as if ``datasets`` were not installed: the folders must be read without it."""
    monkeypatch.setitem(sys.modules, "datasets", None)


def number(text: str) -> int:
    """The row number ``i`` in a sentiment fixture text ("... review number i.")."""
    return int(text.rstrip(".").split()[-1])


def every(s):
    return s.train + s.val + s.test


# --------------------------------------------------------------------------------------------
# The two layouts
# --------------------------------------------------------------------------------------------

def test_save_to_disk_folder_labels_splits_and_no_label_rows():
    s = load_dataset(f"hf:{DISK}")
    assert s.name == f"hf:{DISK}" and s.label_names == SENTIMENT and s.num_classes == 3
    assert s.sizes() == {"train": 24, "val": 6, "test": 6}          # the row labelled -1 is dropped
    assert not any("unrated" in t for t, _ in every(s))
    assert all(lab == number(t) % 3 for t, lab in every(s))
    assert sorted(number(t) for t, _ in s.train) == list(range(24))
    assert sorted(number(t) for t, _ in s.val) == list(range(100, 106))
    assert sorted(number(t) for t, _ in s.test) == list(range(200, 206))
    assert s.train[0] == ("A dull film, review number 0.", 0)        # file order kept


def test_hub_snapshot_default_config_equals_the_saved_folder():
    hub, disk = load_dataset(f"hf:{HUB}"), load_dataset(f"hf:{DISK}")   # sentiment is marked default: true
    assert hub.label_names == SENTIMENT
    assert (hub.train, hub.val, hub.test) == (disk.train, disk.val, disk.test)
    same = load_dataset(f"hf:{HUB}:sentiment")
    assert (same.train, same.val, same.test) == (hub.train, hub.val, hub.test)
    assert same.name == f"hf:{HUB}:sentiment"


def test_hub_snapshot_config_selection_and_carved_validation():
    s = load_dataset(f"hf:{HUB}:topic", seed=0)
    assert s.label_names == ["film", "music"] and s.num_classes == 2
    assert s.sizes() == {"train": 18, "val": 2, "test": 4}            # val carved from the 20 training rows
    train_rows = {t for t, _ in s.train + s.val}
    assert len(train_rows) == 20 and not train_rows & {t for t, _ in s.test}
    assert all(lab == int(t.split()[4]) % 2 for t, lab in every(s))   # "The band made item 7 on stage."
    other = load_dataset(f"hf:{HUB}:topic", seed=1)
    assert other.test == s.test and other.val != s.val                 # only the carved split depends on the seed
    with pytest.raises(DataError, match=r"no config 'nope' in .*README\.md; configs found: \['sentiment', 'topic'\]"):
        load_dataset(f"hf:{HUB}:nope")


def test_plain_hub_layout_in_data_folder():
    s = load_dataset(f"hf:{PLAIN}")
    assert s.label_names == ["no", "yes"] and s.sizes() == {"train": 12, "val": 3, "test": 3}
    assert all(lab == ("warm" in t) for t, lab in every(s))


def test_paths_give_configs_and_splits_without_a_readme(tmp_path):
    """Without README.md: splits from the file names, label names from the files' huggingface metadata."""
    plain = shutil.copytree(PLAIN, tmp_path / "plain")
    (plain / "README.md").unlink()
    s = load_dataset(f"hf:{plain}")
    assert s.label_names == ["no", "yes"] and s.sizes() == {"train": 12, "val": 3, "test": 3}
    hub = shutil.copytree(HUB, tmp_path / "hub")
    (hub / "README.md").unlink()
    with pytest.raises(DataError, match=r"holds configs \['sentiment', 'topic'\]; choose one: hf:.*hub:sentiment"):
        load_dataset(f"hf:{hub}")
    topic = load_dataset(f"hf:{hub}:topic")
    assert topic.label_names == ["film", "music"] and topic.sizes()["test"] == 4
    shutil.rmtree(hub / "topic")                                       # one config left: it is the dataset
    assert load_dataset(f"hf:{hub}").label_names == SENTIMENT


def test_split_folders_and_plain_string_labels(tmp_path):
    """``train/0000.parquet`` layout, other column names, a label column that is no ClassLabel."""
    folder = tmp_path / "ds"
    rows = {"train": 20, "validation": 4, "test": 4}
    for split, n in rows.items():
        (folder / split).mkdir(parents=True)
        pq.write_table(pa.table({"sentence": [f"{split} text {i}" for i in range(n)],
                                 "y": [["pos", "neg"][i % 2] for i in range(n)]}), folder / split / "0000.parquet")
    s = load_dataset(f"hf:{folder}", text_field="sentence", label_field="y")
    assert s.label_names == ["neg", "pos"] and s.sizes() == {"train": 20, "val": 4, "test": 4}
    assert s.train[:2] == [("train text 0", 1), ("train text 1", 0)]
    with pytest.raises(DataError, match=r"no column\(s\) \['text', 'label'\]; columns found: \['sentence', 'y'\]"):
        load_dataset(f"hf:{folder}")


# --------------------------------------------------------------------------------------------
# The split mapping
# --------------------------------------------------------------------------------------------

def test_split_mapping():
    auto = load_dataset(f"hf:{DISK}")
    swapped = load_dataset(f"hf:{DISK}", splits={"train": "train", "val": "test", "test": "validation"})
    assert (swapped.train, swapped.val, swapped.test) == (auto.train, auto.test, auto.val)
    partial = load_dataset(f"hf:{DISK}", splits={"val": "test"})      # test, already used, is carved from train
    assert partial.val == auto.test and partial.sizes() == {"train": 22, "val": 6, "test": 2}
    assert {t for t, _ in partial.train + partial.test} == {t for t, _ in auto.train}


@pytest.mark.parametrize("splits, words", [
    ({"val": "valid"}, ["no split 'valid'", "val", "splits found: ['test', 'train', 'validation']"]),
    ({"train": "Train"}, ["no split 'Train'", "splits found"]),
    ({"val": "test", "test": "test"}, ["split 'test' is mapped to both val and test"]),
    ({"dev": "validation"}, ["unknown key(s) ['dev']", "train, val, test"]),
    ({"val": ""}, ["val must name a split", "''"]),
    ({}, ["non-empty mapping"]),
    (["train"], ["non-empty mapping", "['train']"]),
])
def test_bad_split_mapping_is_refused(splits, words):
    with pytest.raises(DataError) as exc:
        load_dataset(f"hf:{DISK}", splits=splits)
    for w in words:
        assert w in str(exc.value)


def test_split_mapping_only_for_hf_datasets(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(10)))
    assert load_dataset(path).num_classes == 2                         # positive control
    with pytest.raises(DataError, match="maps the splits of an hf: dataset; '.*d.csv' is not one"):
        load_dataset(path, splits={"val": "validation"})


def test_no_train_split(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    for split, n in (("validation", 10), ("test", 3)):
        pq.write_table(pa.table({"text": [f"{split} {i}" for i in range(n)], "label": [i % 2 for i in range(n)]}),
                       folder / f"{split}-0.parquet")
    with pytest.raises(DataError, match=r"no train split; splits found: \['test', 'validation'\]"):
        load_dataset(f"hf:{folder}")
    s = load_dataset(f"hf:{folder}", splits={"train": "validation"})  # named by the mapping; val carved from it
    assert s.sizes() == {"train": 9, "val": 1, "test": 3} and s.label_names == ["0", "1"]
    assert all(t.startswith("validation") for t, _ in s.train + s.val)


# --------------------------------------------------------------------------------------------
# Where NAME is looked for
# --------------------------------------------------------------------------------------------

def test_found_under_data_dir_hf_name(tmp_path, monkeypatch):
    shutil.copytree(DISK, tmp_path / "hf" / "someorg" / "reviews")
    shutil.copytree(HUB, tmp_path / "hf" / "reviews_hub")
    s = load_dataset("hf:someorg/reviews", data_dir=tmp_path)
    assert s.name == "hf:someorg/reviews" and s.label_names == SENTIMENT and s.sizes()["train"] == 24
    assert load_dataset("hf:reviews_hub:topic", data_dir=tmp_path).label_names == ["film", "music"]
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))                 # the default data directory
    monkeypatch.chdir(tmp_path)
    assert load_dataset("hf:someorg/reviews").sizes() == s.sizes()


def test_missing_folder_without_datasets_names_the_places_looked(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    line = expect_refusal("experiments.app.data_cli", ["export", "--dataset", "hf:nosuch/thing", "--out", str(cwd / "out"),
                                               "--data-dir", str(data)], str(cwd),
                          names=["hf:nosuch/thing", str(cwd / "nosuch" / "thing"),
                                 str(data / "hf" / "nosuch" / "thing"), "`datasets` package", "not installed",
                                 "pip install datasets"], watch=[str(data)])
    assert not (cwd / "out").exists() and line


@pytest.mark.parametrize("spec, words", [
    ("hf:", ["hf:", "needs a dataset name"]),
    ("hf:imdb:", ["config after ':' is empty"]),
    ("hf::plain_text", ["needs a dataset name before the config"]),
])
def test_bad_specs(spec, words):
    with pytest.raises(DataError) as exc:
        load_dataset(spec)
    for w in words:
        assert w in str(exc.value)


# --------------------------------------------------------------------------------------------
# Bad folders and files
# --------------------------------------------------------------------------------------------

def test_a_folder_that_is_no_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="is no Hugging Face dataset folder"):
        load_dataset(f"hf:{tmp_path / 'empty'}")
    (tmp_path / "file.parquet").write_bytes(b"x")
    with pytest.raises(DataError, match="is not a folder"):
        load_dataset(f"hf:{tmp_path / 'file.parquet'}")


def test_corrupt_arrow_file(tmp_path):
    disk = shutil.copytree(DISK, tmp_path / "disk")
    bad = disk / "validation" / "data-00000-of-00001.arrow"
    bad.write_bytes(b"not an arrow stream at all")
    with pytest.raises(DataError, match=f"{bad}: cannot read"):
        load_dataset(f"hf:{disk}")
    (disk / "validation" / "state.json").write_text('{"_data_files": [{"filename": "../x.arrow"}]}')
    with pytest.raises(DataError, match="'_data_files' must list"):
        load_dataset(f"hf:{disk}")


def test_label_outside_the_class_label(tmp_path):
    disk = shutil.copytree(DISK, tmp_path / "disk")
    info = json.loads((disk / "train" / "dataset_info.json").read_text())
    info["features"]["label"]["names"] = ["negative", "positive"]      # two names, but labels 0, 1, 2 occur
    (disk / "train" / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"record 2 has label 2 \('label'\), expected an integer in \[0, 2\)"):
        load_dataset(f"hf:{disk}")


def test_readme_problems(tmp_path):
    hub = shutil.copytree(HUB, tmp_path / "hub")
    readme = hub / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text.replace("path: topic/train-*", "path: topic/training-*"), encoding="utf-8")
    with pytest.raises(DataError, match=r"split 'train': no file under .* matches \['topic/training-\*'\]"):
        load_dataset(f"hf:{hub}:topic")
    readme.write_text(text.replace("path: topic/train-*", "path: ../../etc/*"), encoding="utf-8")
    with pytest.raises(DataError, match="must be a relative path inside the folder"):
        load_dataset(f"hf:{hub}:topic")
    readme.write_text(text.replace("'1': music", "'2': music"), encoding="utf-8")
    with pytest.raises(DataError, match="not numbered 0 .. K-1"):
        load_dataset(f"hf:{hub}:topic")
    readme.write_text(text.replace("  default: true\n", ""), encoding="utf-8")
    with pytest.raises(DataError, match=r"lists configs \['sentiment', 'topic'\] and marks none as the default"):
        load_dataset(f"hf:{hub}")
    readme.write_text(text[:text.rindex("---")], encoding="utf-8")
    with pytest.raises(DataError, match="no closing '---' line"):
        load_dataset(f"hf:{hub}")


# --------------------------------------------------------------------------------------------
# The command line, end to end
# --------------------------------------------------------------------------------------------

def test_cli_export_hf_folder_writes_class_label_names(tmp_path):
    out = tmp_path / "exported"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "experiments.app.data_cli", "export", "--dataset", f"hf:{HUB}:topic",
                           "--out", str(out)], check=False, capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["label_names"] == ["film", "music"] and summary["dataset"] == f"hf:{HUB}:topic"
    assert (summary["train"], summary["val"], summary["test"]) == (18, 2, 4)
    assert json.loads((out / "labels.json").read_text()) == ["film", "music"]
    back, orig = load_dataset(out), load_dataset(f"hf:{HUB}:topic")
    assert (back.train, back.val, back.test) == (orig.train, orig.val, orig.test)


def test_cli_export_split_option(tmp_path):
    out = tmp_path / "o"
    code, stdout, err = run_cli("experiments.app.data_cli", ["export", "--dataset", f"hf:{DISK}", "--out", str(out),
                                                     "--split", "val=test", "--split", "test=validation"],
                                str(tmp_path))
    assert code == 0, err
    auto = load_dataset(f"hf:{DISK}")
    back = load_dataset(out)
    assert (back.val, back.test) == (auto.test, auto.val)
    expect_refusal("experiments.app.data_cli", ["export", "--dataset", f"hf:{DISK}", "--out", str(tmp_path / "x"),
                                        "--split", "dev=validation"], str(tmp_path),
                   names=["--split", "'dev=validation'"])
    expect_refusal("experiments.app.data_cli", ["export", "--dataset", f"hf:{DISK}", "--out", str(tmp_path / "x"),
                                        "--split", "val=test", "--split", "val=validation"], str(tmp_path),
                   names=["--split val", "given twice"])


def test_check_split_map_is_exported():
    assert D.check_split_map(None) is None and D.check_split_map({"val": "dev"}) == {"val": "dev"}
    assert H.choose_splits("x", ["TRAIN", "Dev", "test"], None) == {"train": "TRAIN", "val": "Dev", "test": "test"}


# --------------------------------------------------------------------------------------------
# The hub path (step 3), where the `datasets` package is installed
# --------------------------------------------------------------------------------------------

def test_hub_path_through_datasets_matches_the_folder_reader(monkeypatch, tmp_path):
    """``datasets.load_dataset(NAME, CONFIG)`` stands in for the hub with the saved fixture: the result is the
    one the pyarrow reader gives for the same folder (labels, dropped -1 row, splits, mapping)."""
    monkeypatch.delitem(sys.modules, "datasets")
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")                          # no 3 s probe of the hub
    calls = []

    def fake_load_dataset(name, config=None):
        calls.append((name, config))
        return datasets.load_from_disk(str(DISK))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = load_dataset("hf:someorg/reviews:cfg", data_dir=tmp_path, splits={"val": "test", "test": "validation"})
    want = load_dataset(f"hf:{DISK}", splits={"val": "test", "test": "validation"})
    assert calls == [("someorg/reviews", "cfg")]
    assert got.name == "hf:someorg/reviews:cfg" and got.label_names == SENTIMENT
    assert (got.train, got.val, got.test) == (want.train, want.val, want.test)
    with pytest.raises(DataError, match=r"no split 'dev'.*splits found: \['test', 'train', 'validation'\]"):
        load_dataset("hf:someorg/reviews", data_dir=tmp_path, splits={"val": "dev"})
