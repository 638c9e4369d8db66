"""The ``softmax`` kernel: complete graph, rho = exp, softmax over all keys of the logits ``-z_uv`` (self included),
explicit n x n logits; its log-sum-exp gives the degrees and the energy (`energies.kernels`). The parts it shares
with the ``fused`` and ``banded`` kernels and the multi-head pass are in `energies.kernels.lse`."""
from __future__ import annotations

import math

import torch

from ..graphs import TokenGraph
from .guard import dense_z
from .lse import degree_energy, from_lse, softmax_degrees, softmax_supports
from .registry import PairwisePass, register_kernel

__all__ = ["softmax_kernel"]


def _softmax_parts(Y: torch.Tensor, graph: TokenGraph, tau: float, num: bool):
    """``(P Y - Y or None, LSE)`` of the softmax over all keys of the logits ``-z_uv`` (self included, so
    ``LSE_u = log(1 + deg_u) >= 0``), for centred tokens Y, from explicit ``(B, n, n)`` logits with the diagonal
    exactly 0 (the one-call form is the ``fused`` kernel's, `energies.kernels.lse.fused_parts`)."""
    z = dense_z(Y, tau)
    eye = torch.eye(Y.shape[1], dtype=torch.bool, device=Y.device)
    logits = (-z).masked_fill(eye, 0.0).masked_fill(~graph.mask[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    diff = torch.exp(logits - lse) @ Y - Y if num else None
    return diff, lse[..., 0]


@register_kernel("softmax", softmax_supports, expansion=True)
def softmax_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """Softmax over all keys of the logits ``-z_uv`` (self included): ``deg_u = expm1(LSE_u)``,
    ``agg_u = (1 + deg_u) (P Y - Y)_u``, the energy ``-tau/2 sum_u deg_u`` (module docstring). The ``fused``
    kernel runs it where no fused op serves the features' dtype.

    Args:
        Y: centred tokens ``(B, n, d)`` in a dtype the precision guard accepts, zero on padded slots.
        graph: the complete [`TokenGraph`][energies.TokenGraph].
        rho: the penalty, ``exp`` (`softmax_supports`).
        tau: the temperature, > 0.
        energy: also return the pairwise energy per example (float64).
        num: compute the neighbour sums; False: the energy-only pass (`softmax_degrees`).
        metric: unused (the dispatcher passes features already mapped).
        sq: ``|y_u|^2`` ``(B, n)`` when already computed.

    Returns:
        The `PairwisePass` ``(agg or None, deg, energy or None)``.
    """
    if not num:                                     # energy-only: no neighbour sums, half the exponentials
        deg = softmax_degrees(Y, graph.mask, tau, sq)
        agg = None
    else:
        diff, lse = _softmax_parts(Y, graph, tau, num)
        agg, deg = from_lse(diff, lse, graph.mask.to(Y.dtype))
    return PairwisePass(agg, deg, degree_energy(deg, tau) if energy else None)
