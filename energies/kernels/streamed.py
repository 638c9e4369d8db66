"""The ``streamed`` kernel: complete graph, any rho, tiles of ``STREAM_TILE`` keys, O(B n tile) memory forward and
backward (a custom autograd function recomputes one tile at a time); with ``explicit=True`` z from explicit
differences, the exact pass the dispatcher falls back to where the expansion cannot resolve z."""
from __future__ import annotations

from typing import Optional

import torch

from ..graphs import TokenGraph
from ..rho import Rho
from .guard import dense_z, explicit_tile, explicit_z, to_float64
from .registry import PairwisePass, register_kernel

#: key tile of the streamed kernel, and the n above which ``auto`` streams a complete graph
STREAM_TILE = 256
STREAM_MIN_N = 1024


def _complete_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    return None if graph.is_complete else f"is for the complete graph; got graph {graph.name!r} (use 'edges')"


@register_kernel("streamed", _complete_only, expansion=True)
def _streamed_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """Complete graph, any rho, tiles of ``STREAM_TILE`` keys."""
    return streamed_pass(Y, graph, rho, tau, energy, num)


def _tile(Y: torch.Tensor, mask: torch.Tensor, rho: Rho, tau: float, s: int, tile: int, energy: bool,
          explicit: bool = False):
    """Queries = all tokens, keys = tokens s .. s + tile: ``(deg part, agg part, energy part or None)``."""
    n = Y.shape[1]
    K = Y[:, s:s + tile]
    rows = torch.arange(n, device=Y.device)
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    pm = mask[:, :, None] & mask[:, None, s:s + tile] & (rows[:, None] != rows[None, s:s + tile])
    if explicit:
        z, diff = explicit_z(Y, K, tau)
    else:
        z = dense_z(Y, tau, K)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)
    agg = (gamma[..., None] * diff).sum(2) if explicit else gamma @ K - deg[..., None] * Y
    e = 0.5 * tau * to_float64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return deg, agg, e


class _StreamedSums(torch.autograd.Function):
    """``(agg, deg, energy)`` over key tiles; the backward pass recomputes one tile at a time, so the
    memory held is O(B n tile) forward and backward. The energy output is not differentiable."""

    @staticmethod
    def forward(ctx, Y, mask, rho, tau, tile, energy, explicit):
        ctx.save_for_backward(Y, mask)
        ctx.rho, ctx.tau, ctx.tile, ctx.explicit = rho, tau, tile, explicit
        B, n, d = Y.shape
        agg, deg = torch.zeros_like(Y), torch.zeros(B, n, dtype=Y.dtype, device=Y.device)
        e = torch.zeros(B, dtype=torch.float64, device=Y.device)
        for s in range(0, n, tile):
            dg, ag, en = _tile(Y, mask, rho, tau, s, tile, energy, explicit)
            deg += dg
            agg += ag
            if energy:
                e += en
        ctx.mark_non_differentiable(e)
        return agg, deg, e

    @staticmethod
    def backward(ctx, g_agg, g_deg, g_e):
        Y, mask = ctx.saved_tensors
        grad = torch.zeros_like(Y)
        for s in range(0, Y.shape[1], ctx.tile):
            with torch.enable_grad():
                Yd = Y.detach().requires_grad_()
                dg, ag, _ = _tile(Yd, mask, ctx.rho, ctx.tau, s, ctx.tile, False, ctx.explicit)
                outs, grads = [], []
                for o, g in ((dg, g_deg), (ag, g_agg)):
                    if g is not None:
                        outs.append(o)
                        grads.append(g)
                if outs:
                    grad += torch.autograd.grad(outs, Yd, grads)[0]
        return grad, None, None, None, None, None, None


def streamed_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                   tile: Optional[int] = None, explicit: bool = False) -> PairwisePass:
    """The complete-graph pass over key tiles (see the module docstring): the ``streamed`` kernel, and with
    ``explicit`` the exact pass the dispatcher falls back to where the expansion cannot resolve z.

    Args:
        Y: the tokens (or centred features) ``(B, n, d)``, zero on padded slots.
        graph: the complete [`TokenGraph`][energies.TokenGraph].
        rho: the penalty.
        tau: the temperature, > 0.
        energy: also return the pairwise energy per example (float64).
        num: return the neighbour sums.
        tile: keys per tile (default ``STREAM_TILE``).
        explicit: z from explicit differences (any scale), with tiles small enough to hold
            ``EXPLICIT_TILE_ELEMENTS``.

    Returns:
        The `PairwisePass` ``(agg or None, deg, energy or None)``.
    """
    tile = tile or STREAM_TILE
    if explicit:
        tile = explicit_tile(Y, Y.shape[-1], tile)
    agg, deg, e = _StreamedSums.apply(Y, graph.mask, rho, tau, tile, energy, explicit)
    return PairwisePass(agg if num else None, deg, e if energy else None)
