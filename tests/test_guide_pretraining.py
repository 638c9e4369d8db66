"""The guide ``docs/guides/pretraining.md`` runs as written, and its results table is the one generated from
``docs/pretraining/results.json`` (never typed by hand); the study's table and JSON agree (a drifted number is
caught: the negative control)."""
import copy
import json
import os
import re
import subprocess
import sys

import pytest

from experiments.studies.pretraining import markdown

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guides", "pretraining.md")
RESULTS = os.path.join(ROOT, "docs", "pretraining", "results.json")
BLOCK = re.compile(r"<!-- run -->\n```sh\n(.*?)\n```", re.S)
TABLE = re.compile(r"<!-- results:begin -->\n(.*?)<!-- results:end -->", re.S)


def _guide() -> str:
    with open(GUIDE, encoding="utf-8") as fh:
        return fh.read()


def test_the_small_run_of_both_stages_runs_as_written(tmp_path):
    (code,) = BLOCK.findall(_guide())
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exit 2" in proc.stdout and "model.d=24 (the pretrained run has 16)" in proc.stderr
    assert not (tmp_path / "refused").exists()
    fine = json.loads((tmp_path / "fine" / "metrics.json").read_text())
    pre = json.loads((tmp_path / "pre" / "metrics.json").read_text())
    assert pre["task"] == "masked_tokens" and fine["init_from"] == "pre"
    assert fine["energy_increases"] == pre["energy_increases"] == 0
    assert fine["train_energy_increases"] == pre["train_energy_increases"] == 0
    streamed = json.loads((tmp_path / "pre_file" / "metrics.json").read_text())
    assert streamed["texts"] == "texts.txt" and streamed["pretrain_texts"] + streamed["heldout_texts"] == 160


def _results():
    with open(RESULTS, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.skipif(not os.path.exists(RESULTS), reason="no results file committed")
def test_the_guides_table_is_generated_from_the_results_json():
    (table,) = TABLE.findall(_guide())
    results = _results()
    assert table == markdown(results)
    drifted = copy.deepcopy(results)                       # negative control: one number changed is caught
    row = next(iter(next(iter(drifted["results"].values())).values()))
    row["pretrained"]["mean"] += 0.001
    assert markdown(drifted) != table


@pytest.mark.skipif(not os.path.exists(RESULTS), reason="no results file committed")
def test_every_guaranteed_run_descended():
    for dataset, modes in _results()["results"].items():
        row = modes.get("guaranteed")
        if row is not None:
            assert sum(row["energy_increases"].values()) == 0, dataset


def test_a_sweep_counts_a_finished_masked_token_run_and_still_asks_a_classifier_for_its_test_score():
    from experiments.app.sweep import metrics_problem

    assert metrics_problem({"task": "masked_tokens", "val_accuracy": 0.1, "masked_accuracy": 0.1}) is None
    assert metrics_problem({"task": "classify", "val_accuracy": 0.7}) == "has no 'test_accuracy'"
    assert metrics_problem({"val_accuracy": 0.7}) == "has no 'test_accuracy'"      # configs before tasks
    assert "val_accuracy" in metrics_problem({"task": "masked_tokens"})


def test_the_study_runs_in_parts_into_one_file(tmp_path, monkeypatch):
    from experiments.studies import pretraining as S

    rows = []

    def fake_pair(root, dataset, mode, seeds, overrides=(), configs=None, say=print):
        rows.append((dataset, mode, tuple(seeds)))
        return {"seeds": list(seeds), "scratch": {"mean": 0.5, "std": None, "values": [0.5]},
                "pretrained": {"mean": 0.6, "std": None, "values": [0.6]},
                "pretrain_seconds": {"mean": 1.0, "std": None, "values": [1.0]},
                "masked_accuracy": {"mean": 0.1, "std": None, "values": [0.1]},
                "energy_increases": {"pretrain": 0, "scratch": 0, "pretrained": 0}}

    monkeypatch.setattr(S, "run_pair", fake_pair)
    out = str(tmp_path / "r.json")
    assert S.main(["--datasets", "rotten_tomatoes", "--seeds", "3", "--out", out]) == 0
    assert S.main(["--datasets", "listops", "--modes", "baseline", "--seeds", "1", "--out", out]) == 0
    doc = json.loads(open(out).read())["results"]
    assert {d: sorted(m) for d, m in doc.items()} == {"rotten_tomatoes": ["baseline", "guaranteed"],
                                                      "listops": ["baseline"]}
    assert doc["rotten_tomatoes"]["guaranteed"]["seeds"] == [0, 1, 2] and doc["listops"]["baseline"]["seeds"] == [0]
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert S.main(["--datasets", "listops", "--out", str(tmp_path / "bad.json")]) == 2       # not results: refused
    assert rows == [("rotten_tomatoes", "guaranteed", (0, 1, 2)), ("rotten_tomatoes", "baseline", (0, 1, 2)),
                    ("listops", "baseline", (0,))]


def test_a_row_reads_each_runs_metrics_and_history(tmp_path, monkeypatch):
    """run_pair's row from finished runs: accuracies, parameter count, the scratch runs' last-epoch training accuracy
    (a run without history.json counts as none), and every increase; the table prints the parameter count."""
    from experiments.app.sweep import seed_dir
    from experiments.studies import pretraining as S

    monkeypatch.setattr(S, "run_sweep", lambda *a, **k: None)
    where = tmp_path / "listops" / "guaranteed"

    def finished(kind, seed, metrics, train_accuracy=None):
        folder = seed_dir(str(where / kind), seed)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "metrics.json"), "w") as fh:
            json.dump(metrics, fh)
        if train_accuracy is not None:
            with open(os.path.join(folder, "history.json"), "w") as fh:
                json.dump([{"epoch": e, "train_loss": 1.0, "val_loss": 1.0, "train_accuracy": a, "val_accuracy": 0.1}
                       for e, a in ((1, 0.1), (2, train_accuracy))], fh)

    for s in (0, 1):
        finished("pretrain", s, {"task": "masked_tokens", "train_seconds": 10.0 + s, "masked_accuracy": 0.2,
                                 "unigram_masked_accuracy": 0.1, "train_energy_increases": s})
        finished("scratch", s, {"test_accuracy": 0.3 + s / 10, "params": 1234}, 0.5 if s == 0 else None)
        finished(f"pretrained-s{s}", s, {"test_accuracy": 0.4, "params": 1234, "energy_increases": 2})
    row = S.run_pair(str(tmp_path), "listops", "guaranteed", [0, 1], say=lambda *a: None)
    assert row["params"] == 1234 and row["scratch_train_accuracy"]["values"] == [0.5]
    assert row["scratch"]["values"] == [0.3, 0.4] and row["pretrain_seconds"]["mean"] == 10.5
    assert row["energy_increases"] == {"pretrain": 1, "scratch": 0, "pretrained": 4}
    table = S.markdown({"results": {"listops": {"guaranteed": row}}})
    assert "| listops | guaranteed | 1,234 | 35.00 ± 7.07 | 40.00 ± 0.00 |" in table
