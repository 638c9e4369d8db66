"""The precision guard of the expansion kernels: in which dtype the expansion ``|a|^2 + |b|^2 - 2 a.b`` of centred
tokens resolves the edge weights (`expansion_dtype` with one host read, `expansion_ok` on the device),
the centring itself, and z from the expansion or from explicit differences. What a kernel may use of the guard is
public and listed in `__all__`; used by the dispatcher and the kernels; imports no kernel."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..graphs import TokenGraph
from .registry import apply_metric

__all__ = ["EXPANSION_Z_ERROR", "EXPANSION_Z_ULPS", "EXPLICIT_TILE_ELEMENTS", "centred", "dense_z", "edge_z",
           "expansion_dtype", "expansion_ok", "explicit_tile", "explicit_z", "own_dtype", "scale_dtype", "to_float64"]

#: largest (B * n * tile * d) element count of one tile of explicit differences
EXPLICIT_TILE_ELEMENTS = 1 << 22
#: largest tolerated rounding error of z in the expansion, per compute dtype: ``eps * max|y|^2 / tau``.
#: 2^-30 (float64) keeps kernels within ~1e-9 of the step; 2^-14 (float32: max|y|^2 / tau <= 512) is
#: near float32's own rounding of a sum of a few hundred terms. Others (half, bfloat16) compute in float32.
EXPANSION_Z_ERROR = {torch.float64: 2.0 ** -30, torch.float32: 2.0 ** -14}
#: the worst-case rounding of z by the expansion as ``(a, b)``: ``|dz| <= (a d + b) eps(dtype) max_u |x_u|^2 / tau``
#: for d features, per product of the tiles: "ieee" (float32 FMA chains; float64 sums) and "tf32x3" (3xTF32 on
#: tensor cores, the Triton kernel's float32 ``tl.dot``: operands split hi + lo, hi rounded to TF32, lo truncated
#: to TF32 by the tensor core, lo * lo' dropped: <= 5 eps per term, accumulation truncating). Derived in
#: tests/test_tf32x3.py and checked there against float64 by a simulation of the products (plain TF32, ~2^13 eps
#: per term, exceeds it). With the guard's rule above, the weights' relative error is at most
#: ``(a d + b) EXPANSION_Z_ERROR[dtype]`` for either product: 3xTF32 keeps the guard and the trace's budget.
EXPANSION_Z_ULPS = {"ieee": (1.0, 4.0), "tf32x3": (1.5, 9.0)}


def edge_z(Yf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, tau: float) -> torch.Tensor:
    """``z_e = ||y_src - y_dst||^2 / (2 tau)`` per edge, from explicit differences.

    Args:
        Yf: the tokens flattened over the batch, ``(B n, d)``.
        src: the edges' first ends (flat ids).
        dst: the edges' second ends (flat ids).
        tau: the temperature, > 0.

    Returns:
        z per edge, in Yf's dtype.
    """
    diff = Yf[src] - Yf[dst]
    return (diff * diff).sum(-1) / (2.0 * tau)


def dense_z(Y: torch.Tensor, tau: float, K: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(B, n, m)`` matrix of ``z_uv = |y_u - k_v|^2 / (2 tau)`` for keys K (default: Y itself) by the
    expansion ``|y_u|^2 + |k_v|^2 - 2 y_u.k_v``, clamped at 0 (accurate when the tokens are centred and
    `expansion_dtype` accepts their scale).

    Args:
        Y: the queries ``(B, n, d)``.
        tau: the temperature, > 0.
        K: the keys ``(B, m, d)``; None: Y itself.

    Returns:
        z ``(B, n, m)`` in Y's dtype.
    """
    K = Y if K is None else K
    d2 = (Y * Y).sum(-1)[:, :, None] + (K * K).sum(-1)[:, None, :] - 2.0 * Y @ K.transpose(1, 2)
    return torch.clamp(d2, min=0.0) / (2.0 * tau)


def explicit_z(Y: torch.Tensor, K: torch.Tensor, tau: float, metric: Optional[torch.Tensor] = None):
    """``(z, W^T (k_v - y_u))`` for queries Y ``(B, n, d)`` and keys K ``(B, m, d)`` from explicit differences
    ``(B, n, m, d)``, taken in token space and then mapped by the metric W (if any): exact to rounding at any
    scale, at d times the memory of `dense_z`.

    Args:
        Y: the queries ``(B, n, d)``.
        K: the keys ``(B, m, d)``.
        tau: the temperature, > 0.
        metric: W ``(d, d_h)``, or None (token space).

    Returns:
        ``(z, diff)``: z ``(B, n, m)`` and the mapped differences ``(B, n, m, d_h)``.
    """
    diff = apply_metric(K[:, None, :, :] - Y[:, :, None, :], metric)
    return (diff * diff).sum(-1) / (2.0 * tau), diff


def explicit_tile(Y: torch.Tensor, width: int, cap: int) -> int:
    """Keys per tile of explicit differences: at most ``cap``, and at most ``EXPLICIT_TILE_ELEMENTS`` elements of
    ``(B, n, tile, width)``.

    Args:
        Y: the queries ``(B, n, d)`` (their shape only is read).
        width: the last dimension of the differences (d, or d plus the metric's width).
        cap: the most keys a tile may hold.

    Returns:
        The keys per tile, at least 1.
    """
    B, n, _ = Y.shape
    return max(1, min(cap, EXPLICIT_TILE_ELEMENTS // max(1, B * n * width)))


def centred(Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
    """Y minus the mean of each example's real tokens: what an expansion kernel receives. z and agg depend on
    differences only, so this changes nothing but the rounding of the expansion; the mean is detached
    (translation invariance makes its gradient contribution zero).

    Args:
        Y: the tokens ``(B, n, d)``, zero on padded slots.
        graph: the [`TokenGraph`][energies.TokenGraph] whose mask says which tokens are real.

    Returns:
        The centred tokens ``(B, n, d)`` in Y's dtype, padded slots 0.
    """
    m = graph.mask.to(Y.dtype)[..., None]
    mean = Y.detach().sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1.0)
    return (Y - mean) * m


def expansion_dtype(Yc: torch.Tensor, tau: float, sensitivity: float = 1.0,
                    sq: Optional[torch.Tensor] = None) -> Optional[torch.dtype]:
    """The dtype in which the expansion ``|a|^2 + |b|^2 - 2 a.b`` of centred tokens Yc resolves the edge weights
    to ``EXPANSION_Z_ERROR``: Yc's own dtype (float32 or float64), else float64, else None (use explicit
    differences). Rounding of the expansion: ``|dz| <~ eps * max_u |y_u|^2 / tau``; a weight rho'(z) then moves
    by ``|dz| * sensitivity`` relative to the largest ([`kernel_sensitivity`][energies.Rho.kernel_sensitivity], at least
    1 here: 1 for exp, ``(1 - p/2) / eps`` for lp). One host read of the largest norm (none under
    ``torch.compile``, which keeps Yc's dtype).

    Args:
        Yc: the centred features ``(B, n, d)``.
        tau: the temperature, > 0.
        sensitivity: the penalty's [`kernel_sensitivity`][energies.Rho.kernel_sensitivity].
        sq: ``|y_u|^2`` of Yc when already computed.

    Returns:
        The compute dtype (Yc's own, or float64), or None: explicit differences.
    """
    own = own_dtype(Yc)
    if torch.compiler.is_compiling() or Yc.numel() == 0:
        return own
    sq = (Yc.detach() * Yc.detach()).sum(-1) if sq is None else sq.detach()
    return scale_dtype(float(sq.max()) / tau * max(1.0, float(sensitivity)), own)


def scale_dtype(scale: float, own: torch.dtype) -> Optional[torch.dtype]:
    """The rule of `expansion_dtype` for a scale read on the host: the first of ``own`` and float64 with
    ``scale * eps(dtype) <= EXPANSION_Z_ERROR[dtype]``.

    Args:
        scale: ``max_u |y_u|^2 / tau * max(1, sensitivity)`` of the centred features.
        own: the features' compute dtype (`own_dtype`).

    Returns:
        ``own`` or float64, or None where neither resolves z at this scale (explicit differences).
    """
    for dt in dict.fromkeys((own, torch.float64)):
        if math.isfinite(scale) and scale * torch.finfo(dt).eps <= EXPANSION_Z_ERROR[dt]:
            return dt
    return None


def to_float64(x: torch.Tensor) -> torch.Tensor:
    """The energies' accumulation dtype: a kernel sums its per-pair energies in float64.

    Args:
        x: a tensor of any floating dtype.

    Returns:
        ``x`` in float64.
    """
    return x.to(torch.float64)


def expansion_ok(sq: torch.Tensor, tau: float, sensitivity: float, dtype: torch.dtype) -> torch.Tensor:
    """The rule of `expansion_dtype` decided on the device, per example: a bool ``(B,)`` (or ``sq``'s leading
    shape), True where ``max_u |z_u|^2 / tau * max(1, sensitivity) * eps(dtype) <= EXPANSION_Z_ERROR[dtype]``;
    NaN and inf give False. No host read.

    Args:
        sq: the squared norms of the centred features, ``(..., n)``.
        tau: the temperature, > 0.
        sensitivity: the penalty's [`kernel_sensitivity`][energies.Rho.kernel_sensitivity].
        dtype: the compute dtype, a key of ``EXPANSION_Z_ERROR``.

    Returns:
        The bool verdict, ``sq``'s leading shape.
    """
    bound = EXPANSION_Z_ERROR[dtype] / (torch.finfo(dtype).eps * max(1.0, float(sensitivity)))
    return sq.detach().amax(-1) / tau <= bound


def own_dtype(Zc: torch.Tensor) -> torch.dtype:
    """The dtype an expansion computes in for these features when the guard does not widen it: their own
    (float32, float64), float32 for the half types.

    Args:
        Zc: the (centred) features.

    Returns:
        A key of ``EXPANSION_Z_ERROR``.
    """
    return Zc.dtype if Zc.dtype in EXPANSION_Z_ERROR else torch.float32
