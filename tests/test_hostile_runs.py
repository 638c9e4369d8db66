"""The run folder and the trainer: ``--overwrite`` never loses the old run, no write follows a link, a
folder of someone else's files is refused, NaN is never a metric, the descent monitor works in the trainer,
resource limits are refused naming what and where, and a hostile table of run folders.

Each test names the root cause of the issue it covers (``(1)`` ... ``(16)``).
"""
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from clifuzz import expect_refusal, run_cli, snapshot
from test_train import CONFIGS, ROOT, synthetic_text_dir

from experiments.runfolder import runlock as RL
from experiments.runfolder.atomic import atomic_open
from experiments.runfolder import atomic
from experiments.app.bundle import load_model

TINY = os.path.join(CONFIGS, "tiny.yaml")
TRAIN = "experiments.app.train"
TEXTS = ["good great lovely", "bad awful dull", "w1 w2 fine"]


def args(run, data, *extra):
    flags = [e for e in extra if e.startswith("--")]
    return ["--config", TINY, "--run-dir", str(run), *flags, f"data.dataset={data}", "data.glove=none",
            "train.epochs=1", "train.progress=false", "model.layers=1", "train.tensorboard=false",
            *[e for e in extra if not e.startswith("--")]]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return synthetic_text_dir(tmp_path_factory.mktemp("data") / "toy", n_train=120, n_eval=40)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy):
    """A finished run (seed 0), made once; tests copy it."""
    run = tmp_path_factory.mktemp("base") / "run"
    code, _, err = run_cli(TRAIN, args(run, toy), str(run.parent))
    assert code == 0, err[-2000:]
    return run


def probabilities(run):
    return [p.probabilities for p in load_model(str(run)).predict(TEXTS)]


@pytest.fixture
def old_run(tmp_path, trained):
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    (run / "notes.txt").write_text("my notes, not the run's\n")
    return run


# --- (1) --overwrite: everything checkable is checked before anything is touched; the swap is of a complete run

OVERWRITE_FAILURES = [
    (["data.dataset=/nonexistent.csv"], ["/nonexistent.csv"]),
    (["data.dataset=/nonexistent_folder/"], ["nonexistent_folder"]),
    (["model.d=0"], ["model.d"]),
    (["train.max_train_examples=1"], ["train.max_train_examples"]),
    (["model.rho=gauss"], ["model.rho"]),
    (["train.device=cuda:7"], ["train.device"]),
]


@pytest.mark.parametrize("extra,names", OVERWRITE_FAILURES, ids=[e[0][0] for e in OVERWRITE_FAILURES])
def test_a_refused_overwrite_leaves_the_old_run_untouched(tmp_path, toy, old_run, extra, names):
    """A refused ``--overwrite`` (a bad dataset) leaves the old run as it was: best.pt, metrics.json and the bundle give
    the same probabilities, no stage left."""
    before = probabilities(old_run)
    argv = args(old_run, toy, "--overwrite")
    argv = [a for a in argv if not (a.startswith("data.dataset=") and any(e.startswith("data.dataset=") for e in extra))]
    expect_refusal(TRAIN, argv + extra, str(tmp_path), names=names, watch=[str(old_run)])
    assert probabilities(old_run) == before
    assert not os.path.exists(RL.Replacement(str(old_run)).stage)


@pytest.mark.parametrize("failure", ["interrupt", "diverge"])
def test_an_overwrite_that_fails_midway_leaves_the_old_run_and_says_so(tmp_path, toy, old_run, monkeypatch, failure):
    import experiments.app.train as T

    before, files = probabilities(old_run), snapshot(str(old_run))
    real = T.evaluate

    def failing(*a, **k):
        if k.get("split") == "validation":
            if failure == "interrupt":
                raise KeyboardInterrupt
            raise T.TrainingError("the model gives non-finite logits (injected)")
        return real(*a, **k)

    monkeypatch.setattr(T, "evaluate", failing)
    code, _, err = run_cli(TRAIN, args(old_run, toy, "--overwrite", "train.seed=1"), str(tmp_path))
    assert code == (130 if failure == "interrupt" else 2), err[-2000:]
    assert "nothing in" in err and "was replaced" in err, err[-2000:]
    assert snapshot(str(old_run)) == files and probabilities(old_run) == before
    assert not os.path.exists(RL.Replacement(str(old_run)).stage)


def test_an_overwrite_replaces_the_run_and_keeps_what_is_not_the_runs(tmp_path, toy, old_run):
    before = probabilities(old_run)
    code, _, err = run_cli(TRAIN, args(old_run, toy, "--overwrite", "train.seed=1"), str(tmp_path))
    assert code == 0, err[-2000:]
    assert probabilities(old_run) != before
    assert (old_run / "notes.txt").read_text() == "my notes, not the run's\n"
    assert not os.path.exists(RL.Replacement(str(old_run)).stage)
    assert not (old_run / RL.Replacement.OLD).exists() and not (old_run / RL.Replacement.COMPLETE).exists()


KILL_SCRIPT = """
import os, signal, sys
stage, hook = sys.argv[1], sys.argv[2]
def die(name):
    if name == stage:
        os.kill(os.getpid(), signal.SIGKILL)
if hook == "replace":
    import experiments.runfolder.runlock as R
    R.STAGE_HOOK = die
else:
    import experiments.app.checkpoint as C
    C.STAGE_HOOK = die
from experiments.app.train import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("stage,hook,installed", [("done", "checkpoint", False), ("complete", "replace", False),
                                                   ("swapped", "replace", True), ("moved", "replace", True)])
def test_a_kill_at_any_stage_of_an_overwrite_leaves_a_loadable_run(tmp_path, toy, old_run, stage, hook, installed):
    """SIGKILL while the new run trains (its first checkpoint), once it is complete, just after the swap, and
    after the old folder gave back its other files: the folder loads at every instant, as the old run until
    the new one is complete and swapped in, and the next run into the folder finishes (or drops) the rest."""
    before = probabilities(old_run)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, stage, hook,
                           *args(old_run, toy, "--overwrite", "train.seed=1")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    now = probabilities(old_run)                         # loadable right after the kill, no repair needed
    assert (now != before) == installed
    # the next run into the folder repairs first (here one that is then refused: the folder holds a run)
    expect_refusal(TRAIN, args(old_run, toy), str(tmp_path), names=["already holds a finished run"], writes=True)
    assert not os.path.exists(RL.Replacement(str(old_run)).stage)
    assert (old_run / "notes.txt").read_text() == "my notes, not the run's\n"
    assert (probabilities(old_run) == before) == (not installed and stage == "done")
    if stage == "complete":      # complete when killed: the repair installs it
        assert probabilities(old_run) != before


# --- (3) a folder of someone else's files


def test_a_folder_of_someone_elses_files_is_refused_and_overwrite_keeps_them(tmp_path, toy):
    """A folder holding someone else's files (config.yaml) is refused naming it and ``--overwrite``; with
    ``--overwrite`` files that are not the run's are kept."""
    folder = tmp_path / "U"
    folder.mkdir()
    (folder / "config.yaml").write_text("mine\n")
    (folder / "data.csv").write_text("a,b\n")
    expect_refusal(TRAIN, args(folder, toy), str(tmp_path), names=[str(folder), "config.yaml", "--overwrite"])
    code, _, err = run_cli(TRAIN, args(folder, toy, "--overwrite"), str(tmp_path))
    assert code == 0, err[-2000:]
    assert (folder / "data.csv").read_text() == "a,b\n"              # not the run's: kept
    assert (folder / "config.yaml").read_text() != "mine\n"          # the run's own file: replaced
    probabilities(folder)


def test_save_model_refuses_someone_elses_folder_and_replaces_a_bundle_whole(tmp_path, trained):
    """``save_model`` refuses a folder holding files that are not a bundle (someone's config.yaml), naming them, and
    replaces a bundle whole."""
    from experiments.app.bundle import save_model

    model = load_model(str(trained))
    folder = tmp_path / "U"
    folder.mkdir()
    (folder / "config.yaml").write_text("mine\n")
    (folder / "notes.txt").write_text("notes\n")
    with pytest.raises(RL.RunFolderError.__mro__[1], match="files that are not a bundle .*config.yaml"):
        save_model(model, str(folder))
    assert (folder / "config.yaml").read_text() == "mine\n" and sorted(os.listdir(folder)) == ["config.yaml", "notes.txt"]   # no .lock: refused before
    save_model(model, str(folder), overwrite=True)
    # a format-2 bundle writes config.json, not config.yaml: someone's config.yaml is kept like their notes
    assert (folder / "notes.txt").read_text() == "notes\n" and (folder / "config.yaml").read_text() == "mine\n"
    assert probabilities(folder) == probabilities(trained)
    assert not os.path.exists(RL.Replacement(str(folder)).stage)
    empty = tmp_path / "empty"
    empty.mkdir()
    save_model(model, str(empty))                        # the negative control: an empty folder is written
    assert probabilities(empty) == probabilities(trained)


# --- (2) no write follows a link


@pytest.mark.parametrize("name", [".lock", "train.log", "metrics.csv", "tensorboard", "config.yaml", "last.pt",
                                  "metrics.json", "vocab.json"])
def test_resume_never_writes_through_a_link(tmp_path, trained, name):
    """``--resume`` never writes through a link (a ``.lock`` or another run file linked to /some/file leaves its target
    as it was)."""
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    path = run / name
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.symlink_to(target)
    # (config.yaml is read first, through the link, and refused as a config: reading follows, writing never)
    expect_refusal(TRAIN, ["--resume", str(run)], str(tmp_path),
                   names=[name] + (["symbolic link"] if name != "config.yaml" else []), watch=[str(run)])
    assert target.read_text() == "precious\n"


def test_appending_and_locking_never_follow_links_or_open_fifos(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link") as info:
        atomic.open_append(tmp_path / "link")
    assert info.value.filename == str(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        atomic.open_append(tmp_path / "fifo")
    with pytest.raises(RL.RunFolderError, match="symbolic link"):
        lock = tmp_path / "run"
        lock.mkdir()
        (lock / ".lock").symlink_to(target)
        RL.RunLock(str(lock)).acquire()
    assert target.read_text() == "precious\n"
    with atomic.open_append(tmp_path / "plain") as fh:        # the negative control: a plain file appends
        fh.write("x")
    with atomic.open_append(tmp_path / "plain") as fh:
        fh.write("y")
    assert (tmp_path / "plain").read_text() == "xy"


# --- (4) NaN is never a metric


def test_the_untraced_forward_is_guarded_on_the_cpu():
    """The untraced forward is guarded on the CPU: ``model.tau=1e-10`` gives the same finite logits with the trace off
    as on (the guard's one read is of host memory: always on)."""
    from experiments.app.config import load_config
    from experiments.app.build import build_model

    torch.manual_seed(0)
    model = build_model(load_config("tiny", ["model.tau=1e-10"]), 50, 2).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (8, 12), generator=gen)
    mask = torch.ones(8, 12, dtype=torch.bool)
    mask[0, 6:] = False
    with torch.no_grad():
        off, on = model(ids, mask, trace=False).logits, model(ids, mask, trace=True).logits
    assert torch.isfinite(off).all() and torch.equal(off, on)


def test_non_finite_logits_are_a_failure_named_never_a_metric(tmp_path, toy, monkeypatch):
    """Non-finite logits (``model.tau=1e-10``, ``train.lr=10``) are a failure named, exit non-zero, never ``test_loss:
    "nan"``, an accuracy from NaN logits or a descent verdict."""
    from unfold.classifier import SequenceClassifier

    real = SequenceClassifier.forward

    def nan_in_eval(self, *a, **k):
        out = real(self, *a, **k)
        if not self.training:
            out.logits = out.logits.clone()
            out.logits[0] = float("nan")
        return out

    monkeypatch.setattr(SequenceClassifier, "forward", nan_in_eval)
    run = tmp_path / "run"
    line = expect_refusal(TRAIN, args(run, toy), str(tmp_path), names=["non-finite logits", "test"], writes=True)
    assert "example 0" in line
    assert not (run / "metrics.json").exists() and not (run / "bundle.json").exists()


def test_evaluate_refuses_nan_logits_and_passes_finite_ones():
    from experiments.app.train import TrainingError, evaluate
    from experiments.app.config import load_config
    from experiments.app.build import build_model

    torch.manual_seed(0)
    model = build_model(load_config("tiny"), 30, 2)
    ids = torch.randint(1, 30, (6, 5))
    tensors = (ids, torch.ones(6, 5, dtype=torch.bool), torch.tensor([0, 1, 0, 1, 0, 1]))
    acc, loss, _ = evaluate(model, tensors, 4, "cpu")             # the negative control: finite, accepted
    assert 0 <= acc <= 1 and loss == loss
    with torch.no_grad():
        model.head.bias[1] = float("inf")
    with pytest.raises(TrainingError, match=r"4 example\(s\) of the validation split \(first: example 0"):
        evaluate(model, tensors, 4, "cpu", split="validation")


# --- (9) the descent monitor in the trainer, every mode


def test_monitor_warn_and_strict_work_in_the_trainer(tmp_path, toy, faulty):
    """``train.monitor=warn`` confirms flagged steps and warns; ``strict`` refuses naming the violation and epoch 1,
    batch 1 (the re-check reads a SequenceClassifier's graph without crashing)."""
    run = tmp_path / "warn"
    code, _, err = run_cli(TRAIN, args(run, toy, "train.monitor=warn"), str(tmp_path))
    assert code == 0, err[-2000:]
    monitor = json.loads((run / "metrics.json").read_text())["descent_monitor"]
    assert monitor["confirmed"] > 0 and monitor["flagged"] >= monitor["confirmed"] and "descent violation" in err
    expect_refusal(TRAIN, args(tmp_path / "strict", toy, "train.monitor=strict"), str(tmp_path),
                   names=["descent violation", "epoch 1, batch 1"], writes=True)


def test_monitor_passes_a_correct_run_in_strict_mode(tmp_path, toy):
    """The negative control of the above: without the fault, strict mode trains to the end."""
    run = tmp_path / "strict"
    code, _, err = run_cli(TRAIN, args(run, toy, "train.monitor=strict"), str(tmp_path))
    assert code == 0, err[-2000:]
    monitor = json.loads((run / "metrics.json").read_text())["descent_monitor"]
    assert monitor["confirmed"] == 0 and monitor["steps_checked"] > 0


# --- (13) resource limits: refused with the path or the key, never a raw error


def _limited(limit, value, argv, cwd):
    def set_limit():
        resource.setrlimit(limit, (value, value))
    return subprocess.run([sys.executable, "-m", TRAIN, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, preexec_fn=set_limit, env={**os.environ, "PYTHONPATH": ROOT})


def test_a_file_size_limit_is_refused_naming_the_file(tmp_path, toy):
    """Under a file-size limit (``ulimit -f``) the run exits 2 with one error line naming the file and 'File too large',
    no traceback."""
    run = tmp_path / "run"
    proc = _limited(resource.RLIMIT_FSIZE, 20 * 1024, args(run, toy), str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and "error:" in last and "File too large" in last and str(run) in last, last


def test_a_model_beyond_the_memory_limit_is_refused_before_any_work(tmp_path, toy):
    """An in-range ``model.d=16384`` past a memory limit is refused before any work, naming the key and the GiB needed;
    nothing written."""
    run = tmp_path / "run"
    proc = _limited(resource.RLIMIT_AS, 6 * 2 ** 30, args(run, toy, "model.d=16384"), str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and "model.d=16384" in last and "GiB" in last, last
    assert not run.exists()


def test_a_full_disk_is_reported_with_the_path(tmp_path, monkeypatch):
    """ENOSPC while writing: the error names the file being written (it said only 'No space left on device')."""
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic.atomic_save({"w": torch.zeros(3)}, tmp_path / "x.pt")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "x.pt")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not os.listdir(tmp_path)                     # nothing half written left behind
    with atomic_open(tmp_path / "y.txt", "w") as fh:   # the negative control: a normal write
        fh.write("ok")
    assert (tmp_path / "y.txt").read_text() == "ok"


@pytest.mark.parametrize("where", ["open", "fdopen", "write", "fsync", "chmod", "replace"])
def test_a_ctrl_c_anywhere_in_an_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch, where):
    """A KeyboardInterrupt at each step of :func:`atomic_open` (after the step for open, the one that creates the
    file; before it for the others): the old file is kept whole and no temporary file is left. CI once found a
    ``.history.json.*.tmp`` after a Ctrl-C: ``tempfile.mkstemp`` creates the file before it returns its name."""
    (tmp_path / "h.json").write_text("old")
    real = {"open": os.open, "fdopen": os.fdopen, "fsync": os.fsync, "chmod": os.chmod, "replace": os.replace}

    def interrupted(*a, **k):
        if where == "open":
            real["open"](*a, **k)                       # the file now exists, its descriptor is lost
        raise KeyboardInterrupt

    if where != "write":
        monkeypatch.setattr(os, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(tmp_path / "h.json", "w") as fh:
            if where == "write":
                fh.write("half")
                raise KeyboardInterrupt
            fh.write("new")
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["h.json"] and (tmp_path / "h.json").read_text() == "old"
    atomic.atomic_write_text("new", tmp_path / "h.json")        # the negative control: uninterrupted, replaced
    assert sorted(os.listdir(tmp_path)) == ["h.json"] and (tmp_path / "h.json").read_text() == "new"


def test_mkstemp_would_leave_its_file_when_interrupted(tmp_path, monkeypatch):
    """Why atomic_open names its temporary file first: the same interrupt as above inside ``tempfile.mkstemp``
    leaves a file whose name nobody was given (the control showing the injected interrupt reaches the window)."""
    import tempfile

    real_open = os.open

    def interrupted(*a, **k):
        real_open(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tempfile.mkstemp(dir=tmp_path, prefix=".h.json.", suffix=".tmp")
    monkeypatch.undo()
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].endswith(".tmp")
    assert atomic.clean_temporaries(tmp_path) == [str(tmp_path / left[0])] and not os.listdir(tmp_path)


STORM = """
import glob, os, random, signal, sys, threading
sys.path.insert(0, {root!r})
from experiments.runfolder.atomic import atomic_write_text
folder, rng, left, interrupts = {folder!r}, random.Random(0), 0, 0
target = os.path.join(folder, "history.json")
atomic_write_text("x" * 1000, target)          # the target exists before the first interrupt
for trial in range(200):
    timer = threading.Timer(rng.uniform(0, 0.003), os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()                  # inside the try: under load the signal can come before start() returns
        while True:
            atomic_write_text("x" * 1000, target)
    except KeyboardInterrupt:
        interrupts += 1
    timer.join()
    left += len(glob.glob(os.path.join(folder, ".*.tmp")))
    assert open(target).read() == "x" * 1000
print(interrupts, left)
"""


def test_ctrl_c_at_random_instants_of_atomic_writes_leaves_nothing_behind(tmp_path):
    """200 real SIGINTs timed at random into a loop of writes (a fresh process, SIGINT's default handler): every
    one lands somewhere in a write, and none leaves a temporary file or a half-written target (with ``mkstemp``
    a third of them left one)."""
    proc = subprocess.run([sys.executable, "-c", STORM.format(root=ROOT, folder=str(tmp_path))], capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["200", "0"]


# --- (16) a study's default config found from any folder


def test_convex_heads_default_config_resolves_outside_the_repository(tmp_path):
    """convex_heads' default ``--config`` resolves outside the repository (not relative to the working directory)."""
    import experiments.studies.convex_heads as CH
    from experiments.app.config import load_config

    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        default = CH.build_parser().parse_args([]).config
        assert load_config(default)["name"] == "default"
    finally:
        os.chdir(old)


# --- a hostile table of run folders: every name a run writes, as a link, a folder, a FIFO; foreign content


def _plant(run, name, kind, tmp_path):
    path = run / name
    if kind == "link":
        (tmp_path / "victim").write_text("precious\n")
        path.symlink_to(tmp_path / "victim")
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "file":
        path.write_text("someone else's\n")


#: every name a run writes (experiments.runlock.RUN_OUTPUTS; spelled out so that the table is the contract)
WRITTEN = ["metrics.json", "last.pt", "prev.pt", "best.pt", "history.json", "energy_trace.pt", "bundle.json", "model.pt",
           "model.safetensors", "train.log", "metrics.csv", "tensorboard", "config.yaml", "config.json", "README.md",
           "vocab.json", "tokenizer.json", "energy_descent.png", "training_curves.png", "last.pt.corrupt", "prev.pt.corrupt"]
RUN_NAMES = [".lock", "sweep.log", *WRITTEN, "notes.txt", "data"]
FOLDER_CASES = [(name, kind) for name in RUN_NAMES for kind in ("link", "dangling", "fifo", "folder", "file")
                if not (name in ("notes.txt", ".lock", "sweep.log") and kind == "file")]   # a lock, a sweep's log


@pytest.mark.parametrize("name,kind", FOLDER_CASES, ids=[f"{n}-{k}" for n, k in FOLDER_CASES])
def test_a_new_run_into_a_planted_folder_is_refused_untouched(tmp_path, toy, name, kind):
    run = tmp_path / "run"
    run.mkdir()
    _plant(run, name, kind, tmp_path)
    expect_refusal(TRAIN, args(run, toy), str(tmp_path), names=[str(run)])
    if (tmp_path / "victim").exists():
        assert (tmp_path / "victim").read_text() == "precious\n"


def test_the_table_names_every_file_a_run_writes():
    assert sorted(WRITTEN) == sorted(RL.RUN_OUTPUTS)


def test_a_sweep_finishes_its_own_seed_stopped_before_its_first_checkpoint(tmp_path, toy, capsys, monkeypatch):
    """A seed killed before its first checkpoint leaves config.yaml and vocab.json (no run files): the trainer
    refuses such a folder without --overwrite, so the sweep passes it for a folder whose config.yaml is this
    seed's own, and only then; a folder of someone else's files stays refused (the negative control). The sweep
    is a call of its main in this process, both seeds at once (each seed a process of its own, as always)."""
    from experiments.app.config import dump_config, load_config
    from experiments.app.sweep import main

    root = tmp_path / "sweep"
    common = [f"data.dataset={toy}", "data.glove=none", "train.progress=false", "model.layers=1", "train.epochs=1",
              "train.tensorboard=false"]
    own = root / "seed-0"
    own.mkdir(parents=True)
    cfg = load_config(TINY, common + ["train.seed=0", "data.seed=0"])
    (own / "config.yaml").write_text(dump_config(cfg))
    (own / "vocab.json").write_text('{"itos": ["<pad>", "<unk>"]}')
    other = root / "seed-1"
    other.mkdir()
    (other / "vocab.json").write_text("someone else's\n")
    monkeypatch.chdir(ROOT)          # where the seeds' processes start
    capsys.readouterr()
    code = main(["--config", TINY, "--seeds", "2", "--jobs", "2", "--run-dir", str(root), *common])
    err = capsys.readouterr().err
    assert (own / "metrics.json").exists(), err[-3000:]
    assert code == 1 and "seed 1: FAILED" in err, err[-3000:]
    assert (other / "vocab.json").read_text() == "someone else's\n" and not (other / "metrics.json").exists()


# --- (8) the spline probe: an overflow is never a verdict


@pytest.mark.parametrize("activation", ["relu", "softmax", "softplus"])
@pytest.mark.parametrize("t_max", ["1e200", "1e300", "1.7e308"])
def test_the_spline_probe_never_reads_an_overflow_as_a_verdict(tmp_path, activation, t_max):
    """An overflow of the scores (``--attention relu --t-max 1e300``) is refused naming 'not finite' and t_max, never
    reported as 'spline, degree 0': only rows with no key are zeroed, so the NaN is seen."""
    expect_refusal("experiments.studies.spline_probe", ["--attention", activation, "--t-max", t_max, "--n", "3", "--json"],
                   str(tmp_path), names=["not finite", "t_max"])


def test_attention_rows_without_keys_weigh_nothing_and_overflow_stays_visible():
    from unfold.attention import Attention

    torch.manual_seed(0)
    att = Attention(4, 2, "softmax").double()
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    allowed = torch.ones(2, 3, 3, dtype=torch.bool)
    allowed[0, 1] = False                                # query 1 of example 0 sees no key: output o(0) = bias-free 0
    out = att(x, allowed=allowed)
    assert torch.isfinite(out).all() and torch.equal(out[0, 1], torch.zeros(4, dtype=torch.float64))
    assert not torch.isfinite(att(x * 1e200)).all()      # an overflow is not a finite 0
    ok = Attention(4, 2, "relu").double()(x)             # the negative control: an ordinary input is finite
    assert torch.isfinite(ok).all()


# --- (17) the library's boundary: ids, devices, empty examples, integer energies

HOSTILE_IDS = [
    ("float ids", lambda ids: ids.float(), "integer tensor"), ("bool ids", lambda ids: ids > 3, "integer tensor"),
    ("complex ids", lambda ids: ids.to(torch.complex64), "integer tensor"),
    ("id = vocab", lambda ids: torch.where(ids == ids[0, 0], 10, ids), "[0, 10)"),
    ("huge id", lambda ids: ids + 2 ** 40, "[0, 10)"), ("negative id", lambda ids: ids - 20, "[0, 10)"),
    ("int8 negative", lambda ids: (ids - 20).to(torch.int8), "[0, 10)"),
    ("int32 beyond", lambda ids: (ids + 10).int(), "[0, 10)"),
    ("uint8 beyond", lambda ids: (ids + 100).to(torch.uint8), "[0, 10)"),
    ("meta ids", lambda ids: ids.to("meta"), "ids are on meta"),
]


@pytest.mark.parametrize("what,make,message", HOSTILE_IDS, ids=[h[0] for h in HOSTILE_IDS])
@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_hostile_token_ids_are_named_not_torch_errors(what, make, message, mode):
    """Float ids, ids outside the vocabulary and meta inputs are TokenErrors naming them, not torch's RuntimeError /
    IndexError."""
    import unfold as U
    from energies.errors import TokenError

    torch.manual_seed(0)
    model = U.UnfoldedTransformer(10, 2, d=8, heads=2, layers=2, mode=mode)
    ids = torch.randint(1, 10, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(TokenError, match=re_escape(message)):
        model(make(ids), mask.to("meta") if what == "meta ids" else mask)
    assert torch.isfinite(model(ids, mask).logits).all()          # the negative control: good ids pass


def re_escape(text):
    import re
    return re.escape(text)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_an_example_with_no_real_token_is_refused_on_the_cpu_and_fails_the_verdict_elsewhere(mode, monkeypatch):
    """An all-False padding row is refused on the CPU naming the example and fails the verdict elsewhere (never
    'descent' over its layer steps)."""
    import unfold as U
    from unfold import encoders as E
    from energies.errors import ConfigError

    torch.manual_seed(0)
    model = U.UnfoldedTransformer(10, 2, d=8, heads=2, layers=3, mode=mode)
    ids = torch.randint(1, 10, (3, 5))
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(ConfigError, match=r"at least one real token .*example\(s\) \[1\]"):
        model(ids, mask)
    # off the CPU the check would be a sync: it is skipped there, and the trace marks the example instead
    monkeypatch.setattr(E, "check_empty_rows", lambda *a, **k: None)
    import unfold.classifier as C
    monkeypatch.setattr(C, "check_empty_rows", lambda *a, **k: None)
    out = model(ids, mask, trace=True)
    assert out.report().verdict != "descent" and out.report().num_nonfinite == 3
    mask[1, 0] = True                                       # the negative control: one real token suffices
    monkeypatch.undo()
    assert model(ids, mask, trace=True).report().num_nonfinite == 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool])
def test_report_from_values_refuses_integer_energies(dtype):
    """report_from_values refuses integer energies ('floating-point energies'); the same values as float64 give
    'descent'."""
    from energies.errors import StepError
    from unfold.trace import report_from_values

    values = {"a": torch.tensor([[3, 2, 1], [1, 1, 0]]).to(dtype)}
    with pytest.raises(StepError, match="floating-point energies"):
        report_from_values(values, torch.float64)
    assert report_from_values({"a": values["a"].double()}, torch.float64).verdict == "descent"   # control


# --- (15) an edge id is reported as it is


@pytest.mark.parametrize("dtype,big", [(torch.uint64, 2 ** 64 - 1), (torch.uint64, 2 ** 63), (torch.uint64, 99),
                                       (torch.uint32, 2 ** 32 - 1), (torch.uint16, 2 ** 16 - 1),
                                       (torch.uint8, 255), (torch.int8, 127), (torch.int16, 2 ** 15 - 1),
                                       (torch.int32, 2 ** 31 - 1), (torch.int64, 2 ** 63 - 1)])
def test_an_out_of_range_edge_id_is_named_with_its_true_value(dtype, big):
    """An out-of-range edge id is named by its true value in every dtype (a uint64 2^64 - 1, not -1 after the conversion
    to int64)."""
    from energies.errors import GraphError
    from energies.graphs import from_edge_index

    ei = torch.tensor([[0, 1], [1, 2]], dtype=torch.int64).to(dtype)
    if dtype == torch.uint64:
        ei = torch.tensor([[0, 1], [1, big - 2 ** 64 if big >= 2 ** 63 else big]], dtype=torch.int64).view(torch.uint64)
    else:
        ei[1, 1] = big
    with pytest.raises(GraphError, match=rf"edge 1 = \(1, {big}\) is out of range"):
        from_edge_index(ei, 3)
    ok = torch.tensor([[0, 1], [1, 2]], dtype=torch.int64).to(dtype)     # the negative control
    assert from_edge_index(ok, 3).num_nodes == 3


# --- (10) the build check never rejects a valid config, and never speaks of its meta device

KERNEL_NAMES = ["auto", "dense", "edges", "fused", "softmax", "streamed"]
GRAPH_SPECS = ["complete", "window:2", "star"]
RHO_SPECS = ["exp", "relu:1", "softplus:2:0.5", "cauchy", "lp:0.5"]


def test_the_build_check_leaves_the_fused_op_available(tmp_path):
    """The build check leaves the fused op available in the process: after check_buildable(model.kernel=fused),
    fused_available('cpu') is True (the check never probes with meta tensors)."""
    import subprocess as sp
    code = ("from experiments.app.config import load_config; from experiments.app.build import check_buildable; "
            "from energies.kernels.fused_ops import fused_available; "
            "check_buildable(load_config('tiny', ['model.kernel=fused'])); print(fused_available('cpu'))")
    out = sp.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_the_build_check_agrees_with_a_real_build(kernel):
    """Every kernel x graph x rho: the build check accepts it and a real CPU model trains a step with it, or it
    refuses it with a ConfigError naming model.* keys and never its own 'meta' device."""
    from energies.errors import ConfigError
    from experiments.app.config import load_config
    from experiments.app.build import build_model, check_buildable

    accepted = 0
    for graph in GRAPH_SPECS:
        for rho in RHO_SPECS:
            cfg = load_config("tiny", [f"model.kernel={kernel}", f"model.graph={graph}", f"model.rho={rho}",
                                       "model.layers=1"])
            try:
                check_buildable(cfg)
            except ConfigError as exc:
                assert "model.kernel" in str(exc) and "meta" not in str(exc), str(exc)
                with pytest.raises(ConfigError):        # the real build refuses it too
                    build_model(cfg, 20, 2)
                continue
            accepted += 1
            torch.manual_seed(0)
            model = build_model(cfg, 20, 2)
            ids = torch.randint(1, 20, (2, 6))
            out = model(ids, torch.ones(2, 6, dtype=torch.bool))
            torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 1])).backward()
            assert out.report().verdict == "descent", (kernel, graph, rho)
    assert accepted >= (len(GRAPH_SPECS) * len(RHO_SPECS) if kernel in ("auto", "edges", "dense") else 1)
