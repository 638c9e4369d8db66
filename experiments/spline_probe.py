"""Spline probe: is a module a spline along rays through its input, and of which degree?

``python -m experiments.spline_probe --attention softmax|relu|softplus [--causal] [--cross WHICH] [--json]``

Lai, Lim, Liu ("Attention is a smoothed cubic spline") show that ReLU attention is a cubic spline,
a t-layer ReLU encoder a spline of degree 3^t (Lemma 3.2, Theorem 3.3), and that a spline is only
promised to be continuous (Definition 2.2), not C^1 or C^2. Along a ray ``X(t) = X0 + t D`` the probe

1. reads the sign pattern of every ReLU pre-activation (forward hooks on every ``nn.ReLU``) and
   splits t into pieces where the pattern is constant (breakpoints located by bisection);
2. fits polynomials of degree 0, 1, ... per piece in float64 (Chebyshev least squares) and keeps
   the smallest degree whose worst residual is below ``tol`` times the output scale;
3. measures the jump of the output across every breakpoint (continuity gap) and the jump of the
   slope (reported, never required to vanish: C^1 is not claimed).

Verdict ``spline`` when every piece fits a polynomial of degree <= ``max_degree`` and the map is
continuous at every breakpoint; ``non-spline`` otherwise (softmax, LayerNorm, row normalisation:
no finite degree fits), with the evidence. :func:`static_degree` gives the bound of Lemma 3.2 /
Theorem 3.3 for a module built from known parts (attention 3, encoder block 3, t layers 3^t,
encoder-decoder attention 2 / 1 / 3 in context / queries / both, encoder-decoder block 5), or None
where the paper's argument does not apply.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable, List, Optional

import numpy as np
import torch
from torch import nn

from unfold.attention import Attention

__all__ = ["probe", "relu_pattern", "static_degree", "EncoderBlock", "Encoder", "probe_attention"]


# ------------------------------------------------------------------ modules with known degree
class EncoderBlock(nn.Module):
    """Encoder block of the paper's eq. 6 (no LayerNorm): ``h = X + attn(X)``, ``out = h + ffn(h)``."""

    def __init__(self, d: int, heads: int = 1, activation: str = "relu", causal: bool = False, layernorm: bool = False):
        super().__init__()
        self.attn = Attention(d, heads, activation, causal=causal)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d) if layernorm else None

    def forward(self, x):
        h = x + self.attn(x)
        out = h + self.ffn(h)
        return self.norm(out) if self.norm is not None else out


class Encoder(nn.Sequential):
    """t encoder blocks: a spline of degree 3^t with ReLU attention (Theorem 3.3)."""


def static_degree(module: nn.Module, wrt: str = "both") -> Optional[int]:
    """Degree bound of Lemma 3.2 / Theorem 3.3, or None (softmax, softplus, LayerNorm: no spline)."""
    if isinstance(module, Attention):
        if module.activation_name != "relu":
            return None
        return {"both": 3, "context": 2, "x": 1}[wrt]
    if isinstance(module, EncoderBlock):
        a = static_degree(module.attn)
        return None if a is None or module.norm is not None else a
    if isinstance(module, nn.Sequential):
        deg = 1
        for m in module:
            d = static_degree(m)
            if d is None:
                return None
            deg *= d
        return deg
    if isinstance(module, (nn.Linear, nn.ReLU, nn.Identity)):
        return 1
    return None


# ------------------------------------------------------------------ the probe
def relu_pattern(module: nn.Module, fn: Callable[[], torch.Tensor]):
    """``(output, pattern)``: ``fn()`` and the concatenated signs (>0) of every nn.ReLU input in module."""
    signs: List[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda _m, inp: signs.append((inp[0] > 0).reshape(-1)))
             for m in module.modules() if isinstance(m, nn.ReLU)]
    try:
        out = fn()
    finally:
        for h in hooks:
            h.remove()
    pattern = torch.cat(signs) if signs else torch.zeros(0, dtype=torch.bool)
    return out, pattern


def _cheb_fit(ts: np.ndarray, ys: np.ndarray, a: float, b: float, degree: int):
    x = (2 * ts - (a + b)) / (b - a)
    coef = np.polynomial.chebyshev.chebfit(x, ys, degree)
    resid = np.abs(np.polynomial.chebyshev.chebval(x, coef).T - ys).max()
    return coef, float(resid)


def probe(f: Callable[[float], torch.Tensor], module: nn.Module, t_max: float = 3.0, grid: int = 1025,
          max_degree: int = 12, tol: float = 1e-9) -> dict:
    """Probe ``t -> f(t)`` on ``[-t_max, t_max]`` (``f`` evaluates the module in float64; see the
    module docstring). Returns pieces, breakpoints, fitted degrees, residuals, gaps and a verdict."""

    def at(t: float):
        out, pat = relu_pattern(module, lambda: f(t))
        return out.detach().reshape(-1).double().numpy(), pat

    ts = np.linspace(-t_max, t_max, grid)
    samples = [at(float(t)) for t in ts]
    scale = max(max(float(np.abs(y).max()) for y, _ in samples), 1e-300)
    breaks: List[float] = []
    for i in range(grid - 1):
        lo, hi, p_hi = float(ts[i]), float(ts[i + 1]), samples[i + 1][1]
        p_lo = samples[i][1]
        while not torch.equal(p_lo, p_hi):      # find every change inside (lo, hi), left to right
            a, b = lo, hi
            for _ in range(60):
                mid = 0.5 * (a + b)
                if torch.equal(at(mid)[1], p_lo):
                    a = mid
                else:
                    b = mid
            breaks.append(0.5 * (a + b))
            lo, p_lo = b, at(b)[1]
            if b >= hi:
                break
    edges = [-t_max] + breaks + [t_max]
    pieces, worst, degree = [], 0.0, 0
    fits = []
    for a, b in zip(edges[:-1], edges[1:]):
        if b - a < 1e-12 * t_max:
            continue
        m = max_degree + 8
        nodes = 0.5 * (a + b) + 0.5 * (b - a) * np.cos(np.pi * (np.arange(m) + 0.5) / m) * (1 - 1e-9)
        ys = np.stack([at(float(t))[0] for t in nodes])
        best = None
        for k in range(max_degree + 1):
            coef, resid = _cheb_fit(nodes, ys, a, b, k)
            if resid <= tol * scale:
                best = (k, coef, resid)
                break
        if best is None:
            coef, resid = _cheb_fit(nodes, ys, a, b, max_degree)
            pieces.append({"interval": [a, b], "degree": None, "residual_at_max_degree": resid / scale})
            worst = max(worst, resid / scale)
            degree = None
            fits.append(None)
            continue
        k, coef, resid = best
        pieces.append({"interval": [a, b], "degree": k, "residual": resid / scale})
        worst = max(worst, resid / scale)
        degree = None if degree is None else max(degree, k)
        fits.append((a, b, coef))
    gaps, slope_jumps = [], []
    eps = 1e-9 * t_max
    for b in breaks:
        gaps.append(float(np.abs(at(b + eps)[0] - at(b - eps)[0]).max()) / scale)
    for left, right in zip(fits[:-1], fits[1:]):
        if left is None or right is None:
            continue
        dl = np.polynomial.chebyshev.chebval(1.0, np.polynomial.chebyshev.chebder(left[2])) * 2 / (left[1] - left[0])
        dr = np.polynomial.chebyshev.chebval(-1.0, np.polynomial.chebyshev.chebder(right[2])) * 2 / (right[1] - right[0])
        slope_jumps.append(float(np.abs(np.asarray(dl) - np.asarray(dr)).max()) / scale)
    continuous = all(g <= max(1e3 * eps / t_max, tol) for g in gaps)
    verdict = "spline" if degree is not None and continuous else "non-spline"
    return {"verdict": verdict, "degree": degree, "pieces": len(pieces), "breakpoints": len(breaks),
            "max_residual": worst, "max_continuity_gap": max(gaps, default=0.0),
            "max_slope_jump": max(slope_jumps, default=0.0), "max_degree_tried": max_degree, "tol": tol,
            "piece_detail": pieces[:50]}


def probe_attention(activation: str = "relu", n: int = 6, d: int = 4, heads: int = 1, causal: bool = False,
                    cross: Optional[str] = None, seed: int = 0, **kw) -> dict:
    """Probe one standard attention module with random weights along a random ray (float64).
    ``cross``: None (self-attention), or which input of encoder-decoder attention moves: ``context``,
    ``x`` or ``both``."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    att = Attention(d, heads, activation, causal=causal).double()
    X0, D = (torch.randn(1, n, d, dtype=torch.float64, generator=gen) for _ in range(2))
    C0, DC = (torch.randn(1, n + 1, d, dtype=torch.float64, generator=gen) for _ in range(2))
    if cross is None:
        f = lambda t: att(X0 + t * D)  # noqa: E731
    else:
        mx, mc = cross in ("x", "both"), cross in ("context", "both")
        f = lambda t: att(X0 + (t * D if mx else 0), context=C0 + (t * DC if mc else 0))  # noqa: E731
    out = probe(f, att, **kw)
    out["static_degree_bound"] = static_degree(att, cross or "both")
    out["module"] = f"attention({activation}{', causal' if causal else ''}{', cross wrt ' + cross if cross else ''})"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.spline_probe", description=__doc__.splitlines()[0])
    p.add_argument("--attention", choices=["softmax", "relu", "softplus"], required=True)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--cross", choices=["context", "x", "both"], help="probe encoder-decoder attention")
    p.add_argument("--max-degree", type=int, default=12)
    p.add_argument("--tol", type=float, default=1e-9)
    p.add_argument("--t-max", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args(argv)
    kw = dict(max_degree=args.max_degree, tol=args.tol, t_max=args.t_max)
    out = probe_attention(args.attention, causal=args.causal, cross=args.cross, seed=args.seed, **kw)
    if not args.json:
        print(f"{out['module']}: {out['verdict']}, degree {out['degree']}, static bound "
              f"{out['static_degree_bound']}, {out['pieces']} pieces, max residual {out['max_residual']:.2e}, "
              f"continuity gap {out['max_continuity_gap']:.2e}, slope jump {out['max_slope_jump']:.2e}")
    out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
    print(json.dumps({k: v for k, v in out.items() if k != "piece_detail"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
