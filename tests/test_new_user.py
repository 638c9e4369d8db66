"""The newcomer's path, as a new user would go: the console commands only, in an empty folder.

1. Their own CSV with other column names: the refusal names the keys that fix it (exit 2, nothing written), and the
   fix, pasted, trains.
2. Configs that compose: an ``extends:`` chain of two files of their own, overrides on both sides of ``--run-dir``;
   ``--print-config`` shows exactly what the run then stores.
3. Predicting: a text of unknown words only is flagged (JSON and a warning); lines on stdin stream (the first result
   arrives while stdin is still open).
4. The same training command pasted again: exit 0, and the finished run byte-identical.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from test_rerun_and_progress import snapshot as _snapshot

BIN = os.path.dirname(sys.executable)


def _command(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not installed beside {sys.executable} (pip install -e .)")
    return path


def _run(name, *args, cwd, stdin=None, timeout=300):
    return subprocess.run([_command(name), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          input=stdin, timeout=timeout)


def _write_csv(path, rows=600, seed=0):
    rng = random.Random(seed)
    good, bad = "great superb moving delightful brilliant".split(), "dull awful tedious clumsy boring".split()
    filler = "the film a story plot actors scene with and of this".split()
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("body,topic\n")
        for i in range(rows):
            words = rng.sample(filler, 6) + rng.sample(good if i % 2 == 0 else bad, 2)
            rng.shuffle(words)
            fh.write(f"{' '.join(words)},{'positive' if i % 2 == 0 else 'negative'}\n")


def _uncommented(text):
    return yaml.safe_load("\n".join(line.split(" #")[0] for line in text.splitlines()))


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    home = tmp_path_factory.mktemp("new-user")
    _write_csv(home / "reviews.csv")
    (home / "base.yaml").write_text("extends: tiny\ndata:\n  glove: none\ntrain:\n  epochs: 6\n  batch_size: 32\n")
    (home / "mine.yaml").write_text("extends: base.yaml\ntrain:\n  lr: 0.005\n  progress: false\n")
    return home


def test_own_csv_refused_with_the_keys_then_trained(user):
    refused = _run("unfold-train", "--config", "tiny", "data.dataset=reviews.csv", "data.glove=none",
                   "--run-dir", "runs/first", cwd=user)
    assert refused.returncode == 2
    assert "data.text_field=body data.label_field=topic" in refused.stderr, refused.stderr[-2000:]
    assert not (user / "runs" / "first").exists()                        # nothing written
    fixed = _run("unfold-train", "--config", "tiny", "data.dataset=reviews.csv", "data.glove=none",
                 "data.text_field=body", "data.label_field=topic", "train.epochs=1", "train.progress=false",
                 "--run-dir", "runs/first", cwd=user)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert json.loads(fixed.stdout.splitlines()[-1])["energy_verdict"] == "descent"


@pytest.fixture(scope="module")
def composed(user):
    """The chain mine.yaml -> base.yaml -> tiny, with overrides before and after --run-dir."""
    args = ["--config", "mine.yaml", "data.dataset=reviews.csv", "data.text_field=body", "--run-dir", "runs/mine",
            "data.label_field=topic", "model.layers=3"]
    printed = _run("unfold-train", *args, "--print-config", cwd=user)
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert not (user / "runs" / "mine").exists()                          # --print-config writes nothing
    trained = _run("unfold-train", *args, cwd=user)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return args, printed, trained


def test_an_extends_chain_with_overrides_on_both_sides_trains(user, composed):
    _, _, trained = composed
    metrics = json.loads((user / "runs" / "mine" / "metrics.json").read_text())
    assert metrics["name"] == "mine" and metrics["energy_verdict"] == "descent"
    assert metrics["test_accuracy"] > metrics["majority_class_accuracy"] + 0.2      # this chain's model learns
    stored = yaml.safe_load((user / "runs" / "mine" / "config.yaml").read_text())
    assert stored["model"]["layers"] == 3 and stored["train"]["lr"] == 0.005 and stored["train"]["epochs"] == 6
    assert stored["data"]["glove"] == "none" and stored["model"]["d"] == 16           # from base.yaml, from tiny


def test_print_config_is_what_the_run_stores(user, composed):
    _, printed, _ = composed
    stored = yaml.safe_load((user / "runs" / "mine" / "config.yaml").read_text())
    assert _uncommented(printed.stdout) == stored
    assert "# override" in printed.stdout and "# config" in printed.stdout and "# default" in printed.stdout


def test_an_all_unknown_text_is_flagged(user, composed):
    proc = _run("unfold-predict", "runs/mine", "--text", "zzz qqq xyzzy", "--text", "a brilliant moving film",
                "--json", cwd=user)
    assert proc.returncode == 0, proc.stderr[-2000:]
    unknown, known = (json.loads(line) for line in proc.stdout.splitlines())
    assert unknown["unknown_tokens"] == unknown["tokens"] == 3
    assert known["unknown_tokens"] == 0
    assert "zzz qqq xyzzy" in proc.stderr and "prior" in proc.stderr                 # the warning names the text


def test_stdin_lines_stream(user, composed):
    """The first result is read back while stdin is still open: predictions are not held until the end."""
    proc = subprocess.Popen([_command("unfold-predict"), "runs/mine", "--file", "-", "--json"], cwd=user,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start = time.perf_counter()
        proc.stdin.write("a brilliant moving film\n" * 64)     # one batch
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())
        latency = time.perf_counter() - start
        assert proc.poll() is None                            # still running: stdin is open
        assert first["label"] == "positive"
        proc.stdin.write("dull and tedious\n")
        proc.stdin.close()
        rest = proc.stdout.read().splitlines()
        assert proc.wait(timeout=120) == 0
        assert len(rest) == 64                                # 63 more of the first batch, and the last line
        assert json.loads(rest[-1])["label"] == "negative"
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"first line after {latency:.2f} s")


def test_the_same_command_again_leaves_the_run_byte_identical(user, composed):
    args, _, first = composed
    before = _snapshot(user / "runs" / "mine")
    again = _run("unfold-train", *args, cwd=user)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already holds this finished run" in again.stderr
    assert json.loads(again.stdout.splitlines()[-1]) == json.loads(first.stdout.splitlines()[-1])
    assert _snapshot(user / "runs" / "mine") == before
    shutil.rmtree(user / "runs" / "first", ignore_errors=True)
