"""A result no better than the majority class is said plainly, in the log and in ``metrics.json``
(``majority_class_accuracy``, ``no_better_than_majority``), with the exit code unchanged."""
import json
import os

import torch
from clifuzz import run_cli
from test_train import CONFIGS, ROOT, synthetic_text_dir

from experiments.app.tasks.classify import majority_class_accuracy

WARNING = "is no better than always predicting the test set's most frequent class"


def test_majority_class_accuracy():
    assert majority_class_accuracy([("a", 0), ("b", 1), ("c", 1), ("d", 2)]) == 0.5
    assert majority_class_accuracy([]) == 0.0


def _train(tmp_path, data, *extra):
    """``(metrics, log)`` of a tiny run of the trainer's main, called in this process (its thread count
    restored after)."""
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        code, _, log = run_cli("experiments.app.train", [
            "--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
            "data.glove=none", "train.batch_size=32", "train.progress=false", "model.layers=2", "train.device=cpu",
            *extra], ROOT)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, log[-3000:]                                        # exit code unchanged either way
    return json.loads((run / "metrics.json").read_text()), log


def test_a_model_no_better_than_the_majority_class_is_flagged(tmp_path):
    data = synthetic_text_dir(tmp_path / "toy", n_train=96, n_eval=40)
    test = os.path.join(data, "test.jsonl")
    with open(test) as f:                                  # a test split of one class: majority accuracy 1.0, which
        rows = [json.loads(line) for line in f]            # no model exceeds, whatever it learned
    with open(test, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["label"] == rows[0]["label"])
    metrics, log = _train(tmp_path, data, "train.epochs=1", "train.lr=1e-9")
    assert metrics["majority_class_accuracy"] == 1.0
    assert metrics["no_better_than_majority"] is True
    assert sum(WARNING in line for line in log.splitlines()) == 1, log[-3000:]


def test_a_model_that_learns_is_not_flagged(tmp_path):
    data = synthetic_text_dir(tmp_path / "toy", n_train=320, n_eval=64)
    metrics, log = _train(tmp_path, data, "train.epochs=8", "train.lr=0.005")
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"] + 0.2, metrics
    assert 0.3 < metrics["majority_class_accuracy"] < 0.7
    assert metrics["no_better_than_majority"] is False
    assert WARNING not in log
