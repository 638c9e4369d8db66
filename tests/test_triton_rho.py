"""The Triton penalty functions (energies.kernels.triton.rho) against 50-digit references (tests/precision.py), one tile at a
time: value, derivative and second derivative of every built-in rho, in float64 and float32, on tiles whose z lie
all below, all above, and on both sides of the softplus switch z = 2T (the per-tile branches: quadrature only,
series only, both). Run in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by conftest.py without a GPU),
compiled on CUDA."""
from __future__ import annotations

import os

import mpmath
import pytest
import torch

triton = pytest.importorskip("triton")

from energies.rho import get_rho  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not set", allow_module_level=True)

import triton.language as tl  # noqa: E402

from energies.kernels.triton.pairwise import rho_functions  # noqa: E402
from energies.kernels.triton.rho import _landen  # noqa: E402
from tests.precision import rho_mp  # noqa: E402

mpmath.mp.dps = 50


@triton.jit
def _eval(Z, P, V, DV, D2, RHO_V: tl.constexpr, RHO_D: tl.constexpr, RHO_2: tl.constexpr, BLOCK: tl.constexpr):
    """One (16, BLOCK // 16) tile of z per program: the three functions, as the pairwise kernels call them."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, 16)[:, None] * (BLOCK // 16) + tl.arange(0, BLOCK // 16)[None, :]
    z = tl.load(Z + i)
    dt = Z.dtype.element_ty
    p0, p1, p2, p3 = tl.load(P + 0).to(dt), tl.load(P + 1).to(dt), tl.load(P + 2).to(dt), tl.load(P + 3).to(dt)
    tl.store(V + i, RHO_V(z, p0, p1, p2, p3))
    tl.store(DV + i, RHO_D(z, p0, p1, p2, p3))
    tl.store(D2 + i, RHO_2(z, p0, p1, p2, p3))


def _run(spec, z, dtype):
    value, derivative, second, params = rho_functions(get_rho(spec))
    Z = z.to(dtype).to(DEVICE).contiguous()
    P = torch.tensor(list(params) + [0.0] * (4 - len(params)), dtype=torch.float64, device=DEVICE)
    out = [torch.empty_like(Z) for _ in range(3)]
    _eval[(Z.numel() // 256,)](Z, P, *out, RHO_V=value, RHO_D=derivative, RHO_2=second, BLOCK=256)
    return Z.double().cpu(), [o.double().cpu() for o in out]


def _z_tiles(t):
    """Four tiles of 256: all below 2T, all above, mixed, and a wide sweep (zeros and the exact switch included)."""
    g = torch.Generator().manual_seed(0)
    below = torch.rand(256, generator=g, dtype=torch.float64) * 1.999 * t
    above = 2 * t + torch.rand(256, generator=g, dtype=torch.float64) * 6.0
    mixed = torch.rand(256, generator=g, dtype=torch.float64) * 4 * t
    wide = torch.cat([torch.tensor([0.0, 1e-300, 1e-30, 1e-8, 2 * t, 2 * t * (1 - 1e-15), 30.0, 700.0]),
                      torch.logspace(-12, 2.5, 248, dtype=torch.float64)])
    return torch.cat([below, above, mixed, wide])


def _mp_derivative(spec, z):
    name, _, rest = spec.partition(":")
    a = [mpmath.mpf(x) for x in rest.split(":")] if rest else []
    z = mpmath.mpf(z)
    if name == "exp":
        return mpmath.exp(-z), -mpmath.exp(-z)
    if name == "relu":
        return max(a[0] - z, 0), (-1 if z < a[0] else 0)
    if name == "softplus":
        c, t = a
        return t * mpmath.log1p(mpmath.exp((c - z) / t)), -1 / (1 + mpmath.exp((z - c) / t))
    if name == "cauchy":
        return 1 / (1 + z), -1 / (1 + z) ** 2
    if name == "lp":
        h, eps = a[0] / 2, a[1]
        zc = max(z, eps)
        return h * zc ** (h - 1), (h * (h - 1) * zc ** (h - 2) if z > eps else 0)
    raise ValueError(spec)


@pytest.mark.parametrize("dtype, ulps", [(torch.float64, 64), (torch.float32, 64)])
@pytest.mark.parametrize("spec", ["softplus:1.5:0.5", "softplus:2:0.05", "softplus:0.3:2", "softplus:1000:1",
                                  "softplus:400:0.25", "exp", "cauchy", "relu:1.5", "lp:1:0.001"])
def test_the_triton_functions_match_50_digit_references(spec, dtype, ulps):
    """Relative error at most ``ulps`` eps of the compute dtype times the condition of the argument (``1 + z / T``
    for softplus, ``1 + z`` for exp, ``1 + |log z|`` for lp: the rounding of z itself, or of ``(C - z) / T``, moves
    exp by that many ulps; values below the dtype's smallest normal, where exp(-z) underflows, compared
    absolutely)."""
    t = float(spec.split(":")[2]) if spec.startswith("softplus") else 0.5
    scale = 1.0 / t if spec.startswith("softplus") else 1.0
    Z, (v, d1, d2) = _run(spec, _z_tiles(t), dtype)
    eps, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).tiny
    worst = 0.0
    for k in range(Z.numel()):
        z = float(Z[k])
        cond = 1.0 + z * scale + (abs(mpmath.log(z)) if spec.startswith("lp") and z > 0 else 0.0)
        ref = [rho_mp(spec, z), *_mp_derivative(spec, z)]
        for got, r in zip((v[k], d1[k], d2[k]), ref):
            r = float(r)
            err = abs(float(got) - r) / max(abs(r), tiny / eps) / cond
            worst = max(worst, err)
            assert err <= ulps * eps, (spec, dtype, z, float(got), r)
    assert worst > 0.0           # a comparison was made


@triton.jit
def series_only(z, c, t, f_c, p3):
    """softplus's value by the series at every z (the branch the quadrature replaces below 2T)."""
    f_u = _landen(-tl.abs(z - c) / t)
    return z * (c - 0.5 * z) + t * t * (f_u - f_c)


def test_a_wrong_branch_choice_is_caught():
    """Negative control: the series alone (no quadrature) on small z loses the precision the test asks for."""
    value, derivative, second, params = rho_functions(get_rho("softplus:1.5:0.5"))
    z = torch.logspace(-9, -1, 256, dtype=torch.float64)
    P = torch.tensor(list(params), dtype=torch.float64, device=DEVICE)
    out = [torch.empty_like(z, device=DEVICE) for _ in range(3)]
    _eval[(1,)](z.to(DEVICE), P, *out, RHO_V=series_only, RHO_D=derivative, RHO_2=second, BLOCK=256)
    err = max(abs(float(out[0][k]) - float(rho_mp("softplus:1.5:0.5", float(z[k])))) /
              abs(float(rho_mp("softplus:1.5:0.5", float(z[k])))) for k in range(256))
    assert err > 64 * torch.finfo(torch.float64).eps


@pytest.mark.parametrize("c, t", [(709.8, 1.0), (1000.0, 1.0), (400.0, 0.25), (1e6, 1e-3), (1e100, 1.0)])
def test_softplus_beyond_exps_range_has_its_triton_constant(c, t):
    """C / T past ~709 (where e^(C/T) overflows a float64): ``triton()`` (the kernel's support check calls it) once
    ended in ``OverflowError: math range error``; F(-C / T) = -Li2(-e^(-C/T)) is now computed from e^(-C/T) alone,
    against 50 digits (absolutely below float64's smallest subnormal, where it underflows to 0)."""
    from energies.kernels.triton import _triton_supports
    from energies.graphs import complete

    rho = get_rho(f"softplus:{c!r}:{t!r}")
    f_c = rho_functions(rho)[3][2]
    ref = -mpmath.polylog(2, -mpmath.exp(-mpmath.mpf(c) / mpmath.mpf(t)))
    assert abs(f_c - float(ref)) <= 4 * torch.finfo(torch.float64).eps * float(ref) + 5e-324
    assert _triton_supports(complete(4), rho) is None
