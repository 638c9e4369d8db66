"""Fuzz: random configs from the registries either run a forward/backward step or fail with the
framework's own error (a subclass of UnfoldError), never a raw error from deep inside torch."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from energies.errors import EnergyError, UnfoldError
from energies.rho import RHOS, Rho, get_rho
from experiments.app.config import load_config
from experiments.app.build import build_model
from unfold.attention import ACTIVATIONS
from unfold.model import MODES

VALID_RHO = st.sampled_from(["exp", "relu:0.5", "relu:2", "softplus:2:0.5", "softplus:1:2", "cauchy", "lp:0.5", "lp:1",
                             "lp:2"])
VALID_GRAPH = st.sampled_from(["complete", "window:1", "window:3", "strided:2", "dilated:2:1", "star", "random:0.3",
                               "random:0.8"])
#: one bad value per key, with the mode it is bad in (None: any)
BAD = [("model.rho", "gauss", "guaranteed"), ("model.rho", "relu:-1", "guaranteed"), ("model.rho", "lp:3", "guaranteed"),
       ("model.graph", "window:0", None), ("model.graph", "ring", None), ("model.graph", "random:2", None),
       ("model.alpha", 0.0, None), ("model.alpha", 1.5, None), ("model.alpha", float("nan"), None),
       ("model.tau", -1.0, None), ("model.d", 0, None), ("model.layers", 0, None), ("model.attention", "gelu", "free"),
       ("model.norm", "pre", "free"), ("model.curvature", "exact", None), ("model.mode", "deq", None),
       ("model.attention", "relu", "guaranteed"), ("model.norm", "none", "baseline"),
       ("model.curvature", "constant", "free"), ("model.heads", 3, "free"), ("data.max_len", 0, None),
       ("model.dropout", "high", None)]


@st.composite
def configs(draw):
    mode = draw(st.sampled_from(list(MODES)))
    ov = {"model.mode": mode, "model.d": draw(st.sampled_from([4, 6, 8])), "model.heads": draw(st.sampled_from([1, 2])),
          "model.layers": draw(st.integers(1, 3)), "model.dropout": draw(st.sampled_from([0.0, 0.1]))}
    if mode == "guaranteed":
        ov.update({"model.rho": draw(VALID_RHO), "model.graph": draw(VALID_GRAPH),
                   "model.curvature": draw(st.sampled_from(["adaptive", "constant"])),
                   "model.layernorm": draw(st.booleans()), "model.relu": draw(st.booleans()),
                   "model.alpha": draw(st.sampled_from([0.25, 1.0])), "model.tau": draw(st.sampled_from([None, 0.5, 3.0]))})
    elif mode == "free":
        ov.update({"model.attention": draw(st.sampled_from(sorted(ACTIVATIONS))), "model.graph": draw(VALID_GRAPH),
                   "model.norm": draw(st.sampled_from(["post", "none"]))})
    else:
        ov.update({"model.attention": draw(st.sampled_from(sorted(ACTIVATIONS)))})
    bad = None
    if draw(st.booleans()):
        key, value, where = draw(st.sampled_from([b for b in BAD if b[2] in (None, mode)]))
        if key == "model.heads":
            ov["model.d"] = 4
        ov[key] = value
        bad = key
    return ov, bad


def _yaml(v):
    return "null" if v is None else (".nan" if isinstance(v, float) and math.isnan(v) else str(v))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.integers(1, 9), st.integers(0, 2 ** 16))
def test_random_configs_run_or_fail_with_a_framework_error(case, n, seed):
    """Valid configs run a forward and backward pass with finite loss and a full energy trace; a config
    with one bad value fails with an UnfoldError whose message names the key or the value."""
    ov, bad = case
    gen = torch.Generator().manual_seed(seed)
    try:
        cfg = load_config(None, [f"{k}={_yaml(v)}" for k, v in ov.items() if not k.startswith("data.")] +
                          ["data.glove=none", f"data.max_len={ov.get('data.max_len', 16)}"])
        model = build_model(cfg, 20, 3)
        ids = torch.randint(1, 20, (2, n), generator=gen)
        mask = torch.ones(2, n, dtype=torch.bool)
        mask[1, n // 2 + 1:] = False
        out = model(ids, mask)
        loss = torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2]))
        loss.backward()
    except UnfoldError as exc:
        assert bad is not None, f"a valid config failed: {ov}: {exc}"
        name, value = bad.split(".")[-1], _yaml(ov[bad])
        msg = str(exc)
        assert name in msg or value in msg or ("nan" in value and "nan" in msg), (bad, msg)
        return
    assert bad is None, f"bad {bad}={ov[bad]!r} was accepted"
    assert torch.isfinite(loss)
    assert all(v.shape == (2, cfg["model"]["layers"] + 1) for v in out.energies.values())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_rho_that_is_not_concave_is_refused(monkeypatch):
    class Convex(Rho):
        def value(self, z):
            return z * z

        def derivative(self, z):
            return 2 * z

    class Decreasing(Rho):
        def value(self, z):
            return -z

        def derivative(self, z):
            return -torch.ones_like(z)

    monkeypatch.setitem(RHOS, "convex", Convex)
    monkeypatch.setitem(RHOS, "decreasing", Decreasing)
    with pytest.raises(EnergyError, match=r"rho rho is not concave: rho' increases from 0 at z=0"):
        get_rho("convex")
    with pytest.raises(EnergyError, match="is not non-decreasing"):
        get_rho("decreasing")
