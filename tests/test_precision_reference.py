"""The closed form of the softplus reference (``tests.precision.softplus_dilog``) against the adaptive quadrature of
its derivative (``softplus_quad``), an independent route, to 1e-45 relative in 50 digits."""
import mpmath
import pytest

from tests.precision import rho_mp, softplus_dilog, softplus_quad

SPECS = [(1.5, 0.5), (2.0, 0.05), (0.3, 2.0), (1000.0, 1.0), (400.0, 0.25), (1.0, 1.0)]


def _zs(c, t):
    """About 30 points: the extremes, the switch 2T, the knee c, and a log sweep."""
    return [1e-300, 1e-30, 1e-8, 2 * t, c, c * (1 - 1e-9), c * (1 + 1e-9), 700.0] + [10.0 ** (k / 2) for k in range(-20, 6)]


@pytest.mark.parametrize("c, t", SPECS)
def test_the_closed_form_equals_the_quadrature(c, t):
    """Relative difference at most 1e-45 on every point; z = 0 gives 0; ``rho_mp`` uses the closed form."""
    mpmath.mp.dps = 50
    assert softplus_dilog(c, t, 0.0) == 0
    for z in _zs(c, t):
        a, b = softplus_quad(c, t, z), softplus_dilog(c, t, z)
        assert abs(a - b) <= mpmath.mpf("1e-45") * abs(a), (c, t, z, a, b)
        assert rho_mp(f"softplus:{c!r}:{t!r}", z) == softplus_dilog(mpmath.mpf(repr(c)), mpmath.mpf(repr(t)), z)


def test_a_wrong_closed_form_is_caught():
    """Negative control: a sign flip or an offset of the closed form breaks the 1e-45 agreement."""
    mpmath.mp.dps = 50
    c, t = 1.5, 0.5
    for z in (1e-8, 1.0, 700.0):
        a, b = softplus_quad(c, t, z), softplus_dilog(c, t, z)
        for wrong in (-b, b + mpmath.mpf("1e-40") * abs(b), softplus_dilog(mpmath.mpf(c) + mpmath.mpf("1e-20"), t, z)):
            assert abs(a - wrong) > mpmath.mpf("1e-45") * abs(a), (z, wrong)
