import math

import pytest
import torch

import energies as E
from energies.errors import EnergyError
from reference import complete_edges, e1_numpy, rho_value
from matrix import rho_specs

RHOS = rho_specs("energy")  # drawn from the registry (tests/matrix.py)


def graphs(n, batch_size=1, mask=None):
    return [E.complete(n, batch_size, mask), E.window(n, 2, batch_size, mask), E.strided(n, 3, batch_size, mask),
            E.dilated(n, 2, 2, batch_size, mask), E.star(n, batch_size, mask),
            E.random(n, 0.4, batch_size, mask, seed=7)]


@pytest.mark.parametrize("spec", RHOS)
def test_rho_derivative_is_autograd_and_rho_is_concave_nondecreasing(spec):
    rho = E.get_rho(spec)
    z = torch.linspace(0, 8, 4001, dtype=torch.float64)[1:].requires_grad_()
    (g,) = torch.autograd.grad(rho.value(z).sum(), z)
    assert torch.allclose(g, rho.derivative(z.detach()), rtol=1e-9, atol=1e-12)
    d = rho.derivative(z.detach())
    assert (d >= 0).all(), "rho must be non-decreasing"
    assert (d[1:] <= d[:-1] + 1e-15).all(), "rho' must be non-increasing (rho concave)"
    # concavity of the values themselves: midpoint above the chord
    v = rho.value(z.detach())
    assert (v[1:-1] >= 0.5 * (v[2:] + v[:-2]) - 1e-12).all()
    # matches the independent reference formula
    for zz in [0.0, 1e-4, 0.3, 1.0, 2.7]:
        assert rho.value(torch.tensor(zz, dtype=torch.float64)).item() == pytest.approx(rho_value(spec, zz), abs=1e-14)


def test_rho_errors():
    with pytest.raises(EnergyError, match="unknown rho 'softmaxx'"):
        E.get_rho("softmaxx")
    with pytest.raises(EnergyError, match="0 < p <= 2"):
        E.get_rho("lp:3")
    with pytest.raises(EnergyError, match="c > 0"):
        E.get_rho("relu:-1")
    with pytest.raises(EnergyError, match="tau"):
        E.PairwiseAttention("exp", tau=0.0)


@pytest.mark.parametrize("spec", RHOS)
def test_e1_matches_independent_numpy(spec):
    torch.manual_seed(0)
    n, d = 9, 4
    Y = torch.randn(n, d, dtype=torch.float64)
    Bm = torch.randn(n, d, dtype=torch.float64)
    for g in graphs(n):
        edges = [(u, v) for u, v in g.edges().T.tolist()]
        for B in (None, Bm):
            for tau in (1.0, 2.5):
                ours = E.attention_energy(spec, tau, B).value(Y, g).item()
                ref = e1_numpy(Y.numpy(), edges, spec, tau, None if B is None else B.numpy())
                assert ours == pytest.approx(ref, rel=1e-10, abs=1e-10), (g.name, B is None, tau)
    assert edges_complete_ok(n)


def edges_complete_ok(n):
    g = E.complete(n)
    return sorted(tuple(e) for e in g.edges().T.tolist()) == complete_edges(n)


def test_dense_and_edge_kernels_agree():
    torch.manual_seed(1)
    mask = E.mask_from_lengths([10, 7, 4], 10)
    Y = torch.randn(3, 10, 5, dtype=torch.float64)
    for g in graphs(10, 3, mask):
        for spec in RHOS:
            e_edges = E.PairwiseAttention(spec, 1.3, kernel="edges")
            e_dense = E.PairwiseAttention(spec, 1.3, kernel="dense")
            assert torch.allclose(e_edges.value(Y, g), e_dense.value(Y, g), rtol=1e-12, atol=1e-12)
            assert torch.allclose(e_edges.grad(Y, g), e_dense.grad(Y, g), rtol=1e-10, atol=1e-12)


def all_terms(d):
    W = torch.randn(d, d, dtype=torch.float64)
    return [E.PairwiseAttention(s, 1.7) for s in RHOS] + [
        E.Residual(), E.Residual(torch.randn(8, d, dtype=torch.float64)), E.FeedForward(W + W.T),
        E.Centering(), E.Rescaling(), E.Rescaling(1.0)]


def test_analytic_gradients_equal_autograd():
    torch.manual_seed(2)
    d = 5
    mask = E.mask_from_lengths([8, 5], 8)
    for g in graphs(8, 2, mask):
        for term in all_terms(d):
            Y = torch.randn(2, 8, d, dtype=torch.float64, requires_grad=True)
            (auto,) = torch.autograd.grad(term.value(Y, g).sum(), Y)
            assert torch.allclose(term.grad(Y.detach(), g), auto, rtol=1e-9, atol=1e-11), (g.name, term)
            assert (term.grad(Y.detach(), g)[1, 5:] == 0).all()


def test_composite_reports_terms_and_merges():
    e = E.attention_energy("cauchy") + E.feedforward_energy(torch.eye(3, dtype=torch.float64))
    assert e.names == ["attention", "residual", "ffn", "residual@2"]
    Y = torch.randn(1, 4, 3, dtype=torch.float64)
    g = E.complete(4)
    vals = e.term_values(Y, g)
    assert torch.allclose(sum(vals.values()), e.value(Y, g))
    assert torch.allclose(vals["residual"], vals["residual@2"])
    shared = E.Residual()
    e2 = E.Energy(a=shared) + E.Energy(b=shared)
    assert e2.names == ["a"]  # the same term object counts once


def test_feedforward_needs_symmetric_square_weight():
    with pytest.raises(EnergyError, match="symmetric"):
        E.FeedForward(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
    with pytest.raises(EnergyError, match="square"):
        E.FeedForward(torch.zeros(2, 3))


def test_indicator_values():
    g = E.complete(3, mask=torch.tensor([[True, True, False]]))
    t = E.NonNegativity()
    assert t.value(torch.tensor([[[1.0], [0.0], [-5.0]]]), g).item() == 0.0  # padded slot ignored
    assert t.value(torch.tensor([[[1.0], [-1e-9], [0.0]]]), g).item() == math.inf


def test_float32_tokens_evaluate_in_float64():
    Y = torch.randn(1, 6, 4)
    v = E.attention_energy().value(Y, E.complete(6))
    assert v.dtype == torch.float64
    assert v.item() == pytest.approx(e1_numpy(Y[0].double().numpy(), complete_edges(6)), rel=1e-12)


def test_softplus_integral_matches_quadrature_and_its_derivative_is_softplus():
    from scipy.integrate import quad
    import numpy as np

    from energies.rho import softplus_integral

    us = [-40.0, -7.0, -1.0, -0.2, 0.0, 0.3, 2.0, 9.0, 35.0]
    got = softplus_integral(torch.tensor(us, dtype=torch.float64))
    for u, g in zip(us, got.tolist()):
        ref = quad(lambda s: np.logaddexp(0.0, s), -np.inf, u, epsabs=1e-13, epsrel=1e-13, limit=200)[0]
        assert abs(g - ref) <= 1e-12 * max(1.0, abs(ref))
    u = torch.tensor(us, dtype=torch.float64, requires_grad=True)
    (d,) = torch.autograd.grad(softplus_integral(u).sum(), u)
    assert (d - torch.nn.functional.softplus(u)).abs().max() < 1e-12


def test_softplus_kernel_tends_to_the_relu_kernel_at_rate_t_log2():
    """|t softplus((c - z)/t) - max(c - z, 0)| <= t log 2, attained at z = c; the energies converge too."""
    z = torch.linspace(0.0, 4.0, 401, dtype=torch.float64)
    relu = E.get_rho("relu:1.5")
    for t in (1.0, 0.1, 0.01, 0.001):
        sp = E.get_rho(f"softplus:1.5:{t}")
        gap = (sp.derivative(z) - relu.derivative(z)).abs().max().item()
        assert gap <= t * math.log(2) + 1e-15 and gap >= 0.99 * t * math.log(2)
        assert (sp.value(z) - relu.value(z)).abs().max().item() <= 4.0 * t * math.log(2) + 1e-12
