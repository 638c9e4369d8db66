"""``unfold-variants``: the quick run end to end, its resumability, its refusals, and the training
throughput / peak memory figures the trainer records for its table (:mod:`experiments.app.throughput`)."""
import contextlib
import io
import json
import os
import types

import pytest
import torch

from energies.errors import CheckpointError
from experiments.studies import variants as V
from experiments.app.checkpoint import TRAINER_KEYS, load_checkpoint
from experiments.runfolder.checkpoint_fields import HISTORY_KEYS, THROUGHPUT_KEYS, _check_history
from experiments.app.config import load_config
from experiments.app.throughput import run_metrics

GRAPHS = V.QUICK_GRAPHS.split(",")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``--quick --json`` run by `V.main` in this process: ``(root, outcome)``, where ``outcome.stdout`` is what it
    printed. Each seed still trains in its own ``python -m experiments.app.train`` process; the command's own
    ``python -m experiments.studies.variants`` start is run by `tests/test_plugins.py`."""
    root = tmp_path_factory.mktemp("variants") / "v"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = V.main(["--quick", "--run-dir", str(root), "--json"])
    assert code == 0, err.getvalue()[-3000:]
    return root, types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def test_quick_run_writes_table_json_and_plots(quick):
    root, proc = quick
    summary = json.loads(proc.stdout)
    assert summary == json.loads((root / V.VARIANTS_JSON).read_text())
    assert [v["graph"] for v in summary["variants"]] == GRAPHS and summary["seeds"] == [0]
    md = (root / V.VARIANTS_MD).read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| graph")]
    assert [r.split(" | ")[0][2:] for r in rows] == GRAPHS            # one row per variant, in order
    for v in summary["variants"]:
        assert v["mode"] == "guaranteed" and v["finished"] == [0] and v["failed"] == []
        assert v["energy_increases"] == 0 and v["untrained_energy_increases"] == 0     # guaranteed: exact descent
        assert v["energy_steps"] == v["untrained_energy_steps"] == 100 * 2             # 100 test examples x 2 layers
        assert 0 <= v["test_accuracy"]["mean"] <= 1 and v["test_accuracy"]["std"] is None   # one seed: no spread
        curve = v["energy_per_layer"]
        assert len(curve) == 3 and all(b < a for a, b in zip(curve, curve[1:]))     # mean energy goes down
        assert (root / V.slug(v["graph"]) / "summary.json").is_file()                # a sweep per variant
    for name in (V.ACCURACY_PNG, V.ENERGY_PNG):
        assert (root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

def test_table_reprints_the_same_table(quick, capsys):
    root, _ = quick
    assert V.main(["--table", str(root)]) == 0
    assert capsys.readouterr().out == (root / V.VARIANTS_MD).read_text()
    assert V.main(["--table", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((root / V.VARIANTS_JSON).read_text())


def test_trainer_records_throughput_and_peak_memory(quick):
    root, _ = quick
    seed = root / "star" / "seed-0"
    m = json.loads((seed / "metrics.json").read_text())
    assert m["train_tokens_per_second"] > 0 and m["peak_memory_bytes"] > 2 ** 20
    assert 0 <= m["peak_memory_growth_bytes"] <= m["peak_memory_bytes"]
    assert m["throughput_epochs"] == 4 and isinstance(m["peak_memory_kind"], str)
    assert m["train_tokens_per_second"] == pytest.approx(m["train_tokens"] / m["train_pass_seconds"])
    assert m["train_pass_seconds"] < m["train_seconds"]                 # validation and checkpoints not timed
    # the real (unpadded) tokens: every training example's length, once per epoch
    from experiments.app.build import build_data

    ids, mask, _ = build_data(load_config(str(seed / "config.yaml")))[2]["train"]
    assert len(ids) == 200 and m["train_tokens"] == 4 * int(mask.sum())
    assert m["train_tokens"] < 4 * mask.numel()                         # control: padding is not counted
    history = json.loads((seed / "history.json").read_text())
    assert all(set(THROUGHPUT_KEYS) <= set(r) for r in history)
    assert sum(r["train_tokens"] for r in history) == m["train_tokens"]
    ck, _ = load_checkpoint(str(seed), epochs=4, require=TRAINER_KEYS)  # the checkpoint keeps them, checked
    assert ck["history"][-1]["train_tokens"] == history[-1]["train_tokens"]


def test_second_run_trains_nothing(quick, capsys):
    root, _ = quick
    stamps = {g: (root / V.slug(g) / "seed-0" / "best.pt").stat().st_mtime_ns for g in GRAPHS}
    metrics = {g: (root / V.slug(g) / "seed-0" / "metrics.json").read_bytes() for g in GRAPHS}
    code = V.main(["--quick", "--run-dir", str(root)])                 # in this process: nothing to train
    again = capsys.readouterr()
    assert code == 0, again.err[-2000:]
    assert again.err.count("finished already") == len(GRAPHS) and "-m experiments" not in again.err   # no run started
    assert {g: (root / V.slug(g) / "seed-0" / "best.pt").stat().st_mtime_ns for g in GRAPHS} == stamps
    assert {g: (root / V.slug(g) / "seed-0" / "metrics.json").read_bytes() for g in GRAPHS} == metrics
    assert "| window:2 |" in again.out


def test_a_rerun_that_finishes_less_never_replaces_the_finished_results(quick, tmp_path, capsys):
    """The same folder re-run with changed overrides refuses every seed (another config) and
    must then keep the finished variants.json, variants.md, plots and each variant's summary.json as they are."""
    import shutil

    root = tmp_path / "v"
    shutil.copytree(quick[0], root)
    kept = [V.VARIANTS_JSON, V.VARIANTS_MD, V.ACCURACY_PNG, V.ENERGY_PNG] + \
        [os.path.join(V.slug(g), "summary.json") for g in GRAPHS] + [os.path.join(V.slug(g), "summary.md") for g in GRAPHS]
    before = {name: (root / name).read_bytes() for name in kept}
    code = V.main(["--quick", "--run-dir", str(root), "train.lr=0.01"])
    out = capsys.readouterr()
    assert code == 1 and "another config" in out.err and "kept as they were" in out.err, out.err[-3000:]
    assert {name: (root / name).read_bytes() for name in kept} == before
    assert V.main(["--table", str(root)]) == 0                            # the finished table, as it was
    assert capsys.readouterr().out == before[V.VARIANTS_MD].decode()


@pytest.mark.parametrize("args, names", [
    (["--quick", "--graphs", "complete,windw:3"], ["--graphs", "windw:3", "unknown graph"]),
    (["--quick", "--graphs", "complete,window:x"], ["--graphs", "window:x"]),
    (["--quick", "--graphs", "star,,complete"], ["--graphs", "none empty"]),
    (["--quick", "--graphs", "star,star"], ["--graphs", "twice"]),
    # one graph spelt twice: it would train twice
    (["--quick", "--graphs", "window:8,window:08"], ["--graphs", "one graph", "window:8"]),
    (["--quick", "--graphs", "random:0.05,random:.05"], ["--graphs", "one graph", "random:0.05"]),
    (["--quick", "--graphs", "star,window:+2,window:2"], ["--graphs", "one graph", "window:2"]),
    (["--quick", "--graphs", "dilated:2,dilated:2:1"], ["--graphs", "one graph", "dilated:2:1"]),
    (["--quick", "--graphs", "window:\u0663,window:3"], ["--graphs", "window:\u0663", "integer"]),
    (["--quick", "--graphs", "complete,window:\u0663"], ["--graphs", "window:\u0663", "integer"]),
    (["--quick", "--seeds", "\u0663"], ["--seeds", ">= 1"]),
    (["--quick", "--seeds", "\uff12"], ["--seeds", ">= 1"]),
    (["--quick", "--jobs", "\u0663"], ["--jobs", ">= 1"]),
    (["--quick", "--jobs", "0"], ["--jobs", ">= 1"]),
    # seed counts and ranges refused before anything is built or written
    (["--quick", "--seeds", "99999999999999999999"], ["--seeds", "at most 1000"]),
    (["--quick", "--seeds", "100000000"], ["--seeds", "at most 1000"]),
    (["--quick", "--first-seed", "4294967295", "--seeds", "2"], ["--first-seed", "4294967296", "data.seed"]),
    (["--quick", "--seeds", "0"], ["--seeds", "'0'", ">= 1"]),
    (["--config", "no_such_config", "--graphs", "complete"], ["no_such_config"]),
    (["--quick", "model.graph=star"], ["model.graph", "--graphs"]),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, monkeypatch, capsys, args, names):
    monkeypatch.chdir(tmp_path)
    code = V.main(args + ["--run-dir", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(V.PROG + ": error:"), err
    assert all(n in err for n in names), err
    assert os.listdir(tmp_path) == []                                   # nothing written


def test_the_same_command_with_good_specs_passes_the_checks():
    """Control for the refusals: the specs of the default list are accepted by the same checks."""
    specs = V.parse_graphs(V.DEFAULT_GRAPHS)
    assert V.check_variants("tiny", [], specs)["name"] == "tiny"
    assert [V.slug(s) for s in specs] == ["complete", "window-8", "strided-16", "dilated-4-8", "star",
                                          "random-0.05"]


def _mutate(path, change):
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _v0(key, value, sub=None):
    def change(doc):
        target = doc["variants"][0] if sub is None else doc["variants"][0][sub]
        target[key] = value
    return change


#: variants.json edits --table must refuse: (id, change, the field the error names)
VARIANT_TABLE_CASES = [
    ("accuracy-1e308", _v0("mean", 1e308, "test_accuracy"), "test_accuracy.mean"),
    ("accuracy-negative", _v0("mean", -0.5, "test_accuracy"), "test_accuracy.mean"),
    ("accuracy-std-2", _v0("std", 2.0, "test_accuracy"), "test_accuracy.std"),
    ("memory-negative", _v0("mean", -5.0, "peak_memory_bytes"), "peak_memory_bytes.mean"),
    ("growth-negative", _v0("mean", -1, "peak_memory_growth_bytes"), "peak_memory_growth_bytes.mean"),
    ("tokens-negative", _v0("mean", -1.0, "train_tokens_per_second"), "train_tokens_per_second.mean"),
    ("steps-400-digits", _v0("energy_steps", 10 ** 400), "energy_steps"),
    ("increases-2**63", _v0("untrained_energy_increases", 2 ** 63), "untrained_energy_increases"),
    ("graph-newline", _v0("graph", "star\n\n# injected heading"), "variants[0]"),
    ("graph-tab", _v0("graph", "star\tx"), "variants[0]"),
    ("graph-bidi", _v0("graph", "star\u202e"), "variants[0]"),
    ("name-newline", lambda d: d.update(name="tiny\n# injected"), "'name'"),
    ("config-newline", lambda d: d.update(config="a\nb"), "'config'"),
    ("override-newline", lambda d: d.update(overrides=["x=1\ny"]), "overrides[0]"),
    ("kind-pipe", lambda d: d.update(peak_memory_kind="a|b"), "peak_memory_kind"),
    ("wall-negative", lambda d: d.update(wall_seconds=-1), "wall_seconds"),
    ("seed-negative", lambda d: d.update(seeds=[-1]), "seeds"),
    ("finished-string", _v0("finished", ["0"]), "finished"),
]


@pytest.mark.parametrize("case", VARIANT_TABLE_CASES, ids=[c[0] for c in VARIANT_TABLE_CASES])
def test_table_refuses_absurd_variants_summaries(quick, tmp_path, capsys, case):
    _, change, field = case
    (tmp_path / V.VARIANTS_JSON).write_bytes((quick[0] / V.VARIANTS_JSON).read_bytes())
    assert V.main(["--table", str(tmp_path)]) == 0                        # control: the file as written
    capsys.readouterr()
    _mutate(tmp_path / V.VARIANTS_JSON, change)
    assert V.main(["--table", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and V.VARIANTS_JSON in err and field in err, err


def _stat(key, field, value):
    return lambda d: d["metrics"][key].update({field: value})


#: summary.json edits unfold-sweep --table must refuse
SWEEP_TABLE_CASES = [
    ("accuracy-1e308", _stat("test_accuracy", "mean", 1e308), "test_accuracy.mean"),
    ("val-accuracy-negative", _stat("val_accuracy", "max", -0.1), "val_accuracy.max"),
    ("accuracy-std-2", _stat("test_accuracy", "std", 2.0), "test_accuracy.std"),
    ("seconds-negative", _stat("train_seconds", "mean", -3.0), "train_seconds.mean"),
    ("steps-1e300", _stat("energy_steps", "mean", 1e300), "energy_steps.mean"),
    ("name-tab", lambda d: d.update(name="tiny\tx"), "'name'"),
    ("name-bidi", lambda d: d.update(name="tiny\u202e"), "'name'"),
]


@pytest.mark.parametrize("case", SWEEP_TABLE_CASES, ids=[c[0] for c in SWEEP_TABLE_CASES])
def test_sweep_table_refuses_absurd_summaries(quick, tmp_path, capsys, case):
    from experiments.app import sweep as S

    _, change, field = case
    (tmp_path / "summary.json").write_bytes((quick[0] / "star" / "summary.json").read_bytes())
    assert S.main(["--table", str(tmp_path)]) == 0                        # control: the file as written
    capsys.readouterr()
    _mutate(tmp_path / "summary.json", change)
    assert S.main(["--table", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "summary.json" in err and field in err, err


def test_table_refuses_a_malformed_summary(tmp_path, capsys):
    (tmp_path / V.VARIANTS_JSON).write_text(json.dumps({"name": "x", "seeds": [0], "overrides": [],
                                                        "wall_seconds": 1, "variants": [{"graph": "star"}]}))
    assert V.main(["--table", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "variants[0].finished" in err


def test_figures_of_a_resumed_run_cover_every_measured_epoch():
    """A resumed run's history holds the epochs before the interruption (from the checkpoint) with their own
    figures; an epoch of a checkpoint written before the figures existed is left out, and counted out."""
    def rec(epoch, **extra):
        return {"epoch": epoch, "train_loss": 0.5, "train_accuracy": 0.5, "val_loss": 0.5, "val_accuracy": 0.5,
                "seconds": 1.0, "train_energy_increases": 0, "train_energy_steps": 10 * epoch, **extra}

    def timed(epoch, tokens, seconds, peak):
        return rec(epoch, train_tokens=tokens, train_pass_seconds=seconds, peak_memory_bytes=peak,
                   peak_memory_growth_bytes=peak // 10)

    history = [rec(1), timed(2, 1000, 2.0, 500), timed(3, 3000, 2.0, 700)]
    m = run_metrics(history, torch.device("cpu"))
    assert m["train_tokens_per_second"] == 1000.0 and m["throughput_epochs"] == 2
    assert m["peak_memory_bytes"] == 700 and m["peak_memory_growth_bytes"] == 70
    old = run_metrics([rec(1)], torch.device("cpu"))
    assert old["train_tokens_per_second"] is None and old["throughput_epochs"] == 0
    assert _check_history("ck", history, 3) == history                  # old and new records both accepted
    partial = timed(2, 1000, 2.0, 500)
    del partial["peak_memory_bytes"]
    with pytest.raises(CheckpointError, match=r"history\[1\]"):         # control: all four fields or none
        _check_history("ck", [rec(1), partial], 2)
    with pytest.raises(CheckpointError, match="train_tokens"):
        _check_history("ck", [rec(1), timed(2, -1, 2.0, 500)], 2)
    assert set(HISTORY_KEYS).isdisjoint(THROUGHPUT_KEYS)
