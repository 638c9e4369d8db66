"""Concave, non-decreasing penalties rho and their derivatives (the attention kernels).

The attention energy (supplement eq. 33, with temperature tau) is

    E_att(Y) = sum_{{u,v} in E} tau * rho(z_uv),    z_uv = ||y_u - y_v||^2 / (2 tau).

Because rho is concave, its tangent at z0 majorizes it,
``rho(z) <= rho(z0) + rho'(z0) (z - z0)`` (Algorithm 3, step 1), so the edge weight of
the MM step is ``gamma_uv = rho'(z_uv)``: each rho *is* an attention kernel. Validity
of the MM step needs ``rho' >= 0`` (non-decreasing) and ``rho'`` non-increasing (concave).

Register new penalties with [`register_rho`][energies.register_rho]; build from a spec string with
[`get_rho`][energies.get_rho] (``"exp"``, ``"relu:1.5"``, ``"softplus:1.5:0.5"``, ``"cauchy"``, ``"lp:1"``).
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import numpy as np
import torch

from .checks import parse_float
from .errors import EnergyError
from .registry import Registry

__all__ = ["check_rho", "Rho", "ExpRho", "ReluRho", "SoftplusRho", "CauchyRho", "LpRho", "softplus_integral", "softplus_integral_neg", "kernel_sensitivity", "RHOS", "RHO_ALIASES", "register_rho", "get_rho"]


class Rho(torch.nn.Module):
    """A penalty rho of the attention energy ``sum_{{u,v} in E} tau rho(z_uv)`` (supplement eq. 33): ``value(z)`` is
    rho, ``derivative(z)`` is rho' (the kernel gamma, Algorithm 3 step 1), for z >= 0; concave and non-decreasing
    (``rho' >= 0``, rho' non-increasing, so ``rho'' <= 0``), which [`check_rho`][energies.check_rho] verifies on every
    penalty built.

    A module without parameters, so that the modules holding it (terms, encoders, convs) carry it and hooks
    reach its kinks: a piecewise rho evaluates its ReLU through an ``nn.ReLU`` submodule (``ReluRho.kink``),
    which forward hooks see (the spline probe records and freezes sign patterns this way). ``rho(z)`` is
    ``rho.value(z)``. A subclass implements [`value`][energies.Rho.value] and [`derivative`][energies.Rho.derivative]
    (and, where it knows them, [`kernel_sensitivity`][energies.Rho.kernel_sensitivity], [`spec`][energies.Rho.spec],
    [`triton`][energies.Rho.triton]) and is registered with [`register_rho`][energies.register_rho].

    Args:
        *args: a subclass's constructor arguments, the spec's ``:`` arguments in order (accepted here by
            ``__new__`` so that any subclass constructor works; ``Rho`` itself takes none).
        **kwargs: a subclass's constructor arguments by name (``Rho`` itself takes none).
    """

    name = "rho"

    #: example specs by regime, which the test matrices draw from the registry (``tests/matrix.py``):
    #: ``typical`` (every matrix runs it; a class that declares none runs its bare name), and where they apply
    #: ``steep`` (a large kernel sensitivity: weights that span orders of magnitude), ``linear`` (rho linear in z,
    #: the concave boundary) and ``wide`` (a second scale of the parameters)
    examples: Dict[str, str] = {}

    def __new__(cls, *args, **kwargs):
        # a module from the start, so that a subclass whose __init__ skips super().__init__() may still assign
        # parameters or modules
        obj = super().__new__(cls)
        torch.nn.Module.__init__(obj)
        return obj

    def __init__(self):
        super().__init__()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.value(z)

    def value(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def derivative(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def max_derivative(self) -> float:
        """``sup_{z >= 0} rho'(z) = rho'(0)`` (rho' is non-increasing for a concave rho): the largest
        edge weight, which gives a curvature bound independent of Y (``curvature="constant"``)."""
        return float(self.derivative(torch.zeros((), dtype=torch.float64, device="cpu")))   # (not under a device context)

    def sign_range(self) -> Tuple[float, float]:
        """``(rho(0), sup_z rho(z))`` as floats: the range of a non-decreasing rho on ``[0, inf)`` (its value at 0 and
        far out, at z = 1e300; NaN there reads as +inf), computed once per penalty. A rho that keeps one sign there
        has ``sum_e |rho(z_e)| = |sum_e rho(z_e)|``, which a pass's rounding bound uses
        ([`energies.terms.PairwiseAttention.value_error`][energies.PairwiseAttention.value_error]).

        Returns:
            ``(low, high)``, ``low <= high``.
        """
        cached = self.__dict__.get("_sign_range")
        if cached is None:
            z = torch.tensor([0.0, 1e300], dtype=torch.float64, device="cpu")
            with torch.no_grad():
                low, high = (float(v) for v in self.value(z))
            cached = (low, math.inf if math.isnan(high) else max(low, high))
            self.__dict__["_sign_range"] = cached
        return cached

    def slope_per_value(self) -> float:
        """A k with ``rho'(z) <= k |rho(z)|`` for every z >= 0, or inf where none holds (the default): then the edge
        weights of a pass sum to at most ``k |sum_e rho(z_e)|``, a rounding bound's shortcut
        ([`energies.terms.PairwiseAttention.value_error`][energies.PairwiseAttention.value_error])."""
        return math.inf

    def kernel_sensitivity(self) -> float:
        """``sup_z |rho''(z)| / rho'(0)``: how much the largest edge weight changes, relatively, per unit of error
        in z. The kernels that compute z by an expansion keep that error times this below their bound
        (`energies.kernels.expansion_dtype`). Subclasses give it in closed form; the default estimates
        it from differences of rho' on the validation grid, times 4."""
        g = self.derivative(_GRID)
        slope = ((g[:-1] - g[1:]).abs() / (_GRID[1:] - _GRID[:-1])).max()
        return 4.0 * float(slope) / max(float(g[0]), 1e-300)

    def spec(self) -> str:
        return self.name

    def triton(self):
        """``(value, derivative, second, params)`` for the Triton kernel (`energies.kernels.triton.pairwise`): three
        ``@triton.jit`` functions ``f(z, p0, p1, p2, p3)`` giving rho, rho' and rho'' on a tile of z >= 0, and up to
        four float parameters; None (the default) where the penalty has none, which the ``triton`` kernel then
        declines. The built-in penalties return ``(name, params)`` instead, naming their functions in
        `energies.kernels.triton.rho`."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec()!r})"


RHOS: Registry = Registry("rho", EnergyError, "name", "energies.rho.RHOS")


register_rho = RHOS.register
"""``@register_rho("name")`` registers a penalty class (a [`Rho`][energies.Rho]), so that [`get_rho`][energies.get_rho]
builds it from ``name[:arg[:arg]]``; its constructor takes the spec's ``:`` arguments.

Args:
    name: the penalty's name, a non-empty string not taken (a taken name is refused with an
        [`EnergyError`][energies.EnergyError] naming the registry and the name).

Returns:
    The class decorator; it sets the class's ``name`` to ``name`` and returns the class.
"""

#: other names of a registered penalty, mapped by `get_rho` when the spec is parsed (not registrations: the
#: penalty built is the registered one, and its ``spec()`` stays the canonical name, so saved configs and bundles
#: read the same). ``softmax``: the README's name for the exp penalty (softmax attention, supplement eq. 35).
RHO_ALIASES: Dict[str, str] = RHOS.add_aliases({"softmax": "exp"})


@register_rho("exp")
class ExpRho(Rho):
    """rho(z) = -exp(-z), rho'(z) = exp(-z), rho''(z) = -exp(-z): softmax attention (supplement eq. 35).

    Its edge weight ``gamma_uv = exp(-z_uv)`` is at most rho'(0) = 1 and ``|rho''| <= 1`` on z >= 0 (kernel
    sensitivity 1). Spec ``exp`` (alias ``softmax``); no parameters.
    """

    examples = {"typical": "exp"}

    def __init__(self):
        super().__init__()

    def value(self, z):
        return -torch.exp(-z)

    def derivative(self, z):
        return torch.exp(-z)

    def slope_per_value(self):
        """1: ``rho'(z) = exp(-z) = |rho(z)|``."""
        return 1.0

    def triton(self):
        return _triton("exp")

    def kernel_sensitivity(self):
        return 1.0


@register_rho("relu")
class ReluRho(Rho):
    """Truncated quadratic: rho(z) = c min(z, c) - min(z, c)^2 / 2, rho'(z) = max(c - z, 0), rho''(z) = -1 for
    z < c and 0 beyond.

    The kernel is ReLU of ``c - z``: on tokens of equal norm, ReLU of a shifted dot product
    (ReLU attention; no equation number in the papers). Concave and non-decreasing for any ``c > 0``: the edge
    weight is at most rho'(0) = c and ``|rho''| <= 1`` (kernel sensitivity 1 / c). Spec ``relu:C``.

    Args:
        c: the cut-off C, finite and > 0 (default 1): pairs with z >= c get weight 0.

    Raises:
        EnergyError: c not a finite number > 0.
    """

    examples = {"typical": "relu:1.5", "wide": "relu:2"}

    def __init__(self, c: float = 1.0):
        super().__init__()
        self.c = _finite_positive("relu", "c", c)
        self.kink = torch.nn.ReLU()

    def value(self, z):
        m = torch.clamp(z, max=self.c)
        return m * (self.c - 0.5 * m)   # c m - m^2 / 2 with c - m/2 >= c/2: full relative precision

    def derivative(self, z):
        return self.kink(self.c - z)

    def kernel_sensitivity(self):
        return 1.0 / self.c

    def triton(self):
        return _triton("relu", self.c)

    def spec(self):
        return f"relu:{self.c:g}"


def _finite_positive(rho: str, field: str, value) -> float:
    """A rho parameter as a float: finite and > 0, else an [`EnergyError`][energies.EnergyError] naming it."""
    try:
        v = math.nan if isinstance(value, (bool, np.bool_, str, bytes)) or (
            isinstance(value, torch.Tensor) and value.dtype == torch.bool) else float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise EnergyError(f"{rho} rho needs a finite {field} > 0, got {field}={value}")
    return v


def _where(cond: torch.Tensor, z: torch.Tensor, safe: float, branch) -> torch.Tensor:
    """``branch(z)`` where ``cond``, 0 elsewhere, evaluated on ``safe`` outside ``cond`` so that the
    unused branch never produces inf/NaN (which ``torch.where`` would pass on to gradients as NaN)."""
    zs = torch.where(cond, z, torch.full_like(z, safe))
    return torch.where(cond, branch(zs), torch.zeros_like(z))


def softplus_integral_neg(u: torch.Tensor, terms: int = 60) -> torch.Tensor:
    """``F(u) = int_{-inf}^u softplus(s) ds = -Li2(-e^u)`` for ``u <= 0`` (``u = -inf`` gives 0).

    Landen's identity ``F(u) = Li2(sigmoid(u)) + softplus(u)^2 / 2``: with ``w = sigmoid(u) <= 1/2``
    the series ``Li2(w) = sum_k w^k / k^2`` has positive terms and converges like ``2^-k``, so every
    value keeps full relative precision (60 terms: error below 1e-18 relative)."""
    w = torch.sigmoid(u)
    # Horner's rule, w (1 + w (1/4 + w (1/9 + ...))): positive terms and w <= 1/2, so the rounding stays within a
    # few eps relative; no (..., terms) tensor of powers is allocated (as summing w^k / k^2 would)
    acc = torch.full_like(w, 1.0 / (terms * terms))
    for k in range(terms - 1, 0, -1):
        acc = torch.addcmul(torch.full_like(w, 1.0 / (k * k)), acc, w)
    return acc * w + 0.5 * torch.nn.functional.softplus(u) ** 2


def softplus_integral(u: torch.Tensor, terms: int = 60) -> torch.Tensor:
    """``F(u) = int_{-inf}^u softplus(s) ds`` for any u: `softplus_integral_neg` for u <= 0 and
    ``F(u) = u^2 / 2 + pi^2 / 6 - F(-u)`` for u > 0 (from ``softplus(s) = s + softplus(-s)``)."""
    a = torch.where(u <= 0, u, -u)
    neg = softplus_integral_neg(a, terms)
    return torch.where(u <= 0, neg, 0.5 * u * u + math.pi ** 2 / 6.0 - neg)


#: Gauss-Legendre rule on [0, 1] for the softplus rho at z < 2t (16 nodes, exact to machine precision there:
#: the integrand is analytic in a strip of half-width pi t around the real axis, so the error is below 6.4^-32).
_GL_X, _GL_W = (torch.from_numpy(a) for a in __import__("numpy").polynomial.legendre.leggauss(16))
_GL_X, _GL_W = (0.5 * (_GL_X + 1.0)).to(torch.float64), (0.5 * _GL_W).to(torch.float64)


@register_rho("softplus")
class SoftplusRho(Rho):
    """Softplus kernel: rho'(z) = t softplus((c - z) / t), rho(z) = int_0^z rho'(s) ds, so rho(0) = 0.

    Concave (rho'' = -sigmoid((c - z) / t) < 0, so ``|rho''| <= sigmoid(c / t) < 1`` on z >= 0) and increasing
    for any c, t > 0; the edge weight is at most rho'(0) = t softplus(c / t). No equation number in the papers.
    Spec ``softplus:C:T``. On tokens of equal
    norm the kernel is softplus of a shifted dot product (softplus attention); as t -> 0 it tends to
    the ReLU kernel max(c - z, 0) of ``relu:c``, uniformly, with error at most t log 2.

    Evaluation keeps full relative precision for every z >= 0 (no difference of large values):
    ``rho' = max(c - z, 0) + t softplus(-|c - z| / t)`` (no overflow for any c / t), and with
    F = `softplus_integral_neg`,

    * z < 2t: 16-point Gauss-Legendre quadrature of rho' on [0, z];
    * 2t <= z <= c: ``z (c - z / 2) + t^2 (F((z - c) / t) - F(-c / t))`` (both parts >= 0; the difference of F
      has ratio >= e^2 / 1.2, so it loses under 1 bit);
    * z > c, z >= 2t: ``c^2 / 2 + t^2 (pi^2 / 6 - F(-c / t) - F((c - z) / t))`` (both parts >= 0).

    Args:
        c: the shift C, finite and > 0 (default 1).
        t: the softness T, finite and > 0 (default 1); T -> 0 gives ``relu:C``.

    Raises:
        EnergyError: c or t not a finite number > 0.
    """

    examples = {"typical": "softplus:1.5:0.5", "wide": "softplus:2:0.5"}

    def __init__(self, c: float = 1.0, t: float = 1.0):
        super().__init__()
        self.c, self.t = _finite_positive("softplus", "c", c), _finite_positive("softplus", "t", t)

    def value(self, z):
        c, t = self.c, self.t
        F = softplus_integral_neg
        small = z < 2.0 * t
        mid = ~small & (z <= c)
        big = ~small & ~mid

        def quad(s):
            x, w = _GL_X.to(device=s.device, dtype=s.dtype), _GL_W.to(device=s.device, dtype=s.dtype)
            return s * (self.derivative(s[..., None] * x) * w).sum(-1)

        def middle(s):
            return s * (c - 0.5 * s) + t * t * (F((s - c) / t) - F(torch.full_like(s, -c / t)))

        def beyond(s):
            return 0.5 * c * c + t * t * (math.pi ** 2 / 6.0 - F(torch.full_like(s, -c / t)) - F((c - s) / t))

        return (_where(small, z, 0.0, quad) + _where(mid, z, c, middle)
                + _where(big, z, max(c, 2.0 * t), beyond))

    def derivative(self, z):
        d = self.c - z
        return torch.clamp(d, min=0.0) + self.t * torch.nn.functional.softplus(-d.abs() / self.t)

    def kernel_sensitivity(self):
        """|rho''| = sigmoid((c - z) / t) <= sigmoid(c / t) on z >= 0, over rho'(0)."""
        a = self.c / self.t
        return 1.0 / (1.0 + math.exp(-a)) / max(self.max_derivative(), 1e-300)

    def triton(self):
        u = -self.c / self.t                   # F(-C / T) in float64 (Python floats: no tensor, nothing to trace)
        e = math.exp(u)                        # u < 0: e^u in (0, 1) (0 past C / T ~ 745), never e^-u (overflows
        w = e / (1.0 + e)                      # past C / T ~ 709); sigmoid(u) = e^u / (1 + e^u), as accurate
        acc = 1.0 / 3600.0
        for k in range(59, 0, -1):
            acc = acc * w + 1.0 / (k * k)
        return _triton("softplus", self.c, self.t, acc * w + 0.5 * math.log1p(e) ** 2)

    def spec(self):
        return f"softplus:{self.c:g}:{self.t:g}"


@register_rho("cauchy")
class CauchyRho(Rho):
    """Cauchy / log penalty: rho(z) = log(1 + z) (``log1p``: full relative precision), rho'(z) = 1 / (1 + z),
    rho''(z) = -1 / (1 + z)^2.

    The edge weight is at most rho'(0) = 1 and ``|rho''| <= 1`` on z >= 0 (kernel sensitivity 1); it decays like
    1 / z, so far pairs keep some pull (a heavy-tailed kernel). No equation number in the papers. Spec ``cauchy``;
    no parameters.
    """

    examples = {"typical": "cauchy"}

    def __init__(self):
        super().__init__()

    def value(self, z):
        return torch.log1p(z)

    def derivative(self, z):
        return 1.0 / (1.0 + z)

    def triton(self):
        return _triton("cauchy")

    def kernel_sensitivity(self):
        return 1.0


@register_rho("lp")
class LpRho(Rho):
    """l_p penalty of TWIRLS: rho(z) = z^(p/2), 0 < p <= 2, made finite-sloped by a floor.

    Below ``z = eps`` rho continues linearly with the slope it has at ``eps``,
    ``rho(z) = eps^(p/2) + (p/2) eps^(p/2 - 1) (z - eps) = (1 - p/2) eps^(p/2) + (p/2) eps^(p/2 - 1) z``
    (evaluated in the second form: two non-negative parts, full relative precision), so
    rho' = (p/2) max(z, eps)^(p/2 - 1) stays finite; the extension keeps rho concave, non-decreasing and C^1.
    Curvature: rho'' = (p/2)(p/2 - 1) z^(p/2 - 2) above eps, 0 below, so the edge weight is at most
    rho'(0) = (p/2) eps^(p/2 - 1) and ``|rho''| <= (p/2)(1 - p/2) eps^(p/2 - 2)`` (kernel sensitivity
    (1 - p/2) / eps). No equation number in the papers (TWIRLS). Spec ``lp:P[:EPS]``.

    Args:
        p: the exponent P, 0 < p <= 2 (default 1); p = 2 is the linear rho(z) = z.
        eps: the floor, finite and > 0 (default 1e-3), such that its slope (p/2) eps^(p/2 - 1) is finite.

    Raises:
        EnergyError: p outside (0, 2], eps not a finite number > 0, or a floor slope that overflows float64.
    """

    examples = {"typical": "lp:1", "steep": "lp:0.5:0.01", "linear": "lp:2", "wide": "lp:1.5:0.1"}

    def __init__(self, p: float = 1.0, eps: float = 1e-3):
        super().__init__()
        self.p, self.eps = _finite_positive("lp", "p", p), _finite_positive("lp", "floor eps", eps)
        if not (0.0 < self.p <= 2.0):
            raise EnergyError(f"lp rho needs 0 < p <= 2, got p={p}")
        h = 0.5 * self.p
        try:
            self._lin0, self._slope = (1.0 - h) * self.eps ** h, h * self.eps ** (h - 1.0)
        except OverflowError:
            self._lin0, self._slope = math.inf, math.inf
        if not (math.isfinite(self._lin0) and math.isfinite(self._slope)):
            raise EnergyError(f"lp rho with p={p}, eps={eps}: the floor's slope (p/2) eps^(p/2 - 1) = "
                              f"{self._slope:g} is not finite in float64; use a larger eps")

    def value(self, z):
        h = 0.5 * self.p
        zc = torch.clamp(z, min=self.eps)
        return torch.where(z >= self.eps, zc ** h, self._lin0 + self._slope * z)

    def derivative(self, z):
        h = 0.5 * self.p
        return h * torch.clamp(z, min=self.eps) ** (h - 1.0)

    def kernel_sensitivity(self):
        """rho' is flat below eps and falls fastest just above it: ``sup |rho''| / rho'(0) = (1 - p/2) / eps``."""
        return (1.0 - 0.5 * self.p) / self.eps

    def triton(self):
        return _triton("lp", 0.5 * self.p, self.eps, self._lin0, self._slope)

    def spec(self):
        return f"lp:{self.p:g}:{self.eps:g}"


def _triton(name: str, *params: float):
    """A built-in penalty's Triton functions, named (``(name, params)``, the parameters padded to four): the functions
    themselves are in `energies.kernels.triton.rho`, which the kernel resolves the name with (this module,
    below the kernels, imports none of them)."""
    return name, tuple(float(p) for p in params) + (0.0,) * (4 - len(params))


def kernel_sensitivity(rho: Rho) -> float:
    """``rho.kernel_sensitivity()``, computed once per penalty object (its parameters do not change): the kernels
    ask for it on every pass. Computed when the penalty is built ([`get_rho`][energies.get_rho]), so that no later pass,
    hooked or compiled, evaluates it."""
    cached = rho.__dict__.get("_kernel_sensitivity")
    if cached is None:
        cached = rho.__dict__["_kernel_sensitivity"] = float(rho.kernel_sensitivity())
    return cached



def get_rho(spec) -> Rho:
    """A penalty rho (concave, non-decreasing: the attention energy's ``tau rho(z)`` per edge, supplement eq. 33) from
    a [`Rho`][energies.Rho] or a spec.

    Args:
        spec: a [`Rho`][energies.Rho] (checked), or ``name[:arg[:arg]]`` such as ``"lp:1"`` or ``"softplus:2:0.5"``;
            ``name`` is registered in [`RHOS`][energies.RHOS] or an alias of `RHO_ALIASES` (``"softmax"`` builds
            ``exp``, whose spec stays ``"exp"``).

    Returns:
        The penalty, its value and derivative validated and its kernel sensitivity computed once.

    Raises:
        EnergyError: an unknown name (the registered ones listed), arguments that are not numbers, too many or out
            of the penalty's range (e.g. ``relu:0``), or a penalty that fails [`check_rho`][energies.check_rho].
    """
    if isinstance(spec, Rho):
        check_rho(spec)
        kernel_sensitivity(spec)
        return spec
    name, _, rest = str(spec).partition(":")
    if name not in RHOS:
        name = RHO_ALIASES.get(name, name)   # an alias names the registered penalty (a registered name wins)
    if name not in RHOS:
        aliases = [f"{a} (= {c})" for a, c in sorted(RHO_ALIASES.items()) if c in RHOS and a not in RHOS]
        RHOS.check(name, f"; also accepted: {aliases}" if aliases else "")
    try:
        args = [parse_float(a) for a in rest.split(":")] if rest else []   # ASCII digits only (energies.checks)
    except ValueError:
        raise EnergyError(f"rho arguments must be numbers, got {spec!r}") from None
    try:
        rho = RHOS[name](*args)
    except TypeError:
        raise EnergyError(f"too many arguments for rho {name!r} in {spec!r}") from None
    check_rho(rho)
    kernel_sensitivity(rho)
    return rho


_CHECKED: Dict[str, bool] = {}
#: z grid of `check_rho`: 0 and 241 points from 1e-12 to 1e12 (ratio 10^0.1)
_GRID = torch.cat([torch.zeros(1), torch.logspace(-12, 12, 241)]).to(torch.float64)
#: far points where value and derivative must still be finite (a bounded rho such as relu:C must not overflow)
_FAR = torch.tensor([1e20, 1e50, 1e100, 1e200, 1e300], dtype=torch.float64)
#: slack of the value checks, relative to the values compared (float64 rounding of rho and of a difference)
_VALUE_SLACK = 1e-9


def check_rho(rho: Rho) -> None:
    """Validate a penalty once per spec on a grid of z in [0, 1e12] (the conditions of a valid MM step, supplement
    eq. 33 with Algorithm 3: rho' >= 0 and rho' non-increasing); an [`EnergyError`][energies.EnergyError] names the
    first z where a property fails:

    * ``rho(z)`` and ``rho'(z)`` finite, on the grid and at z = 1e20 ... 1e300 (a rho whose value is NaN or
      inf would make every energy, and so every descent verdict, meaningless);
    * ``rho' >= 0`` (non-decreasing) and ``rho'`` non-increasing (concave);
    * value and derivative agree: for grid points z1 < z2 a concave, differentiable rho satisfies
      ``rho'(z2) (z2 - z1) <= rho(z2) - rho(z1) <= rho'(z1) (z2 - z1)`` (checked with a slack of
      1e-9 times the values compared, for float64 rounding); this also shows rho is non-decreasing.

    A spec that passed once (by class and [`Rho.spec`][energies.Rho.spec]) is not checked again.

    Args:
        rho: the penalty (a [`Rho`][energies.Rho]).

    Raises:
        EnergyError: ``rho`` not a [`Rho`][energies.Rho] instance, a value or derivative not finite, rho' negative or
            increasing, or value and derivative that disagree; the message names the spec and z.
    """
    if not isinstance(rho, Rho):
        raise EnergyError(f"check_rho takes a Rho instance, got {rho!r:.80}")
    key = f"{type(rho).__name__}:{rho.spec()}"
    if _CHECKED.get(key):
        return
    g = rho.derivative(_GRID)
    v = rho.value(_GRID)
    far_g, far_v = rho.derivative(_FAR), rho.value(_FAR)
    _check_finite(rho, (("rho'(z)", g, _GRID), ("rho(z)", v, _GRID)))
    if bool((g < 0).any()):
        raise EnergyError(f"rho {rho.spec()} is not non-decreasing: rho'(z)={float(g[g < 0][0]):.3g} < 0 at "
                          f"z={float(_GRID[g < 0][0]):.3g}")
    rise = g[1:] > g[:-1] * (1 + 1e-12) + 1e-300
    if bool(rise.any()):
        i = int(rise.nonzero()[0])
        raise EnergyError(f"rho {rho.spec()} is not concave: rho' increases from {float(g[i]):.6g} at "
                          f"z={float(_GRID[i]):.3g} to {float(g[i + 1]):.6g} at z={float(_GRID[i + 1]):.3g}")
    dz = _GRID[1:] - _GRID[:-1]
    dv = v[1:] - v[:-1]
    slack = _VALUE_SLACK * (v[1:].abs() + v[:-1].abs() + g[:-1] * dz) + 1e-300
    off = (dv < g[1:] * dz - slack) | (dv > g[:-1] * dz + slack)
    if bool(off.any()):
        i = int(off.nonzero()[0])
        raise EnergyError(f"rho {rho.spec()}: value and derivative disagree between z={float(_GRID[i]):.3g} and "
                          f"z={float(_GRID[i + 1]):.3g}: rho rises by {float(dv[i]):.6g}, but a concave rho with "
                          f"these derivatives rises by between {float(g[i + 1] * dz[i]):.6g} and {float(g[i] * dz[i]):.6g}")
    _check_finite(rho, (("rho'(z)", far_g, _FAR), ("rho(z)", far_v, _FAR)))
    _CHECKED[key] = True


def _check_finite(rho: Rho, checks) -> None:
    for what, x, zs in checks:
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise EnergyError(f"rho {rho.spec()}: {what} = {float(x[i])} is not finite at z={float(zs[i]):.3g}")
