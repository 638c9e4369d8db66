"""The boundary of the data and analysis tools: every option has its range, every file it reads is checked,
and no bad argument or bad file reaches the user as a traceback.

Table-driven: each row of :data:`CASES` is one bad invocation of ``experiments.data``, ``tfidf``,
``plot_energy``, ``spline_probe``, ``descent``, ``activations``, ``pyg_sbm`` or ``bench``, run through
:func:`clifuzz.expect_refusal` (exit 2, one ``error:`` line naming the flag / key / value / file, nothing
written). The bad files live in one workspace built once (:func:`ws`), watched by every case so that a
refusal that writes there fails too. Then unit tests of the one-class refusal and the GloVe file checks,
each with a positive control.
"""
import bz2
import json
import os

import numpy as np
import pytest
import torch

from clifuzz import expect_refusal, run_cli
from experiments import data as D
from experiments.data import files as F
from experiments.app import tfidf as T
from experiments.app.config import dump_config
from experiments.data import DataError, Splits, Vocab, load_dataset, load_glove

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "experiments", "configs", "default.yaml")
TEXTS = ["good film", "bad film", "great plot", "awful plot", "fine cast", "dull cast", "lovely score",
         "boring score", "superb pace", "poor pace", "nice end", "weak end"]


def csv_text(rows, header=("text", "label")) -> str:
    return ",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)


def jsonl_text(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def write_split_dir(folder, train, val, test, labels=None):
    """An exported-splits folder (``train/val/test.jsonl`` of ``(text, label)``, optional labels.json)."""
    os.makedirs(folder, exist_ok=True)
    for name, rows in (("train", train), ("val", val), ("test", test)):
        with open(os.path.join(folder, f"{name}.jsonl"), "w", encoding="utf-8") as fh:
            fh.write(jsonl_text({"text": t, "label": lab} for t, lab in rows))
    if labels is not None:
        with open(os.path.join(folder, "labels.json"), "w", encoding="utf-8") as fh:
            fh.write(labels)
    return folder


class Evil:
    """A class a pickle would have to import (and could run code from): ``safe_load`` refuses it."""


TWO = [(t, i % 2) for i, t in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace: one bad file (or folder) per case, built once."""
    w = tmp_path_factory.mktemp("ws")

    def put(name, content, mode="w"):
        path = w / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode == "wb":
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    # datasets given by path
    put("good.csv", csv_text((t, ["neg", "pos"][i % 2]) for i, t in enumerate(TEXTS)))
    put("one.csv", csv_text((t, "pos") for t in TEXTS))
    put("nan.csv", csv_text([(TEXTS[0], "pos"), (TEXTS[1], "nan"), (TEXTS[2], "neg")]
                            + [(t, "pos") for t in TEXTS[3:]]))
    put("inf.jsonl", jsonl_text([{"text": t, "label": "-inf" if i == 4 else i % 2} for i, t in enumerate(TEXTS)]))
    put("nanlit.jsonl", "".join(f'{{"text": "{t}", "label": {"NaN" if i == 3 else i % 2}}}\n'
                                for i, t in enumerate(TEXTS)))
    put("half.jsonl", jsonl_text([{"text": t, "label": 0.5 if i == 2 else i % 2} for i, t in enumerate(TEXTS)]))
    put("listlabel.jsonl", jsonl_text([{"text": t, "label": [1] if i == 1 else 0} for i, t in enumerate(TEXTS)]))
    put("emptylabel.csv", csv_text([(t, "" if i == 5 else i % 2) for i, t in enumerate(TEXTS)]))
    put("nocol.csv", csv_text(TWO, header=("text", "y")))
    put("empty.csv", "")
    put("empty.jsonl", "")
    put("latin.jsonl", "\xff\xfe not utf-8\n".encode("latin-1"), "wb")
    put("badline.jsonl", jsonl_text({"text": t, "label": lab} for t, lab in TWO[:4]) + "{not json\n")
    put("array.jsonl", jsonl_text({"text": t, "label": lab} for t, lab in TWO[:4]) + "[1, 2]\n")
    put("string.json", json.dumps("just a string"))
    put("surrogate.jsonl", "".join('{"text": "a\\ud800b", "label": %d}\n' % (i % 2) for i in range(6)))
    put("two.csv", csv_text(TWO[:2]))
    (w / "dir.csv").mkdir()
    put("afile", "not a folder\n")
    # exported-split folders
    write_split_dir(w / "onetrain", [(t, "a") for t in TEXTS[:8]], [(TEXTS[8], "b")], [(TEXTS[9], "a")])
    write_split_dir(w / "emptytrain", [], [(TEXTS[8], "b")], [(TEXTS[9], "a")])
    write_split_dir(w / "emptytest", TWO[:8], TWO[8:10], [])
    write_split_dir(w / "badlabels", TWO[:8], TWO[8:10], TWO[10:], labels="{oops")
    write_split_dir(w / "dictlabels", TWO[:8], TWO[8:10], TWO[10:], labels='{"a": 1}')
    write_split_dir(w / "nolabels", TWO[:8], TWO[8:10], TWO[10:], labels="[]")
    write_split_dir(w / "outofrange", TWO[:8], [(TEXTS[8], 5)], TWO[10:], labels='["neg", "pos"]')
    write_split_dir(w / "notest", TWO[:8], TWO[8:10], TWO[10:])
    os.rename(w / "notest" / "test.jsonl", w / "notest" / "tst.jsonl")     # misspelt: refused, not carved
    # data folders for the registered datasets
    (w / "emptydata").mkdir()
    put("rtbad/" + D.RT_FILE, b"BZh91AY&SY garbage, not bz2", "wb")
    put("rtnocol/" + D.RT_FILE, bz2.compress(b"category,review\nfresh,nice\n"), "wb")
    put("cfbad/" + D.CF_FILE, "sentiment,confidence,text\nangry,1,hello\n")
    put("badmanifest/manifest.json", "{not json")
    # run folders for plot_energy
    energies = {"E": torch.randn(4, 3, dtype=torch.float64)}
    history = [{"epoch": 1, "train_loss": 0.7, "val_loss": 0.7, "train_accuracy": 0.5, "val_accuracy": 0.5}]

    def run(name, trace=None, hist=None, metrics=None, raw=None):
        folder = w / "runs" / name
        folder.mkdir(parents=True)
        if trace is not None:
            torch.save(trace, folder / "energy_trace.pt")
        if hist is not None:
            (folder / "history.json").write_text(hist if isinstance(hist, str) else json.dumps(hist))
        if metrics is not None:
            (folder / "metrics.json").write_text(metrics if isinstance(metrics, str) else json.dumps(metrics))
        for fname, content in (raw or {}).items():
            (folder / fname).write_bytes(content)
        return folder

    good = {"energies": energies, "energy_min": None, "extra_layers": 32, "mode": "guaranteed", "dtype": "float64"}
    run("notrun")
    run("notrace", hist=history)
    run("nohist", trace=good)
    run("garbagetrace", hist=history, raw={"energy_trace.pt": os.urandom(256)})
    run("emptytrace", hist=history, raw={"energy_trace.pt": b""})
    run("listtrace", trace=[1, 2, 3], hist=history)
    run("noenergies", trace={"mode": "guaranteed"}, hist=history)
    run("emptyenergies", trace={**good, "energies": {}}, hist=history)
    run("vectorenergy", trace={**good, "energies": {"E": torch.randn(4)}}, hist=history)
    run("intenergy", trace={**good, "energies": {"E": torch.ones(4, 3, dtype=torch.long)}}, hist=history)
    run("shapes", trace={**good, "energies": {"E": torch.randn(4, 3), "F": torch.randn(4, 2)}}, hist=history)
    run("emin", trace={**good, "energy_min": torch.randn(7)}, hist=history)
    run("extra", trace={**good, "extra_layers": -1}, hist=history)
    run("modeint", trace={**good, "mode": 3}, hist=history)
    run("pickled", hist=history, raw={"energy_trace.pt": b""})
    torch.save({"energies": energies, "evil": Evil()}, w / "runs" / "pickled" / "energy_trace.pt")
    run("garbagehist", trace=good, raw={"history.json": os.urandom(64) + b"\xff"})
    run("texthist", trace=good, hist="epoch 1: fine")
    run("objecthist", trace=good, hist={"epoch": 1})
    run("emptyhist", trace=good, hist=[])
    run("keyhist", trace=good, hist=[{"epoch": 1, "train_loss": 0.7}])
    run("strhist", trace=good, hist=[{**history[0], "val_loss": "low"}])
    run("listmetrics", trace=good, hist=history, metrics=[1, 2])
    run("garbagemetrics", trace=good, hist=history, raw={"metrics.json": os.urandom(64)})
    run("namemetrics", trace=good, hist=history, metrics={"name": ["x"]})
    run("accmetrics", trace=good, hist=history, metrics={"test_accuracy": "high"})
    run("dirmetrics", trace=good, hist=history)
    (w / "runs" / "dirmetrics" / "metrics.json").mkdir()
    # checkpoints for spline_probe
    ck = w / "ck"
    ck.mkdir()
    (ck / "garbage.pt").write_bytes(os.urandom(300))
    (ck / "empty.pt").write_bytes(b"")
    torch.save([1, 2], ck / "list.pt")
    torch.save({"model": {}}, ck / "noconfig.pt")
    torch.save({"config": "x", "model": {}}, ck / "strconfig.pt")
    torch.save({"config": {}, "model": [1]}, ck / "listmodel.pt")
    torch.save({"config": {}, "model": {"head.weight": torch.zeros(2, 4)}}, ck / "noembed.pt")
    torch.save({"config": {}, "model": {"embed.weight": torch.full((5, 4), float("nan")),
                                        "head.weight": torch.zeros(2, 4)}}, ck / "nan.pt")
    torch.save({"config": {"model": {"d": -1}}, "model": {"embed.weight": torch.zeros(5, 4),
                                                          "head.weight": torch.zeros(2, 4)}}, ck / "badconfig.pt")
    torch.save({"config": {"model": {"d": 4, "heads": 1}, "data": {"glove": "none"}},
                "model": {"embed.weight": torch.zeros(5, 4), "head.weight": torch.zeros(2, 4)}}, ck / "misfit.pt")
    torch.save({"config": {}, "model": {}, "evil": Evil()}, ck / "pickled.pt")
    (ck / "folder.pt").mkdir()
    put("bad.yaml", "model: [unclosed\n")
    put("list.yaml", "- 1\n- 2\n")
    # an activations output folder whose reused run has a broken metrics.json
    from experiments.studies.activations import variant_config
    act = w / "act" / "std-softmax"
    act.mkdir(parents=True)
    (act / "config.yaml").write_text(dump_config(variant_config("std-softmax", 6)))
    (act / "best.pt").write_bytes(b"")
    (act / "metrics.json").write_text(json.dumps({
        "test_accuracy": "high", "val_accuracy": 0.5, "energy_first_mean": 1.0, "energy_last_mean": 0.5,
        "train_seconds": 1.0, "energy_steps": 8, "energy_increases": 0, "mode": "free"}))
    os.utime(act / "best.pt", (1, 1))
    return w


DATA, TFIDF, PLOT = "experiments.app.data_cli", "experiments.app.tfidf", "experiments.app.plot_energy"
SPLINE = "experiments.studies.spline_probe"
DESCENT, ACT, SBM, BENCH = "experiments.studies.descent", "experiments.studies.activations", "experiments.studies.pyg_sbm", "experiments.studies.bench"
STREAM = "experiments.studies.stream_memory"


def export(dataset, *more):
    return ["export", "--dataset", f"{{ws}}/{dataset}", "--out", "{cwd}/out", *more]


#: (module, argv with {ws} / {cwd} placeholders, words the error line must name)
CASES = [
    # --- experiments.data: datasets given by path
    (DATA, export("one.csv"), ["one.csv", "one class", "'pos'"]),
    (DATA, export("onetrain"), ["onetrain", "training split", "one class", "'a'"]),
    (DATA, export("emptytrain"), ["emptytrain", "training split is empty"]),
    (DATA, export("nan.csv"), ["nan.csv", "record 1", "'nan'"]),
    (DATA, export("inf.jsonl"), ["inf.jsonl", "record 4", "'-inf'"]),
    (DATA, export("nanlit.jsonl"), ["nanlit.jsonl", "record 3", "nan"]),
    (DATA, export("half.jsonl"), ["half.jsonl", "record 2", "0.5"]),
    (DATA, export("listlabel.jsonl"), ["listlabel.jsonl", "record 1", "[1]"]),
    (DATA, export("emptylabel.csv"), ["emptylabel.csv", "record 5", "empty label"]),
    (DATA, export("nocol.csv"), ["nocol.csv", "'label'", "'y'"]),
    (DATA, export("empty.csv"), ["empty.csv", "'text'", "'label'"]),
    (DATA, export("empty.jsonl"), ["empty.jsonl", "no examples"]),
    (DATA, export("latin.jsonl"), ["latin.jsonl", "utf-8"]),
    (DATA, export("badline.jsonl"), ["badline.jsonl:5", "not valid json"]),
    (DATA, export("array.jsonl"), ["array.jsonl", "record 4", "not an object"]),
    (DATA, export("string.json"), ["string.json", "list of objects", "str"]),
    (DATA, export("surrogate.jsonl"), ["surrogate.jsonl", "record 0", "not valid unicode"]),
    (DATA, export("two.csv"), ["at least 3", "2"]),
    (DATA, export("nolabels"), ["labels.json", "non-empty list"]),
    (DATA, export("dir.csv"), ["dir.csv", "train.jsonl"]),
    (DATA, export("notest"), ["notest", "tst.jsonl", "is no split file", "rename tst.jsonl test.jsonl"]),
    (DATA, export("badlabels"), ["labels.json", "cannot read"]),
    (DATA, export("dictlabels"), ["labels.json", "list of label names"]),
    (DATA, export("outofrange"), ["val.jsonl", "record 0", "5", "[0, 2)"]),
    (DATA, export("absent.csv"), ["absent.csv", "not found"]),
    (DATA, ["export", "--dataset", "nope", "--out", "o"], ["unknown dataset", "'nope'", "rotten_tomatoes"]),
    (DATA, ["export", "--dataset", "hf:", "--out", "o"], ["hf:", "needs a dataset name"]),
    (DATA, ["export", "--dataset", "", "--out", "o"], ["--dataset", "empty"]),
    (DATA, export("good.csv", "--text-field", ""), ["--text-field", "empty"]),
    (DATA, export("good.csv", "--label-field", "stars"), ["good.csv", "'stars'", "columns found"]),
    # --- experiments.data: options and folders
    (DATA, export("good.csv", "--seed", "-1"), ["--seed", "-1"]),
    (DATA, export("good.csv", "--seed", "4294967296"), ["--seed", "4294967296", "2**32"]),
    (DATA, export("good.csv", "--seed", "one"), ["--seed", "'one'", "integer"]),
    (DATA, ["export", "--dataset", "{ws}/good.csv", "--out", "{ws}/afile"], ["--out", "afile", "not a folder"]),
    (DATA, ["export", "--dataset", "{ws}/good.csv", "--out", "{ws}/afile/sub"], ["--out", "afile", "not a folder"]),
    (DATA, ["export", "--dataset", "{ws}/good.csv", "--out", ""], ["--out", "empty path"]),
    (DATA, ["export", "--dataset", "{ws}/good.csv", "--out", "a\0b"], ["--out", "not a usable path"]),
    (DATA, ["export", "--dataset", "{ws}/good.csv"], ["--out", "required"]),
    (DATA, ["export", "--dataset", "rotten_tomatoes", "--out", "o", "--data-dir", "{ws}/afile"],
     ["--data-dir", "afile", "not a folder"]),
    (DATA, ["export", "--dataset", "rotten_tomatoes", "--out", "o", "--data-dir", "{ws}/emptydata"],
     ["rotten_tomatoes", "not found", "fetch --dataset rotten_tomatoes"]),
    (DATA, ["export", "--dataset", "rotten_tomatoes", "--out", "o", "--data-dir", "{ws}/rtbad"],
     ["rotten_tomatoes", "corrupt", "--force"]),
    (DATA, ["export", "--dataset", "rotten_tomatoes", "--out", "o", "--data-dir", "{ws}/rtnocol"],
     ["rotten_tomatoes", "corrupt", "'text'"]),
    (DATA, ["export", "--dataset", "crowdflower", "--out", "o", "--data-dir", "{ws}/cfbad"],
     ["crowdflower", "corrupt", "'angry'"]),
    (DATA, ["fetch", "--data-dir", "{ws}/afile"], ["--data-dir", "afile", "not a folder"]),
    (DATA, ["fetch", "--data-dir", "{ws}/afile/sub"], ["--data-dir", "afile", "not a folder"]),
    (DATA, ["fetch", "--dataset", "nope"], ["--dataset", "'nope'", "rotten_tomatoes"]),
    (DATA, ["fetch", "--data-dir", "{ws}/badmanifest", "--dataset", "glove"], ["manifest", "corrupt", "badmanifest"]),
    (DATA, ["refetch"], ["'refetch'", "fetch", "export"]),
    (DATA, [], ["required"]),
    # --- experiments.app.tfidf
    (TFIDF, ["--dataset", "{ws}/one.csv"], ["one.csv", "one class"]),
    (TFIDF, ["--dataset", "{ws}/onetrain"], ["onetrain", "training split", "one class"]),
    (TFIDF, ["--dataset", "{ws}/emptytest"], ["emptytest", "empty: test"]),
    (TFIDF, ["--dataset", "{ws}/nan.csv"], ["nan.csv", "'nan'"]),
    (TFIDF, ["--dataset", "{ws}/nocol.csv"], ["nocol.csv", "'label'"]),
    (TFIDF, ["--dataset", "nope"], ["unknown dataset", "'nope'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--min-df", "0"], ["--min-df", "'0'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--min-df", "1.5"], ["--min-df", "'1.5'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--min-df", "1000"], ["good.csv", "min_df=1000", "no features"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--ngram", "4", "6"], ["good.csv", "4-6-gram", "no features"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--ngram", "2", "1"], ["--ngram", "2", "1"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--ngram", "0", "1"], ["--ngram", "'0'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--ngram", "1"], ["--ngram"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--Cs", "0"], ["--Cs", "'0'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--Cs", "1", "-2"], ["--Cs", "'-2'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--Cs", "nan"], ["--Cs", "'nan'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--Cs", "inf"], ["--Cs", "'inf'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--threads", "0"], ["--threads", "'0'"]),
    (TFIDF, ["--dataset", "{ws}/good.csv", "--seed", "-3"], ["--seed", "'-3'"]),
    (TFIDF, ["--dataset", "rotten_tomatoes", "--data-dir", "{ws}/afile"], ["--data-dir", "not a folder"]),
    # --- experiments.app.plot_energy
    (PLOT, ["{ws}/runs/absent"], ["absent", "does not exist"]),
    (PLOT, ["{ws}/afile"], ["afile", "not a folder"]),
    (PLOT, ["{ws}/runs/notrun"], ["energy_trace.pt", "missing"]),
    (PLOT, ["{ws}/runs/notrace"], ["energy_trace.pt", "missing"]),
    (PLOT, ["{ws}/runs/nohist"], ["history.json", "missing"]),
    (PLOT, ["{ws}/runs/garbagetrace"], ["energy_trace.pt", "cannot be read"]),
    (PLOT, ["{ws}/runs/emptytrace"], ["energy_trace.pt", "cannot be read"]),
    (PLOT, ["{ws}/runs/listtrace"], ["energy_trace.pt", "list", "not an energy trace"]),
    (PLOT, ["{ws}/runs/noenergies"], ["energy_trace.pt", "'energies'"]),
    (PLOT, ["{ws}/runs/emptyenergies"], ["energy_trace.pt", "'energies'", "non-empty"]),
    (PLOT, ["{ws}/runs/vectorenergy"], ["energy_trace.pt", "energies['e']", "(4,)"]),
    (PLOT, ["{ws}/runs/intenergy"], ["energy_trace.pt", "energies['e']", "int64"]),
    (PLOT, ["{ws}/runs/shapes"], ["energy_trace.pt", "energies['f']", "(4, 2)", "(4, 3)"]),
    (PLOT, ["{ws}/runs/emin"], ["energy_trace.pt", "'energy_min'", "(7,)"]),
    (PLOT, ["{ws}/runs/extra"], ["energy_trace.pt", "'extra_layers'", "-1"]),
    (PLOT, ["{ws}/runs/modeint"], ["energy_trace.pt", "'mode'", "3"]),
    (PLOT, ["{ws}/runs/pickled"], ["energy_trace.pt", "evil", "not loaded"]),
    (PLOT, ["{ws}/runs/garbagehist"], ["history.json", "not utf-8"]),
    (PLOT, ["{ws}/runs/texthist"], ["history.json", "not valid json"]),
    (PLOT, ["{ws}/runs/objecthist"], ["history.json", "object", "array"]),
    (PLOT, ["{ws}/runs/emptyhist"], ["history.json", "no epoch"]),
    (PLOT, ["{ws}/runs/keyhist"], ["history.json", "record 0", "val_loss"]),
    (PLOT, ["{ws}/runs/strhist"], ["history.json", "'val_loss'", "'low'"]),
    (PLOT, ["{ws}/runs/listmetrics"], ["metrics.json", "array", "object"]),
    (PLOT, ["{ws}/runs/garbagemetrics"], ["metrics.json"]),
    (PLOT, ["{ws}/runs/namemetrics"], ["metrics.json", "'name'", "['x']"]),
    (PLOT, ["{ws}/runs/accmetrics"], ["metrics.json", "'test_accuracy'", "'high'"]),
    (PLOT, ["{ws}/runs/dirmetrics"], ["metrics.json", "folder"]),
    (PLOT, [], ["run_dir"]),
    (PLOT, ["{ws}/runs/notrun", "{ws}/runs/nohist"], ["unrecognized", "nohist"]),
    # --- experiments.studies.spline_probe: options
    (SPLINE, ["--attention", "relu", "--t-max", "0"], ["--t-max", "'0'"]),
    (SPLINE, ["--attention", "relu", "--t-max", "-3"], ["--t-max", "'-3'"]),
    (SPLINE, ["--attention", "relu", "--t-max", "nan"], ["--t-max", "'nan'"]),
    (SPLINE, ["--attention", "relu", "--t-max", "inf"], ["--t-max", "'inf'"]),
    (SPLINE, ["--attention", "relu", "--tol", "nan"], ["--tol", "'nan'"]),
    (SPLINE, ["--attention", "relu", "--tol", "0"], ["--tol", "'0'"]),
    (SPLINE, ["--attention", "relu", "--tol=-1e-9"], ["--tol", "'-1e-9'"]),
    (SPLINE, ["--attention", "relu", "--tol", "1"], ["--tol", "'1'"]),
    (SPLINE, ["--attention", "relu", "--tol", "1e-20"], ["--tol", "'1e-20'", "round-off"]),
    (SPLINE, ["--attention", "relu", "--max-degree", "-1"], ["--max-degree", "'-1'"]),
    (SPLINE, ["--attention", "relu", "--max-degree", "1000000"], ["--max-degree", "'1000000'", "100"]),
    (SPLINE, ["--attention", "relu", "--max-degree", "2.5"], ["--max-degree", "'2.5'"]),
    (SPLINE, ["--attention", "relu", "--n", "0"], ["--n", "'0'"]),
    (SPLINE, ["--config", CONFIG, "--layers", "0"], ["--layers", "'0'"]),
    (SPLINE, ["--config", CONFIG, "--layers", "-2"], ["--layers", "'-2'"]),
    (SPLINE, ["--attention", "relu", "--seed", "-1"], ["--seed", "'-1'"]),
    (SPLINE, ["--attention", "relu", "--seed", str(2 ** 63)], ["--seed", str(2 ** 63)]),
    (SPLINE, ["--attention", "gelu"], ["--attention", "'gelu'"]),
    (SPLINE, ["--n", "3"], ["--attention", "--config", "--checkpoint", "required"]),
    (SPLINE, ["--attention", "relu", "--config", CONFIG], ["--config", "not allowed", "--attention"]),
    (SPLINE, ["--attention", "relu", "model.d=4"], ["model.d=4", "--config"]),
    (SPLINE, ["--config", CONFIG, "--causal"], ["--causal", "--attention"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/list.pt", "--cross", "x"], ["--cross", "--attention"]),
    (SPLINE, ["--attention", "softmax", "--layers", "2"], ["--layers", "--attention"]),
    # --- experiments.studies.spline_probe: files
    (SPLINE, ["--config", "{ws}/absent.yaml"], ["absent.yaml", "missing"]),
    (SPLINE, ["--config", "{ws}/bad.yaml"], ["bad.yaml", "not valid yaml"]),
    (SPLINE, ["--config", "{ws}/list.yaml"], ["list.yaml", "mapping"]),
    (SPLINE, ["--config", "{ws}/latin.jsonl"], ["latin.jsonl", "utf-8"]),
    (SPLINE, ["--config", CONFIG, "model.nope=1"], ["model.nope"]),
    (SPLINE, ["--config", CONFIG, "model.d=-4"], ["model.d"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/absent.pt"], ["absent.pt", "no such file"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/folder.pt"], ["folder.pt", "no such file"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/garbage.pt"], ["garbage.pt", "cannot be read"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/empty.pt"], ["empty.pt", "cannot be read"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/list.pt"], ["list.pt", "list", "not a model checkpoint"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/noconfig.pt"], ["noconfig.pt", "'config'"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/strconfig.pt"], ["strconfig.pt", "'config'", "str"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/listmodel.pt"], ["listmodel.pt", "'model'", "state dict"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/noembed.pt"], ["noembed.pt", "'embed.weight'"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/nan.pt"], ["nan.pt", "embed.weight", "nan"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/badconfig.pt"], ["badconfig.pt", "model.d"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/misfit.pt"], ["misfit.pt", "do not fit"]),
    (SPLINE, ["--checkpoint", "{ws}/ck/pickled.pt"], ["pickled.pt", "evil", "not loaded"]),
    # --- experiments.studies.descent
    (DESCENT, ["--samples", "0"], ["--samples", "'0'"]),
    (DESCENT, ["--layers", "-1"], ["--layers", "'-1'"]),
    (DESCENT, ["--n", "1"], ["--n", "'1'", "pairs"]),
    (DESCENT, ["--n", "ten"], ["--n", "'ten'"]),
    (DESCENT, ["--d", "0"], ["--d", "'0'"]),
    (DESCENT, ["--seed", "-1"], ["--seed", "'-1'"]),
    (DESCENT, ["--seed", str(2 ** 64)], ["--seed"]),
    (DESCENT, ["--out", "{ws}/afile"], ["--out", "afile", "not a folder"]),
    (DESCENT, ["--out", "{ws}/afile/x"], ["--out", "afile", "not a folder"]),
    # --- experiments.studies.activations (refused before any training)
    (ACT, ["--epochs", "0"], ["--epochs", "'0'"]),
    (ACT, ["--epochs", "two"], ["--epochs", "'two'"]),
    (ACT, ["--probe-n", "0"], ["--probe-n", "'0'"]),
    (ACT, ["--only", "mm-gelu"], ["--only", "'mm-gelu'", "mm-relu"]),
    (ACT, ["--out", "{ws}/afile"], ["--out", "afile", "not a folder"]),
    (ACT, ["--set", "model.nope=1"], ["model.nope"]),
    (ACT, ["--set", "model.layers=-1"], ["model.layers"]),
    (ACT, ["--set", "nokey"], ["nokey", "section.key=value"]),
    (ACT, ["--out", "{ws}/act", "--only", "std-softmax"], ["metrics.json", "'test_accuracy'", "'high'"]),
    # --- experiments.studies.pyg_sbm
    (SBM, ["--layers", "0"], ["--layers", "'0'"]),
    (SBM, ["--layers", "x"], ["--layers", "'x'"]),
    (SBM, ["--epochs", "0"], ["--epochs", "'0'"]),
    (SBM, ["--epochs", "-5"], ["--epochs", "'-5'"]),
    (SBM, ["--seed", "-1"], ["--seed", "'-1'"]),
    # --- experiments.studies.bench
    (STREAM, ["--size-mb", "0"], ["--size-mb", "0"]),
    (STREAM, ["--tokenizer", "words"], ["--tokenizer", "'words'"]),
    (STREAM, ["--tokenizer", "bpe:3"], ["--tokenizer", "'bpe:3'"]),
    (STREAM, ["--batch-size", "0"], ["--batch-size", "0"]),
    (STREAM, ["--quick", "--out", "no/such/folder/x.json"], ["--out", "no/such/folder/x.json"]),
    (BENCH, ["nope"], ["suite", "'nope'", "energy"]),
    (BENCH, [], ["suite", "required"]),
    (BENCH, ["energy", "--device", "foo"], ["--device", "'foo'"]),
    (BENCH, ["energy", "--device", "meta"], ["--device", "'meta'"]),
    (BENCH, ["energy", "--device", "cpu:3"], ["--device", "'cpu:3'"]),
    (BENCH, ["energy", "--device", "cuda:99"], ["--device", "'cuda:99'"]),
]


def _fill(value, ws, cwd):
    return value.replace("{ws}", str(ws)).replace("{cwd}", str(cwd))


@pytest.mark.parametrize("module, argv, names", CASES,
                         ids=[f"{m.split('.')[-1]}-{i}-{' '.join(a)[-60:]}" for i, (m, a, _) in enumerate(CASES)])
def test_refused(module, argv, names, ws, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    expect_refusal(module, [_fill(a, ws, cwd) for a in argv], str(cwd),
                   names=[_fill(n, ws, cwd) for n in names], watch=[str(ws)])


def test_enough_distinct_cases():
    assert len({(m, tuple(a)) for m, a, _ in CASES}) == len(CASES) >= 90


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_output_folder(ws, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        expect_refusal(DATA, ["export", "--dataset", str(ws / "good.csv"), "--out", str(locked / "o")], str(tmp_path),
                       names=["--out", "not writable"])
        expect_refusal(DATA, ["fetch", "--data-dir", str(locked)], str(tmp_path), names=["--data-dir", "not writable"])
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc (no folder can be made there)")
@pytest.mark.parametrize("out", ["/proc/unfold-export", "/proc/unfold-new/export"])
def test_export_into_a_folder_that_cannot_be_made(ws, tmp_path, out):
    expect_refusal(DATA, ["export", "--dataset", str(ws / "good.csv"), "--out", out], str(tmp_path), names=[out])


# --------------------------------------------------------------------------------------------
# Positive controls of the CLIs above: the same tools accept good input
# --------------------------------------------------------------------------------------------

def test_export_good_file_and_all_or_nothing(ws, tmp_path, monkeypatch):
    out = tmp_path / "deep" / "out"
    code, stdout, err = run_cli(DATA, ["export", "--dataset", str(ws / "good.csv"), "--out", str(out)], str(tmp_path))
    assert code == 0, err
    assert sorted(os.listdir(out)) == ["labels.json", "test.jsonl", "train.jsonl", "val.jsonl"]
    back = load_dataset(str(out))
    assert back.label_names == ["neg", "pos"] and sum(back.sizes().values()) == len(TEXTS)
    # a failure while writing the third file leaves no folder (and no parent made for it) behind
    calls = []
    real = F.atomic_write_bytes

    def flaky(path, data):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(F, "atomic_write_bytes", flaky)             # looked up by F.export
    fresh = tmp_path / "new" / "parents" / "out"
    line = expect_refusal(DATA, ["export", "--dataset", str(ws / "good.csv"), "--out", str(fresh)], str(tmp_path),
                          names=["no space left"], writes=True)
    assert line and not (tmp_path / "new").exists()
    calls.clear()
    before = {p: p.read_bytes() for p in out.iterdir()}
    expect_refusal(DATA, ["export", "--dataset", str(ws / "good.csv"), "--out", str(out), "--seed", "5",
                          "--overwrite"], str(tmp_path), names=["no space left"], writes=True)
    assert {p: p.read_bytes() for p in out.iterdir()} == before and sorted(os.listdir(tmp_path)) == ["deep"]


def test_plot_energy_draws_a_good_run(ws, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"energies": {"E": torch.randn(4, 3, dtype=torch.float64), "F": torch.full((4, 3), float("nan"))},
                "energy_min": torch.randn(4, dtype=torch.float64), "extra_layers": 32, "mode": "guaranteed",
                "dtype": "float64"}, run / "energy_trace.pt")
    (run / "history.json").write_text(json.dumps([{"epoch": 1, "train_loss": 0.7, "val_loss": "nan",
                                                    "train_accuracy": 0.5, "val_accuracy": 0.5}]))
    (run / "metrics.json").write_text(json.dumps({"name": "a$b", "test_accuracy": "nan"}))
    code, out, err = run_cli(PLOT, [str(run)], str(tmp_path))
    assert code == 0, err
    assert (run / "energy_descent.png").stat().st_size > 0 and (run / "training_curves.png").stat().st_size > 0


# --------------------------------------------------------------------------------------------
# One class: refused by the loader and by the TF-IDF baseline
# --------------------------------------------------------------------------------------------

def test_one_class_dataset_is_refused(ws):
    with pytest.raises(DataError, match=r"one\.csv holds one class only \('pos', 12 examples\)"):
        load_dataset(str(ws / "one.csv"))
    with pytest.raises(DataError, match=r"onetrain: its training split holds one class only \('a', 8 examples\)"):
        load_dataset(str(ws / "onetrain"))
    good = load_dataset(str(ws / "good.csv"))                       # positive control
    assert good.num_classes == 2 and len({lab for _, lab in good.train}) == 2


def test_one_class_in_training_split_of_a_file(tmp_path):
    """A file with two classes whose seeded split puts the only example of one class outside training."""
    rows = [(f"text {i}", "a") for i in range(9)] + [("text 9", "b")]
    path = tmp_path / "rare.csv"
    path.write_text(csv_text(rows))
    seeds = {s: any(lab == "b" for _, lab in D.split_examples(rows, s)[0]) for s in range(20)}
    bad, ok = next(s for s, has_b in seeds.items() if not has_b), next(s for s, has_b in seeds.items() if has_b)
    with pytest.raises(DataError, match=r"rare\.csv: its training split holds one class only \('a'"):
        load_dataset(str(path), seed=bad)
    assert load_dataset(str(path), seed=ok).num_classes == 2       # positive control


def test_tfidf_refuses_one_class_training_data():
    train = [(f"good text {i}", 0) for i in range(8)]
    one = Splits(train, [("bad text", 1)], [("good text x", 0)], 2, ["neg", "pos"], "toy")
    with pytest.raises(DataError, match=r"toy: its training split holds one class only \('neg'"):
        T.tfidf_logreg(one, Cs=(1,))
    two = Splits(train[:4] + [(f"bad text {i}", 1) for i in range(4)], [("bad text", 1)], [("good text x", 0)], 2,
                 ["neg", "pos"], "toy")
    res = T.tfidf_logreg(two, Cs=(1,))                               # positive control
    assert res["test_accuracy"] == 1.0 and res["val_accuracy"] == 1.0
    with pytest.raises(DataError, match="empty: test"):
        T.tfidf_logreg(Splits(two.train, two.val, [], 2, ["neg", "pos"], "toy"), Cs=(1,))


# --------------------------------------------------------------------------------------------
# GloVe files: 1 + 50 columns a line, finite numbers
# --------------------------------------------------------------------------------------------

WORDS = ["the", "film", "good"]


def write_glove(root, vocab_text=None, emb=None):
    (root / "glove").mkdir(parents=True, exist_ok=True)
    if emb is None:
        emb = np.random.RandomState(0).randn(len(WORDS), 50).astype(np.float32)
    np.save(root / D.GLOVE_EMB, emb)
    (root / D.GLOVE_VOCAB).write_text("\n".join(WORDS) + "\n" if vocab_text is None else vocab_text, encoding="utf-8",
                                      newline="")


VOCAB = Vocab.build([WORDS + ["unseen"]])


def test_glove_good_files_load(tmp_path):
    write_glove(tmp_path)
    weights, coverage = load_glove(VOCAB, data_dir=tmp_path)
    assert weights.shape == (len(VOCAB), 50) and coverage == 0.75


@pytest.mark.parametrize("vocab_text, words", [
    ("the " + " ".join(["0.1"] * 50) + "\nfilm\ngood\n", ["line 1", "51 columns"]),      # a GloVe text line
    ("the\nfilm 0.5\ngood\n", ["line 2", "2 columns"]),
    ("the\n\ngood\n", ["line 2", "is empty"]),
    ("the\nfilm\ngood \n", ["line 3", "whitespace around", "'good '"]),
    ("the\nfilm\tx\ngood\n", ["line 2", "2 columns"]),
    ("the\nfilm\u00a0x\ngood\n", ["line 2", "2 columns"]),                              # no-break space
])
def test_glove_vocabulary_line_with_wrong_columns(tmp_path, vocab_text, words):
    write_glove(tmp_path, vocab_text=vocab_text)
    with pytest.raises(DataError) as exc:
        load_glove(VOCAB, data_dir=tmp_path)
    assert str(tmp_path / D.GLOVE_VOCAB) in str(exc.value)
    for w in words:
        assert w in str(exc.value)


@pytest.mark.parametrize("emb, words", [
    (np.zeros((3, 49), np.float32), ["(3, 49)", "50 values"]),
    (np.zeros((3, 51), np.float32), ["(3, 51)", "50 values"]),
    (np.zeros(150, np.float32), ["(150,)"]),
    (np.array([["x"] * 50] * 3), ["<U1", "not numbers"]),
    (np.ones((3, 50), bool), ["bool", "not numbers"]),
    (np.ones((2, 50), np.float32), ["(2, 50) for 3 words"]),
])
def test_glove_matrix_of_wrong_shape_or_kind(tmp_path, emb, words):
    write_glove(tmp_path, emb=emb)
    with pytest.raises(DataError) as exc:
        load_glove(VOCAB, data_dir=tmp_path)
    assert str(tmp_path / D.GLOVE_EMB) in str(exc.value)
    for w in words:
        assert w in str(exc.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_glove_non_finite_value_names_line_and_word(tmp_path, bad):
    emb = np.ones((3, 50), np.float32)
    emb[1, 7] = bad
    write_glove(tmp_path, emb=emb)
    with pytest.raises(DataError) as exc:
        load_glove(VOCAB, data_dir=tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / D.GLOVE_EMB) in msg and "line 2 (word 'film')" in msg and "column 8" in msg
    assert str(bad) in msg
