"""Standard attention activations and the spline probe (Lai, Lim, Liu: attention is a cubic spline)."""
import importlib.util
import json
import math

import pytest
import torch

import unfold as U
from energies.errors import ConfigError
from experiments.studies.spline_probe import (Encoder, EncoderBlock, main, probe, probe_attention, probe_model, run_taped,
                                      static_degree)
from unfold.attention import Attention


def test_relu_attention_fits_degree_3_and_not_2():
    out = probe_attention("relu", seed=0)
    assert out["verdict"] == "spline" and out["degree"] == 3 and out["static_degree_bound"] == 3
    assert out["pieces"] > 1 and out["max_continuity_gap"] < 1e-6
    assert out["max_slope_jump"] > 1e-3          # continuous but not C^1: the probe reports, never requires it
    low = probe_attention("relu", seed=0, max_degree=2)
    assert low["verdict"] == "non-spline" and low["degree"] is None and low["max_residual"] > 1e-6


@pytest.mark.parametrize("activation", ["softmax", "softplus"])
def test_smooth_activations_fail_every_low_degree(activation):
    out = probe_attention(activation, seed=1)
    assert out["verdict"] == "non-spline" and out["degree"] is None and out["static_degree_bound"] is None
    assert out["pieces"] == 1 and out["max_residual"] > 1e-7


@pytest.mark.parametrize("which,degree", [("context", 2), ("x", 1), ("both", 3)])
def test_cross_attention_degrees(which, degree):
    out = probe_attention("relu", cross=which, seed=2)
    assert out["verdict"] == "spline" and out["degree"] == degree == out["static_degree_bound"]


def test_static_bound_is_never_below_the_probed_degree():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    for module in (EncoderBlock(3, activation="relu"), Encoder(EncoderBlock(3), EncoderBlock(3))):
        module = module.double()
        X0, D = (torch.randn(1, 4, 3, dtype=torch.float64, generator=gen) for _ in range(2))
        bound = static_degree(module)
        out = probe(lambda t: module(X0 + t * D), module, t_max=1.0, max_degree=bound)
        assert out["verdict"] == "spline" and out["degree"] <= bound
    assert static_degree(Encoder(EncoderBlock(3), EncoderBlock(3))) == 9
    assert static_degree(EncoderBlock(3, layernorm=True)) is None


@pytest.mark.parametrize("activation", ["softmax", "relu", "softplus"])
def test_causal_output_j_ignores_inputs_after_j(activation):
    torch.manual_seed(0)
    att = Attention(4, 2, activation, causal=True).double()
    X = torch.randn(1, 7, 4, dtype=torch.float64)
    J = torch.autograd.functional.jacobian(att, X)[0, :, :, 0]      # (out pos, out feat, in pos, in feat)
    for j in range(7):
        assert J[j, :, j + 1:].abs().sum() == 0
        assert J[j, :, : j + 1].abs().max() > 0


def test_softmax_module_equals_torch_sdpa():
    torch.manual_seed(1)
    att = Attention(8, 2, "softmax").double()
    X = torch.randn(3, 5, 8, dtype=torch.float64)
    q, k, v = (att._split(lin(X)) for lin in (att.q, att.k, att.v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(3, 5, 8)
    assert torch.allclose(att(X), att.o(ref), atol=1e-12)


def test_softplus_attention_tends_to_relu_attention_at_rate_t():
    """|t softplus(s/t) - relu(s)| <= t log 2 per weight, so the outputs differ by at most
    t log 2 / m * sum_i |V_i| |W_o| (checked entrywise). A query of zeros has every score 0, where the
    weight gap is exactly t log 2: its output error is exactly linear in t (the rate is attained)."""
    torch.manual_seed(2)
    X = torch.randn(1, 6, 4, dtype=torch.float64)
    X[0, 0] = 0.0
    relu = Attention(4, 1, "relu").double()
    with torch.no_grad():
        V = relu.v(X)[0]
        bound = math.log(2) / 6 * (V.abs().sum(0) @ relu.o.weight.abs().T)
    errs = []
    for t in (1e-1, 1e-2, 1e-3, 1e-4):
        sp = Attention(4, 1, "softplus", temperature=t).double()
        sp.load_state_dict(relu.state_dict())
        err = (sp(X) - relu(X)).abs()[0]
        assert (err <= t * bound + 1e-15).all()
        errs.append(err[0] / t)
    assert all(torch.allclose(e, errs[0], rtol=1e-9) for e in errs) and errs[0].max() > 0


def test_attention_refuses_bad_input():
    with pytest.raises(ConfigError, match="unknown attention activation 'gelu'; valid"):
        Attention(4, 1, "gelu")
    with pytest.raises(ConfigError, match="temperature > 0"):
        Attention(4, 1, "softplus", temperature=0)


# ------------------------------------------------------------------ models and our own MM steps
def _tiny(**kw):
    torch.manual_seed(0)
    kw = {"d": 4, "heads": 1, "layers": 1, "dropout": 0.0, **kw}
    return U.UnfoldedTransformer(30, 2, **kw).double().eval()


PROBE = dict(n=4, t_max=2.0, grid=257)


def test_mm_relu_attention_with_constant_curvature_is_a_cubic_spline():
    """Y - a grad E(Y) / c with c fixed and rho = relu:C: relu(C - z) (quadratic) times y_u - y_v (linear)."""
    model = _tiny(rho="relu:2", curvature="constant")
    out = probe_model(model, **PROBE)
    assert out["verdict"] == "spline" and out["degree"] == 3 == out["static_degree_bound"], out
    assert out["pieces"] > 1 and out["max_residual"] < 1e-12
    assert probe_model(model, max_degree=2, **PROBE)["verdict"] == "non-spline"
    two = probe_model(model, layers=2, **PROBE)
    assert two["verdict"] == "spline" and 3 < two["degree"] <= two["static_degree_bound"] == 9


def test_mm_relu_attention_with_adaptive_curvature_is_no_spline_and_says_why():
    """The default step divides by sum_v relu(C - z_uv): a rational function on each piece."""
    model = _tiny(rho="relu:2")
    out = probe_model(model, **PROBE)
    assert out["verdict"] == "non-spline" and out["degree"] is None and out["static_degree_bound"] is None
    assert any("adaptive curvature" in r for r in out["non_spline_parts"])
    assert out["pieces"] > 1      # the kinks of relu(C - z) and of the ReLU prox are seen through their modules' hooks


@pytest.mark.parametrize("norm,verdict", [("none", "spline"), ("post", "non-spline")])
def test_free_mode_relu_blocks_are_splines_only_without_layernorm(norm, verdict):
    out = probe_model(_tiny(mode="free", attention="relu", norm=norm), **PROBE)
    assert out["verdict"] == verdict
    if norm == "none":
        assert out["degree"] == 3 == out["static_degree_bound"]
    else:
        assert out["non_spline_parts"] == ["LayerNorm (division by the standard deviation)"]


def test_kink_tape_replays_the_frozen_map():
    model = _tiny(rho="relu:2", curvature="constant")
    mask = torch.ones(1, 5, dtype=torch.bool)
    X = torch.randn(1, 5, 4, dtype=torch.float64)
    f = lambda: model.encode(X, mask)[0]   # noqa: E731
    out, tape = run_taped(model, f)
    assert tape.signs and not bool(tape.pattern().all())          # both signs occur
    same, _ = run_taped(model, f, replay=tape.signs)
    assert torch.equal(same, out)                                 # the frozen map agrees where recorded
    flipped = [~s for s in tape.signs]
    other, _ = run_taped(model, f, replay=flipped)
    assert not torch.allclose(other, out)                         # negative control: another pattern, another map
    with pytest.raises(RuntimeError, match="kink tape out of step"):
        run_taped(model, f, replay=tape.signs[:1])
    # the hooks are gone afterwards, and the core holds no global state for the probe: the model's ReLUs are
    # modules (the rho kernel's kink, the prox), plain ReLUs outside a taped call
    assert all(not m._forward_hooks for m in model.modules())
    assert importlib.util.find_spec("energies.kinks") is None
    relus = [m for m in model.modules() if isinstance(m, torch.nn.ReLU)]
    assert relus and torch.equal(relus[0](torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_probe_cli_on_a_config(capsys):
    code = main(["--config", "experiments/configs/default.yaml", "--n", "3", "--t-max", "1", "--json",
                 "model.d=4", "model.heads=1", "model.layers=1", "model.rho=relu:2", "model.curvature=constant"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and out["verdict"] == "spline" and out["degree"] == 3 and out["static_degree_bound"] == 3
    assert main(["--config", "experiments/configs/default.yaml", "model.nope=1"]) == 2
    assert "unknown config key 'model.nope'" in capsys.readouterr().err
