"""Convex heads (Sahiner et al.): lifted identity, certificates, beta_max, ranks, the non-convex
equivalence, and monotone solvers with a negative control."""
import pytest
import torch

from convex import HEADS, make_head, map_back, solve
from convex.losses import get_loss
from convex.solver import beta_max, certificate, rank
from energies.errors import ConfigError, TokenError


N, S, D, C = 36, 5, 4, 2


def toy(n=N, s=S, d=D, c=C, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, s, d, generator=gen, dtype=torch.float64)
    lengths = torch.randint(2, s + 1, (n,), generator=gen)
    mask = torch.arange(s)[None] < lengths[:, None]
    y = torch.randint(0, c, (n,), generator=gen)
    X = X + 0.8 * torch.nn.functional.one_hot(y, d)[:, None].to(X) * (1 if d >= c else 0)   # some signal
    Y = torch.nn.functional.one_hot(y, c).to(torch.float64)
    return X.to(device), mask.to(device), Y.to(device)


def random_heads(head, per_block=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [(g, *head.unfactor(g, torch.randn(r, generator=gen, dtype=torch.float64),
                               torch.randn(q, generator=gen, dtype=torch.float64)))
            for g, (r, q) in enumerate(head.blocks()) for _ in range(per_block)]


@pytest.mark.parametrize("name", sorted(HEADS))
def test_lifted_identity_and_adjoint(name):
    """A(sum_j u_j v_j^T) equals the non-convex multi-head output computed from the weights, to 1e-10;
    <A Z, R> = <Z, A* R>."""
    X, mask, _ = toy()
    head = make_head(name, D, S, C)
    data = head.prepare(X, mask)
    heads = random_heads(head)
    out, ref = head.forward(head.lift(heads), data), head.nonconvex(heads, data)
    assert out.shape == (N, C)
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-10 * float(ref.abs().max()))
    gen = torch.Generator().manual_seed(2)
    Z = [torch.randn(r, q, generator=gen, dtype=torch.float64) for r, q in head.blocks()]
    R = torch.randn(N, C, generator=gen, dtype=torch.float64)
    lhs = (head.forward(Z, data) * R).sum()
    rhs = sum((z * a).sum() for z, a in zip(Z, head.adjoint(R, data)))
    assert torch.allclose(lhs, rhs, rtol=1e-10)
    # negative control: another head's weights give another output
    assert not torch.allclose(head.nonconvex(random_heads(head, seed=3), data), ref, rtol=1e-3)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("loss", ["cross_entropy", "squared"])
def test_optimum_is_certified_and_maps_back_to_the_same_objective(name, loss):
    X, mask, Y = toy()
    head = make_head(name, D, S, C)
    data = head.prepare(X, mask)
    beta = 0.1 * beta_max(head, data, Y, loss)
    sol = solve(head, data, Y, beta, loss=loss, max_iter=4000, tol=1e-7)
    assert sol.converged and sol.certificate["duality_gap_rel"] < 1e-6, sol.certificate
    assert sol.certificate["optimality_ratio"] <= 1 + 1e-3
    assert sol.report().num_increases == 0
    heads = map_back(head, sol.Z)
    assert len(heads) == sol.rank > 0
    weight_decay = 0.5 * beta * sum(float((W1 ** 2).sum() + (W2 ** 2).sum()) for _, W1, W2 in heads)
    nonconvex = float(get_loss(loss).value(head.nonconvex(heads, data), Y)) + weight_decay
    assert abs(nonconvex - sol.certificate["objective"]) <= 1e-10 * abs(sol.certificate["objective"])


@pytest.mark.parametrize("name", ["mlp_linear", "sa_linear", "mixer_gated", "bfno"])
def test_solution_is_zero_iff_beta_reaches_beta_max(name):
    X, mask, Y = toy()
    head = make_head(name, D, S, C)
    data = head.prepare(X, mask)
    bmax = beta_max(head, data, Y)
    above = solve(head, data, Y, bmax * 1.001, max_iter=300)
    assert above.rank == 0 and all(float(z.abs().max()) == 0.0 for z in above.Z)
    below = solve(head, data, Y, bmax * 0.95, max_iter=300)
    assert below.rank > 0
    assert certificate(head, data, Y, [torch.zeros_like(z) for z in below.Z], bmax * 0.95)["optimality_ratio"] > 1


def test_rank_is_non_increasing_in_beta():
    X, mask, Y = toy(n=60, d=6, c=4, seed=5)
    for name in ("mlp_linear", "sa_linear"):
        head = make_head(name, 6, S, 4)
        data = head.prepare(X, mask)
        bmax = beta_max(head, data, Y, "squared")
        ranks = [solve(head, data, Y, f * bmax, loss="squared", max_iter=3000).rank for f in (0.01, 0.05, 0.2, 0.5, 0.9)]
        assert all(a >= b for a, b in zip(ranks, ranks[1:])), (name, ranks)
        assert ranks[0] > ranks[-1] >= 1, (name, ranks)


def _train_nonconvex(head, data, Y, beta, m, seed):
    """Gradient-based training (L-BFGS) of m non-convex heads of block 0 with weight decay."""
    r, q = head.blocks()[0]
    gen = torch.Generator().manual_seed(seed)
    U = (0.1 * torch.randn(m, r, generator=gen, dtype=torch.float64)).requires_grad_()
    V = (0.1 * torch.randn(m, q, generator=gen, dtype=torch.float64)).requires_grad_()
    opt = torch.optim.LBFGS([U, V], lr=1, max_iter=3000, tolerance_grad=1e-12, tolerance_change=1e-15,
                            history_size=50, line_search_fn="strong_wolfe")
    loss = get_loss("squared")

    def objective():
        heads = [(0, *head.unfactor(0, U[j], V[j])) for j in range(m)]
        wd = 0.5 * beta * sum((W1 ** 2).sum() + (W2 ** 2).sum() for _, W1, W2 in heads)
        return loss.value(head.nonconvex(heads, data), Y) + wd

    def closure():
        opt.zero_grad()
        f = objective()
        f.backward()
        return f

    for _ in range(3):
        opt.step(closure)
    with torch.no_grad():
        return float(objective())


@pytest.mark.parametrize("name", ["mlp_linear", "sa_linear"])
def test_gradient_descent_on_enough_heads_reaches_the_convex_optimum(name):
    """L-BFGS on as many non-convex heads as the convex optimum's rank reaches its objective, within 100 times
    the solver's stopping rule (relative duality gap <= tol, which the solve must meet); one head does not
    (at beta = 0.2 beta_max the optimum of sa_linear has rank 5)."""
    X, mask, Y = toy(n=60, d=6, c=4, seed=5)
    head = make_head(name, 6, S, 4)
    data = head.prepare(X, mask)
    beta = 0.2 * beta_max(head, data, Y, "squared")
    tol = 1e-8
    sol = solve(head, data, Y, beta, loss="squared", max_iter=5000, tol=tol)
    assert sol.converged and sol.certificate["duality_gap_rel"] <= tol, sol.certificate
    opt, r = sol.certificate["objective"], sol.rank
    assert r >= 2
    enough = _train_nonconvex(head, data, Y, beta, r, seed=0)
    assert abs(enough - opt) <= 100 * tol * opt, (enough, opt)
    fewer = _train_nonconvex(head, data, Y, beta, 1, seed=0)
    assert fewer > opt * (1 + 1e-4), (fewer, opt)      # one head cannot represent the rank-r optimum


@pytest.mark.parametrize("method", ["fista", "pg"])
def test_objective_never_increases_and_a_too_long_step_is_caught(method):
    X, mask, Y = toy(seed=3)
    head = make_head("sa_linear", D, S, C)
    data = head.prepare(X, mask)
    beta = 0.05 * beta_max(head, data, Y)
    sol = solve(head, data, Y, beta, method=method, max_iter=400, tol=0)
    rep = sol.report()
    assert rep.steps == 400 and rep.num_increases == 0
    if method == "fista":
        assert any(c > o for c, o in zip(sol.candidates, sol.objective_curve()[:-1].tolist()))   # rejections occurred
    L = sol.lipschitz[-1]
    bad = solve(head, data, Y, beta, method="pg", max_iter=100, tol=0, fixed_lipschitz=L / 50)
    assert bad.report().num_increases > 0


def test_bad_input_is_named():
    head = make_head("mlp_linear", D, S, C)
    with pytest.raises(ConfigError, match=r"unknown convex head 'sa_softmax'; valid: \['bfno'"):
        make_head("sa_softmax", D, S, C)
    with pytest.raises(TokenError, match=r"needs features \(N, s=5, d=4\), got \(3, 5, 7\)"):
        head.prepare(torch.randn(3, 5, 7))
    with pytest.raises(TokenError, match="NaN or Inf"):
        head.prepare(torch.full((2, S, D), float("nan")))
    X, mask, Y = toy()
    data = head.prepare(X, mask)
    with pytest.raises(ConfigError, match="beta must be a finite number > 0"):
        solve(head, data, Y, 0.0)
    with pytest.raises(ConfigError, match=r"unknown loss 'hinge'; valid: \['cross_entropy', 'squared'\]"):
        solve(head, data, Y, 0.1, loss="hinge")
    with pytest.raises(ConfigError, match=r"targets must be \(N=36, c=2\)"):
        solve(head, data, Y[:, :1], 0.1)
    with pytest.raises(ConfigError, match="bfno needs groups dividing"):
        make_head("bfno", 5, S, 2, groups=2)


def test_solver_runs_on_device(device):
    X, mask, Y = toy(device=device)
    head = make_head("mixer_gated", D, S, C)
    data = head.prepare(X, mask)
    sol = solve(head, data, Y, 0.1 * beta_max(head, data, Y), max_iter=2000)
    assert sol.Z[0].device.type == torch.device(device).type and sol.converged
    assert rank(sol.Z) == sol.ranks


def test_convex_heads_experiment_on_model_features(tmp_path, capsys):
    """The experiment command end to end on a toy text set: a tiny trained model's features, three heads, each
    solved to the command's own stopping rule (``--tol``). The model is trained (one epoch) and the refused
    head checked by calls of the commands' main in this process; the experiment runs as a process of its own."""
    import json
    import os
    import subprocess
    import sys

    from experiments.app.train import main as train_main
    from experiments.studies.convex_heads import main as convex_main
    from tests.test_train import CONFIGS, ROOT, synthetic_text_dir

    data = synthetic_text_dir(tmp_path / "toy", n_train=120, n_eval=60)
    run = tmp_path / "run"
    code = train_main(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
                       "data.glove=none", "train.progress=false", "model.d=8", "train.epochs=1"])
    assert code == 0, capsys.readouterr().err[-2000:]
    out, tol = tmp_path / "convex", 1e-7
    cmd = [sys.executable, "-m", "experiments.studies.convex_heads", "--quick", "--features", "model", "--checkpoint",
           str(run / "best.pt"), "--config", os.path.join(CONFIGS, "tiny.yaml"), "--heads", "mlp_linear", "sa_linear",
           "bfno", "--dim", "4", "--tol", str(tol), "--out", str(out), "--json", "--set", f"data.dataset={data}",
           "data.glove=none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == {"model/mlp_linear", "model/sa_linear", "model/bfno"}
    for r in res.values():
        assert r["objective_increases"] == 0 and r["rank"] >= 1 and 0 <= r["test_accuracy"] <= 1
        assert {"objective", "duality_gap_rel"} <= set(r)
    assert res["model/mlp_linear"]["duality_gap_rel"] < 10 * tol
    assert (out / "objective.png").stat().st_size > 0 and (out / "table.md").read_text().count("| model |") == 3
    capsys.readouterr()
    assert convex_main(["--heads", "sa_softmax"]) == 2
    assert "unknown head(s) ['sa_softmax']" in capsys.readouterr().err


# ============================================================================ method="newton"
from convex.losses import Loss, LOSSES  # noqa: E402
from convex.solver import _balanced, _steihaug  # noqa: E402


@pytest.mark.parametrize("name", ["mlp_gated", "sa_linear", "sa_gated", "mixer_linear", "mixer_gated", "bfno"])
@pytest.mark.parametrize("loss", ["cross_entropy", "squared"])
def test_newton_reaches_the_fista_optimum_within_the_certified_gaps(name, loss):
    """Both methods certify; each one's dual value bounds the other's objective from below (weak duality), so
    the two objectives agree within the sum of the two certified gaps. The trace of each never increases."""
    X, mask, Y = toy(seed=4)
    head = make_head(name, D, S, C)
    data = head.prepare(X, mask)
    beta = 0.05 * beta_max(head, data, Y, loss)
    # both held to one stopping rule (relative gap <= 1e-7): how far below it Newton gets before float64 can no
    # longer see descent depends on the processor's rounding (2e-8 on one machine, <= 1e-8 on another), so the
    # test asks only what the solver's own criterion promises
    new = solve(head, data, Y, beta, loss=loss, method="newton", max_iter=800, tol=1e-7)
    old = solve(head, data, Y, beta, loss=loss, method="fista", max_iter=4000, tol=1e-7)
    assert new.converged and new.certificate["duality_gap_rel"] <= 1e-7, new.certificate
    assert old.converged, old.certificate
    assert new.iterations <= 800
    pn, pf = new.certificate["objective"], old.certificate["objective"]
    assert abs(pn - pf) <= new.certificate["duality_gap"] + old.certificate["duality_gap"] + 1e-15 * pf
    assert pn >= old.certificate["dual"] - 1e-15 * pf and pf >= new.certificate["dual"] - 1e-15 * pf
    for sol in (new, old):
        curve = sol.objective_curve()
        assert bool((curve[1:] <= curve[:-1]).all()) and sol.report().num_increases == 0
    # the certificate the solver reports is the one computed from scratch at the Z it returns
    again = certificate(head, data, Y, new.Z, beta, loss)
    assert again == new.certificate


def ill_conditioned(n=200, s=8, d=5, seed=0):
    """Gated attention on features whose scales decay over two decades, variable lengths, and labels of a planted
    head with noise: the problem is ill-conditioned, the regime where the first-order gap stalls."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, s, d, generator=gen, dtype=torch.float64) * torch.logspace(0, -2, d, dtype=torch.float64)
    mask = torch.arange(s)[None] < torch.randint(2, s + 1, (n,), generator=gen)[:, None]
    head = make_head("sa_gated", d, s, 2, gates=2, seed=seed)
    data = head.prepare(X, mask)
    r, q = head.blocks()[0]
    planted = [(0, *head.unfactor(0, torch.randn(r, generator=gen, dtype=torch.float64),
                                  torch.randn(q, generator=gen, dtype=torch.float64)))]
    out = head.nonconvex(planted, data)
    out = out + 0.5 * out.std() * torch.randn(out.shape, generator=gen, dtype=torch.float64)
    return head, data, out.argmax(-1)


def test_newton_certifies_where_fista_stalls():
    head, data, y = ill_conditioned()
    beta = 0.02 * beta_max(head, data, y)
    fista = solve(head, data, y, beta, method="fista", max_iter=800, tol=1e-7)
    newton = solve(head, data, y, beta, method="newton", max_iter=800, tol=1e-7)
    assert not fista.converged and fista.certificate["duality_gap_rel"] > 1e-6, fista.certificate   # the stall
    assert newton.converged and newton.iterations < 800 and newton.newton_steps > 0, newton.certificate
    assert newton.certificate["objective"] <= fista.certificate["objective"]
    assert newton.report().num_increases == 0
    # candidates were refused (some went up) while every kept objective went down or stayed
    curve = newton.objective_curve()
    assert bool((curve[1:] <= curve[:-1]).all())


def test_newton_keeps_the_trace_monotone_even_with_a_too_long_prox_step():
    """With an L 50 times too small the proximal candidates rise (pg records them: the trace flags it); the
    newton method refuses them and still records a monotone trace."""
    X, mask, Y = toy(seed=3)
    head = make_head("sa_linear", D, S, C)
    data = head.prepare(X, mask)
    beta = 0.05 * beta_max(head, data, Y)
    L = solve(head, data, Y, beta, method="pg", max_iter=50, tol=0).lipschitz[-1]
    bad = solve(head, data, Y, beta, method="newton", max_iter=200, tol=0, fixed_lipschitz=L / 50, warmup=0)
    curve = bad.objective_curve()
    assert any(c > o for c, o in zip(bad.candidates, curve.tolist()))          # rising candidates were offered
    assert bool((curve[1:] <= curve[:-1]).all()) and bad.report().num_increases == 0
    assert solve(head, data, Y, beta, method="pg", max_iter=100, tol=0, fixed_lipschitz=L / 50).report().num_increases > 0


def test_a_rank_deficient_stationary_point_is_not_certified():
    """Negative control of the certificate: the optimum with its smallest singular direction removed (what a
    Burer-Monteiro point of too low a rank looks like) has a gap far above tol and an optimality ratio > 1."""
    head, data, y = ill_conditioned()
    beta = 0.02 * beta_max(head, data, y)
    sol = solve(head, data, y, beta, method="newton", max_iter=800, tol=1e-8)
    assert sol.converged and sol.rank >= 2
    g = max(range(len(sol.Z)), key=lambda i: sol.ranks[i])
    U, S_, Vh = torch.linalg.svd(sol.Z[g], full_matrices=False)
    k = sol.ranks[g] - 1
    Z = list(sol.Z)
    Z[g] = (U[:, :k] * S_[:k]) @ Vh[:k]
    cert = certificate(head, data, y, Z, beta)
    assert cert["duality_gap_rel"] > 1e3 * 1e-8 and cert["optimality_ratio"] > 1


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_loss_hessian_is_the_derivative_of_the_gradient(loss):
    gen = torch.Generator().manual_seed(0)
    R = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    dR = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    Y = torch.softmax(torch.randn(7, 3, generator=gen, dtype=torch.float64), -1)
    fn = get_loss(loss)
    _, jvp = torch.autograd.functional.jvp(lambda r: fn.grad(r, Y), R, dR)
    assert torch.allclose(fn.hess(R, dR, Y), jvp, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(fn.hess(R, 2 * dR + 1, Y), jvp, rtol=1e-3)     # negative control


def test_newton_hessian_vector_product_matches_finite_differences():
    """The Hessian-vector product of f(U, V) = l(A(U V^T)) + beta/2 (|U|^2 + |V|^2) that the Newton steps use,
    against central differences of its gradient; a Hessian off by a factor fails the same check."""
    import convex.solver as cs

    X, mask, Y = toy(seed=6)
    head = make_head("mixer_gated", D, S, C)
    data = head.prepare(X, mask)
    loss = get_loss("cross_entropy")
    beta = 0.03
    gen = torch.Generator().manual_seed(1)
    Us = [torch.randn(r, 2, generator=gen, dtype=torch.float64) for r, _ in head.blocks()]
    Vs = [torch.randn(q, 2, generator=gen, dtype=torch.float64) for _, q in head.blocks()]
    dU = [torch.randn_like(u) for u in Us]
    dV = [torch.randn_like(v) for v in Vs]

    def grad(Us, Vs):
        G = head.adjoint(loss.grad(head.forward([u @ v.T for u, v in zip(Us, Vs)], data), Y), data)
        return [g @ v + beta * u for g, u, v in zip(G, Us, Vs)] + [g.T @ u + beta * v for g, u, v in zip(G, Us, Vs)]

    def hvp(Us, Vs, scale=1.0):
        R = head.forward([u @ v.T for u, v in zip(Us, Vs)], data)
        G = head.adjoint(loss.grad(R, Y), data)
        dZ = [du @ v.T + u @ dv.T for du, dv, u, v in zip(dU, dV, Us, Vs)]
        dG = head.adjoint(scale * loss.hess(R, head.forward(dZ, data), Y), data)
        return ([dg @ v + g @ dv + beta * du for dg, g, du, dv, v in zip(dG, G, dU, dV, Vs)]
                + [dg.T @ u + g.T @ du + beta * dv for dg, g, du, dv, u in zip(dG, G, dU, dV, Us)])

    e = 1e-5
    plus = grad([u + e * d for u, d in zip(Us, dU)], [v + e * d for v, d in zip(Vs, dV)])
    minus = grad([u - e * d for u, d in zip(Us, dU)], [v - e * d for v, d in zip(Vs, dV)])
    fd = [(a - b) / (2 * e) for a, b in zip(plus, minus)]
    err = lambda h: max(float((a - b).abs().max()) for a, b in zip(h, fd)) / max(float(b.abs().max()) for b in fd)
    assert err(hvp(Us, Vs)) < 1e-7
    assert err(hvp(Us, Vs, scale=2.0)) > 1e-3                                  # negative control
    assert cs.CG_ITERS >= 1 and cs.FORCING < 1


@pytest.mark.parametrize("shape, k", [((9, 4), 3), ((5, 7), 4), ((6, 6), 0), ((8, 3), 3)])
def test_balanced_factors(shape, k):
    gen = torch.Generator().manual_seed(k)
    U = torch.randn(shape[0], k, generator=gen, dtype=torch.float64) * torch.logspace(0, -3, k, dtype=torch.float64)
    V = 5 * torch.randn(shape[1], k, generator=gen, dtype=torch.float64)
    if k >= 2:
        U[:, 1] = 2 * U[:, 0]                  # rank deficient: one column is a multiple of another
    Ub, Vb, Sb = _balanced(U, V)
    Z = U @ V.T
    assert torch.allclose(Ub @ Vb.T, Z, atol=1e-12 * max(float(Z.abs().max()), 1.0))
    nuc = float(torch.linalg.matrix_norm(Z, ord="nuc")) if k else 0.0
    assert abs(0.5 * float((Ub ** 2).sum() + (Vb ** 2).sum()) - nuc) <= 1e-12 * max(nuc, 1.0)
    assert abs(float(Sb.sum()) - nuc) <= 1e-12 * max(nuc, 1.0)
    assert torch.allclose(Ub.T @ Ub, Vb.T @ Vb, atol=1e-10 * max(nuc, 1.0))    # balanced: equal Gram matrices


def test_steihaug_solves_inside_and_stops_on_the_boundary():
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    H = M @ M.T + 0.5 * torch.eye(6, dtype=torch.float64)
    g = [torch.randn(6, generator=gen, dtype=torch.float64)]
    hvp = lambda d: [H @ d[0]]
    s, Hs, used, hit = _steihaug(g, hvp, 1e6, 1e-12, 50)
    assert not hit and torch.allclose(s[0], -torch.linalg.solve(H, g[0]), rtol=1e-8) and torch.allclose(Hs[0], H @ s[0])
    s, _, _, hit = _steihaug(g, hvp, 1e-3, 1e-12, 50)
    assert hit and abs(float(s[0].norm()) - 1e-3) < 1e-12 and float(g[0] @ s[0]) < 0
    neg = -H                                                           # negative curvature: to the boundary, downhill
    s, Hs, used, hit = _steihaug(g, lambda d: [neg @ d[0]], 2.0, 1e-12, 50)
    assert hit and used == 1 and abs(float(s[0].norm()) - 2.0) < 1e-12
    assert float(g[0] @ s[0]) + 0.5 * float(s[0] @ Hs[0]) < 0
    assert _steihaug(g, hvp, 1.0, 0.1, 0)[0] is None


def test_newton_options_are_checked():
    X, mask, Y = toy()
    head = make_head("mlp_linear", D, S, C)
    data = head.prepare(X, mask)
    for kw, words in [({"warmup": -1}, ["warmup", "-1"]), ({"warmup": 2.5}, ["warmup", "2.5"]),
                      ({"cg_iters": 0}, ["cg_iters", "0"]), ({"cg_iters": "x"}, ["cg_iters", "'x'"]),
                      ({"method": "Newton"}, ["method", "'Newton'"])]:
        with pytest.raises(ConfigError) as err:
            solve(head, data, Y, 0.1, **kw)
        assert all(w in str(err.value) for w in words), (kw, str(err.value))

    class NoHessian(Loss):
        name = "no_hessian"
        value = LOSSES["squared"].value
        grad = LOSSES["squared"].grad
        dual_value = LOSSES["squared"].dual_value

    with pytest.raises(ConfigError, match="method 'newton' needs the Hessian of the loss.*'no_hessian'"):
        solve(head, data, Y, 0.1, loss=NoHessian(), method="newton")
    assert solve(head, data, Y, 0.1, loss=NoHessian(), method="fista", max_iter=5).iterations == 5


def test_newton_from_zero_and_at_beta_max():
    """warmup=0 starts the Newton rounds at Z = 0 (no factors yet: the first proximal step makes them);
    above beta_max the answer is Z = 0, certified at once."""
    X, mask, Y = toy()
    head = make_head("sa_gated", D, S, C)
    data = head.prepare(X, mask)
    bmax = beta_max(head, data, Y)
    sol = solve(head, data, Y, 0.1 * bmax, method="newton", warmup=0, max_iter=600)
    assert sol.converged and sol.newton_steps > 0 and sol.report().num_increases == 0
    zero = solve(head, data, Y, 1.001 * bmax, method="newton", warmup=0, max_iter=50)
    assert zero.converged and zero.rank == 0 and zero.newton_steps == 0


def test_newton_runs_on_device(device):
    X, mask, Y = toy(device=device)
    head = make_head("mixer_gated", D, S, C)
    data = head.prepare(X, mask)
    sol = solve(head, data, Y, 0.1 * beta_max(head, data, Y), method="newton", max_iter=800)
    assert sol.Z[0].device.type == torch.device(device).type and sol.converged and sol.newton_steps > 0
    assert sol.report().num_increases == 0


def test_low_precision_non_finite_and_foreign_inputs_are_refused_by_name():
    """Adversarial review: each of these raised a raw torch error (RuntimeError from linalg.matrix_norm on
    float16/bfloat16 features, LinAlgError/NotImplementedError from the SVD on NaN or float16 blocks, KeyError on
    data prepared by another head) or was silently solved against another head's data."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(6, 3, 2, dtype=torch.float64, generator=gen)
    Y = torch.tensor([0, 1, 0, 1, 1, 0])
    head = make_head("mlp_linear", 2, 3, 2)
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(TokenError, match="float32 or float64"):
            head.prepare(X.to(dtype))
    with pytest.raises(TokenError, match="meta"):
        head.prepare(X.to("meta"))
    data = head.prepare(X)
    for other in (make_head("sa_linear", 2, 3, 2), make_head("mlp_linear", 2, 4, 2)):
        for call in (lambda: solve(other, data, Y, 0.1, max_iter=2), lambda: beta_max(other, data, Y)):
            with pytest.raises(ConfigError, match="prepared by"):
                call()
    with pytest.raises(ConfigError, match="prepared by"):
        solve(head, {"X": X}, Y, 0.1)
    from convex import svt
    bad = {"NaN": torch.full((2, 2), float("nan")), "Inf": torch.full((2, 2), float("inf"))}
    for z in bad.values():
        for call in (lambda: svt(z, 0.1), lambda: rank([z])):
            with pytest.raises(ConfigError, match="NaN or Inf"):
                call()
    for dtype in (torch.float16, torch.bfloat16):
        z = torch.ones(2, 2, dtype=dtype)
        for call in (lambda: svt(z, 0.1), lambda: rank([z]), lambda: map_back(head, [z])):
            with pytest.raises(ConfigError, match="float32 or float64"):
                call()
    with pytest.raises(ConfigError, match="list of blocks"):
        rank(None)
    with pytest.raises(ConfigError, match="convex.Head"):
        map_back(None, [torch.ones(2, 2)])
    sol = solve(head, data, Y, 0.1)                       # the positive control: the same calls on good input
    assert sol.converged and rank(sol.Z) == sol.ranks and len(map_back(head, sol.Z)) == sol.rank


def test_blocks_beyond_memory_are_refused_before_allocation():
    """Adversarial review: a head whose blocks cannot fit (mixer_linear with s = 20000: (s^2, d c) = 4e11 entries)
    reached the allocator in solve and beta_max, and sa_gated's features in prepare (torch's untyped
    RuntimeError)."""
    head = make_head("mixer_linear", 1, 20000, 1000)
    data = head.prepare(torch.ones(2, 20000, 1, dtype=torch.float64))
    Y = torch.tensor([0, 1])
    for call in (lambda: solve(head, data, Y, 0.1, max_iter=1), lambda: beta_max(head, data, Y)):
        with pytest.raises(ConfigError, match="blocks .* of memory"):
            call()
    gated = make_head("sa_gated", 600, 4, 2)          # its features (N, d^3) per gate: 2.2e10 entries for N = 50
    with pytest.raises(TokenError, match="features of N=50 examples .* of memory"):
        gated.prepare(torch.zeros(50, 4, 600, dtype=torch.float64))


def test_a_dual_value_above_the_objective_is_never_certified_as_a_zero_gap():
    """Adversarial review: the gap was max(P - dual, 0), so a loss whose conjugate is wrong (here the squared
    loss's dual value raised by 1) got duality_gap 0 and ``converged`` True at the first check (iteration 10, its
    objective 2e-7 relative above the optimum, beyond tol = 1e-7). Weak duality bounds dual <= P up to rounding;
    beyond it the certificate is refused."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(6, 3, 2, dtype=torch.float64, generator=gen)
    Y = torch.tensor([0, 1, 0, 1, 1, 0])
    head = make_head("mlp_linear", 2, 3, 2)
    data = head.prepare(X)
    squared = get_loss("squared")

    class WrongConjugate(type(squared)):
        name = "wrong_conjugate"

        def dual_value(self, R, Y, t):
            return squared.dual_value(R, Y, t) + 1.0

    with pytest.raises(ConfigError, match="'wrong_conjugate'.*dual value .* exceeds the objective"):
        solve(head, data, Y, 0.01, loss=WrongConjugate(), max_iter=50)
    with pytest.raises(ConfigError, match="exceeds the objective"):
        certificate(head, data, Y, [torch.zeros(2, 2, dtype=torch.float64)], 0.01, loss=WrongConjugate())
    sol = solve(head, data, Y, 0.01, loss="squared", tol=0.0, max_iter=300)      # the exact conjugate: never refused
    assert sol.certificate["duality_gap"] >= 0 and sol.certificate["dual"] <= sol.certificate["objective"] * (1 + 1e-12)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_lift_checks_each_head_and_round_trips_map_back(name):
    """Adversarial review: Head.lift indexed and reshaped whatever it got (IndexError for a block g out of range,
    RuntimeError for a W1 of the wrong shape, TypeError for None); each (g, W1, W2) is now checked against the
    shapes unfactor gives, and map_back's heads still lift back to the blocks (the positive control)."""
    head = make_head(name, 4, 4, 4)
    gen = torch.Generator().manual_seed(0)
    Z = [torch.randn(r, q, dtype=torch.float64, generator=gen) for r, q in head.blocks()]
    W = map_back(head, Z, rtol=0)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(Z, head.lift(W)))
    g, W1, W2 = W[0]
    for bad, words in [(None, "list of"), ([(len(Z), W1, W2)], "block g"), ([(g, W1[..., :-1], W2)], "W1 must be"),
                       ([(g, W1, W2.long())], "W2 must be"), ([(g, W1)], "must be (g, W1, W2)")]:
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            head.lift(bad)
