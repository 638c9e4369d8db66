"""Pairwise sums over a token graph: the one place where edges meet tensors.

Three kernels compute the same quantities, so that energies and updates share the math and only
swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory);
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n);
* ``softmax``: complete graph with rho = exp only: softmax over all keys with key bias
  ``log beta_v = -|z_v|^2 / (2 tau)``, self included (supplement eq. 35, 39), explicit n x n logits;
* ``fused``: the same softmax form in one flash-attention kernel call (:mod:`energies.fused`): no
  n x n matrix, the log-sum-exp differentiable, CPU only;
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
from .fused import fused_available, fused_attention
from .graph import TokenGraph
from .rho import ExpRho, Rho

__all__ = ["KERNELS", "pick_kernel", "edge_z", "dense_z", "PairwisePass", "pairwise_pass",
           "weighted_neighbour_sums", "pairwise_energy"]

KERNELS = ("edges", "dense", "softmax", "fused", "streamed")
#: key tile of the streamed kernel, and the n above which ``auto`` streams a complete graph
STREAM_TILE = 256
STREAM_MIN_N = 1024


class PairwisePass(NamedTuple):
    num: torch.Tensor               # (B, n, d)  sum_v gamma_uv y_v
    deg: torch.Tensor               # (B, n)     sum_v gamma_uv
    energy: Optional[torch.Tensor]  # (B,) float64, sum_E tau rho(z), or None when not asked for


def pick_kernel(graph: TokenGraph, rho: Rho, kernel: str = "auto") -> str:
    """``auto``: on the complete graph with rho = exp the fused kernel where its op exists (CPU),
    else softmax (streamed above ``STREAM_MIN_N`` tokens); other rho on the complete graph: dense,
    streamed above ``STREAM_MIN_N``; any other graph: edges. A kernel that does not apply is an error."""
    if kernel == "auto":
        if not graph.is_complete:
            return "edges"
        if isinstance(rho, ExpRho):
            if fused_available(graph.mask.device.type):
                return "fused"
            return "streamed" if graph.num_nodes > STREAM_MIN_N else "softmax"
        return "streamed" if graph.num_nodes > STREAM_MIN_N else "dense"
    if kernel not in KERNELS:
        raise EnergyError(f"unknown pairwise kernel {kernel!r}; valid: {list(KERNELS) + ['auto']}")
    if kernel == "streamed" and not graph.is_complete:
        raise EnergyError(f"the streamed kernel is for the complete graph; got graph {graph.name!r} (use 'edges')")
    if kernel in ("softmax", "fused") and not (graph.is_complete and isinstance(rho, ExpRho)):
        raise EnergyError(f"the {kernel} kernel needs the complete graph and rho='exp'; "
                          f"got graph {graph.name!r}, rho {rho.spec()!r}")
    if kernel == "fused" and not fused_available(graph.mask.device.type):
        raise EnergyError(f"the fused kernel needs PyTorch's CPU flash-attention op, not available on "
                          f"{graph.mask.device.type!r}; use 'softmax' or 'streamed'")
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


def _explicit_parts(Y: torch.Tensor, graph: TokenGraph, tau: float, sq: torch.Tensor, num: bool):
    """``(P Y or None, LSE)`` of the softmax over all keys with key bias ``log beta_v = -|y_v|^2 / (2 tau)``,
    self included, from the explicit ``(B, n, n)`` logits."""
    logits = Y @ Y.transpose(1, 2) / tau - (0.5 / tau) * sq[:, None, :]
    logits = logits.masked_fill(~graph.mask[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    attn = torch.exp(logits - lse) @ Y if num else None
    return attn, lse[..., 0]


#: key feature of padded tokens in the fused form: logit -PAD_LOGIT, so that p = 0 exactly
PAD_LOGIT = 1.0e4


def _fused_parts(Y: torch.Tensor, graph: TokenGraph, tau: float, sq: torch.Tensor, num: bool):
    """The same ``(P Y, LSE)`` from one fused kernel call (:mod:`energies.fused`). The key bias is
    folded into one extra feature, ``[y_u, 1] . [y_v, -|y_v|^2 / 2] / tau``, and the values carry a
    zero there, so that q, k, v share one head size and no n x n matrix is formed."""
    one = torch.ones_like(sq)[..., None]
    bias = torch.where(graph.mask, -0.5 * sq, torch.full_like(sq, -PAD_LOGIT * tau))[..., None]
    q = torch.cat([Y, one], -1)[:, None]
    k = torch.cat([Y, bias], -1)[:, None]
    v = torch.cat([Y, torch.zeros_like(one)], -1)[:, None]
    attn, lse = fused_attention(q, k, v, 1.0 / tau)
    return attn[:, 0, :, :-1], lse[:, 0]


def pairwise_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                  energy: bool = False, num: bool = True) -> PairwisePass:
    """One pass over the graph: ``(num, deg)`` in Y's dtype and, if asked, the pairwise energy.
    ``num=False`` skips the weighted sums of neighbours (``num`` is then None): an energy-only pass."""
    kernel = pick_kernel(graph, rho, kernel)
    Y = graph.zero_padded(Y)
    B, n, d = Y.shape
    if kernel in ("softmax", "fused"):
        sq = (Y * Y).sum(-1)
        attn, lse = (_fused_parts if kernel == "fused" else _explicit_parts)(Y, graph, tau, sq, num)
        # log p_uu = l_uu - LSE_u = -log S_u <= 0 (l_uu = |y_u|^2 / 2tau); padded queries get a dummy -1
        log_p_self = torch.where(graph.mask, torch.clamp((0.5 / tau) * sq - lse, max=0.0), -torch.ones_like(sq))
        S = torch.exp(-log_p_self)                # sum over all v, self included
        off = -torch.expm1(log_p_self)            # 1 - p_uu, without cancellation
        real = graph.mask.to(Y.dtype)
        deg = S * off * real
        nums = None
        if num:
            nums = (S[..., None] * (attn - torch.exp(log_p_self)[..., None] * Y)) * real[..., None]
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
    if kernel in ("softmax", "fused"):
        kernel = "dense"
    return pairwise_pass(Y, graph, rho, tau, kernel, energy=True, num=False).energy
