"""A model trained on an edge-list graph (``model.graph=FILE.npy``) holds that graph: the run
folder, and so its bundle, keeps a copy (``graph.npy``) under its sha256, and the bundle predicts with it whatever
happens to the file afterwards (edited, moved with the bundle, deleted). A changed copy is refused; a bundle
written before bundles held their graph loads when the file is there and is refused, naming the path to restore,
when it is not; ``save_model`` of such a model writes a bundle holding it.

One tiny run is trained once per module (a subprocess, a few seconds) and copied per test.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from clifuzz import expect_refusal
from energies.errors import CheckpointError
from test_train import CONFIGS, ROOT, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")
#: node ids must lie below every batch's length: the graph spans the first N tokens, each text has at least N
N = 4
TEXTS = ["good great w1 w2 w5", "bad awful w2 w3", "w4 good bad bad great w1"]


def chain(n=N):
    """A path graph over ``n`` ids (both directions): the graph trained on."""
    i = np.arange(n - 1)
    return np.stack([np.concatenate([i, i + 1]), np.concatenate([i + 1, i])]).astype(np.int64)


def everything(n=N):
    """Every ordered pair of distinct ids: what the file is edited into after training."""
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    keep = a != b
    return np.stack([a[keep], b[keep]]).astype(np.int64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(run folder, graph file)``: a finished tiny run on the chain graph read from a ``.npy`` file."""
    tmp = tmp_path_factory.mktemp("graph_bundle")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    graph = str(tmp / "edges" / "g.npy")
    os.makedirs(os.path.dirname(graph))
    np.save(graph, chain())
    run = tmp / "run"
    proc = subprocess.run([sys.executable, "-m", "experiments.app.train", "--config", TINY, "--run-dir", str(run),
                           f"data.dataset={data}", "train.epochs=1", "train.progress=false", "model.layers=2",
                           "train.tensorboard=false", f"model.graph={graph}"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(run), graph


def _copy(trained, tmp_path):
    """A fresh copy of the run and of its graph file (each test edits its own): ``(run, graph)``, the copied
    bundle's config still naming the original file's path, which the copy of the file then replaces."""
    run, graph = trained
    folder = str(tmp_path / "run")
    shutil.copytree(run, folder)
    np.save(graph, chain())           # the file as trained on (a test before may have edited it)
    return folder, graph


def predict(folder):
    from experiments.app.bundle import load_model

    out = load_model(folder).predict(TEXTS)
    return [p.probabilities for p in out], [p.energies for p in out]


def test_the_run_folder_holds_the_graph_and_its_checksum(trained, tmp_path):
    folder, graph = _copy(trained, tmp_path)
    manifest = json.load(open(os.path.join(folder, "bundle.json")))
    assert manifest["graph"] == {"spec": graph, "file": "graph.npy"}
    assert np.array_equal(np.load(os.path.join(folder, "graph.npy")), chain())
    import hashlib

    assert manifest["sha256"]["graph.npy"] == hashlib.sha256(open(os.path.join(folder, "graph.npy"), "rb").read()
                                                             ).hexdigest()


def test_editing_the_graph_file_after_training_changes_no_prediction(trained, tmp_path):
    folder, graph = _copy(trained, tmp_path)
    before = predict(folder)
    np.save(graph, everything())
    assert predict(folder) == before
    # the negative control: a model built on the edited file does predict otherwise
    from experiments.app.bundle import load_model
    from experiments.app.build import build_model

    tm = load_model(folder)
    other = build_model({**tm.config}, len(tm.vocab), len(tm.label_names)).eval()
    other.load_state_dict(tm.model.state_dict())
    ids, mask = tm.encode(TEXTS)
    with torch.no_grad():
        assert not torch.allclose(other(ids, mask).logits, tm.model(ids, mask).logits)


def test_a_moved_bundle_whose_graph_file_is_deleted_still_predicts_the_same(trained, tmp_path):
    folder, graph = _copy(trained, tmp_path)
    before = predict(folder)
    moved = str(tmp_path / "elsewhere" / "model")
    os.makedirs(os.path.dirname(moved))
    shutil.move(folder, moved)
    os.unlink(graph)
    try:
        assert predict(moved) == before
        from experiments.app.bundle import load_model, save_model

        saved = str(tmp_path / "saved")        # saved again: the copy goes with it
        save_model(load_model(moved), saved)
        assert predict(saved) == before
    finally:
        np.save(graph, chain())


def test_a_changed_copy_of_the_graph_is_refused(trained, tmp_path):
    folder, _ = _copy(trained, tmp_path)
    np.save(os.path.join(folder, "graph.npy"), everything())
    expect_refusal("experiments.app.predict", [folder, "--text", TEXTS[0]], str(tmp_path),
                   names=["graph.npy", "changed since"])


def _as_old_bundle(folder):
    """The bundle as written before bundles held their graph (format 1: format 2 came later, and its model card
    records bundle.json's fields, so removing the key from a format-2 manifest is an edit that is refused): no
    ``graph.npy``, no ``graph`` key."""
    from test_bundle_safetensors import as_format_1

    as_format_1(folder)
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    manifest.pop("graph")
    manifest["sha256"].pop("graph.npy")
    json.dump(manifest, open(path, "w"))
    os.unlink(os.path.join(folder, "graph.npy"))


def test_an_old_bundle_loads_when_its_graph_file_is_there_and_is_refused_naming_it_when_gone(trained, tmp_path):
    folder, graph = _copy(trained, tmp_path)
    before = predict(folder)
    _as_old_bundle(folder)
    assert predict(folder) == before
    from experiments.app.bundle import load_model, save_model

    saved = str(tmp_path / "saved")
    save_model(load_model(folder), saved)           # the upgrade: a bundle holding the graph
    assert os.path.isfile(os.path.join(saved, "graph.npy"))
    os.unlink(graph)
    try:
        with pytest.raises(CheckpointError, match="restore it at"):
            load_model(folder)
        expect_refusal("experiments.app.predict", [folder, "--text", TEXTS[0]], str(tmp_path),
                       names=["g.npy", "restore"])
        assert predict(saved) == before
    finally:
        np.save(graph, chain())


def test_a_manifest_graph_key_that_does_not_fit_is_refused(trained, tmp_path):
    folder, _ = _copy(trained, tmp_path)
    path = os.path.join(folder, "bundle.json")
    manifest = json.load(open(path))
    manifest["graph"]["file"] = "../evil.npy"
    json.dump(manifest, open(path, "w"))
    expect_refusal("experiments.app.predict", [folder, "--text", TEXTS[0]], str(tmp_path), names=["graph"])
