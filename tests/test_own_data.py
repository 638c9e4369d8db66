"""Own data, first class.

* Every refusal of a user's own data (missing columns in each format, a label column that is not one, one class,
  an empty split, a file of another kind, a path that is not there, a folder without split files, hf: splits and
  configs, ...) ends with ``fix: set data.KEY=VALUE ...``, the config keys that fix it, and the fix it names,
  pasted as overrides (placeholders such as ``COLUMN`` filled in), loads the data through the trainer's config and
  reader (:func:`experiments.app.config.load_config` + :func:`experiments.data.load.load_configured`).
* ``unfold-data inspect PATH`` shows what training reads: the same splits, classes and sizes as the trainer's
  :func:`experiments.app.build.build_data`, lengths and truncation, GloVe coverage or "GloVe not available", the
  command that trains on it; a refusal exits 2 with the fix and writes nothing.
"""
import json
import os
import re
import shlex

import numpy as np
import pytest

from experiments.app.config import load_config
from experiments.data import DataError
from experiments.app.data_cli import main as data_main
from experiments.data.core import split_examples
from experiments.data.load import load_configured

POS, NEG = "good fine great nice lovely superb".split(), "bad poor awful dull weak boring".split()


def rows(n=30):
    """``n`` distinct (text, label) pairs, two classes alternating."""
    return [(" ".join((POS if i % 2 else NEG)[(i + k) % 6] for k in range(4)) + f" number {i}",
             "pos" if i % 2 else "neg") for i in range(n)]


def write_csv(path, header, records):
    path.write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in records))
    return path


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path, columns: dict):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table(columns), path)
    return path


def hf_folder(root, splits=("train", "test"), text="text", label="label", n=30):
    """A hub-snapshot folder: ``data/SPLIT-00000-of-00001.parquet`` per split."""
    (root / "data").mkdir(parents=True)
    data = rows(n)
    k = len(splits)
    for i, s in enumerate(splits):
        part = data[i * n // k:(i + 1) * n // k]
        write_parquet(root / "data" / f"{s}-00000-of-00001.parquet",
                      {text: [t for t, _ in part], label: [lab for _, lab in part]})
    return root


def fixes(message: str) -> list[str]:
    """The settings a refusal names after ``set`` (the overrides to paste), shell-split."""
    m = re.search(r"\bset ((?:'?data\.[\w.]+=[^;()]*?'? ?)+)(?:\(|;|,|$)", message)
    assert m, f"no 'set data.KEY=VALUE' in: {message}"
    return shlex.split(m.group(1))


def load(dataset, overrides=()):
    """The data ``unfold-train data.dataset=DATASET OVERRIDES`` reads (its config, its reader)."""
    return load_configured(load_config(None, [f"data.dataset={dataset}", *overrides])["data"])


# -------------------------------------------------------------------------------------------------------------
# Each case: (name, setup(tmp) -> (dataset, overrides), keys the fix must name, placeholder fill or None when the
# fix is not applied mechanically). The fix named is pasted (placeholders filled) and must load.
# -------------------------------------------------------------------------------------------------------------

def csv_other_columns(tmp):
    write_csv(tmp / "own.csv", ["body", "topic"], rows())
    return str(tmp / "own.csv"), []


def jsonl_other_columns(tmp):
    write_jsonl(tmp / "own.jsonl", [{"review": t, "stars": lab} for t, lab in rows()])
    return str(tmp / "own.jsonl"), []


def parquet_other_columns(tmp):
    data = rows()
    write_parquet(tmp / "own.parquet", {"body": [t for t, _ in data], "topic": [y for _, y in data],
                                        "id": list(range(len(data)))})
    return str(tmp / "own.parquet"), ["data.text_field=body"]


def hf_other_columns(tmp):
    hf_folder(tmp / "hf", text="sentence", label="y")
    return f"hf:{tmp / 'hf'}", []


def one_class_column(tmp):                  # 'label' holds one value; the classes are in 'topic'
    write_csv(tmp / "own.csv", ["text", "label", "topic"], [(t, "x", y) for t, y in rows()])
    return str(tmp / "own.csv"), []


def empty_labels(tmp):                       # 'label' is a mostly empty note column
    write_csv(tmp / "own.csv", ["text", "label", "topic"], [(t, "" if i else "n", y) for i, (t, y) in enumerate(rows())])
    return str(tmp / "own.csv"), []


def mixed_label_types(tmp):                  # 1 and "1": one class written two ways
    write_jsonl(tmp / "own.jsonl", [{"text": t, "label": (1 if i % 3 else "1") if y == "pos" else 0, "y": y}
                                    for i, (t, y) in enumerate(rows())])
    return str(tmp / "own.jsonl"), []


def fractional_labels(tmp):                  # a score column read as the label
    write_jsonl(tmp / "own.jsonl", [{"text": t, "label": 0.5 + i, "y": y} for i, (t, y) in enumerate(rows())])
    return str(tmp / "own.jsonl"), []


def texts_mostly_empty(tmp):                 # 'text' is an empty title column; the texts are in 'body'
    write_csv(tmp / "own.csv", ["text", "body", "label"], [("", t, y) for t, y in rows()])
    return str(tmp / "own.csv"), []


def unknown_extension(tmp):
    (tmp / "own.xlsx").write_bytes(b"PK\x03\x04 not read")
    write_csv(tmp / "own.csv", ["text", "label"], rows())          # what "save it as CSV" gives
    return str(tmp / "own.xlsx"), []


def missing_file(tmp):
    write_csv(tmp / "own.csv", ["text", "label"], rows())
    return str(tmp / "nowhere" / "own.csv"), []


def folder_with_one_file(tmp):
    (tmp / "d").mkdir()
    write_csv(tmp / "d" / "reviews.csv", ["text", "label"], rows())
    return str(tmp / "d"), []


def folder_is_hf(tmp):
    hf_folder(tmp / "d")
    return str(tmp / "d"), []


def folder_empty_val(tmp):
    (tmp / "d").mkdir()
    write_jsonl(tmp / "d" / "train.jsonl", [{"text": t, "label": y} for t, y in rows()])
    (tmp / "d" / "val.jsonl").write_text("\n")
    write_jsonl(tmp / "d" / "test.jsonl", [{"text": t, "label": y} for t, y in rows(4)])
    return str(tmp / "d"), []


def folder_train_one_class(tmp):             # 'label' of the train file is one class; 'y' holds the classes
    (tmp / "d").mkdir()
    for s, n in (("train", 20), ("val", 4), ("test", 4)):
        write_jsonl(tmp / "d" / f"{s}.csv", [])
        write_csv(tmp / "d" / f"{s}.csv", ["text", "label", "y"],
                  [(f"{s} {t}", "a" if s == "train" else y, y) for t, y in rows(n)])
    return str(tmp / "d"), []


def seed_draws_one_class(tmp):               # nine of one class, one of another: seed 0 holds it out of train
    n = 10
    train1 = {int(j) for j in np.random.RandomState(1).permutation(n)[:8]}          # seed 1's training examples
    held = next(int(j) for j in np.random.RandomState(0).permutation(n)[8:] if int(j) in train1)   # held out by 0
    write_csv(tmp / "own.csv", ["text", "label"], [(t, "b" if i == held else "a") for i, (t, _) in enumerate(rows(n))])
    return str(tmp / "own.csv"), []


def hf_no_train_split(tmp):
    hf_folder(tmp / "hf", splits=("training", "validation", "test"))
    return f"hf:{tmp / 'hf'}", []


def hf_split_not_found(tmp):
    hf_folder(tmp / "hf", splits=("train", "validation", "test"))
    return f"hf:{tmp / 'hf'}", ["data.splits.val=dev"]


def hf_two_configs(tmp):
    for cfg in ("sentiment", "topic"):
        hf_folder(tmp / "hf" / cfg)
    return f"hf:{tmp / 'hf'}", []


def hf_missing(tmp):
    hf_folder(tmp / "real")
    return f"hf:{tmp / 'nowhere'}", []


def splits_for_a_file(tmp):
    write_csv(tmp / "own.csv", ["text", "label"], rows())
    return str(tmp / "own.csv"), ["data.splits.val=validation"]


def jsonl_that_is_csv(tmp):
    write_csv(tmp / "own.jsonl", ["text", "label"], rows())
    write_csv(tmp / "own.csv", ["text", "label"], rows())       # what renaming it gives
    return str(tmp / "own.jsonl"), []


def hf_folder_of_csv(tmp):                   # hf: on a folder of CSV split files: read without hf:
    (tmp / "d").mkdir()
    data = rows()
    write_csv(tmp / "d" / "train.csv", ["text", "label"], data[:24])
    write_csv(tmp / "d" / "test.csv", ["text", "label"], data[24:])
    return f"hf:{tmp / 'd'}", []


def unreadable_parquet(tmp):
    (tmp / "own.parquet").write_bytes(b"PAR1 this is not parquet")
    write_csv(tmp / "own.csv", ["text", "label"], rows())
    return str(tmp / "own.parquet"), []


def unknown_name(tmp):
    write_csv(tmp / "own.csv", ["text", "label"], rows())
    return "my_reviews", []


CASES = [
    # name, setup, keys named, placeholder -> value (None: the fix is checked by its keys only)
    ("csv_other_columns", csv_other_columns, ["data.text_field", "data.label_field"], {}),
    ("jsonl_other_columns", jsonl_other_columns, ["data.text_field", "data.label_field"], {}),
    ("parquet_other_columns", parquet_other_columns, ["data.label_field"], {}),
    ("hf_other_columns", hf_other_columns, ["data.text_field", "data.label_field"], {}),
    ("one_class_column", one_class_column, ["data.label_field"], {"COLUMN": "topic"}),
    ("empty_labels", empty_labels, ["data.label_field"], {"COLUMN": "topic"}),
    ("mixed_label_types", mixed_label_types, ["data.label_field"], {"COLUMN": "y"}),
    ("fractional_labels", fractional_labels, ["data.label_field"], {"COLUMN": "y"}),
    ("texts_mostly_empty", texts_mostly_empty, ["data.text_field"], {"COLUMN": "body"}),
    ("unknown_extension", unknown_extension, ["data.dataset"], {}),
    ("missing_file", missing_file, ["data.dataset"], {"PATH": "{tmp}/own.csv"}),
    ("folder_with_one_file", folder_with_one_file, ["data.dataset"], {}),
    ("folder_is_hf", folder_is_hf, ["data.dataset"], {}),
    ("folder_empty_val", folder_empty_val, ["data.dataset"], {}),
    ("folder_train_one_class", folder_train_one_class, ["data.label_field"], {"COLUMN": "y"}),
    ("seed_draws_one_class", seed_draws_one_class, ["data.seed"], {}),
    ("hf_no_train_split", hf_no_train_split, ["data.splits.train"], {}),
    ("hf_split_not_found", hf_split_not_found, ["data.splits.val"], {}),
    ("hf_two_configs", hf_two_configs, ["data.dataset"], {}),
    ("hf_missing", hf_missing, ["data.dataset"], {"PATH": "{tmp}/real"}),
    ("splits_for_a_file", splits_for_a_file, ["data.splits"], {}),
    ("jsonl_that_is_csv", jsonl_that_is_csv, ["data.dataset"], {}),
    ("hf_folder_of_csv", hf_folder_of_csv, ["data.dataset"], {}),
    ("unreadable_parquet", unreadable_parquet, ["data.dataset"], {"PATH": "{tmp}/own.csv"}),
    ("unknown_name", unknown_name, ["data.dataset"], {"PATH": "{tmp}/own.csv"}),
]


@pytest.mark.parametrize("name,setup,keys,fill", CASES, ids=[c[0] for c in CASES])
def test_refusal_names_the_keys_and_the_fix_loads(tmp_path, name, setup, keys, fill):
    dataset, overrides = setup(tmp_path)
    with pytest.raises(DataError) as e:
        load(dataset, overrides)
    msg = str(e.value)
    settings = fixes(msg)
    assert [s.split("=", 1)[0] for s in settings] == keys, msg
    pasted = []
    for s in settings:
        for placeholder, value in fill.items():
            s = s.replace(placeholder, value.format(tmp=tmp_path))
        pasted.append(s)
    assert not any(w in s for s in pasted for w in ("COLUMN", "=PATH", "=NAME", "=FILE")), (pasted, msg)
    dataset_fix = [s for s in pasted if s.startswith("data.dataset=")]
    ds = dataset_fix[0].split("=", 1)[1] if dataset_fix else dataset
    keep = [o for o in overrides if o.split("=", 1)[0] not in {s.split("=", 1)[0].split(".")[0] + "." +
                                                                 s.split("=", 1)[0].split(".")[1] for s in pasted}]
    splits = load(ds, [*keep, *[s for s in pasted if not s.startswith("data.dataset=")]])  # the fix loads
    assert splits.num_classes >= 2 and all(splits.sizes().values())


def test_a_misspelt_split_file_is_named_not_carved(tmp_path):
    """The one folder refusal that no config key fixes: it names the file to rename."""
    (tmp_path / "d").mkdir()
    for s in ("train", "val", "tset"):
        write_jsonl(tmp_path / "d" / f"{s}.jsonl", [{"text": f"{s} {t}", "label": y} for t, y in rows(10)])
    with pytest.raises(DataError, match=r"no test \(test\) file, and \['tset.jsonl'\] is no split file: rename "
                                        r"tset.jsonl test.jsonl"):
        load(str(tmp_path / "d"))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_a_folder_of_splits_in_each_format_and_a_derived_split(tmp_path, suffix):
    """train/validation/test files of one kind are read as given; without a test file it is drawn from train by
    data.seed and said so."""
    data = rows(40)
    for s, part in (("train", data[:30]), ("validation", data[30:35]), ("test", data[35:])):
        path = tmp_path / f"{s}{suffix}"
        if suffix == ".csv":
            write_csv(path, ["text", "label"], part)
        elif suffix == ".jsonl":
            write_jsonl(path, [{"text": t, "label": y} for t, y in part])
        else:
            write_parquet(path, {"text": [t for t, _ in part], "label": [y for _, y in part]})
    s = load(str(tmp_path))
    assert s.sizes() == {"train": 30, "val": 5, "test": 5} and s.derived == ()
    assert s.origin == {"train": f"train{suffix}", "val": f"validation{suffix}", "test": f"test{suffix}"}
    os.remove(tmp_path / f"test{suffix}")
    s = load(str(tmp_path), ["data.seed=3"])
    assert s.derived == ("train", "test") and s.sizes() == {"train": 27, "val": 5, "test": 3}
    assert s.origin["test"] == f"drawn from train{suffix} (80/10/10, data.seed=3)"
    tr, va, te = split_examples([(t, int(y == "pos")) for t, y in data[:30]], 3)
    assert s.test == te and s.train == tr + va


# -------------------------------------------------------------------------------------------------------------
# unfold-data inspect
# -------------------------------------------------------------------------------------------------------------

def run_data(argv, capsys):
    rc = data_main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def own_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = rows(40) + [("long " * 50 + "text", "pos"), ("longer " * 60 + "text", "neg")]
    write_csv(tmp_path / "reviews.csv", ["body", "topic"], data)
    return tmp_path


def test_inspect_refusal_exits_2_with_the_fix_and_writes_nothing(own_csv, capsys):
    before = sorted(os.listdir(own_csv))
    rc, out, err = run_data(["inspect", "reviews.csv"], capsys)
    assert rc == 2 and out == ""
    assert "set data.text_field=body data.label_field=topic" in err
    assert sorted(os.listdir(own_csv)) == before
    rc, out, err = run_data(["inspect", "reviews.csv", "model.nope=1"], capsys)     # a bad override: typed, 2
    assert rc == 2 and out == "" and "nope" in err


def test_inspect_reports_what_the_trainer_reads(own_csv, capsys):
    """Splits, classes and vocabulary are those of the trainer's build_data for the same config and overrides."""
    from experiments.app.build import build_data
    over = ["data.text_field=body", "data.label_field=topic", "data.max_len=20", "data.glove=none"]
    rc, out, err = run_data(["inspect", "reviews.csv", "--json", "--config", "tiny", *over], capsys)
    assert rc == 0, err
    r = json.loads(out)
    splits, vocab, tensors, _ = build_data(load_config("tiny", ["data.dataset=reviews.csv", *over]))
    assert {s: r["splits"][s]["size"] for s in ("train", "val", "test")} == splits.sizes()
    assert sum(r["splits"][s]["size"] for s in ("train", "val", "test")) == 42
    assert r["classes"]["names"] == splits.label_names == ["neg", "pos"]
    for s in ("train", "val", "test"):
        ys = [y for _, y in getattr(splits, s)]
        assert r["classes"]["counts"][s] == {"neg": ys.count(0), "pos": ys.count(1)}
    assert r["vocabulary"]["size"] == len(vocab)
    assert r["columns"] == {"found": ["body", "topic"], "text": "body", "label": "topic",
                            "text_set_by": "data.text_field (override)", "label_set_by": "data.label_field (override)"}
    assert r["format"] == "CSV file" and all(r["splits"][s]["derived"] for s in ("train", "val", "test"))
    # lengths: the two long texts (51 and 61 tokens) are cut at data.max_len=20, wherever they fell
    cut = {s: r["lengths"][s]["truncated"] * r["splits"][s]["size"] for s in ("train", "val", "test")}
    assert round(sum(cut.values())) == 2 and max(r["lengths"][s]["max"] for s in cut) == 61
    assert r["argv"] == ["unfold-train", "--config", "tiny", "data.dataset=reviews.csv", *over, "--run-dir",
                         "runs/reviews_csv"]
    assert r["command"] == shlex.join(r["argv"])


def test_inspect_text_output(own_csv, capsys):
    rc, out, err = run_data(["inspect", "reviews.csv", "data.text_field=body", "data.label_field=topic",
                             "data.data_dir=" + str(own_csv / "empty")], capsys)
    assert rc == 0, err
    for words in ("dataset     reviews.csv (CSV file)", "text:  'body', chosen by data.text_field (override)",
                  "derived: drawn from reviews.csv (80/10/10, data.seed=0)", "truncated",
                  "GloVe not available (data.glove=finetune)", "data.glove=finetune needs the GloVe files",
                  "train with  unfold-train data.dataset=reviews.csv data.text_field=body data.label_field=topic "
                  f"data.data_dir={own_csv / 'empty'} --run-dir runs/reviews_csv"):
        assert words in out, out


def test_inspect_glove_rate_is_the_trainers_coverage(own_csv, capsys):
    """With the GloVe files present, the share of the vocabulary found is the one the trainer logs (load_glove)."""
    from experiments.data import Vocab, load_glove, tokenize
    try:
        rc, out, err = run_data(["inspect", "reviews.csv", "--json", "data.text_field=body", "data.label_field=topic"],
                                capsys)
        r = json.loads(out)
        if not r["glove"]["available"]:
            pytest.skip("GloVe files not in the data folder")
    except json.JSONDecodeError:
        raise AssertionError(err)
    s = load("reviews.csv", ["data.text_field=body", "data.label_field=topic"])
    vocab = Vocab.build([tokenize(t) for t, _ in s.train])
    assert r["glove"]["vocabulary_found"] == pytest.approx(load_glove(vocab)[1])
    assert r["glove"]["unknown_tokens"]["train"] == 0.0        # 'number' and digits are GloVe words


def test_inspect_takes_options_and_overrides_anywhere(own_csv, capsys):
    """--import before the command, --json and --config between the overrides: one report, as unfold-train reads
    its line (parse_intermixed_args)."""
    rc, out, err = run_data(["--import", "json", "inspect", "data.text_field=body", "reviews.csv", "--json",
                             "data.label_field=topic", "--config", "tiny"], capsys)
    assert rc == 0, err
    r = json.loads(out)
    assert r["columns"]["text"] == "body" and r["config"] == "tiny" and r["dataset"] == "reviews.csv"
