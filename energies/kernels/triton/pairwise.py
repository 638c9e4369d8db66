"""The pairwise pass as Triton kernels: the ``triton`` pairwise kernel (GPU, or CPU through ``TRITON_INTERPRET=1``).

For features ``x_u`` (``Z = W_h^T (y - mean)`` of every head h, ``(B H, n, D)``) and edge weights
``gamma_uv = rho'(z_uv)``, ``z_uv = |x_u - x_v|^2 / (2 tau)``, one launch over all examples and heads returns, per
token, what the MM step and the trace need (`energies.kernels`):

    agg_u = sum_{v in N(u)} gamma_uv (x_v - x_u),    deg_u = sum_{v in N(u)} gamma_uv,
    share_u = tau / 2 sum_{v in N(u)} rho(z_uv)      (the token's half of each of its edges),

without an n x n tensor. Two layouts of the token graph:

* **tiled** (the complete graph and every shift-invariant graph: window, strided, dilated;
  [`TokenGraph.offsets`][energies.TokenGraph.offsets]): a program takes a block of BM queries and visits only the key
  blocks its offsets reach (the complete graph: a plain loop over every key block, unmasked off the diagonal and the
  ragged last block; others: a block table built once per shape); inside a tile, a pair is an edge where both tokens are
  real and ``|i - j|`` is one of the graph's offsets (a 0/1 table over offsets). z comes from the expansion
  ``|a|^2 + |b|^2 - 2 a.b`` (two ``tl.dot``) on centred features, or, per example, from explicit differences where the
  precision guard says the expansion cannot resolve z (the rule of `energies.kernels.expansion_dtype`:
  ``eps(dtype) * max_u |x_u|^2 / tau * kernel_sensitivity <= EXPANSION_Z_ERROR[dtype]``), decided **on the
  device**, in the kernel, with no host read;
* **CSR** (any other graph: star, random, edge lists): a program per token and head walks its neighbour list
  (both orientations, sorted by token, built on the device from the edge list) in chunks of BN gathered keys;
  z from explicit differences (exact to rounding at any scale).

Padding: a pair counts only where both tokens are real (the mask is read in the kernel), so sparse layouts keep
a fixed shape whatever the mask. Accumulation: neighbour sums in the compute dtype (float32 tiles accumulate
in float32, ``tl.dot`` with ``input_precision="tf32x3"``: 3xTF32 on tensor cores, z within
`EXPANSION_Z_ULPS` as with IEEE products); the degrees and energy shares sum each tile's
BN terms in the compute dtype (a pairwise tree: error <= ceil(log2 BN) eps relative to sum |x|) and add the tile
sums in float64, so a float32 energy carries at most about (log2 BN + 2) eps relative error whatever n, inside
the trace's tolerance ``64 eps sum_k |E_k|``.

Backward (`_backward`), the same pass structure, memory linear in n: with upstream gradients ``g_u``
(of agg), ``gd_u`` (of deg) and ``ge`` (of the energy, per example),

    dL/dx_u = sum_v gamma_uv (g_v - g_u) + sum_v C_uv (x_u - x_v) + ge sum_v gamma_uv (x_u - x_v),
    C_uv = [ (g_u - g_v).(x_v - x_u) + gd_u + gd_v ] rho''(z_uv) / tau,

from ``agg_u = sum_v gamma_uv (x_v - x_u)`` (gamma symmetric) and ``d gamma_uv / d x_u = rho''(z_uv) (x_u - x_v) /
tau``. The kernels are wrapped as ``torch.library`` custom ops with fake (meta) implementations, so the
surrounding code runs on the ``meta`` device and compiles without graph breaks.
"""
from __future__ import annotations

import os
from typing import Dict, NamedTuple, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..guard import expansion_ok
from .rho import FUNCTIONS

__all__ = ["INTERPRETED", "pairwise_heads", "reference", "block_size", "layout_for", "block_table", "Layout"]


def reference(Z: torch.Tensor, pairs: torch.Tensor, rho, tau: float):
    """The plain-torch reference of `pairwise_heads`: the three outputs from explicit float64 differences
    on the ``(n, n)`` pair table (supplement eq. 33 and its gradient), what the tests hold the kernels to.

    ``z_uv = |x_u - x_v|^2 / (2 tau)``, ``gamma_uv = rho'(z_uv)`` on the edges,
    ``agg_u = sum_v gamma_uv (x_v - x_u)``, ``deg_u = sum_v gamma_uv``,
    ``energy = tau / 2 sum_u sum_v rho(z_uv)`` (each undirected edge once). Memory ``(B, H, n, n, D)``: small n.

    Args:
        Z: the head features ``(B, H, n, D)``.
        pairs: ``(B, n, n)`` bool, symmetric, False on the diagonal: the edges between real tokens
            ([`pair_mask`][energies.TokenGraph.pair_mask]).
        rho: the concave penalty ([`Rho`][energies.Rho]).
        tau: the temperature, > 0.

    Returns:
        ``(agg (B, H, n, D), deg (B, H, n), energy (B, H))``, all float64.
    """
    X = Z.double()
    diff = X[:, :, None, :, :] - X[:, :, :, None, :]               # [b, h, u, v] = x_v - x_u
    z = (diff * diff).sum(-1) / (2 * tau)
    A = pairs[:, None].to(X.device)
    zero = torch.zeros((), dtype=torch.float64, device=X.device)
    gamma = torch.where(A, rho.derivative(z), zero)
    return ((gamma[..., None] * diff).sum(3), gamma.sum(-1),
            0.5 * tau * torch.where(A, rho.value(z), zero).sum((2, 3)))

#: whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when this module was imported): on
#: CPU tensors, the only way to run them on a machine without a GPU
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"



def block_size(device: torch.device, dtype: torch.dtype, d: int) -> Tuple[int, int]:
    """``(BM, BN)``: 16 in the interpreter (numpy per program: small tiles keep tests fast), 64 on a GPU (32 for
    wide heads, 16 for float64, to bound registers). ``tl.dot`` needs at least 16."""
    if device.type != "cuda":
        return 16, 16
    if dtype == torch.float64:         # the product is a (BM, BD, BN) sum in registers (_mm)
        return 16, 16
    if d > 128:
        return 32, 32
    return 64, 64


@triton.jit
def _mm(a, b, IP: tl.constexpr):
    """``a @ b`` of two tiles: ``tl.dot`` (``input_precision=IP``), or for ``IP == "fp64"`` the sum of products
    over the shared axis. Triton 3.6 does not lower a float64 ``tl.dot`` for sm_90 (``PassManager::run failed`` in
    ``ConvertTritonGPUToLLVM``), and float64 is the dtype of the descent checks."""
    if IP == "fp64":
        return tl.sum(a[:, :, None] * b[None, :, :], 1)
    else:
        return tl.dot(a, b, input_precision=IP)


@triton.jit
def _mma(a, b, acc, IP: tl.constexpr):
    """``acc + a @ b``: ``tl.dot`` accumulating into ``acc`` (no temporary tile), or the float64 sum of products;
    ``IP == "bf16"``: bfloat16 operands on the tensor cores, float32 accumulation (the aggregation products of a
    bfloat16 step, `_ap`); ``"bf16emu"``: the same rounding of the operands with a float32 product, for
    Triton's interpreter (whose bfloat16 ``tl.dot`` returns garbage in Triton 3.9)."""
    if IP == "fp64":
        return acc + tl.sum(a[:, :, None] * b[None, :, :], 1)
    elif IP == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    elif IP == "bf16emu":
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=IP)


@triton.jit
def _load_params(P, dtype: tl.constexpr):
    tau = tl.load(P + 0).to(dtype)
    return tau, tl.load(P + 1).to(dtype), tl.load(P + 2).to(dtype), tl.load(P + 3).to(dtype), tl.load(P + 4).to(dtype)


@triton.jit
def _tile_z(X, xq, sqq, xk, sqk, rows, cols, rmask, cmask, flag, D, inv2, BM: tl.constexpr, BN: tl.constexpr,
            IP: tl.constexpr):
    """z of a (BM, BN) tile: the expansion ``|x_u|^2 + |x_v|^2 - 2 x_u.x_v`` from the precomputed squared norms and
    one product (flag = 1), or explicit differences column by column (flag = 0); times ``inv2 = 1 / (2 tau)``."""
    if flag != 0:
        dot = _mm(xq, tl.trans(xk), IP)
        d2 = tl.maximum(sqq[:, None] + sqk[None, :] - 2.0 * dot, 0.0)
    else:
        d2 = tl.zeros([BM, BN], dtype=xq.dtype)
        for k in range(0, D):
            a = tl.load(X + rows * D + k, mask=rmask, other=0.0)
            b = tl.load(X + cols * D + k, mask=cmask, other=0.0)
            diff = a[:, None] - b[None, :]
            d2 += diff * diff
    return d2 * inv2


@triton.jit
def _key_tile(X, SQ, MASK, ALLOWED, rows, cols, n, D, b, dcol, MASKED: tl.constexpr, BANDED: tl.constexpr):
    """The keys of a tile: ``(cmask, x_k, |x_k|^2, edge)``; ``edge`` is ``(1, BN)`` (the key is real) on an
    unmasked tile (every key inside the sequence, none equal to a query: off the diagonal) and ``(BM, BN)`` on a
    masked one (inside the sequence, not the query itself, and for a banded graph |i - j| in the offsets table).
    The query's own mask is applied once per row at the end (`_finish_rows`)."""
    cmask = cols < n
    if MASKED:
        xk = tl.load(X + cols[:, None] * D + dcol[None, :], mask=cmask[:, None] & (dcol[None, :] < D), other=0.0)
        sqk = tl.load(SQ + cols, mask=cmask, other=0.0)
        mk = tl.load(MASK + b * n + cols, mask=cmask, other=0) != 0
        edge = mk[None, :] & (rows[:, None] != cols[None, :])
        if BANDED:
            off = tl.abs(cols[None, :] - rows[:, None])
            ok = edge & (off < n)
            edge = ok & (tl.load(ALLOWED + off, mask=ok, other=0) != 0)
    else:
        xk = tl.load(X + cols[:, None] * D + dcol[None, :], mask=dcol[None, :] < D, other=0.0)
        sqk = tl.load(SQ + cols)
        edge = (tl.load(MASK + b * n + cols) != 0)[None, :]
    return cmask, xk, sqk, edge


@triton.jit
def _query_block(X, SQ, MASK, FLAG, qb, bh, b, n, D, BM: tl.constexpr, BD: tl.constexpr):
    """A block of BM queries of example-head bh: ``(rows, rmask, dcol, tile mask, x_q, real, |x_q|^2, guard flag)``."""
    rows = qb * BM + tl.arange(0, BM)
    rmask = rows < n
    dcol = tl.arange(0, BD)
    tile = rmask[:, None] & (dcol[None, :] < D)
    xq = tl.load(X + rows[:, None] * D + dcol[None, :], mask=tile, other=0.0)
    mq = (tl.load(MASK + b * n + rows, mask=rmask, other=0) != 0) & rmask
    sqq = tl.load(SQ + rows, mask=rmask, other=0.0)
    return rows, rmask, dcol, tile, xq, mq, sqq, tl.load(FLAG + bh)


@triton.jit
def _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, kb, xq, sqq, rows, rmask, flag, n, D, b, dcol, inv2,
              p0, p1, p2, p3, RHO_V: tl.constexpr, RHO_D: tl.constexpr, NUM: tl.constexpr, ENERGY: tl.constexpr,
              MASKED: tl.constexpr, BANDED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, IP: tl.constexpr,
              AP: tl.constexpr):
    """One key tile of the forward: the row sums of gamma (float64), ``gamma @ x_k`` and rho's row sums (float64)."""
    cols = kb * BN + tl.arange(0, BN)
    cmask, xk, sqk, edge = _key_tile(X, SQ, MASK, ALLOWED, rows, cols, n, D, b, dcol, MASKED, BANDED)
    z = _tile_z(X, xq, sqq, xk, sqk, rows, cols, rmask, cmask, flag, D, inv2, BM, BN, IP)
    gamma = tl.where(edge, RHO_D(z, p0, p1, p2, p3), 0.0)
    deg += tl.sum(gamma, 1).to(tl.float64)
    if NUM:
        num = _mma(gamma, xk, num, AP)
    if ENERGY:
        en += tl.sum(tl.where(edge, RHO_V(z, p0, p1, p2, p3), 0.0), 1).to(tl.float64)
    return num, deg, en


@triton.jit
def _key_ranges(qb, n, mq, BM: tl.constexpr, BN: tl.constexpr):
    """The complete graph's key blocks for query block qb, as ``(lo, hi, full, nkb)``: blocks ``[0, lo)`` and
    ``[hi, full)`` are unmasked (off the diagonal, inside the sequence), ``[lo, hi)`` (those meeting the queries'
    own positions) and ``[max(hi, full), nkb)`` (the ragged last block, if not already among them) masked. A block
    without a real query (``mq`` all False) visits none: its outputs are 0 as they would be anyway, so an example
    masked out whole costs one launch of empty programs (the fused kernel's guard sends only the examples it
    refuses here, the others masked out)."""
    live = tl.max(mq.to(tl.int32), 0) > 0
    nkb = tl.where(live, tl.cdiv(n, BN), 0)
    lo = tl.where(live, (qb * BM) // BN, 0)
    hi = tl.minimum(((qb + 1) * BM + BN - 1) // BN, nkb)
    return lo, hi, tl.where(live, n // BN, 0), nkb


@triton.jit
def _tiled_fwd(X, SQ, MASK, ALLOWED, KB_PTR, KB_IDX, FLAG, P, AGG, DEG, EN, n, D, H, NKEY,
               RHO_V: tl.constexpr, RHO_D: tl.constexpr, NUM: tl.constexpr, ENERGY: tl.constexpr,
               COMPLETE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, IP: tl.constexpr,
               AP: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    X = X + bh * n * D
    SQ = SQ + bh * n
    dtype = X.dtype.element_ty
    tau, p0, p1, p2, p3 = _load_params(P, dtype)
    inv2 = tl.load(P + 5).to(dtype)
    rows, rmask, dcol, tile, xq, mq, sqq, flag = _query_block(X, SQ, MASK, FLAG, qb, bh, b, n, D, BM, BD)
    num = tl.zeros([BM, BD], dtype=dtype)
    deg = tl.zeros([BM], dtype=tl.float64)
    en = tl.zeros([BM], dtype=tl.float64)
    if COMPLETE:        # a plain walk over the key blocks; masks only on the diagonal and the ragged tiles
        lo, hi, full, nkb = _key_ranges(qb, n, mq, BM, BN)
        for kb in range(0, lo):
            num, deg, en = _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, kb, xq, sqq, rows, rmask, flag, n, D, b, dcol,
                                     inv2, p0, p1, p2, p3, RHO_V, RHO_D, NUM, ENERGY, False, False, BM, BN, IP, AP)
        for kb in range(hi, full):
            num, deg, en = _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, kb, xq, sqq, rows, rmask, flag, n, D, b, dcol,
                                     inv2, p0, p1, p2, p3, RHO_V, RHO_D, NUM, ENERGY, False, False, BM, BN, IP, AP)
        for kb in range(lo, hi):
            num, deg, en = _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, kb, xq, sqq, rows, rmask, flag, n, D, b, dcol,
                                     inv2, p0, p1, p2, p3, RHO_V, RHO_D, NUM, ENERGY, True, False, BM, BN, IP, AP)
        for kb in range(tl.maximum(hi, full), nkb):
            num, deg, en = _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, kb, xq, sqq, rows, rmask, flag, n, D, b, dcol,
                                     inv2, p0, p1, p2, p3, RHO_V, RHO_D, NUM, ENERGY, True, False, BM, BN, IP, AP)
    else:               # a shift-invariant graph: the key blocks its offsets reach (the block table), all masked
        for i in range(tl.load(KB_PTR + qb), tl.load(KB_PTR + qb + 1)):
            num, deg, en = _fwd_tile(num, deg, en, X, SQ, MASK, ALLOWED, tl.load(KB_IDX + i), xq, sqq, rows, rmask,
                                     flag, n, D, b, dcol, inv2, p0, p1, p2, p3, RHO_V, RHO_D, NUM, ENERGY, True, True,
                                     BM, BN, IP, AP)
    deg = tl.where(mq, deg, 0.0)
    out = bh * n + rows
    tl.store(DEG + out, deg.to(dtype), mask=rmask)
    if NUM:
        agg = tl.where(mq[:, None], num - deg.to(dtype)[:, None] * xq, 0.0)
        tl.store(AGG + out[:, None] * D + dcol[None, :], agg, mask=tile)
    if ENERGY:
        tl.store(EN + out, tl.where(mq, en, 0.0) * 0.5 * tl.load(P + 0), mask=rmask)


@triton.jit
def _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, kb, xq, gq, aq, gdq, sqq, rows, rmask, flag, n, D, b,
              dcol, inv2, ninv, ge, p0, p1, p2, p3, RHO_D: tl.constexpr, RHO_2: tl.constexpr, MASKED: tl.constexpr,
              BANDED: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, IP: tl.constexpr, AP: tl.constexpr):
    """One key tile of the backward: ``acc += gamma @ g_k + cn @ x_k`` with ``cn = -(C + ge gamma)`` (the energy's
    gradient folded into the edge coefficient), and the row sums of gamma and cn."""
    cols = kb * BN + tl.arange(0, BN)
    cmask, xk, sqk, edge = _key_tile(X, SQ, MASK, ALLOWED, rows, cols, n, D, b, dcol, MASKED, BANDED)
    if MASKED:
        gk = tl.load(G + cols[:, None] * D + dcol[None, :], mask=cmask[:, None] & (dcol[None, :] < D), other=0.0)
        gdk = tl.load(GD + cols, mask=cmask, other=0.0)
    else:
        gk = tl.load(G + cols[:, None] * D + dcol[None, :], mask=dcol[None, :] < D, other=0.0)
        gdk = tl.load(GD + cols)
    z = _tile_z(X, xq, sqq, xk, sqk, rows, cols, rmask, cmask, flag, D, inv2, BM, BN, IP)
    gamma = tl.where(edge, RHO_D(z, p0, p1, p2, p3), 0.0)
    if flag != 0:       # (g_u - g_v).(x_v - x_u) + gd_u + gd_v = g_u.x_v + g_v.x_u + a_u + a_v, a = gd - g.x
        ak = gdk - tl.sum(gk * xk, 1)
        s = _mma(xq, tl.trans(gk), _mm(gq, tl.trans(xk), IP), IP) + aq[:, None] + ak[None, :]
    else:
        s = tl.zeros([BM, BN], dtype=xq.dtype)
        for k in range(0, D):
            xa = tl.load(X + rows * D + k, mask=rmask, other=0.0)
            xb = tl.load(X + cols * D + k, mask=cmask, other=0.0)
            ga = tl.load(G + rows * D + k, mask=rmask, other=0.0)
            gb = tl.load(G + cols * D + k, mask=cmask, other=0.0)
            s += (ga[:, None] - gb[None, :]) * (xb[None, :] - xa[:, None])
        s = s + gdq[:, None] + gdk[None, :]
    cn = tl.where(edge, s * RHO_2(z, p0, p1, p2, p3) * ninv - ge * gamma, 0.0)
    deg += tl.sum(gamma, 1)
    csum += tl.sum(cn, 1)
    acc = _mma(gamma, gk, acc, AP)
    acc = _mma(cn, xk, acc, AP)
    return acc, deg, csum


@triton.jit
def _tiled_bwd(X, G, GD, GE, SQ, MASK, ALLOWED, KB_PTR, KB_IDX, FLAG, P, DX, n, D, H, NKEY,
               RHO_D: tl.constexpr, RHO_2: tl.constexpr, COMPLETE: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, IP: tl.constexpr, AP: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    X = X + bh * n * D
    G = G + bh * n * D
    GD = GD + bh * n
    SQ = SQ + bh * n
    dtype = X.dtype.element_ty
    tau, p0, p1, p2, p3 = _load_params(P, dtype)
    inv2 = tl.load(P + 5).to(dtype)
    ninv = tl.load(P + 6).to(dtype)
    ge = tl.load(GE + bh).to(dtype)
    rows, rmask, dcol, tile, xq, mq, sqq, flag = _query_block(X, SQ, MASK, FLAG, qb, bh, b, n, D, BM, BD)
    gq = tl.load(G + rows[:, None] * D + dcol[None, :], mask=tile, other=0.0)
    gdq = tl.load(GD + rows, mask=rmask, other=0.0)
    aq = gdq - tl.sum(gq * xq, 1)
    acc = tl.zeros([BM, BD], dtype=dtype)        # sum_v gamma g_v + cn x_v
    deg = tl.zeros([BM], dtype=dtype)
    csum = tl.zeros([BM], dtype=dtype)
    if COMPLETE:
        lo, hi, full, nkb = _key_ranges(qb, n, mq, BM, BN)
        for kb in range(0, lo):
            acc, deg, csum = _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, kb, xq, gq, aq, gdq, sqq, rows,
                                       rmask, flag, n, D, b, dcol, inv2, ninv, ge, p0, p1, p2, p3, RHO_D, RHO_2,
                                       False, False, BM, BN, IP, AP)
        for kb in range(hi, full):
            acc, deg, csum = _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, kb, xq, gq, aq, gdq, sqq, rows,
                                       rmask, flag, n, D, b, dcol, inv2, ninv, ge, p0, p1, p2, p3, RHO_D, RHO_2,
                                       False, False, BM, BN, IP, AP)
        for kb in range(lo, hi):
            acc, deg, csum = _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, kb, xq, gq, aq, gdq, sqq, rows,
                                       rmask, flag, n, D, b, dcol, inv2, ninv, ge, p0, p1, p2, p3, RHO_D, RHO_2,
                                       True, False, BM, BN, IP, AP)
        for kb in range(tl.maximum(hi, full), nkb):
            acc, deg, csum = _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, kb, xq, gq, aq, gdq, sqq, rows,
                                       rmask, flag, n, D, b, dcol, inv2, ninv, ge, p0, p1, p2, p3, RHO_D, RHO_2,
                                       True, False, BM, BN, IP, AP)
    else:
        for i in range(tl.load(KB_PTR + qb), tl.load(KB_PTR + qb + 1)):
            acc, deg, csum = _bwd_tile(acc, deg, csum, X, G, GD, SQ, MASK, ALLOWED, tl.load(KB_IDX + i), xq, gq, aq,
                                       gdq, sqq, rows, rmask, flag, n, D, b, dcol, inv2, ninv, ge, p0, p1, p2, p3,
                                       RHO_D, RHO_2, True, True, BM, BN, IP, AP)
    dx = tl.where(mq[:, None], acc - deg[:, None] * gq - csum[:, None] * xq, 0.0)
    tl.store(DX + (bh * n + rows)[:, None] * D + dcol[None, :], dx, mask=tile)


@triton.jit
def _csr_token(X, MASK, P, n, D, H, BD: tl.constexpr):
    """The token of this program: ``(u, b, row, iu, dcol, dm, x_u, real (1,), tau, p0..p3)``, row the offset of its
    example-head in X, iu its own row there."""
    u = tl.program_id(0).to(tl.int64)          # flat token id b * n + i
    h = tl.program_id(1).to(tl.int64)
    b = u // n
    row = (b * H + h) * n
    tau, p0, p1, p2, p3 = _load_params(P, X.dtype.element_ty)
    dcol = tl.arange(0, BD)
    dm = dcol < D
    iu = row + u % n
    xu = tl.load(X + iu * D + dcol, mask=dm, other=0.0)
    mu = tl.load(MASK + u + tl.arange(0, 1)) != 0          # (1,): broadcast against each chunk
    return u, b, row, iu, dcol, dm, xu, mu, tau, p0, p1, p2, p3


@triton.jit
def _csr_chunk(X, MASK, COL, s, hi, xu, mu, b, row, n, D, dcol, dm, tau, p0, p1, p2, p3, RHO_D: tl.constexpr,
               BN: tl.constexpr):
    """Neighbours s .. s + BN of the token: ``(v, ok, diff = x_v - x_u, z, gamma)`` (0 off the real edges)."""
    j = s + tl.arange(0, BN)
    jm = j < hi
    v = tl.load(COL + j, mask=jm, other=0).to(tl.int64)
    ok = jm & (tl.load(MASK + b * n + v, mask=jm, other=0) != 0) & mu
    xv = tl.load(X + (row + v)[:, None] * D + dcol[None, :], mask=ok[:, None] & dm[None, :], other=0.0)
    diff = xv - xu[None, :]
    z = tl.where(ok, tl.sum(diff * diff, 1) / (2.0 * tau), 0.0)
    return v, ok, diff, z, tl.where(ok, RHO_D(z, p0, p1, p2, p3), 0.0)


@triton.jit
def _csr_fwd(X, MASK, ROWPTR, COL, P, AGG, DEG, EN, n, D, H,
             RHO_V: tl.constexpr, RHO_D: tl.constexpr, NUM: tl.constexpr, ENERGY: tl.constexpr,
             BN: tl.constexpr, BD: tl.constexpr):
    u, b, row, iu, dcol, dm, xu, mu, tau, p0, p1, p2, p3 = _csr_token(X, MASK, P, n, D, H, BD)
    agg = tl.zeros([BD], dtype=X.dtype.element_ty)
    deg = tl.zeros([1], dtype=tl.float64)
    en = tl.zeros([1], dtype=tl.float64)
    hi = tl.load(ROWPTR + u + 1)
    for s in range(tl.load(ROWPTR + u), hi, BN):
        v, ok, diff, z, gamma = _csr_chunk(X, MASK, COL, s, hi, xu, mu, b, row, n, D, dcol, dm, tau, p0, p1, p2, p3,
                                           RHO_D, BN)
        deg += tl.sum(gamma, 0).to(tl.float64)
        if NUM:
            agg += tl.sum(gamma[:, None] * diff, 0)
        if ENERGY:
            en += tl.sum(tl.where(ok, RHO_V(z, p0, p1, p2, p3), 0.0), 0).to(tl.float64)
    one = tl.arange(0, 1)
    tl.store(DEG + iu + one, deg.to(X.dtype.element_ty))
    if NUM:
        tl.store(AGG + iu * D + dcol, agg, mask=dm)
    if ENERGY:
        tl.store(EN + iu + one, en * 0.5 * tl.load(P + 0))


@triton.jit
def _csr_bwd(X, G, GD, GE, MASK, ROWPTR, COL, P, DX, n, D, H,
             RHO_D: tl.constexpr, RHO_2: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    u, b, row, iu, dcol, dm, xu, mu, tau, p0, p1, p2, p3 = _csr_token(X, MASK, P, n, D, H, BD)
    ge = tl.load(GE + row // n).to(X.dtype.element_ty)
    gu = tl.load(G + iu * D + dcol, mask=dm, other=0.0)
    gdu = tl.load(GD + iu)
    dx = tl.zeros([BD], dtype=X.dtype.element_ty)
    hi = tl.load(ROWPTR + u + 1)
    for s in range(tl.load(ROWPTR + u), hi, BN):
        v, ok, diff, z, gamma = _csr_chunk(X, MASK, COL, s, hi, xu, mu, b, row, n, D, dcol, dm, tau, p0, p1, p2, p3,
                                           RHO_D, BN)
        r2 = tl.where(ok, RHO_2(z, p0, p1, p2, p3), 0.0)
        gv = tl.load(G + (row + v)[:, None] * D + dcol[None, :], mask=ok[:, None] & dm[None, :], other=0.0)
        gdv = tl.load(GD + row + v, mask=ok, other=0.0)
        sdot = tl.sum((gu[None, :] - gv) * diff, 1)          # (g_u - g_v).(x_v - x_u)
        c = tl.where(ok, (sdot + gdu + gdv) * r2 / tau, 0.0)
        dx += tl.sum(gamma[:, None] * (gv - gu[None, :]) - (c + ge * gamma)[:, None] * diff, 0)
    tl.store(DX + iu * D + dcol, dx, mask=dm)


# ---------------------------------------------------------------------------------------------- host side
def rho_functions(rho):
    """``(value, derivative, second, params)`` of a penalty for the kernels ([`triton`][energies.Rho.triton])."""
    got = rho.triton()
    if got is None:
        raise NotImplementedError(f"rho {rho.spec()} provides no Triton functions (Rho.triton)")
    if isinstance(got[0], str):         # a built-in penalty names its functions in this package (.rho)
        (value, derivative, second), params = FUNCTIONS[got[0]], got[1]
    else:
        value, derivative, second, params = got
    params = tuple(float(p) for p in params) + (0.0,) * (4 - len(params))
    return value, derivative, second, params[:4]


def _bd(D: int) -> int:
    return max(16, triton.next_power_of_2(D))


def _ap(dtype: torch.dtype, lowp: bool) -> str:
    """The aggregation products' precision (``gamma @ x_k``; the backward's ``gamma @ g_k + cn @ x_k``): the tiles'
    own (`_ip`), or for a half-precision step (``lowp``, float32 tiles) bfloat16 operands with float32
    accumulation -- ``"bf16emu"`` in the interpreter (the same rounding, a float32 product). These products feed the
    step and its gradient only: the degrees, the energy and z keep the tiles' precision, so the certified energy is
    untouched."""
    if not lowp or dtype != torch.float32:
        return _ip(dtype)
    return "bf16emu" if INTERPRETED else "bf16"


def _ip(dtype: torch.dtype) -> str:
    """The tiles' product (`_mm`): ``tl.dot`` with 3xTF32 products on tensor cores for float32 (the error of z
    within `EXPANSION_Z_ULPS`, as IEEE products are; the interpreter computes it in
    full float32), or the plain sum of products for float64."""
    return "fp64" if dtype == torch.float64 else "tf32x3"


#: ``UNFOLD_TRITON_AUTOTUNE=0`` turns the CUDA autotuning of the complete graph's kernels off (the fixed
#: `block_size` tiles then run: no benchmarking of configurations on first use)
AUTOTUNE = os.environ.get("UNFOLD_TRITON_AUTOTUNE", "1") != "0"
_TUNERS: Dict[tuple, object] = {}


def _configs(wide: bool):
    """The autotuning space (BLOCK_M, BLOCK_N, warps, stages): eight shapes; for heads wider than 128 features (a
    (BM, BD) float32 query tile per program) four with BLOCK_N 32."""
    if wide:
        shapes = ((32, 32, 4, 2), (32, 32, 4, 3), (64, 32, 4, 2), (64, 32, 8, 2))
    else:   # eight of the 36 in BLOCK_M {32, 64, 128} x BLOCK_N {32, 64} x warps {4, 8} x stages {2, 3, 4}: the
        # shapes public FlashAttention-2 Triton kernels settle on for float32 heads of 16-128 (each one more compile
        # of a kernel that holds four tile bodies: 36 would cost minutes on the first call)
        shapes = ((32, 32, 4, 2), (64, 32, 4, 2), (64, 32, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 3),
                  (128, 32, 8, 2), (128, 64, 8, 2))
    return [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=st) for bm, bn, w, st in shapes]


def _tuner(which: str, X: torch.Tensor):
    """The autotuned ``_tiled_fwd`` / ``_tiled_bwd`` for the complete graph, or None where the fixed tiles run: in the
    interpreter (autotuning there would benchmark numpy), off CUDA, in float64 (the products are register sums,
    `_mm`: 16 x 16 tiles only) or with ``UNFOLD_TRITON_AUTOTUNE=0``. Only the complete graph: its kernels walk
    the key blocks in a plain loop, so any BLOCK_M / BLOCK_N serves; the banded graphs' block table is built for
    `block_size`'s tiles and must run with them. Key: the sequence length rounded up to a power of two
    (``NKEY``) and the head width (the tensors' dtypes are part of Triton's key)."""
    if INTERPRETED or not AUTOTUNE or X.device.type != "cuda" or X.dtype == torch.float64:
        return None
    wide = X.shape[-1] > 128
    t = _TUNERS.get((which, wide))
    if t is None:
        fn = _tiled_fwd if which == "fwd" else _tiled_bwd
        t = _TUNERS[(which, wide)] = triton.autotune(configs=_configs(wide), key=["NKEY", "D"])(fn)
    return t


class Layout(NamedTuple):
    """A token graph laid out for the kernels: ``kind`` `COMPLETE` / `BANDED` (``t0`` the 0/1 offsets
    table, ``(n,)`` int8, ``t1`` / ``t2`` the key blocks of every query block, `block_table`) or `CSR`
    (``t0`` row pointers over flat token ids, ``t1`` the neighbours' positions in their example, both
    orientations); ``bm`` / ``bn`` the block sizes."""
    kind: int
    t0: torch.Tensor
    t1: torch.Tensor
    t2: torch.Tensor
    bm: int
    bn: int


_LAYOUTS: Dict[tuple, Layout] = {}


def layout_for(graph, D: int, dtype: torch.dtype) -> Layout:
    """The `Layout` of a [`TokenGraph`][energies.TokenGraph] on its device (tiled for the complete graph and
    shift-invariant graphs, cached per shape; CSR otherwise, cached on the graph's fixed edge list). Built from
    fixed shapes: the mask is applied in the kernels."""
    device = graph.mask.device
    if graph.is_complete or graph.offsets is not None:
        return tiled_layout(graph.num_nodes, None if graph.is_complete else graph.offsets, D, dtype, device)
    return _csr_layout(graph, block_size(device, dtype, D)[0])


def tiled_layout(n: int, offsets, D: int, dtype: torch.dtype, device) -> Layout:
    """The tiled `Layout` of ``n`` tokens: the complete graph (``offsets`` None) or the shift-invariant graph
    of ``offsets`` (cached per shape, `_tiled_layout`)."""
    bm, bn = block_size(torch.device(device), dtype, D)
    return _tiled_layout((n, None if offsets is None else tuple(offsets), bm, bn, str(device)))


@torch.compiler.assume_constant_result
def _tiled_layout(key) -> Layout:
    """The tiled layout of ``key = (n, offsets, bm, bn, device)``, cached (a constant to ``torch.compile``, which
    calls this once while tracing and keeps the result: no graph break, no guard on the cache)."""
    lay = _LAYOUTS.get(key)
    if lay is not None:
        return lay
    n, offsets, bm, bn, device = key
    if len(_LAYOUTS) > 64:
        _LAYOUTS.clear()
    ptr, idx = block_table(n, bm, bn, offsets, "cpu")
    table = torch.zeros(max(n, 1), dtype=torch.int8, device="cpu")
    if offsets:
        table[torch.tensor(offsets, dtype=torch.long, device="cpu")] = 1
    lay = _LAYOUTS[key] = Layout(COMPLETE if offsets is None else BANDED, table.to(device), ptr.to(device),
                                 idx.to(device), bm, bn)
    return lay


@torch.compiler.disable
def _csr_layout(graph, bm: int) -> Layout:
    """Neighbour lists of the graph's fixed edge list: both orientations sorted by token (one argsort), row pointers
    from the counts (index_add, cumsum): fixed shapes, device ops, cached on the graph."""
    src, dst, _ = graph.fixed_edges()
    cache = graph.__dict__.setdefault("_layouts", {})
    hit = cache.get("csr")
    if hit is not None and hit[0] is src:
        return hit[1]
    n, total = graph.num_nodes, graph.total_nodes
    a = torch.cat([src, dst])
    b = torch.cat([dst, src])
    order = torch.argsort(a * total + b)
    col = (b[order] % n).to(torch.int32)
    counts = torch.zeros(total, dtype=torch.long, device=a.device).index_add_(0, a, torch.ones_like(a))
    rowptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    lay = Layout(CSR, rowptr, col, col, bm, 16)
    cache["csr"] = (src, lay)
    return lay


def block_table(n: int, bm: int, bn: int, offsets: Optional[Tuple[int, ...]], device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(kb_ptr, kb_idx)`` int32: for query block q, the key blocks ``kb_idx[kb_ptr[q]:kb_ptr[q+1]]`` holding a pair
    ``(i, j)`` with ``|i - j|`` among ``offsets`` (all key blocks for the complete graph, ``offsets=None``).
    Differences j - i over query block q and key block k span ``[k bn - q bm - bm + 1, k bn + bn - 1 - q bm]``."""
    qbs, kbs = -(-n // bm), -(-n // bn)
    if offsets is None:
        ptr = torch.arange(qbs + 1, dtype=torch.int32, device="cpu") * kbs
        idx = torch.arange(kbs, dtype=torch.int32, device="cpu").repeat(qbs)
        return ptr.to(device), idx.to(device)
    offs = torch.tensor(sorted(set(offsets)), dtype=torch.long, device="cpu")
    q = torch.arange(qbs, device="cpu")[:, None]
    k = torch.arange(kbs, device="cpu")[None, :]
    lo = k * bn - q * bm - bm + 1          # smallest j - i
    hi = k * bn + bn - 1 - q * bm          # largest j - i
    # an offset o in [lo, hi] or -o in [lo, hi]  <=>  some o in [lo, hi] or in [-hi, -lo]
    def any_in(a, b):
        if offs.numel() == 0:
            return torch.zeros_like(a, dtype=torch.bool)
        first = torch.searchsorted(offs, a.clamp_min(1).reshape(-1)).reshape(a.shape)
        val = offs[first.clamp_max(offs.numel() - 1)]
        return (first < offs.numel()) & (val <= b) & (b >= 1)
    touch = any_in(lo, hi) | any_in(-hi, -lo)
    counts = touch.sum(1)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), counts.cumsum(0)]).to(torch.int32)
    idx = touch.nonzero()[:, 1].to(torch.int32)
    return ptr.to(device), idx.to(device)


#: the Triton functions of each penalty the kernels have seen, by key (custom ops take strings, not functions)
_RHO_FNS: Dict[str, tuple] = {}
_RHO_PARAMS: Dict[str, tuple] = {}
_DUMMY: Dict[str, torch.Tensor] = {}


def _key_of(rho) -> str:
    return f"{type(rho).__module__}.{type(rho).__qualname__}:{rho.spec()}"


def _register(rho) -> Tuple[str, tuple]:
    value, derivative, second, params = rho_functions(rho)
    key = _key_of(rho)
    _RHO_FNS[key] = (value, derivative, second)
    _RHO_PARAMS[key] = params
    return key, params


@torch.compiler.assume_constant_result
def _rho_params(key: str) -> tuple:
    """The parameters of the penalty registered under ``key``, rebuilt from its spec
    ([`energies.rho.get_rho`][energies.get_rho]) when it was never run eagerly. A string argument: a constant to every
    torch version's dynamo (torch 2.11 refused the penalty module itself,
    ``UnspecializedNNModuleVariable(ExpRho) is not a constant``)."""
    if key not in _RHO_PARAMS:
        from ...rho import get_rho

        rho = get_rho(key.split(":", 1)[1])
        if _key_of(rho) != key:
            raise NotImplementedError(f"rho {key!r} is not rebuilt by its spec: run it once outside torch.compile")
        _register(rho)
    return _RHO_PARAMS[key]


def _rho_key(rho) -> Tuple[str, tuple]:
    """The key under which the kernels find a penalty's Triton functions, and its parameters. Eagerly the penalty
    registers itself; while ``torch.compile`` traces, the key is a string computed from constants and the lookup is
    a constant to dynamo (`_rho_params`), so the functions are registered before the op runs."""
    if not torch.compiler.is_compiling():
        return _register(rho)
    key = _key_of(rho)
    return key, _rho_params(key)


def _launch_fwd(X, sq, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, num, energy, lowp=False):
    BH, n, D = X.shape
    rho_v, rho_d, _ = _RHO_FNS[rho_key]
    agg = torch.empty_like(X) if num else X.new_zeros(1)
    deg = X.new_empty(BH, n)
    en = torch.empty(BH, n, dtype=torch.float64, device=X.device) if energy else X.new_zeros(1, dtype=torch.float64)
    if n == 0 or BH == 0:
        return agg, deg.zero_(), en.zero_()
    if kind != CSR:
        args = (X, sq, mask8, t0, t1, t2, flag, params, agg, deg, en, n, D, H, triton.next_power_of_2(n))
        meta = dict(RHO_V=rho_v, RHO_D=rho_d, NUM=num, ENERGY=energy, COMPLETE=kind == COMPLETE, BD=_bd(D),
                    IP=_ip(X.dtype), AP=_ap(X.dtype, lowp))
        tuned = _tuner("fwd", X) if kind == COMPLETE else None
        if tuned is not None:
            tuned[lambda m: (triton.cdiv(n, m["BM"]), BH)](*args, **meta)
        else:
            _tiled_fwd[(-(-n // bm), BH)](*args, BM=bm, BN=bn, **meta)
    else:
        _csr_fwd[(BH // H * n, H)](X, mask8, t0, t1, params, agg, deg, en, n, D, H, RHO_V=rho_v, RHO_D=rho_d,
                                   NUM=num, ENERGY=energy, BN=bn, BD=_bd(D))
    return agg, deg, en


def _launch_bwd(X, sq, g, gd, ge, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, lowp=False):
    BH, n, D = X.shape
    _, rho_d, rho_2 = _RHO_FNS[rho_key]
    dx = torch.zeros_like(X)
    if n == 0 or BH == 0:
        return dx
    if kind != CSR:
        args = (X, g, gd, ge, sq, mask8, t0, t1, t2, flag, params, dx, n, D, H, triton.next_power_of_2(n))
        meta = dict(RHO_D=rho_d, RHO_2=rho_2, COMPLETE=kind == COMPLETE, BD=_bd(D), IP=_ip(X.dtype),
                    AP=_ap(X.dtype, lowp))
        tuned = _tuner("bwd", X) if kind == COMPLETE else None
        if tuned is not None:
            tuned[lambda m: (triton.cdiv(n, m["BM"]), BH)](*args, **meta)
        else:
            _tiled_bwd[(-(-n // bm), BH)](*args, BM=bm, BN=bn, **meta)
    else:
        _csr_bwd[(BH // H * n, H)](X, g, gd, ge, mask8, t0, t1, params, dx, n, D, H, RHO_D=rho_d, RHO_2=rho_2,
                                   BN=bn, BD=_bd(D))
    return dx


#: layout kinds of the custom ops
COMPLETE, BANDED, CSR = 0, 1, 2


@torch.library.custom_op("unfolded_transformers::triton_pairwise", mutates_args=())
def _pairwise_op(X: torch.Tensor, sq: torch.Tensor, mask8: torch.Tensor, t0: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor,
                 params: torch.Tensor, flag: torch.Tensor, H: int, kind: int, bm: int, bn: int, rho_key: str,
                 num: bool, energy: bool, lowp: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(agg or a 1-element placeholder, deg, energy per (example, head) (BH,) float64 or placeholder)``; ``sq``
    the squared norms ``|x_u|^2`` ``(BH, n)`` (computed once per pass, not per tile; treated as a constant of X:
    the backward differentiates z itself)."""
    agg, deg, en = _launch_fwd(X, sq, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, num, energy, lowp)
    return agg, deg, (en.sum(-1) if energy else en)


@_pairwise_op.register_fake
def _pairwise_fake(X, sq, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, num, energy, lowp):
    BH, n, _ = X.shape
    return (torch.empty_like(X) if num else X.new_empty(1), X.new_empty(BH, n),
            X.new_empty(BH if energy else 1, dtype=torch.float64))


@torch.library.custom_op("unfolded_transformers::triton_pairwise_backward", mutates_args=())
def _pairwise_bwd_op(X: torch.Tensor, sq: torch.Tensor, g: torch.Tensor, gd: torch.Tensor, ge: torch.Tensor, mask8: torch.Tensor,
                     t0: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, params: torch.Tensor, flag: torch.Tensor,
                     H: int, kind: int, bm: int, bn: int, rho_key: str, lowp: bool) -> torch.Tensor:
    return _launch_bwd(X, sq, g, gd, ge, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, lowp)


@_pairwise_bwd_op.register_fake
def _pairwise_bwd_fake(X, sq, g, gd, ge, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, lowp):
    return torch.empty_like(X)


def _setup(ctx, inputs, output):
    X, sq, mask8, t0, t1, t2, params, flag, H, kind, bm, bn, rho_key, num, energy, lowp = inputs
    ctx.save_for_backward(X, sq, mask8, t0, t1, t2, params, flag)
    ctx.rest = (H, kind, bm, bn, rho_key, lowp)
    ctx.num, ctx.energy = num, energy


def _backward(ctx, g_agg, g_deg, g_e):
    X, sq, mask8, t0, t1, t2, params, flag = ctx.saved_tensors
    BH, n, D = X.shape
    g = g_agg.to(X.dtype).contiguous() if (ctx.num and g_agg is not None) else torch.zeros_like(X)
    gd = g_deg.to(X.dtype).contiguous() if g_deg is not None else X.new_zeros(BH, n)
    ge = g_e.to(X.dtype).contiguous() if (ctx.energy and g_e is not None) else X.new_zeros(BH)
    dx = _pairwise_bwd_op(X, sq, g, gd, ge, mask8, t0, t1, t2, params, flag, *ctx.rest)
    return (dx,) + (None,) * 15


_pairwise_op.register_autograd(_backward, setup_context=_setup)


def pairwise_heads(Z: torch.Tensor, mask: torch.Tensor, layout: "Layout", rho, tau: float, num: bool, energy: bool,
                   sensitivity: float, lowp: bool = False):
    """``(agg (B, H, n, D) or None, deg (B, H, n), energy (B, H) float64 or None)`` for centred head features ``Z``
    ``(B, H, n, D)`` (zero on padded slots) and a ``(B, n)`` bool mask: one launch over every example and head;
    `reference` (the top of this file) is the same in plain torch.
    Differentiable in Z (all three outputs). ``lowp``: the tokens were bfloat16 / float16 (a half-precision step):
    the aggregation products (``gamma @ x`` and the backward's) take bfloat16 operands on the tensor cores, z and
    every sum of the degrees and energy stay as they are (`_ap`)."""
    B, H, n, D = Z.shape
    X = Z.reshape(B * H, n, D).contiguous()
    key, p = _rho_key(rho)
    params = _params(float(tau), p, Z.device)
    sq = (X.detach() * X.detach()).sum(-1)           # |x_u|^2, once per pass: the guard's input and the kernels'
    flag = expansion_ok(sq, float(tau), sensitivity, X.dtype).to(torch.int8)
    mask8 = mask.to(torch.int8).contiguous()
    agg, deg, e = _pairwise_op(X, sq, mask8, layout.t0, layout.t1, layout.t2, params, flag, H, layout.kind, layout.bm,
                               layout.bn, key, bool(num), bool(energy), bool(lowp))
    return (agg.view(B, H, n, D) if num else None), deg.view(B, H, n), (e.view(B, H) if energy else None)


_PARAMS: Dict[tuple, torch.Tensor] = {}


def _params(tau: float, p: tuple, device) -> torch.Tensor:
    """``[tau, p0, p1, p2, p3, 1 / (2 tau), -1 / tau]`` float64 on the device (cached: no host-to-device copy per pass
    once seen; the reciprocals spare the tiles a division per pair)."""
    key = (tau, p, str(device))
    t = _PARAMS.get(key)
    if t is None:
        if len(_PARAMS) > 256:
            _PARAMS.clear()
        t = _PARAMS[key] = torch.tensor([tau, *p, 0.5 / tau, -1.0 / tau], dtype=torch.float64, device="cpu").to(device)
    return t
