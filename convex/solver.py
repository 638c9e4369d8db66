"""Proximal gradient with singular-value thresholding for the convex heads, with certificates.

Objective (the head's energy), for blocks ``Z = [Z_1..Z_G]``, pooled outputs ``A(Z)`` and a mean loss l:

    P(Z) = l(A(Z)) + beta sum_g ||Z_g||_*

Step: ``Z <- SVT_{beta / L}(Y - grad l(A(Y)) / L)`` block by block (the prox of the block nuclear
norm thresholds each block's singular values), with L from a power iteration on A*A times the
loss curvature, doubled by backtracking until the quadratic upper bound holds, so every plain step
(``method="pg"``) descends P. ``method="fista"`` is Beck and Teboulle's monotone FISTA: the
accelerated candidate is kept only when it does not increase P (else the momentum restarts from
the kept iterate, O'Donoghue and Candes), so the traced objective never increases either. L
shrinks by 10 % before every step and backtracking doubles it back as needed (adaptive steps). The objective of every iterate is recorded as an energy trace
(:func:`unfold.trace.report_from_values`, terms ``loss`` and ``penalty``), like the layers'.

Certificates (Fenchel duality; the dual is ``max -l*(V)`` s.t. ``max_g ||A_g*(V)||_2 <= beta``):
at the dual point ``V = t grad l(A(Z))``, ``t = min(1, beta / max_g ||A_g*(grad l)||_2)``, the gap
``P(Z) + l*(V) >= 0`` bounds the distance to the optimum; ``beta_max = max_g ||A_g*(grad l(0))||_2``
is the smallest beta whose solution is Z = 0 (Z = 0 is optimal iff that norm is <= beta).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from energies.errors import ConfigError, TokenError
from energies.checks import check_int, check_number
from unfold.trace import DescentReport, report_from_values

from .heads import Head
from .losses import Loss, get_loss

__all__ = ["solve", "ConvexSolution", "svt", "nuclear", "beta_max", "certificate", "map_back", "rank",
           "operator_norm2", "METHODS"]

METHODS = ("fista", "pg")
ROUNDING = 8 * torch.finfo(torch.float64).eps    # slack of the backtracking test (below the trace tolerance)
SHRINK = 0.9   # L is multiplied by this before each step (adaptive step size), then doubled while the bound fails


def svt(Z: torch.Tensor, tau: float, with_norm: bool = False):
    """Singular-value thresholding: the prox of ``tau ||.||_*`` (and, with ``with_norm``, the nuclear
    norm of the result, sum of the thresholded singular values, at no extra cost)."""
    if not isinstance(Z, torch.Tensor) or Z.ndim != 2:
        raise ConfigError(f"svt needs a matrix, got {tuple(getattr(Z, 'shape', ()))}")
    tau = check_number(tau, "svt threshold tau", "nonnegative", ConfigError)
    U, S, Vh = torch.linalg.svd(Z, full_matrices=False)
    S = torch.clamp(S - tau, min=0.0)
    k = int((S > 0).sum())
    out = (U[:, :k] * S[:k]) @ Vh[:k]
    return (out, float(S.sum())) if with_norm else out


def nuclear(Z: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(torch.linalg.matrix_norm(z, ord="nuc") for z in Z)


def rank(Z: Sequence[torch.Tensor], rtol: float = 1e-9) -> List[int]:
    """Singular values above ``rtol`` times the largest over all blocks, per block."""
    rtol = check_number(rtol, "rtol", "nonnegative", ConfigError)
    svals = [torch.linalg.svdvals(z) for z in Z]
    top = max([float(s.max()) if s.numel() else 0.0 for s in svals] + [0.0])
    return [int((s > rtol * top).sum()) if top > 0 else 0 for s in svals]


def operator_norm2(head: Head, data: dict, iters: int = 30, seed: int = 0) -> float:
    """``||A||_2^2`` by power iteration on A*A (an estimate from below; backtracking covers the rest)."""
    iters = check_int(iters, "iters", 1, error=ConfigError)
    gen = torch.Generator().manual_seed(seed)
    X = data["X"]
    Z = [torch.randn(r, q, generator=gen, dtype=torch.float64).to(X) for r, q in head.blocks()]
    lam = 0.0
    for _ in range(iters):
        n = math.sqrt(sum(float((z * z).sum()) for z in Z)) or 1.0
        Z = [z / n for z in Z]
        Z = head.adjoint(head.forward(Z, data), data)
        lam = math.sqrt(sum(float((z * z).sum()) for z in Z))
    return lam


def _dual_norm(G: Sequence[torch.Tensor]) -> float:
    return max(float(torch.linalg.matrix_norm(g, ord=2)) for g in G)


def _problem(head: Head, data: dict, Y, loss) -> "tuple[Loss, torch.Tensor]":
    """``(loss, targets)`` checked against the head and its prepared data (:meth:`Head.prepare`): the
    targets as a finite ``(N, c)`` tensor (integer labels in [0, c) are one-hot encoded)."""
    if not isinstance(head, Head):
        raise ConfigError(f"head must be a convex.Head, got {type(head).__name__}")
    if not isinstance(data, dict) or not isinstance(data.get("X"), torch.Tensor):
        raise ConfigError("data must be the dict that head.prepare(X, mask) returns")
    X = data["X"]
    if X.shape[0] < 1:
        raise TokenError(f"head {head.name} needs at least one example, got N=0")
    loss = get_loss(loss)
    return loss, loss.targets(Y, X.shape[0], head.c, X)


def _finite(values: Dict[str, float], what: str) -> Dict[str, float]:
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise TokenError(f"{what} is not finite ({', '.join(f'{k}={v}' for k, v in bad.items())}): the features, "
                         "targets or iterate overflow float64; rescale the features")
    return values


def beta_max(head: Head, data: dict, Y: torch.Tensor, loss="cross_entropy") -> float:
    """``max_g ||A_g*(grad l(0))||_2``: Z = 0 solves the problem iff beta >= beta_max."""
    loss, Y = _problem(head, data, Y, loss)
    R0 = torch.zeros_like(Y)
    return _finite({"beta_max": _dual_norm(head.adjoint(loss.grad(R0, Y), data))}, "beta_max")["beta_max"]


def certificate(head: Head, data: dict, Y: torch.Tensor, Z: Sequence[torch.Tensor], beta: float,
                loss="cross_entropy") -> Dict[str, float]:
    """Primal value, dual value at the scaled gradient, duality gap (absolute and relative), the
    optimality ratio ``max_g ||A_g*(grad l)||_2 / beta`` (<= 1 at the optimum). A certificate is never
    made of non-finite values: a :class:`TokenError` says what overflowed."""
    loss, Y = _problem(head, data, Y, loss)
    beta = check_number(beta, "beta", "positive", ConfigError)
    return _certificate(head, data, Y, _blocks(head, Z, "Z", data["X"]), beta, loss)


def _certificate(head: Head, data: dict, Y: torch.Tensor, Z: Sequence[torch.Tensor], beta: float,
                 loss: Loss) -> Dict[str, float]:
    """:func:`certificate` on arguments already checked (the solver's own calls)."""
    R = head.forward(Z, data)
    l, pen = float(loss.value(R, Y)), float(beta * nuclear(Z))
    norm = _dual_norm(head.adjoint(loss.grad(R, Y), data))
    t = 1.0 if norm <= beta else beta / norm
    dual = float(loss.dual_value(R, Y, t))
    P = l + pen
    _finite({"loss": l, "penalty": pen, "dual": dual, "dual_norm": norm}, "the certificate")
    gap = max(P - dual, 0.0)
    return {"objective": P, "loss": l, "penalty": pen, "dual": dual, "duality_gap": gap,
            "duality_gap_rel": gap / max(abs(P), 1e-300), "optimality_ratio": norm / beta}


def _blocks(head: Head, Z, what: str, like: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """``Z`` checked: finite floating blocks of the head's shapes (moved to ``like``'s dtype and device if given)."""
    shapes = head.blocks()
    if not isinstance(Z, (list, tuple)) or len(Z) != len(shapes):
        got = f"{len(Z)} block(s)" if isinstance(Z, (list, tuple)) else type(Z).__name__
        raise ConfigError(f"{what} must be a list of {len(shapes)} block(s) of shapes {shapes}, got {got}")
    out = []
    for g, (z, shape) in enumerate(zip(Z, shapes)):
        if not isinstance(z, torch.Tensor) or tuple(z.shape) != tuple(shape) or not z.dtype.is_floating_point:
            raise ConfigError(f"{what}[{g}] must be a floating {shape} tensor, got "
                              f"{tuple(getattr(z, 'shape', ()))} {getattr(z, 'dtype', type(z).__name__)}")
        if not bool(torch.isfinite(z).all()):
            raise ConfigError(f"{what}[{g}] holds NaN or Inf")
        out.append(z if like is None else z.to(like))
    return out


@dataclass
class ConvexSolution:
    Z: List[torch.Tensor]
    beta: float
    method: str
    iterations: int
    converged: bool
    certificate: Dict[str, float]
    beta_max: float
    ranks: List[int]
    seconds: float
    #: per-iteration float64 ``{"loss": (1, K+1), "penalty": (1, K+1)}`` of the kept iterates
    trace: Dict[str, torch.Tensor] = field(default_factory=dict)
    #: objective of every accelerated candidate (what plain FISTA would have kept)
    candidates: List[float] = field(default_factory=list)
    lipschitz: List[float] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return sum(self.ranks)

    def report(self) -> DescentReport:
        """The energy-trace report of the objective across iterations (increases flagged)."""
        return report_from_values(self.trace, torch.float64, guaranteed=True)

    def objective_curve(self) -> torch.Tensor:
        return sum(self.trace.values())[0]


def solve(head: Head, data: dict, Y: torch.Tensor, beta: float, loss="cross_entropy", method: str = "fista",
          max_iter: int = 500, tol: float = 1e-7, Z0: Optional[Sequence[torch.Tensor]] = None,
          check_every: int = 10, fixed_lipschitz: Optional[float] = None) -> ConvexSolution:
    """Minimise ``l(A(Z)) + beta sum_g ||Z_g||_*`` (module docstring); stops when the relative duality
    gap is below ``tol`` (checked every ``check_every`` iterations) or after ``max_iter``.

    The gap of a float64 solution bottoms out near 1e-8 relative (it is first order in the distance
    to Z*, the objective second order), so ``tol`` below that only spends iterations.
    ``fixed_lipschitz``: a constant L, no backtracking (for experiments and negative controls: an L
    below the true constant breaks the majorization, and the trace shows it)."""
    if not isinstance(method, str) or method not in METHODS:
        raise ConfigError(f"unknown solver method {method!r}; valid: {list(METHODS)}")
    beta = check_number(beta, "beta", "positive", ConfigError)
    loss, Y = _problem(head, data, Y, loss)
    max_iter = check_int(max_iter, "max_iter", 1, error=ConfigError)
    tol = check_number(tol, "tol", "nonnegative", ConfigError)
    check_every = check_int(check_every, "check_every", 1, error=ConfigError)
    if fixed_lipschitz is not None:
        fixed_lipschitz = check_number(fixed_lipschitz, "fixed_lipschitz", "positive", ConfigError)
    X = data["X"]
    t0 = time.perf_counter()
    Z = ([z.clone() for z in _blocks(head, Z0, "Z0", X)] if Z0 is not None
         else [torch.zeros(r, q).to(X) for r, q in head.blocks()])
    if fixed_lipschitz:
        L = fixed_lipschitz
    else:
        norm2 = operator_norm2(head, data)
        if not math.isfinite(norm2):
            raise TokenError(f"head {head.name}: ||A||^2 overflows float64 (largest |feature| "
                             f"{float(X.abs().max()):.3g}): rescale the features")
        L = max(loss.curvature * norm2 / X.shape[0], 1e-12)

    def smooth(Zs):
        R = head.forward(Zs, data)
        return loss.value(R, Y), R

    def prox_step(Yk):
        """``(Z', loss at Z', penalty at Z')``: one prox-gradient step from Yk (with backtracking)."""
        nonlocal L
        f, R = smooth(Yk)
        G = head.adjoint(loss.grad(R, Y), data)
        if not fixed_lipschitz:
            L = max(L * SHRINK, 1e-12)             # try a longer step first; backtracking restores the bound
        for _ in range(64):
            parts = [svt(y - g / L, beta / L, with_norm=True) for y, g in zip(Yk, G)]
            Zn = [z for z, _ in parts]
            fn, _ = smooth(Zn)
            if fixed_lipschitz:
                break
            D = [zn - y for zn, y in zip(Zn, Yk)]
            bound = float(f) + sum(float((g * d).sum()) for g, d in zip(G, D)) + 0.5 * L * sum(float((d * d).sum()) for d in D)
            if float(fn) <= bound + ROUNDING * abs(float(f)):    # the descent lemma, up to rounding
                break
            L *= 2.0
        return Zn, float(fn), beta * sum(n for _, n in parts)

    lx, px = float(smooth(Z)[0]), float(beta * nuclear(Z))
    _finite({"loss": lx, "penalty": px}, "the objective at the start")
    losses, pens, cands, lips = [lx], [px], [], []
    Yk, t = Z, 1.0
    converged, it = False, 0
    for it in range(1, max_iter + 1):
        Zc, lc, pc = prox_step(Yk if method == "fista" else Z)
        cands.append(lc + pc)
        lips.append(L)
        accepted = method == "pg" or lc + pc <= losses[-1] + pens[-1]
        Znew, lz, pz = (Zc, lc, pc) if accepted else (Z, losses[-1], pens[-1])
        if method == "fista":
            if accepted:
                t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                Yk = [zn + ((t - 1.0) / t_new) * (zn - z) for zn, z in zip(Znew, Z)]
                t = t_new
            else:                                   # the candidate went up: restart the momentum (O'Donoghue-Candes)
                Yk, t = Znew, 1.0
        Z = Znew
        losses.append(lz)
        pens.append(pz)
        if it % check_every == 0:
            cert = _certificate(head, data, Y, Z, beta, loss)
            if cert["duality_gap_rel"] <= tol:
                converged = True
                break
    if not converged:                      # the certificate of the final iterate (already made when converged)
        cert = _certificate(head, data, Y, Z, beta, loss)
        converged = cert["duality_gap_rel"] <= tol
    trace = {"loss": torch.tensor([losses], dtype=torch.float64), "penalty": torch.tensor([pens], dtype=torch.float64)}
    return ConvexSolution(Z=Z, beta=float(beta), method=method, iterations=it, converged=converged, certificate=cert,
                          beta_max=beta_max(head, data, Y, loss), ranks=rank(Z), seconds=time.perf_counter() - t0,
                          trace=trace, candidates=cands, lipschitz=lips)


def map_back(head: Head, Z: Sequence[torch.Tensor], rtol: float = 1e-9):
    """The equivalent non-convex heads: per block, one head per singular pair above ``rtol`` (relative),
    split evenly, ``u = sqrt(sigma) U_k``, ``v = sqrt(sigma) V_k``, so that the weight decay
    ``beta/2 (||W1||^2 + ||W2||^2)`` equals ``beta sigma``, the nuclear norm's share."""
    rtol = check_number(rtol, "rtol", "nonnegative", ConfigError)
    Z = _blocks(head, Z, "Z")
    heads = []
    top = max(float(torch.linalg.svdvals(z).max()) if z.numel() else 0.0 for z in Z)
    for g, z in enumerate(Z):
        U, S, Vh = torch.linalg.svd(z, full_matrices=False)
        for k in range(int((S > rtol * top).sum()) if top > 0 else 0):
            r = math.sqrt(float(S[k]))
            heads.append((g, *head.unfactor(g, r * U[:, k], r * Vh[k])))
    return heads
