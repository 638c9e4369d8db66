"""rho = exp through torch's own fused attention on CUDA, verified on the CPU.

The CUDA ops (memory-efficient for float32, flash for bfloat16) cannot run here, so each part is checked where it
can be: their calling convention and shapes through their meta kernels (``tests/test_meta.py`` and below), their
algebra through ``REFERENCE_OPS`` (plain torch with the ops' contract: a backward that forms ``delta`` from the
``out`` it is given), and the compact layout they get (one extra column, the values' zero column serving the LSE
gradient) through the CPU flash op itself, whose backward has the same contract. On a GPU the ``cuda`` cases run
the real ops against the explicit float64 form."""
from __future__ import annotations

import pytest
import torch

import energies as E
from energies.kernels.fused_ops import CPU_OPS, REFERENCE_OPS, _probe, fused_attention, fused_ops, fused_unavailable
from energies.kernels.fused import FUSED_LSE_MAX_N, _fused_heads
from energies.kernels.lse import _compact_layout, _spare_layout, fused_parts
from energies.kernels import pairwise_pass, pick_kernel

#: the CPU flash op with the CUDA ops' layout (head size rounded up to 8, values apart)
CPU_COMPACT = CPU_OPS._replace(name="cpu-flash-compact", head_multiple=8)


def _explicit(q, k, v, scale):
    s = q @ k.transpose(-1, -2) * scale
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def _grads(fn, q, k, v, w_o, w_l):
    o, lse = fn(q, k, v)
    loss = (o * w_o).sum() + (lse * w_l).sum()
    return [o, lse, *torch.autograd.grad(loss, (q, k, v))]


@pytest.mark.parametrize("ops", [REFERENCE_OPS, CPU_OPS], ids=lambda o: o.name)
def test_lse_column_in_the_values_carries_the_lse_gradient(ops):
    """``lse_col=j``: values zero in column j, q and k anything there; O, LSE and every gradient equal the explicit
    form (float64: to 1e-12, a few hundred roundings of terms of size 1)."""
    gen = torch.Generator().manual_seed(3)
    B, H, n, c = 2, 3, 29, 6
    q, k = (torch.randn(B, H, n, c, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, n, c, dtype=torch.float64, generator=gen)
    v[..., 2] = 0.0
    v.requires_grad_()
    w_o, w_l = torch.randn(B, H, n, c, dtype=torch.float64, generator=gen), torch.randn(B, H, n, dtype=torch.float64,
                                                                                        generator=gen)
    got = _grads(lambda a, b, cc: fused_attention(a, b, cc, 0.45, lse_col=2, ops=ops), q, k, v, w_o, w_l)
    ref = _grads(lambda a, b, cc: _explicit(a, b, cc, 0.45), q, k, v, w_o, w_l)
    got[4][..., 2] = 0.0                     # the values' zero column is a constant: its gradient is not asked
    ref[4][..., 2] = 0.0
    for a, b in zip(got, ref):
        assert (a - b).abs().max().item() < 1e-12


def test_a_backward_that_ignores_out_misses_the_lse_gradient():
    """Negative control: an op whose backward recomputes ``delta`` from its own output instead of the ``out`` it is
    given (as no fused op does) loses the LSE gradient, and the comparison above would fail."""
    def recomputing(g, q, k, v, out, lse, state, scale):
        o, _, _ = REFERENCE_OPS.forward(q, k, v, scale)
        return REFERENCE_OPS.backward(g, q, k, v, o, lse, state, scale)

    bad = REFERENCE_OPS._replace(name="bad", backward=recomputing)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 11, 4, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    w_o, w_l = torch.zeros(1, 1, 11, 4, dtype=torch.float64), torch.randn(1, 1, 11, dtype=torch.float64, generator=gen)
    got = _grads(lambda a, b, c: fused_attention(a, b, c, 0.5, ops=bad), q, k, v, w_o, w_l)
    ref = _grads(lambda a, b, c: _explicit(a, b, c, 0.5), q, k, v, w_o, w_l)
    assert (got[2] - ref[2]).abs().max().item() > 1e-3


def _features(B=3, H=2, n=23, c=5, seed=0, scale=1.0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    mask = E.mask_from_lengths([n, n - 7, 3][:B], n)
    Z = torch.randn(B, H, n, c, dtype=torch.float64, generator=gen) * scale
    Z = (Z - Z.mean(2, keepdim=True)) * mask[:, None, :, None]
    return Z.to(dtype).requires_grad_(), mask


@pytest.mark.parametrize("ops", [REFERENCE_OPS, CPU_COMPACT], ids=lambda o: o.name)
@pytest.mark.parametrize("c", [5, 7, 8])
def test_compact_layout_equals_the_cpu_layout(ops, c):
    """The CUDA layout (``[z, 1] . [z, -|z|^2/2]``, head size c + 1 rounded up to 8, LSE minus the query's constant)
    gives the same ``P Z - Z`` and ``log(1 + deg)`` as the CPU layout, and the same gradients, with padding;
    c = 7 needs no zero padding, c = 8 a whole block of it."""
    Z, mask = _features(c=c)
    w_d, w_l = torch.randn_like(Z.detach()), torch.randn(Z.shape[:-1], dtype=torch.float64)
    outs = []
    for layout, o in ((_spare_layout, CPU_OPS), (_compact_layout, ops)):
        diff, lse = layout(Z, mask, 1.3, None, o)
        real = mask[:, None]
        loss = (diff * w_d * real[..., None]).sum() + (lse * w_l * real).sum()
        outs.append([diff * real[..., None], lse * real, *torch.autograd.grad(loss, Z)])
    for a, b in zip(*outs):
        assert (a - b).abs().max().item() < 1e-12


def test_fused_parts_picks_the_layout_of_the_op():
    Z, mask = _features()
    a = fused_parts(Z, mask, 1.0)                  # CPU: the CPU op, its spare layout
    b = fused_parts(Z, mask, 1.0, ops=CPU_COMPACT)
    assert fused_ops("cpu", torch.float64) is CPU_OPS
    assert (a[1] - b[1]).abs().max().item() < 1e-12


def test_the_kernel_on_the_cuda_layout_equals_the_edge_list(monkeypatch):
    """The ``fused`` kernel with the CUDA ops' layout (through the CPU op): agg, deg, energy equal ``edges`` in
    float64, padded examples included."""
    import energies.kernels.lse as S
    monkeypatch.setattr(S, "fused_ops", lambda device_type, dtype: CPU_COMPACT)
    gen = torch.Generator().manual_seed(1)
    Y = torch.randn(3, 21, 4, dtype=torch.float64, generator=gen)
    g = E.complete(21, 3, E.mask_from_lengths([21, 13, 2], 21))
    r = E.get_rho("exp")
    got = pairwise_pass(Y, g, r, 1.7, "fused", energy=True)
    ref = pairwise_pass(Y, g, r, 1.7, "edges", energy=True)
    assert (got.num - ref.num).abs().max() < 1e-10
    assert (got.deg - ref.deg).abs().max() < 1e-10
    assert torch.allclose(got.energy, ref.energy, rtol=1e-12, atol=1e-12)


def test_half_features_step_in_half_and_energy_in_float32():
    """bfloat16 features (the step under autocast): agg and deg come back in bfloat16 from the op, the energy from
    the float32 energy-only pass. The energy's tolerance: float32 sums of n terms of size <= 1 per token,
    ``n eps32`` relative, far inside what bfloat16 (eps 2^-8) would give; deg within bfloat16's rounding of the
    features, ``4 eps_bf16 (1 + deg)``."""
    Z64, mask = _features(H=1, n=19, c=4)
    Zb = Z64.detach().to(torch.bfloat16)
    g = E.complete(19, 3, mask)
    agg, deg, e = _fused_heads(Zb, g, E.get_rho("exp"), 1.0, True, True, None)
    assert agg.dtype == deg.dtype == torch.bfloat16 and e.dtype == torch.float64
    ref = pairwise_pass(Zb.double()[:, 0], g, E.get_rho("exp"), 1.0, "edges", energy=True)
    eps32, epsb = torch.finfo(torch.float32).eps, torch.finfo(torch.bfloat16).eps
    assert ((e[:, 0] - ref.energy).abs() <= 19 * eps32 * ref.energy.abs()).all()
    assert ((deg[:, 0].double() - ref.deg).abs() <= 4 * epsb * (1 + ref.deg)).all()


def test_probe_accepts_a_right_op_and_names_a_wrong_one():
    assert _probe(REFERENCE_OPS, "cpu", torch.float64) is None
    wrong = REFERENCE_OPS._replace(forward=lambda q, k, v, s: (lambda o: (o[0] * 1.01, o[1], o[2]))(
        REFERENCE_OPS.forward(q, k, v, s)))
    assert "differs from the explicit form" in _probe(wrong, "cpu", torch.float64)
    assert "float64" in fused_unavailable("meta", torch.float64)
    assert fused_ops("meta", torch.float16).name == "cuda-flash"
    if not torch.cuda.is_available():
        assert fused_ops("cuda", torch.float32) is None and "cuda-memory-efficient" in fused_unavailable("cuda")


def test_auto_picks_fused_off_the_cpu_for_the_complete_graph_and_exp_only():
    full, win = E.complete(9, 2).to("meta"), E.window(9, 2, 2).to("meta")
    assert pick_kernel(full, E.get_rho("exp")) == "fused"
    assert pick_kernel(full, E.get_rho("cauchy")) != "fused"
    assert pick_kernel(win, E.get_rho("exp")) != "fused"
    assert pick_kernel(E.complete(9, 2), E.get_rho("exp")) == "fused"        # the CPU: its own op, as before
    assert FUSED_LSE_MAX_N == 1024


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [37, 300, 1500])
def test_cuda_fused_kernel_equals_the_float64_form(dtype, n):
    """On a GPU: the real ops against the explicit float64 form, padded; float32 (3xTF32 products) within the guard's
    z bound, bfloat16 within its own rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    gen = torch.Generator().manual_seed(0)
    Y = torch.randn(2, n, 32, dtype=torch.float64, generator=gen)
    g = E.complete(n, 2, E.mask_from_lengths([n, n // 2], n))
    r = E.get_rho("exp")
    ref = pairwise_pass(Y, g, r, 8.0, "edges", energy=True)
    Yd, gd = Y.to("cuda", dtype), g.to("cuda")
    got = pairwise_pass(Yd, gd, r, 8.0, "fused", energy=True, guard=False)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    scale = ref.deg.abs().max().item() + 1
    assert (got.deg.double().cpu() - ref.deg).abs().max().item() < tol * scale
    assert (got.num.double().cpu() - ref.num).abs().max().item() < tol * scale * Y.abs().max().item()
    assert torch.allclose(got.energy.cpu(), ref.energy, rtol=tol, atol=0)


def _online_lse(s: torch.Tensor, block: int) -> torch.Tensor:
    """The CUDA ops' log-sum-exp as they compute it, in float32: key blocks of ``block``, a running maximum m and a
    running sum l rescaled by ``exp(m_old - m_new)`` when m grows, LSE = m + log(l)."""
    m = torch.full(s.shape[:-1], -float("inf"), dtype=torch.float32)
    l_ = torch.zeros(s.shape[:-1], dtype=torch.float32)
    for j in range(0, s.shape[-1], block):
        t = s[..., j:j + block].float()
        m_new = torch.maximum(m, t.amax(-1))
        l_ = l_ * torch.exp(m - m_new) + torch.exp(t - m_new[..., None]).sum(-1)
        m = m_new
    return m + torch.log(l_)


@pytest.mark.parametrize("kind", ["equal", "random", "growing"])
def test_the_running_lse_stays_inside_the_bound_behind_fused_lse_max_n(kind):
    """The rule behind FUSED_LSE_MAX_N: exp(LSE) from a float32 running sum over key blocks of 64 errs by at most
    (n / 64 + 8) eps relative (checked against float64 on equal logits -- every term the same, the worst case of
    a sum of positive terms --, random ones, and a maximum that grows block after block, forcing every rescale),
    so n <= 1,024 keeps it within 24 eps, half the trace's 64 eps budget with room for the logits' rounding."""
    eps = torch.finfo(torch.float32).eps
    gen = torch.Generator().manual_seed(0)
    for n in (64, 512, 1024, 4096):
        if kind == "equal":
            s = torch.zeros(4, n, dtype=torch.float64)
        elif kind == "random":
            s = torch.randn(4, n, dtype=torch.float64, generator=gen) * 3
        else:
            s = torch.linspace(-20, 0, n, dtype=torch.float64).repeat(4, 1)
        s = s.float().double()                            # logits exactly representable: only the sum's rounding
        got = _online_lse(s, 64).double()
        ref = torch.logsumexp(s, -1)
        rel = (torch.exp(got - ref) - 1).abs().max().item()
        assert rel <= (n / 64 + 8) * eps, (n, rel / eps)
        if n <= 1024:
            assert rel <= 24 * eps


def test_the_guards_exact_side_runs_only_the_refused_examples():
    """Off the CPU the fused kernel's guard takes, per example, the op's pass or the Triton kernel's (explicit
    differences where the expansion cannot resolve z); the Triton pass gets the refused examples only, the others
    masked out (their programs visit no key block). Checked in the interpreter: refused examples equal ``edges``,
    the others come back 0."""
    from energies.kernels.dispatch import _safe_pass
    from energies.kernels.registry import KERNELS
    if KERNELS["triton"].supports(E.complete(4, 1), E.get_rho("exp")) is not None:
        pytest.skip("Triton is not installed")
    gen = torch.Generator().manual_seed(2)
    Y = torch.randn(3, 19, 3, dtype=torch.float64, generator=gen)
    g = E.complete(19, 3, E.mask_from_lengths([19, 11, 19], 19))
    r = E.get_rho("exp")
    ok = torch.tensor([True, False, True])
    got = _safe_pass(KERNELS["fused"], Y, None, ok, g, r, 1.3, True, True, None)
    ref = pairwise_pass(Y, g, r, 1.3, "edges", energy=True)
    assert (got.deg[1] - ref.deg[1]).abs().max() < 1e-12 and (got.agg[1] - ref.agg[1]).abs().max() < 1e-12
    assert abs(got.energy[1] - ref.energy[1]) < 1e-12
    assert got.deg[[0, 2]].abs().max() == 0 and got.agg[[0, 2]].abs().max() == 0 and got.energy[[0, 2]].abs().max() == 0
