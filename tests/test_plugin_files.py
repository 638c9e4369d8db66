"""Each kind of part, added from outside the package in one file (CONTRIBUTING.md): a rho, a token graph, a
pairwise kernel and an encoder.

Each plug-in below is the whole of what a contributor writes: one module, written to ``tmp_path``, that imports the
library's public paths and registers its part with one decorator. Loaded by :func:`unfold.plugins.import_plugins`
(what ``--import MODULE`` does), the part is then selectable by name: by the library, by the config check
(:func:`experiments.app.config.load_config`) and by the model a config builds
(:func:`experiments.app.build.build_model`), which trains through it (loss and gradient finite, the weights move,
and for the MM parts the energy descends). Each test checks that the name is refused before the import (the
registration is what makes it valid) and removes it again afterwards.
"""
import sys

import pytest
import torch

import energies as E
import unfold as U
import unfold.plugins as plugins
from energies.errors import ConfigError
from energies.graphs import MASK_FREE
from energies.kernels import pairwise_pass
from experiments.app.build import build_model
from experiments.app.config import load_config

RHO = '''\
"""A penalty: rho(z) = 2 sqrt(1 + z), concave and non-decreasing (rho'(z) = 1 / sqrt(1 + z))."""
import torch

from energies.rho import Rho, register_rho


@register_rho("sqrtrho")
class SqrtRho(Rho):
    def value(self, z):
        return 2.0 * torch.sqrt(1.0 + z)

    def derivative(self, z):
        return 1.0 / torch.sqrt(1.0 + z)

    def spec(self):
        return "sqrtrho"
'''

GRAPH = '''\
"""A token graph: each token linked to the tokens K and 2K places away (a two-scale dilation)."""
import torch

from energies.graphs import TokenGraph, from_edge_index, register_graph


@register_graph("twoscale", mask_free=True)
def twoscale(n, k, batch_size=1, mask=None, seed=0) -> TokenGraph:
    k = int(k)
    i = torch.arange(n)
    pairs = [(i[:-o], i[o:]) for o in (k, 2 * k) if 0 < o < n]
    edges = torch.stack([torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])]) if pairs else \\
        torch.zeros(2, 0, dtype=torch.long)
    return from_edge_index(edges, n, batch_size, mask, name=f"twoscale:{k}")
'''

KERNEL = '''\
"""A pairwise kernel: every pair's explicit difference at once, (B, n, n, d) (small n only), any graph."""
import torch

from energies.kernels import PairwisePass, register_kernel


@register_kernel("allpairs")
def allpairs(Y, graph, rho, tau, energy, num, metric=None):
    Z = Y if metric is None else Y @ metric.to(device=Y.device, dtype=Y.dtype)
    diff = Z[:, None, :, :] - Z[:, :, None, :]                  # [b, u, v] = z_v - z_u
    z = (diff * diff).sum(-1) / (2.0 * tau)
    pm = graph.pair_mask()
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    gamma = torch.where(pm, rho.derivative(z), zero)
    agg = (gamma[..., None] * diff).sum(2) if num else None
    e = 0.5 * tau * torch.where(pm, rho.value(z), zero).to(torch.float64).sum((1, 2)) if energy else None
    return PairwisePass(agg, gamma.sum(-1), e)
'''

ENCODER = '''\
"""An encoder: T shared MM steps on E(Y) = sum_G tau rho(|y_u - y_v|^2 / 2 tau) + 1/2 |Y - X W|^2 (W learned):
attention with an initial residual and nothing else, every layer a descent step of that energy."""
import math

import torch
from torch import nn

from energies import Energy, PairwiseAttention, Residual
from unfold import Encoder, register_encoder
from unfold.mm import mm_step
from unfold.trace import resolution


@register_encoder("plainmm")
class PlainMM(Encoder):
    guaranteed = True
    weight_shared = True

    def __init__(self, d=64, layers=4, rho="exp", tau=None, alpha=0.9, kernel="auto", graph="complete",
                 validate=False):
        super().__init__(d, layers, graph, validate)
        self.rho, self.tau, self.alpha, self.kernel = rho, tau or math.sqrt(d), alpha, kernel
        self.W = nn.Parameter(torch.eye(d) + 0.1 * torch.randn(d, d))

    def energy(self, B):
        return Energy(attention=PairwiseAttention(self.rho, self.tau, kernel=self.kernel), residual=Residual(B))

    def run(self, X, mask, graph, trace, keep_states, layers):
        B = graph.zero_padded(X @ self.W)
        energy = self.energy(B)
        values, res, states = [], [], []
        Y = B
        for _ in range(self.layers if layers is None else layers):
            if keep_states:
                states.append(Y)
            step = mm_step(energy, Y, graph, self.alpha, values=trace)
            if trace:
                values.append({k: v.detach() for k, v in step.values.items()})
                res.append(resolution(energy, Y, graph, step.curvature))
            Y = step.Y
        return self.finish(Y, energy, graph, values, res, states, trace, keep_states, True)
'''


@pytest.fixture
def load(tmp_path, monkeypatch):
    """``load(name, source)``: write ``tmp_path/name.py`` and import it as a plug-in; everything it registered, and
    the module, are removed afterwards."""
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(plugins, "_imported", set())
    tables = (E.RHOS, E.GRAPHS, E.KERNELS, U.ENCODERS)
    before = [set(t) for t in tables]
    loaded = []

    def do(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(source)
        assert plugins.import_plugins([name]) == [name]
        loaded.append(name)

    yield do
    for table, names in zip(tables, before):
        for name in set(table) - names:
            del table[name]
    for name in loaded:
        sys.modules.pop(name, None)


def train_steps(cfg, steps: int = 3):
    """A few Adam steps of the model the config builds on a fixed toy batch (the loss falls, every weight
    gradient finite): the last traced output and the model."""
    torch.manual_seed(0)
    model = build_model(cfg, 30, 2).double()
    ids = torch.randint(1, 30, (4, 9))
    ids[2, 6:] = 0                                        # padding
    y = torch.tensor([0, 1, 0, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    losses = []
    for _ in range(steps):
        out = model(ids, ids != 0, trace=True)
        loss = torch.nn.functional.cross_entropy(out.logits, y)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(float(loss.detach()))
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved and all(map(lambda x: x == x, losses)) and losses[-1] < losses[0], losses   # it learns
    return out, model


TINY = ["model.d=8", "model.heads=2", "model.layers=2", "data.max_len=9"]


def test_a_rho_is_one_file(load):
    with pytest.raises(ConfigError, match="model.rho"):
        load_config("tiny", TINY + ["model.rho=sqrtrho"])
    load("plug_rho", RHO)
    rho = E.get_rho("sqrtrho")                             # validated like a built-in one (concave, non-decreasing)
    z = torch.linspace(0, 4, 9, dtype=torch.float64)
    assert torch.allclose(rho.derivative(z), 1 / torch.sqrt(1 + z))
    out, _ = train_steps(load_config("tiny", TINY + ["model.rho=sqrtrho"]))
    rep = out.report()
    assert rep.num_increases == 0 and rep.steps > 0        # guaranteed mode with a concave rho: still descends


def test_a_graph_is_one_file(load):
    with pytest.raises(ConfigError, match="model.graph"):
        load_config("tiny", TINY + ["model.graph=twoscale:2"])
    load("plug_graph", GRAPH)
    g = E.graph_from_spec("twoscale:2", 9)
    assert sorted(map(tuple, g.edges().T.tolist())) == sorted([(i, i + 2) for i in range(7)] +
                                                              [(i, i + 4) for i in range(5)])
    assert "twoscale" in MASK_FREE and g.name == "twoscale:2"
    out, _ = train_steps(load_config("tiny", TINY + ["model.graph=twoscale:2"]))
    assert out.report().num_increases == 0


def test_a_kernel_is_one_file(load):
    with pytest.raises(ConfigError, match="model.kernel"):
        load_config("tiny", TINY + ["model.kernel=allpairs"])
    load("plug_kernel", KERNEL)
    assert E.kernel_names()[-1] == "allpairs"
    gen = torch.Generator().manual_seed(3)
    Y = torch.randn(2, 7, 4, dtype=torch.float64, generator=gen)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    for g in (E.window(7, 2, batch_size=2, mask=mask), E.complete(7, 2, mask)):
        ref = pairwise_pass(Y, g, E.get_rho("cauchy"), 1.3, "edges", energy=True)
        got = pairwise_pass(Y, g, E.get_rho("cauchy"), 1.3, "allpairs", energy=True)
        assert torch.allclose(got.agg, ref.agg, atol=1e-12) and torch.allclose(got.deg, ref.deg, atol=1e-12)
        assert torch.allclose(got.energy, ref.energy, rtol=1e-12)
    cfg = load_config("tiny", TINY + ["model.kernel=allpairs", "model.graph=window:2"])
    out, model = train_steps(cfg)
    assert model.encoder.kernel == "allpairs" and out.report().num_increases == 0


def test_an_encoder_is_one_file(load):
    with pytest.raises(ConfigError, match="model.mode"):
        load_config("tiny", TINY + ["model.mode=plainmm"])
    load("plug_encoder", ENCODER)
    cfg = load_config("tiny", TINY + ["model.mode=plainmm", "model.alpha=0.5"])
    out, model = train_steps(cfg)
    assert type(model.encoder).__name__ == "PlainMM" and model.encoder.alpha == 0.5
    rep = out.report()
    assert rep.steps == 4 * 2 and rep.num_increases == 0 and out.guaranteed
    assert set(out.energies) >= {"attention", "residual"}
