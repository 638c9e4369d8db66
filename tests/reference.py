"""An independent numpy implementation of the attention energy E1, for tests only.

Written from the formula, not from the package: explicit loops over undirected edges,
its own rho formulas, float64 throughout.
"""
import math

import numpy as np


def rho_value(spec: str, z: float) -> float:
    name, _, rest = spec.partition(":")
    args = [float(a) for a in rest.split(":")] if rest else []
    if name == "exp":
        return -math.exp(-z)
    if name == "relu":
        c = args[0] if args else 1.0
        return c * z - z * z / 2 if z <= c else c * c / 2
    if name == "softplus":  # rho(z) = int_0^z t softplus((c - s) / t) ds, by quadrature
        from scipy.integrate import quad

        c, t = (args + [1.0, 1.0])[:2] if len(args) < 2 else args[:2]
        return quad(lambda s: t * np.logaddexp(0.0, (c - s) / t), 0.0, z, epsabs=1e-13, epsrel=1e-13)[0]
    if name == "cauchy":
        return math.log(1 + z)
    if name == "lp":
        p = args[0] if args else 1.0
        eps = args[1] if len(args) > 1 else 1e-3
        h = p / 2
        return z ** h if z >= eps else eps ** h + h * eps ** (h - 1) * (z - eps)
    raise ValueError(spec)


def undirected_edges(edge_list, n):
    """Set of frozensets from a (2, m) list holding edges once or in both orientations."""
    return sorted({tuple(sorted((int(u), int(v)))) for u, v in np.asarray(edge_list).T})


def e1_numpy(Y, edges, rho="exp", tau=1.0, B=None):
    """E1(Y) = sum_{u<v in edges} tau rho(|y_u - y_v|^2 / (2 tau)) + |Y - B|^2 / 2."""
    Y = np.asarray(Y, dtype=np.float64)
    total = 0.0
    for u, v in edges:
        diff = Y[u] - Y[v]
        total += tau * rho_value(rho, float(diff @ diff) / (2 * tau))
    R = Y if B is None else Y - np.asarray(B, dtype=np.float64)
    return total + 0.5 * float((R * R).sum())


def complete_edges(n):
    return [(u, v) for u in range(n) for v in range(u + 1, n)]
