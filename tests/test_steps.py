import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import energies as E
import unfold as U
from energies.errors import StepError
from matrix import rho_specs

RHOS = rho_specs("kernels")  # drawn from the registry (tests/matrix.py)


def builders(n, B, mask=None, seed=0):
    return [E.complete(n, B, mask), E.window(n, 2, B, mask), E.strided(n, 3, B, mask),
            E.dilated(n, 2, 2, B, mask), E.star(n, B, mask), E.random(n, 0.3, B, mask, seed=seed)]


# ------------------------------------------------------------------ kernels agree
@pytest.mark.parametrize("update", ["exact", "printed"])
def test_softmax_form_equals_edge_list_form_on_complete_graph(update, device):
    torch.manual_seed(0)
    mask = E.mask_from_lengths([12, 9, 5], 12).to(device)
    g = E.complete(12, 3, mask).to(device)
    Y = torch.randn(3, 12, 6, dtype=torch.float64, device=device)
    Bs = [None] if update == "printed" else [None, torch.randn(3, 12, 6, dtype=torch.float64, device=device)]
    for tau in (1.0, math.sqrt(6), 5.0):
        for B in Bs:
            for alpha in (1.0, 0.4):
                soft = U.AttentionStep("exp", tau, alpha, B, update, kernel="softmax")(Y, g)
                edge = U.AttentionStep("exp", tau, alpha, B, update, kernel="edges")(Y, g)
                dense = U.AttentionStep("exp", tau, alpha, B, update, kernel="dense")(Y, g)
                assert (soft - edge).abs().max().item() < 1e-10
                assert (dense - edge).abs().max().item() < 1e-10
                assert torch.equal(soft[1, 9:], Y[1, 9:])  # padded slots untouched


def test_softmax_kernel_refuses_what_it_cannot_do():
    Y = torch.randn(1, 5, 3, dtype=torch.float64)
    with pytest.raises(E.EnergyError, match="complete graph and rho='exp'"):
        U.AttentionStep("cauchy", kernel="softmax")(Y, E.complete(5))
    with pytest.raises(E.EnergyError, match="complete graph and rho='exp'"):
        U.AttentionStep("exp", kernel="softmax")(Y, E.window(5, 1))
    with pytest.raises(StepError, match=r"alpha must lie in \(0, 1\]"):
        U.AttentionStep(alpha=0.0)
    with pytest.raises(StepError, match="printed"):
        U.AttentionStep(B=torch.zeros(5, 3), update="printed")
    with pytest.raises(StepError, match="unknown attention update"):
        U.AttentionStep(update="exactly")


# ------------------------------------------------------------------ the step is the MM step
@pytest.mark.parametrize("rho", RHOS)
def test_step_minimises_its_jacobi_preconditioned_surrogate(rho):
    """Closed form vs a generic solver: Y1 = argmin_Y' <g, Y'-Y0> + sum_u D_u |y'_u - y0_u|^2 / (2 alpha),
    g = grad E~(Y0) = grad E1(Y0); for alpha = 1 also the per-token minimiser of E~ with the others fixed."""
    from scipy.optimize import minimize

    torch.manual_seed(3)
    n, d = 7, 3
    for g in builders(n, 1, seed=2):
        Y0 = torch.randn(1, n, d, dtype=torch.float64)
        B = torch.randn(1, n, d, dtype=torch.float64)
        for alpha in (1.0, 0.6):
            step = U.AttentionStep(rho, 1.2, alpha, B)
            Y1 = step(Y0, g)
            D = step.jacobi_diagonal(Y0, g)[0]
            Et = step.surrogate(Y0, g)
            Yr = Y0.clone().requires_grad_()
            (grad,) = torch.autograd.grad(Et(Yr).sum(), Yr)
            assert torch.allclose(grad, step.energy.grad(Y0, g), atol=1e-10)  # tangent: same gradient

            def model(x):
                X = torch.from_numpy(x).reshape(n, d)
                diff = X - Y0[0]
                val = (grad[0] * diff).sum() + (D[:, None] * diff * diff).sum() / (2 * alpha)
                gr = grad[0] + D[:, None] * diff / alpha
                return val.item(), gr.reshape(-1).numpy()

            res = minimize(model, Y0[0].reshape(-1).numpy(), jac=True, method="L-BFGS-B",
                           options={"gtol": 1e-13, "ftol": 1e-15, "maxiter": 500})
            assert np.abs(res.x.reshape(n, d) - Y1[0].numpy()).max() < 1e-6, (g.name, alpha)
            if alpha == 1.0:
                for u in range(n):  # each token minimises E~ with the others held at Y0
                    Yu = Y0.clone()
                    Yu[0, u] = Y1[0, u]
                    Yu.requires_grad_()
                    (gu,) = torch.autograd.grad(Et(Yu).sum(), Yu)
                    assert gu[0, u].abs().max().item() < 1e-10


@pytest.mark.parametrize("rho", RHOS)
def test_surrogate_majorizes_and_touches(rho):
    torch.manual_seed(4)
    for g in builders(8, 4, seed=1):
        Y0 = torch.randn(4, 8, 3, dtype=torch.float64)
        step = U.AttentionStep(rho, 0.9, 1.0)
        Et = step.surrogate(Y0, g)
        assert torch.allclose(Et(Y0), step.energy.value(Y0, g), rtol=1e-13, atol=1e-12)
        for scale in (0.1, 1.0, 3.0):
            Yp = Y0 + scale * torch.randn_like(Y0)
            assert (Et(Yp) >= step.energy.value(Yp, g) - 1e-10).all()
        Y1 = step(Y0, g)
        assert (Et(Y1) <= Et(Y0) + 1e-12).all()


# ------------------------------------------------------------------ descent properties
def test_exact_steps_never_increase_E1_over_10000_layer_steps():
    """Seeded loop over every builder, every rho, alpha in (0, 1], residual plain or initial; float64."""
    total_steps = total_inc = 0
    rng = torch.Generator().manual_seed(123)
    for gi in range(6):
        for rho in RHOS:
            for alpha in (1.0, 0.7, 0.25):
                n, S = 14, 12
                mask = E.mask_from_lengths(torch.randint(4, n + 1, (S,), generator=rng), n)
                g = builders(n, S, mask, seed=gi)[gi]
                scale = float(torch.empty(1).uniform_(0.3, 2.0, generator=rng))
                Y = scale * torch.randn(S, n, 5, dtype=torch.float64, generator=rng)
                B = Y.clone() if alpha == 0.7 else None
                tau = float(torch.empty(1).uniform_(0.5, 4.0, generator=rng))
                step = U.AttentionStep(rho, tau, alpha, B)
                assert step.guaranteed()
                _, rep = U.trace_descent(step, Y, g, layers=10)
                total_steps += rep.steps
                total_inc += rep.num_increases
                assert rep.num_increases == 0, (g.name, rho, alpha, rep.violations[:1])
    assert total_steps >= 10_000
    assert total_inc == 0


def test_printed_update_raises_energy_on_random_sparse_graphs():
    """Negative control: eq. 38 as printed (self term in the numerator) is caught by the checker."""
    incs = steps = 0
    max_rel = 0.0
    for seed in range(4):
        g = E.random(32, 0.3, 64, seed=seed)
        Y = 0.5 * torch.randn(64, 32, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        step = U.AttentionStep("exp", tau=2.0, alpha=1.0, update="printed")
        assert not step.guaranteed()
        _, rep = U.trace_descent(step, Y, g, layers=10)
        incs += rep.num_increases
        steps += rep.steps
        max_rel = max(max_rel, rep.max_rel_increase())
        # the exact step on the same inputs does not increase
        _, rep_exact = U.trace_descent(U.AttentionStep("exp", 2.0, 1.0), Y, g, layers=10)
        assert rep_exact.num_increases == 0
    assert incs > 0 and max_rel > 1e-8
    assert incs < 0.2 * steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 16), d=st.integers(1, 6), S=st.integers(1, 4),
    graph=st.sampled_from(["complete", "window:1", "window:3", "strided:2", "strided:4", "dilated:2:3", "star",
                           "random:0.2", "random:0.7"]),
    rho=st.sampled_from(RHOS + ["relu:0.3", "cauchy", "lp:1.5"]),
    alpha=st.floats(0.01, 1.0), tau=st.floats(0.1, 10.0), scale=st.floats(0.01, 5.0),
    seed=st.integers(0, 10_000), residual=st.booleans())
def test_exact_descent_property(n, d, S, graph, rho, alpha, tau, scale, seed, residual):
    gen = torch.Generator().manual_seed(seed)
    g = E.graph_from_spec(graph, n, S, seed=seed)
    Y = scale * torch.randn(S, n, d, dtype=torch.float64, generator=gen)
    B = torch.randn(S, n, d, dtype=torch.float64, generator=gen) if residual else None
    _, rep = U.trace_descent(U.AttentionStep(rho, tau, alpha, B), Y, g, layers=4)
    assert rep.num_increases == 0, rep.violations[:1]


# ------------------------------------------------------------------ the other steps
def random_sym(d, gen, scale=1.0):
    A = torch.randn(d, d, dtype=torch.float64, generator=gen)
    return scale * (A + A.T) / 2


def test_feedforward_step_descends_under_its_bound_and_fails_beyond():
    gen = torch.Generator().manual_seed(5)
    g = E.window(10, 2, 8)
    for k in range(10):
        W = random_sym(6, gen, 0.8)
        if k % 2:  # I + W positive definite: the overshoot below must show
            W = W @ W.T
        Y = torch.randn(8, 10, 6, dtype=torch.float64, generator=gen)
        B = torch.randn(10, 6, dtype=torch.float64, generator=gen)
        L = U.FeedForwardStep(W).lipschitz()
        ok = U.FeedForwardStep(W, step_size=1.0 / L, B=B)
        assert ok.guaranteed()
        _, rep = U.trace_descent(ok, Y, g, layers=8)
        assert rep.num_increases == 0
        bad = U.FeedForwardStep(W, step_size=2.5 / L, B=B)
        assert not bad.guaranteed()
        _, rep_bad = U.trace_descent(bad, Y, g, layers=8)
        if k % 2:
            assert rep_bad.num_increases > 0  # negative control: a2 L > 2 overshoots


def test_feedforward_step_is_a_symmetric_linear_layer():
    gen = torch.Generator().manual_seed(6)
    W = random_sym(4, gen)
    B = torch.randn(5, 4, dtype=torch.float64, generator=gen)
    Y = torch.randn(1, 5, 4, dtype=torch.float64, generator=gen)
    a = 0.1
    out = U.FeedForwardStep(W, a, B)(Y, E.complete(5))
    assert torch.allclose(out, Y @ (torch.eye(4, dtype=torch.float64) - a * (torch.eye(4, dtype=torch.float64) + W)) + a * B)


def test_layernorm_steps_are_layernorm_and_descend_their_terms():
    gen = torch.Generator().manual_seed(7)
    Y = 3 * torch.randn(4, 9, 8, dtype=torch.float64, generator=gen) + 1.0
    g = E.complete(9, 4)
    ln = U.layernorm_step()
    out = ln(Y, g)
    assert torch.allclose(out, torch.nn.functional.layer_norm(Y, (8,), eps=0.0), atol=1e-12)
    assert ln.guaranteed()
    _, rep = U.trace_descent(ln, Y, g, layers=3)
    assert rep.num_increases == 0
    out1 = U.layernorm_step(radius=1.0)(Y, g)
    assert torch.allclose(out1.norm(dim=-1), torch.ones(4, 9, dtype=torch.float64))
    for step, name in ((U.CenterStep(), "center"), (U.RescaleStep(), "rescale")):
        _, rep = U.trace_descent(step, Y, g, layers=2)
        assert rep.num_increases == 0 and rep.terms[name][:, -1].le(rep.terms[name][:, 0]).all()


def test_relu_prox_after_attention_with_half_step():
    """Exact attention (alpha <= 1/2) then ReLU is a proximal MM step on E1 + indicator(Y >= 0),
    even with an anchor B that pulls tokens negative."""
    gen = torch.Generator().manual_seed(8)
    for gi, g in enumerate(builders(10, 8, seed=3)):
        Y0 = torch.relu(torch.randn(8, 10, 4, dtype=torch.float64, generator=gen))
        B = torch.randn(8, 10, 4, dtype=torch.float64, generator=gen) - 0.5
        for rho in RHOS:
            seq = U.Sequence([U.AttentionStep(rho, 1.0, 0.5, B), U.ReLUProxStep()])
            assert seq.guaranteed()
            _, rep = U.trace_descent(seq, Y0, g, layers=6)
            assert rep.num_increases == 0, (g.name, rho, rep.violations[:1])
            assert set(rep.terms) == {"attention", "residual", "relu"}
            assert (rep.terms["relu"][:, 1:] == 0).all()
    assert not U.Sequence([U.AttentionStep(alpha=0.9), U.ReLUProxStep()]).guaranteed()


def test_theorem41_alternating_gradient_steps():
    """Two gradient steps f then g (Thm 4.1): where the condition holds at every step the sum
    descends; with steps far beyond it the sum goes up (negative control)."""
    gen = torch.Generator().manual_seed(9)
    d = 5
    g = E.complete(6, 6)
    Wf, Wg = random_sym(d, gen, 0.3), random_sym(d, gen, 0.3)
    f_energy = E.Energy(quad=E.FeedForward(Wf), residual=E.Residual())
    Lf = float((1 + torch.linalg.eigvalsh(Wf)).abs().max())
    held_any = False
    for a1 in (0.05, 0.2):
        fstep = U.GradientStep(f_energy, a1, lipschitz=Lf)
        gstep = U.FeedForwardStep(Wg, 1.0)
        Lg = gstep.lipschitz()
        gstep.step_size = 1.0 / (Lf + Lg)
        seq = U.Sequence([fstep, gstep])
        Y = torch.randn(6, 6, d, dtype=torch.float64, generator=gen)
        held = True
        Yt = Y
        for _ in range(5):
            held &= bool(seq.theorem41(Yt, g)["holds"].all())
            Yt = seq(Yt, g)
        _, rep = U.trace_descent(seq, Y, g, layers=5)
        if held:
            held_any = True
            assert rep.num_increases == 0
    assert held_any  # the guaranteed branch was exercised
    big = U.Sequence([U.GradientStep(f_energy, 3.0 / Lf, lipschitz=Lf), U.FeedForwardStep(Wg, 1.0)])
    info = big.theorem41(Y, g)
    assert not info["holds"].any()
    _, rep_bad = U.trace_descent(big, Y, g, layers=5)
    assert rep_bad.num_increases > 0
    assert U.theorem41_bound(0.1, 0.1, 2.0) == pytest.approx(1 / 0.2)


def _psd(d, gen, scale):
    A = torch.randn(d, d, dtype=torch.float64, generator=gen)
    return scale * A @ A.T / d


def _quadratic_pair(Wf, Wg, a1, a2):
    """Two gradient steps on the convex quadratics f = tr(Y Wf Y^T) / 2, g = tr(Y Wg Y^T) / 2, and h = f + g."""
    f, g = E.Energy(quad=E.FeedForward(Wf)), E.Energy(quad=E.FeedForward(Wg))
    Lf, Lg = (float(torch.linalg.eigvalsh(W).max()) for W in (Wf, Wg))
    seq = U.Sequence([U.GradientStep(f, a1, lipschitz=Lf), U.GradientStep(g, a2, lipschitz=Lg)])
    return seq, (lambda Y, graph: f.value(Y, graph) + g.value(Y, graph)), Lf, Lg


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), r1=st.floats(0.01, 20.0), r2=st.floats(0.05, 1.0),
       sf=st.floats(1e-3, 1.0))
def test_theorem41_holds_only_where_h_descends(seed, r1, r2, sf):
    """Property (Thm 4.1, eq. 40 with its absolute value kept): wherever :meth:`Sequence.theorem41` says the
    condition holds, h = f + g does not rise over the two steps, for step sizes on both sides of alpha1 = alpha2.
    Rule: h >= 0 is a sum of n d products, each evaluation off by at most n d eps h, so a rise counts beyond
    2 n d eps (h(Y) + h(Y''))."""
    gen = torch.Generator().manual_seed(seed)
    B, n, d = 16, 3, 3
    Wf, Wg = _psd(d, gen, sf), _psd(d, gen, 1.0)
    Lf, Lg = (float(torch.linalg.eigvalsh(W).max()) for W in (Wf, Wg))
    seq, h, _, _ = _quadratic_pair(Wf, Wg, r1 / max(Lf, 1e-12), r2 / (Lf + Lg))
    g = E.complete(n, B)
    Y = torch.randn(B, n, d, dtype=torch.float64, generator=gen) * torch.logspace(-1, 1, B, dtype=torch.float64)[:, None, None]
    holds = seq.theorem41(Y, g)["holds"]
    h0, h1 = h(Y, g), h(seq(Y, g), g)
    rise = h1 - h0 > 2 * n * d * torch.finfo(torch.float64).eps * (h0 + h1)
    assert not (holds & rise).any()


def test_theorem41_bound_keeps_the_absolute_value():
    """Negative control: alpha1 = 5 > alpha2 = 0.5 on f = g = |y|^2 / 2 raises h four-fold at delta = 1/2; eq. 46's
    b = 1 - 10 + 5 < 0 gave no bound (the check said 'holds'), |1 - 10| + 5 = 14 gives 1/14. Where alpha1 > alpha2
    and delta is small, the corrected bound still holds, and h descends."""
    I = torch.eye(3, dtype=torch.float64)
    seq, h, _, _ = _quadratic_pair(I, I, 5.0, 0.5)
    g = E.complete(4, 2)
    Y = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    info = seq.theorem41(Y, g)
    assert info["bound"][0] == pytest.approx(1 / 14) and not info["holds"].any()
    assert (h(seq(Y, g), g) > 3.99 * h(Y, g)).all()
    assert U.theorem41_bound(0.3, 0.3, 0.0) == math.inf and U.theorem41_bound(0.2, 0.1, 1.0) == pytest.approx(1 / 1.2)
    seq, h, _, _ = _quadratic_pair(0.01 * I, I, 1.5, 0.9)      # delta = 0.01 / 1.01 <= 1 / (2/3 + 0.015)
    info = seq.theorem41(Y, g)
    assert info["holds"].all() and (h(seq(Y, g), g) <= h(Y, g)).all()


def test_steps_run_on_device_and_keep_dtype(device):
    for dtype in (torch.float32, torch.float64):
        Y = torch.randn(2, 16, 8, dtype=dtype, device=device)
        for g in builders(16, 2):
            g = g.to(device)
            for rho in RHOS:
                out, rep = U.trace_descent(U.AttentionStep(rho, math.sqrt(8), 0.8), Y, g, layers=6)
                assert out.dtype == dtype and out.device.type == device
                assert rep.num_increases == 0, (dtype, g.name, rho, rep.violations[:1])
                assert rep.before.device.type == device


def test_a_registered_rho_plugs_into_energy_step_and_checker():
    """Registry: a new concave non-decreasing rho (Geman-McClure) works everywhere by name."""
    from energies.rho import RHOS, Rho, register_rho

    @register_rho("geman_test")
    class Geman(Rho):
        def value(self, z):
            return z / (1 + z)

        def derivative(self, z):
            return 1 / (1 + z) ** 2

    try:
        g = E.random(12, 0.4, 6, seed=2)
        Y = torch.randn(6, 12, 3, dtype=torch.float64)
        _, rep = U.trace_descent(U.AttentionStep("geman_test", 1.0, 1.0), Y, g, layers=8)
        assert rep.num_increases == 0 and rep.terms["attention"][:, 0].gt(0).all()
    finally:
        RHOS.pop("geman_test")
