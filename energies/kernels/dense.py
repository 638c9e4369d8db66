"""The ``dense`` kernel: an ``(B, n, n)`` weight matrix masked by the graph's adjacency (complete graphs or small n)."""
from __future__ import annotations

import torch

from ..errors import EnergyError
from ..memory import check_memory
from .guard import dense_z, to_float64
from .registry import PairwisePass, register_kernel


@register_kernel("dense", expansion=True)
def _dense_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """An ``(B, n, n)`` weight matrix masked by the graph's adjacency; matrices that cannot fit in memory are
    refused before any is built (z, rho'(z), gamma and the product's operand in Y's dtype, the bool adjacency)."""
    B, n = Y.shape[0], Y.shape[1]
    check_memory(B * n * n * (4 * Y.element_size() + 1),
                 f"the dense kernel's (B, n, n) = ({B}, {n}, {n}) {str(Y.dtype).replace('torch.', '')} matrices",
                 EnergyError, "use kernel 'streamed' (tiles of keys) or 'edges', or a smaller n", device=Y.device)
    z = dense_z(Y, tau)
    pm = graph.pair_mask()
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)
    e = 0.5 * tau * to_float64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return PairwisePass(gamma @ Y - deg[..., None] * Y if num else None, deg, e)
