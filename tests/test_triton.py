"""The Triton kernel family (energies.kernels.triton.pairwise): outputs, energies and gradients against the explicit float64
form for every rho, graph layout, padding pattern and dtype, run in Triton's interpreter on CPU tensors
(TRITON_INTERPRET=1, set by conftest.py without a GPU) and compiled on CUDA where there is one.

Tolerances follow the kernels' own rule: z from the expansion errs by at most ``EXPANSION_Z_ERROR[dtype]`` per unit
of ``rho'(0)``-relative weight (the precision guard), and the sums add up to ``n`` terms in the compute dtype, so

    |agg - agg_ref| <= (Z_ERROR + 8 n eps) * S,    S = sum_v rho'(0) |x_v - x_u| (largest over u),

and likewise for the degrees (``S = n rho'(0)``) and the energy (relative to ``sum_E tau |rho(z)|``, plus
``Z_ERROR`` times the energy's sensitivity ``sum_E gamma z``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")

import energies as E  # noqa: E402
from energies import kernels as P  # noqa: E402
from energies.rho import kernel_sensitivity  # noqa: E402
from energies.errors import EnergyError  # noqa: E402
from energies.kernels import EXPANSION_Z_ERROR, pairwise_pass  # noqa: E402
from energies.rho import ExpRho, Rho, get_rho, register_rho, RHOS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)

import triton.language as tl  # noqa: E402

from energies.kernels.triton import pairwise as TP  # noqa: E402

RHO_SPECS = ["exp", "relu:1.5", "softplus:1.5:0.5", "cauchy", "lp:1:0.001"]
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("graph", ["complete", "window:3", "strided:4", "star"])
@pytest.mark.parametrize("spec", RHO_SPECS)
def test_bfloat16_tokens_run_in_float32_and_come_back_in_bfloat16(spec, graph, padded):
    """bfloat16 tokens: the kernel computes z, the degrees and the energy in float32 (the half types' compute dtype),
    the aggregation product ``gamma @ x`` with bfloat16 operands (float32 accumulation), and returns agg and deg in
    bfloat16, the energy in float64. Rule: float32's rule of :func:`_check` for the float32 computation of the same
    (bfloat16-valued) tokens; plus, for agg, the operands' rounding, ``eps_bf16 / 2`` on gamma and on x (the
    tokens are bfloat16 values, but centred in float32) per term, at most ``eps_bf16 sum_v gamma_uv |x_v|_inf <=
    eps_bf16 max deg max |x|``; plus bfloat16's rounding of each output, ``eps_bf16 / 2`` of its largest value. The
    energy is not rounded to bfloat16 (float32's rule alone): a bfloat16 step never changes the certified energy."""
    B, n, d, tau = 2, 19, 3, 1.7
    Y, mask = _tokens(B, n, d, torch.bfloat16, padded, seed=hash((spec, graph, "bf16")) % 1000)
    g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho(spec)
    out = pairwise_pass(Y, g, rho, tau, "triton", energy=True)
    assert out.agg.dtype == out.deg.dtype == torch.bfloat16 and out.energy.dtype == torch.float64
    agg, deg, energy, scale, sens = _explicit(Y, g, rho, tau)
    half = torch.finfo(torch.bfloat16).eps / 2
    rel = EXPANSION_Z_ERROR[torch.float32] * max(1.0, kernel_sensitivity(rho)) + 8 * n * torch.finfo(torch.float32).eps
    ops = 2 * half * deg.abs().max() * 2 * Y.double().abs().max()      # centred |x| <= 2 max |y|
    assert (out.agg.double() - agg).abs().max() <= rel * float(scale) + ops + half * agg.abs().max() + 1e-300
    assert (out.deg.double() - deg).abs().max() <= rel * n * rho.max_derivative() + half * deg.abs().max()
    assert ((out.energy - energy).abs() <= rel * sens + n * n * tau_floor(torch.float32)).all()


GRAPHS = ["complete", "window:3", "strided:4", "star"]


def _explicit(Y, graph, rho, tau, metric=None):
    """The explicit float64 form from the dense adjacency (the kernel file's own :func:`TP.reference`):
    ``(agg, deg, energy)`` and the tolerance rule's scales ``(S_agg, sensitivity)``."""
    Y = graph.zero_padded(Y.double())
    X = Y if metric is None else Y @ metric.double()
    A = graph.pair_mask().to(Y.device)
    agg, deg, energy = (t[:, 0] for t in TP.reference(X[:, None], A, rho, tau))
    diff = X[:, None, :, :] - X[:, :, None, :]                   # [b, u, v] = x_v - x_u
    z = (diff * diff).sum(-1) / (2 * tau)
    zero = torch.zeros((), dtype=torch.float64, device=Y.device)
    gamma = torch.where(A, rho.derivative(z), zero)
    scale = torch.where(A, diff.norm(dim=-1), zero).sum(-1).amax() * rho.max_derivative()
    sens = 0.5 * tau * torch.where(A, rho.value(z).abs() + gamma * z, zero).sum((1, 2))
    return agg, deg, energy, scale, sens


def tau_floor(dtype):
    return torch.finfo(dtype).tiny


def _check(out, ref, graph, dtype, rho):
    """Assert the kernel's pass is within the rule of the module docstring of the explicit form."""
    agg, deg, energy, scale, sens = ref
    eps, n = torch.finfo(dtype).eps, graph.num_nodes
    rel = EXPANSION_Z_ERROR[dtype] * max(1.0, kernel_sensitivity(rho)) + 8 * n * eps
    assert torch.isfinite(out.agg).all() and torch.isfinite(out.deg).all() and torch.isfinite(out.energy).all()
    assert (out.agg.double() - agg).abs().max() <= rel * float(scale) + 1e-300
    assert (out.deg.double() - deg).abs().max() <= rel * n * rho.max_derivative()
    floor = n * n * tau_floor(dtype)          # values below the compute dtype's smallest normal flush to 0
    assert ((out.energy - energy).abs() <= rel * sens + floor).all()


def _tokens(B, n, d, dtype, padded, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    Y = (torch.randn(B, n, d, generator=g, dtype=torch.float64) * scale).to(dtype).to(DEVICE)
    mask = torch.ones(B, n, dtype=torch.bool)
    if padded:
        mask[0, n - 3:] = False
        mask[-1, :2] = False          # padding at the front too
    return Y, mask.to(DEVICE)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("spec", RHO_SPECS)
def test_pass_matches_the_explicit_float64_form(spec, graph, dtype, padded):
    # n = 19: not a multiple of the interpreter's 16-token blocks; d = 3: not a power of two
    B, n, d, tau = 2, 19, 3, 1.7
    Y, mask = _tokens(B, n, d, dtype, padded, seed=hash((spec, graph)) % 1000)
    g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho(spec)
    out = pairwise_pass(Y, g, rho, tau, "triton", energy=True)
    _check(out, _explicit(Y, g, rho, tau), g, dtype, rho)
    assert out.agg.dtype == dtype and out.deg.dtype == dtype and out.energy.dtype == torch.float64


@pytest.mark.parametrize("graph", ["dilated:2:3", "random:0.3", "window:40"])
def test_other_layouts_and_a_window_wider_than_the_sequence(graph):
    B, n, d, tau = 2, 21, 5, 0.9
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=3)
    g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho("exp")
    _check(pairwise_pass(Y, g, rho, tau, "triton", energy=True), _explicit(Y, g, rho, tau), g, torch.float64, rho)


@pytest.mark.parametrize("graph, n", [("strided:4", 42), ("strided:3", 24), ("dilated:3:20", 40), ("strided:5", 13)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_graphs_split_into_band_and_residue_classes(graph, n, dtype, monkeypatch):
    """A stride's multiples are the complete graph of each residue class: the kernel runs them as ``B k`` examples of
    ``ceil(n / k)`` tokens plus the band (n not a multiple of k, padded tokens at both ends). It equals the explicit
    float64 form, and its gradients pass gradcheck. Controls: the split is what ran (strided:5 at n = 13 is not
    cheaper split, and stays whole), and a split that forgets the band fails the comparison."""
    from energies.kernels import triton as TK
    from energies.kernels.triton.plan import residue_split

    B, d, tau = 2, 3, 1.1
    Y, mask = _tokens(B, n, d, dtype, True, seed=n)
    g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho("softplus:1.5:0.5")
    split = residue_split(g.offsets, n)
    assert (split is None) == (graph == "strided:5")
    calls = []
    real = TK._residue_heads
    monkeypatch.setattr(TK, "_residue_heads", lambda *a: calls.append(a[3]) or real(*a))
    out = pairwise_pass(Y, g, rho, tau, "triton", energy=True)
    assert calls == ([] if split is None else [split[1]])
    ref = _explicit(Y, g, rho, tau)
    _check(out, ref, g, dtype, rho)
    if split is None:
        return
    if dtype == torch.float64 and graph == "strided:3":      # one gradcheck (the interpreter is slow)
        W = torch.randn(d, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(DEVICE)

        def fn(Y, W):
            o = pairwise_pass(Y, g, rho, tau, "triton", energy=True, metric=W)
            return o.agg, o.deg, o.energy

        assert torch.autograd.gradcheck(fn, (Y.clone().requires_grad_(), W.requires_grad_()), eps=1e-6, atol=1e-7,
                                        fast_mode=True)
    if split[0]:                   # the negative control: without the band the pass is wrong
        monkeypatch.setattr(TK, "_residue_heads", lambda Z, m, band, k, *a: real(Z, m, (), k, *a))
        with pytest.raises(AssertionError):
            _check(pairwise_pass(Y, g, rho, tau, "triton", energy=True), ref, g, dtype, rho)


def test_a_mask_applied_on_the_device_keeps_the_edge_list_shape():
    """GraphCache masks a shift-invariant graph without compacting its edges (no host read); the kernels weigh
    each edge by the mask, and the result equals the graph built with the mask."""
    B, n, d = 3, 18, 4
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=5)
    from energies.graphs import GraphCache
    cached = GraphCache("window:2")(mask)
    built = E.window(n, 2, batch_size=B, mask=mask.cpu()).to(DEVICE)
    assert cached.fixed_edges()[2] is not None                   # not compacted
    rho = get_rho("cauchy")
    a = pairwise_pass(Y, cached, rho, 1.0, "triton", energy=True)
    b = pairwise_pass(Y, built, rho, 1.0, "edges", energy=True)
    c = pairwise_pass(Y, cached, rho, 1.0, "edges", energy=True)
    for x, y in ((a.agg, b.agg), (a.deg, b.deg), (a.energy, b.energy), (c.agg, b.agg), (c.energy, b.energy)):
        assert torch.allclose(x, y, rtol=1e-12, atol=1e-13)
    assert torch.equal(cached.degree(), built.degree())
    assert torch.equal(cached.pair_mask(), built.pair_mask())


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("spec", RHO_SPECS)
def test_gradients_pass_gradcheck_in_float64(spec, graph):
    """agg, deg and the energy, through the metric W too (padded tokens, n not a block multiple)."""
    B, n, d = 2, 6, 3
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=7)
    g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho(spec)
    W = torch.randn(d, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def fn(Y, W):
        out = pairwise_pass(Y, g, rho, 1.3, "triton", energy=True, metric=W)
        return out.agg, out.deg, out.energy

    assert torch.autograd.gradcheck(fn, (Y.requires_grad_(), W.requires_grad_()), eps=1e-6, atol=1e-7,
                                    fast_mode=True)


def test_float32_gradients_agree_with_the_edge_kernel():
    B, n, d = 2, 19, 3
    for graph in ("complete", "star"):
        Y, mask = _tokens(B, n, d, torch.float32, True, seed=11)
        g = E.graph_from_spec(graph, n, batch_size=B, mask=mask.cpu()).to(DEVICE)
        rho = get_rho("softplus:1.5:0.5")
        grads = []
        for kernel in ("triton", "edges"):
            Yk = Y.clone().requires_grad_()
            out = pairwise_pass(Yk, g, rho, 1.3, kernel, energy=True)
            (out.agg.square().sum() + out.deg.sum() + out.energy.sum()).backward()
            grads.append(Yk.grad)
        assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-4 * float(grads[1].abs().max()))


# ------------------------------------------------------------------------------------- the guard on the device
def test_the_guard_switches_to_explicit_differences_on_the_device(monkeypatch):
    """Tokens far from the origin, spread 1e4 apart at tau = 1: the expansion cannot resolve z in float32; the kernel
    decides so per example on the device and uses explicit differences. Negative control: with the guard forced to
    say 'expansion' the same pass is far off."""
    B, n, d, tau = 2, 17, 3, 1.0
    Y, mask = _tokens(B, n, d, torch.float32, True, seed=2, scale=1e4)
    near, _ = _tokens(B, n, d, torch.float32, False, seed=12)
    Y[:, 1::2] = Y[:, 0:n - 1:2] + near[:, 1::2]      # pairs at distance ~1, clusters 1e4 apart: z ~ 1 within a pair
    g = E.complete(n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    rho = get_rho("exp")
    ref = _explicit(Y, g, rho, tau)
    _check(pairwise_pass(Y, g, rho, tau, "triton", energy=True), ref, g, torch.float32, rho)
    monkeypatch.setattr(TP, "expansion_ok", lambda sq, *a: torch.ones(sq.shape[:-1], dtype=torch.bool, device=sq.device))
    with pytest.raises(AssertionError):
        _check(pairwise_pass(Y, g, rho, tau, "triton", energy=True), ref, g, torch.float32, rho)


# ------------------------------------------------------------------------------------- negative control, plug-ins
@triton.jit
def _wrong_derivative(z, p0, p1, p2, p3):
    return tl.exp(-1.02 * z)          # 2 % off in the exponent: a wrong kernel


class _WrongExp(ExpRho):
    def triton(self):
        value, _, second, params = TP.rho_functions(ExpRho())     # the built-in's functions, resolved by name
        return value, _wrong_derivative, second, params


def test_a_deliberately_wrong_kernel_fails_the_comparison():
    B, n, d = 2, 19, 3
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=4)
    g = E.complete(n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    ref = _explicit(Y, g, get_rho("exp"), 1.0)
    with pytest.raises(AssertionError):
        _check(pairwise_pass(Y, g, _WrongExp(), 1.0, "triton", energy=True), ref, g, torch.float64, get_rho("exp"))


@triton.jit
def _sqrt_value(z, p0, p1, p2, p3):
    return 2.0 * z / (tl.sqrt(1.0 + z) + 1.0)


@triton.jit
def _sqrt_derivative(z, p0, p1, p2, p3):
    return 1.0 / tl.sqrt(1.0 + z)


@triton.jit
def _sqrt_second(z, p0, p1, p2, p3):
    r = 1.0 / tl.sqrt(1.0 + z)
    return -0.5 * r * r * r


def test_a_registered_rho_with_its_triton_functions_runs_in_the_kernel():
    """A penalty of one's own (rho(z) = 2 sqrt(1 + z) - 2): its torch value/derivative for every other kernel, its
    Triton triple for this one; outputs and gradients agree with the explicit form."""
    @register_rho("sqrt_test")
    class SqrtRho(Rho):
        def value(self, z):
            return 2.0 * z / (torch.sqrt(1.0 + z) + 1.0)      # 2 sqrt(1 + z) - 2 without cancellation

        def derivative(self, z):
            return 1.0 / torch.sqrt(1.0 + z)

        def triton(self):
            return _sqrt_value, _sqrt_derivative, _sqrt_second, ()

    try:
        rho = get_rho("sqrt_test")
        for graph in ("window:2", "random:0.4"):
            Y, mask = _tokens(2, 19, 3, torch.float64, True, seed=8)
            g = E.graph_from_spec(graph, 19, batch_size=2, mask=mask.cpu()).to(DEVICE)
            _check(pairwise_pass(Y, g, rho, 1.0, "triton", energy=True), _explicit(Y, g, rho, 1.0), g,
                   torch.float64, rho)
        Ys = Y[:, :6].clone().requires_grad_()
        gs = E.complete(6, batch_size=2).to(DEVICE)
        assert torch.autograd.gradcheck(lambda X: pairwise_pass(X, gs, rho, 1.0, "triton", energy=True)[:3:2],
                                        (Ys,), fast_mode=True)
    finally:
        RHOS.pop("sqrt_test", None)


def test_a_rho_without_triton_functions_is_declined_with_a_reason():
    class Plain(Rho):
        def value(self, z):
            return torch.log1p(z)

        def derivative(self, z):
            return 1.0 / (1.0 + z)

    g = E.complete(4).to(DEVICE)
    with pytest.raises(EnergyError, match="Triton functions"):
        P.pick_kernel(g, Plain(), "triton")


# ------------------------------------------------------------------------------------- layouts, heads, models
@pytest.mark.parametrize("offsets", [(1, 2, 3), (5,), (1, 16, 17, 40), (3, 6, 9, 12, 15, 18, 21, 24, 27, 30)])
def test_the_block_table_visits_every_tile_holding_an_edge(offsets):
    n, bm, bn = 77, 16, 16
    ptr, idx = TP.block_table(n, bm, bn, offsets, "cpu")
    visited = {(q, int(k)) for q in range(len(ptr) - 1) for k in idx[ptr[q]:ptr[q + 1]]}
    need = {(i // bm, j // bn) for i in range(n) for j in range(n) if abs(i - j) in offsets}
    assert need <= visited
    # and no more than the tiles an offset reaches (a banded graph does not scan the whole row)
    assert len(visited) == len(need)


def test_heads_share_one_launch_and_equal_one_launch_per_head():
    B, n, d = 2, 19, 6
    Y, mask = _tokens(B, n, d, torch.float64, True, seed=9)
    g = E.window(n, 4, batch_size=B, mask=mask.cpu()).to(DEVICE)
    Ws = [torch.randn(d, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(h)).to(DEVICE)
          for h in range(3)]
    rho = get_rho("relu:1.5")
    joint = P.pairwise_pass_heads(Y, g, rho, 1.2, "triton", Ws, energy=True, num=True)
    assert joint is not None
    for W, out in zip(Ws, joint):
        one = pairwise_pass(Y, g, rho, 1.2, "triton", energy=True, metric=W)
        assert torch.allclose(out.agg, one.agg, rtol=1e-13, atol=1e-14)
        assert torch.allclose(out.energy, one.energy, rtol=1e-13)


@pytest.mark.parametrize("graph", ["complete", "window:3", "star"])
def test_one_launch_over_heads_equals_the_files_plain_torch_reference(graph):
    """:func:`TP.pairwise_heads` against :func:`TP.reference` (the top of the kernel's file) on 3 heads, float64,
    by the module docstring's rule; a reference fed one head's features shuffled is caught (negative control)."""
    B, H, n, D, tau = 2, 3, 19, 4, 1.3
    g = E.graph_from_spec(graph, n, batch_size=B, mask=_tokens(B, n, 1, torch.float64, True)[1].cpu()).to(DEVICE)
    Z = g.zero_padded(torch.randn(B, n, H * D, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
                      .to(DEVICE)).unflatten(-1, (H, D)).transpose(1, 2)
    Z = Z - Z.sum(2, keepdim=True) / g.mask.sum(-1)[:, None, None, None]          # centred, as the kernel receives
    Z = Z * g.mask[:, None, :, None]
    rho = get_rho("cauchy")
    agg, deg, e = TP.pairwise_heads(Z, g.mask, TP.layout_for(g, D, Z.dtype), rho, tau, True, True,
                                    kernel_sensitivity(rho))
    ragg, rdeg, re = TP.reference(Z, g.pair_mask(), rho, tau)
    rel = EXPANSION_Z_ERROR[torch.float64] * max(1.0, kernel_sensitivity(rho)) + 8 * n * torch.finfo(torch.float64).eps
    S = rho.max_derivative() * (Z[:, :, None] - Z[:, :, :, None]).norm(dim=-1).sum(-1).amax()
    assert (agg - ragg).abs().max() <= rel * S
    assert (deg - rdeg).abs().max() <= rel * n * rho.max_derivative()
    z = ((Z[:, :, None] - Z[:, :, :, None]) ** 2).sum(-1) / (2 * tau)
    A = g.pair_mask()[:, None]
    sens = 0.5 * tau * torch.where(A, rho.value(z).abs() + rho.derivative(z) * z, 0.0).sum((2, 3))
    assert ((e - re).abs() <= rel * sens).all()            # relative to sum_E tau (|rho(z)| + gamma z)
    wrong = TP.reference(Z[:, :, torch.randperm(n, generator=torch.Generator().manual_seed(1))], g.pair_mask(), rho, tau)
    assert (agg - wrong[0]).abs().max() > rel * S


@pytest.mark.parametrize("graph", ["complete", "window:3", "star"])
def test_guaranteed_encoder_on_the_triton_kernel_descends_and_equals_the_edge_kernel(graph):
    from unfold.encoders import GuaranteedEncoder

    X, mask = _tokens(2, 13 if graph != "star" else 6, 8, torch.float64, True, seed=10)
    encs = []
    for kernel in ("triton", "edges"):
        torch.manual_seed(0)
        encs.append(GuaranteedEncoder(d=8, heads=2, layers=3, graph=graph, rho="softplus:2:0.5", kernel=kernel)
                    .double().to(DEVICE))
    a, b = (enc(X, mask, trace=True) for enc in encs)
    assert torch.allclose(a.Y, b.Y, rtol=1e-11, atol=1e-12)
    for k in a.energies:
        assert torch.allclose(a.energies[k], b.energies[k], rtol=1e-11, atol=1e-11)
    rep = a.report()
    assert rep.verdict == "descent" and rep.num_increases == 0
    a.Y.sum().backward()
    b.Y.sum().backward()
    for pa, pb in zip(encs[0].parameters(), encs[1].parameters()):
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------- CLI
def _check_cli(kernel, extra_env=None, *args):
    env = dict(os.environ, **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "unfold.check", "--kernel", kernel, *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter CLI case")
def test_unfold_check_with_the_triton_kernel_reports_the_edge_kernel_energies():
    args = ("--rho", "softplus:2:0.5", "--graph", "star", "--dtype", "float64", "--samples", "1", "--n", "7",
            "--d", "3", "--layers", "2", "--json")
    runs = [_check_cli(k, {"TRITON_INTERPRET": "1"}, *args) for k in ("triton", "edges")]
    a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert a["verdict"] == "descent" and a["increases"] == 0
    for ea, eb in zip(a["energies"], b["energies"]):
        for x, y in zip(ea, eb):
            assert abs(x - y) <= 1e-12 * abs(y)


@pytest.mark.skipif(DEVICE != "cpu", reason="the message for CPU tensors without the interpreter")
def test_unfold_check_says_what_to_set_without_the_interpreter():
    r = _check_cli("triton", {"TRITON_INTERPRET": "0"}, "--samples", "1", "--n", "4", "--layers", "1")
    assert r.returncode == 2
    assert "TRITON_INTERPRET=1" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------- CUDA, compiled
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("graph", ["complete", "window:8", "star"])
def test_compiled_kernels_on_cuda_at_several_block_counts(graph):
    assert not TP.INTERPRETED
    for n in (100, 257):
        Y, mask = _tokens(2, n, 64, torch.float32, True, seed=n)
        g = E.graph_from_spec(graph, n, batch_size=2, mask=mask.cpu()).to("cuda")
        rho = get_rho("exp")
        _check(pairwise_pass(Y, g, rho, 8.0, "triton", energy=True), _explicit(Y, g, rho, 8.0), g, torch.float32, rho)
    assert P.pick_kernel(g, rho, "auto") == "triton"


def test_the_triton_kernel_compiles_in_one_graph_from_a_cold_cache():
    """The custom ops are opaque to dynamo and the layouts are constants to it: the guaranteed encoder with the trace
    on compiles with fullgraph=True (no graph break) and returns what eager returns."""
    import torch._dynamo as dynamo

    from unfold.encoders import GuaranteedEncoder

    TP._LAYOUTS.clear()
    TP._RHO_FNS.clear()          # cold: the penalty is found from its spec while dynamo traces (_rho_params)
    TP._RHO_PARAMS.clear()
    dynamo.reset()
    torch.manual_seed(0)
    enc = GuaranteedEncoder(d=8, heads=2, layers=2, kernel="triton").to(DEVICE)
    X, mask = _tokens(2, 9, 8, torch.float32, True, seed=13)
    X = X.relu()
    out = torch.compile(lambda X, m: enc(X, m, trace=True), backend="aot_eager", fullgraph=True)(X, mask)
    assert TP._RHO_PARAMS, "the compiled call registered the penalty"
    ref = enc(X, mask, trace=True)
    assert torch.allclose(out.Y, ref.Y, rtol=1e-6, atol=1e-6)
    for k in ref.energies:
        assert torch.allclose(out.energies[k], ref.energies[k], rtol=1e-6, atol=1e-6)
    assert out.report().verdict == "descent"
    dynamo.reset()


def test_the_half_precision_step_rounds_only_the_aggregation_operands():
    """``lowp`` (a bfloat16 step): agg and its gradient move by bfloat16's rounding of the product's operands (more
    than float32's rule: the switch is live), while the degrees and the energy are the same numbers bit for bit."""
    from energies.kernels.triton.pairwise import layout_for, pairwise_heads
    B, n, d, tau = 2, 37, 8, 1.3
    Y, mask = _tokens(B, n, d, torch.float32, True, seed=5)
    g = E.graph_from_spec("complete", n, batch_size=B, mask=mask.cpu()).to(DEVICE)
    Z = (g.zero_padded(Y) - 0.0)[:, None].contiguous().requires_grad_()
    rho = get_rho("cauchy")
    outs = []
    for lowp in (False, True):
        agg, deg, e = pairwise_heads(Z, g.mask, layout_for(g, d, torch.float32), rho, tau, True, True, 1.0, lowp)
        (gz,) = torch.autograd.grad((agg * torch.cos(agg.detach())).sum() + e.sum(), Z)
        outs.append((agg.detach(), deg.detach(), e.detach(), gz))
    (a0, d0, e0, g0), (a1, d1, e1, g1) = outs
    assert torch.equal(d0, d1) and torch.equal(e0, e1)
    diff = (a1 - a0).abs().max().item()
    bound = torch.finfo(torch.bfloat16).eps * d0.abs().max().item() * Z.detach().abs().max().item()
    assert 64 * torch.finfo(torch.float32).eps * a0.abs().max().item() < diff <= bound
    assert 0 < (g1 - g0).abs().max().item() <= 0.05 * g0.abs().max().item()
