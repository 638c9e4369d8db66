"""The ``banded`` pairwise kernel: shift-invariant graphs (window, dilated, strided) in a block-ordered layout.

A graph with offsets ``O`` (:attr:`~energies.graph.TokenGraph.offsets`: the edges are every pair ``{i, i + o}``,
``o in O``, of real tokens) and reach ``R = max O`` is cut into blocks of ``b`` tokens (``b`` a multiple of
``BANDED_ALIGN``, at least R and ``BANDED_MIN_BLOCK``; n padded to a multiple of b with masked slots). Query block
``k`` (tokens ``kb .. kb + b - 1``) meets the ``w = b + 2R`` keys ``kb - R .. kb + b + R - 1``, which hold every
neighbour of its queries. Per tile, batched over examples, heads and blocks, with the expansion on the centred
features Z that the kernel receives (``expansion=True``, :class:`~energies.pairwise.Kernel`):

    z_uv = max(|z_u|^2 + |z_v|^2 - 2 z_u . z_v, 0) / (2 tau),    gamma_uv = rho'(z_uv) [uv in E],

    deg_u = sum_v gamma_uv,    agg_u = sum_v gamma_uv z_v - deg_u z_u = sum_v gamma_uv (z_v - z_u),

    energy = tau / 2 sum_u sum_v [uv in E] rho(z_uv)    (float64 per example: each undirected edge once),

exactly what the ``dense`` kernel computes on the ``(n, n)`` matrix, here on ``(n, w)`` weights per head (never
n x n). ``[uv in E]`` is a static ``(b, w)`` 0/1 table (``|v - u| in O`` for query row r and key column c,
``v - u = c - R - r``) times the token mask of both ends (slots outside ``[0, n)`` are masked). Memory for the
weights ``O(n w)`` per head; the key windows ``O(n w d / b)``.

``supports``: every graph with offsets (a strided graph reaches the whole sequence, so its tiles cover all of it:
correct, at dense cost). :func:`banded_pays` is the rule of ``auto`` on the CPU: use banded where the key window
is short against the sequence, ``w < n / 2``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .graph import TokenGraph
from .pairwise import PairwisePass, register_kernel
from .rho import Rho

__all__ = ["banded_block", "banded_pays", "banded_sums", "BANDED_ALIGN", "BANDED_MIN_BLOCK"]

#: the block size is a multiple of this
BANDED_ALIGN = 8
#: the smallest block (8, 16 and 32 measured within 10 % of each other on window:8, n = 512)
BANDED_MIN_BLOCK = 8


def banded_block(reach: int, n: int) -> int:
    """Block size b for offsets reaching ``reach``: the multiple of ``BANDED_ALIGN`` at least ``reach`` and
    ``BANDED_MIN_BLOCK``, and no more than n rounded up (one block covers a short sequence)."""
    b = max(reach, BANDED_MIN_BLOCK)
    b = -(-b // BANDED_ALIGN) * BANDED_ALIGN
    return min(b, -(-n // BANDED_ALIGN) * BANDED_ALIGN)


def banded_pays(graph: TokenGraph) -> bool:
    """The ``auto`` rule on the CPU: a shift-invariant graph whose key window ``b + 2R`` is under n / 2."""
    if graph.offsets is None:
        return False
    n = graph.num_nodes
    reach = max(graph.offsets, default=0)
    return banded_block(reach, n) + 2 * reach < n / 2


def _supports(graph: TokenGraph, rho: Rho) -> Optional[str]:
    if graph.offsets is None:
        return f"needs a shift-invariant graph (window, dilated, strided); got graph {graph.name!r} (use 'edges')"
    return None


def _table(offsets: Tuple[int, ...], b: int, reach: int, device) -> torch.Tensor:
    """``(b, b + 2R)`` bool: query row r meets key column c iff ``|c - R - r|`` is one of the offsets."""
    rel = (torch.arange(b + 2 * reach, device=device)[None, :] - reach) - torch.arange(b, device=device)[:, None]
    table = torch.zeros(b, b + 2 * reach, dtype=torch.bool, device=device)
    for o in offsets:
        table |= rel.abs() == o
    return table


def banded_sums(Z: torch.Tensor, mask: torch.Tensor, offsets: Tuple[int, ...], rho: Rho, tau: float,
                energy: bool, num: bool, sq: Optional[torch.Tensor] = None, block: Optional[int] = None):
    """``(agg or None, deg, energy or None)`` of the module docstring for features Z ``(B, H, n, c)`` (centred,
    zero on padded slots), mask ``(B, n)``; agg ``(B, H, n, c)``, deg ``(B, H, n)``, energy ``(B, H)`` float64.
    ``sq``: ``|z_u|^2`` ``(B, H, n)`` when already computed. ``block``: b (default :func:`banded_block`)."""
    B, H, n, c = Z.shape
    reach = max(offsets, default=0)
    b = block or banded_block(reach, n)
    nb = -(-n // b)
    w = b + 2 * reach
    total = nb * b + 2 * reach                                    # R slots before, R + padding after
    pad = (reach, total - reach - n)
    sq = (Z * Z).sum(-1) if sq is None else sq
    Zp = torch.nn.functional.pad(Z, (0, 0) + pad)                 # (B, H, total, c), zeros outside [0, n)
    keys = Zp.unfold(2, w, b)                                     # (B, H, nb, c, w): the key window of each block
    queries = Zp[:, :, reach:reach + nb * b].reshape(B, H, nb, b, c)
    sqp = torch.nn.functional.pad(sq, pad)
    sq_k = sqp.unfold(2, w, b)                                    # (B, H, nb, w)
    sq_q = sqp[:, :, reach:reach + nb * b].reshape(B, H, nb, b)
    mp = torch.nn.functional.pad(mask, pad)                       # (B, total), False outside [0, n)
    pm = (_table(offsets, b, reach, Z.device)
          & mp[:, reach:reach + nb * b].reshape(B, nb, b, 1)
          & mp.unfold(1, w, b)[:, :, None, :])[:, None]          # (B, 1, nb, b, w)
    d2 = sq_q[..., None] + sq_k[..., None, :] - 2.0 * (queries @ keys)
    z = torch.clamp(d2, min=0.0) / (2.0 * tau)                    # (B, H, nb, b, w)
    zero = torch.zeros((), dtype=Z.dtype, device=Z.device)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)                                           # (B, H, nb, b)
    agg = None
    if num:
        agg = (gamma @ keys.transpose(-1, -2) - deg[..., None] * queries).reshape(B, H, nb * b, c)[:, :, :n]
    e = None
    if energy:
        e = 0.5 * tau * torch.where(pm, rho.value(z), zero).to(torch.float64).sum((2, 3, 4))
    return agg, deg.reshape(B, H, nb * b)[:, :, :n], e


@register_kernel("banded", _supports, expansion=True)
def _banded_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """Shift-invariant graphs (offsets), block by block (module docstring)."""
    agg, deg, e = banded_sums(Y[:, None], graph.mask, graph.offsets, rho, tau, energy, num,
                              None if sq is None else sq[:, None])
    return PairwisePass(None if agg is None else agg[:, 0], deg[:, 0], None if e is None else e[:, 0])
