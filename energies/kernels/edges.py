"""The ``edges`` kernel: gather/scatter over the canonical edge list (any graph, O(|E| d) memory), z from explicit
differences; also the exact pass the dispatcher and `pairwise_energy` use off the
complete graph."""
from __future__ import annotations

from typing import Optional

import torch

from ..graphs import TokenGraph
from ..rho import Rho
from .guard import to_float64
from .registry import PairwisePass, apply_metric, register_kernel


@register_kernel("edges")
def edges_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                metric: Optional[torch.Tensor] = None) -> PairwisePass:
    """Gather/scatter over the canonical edge list: ``agg`` from the explicit differences of each edge (taken
    in token space, then mapped by the metric). Also the exact pass the dispatcher and `pairwise_energy` use off the
    complete graph.

    Args:
        Y: the tokens ``(B, n, d)``, zero on padded slots.
        graph: the [`TokenGraph`][energies.TokenGraph] (its edge list).
        rho: the penalty.
        tau: the temperature, > 0.
        energy: also return the pairwise energy per example (float64).
        num: compute the neighbour sums.
        metric: W ``(d, d_h)``, or None.

    Returns:
        The `PairwisePass` ``(agg or None, deg, energy or None)``.
    """
    B, n, d = Y.shape
    Yf = Y.reshape(B * n, d)
    src, dst, valid = graph.fixed_edges()          # fixed shape: edges at padded slots weigh 0 (no host read)
    diff = apply_metric(Yf[dst] - Yf[src], metric)
    z = (diff * diff).sum(-1) / (2.0 * tau)
    gamma = rho.derivative(z)
    if valid is not None:
        gamma = torch.where(valid, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device))
    agg = None
    if num:
        msg = gamma[:, None] * diff
        agg = torch.zeros(B * n, diff.shape[-1], dtype=Y.dtype, device=Y.device)
        agg = agg.index_add(0, src, msg).index_add(0, dst, -msg).reshape(B, n, -1)
    deg = torch.zeros(B * n, dtype=Y.dtype, device=Y.device).index_add(0, src, gamma).index_add(0, dst, gamma)
    e = None
    if energy:
        v = to_float64(tau * rho.value(z))
        if valid is not None:
            v = torch.where(valid, v, torch.zeros((), dtype=v.dtype, device=v.device))
        # one example: a sum (inductor's CPU code for a scatter into one slot fails, torch 2.13)
        e = (v.sum(0, keepdim=True) if B == 1 else
             torch.zeros(B, dtype=torch.float64, device=Y.device).index_add(0, src // n, v))
    return PairwisePass(agg, deg.reshape(B, n), e)
