"""Pairwise sums over a token graph: the one place where edges meet tensors.

Three kernels compute the same quantities, so that energies and updates share the math and only
swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory);
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n);
* ``softmax``: complete graph with rho = exp only: softmax over all keys with key bias
  ``log beta_v = -|z_v|^2 / (2 tau)``, self included (supplement eq. 35, 39);
* ``streamed``: complete graph, any rho, tiles of ``STREAM_TILE`` keys: O(B n tile) memory forward
  and backward (a custom autograd function recomputes one tile at a time in the backward pass). No running log-sum-exp is needed:
  ``gamma = rho'(z)`` is bounded for every rho here and the step divides by ``1 + deg``, so plain
  sums of tiles are safe.

For edge weights ``gamma_uv = rho'(z_uv)``, ``z_uv = ||y_u - y_v||^2 / (2 tau)``, one pass returns

    num_u = sum_{v in N(u)} gamma_uv y_v,     deg_u = sum_{v in N(u)} gamma_uv,

and, from the same pass, the pairwise energy ``sum_{{u,v} in E} tau rho(z_uv)`` per example.
On the softmax kernel the energy comes from the log-sum-exp of the pass itself: with
``S_u = exp(LSE_u + log beta_u) = sum_v gamma_uv`` (self included, gamma_uu = 1),
``deg_u = S_u (1 - p_uu)`` and the energy is ``-tau/2 sum_u deg_u`` (../shared/NOTES.md).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from .errors import EnergyError
from .graph import TokenGraph
from .rho import ExpRho, Rho

__all__ = ["KERNELS", "pick_kernel", "edge_z", "dense_z", "PairwisePass", "pairwise_pass",
           "weighted_neighbour_sums", "pairwise_energy"]

KERNELS = ("edges", "dense", "softmax", "streamed")
#: key tile of the streamed kernel, and the n above which ``auto`` streams a complete graph
STREAM_TILE = 256
STREAM_MIN_N = 1024


class PairwisePass(NamedTuple):
    num: torch.Tensor               # (B, n, d)  sum_v gamma_uv y_v
    deg: torch.Tensor               # (B, n)     sum_v gamma_uv
    energy: Optional[torch.Tensor]  # (B,) float64, sum_E tau rho(z), or None when not asked for


def pick_kernel(graph: TokenGraph, rho: Rho, kernel: str = "auto") -> str:
    """``auto``: softmax for the complete graph with rho = exp, dense for other complete graphs,
    edges otherwise. An explicit ``softmax`` that does not apply is an error."""
    if kernel == "auto":
        if graph.is_complete:
            if graph.num_nodes > STREAM_MIN_N:
                return "streamed"
            return "softmax" if isinstance(rho, ExpRho) else "dense"
        return "edges"
    if kernel not in KERNELS:
        raise EnergyError(f"unknown pairwise kernel {kernel!r}; valid: {list(KERNELS) + ['auto']}")
    if kernel == "streamed" and not graph.is_complete:
        raise EnergyError(f"the streamed kernel is for the complete graph; got graph {graph.name!r} (use 'edges')")
    if kernel == "softmax" and not (graph.is_complete and isinstance(rho, ExpRho)):
        raise EnergyError("the softmax kernel needs the complete graph and rho='exp'; "
                          f"got graph {graph.name!r}, rho {rho.spec()!r}")
    return kernel


def edge_z(Yf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, tau: float) -> torch.Tensor:
    """``z_e = ||y_src - y_dst||^2 / (2 tau)`` per edge, from explicit differences."""
    diff = Yf[src] - Yf[dst]
    return (diff * diff).sum(-1) / (2.0 * tau)


def dense_z(Y: torch.Tensor, tau: float, K: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(B, n, m)`` matrix of ``z_uv = |y_u - k_v|^2 / (2 tau)`` for keys K (default: Y itself) by the
    expansion ``|y_u|^2 + |k_v|^2 - 2 y_u.k_v``, clamped at 0."""
    K = Y if K is None else K
    d2 = (Y * Y).sum(-1)[:, :, None] + (K * K).sum(-1)[:, None, :] - 2.0 * Y @ K.transpose(1, 2)
    return torch.clamp(d2, min=0.0) / (2.0 * tau)


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def pairwise_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                  energy: bool = False, num: bool = True) -> PairwisePass:
    """One pass over the graph: ``(num, deg)`` in Y's dtype and, if asked, the pairwise energy.
    ``num=False`` skips the weighted sums of neighbours (``num`` is then None): an energy-only pass."""
    kernel = pick_kernel(graph, rho, kernel)
    Y = graph.zero_padded(Y)
    B, n, d = Y.shape
    if kernel == "softmax":
        sq = (Y * Y).sum(-1)
        logits = Y @ Y.transpose(1, 2) / tau - (0.5 / tau) * sq[:, None, :]  # key bias log beta_v
        logits = logits.masked_fill(~graph.mask[:, None, :], -math.inf)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        log_p_self = torch.diagonal(logits, dim1=1, dim2=2) - lse[..., 0]     # log p_uu = -log S_u
        p_self = torch.exp(log_p_self)
        S = torch.exp(lse[..., 0] - (0.5 / tau) * sq)                       # sum over all v, self included
        off = -torch.expm1(log_p_self)                                       # 1 - p_uu, without cancellation
        real = graph.mask.to(Y.dtype)
        deg = S * off * real
        nums = None
        if num:  # the n x n probabilities only when the neighbour sums are wanted
            p = torch.exp(logits - lse)
            nums = (S[..., None] * (p @ Y - p_self[..., None] * Y)) * real[..., None]
        e = -0.5 * tau * deg.sum(-1, dtype=torch.float64) if energy else None
        return PairwisePass(nums, deg, e)
    if kernel == "streamed":
        return _streamed_pass(Y, graph, rho, tau, energy, num)
    if kernel == "dense":
        z = dense_z(Y, tau)
        pm = graph.pair_mask()
        zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
        gamma = torch.where(pm, rho.derivative(z), zero)
        e = 0.5 * tau * _f64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
        return PairwisePass(gamma @ Y if num else None, gamma.sum(-1), e)
    Yf = Y.reshape(B * n, d)
    src, dst = graph.edges()
    z = edge_z(Yf, src, dst, tau)
    gamma = rho.derivative(z)
    nums = None
    if num:
        nums = torch.zeros_like(Yf).index_add(0, src, gamma[:, None] * Yf[dst]).index_add(0, dst, gamma[:, None] * Yf[src])
        nums = nums.reshape(B, n, d)
    deg = torch.zeros(B * n, dtype=Y.dtype, device=Y.device).index_add(0, src, gamma).index_add(0, dst, gamma)
    e = None
    if energy:
        e = torch.zeros(B, dtype=torch.float64, device=Y.device).index_add(0, src // n, _f64(tau * rho.value(z)))
    return PairwisePass(nums, deg.reshape(B, n), e)


def _tile(Y: torch.Tensor, mask: torch.Tensor, rho: Rho, tau: float, s: int, tile: int, energy: bool):
    """Queries = all tokens, keys = tokens s .. s + tile: ``(deg part, num part, energy part or None)``."""
    n = Y.shape[1]
    K = Y[:, s:s + tile]
    rows = torch.arange(n, device=Y.device)
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    z = dense_z(Y, tau, K)
    pm = mask[:, :, None] & mask[:, None, s:s + tile] & (rows[:, None] != rows[None, s:s + tile])
    gamma = torch.where(pm, rho.derivative(z), zero)
    e = 0.5 * tau * _f64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return gamma.sum(-1), gamma @ K, e


class _StreamedSums(torch.autograd.Function):
    """``(num, deg, energy)`` over key tiles; the backward pass recomputes one tile at a time, so the
    memory held is O(B n tile) forward and backward. The energy output is not differentiable."""

    @staticmethod
    def forward(ctx, Y, mask, rho, tau, tile, energy):
        ctx.save_for_backward(Y, mask)
        ctx.rho, ctx.tau, ctx.tile = rho, tau, tile
        B, n, d = Y.shape
        num, deg = torch.zeros_like(Y), torch.zeros(B, n, dtype=Y.dtype, device=Y.device)
        e = torch.zeros(B, dtype=torch.float64, device=Y.device)
        for s in range(0, n, tile):
            dg, nm, en = _tile(Y, mask, rho, tau, s, tile, energy)
            deg += dg
            num += nm
            if energy:
                e += en
        ctx.mark_non_differentiable(e)
        return num, deg, e

    @staticmethod
    def backward(ctx, g_num, g_deg, g_e):
        Y, mask = ctx.saved_tensors
        grad = torch.zeros_like(Y)
        for s in range(0, Y.shape[1], ctx.tile):
            with torch.enable_grad():
                Yd = Y.detach().requires_grad_()
                dg, nm, _ = _tile(Yd, mask, ctx.rho, ctx.tau, s, ctx.tile, False)
                outs, grads = [], []
                for o, g in ((dg, g_deg), (nm, g_num)):
                    if g is not None:
                        outs.append(o)
                        grads.append(g)
                if outs:
                    grad += torch.autograd.grad(outs, Yd, grads)[0]
        return grad, None, None, None, None, None


def _streamed_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                   tile: Optional[int] = None) -> PairwisePass:
    """The complete-graph pass over key tiles (see the module docstring)."""
    nums, deg, e = _StreamedSums.apply(Y, graph.mask, rho, tau, tile or STREAM_TILE, energy)
    return PairwisePass(nums if num else None, deg, e if energy else None)


def weighted_neighbour_sums(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto"):
    """``(num, deg)`` with ``num_u = sum_v gamma_uv y_v`` ``(B, n, d)`` and ``deg_u = sum_v gamma_uv`` ``(B, n)``."""
    out = pairwise_pass(Y, graph, rho, tau, kernel)
    return out.num, out.deg


def pairwise_energy(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto") -> torch.Tensor:
    """``sum_{{u,v} in E} tau * rho(z_uv)`` per example, ``(B,)`` float64, each undirected edge once.

    Evaluated directly from the pairs (dense or edges kernel), never from a log-sum-exp, so that it
    is an independent check of the energy the softmax pass reports."""
    kernel = pick_kernel(graph, rho, kernel)
    if kernel == "softmax":
        kernel = "dense"
    return pairwise_pass(Y, graph, rho, tau, kernel, energy=True, num=False).energy
