"""The ``fused`` kernel: the softmax kernel in one flash-attention call (:mod:`energies.fused`), CPU only."""
from __future__ import annotations

from typing import Optional

from ..fused import fused_available
from ..graph import TokenGraph
from ..rho import Rho
from .registry import PairwisePass, register_kernel
from .softmax import _softmax_kernel, _softmax_only


def _fused_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    why = _softmax_only(graph, rho)
    if why is None and not fused_available(graph.mask.device.type):
        why = (f"needs PyTorch's CPU flash-attention op, not available on {graph.mask.device.type!r}; "
               "use 'softmax' or 'streamed'")
    return why


@register_kernel("fused", _fused_only, expansion=True)
def _fused_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """The softmax kernel in one flash-attention call (:mod:`energies.fused`)."""
    return _softmax_kernel(Y, graph, rho, tau, energy, num, sq=sq, fused=True)
