import json
import os
import random
import subprocess
import sys

import pytest
import torch
import yaml

from experiments.app.config import DEFAULTS, ConfigError, apply_overrides, dump_config, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "experiments", "configs")


def synthetic_text_dir(path, n_train=600, n_eval=150, seed=0):
    """A separable toy sentiment set as exported JSONL splits (the trainer uses them as they are): the
    application's own offline set (:func:`experiments.studies.variants.write_toy_data`, also ``--quick``'s data)."""
    from experiments.studies.variants import write_toy_data

    os.makedirs(path, exist_ok=True)
    return write_toy_data(str(path), n_train, n_eval, seed)


def run_train(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "experiments.app.train"] + args, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_tiny_synthetic_text_trains_to_high_accuracy(tmp_path, mode):
    data = synthetic_text_dir(tmp_path / "toy", n_train=400)
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run),
                      f"data.dataset={data}", "data.glove=none", f"model.mode={mode}", "train.epochs=12",
                      "train.batch_size=32", "train.lr=0.005", "train.progress=false", "model.layers=2",
                      "train.device=auto"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["device"] == ("cuda" if torch.cuda.is_available() else "cpu")        # train.device=auto
    assert metrics["test_accuracy"] >= 0.9, metrics
    for key in ("test_accuracy", "val_accuracy", "train_seconds", "params", "energy_steps", "energy_increases",
                "energy_max_rel_increase"):
        assert key in metrics and key in summary
    assert metrics["energy_steps"] == 150 * 2
    if mode == "guaranteed":
        assert metrics["energy_increases"] == 0 and metrics["untrained"]["energy_increases"] == 0
        assert metrics["train_energy_increases"] == 0 and metrics["train_energy_steps"] > 0
        mon = metrics["descent_monitor"]
        assert mon["mode"] == "warn" and mon["confirmed"] == 0 and mon["steps_checked"] == metrics["train_energy_steps"]
    for f in ("best.pt", "config.yaml", "vocab.json", "history.json", "energy_trace.pt", "energy_descent.png",
              "training_curves.png"):
        assert (run / f).stat().st_size > 0, f
    trace = torch.load(run / "energy_trace.pt", weights_only=True)
    assert all(v.shape == (150, 3) and v.dtype == torch.float64 for v in trace["energies"].values())
    # plots are redrawn from the saved data
    os.remove(run / "energy_descent.png")
    proc = subprocess.run([sys.executable, "-m", "experiments.app.plot_energy", str(run)], capture_output=True,
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
    strip = [[{k: v for k, v in h.items() if k not in TIMING} for h in hist] for hist in accs]
    assert strip[0] == strip[1] and all("train_tokens" in h for h in strip[0])


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
    with pytest.raises(ConfigError, match=r"unknown config key 'optim'; valid keys: data, model, name, pretrain, task, train"):
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
    proc = subprocess.run([sys.executable, "-m", "experiments.app.train", "--config", os.path.join(CONFIGS, "tiny.yaml"),
                           "--run-dir", str(run)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 2
    assert "unfold-data fetch --dataset rotten_tomatoes" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()


def test_activation_sweep_trains_probes_tabulates_and_resumes(tmp_path):
    """experiments.studies.activations on a toy set: two spline variants, one non-spline; a rerun reuses the runs."""
    data = synthetic_text_dir(tmp_path / "toy", n_train=96, n_eval=40)
    args = [sys.executable, "-m", "experiments.studies.activations", "--out", str(tmp_path / "sweep"), "--epochs", "1",
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
    from clifuzz import run_cli

    code, _, err = run_cli("experiments.studies.activations", ["--only", "mm-gelu"], ROOT)      # in process
    assert code == 2 and "invalid choice: 'mm-gelu'" in err and "Traceback" not in err


TIMING = ("train_seconds", "seconds", "train_pass_seconds", "train_tokens_per_second", "peak_memory_bytes",
          "peak_memory_growth_bytes")    # measured (experiments.throughput): the rest must match


def _strip_timing(x):
    if isinstance(x, dict):
        return {k: _strip_timing(v) for k, v in x.items() if k not in TIMING}
    if isinstance(x, list):
        return [_strip_timing(v) for v in x]
    return x


def _resume_args(run):
    return ["--resume", str(run)]


def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path):
    """Kill training with SIGKILL at random moments (after checkpoints), resume each time: the final
    metrics, model and energy trace equal those of an uninterrupted run; no checkpoint is ever unloadable."""
    import time

    from experiments.app.checkpoint import LAST, load_checkpoint

    data = synthetic_text_dir(tmp_path / "toy", n_train=320, n_eval=64)
    base = ["--config", os.path.join(CONFIGS, "tiny.yaml"), f"data.dataset={data}", "data.glove=none", "train.epochs=5",
            "train.progress=false", "model.layers=2", "train.threads=1", "train.batch_size=16"]
    ref = tmp_path / "ref"
    assert run_train(base[:2] + ["--run-dir", str(ref)] + base[2:]).returncode == 0
    run = tmp_path / "killed"
    rng = random.Random(0)
    kills = resumes = 0
    for attempt in range(14):
        if (run / "metrics.json").exists():
            break
        started = (run / LAST).exists()
        args = _resume_args(run) if started else base[:2] + ["--run-dir", str(run)] + base[2:]
        resumes += started
        proc = subprocess.Popen([sys.executable, "-m", "experiments.app.train"] + args, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        before = (run / LAST).stat().st_mtime_ns if (run / LAST).exists() else 0
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:     # wait for a new checkpoint, then a random moment
            if (run / LAST).exists() and (run / LAST).stat().st_mtime_ns != before:
                time.sleep(rng.uniform(0.0, 0.25))           # within the next epoch (about 0.5 s here)
                break
            time.sleep(0.02)
        if proc.poll() is None and attempt < 12:
            proc.kill()
            kills += 1
        err = proc.communicate()[1]
        assert proc.returncode in (0, -9), err[-2000:]
        if (run / LAST).exists() or (run / "prev.pt").exists():
            load_checkpoint(str(run))                               # never an unloadable state
    assert kills >= 2 and resumes >= 2, (kills, resumes)
    final = run_train(_resume_args(run)) if not (run / "metrics.json").exists() else None
    assert final is None or final.returncode == 0, final.stderr[-2000:]
    got, want = (json.loads((d / "metrics.json").read_text()) for d in (run, ref))
    assert _strip_timing(got) == _strip_timing(want)
    assert _strip_timing(json.loads((run / "history.json").read_text())) == \
        _strip_timing(json.loads((ref / "history.json").read_text()))
    a, b = (torch.load(d / "best.pt", weights_only=True)["model"] for d in (run, ref))
    assert all(torch.equal(a[k], b[k]) for k in b)


def test_corrupt_last_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    """A resume whose last.pt cannot be loaded resumes from prev.pt (after epoch 2) and ends with the metrics of the
    run it resumes; with neither loadable it is refused, and so is a resume given a config override. The runs are
    calls of the trainer's main in this process."""
    from experiments.app.train import main

    def train(argv):
        capsys.readouterr()
        threads = torch.get_num_threads()
        try:
            code = main(argv)
        finally:
            torch.set_num_threads(threads)
        return code, capsys.readouterr().err

    data = synthetic_text_dir(tmp_path / "toy", n_train=80, n_eval=24)
    run = tmp_path / "run"
    args = ["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
            "data.glove=none", "train.epochs=3", "train.progress=false", "train.threads=1"]
    assert train(args)[0] == 0
    want = json.loads((run / "metrics.json").read_text())
    (run / "last.pt").write_bytes(b"not a checkpoint")
    code, err = train(["--resume", str(run)])
    assert code == 0, err[-2000:]
    assert "last.pt cannot be loaded" in err and "resuming" in err and "after epoch 2" in err
    assert _strip_timing(json.loads((run / "metrics.json").read_text())) == _strip_timing(want)
    (run / "last.pt").write_bytes(b"x")
    (run / "prev.pt").write_bytes(b"y")
    code, err = train(["--resume", str(run)])
    assert code == 2 and "no loadable checkpoint in" in err
    code, err = train(["--resume", str(run), "train.epochs=9"])
    assert code == 2 and "--resume RUN_DIR takes the run's own config.yaml" in err


def test_nan_loss_stops_with_a_clear_message_and_keeps_checkpoints(tmp_path):
    data = synthetic_text_dir(tmp_path / "toy", n_train=200, n_eval=60)
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
                      "data.glove=none", "train.epochs=30", "train.progress=false", "train.lr=1e12",
                      "train.grad_clip=0.0", "model.mode=free", "train.threads=1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "loss is nan" in proc.stderr or "loss is inf" in proc.stderr
    assert "at epoch" in proc.stderr and ", batch " in proc.stderr
    assert "the last good checkpoint is" in proc.stderr.lower() or "no epoch finished: there is no checkpoint" in \
        proc.stderr.lower()
    for f in ("last.pt", "best.pt"):
        if (run / f).exists():
            torch.load(run / f, weights_only=True)


def test_exponent_floats_without_a_dot_are_floats():
    assert load_config(None, ["train.lr=1e-3"])["train"]["lr"] == 1e-3      # YAML 1.1 reads 1e-3 as a string
    with pytest.raises(ConfigError, match="config key 'train.lr' must be float, got str 'fast'"):
        load_config(None, ["train.lr=fast"])


def test_two_process_ddp_matches_single_process_training(tmp_path):
    """torchrun, 2 CPU processes (gloo), same global batch: losses within 1e-5 relative of one process
    (dropout off: each rank draws its own dropout masks), the same accuracies and energy-step counts."""
    data = synthetic_text_dir(tmp_path / "toy", n_train=300, n_eval=60)
    common = ["--config", os.path.join(CONFIGS, "tiny.yaml"), f"data.dataset={data}", "data.glove=none",
              "train.epochs=3", "train.progress=false", "model.dropout=0.0", "train.threads=1", "train.batch_size=299"]   # shares 150/149, then 1/0 (filler)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "experiments.app.train", "--run-dir", str(tmp_path / "ddp")] + common,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    single = run_train(["--run-dir", str(tmp_path / "single")] + common)
    assert single.returncode == 0, single.stderr[-2000:]
    h2, h1 = (json.loads((tmp_path / r / "history.json").read_text()) for r in ("ddp", "single"))
    for a, b in zip(h2, h1):
        for k in ("train_loss", "val_loss"):
            assert abs(a[k] - b[k]) <= 1e-5 * abs(b[k]), (k, a[k], b[k])
        assert a["train_energy_steps"] == b["train_energy_steps"] and a["train_accuracy"] == b["train_accuracy"]
    m2, m1 = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("ddp", "single"))
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    assert m2["test_accuracy"] == m1["test_accuracy"] and m2["energy_increases"] == m1["energy_increases"] == 0
    assert not (tmp_path / "ddp" / "rank1").exists()


def test_auto_device_is_the_gpu_where_torch_sees_one_else_the_cpu():
    from experiments.app.build import check_buildable
    from unfold.devices import check_device, resolve_device
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == want and check_device("auto").type == want
    assert resolve_device("cpu") == "cpu"
    assert check_buildable(load_config("tiny", ["train.device=auto"])) > 0
    with pytest.raises(ConfigError, match="train.device"):
        load_config("tiny", ["train.device=automatic"])


def test_a_device_spec_has_one_rule_for_configs_and_flags():
    """`unfold.devices.parse_device` is the syntax both the config key and every --device flag obey: a config names
    a GPU it may lack (read anywhere), never a device kind the model cannot run on, nor a second CPU."""
    from unfold.devices import check_device, parse_device
    assert load_config("tiny", ["train.device=cuda:3"])["train"]["device"] == "cuda:3"     # read on any machine
    for spec in ("mps", "meta", "cpu:3", "gpu"):
        with pytest.raises(ConfigError, match=rf"train.device.*{spec}"):
            load_config("tiny", [f"train.device={spec}"])
        with pytest.raises(ConfigError, match=rf"--device must be cpu, cuda, cuda:K or auto, got '{spec}'"):
            check_device(spec, "--device", ConfigError)
    assert parse_device("cuda:3").index == 3 and parse_device("cpu").type == "cpu"
    if not torch.cuda.is_available():           # the syntax holds, the machine lacks it: refused when a run starts
        with pytest.raises(ConfigError, match="CUDA is not available"):
            check_device("cuda:3", "train.device", ConfigError)
