"""Configs that compose: ``extends:`` chains, ``--print-config`` and overrides anywhere on
the command line of ``unfold-train``."""
import os

import pytest

from clifuzz import run_cli
from experiments.app import train as train_module
from experiments.app.config import ConfigError, dump_config, load_config, load_yaml
from test_train import ROOT

TRAIN = "experiments.app.train"


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def chain(tmp_path):
    """child.yaml -> sub/parent.yaml -> the shipped tiny."""
    _write(tmp_path / "sub" / "parent.yaml", "name: parent\nextends: tiny\nmodel: {d: 8, rho: cauchy}\n")
    return _write(tmp_path / "child.yaml", "extends: sub/parent.yaml\nmodel: {layers: 3}\ntrain: {epochs: 3}\n")


def test_extends_chain_merges_each_section_and_is_not_stored(chain, tmp_path):
    tiny = load_config("tiny")
    cfg = load_config(chain)
    assert "extends" not in cfg
    assert cfg["model"]["d"] == 8 and cfg["model"]["rho"] == "cauchy"          # from the parent
    assert cfg["model"]["layers"] == 3 and cfg["train"]["epochs"] == 3          # from the child
    assert cfg["model"]["heads"] == tiny["model"]["heads"] == 2                 # the grandparent, same section
    assert cfg["data"] == tiny["data"] and cfg["train"]["batch_size"] == tiny["train"]["batch_size"]
    assert cfg["name"] == "child"                  # its own stem: a parent's name is not inherited
    assert load_config(str(tmp_path / "sub" / "parent.yaml"))["name"] == "parent"
    assert "extends" not in dump_config(cfg)
    # overrides still win over every file of the chain
    assert load_config(chain, ["model.d=4"])["model"]["d"] == 4


def test_extends_is_resolved_beside_the_file_whatever_the_working_folder(chain, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path / "sub")
    assert load_config(chain)["model"]["d"] == 8


@pytest.mark.parametrize("files, names", [
    ({"a.yaml": "extends: a.yaml\n"}, ["circular", "a.yaml -> ", "a.yaml"]),
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: c.yaml\n", "c.yaml": "extends: a.yaml\n"},
     ["circular", "a.yaml", "b.yaml", "c.yaml"]),
    ({"a.yaml": "extends: nowhere\n"}, ["extends", "nowhere", "tiny"]),
    ({"a.yaml": "extends: sub/missing.yaml\n"}, ["extends", "missing.yaml"]),
    ({"a.yaml": "extends: 3\n"}, ["extends", "3"]),
    ({"a.yaml": "extends: ''\n"}, ["extends"]),
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "model: {widht: 3}\n"}, ["model.widht"]),
    ({"a.yaml": "model: {extends: tiny}\n"}, ["model.extends"]),          # a top-level key only
    # the merged config is validated as a whole: the parent's monitor with the child's trace
    ({"a.yaml": "extends: b.yaml\ntrain: {trace: false}\n", "b.yaml": "train: {monitor: strict}\n"},
     ["train.monitor", "train.trace"]),
])
def test_bad_chains_are_refused_naming_the_files(tmp_path, files, names):
    for name, text in files.items():
        _write(tmp_path / name, text)
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "a.yaml"))
    for word in names:
        assert word in str(info.value), (word, str(info.value))
    if "circular" in names:
        assert str(info.value).count("a.yaml") == 2        # the chain, closed on its first file


def _capture_train(monkeypatch):
    seen = {}

    def fake_train(cfg, run_dir, resume=False, overwrite=False):
        seen.update(cfg=cfg, run_dir=run_dir)
        return {}                                   # "another rank reports": main exits 0 without printing
    monkeypatch.setattr(train_module, "train", fake_train)
    return seen


def test_overrides_on_both_sides_of_run_dir_are_accepted(chain, tmp_path, monkeypatch):
    seen = _capture_train(monkeypatch)
    run_dir = str(tmp_path / "run")
    code, out, err = run_cli(TRAIN, ["--config", chain, "model.d=4", "--run-dir", run_dir, "train.epochs=2"], ROOT)
    assert code == 0, err
    assert seen["run_dir"] == run_dir
    assert seen["cfg"]["model"]["d"] == 4 and seen["cfg"]["train"]["epochs"] == 2
    assert seen["cfg"] == load_config(chain, ["model.d=4", "train.epochs=2"])
    # a bad override is still refused wherever it stands
    code, out, err = run_cli(TRAIN, ["--config", chain, "model.d=0", "--run-dir", run_dir], ROOT)
    assert code == 2 and "model.d" in err


def test_print_config_is_what_the_run_stores_and_writes_nothing(chain, tmp_path, monkeypatch):
    overrides = ["model.d=4", "train.epochs=2"]
    run_dir = tmp_path / "run"
    argv = ["--config", chain, overrides[0], "--run-dir", str(run_dir), overrides[1]]
    code, out, err = run_cli(TRAIN, argv + ["--print-config"], ROOT)
    assert code == 0, err
    assert not run_dir.exists() and not os.path.exists(os.path.join(ROOT, "runs", "child"))
    printed = load_yaml(out)
    assert printed == load_config(chain, overrides)
    seen = _capture_train(monkeypatch)
    assert run_cli(TRAIN, argv, ROOT)[0] == 0
    assert printed == seen["cfg"] == load_yaml(dump_config(seen["cfg"]))     # what config.yaml would hold
    lines = {line.split(":")[0].strip(): line for line in out.splitlines()}
    parent = str(tmp_path / "sub" / "parent.yaml")
    assert lines["d"].endswith("# override") and lines["epochs"].endswith("# override")
    assert lines["layers"].endswith(f"# config {chain}")
    assert lines["rho"].endswith(f"# config {os.path.join(os.path.dirname(chain), 'sub/parent.yaml')}") \
        or lines["rho"].endswith(f"# config {parent}")
    assert lines["glove"].endswith("tiny.yaml") and lines["heads"].endswith("tiny.yaml")
    assert lines["alpha"].endswith("# default") and lines["name"].endswith(f"# config {chain}")


def test_print_config_of_a_config_that_is_refused_exits_2(tmp_path):
    code, out, err = run_cli(TRAIN, ["--config", "tiny", "model.layers=0", "--print-config"], ROOT)
    assert code == 2 and "model.layers" in err and out == ""
