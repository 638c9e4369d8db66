"""Model bundles and run folders under a careless or malicious user (fifth hostile review).

* ``save_pretrained(RUN, overwrite=True)`` over a finished run replaces the bundle's own files only: checkpoints,
  metrics, history, trace, log, plots and anyone's files stay, byte for byte, also when the save is killed
  after the swap and recovered by the next one;
* ``bundle.json``'s fields are checked on load: the data fingerprint is recomputed from the vocabulary and label
  names actually loaded, and the card (hashed in ``bundle.json``) records the digest of every field, so swapped
  label names, a reordered or re-cased vocabulary with recomputed hashes, edited metrics, command or dataset are
  refused naming the field;
* integer, boolean or other-precision weights are refused naming the tensor and its dtype, never cast;
* a run killed between ``metrics.json`` and ``bundle.json`` is unfinished: the same command advises ``--resume``,
  which finishes it;
* a save that fails half way leaves nothing, and the retry works;
* ``from_pretrained``/``save_pretrained`` refuse a non-path argument with a ``CheckpointError`` naming it;
  ``convert`` prints no warning about its own probe texts, refuses an empty or ``.``/``..`` NEW, and leaves no
  staging folder when interrupted (SIGTERM), while one left by a killed conversion neither blocks the next nor
  survives it.

One tiny run (1 layer, 2 epochs) is trained once per module and copied per test.
"""
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from energies.errors import CheckpointError
from test_train import CONFIGS, ROOT, run_train, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")
TEXTS = ["good great w1 w2 w5", "bad awful w2 w3", "zzz unknown words only"]
BUNDLE_NAMES = {"bundle.json", "model.safetensors", "config.json", "vocab.json", "README.md", "graph.npy"}
META = {"format": "unfolded-transformers/bundle/2"}


def train_args(run, data, *extra):
    return ["--config", TINY, "--run-dir", str(run), f"data.dataset={data}", "data.glove=none", "train.epochs=2",
            "train.progress=false", "model.layers=1", "train.tensorboard=false", *extra]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``(finished tiny run folder, data folder)``."""
    tmp = tmp_path_factory.mktemp("round5")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    run = tmp / "run"
    proc = run_train(train_args(run, data))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(run), str(data)


def copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return str(dst)


def files_of(folder):
    """``{relative path: sha256}`` of every file under ``folder`` (hidden lock files left out)."""
    out = {}
    for base, _, names in os.walk(folder):
        for name in names:
            if name == ".lock":
                continue
            path = os.path.join(base, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def hidden_siblings(folder):
    parent = os.path.dirname(os.path.abspath(folder))
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def outputs(model):
    return [(p.label, p.probabilities, p.energies, p.verdict) for p in model.predict(TEXTS)]


def edit_manifest(folder, change):
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    change(manifest)
    json.dump(manifest, open(path, "w"))


def rehash(folder, name):
    digest = hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
    edit_manifest(folder, lambda m: m["sha256"].__setitem__(name, digest))


def label_digest(names):
    """The fingerprint's digest of label names, computed here independently (sha256 of one JSON line each)."""
    h = hashlib.sha256()
    for name in names:
        h.update(json.dumps(name, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n")
    return h.hexdigest()


# ----------------------------------------------------------------------------- overwrite keeps the run's files
def with_foreign_files(run):
    os.makedirs(os.path.join(run, "tensorboard"))
    open(os.path.join(run, "tensorboard", "events.out"), "wb").write(b"events")
    open(os.path.join(run, "notes.txt"), "w").write("my notes\n")
    return run


def test_save_pretrained_over_a_finished_run_replaces_only_the_bundles_files(made, tmp_path):
    """save_pretrained over a finished run keeps byte for byte every file a bundle does not write (best.pt, last.pt,
    prev.pt, metrics.json, history.json, energy_trace.pt, train.log, tensorboard/, the plots), and the run still loads
    as the same model."""
    from experiments.app.bundle import TrainedModel

    run = with_foreign_files(copy(made[0], tmp_path / "run"))
    before = files_of(run)
    model = TrainedModel.from_pretrained(run)
    assert model.save_pretrained(run, overwrite=True) == run
    after = files_of(run)
    kept = {k: v for k, v in before.items() if k not in BUNDLE_NAMES}
    assert {"best.pt", "last.pt", "prev.pt", "metrics.json", "history.json", "energy_trace.pt", "train.log",
            "energy_descent.png", "training_curves.png", "config.yaml", "notes.txt",
            os.path.join("tensorboard", "events.out")} <= set(kept)
    assert {k: after.get(k) for k in kept} == kept
    assert set(after) - set(kept) <= BUNDLE_NAMES
    assert outputs(TrainedModel.from_pretrained(run)) == outputs(model)
    assert hidden_siblings(run) == []


KILL_AFTER_SWAP = """
import os, sys
from experiments.runfolder import runlock
from experiments.app.bundle import TrainedModel
runlock.STAGE_HOOK = lambda stage: os._exit(9) if stage == "swapped" else None
TrainedModel.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[1], overwrite=True)
"""


def test_a_bundle_save_killed_after_the_swap_is_recovered_without_losing_the_run(made, tmp_path):
    """Killed just after the swap, the old folder's files wait in the staging folder; the next save into the
    folder finishes the move and drops only the bundle's own old files."""
    from experiments.app.bundle import TrainedModel, load_model

    run = with_foreign_files(copy(made[0], tmp_path / "run"))
    before = files_of(run)
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_SWAP, run], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    model = load_model(run)                               # the new bundle is in place, whole
    model.save_pretrained(run, overwrite=True)            # recovers first
    after = files_of(run)
    assert {k: after.get(k) for k in before if k not in BUNDLE_NAMES} == \
        {k: v for k, v in before.items() if k not in BUNDLE_NAMES}
    assert hidden_siblings(run) == []
    assert outputs(TrainedModel.from_pretrained(run)) == outputs(model)


# ------------------------------------------------------------------------------ a failed save leaves nothing
def test_a_save_into_a_new_folder_that_fails_half_way_leaves_nothing_and_the_retry_works(made, tmp_path,
                                                                                          monkeypatch):
    """A save into a new folder that fails half way leaves no weights, config, vocabulary or hidden sibling (at most an
    empty folder or its .lock), and the retry writes the same model."""
    import experiments.app.bundle as B
    import experiments.app.bundle.write as W

    model = B.TrainedModel.from_pretrained(made[0])
    target = str(tmp_path / "shared")
    real = W._write_text

    def disk_full(text, path):
        if path.endswith("README.md"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(text, path)

    monkeypatch.setattr(W, "_write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        model.save_pretrained(target)
    assert not os.path.exists(target) or os.listdir(target) in ([], [".lock"])
    assert hidden_siblings(target) == []
    monkeypatch.setattr(W, "_write_text", real)
    model.save_pretrained(target)                          # the retry works
    assert outputs(B.load_model(target)) == outputs(model)


def test_a_failed_overwrite_leaves_the_folder_as_it_was(made, tmp_path, monkeypatch):
    import experiments.app.bundle as B
    import experiments.app.bundle.model as M

    run = copy(made[0], tmp_path / "run")
    before = files_of(run)
    model = B.TrainedModel.from_pretrained(run)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(M, "write_read_back", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.save_pretrained(run, overwrite=True)
    assert files_of(run) == before and hidden_siblings(run) == []


# ------------------------------------------------------------------------------- fingerprint and card bound
def test_swapped_label_names_are_refused(made, tmp_path):
    """Swapped label_names are refused by load_model and by predict (never every prediction inverted, exit 0)."""
    from clifuzz import expect_refusal
    from experiments.app.bundle import load_model

    folder = copy(made[0], tmp_path / "m")
    edit_manifest(folder, lambda m: m["label_names"].reverse())
    with pytest.raises(CheckpointError, match="label_names"):
        load_model(folder)
    expect_refusal("experiments.app.predict", [folder, "--text", "good"], str(tmp_path), names=["label_names"])


def test_swapped_label_names_with_their_fingerprint_recomputed_are_refused_by_the_card(made, tmp_path):
    from experiments.app.bundle import load_model

    folder = copy(made[0], tmp_path / "m")

    def forge(m):
        m["label_names"].reverse()
        m["data_fingerprint"]["label_names"] = label_digest(m["label_names"])
    edit_manifest(folder, forge)
    with pytest.raises(CheckpointError, match="label_names"):
        load_model(folder)


@pytest.mark.parametrize("change", ["reorder", "upper"])
def test_a_changed_vocabulary_with_recomputed_hashes_is_refused(made, tmp_path, change):
    from experiments.app.bundle import load_model

    folder = copy(made[0], tmp_path / "m")
    path = os.path.join(folder, "vocab.json")
    vocab = json.load(open(path))
    itos = vocab["itos"]
    if change == "reorder":
        itos[2], itos[3] = itos[3], itos[2]
    else:
        itos[2:] = [t.upper() for t in itos[2:]]
        assert len(set(itos)) == len(itos)
    json.dump(vocab, open(path, "w"))
    rehash(folder, "vocab.json")
    with pytest.raises(CheckpointError, match="vocab.json.*data_fingerprint"):
        load_model(folder)


@pytest.mark.parametrize("key, value", [("metrics", "test_accuracy"), ("command", "rm -rf ~"),
                                        ("dataset", "imdb")])
def test_an_edited_card_field_of_bundle_json_is_refused_naming_it(made, tmp_path, key, value):
    """An edited card field of bundle.json (e.g. test_accuracy) is refused naming the key and README.md, by
    from_pretrained and by save_pretrained (no card claims it)."""
    from experiments.app.bundle import TrainedModel

    folder = copy(made[0], tmp_path / "m")
    if key == "metrics":
        edit_manifest(folder, lambda m: m["metrics"].__setitem__("test_accuracy", 0.999))
    else:
        edit_manifest(folder, lambda m: m.__setitem__(key, value))
    with pytest.raises(CheckpointError, match=f"key '{key}'.*README.md"):
        TrainedModel.from_pretrained(folder)
    with pytest.raises(CheckpointError):
        TrainedModel.from_pretrained(folder).save_pretrained(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def as_older_card(folder):
    """Rewrite the bundle's card as the code before card bindings wrote it (no front-matter digests), rehashed."""
    from experiments.app.bundle import load_model, model_card

    m = load_model(folder)
    manifest = json.load(open(os.path.join(folder, "bundle.json")))
    card = model_card(json.load(open(os.path.join(folder, "config.json"))), m.label_names, m.dataset,
                      m.data_fingerprint, manifest["metrics"], manifest["command"], names_checkpoint=False)
    open(os.path.join(folder, "README.md"), "w", encoding="utf-8").write(card)
    rehash(folder, "README.md")
    return m


def test_an_older_card_still_loads_and_still_binds_its_fields(made, tmp_path):
    from experiments.app.bundle import load_model

    folder = copy(made[0], tmp_path / "m")
    m = as_older_card(folder)
    assert load_model(folder).metrics == m.metrics
    edit_manifest(folder, lambda man: man["metrics"].__setitem__("test_accuracy", 0.999))
    with pytest.raises(CheckpointError, match="README.md.*metrics"):
        load_model(folder)


def test_a_hostile_card_front_matter_is_one_refusal(made, tmp_path):
    from experiments.app.bundle import load_model

    for name, front in (("deep", "a: " + "[" * 5000 + "]" * 5000 + "\n"),
                        ("binding-list", "bundle_sha256: [1, 2]\n"),
                        ("dup", "a: 1\na: 2\n")):
        folder = copy(made[0], tmp_path / name)
        text = open(os.path.join(folder, "README.md")).read()
        end = text.index("\n---\n", 3)
        open(os.path.join(folder, "README.md"), "w").write("---\n" + front + text[end + 1:])
        rehash(folder, "README.md")
        with pytest.raises(CheckpointError, match="README.md"):
            load_model(folder)


# ---------------------------------------------------------------------------------------------- weight dtypes
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float64, torch.float16])
def test_weights_of_another_dtype_are_refused_naming_the_tensor(made, tmp_path, dtype):
    """Weights of another dtype are refused naming the tensor and its dtype, never cast (an integer head would predict
    0.5/0.5 with a 'descent' verdict)."""
    import safetensors.torch

    from experiments.app.bundle import load_model

    folder = copy(made[0], tmp_path / "m")
    path = os.path.join(folder, "model.safetensors")
    tensors = safetensors.torch.load(open(path, "rb").read())
    tensors["head.weight"] = tensors["head.weight"].to(dtype)
    open(path, "wb").write(safetensors.torch.save(tensors, metadata=META))
    rehash(folder, "model.safetensors")
    shown = str(dtype).replace("torch.", "")
    with pytest.raises(CheckpointError, match=f"'head.weight' is {shown}"):
        load_model(folder)


# ----------------------------------------------------------------------------- a kill before bundle.json
KILL_BEFORE_BUNDLE = """
import os, sys
import experiments.app.bundle as B
def killed(*a, **k):
    os._exit(9)
B.write_run_bundle = killed
from experiments.app.train import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_killed_between_metrics_and_bundle_is_resumed_not_called_finished(made, tmp_path, capsys):
    """The same command again advises --resume instead of calling the run finished (--overwrite would throw the
    training away); --resume finishes the run into a loadable bundle. The killed run is a process of its own;
    the commands after it are calls of the trainer's main in this process."""
    from experiments.app.bundle import load_model
    from experiments.app.train import main

    def train(argv):
        capsys.readouterr()
        code = main(argv)
        return code, capsys.readouterr().err

    run = tmp_path / "run"
    args = train_args(run, made[1])
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_BUNDLE, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert (run / "metrics.json").exists() and not (run / "bundle.json").exists()
    code, err = train(args)
    assert code == 2, err[-2000:]
    assert f"--resume {run}" in err and "a finished run" not in err, err
    code, err = train(["--resume", str(run)])
    assert code == 0, err[-2000:]
    assert load_model(str(run)).metrics["test_accuracy"] == json.load(open(run / "metrics.json"))["test_accuracy"]
    code, err = train(args)
    assert code == 0 and "already holds this finished run" in err


def test_the_folder_check_calls_a_run_finished_only_with_its_bundle(tmp_path):
    from experiments.runfolder.runlock import RunFolderError, check_fresh

    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    (run / "last.pt").write_bytes(b"x")
    with pytest.raises(RunFolderError, match=f"unfinished run .*--resume {run}"):
        check_fresh(str(run))
    (run / "last.pt").unlink()
    with pytest.raises(RunFolderError, match="without a checkpoint") as info:
        check_fresh(str(run))
    assert "--resume" not in str(info.value)
    (run / "bundle.json").write_text("{}")
    with pytest.raises(RunFolderError, match="already holds a finished run"):
        check_fresh(str(run))


# ------------------------------------------------------------------------------------------ path arguments
class BytesPath:
    def __fspath__(self):
        return b"/tmp"


@pytest.mark.parametrize("value", [b"/tmp/x", 5, None, BytesPath(), "a\x00b"])
def test_from_pretrained_and_save_pretrained_refuse_a_non_path_naming_the_argument(made, value):
    """A non-path is refused naming ``pretrained_model_name_or_path`` / ``save_directory``, not a raw TypeError (or
    ValueError for a NUL)."""
    from experiments.app.bundle import TrainedModel, load_model

    with pytest.raises(CheckpointError, match="pretrained_model_name_or_path"):
        TrainedModel.from_pretrained(value)
    with pytest.raises(CheckpointError, match="save_directory"):
        load_model(made[0]).save_pretrained(value)


# -------------------------------------------------------------------------------------------------- convert
def convert_cmd(*argv):
    return [sys.executable, "-m", "experiments.app.bundle", "convert", *argv]


def test_convert_prints_no_warning_about_its_own_probe_texts(made, tmp_path):
    new = tmp_path / "new"
    proc = subprocess.run(convert_cmd(made[0], str(new)), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr
    assert (new / "bundle.json").exists()


@pytest.mark.parametrize("new", ["", "   ", ".", ".."])
def test_convert_refuses_an_empty_or_dot_output_and_stages_nothing(made, tmp_path, new):
    from clifuzz import expect_refusal

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    expect_refusal("experiments.app.bundle", ["convert", made[0], new], str(work), names=["NEW"],
                   watch=[str(tmp_path)])


STALL = """
import os, sys, time
import experiments.app.bundle as B
import experiments.app.bundle.write as W
real = W.read_bundle
def stalled(folder, *a, **k):
    if ".convert" in str(folder):
        open(sys.argv[1], "w").close()
        time.sleep(600)
    return real(folder, *a, **k)
W.read_bundle = stalled
sys.exit(B.main(["convert"] + sys.argv[2:]))
"""


def stall_convert(tmp_path, old, new, sig):
    ready = tmp_path / f"ready-{sig}"
    proc = subprocess.Popen([sys.executable, "-c", STALL, str(ready), old, new], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    return proc.returncode


def test_an_interrupted_convert_leaves_no_staging_folder_and_a_killed_ones_does_not_block(made, tmp_path):
    from experiments.app.bundle import load_model

    new = str(tmp_path / "out" / "new")
    os.makedirs(os.path.dirname(new))
    assert stall_convert(tmp_path, made[0], new, signal.SIGTERM) != 0
    assert os.listdir(tmp_path / "out") == []                # SIGTERM: cleaned up like Ctrl-C
    assert stall_convert(tmp_path, made[0], new, signal.SIGKILL) == -signal.SIGKILL
    stale = os.listdir(tmp_path / "out")
    assert len(stale) == 1 and stale[0].startswith(".new.") and stale[0].endswith(".convert")
    proc = subprocess.run(convert_cmd(made[0], new), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.listdir(tmp_path / "out") == ["new"]            # the stale staging folder is gone, not the output
    assert outputs(load_model(new)) == outputs(load_model(made[0]))


def test_a_model_whose_fingerprint_is_not_its_own_is_refused_before_anything_is_written(made, tmp_path):
    from experiments.app.bundle import load_model

    model = load_model(made[0])
    model.label_names = list(reversed(model.label_names))
    with pytest.raises(CheckpointError, match="label_names"):
        model.save_pretrained(tmp_path / "x")
    assert not (tmp_path / "x").exists() and hidden_siblings(tmp_path / "x") == []
