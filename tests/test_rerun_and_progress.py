"""A run says what it is doing within seconds of its start (data, vocabulary, the untrained
descent check with a progress bar), and the same training command pasted again over its finished run says what is
there and how to train again, exits 0 and leaves the run byte-identical; another config is refused naming keys."""
import hashlib
import json
import os

import pytest
from test_train import CONFIGS, run_train, synthetic_text_dir


def _args(run, data, *extra):
    return ["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
            "data.glove=none", "train.progress=false", "train.epochs=1", "train.device=cpu", *extra]


def snapshot(folder):
    """Every file under ``folder`` (the lock included) with its bytes' sha256 and its mtime."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = (hashlib.sha256(fh.read()).hexdigest(),
                                                      os.stat(path).st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rerun")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    run = tmp / "run"
    proc = run_train(_args(run, data))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, data, proc


def test_progress_is_said_from_the_start(finished):
    _, data, proc = finished
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0] == f"reading data.dataset={data} ...", lines[:3]
    assert lines[1].startswith("read ") and "train/val/test examples, 2 classes" in lines[1]
    assert lines[2].startswith("vocabulary: ")
    untrained = next(i for i, line in enumerate(lines) if "checking the descent of the untrained model" in line)
    epoch = next(i for i, line in enumerate(lines) if line.startswith("epoch 1:"))
    assert untrained < epoch
    assert any("checking the descent of the trained model" in line for line in lines[epoch:])


def test_the_same_command_again_leaves_the_finished_run_untouched(finished):
    run, data, first = finished
    before = snapshot(run)
    again = run_train(_args(run, data))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already holds this finished run (same config" in again.stderr
    assert "--run-dir NEW_FOLDER" in again.stderr and "--overwrite" in again.stderr
    assert "error" not in again.stderr.lower() and "Traceback" not in again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == json.loads(first.stdout.splitlines()[-1])
    assert snapshot(run) == before                      # bytes and times: nothing read-write was opened


def test_another_config_over_a_finished_run_is_refused_naming_keys(finished):
    run, data, _ = finished
    before = snapshot(run)
    other = run_train(_args(run, data, "model.layers=3", "train.lr=0.5"))
    assert other.returncode == 2
    assert "holds a finished run of another config: model.layers (2 there, 3 now), train.lr" in other.stderr
    assert snapshot(run) == before


def test_overwrite_still_retrains(finished, tmp_path):
    """The shortcut is only for a plain re-paste: --overwrite goes on to train (into a copy here)."""
    import shutil

    run, data, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    proc = run_train(_args(copy, data, "--overwrite"))
    assert proc.returncode == 0 and "already holds this finished run" not in proc.stderr
    assert "epoch 1:" in proc.stderr
