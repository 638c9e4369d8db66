"""The in-model trace is sound: every step whose exact energy change exceeds its tolerance tol_t is reported, for every
kernel and dtype, although the trace reads the kernels' own passes, whose energy errs by far more than tol_t.

The rule that makes it so: a step is decided by the exact re-evaluation whenever its read change lies within the
passes' rounding bound (:meth:`energies.energy.Energy.value_error`) of tol_t. Here that bound is checked against
50-digit arithmetic for every kernel, dtype and several penalties (negative control: a bound 1000 times smaller is
exceeded), and faults are planted: after layer index 1 every real token is shifted, or scaled, so that the exact energy
rises by 1.25 to 1000 tol_t, on inputs near and far from the precision guard's switch. None may be missed, and the
designed false-alarm grid (a near-equal cluster plus one far token) stays at 0.
"""
from __future__ import annotations

import math

import mpmath
import pytest
import torch

import energies as E
from energies.kernels import EXPANSION_Z_ERROR
from energies.terms import PairwiseAttention, PassStats
from unfold.encoders import Encoder, GuaranteedEncoder
from unfold.prox import ProxMMStep
from unfold.trace import report_from_values

KERNELS = ["dense", "softmax", "streamed", "fused", "edges", "banded", "triton"]
DTYPES = [torch.float64, torch.float32]
#: the largest token norm at which a dtype's own expansion still resolves z (tau = 1): the precision guard's switch
SWITCH = {dt: math.sqrt(EXPANSION_Z_ERROR[dt] / torch.finfo(dt).eps) for dt in DTYPES}


def _graph(kernel):
    return "window:2" if kernel == "banded" else "complete"


def _encoder(kernel, dtype, d=3, layers=4):
    torch.manual_seed(0)
    enc = GuaranteedEncoder(d=d, heads=1, layers=layers, rho="exp", tau=1.0, ffn=False, relu=False, kernel=kernel,
                            graph=_graph(kernel)).to(dtype)
    with torch.no_grad():
        enc.W.copy_(torch.eye(d, dtype=dtype)[None])
    return enc


def _mp(x):
    return mpmath.mpf(float(x))


def _energy_mp(Y, X, pairs, rho="exp", tau=1.0):
    """E(Y) = sum over ``pairs`` of tau rho(|y_u - y_v|^2 / 2 tau) + 1/2 |Y - X|^2 in 50-digit arithmetic (one example,
    real tokens only, float64 inputs read exactly)."""
    mpmath.mp.dps = 50
    ys = [[_mp(v) for v in row] for row in Y.tolist()]
    xs = [[_mp(v) for v in row] for row in X.tolist()]
    e = sum(((a - b) ** 2 for ry, rx in zip(ys, xs) for a, b in zip(ry, rx)), mpmath.mpf(0)) / 2
    for i, j in pairs:
        z = sum((a - b) ** 2 for a, b in zip(ys[i], ys[j])) / (2 * tau)
        e += tau * {"exp": lambda: -mpmath.exp(-z), "cauchy": lambda: mpmath.log1p(z)}[rho]()
    return e


def _pairs(graph):
    A = graph.pair_mask()[0]
    n = A.shape[0]
    return [(i, j) for i in range(n) for j in range(i + 1, n) if bool(A[i, j])]


# ------------------------------------------------------------------------------------------------ the bound itself

def _cases():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 7, 3, dtype=torch.float64, generator=g)
    far = base * 1e-3
    far[:, 0] += 1.0
    return {"random": base * 3, "cluster+far": far, "offset": 1e4 + base,
            "coincident": base[:, :1].expand(2, 7, 3) * 5 + 1e-6 * base}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_pass_rounding_bound_holds_against_50_digit_arithmetic(kernel, dtype):
    """|pass value - E_exact| <= value_error for the energy-only pass and the step's pass, every input of
    :func:`_cases` (scaled to both sides of the guard's switch), exp and cauchy penalties where the kernel runs them,
    padded examples included. The bound is a worst case: it is also checked not to be vacuous (the largest observed
    error reaches 1e-6 of it, so a bound 1e6 times smaller would fail)."""
    rhos = ["exp"] if kernel in ("softmax", "fused") else ["exp", "cauchy"]
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, -2:] = False
    graph = E.graph_from_spec(_graph(kernel), 7, batch_size=2, mask=mask)
    worst = 0.0
    for rho in rhos:
        term = PairwiseAttention(rho, 1.0, kernel=kernel)
        for name, Y0 in _cases().items():
            for scale in (1.0, 0.9 * SWITCH[dtype], 1.5 * SWITCH[dtype]):
                Y = graph.zero_padded((Y0 * (scale if name == "cluster+far" else 1.0)).to(dtype))
                v, c = term.pass_value_and_curvature(Y, graph)
                parts = term.mm(Y, graph)
                for val, curv in ((v, c), (parts.value, parts.curvature)):
                    err = term.value_error(PassStats(Y, graph, curv), val)
                    assert torch.isfinite(err).all() and (err > 0).all()
                    for b in range(2):
                        real = int(mask[b].sum())
                        exact = _energy_mp(Y[b, :real].double(), Y[b, :real].double(), _pairs_of(graph, b, real), rho)
                        diff = abs(_mp(val[b]) - exact)
                        assert diff <= _mp(err[b]), (rho, name, scale, b, float(diff), float(err[b]))
                        worst = max(worst, float(diff / _mp(err[b])))
    assert worst > 1e-6, worst          # the rule is not vacuous: a bound 1e6 times tighter is exceeded


def _pairs_of(graph, b, real):
    A = graph.pair_mask()[b]
    return [(i, j) for i in range(real) for j in range(i + 1, real) if bool(A[i, j])]


def test_a_term_that_overrides_its_pass_without_a_bound_is_always_rechecked():
    """Unknown rounding is never read as descent: a term class that overrides its pass value without stating its
    own value_error gets +inf; one that reads its pass through value() gets 0."""
    class Scaled(E.Residual):
        def pass_value(self, Y, graph):
            return 1.0000001 * super().pass_value(Y, graph)

    class Plain(E.terms.Centering):
        pass

    Y = torch.randn(2, 4, 3, dtype=torch.float64)
    g = E.graph_from_spec("complete", 4, batch_size=2)
    v = torch.ones(2, dtype=torch.float64)
    assert torch.isinf(E.EnergyTerm.value_error(Scaled(), PassStats(Y, g, 1.0), v)).all()
    assert (Plain().value_error(PassStats(Y, g, 1.0), v) == 0).all()
    assert (E.Residual().value_error(PassStats(Y, g, 1.0), v) > 0).all()       # its own rule


# ------------------------------------------------------------------------------------------------ planted faults

def _exact_change(enc, X, graph, Y, Yf):
    energy = enc.energy(X)
    return float(Encoder.exact_total(energy, Yf, graph)[0] - Encoder.exact_total(energy, Y, graph)[0])


def _fault(kind, Y, p, mask):
    m = mask[..., None].to(Y.dtype)
    return Y + p * m if kind == "shift" else Y * (1 + p * m)


def _solve(f, target):
    """p with f(p) ~ target (f(0) = 0, f rising in the direction searched): doubling, then bisection."""
    sign = 1.0 if f(1e-12) >= f(-1e-12) else -1.0
    hi = 1e-15
    while f(sign * hi) < target and hi < 1e6:
        hi *= 2
    lo = 0.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(sign * mid) < target else (lo, mid)
    return sign * hi


@pytest.fixture
def planted(monkeypatch):
    """Layer index 1 replaced by ``Y_1 + fault``: its values still read off the step's pass at Y_1, its output the
    faulted tokens, so that the step's exact change is the fault's alone."""
    plan = {"fault": None, "calls": 0}
    original = ProxMMStep.step_with_trace

    def step(self, Y, graph, values=True):
        out, vals, curv = original(self, Y, graph, values)
        t, plan["calls"] = plan["calls"], plan["calls"] + 1
        if t == 1 and plan["fault"] is not None:
            out = plan["fault"](Y)
        return out, vals, curv

    monkeypatch.setattr(ProxMMStep, "step_with_trace", step)
    return plan


#: the cluster's spread per dtype: tight enough that the kernels' rounding of the pairwise energy dwarfs tol_t
SPREAD = {torch.float64: 1e-9, torch.float32: 1e-4}


def _inputs(dtype, frac, seed):
    """The reported kind of input: d = 1, n = 3, one token at ``frac`` times the guard's switch, two within
    ``SPREAD`` of 0."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(1, 3, 1, dtype=torch.float64, generator=g) * SPREAD[dtype]
    X[0, 0] += frac * SWITCH[dtype]
    return X.to(dtype)


def _planted_runs(planted, kernel, dtype, seeds=range(4), fracs=(0.5, 0.95, 1.3), factors=(1.25, 3.0, 30.0, 1000.0)):
    """For every input and fault (shift, scale) sized to k tol_1 for k in ``factors``: ``(trace, rise_mp, tol_1,
    case)`` of the faulted forward, its planted rise in 50-digit arithmetic."""
    for seed in seeds:
        for frac in fracs:
            X = _inputs(dtype, frac, seed)
            enc = _encoder(kernel, dtype, d=1)
            planted["calls"], planted["fault"] = 0, None
            clean = enc(X, trace=True, keep_states=True)
            graph, Y1 = enc.token_graph(torch.ones(1, 3, dtype=torch.bool)), clean.states[1]
            tol = float(clean.report().tol[0, 1])
            for kind in ("shift", "scale"):
                for k in factors:
                    p = _solve(lambda q: _exact_change(enc, X, graph, Y1, _fault(kind, Y1, q, graph.mask)), k * tol)
                    planted["calls"], planted["fault"] = 0, (lambda Y, p=p, kind=kind: _fault(kind, Y, p, graph.mask))
                    out = enc(X, trace=True, keep_states=True)
                    rise = (_energy_mp(out.states[2][0].double(), X[0].double(), _pairs(graph))
                            - _energy_mp(out.states[1][0].double(), X[0].double(), _pairs(graph)))
                    yield out.energies, rise, tol, (kind, k, seed, frac)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_planted_rise_above_the_tolerance_is_missed(planted, kernel, dtype):
    """Shift or scaling of every real token after layer index 1, sized to raise the exact energy by 1.25, 3, 30 and
    1000 tol_1, on inputs at half the guard's switch, just below it and past it (2 seeds): every one is reported as
    an increase at that layer (0 missed of 48; 24 for Triton), each planted rise confirmed above tol_1 in 50-digit arithmetic, and
    no other step is flagged."""
    seeds = range(1 if kernel == "triton" else 2)         # (Triton's interpreter runs each program in Python)
    missed, count = [], 0
    for trace, rise, tol, case in _planted_runs(planted, kernel, dtype, seeds):
        assert rise > tol, (case, float(rise), tol)                         # the fault is real
        rep = report_from_values(trace, dtype, guaranteed=True)
        count += 1
        if not bool(rep.increases[0, 1]):
            missed.append((case, float(rise) / tol))
        assert int(rep.increases.sum()) == int(rep.increases[0, 1]), case    # only the faulted step
    assert count == 24 * len(seeds) and missed == [], missed


def test_without_the_window_the_same_faults_are_missed(planted):
    """The negative control of the rule: the same planted rises judged on the kernels' values alone (no rounding
    bound: only steps those values flag are rechecked) are missed on some inputs, for the dense and fused kernels."""
    for kernel in ("dense", "fused"):
        missed = 0
        for trace, rise, tol, case in _planted_runs(planted, kernel, torch.float64, seeds=range(6), fracs=(0.5, 0.95),
                                                    factors=(1.25, 3.0)):
            trace.error = None
            missed += not bool(report_from_values(trace, torch.float64, guaranteed=True).increases[0, 1])
        assert missed > 0, kernel


def test_the_reported_reproduction_is_an_increase_with_every_kernel(planted):
    """The case that was read as descent: d = 1, n = 3, tokens [1000, 7.8e-10, 8.0e-9], every token moved by 1e-6
    after layer index 1 (E rises by about 1.5e-12, ~100 times that step's tolerance): an increase at that layer."""
    X = torch.tensor([[[1000.0], [7.800369015336367e-10], [8.03415670889326e-09]]], dtype=torch.float64)
    for kernel in ["dense", "softmax", "streamed", "fused", "edges", "triton"]:
        enc = _encoder(kernel, torch.float64, d=1)
        planted["calls"], planted["fault"] = 0, None
        Y1 = enc(X, trace=True, keep_states=True).states[1]
        planted["calls"], planted["fault"] = 0, (lambda Y: Y + 1e-6)
        out = enc(X, trace=True, keep_states=True)
        rep = out.report()
        assert rep.verdict == "increase" and bool(rep.increases[0, 1]), kernel
        graph = enc.token_graph(torch.ones(1, 3, dtype=torch.bool))
        rise = _energy_mp(out.states[2][0], X[0], _pairs(graph)) - _energy_mp(Y1[0], X[0], _pairs(graph))
        assert rise > float(rep.tol[0, 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_false_alarm_grid_stays_at_zero(kernel, dtype):
    """A near-equal cluster (spread 1e-8) plus one far token, scales from 1 to past the guard's switch: real MM steps,
    none reported as an increase, while the recheck decides the steps its window holds."""
    for seed in range(2):
        for frac in (0.01, 0.5, 0.95, 1.3):
            g = torch.Generator().manual_seed(seed)
            X = torch.randn(1, 6, 3, dtype=torch.float64, generator=g) * 1e-8
            X[0, 0] = frac * SWITCH[dtype] * torch.randn(3, dtype=torch.float64, generator=g).sign() / math.sqrt(3)
            rep = _encoder(kernel, dtype, layers=6)(X.to(dtype), trace=True).report()
            assert rep.num_increases == 0, (seed, frac, rep.violations[:1])


def test_the_bounds_are_computed_when_read_from_the_forward_pass_alone():
    """Resolution and rounding bound are computed when a verdict first reads them (a forward nobody judges does not
    pay for them), from what the forward computed: an in-place optimiser-like update of the weights in between
    changes neither; a value set before the first read stays."""
    torch.manual_seed(1)
    enc = GuaranteedEncoder(d=4, heads=2, layers=3, rho="exp", tau=1.0).double()
    X = torch.randn(2, 5, 4, dtype=torch.float64)
    first, second = enc(X, trace=True).energies, enc(X, trace=True).energies
    assert first.__dict__["_bounds"] is not None                      # nothing computed yet
    res, err = first.resolution.clone(), first.error.clone()
    assert first.__dict__["_bounds"] is None and err.shape == res.shape == (2, 4) and (err > 0).all()
    with torch.no_grad():
        for p in enc.parameters():
            p.mul_(3.0)
    assert torch.equal(second.error, err) and torch.equal(second.resolution, res)
    third = enc(X, trace=True).energies
    third.error = None
    assert third.error is None and third.resolution is not None


@pytest.mark.parametrize("graph", ["complete", "window:2", "strided:2", "random:0.4"])
def test_the_recheck_evaluates_the_flagged_examples_alone_and_alike(graph):
    """``exact(t, rows)`` is ``exact(t)`` of those rows (their states, anchors and graph,
    [TokenGraph.select][energies.graphs.TokenGraph.select]), padded examples included, so that a recheck costs the
    flagged examples only."""
    torch.manual_seed(2)
    enc = GuaranteedEncoder(d=4, heads=2, layers=2, rho="exp", tau=1.0, graph=graph).double()
    X = torch.randn(5, 7, 4, dtype=torch.float64)
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    exact = enc(X, mask, trace=True).energies.exact
    rows = torch.tensor([3, 1])
    for t in range(3):
        whole, part = exact(t), exact(t, rows)
        for k in whole:
            torch.testing.assert_close(part[k], whole[k][rows], rtol=1e-13, atol=1e-13)
    g = enc.token_graph(mask)
    sub = g.select(rows)
    assert sub.batch_size == 2 and torch.equal(sub.mask, mask[rows])
    assert torch.equal(sub.degree(), g.degree()[rows])


def test_select_refuses_repeated_or_out_of_range_examples():
    g = E.graph_from_spec("random:0.5", 6, batch_size=4)
    for rows in ([1, 1], [0, 2, 2], [4], [-1]):
        with pytest.raises(E.GraphError, match="distinct"):
            g.select(torch.tensor(rows))
