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
    X, mask, Y = toy(n=60, d=6, c=4, seed=5)
    head = make_head(name, 6, S, 4)
    data = head.prepare(X, mask)
    beta = 0.02 * beta_max(head, data, Y, "squared")
    sol = solve(head, data, Y, beta, loss="squared", max_iter=5000, tol=1e-8)
    opt, r = sol.certificate["objective"], sol.rank
    assert r >= 2
    enough = _train_nonconvex(head, data, Y, beta, r, seed=0)
    assert abs(enough - opt) <= 1e-6 * opt, (enough, opt)
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


def test_convex_heads_experiment_on_model_features(tmp_path):
    """The experiment command end to end on a toy text set: a tiny trained model's features, three heads."""
    import json
    import os
    import subprocess
    import sys

    from tests.test_train import CONFIGS, ROOT, run_train, synthetic_text_dir

    data = synthetic_text_dir(tmp_path / "toy", n_train=200, n_eval=60)
    run = tmp_path / "run"
    proc = run_train(["--config", os.path.join(CONFIGS, "tiny.yaml"), "--run-dir", str(run), f"data.dataset={data}",
                      "data.glove=none", "train.progress=false", "model.d=8"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "convex"
    cmd = [sys.executable, "-m", "experiments.convex_heads", "--quick", "--features", "model", "--checkpoint",
           str(run / "best.pt"), "--config", os.path.join(CONFIGS, "tiny.yaml"), "--heads", "mlp_linear", "sa_linear",
           "bfno", "--dim", "4", "--out", str(out), "--json", "--set", f"data.dataset={data}", "data.glove=none"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == {"model/mlp_linear", "model/sa_linear", "model/bfno"}
    for r in res.values():
        assert r["objective_increases"] == 0 and r["rank"] >= 1 and 0 <= r["test_accuracy"] <= 1
        assert {"objective", "duality_gap_rel"} <= set(r)
    assert res["model/mlp_linear"]["duality_gap_rel"] < 1e-6
    assert (out / "objective.png").stat().st_size > 0 and (out / "table.md").read_text().count("| model |") == 3
    bad = subprocess.run(cmd[:3] + ["--heads", "sa_softmax"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "unknown head(s) ['sa_softmax']" in bad.stderr
