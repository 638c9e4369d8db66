"""The built-in penalties rho as Triton device functions: value, derivative rho' (the edge weight gamma) and
second derivative rho'' (the backward pass), one triple per rho (`energies.kernels.triton.pairwise`).

Each function is ``f(z, p0, p1, p2, p3)`` on a tile of ``z >= 0`` in the compute dtype (float32 or float64); the
four parameters are what [`triton`][energies.Rho.triton] returns (read from a float64 tensor in the kernel, so
float64 kernels keep them exact). Python float literals below adopt the dtype of the tensor they meet (Triton's
scalar rule), so float64 kernels keep full precision. The formulas are those of `energies.rho`, with the
same precision rules:

* exp: ``-exp(-z)``, ``exp(-z)`` (``-z <= 0``: no overflow, no shift needed); in float32 as ``exp2(-z log2(e))``
  (the constant folded into one multiply: what CUDA's fast float32 ``exp`` does anyway), in float64 ``exp`` itself
  (``exp2`` would add about ``z`` ulps from rounding the scaled argument);
* relu:C: ``m (C - m / 2)``, ``m = min(z, C)``; ``max(C - z, 0)``;
* softplus:C:T: ``rho' = max(C - z, 0) + T softplus(-|C - z| / T)`` (``softplus(x) = log1p(e^x)`` for x <= 0 by
  the compensated ``log(1 + w) - ((1 + w) - 1 - w) / (1 + w)``, as libdevice's log1p is not available to the
  interpreter); ``rho`` by 16-point Gauss-Legendre quadrature for z < 2T and by the dilogarithm series
  (Landen's identity, ``sum_k w^k / k^2`` with ``w = sigmoid(u) <= 1/2`` by Horner's rule as energies.rho does:
  60 terms in float64, 24 in float32, whose next term is below ``2^-23 / 625`` of the sum) elsewhere; each tile
  evaluates only the branches its z reach (a tile of z all below 2T runs the quadrature alone, a tile all above
  it the series alone: per-tile branches on ``min z`` / ``max z``, the result unchanged);
* cauchy: ``log1p(z)`` (compensated as above), ``1 / (1 + z)``;
* lp:P:EPS: ``z^(P/2)`` as ``exp(P/2 log z)`` above EPS (relative error about ``(1 + |P/2 log z|) eps``), the
  linear floor below; ``rho' = P/2 max(z, EPS)^(P/2 - 1)``.

A registered rho of one's own joins the Triton kernel by returning its own triple of ``@triton.jit`` functions
with the same signature from [`triton`][energies.Rho.triton] (tests/test_triton.py shows one).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def log1p(x):
    """``log(1 + x)`` for ``x >= 0`` to full relative precision (compensated: exact when 1 + x rounds to 1)."""
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.log(u) - ((u - 1.0) - x) / u)


@triton.jit
def softplus_neg(x):
    """``log(1 + e^x)`` for ``x <= 0``."""
    return log1p(tl.exp(x))


#: log2(e): ``exp(-z) = exp2(-z log2(e))``
LOG2E = 1.4426950408889634


@triton.jit
def exp_neg(z):
    """``exp(-z)``: ``exp2`` with log2(e) folded into the one multiply in float32, ``exp`` in float64."""
    if z.dtype == tl.float64:
        r = tl.exp(-z)
    else:
        r = tl.exp2(z * -1.4426950408889634)
    return r


@triton.jit
def exp_value(z, p0, p1, p2, p3):
    return -exp_neg(z)


@triton.jit
def exp_derivative(z, p0, p1, p2, p3):
    return exp_neg(z)


@triton.jit
def exp_second(z, p0, p1, p2, p3):
    return -exp_neg(z)


@triton.jit
def relu_value(z, c, p1, p2, p3):
    m = tl.minimum(z, c)
    return m * (c - 0.5 * m)


@triton.jit
def relu_derivative(z, c, p1, p2, p3):
    return tl.maximum(c - z, 0.0)


@triton.jit
def relu_second(z, c, p1, p2, p3):
    return tl.where(z < c, -1.0, 0.0) + 0.0 * z


@triton.jit
def softplus_derivative(z, c, t, p2, p3):
    d = c - z
    return tl.maximum(d, 0.0) + t * softplus_neg(-tl.abs(d) / t)


@triton.jit
def softplus_second(z, c, t, p2, p3):
    return -1.0 / (1.0 + tl.exp((z - c) / t))


@triton.jit
def _landen(u):
    """``F(u) = int_{-inf}^u softplus(s) ds = Li2(sigmoid(u)) + softplus(u)^2 / 2`` for ``u <= 0``."""
    w = 1.0 / (1.0 + tl.exp(-u))
    # Horner's rule, w (1 + w (1/4 + w (1/9 + ...))): positive terms, w <= 1/2, constants folded at compile time
    # (static_range: k is a constant, 1 / k^2 a literal in the tile's dtype), no division per pair
    if u.dtype == tl.float64:
        acc = tl.zeros_like(w) + 1.0 / 3600.0
        for k in tl.static_range(59, 0, -1):
            acc = acc * w + 1.0 / (k * k)
    else:
        acc = tl.zeros_like(w) + 1.0 / 576.0
        for k in tl.static_range(23, 0, -1):
            acc = acc * w + 1.0 / (k * k)
    sp = softplus_neg(u)
    return acc * w + 0.5 * sp * sp


@triton.jit
def _quad(z, c, t):
    """``int_0^z rho'(s) ds`` by the 16-point Gauss-Legendre rule on [0, 1] (the nodes of energies.rho)."""
    acc = 0.013576229705877088 * softplus_derivative(z * 0.005299532504175031, c, t, 0.0, 0.0)
    acc += 0.031126761969323728 * softplus_derivative(z * 0.0277124884633837, c, t, 0.0, 0.0)
    acc += 0.0475792558412463 * softplus_derivative(z * 0.06718439880608412, c, t, 0.0, 0.0)
    acc += 0.062314485627767036 * softplus_derivative(z * 0.1222977958224985, c, t, 0.0, 0.0)
    acc += 0.07479799440828835 * softplus_derivative(z * 0.19106187779867811, c, t, 0.0, 0.0)
    acc += 0.08457825969750132 * softplus_derivative(z * 0.2709916111713863, c, t, 0.0, 0.0)
    acc += 0.09130170752246182 * softplus_derivative(z * 0.35919822461037054, c, t, 0.0, 0.0)
    acc += 0.09472530522753432 * softplus_derivative(z * 0.4524937450811813, c, t, 0.0, 0.0)
    acc += 0.09472530522753432 * softplus_derivative(z * 0.5475062549188188, c, t, 0.0, 0.0)
    acc += 0.09130170752246182 * softplus_derivative(z * 0.6408017753896295, c, t, 0.0, 0.0)
    acc += 0.08457825969750132 * softplus_derivative(z * 0.7290083888286136, c, t, 0.0, 0.0)
    acc += 0.07479799440828835 * softplus_derivative(z * 0.8089381222013219, c, t, 0.0, 0.0)
    acc += 0.062314485627767036 * softplus_derivative(z * 0.8777022041775016, c, t, 0.0, 0.0)
    acc += 0.0475792558412463 * softplus_derivative(z * 0.9328156011939159, c, t, 0.0, 0.0)
    acc += 0.031126761969323728 * softplus_derivative(z * 0.9722875115366163, c, t, 0.0, 0.0)
    acc += 0.013576229705877088 * softplus_derivative(z * 0.994700467495825, c, t, 0.0, 0.0)
    return z * acc


@triton.jit
def softplus_value(z, c, t, f_c, p3):
    """``f_c = F(-C / T)`` (computed once in float64 on the host). z < 2T: quadrature; 2T <= z <= C:
    ``z (C - z / 2) + T^2 (F((z - C) / T) - F(-C / T))``; beyond: ``C^2 / 2 + T^2 (pi^2 / 6 - F(-C / T) - F((C - z)
    / T))`` (energies.rho.SoftplusRho.value)."""
    small = z < 2.0 * t
    q = tl.zeros_like(z)
    if tl.min(z) < 2.0 * t:            # some z of the tile below 2T: the quadrature
        q = _quad(tl.where(small, z, 0.0), c, t)
    r = q
    if tl.max(z) >= 2.0 * t:           # some at or above: the series
        f_u = _landen(-tl.abs(z - c) / t)
        mid = z * (c - 0.5 * z) + t * t * (f_u - f_c)
        big = 0.5 * c * c + t * t * (1.6449340668482264 - f_c - f_u)
        r = tl.where(small, q, tl.where(z <= c, mid, big))
    return r


@triton.jit
def cauchy_value(z, p0, p1, p2, p3):
    return log1p(z)


@triton.jit
def cauchy_derivative(z, p0, p1, p2, p3):
    return 1.0 / (1.0 + z)


@triton.jit
def cauchy_second(z, p0, p1, p2, p3):
    r = 1.0 / (1.0 + z)
    return -r * r


@triton.jit
def lp_value(z, h, eps, lin0, slope):
    zc = tl.maximum(z, eps)
    return tl.where(z >= eps, tl.exp(h * tl.log(zc)), lin0 + slope * z)


@triton.jit
def lp_derivative(z, h, eps, lin0, slope):
    return h * tl.exp((h - 1.0) * tl.log(tl.maximum(z, eps)))


@triton.jit
def lp_second(z, h, eps, lin0, slope):
    zc = tl.maximum(z, eps)
    return tl.where(z > eps, h * (h - 1.0) * tl.exp((h - 2.0) * tl.log(zc)), 0.0)


FUNCTIONS = {
    "exp": (exp_value, exp_derivative, exp_second),
    "relu": (relu_value, relu_derivative, relu_second),
    "softplus": (softplus_value, softplus_derivative, softplus_second),
    "cauchy": (cauchy_value, cauchy_derivative, cauchy_second),
    "lp": (lp_value, lp_derivative, lp_second),
}
