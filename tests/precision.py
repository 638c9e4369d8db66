"""High-precision references for the verdict tests: rho and the attention energy E1 in 50-digit mpmath.

Written from the formulas (supplement eq. 33, the rho definitions of ``energies.rho``), not from the
package: each rho by its closed form (softplus by the dilogarithm, checked against adaptive quadrature of its
derivative in tests/test_precision_reference.py).
"""
import mpmath

mpmath.mp.dps = 50


def rho_mp(spec: str, z):
    """rho(z) in mpmath for a spec ``name[:args]`` (defaults as in ``energies.rho``)."""
    name, _, rest = spec.partition(":")
    a = [mpmath.mpf(x) for x in rest.split(":")] if rest else []
    z = mpmath.mpf(z)
    if name == "exp":
        return -mpmath.exp(-z)
    if name == "relu":
        c = a[0] if a else mpmath.mpf(1)
        m = min(z, c)
        return c * m - m * m / 2
    if name == "softplus":
        c, t = (a + [mpmath.mpf(1), mpmath.mpf(1)])[:2] if len(a) < 2 else a[:2]
        return softplus_dilog(c, t, z)
    if name == "cauchy":
        return mpmath.log1p(z)
    if name == "lp":
        p = a[0] if a else mpmath.mpf(1)
        eps = a[1] if len(a) > 1 else mpmath.mpf("1e-3")
        h = p / 2
        return z ** h if z >= eps else (1 - h) * eps ** h + h * eps ** (h - 1) * z
    raise ValueError(spec)


def _li2_neg(x):
    """Li2(-x) for x > 0: inversion above 1, Landen's identity below (series argument at most 1/2)."""
    if x > 1:
        return -mpmath.pi ** 2 / 6 - mpmath.log(x) ** 2 / 2 - _li2_neg(1 / x)
    return -mpmath.polylog(2, x / (1 + x)) - mpmath.log1p(x) ** 2 / 2


def softplus_dilog(c, t, z):
    """Softplus rho by its closed form ``t^2 (Li2(-e^((c-z)/t)) - Li2(-e^(c/t)))``, at a working precision raised
    by the digits the difference cancels."""
    c, t, z = mpmath.mpf(c), mpmath.mpf(t), mpmath.mpf(z)
    if z == 0:
        return mpmath.mpf(0)
    dps = mpmath.mp.dps
    with mpmath.workdps(20):
        big = t * t * abs(_li2_neg(mpmath.exp(c / t))) + 1
        w = min(z, abs(c) + t)          # rho(z) >= rho(w) >= w rho'(w) for any w <= z (rho increasing, concave)
        small = w * t * mpmath.log1p(mpmath.exp((c - w) / t))
        extra = int(mpmath.ceil(mpmath.log10(big / small))) if small > 0 else 0
    with mpmath.workdps(dps + max(extra, 0) + 15):
        r = t * t * (_li2_neg(mpmath.exp((c - z) / t)) - _li2_neg(mpmath.exp(c / t)))
    return +r


def softplus_quad(c, t, z):
    """Softplus rho by adaptive quadrature of its derivative (the independent form ``softplus_dilog`` is checked
    against)."""
    c, t, z = mpmath.mpf(c), mpmath.mpf(t), mpmath.mpf(z)
    if z == 0:
        return mpmath.mpf(0)
    f = lambda x: t * mpmath.log1p(mpmath.exp((c - z * x) / t))  # noqa: E731   rho(z) = z int_0^1 rho'(z x) dx
    return z * mpmath.quad(f, [0, c / z, 1] if 0 < c < z else [0, 1])


def energy_mp(Y, edges, rho: str, tau: float, B=None):
    """E1(Y) = sum_{u<v in edges} tau rho(|y_u - y_v|^2 / 2 tau) + |Y - B|^2 / 2 of one (n, d) matrix (floats
    taken exactly), in 50 digits."""
    rows = [[mpmath.mpf(float(x)) for x in r] for r in Y]
    tau = mpmath.mpf(float(tau))
    total = mpmath.mpf(0)
    for u, v in edges:
        z = sum((a - b) ** 2 for a, b in zip(rows[u], rows[v])) / (2 * tau)
        total += tau * rho_mp(rho, z)
    anchor = [[mpmath.mpf(0)] * len(r) for r in rows] if B is None else [[mpmath.mpf(float(x)) for x in r] for r in B]
    total += sum((a - b) ** 2 for r, rb in zip(rows, anchor) for a, b in zip(r, rb)) / 2
    return total
