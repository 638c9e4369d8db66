"""The ``banded`` kernel (energies/kernels/banded.py): shift-invariant graphs block by block, against the ``edges`` kernel.

Tolerance by the kernels' own rule (as tests/test_triton.py): z from the expansion errs by at most
``EXPANSION_Z_ERROR[dtype]`` per unit of ``rho'(0)``-relative weight, and the sums add up to n terms, so with
``rel = EXPANSION_Z_ERROR[dtype] * max(1, kernel_sensitivity) + 8 n eps(dtype)``

    |agg - agg_edges| <= rel * S,   S = rho'(0) max_u sum_{v in N(u)} |y_v - y_u|,
    |deg - deg_edges| <= rel * n rho'(0),    |E - E_edges| <= rel * tau/2 sum_uv [uv in E] (|rho(z)| + gamma z),

the reference being the edge kernel in float64 (explicit differences).
"""
from __future__ import annotations

import pytest
import torch

import energies as E
import energies.kernels.banded as BD
from energies.kernels import EXPANSION_Z_ERROR, KERNELS, pairwise_pass, pick_kernel
from energies.rho import get_rho, kernel_sensitivity
from unfold.encoders import GuaranteedEncoder
from matrix import rho_specs

RHOS = rho_specs("banded")  # drawn from the registry (tests/matrix.py)
GRAPHS = ["window:1", "window:3", "window:8", "dilated:2:3", "dilated:4:8", "strided:4", "strided:5", "dilated:3:20"]
TAU = 1.7


def _tokens(B, n, d, dtype, padded, seed):
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, d, generator=g, dtype=torch.float64).to(dtype)
    lengths = [n, max(1, n - 7), 1] if padded else [n] * B      # ragged, one example of a single token
    return Y, E.mask_from_lengths(lengths[:B], n)


def _bounds(Y, graph, rho, dtype):
    """``(rel, S, n rho'(0), energy sensitivity (B,))`` of the module docstring, in float64."""
    Yd = graph.zero_padded(Y.double())
    diff = Yd[:, None, :, :] - Yd[:, :, None, :]
    z = (diff * diff).sum(-1) / (2 * TAU)
    A = graph.pair_mask()
    zero = torch.zeros((), dtype=torch.float64)
    n = graph.num_nodes
    rel = EXPANSION_Z_ERROR[dtype] * max(1.0, kernel_sensitivity(rho)) + 8 * n * torch.finfo(dtype).eps
    scale = float(torch.where(A, diff.norm(dim=-1), zero).sum(-1).amax()) * rho.max_derivative()
    sens = 0.5 * TAU * torch.where(A, rho.value(z).abs() + rho.derivative(z) * z, zero).sum((1, 2))
    return rel, scale, n * rho.max_derivative(), sens


def _compare(Y, graph, rho, dtype, kernel="banded"):
    """True where the kernel's pass is within the rule of the edge kernel's float64 pass."""
    out = pairwise_pass(Y, graph, rho, TAU, kernel, energy=True)
    ref = pairwise_pass(Y.double(), graph, rho, TAU, "edges", energy=True)
    rel, scale, dscale, sens = _bounds(Y, graph, rho, dtype)
    assert out.agg.dtype == dtype and out.deg.dtype == dtype and out.energy.dtype == torch.float64
    return bool((out.agg.double() - ref.agg).abs().max() <= rel * scale + 1e-300
                and (out.deg.double() - ref.deg).abs().max() <= rel * dscale
                and ((out.energy - ref.energy).abs() <= rel * sens + 1e-300).all())


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("graph", GRAPHS)
def test_banded_equals_edges_for_every_rho(graph, dtype, padded):
    # n = 19, 37: not multiples of the block; n = 5: smaller than one block
    for n in (5, 19, 37):
        Y, mask = _tokens(3, n, 4, dtype, padded, seed=n)
        g = E.graph_from_spec(graph, n, batch_size=3, mask=mask)
        assert KERNELS["banded"].supports(g, get_rho("exp")) is None
        for spec in RHOS:
            assert _compare(Y, g, get_rho(spec), dtype), (graph, n, spec)


def test_a_wrong_offset_table_fails_the_comparison(monkeypatch):
    """Negative control: a table missing the largest offset (or one with an extra offset) is caught."""
    Y, mask = _tokens(3, 19, 4, torch.float64, True, seed=1)
    rho = get_rho("cauchy")
    assert _compare(Y, E.window(19, 3, batch_size=3, mask=mask), rho, torch.float64)
    real = BD._table
    monkeypatch.setattr(BD, "_table", lambda offsets, b, reach, device: real(offsets[:-1], b, reach, device))
    assert not _compare(Y, E.window(19, 3, batch_size=3, mask=mask), rho, torch.float64)   # a new graph: no cache
    monkeypatch.setattr(BD, "_table", lambda offsets, b, reach, device: real(offsets + (reach + 1,), b, reach + 1,
                                                                             device)[:, 1:-1])
    assert not _compare(Y, E.window(19, 3, batch_size=3, mask=mask), rho, torch.float64)


@pytest.mark.parametrize("graph,spec", [("window:3", "softplus:2:0.5"), ("dilated:2:3", "exp"), ("strided:3", "exp"),
                                        ("strided:3", "cauchy"), ("dilated:2:9", "lp:1.5:0.1")])
def test_gradcheck_float64(graph, spec):
    Y, mask = _tokens(2, 11, 3, torch.float64, True, seed=4)
    g = E.graph_from_spec(graph, 11, batch_size=2, mask=mask)
    rho = get_rho(spec)
    W = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def fn(Y, W):
        out = pairwise_pass(Y, g, rho, TAU, "banded", energy=True, metric=W)
        return out.agg, out.deg, out.energy
    assert torch.autograd.gradcheck(fn, (Y.requires_grad_(), W.requires_grad_()), eps=1e-6, atol=1e-7)


def test_declines_graphs_without_offsets_and_auto_picks_it_on_the_cpu_where_it_pays():
    r = get_rho("exp")
    for g in (E.star(16), E.complete(16), E.random(16, 0.3)):
        why = KERNELS["banded"].supports(g, r)
        assert why is not None and "shift-invariant" in why
        assert pick_kernel(g, r) != "banded"
    with pytest.raises(E.EnergyError, match="the banded kernel needs a shift-invariant graph"):
        pick_kernel(E.star(16), r, "banded")
    assert pick_kernel(E.window(512, 8), r) == "banded"
    assert pick_kernel(E.dilated(512, 4, 8), r) == "banded"
    assert pick_kernel(E.window(40, 8), r) == "banded"         # 24 keys for 16 neighbours
    assert pick_kernel(E.strided(512, 16), r) == "banded"      # band 16 + 30 and classes of 32: 78 keys, 46 offsets
    assert pick_kernel(E.strided(64, 16), r) == "banded"       # 46 + 4 keys for 18 offsets
    assert pick_kernel(E.dilated(2048, 64, 1), r) == "edges"   # 64 + 128 keys for 2 neighbours
    assert pick_kernel(E.window(512, 8).to("meta"), r) != "banded"   # off the CPU auto is as before


def test_heads_in_one_call_equal_each_head_alone():
    Y, mask = _tokens(3, 37, 6, torch.float64, True, seed=6)
    g = E.window(37, 3, batch_size=3, mask=mask)
    rho = get_rho("softplus:2:0.5")
    gen = torch.Generator().manual_seed(7)
    Ws = [torch.randn(6, 3, dtype=torch.float64, generator=gen) for _ in range(2)]
    joint = E.kernels.pairwise_pass_heads(Y, g, rho, TAU, "banded", Ws, energy=True)
    assert joint is not None
    for W, o in zip(Ws, joint):
        ref = pairwise_pass(Y, g, rho, TAU, "edges", energy=True, metric=W)
        assert (o.agg - ref.agg).abs().max() < 1e-10 and (o.deg - ref.deg).abs().max() < 1e-10
        assert torch.allclose(o.energy, ref.energy, rtol=1e-10, atol=1e-12)


def test_guaranteed_encoder_descends_and_equals_edges():
    torch.manual_seed(0)
    X = torch.randn(3, 21, 8, dtype=torch.float64)
    mask = E.mask_from_lengths([21, 13, 1], 21)
    outs = {}
    for kernel in ("banded", "edges"):
        torch.manual_seed(1)
        enc = GuaranteedEncoder(d=8, heads=2, layers=3, graph="window:3", kernel=kernel).double()
        out = enc(X, mask, trace=True)
        assert out.report().num_increases == 0
        outs[kernel] = out.Y
    assert (outs["banded"] - outs["edges"]).abs().max() < 1e-10


def test_guaranteed_encoder_runs_on_meta():
    with torch.device("meta"):
        enc = GuaranteedEncoder(d=8, layers=2, graph="window:3", kernel="banded")
        X = torch.randn(2, 5, 8)
        mask = torch.ones(2, 5, dtype=torch.bool)
        out = enc(X, mask, trace=True)
        assert out.Y.device.type == "meta" and out.Y.shape == (2, 5, 8)
        out = enc(X, mask)
        out.Y.sum().backward()


def test_plan_splits_strided_graphs_into_a_band_and_residue_classes():
    """``banded_plan``: a stride qualifies only when every multiple below n is an offset; the cheaper layout wins."""
    assert BD.banded_plan(E.window(512, 8).offsets, 512) == (8 + 16, tuple(range(1, 9)), None)
    cost, band, k = BD.banded_plan(E.strided(512, 16).offsets, 512)
    assert (band, k) == (tuple(range(1, 16)), 16) and cost == 16 + 30 + 32
    assert BD.banded_plan(E.dilated(40, 3, 20).offsets, 40) == (14, (), 3)          # every multiple: classes only
    cost, band, k = BD.banded_plan(E.dilated(512, 4, 8).offsets, 512)               # 36, 40, ... missing: no stride
    assert k is None and band == tuple(range(4, 33, 4))
    assert BD.banded_plan((), 9) == (0, (), None)


@pytest.mark.parametrize("spec", ["exp", "cauchy"])
def test_both_layouts_of_a_strided_graph_are_used_and_agree_with_edges(spec, monkeypatch):
    """strided:4 at n = 37 takes the band (offsets 1..3) and the classes mod 4 (the flash op for exp, tiles
    otherwise); each part is seen to run, and the sum matches the edge kernel (the parametrized test above)."""
    calls = []
    real = BD._tile_sums
    monkeypatch.setattr(BD, "_tile_sums", lambda q, *a: calls.append(tuple(q.shape)) or real(q, *a))
    Y, mask = _tokens(3, 37, 4, torch.float64, True, seed=2)
    g = E.strided(37, 4, batch_size=3, mask=mask)
    assert _compare(Y, g, get_rho(spec), torch.float64)
    assert calls[0] == (3, 1, 5, 8, 4)                         # the band: 5 blocks of 8 queries
    assert BD._softmax_route(get_rho(spec), Y) == (spec == "exp")
    assert len(calls) == (1 if spec == "exp" else 2)
    if spec != "exp":
        assert calls[1] == (3, 1, 4, 10, 4)                    # 4 classes of ceil(37 / 4) = 10 tokens


def test_backward_recomputes_instead_of_holding_the_weights():
    """Nothing of the tiles' size ``(N, b, w)`` in floating point is saved for the backward pass (z, gamma are
    recomputed): the largest saved float tensor is an input (the key windows, ``(N, w, c)``, here c = 2 < b = 8).
    Control: the same measurement of the edge kernel sees its per-edge weights saved."""
    def largest_saved(kernel):
        Y, mask = _tokens(3, 64, 2, torch.float64, True, seed=3)
        g = E.window(64, 8, batch_size=3, mask=mask)
        sizes = []

        def pack(t):
            if t.is_floating_point():
                sizes.append(t.numel())
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = pairwise_pass(Y.requires_grad_(), g, get_rho("cauchy"), TAU, kernel, energy=True)
        (out.agg.sum() + out.deg.sum() + out.energy.sum()).backward()
        return max(sizes)
    N, b, w, c = 3 * 8, 8, 24, 2
    assert largest_saved("banded") <= N * w * c < N * b * w
    assert largest_saved("edges") >= 3 * (64 * 8 - 36)          # one weight per directed edge at least


def test_a_wrong_backward_fails_gradcheck(monkeypatch):
    """Negative control for the hand-written backward: dropping the energy's share of dL/dz is caught."""
    Y, mask = _tokens(2, 11, 3, torch.float64, True, seed=4)
    g = E.window(11, 3, batch_size=2, mask=mask)
    rho = get_rho("cauchy")

    def fn(Y):
        out = pairwise_pass(Y, g, rho, TAU, "banded", energy=True)
        return out.energy
    assert torch.autograd.gradcheck(fn, (Y.clone().requires_grad_(),), eps=1e-6, atol=1e-7)
    real = BD._TileSums.backward

    def wrong(ctx, g_agg, g_deg, g_e):
        return real(ctx, g_agg, g_deg, None if g_e is None else g_e * 0.5)
    monkeypatch.setattr(BD._TileSums, "backward", staticmethod(wrong))
    assert not torch.autograd.gradcheck(fn, (Y.clone().requires_grad_(),), eps=1e-6, atol=1e-7, raise_exception=False)
