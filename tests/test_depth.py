"""Depth chosen by the energy: ``stop_rel`` on the guaranteed encoder, deeper inference, the verdict
over stopped runs, and ``python -m experiments.studies.depth``.

The stopping rule (:class:`unfold.encoders.GuaranteedEncoder`): an example runs layer k+1 iff it ran layer k and
``(E_{k-1} - E_k) / max(|E_{k-1}|, tiny) >= EPS``; both energies are known before layer k+1, so a stopped example's
output is Y_k of the full unroll. Exactness is checked in float64 with the tolerance ``max |Y - Y_k| <= 4 eps(float64)
* max(1, max |Y_k|)`` per example (the computation is the same, so it is 0 in practice: the bound only allows a
batch kernel to reorder a sum).
"""
import os
import subprocess
import sys

import pytest
import torch

from clifuzz import run_cli
from energies.errors import ConfigError, StepError
from experiments.app.config import load_config
from test_train import CONFIGS, ROOT, synthetic_text_dir
from unfold.encoders import FreeEncoder, GuaranteedEncoder
from unfold.inputs import check_inference_layers, check_stop_rel
from unfold.model import UnfoldedTransformer
from unfold.trace import EnergyTrace, relative_decrease, report_from_values

TINY = os.path.join(CONFIGS, "tiny.yaml")
F64 = torch.finfo(torch.float64).eps


def _tokens(B=6, n=7, d=8, seed=0):
    """Examples of very different scales, so that they stop at different depths."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 1.0, 2.0, 3.0, 0.5, 1.5][:B], dtype=torch.float64)
    return torch.randn(B, n, d, generator=g, dtype=torch.float64) * scale[:, None, None]


def _encoder(layers=30, stop_rel=None, seed=0):
    torch.manual_seed(seed)
    return GuaranteedEncoder(d=8, heads=2, layers=layers, stop_rel=stop_rel).double()


def _close(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= 4 * F64 * max(1.0, float(b.abs().max()))


# ------------------------------------------------------------------ (a) stopped outputs = full unroll truncated
def test_stopped_examples_equal_the_full_unroll_truncated_at_their_depth():
    X, eps = _tokens(), 2e-2
    stopped = _encoder(stop_rel=eps)(X, trace=True, keep_states=True)
    full = _encoder()(X, trace=True, keep_states=True)
    used = stopped.layers_used
    assert used.dtype == torch.long and used.shape == (6,)
    assert len(set(used.tolist())) >= 4 and int(used.min()) < 30, used    # examples stop at different depths
    # the depth is the first layer whose relative decrease (from the full unroll's own trace) is below EPS
    tot = full.report().totals
    rel = relative_decrease(tot[:, :-1], tot[:, 1:])
    for b in range(6):
        small = (rel[b, :-1] < eps).nonzero().flatten()     # the last layer has no next one to skip
        expected = int(small[0]) + 1 if small.numel() else 30
        k = int(used[b])
        assert k == expected, (b, k, expected)
        assert _close(stopped.Y[b], full.states[k][b]), b            # the output is Y_k of the full unroll
        assert not _close(stopped.Y[b], full.states[k - 1][b]), b    # not Y_{k-1}: the stopping layer is kept
        for t in range(k, 31):                                       # frozen after k: the tokens stay Y_k
            assert torch.equal(stopped.states[t][b], stopped.states[k][b])
        assert torch.equal(stopped.energies.ran[b], torch.arange(30) < k)


def test_the_classifier_stops_each_example_like_the_full_model_at_its_depth():
    torch.manual_seed(1)
    kw = dict(vocab_size=50, num_classes=3, d=8, heads=2, layers=12, dropout=0.0)
    model = UnfoldedTransformer(**kw, stop_rel=5e-2).double().eval()
    full = UnfoldedTransformer(**kw).double().eval()
    full.load_state_dict(model.state_dict())
    ids = torch.randint(2, 50, (8, 9))
    mask = torch.arange(9)[None] < torch.tensor([9, 3, 5, 9, 2, 7, 8, 4])[:, None]
    with torch.no_grad():
        out = model(ids, mask)
        assert out.layers_used.shape == (8,) and int(out.layers_used.max()) <= 12
        assert len(set(out.layers_used.tolist())) >= 2, out.layers_used
        for b in range(8):
            ref = full(ids, mask, layers=int(out.layers_used[b])).logits[b]
            assert _close(out.logits[b], ref), b


# ------------------------------------------------------------------ (b) negative control: the rule must not stop
def test_a_threshold_below_every_decrease_never_stops():
    X = _tokens()
    full = _encoder(layers=5)(X, trace=True)
    tot = full.report().totals
    eps = 1e-6
    assert float(relative_decrease(tot[:, :-1], tot[:, 1:]).min()) > eps      # the control's premise
    out = _encoder(layers=5, stop_rel=eps)(X, trace=True)
    assert torch.equal(out.Y, full.Y)
    assert torch.equal(out.layers_used, torch.full((6,), 5))
    assert bool(out.energies.ran.all()) and out.report().steps == 30 and out.report().frozen_steps == 0
    for off in (None, 0, 0.0):                                                 # off: the same as no rule
        o = _encoder(layers=5, stop_rel=off)(X, trace=True)
        assert o.energies.ran is None and torch.equal(o.Y, full.Y)
        assert torch.equal(o.layers_used, torch.full((6,), 5))


# ------------------------------------------------------------------ (c) no host read: meta device
@pytest.mark.parametrize("trace", [False, True])
def test_stop_rel_runs_on_meta(trace):
    with torch.device("meta"):
        enc = GuaranteedEncoder(d=8, layers=3, stop_rel=1e-2)
        out = enc(torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.bool), trace=trace)
        assert out.layers_used.device.type == "meta" and out.layers_used.shape == (2,)
        if trace:
            assert out.energies.ran.device.type == "meta" and out.energies.ran.shape == (2, 3)
            assert all(v.shape == (2, 4) for v in out.energies.values())
        else:
            out.Y.sum().backward()
        model = UnfoldedTransformer(30, 2, d=8, layers=3, stop_rel=1e-2)
        res = model(torch.randint(0, 30, (2, 5)), torch.ones(2, 5, dtype=torch.bool), trace=trace, layers=6)
        assert res.layers_used.device.type == "meta" and res.logits.shape == (2, 2)


# ------------------------------------------------------------------ (d) the verdict over a stopped run
def test_the_verdict_judges_every_layer_that_ran_and_no_frozen_one():
    out = _encoder(stop_rel=2e-2)(_tokens(), trace=True)
    rep = out.report()
    used = int(out.layers_used.sum())
    assert rep.num_increases == 0 and rep.verdict == "descent"
    assert rep.steps == used and rep.frozen_steps == 6 * 30 - used > 0
    assert rep.summary()["frozen_steps"] == rep.frozen_steps
    # without the mark the frozen layers would count as (passing) steps
    assert report_from_values(dict(out.energies), torch.float64, resolution=out.energies.resolution).steps == 180


def test_an_increase_at_the_stopping_layer_is_caught_and_a_frozen_layer_is_never_judged():
    E = torch.tensor([[10.0, 9.0, 9.5, 9.5], [10.0, 9.0, 8.0, 100.0]], dtype=torch.float64)
    ran = torch.tensor([[True, True, False], [True, True, False]])
    rep = report_from_values({"e": E}, torch.float64, ran=ran)
    # example 0 rose at layer 2, the last layer it ran (where it stopped): caught; example 1's "rise" at its
    # frozen layer 3 is no step
    assert rep.increases.tolist() == [[False, True, False], [False, False, False]]
    assert rep.steps == 4 and rep.frozen_steps == 2 and [v["sample"] for v in rep.violations] == [0]
    assert float(rep.rel_increase()[1, 2]) == 0.0
    nan = E.clone()
    nan[1, 3] = float("nan")                                # a NaN on a frozen layer is not judged either
    assert report_from_values({"e": nan}, torch.float64, ran=ran).num_nonfinite == 0
    nan[1, 2] = float("nan")                                # on a layer that ran it fails
    assert report_from_values({"e": nan}, torch.float64, ran=ran).num_nonfinite == 1
    with pytest.raises(StepError, match="ran"):
        report_from_values({"e": E}, torch.float64, ran=ran[:, :2])
    joined = EnergyTrace.cat([EnergyTrace({"e": E}, ran=ran), EnergyTrace({"e": E})])
    assert joined.ran.tolist() == ran.tolist() + [[True] * 3] * 2


def test_a_planted_increase_at_a_layer_that_ran_is_caught(faulty):
    out = _encoder(layers=8, stop_rel=1e-3)(_tokens(), trace=True)
    rep = out.report()
    bad = [v for v in rep.violations if v["sample"] == 0]
    assert bad, "the planted increase was hidden"
    assert all(v["layer"] < int(out.layers_used[0]) for v in bad)             # at layers that ran
    assert bool(out.energies.ran[0, bad[0]["layer"]])


# ------------------------------------------------------------------ (e) refusals
@pytest.mark.parametrize("value", [1, 1.0, -0.1, 2.0, float("nan"), float("inf"), True, "0.1"])
def test_bad_stop_rel_values_are_refused(value):
    with pytest.raises(ConfigError, match="stop_rel"):
        check_stop_rel(value)
    with pytest.raises(ConfigError, match="stop_rel"):
        GuaranteedEncoder(d=4, layers=2, stop_rel=value)


@pytest.mark.parametrize("override", ["model.stop_rel=1", "model.stop_rel=-0.01", "model.stop_rel=.nan",
                                      "model.stop_rel=true", "model.stop_rel=abc", "model.stop_rel=[0.1]"])
def test_config_refuses_bad_stop_rel(override):
    with pytest.raises(ConfigError, match="model.stop_rel"):
        load_config("tiny", [override])


def test_config_refuses_stop_rel_where_it_does_not_apply():
    for mode in ("free", "baseline"):
        with pytest.raises(ConfigError, match=r"model\.stop_rel.*model\.mode='" + mode):
            load_config("tiny", ["model.stop_rel=0.01", f"model.mode={mode}"])
        assert load_config("tiny", ["model.stop_rel=0", f"model.mode={mode}"])["model"]["stop_rel"] == 0.0
    assert load_config("tiny", ["model.stop_rel=1e-3"])["model"]["stop_rel"] == 1e-3
    with pytest.raises(ConfigError, match="stop_rel"):
        UnfoldedTransformer(10, 2, d=8, mode="free", stop_rel=0.1)


def test_inference_depth_is_refused_for_untied_stacks():
    free = FreeEncoder(d=8, heads=2, layers=2)
    with pytest.raises(ConfigError, match="--layers=4.*untied"):
        check_inference_layers(free, 4, "--layers")
    for bad in (0, -1, 5000, 2.0, True):
        with pytest.raises(ConfigError, match="layers"):
            check_inference_layers(GuaranteedEncoder(d=8, layers=2), bad)
    assert check_inference_layers(GuaranteedEncoder(d=8, layers=2), 8) == 8


# ------------------------------------------------------------------ a trained run: predict --layers, the study
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("depth")
    data = synthetic_text_dir(base / "toy", n_train=200, n_eval=60)
    out = base / "run"
    proc = subprocess.run([sys.executable, "-m", "experiments.app.train", "--config", TINY, "--run-dir", str(out),
                           f"data.dataset={data}", "train.max_train_examples=200", "model.layers=3", "train.epochs=2",
                           "train.progress=false", "train.tensorboard=false"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(out)


def test_predict_unrolls_more_layers_and_refuses_bad_ones(run, tmp_path):
    code, out, err = run_cli("experiments.app.predict", [run, "--text", "good w1", "--json", "--layers", "9"], str(tmp_path))
    assert code == 0, err
    import json
    pred = json.loads(out)
    assert len(pred["energies"]) == 10 and pred["increases"] == 0
    for bad, what in (("0", "--layers"), ("x", "--layers"), ("5000", "--layers")):
        code, out, err = run_cli("experiments.app.predict", [run, "--text", "good", "--layers", bad], str(tmp_path))
        assert code == 2 and what in err and not out, (bad, err)
    # an untied (free) model: a bundle of one, refused naming --layers
    from experiments.app.bundle import TrainedModel, load_model, save_model
    from experiments.app.build import build_model

    trained = load_model(run)
    cfg = load_config(os.path.join(run, "config.yaml"), ["model.mode=free"])
    free = TrainedModel(build_model(cfg, len(trained.vocab), 2), cfg, trained.vocab, trained.label_names)
    folder = save_model(free, str(tmp_path / "free"))
    code, out, err = run_cli("experiments.app.predict", [folder, "--text", "good", "--layers", "3"], str(tmp_path))
    assert code == 2 and "--layers=3" in err and "untied" in err and not out, err
    code, _, err = run_cli("experiments.studies.depth", [folder, "--quick"], str(tmp_path))
    assert code == 2 and "weight-shared" in err and not os.path.exists(os.path.join(folder, "depth")), err


def test_depth_study_quick_writes_json_md_png(run, tmp_path):
    import json

    out_dir = tmp_path / "study"
    code, out, err = run_cli("experiments.studies.depth", [run, "--quick", "--json", "--out", str(out_dir),
                                                   "--eps", "1e-1,1e-3,0", "--depths", "1,3,6,12"], str(tmp_path))
    assert code == 0, err
    doc = json.loads(out)
    assert json.loads((out_dir / "depth.json").read_text()) == doc
    assert (out_dir / "depth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Depth chosen by the energy" in (out_dir / "depth.md").read_text()
    assert doc["trained_layers"] == 3 and doc["quick"] and [r["eps"] for r in doc["eps"]] == [0.1, 1e-3, 0.0]
    off = doc["eps"][-1]
    assert off["mean_layers"] == 3 and off["frozen_steps"] == 0
    assert all(r["mean_layers"] <= 3 and r["steps"] + r["frozen_steps"] == 3 * r["examples"] for r in doc["eps"])
    assert [r["layers"] for r in doc["depths"]] == [1, 3, 6, 12]
    assert all(r["increases"] == 0 and r["nonfinite"] == 0 for r in doc["depths"] + doc["eps"])
    assert doc["depths"][1]["accuracy"] == off["accuracy"]                    # depth T = the rule off
    energy = [r["energy_last_mean"] for r in doc["depths"]]
    assert energy == sorted(energy, reverse=True)                             # deeper: lower energy
    # refusals: one line, exit 2, nothing written
    for args, what in (([run, "--eps", "2"], "--eps"), ([run, "--eps", "1e-2,,0"], "--eps"),
                       ([run, "--depths", "0"], "--depths"), ([run, "--eps", "1e-2,1e-2"], "twice"),
                       ([run, "--out", os.path.join(run, "config.yaml")], "--out")):
        code, out, err = run_cli("experiments.studies.depth", args, str(tmp_path))
        assert code == 2 and what in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not os.path.exists(os.path.join(run, "depth"))


def test_a_generated_dataset_is_read_back_with_its_options(tmp_path):
    """A run on ListOps with its own generator options (lengths, counts) is read again by every consumer of its
    config (here the depth study, which checks the test split's fingerprint) through one function,
    ``experiments.data.load_configured``. The run is a call of the trainer's main in this process (its thread
    count restored after)."""
    out = tmp_path / "lo"
    threads = torch.get_num_threads()
    try:
        code, _, err = run_cli("experiments.app.train", [
            "--config", "listops", "--run-dir", str(out), "data.max_len=24", "data.listops_min_len=8",
            "data.listops_max_len=24", "data.listops_train=120", "data.listops_val=40", "data.listops_test=40",
            "model.d=16", "model.layers=2", "train.epochs=1", "train.progress=false", "train.tensorboard=false",
            "train.threads=1"], ROOT)
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err[-2000:]
    code, out_json, err = run_cli("experiments.studies.depth", [str(out), "--quick", "--json", "--eps", "0.1,0",
                                                        "--depths", "1,2"], str(tmp_path))
    assert code == 0, err
    import json
    doc = json.loads(out_json)
    assert doc["eps"][0]["examples"] == 40 and all(r["increases"] == 0 for r in doc["depths"])
    # negative control: the same run read with other options is a different test split, refused
    from experiments.data import config_options, load_configured
    from experiments.app.config import load_config
    dc = load_config(str(out / "config.yaml"))["data"]
    assert config_options(dc)["max_len"] == 24
    assert load_configured(dc).test != load_configured({**dc, "listops_min_len": 9}).test
