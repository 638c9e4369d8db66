"""The shipped ``tiny`` config learns: trained as shipped on rotten_tomatoes, its test accuracy is clearly above the test split's
most frequent class (``metrics.json``: ``majority_class_accuracy``), and it stays quick.

Measured with 3 seeds (README / the config's comment): 0.71 against 0.58-0.60. Skipped where the rotten_tomatoes
file is not in the data folder (the suite never downloads)."""
import json
import os

import pytest

from experiments.app.config import load_config
from experiments.data.corpora import RT_FILE
from experiments.data.store import data_dir
from tests.test_train import run_train


def test_tiny_is_small_and_quick_as_shipped():
    cfg = load_config("tiny")
    assert cfg["name"] == "tiny" and cfg["data"]["glove"] == "none"          # no GloVe file needed
    assert cfg["model"]["d"] <= 16 and cfg["model"]["layers"] <= 2 and cfg["train"]["epochs"] <= 2


@pytest.mark.skipif(not (data_dir() / RT_FILE).is_file(), reason=f"no {RT_FILE} in the data folder")
def test_tiny_learns_rotten_tomatoes(tmp_path):
    run = tmp_path / "run"
    proc = run_train(["--config", "tiny", "--run-dir", str(run), "train.progress=false"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["no_better_than_majority"] is False, metrics
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"] + 0.05, metrics
    assert metrics["train_seconds"] < 60, metrics                               # seconds, not minutes
    assert "no better than always predicting" not in proc.stderr
    assert os.path.isfile(run / "best.pt")
