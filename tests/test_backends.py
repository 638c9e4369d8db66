"""Every pairwise kernel agrees with the dense reference: neighbour sums, degrees, energies, gradients."""
import math

import pytest
import torch

import energies as E
import unfold as U
from energies.errors import EnergyError
from energies.kernels import pairwise_pass, pick_kernel
from matrix import rho_specs

RHOS = rho_specs("kernels")  # drawn from the registry (tests/matrix.py)


def sample(B=3, n=37, d=5, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, d, dtype=torch.float64, generator=gen).to(device)
    mask = E.mask_from_lengths([n, n - 9, 4][:B], n).to(device)
    return Y, mask


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("tile", [1, 8, 13, 64])
def test_streamed_equals_dense(rho, tile, device, monkeypatch):
    import energies.kernels.streamed as S        # the kernel's own module: what streamed_pass reads

    monkeypatch.setattr(S, "STREAM_TILE", tile)
    Y, mask = sample(device=device)
    g = E.complete(Y.shape[1], Y.shape[0], mask).to(device)
    r = E.get_rho(rho)
    ref = pairwise_pass(Y, g, r, 1.7, "dense", energy=True)
    got = pairwise_pass(Y, g, r, 1.7, "streamed", energy=True)
    assert (got.num - ref.num).abs().max() < 1e-10
    assert (got.deg - ref.deg).abs().max() < 1e-10
    assert torch.allclose(got.energy, ref.energy, rtol=1e-12, atol=1e-12)
    # gradients through a full exact step, tiles recomputed in the backward pass
    grads = []
    for kernel in ("dense", "streamed"):
        Yr = Y.clone().requires_grad_()
        out = U.AttentionStep(rho, 1.7, 0.8, kernel=kernel)(Yr, g)
        (gr,) = torch.autograd.grad((out * torch.cos(out)).sum(), Yr)
        grads.append(gr)
    assert (grads[0] - grads[1]).abs().max() < 1e-8


def cpu_only(kernel, device):
    if kernel == "fused" and device != "cpu":
        pytest.skip("the fused kernel wraps the CPU flash-attention op")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_wrapper_equals_explicit_softmax_with_both_gradients(dtype):
    """The one private-op wrapper: O and LSE, and the gradients through both, equal the explicit form."""
    from energies.kernels.fused_ops import fused_attention

    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 3, 41, 6, dtype=dtype, generator=gen).requires_grad_() for _ in range(3))
    w_o, w_l = torch.randn(2, 3, 41, 6, dtype=dtype, generator=gen), torch.randn(2, 3, 41, dtype=dtype, generator=gen)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    results = []
    for explicit in (False, True):
        if explicit:
            s = q @ k.transpose(-1, -2) * 0.4
            o, lse = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
        else:
            o, lse = fused_attention(q, k, v, 0.4)
        for weights in ((w_o, 0 * w_l), (0 * w_o, w_l), (w_o, w_l)):   # O alone, LSE alone, both
            loss = (o * weights[0]).sum() + (lse * weights[1]).sum()
            results.append([o, lse] + list(torch.autograd.grad(loss, (q, k, v), retain_graph=True)))
    for a, b in zip(results[:3], results[3:]):
        for x, y in zip(a, b):
            assert (x - y).abs().max().item() < tol


@pytest.mark.parametrize("spare", [False, True])
def test_fused_wrapper_with_values_as_queries_and_a_spare_column(spare):
    """v given as q itself (one tensor, its gradients summed) and inputs carrying a zero spare column (the op
    reading the first c in place): O, LSE and the gradient equal the explicit form of the same call."""
    from energies.kernels.fused_ops import fused_attention

    gen = torch.Generator().manual_seed(7)
    base_q = torch.randn(2, 1, 33, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    base_k = torch.randn(2, 1, 33, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w_o, w_l = torch.randn(2, 1, 33, 5, dtype=torch.float64, generator=gen), torch.randn(2, 1, 33, dtype=torch.float64,
                                                                                          generator=gen)

    def build(t):
        return torch.nn.functional.pad(t, (0, 1)) if spare else t * 1.0

    outs = []
    for explicit in (False, True):
        q, k = build(base_q), build(base_k)
        if explicit:
            qc, kc = (q[..., :-1], k[..., :-1]) if spare else (q, k)
            s = qc @ kc.transpose(-1, -2) * 0.3
            o, lse = torch.softmax(s, -1) @ qc, torch.logsumexp(s, -1)
        else:
            o, lse = fused_attention(q, k, q, 0.3, spare=spare)
        loss = (o * w_o).sum() + (lse * w_l).sum()
        outs.append([o, lse, *torch.autograd.grad(loss, (base_q, base_k))])
    for x, y in zip(*outs):
        assert (x - y).abs().max().item() < 1e-12
    with pytest.raises(E.EnergyError, match="one head size"):
        fused_attention(base_q[..., :1], base_q[..., :1], base_q[..., :1], 0.3, spare=True)


@pytest.mark.parametrize("kernel", ["softmax", "fused", "streamed", "dense"])
def test_complete_kernels_match_the_edge_list_on_every_quantity(kernel):
    Y, mask = sample(n=20, seed=1)
    g = E.complete(20, 3, mask)
    sparse = g.to_sparse()
    for rho in (["exp"] if kernel in ("softmax", "fused") else RHOS):
        r = E.get_rho(rho)
        a = pairwise_pass(Y, g, r, 2.0, kernel, energy=True)
        b = pairwise_pass(Y, sparse, r, 2.0, "edges", energy=True)
        assert (a.num - b.num).abs().max() < 1e-10 and (a.deg - b.deg).abs().max() < 1e-10
        assert torch.allclose(a.energy, b.energy, rtol=1e-10, atol=1e-10)


def test_energy_from_the_pass_equals_direct_evaluation():
    """The LSE identity (softmax) and the tile sums (streamed) give the energy of the pairs, to 1e-8."""
    Y, mask = sample(n=50, seed=2)
    g = E.complete(50, 3, mask)
    direct = E.PairwiseAttention("exp", 3.0, kernel="edges").value(Y, g.to_sparse())
    for kernel in ("softmax", "fused", "streamed"):
        term = E.PairwiseAttention("exp", 3.0, kernel=kernel)
        assert torch.allclose(term.pass_value(Y, g), direct, rtol=1e-8, atol=1e-10)
        assert torch.allclose(term.mm_pass(Y, g)[2], direct, rtol=1e-8, atol=1e-10)


def test_auto_picks_by_graph_and_size_and_kernels_refuse_clearly():
    r_exp, r_c = E.get_rho("exp"), E.get_rho("cauchy")
    assert pick_kernel(E.complete(64), r_exp) == "fused"
    assert pick_kernel(E.complete(4096), r_exp) == "fused"
    assert pick_kernel(E.complete(64), r_c) == "dense"
    assert pick_kernel(E.complete(4096), r_c) == "streamed"
    assert pick_kernel(E.window(64, 2), r_exp) == "banded"         # 8 + 2 * 2 keys for 4 neighbours (CPU)
    assert pick_kernel(E.window(16, 8), r_exp) == "banded"         # 24 keys per query for 16 neighbours
    assert pick_kernel(E.dilated(2048, 64, 1), r_exp) == "edges"    # 192 keys for 2 neighbours: not worth it
    assert pick_kernel(E.star(64), r_exp) == "edges"
    with pytest.raises(EnergyError, match="streamed kernel is for the complete graph"):
        pick_kernel(E.window(64, 2), r_exp, "streamed")
    with pytest.raises(EnergyError, match="softmax kernel needs the complete graph and rho='exp'"):
        pick_kernel(E.complete(8), r_c, "softmax")
    with pytest.raises(EnergyError, match="unknown pairwise kernel 'flash'"):
        pick_kernel(E.complete(8), r_c, "flash")


def test_streamed_runs_where_dense_would_not_fit():
    """n = 4,096 on the complete graph (auto streams above 1,024): each dense float64 n x n intermediate would take
    134 MB; the streamed step holds B * n * tile at a time and still descends."""
    n, d = 4_096, 8
    Y = torch.randn(1, n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    g = E.complete(n)
    step = U.AttentionStep("cauchy", math.sqrt(d), 1.0)
    assert pick_kernel(g, step.rho) == "streamed"
    out, rep = U.trace_descent(step, Y, g, layers=1)
    assert rep.num_increases == 0 and torch.isfinite(out).all()


@pytest.mark.parametrize("scale", [1.0, 20.0])
@pytest.mark.parametrize("kernel", ["fused", "softmax", "streamed"])
def test_every_complete_kernel_matches_dense_in_steps_and_gradients(kernel, scale, device):
    """Outputs and gradients of a full exact step (with an initial residual and padding) on each
    complete-graph kernel equal the dense reference within 1e-8 relative (float64); scale 20 makes every
    off-diagonal weight underflow and the padded rows' logits extreme."""
    cpu_only(kernel, device)
    Y, mask = sample(n=29, d=4, seed=5, device=device)
    Y = Y * scale
    g = E.complete(29, 3, mask).to(device)
    B = torch.randn_like(Y)
    outs = {}
    for kern in ("dense", kernel):
        Yr = Y.clone().requires_grad_()
        out = U.AttentionStep("exp", 1.3, 0.7, B, kernel=kern)(Yr, g)
        outs[kern] = (out.detach(), torch.autograd.grad((out * torch.sin(out)).sum(), Yr)[0])
    assert (outs["dense"][0] - outs[kernel][0]).abs().max() < 1e-10
    # gradients to 1e-8 relative to their size (at scale 20 they reach ~10^2)
    assert (outs["dense"][1] - outs[kernel][1]).abs().max() < 1e-8 * max(1.0, outs["dense"][1].abs().max().item())
    # the energy read off the pass, differentiated: the gradient of E1 itself
    term = E.PairwiseAttention("exp", 1.3, kernel=kernel)
    Yr = Y.clone().requires_grad_()
    (g_pass,) = torch.autograd.grad(term.mm_pass(Yr, g)[2].sum(), Yr) if kernel != "streamed" else (None,)
    if g_pass is not None:
        (g_ref,) = torch.autograd.grad(E.PairwiseAttention("exp", 1.3, kernel="dense").value(Yr, g).sum(), Yr)
        assert (g_pass - g_ref).abs().max() < 1e-8


def test_fused_kernel_refuses_clearly():
    r_c = E.get_rho("cauchy")
    with pytest.raises(EnergyError, match="fused kernel needs the complete graph and rho='exp'"):
        pick_kernel(E.complete(8), r_c, "fused")
    with pytest.raises(EnergyError, match="fused kernel needs the complete graph"):
        pick_kernel(E.window(8, 1), E.get_rho("exp"), "fused")
