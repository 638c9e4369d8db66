"""Models people can share: a bundle is ``config.json`` + ``model.safetensors`` + ``vocab.json``
+ a model card ``README.md`` + ``bundle.json`` (format 2, sha256 of every file), loaded with
``TrainedModel.from_pretrained`` (a ``huggingface_hub`` ``ModelHubMixin``) from a folder holding no pickle file,
with no pickle reader called and no network; the trainer's run folder is such a bundle; format-1 bundles
(``best.pt``/``model.pt`` + ``config.yaml``) still load, and ``python -m experiments.app.bundle convert OLD NEW``
writes them as format 2, verified, OLD untouched.

One tiny run (1 layer, 2 epochs, a few seconds) is trained once per module and copied per test.
"""
import hashlib
import json
import os
import pickle
import shutil

import pytest
import torch

from clifuzz import expect_refusal, run_cli, snapshot
from energies.errors import CheckpointError
from test_train import CONFIGS, run_train, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")
TEXTS = ["good great w1 w2 w5", "bad awful w2 w3", "", "zzz unknown words only"]
CONVERT = "experiments.app.bundle"
NEW_FILES = ["README.md", "bundle.json", "config.json", "model.safetensors", "vocab.json"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run folder (the trainer's bundle)."""
    tmp = tmp_path_factory.mktemp("safetensors_bundle")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    folder = tmp / "run"
    proc = run_train(["--config", TINY, "--run-dir", str(folder), f"data.dataset={data}", "data.glove=none",
                      "train.epochs=2", "train.progress=false", "model.layers=1", "train.tensorboard=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(folder)


def as_format_1(folder):
    """Rewrite the bundle in ``folder`` as format 1 wrote it (the trainer's ``best.pt`` run folder, or
    ``save_model``'s ``model.pt`` + ``config.yaml``), the format-2 files removed: an old bundle."""
    from experiments.app.bundle import FORMAT, load_model, write_bundle_manifest
    from experiments.app.config import dump_config

    model = load_model(folder)
    for name in ("model.safetensors", "config.json", "README.md"):
        os.unlink(os.path.join(folder, name))
    weights = "best.pt" if os.path.exists(os.path.join(folder, "best.pt")) else "model.pt"
    if weights == "model.pt":
        torch.save({"model": model.model.state_dict(), "format": FORMAT, "version": 1},
                   os.path.join(folder, "model.pt"))
        with open(os.path.join(folder, "config.yaml"), "w") as fh:
            fh.write(dump_config(model.config))
    write_bundle_manifest(folder, weights, model.label_names, model.data_fingerprint, model.dataset,
                          graph=model.config["model"]["graph"])
    return folder


def copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.png", "tensorboard", ".lock"))
    return str(dst)


def rehash(folder, name):
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    manifest["sha256"][name] = hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
    json.dump(manifest, open(path, "w"))


def tensors_bytes(model):
    return {k: (str(v.dtype), tuple(v.shape), v.detach().cpu().contiguous().numpy().tobytes())
            for k, v in model.model.state_dict().items()}


def outputs(model):
    return [(p.label, p.probabilities, p.energies, p.verdict) for p in model.predict(TEXTS)]


@pytest.fixture
def no_pickle_no_network(monkeypatch):
    """Every pickle reader and torch.load fail, and so does every socket connection: a load that passes under
    this read no pickle and reached no network."""
    def refuse(*a, **k):
        raise AssertionError("a pickle reader or the network was used")
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    import socket
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_the_run_folder_is_a_safetensors_bundle_with_a_model_card(run):
    from huggingface_hub import ModelCard

    from experiments.app.bundle import load_model

    manifest = json.load(open(os.path.join(run, "bundle.json")))
    assert manifest["version"] == 2 and manifest["weights"] == "model.safetensors"
    assert sorted(manifest["sha256"]) == ["README.md", "config.json", "model.safetensors", "vocab.json"]
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256(open(os.path.join(run, name), "rb").read()).hexdigest() == digest
    model = load_model(run)
    assert json.load(open(os.path.join(run, "config.json"))) == model.config
    best = torch.load(os.path.join(run, "best.pt"), weights_only=True)["model"]      # the checkpoint stays
    assert all(torch.equal(best[k], v) for k, v in model.model.state_dict().items())  # = the bundle's weights
    card = ModelCard.load(os.path.join(run, "README.md"))
    assert card.data.library_name == "unfolded-transformers" and card.data.pipeline_tag == "text-classification"
    assert "safetensors" in card.data.tags and card.data.metrics == ["accuracy"]
    metrics = json.load(open(os.path.join(run, "metrics.json")))
    text = card.text
    assert f"**{metrics['energy_verdict']}**" in text and metrics["energy_tol_rule"] in text
    assert f"| test_accuracy | {metrics['test_accuracy']} |" in text
    assert "python -m experiments.app.train --config" in text and model.data_fingerprint["train"] in text
    assert manifest["metrics"]["energy_verdict"] == metrics["energy_verdict"] == "descent"


def test_the_card_and_the_log_name_the_checkpoint_the_test_figures_come_from(run):
    """The test figures are of the best-validation epoch (best.pt, the bundle's weights): the card says which of
    the run's 2 epochs with its validation accuracy, and so does the training log's last line."""
    from test_bundle_card import names_its_checkpoint

    metrics = json.load(open(os.path.join(run, "metrics.json")))
    best, val = metrics["best_epoch"], metrics["val_accuracy"]
    assert best in (1, 2)
    assert torch.load(os.path.join(run, "best.pt"), weights_only=True)["epoch"] == best
    assert names_its_checkpoint(open(os.path.join(run, "README.md"), encoding="utf-8").read(), best, 2, val)
    last = open(os.path.join(run, "train.log"), encoding="utf-8").read().splitlines()[-1]
    assert f"best-validation checkpoint: epoch {best} of 2" in last and f"validation accuracy {val:.4f}" in last


def test_from_pretrained_reads_a_folder_without_any_pickle_offline(run, tmp_path, no_pickle_no_network):
    from huggingface_hub import ModelHubMixin

    from experiments.app.bundle import TrainedModel

    model = TrainedModel.from_pretrained(run)
    out = model.save_pretrained(tmp_path / "shared")
    names = sorted(n for n in os.listdir(out) if not n.startswith("."))
    assert names == NEW_FILES
    assert not [n for n in names if n.endswith((".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt"))]
    back = TrainedModel.from_pretrained(out)
    assert isinstance(back, ModelHubMixin) and back.label_names == model.label_names
    assert outputs(back) == outputs(model)


def test_safetensors_round_trip_is_bit_equal(run, tmp_path):
    from experiments.app.bundle import TrainedModel

    model = TrainedModel.from_pretrained(run)
    a = model.save_pretrained(tmp_path / "a")
    back = TrainedModel.from_pretrained(a)
    assert tensors_bytes(back) == tensors_bytes(model)                    # every tensor, bit for bit
    assert [p.to_dict() for p in back.predict(TEXTS)] == [p.to_dict() for p in model.predict(TEXTS)]
    assert back.metrics == model.metrics and back.command == model.command and back.config == model.config
    b = back.save_pretrained(tmp_path / "b")                              # saving again writes the same bytes
    for name in NEW_FILES:
        assert open(os.path.join(a, name), "rb").read() == open(os.path.join(b, name), "rb").read(), name


def test_a_tampered_or_nan_safetensors_file_is_refused(run, tmp_path):
    import safetensors.torch

    from experiments.app.bundle import load_model

    folder = copy(run, tmp_path / "m")
    load_model(folder)                                                    # control: the intact copy loads
    path = os.path.join(folder, "model.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1                                                         # one bit of one weight
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors changed since bundle.json"):
        load_model(folder)
    expect_refusal("experiments.app.predict", [folder, "--text", "good"], str(tmp_path),
                   names=["model.safetensors", "changed since"])
    tensors = safetensors.torch.load(open(os.path.join(run, "model.safetensors"), "rb").read())
    meta = {"format": "unfolded-transformers/bundle/2"}
    tensors["head.weight"][0, 0] = float("nan")                           # a NaN weight, consistently re-hashed
    open(path, "wb").write(safetensors.torch.save(tensors, metadata=meta))
    rehash(folder, "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: model weight 'head.weight' is not finite"):
        load_model(folder)


# hostile format-2 files, each re-hashed in bundle.json (so that the file's own check is what refuses it)
def _st(change):
    def write(folder):
        import safetensors.torch

        path = os.path.join(folder, "model.safetensors")
        tensors = safetensors.torch.load(open(path, "rb").read())   # not mmapped: the file is rewritten
        meta = {"format": "unfolded-transformers/bundle/2"}
        data = change(tensors, meta)
        open(path, "wb").write(data if isinstance(data, bytes) else safetensors.torch.save(tensors, metadata=meta))
        rehash(folder, "model.safetensors")
    return write


def _config(change):
    def write(folder):
        path = os.path.join(folder, "config.json")
        cfg = json.load(open(path))
        change(cfg)
        json.dump(cfg, open(path, "w"))
        rehash(folder, "config.json")
    return write


HOSTILE = [
    ("pickle-in-safetensors", _st(lambda t, m: pickle.dumps({"model": t})), ["model.safetensors", "safetensors"]),
    ("zip-bytes-in-safetensors", _st(lambda t, m: b"PK\x03\x04truncated"), ["model.safetensors", "safetensors"]),
    ("no-metadata", _st(lambda t, m: m.clear()), ["model.safetensors", "metadata"]),
    ("inf-weight", _st(lambda t, m: t["encoder.A"].fill_(float("inf"))), ["encoder.A", "not finite"]),
    ("missing-weight", _st(lambda t, m: t.pop("head.bias")), ["model.safetensors", "head.bias"]),
    ("extra-weight", _st(lambda t, m: t.update(evil=torch.zeros(1))), ["model.safetensors", "evil"]),
    ("config-unknown-key", _config(lambda c: c["model"].update(evil=1)), ["config.json", "evil"]),
    ("config-bad-value", _config(lambda c: c["model"].update(layers=-1)), ["config.json", "model.layers"]),
    ("config-changed-not-rehashed", lambda f: open(os.path.join(f, "config.json"), "a").write(" "),
     ["config.json", "changed since"]),
    ("card-changed", lambda f: open(os.path.join(f, "README.md"), "a").write("edited"), ["README.md", "changed"]),
    ("card-missing", lambda f: os.unlink(os.path.join(f, "README.md")), ["README.md", "missing"]),
    ("manifest-metrics-list", lambda f: _manifest(f, metrics=[1]), ["metrics"]),
    ("manifest-command-int", lambda f: _manifest(f, command=3), ["command", "3"]),
    ("manifest-weights-best.pt", lambda f: _manifest(f, weights="best.pt"), ["weights", "version 2"]),
    ("manifest-version-3", lambda f: _manifest(f, version=3), ["version", "3"]),
    ("bundle.json-deleted-legacy", lambda f: os.unlink(os.path.join(f, "bundle.json")),
     ["model.safetensors", "bundle.json"], ["--legacy"]),
]


def _manifest(folder, **change):
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    manifest.update(change)
    json.dump(manifest, open(path, "w"))


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_format_2_bundle_is_refused_naming_the_file(run, tmp_path, case):
    from experiments.app.bundle import load_model

    _, apply, names, *extra = case
    folder = copy(run, tmp_path / "m")
    apply(folder)
    with pytest.raises(CheckpointError) as info:
        load_model(folder, legacy=bool(extra))
    assert all(n in str(info.value) for n in names), (names, str(info.value))


def test_an_old_bundle_still_loads_and_the_converter_writes_it_as_format_2(run, tmp_path):
    from experiments.app.bundle import load_model

    current = load_model(run)
    for kind, source in (("run", run), ("saved", None)):
        if source is None:                   # format 1's save_model folder: model.pt + config.yaml
            source = str(tmp_path / "saved_v2")
            current.save_pretrained(source)
        old = as_format_1(copy(source, tmp_path / f"old_{kind}"))
        manifest = json.load(open(os.path.join(old, "bundle.json")))
        assert manifest["version"] == 1 and manifest["weights"] in ("best.pt", "model.pt")
        assert not os.path.exists(os.path.join(old, "model.safetensors"))
        loaded = load_model(old)                                        # format 1 still loads (weights_only)
        assert tensors_bytes(loaded) == tensors_bytes(current) and outputs(loaded) == outputs(current)
        before = snapshot(old)
        new = str(tmp_path / f"new_{kind}")
        code, out, err = run_cli(CONVERT, ["convert", old, new], str(tmp_path))
        assert code == 0, err[-2000:]
        assert snapshot(old) == before                                  # OLD untouched, byte for byte
        assert sorted(n for n in os.listdir(new) if not n.startswith(".")) == NEW_FILES
        converted = load_model(new)
        assert json.load(open(os.path.join(new, "bundle.json")))["version"] == 2
        assert tensors_bytes(converted) == tensors_bytes(loaded)
        assert [p.to_dict() for p in converted.predict(TEXTS)] == [p.to_dict() for p in loaded.predict(TEXTS)]
        card = open(os.path.join(new, "README.md")).read()
        assert "bundle convert" in card and ("**descent**" in card if kind == "run" else "Not recorded" in card)


def test_the_converter_refuses_and_writes_nothing(run, tmp_path):
    old = as_format_1(copy(run, tmp_path / "old"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("x")
    expect_refusal(CONVERT, ["convert", old, old], str(tmp_path), names=["OLD itself"])
    expect_refusal(CONVERT, ["convert", old, os.path.join(old, "inside")], str(tmp_path), names=["inside OLD"])
    expect_refusal(CONVERT, ["convert", old, str(tmp_path / "full")], str(tmp_path), names=["full", "not an empty"])
    with open(os.path.join(old, "vocab.json"), "a") as fh:             # a tampered OLD: refused, nothing at NEW
        fh.write(" ")
    expect_refusal(CONVERT, ["convert", old, str(tmp_path / "new")], str(tmp_path), names=["vocab.json", "changed"])
    assert not (tmp_path / "new").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".convert")]


def test_push_to_hub_uploads_the_bundle_the_mixin_saves(run, tmp_path, monkeypatch):
    """The mixin's push_to_hub, its Hub client replaced by a recorder (no network): what it uploads is the
    format-2 bundle, which loads."""
    import huggingface_hub.hub_mixin as hub

    from experiments.app.bundle import TrainedModel

    seen = {}

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, **kw):
            return type("Repo", (), {"repo_id": repo_id})()

        def upload_folder(self, repo_id, folder_path, **kw):
            seen["files"] = sorted(os.listdir(folder_path))
            seen["copy"] = shutil.copytree(folder_path, tmp_path / "uploaded")
            return f"https://hub/{repo_id}/commit/1"

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    model = TrainedModel.from_pretrained(run)
    assert model.push_to_hub("someone/tiny") == "https://hub/someone/tiny/commit/1"
    assert [n for n in seen["files"] if not n.startswith(".")] == NEW_FILES
    assert outputs(TrainedModel.from_pretrained(str(seen["copy"]))) == outputs(model)


def test_from_pretrained_of_a_hub_id_downloads_bundle_files_only(run, tmp_path, monkeypatch):
    """A name that is no local folder and reads as a Hub id is downloaded (here: a stand-in for snapshot_download
    that copies the run), asking for the bundle's files only, never a .pt checkpoint; a failing download is one
    CheckpointError naming the id."""
    import huggingface_hub

    from experiments.app.bundle import TrainedModel

    asked = {}

    def fake_snapshot(repo_id, allow_patterns=None, **kw):
        asked["patterns"] = allow_patterns
        out = tmp_path / "cache"
        shutil.copytree(run, out, ignore=lambda d, names: [n for n in names if n not in allow_patterns])
        return str(out)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    model = TrainedModel.from_pretrained("someone/tiny")
    assert not [p for p in asked["patterns"] if p.endswith(".pt")]
    assert sorted(n for n in os.listdir(tmp_path / "cache")) == NEW_FILES
    assert outputs(model) == outputs(TrainedModel.from_pretrained(run))

    def offline(repo_id, **kw):
        raise OSError("offline")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="'someone/other': no such model folder.*offline"):
        TrainedModel.from_pretrained("someone/other")
