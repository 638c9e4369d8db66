"""Concave, non-decreasing penalties rho and their derivatives (the attention kernels).

The attention energy (supplement eq. 33, with temperature tau) is

    E_att(Y) = sum_{{u,v} in E} tau * rho(z_uv),    z_uv = ||y_u - y_v||^2 / (2 tau).

Because rho is concave, its tangent at z0 majorizes it,
``rho(z) <= rho(z0) + rho'(z0) (z - z0)`` (Algorithm 3, step 1), so the edge weight of
the MM step is ``gamma_uv = rho'(z_uv)``: each rho *is* an attention kernel. Validity
of the MM step needs ``rho' >= 0`` (non-decreasing) and ``rho'`` non-increasing (concave).

Register new penalties with :func:`register_rho`; build from a spec string with
:func:`get_rho` (``"exp"``, ``"relu:1.5"``, ``"softplus:1.5:0.5"``, ``"cauchy"``, ``"lp:1"``).
"""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch

from . import kinks
from .errors import EnergyError
from .registry import registrar

__all__ = ["check_rho", "Rho", "ExpRho", "ReluRho", "SoftplusRho", "CauchyRho", "LpRho", "softplus_integral", "RHOS", "register_rho", "get_rho"]


class Rho:
    """A penalty: ``value(z)`` is rho, ``derivative(z)`` is rho' (the kernel gamma), for z >= 0."""

    name = "rho"

    def value(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def derivative(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def max_derivative(self) -> float:
        """``sup_{z >= 0} rho'(z) = rho'(0)`` (rho' is non-increasing for a concave rho): the largest
        edge weight, which gives a curvature bound independent of Y (``curvature="constant"``)."""
        return float(self.derivative(torch.zeros((), dtype=torch.float64)))

    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


RHOS: Dict[str, Callable[..., Rho]] = {}


register_rho = registrar(RHOS, "name")
"""``@register_rho("name")`` registers a penalty class; its constructor takes the spec's ``:`` arguments."""


@register_rho("exp")
class ExpRho(Rho):
    """rho(z) = -exp(-z), rho'(z) = exp(-z): softmax attention (supplement eq. 35)."""

    def value(self, z):
        return -torch.exp(-z)

    def derivative(self, z):
        return torch.exp(-z)


@register_rho("relu")
class ReluRho(Rho):
    """Truncated quadratic: rho(z) = c min(z, c) - min(z, c)^2 / 2, rho'(z) = max(c - z, 0).

    The kernel is ReLU of ``c - z``: on tokens of equal norm, ReLU of a shifted dot product
    (ReLU attention). Concave and non-decreasing for any ``c > 0``.
    """

    def __init__(self, c: float = 1.0):
        self.c = float(c)
        if not self.c > 0:
            raise EnergyError(f"relu rho needs c > 0, got c={c}")

    def value(self, z):
        m = torch.clamp(z, max=self.c)
        return self.c * m - 0.5 * m * m

    def derivative(self, z):
        return kinks.relu(self.c - z)

    def spec(self):
        return f"relu:{self.c:g}"


def softplus_integral(u: torch.Tensor, terms: int = 60) -> torch.Tensor:
    """``F(u) = int_{-inf}^u softplus(s) ds = -Li2(-e^u)`` (dilogarithm), accurate to ~1e-15.

    For u <= 0 Landen's identity gives ``F(u) = Li2(sigmoid(u)) + softplus(u)^2 / 2`` with
    ``sigmoid(u) <= 1/2``, where the series ``Li2(w) = sum_k w^k / k^2`` converges geometrically; for
    u > 0, ``softplus(s) = s + softplus(-s)`` gives ``F(u) = u^2 / 2 + pi^2 / 6 - F(-u)``."""
    a = torch.where(u <= 0, u, -u)   # -|u| with slope +-1 at 0 too (abs would give 0 there)
    w = torch.sigmoid(a)
    k = torch.arange(1, terms + 1, dtype=u.dtype, device=u.device)
    li2 = (w[..., None] ** k / (k * k)).sum(-1)
    neg = li2 + 0.5 * torch.nn.functional.softplus(a) ** 2
    return torch.where(u <= 0, neg, 0.5 * u * u + math.pi ** 2 / 6.0 - neg)


@register_rho("softplus")
class SoftplusRho(Rho):
    """Softplus kernel: rho'(z) = t softplus((c - z) / t), rho(z) = t^2 (F(c / t) - F((c - z) / t))
    with F the integral of softplus (:func:`softplus_integral`), so rho(0) = 0.

    Concave (rho'' = -sigmoid((c - z) / t) < 0) and increasing for any c, t > 0. On tokens of equal
    norm the kernel is softplus of a shifted dot product (softplus attention); as t -> 0 it tends to
    the ReLU kernel max(c - z, 0) of ``relu:c``, uniformly, with error at most t log 2.
    """

    def __init__(self, c: float = 1.0, t: float = 1.0):
        self.c, self.t = float(c), float(t)
        if not (self.c > 0 and self.t > 0):
            raise EnergyError(f"softplus rho needs c > 0 and t > 0, got c={c}, t={t}")
        self._F0 = float(softplus_integral(torch.tensor(self.c / self.t, dtype=torch.float64)))   # F(c / t)

    def value(self, z):
        t = self.t
        return t * t * (self._F0 - softplus_integral((self.c - z) / t))

    def derivative(self, z):
        return self.t * torch.nn.functional.softplus((self.c - z) / self.t)

    def spec(self):
        return f"softplus:{self.c:g}:{self.t:g}"


@register_rho("cauchy")
class CauchyRho(Rho):
    """Cauchy / log penalty: rho(z) = log(1 + z), rho'(z) = 1 / (1 + z)."""

    def value(self, z):
        return torch.log1p(z)

    def derivative(self, z):
        return 1.0 / (1.0 + z)


@register_rho("lp")
class LpRho(Rho):
    """l_p penalty of TWIRLS: rho(z) = z^(p/2), 0 < p <= 2, made finite-sloped by a floor.

    Below ``z = eps`` rho continues linearly with the slope it has at ``eps``,
    ``rho(z) = eps^(p/2) + (p/2) eps^(p/2 - 1) (z - eps)``, so rho' = (p/2) max(z, eps)^(p/2 - 1)
    stays finite; the extension keeps rho concave, non-decreasing and C^1.
    """

    def __init__(self, p: float = 1.0, eps: float = 1e-3):
        self.p, self.eps = float(p), float(eps)
        if not (0.0 < self.p <= 2.0):
            raise EnergyError(f"lp rho needs 0 < p <= 2, got p={p}")
        if not self.eps > 0:
            raise EnergyError(f"lp rho needs a floor eps > 0, got eps={eps}")

    def value(self, z):
        h = 0.5 * self.p
        zc = torch.clamp(z, min=self.eps)
        lin = self.eps ** h + h * self.eps ** (h - 1.0) * (z - self.eps)
        return torch.where(z >= self.eps, zc ** h, lin)

    def derivative(self, z):
        h = 0.5 * self.p
        return h * torch.clamp(z, min=self.eps) ** (h - 1.0)

    def spec(self):
        return f"lp:{self.p:g}:{self.eps:g}"


def get_rho(spec) -> Rho:
    """A penalty from a :class:`Rho`, or a spec ``name[:arg[:arg]]`` such as ``"lp:1"``."""
    if isinstance(spec, Rho):
        check_rho(spec)
        return spec
    name, _, rest = str(spec).partition(":")
    if name not in RHOS:
        raise EnergyError(f"unknown rho {name!r}; valid: {sorted(RHOS)}")
    try:
        args = [float(a) for a in rest.split(":")] if rest else []
    except ValueError:
        raise EnergyError(f"rho arguments must be numbers, got {spec!r}") from None
    try:
        rho = RHOS[name](*args)
    except TypeError:
        raise EnergyError(f"too many arguments for rho {name!r} in {spec!r}") from None
    check_rho(rho)
    return rho


_CHECKED: Dict[str, bool] = {}
_GRID = torch.cat([torch.zeros(1), torch.logspace(-6, 3, 190)]).to(torch.float64)


def check_rho(rho: Rho) -> None:
    """The MM step needs rho' >= 0 (non-decreasing rho) and rho' non-increasing (concave rho) on
    z >= 0, finite: checked on a grid of z in [0, 1e3] once per spec; an :class:`EnergyError`
    names the first z where it fails."""
    key = f"{type(rho).__name__}:{rho.spec()}"
    if _CHECKED.get(key):
        return
    with kinks.paused():
        g = rho.derivative(_GRID)
    bad = ~torch.isfinite(g)
    if bool(bad.any()):
        raise EnergyError(f"rho {rho.spec()}: rho'(z) is not finite at z={float(_GRID[bad][0]):.3g}")
    if bool((g < 0).any()):
        raise EnergyError(f"rho {rho.spec()} is not non-decreasing: rho'(z)={float(g[g < 0][0]):.3g} < 0 at "
                          f"z={float(_GRID[g < 0][0]):.3g}")
    rise = g[1:] > g[:-1] * (1 + 1e-12) + 1e-300
    if bool(rise.any()):
        i = int(rise.nonzero()[0])
        raise EnergyError(f"rho {rho.spec()} is not concave: rho' increases from {float(g[i]):.6g} at "
                          f"z={float(_GRID[i]):.3g} to {float(g[i + 1]):.6g} at z={float(_GRID[i + 1]):.3g}")
    _CHECKED[key] = True
