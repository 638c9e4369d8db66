"""The ``banded`` pairwise kernel: shift-invariant graphs (window, dilated, strided) in a block-ordered layout.

A graph with offsets ``O`` ([`offsets`][energies.TokenGraph.offsets]: the edges are every pair ``{i, i + o}``,
``o in O``, of real tokens) and reach ``R = max O`` is cut into blocks of ``b`` tokens (``b`` a multiple of
``BANDED_ALIGN``, at least R and ``BANDED_MIN_BLOCK``; n padded to a multiple of b with masked slots). Query block
``k`` (tokens ``kb .. kb + b - 1``) meets the ``w = b + 2R`` keys ``kb - R .. kb + b + R - 1``, which hold every
neighbour of its queries. Per tile, batched over examples, heads and blocks, with the expansion on the centred
features Z that the kernel receives (``expansion=True``, [`Kernel`][energies.Kernel]):

    z_uv = max(|z_u|^2 + |z_v|^2 - 2 z_u . z_v, 0) / (2 tau),    gamma_uv = rho'(z_uv) [uv in E],

    deg_u = sum_v gamma_uv,    agg_u = sum_v gamma_uv z_v - deg_u z_u = sum_v gamma_uv (z_v - z_u),

    energy = tau / 2 sum_u sum_v [uv in E] rho(z_uv)    (float64 per example: each undirected edge once),

exactly what the ``dense`` kernel computes on the ``(n, n)`` matrix, here on ``(n, w)`` weights per head (never
n x n). ``[uv in E]`` is a static ``(b, w)`` 0/1 table (``|v - u| in O`` for query row r and key column c,
``v - u = c - R - r``) times the token mask of both ends (slots outside ``[0, n)`` are masked). Memory for the
weights ``O(n w)`` per head; the key windows ``O(n w d / b)``.

Strided graphs (every multiple of k an offset, `banded_plan`): the pairs ``|i - j| = 0 (mod k)`` are the
complete graph of each residue class ``i mod k`` (``m = ceil(n / k)`` tokens), laid out as ``(B, H, k, m, c)``
tiles with the table ``r != c``, and only the other offsets (``1 .. k-1`` for ``strided:k``) go to the band: the
two pair sets are disjoint, so the sums add. With rho = exp each class goes to the fused flash op (a complete
graph with padded keys, as the ``fused`` kernel does), else to the same tiles. Keys per query: ``b + 2R`` for a
band, ``b + 2(k - 1) + m`` for ``strided:k`` (78 at n = 512, k = 16, against 511 for the complete graph).

The tiles' backward pass (`_TileSums`) recomputes z and the weights instead of keeping them, so the
memory is that of the features and the key windows, ``O(n (b + 2R) c / b)`` per head.

``supports``: every graph with offsets. `banded_pays` is the rule of ``auto`` on the CPU: use banded where
the keys per query of the cheapest layout are fewer than 8 times the neighbours per token.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..graphs import TokenGraph
from ..graphs.bands import (BANDED_ALIGN, BANDED_MIN_BLOCK, banded_block, banded_plan,  # noqa: F401  (re-exported)
                           class_mask, from_classes, to_classes)
from ..rho import Rho
from .registry import PairwisePass, register_kernel

__all__ = ["banded_block", "banded_pays", "banded_plan", "banded_sums", "BANDED_ALIGN", "BANDED_MIN_BLOCK"]


def _supports(graph: TokenGraph, rho: Rho) -> Optional[str]:
    if graph.offsets is None:
        return f"needs a shift-invariant graph (window, dilated, strided); got graph {graph.name!r} (use 'edges')"
    return None


#: a tile weight costs several times less than an edge-list weight on the CPU (gather, index_add and saved
#: differences against one batched matmul): ``auto`` picks ``banded`` while its tiles hold at most this many times
#: the edge list's pairs, a margin below the break-even measured on the page docs/kernels.md ("banded")
BANDED_PAIR_ADVANTAGE = 8


def banded_pays(graph: TokenGraph) -> bool:
    """The ``auto`` rule on the CPU: a shift-invariant graph whose keys per query (`banded_plan`) are fewer
    than `BANDED_PAIR_ADVANTAGE` times its neighbours per token (``2 |O|`` away from the ends), the edge
    kernel's pairs. A long reach with few offsets (``dilated:64:1``: 192 keys for 2 neighbours) stays on edges."""
    if not graph.offsets:
        return False
    return banded_plan(graph.offsets, graph.num_nodes)[0] < BANDED_PAIR_ADVANTAGE * 2 * len(graph.offsets)


def _table(offsets: Tuple[int, ...], b: int, reach: int, device) -> torch.Tensor:
    """``(b, b + 2R)`` bool: query row r meets key column c iff ``|c - R - r|`` is one of the offsets."""
    rel = (torch.arange(b + 2 * reach, device=device)[None, :] - reach) - torch.arange(b, device=device)[:, None]
    table = torch.zeros(b, b + 2 * reach, dtype=torch.bool, device=device)
    for o in offsets:
        table |= rel.abs() == o
    return table


def _band_masks(mask: torch.Tensor, offsets: Tuple[int, ...], b: int, H: int):
    """Pair mask of the band layout ``(B, H, nb, b, w)`` (expanded over heads and contiguous: ``torch.where``
    with a broadcast bool mask is not vectorised on the CPU), from the offset table and the token mask."""
    B, n = mask.shape
    reach = max(offsets)
    nb, w = -(-n // b), b + 2 * reach
    mp = torch.nn.functional.pad(mask, (reach, nb * b + reach - n))              # False outside [0, n)
    pm = (_table(offsets, b, reach, mask.device)
          & mp[:, reach:reach + nb * b].reshape(B, nb, b, 1)
          & mp.unfold(1, w, b)[:, :, None, :])
    return pm[:, None].expand(B, H, nb, b, w).contiguous()


def _residue_masks(mask: torch.Tensor, k: int, H: int):
    """Pair mask of the residue layout ``(B, H, k, m, m)``: tokens ``q k + r`` of class r meet each other (not
    themselves), real tokens only; ``m = ceil(n / k)``."""
    B = mask.shape[0]
    mr = class_mask(mask, k).reshape(B, k, -1)                                            # (B, k, m)
    m = mr.shape[-1]
    eye = torch.eye(m, dtype=torch.bool, device=mask.device)
    pm = mr[..., :, None] & mr[..., None, :] & ~eye
    return pm[:, None].expand(B, H, k, m, m).contiguous()


def _masks(graph: TokenGraph, plan, H: int, classes: bool = True):
    """``(band mask or None, residue mask or None)`` for ``plan`` (no residue mask where ``classes`` is False: the
    flash op takes the classes), cached on the graph per mask
    ([`TokenGraph.mask_cached`][energies.TokenGraph.mask_cached])."""
    _, band, k = plan
    mask = graph.mask
    n = mask.shape[1]

    def build():
        return (_band_masks(mask, band, banded_block(max(band), n), H) if band else None,
                None if k is None or not classes else _residue_masks(mask, k, H))
    return graph.mask_cached("_banded", (plan, H, classes), build)


def _tile_z(queries, keys, sq_q, sq_k, tau: float) -> torch.Tensor:
    """``z = max(|q|^2 + |k|^2 - 2 q.k, 0) / (2 tau)`` on ``(N, b, w)`` tiles, the scale folded into the sums."""
    s = 0.5 / tau
    base = (sq_q * s)[..., :, None] + (sq_k * s)[..., None, :]
    return torch.baddbmm(base, queries, keys.transpose(1, 2), alpha=-2.0 * s).clamp_min_(0.0)


class _TileSums(torch.autograd.Function):
    """``(agg, deg, energy)`` of the module docstring over tiles: queries ``(N, b, c)``, keys ``(N, w, c)``, their
    squared norms ``(N, b)``, ``(N, w)`` and the pair mask ``(N, b, w)``; energy per tile ``(N,)`` float64 (each
    tile's rows summed in z's dtype, then the row sums in float64: a relative error of about ``log2(w) eps``, inside
    the trace's ``64 eps`` rule).

    The backward pass recomputes z and gamma from the inputs (nothing of size ``(N, b, w)`` is held between the
    passes: the memory of the banded kernel is that of its inputs and outputs) and applies the chain rule by hand;
    with ``G = dL/dz [z > 0] / (2 tau)`` (the clamp's rule),

        dL/dgamma_uv = A_u . (k_v - q_u) + D_u,    dL/dz = dL/dgamma rho''(z) + g_E tau/2 gamma,
        dL/dq_u = -2 sum_v G_uv k_v - deg_u A_u,   dL/dk_v = -2 sum_u G_uv q_u + sum_u gamma_uv A_u,
        dL/d|q_u|^2 = sum_v G_uv,                  dL/d|k_v|^2 = sum_u G_uv,

    (A, D, g_E: the gradients of agg, deg, energy), ``rho''`` as the vector-Jacobian product of ``rho.derivative``
    (any registered rho). First-order only (as the streamed and fused kernels)."""

    @staticmethod
    def forward(ctx, queries, keys, sq_q, sq_k, pm, rho, tau, energy):
        ctx.save_for_backward(queries, keys, sq_q, sq_k, pm)
        ctx.rho, ctx.tau = rho, tau
        z = _tile_z(queries, keys, sq_q, sq_k, tau)
        zero = torch.zeros((), dtype=z.dtype, device=z.device)
        gamma = torch.where(pm, rho.derivative(z), zero)
        deg = gamma.sum(-1)
        agg = torch.baddbmm(queries * -deg[..., None], gamma, keys)
        e = (0.5 * tau * torch.where(pm, rho.value(z), zero).sum(-1).to(torch.float64).sum(-1) if energy
             else torch.zeros(z.shape[0], dtype=torch.float64, device=z.device))
        return agg, deg, e

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_agg, g_deg, g_e):
        queries, keys, sq_q, sq_k, pm = ctx.saved_tensors
        rho, tau = ctx.rho, ctx.tau
        z = _tile_z(queries, keys, sq_q, sq_k, tau)
        zero = torch.zeros((), dtype=z.dtype, device=z.device)
        with torch.enable_grad():
            zz = z.requires_grad_()
            rd = rho.derivative(zz)
        gamma = torch.where(pm, rd.detach(), zero)
        dgamma = torch.zeros_like(z) if g_deg is None else g_deg[..., None].expand_as(z).clone()
        if g_agg is not None:
            dgamma.baddbmm_(g_agg, keys.transpose(1, 2)).sub_((g_agg * queries).sum(-1)[..., None])
        dz = torch.autograd.grad(rd, zz, torch.where(pm, dgamma, zero))[0]          # dL/dgamma rho''(z)
        if g_e is not None:
            dz.add_(gamma * (0.5 * tau * g_e.to(z.dtype))[:, None, None])
        G = torch.where(z > 0, dz, zero).mul_(0.5 / tau)
        dq = torch.bmm(G, keys).mul_(-2.0)
        dk = torch.bmm(G.transpose(1, 2), queries).mul_(-2.0)
        if g_agg is not None:
            dq.sub_(gamma.sum(-1)[..., None] * g_agg)
            dk.baddbmm_(gamma.transpose(1, 2), g_agg)
        return dq, dk, G.sum(-1), G.sum(-2), None, None, None, None


def _tile_sums(queries, keys, sq_q, sq_k, pm, rho: Rho, tau: float, energy: bool, num: bool):
    """The module docstring's sums over tiles: queries ``(B, H, t, b, c)``, keys ``(B, H, t, w, c)``, their squared
    norms, the pair mask ``(B, H, t, b, w)``. Returns ``(agg (B, H, t, b, c) or None, deg (B, H, t, b), energy
    (B, H) or None)`` (`_TileSums`)."""
    lead, (b, c), w = queries.shape[:-2], queries.shape[-2:], keys.shape[-2]
    agg, deg, e = _TileSums.apply(queries.reshape(-1, b, c), keys.reshape(-1, w, c), sq_q.reshape(-1, b),
                                  sq_k.reshape(-1, w), pm.reshape(-1, b, w), rho, tau, energy)
    return (agg.reshape(*lead, b, c) if num else None, deg.reshape(*lead, b),
            e.reshape(*lead).sum(-1) if energy else None)


def _softmax_route(rho: Rho, Z: torch.Tensor) -> bool:
    """Whether the residue layout's classes go to the fused flash op (rho = exp, CPU op present, float32/64)."""
    from ..rho import ExpRho
    from .fused_ops import fused_available
    return (isinstance(rho, ExpRho) and Z.dtype in (torch.float32, torch.float64)
            and fused_available(Z.device.type, Z.dtype))


def _add(a, x):
    """``a + x``, where None is no sum yet (``a``) or a part not computed (``x``: the result is then None)."""
    return x if a is None else (None if x is None else a + x)


def _band_sums(Z, sq, band, band_pm, rho, tau: float, energy: bool, num: bool):
    """``(agg or None, deg, energy or None)`` of the band layout: query blocks of b tokens against their key windows
    of ``b + 2R`` (module docstring)."""
    B, H, n, c = Z.shape
    reach = max(band)
    b = banded_block(reach, n)
    nb, w = -(-n // b), b + 2 * reach
    pad = (reach, nb * b + reach - n)
    Zp = torch.nn.functional.pad(Z, (0, 0) + pad)                             # zeros outside [0, n)
    keys = Zp.unfold(2, w, b).transpose(-1, -2).contiguous()                  # (B, H, nb, w, c)
    queries = torch.nn.functional.pad(Z, (0, 0, 0, nb * b - n)).reshape(B, H, nb, b, c)
    sqp = torch.nn.functional.pad(sq, pad)
    a, d, e = _tile_sums(queries, keys, sqp[:, :, reach:reach + nb * b].reshape(B, H, nb, b),
                         sqp.unfold(2, w, b), band_pm, rho, tau, energy, num)
    deg = d.reshape(B, H, nb * b)[:, :, :n]
    agg = None if a is None else a.reshape(B, H, nb * b, c)[:, :, :n]
    return agg, deg, e


def _softmax_class_sums(Z, sq, mask, k: int, tau: float, energy: bool):
    """``(agg, deg, energy or None)`` of the residue classes for rho = exp, each class through the flash op."""
    B, H, n, _ = Z.shape
    # rho = exp: each class is a complete graph, the fused kernel's case (self pair included, then
    # removed: deg = expm1(LSE)), so the flash op does the class's n/k x n/k pairs at its own speed
    from .lse import degree_energy, from_lse, fused_parts
    mr = class_mask(mask, k)
    diff, lse = fused_parts(to_classes(Z, k), mr, tau, to_classes(sq, k))
    a, d = from_lse(diff, lse, mr.to(Z.dtype)[:, None])
    er = degree_energy(d, tau).reshape(B, k, H).sum(1) if energy else None
    return from_classes(a, k, n), from_classes(d, k, n), er


def _class_sums(Z, sq, k: int, res_pm, rho, tau: float, energy: bool, num: bool):
    """``(agg or None, deg, energy or None)`` of the residue classes on ``(B, H, k, m, c)`` tiles (any rho)."""
    B, H, n, c = Z.shape
    m = -(-n // k)
    Zr = to_classes(Z, k).reshape(B, k, H, m, c).transpose(1, 2)                 # (B, H, k, m, c)
    sqr = to_classes(sq, k).reshape(B, k, H, m).transpose(1, 2)
    a, d, er = _tile_sums(Zr, Zr, sqr, sqr, res_pm, rho, tau, energy, num)
    d = from_classes(d.transpose(1, 2).reshape(B * k, H, m), k, n)
    a = None if a is None else from_classes(a.transpose(1, 2).reshape(B * k, H, m, c), k, n)
    return a, d, er


def banded_sums(Z: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                sq: Optional[torch.Tensor] = None):
    """``(agg or None, deg, energy or None)`` of the module docstring for features Z ``(B, H, n, c)`` (centred,
    zero on padded slots) on ``graph`` (a [`TokenGraph`][energies.TokenGraph] with offsets); agg ``(B, H, n, c)``, deg
    ``(B, H, n)``, energy ``(B, H)`` float64. ``sq``: ``|z_u|^2``
    ``(B, H, n)`` when already computed. The layout is `banded_plan`'s: a band, a residue layout, or both
    (their pair sets are disjoint, so their sums add)."""
    B, H, n, c = Z.shape
    plan = banded_plan(graph.offsets, n)
    _, band, k = plan
    soft = k is not None and _softmax_route(rho, Z)
    band_pm, res_pm = _masks(graph, plan, H, classes=not soft)
    sq = (Z * Z).sum(-1) if sq is None else sq
    agg = deg = e = None
    if band:
        agg, deg, e = _band_sums(Z, sq, band, band_pm, rho, tau, energy, num)
    if k is not None:
        a, d, er = (_softmax_class_sums(Z, sq, graph.mask, k, tau, energy) if soft
                    else _class_sums(Z, sq, k, res_pm, rho, tau, energy, num))
        deg = _add(deg, d)
        if num:
            agg = _add(agg, a)
        e = _add(e, er) if energy else None
    if deg is None:                                     # no offsets: no edge
        deg = Z.new_zeros(B, H, n)
        agg = Z.new_zeros(B, H, n, c) if num else None
        e = Z.new_zeros(B, H, dtype=torch.float64) if energy else None
    return agg, deg, e


@register_kernel("banded", _supports, expansion=True, auto=banded_pays, heads=banded_sums)
def _banded_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """Shift-invariant graphs (offsets), block by block (module docstring)."""
    agg, deg, e = banded_sums(Y[:, None], graph, rho, tau, energy, num, None if sq is None else sq[:, None])
    return PairwisePass(None if agg is None else agg[:, 0], deg[:, 0], None if e is None else e[:, 0])
