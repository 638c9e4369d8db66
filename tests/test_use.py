"""Using a trained model: bundles (load_model / save_model), the predict CLI, HF-style masks, run logs
(train.log, metrics.csv, TensorBoard), seed sweeps, console commands and configs found by name."""
import configparser
import csv
import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from energies.errors import CheckpointError, ConfigError
from experiments.app import sweep as S
from experiments.app.bundle import BUNDLE, load_model, save_model
from experiments.app.config import CONFIG_DIR, config_names, load_config
from experiments.runfolder.runlog import COLUMNS, MetricsLog, read_metrics_csv
from tests.test_train import synthetic_text_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 4


def named_label_dir(path, **kw):
    """The synthetic sentiment set with label names "bad" / "good" instead of 0 / 1 (no labels.json)."""
    synthetic_text_dir(path, **kw)
    for split in ("train", "val", "test"):
        f = os.path.join(path, f"{split}.jsonl")
        rows = [json.loads(line) for line in open(f)]
        with open(f, "w") as fh:
            for r in rows:
                fh.write(json.dumps({"text": r["text"], "label": ["bad", "good"][r["label"]]}) + "\n")
    return str(path)


def run(module, *args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("use")
    data = named_label_dir(tmp / "toy", n_train=400, n_eval=100)
    run_dir = tmp / "run"
    proc = run("experiments.app.train", "--config", "tiny", "--run-dir", run_dir, f"data.dataset={data}",
               "data.glove=none", f"train.epochs={EPOCHS}", "train.batch_size=32", "train.lr=0.005",
               "train.progress=false", "model.layers=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, data


TEXTS = ["good great superb w1 w2", "awful boring w3", "w4 w5 bad w6 poor dull w7 w8 w9", ""]


def test_bundle_round_trip_keeps_predictions_and_label_names(trained, tmp_path):
    run_dir, _ = trained
    manifest = json.loads((run_dir / BUNDLE).read_text())
    assert manifest["label_names"] == ["bad", "good"] and manifest["weights"] == "model.safetensors"
    assert set(manifest["data_fingerprint"]) >= {"vocab", "train", "val", "test", "label_names"}
    model = load_model(run_dir)
    assert model.label_names == ["bad", "good"]
    before = model.predict(TEXTS)
    assert [p.label for p in before[:2]] == ["good", "bad"]          # the names map to the right classes
    out = save_model(model, tmp_path / "bundle")
    assert sorted(n for n in os.listdir(out) if n != ".lock") == ["README.md", "bundle.json", "config.json",
                                                                  "model.safetensors", "vocab.json"]
    again = load_model(out)
    after = again.predict(TEXTS)
    assert [p.to_dict() for p in after] == [p.to_dict() for p in before]
    assert torch.equal(again.logits(TEXTS), model.logits(TEXTS))
    assert again.label_names == ["bad", "good"] and again.data_fingerprint == model.data_fingerprint
    with pytest.raises(CheckpointError, match="holds a model already"):   # never overwritten silently
        save_model(model, out)
    save_model(model, out, overwrite=True)


def test_prediction_carries_energy_and_descent(trained):
    model = load_model(trained[0])
    for p in model.predict(TEXTS):
        assert abs(sum(p.probabilities.values()) - 1) < 1e-12
        assert len(p.energies) == 3                                     # E(Y_0..Y_T), T = 2 layers
        assert all(len(v) == 3 for v in p.energy_terms.values())
        total = [sum(v[t] for v in p.energy_terms.values()) for t in range(3)]
        assert total == pytest.approx(p.energies, rel=1e-12, abs=1e-12)
        assert p.increases == 0 and p.nonfinite == 0 and p.descent and p.verdict == "descent"
        assert p.energies[-1] <= p.energies[0]


def copy_run(trained, tmp_path, bundle=True):
    """A copy of the trained run folder (without bundle.json and the files only a bundle has: a run from before
    bundles)."""
    copy = tmp_path / "copy"
    shutil.copytree(trained[0], copy)
    if not bundle:
        for name in (BUNDLE, "model.safetensors", "config.json", "README.md"):
            (copy / name).unlink()
    return copy


def test_a_changed_bundle_file_is_refused(trained, tmp_path):
    copy = copy_run(trained, tmp_path)
    load_model(copy)                                                    # control: the intact copy loads
    with open(copy / "vocab.json", "r+") as fh:
        vocab = json.load(fh)
        vocab["itos"].append("zzz")
        fh.seek(0)
        json.dump(vocab, fh)
    with pytest.raises(CheckpointError, match="changed since bundle.json"):
        load_model(copy)


def test_weights_are_loaded_without_executing_code(trained, tmp_path):
    copy = copy_run(trained, tmp_path, bundle=False)
    torch.save({"model": {"x": torch.zeros(1)}, "evil": ConfigError("x")}, copy / "best.pt")
    with pytest.raises(CheckpointError, match="not loaded"):
        load_model(copy)


def test_a_run_from_before_bundles_loads_its_label_names_from_its_data(trained, tmp_path):
    """A run from before bundles: no bundle.json and no checksummed checkpoint (both are what today's trainer
    writes); read only when asked for (``legacy=True``): a folder whose bundle.json was deleted is not one."""
    copy = copy_run(trained, tmp_path, bundle=False)
    with pytest.raises(CheckpointError, match="bundle.json"):
        load_model(copy)
    with pytest.raises(CheckpointError):                    # checksummed checkpoints: bundle.json was removed
        load_model(copy, legacy=True)
    for name in ("last.pt", "prev.pt"):
        (copy / name).unlink(missing_ok=True)
    old = load_model(copy, legacy=True)
    assert old.label_names == ["bad", "good"]
    assert [p.to_dict() for p in old.predict(TEXTS)] == [p.to_dict() for p in load_model(trained[0]).predict(TEXTS)]


def test_predict_cli_json_equals_the_python_call(trained, tmp_path):
    run_dir, _ = trained
    texts = tmp_path / "texts.txt"
    texts.write_text("awful boring w3\n\nw4 w5 bad w6 poor dull w7 w8 w9\n")
    plot = tmp_path / "e.png"
    proc = run("experiments.app.predict", run_dir, "--text", TEXTS[0], "--file", texts, "--json", "--plot", plot)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 3                                               # blank lines of the file skipped
    for row in rows:
        assert {"label", "probabilities", "energies", "increases"} <= set(row)
        assert row["label"] in ("bad", "good") and set(row["probabilities"]) == {"bad", "good"}
    expected = [p.to_dict() for p in load_model(run_dir).predict(TEXTS[:3])]
    assert rows == json.loads(json.dumps(expected))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    human = run("experiments.app.predict", run_dir, "--text", TEXTS[0])
    assert human.returncode == 0 and human.stdout.startswith("good\t")


@pytest.mark.parametrize("args, message", [
    (["--text", "x"], "no such model folder"),
    ([], "no text to classify"),
    (["--text", "x", "--plot", "{tmp}/e.jpg"], "PNG"),
])
def test_predict_cli_refuses_bad_input(trained, tmp_path, args, message):
    run_dir = tmp_path / "missing" if message == "no such model folder" else trained[0]
    proc = run("experiments.app.predict", run_dir, *[a.format(tmp=tmp_path) for a in args], stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""
    assert not list(tmp_path.glob("*.jpg"))


def test_integer_attention_mask_equals_bool_mask(trained):
    model = load_model(trained[0]).model
    ids = torch.tensor([[5, 9, 12, 7, 0, 0], [3, 4, 0, 0, 0, 0], [8, 8, 8, 8, 8, 8]])
    mask = ids != 0
    ref = model(ids, mask)
    for kw in ({"input_ids": ids, "attention_mask": mask.long()}, {"input_ids": ids, "attention_mask": mask.int()},
               {"ids": ids, "mask": mask.to(torch.uint8)}):
        out = model(**kw)
        assert torch.equal(out.logits, ref.logits)
        assert all(torch.equal(out.energies[k], ref.energies[k]) for k in ref.energies)
    wrong = model(ids, torch.ones_like(mask))                           # control: the mask matters
    assert not torch.equal(wrong.logits, ref.logits)
    with pytest.raises(ConfigError, match="float mask is ambiguous"):       # torch's float masks are additive
        model(input_ids=ids, attention_mask=mask.float())
    model(input_ids=ids, attention_mask=mask.long() * 2)                # not checked in the hot path (host read)
    model.validate = True
    try:
        with pytest.raises(ConfigError, match=r"0 and 1 only, got values \[2\]"):
            model(input_ids=ids, attention_mask=mask.long() * 2)
        assert torch.equal(model(input_ids=ids, attention_mask=mask.long()).logits, ref.logits)
    finally:
        model.validate = False


def test_run_logs_metrics_csv_log_file_and_tensorboard(trained):
    run_dir, _ = trained
    rows = read_metrics_csv(run_dir / "metrics.csv")
    steps = [r for r in rows if r["kind"] == "step"]
    epochs = [r for r in rows if r["kind"] == "epoch"]
    per_epoch = -(-400 // 32)
    assert len(steps) == EPOCHS * per_epoch and [r["epoch"] for r in epochs] == list(range(1, EPOCHS + 1))
    assert [r["step"] for r in steps] == list(range(1, EPOCHS * per_epoch + 1))
    for r in steps:
        assert r["loss"] > 0 and r["lr"] > 0 and 0 <= r["accuracy"] <= 1 and r["energy_increases"] == 0
        assert r["energy_last_mean"] <= r["energy_first_mean"]
    history = json.loads((run_dir / "history.json").read_text())
    for r, h in zip(epochs, history):
        assert r["val_accuracy"] == h["val_accuracy"] and r["loss"] == pytest.approx(h["train_loss"], rel=1e-12)
        assert r["energy_steps"] == history[0]["train_energy_steps"]   # per epoch, not cumulative
    log = (run_dir / "train.log").read_text()
    assert "epoch 1: train loss" in log and f"epoch {EPOCHS}: train loss" in log
    if importlib.util.find_spec("tensorboard"):
        events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        assert events and events[0].stat().st_size > 0


def test_metrics_csv_drops_the_rows_of_an_epoch_cut_short_on_resume(tmp_path):
    log = MetricsLog(str(tmp_path), tensorboard=False)
    for epoch in (1, 2, 3):
        for step in range(2):
            log.write("step", epoch, 2 * (epoch - 1) + step + 1, loss=1.0 / epoch)
        if epoch < 3:                                                   # epoch 3 was interrupted
            log.write("epoch", epoch, 2 * epoch, loss=1.0, val_accuracy=0.5)
    log.close()
    assert len(read_metrics_csv(tmp_path / "metrics.csv")) == 8
    MetricsLog(str(tmp_path), tensorboard=False, resume_after=2).close()
    rows = read_metrics_csv(tmp_path / "metrics.csv")
    assert len(rows) == 6 and max(r["epoch"] for r in rows) == 2
    with open(tmp_path / "metrics.csv") as fh:
        assert next(csv.reader(fh)) == list(COLUMNS)
    MetricsLog(str(tmp_path), tensorboard=False).close()                # a new run starts the file afresh
    assert read_metrics_csv(tmp_path / "metrics.csv") == []
    with pytest.raises(KeyError):
        MetricsLog(str(tmp_path), tensorboard=False).write("step", 1, 1, nonsense=1)


def test_tensorboard_off_writes_no_event_files(tmp_path):
    data = named_label_dir(tmp_path / "toy", n_train=64, n_eval=32)
    proc = run("experiments.app.train", "--config", "tiny", "--run-dir", tmp_path / "r", f"data.dataset={data}",
               "data.glove=none", "train.tensorboard=false", "train.progress=false", "model.layers=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "r" / "tensorboard").exists() and (tmp_path / "r" / "metrics.csv").exists()


def test_two_seed_sweep_writes_mean_and_std(tmp_path):
    data = named_label_dir(tmp_path / "toy", n_train=96, n_eval=48)
    root = tmp_path / "sweep"
    args = ["--config", "tiny", "--seeds", "2", "--jobs", "2", "--run-dir", root, f"data.dataset={data}",
            "data.glove=none", "train.progress=false", "model.layers=1", "train.tensorboard=false"]
    proc = run("experiments.app.sweep", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((root / "summary.json").read_text())
    accs = [json.loads((root / f"seed-{k}" / "metrics.json").read_text())["test_accuracy"] for k in (0, 1)]
    stat = summary["metrics"]["test_accuracy"]
    mean = sum(accs) / 2
    assert stat["n"] == 2 and stat["mean"] == pytest.approx(mean, abs=1e-15)
    assert stat["std"] == pytest.approx(abs(accs[0] - accs[1]) / 2 ** 0.5, abs=1e-15)   # sample std, n - 1
    assert summary["failed"] == [] and summary["seeds"] == [0, 1]
    cfgs = [load_config(str(root / f"seed-{k}" / "config.yaml")) for k in (0, 1)]
    assert [c["train"]["seed"] for c in cfgs] == [0, 1] and [c["data"]["seed"] for c in cfgs] == [0, 1]
    md = (root / "summary.md").read_text()
    assert "| test_accuracy |" in md and " ± " in md
    stamp = (root / "seed-0" / "metrics.json").stat().st_mtime_ns
    again = run("experiments.app.sweep", *args)                             # a finished sweep is not run again
    assert again.returncode == 0 and "finished already" in again.stderr
    assert (root / "seed-0" / "metrics.json").stat().st_mtime_ns == stamp
    table = run("experiments.app.sweep", "--table", root)
    assert table.returncode == 0 and "| tiny |" in table.stdout and "%" in table.stdout


def test_sweep_reports_a_failed_seed_and_keeps_the_others(tmp_path):
    data = named_label_dir(tmp_path / "toy", n_train=96, n_eval=48)
    root = tmp_path / "sweep"
    (root / "seed-1").mkdir(parents=True)
    (root / "seed-1" / "notes.txt").write_text("mine")                 # someone else's folder: never overwritten
    args = ["--config", "tiny", "--seeds", "2", "--run-dir", root, f"data.dataset={data}", "data.glove=none",
            "train.progress=false", "model.layers=1", "train.tensorboard=false"]
    proc = run("experiments.app.sweep", *args)
    assert proc.returncode == 1
    summary = json.loads((root / "summary.json").read_text())
    assert summary["failed"] == [1] and list(summary["runs"]) == ["0"]
    assert summary["metrics"]["test_accuracy"]["n"] == 1 and summary["metrics"]["test_accuracy"]["std"] is None
    assert sorted(n for n in os.listdir(root / "seed-1") if n != ".lock") == ["notes.txt", "sweep.log"]
    # a malformed metrics.json is refused before anything runs (it is neither a finished run nor one to resume)
    (root / "seed-1" / "metrics.json").write_text("{}")
    again = run("experiments.app.sweep", *args)
    assert again.returncode == 2 and "metrics.json" in again.stderr and "test_accuracy" in again.stderr


def test_sweep_refuses_an_override_of_a_seed_key():
    proc = run("experiments.app.sweep", "--config", "tiny", "train.seed=3")
    assert proc.returncode == 2 and "seed key" in proc.stderr


def test_summary_statistics():
    assert S.describe([1.0]) == {"mean": 1.0, "std": None, "min": 1.0, "max": 1.0, "n": 1, "nonfinite": 0}
    d = S.describe([1.0, 2.0, 4.0])
    assert d["mean"] == pytest.approx(7 / 3) and d["std"] == pytest.approx(1.5275252316519468)
    flat = S.flatten({"a": 1, "b": {"c": 2.5, "d": True, "e": "x"}, "f": float("nan"), "g": "-inf"})
    assert set(flat) == {"a", "b.c", "f", "g"} and flat["a"] == 1.0 and flat["b.c"] == 2.5
    assert flat["f"] != flat["f"] and flat["g"] == float("-inf")        # kept, to be counted as non-finite


CONSOLE = ["unfold-train", "unfold-check", "unfold-predict", "unfold-sweep", "unfold-data", "unfold-variants"]


@pytest.mark.parametrize("command", CONSOLE)
def test_console_commands_answer_help(command):
    exe = shutil.which(command, path=os.path.dirname(sys.executable)) or shutil.which(command)
    assert exe is not None, f"{command} is not installed (pip install -e .)"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0 and "usage:" in proc.stdout


def test_console_scripts_match_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].split("\n") if line)
    assert sorted(scripts) == sorted(CONSOLE)


def test_configs_are_found_by_name_and_shipped_as_package_data(tmp_path):
    assert {"default", "tiny", "free", "baseline_transformer"} <= set(config_names())
    assert load_config("tiny") == load_config(str(CONFIG_DIR / "tiny.yaml")) == load_config("tiny.yaml")
    with pytest.raises(ConfigError, match="neither a file nor a shipped config.*default"):
        load_config("no_such_config")
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    globs = cfg["options.package_data"]["experiments"].split()
    for f in os.listdir(CONFIG_DIR):
        assert any(fnmatch.fnmatch(f"configs/{f}", g) for g in globs), f
    proc = subprocess.run([sys.executable, "-m", "experiments.app.train", "--config", "nope", "--run-dir", tmp_path / "r"],
                          capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 2 and "shipped" in proc.stderr and not (tmp_path / "r").exists()


def _version(text):
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def test_constraints_pin_every_requirement_within_its_lower_bound():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = [ln.strip() for ln in cfg["options"]["install_requires"].splitlines() if ln.strip()]
    # an environment marker (triton: Linux only) is not part of the requirement's version bound
    test_extra = [ln.split(";")[0].strip() for ln in cfg["options.extras_require"]["test"].splitlines() if ln.strip()]
    # the development install pins torch (no multi-GB CUDA build without -c); everything else is a lower bound
    assert [r for r in test_extra if "==" in r] == ["torch==2.13.0"]
    lines += [r for r in test_extra if "==" not in r]
    pins = {}
    for ln in open(os.path.join(ROOT, "constraints.txt")):
        ln = ln.split("#")[0].strip()
        if ln:
            name, version = ln.split("==")
            pins[name.lower()] = version
    assert pins["torch"] == "2.13.0"
    for req in lines:
        req = req.split(";")[0].strip()
        assert "==" not in req, f"{req}: library users get lower bounds; exact pins go to constraints.txt"
        name, bound = req.split(">=")
        name = name.split("[")[0]                     # an extra (mkdocstrings[python]) is not part of the name
        assert _version(pins[name.lower()]) >= _version(bound), req
    assert os.path.isfile(os.path.join(ROOT, "LICENSE")) and "MIT" in open(os.path.join(ROOT, "LICENSE")).read()


def test_an_offline_hf_folder_trains_and_its_bundle_keeps_the_classlabel_names(tmp_path):
    fixture = os.path.join(ROOT, "tests", "data", "hf", "reviews_disk")
    proc = run("experiments.app.train", "--config", "tiny", "--run-dir", tmp_path / "r", f"data.dataset=hf:{fixture}",
               "data.glove=none", "data.min_freq=1", "train.progress=false", "model.layers=1",
               "train.tensorboard=false", "data.splits={train: train, val: validation, test: test}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    trained = load_model(tmp_path / "r")
    assert trained.label_names == ["negative", "neutral", "positive"]
    pred = run("experiments.app.predict", tmp_path / "r", "--text", "A dull film", "--json")
    assert pred.returncode == 0 and json.loads(pred.stdout)["label"] in trained.label_names
    bad = run("experiments.app.train", "--config", "tiny", "--run-dir", tmp_path / "q", f"data.dataset=hf:{fixture}",
              "data.splits={train: train, val: dev}")
    assert bad.returncode == 2 and "dev" in bad.stderr and not (tmp_path / "q").exists()


def test_the_readme_python_block_runs(trained, tmp_path, capsys):
    text = open(os.path.join(ROOT, "docs", "predict.md"), encoding="utf-8").read()     # the page's python block
    section = text.split("# Use a trained model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'load_model("runs/default")' in code
    code = code.replace("runs/default", str(trained[0])).replace("exported/rt-default", str(tmp_path / "exp"))
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.split()[0] in ("bad", "good") and line.endswith(" descent 0")
                                   for line in lines)
    assert load_model(tmp_path / "exp").label_names == ["bad", "good"]


def test_predict_checks_the_weights_as_they_are_now_and_nan_is_never_descent(trained):
    model = load_model(trained[0])
    before = model.predict(TEXTS[:1])[0]
    with torch.no_grad():
        for p in model.model.parameters():
            p.add_(0.05)
    after = model.predict(TEXTS[:1])[0]
    assert after.energies != before.energies                           # no stale float64 copy
    with torch.no_grad():
        model.model.head.weight.fill_(float("nan"))
    bad = model.predict(TEXTS[:1])[0]
    assert not bad.descent and bad.verdict == "non-finite" and bad.nonfinite >= 1


def test_prediction_says_when_a_text_was_truncated(trained):
    model = load_model(trained[0])
    max_len = model.config["data"]["max_len"]
    long, short = model.predict([" ".join(["good"] * (max_len + 5)), "good"])
    assert long.truncated and long.tokens == max_len and not short.truncated and short.tokens == 1


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(sha256={}), "sha256 must map exactly"),
    (lambda m: m.update(sha256=["x"]), "sha256 must map exactly"),
    (lambda m: m.update(label_names=["a", "a"]), "distinct strings"),
    (lambda m: m.update(weights="../evil.pt"), "must be one of"),
    (lambda m: m.update(version=99), "bundle version"),
])
def test_a_malformed_manifest_is_refused(trained, tmp_path, change, message):
    copy = copy_run(trained, tmp_path)
    manifest = json.loads((copy / BUNDLE).read_text())
    change(manifest)
    (copy / BUNDLE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=message):
        load_model(copy)


def test_training_into_a_saved_bundle_is_refused(trained, tmp_path):
    out = save_model(load_model(trained[0]), tmp_path / "b")
    proc = run("experiments.app.train", "--config", "tiny", "--run-dir", out, f"data.dataset={trained[1]}",
               "data.glove=none")
    assert proc.returncode == 2 and "already holds" in proc.stderr
    load_model(out)                                                     # intact


@pytest.mark.parametrize("args, message", [(["--text", "x", "--device", "gpu"], "--device must be cpu, cuda, cuda:K or auto, got 'gpu'"),
                                           (["--text", "  "], "is empty")])
def test_predict_refuses_a_bad_device_or_empty_text(trained, args, message):
    proc = run("experiments.app.predict", trained[0], *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_a_sweep_never_resumes_a_seed_under_another_config(tmp_path):
    data = named_label_dir(tmp_path / "toy", n_train=64, n_eval=32)
    root = tmp_path / "sweep"
    base = ["--config", "tiny", "--seeds", "1", "--run-dir", root, f"data.dataset={data}", "data.glove=none",
            "train.progress=false", "model.layers=1", "train.tensorboard=false"]
    assert run("experiments.app.sweep", *base).returncode == 0
    stamp = (root / "seed-0" / "config.yaml").read_text()
    proc = run("experiments.app.sweep", *base, "train.lr=0.05")
    assert proc.returncode == 1 and "another config" in proc.stderr
    assert (root / "seed-0" / "config.yaml").read_text() == stamp
    # the finished summary is never replaced by the all-failed one of this run
    assert "kept as it was" in proc.stderr and "seeds 0" in proc.stderr
    summary = json.loads((root / "summary.json").read_text())
    assert summary["failed"] == [] and list(summary["runs"]) == ["0"]
    assert summary["note"] is None                                      # one seed: nothing to compare


def test_summary_counts_nonfinite_metrics_instead_of_hiding_them():
    stats = S.summarize({0: {"test_loss": 0.4}, 1: {"test_loss": "nan"}, 2: {"test_loss": 0.5}})
    assert stats["test_loss"]["n"] == 2 and stats["test_loss"]["nonfinite"] == 1
    assert "1 non-finite" in S._fmt(stats["test_loss"])
    assert S.describe([float("nan")])["mean"] is None


def test_tfidf_sweep_over_split_seeds_with_a_training_subset(tmp_path):
    data = tmp_path / "toy.jsonl"
    rows = [{"text": f"{w} w{i % 7} w{i % 5}", "label": ["bad", "good"][w in ("good", "great")]}
            for i, w in enumerate(["good", "bad", "great", "awful"] * 40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = tmp_path / "tf"
    proc = run("experiments.app.sweep", "--tfidf", "--dataset", data, "--seeds", "2", "--max-train-examples", "50",
               "--run-dir", root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [json.loads((root / f"seed-{k}" / "metrics.json").read_text()) for k in (0, 1)]
    assert [r["sizes"]["train"] for r in runs] == [50, 50] and [r["seed"] for r in runs] == [0, 1]
    summary = json.loads((root / "summary.json").read_text())
    assert summary["metrics"]["test_accuracy"]["n"] == 2 and summary["seed_keys"] == ["data.seed"]
    assert "n/a" in run("experiments.app.sweep", "--table", root).stdout    # no energy columns for TF-IDF
    bad = run("experiments.app.sweep", "--config", "tiny", "--max-train-examples", "5")
    assert bad.returncode == 2 and "goes with --tfidf" in bad.stderr
