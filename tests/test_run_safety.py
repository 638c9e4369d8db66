"""Runs that never lose work: safe loading (weights_only=True), a kill at every stage of a checkpoint save
(real process exits), a corrupt last checkpoint that must not replace the good one, and one run per folder."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from energies.errors import CheckpointError
from experiments.app import checkpoint as C
from experiments.runfolder.runlock import RunFolderError, RunLock, check_fresh
from test_train import CONFIGS, ROOT, run_train, synthetic_text_dir


def state(tag: float):
    """A minimal checkpoint with every required key; ``tag`` tells two of them apart."""
    return {"model": {"w": torch.full((3,), tag)}, "optimizer": {}, "scheduler": {}, "torch_rng": torch.get_rng_state(),
            "data_rng": torch.get_rng_state(), "epoch": int(tag), "config": {"name": "t"}}


class Payload:
    """Not a plain container: weights_only=True must refuse to load it."""

    def __init__(self):
        self.x = 1


def test_safe_load_refuses_objects_that_could_run_code(tmp_path):
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save(state(1.0), good)
    torch.save({"model": Payload()}, bad)
    assert C.safe_load(str(good))["epoch"] == 1
    with pytest.raises(CheckpointError, match="not loaded .*loading could execute code"):
        C.safe_load(str(bad))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint"):
        C.safe_load(str(tmp_path / "junk.pt"))
    with pytest.raises(CheckpointError, match="no such file"):
        C.safe_load(str(tmp_path / "none.pt"))


KILL = r"""
import os, sys, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, os.path.join({root!r}, "tests"))
from experiments.app import checkpoint as C
from test_run_safety import state

class Bomb:
    def __reduce__(self):          # pickled in the middle of torch.save: the process dies mid-write
        os._exit(9)

stage = {stage!r}
if stage == "writing":
    new = state(3.0); new["model"]["bomb"] = Bomb()
else:
    new = state(3.0)
    C.STAGE_HOOK = lambda name: os._exit(9) if name == stage else None
C.save_checkpoint({run!r}, new)
"""


@pytest.mark.parametrize("corrupt_last", [False, True])
@pytest.mark.parametrize("stage", ["writing", "written", "verified", "rotated", "done"])
def test_a_kill_at_any_stage_of_a_save_leaves_a_loadable_checkpoint(tmp_path, stage, corrupt_last):
    """A kill at any stage of a save, after a fall-back from a corrupt last.pt or not, leaves a loadable checkpoint: the
    good prev.pt is never renamed over."""
    run = str(tmp_path)
    C.save_checkpoint(run, state(1.0))
    C.save_checkpoint(run, state(2.0))                      # last = 2, prev = 1
    if corrupt_last:
        with open(os.path.join(run, C.LAST), "wb") as fh:
            fh.write(b"garbage: the last save was cut")     # last corrupt, prev = 1 is the only good one
    proc = subprocess.run([sys.executable, "-c", KILL.format(root=ROOT, stage=stage, run=run)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr[-2000:]
    loaded, path = C.load_checkpoint(run)
    expected = {1.0, 2.0, 3.0} if not corrupt_last else {1.0, 3.0}
    assert float(loaded["model"]["w"][0]) in expected
    if corrupt_last:   # the good prev.pt was never replaced by the corrupt file
        assert float(C.safe_load(os.path.join(run, C.PREV))["model"]["w"][0]) in {1.0}
    C.clean_temporaries(run)
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]
    C.save_checkpoint(run, state(4.0))                      # and the next save works and rotates a good file
    assert float(C.load_checkpoint(run)[0]["model"]["w"][0]) == 4.0
    assert float(C.safe_load(os.path.join(run, C.PREV))["model"]["w"][0]) in expected


def test_a_checkpoint_that_does_not_load_back_is_not_installed(tmp_path, monkeypatch):
    run = str(tmp_path)
    C.save_checkpoint(run, state(1.0))
    monkeypatch.setattr(C, "_loadable", lambda path: not path.endswith(".tmp"))
    with pytest.raises(CheckpointError, match="does not load back"):
        C.save_checkpoint(run, state(2.0))
    assert float(C.load_checkpoint(run)[0]["model"]["w"][0]) == 1.0 and not os.path.exists(os.path.join(run, C.PREV))


def test_one_run_per_folder_and_no_silent_overwrite(tmp_path):
    held = RunLock(str(tmp_path / "r")).acquire()
    try:
        with pytest.raises(RunFolderError, match=rf"in use by another run \(pid {os.getpid()}\)"):
            RunLock(str(tmp_path / "r")).acquire()
    finally:
        held.release()
    RunLock(str(tmp_path / "r")).acquire().release()        # released: free again
    (tmp_path / "r" / "metrics.json").write_text("{}")
    (tmp_path / "r" / "bundle.json").write_text("{}")     # the last file a run writes: finished
    with pytest.raises(RunFolderError, match="already holds a finished run .*--overwrite"):
        check_fresh(str(tmp_path / "r"))
    assert check_fresh(str(tmp_path / "r"), overwrite=True) is True      # something to replace: nothing removed
    assert (tmp_path / "r" / "metrics.json").exists()


def in_process(capsys, argv, limit=120):
    """``(exit code, stderr)`` of ``unfold-train argv`` run in this process; a run still going after ``limit``
    seconds is stopped (SIGALRM) and ends as an internal error, so a lock that fails to refuse cannot hang."""
    from experiments.app.train import main

    def expire(signum, frame):
        raise RuntimeError(f"unfold-train ran past {limit} s")

    capsys.readouterr()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit)
    try:
        code = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, capsys.readouterr().err


def test_concurrent_training_runs_into_one_folder(tmp_path, capsys):
    """Two runs into one --run-dir: the second one and a resume are refused while the first holds the folder. The
    first run is a process of its own, given far more epochs than the checks take, so that it still holds the
    folder while they are refused (from its first saved epoch on); then Ctrl-C stops it mid-training. A finished
    folder is refused, and replaced only with --overwrite. The other runs are calls of the trainer's main in
    this process (a process other than the first's)."""
    data = synthetic_text_dir(tmp_path / "toy", n_train=80, n_eval=24)

    def args(run, *extra):
        return ["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
                "data.glove=none", "train.progress=false", *extra]

    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "experiments.app.train"] + args(run, "train.epochs=100000"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not (run / "last.pt").exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.05)          # its first epoch saved: the run holds the folder and is training
        assert first.poll() is None, "the first run ended before the second could start"
        code, err = in_process(capsys, args(run, "train.epochs=100000"))
        assert code == 2 and "is in use by another run" in err, err[-2000:]
        assert "Traceback" not in err
        code, err = in_process(capsys, ["--resume", run])
        assert code == 2 and "is in use by another run" in err, err[-2000:]
        assert first.poll() is None, "the first run must still hold the folder after the checks"
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err[-2000:]
    done = tmp_path / "done"
    code, err = in_process(capsys, args(done, "train.epochs=2"))
    assert code == 0, err[-2000:]
    metrics = json.loads((done / "metrics.json").read_text())
    assert metrics["name"] == "tiny" and len(json.loads((done / "history.json").read_text())) == 2
    code, err = in_process(capsys, args(done, "train.epochs=2"))     # the same command again: said, nothing changed
    assert code == 0 and "already holds this finished run" in err, err[-2000:]
    code, err = in_process(capsys, args(done, "train.epochs=3"))     # another config: refused, naming the key
    assert code == 2 and "finished run of another config: train.epochs (2 there, 3 now)" in err
    assert json.loads((done / "metrics.json").read_text()) == metrics
    code, err = in_process(capsys, args(done, "train.epochs=1", "--overwrite"))
    assert code == 0, err[-2000:]
    assert len(json.loads((done / "history.json").read_text())) == 1


def test_everything_a_run_saves_loads_with_weights_only(tmp_path):
    data = synthetic_text_dir(tmp_path / "toy")
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
                      "data.glove=none", "train.progress=false", "train.epochs=2"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("best.pt", "last.pt", "prev.pt", "energy_trace.pt"):
        torch.load(run / name, weights_only=True)             # raises if anything but plain data was saved
    trace = C.safe_load(str(run / "energy_trace.pt"))
    assert trace["resolution"].shape == next(iter(trace["energies"].values())).shape
