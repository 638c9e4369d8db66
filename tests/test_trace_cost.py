"""The cheaper trace: each shortcut checked against a high-precision or independent reference, each
with a control showing that the check can fail.

* ``_f64_sum``: one float32 cascade reduction per example instead of per-token sums and a float64 sweep; its error
  against an exactly rounded sum (``math.fsum``; ``mpmath`` on a small case) stays below 4 eps sum|x|.
* the energy-only pass of the softmax kernels (``softmax_degrees``: symmetric blocks, diagonal left out) against
  the explicit float64 sums, with padding, odd block splits, float32 and gradients;
* the bitwise padding masks of ``TokenGraph`` against ``torch.where``, bit for bit, NaN and inf included.
"""
import math

import mpmath
import numpy as np
import pytest
import torch

from energies.graphs import TokenGraph
from energies.graphs.container import mask_bits
from energies.kernels.lse import softmax_degrees
from energies.kernels import pairwise_energy, pairwise_pass
from energies.rho import get_rho
from energies.terms import NonNegativity, _f64_sum
from unfold.model import UnfoldedTransformer

EPS32 = torch.finfo(torch.float32).eps


def _fsum_rows(x: torch.Tensor):
    """Exactly rounded per-example sums (math.fsum of the float64 values, which are x's exactly)."""
    flat = x.double().reshape(x.shape[0], -1)
    return [math.fsum(r.tolist()) for r in flat], [math.fsum(r.abs().tolist()) for r in flat]


@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 513, 64), (1, 16384, 64)])
@pytest.mark.parametrize("kind", ["squares", "products"])
def test_one_reduction_sum_is_within_4_eps_of_the_exact_sum(shape, kind):
    gen = torch.Generator().manual_seed(sum(shape))
    X = torch.randn(shape, generator=gen) * torch.rand(shape[0], 1, 1, generator=gen) * 50 + 3.0
    Z = torch.randn(shape, generator=gen)
    x = X * X if kind == "squares" else X * Z           # the residual's R*R, the feed-forward's G*Y
    got = _f64_sum(x)
    assert got.dtype == torch.float64
    exact, scale = _fsum_rows(x)
    for g, e, s in zip(got.tolist(), exact, scale):
        assert abs(g - e) <= 4 * EPS32 * s, (g, e, s)


def test_one_reduction_sum_bound_is_not_vacuous():
    """Control: a sequential float32 running sum (numpy's float32 accumulate) of the same terms breaks the 4 eps
    bound, so the test above would catch a summation that is not cascaded."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(1, 1 << 20, generator=gen) + 1.0)
    seq = float(np.add.accumulate(x[0].numpy(), dtype=np.float32)[-1])
    exact, scale = _fsum_rows(x)
    assert abs(seq - exact[0]) > 4 * EPS32 * scale[0]
    assert abs(float(_f64_sum(x[..., None])) - exact[0]) <= 4 * EPS32 * scale[0]


def test_one_reduction_sum_matches_mpmath_and_keeps_float64():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 40, 6, dtype=torch.float64, generator=gen) * 1e3
    ref = [mpmath.fsum(mpmath.mpf(v) for v in r) for r in x.reshape(2, -1).tolist()]
    got = _f64_sum(x)
    for g, r in zip(got.tolist(), ref):
        assert abs(mpmath.mpf(g) - r) <= 4 * torch.finfo(torch.float64).eps * float(x.abs().sum() / 2)
    half = _f64_sum(torch.ones(2, 3, 4, dtype=torch.bfloat16))   # half types accumulate in float32
    assert half.tolist() == [12.0, 12.0]


def _explicit_degrees(Y, mask, tau):
    """sum over real v != u of exp(-|y_u - y_v|^2 / 2 tau), float64, explicit differences."""
    Y = Y.double()
    z = ((Y[:, :, None] - Y[:, None]) ** 2).sum(-1) / (2 * tau)
    eye = torch.eye(Y.shape[1], dtype=torch.bool)
    keep = mask[:, :, None] & mask[:, None, :] & ~eye
    return torch.where(keep, torch.exp(-z), torch.zeros(())).sum(-1)


@pytest.mark.parametrize("B,n,d", [(3, 5, 4), (2, 130, 8), (1, 700, 3)])
def test_energy_only_degrees_equal_explicit_sums(B, n, d):
    gen = torch.Generator().manual_seed(n)
    Y = torch.randn(B, n, d, dtype=torch.float64, generator=gen)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[0, n // 2:] = False
    g = TokenGraph(B, n, mask)
    tau = math.sqrt(d)
    Yc = g.zero_padded(Y - (Y * mask[..., None]).sum(1, keepdim=True) / mask.sum(1)[:, None, None])
    got = softmax_degrees(Yc, g.mask, tau)
    ref = _explicit_degrees(Yc, mask, tau)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-14)
    assert torch.all(got[~mask] == 0)
    # the energy-only pass and the full (flash) pass give the same energy, and both the pairwise energy
    e_only = pairwise_pass(Y, g, get_rho("exp"), tau, "fused", energy=True, num=False)
    e_full = pairwise_pass(Y, g, get_rho("exp"), tau, "fused", energy=True, num=True)
    e_ref = pairwise_energy(Y, g, get_rho("exp"), tau)
    assert torch.allclose(e_only.energy, e_ref, rtol=1e-12) and torch.allclose(e_full.energy, e_ref, rtol=1e-12)
    assert torch.allclose(e_only.deg, e_full.deg, rtol=1e-10, atol=1e-13)


def test_energy_only_degrees_float32_and_small_degrees():
    """float32: relative error of each degree a few eps even where deg << 1 (no exp(LSE) - 1 cancellation)."""
    gen = torch.Generator().manual_seed(5)
    Y = torch.randn(2, 300, 16, generator=gen) * 3.0           # far apart: degrees ~1e-3 .. 1e-1
    g = TokenGraph(2, 300, None)
    Yc = Y - Y.mean(1, keepdim=True)
    got = softmax_degrees(Yc, g.mask, 4.0).double()
    ref = _explicit_degrees(Yc, g.mask, 4.0)
    assert float(ref.min()) < 1e-2
    rel = ((got - ref).abs() / ref).max()
    # the logits err by about eps |y|^2 / tau in the expansion (the kernels' guard bounds this); here |y|^2/tau ~ 40
    assert rel < 64 * 40 * EPS32, float(rel)
    # control: the same degrees read off a float32 log-sum-exp (exp(LSE) - 1) are far less accurate
    full = pairwise_pass(Yc, g, get_rho("exp"), 4.0, "fused", energy=False, num=True).deg.double()
    assert ((full - ref).abs() / ref).max() > 4 * rel


def test_energy_only_degrees_gradient():
    gen = torch.Generator().manual_seed(1)
    Y = torch.randn(2, 90, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    mask = torch.ones(2, 90, dtype=torch.bool)
    mask[1, 60:] = False
    g = TokenGraph(2, 90, mask)
    assert torch.autograd.gradcheck(lambda y: softmax_degrees(g.zero_padded(y), g.mask, 1.5), (Y,))
    got = torch.autograd.grad(softmax_degrees(g.zero_padded(Y), g.mask, 1.5).sum(), Y)[0]
    ref = torch.autograd.grad(_explicit_degrees(g.zero_padded(Y), mask, 1.5).sum(), Y)[0]
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_bitwise_padding_masks_equal_where_bit_for_bit(dtype):
    mask = torch.tensor([[True, True, False, False], [True, False, True, False]])
    g = TokenGraph(2, 4, mask)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, generator=gen).to(dtype)
    old = torch.randn(2, 4, 3, generator=gen).to(dtype)
    x[0, 2, 0], x[0, 3, 1], x[1, 1, 2], x[0, 0, 0], x[1, 2, 1] = math.nan, math.inf, -math.inf, math.nan, -0.0
    old[0, 2, 1] = math.nan
    zero = torch.zeros((), dtype=dtype)
    for got, ref in ((g.zero_padded(x), torch.where(mask[..., None], x, zero)),
                     (g.keep_padded(x, old), torch.where(mask[..., None], x, old))):
        assert torch.equal(got.view(torch.int16 if dtype.itemsize == 2 else
                                    torch.int32 if dtype.itemsize == 4 else torch.int64),
                           ref.view(torch.int16 if dtype.itemsize == 2 else
                                    torch.int32 if dtype.itemsize == 4 else torch.int64))
    # control: multiplying by the mask, the shortcut these replace, lets NaN/inf through on padded slots
    assert torch.isnan((x * mask[..., None].to(dtype))[0, 2, 0])
    assert not torch.isnan(g.zero_padded(x)[0, 2, 0])


def test_bitwise_masks_gradients_and_other_dtypes():
    mask = torch.tensor([[True, False, True]])
    g = TokenGraph(1, 3, mask)
    x = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    o = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: g.zero_padded(a) ** 2, (x,))
    assert torch.autograd.gradgradcheck(lambda a: g.zero_padded(a) ** 3, (x,))
    assert torch.autograd.gradcheck(lambda a, b: g.keep_padded(a, b) ** 2, (x, o))
    ints = torch.arange(6).reshape(1, 3, 2)
    assert g.zero_padded(ints).tolist() == [[[0, 1], [0, 0], [4, 5]]]           # integers: torch.where
    assert g.zero_padded(ints[..., 0]).tolist() == [[0, 0, 4]]                   # (B, n) tensors too
    assert torch.equal(mask_bits(torch.tensor([math.nan, 2.0]), torch.tensor([0, -1], dtype=torch.int32)),
                       torch.tensor([0.0, 2.0]))
    # the cached bits follow the mask when it is changed in place, and a graph moved or re-masked gets its own
    y = torch.ones(1, 3, 2)
    assert g.zero_padded(y)[0, :, 0].tolist() == [1, 0, 1]
    g.mask[0, 1] = True
    assert g.zero_padded(y)[0, :, 0].tolist() == [1, 1, 1]
    h = g.with_mask(torch.tensor([[False, True, True]]))
    assert h.zero_padded(y)[0, :, 0].tolist() == [0, 1, 1] and g.zero_padded(y)[0, :, 0].tolist() == [1, 1, 1]


def test_nonnegativity_value_reads_real_slots_only():
    mask = torch.tensor([[True, True, False], [True, True, True]])
    g = TokenGraph(2, 3, mask)
    Y = torch.ones(2, 3, 4)
    Y[0, 2, 1] = -5.0                                  # padded: ignored
    assert NonNegativity().value(Y, g).tolist() == [0.0, 0.0]
    Y[1, 0, 3] = -1e-30                                # real: infeasible
    assert NonNegativity().value(Y, g).tolist() == [0.0, math.inf]


def test_trace_values_equal_the_independent_float64_evaluation():
    """The traced per-term energies (one-reduction sums, energy-only final pass) equal each term's independent
    float64 ``value`` at the kept states to within the trace's own tolerance rule, for a padded batch."""
    torch.manual_seed(0)
    model = UnfoldedTransformer(300, 2, d=16, heads=2, layers=3).eval()
    ids = torch.randint(1, 300, (4, 50))
    mask = torch.arange(50)[None] < torch.tensor([50, 31, 7, 44])[:, None]
    with torch.no_grad():
        out = model(ids * mask, mask, trace=True, keep_states=True)
        X, _ = out.inputs
        energy = model.encoder.energy(X)
        graph = model.encoder.token_graph(mask)
        for t, Y in enumerate(out.states):
            scale = sum(float(out.energies[k][:, t].abs().max()) for k in out.energies)
            for name, term in energy.terms.items():
                ref = term.value(Y, graph)
                got = out.energies[name][:, t]
                assert torch.allclose(got, ref, rtol=0, atol=64 * EPS32 * scale), (t, name)
    assert out.report().verdict == "descent"


def test_bitwise_masks_forward_mode_vmap_and_compile():
    """Forward-mode derivatives (torch.func.jvp / jacfwd, dual tensors) and vmap pass through the masks like
    torch.where; a compiled function gets the same gradient as eager."""
    import torch.autograd.forward_ad as fwAD

    mask = torch.tensor([[True, False, True]])
    g = TokenGraph(1, 3, mask)
    x = torch.randn(1, 3, 2, dtype=torch.float64)
    ref = torch.func.jacfwd(lambda a: torch.where(mask[..., None], a, 0.0))(x)
    assert torch.equal(torch.func.jacfwd(g.zero_padded)(x), ref)
    assert torch.equal(torch.func.jacrev(g.zero_padded)(x), ref)
    t = torch.ones_like(x)
    assert torch.func.jvp(lambda a: g.keep_padded(2 * a, a), (x,), (t,))[1][0, :, 0].tolist() == [2.0, 1.0, 2.0]
    with fwAD.dual_level():
        assert fwAD.unpack_dual(g.zero_padded(fwAD.make_dual(x, t))).tangent[0, :, 0].tolist() == [1.0, 0.0, 1.0]
    assert torch.vmap(lambda a: g.zero_padded(a[None])[0])(torch.ones(4, 3, 2)).sum().item() == 16.0
    from torch import _dynamo
    _dynamo.reset()
    f = torch.compile(lambda a: g.zero_padded(a) * 2, fullgraph=True, backend="eager")
    xr = x.clone().requires_grad_()
    f(xr).sum().backward()
    assert xr.grad[0, :, 0].tolist() == [2.0, 0.0, 2.0]


def test_bit_cache_follows_replaced_masks_inference_mode_and_numpy():
    g = TokenGraph(1, 4, torch.tensor([[True, True, True, True]]))
    ones = torch.ones(1, 4, 1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):                                    # a new mask object each time (addresses get reused)
        m = torch.rand(1, 4, generator=gen) > 0.5
        g.mask = m
        assert torch.equal(g.zero_padded(ones)[0, :, 0], m[0].float())
    with torch.inference_mode():                            # inference tensors have no version counter
        gi = TokenGraph(1, 4, torch.tensor([[True, False, True, False]]))
        assert gi.zero_padded(ones)[0, :, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    arr = np.array([[True, False, True, True]])
    gn = TokenGraph(1, 4, arr)
    arr[0, 1] = True                                        # a numpy mask is copied: later writes do not leak in
    assert gn.zero_padded(ones)[0, :, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert gn.mask[0].tolist() == [True, False, True, True]


def test_spare_column_gets_no_gradient():
    from energies.kernels.fused_ops import fused_attention

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.nn.functional.pad(torch.randn(1, 1, 9, 3, dtype=torch.float64, generator=gen), (0, 1))
               .requires_grad_() for _ in range(3))
    o, lse = fused_attention(q, k, v, 0.5, spare=True)
    grads = torch.autograd.grad(o.sum() + lse.sum(), (q, k, v))
    assert all(float(t[..., -1].abs().max()) == 0.0 for t in grads)


def test_nonnegativity_with_a_nan_token_and_a_negative_token():
    g = TokenGraph(1, 3, None)
    Y = torch.ones(1, 3, 2)
    Y[0, 0, 0], Y[0, 2, 1] = math.nan, -1.0
    assert NonNegativity().value(Y, g).tolist() == [math.inf]


def test_one_reduction_sum_in_chunks_beyond_2_22_elements():
    from energies import terms

    gen = torch.Generator().manual_seed(9)
    x = torch.rand(1, 3 * 1024, 1024, generator=gen) + 0.5      # 3 x 2^20 elements
    old = terms.SUM_CHUNK
    try:
        terms.SUM_CHUNK = 1 << 20                               # force the chunked path on a small case
        chunked = float(_f64_sum(x))
    finally:
        terms.SUM_CHUNK = old
    exact, scale = _fsum_rows(x)
    assert abs(chunked - exact[0]) <= 4 * EPS32 * scale[0]
    assert abs(float(_f64_sum(x)) - exact[0]) <= 4 * EPS32 * scale[0]


# ----------------------------------------------------------------- heads in one kernel call
def _guaranteed(dtype, heads=2, **kw):
    from unfold.encoders import GuaranteedEncoder

    torch.manual_seed(0)
    return GuaranteedEncoder(d=12, heads=heads, layers=3, **kw).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_heads_in_one_call_equal_each_head_alone(dtype, monkeypatch):
    """The MM step and the trace with the heads in one kernel call (PairwiseAttention.joint_mm /
    joint_pass_values) equal those with one call per head: output, per-term energies, resolution and the
    gradients of the weights and the input; float64 to 1e-12 relative, float32 to a few eps."""
    from energies.terms import PairwiseAttention

    gen = torch.Generator().manual_seed(1)
    X = torch.randn(3, 20, 12, dtype=dtype, generator=gen)
    mask = torch.arange(20)[None] < torch.tensor([20, 13, 4])[:, None]
    results = []
    for joint in (True, False):
        enc = _guaranteed(dtype)
        if not joint:
            monkeypatch.setattr(PairwiseAttention, "joint_mm", staticmethod(lambda *a, **k: None))
            monkeypatch.setattr(PairwiseAttention, "joint_pass_values", staticmethod(lambda *a, **k: None))
        Xr = X.clone().requires_grad_()
        out = enc(Xr, mask, trace=True)
        grads = torch.autograd.grad((out.Y ** 2).sum(), [Xr, enc.W, enc.A])
        results.append([out.Y, *out.energies.values(), out.energies.resolution, *grads])
        monkeypatch.undo()
    rtol = 1e-12 if dtype == torch.float64 else 64 * EPS32
    for a, b in zip(*results):
        a, b = a.detach(), b.detach()
        assert torch.allclose(a, b.to(a.dtype), rtol=rtol, atol=rtol * float(b.abs().max())), (a, b)


def test_heads_in_one_call_are_used_and_declined_where_they_cannot_share(monkeypatch):
    """The joint path runs for the default heads (one flash call for both), and declines (each head its own
    pass) when the scale guard asks for a wider dtype: there the result equals the per-head float64 path."""
    import energies.kernels.fused_ops as fused
    from energies.terms import PairwiseAttention

    calls = []
    real = fused._FusedAttention.apply
    monkeypatch.setattr(fused._FusedAttention, "apply", lambda *a: calls.append(a[0].shape) or real(*a))
    enc = _guaranteed(torch.float32)
    X = torch.randn(2, 9, 12)
    enc(X, None)
    assert calls and all(s[1] == 2 for s in calls)                  # (B, H = 2, n, c): both heads in each call
    calls.clear()
    big = X * 30.0                     # max |z|^2 / tau beyond float32 budget (512), within float64 (4e6)
    out = enc(big, None, trace=True)
    assert calls and all(s[1] == 1 for s in calls)                  # the guard declined the joint call
    monkeypatch.setattr(PairwiseAttention, "joint_mm", staticmethod(lambda *a, **k: None))
    ref = enc(big, None, trace=True)
    assert torch.equal(out.Y, ref.Y)
