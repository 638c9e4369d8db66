"""Hostile bundles and checkpoints: what ``unfold-predict`` and ``unfold-train --resume`` read is
validated at the boundary, refused in one line naming the file, the field and the value, with nothing written.

* checkpoints carry a checksum (``sha256``) verified on load, every field is validated (epoch in
  [1, train.epochs], best_val/best_epoch consistent with the history, counts >= 0, finite numbers), a tampered
  ``last.pt`` falls back to ``prev.pt``, and a non-finite model is never saved as a checkpoint;
* ``bundle.json`` is validated key by key, JSON documents nested 5,000 deep are refused in one line, a folder
  without ``bundle.json`` is read only with ``--legacy`` and only when nothing in it was written by the
  current format, bundle weights must be finite;
* a crafted pickle (``os.system`` in ``__reduce__``) is reported as code, never as truncated, in every pickle
  protocol and torch's formats (and is never executed);
* ``--plot`` that cannot be written is refused before anything is printed.

The table at the end runs more than 80 hostile invocations through :func:`clifuzz.expect_refusal`. One tiny
run is trained once per module (a subprocess, about 5 s) and copied per case.
"""
import copy
import hashlib
import json
import math
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from clifuzz import expect_refusal, run_cli
from energies.errors import CheckpointError
from experiments.app import checkpoint as C
from test_train import CONFIGS, ROOT, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")
TRAIN, PREDICT = "experiments.app.train", "experiments.app.predict"
EPOCHS = 2
#: the old code has no seal(): there the table's re-sealed cases are written without a checksum
seal = getattr(C, "seal", lambda state: state)
#: files of a run folder a case needs (the plots and TensorBoard events are left out: copying is per case)
KEEP = ("config.yaml", "vocab.json", "best.pt", "last.pt", "prev.pt", "bundle.json", "metrics.json", "history.json",
        "energy_trace.pt", "train.log", "metrics.csv")


class Evil:
    """A pickle that would run ``os.system("true")`` when loaded (it never is: weights_only refuses it)."""

    def __reduce__(self):
        return (os.system, ("true",))


class Tripwire:
    """A pickle that would create a folder when loaded: proof that refusing it executed nothing."""

    path = ""

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """``(run folder, saved bundle folder, data folder)``: a finished tiny run of EPOCHS epochs, and the same model
    written by save_model, both rewritten as bundle format 1 wrote them (``best.pt``; ``model.pt`` +
    ``config.yaml``)."""
    tmp = tmp_path_factory.mktemp("hostile")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    run = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", TRAIN, "--config", TINY, "--run-dir", str(run),
                           f"data.dataset={data}", "data.glove=none", f"train.epochs={EPOCHS}", "train.progress=false",
                           "model.layers=1", "train.tensorboard=false"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from experiments.app.bundle import load_model, save_model
    from test_bundle_safetensors import as_format_1

    saved = tmp / "saved"
    save_model(load_model(str(run)), str(saved))
    as_format_1(str(run))     # the table is about format 1 (best.pt, model.pt: still read); format 2's hostile
    as_format_1(str(saved))   # files are tests/test_bundle_safetensors.py's
    return run, saved, data


def copy_folder(src, dst):
    os.makedirs(dst)
    for name in os.listdir(src):
        if name in KEEP or name.endswith(".pt") or name.endswith(".json"):
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    return str(dst)


def rehash(folder, name):
    """Rewrite ``folder/bundle.json`` with the current sha256 of ``name`` (a hostile edit made consistent)."""
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    with open(os.path.join(folder, name), "rb") as fh:
        manifest["sha256"][name] = hashlib.sha256(fh.read()).hexdigest()
    with open(path, "w") as fh:
        json.dump(manifest, fh)


def load_pt(path):
    return torch.load(path, weights_only=True)


def deep(n=5000):
    return "[" * n + "]" * n


# ------------------------------------------------------------------------------------------- checkpoint faults
def test_a_scaled_weight_in_last_pt_is_refused_and_resume_falls_back_to_prev_pt_to_the_same_result(base, tmp_path):
    """A weight scaled in last.pt is refused by its checksum (the reason is printed), prev.pt (epoch 1) is used, and
    the resumed run retrains epoch 2 to the very weights of the uninterrupted run."""
    run = copy_folder(base[0], tmp_path / "run")
    ck = load_pt(os.path.join(run, C.LAST))
    ck["model"]["head.weight"] = ck["model"]["head.weight"] * 2
    torch.save(ck, os.path.join(run, C.LAST))
    state, path = C.load_checkpoint(run)
    assert path.endswith(C.PREV) and state["epoch"] == EPOCHS - 1
    for name in ("metrics.json", "bundle.json"):
        os.unlink(os.path.join(run, name))
    code, out, err = run_cli(TRAIN, ["--resume", run], str(tmp_path))
    assert code == 0, err[-3000:]
    assert "checksum" in err and C.LAST in err                 # the reason last.pt was passed over is printed
    want, got = (load_pt(os.path.join(d, "best.pt"))["model"] for d in (str(base[0]), run))
    assert all(torch.equal(want[k], got[k]) for k in want)
    a, b = (json.load(open(os.path.join(d, "metrics.json"))) for d in (str(base[0]), run))
    assert a["test_accuracy"] == b["test_accuracy"] and a["best_epoch"] == b["best_epoch"]


def test_save_checkpoint_refuses_nonfinite_weights_and_keeps_the_last_good_one(base, tmp_path):
    """A NaN or infinite weight, or a NaN in the optimizer state, is refused naming it; last.pt keeps the last good
    checkpoint byte for byte and no temporary file is left; the same state, finite, is written."""
    run = copy_folder(base[0], tmp_path / "run")
    good = open(os.path.join(run, C.LAST), "rb").read()
    ck = load_pt(os.path.join(run, C.LAST))
    ck.pop(getattr(C, "DIGEST", "sha256"), None)
    for bad in (float("nan"), float("inf")):
        state = copy.deepcopy(ck)
        state["model"]["encoder.A"][0, 1] = bad
        with pytest.raises(CheckpointError, match=r"encoder\.A.*not finite"):
            C.save_checkpoint(run, state)
        assert open(os.path.join(run, C.LAST), "rb").read() == good
    state = copy.deepcopy(ck)
    next(iter(state["optimizer"]["state"].values()))["exp_avg"].fill_(float("nan"))
    with pytest.raises(CheckpointError, match="optimizer state.*not finite"):
        C.save_checkpoint(run, state)
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]
    C.save_checkpoint(run, ck)                                   # control: the same state, finite, is written
    assert C.load_checkpoint(run)[0]["epoch"] == EPOCHS


def test_every_checkpoint_carries_a_checksum_that_is_verified(base, tmp_path):
    ck = load_pt(os.path.join(base[0], C.LAST))
    assert ck["sha256"] == C.state_digest(ck)
    flipped = copy.deepcopy(ck)
    flipped["model"]["head.bias"].view(torch.int32)[0] ^= 1      # one bit
    assert C.state_digest(flipped) != ck["sha256"]
    with pytest.raises(CheckpointError, match="checksum"):
        C.validate_checkpoint(flipped, "x.pt")
    assert C.state_digest({k: v for k, v in ck.items() if k != "sha256"}) == ck["sha256"]   # all but itself
    assert C.validate_checkpoint(ck, "x.pt", require=C.TRAINER_KEYS) is ck
    with pytest.raises(CheckpointError, match="x.pt holds containers nested more than"):   # never recursed into
        C.validate_checkpoint({**ck, "history": _nested(100000)}, "x.pt")


def test_the_trainers_checkpoint_fields_are_all_validated(base):
    """Every key the trainer writes is one validate_checkpoint knows (and a state with all of them passes)."""
    ck = load_pt(os.path.join(base[0], C.LAST))
    assert set(ck) == set(C.TRAINER_KEYS) | {C.DIGEST}
    C.validate_checkpoint(ck, "last.pt", epochs=EPOCHS, require=C.TRAINER_KEYS)
    with pytest.raises(CheckpointError, match=r"epoch = 2 must be an integer in \[1, 1\]"):
        C.validate_checkpoint(ck, "last.pt", epochs=1)


# ------------------------------------------------------------------------------------------------ crafted pickles
def _crafted_files(folder, obj):
    """``{label: path}``: ``{"model": obj}`` written by torch.save (zip and legacy formats) and plain pickle 0..5."""
    out = {}
    out["torch.save"] = os.path.join(folder, "zip.pt")
    torch.save({"model": obj}, out["torch.save"])
    out["torch.save legacy"] = os.path.join(folder, "legacy.pt")
    torch.save({"model": obj}, out["torch.save legacy"], _use_new_zipfile_serialization=False)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        out[f"pickle protocol {proto}"] = os.path.join(folder, f"p{proto}.pt")
        with open(out[f"pickle protocol {proto}"], "wb") as fh:
            pickle.dump({"model": obj}, fh, protocol=proto)
    return out


def test_a_crafted_pickle_is_reported_as_code_in_every_format_and_never_executed(tmp_path):
    """A pickle that calls ``posix.system`` is refused as code in every protocol, never as a truncated file (torch
    2.13 words its refusal "unsupported GLOBAL posix.system" and for protocols 0, 4, 5 stops at an opcode first);
    it is never executed, and a truly truncated file is still reported as unreadable."""
    for label, path in _crafted_files(str(tmp_path), Evil()).items():
        with pytest.raises(CheckpointError) as info:
            C.safe_load(path)
        msg = str(info.value)
        assert "loading could execute code" in msg and "system" in msg and "truncated" not in msg, (label, msg)
    Tripwire.path = str(tmp_path / "executed")
    for label, path in _crafted_files(str(tmp_path), Tripwire()).items():
        with pytest.raises(CheckpointError, match="loading could execute code"):
            C.safe_load(path)
        assert not os.path.exists(Tripwire.path), f"{label}: the pickle was executed"
    (tmp_path / "junk.pt").write_bytes(b"\x80\x02}q\x00(X\x05\x00\x00\x00model")    # a real truncation stays one
    with pytest.raises(CheckpointError, match="cannot be read as a checkpoint"):
        C.safe_load(str(tmp_path / "junk.pt"))


# ------------------------------------------------------------------------------------------- JSON and YAML bombs
def test_deeply_nested_documents_are_one_line_refusals_naming_the_file(tmp_path):
    """5,000 nested brackets (JSON or YAML) are a one-line refusal naming the file from every reader, never a
    RecursionError; NaN is refused, brackets inside strings are text."""
    from experiments.app.config import load_config
    from energies.errors import ConfigError
    from unfold import strict_json

    with pytest.raises(ValueError, match="nested 5000 levels deep"):
        strict_json.loads(deep())
    with pytest.raises(ValueError, match="NaN"):
        strict_json.loads('{"a": NaN}')
    assert strict_json.loads('{"a": ["[[[[", {"b": []}]}') == {"a": ["[[[[", {"b": []}]}
    from unfold.documents import read_document

    (tmp_path / "deep.json").write_text(deep())
    with pytest.raises(ConfigError, match="deep.json is not valid JSON .nested too deeply"):
        read_document(str(tmp_path / "deep.json"), json.load, ConfigError, str(tmp_path / "deep.json"), "JSON")
    for text in (deep(), "a:\n" + "".join(" " * i + "- \n" for i in range(1, 3000))):
        (tmp_path / "deep.yaml").write_text(text)
        with pytest.raises(ConfigError, match="deep.yaml.*nested"):
            load_config(str(tmp_path / "deep.yaml"))


# ---------------------------------------------------------------------------------------------------- bundles
def test_bundle_json_of_the_wrong_json_type_is_refused_naming_it(base, tmp_path):
    """bundle.json holding an array, a string, null or a number is refused naming the JSON type it holds."""
    from experiments.app.bundle import load_model

    folder = copy_folder(base[0], tmp_path / "b")
    for text, kind in (("[1, 2]", "array"), ('"x"', "string"), ("null", "null"), ("3", "number")):
        (tmp_path / "b" / "bundle.json").write_text(text)
        with pytest.raises(CheckpointError, match=f"bundle.json.*JSON object.*{kind}"):
            load_model(folder)


def test_a_folder_without_bundle_json_is_read_only_with_legacy_and_only_when_truly_legacy(base, tmp_path):
    """A folder without bundle.json is refused, so no hash check can be skipped by deleting it; with legacy=True it
    is still refused while it holds what only the current format writes (a checksummed checkpoint, a format-marked
    model.pt); a folder with neither loads with legacy=True, label names from its data, and swapped weights with
    another config are refused."""
    from experiments.app.bundle import load_model

    run = copy_folder(base[0], tmp_path / "run")
    os.unlink(os.path.join(run, "bundle.json"))
    with pytest.raises(CheckpointError, match="no bundle.json"):
        load_model(run)
    with pytest.raises(CheckpointError, match="last.pt is a checksummed checkpoint"):
        load_model(run, legacy=True)
    saved = copy_folder(base[1], tmp_path / "saved")
    os.unlink(os.path.join(saved, "bundle.json"))
    with pytest.raises(CheckpointError, match="model.pt carries the bundle format"):
        load_model(saved, legacy=True)
    for name in (C.LAST, C.PREV):                                 # a run folder from before checkpoint checksums
        os.unlink(os.path.join(run, name))
    old = load_model(run, legacy=True)
    assert old.label_names == ["0", "1"] and old.predict(["good great"])[0].verdict == "descent"
    other = load_pt(os.path.join(base[1], "model.pt"))["model"]   # swapped weights with another config: refused
    best = load_pt(os.path.join(run, "best.pt"))
    best["config"] = copy.deepcopy(best["config"])
    best["config"]["train"]["lr"] = 0.5
    best["model"] = other
    torch.save(best, os.path.join(run, "best.pt"))
    with pytest.raises(CheckpointError, match="another config"):
        load_model(run, legacy=True)


def test_bundle_weights_must_be_finite_and_save_model_refuses_a_nonfinite_model(base, tmp_path):
    from experiments.app.bundle import load_model, save_model

    folder = copy_folder(base[1], tmp_path / "saved")
    state = load_pt(os.path.join(folder, "model.pt"))
    assert state["format"] == "unfolded-transformers/bundle" and state["version"] == 1
    state["model"]["encoder.W"][0, 0, 0] = float("nan")
    torch.save(state, os.path.join(folder, "model.pt"))
    rehash(folder, "model.pt")
    with pytest.raises(CheckpointError, match=r"model.pt: model weight 'encoder.W' is not finite"):
        load_model(folder)
    model = load_model(str(base[1]))
    with torch.no_grad():
        model.model.head.bias.fill_(float("inf"))
    with pytest.raises(CheckpointError, match="head.bias.*not finite"):
        save_model(model, str(tmp_path / "nan"))
    assert not (tmp_path / "nan").exists()


def test_predict_with_an_unwritable_plot_prints_nothing_and_writes_nothing(base, tmp_path):
    """An unwritable ``--plot`` path (under a file, or a folder) is refused before any prediction is printed: exit
    2, empty stdout; a plot in a new folder is written."""
    (tmp_path / "afile").write_text("x")
    for plot in ("afile/e.png", "adir.png"):
        os.makedirs(tmp_path / "adir.png", exist_ok=True)
        line = expect_refusal(PREDICT, [str(base[0]), "--text", "good", "--plot", plot], str(tmp_path),
                              names=["--plot"])
        code, out, _ = run_cli(PREDICT, [str(base[0]), "--text", "good", "--plot", plot], str(tmp_path))
        assert code == 2 and out == "", line
    code, out, err = run_cli(PREDICT, [str(base[0]), "--text", "good", "--plot", "ok/e.png"], str(tmp_path))
    assert code == 0 and out.startswith(("0\t", "1\t")) and (tmp_path / "ok" / "e.png").exists(), err


# ------------------------------------------------------------------------------------------ the hostile table
def _ck(mutate, reseal=True):
    """A checkpoint case: ``mutate(state)`` on last.pt (re-sealed with a valid checksum, so that the field check is
    what refuses it, unless ``reseal`` is false); prev.pt removed so that nothing can be fallen back to."""
    def apply(folder):
        path = os.path.join(folder, C.LAST)
        state = load_pt(path)
        mutate(state)                     # in place (a return value is ignored)
        if reseal:
            state = seal(state)
        torch.save(state, path)
        os.unlink(os.path.join(folder, C.PREV))
    return apply


def _set(*keys_value):
    """``_ck`` mutation setting ``state[k1][k2]... = value``."""
    *keys, value = keys_value

    def mutate(state):
        target = state
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value(target[keys[-1]]) if callable(value) else value
    return mutate


def _raw(data):
    """A case replacing last.pt by ``data`` (bytes, or a callable(folder) writing it), prev.pt removed."""
    def apply(folder):
        path = os.path.join(folder, C.LAST)
        if callable(data):
            data(path)
        else:
            with open(path, "wb") as fh:
                fh.write(data)
        os.unlink(os.path.join(folder, C.PREV))
    return apply


def _pickled(obj, proto=None):
    def write(path):
        if proto is None:
            torch.save(obj, path)
        else:
            with open(path, "wb") as fh:
                pickle.dump(obj, fh, protocol=proto)
    return write


def _link(target_of):
    def write(path):
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target_of(path), path)
    return write


def _file(name, text=None, data=None, rehashed=False):
    """A bundle case: ``name`` in the folder replaced by ``text``/``data`` (and bundle.json re-hashed for it)."""
    def apply(folder):
        path = os.path.join(folder, name)
        if data is not None:
            open(path, "wb").write(data)
        else:
            open(path, "w", encoding="utf-8").write(text)
        if rehashed:
            rehash(folder, name)
    return apply


def _manifest(change, text=False):
    """A case editing bundle.json: ``change(manifest)`` in place, or (``text``) returning the new file's text."""
    def apply(folder):
        path = os.path.join(folder, "bundle.json")
        manifest = json.load(open(path))
        out = change(manifest)
        open(path, "w").write(out if text else json.dumps(manifest))
    return apply


def _weights(mutate, name="best.pt", rehashed=True):
    def apply(folder):
        path = os.path.join(folder, name)
        state = load_pt(path)
        mutate(state)                     # in place
        torch.save(state, path)
        if rehashed:
            rehash(folder, name)
    return apply


def _replace(name, writer, rehashed=True):
    def apply(folder):
        path = os.path.join(folder, name)
        os.unlink(path)
        writer(path)
        if rehashed and os.path.isfile(path):
            rehash(folder, name)
    return apply


def _nested(depth):
    x = []
    for _ in range(depth):
        x = [x]
    return x


def _first_opt(state):
    return next(iter(state["optimizer"]["state"].values()))


def _nan_weight(state):
    state["model"]["head.weight"][0, 0] = float("nan")


def _other_best_epoch(state):
    state["best_epoch"] = 2 if state["best_epoch"] == 1 else 1


NAN, INF = float("nan"), float("inf")

#: --resume cases: (id, apply(folder), words the error line must name)
RESUME_CASES = [
    ("epoch-huge", _ck(_set("epoch", 10 ** 18)), ["epoch", "1000000000000000000"]),
    ("epoch-zero", _ck(_set("epoch", 0)), ["epoch", "= 0"]),
    ("epoch-negative", _ck(_set("epoch", -1)), ["epoch", "-1"]),
    ("epoch-beyond-train.epochs", _ck(_set("epoch", EPOCHS + 1)), ["epoch", f"= {EPOCHS + 1}", "train.epochs"]),
    ("epoch-string", _ck(_set("epoch", "one")), ["epoch", "'one'"]),
    ("epoch-bool", _ck(_set("epoch", True)), ["epoch", "True"]),
    ("epoch-float", _ck(_set("epoch", 2.0)), ["epoch", "2.0"]),
    ("best_val-2", _ck(_set("best_val", 2.0)), ["best_val", "2.0"]),
    ("best_val-nan", _ck(_set("best_val", NAN)), ["best_val", "nan"]),
    ("best_val-negative", _ck(_set("best_val", -0.5)), ["best_val", "-0.5"]),
    ("best_val-string", _ck(_set("best_val", "0.5")), ["best_val", "'0.5'"]),
    ("best_val-not-the-history's", _ck(_set("best_val", 0.999)), ["best_val", "0.999"]),
    ("best_val-sentinel-with-history", _ck(_set("best_val", -1)), ["best_val", "-1"]),
    ("best_epoch-negative", _ck(_set("best_epoch", -3)), ["best_epoch", "-3"]),
    ("best_epoch-beyond", _ck(_set("best_epoch", 5)), ["best_epoch", "5"]),
    ("best_epoch-not-the-first-best", _ck(_other_best_epoch), ["best_epoch"]),
    ("train_inc-negative", _ck(_set("train_inc", -1)), ["train_inc", "-1"]),
    ("train_steps-negative", _ck(_set("train_steps", -5)), ["train_steps", "-5"]),
    ("train_steps-float", _ck(_set("train_steps", 1.5)), ["train_steps", "1.5"]),
    ("train_inc-above-steps", _ck(_set("train_inc", lambda v: 10 ** 6)), ["train_inc", "1000000"]),
    ("elapsed-nan", _ck(_set("elapsed", NAN)), ["elapsed", "nan"]),
    ("elapsed-negative", _ck(_set("elapsed", -1.0)), ["elapsed", "-1.0"]),
    ("elapsed-inf", _ck(_set("elapsed", INF)), ["elapsed", "inf"]),
    ("elapsed-string", _ck(_set("elapsed", "x")), ["elapsed"]),
    ("history-int", _ck(_set("history", 3)), ["history", "3"]),
    ("history-empty", _ck(_set("history", [])), ["history"]),
    ("history-epoch-renumbered", _ck(_set("history", 0, "epoch", 5)), ["history[0].epoch", "5"]),
    ("history-accuracy-1.5", _ck(_set("history", 0, "val_accuracy", 1.5)), ["history[0].val_accuracy", "1.5"]),
    ("history-loss-nan", _ck(_set("history", 0, "train_loss", NAN)), ["history[0].train_loss", "nan"]),
    ("history-count-negative", _ck(_set("history", 1, "train_energy_increases", -1)),
     ["history[1].train_energy_increases", "-1"]),
    ("history-extra-key", _ck(_set("history", 0, "evil", 1)), ["history[0]"]),
    ("history-steps-decrease", _ck(_set("history", 1, "train_energy_steps", 0)), ["history[1].train_energy_steps"]),
    ("history-record-string", _ck(_set("history", 0, "x")), ["history[0]", "'x'"]),
    ("untrained-count-negative", _ck(_set("untrained", "energy_increases", -1)), ["untrained.energy_increases"]),
    ("untrained-verdict-lies", _ck(_set("untrained", "energy_increases", 1)), ["untrained.energy_verdict", "descent"]),
    ("untrained-none", _ck(_set("untrained", None)), ["untrained", "None"]),
    ("untrained-mean-nan", _ck(_set("untrained", "energy_first_mean", NAN)), ["untrained.energy_first_mean", "nan"]),
    ("monitor-negative", _ck(_set("monitor", "steps", -1)), ["monitor.steps", "-1"]),
    ("monitor-confirmed-above-flagged", _ck(_set("monitor", "confirmed", 10 ** 6)), ["monitor.confirmed"]),
    ("monitor-list", _ck(_set("monitor", [])), ["monitor"]),
    ("monitor-messages", _ck(_set("monitor", "messages", [1])), ["monitor.messages"]),
    ("weight-scaled-no-reseal", _ck(_set("model", "head.weight", lambda t: t * 2), reseal=False),
     ["last.pt", "checksum"]),
    ("weight-nan", _ck(_nan_weight), ["last.pt", "head.weight", "not finite"]),
    ("weight-inf", _ck(_set("model", "encoder.A", lambda t: t.fill_(INF))), ["encoder.A", "not finite", "inf"]),
    ("weight-nan-no-reseal", _ck(_nan_weight, reseal=False), ["checksum"]),
    ("weight-string", _ck(_set("model", "head.weight", "w")), ["model['head.weight']"]),
    ("model-empty", _ck(_set("model", {})), ["model"]),
    ("adam-second-moment-negative", _ck(lambda s: _first_opt(s)["exp_avg_sq"].fill_(-1.0)), ["exp_avg_sq", "-1.0"]),
    ("adam-moment-nan", _ck(lambda s: _first_opt(s)["exp_avg"].fill_(NAN)), ["exp_avg", "not finite"]),
    ("adam-moment-wrong-shape", _ck(lambda s: _first_opt(s).update(exp_avg=torch.zeros(3))), ["exp_avg", "shape"]),
    ("adam-weight-decay-changed", _ck(_set("optimizer", "param_groups", 0, "weight_decay", 5.0)),
     ["weight_decay", "5.0"]),
    ("adam-eps-negative", _ck(_set("optimizer", "param_groups", 0, "eps", -1.0)), ["eps", "-1.0"]),
    ("adam-lr-nan", _ck(_set("optimizer", "param_groups", 0, "lr", NAN)), ["lr", "nan"]),
    ("adam-betas-2", _ck(_set("optimizer", "param_groups", 0, "betas", (2.0, 0.999))), ["betas"]),
    ("adam-params-wrong", _ck(_set("optimizer", "param_groups", 0, "params", [0])), ["params"]),
    ("scheduler-step-huge", _ck(_set("scheduler", "last_epoch", 10 ** 6)), ["scheduler.last_epoch", "1000000"]),
    ("scheduler-total-steps", _ck(_set("scheduler", "total_steps", 1)), ["scheduler.total_steps", "1"]),
    ("scheduler-extra-key", _ck(_set("scheduler", "optimizer", {})), ["scheduler"]),
    ("scheduler-lr-nan", _ck(_set("scheduler", "_last_lr", [NAN])), ["scheduler", "_last_lr", "nan"]),
    ("torch_rng-float", _ck(_set("torch_rng", lambda t: t.float())), ["torch_rng"]),
    ("data_rng-string", _ck(_set("data_rng", "abc")), ["data_rng", "'abc'"]),
    ("cuda_rng-int", _ck(_set("cuda_rng", 3)), ["cuda_rng", "3"]),
    ("config-int", _ck(_set("config", 3)), ["config", "3"]),
    ("config-other-lr", _ck(_set("config", "train", "lr", 0.5)), ["config"]),
    ("checksum-missing", _ck(lambda s: s.pop("sha256", None), reseal=False), ["sha256"]),
    ("checksum-garbage", _ck(lambda s: s.update(sha256="zz"), reseal=False), ["sha256", "'zz'"]),
    ("unknown-key", _ck(_set("evil", 1)), ["evil"]),
    ("model-key-missing", _ck(lambda s: s.pop("model")), ["model"]),
    ("vocab-int", _ck(_set("vocab", 3)), ["vocab", "3"]),
    ("fingerprint-string", _ck(_set("data_fingerprint", "x")), ["data_fingerprint", "'x'"]),
    ("nested-200-deep", _ck(_set("history", _nested(200)), reseal=False), ["last.pt", "nested"]),
    ("pickle-os.system", _raw(_pickled({"model": Evil()})), ["last.pt", "system", "execute code"]),
    ("pickle-protocol-0", _raw(_pickled({"model": Evil()}, 0)), ["last.pt", "system", "execute code"]),
    ("pickle-protocol-2", _raw(_pickled({"model": Evil()}, 2)), ["last.pt", "system", "execute code"]),
    ("pickle-protocol-5", _raw(_pickled({"model": Evil()}, 5)), ["last.pt", "system", "execute code"]),
    ("truncated", _raw(lambda p: open(p, "r+b").truncate(os.path.getsize(p) // 2)), ["last.pt", "cannot be read"]),
    ("empty-file", _raw(b""), ["last.pt"]),
    ("a-list", _raw(_pickled([1, 2])), ["last.pt", "list"]),
    ("symlink-dev-zero", _raw(_link(lambda p: "/dev/zero")), ["last.pt"]),
    ("a-folder", _raw(lambda p: (os.unlink(p), os.mkdir(p))), ["last.pt"]),
]


def _config_text(text):
    def apply(folder):
        open(os.path.join(folder, "config.yaml"), "w").write(text)
    return apply


RESUME_CASES += [
    ("config.yaml-nested", _config_text(deep()), ["config.yaml", "nested"]),
    ("config.yaml-list", _config_text("[1, 2]\n"), ["config.yaml", "mapping"]),
    ("config.yaml-not-utf8", lambda f: open(os.path.join(f, "config.yaml"), "wb").write(b"\xff\xfe name: x"),
     ["config.yaml", "UTF-8"]),
]


def _evil_best(proto):
    return _replace("best.pt", _pickled({"model": Evil()}, proto))


def _set_config_lr(state):
    state["config"] = copy.deepcopy(state["config"])
    state["config"]["train"]["lr"] = 0.5


#: unfold-predict cases on the run folder: (id, apply(folder), words the error line must name[, extra argv])
PREDICT_CASES = [
    ("bundle.json-array", _file("bundle.json", "[1, 2]"), ["bundle.json", "array"]),
    ("bundle.json-string", _file("bundle.json", '"bundle"'), ["bundle.json", "string"]),
    ("bundle.json-null", _file("bundle.json", "null"), ["bundle.json", "null"]),
    ("bundle.json-nested", _file("bundle.json", deep()), ["bundle.json", "nested"]),
    ("bundle.json-nested-in-key", _manifest(lambda m: json.dumps({**m, "dataset": "@"}).replace('"@"', deep(3000)),
                                            text=True), ["bundle.json", "nested"]),
    ("bundle.json-nan", _manifest(lambda m: json.dumps(m).replace('"version": 1', '"version": NaN'), text=True),
     ["bundle.json", "NaN"]),
    ("bundle.json-not-json", _file("bundle.json", "{format: "), ["bundle.json", "JSON"]),
    ("bundle.json-not-utf8", _file("bundle.json", data=b"\xff\xfe{}"), ["bundle.json", "UTF-8"]),
    ("version-true", _manifest(lambda m: m.update(version=True)), ["version", "True"]),
    ("version-string", _manifest(lambda m: m.update(version="1")), ["version", "'1'"]),
    ("version-2", _manifest(lambda m: m.update(version=2)), ["version", "2"]),
    ("format-wrong", _manifest(lambda m: m.update(format="pytorch")), ["format", "pytorch"]),
    ("format-list", _manifest(lambda m: m.update(format=[1])), ["format"]),
    ("weights-path", _manifest(lambda m: m.update(weights="../evil.pt")), ["weights", "../evil.pt"]),
    ("weights-int", _manifest(lambda m: m.update(weights=3)), ["weights", "3"]),
    ("label_names-string", _manifest(lambda m: m.update(label_names="ab")), ["label_names", "'ab'"]),
    ("label_names-ints", _manifest(lambda m: m.update(label_names=[1, 2])), ["label_names"]),
    ("label_names-one", _manifest(lambda m: m.update(label_names=["a"])), ["label_names"]),
    ("label_names-repeated", _manifest(lambda m: m.update(label_names=["a", "a"])), ["label_names"]),
    ("label_names-three", _manifest(lambda m: m.update(label_names=["a", "b", "c"])), ["head", "3"]),
    ("dataset-int", _manifest(lambda m: m.update(dataset=3)), ["dataset", "3"]),
    ("fingerprint-string", _manifest(lambda m: m.update(data_fingerprint="x")), ["data_fingerprint", "'x'"]),
    ("sha256-list", _manifest(lambda m: m.update(sha256=[])), ["sha256"]),
    ("sha256-missing-file", _manifest(lambda m: m["sha256"].pop("vocab.json")), ["sha256"]),
    ("sha256-not-hex", _manifest(lambda m: m["sha256"].update({"config.yaml": "z" * 64})), ["sha256"]),
    ("manifest-extra-key", _manifest(lambda m: m.update(evil=1)), ["evil"]),
    ("manifest-missing-key", _manifest(lambda m: m.pop("weights")), ["weights"]),
    ("bundle.json-folder", _replace("bundle.json", os.mkdir, rehashed=False), ["bundle.json", "folder"]),
    ("bundle.json-dev-zero", _replace("bundle.json", _link(lambda p: "/dev/zero"), rehashed=False),
     ["bundle.json", "not a regular file"]),
    ("bundle.json-deleted", lambda f: os.unlink(os.path.join(f, "bundle.json")), ["no bundle.json"]),
    ("bundle.json-deleted-legacy", lambda f: os.unlink(os.path.join(f, "bundle.json")),
     ["last.pt", "checksummed"], ["--legacy"]),
    ("vocab.json-nested", _file("vocab.json", deep(), rehashed=True), ["vocab.json", "nested"]),
    ("vocab.json-array", _file("vocab.json", "[1, 2]", rehashed=True), ["vocab.json", "itos"]),
    ("vocab.json-itos-string", _file("vocab.json", '{"itos": "abc"}', rehashed=True), ["vocab.json", "itos", "'abc'"]),
    ("vocab.json-no-specials", _file("vocab.json", '{"itos": ["a", "b"]}', rehashed=True), ["vocab.json", "<pad>"]),
    ("vocab.json-repeated", _file("vocab.json", '{"itos": ["<pad>", "<unk>", "a", "a"]}', rehashed=True),
     ["vocab.json", "repeat"]),
    ("vocab.json-changed", _file("vocab.json", '{"itos": ["<pad>", "<unk>", "a"]}'), ["vocab.json", "changed since"]),
    ("vocab.json-dev-zero", _replace("vocab.json", _link(lambda p: "/dev/zero"), rehashed=False),
     ["vocab.json", "not a regular file"]),
    ("vocab.json-missing", lambda f: os.unlink(os.path.join(f, "vocab.json")), ["vocab.json", "missing"]),
    ("config.yaml-nested", _file("config.yaml", deep(), rehashed=True), ["config.yaml", "nested"]),
    ("config.yaml-changed", _file("config.yaml", "name: x\n"), ["config.yaml", "changed since"]),
    ("config.yaml-bad-value", _file("config.yaml", "model:\n  layers: -1\n", rehashed=True), ["model.layers"]),
    ("best.pt-nan", _weights(_nan_weight), ["best.pt", "head.weight", "not finite"]),
    ("best.pt-scaled", _weights(_set("model", "head.weight", lambda t: t * 2), rehashed=False),
     ["best.pt", "changed since"]),
    ("best.pt-os.system", _evil_best(None), ["best.pt", "system", "execute code"]),
    ("best.pt-protocol-0", _evil_best(0), ["best.pt", "system", "execute code"]),
    ("best.pt-protocol-1", _evil_best(1), ["best.pt", "system", "execute code"]),
    ("best.pt-protocol-4", _evil_best(4), ["best.pt", "system", "execute code"]),
    ("best.pt-protocol-5", _evil_best(5), ["best.pt", "system", "execute code"]),
    ("best.pt-symlink-to-last.pt", _replace("best.pt", _link(lambda p: os.path.join(os.path.dirname(p), "last.pt")),
                                            rehashed=False), ["best.pt", "changed since"]),
    ("best.pt-dangling-link", _replace("best.pt", _link(lambda p: p + ".gone"), rehashed=False),
     ["best.pt", "cannot be opened"]),
    ("best.pt-extra-key", _weights(_set("evil", 1)), ["best.pt", "evil"]),
    ("best.pt-epoch-negative", _weights(_set("epoch", -1)), ["best.pt", "epoch", "-1"]),
    ("best.pt-val_accuracy-nan", _weights(_set("val_accuracy", NAN)), ["best.pt", "val_accuracy", "nan"]),
    ("best.pt-other-config", _weights(_set_config_lr), ["best.pt", "config"]),
    ("best.pt-no-model", _weights(lambda s: s.pop("model")), ["best.pt", "model"]),
    ("best.pt-model-string", _weights(_set("model", "head.weight", "x")), ["best.pt", "head.weight"]),
    ("best.pt-truncated", _replace("best.pt", lambda p: open(p, "wb").write(b"PK\x03\x04trunc")),
     ["best.pt", "cannot be read"]),
    ("plot-under-a-file", lambda f: open(os.path.join(os.path.dirname(f), "afile"), "w").write("x"),
     ["--plot", "afile"], ["--plot", "afile/e.png"]),
    ("plot-is-a-folder", lambda f: os.mkdir(os.path.join(os.path.dirname(f), "d.png")), ["--plot", "folder"],
     ["--plot", "d.png"]),
    ("plot-not-png", lambda f: None, ["--plot", "PNG"], ["--plot", "e.jpg"]),
    # One reading rule for every source of text (stdin: test_stdin_reads_by_the_files_rule)
    ("text-lone-surrogate", lambda f: None, ["--text number 2", "UTF-8", "\\udcff"], ["--text", "bad \udcff w1"]),
    ("text-lone-high-surrogate", lambda f: None, ["--text number 2", "UTF-8"], ["--text", "\ud800", "--json"]),
    ("file-not-utf8", lambda f: open(os.path.join(os.path.dirname(f), "bad.txt"), "wb").write(b"good\n\xff w1\n"),
     ["--file bad.txt", "UTF-8", "byte 5", "line 2"], ["--file", "bad.txt"]),
    ("file-surrogate-bytes", lambda f: open(os.path.join(os.path.dirname(f), "s.txt"), "wb").write(b"\xed\xb3\xbf"),
     ["--file s.txt", "UTF-8", "byte 0"], ["--file", "s.txt", "--json"]),
]

#: unfold-predict cases on the folder written by save_model (model.pt)
SAVED_CASES = [
    ("model.pt-nan", _weights(_nan_weight, "model.pt"), ["model.pt", "head.weight", "not finite"]),
    ("model.pt-inf", _weights(_set("model", "encoder.W", lambda t: t.fill_(-INF)), "model.pt"),
     ["model.pt", "encoder.W", "-inf"]),
    ("model.pt-format-wrong", _weights(_set("format", "x"), "model.pt"), ["model.pt", "format", "'x'"]),
    ("model.pt-version-string", _weights(_set("version", "1"), "model.pt"), ["model.pt", "version", "'1'"]),
    ("model.pt-os.system", _replace("model.pt", _pickled({"model": Evil()})), ["model.pt", "system"]),
    ("model.pt-scaled", _weights(_set("model", "encoder.A", lambda t: t * 3), "model.pt", rehashed=False),
     ["model.pt", "changed since"]),
    ("bundle.json-deleted-legacy", lambda f: os.unlink(os.path.join(f, "bundle.json")),
     ["model.pt", "bundle format"], ["--legacy"]),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_hostile_resume_is_refused(base, tmp_path, case):
    _, apply, names = case
    run = copy_folder(base[0], tmp_path / "run")
    apply(run)
    expect_refusal(TRAIN, ["--resume", run], str(tmp_path), names=names, watch=[str(base[2])])


@pytest.mark.parametrize("case", PREDICT_CASES + SAVED_CASES,
                         ids=[c[0] for c in PREDICT_CASES] + ["saved-" + c[0] for c in SAVED_CASES])
def test_hostile_bundle_is_refused_by_predict(base, tmp_path, case):
    ident, apply, names, *extra = case
    source = base[1] if case in SAVED_CASES else base[0]
    folder = copy_folder(source, tmp_path / "m")
    apply(folder)
    argv = [folder, "--text", "good great w1"] + (extra[0] if extra else [])
    expect_refusal(PREDICT, argv, str(tmp_path), names=names)


def test_the_table_has_more_than_80_cases_and_every_control_passes(base, tmp_path):
    """The table's size, and its positive controls: the untouched copies are accepted by both commands."""
    assert len(RESUME_CASES) + len(PREDICT_CASES) + len(SAVED_CASES) > 80
    for source in (base[0], base[1]):
        folder = copy_folder(source, tmp_path / os.path.basename(str(source)))
        code, out, err = run_cli(PREDICT, [folder, "--text", "good great w1", "--json"], str(tmp_path))
        assert code == 0 and json.loads(out.splitlines()[0])["verdict"] == "descent", err[-2000:]
    run = copy_folder(base[0], tmp_path / "resumed")
    _ck(lambda s: None)(run)                      # re-sealed unchanged, prev.pt removed: it resumes (re-evaluates)
    code, _, err = run_cli(TRAIN, ["--resume", run], str(tmp_path))
    assert code == 0, err[-2000:]
    assert not math.isnan(json.load(open(os.path.join(run, "metrics.json")))["val_accuracy"])


# ------------------------------------------------------------------ predict's input and output

BAD_BYTES = b"good great\n\xff\xfe bad\nw1 fine\n"


def _predict_proc(folder, argv, stdin_bytes, cwd):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", PREDICT, folder, *argv], input=stdin_bytes, capture_output=True,
                          cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_stdin_reads_by_the_files_rule(base, tmp_path, json_flag):
    """The same invalid bytes from stdin and from a file: both refused with the same reason; a file before anything
    is printed, stdin after the lines before the bad one are answered (line 1 only), never surrogate-escaped; valid
    UTF-8 on stdin is read."""
    path = tmp_path / "bad.txt"
    path.write_bytes(BAD_BYTES)
    lines = []
    for argv, data in ((["--file", "-"], BAD_BYTES), (["--file", str(path)], b"")):
        proc = _predict_proc(str(base[0]), argv + json_flag, data, str(tmp_path))
        err = proc.stderr.decode("utf-8")
        answered = proc.stdout.decode("utf-8").splitlines()
        expected = 1 if data else 0                     # stdin: line 1's answer, printed before line 2 is refused
        assert proc.returncode == 2 and len(answered) == expected, (argv, proc.returncode, proc.stdout[:300],
                                                                    err[-2000:])
        assert all("good great" in line for line in answered)
        assert "Traceback" not in err
        lines.append(err.strip().splitlines()[-1])
    for line in lines:
        assert "not UTF-8" in line and "byte 11" in line and "line 2" in line, line
    assert lines[0].split(": not UTF-8")[1].split(" (the 1 text(s) before")[0] == lines[1].split(": not UTF-8")[1]
    assert lines[0].endswith("(the 1 text(s) before it were answered above)")
    assert "--file - (stdin)" in lines[0]
    good = _predict_proc(str(base[0]), ["--file", "-", "--json"], "good great\ncafé w1\n".encode(), str(tmp_path))
    assert good.returncode == 0, good.stderr.decode()[-2000:]       # control: valid UTF-8 on stdin is read
    assert [json.loads(x)["text"] for x in good.stdout.decode("utf-8").splitlines()] == ["good great", "café w1"]


HOSTILE_TEXTS = ["good\tgreat", "bad\nawful w1", "w1\\tw2 \r fine", "x\x85y\u2028z\x00\x1b[31m", "plain café"]


def test_plain_output_is_one_line_a_text_and_six_fields(base, tmp_path):
    """A tab, newline or other separator in a text is escaped in the plain output (undone by Python's
    backslash escapes, as the help says), so each text stays one line of six tab-separated fields; ``--json``
    keeps the text as it is."""
    from experiments.app.predict import escape_field

    argv = [str(base[0])] + [a for t in HOSTILE_TEXTS for a in ("--text", t)]
    code, out, err = run_cli(PREDICT, argv, str(tmp_path))
    assert code == 0, err[-2000:]
    rows = out.split("\n")
    assert rows[-1] == "" and len(rows) == len(HOSTILE_TEXTS) + 1, out
    for row, text in zip(rows, HOSTILE_TEXTS):
        assert len(row.splitlines()) == 1
        fields = row.split("\t")
        assert len(fields) == 6, row                                     # the tokens field before the text
        assert fields[5] == escape_field(text)
        assert fields[5].encode("latin-1", "backslashreplace").decode("unicode_escape") == text
    assert escape_field("a\\tb") == "a\\\\tb" and escape_field("a\tb") == "a\\tb"   # a literal backslash-t stays apart
    code, out, err = run_cli(PREDICT, argv + ["--json"], str(tmp_path))
    assert code == 0, err[-2000:]
    out.encode("utf-8")                                              # no lone surrogate
    assert [json.loads(x)["text"] for x in out.splitlines()] == HOSTILE_TEXTS


def test_strict_json_refuses_a_number_that_overflows_to_inf():
    """Adversarial review: the strict reader refused NaN and Infinity but read ``1e400`` (and ``-1e400``) as
    inf, a non-finite value in a file that JSON says holds none."""
    from unfold import strict_json

    for text in ("1e400", '{"tau": -1e400}', "[1.5e309]"):
        with pytest.raises(ValueError, match="overflows a float64"):
            strict_json.loads(text)
    assert strict_json.loads('{"tau": 1.7976931348623157e308, "x": 5e-324}') == {"tau": 1.7976931348623157e308,
                                                                                  "x": 5e-324}
