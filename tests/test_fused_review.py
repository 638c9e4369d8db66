"""Review of rho = exp through torch's fused attention on CUDA: cases the first tests missed, each checked where it can
be without a GPU (the compact layout through the CPU op with the CUDA head multiple; the CUDA ops' dispatch through
their meta kernels)."""
from __future__ import annotations

import pytest
import torch

import energies as E
import energies.kernels.fused_ops as F
from energies.kernels.fused_ops import CPU_OPS
from energies.kernels.dispatch import _explicit_pass, _guarded_on_device
from energies.kernels.guard import centred
from energies.kernels.registry import KERNELS
from energies.kernels.lse import fused_parts

#: the CPU flash op with the CUDA ops' layout (head size rounded up to 8, values apart)
CPU_COMPACT = CPU_OPS._replace(name="cpu-flash-compact", head_multiple=8)


@pytest.mark.parametrize("ops", [CPU_OPS, CPU_COMPACT], ids=lambda o: o.name)
def test_the_guard_on_the_device_keeps_a_refused_examples_gradient_finite(ops, monkeypatch):
    """Off the CPU the guard runs the fast pass on every example and keeps the exact pass's values where the rule
    refuses one (``torch.where``). At a scale the expansion cannot resolve, the compact layout's
    ``LSE - |z|^2 / 2 tau`` (two numbers near 5e11 in float32) leaves log(1 + deg) at ~1e4: exp overflows, and
    the where's zero gradient times inf made the refused example's gradient NaN, which a shared weight would
    then carry to every example. The refused example's gradient must be the exact pass's, the other's the fast
    pass's."""
    import energies.kernels.lse as S
    monkeypatch.setattr(S, "fused_ops", lambda device_type, dtype: ops)
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(2, 9, 4, dtype=torch.float64, generator=gen)
    base[1] *= 1e6                                            # |z|^2 / tau ~ 1e12: far past float32's bound 512
    g = E.complete(9, 2, E.mask_from_lengths([9, 6], 9))
    r = E.get_rho("exp")

    def grads(run):
        Y = base.float().requires_grad_()
        out = run(g.zero_padded(Y))
        w = torch.linspace(-1, 1, out.agg.numel()).view_as(out.agg)
        (gy,) = torch.autograd.grad((out.agg * w).sum() + out.deg.sum() + out.energy.sum(), Y)
        return gy

    def guarded(Y):
        Zc = centred(Y, g)
        return _guarded_on_device(KERNELS["fused"], Y, Zc, (Zc * Zc).sum(-1), g, r, 1.0, True, True, None)

    got = grads(guarded)
    assert torch.isfinite(got).all()
    exact = grads(lambda Y: _explicit_pass(Y, centred(Y, g), g, r, 1.0, True, True, None))
    fast = grads(lambda Y: KERNELS["fused"].run(centred(Y, g), g, r, 1.0, True, True, None))
    assert torch.equal(got[1], exact[1])
    assert torch.allclose(got[0], fast[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c, op", [(255, "flash"), (256, "efficient"), (300, "efficient")])
def test_bfloat16_heads_flash_cannot_take_go_to_the_memory_efficient_op(c, op, aten_calls):
    """FlashAttention-2 refuses head sizes above 256 (``flash_api.cpp``, ``mha_fwd``: ``TORCH_CHECK(head_size_og <=
    256, "FlashAttention forward only supports head dimension at most 256")``, and ``mha_bwd`` likewise); its meta
    kernel does not check it, so the probe (head size 8) passes and bfloat16 features of c >= 256 (compact head
    c + 1 > 256: a single head of d >= 256) would stop with that error on the GPU. The memory-efficient op (also
    a bfloat16 candidate) has no such limit: those heads go there, forward and backward; c = 255 (head 256)
    stays on flash."""
    called = aten_calls
    mask = torch.ones(2, 37, dtype=torch.bool, device="meta")
    Z = torch.randn(2, 1, 37, c, dtype=torch.bfloat16, device="meta", requires_grad=True)
    diff, lse = fused_parts(Z, mask, 4.0)
    (diff.float().sum() + lse.sum()).backward()
    assert diff.shape == Z.shape and lse.shape == (2, 1, 37)
    assert f"_scaled_dot_product_{op}_attention" in called
    assert f"_scaled_dot_product_{op}_attention_backward" in called
    other = "flash" if op == "efficient" else "efficient"
    assert f"_scaled_dot_product_{other}_attention" not in called


def _cutlass_forward(q, k, v, scale):
    """REFERENCE_OPS with the memory-efficient op's output layout: (B, n, H, c) in memory, seen as (B, H, n, c)
    (``attention.cu``: ``res = at::empty({B, M, num_heads, Kv})``, returned ``transpose(1, 2)``)."""
    o, lse, state = F.REFERENCE_OPS.forward(q, k, v, scale)
    return o.transpose(1, 2).contiguous().transpose(1, 2), lse, state


def _cutlass_backward(g, q, k, v, out, lse, state, scale):
    """REFERENCE_OPS's backward reading ``out`` as the memory-efficient op's half kernels do: ``kernel_backward.h``
    sets ``o_strideB``/``o_strideH`` from the tensor but takes the row stride as ``o_strideM() = head_dim_value *
    num_heads`` (``computeDelta``), so an ``out`` whose rows are not H * c apart is read at the wrong place."""
    B, H, n, c = out.shape
    seen = torch.as_strided(out, out.shape, (out.stride(0), out.stride(1), H * c, 1), out.storage_offset())
    return F.REFERENCE_OPS.backward(g, q, k, v, seen, lse, state, scale)


CUTLASS_HALF = F.REFERENCE_OPS._replace(name="cutlass-half-layout", forward=_cutlass_forward,
                                        backward=_cutlass_backward)


@pytest.mark.parametrize("mode", ["appended", "lse_col", "spare"])
def test_the_out_handed_to_the_backward_keeps_the_ops_memory_layout(mode):
    """The LSE gradient rides on the ``out`` given to the backward; the memory-efficient op's half kernels read it
    with rows ``H * c`` apart whatever its strides. ``lse_col`` (the compact layout) clones the op's output and
    kept its layout; the appended column (``fused_attention``'s default) and ``spare`` built ``out`` by
    ``torch.cat``, a (B, H, n, c) layout: with H > 1 the backward read other rows (here: past the storage's end).
    Every mode must give the explicit form's outputs and gradients."""
    gen = torch.Generator().manual_seed(7)
    B, H, n, c = 2, 3, 13, 6
    q, k, v = (torch.randn(B, H, n, c, dtype=torch.float64, generator=gen) for _ in range(3))
    if mode != "appended":
        v[..., -1] = 0.0
    if mode == "spare":
        q[..., -1], k[..., -1] = 0.0, 0.0
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    w_l = torch.randn(B, H, n, dtype=torch.float64, generator=gen)
    kw = {"appended": {}, "lse_col": {"lse_col": c - 1}, "spare": {"spare": True}}[mode]
    o, lse = F.fused_attention(q, k, v, 0.4, ops=CUTLASS_HALF, **kw)
    w_o = torch.randn(o.shape, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad((o * w_o).sum() + (lse * w_l).sum(), (q, k, v))
    cut = slice(None, -1) if mode == "spare" else slice(None)
    s = q[..., cut] @ k[..., cut].transpose(-1, -2) * 0.4
    ref_o, ref_lse = torch.softmax(s, -1) @ v[..., cut], torch.logsumexp(s, -1)
    ref = torch.autograd.grad((ref_o * w_o).sum() + (ref_lse * w_l).sum(), (q, k, v))
    assert (o - ref_o).abs().max() < 1e-12 and (lse - ref_lse).abs().max() < 1e-12
    for a, b in zip(got, ref):
        if mode != "appended":
            a, b = a[..., :-1], b[..., :-1]      # the zero column is a constant: its gradient is not asked
        assert (a - b).abs().max().item() < 1e-12


@pytest.mark.parametrize("lengths, n", [([6, 2, 0], 6), ([1, 1], 1)])
@pytest.mark.parametrize("sq", ["none", "with grad", "float32"])
def test_gradcheck_of_the_compact_layout_over_heads(lengths, n, sq, monkeypatch):
    """float64 gradcheck of agg, deg and energy through ``_fused_heads`` on the CUDA layout (the CPU op, head size
    rounded to 8), three heads, an example with no real token and n = 1, ``sq`` absent, given with its gradient,
    or given in another dtype (then recomputed from Z in the layout's dtype)."""
    import energies.kernels.lse as S
    from energies.kernels.fused import _fused_heads
    monkeypatch.setattr(S, "fused_ops", lambda device_type, dtype: CPU_COMPACT)
    gen = torch.Generator().manual_seed(1)
    mask = E.mask_from_lengths(lengths, n)
    g = E.complete(n, len(lengths), mask)
    Z = (torch.randn(len(lengths), 3, n, 5, dtype=torch.float64, generator=gen) * mask[:, None, :, None])

    def f(Z):
        s = {"none": None, "with grad": (Z * Z).sum(-1), "float32": (Z * Z).sum(-1).float()}[sq]
        return _fused_heads(Z, g, E.get_rho("exp"), 1.1, True, True, s)
    assert torch.autograd.gradcheck(f, (Z.requires_grad_(),), atol=1e-8, rtol=1e-6)
