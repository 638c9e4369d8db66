"""The ``triton`` kernel: the Triton kernels of `energies.kernels.triton.pairwise` (imported only when it runs), on CUDA
or, on the CPU, in Triton's interpreter; `triton_unavailable` says why it cannot run on a device."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ...graphs import TokenGraph
from ...graphs.bands import class_mask, from_classes, to_classes
from ...rho import Rho, kernel_sensitivity
from ..guard import centred, own_dtype
from ..registry import PairwisePass, register_kernel

_TRITON: Dict[str, Optional[str]] = {}


def triton_unavailable(device_type: str) -> Optional[str]:
    """Why the ``triton`` kernel cannot run on tensors of this device type (worded to follow "the triton kernel
    ..."), or None. It runs on CUDA (compiled), on the CPU only in Triton's interpreter (``TRITON_INTERPRET=1``
    set before Triton is first imported: numpy per program, for tests), and on ``meta`` (shapes only). Probed
    once per device type."""
    if device_type not in _TRITON:
        try:
            from . import pairwise as triton_pairwise
        except ImportError as exc:
            _TRITON[device_type] = (f"needs Triton (pip install 'unfolded-transformers[gpu]' or pip install triton): "
                                    f"{type(exc).__name__}: {exc}")
        else:
            why = None
            if device_type == "cpu" and not triton_pairwise.INTERPRETED:
                why = ("runs on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 before the first "
                       "import of triton (e.g. TRITON_INTERPRET=1 unfold-check --kernel triton ...), or use a GPU")
            elif device_type not in ("cpu", "cuda", "meta"):
                why = f"runs on CUDA devices (and CPU through TRITON_INTERPRET=1), not on {device_type!r}"
            _TRITON[device_type] = why
    return _TRITON[device_type]


def _triton_supports(graph: TokenGraph, rho: Rho) -> Optional[str]:
    why = triton_unavailable(graph.mask.device.type)
    if why is None and rho.triton() is None:
        why = f"needs a rho with Triton functions (Rho.triton); {rho.spec()!r} has none"
    return why


@register_kernel("triton", _triton_supports)
def _triton_kernel(Y, graph, rho, tau, energy, num, metric=None) -> PairwisePass:
    """Triton kernels (`energies.kernels.triton.pairwise`): the complete graph and shift-invariant graphs tile by
    tile, any other graph by neighbour lists; every rho with Triton functions; the precision guard on the device."""
    return triton_heads(Y, graph, rho, tau, [metric], energy, num)[0]


def _residue_heads(Z, mask, band, k, rho, tau, num, energy, lowp=False):
    """The kernel's three outputs on a strided graph, as two launches whose pair sets are disjoint (so the sums add):
    the band (offsets not multiples of k) on the tokens as they are, and the complete graph of each residue class
    ``i mod k`` on the tokens regrouped as ``B k`` examples of ``m = ceil(n / k)`` (padded with masked slots)."""
    from .pairwise import pairwise_heads, tiled_layout
    B, H, n, D = Z.shape
    sens = kernel_sensitivity(rho)
    classes = tiled_layout(-(-n // k), None, D, Z.dtype, Z.device)           # complete, on ceil(n / k) tokens
    agg, deg, e = pairwise_heads(to_classes(Z, k), class_mask(mask, k), classes, rho, tau, num, energy, sens, lowp)
    deg = from_classes(deg, k, n)
    agg = from_classes(agg, k, n) if num else None
    e = e.reshape(B, k, H).sum(1) if energy else None
    if band:
        a2, d2, e2 = pairwise_heads(Z, mask, tiled_layout(n, band, D, Z.dtype, Z.device), rho, tau, num, energy,
                                    sens, lowp)
        deg = deg + d2
        agg = agg + a2 if num else agg
        e = e + e2 if energy else e
    return agg, deg, e


def triton_heads(Y, graph, rho, tau, metrics, energy, num):
    """One launch for every head: features ``W_h^T (y - mean)`` ``(B, H, n, d_h)`` in the compute dtype (float32
    for the half types, whose aggregation products then take bfloat16 operands: ``lowp``). The ``triton`` kernel's
    pass, and the dispatcher's for the heads of a multi-head energy.

    Args:
        Y: the tokens ``(B, n, d)``, zero on padded slots.
        graph: the [`TokenGraph`][energies.TokenGraph].
        rho: a penalty with Triton functions.
        tau: the temperature, > 0.
        metrics: the heads' W ``(d, d_h)``, one shape; ``[None]``: the tokens themselves.
        energy: also return the pairwise energy per example (float64).
        num: compute the neighbour sums.

    Returns:
        One `PairwisePass` per metric.
    """
    from .pairwise import layout_for, pairwise_heads
    dt = own_dtype(Y)
    lowp = Y.dtype in (torch.bfloat16, torch.float16)
    Yc = centred(Y.to(dt), graph)
    if metrics[0] is None:
        Z = Yc[:, None]
    else:
        H, dh = len(metrics), metrics[0].shape[1]
        W = torch.cat([w.to(device=Y.device, dtype=dt) for w in metrics], 1)
        Z = (Yc @ W).unflatten(-1, (H, dh)).transpose(1, 2)
    from .plan import residue_split           # its constant mark imports torch._dynamo: not at import time
    split = residue_split(graph.offsets, graph.num_nodes) if graph.offsets is not None else None
    if split is None:
        agg, deg, e = pairwise_heads(Z, graph.mask, layout_for(graph, Z.shape[-1], dt), rho, tau, num, energy,
                                     kernel_sensitivity(rho), lowp)
    else:
        agg, deg, e = _residue_heads(Z, graph.mask, split[0], split[1], rho, tau, num, energy, lowp)
    return [PairwisePass(None if agg is None else agg[:, h].to(Y.dtype), deg[:, h].to(Y.dtype),
                         None if e is None else e[:, h], Y=Y, metric=metrics[h]) for h in range(len(metrics))]
