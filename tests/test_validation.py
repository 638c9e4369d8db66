"""Every public constructor of the library checks its arguments when built: a bad value raises the
typed error (:mod:`energies.errors`) naming the argument, a good one builds something that runs. And graph
specs whose radius reaches far beyond n are clamped, in O(n + |E|): the same edges as radius n - 1."""
import math

import pytest
import torch

import energies as E
import unfold as U
from convex import make_head, solve
from convex.solver import beta_max, certificate, map_back, operator_norm2, rank, svt
from energies.errors import ConfigError, EnergyError, GraphError, InputError, StepError, TokenError
from unfold.pyg import UnfoldedAttentionConv

NAN, INF = math.nan, math.inf


def raises(error, call, *names):
    """``call()`` raises exactly ``error`` (a subclass of UnfoldError) whose message names every ``names``."""
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    for name in names:
        assert str(name).lower() in str(info.value).lower(), f"{name!r} not named in {info.value}"


# ============================================================================ graphs
BAD_SIZES = [0, -1, 2.5, True, NAN, INF, "x", None, "3.0"]
BUILDERS = {
    "complete": lambda n=8, **kw: E.complete(n, **kw),
    "window": lambda n=8, **kw: E.window(n, 2, **kw),
    "strided": lambda n=8, **kw: E.strided(n, 3, **kw),
    "dilated": lambda n=8, **kw: E.dilated(n, 2, 2, **kw),
    "star": lambda n=8, **kw: E.star(n, **kw),
    "random": lambda n=8, **kw: E.random(n, 0.5, **kw),
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("bad", BAD_SIZES, ids=repr)
def test_graph_builders_refuse_bad_sizes(builder, bad):
    raises(GraphError, lambda: BUILDERS[builder](n=bad), "n", repr(bad))
    raises(GraphError, lambda: BUILDERS[builder](batch_size=bad), "batch_size")


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("bad", [-1, 2 ** 64, 1.5, NAN, True, "seed"], ids=repr)
def test_graph_builders_refuse_bad_seeds(builder, bad):
    raises(GraphError, lambda: BUILDERS[builder](seed=bad), "seed")


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_graph_builders_accept_integral_sizes(builder):
    import numpy as np

    for n in (1, 5, np.int64(5), 5.0, torch.tensor(5)):
        g = BUILDERS[builder](n=n, batch_size=np.int32(2), seed=np.int64(3))
        assert (g.batch_size, g.num_nodes) == (2, int(n))
        Y = torch.randn(2, int(n), 3, dtype=torch.float64)
        assert torch.isfinite(E.attention_energy().value(Y, g)).all()


@pytest.mark.parametrize("call, names", [
    (lambda: E.TokenGraph(2.5, 4), ["batch_size", "2.5"]),
    (lambda: E.TokenGraph(1, 0), ["num_nodes"]),
    (lambda: E.TokenGraph(1, True), ["num_nodes"]),
    (lambda: E.TokenGraph(1, 4, name=3), ["name"]),
    (lambda: E.mask_from_lengths([2.5, 1], 4), ["lengths"]),
    (lambda: E.mask_from_lengths([NAN], 4), ["lengths"]),
    (lambda: E.mask_from_lengths([True], 4), ["lengths"]),
    (lambda: E.mask_from_lengths([5], 4), ["lengths"]),
    (lambda: E.mask_from_lengths([1], 0), ["n"]),
    (lambda: E.mask_from_lengths(["a"], 4), ["lengths"]),
    (lambda: E.random(8, NAN), ["probability p", "nan"]),
    (lambda: E.random(8, 1.5), ["probability p"]),
    (lambda: E.random(8, -0.1), ["probability p"]),
    (lambda: E.random(8, "half"), ["probability p"]),
    (lambda: E.random(8, True), ["probability p"]),
    (lambda: E.window(8, 0), ["window radius k"]),
    (lambda: E.window(8, 2.5), ["window radius k", "2.5"]),
    (lambda: E.window(8, True), ["window radius k"]),
    (lambda: E.window(8, NAN), ["window radius k"]),
    (lambda: E.strided(8, 1), ["stride k"]),
    (lambda: E.strided(8, -4), ["stride k"]),
    (lambda: E.dilated(8, 0), ["dilation k"]),
    (lambda: E.dilated(8, 2, 0), ["dilated radius"]),
    (lambda: E.dilated(8, 2, 1.5), ["dilated radius"]),
    (lambda: E.from_edge_index(torch.tensor([[0], [1]]), 2.5), ["n", "2.5"]),
    (lambda: E.from_edge_index(torch.tensor([[0], [1]]), 4, shared="yes"), ["shared"]),
    (lambda: E.graph_from_spec("complete", 2.5), ["n", "2.5"]),
    (lambda: E.graph_from_spec("window:3", 8, batch_size=0), ["batch_size"]),
    (lambda: E.graph_from_spec("random:0.5", 8, seed=-1), ["seed"]),
    (lambda: E.graph_from_spec("", 8), ["graph spec"]),
    (lambda: E.graph_from_spec(3, 8), ["graph spec"]),
    (lambda: E.graph_from_spec("window:1e100", 8), ["window radius k", "1e100"]),
    (lambda: E.graph_from_spec("window:2:3", 8), ["window"]),
])
def test_graph_arguments_are_named(call, names):
    raises(GraphError, call, *names)


def edges_of(g):
    return {tuple(e) for e in g.edges().T.tolist()}


N = 64
ALL_PAIRS = N * (N - 1) // 2


@pytest.mark.parametrize("spec", ["window:63", "window:64", "window:100000000", f"window:{10 ** 18}",
                                  "strided:64", "strided:100000000", f"strided:{10 ** 18}",
                                  "dilated:1:63", "dilated:1:100000000", f"dilated:1:{10 ** 18}"])
def test_a_radius_beyond_n_is_clamped_to_all_pairs(spec):
    """A window (or stride, or dilated reach) of n - 1 or more covers every pair: the same edges as window:63,
    built in O(n + |E|) (a radius of 10**18 would otherwise loop 10**18 times)."""
    g = E.graph_from_spec(spec, N, batch_size=2)
    assert g.num_edges().tolist() == [ALL_PAIRS, ALL_PAIRS]
    assert edges_of(g) == edges_of(E.graph_from_spec("window:63", N, batch_size=2))
    assert g.name == spec


@pytest.mark.parametrize("k, radius", [(3, 21), (3, 22), (3, 10 ** 9), (7, 10 ** 18), (63, 5)])
def test_dilated_reach_is_clamped_to_offsets_below_n(k, radius):
    g = E.dilated(N, k, radius)
    reach = min(radius, (N - 1) // k)
    assert edges_of(g) == {(i, i + k * m) for m in range(1, reach + 1) for i in range(N - k * m)}
    assert edges_of(g) == edges_of(E.dilated(N, k, (N - 1) // k))


@pytest.mark.parametrize("spec", ["dilated:64", "dilated:100000000:3", f"dilated:{10 ** 18}:{10 ** 18}"])
def test_a_dilation_beyond_n_joins_no_pair(spec):
    assert E.graph_from_spec(spec, N).num_edges().tolist() == [0]


def test_strided_clamp_keeps_both_heads_below_n():
    for k in (2, 5, 8, 63):
        want = {(i, j) for i in range(N) for j in range(i + 1, N) if j - i < k or (j - i) % k == 0}
        assert edges_of(E.strided(N, k)) == want


def test_random_graph_of_a_huge_n_is_linear_in_edges():
    """n = 10**6 has 5 * 10**11 candidate pairs; p = 1e-9 keeps about 500 of them: the builder draws the
    edge count and then the edges (O(n + |E|)), not one number per pair."""
    n = 10 ** 6
    g = E.random(n, 1e-9, batch_size=2, seed=1)
    counts = g.num_edges()
    assert ((counts > 350) & (counts < 650)).all()
    src, dst = g.edges()
    assert (src < dst).all() and (src // n == dst // n).all()
    assert torch.equal(g.edges(), E.random(n, 1e-9, batch_size=2, seed=1).edges())
    assert E.random(n, 0.0).num_edges().tolist() == [0]


@pytest.mark.parametrize("call, names", [
    (lambda: E.window(10 ** 6, 10 ** 18), ["window:", "edges"]),          # clamped to all pairs: 5e11 edges
    (lambda: E.graph_from_spec(f"strided:{10 ** 18}", 10 ** 6), ["strided", "edges"]),
    (lambda: E.dilated(10 ** 5, 1, 10 ** 9, batch_size=1000), ["dilated", "edges"]),
    (lambda: E.random(10 ** 5, 0.5), ["random:0.5", "edges"]),
    (lambda: E.random(10 ** 6, 1e-3, batch_size=1000), ["random", "edges"]),
    (lambda: E.complete(2 ** 32), ["slots"]), (lambda: E.graph_from_spec("window:3", 2 ** 31, batch_size=2), ["slots"]),
    (lambda: E.TokenGraph(2 ** 20, 2 ** 12), ["slots"]),
])
def test_graphs_beyond_the_memory_budget_are_refused_before_any_allocation(call, names):
    """Clamping keeps a graph O(n + |E|); a graph whose |E| itself is out of reach is refused, by count."""
    raises(GraphError, call, *names)


@pytest.mark.parametrize("p", [0.01, 0.7])
def test_random_graph_above_the_pairwise_regime_has_the_right_density(p):
    n = 2050                       # 2,100,225 candidate pairs: just above RANDOM_PAIRWISE_MAX
    assert n * (n - 1) // 2 > E.graphs.RANDOM_PAIRWISE_MAX
    g = E.random(n, p, seed=3)
    pairs = n * (n - 1) // 2
    m = int(g.num_edges()[0])
    assert abs(m - p * pairs) <= 6 * math.sqrt(pairs * p * (1 - p)) + 1
    src, dst = g.edges()
    assert (src < dst).all() and (dst < n).all()


def test_random_graph_below_the_regime_keeps_its_realisations():
    """Up to RANDOM_PAIRWISE_MAX pairs the graph for a seed is the one drawn pair by pair."""
    n, p = 30, 0.3
    gen = torch.Generator().manual_seed(5)
    iu = torch.triu_indices(n, n, offset=1)
    keep = torch.rand(iu.shape[1], generator=gen) < p
    assert edges_of(E.random(n, p, seed=5)) == {tuple(e) for e in iu[:, keep].T.tolist()}


# ============================================================================ energy terms
W4 = torch.randn(4, 3, dtype=torch.float64)


@pytest.mark.parametrize("kwargs, names", [
    ({"tau": 0}, ["tau"]), ({"tau": -1.0}, ["tau"]), ({"tau": NAN}, ["tau", "nan"]), ({"tau": INF}, ["tau", "inf"]),
    ({"tau": "x"}, ["tau"]), ({"tau": True}, ["tau"]), ({"tau": None}, ["tau"]),
    ({"rho": "gauss"}, ["gauss"]), ({"rho": "relu:-1"}, ["relu", "c"]), ({"rho": "lp:nan"}, ["lp"]),
    ({"kernel": "flash"}, ["kernel", "flash"]), ({"kernel": 3}, ["kernel"]),
    ({"curvature": "exact"}, ["curvature", "exact"]),
    ({"metric": torch.randn(4)}, ["metric"]), ({"metric": [[1.0]]}, ["metric"]),
    ({"metric": torch.zeros(4, 0)}, ["metric"]), ({"metric": torch.ones(4, 3, dtype=torch.long)}, ["metric", "dtype"]),
])
def test_pairwise_attention_arguments(kwargs, names):
    raises(EnergyError, lambda: E.PairwiseAttention(**kwargs), *names)


@pytest.mark.parametrize("call, names", [
    (lambda: E.Residual(torch.full((4, 3), NAN)), ["anchor b", "nan"]),
    (lambda: E.Residual(torch.zeros(4, 3, dtype=torch.long)), ["anchor b"]),
    (lambda: E.Residual(torch.zeros(4)), ["anchor b", "shape"]),
    (lambda: E.Residual(torch.zeros(0, 3)), ["anchor b"]),
    (lambda: E.FeedForward(torch.zeros(3, 4)), ["weight w", "square"]),
    (lambda: E.FeedForward(torch.zeros(0, 0)), ["weight w"]),
    (lambda: E.FeedForward(torch.full((3, 3), INF)), ["weight w", "inf"]),
    (lambda: E.FeedForward(torch.eye(3), sym_tol=-1), ["sym_tol"]),
    (lambda: E.FeedForward(torch.eye(3), sym_tol=NAN), ["sym_tol"]),
    (lambda: E.FeedForward(torch.tensor([[0.0, 1.0], [0.0, 0.0]])), ["symmetric"]),
    (lambda: E.Rescaling(0), ["radius"]), (lambda: E.Rescaling(-2), ["radius"]),
    (lambda: E.Rescaling(INF), ["radius", "inf"]), (lambda: E.Rescaling(NAN), ["radius"]),
    (lambda: E.Rescaling("big"), ["radius"]), (lambda: E.Rescaling(True), ["radius"]),
])
def test_energy_term_arguments(call, names):
    raises(EnergyError, call, *names)


def test_energy_terms_build_and_evaluate_with_good_arguments():
    g = E.window(6, 2, batch_size=2)
    Y = torch.randn(2, 6, 4, dtype=torch.float64)
    S = torch.randn(4, 4, dtype=torch.float64)
    terms = [E.PairwiseAttention("exp", tau=2, kernel="edges", metric=W4), E.PairwiseAttention(tau=0.5, curvature="constant"),
             E.Residual(torch.randn(6, 4, dtype=torch.float64)), E.FeedForward((S + S.T) / 2, sym_tol=0),
             E.FeedForward(S, sym_tol=INF),
             E.Rescaling(1.5), E.Rescaling(), E.Centering(), E.NonNegativity()]
    for t in terms:
        assert t.value(Y, g).shape == (2,)


# ============================================================================ steps
ENERGY = E.attention_energy()


@pytest.mark.parametrize("call, names", [
    (lambda: U.AttentionStep(alpha=0), ["alpha"]), (lambda: U.AttentionStep(alpha=1.5), ["alpha"]),
    (lambda: U.AttentionStep(alpha=NAN), ["alpha", "nan"]), (lambda: U.AttentionStep(alpha="x"), ["alpha"]),
    (lambda: U.AttentionStep(alpha=True), ["alpha"]), (lambda: U.AttentionStep(update="fast"), ["update", "fast"]),
    (lambda: U.AttentionStep(update=["exact"]), ["update"]),
    (lambda: U.AttentionStep(update="printed", B=torch.zeros(3, 2)), ["printed"]),
    (lambda: U.GradientStep(ENERGY, 0), ["step_size"]), (lambda: U.GradientStep(ENERGY, -0.5), ["step_size"]),
    (lambda: U.GradientStep(ENERGY, NAN), ["step_size", "nan"]), (lambda: U.GradientStep(ENERGY, INF), ["step_size"]),
    (lambda: U.GradientStep(ENERGY, "big"), ["step_size"]), (lambda: U.GradientStep(ENERGY, True), ["step_size"]),
    (lambda: U.GradientStep(ENERGY, 0.1, lipschitz=0), ["lipschitz"]),
    (lambda: U.GradientStep(ENERGY, 0.1, lipschitz=-1), ["lipschitz"]),
    (lambda: U.GradientStep(ENERGY, 0.1, lipschitz=NAN), ["lipschitz", "nan"]),
    (lambda: U.GradientStep(ENERGY, 0.1, lipschitz=INF), ["lipschitz", "inf"]),
    (lambda: U.GradientStep(ENERGY, 0.1, lipschitz="x"), ["lipschitz"]),
    (lambda: U.GradientStep("energy", 0.1), ["energy", "str"]),
    (lambda: U.FeedForwardStep(torch.eye(3), step_size=NAN), ["step_size"]),
    (lambda: U.FeedForwardStep(torch.eye(3), step_size=0), ["step_size"]),
    (lambda: U.Sequence([]), ["at least one"]), (lambda: U.Sequence([U.ReLUProxStep(), 3]), ["step 1", "int"]),
    (lambda: U.Sequence(U.ReLUProxStep()), ["iterable"]), (lambda: U.Sequence(7), ["iterable"]),
    (lambda: U.ProxMMStep(ENERGY, alpha=0), ["alpha"]), (lambda: U.ProxMMStep(ENERGY, alpha=NAN), ["alpha"]),
    (lambda: U.ProxMMStep(None), ["energy"]),
    (lambda: U.theorem41_bound(0.1, 0, 1.0), ["alpha2"]), (lambda: U.theorem41_bound(NAN, 0.1, 1.0), ["alpha1"]),
    (lambda: U.theorem41_bound(0.1, 0.1, -1), ["l_g"]),
])
def test_step_arguments(call, names):
    raises(StepError, call, *names)


@pytest.mark.parametrize("call, names", [
    (lambda X, g: U.mm_step(ENERGY, X, g, preconditioner="nope"), ["preconditioner", "nope"]),
    (lambda X, g: U.mm_step(ENERGY, X, g, preconditioner=None), ["preconditioner"]),
    (lambda X, g: U.mm_step(ENERGY, X, g, alpha=0), ["alpha"]),
    (lambda X, g: U.mm_step(ENERGY, X, g, alpha=NAN), ["alpha", "nan"]),
    (lambda X, g: U.mm_direction(ENERGY, X, g, "jacobian"), ["preconditioner", "jacobian"]),
])
def test_the_functional_mm_step_checks_its_arguments(call, names):
    """mm_step / mm_direction are entries: an unknown preconditioner is refused naming it, never taken for
    'jacobi'."""
    X = torch.randn(2, 4, 3, dtype=torch.float64)
    raises(StepError, lambda: call(X, E.complete(4, 2)), *names)


@pytest.mark.parametrize("call, names", [
    (lambda: U.Attention(4, dropout=1.5), ["dropout", "1.5"]), (lambda: U.Attention(0), ["d", "0"]),
    (lambda: U.Attention("x"), ["d", "x"]), (lambda: U.Attention(4, heads=0), ["heads"]),
    (lambda: U.Attention(4, d_head=0), ["d_head"]),
    (lambda: U.GuaranteedEncoder(6, graph="bogus"), ["bogus", "window"]),
    (lambda: U.FreeEncoder(6, graph="window:x"), ["window:x"]),
    (lambda: U.UnfoldedTransformer(10, 2, mode="free", alpha=0.5), ["alpha=0.5", "mode=free"]),
    (lambda: U.UnfoldedTransformer(10, 2, mode="guaranteed", ffn_mult=3), ["ffn_mult=3", "guaranteed"]),
    (lambda: U.UnfoldedTransformer(10, 2, mode="baseline", d_head=4), ["d_head=4", "baseline"]),
])
def test_model_arguments_are_refused_at_construction(call, names):
    """Refused where they enter, as the framework's typed error naming them: not torch's ValueError, not at the
    first forward, not silently ignored."""
    raises(ConfigError, call, *names)


def test_arguments_at_their_defaults_or_applying_everywhere_are_taken():
    U.UnfoldedTransformer(10, 2, mode="free", alpha=1.0, stop_rel=0, dropout=0.2, d=8)
    U.UnfoldedTransformer(10, 2, mode="guaranteed", ffn_mult=2)
    U.Attention(4, dropout=1.0)
    assert E.check_graph_spec("window:3") == "window:3"
    raises(GraphError, lambda: E.check_graph_spec("bogus"), "bogus")
    raises(GraphError, lambda: E.check_graph_spec("/no/such/file.npy"), "does not exist")
    assert E.check_graph_spec("/no/such/file.npy", files=False) == "/no/such/file.npy"


def test_step_terms_name_their_own_arguments():
    raises(EnergyError, lambda: U.RescaleStep(radius=0), "radius")
    raises(EnergyError, lambda: U.layernorm_step(radius=NAN), "radius")
    raises(EnergyError, lambda: U.AttentionStep(tau=0), "tau")
    raises(EnergyError, lambda: U.AttentionStep(rho="gauss"), "gauss")
    raises(EnergyError, lambda: U.AttentionStep(kernel="flash"), "kernel", "flash")   # checked once, by its term
    raises(EnergyError, lambda: U.FeedForwardStep(torch.ones(2, 3)), "square")


def test_steps_build_and_run_with_good_arguments():
    g = E.star(7, batch_size=2)
    Y = torch.randn(2, 7, 3, dtype=torch.float64)
    S = torch.randn(3, 3, dtype=torch.float64)
    steps = [U.AttentionStep("cauchy", tau=1.5, alpha=0.5, kernel="edges"), U.AttentionStep(update="printed"),
             U.GradientStep(ENERGY, 0.1, lipschitz=2.0), U.FeedForwardStep((S + S.T) / 10, step_size=0.5),
             U.Sequence([U.AttentionStep(alpha=0.5), U.ReLUProxStep()]), U.layernorm_step(2.0),
             U.ProxMMStep(ENERGY, alpha=0.7), U.RescaleStep()]
    for step in steps:
        out = step(Y, g)
        assert out.shape == Y.shape and torch.isfinite(out).all()
    assert U.theorem41_bound(0.1, 0.2, 0.0) == 2.0


# ============================================================================ UnfoldedAttentionConv
@pytest.mark.parametrize("kwargs, names", [
    ({"channels": 0}, ["channels"]), ({"channels": -3}, ["channels"]), ({"channels": 2.5}, ["channels", "2.5"]),
    ({"channels": True}, ["channels"]), ({"channels": "six"}, ["channels"]), ({"channels": NAN}, ["channels"]),
    ({"heads": 0}, ["heads"]), ({"heads": 1.5}, ["heads"]), ({"heads": False}, ["heads"]),
    ({"head_channels": 0}, ["head_channels"]), ({"head_channels": -2}, ["head_channels"]),
    ({"head_channels": 2.5}, ["head_channels"]), ({"head_channels": 7}, ["head_channels", "7"]),
    ({"head_channels": True}, ["head_channels"]),
    ({"tau": 0}, ["tau"]), ({"tau": -1}, ["tau"]), ({"tau": NAN}, ["tau", "nan"]), ({"tau": INF}, ["tau", "inf"]),
    ({"tau": "hot"}, ["tau"]),
    ({"alpha": 0}, ["alpha"]), ({"alpha": 1.5}, ["alpha"]), ({"alpha": NAN}, ["alpha"]),
    ({"relu": "yes"}, ["relu"]), ({"relu": 1}, ["relu"]), ({"relu": True}, ["relu=true needs"]),
])
def test_unfolded_attention_conv_arguments(kwargs, names):
    kw = {"channels": 6, **kwargs}
    raises(StepError, lambda: UnfoldedAttentionConv(**kw), *names)


def test_unfolded_attention_conv_rho_is_named():
    raises(EnergyError, lambda: UnfoldedAttentionConv(6, rho="gauss"), "gauss")


def conv_case(n=10, d=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    ei = torch.tensor([[i for i in range(n - 1)], [i + 1 for i in range(n - 1)]])
    return x, ei


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_unfolded_attention_conv_refuses_a_non_finite_anchor(bad):
    x, ei = conv_case()
    x0 = x.clone()
    x0[3, 2] = bad
    for conv in (UnfoldedAttentionConv(6, validate=True).double(),        # values: behind the switch (host reads)
                 UnfoldedAttentionConv(6, heads=2, head_channels=3, validate=True).double()):
        raises(TokenError, lambda: conv(x, ei, x0), "x0")
        raises(TokenError, lambda: conv.energy(x, ei, x0), "x0")
    raises(TokenError, lambda: UnfoldedAttentionConv(6)(x, ei, x0.long()), "x0")


@pytest.mark.parametrize("kwargs", [{}, {"heads": 2}, {"heads": 3, "head_channels": 2, "relu": True},
                                    {"head_channels": 6, "tau": 0.5, "alpha": 0.3, "rho": "cauchy"},
                                    {"channels": 6.0, "heads": torch.tensor(2), "head_channels": 1}])
def test_unfolded_attention_conv_builds_and_descends_with_good_arguments(kwargs):
    kw = {"channels": 6, **kwargs}
    conv = UnfoldedAttentionConv(**kw).double()
    x, ei = conv_case()
    with torch.no_grad():
        out, vals = conv(x, ei, x, return_energy=True)
    assert out.shape == x.shape and torch.isfinite(out).all()
    with torch.no_grad():
        assert float(conv.energy(out, ei, x)) <= float(sum(vals.values())) + 1e-9


# ============================================================================ convex heads and solver
S_, D_, C_ = 5, 4, 2


def toy(n=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, S_, D_, generator=gen, dtype=torch.float64)
    y = torch.randint(0, C_, (n,), generator=gen)
    return X, torch.ones(n, S_, dtype=torch.bool), y


@pytest.mark.parametrize("call, names", [
    (lambda: make_head("mlp_linear", 0, S_, C_), ["d", "0"]), (lambda: make_head("mlp_linear", 2.5, S_, C_), ["d", "2.5"]),
    (lambda: make_head("mlp_linear", D_, True, C_), ["s"]), (lambda: make_head("mlp_linear", D_, S_, -1), ["c"]),
    (lambda: make_head("mlp_linear", D_, S_, NAN), ["c"]), (lambda: make_head("sa_linear", D_, S_, C_, seed=-1), ["seed"]),
    (lambda: make_head("mlp_gated", D_, S_, C_, gates=0), ["gates"]),
    (lambda: make_head("sa_gated", D_, S_, C_, gates=1.5), ["gates"]),
    (lambda: make_head("mixer_gated", D_, S_, C_, gates="many"), ["gates"]),
    (lambda: make_head("sa_block", D_, S_, C_, groups=0), ["groups"]),
    (lambda: make_head("sa_block", D_, S_, C_, groups=3), ["groups"]),
    (lambda: make_head("bfno", D_, S_, C_, groups=2.5), ["groups"]),
    (lambda: make_head("mlp_linear", D_, S_, C_, gates=2), ["option", "gates"]),
    (lambda: make_head(["mlp_linear"], D_, S_, C_), ["unknown convex head"]),
])
def test_convex_head_arguments(call, names):
    raises(ConfigError, call, *names)


@pytest.mark.parametrize("call, error, names", [
    (lambda h: h.prepare(torch.zeros(0, S_, D_, dtype=torch.float64)), TokenError, ["at least one example"]),
    (lambda h: h.prepare(torch.full((2, S_, D_), NAN, dtype=torch.float64)), TokenError, ["nan"]),
    (lambda h: h.prepare(torch.full((2, S_, D_), 1e200, dtype=torch.float64)), TokenError, ["overflow"]),
    (lambda h: h.prepare(torch.zeros(2, S_, D_, dtype=torch.float64), mask=[[True] * S_] * 2), InputError,
     ["mask", "list"]),
    (lambda h: h.prepare(torch.zeros(2, S_, D_, dtype=torch.float64), mask=torch.full((2, S_), 2)), InputError,
     ["mask", "0 and 1", "[2]"]),
])
def test_convex_head_data(call, error, names):
    """The features' refusals (TokenError) and the mask's, by the encoders' mask rule (InputError, a TokenError;
    the head reads the data anyway, so an integer mask's values are checked)."""
    raises(error, lambda: call(make_head("sa_linear", D_, S_, C_)), *names)


def solver_case(name="mlp_linear", n=24):
    X, mask, y = toy(n)
    head = make_head(name, D_, S_, C_)
    return head, head.prepare(X, mask), y


@pytest.mark.parametrize("change, names", [
    (lambda y: y + C_, ["labels", "[0, 2)"]), (lambda y: y - 1, ["labels", "-1"]),
    (lambda y: y[:-1], ["labels", "(n=24,)"]),
    (lambda y: torch.nn.functional.one_hot(y, C_).double().masked_fill(y[:, None] == 0, NAN), ["nan"]),
    (lambda y: torch.nn.functional.one_hot(y, C_).double() * INF, ["nan or inf"]),
    (lambda y: torch.nn.functional.one_hot(y, C_).double() * 2, ["probability rows"]),
    (lambda y: -torch.nn.functional.one_hot(y, C_).double() + 0.5, ["probability rows"]),
    (lambda y: y.double(), ["(n=24, c=2)"]), (lambda y: y.bool(), ["dtype"]), (lambda y: y.tolist(), ["tensor"]),
])
def test_solver_targets(change, names):
    head, data, y = solver_case()
    Y = change(y)
    raises(ConfigError, lambda: solve(head, data, Y, 0.01, max_iter=5), *names)
    raises(ConfigError, lambda: beta_max(head, data, Y), *names)
    raises(ConfigError, lambda: certificate(head, data, Y, [torch.zeros(D_, C_, dtype=torch.float64)], 0.01), *names)


def test_squared_loss_targets_must_be_finite():
    head, data, y = solver_case()
    Y = torch.randn(24, C_, dtype=torch.float64)
    Y[2, 1] = NAN
    raises(ConfigError, lambda: solve(head, data, Y, 0.01, loss="squared", max_iter=5), "nan", "example 2")


@pytest.mark.parametrize("kwargs, names", [
    ({"beta": 0}, ["beta"]), ({"beta": NAN}, ["beta"]), ({"beta": INF}, ["beta"]),
    ({"max_iter": 0}, ["max_iter"]), ({"max_iter": 2.5}, ["max_iter"]), ({"max_iter": -1}, ["max_iter"]),
    ({"tol": NAN}, ["tol", "nan"]), ({"tol": -1}, ["tol"]), ({"tol": INF}, ["tol"]),
    ({"check_every": 0}, ["check_every"]), ({"fixed_lipschitz": 0}, ["fixed_lipschitz"]),
    ({"fixed_lipschitz": NAN}, ["fixed_lipschitz"]), ({"method": "adam"}, ["method", "adam"]),
    ({"loss": "hinge"}, ["hinge"]), ({"loss": None}, ["loss"]),
    ({"Z0": [torch.zeros(3, 3, dtype=torch.float64)]}, ["z0[0]"]), ({"Z0": torch.zeros(D_, C_)}, ["z0"]),
    ({"Z0": [torch.full((D_, C_), NAN, dtype=torch.float64)]}, ["z0[0]", "nan"]),
    ({"Z0": []}, ["z0"]),
])
def test_solver_arguments(kwargs, names):
    head, data, y = solver_case()
    kw = {"beta": 0.01, **kwargs}
    raises(ConfigError, lambda: solve(head, data, y, **kw), *names)


@pytest.mark.parametrize("call, names", [
    (lambda h, d, y: solve("mlp_linear", d, y, 0.01), ["head"]),
    (lambda h, d, y: solve(h, {"x": 1}, y, 0.01), ["data"]),
    (lambda h, d, y: svt(torch.eye(3), -1), ["tau"]), (lambda h, d, y: svt(torch.eye(3), NAN), ["tau"]),
    (lambda h, d, y: svt(torch.ones(3), 0.1), ["matrix"]),
    (lambda h, d, y: svt(torch.ones(2, 2, dtype=torch.long), 0.1), ["svt", "float32 or float64", "int64"]),
    (lambda h, d, y: rank([torch.eye(3), torch.ones(2, 2, dtype=torch.int32)]), ["block 1", "int32"]),
    (lambda h, d, y: rank([torch.eye(3)], rtol=NAN), ["rtol"]),
    (lambda h, d, y: map_back(h, [torch.eye(D_, C_, dtype=torch.float64)], rtol=-1), ["rtol"]),
    (lambda h, d, y: map_back(h, [torch.eye(3)]), ["z[0]"]),
    (lambda h, d, y: operator_norm2(h, d, iters=0), ["iters"]),
    (lambda h, d, y: certificate(h, d, y, [torch.zeros(D_, C_, dtype=torch.float64)], 0), ["beta"]),
])
def test_solver_helpers(call, names):
    head, data, y = solver_case()
    raises(ConfigError, lambda: call(head, data, y), *names)


def test_solver_refuses_to_certify_overflowing_features():
    """Features finite but so large that the operator overflows: no certificate on NaN, a named error."""
    head = make_head("mlp_linear", D_, S_, C_)
    X, mask, y = toy()
    data = head.prepare(X * 1e160, mask)
    raises(TokenError, lambda: solve(head, data, y, 0.01, max_iter=5), "overflow")


def test_labels_and_one_hot_targets_give_the_same_solution():
    head, data, y = solver_case()
    Y = torch.nn.functional.one_hot(y, C_).double()
    bm = beta_max(head, data, y)
    assert bm == beta_max(head, data, Y)
    a = solve(head, data, y, 0.2 * bm, max_iter=200)
    b = solve(head, data, Y, 0.2 * bm, max_iter=200)
    assert a.certificate == b.certificate and a.converged
    soft = 0.5 * Y + 0.25                              # soft labels: rows in the simplex are fine
    assert math.isfinite(solve(head, data, soft, 0.2 * bm, max_iter=20).certificate["objective"])


# ============================================================================ adversarial review (boundary gaps)
@pytest.mark.parametrize("call, names", [
    (lambda: E.Energy(7), ["pairs", "int"]), (lambda: E.Energy("ab"), ["pairs", "str"]),
    (lambda: E.Energy([E.Centering()]), ["pairs", "centering"]),
    (lambda: E.Energy([(3, E.Centering())]), ["name", "3"]),
    (lambda: E.Energy([("a.b", E.Centering())]), ["name", "a.b"]),
    (lambda: E.Energy([("", E.Centering())]), ["name"]),
])
def test_energy_refuses_malformed_terms(call, names):
    """A malformed term is an EnergyError naming it, not torch's TypeError / KeyError (ModuleDict names)."""
    raises(EnergyError, call, *names)


def test_energy_takes_pairs_as_lists_and_dicts():
    c = E.Centering()
    assert E.Energy([["center", c]]).names == E.Energy({"center": c}).names == ["center"]


@pytest.mark.parametrize("call, names", [
    (lambda: E.PairwiseAttention(guard="no"), ["guard", "no"]), (lambda: E.PairwiseAttention(validate=NAN), ["validate"]),
    (lambda: E.Residual(validate="yes"), ["validate"]), (lambda: E.FeedForward(torch.eye(3), validate=1), ["validate"]),
    (lambda: E.FeedForward(torch.eye(2) * 5, curvature=torch.tensor(0.1)), ["curvature", "0.1", "lambda_max"]),
    (lambda: E.FeedForward(torch.eye(2), curvature=torch.tensor(NAN)), ["curvature", "nan"]),
    (lambda: E.FeedForward(torch.eye(2), curvature=-1.0), ["curvature", "-1"]),
    (lambda: E.FeedForward(torch.eye(2), curvature="x"), ["curvature", "x"]),
    (lambda: E.FeedForward(torch.eye(2), curvature=torch.ones(2)), ["curvature", "shape"]),
    (lambda: E.PairwiseAttention(metric=torch.eye(3) * 3, metric_norm2=torch.tensor(0.01)), ["metric_norm2", "||w||_2^2"]),
    (lambda: E.PairwiseAttention(metric=torch.eye(3), metric_norm2=torch.tensor(INF)), ["metric_norm2", "inf"]),
    (lambda: E.PairwiseAttention(metric_norm2=torch.tensor(1.0)), ["metric_norm2", "no metric"]),
])
def test_energy_term_flags_and_given_bounds(call, names):
    """A truthy string or NaN for a switch, and a caller's curvature or ||W||^2 bound below the true one (which
    makes the MM step too long while the step claims its guarantee), are refused naming them."""
    raises(EnergyError, call, *names)


def test_given_bounds_at_or_above_the_true_one_are_taken_and_used():
    W = torch.diag(torch.tensor([3.0, -1.0], dtype=torch.float64))
    g, Y = E.complete(4), torch.randn(1, 4, 2, dtype=torch.float64)
    assert float(E.FeedForward(W, curvature=3.0).curvature(Y, g)) == 3.0          # a number becomes a tensor
    assert float(E.FeedForward(W, curvature=torch.tensor(3.0)).curvature(Y, g)) == 3.0
    pa = E.PairwiseAttention(metric=W, metric_norm2=9.0)
    assert float(pa.metric_norm2()) == 9.0 and torch.isfinite(pa.curvature(Y, g)).all()
    E.FeedForward(torch.eye(2, device="meta"), curvature=torch.tensor(1.0, device="meta"))   # meta: no values read
    E.Residual(torch.zeros(4, 2, device="meta"))


@pytest.mark.parametrize("call, names", [
    (lambda: U.Attention(4, temperature=NAN), ["temperature", "nan"]),
    (lambda: U.Attention(4, temperature="hot"), ["temperature", "hot"]),
    (lambda: U.Attention(4, causal="no"), ["causal", "no"]), (lambda: U.Attention(4, bias=NAN), ["bias"]),
    (lambda: U.Attention(4, activation=["relu"]), ["activation"]),
    (lambda: U.FreeEncoder(4, heads=1, attention_temperature=NAN), ["attention_temperature"]),
    (lambda: U.TorchEncoder(4, heads=1, attention_temperature=-1), ["attention_temperature"]),
    (lambda: U.TokenEmbedding(10, 4, pad_idx=2.5), ["pad_idx", "2.5"]),
    (lambda: U.TokenEmbedding(10, 4, pad_idx="x"), ["pad_idx", "x"]),
    (lambda: U.TokenEmbedding(10, 4, pad_idx=True), ["pad_idx", "true"]),
    (lambda: U.TokenEmbedding(10, 4, pad_idx=10), ["pad_idx", "10"]),
    (lambda: U.TokenEmbedding(10, 4, freeze="no"), ["freeze", "no"]),
    (lambda: U.UnfoldedTransformer(10, NAN, d=4, heads=1), ["num_classes", "nan"]),
    (lambda: U.UnfoldedTransformer(10, "x", d=4, heads=1), ["num_classes", "x"]),
    (lambda: U.UnfoldedTransformer(10, 2.5, d=4, heads=1), ["num_classes", "2.5"]),
    (lambda: U.UnfoldedTransformer(10, True, d=4, heads=1), ["num_classes", "true"]),
    (lambda: U.UnfoldedTransformer(10, 2, d=4, heads=1, pad_idx=None), ["pad_idx", "none"]),
])
def test_model_scalars_refused_by_name(call, names):
    """Each bad scalar is a ConfigError naming it, never a raw int()/comparison/IndexError nor taken silently (a NaN
    temperature with a softmax attention, num_classes 2.5 truncated to 2, a truthy string for a switch)."""
    raises(ConfigError, call, *names)


@pytest.mark.parametrize("call, names", [
    (lambda: E.TokenGraph(1, 4, edge_index=torch.tensor([[0], [1]]), offsets=[2]), ["offsets [2]", "edge list"]),
    (lambda: E.TokenGraph(1, 4, edge_index=torch.tensor([[0], [2]]), offsets=[1, 2]), ["offsets [1, 2]"]),
    (lambda: E.TokenGraph(1, 6, offsets=[1]), ["offsets [1]", "complete"]),
    (lambda: E.TokenGraph(1, 4, edge_index=torch.tensor([[0], [1]]), offsets="x"), ["offsets", "'x'"]),
    (lambda: E.TokenGraph(1, 4, edge_index=torch.tensor([[0], [1]]), offsets=[1.5]), ["offset", "1.5"]),
    (lambda: E.TokenGraph(1, 4, edge_index=torch.tensor([[0], [1]]), offsets=[0, 1]), ["offset", "0"]),
])
def test_token_graph_offsets_must_describe_its_edges(call, names):
    """Offsets that are not the edge list's pattern are refused: kept, the banded kernel's MM pass would run over
    another graph than ``value`` (E = -0.0978 vs -0.1456 on the first case), so a step would descend one energy
    and the trace judge another."""
    raises(GraphError, call, *names)


@pytest.mark.parametrize("spec", ["window:2", "strided:3", "dilated:2:2"])
def test_builder_offsets_pass_their_check_padded_and_sparse(spec):
    m = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1] * 7], dtype=torch.bool)
    for g in (E.graph_from_spec(spec, 7, batch_size=2), E.graph_from_spec(spec, 7, batch_size=2, mask=m)):
        s = g.to_sparse()
        assert s.offsets == g.offsets and torch.equal(s.edges(), g.edges())
        Y = torch.randn(2, 7, 3, dtype=torch.float64)
        banded, edges = E.PairwiseAttention(kernel="banded"), E.PairwiseAttention(kernel="edges")
        assert torch.allclose(banded.mm(Y, g).value, edges.mm(Y, g).value, rtol=1e-12, atol=1e-12)
    assert E.TokenGraph(1, 4, offsets=[1, 2, 3, 9]).offsets == (1, 2, 3)     # the complete graph's, beyond n dropped


# ============================================================================ verdicts (adversarial review)
class _NaNStep(U.Step):
    """Turns every token into NaN, at every layer (a diverging step)."""

    def __init__(self):
        super().__init__()
        self.energy = E.attention_energy()

    def update(self, Y, graph):
        return Y * NAN


class _Shrinks(_NaNStep):
    def update(self, Y, graph):
        return Y[:, :2]


def test_a_step_that_keeps_diverging_is_reported_not_raised():
    """A step that keeps giving NaN is reported, not raised: a dead example's tokens are zeroed at every later
    layer too, so no NaN reaches the energy's token check, and the verdict is "nonfinite" for every step."""
    g, Y = E.complete(4, batch_size=2), torch.randn(2, 4, 3, dtype=torch.float64)
    _, rep = U.trace_descent(_NaNStep(), Y, g, layers=3)
    assert rep.verdict == "nonfinite" and rep.num_nonfinite == rep.num_increases == 6
    _, rep = U.trace_descent(U.Sequence([_NaNStep(), U.ReLUProxStep()]), Y, g, layers=2)
    assert rep.verdict == "nonfinite" and rep.num_nonfinite == 4


def test_a_step_changing_the_shape_is_named():
    g, Y = E.complete(4, batch_size=2), torch.randn(2, 4, 3, dtype=torch.float64)
    raises(StepError, lambda: U.trace_descent(_Shrinks(), Y, g, layers=1), "_Shrinks", "(2, 2, 3)")
    raises(StepError, lambda: U.trace_descent(U.Sequence([_Shrinks(), U.ReLUProxStep()]), Y, g, layers=1),
           "sub-step 0", "_Shrinks")
    raises(StepError, lambda: _Shrinks()(Y, g), "_Shrinks", "same shape")


@pytest.mark.parametrize("ran", [[[False]], [[False, True]], [[True, False, True]]], ids=str)
def test_ran_must_be_a_prefix_of_layers(ran):
    """A ``ran`` that skips layer 1 or resumes after a stop (layers that ran would go unjudged; all False would give
    "descent" over no step for a NaN or a rise) is refused naming layer 1."""
    ran = torch.tensor(ran)
    vals = torch.tensor([[1.0] + [NAN] * ran.shape[1]], dtype=torch.float64)
    raises(StepError, lambda: U.report_from_values({"e": vals}, torch.float64, ran=ran), "ran", "layer 1")


@pytest.mark.parametrize("bad", ["no", NAN, 1, None], ids=repr)
def test_report_guaranteed_is_a_bool(bad):
    """A truthy non-bool for ``guaranteed`` is refused, never stored as a summary's ``guaranteed: true``."""
    vals = {"e": torch.tensor([[1.0, 0.5]], dtype=torch.float64)}
    raises(StepError, lambda: U.report_from_values(vals, torch.float64, guaranteed=bad), "guaranteed")


@pytest.mark.parametrize("call, names", [
    (lambda: U.check_tol_factor(torch.tensor(True)), ["tol_factor"]),
    (lambda: U.check_tol_factor(__import__("numpy").bool_(True)), ["tol_factor"]),
    (lambda: U.tolerance({"e": torch.ones(2, dtype=torch.float64)}, torch.int64), ["dtype", "int64"]),
    (lambda: U.tolerance({}, torch.float64), ["values"]),
    (lambda: U.trace_descent(U.AttentionStep(), torch.randn(1, 4, 2), E.complete(4), layers=1, substeps="no"),
     ["substeps", "no"]),
])
def test_verdict_arguments(call, names):
    raises(StepError, call, *names)


def test_check_tokens_names_a_graph_that_is_not_one():
    raises(GraphError, lambda: E.check_tokens(torch.zeros(1, 4, 2), "complete"), "graph", "str")
    raises(GraphError, lambda: U.trace_descent(U.AttentionStep(), torch.zeros(1, 4, 2), "complete", layers=1), "graph")


def test_a_gradient_step_on_an_energy_with_an_indicator_claims_no_guarantee():
    """Prop. A.1 is about a smooth E: with the ReLU indicator in E the gradient step leaves the feasible set and E
    goes to +inf (the trace sees the increase), so guaranteed() is False even for step_size * L <= 1."""
    energy = E.attention_energy(B=-torch.ones(4, 3, dtype=torch.float64)) + E.nonnegativity_energy()
    step = U.GradientStep(energy, 0.5, lipschitz=1.0)
    assert not step.guaranteed()
    _, rep = U.trace_descent(step, torch.rand(1, 4, 3, dtype=torch.float64) * 0.01, E.complete(4), layers=1)
    assert rep.verdict == "increase" and rep.guaranteed == [False]
    assert U.GradientStep(E.attention_energy(), 0.5, lipschitz=1.0).guaranteed()           # smooth: claimed
    assert U.Sequence([U.GradientStep(E.attention_energy(), 0.5, lipschitz=1.0), U.ReLUProxStep()]).guaranteed()


@pytest.mark.parametrize("call, names", [
    (lambda Y, g: U.mm_step(E.attention_energy(), Y.tolist(), g), ["y", "list"]),
    (lambda Y, g: U.mm_direction(E.attention_energy(), None, g), ["y", "nonetype"]),
    (lambda Y, g: U.mm_step(E.attention_energy(), Y.masked_fill(Y > 0, NAN), g), ["y", "nan"]),
    (lambda Y, g: U.mm_step(E.feedforward_energy(torch.eye(3, dtype=torch.float64)), Y, g), ["d=4", "(3, 3)"]),
    (lambda Y, g: E.feedforward_energy(torch.eye(3, dtype=torch.float64)).value(Y, g), ["d=4", "feed-forward"]),
    (lambda Y, g: U.mm_step(E.attention_energy(), Y[:, :, :0], g), ["no features"]),
])
def test_the_functional_mm_step_checks_its_tokens(call, names):
    """Bad tokens are a TokenError naming them: no raw AttributeError / TypeError / matmul RuntimeError, no NaN
    tokens stepped unread."""
    raises(TokenError, lambda: call(torch.randn(2, 4, 4, dtype=torch.float64), E.complete(4, 2)), *names)


def test_the_functional_mm_step_checks_its_energy():
    raises(StepError, lambda: U.mm_step("E1", torch.randn(1, 4, 2), E.complete(4)), "energy", "str")


@pytest.mark.parametrize("call, error, names", [
    (lambda: U.masked_mean(torch.randn(2, 4, 3), torch.ones(2, 4)), InputError, ["mask", "bool", "float32"]),
    (lambda: U.masked_mean(torch.randn(2, 4, 3), torch.ones(2, 5, dtype=torch.bool)), InputError,
     ["mask", "(2, 4)", "(2, 5)"]),
    (lambda: U.masked_mean(torch.randn(2, 4, 3), [[1, 1, 0, 0]] * 2), InputError, ["mask", "list"]),
    (lambda: U.masked_mean(torch.randn(2, 4, 3).tolist(), torch.ones(2, 4, dtype=torch.bool)), TokenError,
     ["y", "list"]),
    (lambda: U.masked_mean(torch.zeros(2, 4, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool)), TokenError,
     ["int64"]),
    (lambda: U.masked_mean(torch.randn(4, 3), torch.ones(4, dtype=torch.bool)), TokenError, ["(b, n, d)"]),
])
def test_masked_mean_checks_its_metadata(call, error, names):
    """Bad metadata is refused by name, not by torch's RuntimeError / TypeError; a float mask (torch's are additive)
    is refused as the encoders refuse it (InputError, a TokenError)."""
    raises(error, call, *names)


MASK_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", MASK_DTYPES, ids=str)
def test_every_mask_the_encoder_takes_pools_graphs_and_solves_alike(dtype):
    """A 0/1 integer attention mask (Hugging Face's) is read as ``mask != 0`` wherever a padding mask is taken, as
    the encoder reads it: the pooling (`masked_mean`), the token graphs (`TokenGraph`, a mask-dependent builder,
    `with_mask`), attention's key padding mask and a convex head's `prepare` give what the bool mask gives: one
    dtype rule, `energies.checks.as_bool_mask`. None of them refuses an integer mask the encoder accepts (the
    docs' own example passes ``mask.long()``)."""
    torch.manual_seed(0)
    ref = torch.tensor([[True, True, True, False, False], [True, True, False, False, False]])
    mask = ref.to(dtype)
    X = torch.randn(2, 5, 4)
    enc = U.GuaranteedEncoder(4, heads=1, layers=2, graph="window:1")
    out, out_ref = enc(X, mask), enc(X, ref)
    assert torch.equal(U.masked_mean(out.Y, mask), U.masked_mean(out_ref.Y, ref))
    assert torch.equal(U.masked_mean(X, mask), (X * ref[..., None]).sum(1) / ref.sum(1, keepdim=True))
    assert torch.equal(U.masked_mean(X, None), X.mean(1))
    for spec in ("complete", "window:1", "star"):
        g, g_ref = E.graph_from_spec(spec, 5, batch_size=2, mask=mask), E.graph_from_spec(spec, 5, batch_size=2,
                                                                                         mask=ref)
        assert torch.equal(g.mask, ref) and torch.equal(g.edges(), g_ref.edges()), spec
    assert torch.equal(E.complete(5, 2).with_mask(mask).mask, ref)
    head = make_head("mlp_linear", d=4, s=5, c=2)
    data, data_ref = head.prepare(X.double(), mask), head.prepare(X.double(), ref)
    assert all(torch.equal(data[k], data_ref[k]) for k in ("X", "mask", "pi"))
    attn = U.Attention(4, heads=2)
    assert torch.equal(attn(X, key_padding_mask=mask), attn(X, key_padding_mask=ref))


def test_a_float_mask_is_refused_wherever_a_mask_is_taken():
    """The control: a float mask is ambiguous (torch's float masks are additive, 0 keeps and -inf drops) and is
    refused by every taker, naming the dtype."""
    X, mask = torch.randn(2, 5, 4), torch.ones(2, 5)
    raises(InputError, lambda: U.masked_mean(X, mask), "float32")
    raises(InputError, lambda: U.GuaranteedEncoder(4, heads=1, layers=2)(X, mask), "float32")
    raises(GraphError, lambda: E.complete(5, 2, mask=mask), "float32")
    raises(InputError, lambda: make_head("mlp_linear", d=4, s=5, c=2).prepare(X.double(), mask), "float32")
    raises(TokenError, lambda: U.Attention(4, heads=2)(X, key_padding_mask=mask), "float32")


@pytest.mark.parametrize("call, names", [
    (lambda: E.check_rho(3), ["rho instance", "3"]), (lambda: E.check_rho(E.ExpRho), ["rho instance", "exprho"]),
    (lambda: E.LpRho(torch.tensor(True)), ["p", "true"]), (lambda: E.ReluRho(__import__("numpy").bool_(True)), ["c"]),
])
def test_rho_arguments_are_not_bools_or_classes(call, names):
    raises(EnergyError, call, *names)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
@pytest.mark.parametrize("kw, name", [({"trace": "no"}, "trace"), ({"keep_states": NAN}, "keep_states")], ids=str)
def test_forward_switches_are_bools(mode, kw, name):
    """A truthy 'no' for trace and a NaN keep_states are refused naming the switch, by every encoder (the guaranteed
    one names it ``trace``, not 'guard')."""
    model = U.UnfoldedTransformer(10, 3, d=4, heads=1, layers=2, mode=mode)
    raises(ConfigError, lambda: model(torch.randint(1, 10, (2, 5)), **kw), name)
    raises(ConfigError, lambda: model.encoder(torch.randn(2, 5, 4), **kw), name)


def test_theorem41_refuses_energies_with_an_indicator():
    """Thm 4.1 is about smooth f and g: theorem41 refuses an f with the ReLU indicator naming it (its bound would
    say holds, delta 0.99 <= bound 2, for a layer whose energy the trace sees go to +inf); a smooth f is judged."""
    B = -torch.ones(4, 3, dtype=torch.float64)
    f = U.GradientStep(E.attention_energy(B=B) + E.nonnegativity_energy(), 0.25, lipschitz=1.0)
    g = U.GradientStep(E.feedforward_energy(torch.eye(3, dtype=torch.float64)), 0.25, lipschitz=2.0)
    Y = torch.rand(1, 4, 3, dtype=torch.float64) * 0.01
    raises(StepError, lambda: U.Sequence([f, g]).theorem41(Y, E.complete(4)), "theorem41", "indicator", "relu")
    smooth = U.GradientStep(E.attention_energy(B=B), 0.25, lipschitz=1.0)
    assert "holds" in U.Sequence([smooth, g]).theorem41(Y, E.complete(4))


@pytest.mark.parametrize("kind", ["guaranteed", "free", "baseline"])
def test_encoder_depth_is_bounded_at_construction(kind):
    """10**30 shared layers (an unroll that never ends) are refused at construction; the inference rule's bound
    applies, and the bound itself is built."""
    from unfold.inputs import MAX_INFERENCE_LAYERS

    raises(ConfigError, lambda: U.build_encoder(kind, d=4, heads=1, layers=10 ** 30), "layers", str(10 ** 30))
    raises(ConfigError, lambda: U.build_encoder(kind, d=4, heads=1, layers=MAX_INFERENCE_LAYERS + 1), "layers")
    assert U.build_encoder("guaranteed", d=4, heads=1, layers=MAX_INFERENCE_LAYERS).layers == MAX_INFERENCE_LAYERS


@pytest.mark.parametrize("call, names", [
    (lambda: U.Attention(10 ** 30), ["attention", "d=" + str(10 ** 30)]),
    (lambda: U.Attention(4, heads=10 ** 30), ["attention", "heads"]),
    (lambda: U.TokenEmbedding(10 ** 30, 4), ["vocab_size=" + str(10 ** 30)]),
    (lambda: U.TokenEmbedding(10, 4, max_len=10 ** 30), ["max_len"]),
    (lambda: U.UnfoldedTransformer(10, 10 ** 30, d=4, heads=1), ["num_classes=" + str(10 ** 30)]),
    (lambda: U.UnfoldedTransformer(10, 2, d=4, heads=1, ffn_mult=torch.tensor([1.0, 2.0])), ["ffn_mult", "guaranteed"]),
    (lambda: U.UnfoldedTransformer(10, 2, d=4, heads=1, attention_temperature=True), ["attention_temperature=true"]),
])
def test_sizes_beyond_memory_and_odd_inapplicable_values_are_named(call, names):
    """Sizes past int64, a tensor left where an argument does not apply and True passed for the default 1.0
    (True == 1.0) are ConfigErrors naming them, not torch's TypeError ('Overflow when unpacking long long') or the
    ambiguous-truth RuntimeError."""
    raises(ConfigError, call, *names)


@pytest.mark.parametrize("call, names", [
    (lambda: E.mask_from_lengths([1], 10 ** 30), ["n", str(10 ** 30)]),
    (lambda: E.mask_from_lengths([10 ** 30], 4), ["lengths"]),
    (lambda: E.mask_from_lengths([], 4), ["lengths", "at least one example"]),
    (lambda: E.mask_from_lengths(torch.tensor([1], device="meta"), 4), ["lengths", "meta"]),
])
def test_mask_from_lengths_edges(call, names):
    """Bad lengths are a GraphError naming them: no OverflowError or torch's meta RuntimeError, and no (0, n) mask
    for an empty batch."""
    raises(GraphError, call, *names)


@pytest.mark.parametrize("Y, names", [
    (lambda: torch.randn(2, 5, 3).tolist(), ["y", "list"]), (lambda: torch.randn(2, 6, 3), ["y", "(2, 6, 3)"]),
    (lambda: torch.randn(5, 3), ["y", "(5, 3)"]), (lambda: torch.ones(2, 5, 3, dtype=torch.long), ["y", "int64"]),
    (lambda: torch.randn(2, 5, 3, device="meta"), ["y", "meta"]),
])
@pytest.mark.parametrize("name", ["pairwise_pass", "pairwise_energy", "weighted_neighbour_sums", "explicit_energy"])
def test_public_kernel_passes_check_their_entry(name, Y, names):
    """A bad Y is a TokenError at the kernel's entry, not torch's RuntimeError / AttributeError from inside it
    (metadata checks: no host read)."""
    import energies.kernels as K

    raises(TokenError, lambda: getattr(K, name)(Y(), E.complete(5, 2), E.get_rho("exp"), 1.0), *names)


def test_public_kernel_passes_check_their_parts():
    import energies.kernels as K

    Y, g, rho = torch.randn(2, 5, 3), E.complete(5, 2), E.get_rho("exp")
    raises(EnergyError, lambda: K.pairwise_pass(Y, g, rho, NAN), "tau", "nan")
    raises(EnergyError, lambda: K.pairwise_pass(Y, g, rho, True), "tau")
    raises(EnergyError, lambda: K.pairwise_pass(Y, g, "exp", 1.0), "rho", "exp")
    raises(EnergyError, lambda: K.pairwise_energy(Y, "complete", rho, 1.0), "graph", "str")
    raises(EnergyError, lambda: K.pick_kernel("complete", rho), "graph")
    assert torch.isfinite(K.pairwise_energy(Y, g, rho, 1.0)).all()


def test_a_step_without_an_energy_is_named():
    class NoEnergy(U.Step):
        def update(self, Y, graph):
            return Y

    raises(StepError, lambda: U.trace_descent(NoEnergy(), torch.randn(1, 4, 2), E.complete(4), layers=2), "NoEnergy",
           "energy")
    raises(StepError, lambda: U.trace_descent([NoEnergy()], torch.randn(1, 4, 2), E.complete(4)), "NoEnergy")
