"""Hostile data, configs and sweep files: what a user can hand the trainer, ``experiments.data export``,
the TF-IDF baseline and ``unfold-sweep --table`` is checked where it is read, and refused in one line.

* Colliding labels (one class written two ways: ``1`` and ``"1"``, ``1`` and ``true`` or ``1.0``, ``"1"`` and
  ``"01"``, NFC variants, ``true`` and ``"True"``; repeated names in ``labels.json`` or a ``ClassLabel``) are
  refused by the dataset loader, in every format it reads, naming the file, the field and both values, so a
  binary set never trains a 3-class model.
* An empty (or blank-only) split file, and an ``hf:`` split left empty once its unlabelled rows are dropped, is
  refused naming the split and the file (an empty validation split never reports ``val_accuracy 0.0``).
* Every YAML reader (config files, overrides, dataset cards) refuses a repeated key at any level (naming the key
  and the lines, so the last one never silently replaces a whole section) and nesting too deep for the parser
  (a one-line refusal, no ``RecursionError``).
* ``--table`` checks each ``summary.json``, and a sweep checks each seed's existing ``metrics.json`` (a one-line
  refusal, no ``KeyError`` or ``AttributeError``).

The table `CASES` runs each hostile invocation through `clifuzz.expect_refusal`: exit 2, no traceback,
one last ``error:`` line naming the file / key / field / values, nothing written (the workspace watched too).
Unit tests with positive controls follow.
"""
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clifuzz import expect_refusal
from experiments.app import sweep as S
from experiments.app import tfidf as T
from experiments.app import config as C
from experiments import data as D
from experiments.app.config import ConfigError, dump_config, load_config
from experiments.data import DataError, Splits, check_classes, load_dataset
from experiments.data.core import label_table

# names that the fix adds are read inside the tests (getattr), so that on the old code each test fails on its own

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "experiments", "configs", "tiny.yaml")
DISK = os.path.join(ROOT, "tests", "data", "hf", "reviews_disk")
DOCS_SWEEPS = os.path.join(ROOT, "docs", "sweeps")
TRAIN, DATA, TFIDF, SWEEP = "experiments.app.train", "experiments.app.data_cli", "experiments.app.tfidf", "experiments.app.sweep"

WORDS = ["good", "bad", "great", "awful", "fine", "dull", "lovely", "boring", "superb", "poor", "nice", "weak"]
TEXTS = [f"a {w} film number {i}" for i, w in enumerate(WORDS * 2)]      # 24 distinct texts


def jsonl(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def labelled(labels, texts=TEXTS):
    """Records ``{"text", "label"}``: label ``labels[i % len(labels)]`` on text ``i``."""
    return [{"text": t, "label": labels[i % len(labels)]} for i, t in enumerate(texts)]


def csv_text(labels, texts=TEXTS) -> str:
    return "text,label\n" + "".join(f"{t},{labels[i % len(labels)]}\n" for i, t in enumerate(texts))


def split_dir(folder, train, val, test, labels_json=None, raw=None):
    """An exported-splits folder; ``raw`` = ``{file name: text}`` replaces a split's file as given."""
    os.makedirs(folder, exist_ok=True)
    for name, recs in (("train", train), ("val", val), ("test", test)):
        with open(os.path.join(folder, f"{name}.jsonl"), "w", encoding="utf-8") as fh:
            fh.write(jsonl(recs))
    for fname, text in (raw or {}).items():
        with open(os.path.join(folder, fname), "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
    if labels_json is not None:
        with open(os.path.join(folder, "labels.json"), "w", encoding="utf-8") as fh:
            fh.write(labels_json)
    return folder


def card(names: dict) -> str:
    """A dataset card whose ClassLabel ``label`` has ``names`` ({id: name})."""
    lines = ["---", "dataset_info:", "  features:", "  - name: text", "    dtype: string", "  - name: label",
             "    dtype:", "      class_label:", "        names:"]
    lines += [f"          '{k}': {json.dumps(v)}" for k, v in names.items()]
    return "\n".join(lines + ["---", "# a dataset", ""])


def hub_dir(folder, splits: dict, readme=None):
    """A hub-snapshot folder: ``data/SPLIT-00000-of-00001.parquet`` per ``{split: (texts, labels)}``."""
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    for split, (texts, labels) in splits.items():
        pq.write_table(pa.table({"text": texts, "label": labels}),
                       os.path.join(folder, "data", f"{split}-00000-of-00001.parquet"))
    if readme is not None:
        with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as fh:
            fh.write(readme)
    return folder


def summary(**change):
    """A well-formed sweep summary with ``change`` applied (a value of ``...`` removes the key)."""
    stat = {"mean": 0.75, "std": 0.01, "min": 0.74, "max": 0.76, "n": 2, "nonfinite": 0}
    base = {"name": "toy", "runs": {"0": {"test_accuracy": 0.74}, "1": {"test_accuracy": 0.76}},
            "metrics": {"test_accuracy": dict(stat), "val_accuracy": dict(stat), "train_seconds": dict(stat),
                        "energy_increases": dict(stat), "untrained.energy_increases": dict(stat),
                        "energy_steps": dict(stat)}}
    for key, value in change.items():
        node, parts = base, key.split("/")
        for p in parts[:-1]:
            node = node[p]
        if value is ...:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return base


DEEP = "[" * 5000
DEEP_OBJ = '{"a": ' * 5000


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace: every hostile file and folder, built once, watched by every case."""
    w = tmp_path_factory.mktemp("hostile")

    def put(name, content):
        path = w / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    # --- colliding labels in single files (jsonl, json, csv)
    put("int_str.jsonl", jsonl(labelled([0, 1, "1"])))
    put("bool_int.jsonl", jsonl(labelled([0, 1, True])))
    put("float_int.jsonl", jsonl(labelled([0, 1, 1.0])))
    put("zero_pad.jsonl", jsonl(labelled([0, 1, "01"])))
    put("plus.jsonl", jsonl(labelled([0, 1, "+1"])))
    put("exp.jsonl", jsonl(labelled([0, 1, "1e0"])))
    put("negzero.jsonl", jsonl(labelled([1, 0, -0.0])))
    put("true_text.jsonl", jsonl(labelled(["x", "True", True])))
    put("nfc.jsonl", jsonl(labelled(["x", "caf\u00e9", "cafe\u0301"])))
    put("int_str.json", json.dumps(labelled([0, 1, "1"])))
    put("float_text.csv", csv_text(["0", "1", "1.0"]))
    put("zero_pad.csv", csv_text(["0", "1", "01"]))
    put("bom.csv", "\ufeff" + csv_text(["0", "1", "1.00"]))
    put("latin1.csv", ("text,label\n" + "".join(f"caf\xe9 {t},{['0', '1', '+1'][i % 3]}\n"
                                                 for i, t in enumerate(TEXTS))).encode("latin-1"))
    put("data.tsv", "text\tlabel\n" + "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS)))
    # --- colliding labels across the files of a split folder, and in labels.json
    split_dir(w / "dir_int_str", labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]),
              labelled(["1", 0], TEXTS[20:]))
    split_dir(w / "dir_bool", labelled([0, 1], TEXTS[:16]), labelled([True, 0], TEXTS[16:20]),
              labelled([0, 1], TEXTS[20:]))
    ids = (labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]), labelled([0, 1], TEXTS[20:]))
    split_dir(w / "names_dup", *ids, labels_json='["neg", "pos", "pos"]')
    split_dir(w / "names_space", *ids, labels_json='["neg", " neg"]')
    split_dir(w / "names_int_str", *ids, labels_json='["1", 1]')
    split_dir(w / "names_pad", *ids, labels_json='["0", "00"]')
    split_dir(w / "names_null", *ids, labels_json='[null, "pos"]')
    split_dir(w / "names_empty", *ids, labels_json='["", "pos"]')
    split_dir(w / "names_bool", *ids, labels_json="[false, true]")
    split_dir(w / "names_deep", *ids, labels_json=DEEP)
    split_dir(w / "names_nfc", *ids, labels_json='["caf\\u00e9", "cafe\\u0301"]')
    # --- colliding labels and names in Hugging Face folders (parquet, arrow)
    half = len(TEXTS) // 2
    hub_dir(w / "hf_int_str", {"train": (TEXTS[:half], [i % 2 for i in range(half)]),
                               "test": (TEXTS[half:], [str(i % 2) for i in range(half)])})
    hub_dir(w / "hf_float_int", {"train": (TEXTS[:half], [float(i % 2) for i in range(half)]),
                                 "validation": (TEXTS[half:18], [i % 2 for i in range(18 - half)]),
                                 "test": (TEXTS[18:], [0.0, 1.0] * 3)})
    hub_dir(w / "hf_names", {"train": (TEXTS[:half], [i % 2 for i in range(half)]),
                             "test": (TEXTS[half:], [i % 2 for i in range(half)])}, readme=card({0: "pos", 1: "pos"}))
    hub_dir(w / "hf_names_num", {"train": (TEXTS[:half], [i % 2 for i in range(half)])},
            readme=card({0: "1", 1: "1.0"}))
    disk = shutil.copytree(DISK, w / "hf_disk_names")
    for split in ("train", "validation", "test"):
        info = disk / split / "dataset_info.json"
        meta = json.loads(info.read_text())
        meta["features"]["label"]["names"] = ["negative", "Positive", "negative"]
        info.write_text(json.dumps(meta))
    # --- empty splits
    split_dir(w / "empty_val", labelled([0, 1], TEXTS[:16]), [], labelled([0, 1], TEXTS[20:]))
    split_dir(w / "blank_val", labelled([0, 1], TEXTS[:16]), [], labelled([0, 1], TEXTS[20:]),
              raw={"val.jsonl": "\n\n   \n\t\n"})
    split_dir(w / "empty_test", labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]), [])
    split_dir(w / "blank_test", labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]), [],
              raw={"test.jsonl": "\r\n \r\n"})
    split_dir(w / "blank_train", [], labelled([0, 1], TEXTS[16:20]), labelled([0, 1], TEXTS[20:]),
              raw={"train.jsonl": "\n" * 50})
    hub_dir(w / "hf_unlabelled_test", {"train": (TEXTS[:half], [i % 2 for i in range(half)]),
                                       "test": (TEXTS[half:], [-1] * half)}, readme=card({0: "neg", 1: "pos"}))
    hub_dir(w / "hf_empty_val", {"train": (TEXTS[:half], [i % 2 for i in range(half)]),
                                 "validation": ([], pa.array([], pa.int64())),
                                 "test": (TEXTS[half:], [i % 2 for i in range(half)])})
    # --- wrong fields, types and encodings
    split_dir(w / "val_nolabel", labelled([0, 1], TEXTS[:16]), [{"text": "x"}], labelled([0, 1], TEXTS[20:]))
    split_dir(w / "test_listlabel", labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]),
              [{"text": "x", "label": [1]}])
    put("nan_text.jsonl", "".join(json.dumps({"text": t, "label": "NaN" if i == 7 else i % 2}) + "\n"
                                  for i, t in enumerate(TEXTS)))
    put("inf_float.jsonl", "".join(f'{{"text": "{t}", "label": {"1e400" if i == 5 else i % 2}}}\n'
                                   for i, t in enumerate(TEXTS)))
    put("null_label.jsonl", jsonl([{"text": t, "label": None if i == 3 else i % 2} for i, t in enumerate(TEXTS)]))
    put("dict_label.jsonl", jsonl([{"text": t, "label": {"a": 1} if i == 2 else i % 2} for i, t in enumerate(TEXTS)]))
    put("bom.jsonl", "\ufeff" + jsonl(labelled([0, 1])))
    put("utf16.jsonl", jsonl(labelled([0, 1])).encode("utf-16"))
    put("garbage.jsonl", bytes(range(256)) * 4)
    put("deep.jsonl", DEEP + "\n")
    put("notext.csv", "label,body\n" + "".join(f"{i % 2},{t}\n" for i, t in enumerate(TEXTS)))
    put("utf16.csv", csv_text(["0", "1"]).encode("utf-16"))
    put("huge_digits.csv", csv_text(["0", "1", "1" + "0" * 5000, "00" + "1" + "0" * 5000]))
    # --- configs
    put("cfg/deep_flow.yaml", "model:\n  d: " + DEEP + "\n")
    put("cfg/deep_map.yaml", "model: " + "{a: " * 5000 + "\n")
    put("cfg/deep_block.yaml", "".join("  " * i + "a:\n" for i in range(1200)))
    put("cfg/deep_alias.yaml", "".join(f"a{i}: &a{i} [{'*a%d' % (i - 1) if i else 1}]\n" for i in range(300)))
    put("cfg/self_alias.yaml", "model: &m\n  d: *m\n")
    put("cfg/dup_section.yaml", "model:\n  d: 16\nmodel:\n  heads: 3\n")
    put("cfg/dup_key.yaml", "model:\n  d: 16\n  heads: 2\n  d: 32\n")
    put("cfg/dup_flow.yaml", "train: {epochs: 1, lr: 0.1, epochs: 2}\n")
    put("cfg/dup_splits.yaml", "data:\n  splits:\n    train: train\n    train: test\n")
    put("cfg/dup_name.yaml", "name: one\n\"name\": two\n")
    put("cfg/dup_bool.yaml", "model:\n  ffn: true\ntrain:\n  progress: false\n  progress: true\n")
    put("cfg/dup_yes.yaml", "true: 1\nyes: 2\n")
    put("cfg/dup_bom.yaml", "\ufeffmodel:\n  d: 16\nmodel:\n  d: 32\n")
    put("cfg/utf16.yaml", "model:\n  d: 16\n".encode("utf-16"))
    put("cfg/ok.yaml", "model:\n  d: 16\n")
    # --- dataset cards
    hub_dir(w / "hf_card_dup", {"train": (TEXTS, [i % 2 for i in range(len(TEXTS))])},
            readme="---\ndataset_info:\n  features: []\ndataset_info:\n  features: []\n---\n")
    hub_dir(w / "hf_card_deep", {"train": (TEXTS, [i % 2 for i in range(len(TEXTS))])},
            readme="---\nx: " + DEEP + "\n---\n")
    # --- sweep summaries and seed metrics
    def sweep_root(name, content):
        folder = w / "sw" / name
        folder.mkdir(parents=True)
        if content is not None:
            (folder / "summary.json").write_bytes(content if isinstance(content, bytes) else content.encode())
        return folder

    for name, content in SUMMARIES.items():
        sweep_root(name, content)
    (w / "sw" / "dir_summary" / "summary.json").mkdir(parents=True)
    good = w / "good.csv"
    good.write_text(csv_text(["neg", "pos"]), encoding="utf-8")
    for name, metrics in SEED_METRICS.items():
        seed0 = w / "sw" / name / "seed-0"
        seed0.mkdir(parents=True)
        (seed0 / "metrics.json").write_bytes(metrics.encode() if isinstance(metrics, str) else metrics)
    seed0 = w / "sw" / "train_list" / "seed-0"
    seed0.mkdir(parents=True)
    (seed0 / "config.yaml").write_text(dump_config(load_config(TINY, ["train.seed=0", "data.seed=0"])))
    (seed0 / "metrics.json").write_text("[1, 2]")
    return w


def _dumps(value) -> str:
    return json.dumps(value)


#: summary.json contents for --table (name -> text; None: no file)
SUMMARIES = {
    "list": "[1, 2]", "string": '"summary"', "null": "null", "number": "3", "empty_obj": "{}",
    "empty_file": "", "garbage": bytes(range(256)), "latin1": '{"name": "caf\xe9"}'.encode("latin-1"),
    "deep": DEEP, "deep_obj": DEEP_OBJ, "missing": None,
    "name_int": _dumps(summary(name=3)), "name_newline": _dumps(summary(name="a\nb")), "name_pipe": _dumps(summary(name="a|b")),
    "no_runs": _dumps(summary(runs=...)), "runs_list": _dumps(summary(runs=[1, 2])), "runs_empty": _dumps(summary(runs={})),
    "no_metrics": _dumps(summary(metrics=...)), "metrics_list": _dumps(summary(metrics=[1])),
    "no_test_acc": _dumps(summary(**{"metrics/test_accuracy": ...})),
    "no_val_acc": _dumps(summary(**{"metrics/val_accuracy": ...})),
    "test_acc_list": _dumps(summary(**{"metrics/test_accuracy": [0.7]})),
    "test_acc_number": _dumps(summary(**{"metrics/test_accuracy": 0.7})),
    "mean_text": _dumps(summary(**{"metrics/test_accuracy/mean": "high"})),
    "mean_missing": _dumps(summary(**{"metrics/val_accuracy/mean": ...})),
    "std_missing": _dumps(summary(**{"metrics/test_accuracy/std": ...})),
    "mean_nan": _dumps(summary()).replace('"mean": 0.75', '"mean": NaN', 1),
    "mean_huge": _dumps(summary()).replace('"mean": 0.75', '"mean": 1e999', 1),
    "mean_bool": _dumps(summary(**{"metrics/test_accuracy/mean": True})),
    "std_negative": _dumps(summary(**{"metrics/test_accuracy/std": -0.5})),
    "n_text": _dumps(summary(**{"metrics/test_accuracy/n": "5"})),
    "n_missing": _dumps(summary(**{"metrics/val_accuracy/n": ...})),
    "n_bool": _dumps(summary(**{"metrics/test_accuracy/n": True})),
    "nonfinite_negative": _dumps(summary(**{"metrics/test_accuracy/nonfinite": -1})),
    "min_text": _dumps(summary(**{"metrics/test_accuracy/min": "low"})),
    "seconds_list": _dumps(summary(**{"metrics/train_seconds": [1, 2]})),
    "steps_missing": _dumps(summary(**{"metrics/energy_steps": ...})),
    "steps_text": _dumps(summary(**{"metrics/energy_steps/mean": "many"})),
    "untrained_null": _dumps(summary(**{"metrics/untrained.energy_increases": None})),
}

#: a seed's metrics.json in a TF-IDF sweep folder (looks finished to the old reader where it is an object)
_DONE = {"seed": 0, "max_train_examples": None, "val_accuracy": 0.5, "test_accuracy": 0.5}
SEED_METRICS = {
    "seed_list": "[1, 2]",
    "seed_string": '"done"',
    "seed_garbage": bytes(range(256)),
    "seed_deep": DEEP,
    "seed_acc_text": "DATASET", "seed_acc_list": "DATASET", "seed_no_acc": "DATASET",
}


def _seed_metrics(ws, name, change):
    """Rewrite ``sw/NAME/seed-0/metrics.json``: a finished-looking TF-IDF result for ``ws/good.csv`` with ``change``."""
    m = dict(_DONE, dataset_spec=str(ws / "good.csv"), **change)
    for key, value in change.items():
        if value is ...:
            m.pop(key)
    (ws / "sw" / name / "seed-0" / "metrics.json").write_text(json.dumps(m))


def export(dataset, *more):
    return ["export", "--dataset", f"{{ws}}/{dataset}", "--out", "{cwd}/out", *more]


def tfidf(dataset, *more):
    return ["--dataset", f"{{ws}}/{dataset}", "--json", "--Cs", "1", *more]


def train(dataset=None, *more, config=TINY):
    data = [f"data.dataset={{ws}}/{dataset}"] if dataset else []
    return ["--config", config, "--run-dir", "{cwd}/run", *data, "data.glove=none", "train.epochs=1",
            "train.progress=false", "train.tensorboard=false", *more]


def table(name):
    return ["--table", f"{{ws}}/sw/{name}"]


COLLIDE = ["collide"]

#: (module, argv with {ws} / {cwd} placeholders, words the error line must name)
CASES = [
    # --- (5) colliding labels: single files, every format, through export, the baseline and the trainer
    (DATA, export("int_str.jsonl"), ["int_str.jsonl", "'label'", "1", "'1'", *COLLIDE]),
    (DATA, export("bool_int.jsonl"), ["bool_int.jsonl", "'label'", "True", *COLLIDE]),
    (DATA, export("float_int.jsonl"), ["float_int.jsonl", "'label'", "1.0", *COLLIDE]),
    (DATA, export("zero_pad.jsonl"), ["zero_pad.jsonl", "'01'", *COLLIDE]),
    (DATA, export("plus.jsonl"), ["plus.jsonl", "'+1'", *COLLIDE]),
    (DATA, export("exp.jsonl"), ["exp.jsonl", "'1e0'", *COLLIDE]),
    (DATA, export("negzero.jsonl"), ["negzero.jsonl", "-0.0", *COLLIDE]),
    (DATA, export("true_text.jsonl"), ["true_text.jsonl", "'True'", "True", *COLLIDE]),
    (DATA, export("nfc.jsonl"), ["nfc.jsonl", "caf", *COLLIDE]),
    (DATA, export("int_str.json"), ["int_str.json", "'1'", *COLLIDE]),
    (DATA, export("float_text.csv"), ["float_text.csv", "'1.0'", *COLLIDE]),
    (DATA, export("zero_pad.csv"), ["zero_pad.csv", "'01'", *COLLIDE]),
    (DATA, export("bom.csv"), ["bom.csv", "'1.00'", *COLLIDE]),
    (DATA, export("latin1.csv"), ["latin1.csv", "line 2", "0xE9", "not UTF-8"]),     # never re-read as latin-1
    (DATA, export("data.tsv"), ["data.tsv", "unknown dataset"]),
    (DATA, export("int_str.jsonl", "--label-field", "label"), ["int_str.jsonl", *COLLIDE]),
    (DATA, export("dir_int_str"), ["dir_int_str", "test.jsonl record", "'1'", *COLLIDE]),
    (DATA, export("dir_bool"), ["dir_bool", "val.jsonl record", "True", *COLLIDE]),
    (DATA, export("names_dup"), ["labels.json", "'pos'", "class 1", "class 2", *COLLIDE]),
    (DATA, export("names_space"), ["labels.json", "' neg'", *COLLIDE]),
    (DATA, export("names_int_str"), ["labels.json", "'1'", *COLLIDE]),
    (DATA, export("names_pad"), ["labels.json", "'00'", *COLLIDE]),
    (DATA, export("names_nfc"), ["labels.json", *COLLIDE]),
    (DATA, export("names_null"), ["labels.json", "label name 0", "None"]),
    (DATA, export("names_empty"), ["labels.json", "label name 0", "empty"]),
    (DATA, export("names_bool"), ["labels.json", "label name 0", "False"]),
    (DATA, export("names_deep"), ["labels.json", "cannot read"]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_int_str", "--out", "{cwd}/out"], ["hf_int_str", "'0'", "split 'test'", *COLLIDE]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_float_int", "--out", "{cwd}/out"], ["hf_float_int", "0.0", "split 'validation'", *COLLIDE]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_names", "--out", "{cwd}/out"], ["hf_names", "ClassLabel", "'pos'", *COLLIDE]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_names_num", "--out", "{cwd}/out"], ["hf_names_num", "'1.0'", *COLLIDE]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_disk_names", "--out", "{cwd}/out"],
     ["hf_disk_names", "ClassLabel", "'negative'", *COLLIDE]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_names", "--out", "{cwd}/out", "--split", "test=test"],
     ["hf_names", *COLLIDE]),
    (TFIDF, tfidf("int_str.jsonl"), ["int_str.jsonl", "'1'", *COLLIDE]),
    (TFIDF, tfidf("bool_int.jsonl"), ["bool_int.jsonl", *COLLIDE]),
    (TFIDF, tfidf("float_text.csv"), ["float_text.csv", *COLLIDE]),
    (TFIDF, tfidf("zero_pad.csv"), ["zero_pad.csv", *COLLIDE]),
    (TFIDF, tfidf("int_str.json"), ["int_str.json", *COLLIDE]),
    (TFIDF, tfidf("dir_int_str"), ["dir_int_str", *COLLIDE]),
    (TFIDF, tfidf("names_dup"), ["labels.json", *COLLIDE]),
    (TFIDF, ["--dataset", "hf:{ws}/hf_int_str", "--json"], ["hf_int_str", *COLLIDE]),
    (TFIDF, ["--dataset", "hf:{ws}/hf_names", "--json"], ["hf_names", *COLLIDE]),
    (TFIDF, tfidf("int_str.jsonl", "--max-train-examples", "5"), ["int_str.jsonl", *COLLIDE]),
    (TRAIN, train("int_str.jsonl"), ["int_str.jsonl", "'label'", "'1'", *COLLIDE]),
    (TRAIN, train("bool_int.jsonl"), ["bool_int.jsonl", *COLLIDE]),
    (TRAIN, train("float_int.jsonl"), ["float_int.jsonl", *COLLIDE]),
    (TRAIN, train("true_text.jsonl"), ["true_text.jsonl", *COLLIDE]),
    (TRAIN, train("float_text.csv"), ["float_text.csv", *COLLIDE]),
    (TRAIN, train("bom.csv"), ["bom.csv", *COLLIDE]),
    (TRAIN, train("int_str.json"), ["int_str.json", *COLLIDE]),
    (TRAIN, train("dir_int_str"), ["dir_int_str", *COLLIDE]),
    (TRAIN, train("names_dup"), ["labels.json", *COLLIDE]),
    (TRAIN, train("names_space"), ["labels.json", *COLLIDE]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_int_str"), ["hf_int_str", *COLLIDE]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_names"), ["hf_names", "ClassLabel", *COLLIDE]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_disk_names"), ["hf_disk_names", *COLLIDE]),
    (TRAIN, train("int_str.jsonl", "train.max_train_examples=4"), ["int_str.jsonl", *COLLIDE]),
    # --- (6) empty evaluation splits: named with their file, before anything is written
    (DATA, export("empty_val"), ["empty_val", "val.jsonl", "validation split is empty"]),
    (DATA, export("blank_val"), ["blank_val", "val.jsonl", "validation split is empty", "blank"]),
    (DATA, export("empty_test"), ["empty_test", "test.jsonl", "test split is empty"]),
    (DATA, export("blank_test"), ["blank_test", "test.jsonl", "test split is empty", "blank"]),
    (DATA, export("blank_train"), ["blank_train", "train.jsonl", "training split is empty"]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_unlabelled_test", "--out", "{cwd}/out"],
     ["hf_unlabelled_test", "test split is empty", "'test'", "-1"]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_empty_val", "--out", "{cwd}/out"],
     ["hf_empty_val", "validation split is empty", "validation-00000-of-00001.parquet"]),
    (TFIDF, tfidf("empty_val"), ["empty_val", "val.jsonl", "validation split is empty"]),
    (TFIDF, tfidf("blank_val"), ["blank_val", "val.jsonl", "empty"]),
    (TFIDF, tfidf("blank_test"), ["blank_test", "test.jsonl", "empty"]),
    (TFIDF, ["--dataset", "hf:{ws}/hf_unlabelled_test", "--json"], ["hf_unlabelled_test", "test split is empty"]),
    (TRAIN, train("empty_val"), ["empty_val", "val.jsonl", "validation split is empty"]),
    (TRAIN, train("blank_val"), ["blank_val", "val.jsonl", "validation split is empty"]),
    (TRAIN, train("empty_test"), ["empty_test", "test.jsonl", "test split is empty"]),
    (TRAIN, train("blank_test"), ["blank_test", "test.jsonl", "test split is empty"]),
    (TRAIN, train("blank_train"), ["blank_train", "train.jsonl", "training split is empty"]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_unlabelled_test"), ["hf_unlabelled_test", "test split is empty"]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_empty_val"), ["hf_empty_val", "validation split is empty"]),
    # --- missing fields, wrong types, encodings, huge numbers, NaN labels
    (DATA, export("val_nolabel"), ["val.jsonl", "record 0", "'label'"]),
    (DATA, export("test_listlabel"), ["test.jsonl", "record 0", "[1]"]),
    (DATA, export("nan_text.jsonl"), ["nan_text.jsonl", "record 7", "'NaN'"]),
    (DATA, export("inf_float.jsonl"), ["inf_float.jsonl", "record 5", "inf"]),
    (DATA, export("null_label.jsonl"), ["null_label.jsonl", "record 3", "empty label"]),
    (DATA, export("dict_label.jsonl"), ["dict_label.jsonl", "record 2", "{'a': 1}"]),
    (DATA, export("bom.jsonl"), ["bom.jsonl:1", "not valid json"]),
    (DATA, export("utf16.jsonl"), ["utf16.jsonl"]),
    (DATA, export("garbage.jsonl"), ["garbage.jsonl"]),
    (DATA, export("deep.jsonl"), ["deep.jsonl:1", "not valid json"]),
    (DATA, export("notext.csv"), ["notext.csv", "'text'", "columns found"]),
    (DATA, export("utf16.csv"), ["utf16.csv", "UTF-16", "not UTF-8"]),
    (DATA, export("huge_digits.csv"), ["huge_digits.csv", "1000000000", *COLLIDE]),
    (DATA, export("int_str.jsonl", "--label-field", "nope"), ["int_str.jsonl", "'nope'", "columns found"]),
    (TRAIN, train("val_nolabel"), ["val.jsonl", "record 0", "'label'"]),
    (TRAIN, train("nan_text.jsonl"), ["nan_text.jsonl", "record 7"]),
    # --- (11) deep nesting in config files and overrides; (14a) repeated keys at every level
    (TRAIN, ["--config", "{ws}/cfg/deep_flow.yaml", "--run-dir", "{cwd}/run"], ["deep_flow.yaml", "nested deeper"]),
    (TRAIN, ["--config", "{ws}/cfg/deep_map.yaml", "--run-dir", "{cwd}/run"], ["deep_map.yaml", "nested deeper"]),
    (TRAIN, ["--config", "{ws}/cfg/deep_block.yaml", "--run-dir", "{cwd}/run"], ["deep_block.yaml", "nested deeper"]),
    (TRAIN, ["--config", "{ws}/cfg/deep_alias.yaml", "--run-dir", "{cwd}/run"], ["deep_alias.yaml", "through aliases"]),
    (TRAIN, ["--config", "{ws}/cfg/self_alias.yaml", "--run-dir", "{cwd}/run"], ["self_alias.yaml", "itself"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_section.yaml", "--run-dir", "{cwd}/run"],
     ["dup_section.yaml", "duplicate key 'model'", "line 3", "line 1"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_key.yaml", "--run-dir", "{cwd}/run"],
     ["dup_key.yaml", "duplicate key 'model.d'", "line 4", "line 2"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_flow.yaml", "--run-dir", "{cwd}/run"], ["dup_flow.yaml", "'train.epochs'", "line 1"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_splits.yaml", "--run-dir", "{cwd}/run"],
     ["dup_splits.yaml", "'data.splits.train'", "line 4"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_name.yaml", "--run-dir", "{cwd}/run"], ["dup_name.yaml", "'name'", "line 2"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_bool.yaml", "--run-dir", "{cwd}/run"],
     ["dup_bool.yaml", "'train.progress'", "line 5"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_yes.yaml", "--run-dir", "{cwd}/run"], ["dup_yes.yaml", "duplicate key", "'yes'"]),
    (TRAIN, ["--config", "{ws}/cfg/dup_bom.yaml", "--run-dir", "{cwd}/run"], ["dup_bom.yaml", "'model'", "line 3"]),
    (TRAIN, ["--config", "{ws}/cfg/utf16.yaml", "--run-dir", "{cwd}/run"], ["utf16.yaml", "UTF-8"]),
    (TRAIN, train(None, "model.d=" + DEEP), ["override", "model.d=[[[", "nested deeper"]),
    (TRAIN, train(None, "data.splits=" + "{a: " * 5000), ["override", "data.splits=", "nested deeper"]),
    (TRAIN, train(None, "data.splits.train" + ".a" * 3000 + "=x"), ["override", "data.splits.train.a", "nested deeper"]),
    (TRAIN, train(None, "data.splits.train=" + "{a: " * 70 + "x" + "}" * 70), ["override", "nested deeper"]),
    (TRAIN, train(None, "model={d: 16, d: 32}"), ["override", "'model=", "duplicate key 'd'", "line 1"]),
    (TRAIN, train(None, "data.splits={train: train, train: test}"), ["override", "duplicate key 'train'"]),
    (TRAIN, train(None, "train={epochs: 1, lr: 0.1, epochs: 2}"), ["override", "duplicate key 'epochs'"]),
    (TRAIN, train(None, "model.d=1" + "0" * 5000), ["model.d"]),
    (TRAIN, train(None, "model.d=1.0e+999"), ["model.d", "inf"]),
    (TRAIN, ["--config", "{ws}/cfg/ok.yaml", "--run-dir", "{cwd}/run", "model={heads: 1, heads: 2}"],
     ["override", "duplicate key 'heads'"]),
    (SWEEP, ["--config", "{ws}/cfg/dup_section.yaml", "--seeds", "1", "--run-dir", "{cwd}/sw"],
     ["dup_section.yaml", "duplicate key 'model'"]),
    (SWEEP, ["--config", "{ws}/cfg/deep_flow.yaml", "--seeds", "1", "--run-dir", "{cwd}/sw"],
     ["deep_flow.yaml", "nested deeper"]),
    (SWEEP, ["--config", TINY, "--seeds", "1", "--run-dir", "{cwd}/sw", "model.d=" + DEEP], ["override", "nested deeper"]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_card_dup", "--out", "{cwd}/out"],
     ["hf_card_dup", "README.md", "duplicate key 'dataset_info'", "line 4"]),
    (DATA, ["export", "--dataset", "hf:{ws}/hf_card_deep", "--out", "{cwd}/out"],
     ["hf_card_deep", "README.md", "nested deeper"]),
    (TRAIN, train(None, "data.dataset=hf:{ws}/hf_card_dup"), ["hf_card_dup", "duplicate key"]),
    # --- (12b) --table on malformed summary.json; a sweep over malformed seed metrics.json
    *[(SWEEP, table(name), [name, "summary.json"]) for name in
      ("list", "string", "null", "number", "empty_file", "garbage", "latin1", "deep", "deep_obj")],
    (SWEEP, table("missing"), ["missing", "no summary.json"]),
    (SWEEP, table("dir_summary"), ["dir_summary", "summary.json"]),
    (SWEEP, table("empty_obj"), ["empty_obj", "'name'"]),
    (SWEEP, table("name_int"), ["name_int", "'name'", "3"]),
    (SWEEP, table("name_newline"), ["name_newline", "'name'"]),
    (SWEEP, table("name_pipe"), ["name_pipe", "'name'"]),
    (SWEEP, table("no_runs"), ["no_runs", "'runs'"]),
    (SWEEP, table("runs_list"), ["runs_list", "'runs'", "array"]),
    (SWEEP, table("runs_empty"), ["runs_empty", "no finished seed"]),
    (SWEEP, table("no_metrics"), ["no_metrics", "'metrics'"]),
    (SWEEP, table("metrics_list"), ["metrics_list", "'metrics'", "array"]),
    (SWEEP, table("no_test_acc"), ["no_test_acc", "'test_accuracy'"]),
    (SWEEP, table("no_val_acc"), ["no_val_acc", "'val_accuracy'"]),
    (SWEEP, table("test_acc_list"), ["test_acc_list", "metrics.test_accuracy", "array"]),
    (SWEEP, table("test_acc_number"), ["test_acc_number", "metrics.test_accuracy", "number"]),
    (SWEEP, table("mean_text"), ["mean_text", "metrics.test_accuracy.mean", "high"]),
    (SWEEP, table("mean_missing"), ["mean_missing", "metrics.val_accuracy", "'mean'"]),
    (SWEEP, table("std_missing"), ["std_missing", "metrics.test_accuracy", "'std'"]),
    (SWEEP, table("mean_nan"), ["mean_nan", "metrics.test_accuracy.mean", "finite"]),
    (SWEEP, table("mean_huge"), ["mean_huge", "metrics.test_accuracy.mean", "finite"]),
    (SWEEP, table("mean_bool"), ["mean_bool", "metrics.test_accuracy.mean", "true"]),
    (SWEEP, table("std_negative"), ["std_negative", "metrics.test_accuracy.std", "-0.5"]),
    (SWEEP, table("n_text"), ["n_text", "metrics.test_accuracy.n", "integer"]),
    (SWEEP, table("n_missing"), ["n_missing", "metrics.val_accuracy", "'n'"]),
    (SWEEP, table("n_bool"), ["n_bool", "metrics.test_accuracy.n", "true"]),
    (SWEEP, table("nonfinite_negative"), ["nonfinite_negative", "metrics.test_accuracy.nonfinite"]),
    (SWEEP, table("min_text"), ["min_text", "metrics.test_accuracy.min", "low"]),
    (SWEEP, table("seconds_list"), ["seconds_list", "metrics.train_seconds", "array"]),
    (SWEEP, table("steps_missing"), ["steps_missing", "'energy_steps'"]),
    (SWEEP, table("steps_text"), ["steps_text", "metrics.energy_steps.mean", "many"]),
    (SWEEP, table("untrained_null"), ["untrained_null", "metrics.untrained.energy_increases", "null"]),
    (SWEEP, ["--table", DOCS_SWEEPS + "/..", "{ws}/sw/list"], ["summary.json"]),
    *[(SWEEP, ["--tfidf", "--dataset", "{ws}/good.csv", "--seeds", "1", "--run-dir", f"{{ws}}/sw/{name}"],
       [f"{name}/seed-0/metrics.json", *words]) for name, words in (
          ("seed_list", ["array"]), ("seed_string", ["string"]), ("seed_garbage", ["utf-8"]),
          ("seed_deep", ["not valid json"]), ("seed_acc_text", ["'test_accuracy'", "high"]),
          ("seed_acc_list", ["'val_accuracy'"]), ("seed_no_acc", ["'test_accuracy'"]))],
    (SWEEP, ["--config", TINY, "--seeds", "1", "--run-dir", "{ws}/sw/train_list"],
     ["train_list/seed-0/metrics.json", "array"]),
]


@pytest.fixture(scope="module")
def ws_ready(ws):
    """The workspace with the seed metrics that name the workspace itself."""
    _seed_metrics(ws, "seed_acc_text", {"test_accuracy": "high"})
    _seed_metrics(ws, "seed_acc_list", {"val_accuracy": [0.5]})
    _seed_metrics(ws, "seed_no_acc", {"test_accuracy": ...})
    return ws


def _ids():
    seen: dict = {}
    out = []
    for module, argv, _ in CASES:
        key = f"{module.split('.')[-1]}-" + "-".join(os.path.basename(str(a))[:24] for a in argv[:4])
        seen[key] = seen.get(key, 0) + 1
        out.append(key if seen[key] == 1 else f"{key}-{seen[key]}")
    return out


def test_the_table_is_large_enough():
    assert len(CASES) >= 110


@pytest.mark.parametrize("module,argv,names", CASES, ids=_ids())
def test_a_hostile_invocation_is_refused_in_one_line(tmp_path, ws_ready, module, argv, names):
    fill = lambda s: str(s).replace("{ws}", str(ws_ready)).replace("{cwd}", str(tmp_path))
    expect_refusal(module, [fill(a) for a in argv], str(tmp_path), names=[fill(n) for n in names],
                   watch=[str(ws_ready)])


# --------------------------------------------------------------------------------------------
# (5) colliding labels: the rule, with positive controls
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values", [
    [0, 1, "1"], [0, 1, True], [0, 1, 1.0], ["0", "1", "01"], ["0", "1", "+1"], ["0", "1", " 1.0"], [0, -0.0, 1],
    ["x", "True", True], ["caf\u00e9", "cafe\u0301"], ["1e0", 1], ["a", 1, "1"],
])
def test_label_values_that_are_one_class_written_two_ways_are_refused(values):
    with pytest.raises(DataError, match=r"f\.jsonl: label values .* of 'stars' collide"):
        label_table(values, "f.jsonl", "stars")


def test_label_values_that_do_not_collide_keep_their_order():
    assert label_table([10, 2, 1, 2])[1] == ["1", "2", "10"]                   # numeric order for integers
    assert label_table(["b", "a", "b"])[1] == ["a", "b"]
    assert label_table([True, False])[1] == ["False", "True"]
    assert label_table(["1.5", "2"])[1] == ["1.5", "2"]
    assert label_table(["Pos", "pos"])[1] == ["Pos", "pos"]                     # case is not a collision
    table, names = label_table(["1" + "0" * 5000, "2"])                         # beyond int()'s digit limit
    assert names[0] == "2" and len(names[1]) == 5001 and table["2"] == 0


@pytest.mark.parametrize("names", [["a", "a"], ["a", " a"], ["1", 1], ["0", "00"], ["x", "1", "1.0"],
                                   ["caf\u00e9", "cafe\u0301"], [None, "a"], ["", "a"], [True, False], []])
def test_label_name_lists_refuse_repeats_and_non_names(names):
    with pytest.raises(DataError, match="labels.json"):
        D.check_label_names(names, "labels.json")


def test_label_name_lists_accept_distinct_names():
    assert D.check_label_names(["neg", "pos"], "x") == ["neg", "pos"]
    assert D.check_label_names([0, 1, 2], "x") == ["0", "1", "2"]


def test_a_binary_file_with_labels_1_and_quoted_1_is_refused_not_trained_as_three_classes(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(jsonl(labelled([0, 1, "1"])))
    with pytest.raises(DataError, match=r"d\.jsonl: label values 1 \(record 1\) and '1' \(record 2\) of 'label' collide"):
        load_dataset(str(path))
    path.write_text(jsonl(labelled([0, 1, 1])))                               # positive control
    assert load_dataset(str(path)).label_names == ["0", "1"]


def test_every_dataset_is_checked_in_the_one_place_all_consumers_pass(tmp_path):
    """A Splits built by hand (a plug-in loader, a library user) gets the same checks: check_classes refuses
    repeated label names, a label that is no class id, an empty evaluation split; the TF-IDF baseline too."""
    train = [(f"good text {i}", i % 2) for i in range(8)]
    ok = Splits(train, [("bad text", 1)], [("good text x", 0)], 2, ["neg", "pos"], "toy")
    assert check_classes(ok) is ok and T.tfidf_logreg(ok, Cs=(1,))["test_accuracy"] == 1.0
    with pytest.raises(DataError, match=r"toy: label values '1' \(class 0\) and '1' \(class 1\) of 'label names' collide"):
        check_classes(Splits(train, ok.val, ok.test, 2, ["1", "1"], "toy"))
    with pytest.raises(DataError, match=r"toy: label values .* of 'label names' collide"):
        T.tfidf_logreg(Splits(train, ok.val, ok.test, 2, ["pos", "pos "], "toy"), Cs=(1,))
    with pytest.raises(DataError, match=r"toy: test example 0 has label 2"):
        check_classes(Splits(train, ok.val, [("x", 2)], 2, ["neg", "pos"], "toy"))
    with pytest.raises(DataError, match="toy: the validation split is empty"):
        check_classes(Splits(train, [], ok.test, 2, ["neg", "pos"], "toy"))


def test_hf_class_label_names_that_repeat_are_refused(ws):
    with pytest.raises(DataError, match=r"ClassLabel.*'pos' \(class 0\) and 'pos' \(class 1\)"):
        load_dataset(f"hf:{ws / 'hf_names'}")
    assert load_dataset(f"hf:{DISK}").label_names == ["negative", "neutral", "positive"]    # positive control


# --------------------------------------------------------------------------------------------
# (6) empty splits
# --------------------------------------------------------------------------------------------

def test_an_empty_or_blank_validation_split_is_refused_naming_the_file(ws, tmp_path):
    for folder in ("empty_val", "blank_val"):
        with pytest.raises(DataError, match=rf"{folder}/val\.jsonl: the validation split is empty"):
            load_dataset(str(ws / folder))
    good = split_dir(tmp_path / "good", labelled([0, 1], TEXTS[:16]), labelled([0, 1], TEXTS[16:20]),
                     labelled([0, 1], TEXTS[20:]))
    assert load_dataset(str(good)).sizes() == {"train": 16, "val": 4, "test": 4}     # positive control


def test_an_hf_split_left_empty_by_dropping_unlabelled_rows_is_refused(ws):
    with pytest.raises(DataError, match=r"the test split is empty: split 'test' \(.*\) holds no row once its 12 "
                                        r"row\(s\) labelled -1"):
        load_dataset(f"hf:{ws / 'hf_unlabelled_test'}")


def test_too_few_examples_after_cleaning_names_the_file(tmp_path):
    path = tmp_path / "dups.csv"
    path.write_text("text,label\nsame,0\nSAME,1\nother,0\n   ,1\n")
    with pytest.raises(DataError, match=r"dups\.csv: need at least 3 examples to split 80/10/10, got 1 after "
                                        r"cleaning \(4 rows read"):
        load_dataset(str(path))


# --------------------------------------------------------------------------------------------
# (11, 14a) the strict YAML reader
# --------------------------------------------------------------------------------------------

def test_a_repeated_section_no_longer_replaces_the_first(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  d: 16\nmodel:\n  heads: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*duplicate key 'model' at line 3, column 1, first at line 1"):
        load_config(str(cfg))
    cfg.write_text("model:\n  d: 16\n  heads: 4\n")                             # positive control
    assert load_config(str(cfg))["model"]["d"] == 16 and load_config(str(cfg))["model"]["heads"] == 4


def test_the_strict_reader_keeps_what_yaml_allows():
    load_yaml, depth = C.load_yaml, C.MAX_YAML_DEPTH
    assert load_yaml("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n") == {"base": {"x": 1, "y": 2},
                                                                           "c": {"x": 3, "y": 2}}   # merge keys
    deep = "[" * (depth - 1) + "]" * (depth - 1)
    assert load_yaml(f"a: {deep}")["a"] is not None                                # at the limit: read
    assert load_yaml("a: &x [1]\nb: *x\nc: *x\n") == {"a": [1], "b": [1], "c": [1]}   # shared aliases
    assert load_yaml("") is None
    for bad in ("[" * 5000, "{a: " * 5000, "a: 1\na: 2", "a: &a [*a]", "- {k: 1, k: 2}"):
        with pytest.raises(C.StrictYAMLError):
            load_yaml(bad)


def test_every_shipped_config_and_dataset_card_still_reads():
    from experiments.app.config import config_names
    for name in config_names():
        assert load_config(name)["name"]
    for folder in ("reviews_hub", "plain_hub"):
        assert load_dataset(f"hf:{os.path.join(ROOT, 'tests', 'data', 'hf', folder)}").num_classes >= 2


def test_deep_overrides_are_one_config_error():
    for override in ("model.d=" + "[" * 5000, "data.splits=" + "{a: " * 5000, "data.splits.train" + ".a" * 5000 + "=1"):
        with pytest.raises(ConfigError, match="nested deeper"):
            load_config("tiny", [override])


# --------------------------------------------------------------------------------------------
# (12b) --table and the sweep's reading of seed metrics
# --------------------------------------------------------------------------------------------

def test_table_reads_the_shipped_summaries_and_refuses_malformed_ones(tmp_path):
    roots = []
    for name in sorted(os.listdir(DOCS_SWEEPS)):
        root = tmp_path / name[:-5]
        root.mkdir()
        shutil.copy(os.path.join(DOCS_SWEEPS, name), root / "summary.json")
        roots.append(str(root))
    out = S.table(roots)                                                            # positive control
    assert out.count("\n") == 2 + len(roots) and "%" in out
    bad = tmp_path / "bad"
    bad.mkdir()
    for content, words in (([1], "JSON array"), ({"name": "x", "runs": {"0": {}}, "metrics": {}}, "'test_accuracy'"),
                           (summary(**{"metrics/test_accuracy": {"mean": "x", "std": None, "n": 1}}), "mean")):
        (bad / "summary.json").write_text(json.dumps(content))
        with pytest.raises(ConfigError, match=words):
            S.table([str(bad)])


def test_flatten_is_iterative_and_metrics_are_checked():
    deep = node = {}
    for _ in range(5000):
        node["a"] = node = {}
    node["x"] = 1
    assert list(S.flatten(deep).values()) == [1.0]
    assert S.metrics_problem([1]) and S.metrics_problem({"test_accuracy": "hi", "val_accuracy": 1})
    assert S.metrics_problem({"test_accuracy": 0.5, "val_accuracy": "nan"}) is None
