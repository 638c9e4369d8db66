"""The ``dense`` kernel: an ``(B, n, n)`` weight matrix masked by the graph's adjacency (complete graphs or small n)."""
from __future__ import annotations

import torch

from .guard import _f64, dense_z
from .registry import PairwisePass, register_kernel


@register_kernel("dense", expansion=True)
def _dense_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """An ``(B, n, n)`` weight matrix masked by the graph's adjacency."""
    z = dense_z(Y, tau)
    pm = graph.pair_mask()
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)
    e = 0.5 * tau * _f64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return PairwisePass(gamma @ Y - deg[..., None] * Y if num else None, deg, e)
