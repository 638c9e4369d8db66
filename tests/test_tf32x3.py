"""3xTF32 products keep the precision guard: a torch simulation of the tensor cores' 3xTF32 product (the float32
``tl.dot(..., input_precision="tf32x3")`` of the ``triton`` kernel) and the error of z it gives, against float64.

The bound, :data:`energies.kernels.guard.EXPANSION_Z_ULPS`: ``|dz| <= (a d + b) eps max|x|^2 / tau`` for d features
(eps = 2^-23, u = eps / 2 the unit roundoff, M = max |x|, so ``sum_i |a_i b_i| <= |a| |b| <= M^2``). The kernel forms
``z = max(s_a + s_b - 2 p, 0) * fl(1 / (2 tau))`` from squared norms ``s`` (float32 sums) and the product p:

* each ``s``: ``<= gamma_d M^2 ~ (d / 2) eps M^2`` (round to nearest, any order);
* p, IEEE (FMA chain, round to nearest): ``<= (d / 2) eps M^2``;
* p, 3xTF32: ``a = hi + lo`` with ``hi`` rounded to TF32 (11 significant bits, ``|lo| <= 2^-11 |a|``), ``lo`` as the
  tensor core reads it, truncated to TF32 (``|lo - lo'| <= 3 * 2^-23 |a|``: the bits of ``lo`` below TF32's last
  are the last two of a's float32 mantissa), ``lo * lo'`` dropped (``<= 2^-22 |a b|``): ``hi hi' + hi lo' + lo hi'``
  is off by ``<= (2 * 1.5 + 2) eps = 5 eps`` per ``|a_i b_i|``; the products are exact in float32 (11 x 11 bits) and
  their accumulation, with the tensor core's truncating adds, ``<= d eps``: ``p`` within ``(d + 5) eps M^2``;
* ``s_a + s_b`` (``<= 2 M^2``) and the difference (``<= 4 M^2``): ``<= 3 eps M^2``; the scaling ``<= 2 eps M^2 / tau``.

So ``|dz| <= [d + 2 (d / 2) + 3] / 2 + 2 = d + 3.5`` (IEEE) and ``[d + 2 (d + 5) + 3] / 2 + 2 = 1.5 d + 8.5``
(3xTF32) in units of ``eps M^2 / tau``; the constants ``(1, 4)`` and ``(1.5, 9)`` absorb the second-order terms.
Plain TF32 (``hi hi'`` only) errs by up to ``2^-10 = 8192 eps`` per term: the negative control.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from energies.kernels.guard import EXPANSION_Z_ERROR, EXPANSION_Z_ULPS

EPS = 2.0 ** -23
MASK13 = -(1 << 13)            # clears float32's 13 mantissa bits below TF32's 10 explicit ones


def tf32_rna(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 to nearest, ties away from zero (``cvt.rna.tf32.f32``, the split's ``hi``)."""
    return ((x.view(torch.int32) + (1 << 12)) & MASK13).view(torch.float32)


def tf32_trunc(x: torch.Tensor) -> torch.Tensor:
    """x truncated to TF32 (how a tensor core reads a float32 operand it is told is TF32)."""
    return (x.view(torch.int32) & MASK13).view(torch.float32)


def _add(acc: torch.Tensor, t: torch.Tensor, mode: str) -> torch.Tensor:
    """``acc + t`` in float32, rounded to nearest ("rn") or toward zero ("rz", a truncating accumulator); the
    operands' exact sum taken in float64 (exact up to exponent gaps beyond 29 bits)."""
    s = acc.double() + t.double()
    r = s.float()
    if mode == "rz":
        r = torch.where(r.double().abs() > s.abs(), torch.nextafter(r, torch.zeros_like(r)), r)
    return r


def product(A: torch.Tensor, B: torch.Tensor, precision: str, mode: str = "rn") -> torch.Tensor:
    """``A @ B^T`` of float32 ``(m, d)`` and ``(k, d)``, as the hardware forms it, accumulated term by term:
    "ieee" (a float32 FMA chain), "tf32x3" (small products ``lo' hi`` then ``hi lo'``, then ``hi hi'`` on top,
    Triton's order), "tf32" (``hi hi'`` only)."""
    m, d = A.shape
    acc = torch.zeros(m, B.shape[0], dtype=torch.float32)
    if precision == "ieee":
        for i in range(d):                          # fma: the float64 product of two float32 is exact
            s = acc.double() + A[:, i, None].double() * B[None, :, i].double()
            acc = s.float() if mode == "rn" else _add(acc, (s - acc.double()).float(), mode)
        return acc
    ha, hb = tf32_rna(A), tf32_rna(B)
    la, lb = tf32_trunc(A - ha), tf32_trunc(B - hb)          # A - ha is exact in float32
    if precision == "tf32x3":
        for i in range(d):
            acc = _add(acc, la[:, i, None] * hb[None, :, i], mode)     # exact products (11 x 11 bits)
        for i in range(d):
            acc = _add(acc, ha[:, i, None] * lb[None, :, i], mode)
    for i in range(d):
        acc = _add(acc, ha[:, i, None] * hb[None, :, i], mode)
    return acc


def z_error(X: torch.Tensor, tau: float, precision: str, mode: str = "rn") -> float:
    """Largest ``|z - z_ref|`` over all pairs of X's tokens, z as the kernel forms it from the simulated product,
    in units of ``eps max|x|^2 / tau``; z_ref in float64 from explicit differences."""
    X = X.float()
    sq = (X * X).sum(-1)
    d2 = torch.clamp((sq[:, None] + sq[None, :]) - 2.0 * product(X, X, precision, mode), min=0.0)
    z = d2 * torch.tensor(0.5 / tau, dtype=torch.float32)
    X64 = X.double()
    ref = ((X64[:, None, :] - X64[None, :, :]) ** 2).sum(-1) * (0.5 / tau)
    unit = EPS * float((X64 * X64).sum(-1).max()) / tau
    return float((z.double() - ref).abs().max()) / unit


def bound(precision: str, d: int) -> float:
    a, b = EXPANSION_Z_ULPS[precision]
    return a * d + b


def _inputs(kind: str, n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        return torch.randn(n, d, generator=g) * 3.0
    if kind == "clustered":                # near-duplicates far out, every component positive: sum |a_i b_i| = |a||b|
        c = 4.0 * (1.0 + 0.01 * torch.randn(1, d, generator=g))
        return c + 1e-3 * torch.randn(n, d, generator=g)
    if kind == "bits":                     # uniform random mantissas, one sign, one binade
        return (1.0 + torch.rand(n, d, generator=g, dtype=torch.float64)).float()
    if kind == "worst-split":              # every component's lo as large as it gets, all ones below TF32's last bit
        hi = 1.0 + torch.randint(0, 1024, (n, d), generator=g).double() * 2.0 ** -10
        lo = (2.0 ** -11 - 2.0 ** -23) * torch.where(torch.rand(n, 1, generator=g) < 0.5, 1.0, -1.0).double()
        return (hi + lo).float()
    raise ValueError(kind)


KINDS = ["gaussian", "clustered", "bits", "worst-split"]


def test_the_simulated_split_is_what_it_claims():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g) * 100
    hi, lo = tf32_rna(x), x - tf32_rna(x)
    assert torch.equal(hi + lo, x)                                              # the split is exact
    assert ((hi.view(torch.int32) & ~MASK13) == 0).all()                       # hi has TF32's 10 explicit bits
    assert ((lo.abs() <= 2.0 ** -11 * x.abs()) | (lo == 0)).all()              # |lo| <= 2^-11 |x|
    assert ((tf32_trunc(lo) - lo).abs() <= 3 * 2.0 ** -23 * x.abs()).all()      # the tensor core's read of lo
    A = tf32_rna(torch.randn(8, 16, generator=g))                              # operands already in TF32: all
    assert torch.equal(product(A, A, "tf32x3"), product(A, A, "tf32"))          # three products agree exactly


@pytest.mark.parametrize("d", [3, 32])
@pytest.mark.parametrize("mode", ["rn", "rz"])
@pytest.mark.parametrize("kind", KINDS)
def test_3xtf32_z_error_is_within_the_guards_stated_bound(kind, mode, d):
    """3xTF32 (and IEEE) products stay within EXPANSION_Z_ULPS on random and adversarial tokens, with a rounding or a
    truncating accumulator; plain TF32 exceeds the 3xTF32 bound on every input set (the negative control)."""
    n, tau = 192, 0.7
    X = _inputs(kind, n, d, seed=d)
    e3 = z_error(X, tau, "tf32x3", mode)
    ei = z_error(X, tau, "ieee", mode)
    et = z_error(X, tau, "tf32", mode)
    assert e3 <= bound("tf32x3", d), (kind, mode, d, e3)
    assert ei <= bound("ieee", d if mode == "rn" else 2 * d), (kind, mode, d, ei)
    assert et > bound("tf32x3", d), (kind, mode, d, et)                      # negative control
    assert 0.0 < e3                                                         # a rounding error was measured


def test_the_guard_keeps_the_weights_within_the_stated_constant():
    """At the guard's limit (eps max|x|^2 / tau = EXPANSION_Z_ERROR[float32]) the 3xTF32 z of clustered tokens errs
    by at most (1.5 d + 9) EXPANSION_Z_ERROR: the restated guarantee of the guard for the Triton kernel's float32."""
    d = 32
    X = _inputs("clustered", 128, d, seed=5).double()
    tau = EPS * float((X * X).sum(-1).max()) / EXPANSION_Z_ERROR[torch.float32]      # right at the limit
    err = z_error(X, tau, "tf32x3", "rz") * EXPANSION_Z_ERROR[torch.float32]        # absolute error of z
    assert err <= bound("tf32x3", d) * EXPANSION_Z_ERROR[torch.float32]
    assert math.isfinite(tau) and tau > 0


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or torch.cuda.is_available(),
                    reason="what the interpreter does with tf32x3")
def test_the_interpreter_computes_tf32x3_in_full_float32():
    """Under TRITON_INTERPRET=1 ``tl.dot(..., input_precision="tf32x3")`` is numpy's float32 matmul: the kernel runs
    the same code path, at IEEE float32 precision (errors far below plain TF32's)."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def dot_kernel(A, B, C, IP: tl.constexpr):
        i = tl.arange(0, 32)
        a = tl.load(A + i[:, None] * 32 + i[None, :])
        b = tl.load(B + i[:, None] * 32 + i[None, :])
        tl.store(C + i[:, None] * 32 + i[None, :], tl.dot(a, b, input_precision=IP))

    from energies.kernels.triton import pairwise as TP
    assert TP._ip(torch.float32) == "tf32x3" and TP._ip(torch.float64) == "fp64"
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g)
    C = torch.empty(32, 32)
    dot_kernel[(1,)](A, B, C, IP="tf32x3")
    ref = A.double() @ B.double()
    scale = (A.double().abs() @ B.double().abs())
    err = float(((C.double() - ref).abs() / scale).max())
    assert err <= 32 * 2.0 ** -24                             # IEEE float32 accumulation of 32 terms
    plain = product(A, B.T.contiguous(), "tf32")
    assert float(((plain.double() - ref).abs() / scale).max()) > 100 * err   # TF32 would be far coarser


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor cores' products need a GPU")
def test_the_kernels_z_error_on_the_device_is_within_the_bound(monkeypatch):
    """The compiled kernel's own z, read through relu:1 on near-duplicate pairs far from the origin: each token's
    degree is ``1 - z`` of its partner alone (every other pair lies at z ~ 400 > 1), so ``|deg - deg_ref|`` is one
    pair's z error. Within the 3xTF32 bound at ``max|x|^2 / tau ~ 400`` (inside the guard); negative control: with
    plain TF32 products the same pass is far outside it (which also shows the precision reaches the hardware)."""
    from energies.kernels.triton import pairwise as TP
    from energies.kernels import pairwise_pass
    import energies as E
    from energies.rho import get_rho

    g = torch.Generator().manual_seed(0)
    pairs, d, tau = 128, 32, 1.0
    centres = torch.randn(pairs, d, generator=g, dtype=torch.float64) * (16.0 / math.sqrt(d))
    Y = torch.stack([centres, centres + torch.randn(pairs, d, generator=g, dtype=torch.float64) * (0.8 / math.sqrt(d))], 1)
    Y = Y.reshape(1, 2 * pairs, d).float().double()          # the float32 tokens, exactly
    Yc = Y - Y.mean(1, keepdim=True)
    unit = EPS * float((Yc * Yc).sum(-1).max()) / tau
    graph = E.complete(2 * pairs).to("cuda")
    rho = get_rho("relu:1")
    z_ref = ((Yc[0, 0::2] - Yc[0, 1::2]) ** 2).sum(-1) / (2 * tau)
    deg_ref = torch.clamp(1.0 - z_ref, min=0.0).repeat_interleave(2)
    assert float(z_ref.max()) < 1.0
    assert bool(TP.expansion_ok((Yc * Yc).sum(-1).float(), tau, 1.0, torch.float32).all())      # the expansion runs

    def err():
        out = pairwise_pass(Y.float().cuda(), graph, rho, tau, "triton")
        return float((out.deg[0].double().cpu() - deg_ref).abs().max()) / unit

    assert err() <= bound("tf32x3", d)
    monkeypatch.setattr(TP, "_ip", lambda dtype: "fp64" if dtype == torch.float64 else "tf32")
    assert err() > bound("tf32x3", d)
