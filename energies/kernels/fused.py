"""The ``fused`` kernel: the softmax kernel in one fused-attention call (`energies.kernels.fused_ops`): PyTorch's flash
op on the CPU; on CUDA its memory-efficient op (float32, 3xTF32 tensor-core products) or its flash op (bfloat16 /
float16).

On CUDA the energy is read off the op's float32 log-sum-exp up to `FUSED_LSE_MAX_N` tokens; above, the
trace's energy comes from the energy-only pass (`softmax_degrees`, float32 at
least), since the op's running sum of exponentials is not inside the trace's budget there; so does the energy of
bfloat16 / float16 features (the step may run in bfloat16, the energy may not). Where no op serves the features' dtype
(float64 on CUDA: the descent checks, or a guard widening float32), the exact torch forms run instead."""
from __future__ import annotations

from typing import Optional

import torch

from ..graphs import TokenGraph
from ..rho import Rho
from .fused_ops import fused_ops, fused_unavailable
from .registry import PairwisePass, register_kernel
from .lse import degree_energy, from_lse, fused_parts, softmax_degrees, softmax_supports
from .softmax import softmax_kernel
from .streamed import STREAM_MIN_N, streamed_pass

#: largest n whose energy the CUDA ops' float32 log-sum-exp gives with the trace on. The op keeps a running sum
#: l_u of exponentials over key blocks of BN = 64 (rescaled when the row maximum grows); each block adds a
#: rounding of at most (log2 BN + 2) eps relative and each of the n / BN block additions one more eps, so
#: (1 + deg_u) = exp(LSE_u - |z_u|^2 / 2 tau) carries at most (n / 64 + 8) eps relative error plus the
#: logits' own (the guard's bound, shared by every expansion kernel). Half of the trace's 64 eps budget for the
#: sum: n / 64 + 8 <= 32, so n <= 1,536; the bound is taken at 1,024 to leave room for the op's exp2
#: approximation (2 ulp) and the log-sum-exp's final log.
FUSED_LSE_MAX_N = 1024


def _fused_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    why = softmax_supports(graph, rho)
    if why is None:
        why = fused_unavailable(graph.mask.device.type, torch.float32)
    return why


def _fused_heads(Z, graph, rho, tau, energy, num, sq):
    """``(agg, deg, energy)`` ``(B, H, ...)`` for heads of centred features ``Z`` ``(B, H, n, c)`` whose dtype a fused op
    serves: the neighbour sums and degrees from one call over every head (`fused_parts`), or the
    energy-only pass; the energy from the log-sum-exp, or from the energy-only pass where the module docstring
    says (float32 at least, differentiable like the rest). Half types come back in their own dtype."""
    B, H, n, c = Z.shape
    half = Z.dtype in (torch.bfloat16, torch.float16)
    real = graph.mask.to(Z.dtype)[:, None]
    lse_energy = not half and (Z.device.type == "cpu" or n <= FUSED_LSE_MAX_N)
    agg = deg = None
    if num:
        diff, lse = fused_parts(Z, graph.mask, tau, sq)
        agg, deg = from_lse(diff, lse, real)
    if deg is None or (energy and not lse_energy):
        Zw = Z.float() if half else Z
        deg_e = softmax_degrees(Zw.reshape(B * H, n, c), graph.mask.repeat_interleave(H, 0), tau,
                                 None if (half or sq is None) else sq.reshape(B * H, n)).view(B, H, n)
        deg = deg_e if deg is None else deg
    else:
        deg_e = deg
    e = degree_energy(deg_e, tau) if energy else None
    if half:
        agg, deg = (None if agg is None else agg.to(Z.dtype)), deg.to(Z.dtype)
    return agg, deg, e


@register_kernel("fused", _fused_only, expansion=True, native_half=True, heads=_fused_heads)
def _fused_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """The softmax kernel in one fused-attention call (`energies.kernels.fused_ops`); the module docstring says
    where the energy comes from off the CPU, and what runs where no op serves Y's dtype."""
    if fused_ops(Y.device.type, Y.dtype) is None:
        if graph.num_nodes > STREAM_MIN_N:
            return streamed_pass(Y, graph, rho, tau, energy, num)
        return softmax_kernel(Y, graph, rho, tau, energy, num, sq=sq)
    agg, deg, e = _fused_heads(Y[:, None], graph, rho, tau, energy, num, None if sq is None else sq[:, None])
    return PairwisePass(None if agg is None else agg[:, 0], deg[:, 0], None if e is None else e[:, 0])

