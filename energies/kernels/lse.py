"""The log-sum-exp form of rho = exp on the complete graph: what the ``softmax``, ``fused`` and ``banded`` kernels and
the multi-head pass share (`energies.kernels.dispatch.pairwise_pass_heads`).

With ``S_u = sum_v exp(-z_uv) = 1 + deg_u`` (self included) and ``P`` the softmax of the logits ``-z_uv``, one softmax
pass gives ``LSE_u = log(1 + deg_u)``, ``deg_u = expm1(LSE_u)``, ``agg_u = S_u (P Y - Y)_u`` (`from_lse`) and the
energy ``-tau/2 sum_u deg_u`` (`degree_energy`): with rho(z) = -exp(-z), gamma_uv = exp(-z_uv) and the pairwise
energy ``sum_{{u,v}} -tau exp(-z_uv) = -tau/2 sum_{u != v} gamma_uv``. `fused_parts` computes ``(P Z - Z, LSE)`` in
one fused-attention call, `softmax_degrees` the degrees alone (the energy-only pass), `softmax_supports` says where
the form applies. Every name a kernel may use is public and listed in `__all__`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..errors import EnergyError
from ..graphs import TokenGraph
from ..rho import ExpRho, Rho
from .fused_ops import FusedOps, fused_attention, fused_ops, fused_ops_for_head, fused_unavailable

__all__ = ["DEGREE_BLOCK_ELEMENTS", "PAD_LOGIT", "degree_energy", "from_lse", "fused_parts", "softmax_degrees",
           "softmax_supports"]

#: key feature of padded tokens in the fused form: logit below -PAD_LOGIT, so that p = 0 exactly
PAD_LOGIT = 1.0e4


def softmax_supports(graph: TokenGraph, rho: Rho) -> Optional[str]:
    """The ``supports`` rule of the kernels of this form (``softmax``, ``fused``): the complete graph and rho = exp.

    Args:
        graph: the [`TokenGraph`][energies.TokenGraph].
        rho: the penalty.

    Returns:
        None where they apply, else why not (worded to follow "the softmax kernel ...").
    """
    if graph.is_complete and isinstance(rho, ExpRho):
        return None
    return f"needs the complete graph and rho='exp'; got graph {graph.name!r}, rho {rho.spec()!r}"


def fused_parts(Z: torch.Tensor, mask: torch.Tensor, tau: float, sq: Optional[torch.Tensor] = None,
                 ops: Optional[FusedOps] = None):
    """``(P Z - Z, LSE)`` for heads of centred features ``Z`` ``(B, H, n, c)`` (mask ``(B, n)``) in one fused
    attention call, ``LSE_u = log(1 + deg_u)`` (self included), by the layout the op wants
    (`_spare_layout` for the CPU flash op, `_compact_layout` for the CUDA ops, whose kernels are
    instantiated for head sizes 32, 64, 96, 128, ...; above FlashAttention-2's 256 the memory-efficient op,
    `fused_ops_for_head`).

    Args:
        Z: centred features ``(B, H, n, c)``, zero on padded slots.
        mask: ``(B, n)`` bool, True where a token is real.
        tau: the temperature, > 0.
        sq: ``|z_u|^2`` ``(B, H, n)`` when already computed.
        ops: the op pair (default: the tensors' own, `energies.kernels.fused_ops.fused_ops`).

    Returns:
        ``(P Z - Z, LSE)``: ``(B, H, n, c)`` and ``(B, H, n)``.

    Raises:
        EnergyError: no fused op serves the features' device and dtype.
    """
    ops = fused_ops(Z.device.type, Z.dtype) if ops is None else ops
    if ops is None:
        raise EnergyError(f"the fused kernel {fused_unavailable(Z.device.type, Z.dtype)}")
    if ops.head_multiple == 1:
        return _spare_layout(Z, mask, tau, sq, ops)
    head = -(-(Z.shape[-1] + 1) // ops.head_multiple) * ops.head_multiple
    return _compact_layout(Z, mask, tau, sq, fused_ops_for_head(ops, head, Z.device.type, Z.dtype))


def _spare_layout(Z, mask, tau, sq, ops):
    """``[z_u, 1, -|z_u|^2/2] . [z_v, -|z_v|^2/2, 1] / tau = -z_uv`` (padded keys at ``-PAD_LOGIT``), the values the
    queries themselves (their two extra output columns are dropped, so the gradient reaching them is 0 and the
    shared tensor gets exactly the gradient of ``[Z, 0, 0]`` as values), and a spare zero column that the
    backward uses for the LSE gradient (`fused_attention`): c + 3 columns, any c."""
    half_sq = 0.5 * ((Z * Z).sum(-1) if sq is None else sq)
    B, H, n, c = Z.shape
    q, k = Z.new_empty(B, H, n, c + 3), Z.new_empty(B, H, n, c + 3)
    q[..., :c], k[..., :c] = Z, Z
    q[..., c], q[..., c + 1] = 1.0, -half_sq
    k[..., c] = torch.where(mask[:, None], -half_sq, torch.full_like(half_sq, -PAD_LOGIT * tau))
    k[..., c + 1] = 1.0
    q[..., c + 2], k[..., c + 2] = 0.0, 0.0
    attn, lse = fused_attention(q, k, q, 1.0 / tau, spare=True, ops=ops)
    return attn[..., :c] - Z, lse


def _compact_layout(Z, mask, tau, sq, ops):
    """One extra column, padded with zeros to the op's head multiple: ``q_u = [z_u, 1]``, ``k_v = [z_v, b_v]`` with
    ``b_v = -|z_v|^2/2`` (``-PAD_LOGIT tau`` on padded keys), values ``[z_v, 0]``, scale ``1/tau``:

        q_u.k_v / tau = -z_uv + |z_u|^2 / (2 tau),

    so the softmax is the step's (the query's constant cancels), ``log(1 + deg_u) = LSE_u - |z_u|^2 / (2 tau)``,
    and the values' zero column c serves the backward's LSE gradient (``lse_col``). Head size c + 1 rounded up to
    the op's multiple: d_h = 32 gives 40 (the 64-wide instantiation), d_h = 31 gives 32. The CUDA ops' LSE is
    float32 (bfloat16 inputs included); the query constant is taken off in float32 too."""
    B, H, n, c = Z.shape
    wide = torch.float64 if Z.dtype == torch.float64 else torch.float32
    half_sq = 0.5 * ((Z.to(wide) ** 2).sum(-1) if sq is None or sq.dtype != wide else sq)
    pad = -(c + 1) % ops.head_multiple
    b = torch.where(mask[:, None], -half_sq, torch.full_like(half_sq, -PAD_LOGIT * tau)).to(Z.dtype)
    q = torch.nn.functional.pad(torch.cat([Z, torch.ones_like(Z[..., :1])], -1), (0, pad))
    k = torch.nn.functional.pad(torch.cat([Z, b[..., None]], -1), (0, pad))
    v = torch.nn.functional.pad(Z, (0, 1 + pad))
    attn, lse = fused_attention(q, k, v, 1.0 / tau, lse_col=c, ops=ops)
    return attn[..., :c] - Z, lse.to(wide) - half_sq / tau


def from_lse(diff: torch.Tensor, lse: torch.Tensor, real: torch.Tensor):
    """``(agg, deg)`` of the softmax kernels from ``P Y - Y`` and the log-sum-exp ``LSE = log(1 + deg)`` (self
    included): ``deg = expm1(LSE)``, ``agg = (1 + deg) (P Y - Y)``; ``real`` the 0/1 mask of real queries
    (broadcast against LSE), padded queries 0. A query whose example (or residue class) holds no other real token
    has no edge: 0 exactly (its LSE is its own logit, 0 only up to the expansion's rounding of ``-z_uu``).

    Args:
        diff: ``P Y - Y`` ``(..., n, c)``.
        lse: the log-sum-exp ``(..., n)``, self included.
        real: the 0/1 mask of real queries in diff's dtype, broadcast against ``lse``.

    Returns:
        ``(agg, deg)``: ``(..., n, c)`` and ``(..., n)``.
    """
    real = real * (real.sum(-1, keepdim=True) > 1).to(real.dtype)
    log_s = torch.clamp(lse, min=0.0) * real        # log(1 + deg) >= 0; padded queries: 0
    return (torch.exp(log_s) * real)[..., None] * diff, torch.expm1(log_s)    # the (., n) factors joined first


def degree_energy(deg: torch.Tensor, tau: float) -> torch.Tensor:
    """The pairwise energy of rho = exp from the degrees: ``-tau/2 sum_u deg_u`` (float64, per example).

    Args:
        deg: the degrees ``(..., n)`` (0 on padded slots).
        tau: the temperature, > 0.

    Returns:
        The energy ``(...)`` in float64.
    """
    return -0.5 * tau * deg.sum(-1, dtype=torch.float64)


#: largest element count of one block of logits in `softmax_degrees` (16 MiB in float32)
DEGREE_BLOCK_ELEMENTS = 1 << 22


def softmax_degrees(Y: torch.Tensor, mask: torch.Tensor, tau: float, sq: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
    """``deg_u = sum_{v != u, v real} exp(-z_uv)`` ``(B, n)`` (0 on padded u, ``mask`` ``(B, n)``) for centred tokens Y: the
    energy-only pass of the softmax kernels (rho = exp, complete graph; the energy is ``-tau/2 sum_u deg_u``).

    The logits are symmetric, ``-z_uv = y_u.(y_v / tau) + b_u + b_v`` with ``b_u = -|y_u|^2 / (2 tau)``
    (``-PAD_LOGIT`` on padded slots, where exp gives exactly 0): one batched product of the tokens with their own
    transpose scaled by ``1 / tau`` (the d-wide product BLAS serves best, no widened copies of Y), and the two
    offsets added in place. Blocks of query rows are taken against the keys from their own
    block on: each entry right of the diagonal block counts for its row and its column, so about half of
    the n^2 exponentials are computed. ``-z <= 0`` needs no max shift; the diagonal is left out exactly
    (no cancellation as in ``deg = exp(LSE) - 1``); float32 sums are torch's cascade sums (error about eps
    relative, measured in the tests against float64).

    Args:
        Y: centred tokens ``(B, n, d)``, zero on padded slots.
        mask: ``(B, n)`` bool, True where a token is real.
        tau: the temperature, > 0.
        sq: ``|y_u|^2`` ``(B, n)`` when already computed.

    Returns:
        The degrees ``(B, n)`` in Y's dtype, differentiable.
    """
    B, n, _ = Y.shape
    half = 0.5 * ((Y * Y).sum(-1) if sq is None else sq)
    b = torch.where(mask, half * (-1.0 / tau), torch.full_like(half, -PAD_LOGIT))
    g = Y.transpose(1, 2) * (1.0 / tau)
    rows = max(1, min(n, max(64, -(-n // 8)), DEGREE_BLOCK_ELEMENTS // max(1, B * n)))
    inplace = not (torch.is_grad_enabled() and Y.requires_grad)
    deg = Y.new_zeros(B, n)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        K = torch.bmm(Y[:, s:e], g[:, :, s:])                       # (B, r, n - s): y_u.y_v / tau, rows s..e
        if inplace:
            K += b[:, s:e, None]
            K += b[:, None, s:]
            K = K.exp_()
            K[:, :, :e - s].diagonal(dim1=1, dim2=2).zero_()
        else:
            K = K + b[:, s:e, None] + b[:, None, s:]
            eye = torch.eye(e - s, n - s, dtype=torch.bool, device=Y.device)
            K = torch.where(eye, torch.zeros((), dtype=K.dtype, device=K.device), K.exp())
        deg[:, s:e] += K.sum(-1)
        if e < n:
            deg[:, e:] += K[:, :, e - s:].sum(-2)
    return deg
