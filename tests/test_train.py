import json
import os
import random
import subprocess
import sys

import pytest
import torch
import yaml

from experiments.config import DEFAULTS, ConfigError, apply_overrides, dump_config, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "experiments", "configs")


def synthetic_text_dir(path, n_train=600, n_eval=150, seed=0):
    """A separable toy sentiment set as exported JSONL splits (the trainer uses them as they are)."""
    rng = random.Random(seed)
    pos, neg = ["good", "great", "fine", "lovely", "superb"], ["bad", "awful", "poor", "dull", "boring"]
    filler = [f"w{i}" for i in range(40)]

    def make(n):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            words = [rng.choice(filler) for _ in range(rng.randint(3, 12))]
            for _ in range(rng.randint(1, 3)):
                words.insert(rng.randint(0, len(words)), rng.choice(pos if label else neg))
            rows.append({"text": " ".join(words), "label": label})
        return rows

    os.makedirs(path, exist_ok=True)
    for name, n in (("train", n_train), ("val", n_eval), ("test", n_eval)):
        with open(os.path.join(path, f"{name}.jsonl"), "w") as fh:
            for r in make(n):
                fh.write(json.dumps(r) + "\n")
    return str(path)


def run_train(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "experiments.train"] + args, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_tiny_synthetic_text_trains_to_high_accuracy(tmp_path, mode):
    data = synthetic_text_dir(tmp_path / "toy")
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run),
                      f"data.dataset={data}", "data.glove=none", f"model.mode={mode}", "train.epochs=12",
                      "train.batch_size=32", "train.lr=0.005", "train.progress=false", "model.layers=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test_accuracy"] >= 0.9, metrics
    for key in ("test_accuracy", "val_accuracy", "train_seconds", "params", "energy_steps", "energy_increases",
                "energy_max_rel_increase"):
        assert key in metrics and key in summary
    assert metrics["energy_steps"] == 150 * 2
    if mode == "guaranteed":
        assert metrics["energy_increases"] == 0 and metrics["untrained"]["energy_increases"] == 0
        assert metrics["train_energy_increases"] == 0 and metrics["train_energy_steps"] > 0
    for f in ("best.pt", "config.yaml", "vocab.json", "history.json", "energy_trace.pt", "energy_descent.png",
              "training_curves.png"):
        assert (run / f).stat().st_size > 0, f
    trace = torch.load(run / "energy_trace.pt", weights_only=False)
    assert all(v.shape == (150, 3) and v.dtype == torch.float64 for v in trace["energies"].values())
    # plots are redrawn from the saved data
    os.remove(run / "energy_descent.png")
    proc = subprocess.run([sys.executable, "-m", "experiments.plot_energy", str(run)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and (run / "energy_descent.png").exists()


def test_training_is_reproducible(tmp_path):
    data = synthetic_text_dir(tmp_path / "toy", n_train=200, n_eval=50)
    accs = []
    for k in range(2):
        proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(tmp_path / f"r{k}"),
                          f"data.dataset={data}", "data.glove=none", "train.epochs=2", "train.progress=false"])
        assert proc.returncode == 0, proc.stderr[-2000:]
        accs.append(json.loads((tmp_path / f"r{k}" / "history.json").read_text()))
    strip = [[{k: v for k, v in h.items() if k != "seconds"} for h in hist] for hist in accs]
    assert strip[0] == strip[1]


@pytest.mark.parametrize("name", sorted(os.listdir(CONFIGS)))
def test_shipped_configs_load_and_round_trip(name, tmp_path):
    cfg = load_config(os.path.join(CONFIGS, name))
    assert cfg["name"] == os.path.splitext(name)[0]
    path = tmp_path / "again.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(str(path)) == cfg


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'model.depth'; valid keys in model: alpha, attention, attention_temperature, curvature, d, "):
        load_config(None, ["model.depth=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'optim'; valid keys: data, model, name, train"):
        load_config(None, ["optim.lr=3"])
    with pytest.raises(ConfigError, match="'model.layers' must be int, got str 'four'"):
        load_config(None, ["model.layers=four"])
    with pytest.raises(ConfigError, match="'model.mode' must be one of"):
        load_config(None, ["model.mode=recurrent"])
    with pytest.raises(ConfigError, match="'train.trace' must be bool"):
        load_config(None, ["train.trace=3"])
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(None, ["model.layers"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  mode: guaranteed\n  widht: 3\n")
    with pytest.raises(ConfigError, match="widht"):
        load_config(str(bad))
    cfg = load_config(None, ["model.tau=2", "train.lr=1"])
    assert cfg["model"]["tau"] == 2.0 and isinstance(cfg["train"]["lr"], float)
    assert apply_overrides(yaml.safe_load(dump_config(DEFAULTS)), ["name=x"])["name"] == "x"


def test_bad_config_exits_2_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), "model.nope=1"])
    assert proc.returncode == 2
    assert "unknown config key 'model.nope'" in proc.stderr and "Traceback" not in proc.stderr
    assert not run.exists()


def test_missing_data_says_how_to_fetch_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, UNFOLD_DATA=str(tmp_path / "empty"))
    proc = subprocess.run([sys.executable, "-m", "experiments.train", "--config", os.path.join(CONFIGS, "tiny.yaml"),
                           "--run-dir", str(run)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 2
    assert "python -m experiments.data fetch --dataset rotten_tomatoes" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()


def test_activation_sweep_trains_probes_tabulates_and_resumes(tmp_path):
    """experiments.activations on a toy set: two spline variants, one non-spline; a rerun reuses the runs."""
    data = synthetic_text_dir(tmp_path / "toy", n_train=200, n_eval=60)
    args = [sys.executable, "-m", "experiments.activations", "--out", str(tmp_path / "sweep"), "--epochs", "1",
            "--only", "std-relu-nonorm", "mm-relu-const", "mm-relu", "--probe-n", "3",
            "--set", f"data.dataset={data}", "data.glove=none", "model.d=8", "model.heads=1", "model.layers=2",
            "train.threads=1"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((tmp_path / "sweep" / "results.json").read_text())}
    for name in ("std-relu-nonorm", "mm-relu-const"):
        assert rows[name]["probe_layer1"]["verdict"] == "spline" and rows[name]["probe_layer1"]["degree"] == 3
        assert rows[name]["static_degree_bound"] == 9
    assert rows["mm-relu"]["probe_layer1"]["verdict"] == "non-spline" and rows["mm-relu"]["static_degree_bound"] is None
    assert rows["mm-relu"]["energy_increases"] == rows["mm-relu-const"]["energy_increases"] == 0
    table = (tmp_path / "sweep" / "table.md").read_text()
    assert table.count("\n| ") == 4 and "3^2 = 9" in table
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr.count("reusing") == 3
    bad = subprocess.run([sys.executable, "-m", "experiments.activations", "--only", "mm-gelu"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "unknown variant(s) ['mm-gelu']; valid:" in bad.stderr
