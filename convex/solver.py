"""Proximal gradient, monotone FISTA and a proximal Newton-CG hybrid for the convex heads, with certificates.

Objective (the head's energy), for blocks ``Z = [Z_1..Z_G]``, pooled outputs ``A(Z)`` and a mean loss l:

    P(Z) = l(A(Z)) + beta sum_g ||Z_g||_*

Step: ``Z <- SVT_{beta / L}(Y - grad l(A(Y)) / L)`` block by block (the prox of the block nuclear
norm thresholds each block's singular values), with L from a power iteration on A*A times the
loss curvature, doubled by backtracking until the quadratic upper bound holds, so every plain step
(``method="pg"``) descends P. ``method="fista"`` is Beck and Teboulle's monotone FISTA: the
accelerated candidate is kept only when it does not increase P (else the momentum restarts from
the kept iterate, O'Donoghue and Candes), so the traced objective never increases either. L
shrinks by 10 % before every step and backtracking doubles it back as needed (adaptive steps).
A is linear, so the outputs at the extrapolated point are ``A(Y) = A(Z_k) + w (A(Z_k) - A(Z_{k-1}))``
from the two kept forwards: one application of A and one of A* per step.

``method="newton"``: ``warmup`` monotone FISTA steps, then rounds of (i) one proximal-gradient step
from the kept iterate (as above: it finds the rank, adding or dropping singular directions) and (ii) one
trust-region Newton step (Steihaug-Toint truncated CG, at most ``cg_iters`` Hessian-vector products)
on the Burer-Monteiro factors of that iterate, ``Z_g = U_g V_g^T`` balanced (``U_g = U sqrt(S)``,
``V_g = V sqrt(S)`` from its SVD, so that ``||Z_g||_* = 1/2 (||U_g||^2 + ||V_g||^2)``):

    f(U, V) = l(A(U V^T)) + beta/2 sum_g (||U_g||_F^2 + ||V_g||_F^2)            (f >= P(U V^T), = at balance)
    grad_U f = G V + beta U,   grad_V f = G^T U + beta V,   G = A*(grad l(A(U V^T)))
    H[dU, dV] = (dG V + G dV + beta dU,  dG^T U + G^T dU + beta dV),   dG = A*(hess l . A(dU V^T + U dV^T))

Each product costs one A and one A*, like a FISTA step. A Newton candidate is kept only when it lowers f
(trust-region ratio) and its objective P, computed directly, does not exceed the kept one, so the trace
stays monotone; the certificate below is computed at the kept iterate after every round and decides
convergence exactly as for the other methods (a stationary point of f of too low a rank is not optimal:
its certificate says so, and the next proximal step adds the missing direction). Locally the Newton
steps converge superlinearly where FISTA's rate is set by the conditioning of A and of the loss.

The objective of every kept iterate is recorded as an energy trace
([`unfold.trace.report_from_values`][unfold.report_from_values], terms ``loss`` and ``penalty``), like the layers'.

Certificates (Fenchel duality; the dual is ``max -l*(V)`` s.t. ``max_g ||A_g*(V)||_2 <= beta``):
at the dual point ``V = t grad l(A(Z))``, ``t = min(1, beta / max_g ||A_g*(grad l)||_2)``, the gap
``P(Z) + l*(V) >= 0`` bounds the distance to the optimum; ``beta_max = max_g ||A_g*(grad l(0))||_2``
is the smallest beta whose solution is Z = 0 (Z = 0 is optimal iff that norm is <= beta). The dual norm
is the largest singular value from a full SVD of every block (no estimate).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from energies.errors import ConfigError, TokenError
from energies.checks import check_int, check_number
from energies.memory import check_memory
from unfold.trace import DescentReport, report_from_values

from .heads import Head
from .losses import Loss, get_loss

__all__ = ["solve", "ConvexSolution", "svt", "nuclear", "beta_max", "certificate", "map_back", "rank",
           "operator_norm2", "METHODS"]

METHODS = ("fista", "pg", "newton")
ROUNDING = 8 * torch.finfo(torch.float64).eps    # relative rounding of P: slack of the backtracking test (below the
#                                                  trace tolerance), and the smallest decrease newton counts as seen
SHRINK = 0.9   # L is multiplied by this before each step (adaptive step size), then doubled while the bound fails
WARMUP = 50    # method="newton": monotone FISTA steps before the first Newton step (default of ``warmup``)
CG_ITERS = 100  # method="newton": most Hessian-vector products per Newton step (default of ``cg_iters``)
FORCING = 0.1  # truncated CG stops at ||residual|| <= min(FORCING, sqrt(||grad f|| / |f|)) ||grad f||
RHO_MIN = 1e-4  # a Newton candidate must realise this fraction of the decrease its quadratic model predicts


def _svt_factors(Z: torch.Tensor, tau: float):
    """``(U_k, S_k, Vh_k)`` with ``S_k = (sigma - tau)_+ > 0``: the factors of [`svt`][convex.svt]'s result."""
    U, S, Vh = torch.linalg.svd(Z, full_matrices=False)
    S = torch.clamp(S - tau, min=0.0)
    k = int((S > 0).sum())
    return U[:, :k], S[:k], Vh[:k]


def _check_matrix(Z, what: str) -> torch.Tensor:
    """``Z`` if it is a finite 2-D float32 or float64 tensor (what the SVD takes), else a ConfigError naming
    ``what``, its shape and dtype."""
    if (not isinstance(Z, torch.Tensor) or Z.ndim != 2 or Z.dtype not in (torch.float32, torch.float64)
            or Z.device.type == "meta"):
        raise ConfigError(f"{what} needs a 2-D float32 or float64 matrix, got "
                          f"{tuple(Z.shape) if isinstance(Z, torch.Tensor) else type(Z).__name__}"
                          f"{f' of dtype {Z.dtype}' if isinstance(Z, torch.Tensor) else ''}"
                          f"{' on the meta device' if isinstance(Z, torch.Tensor) and Z.device.type == 'meta' else ''}")
    if not bool(torch.isfinite(Z).all()):
        raise ConfigError(f"{what} holds NaN or Inf")
    return Z


def svt(Z: torch.Tensor, tau: float, with_norm: bool = False):
    """Singular-value thresholding, the prox of ``tau ||.||_*``: ``U diag((sigma - tau)_+) V^T`` from the full
    SVD ``Z = U diag(sigma) V^T`` (the solver's proximal step on each block, module docstring; no equation of the
    paper, which states the programs, not a solver).

    With ``with_norm``, the nuclear norm of the result, the sum of the thresholded singular values, comes at no
    extra cost.

    Args:
        Z: the matrix ``(r, q)``, float32 or float64, finite.
        tau: the threshold, a finite number >= 0 (0 returns Z up to rounding).
        with_norm: also return the result's nuclear norm.

    Returns:
        The thresholded matrix, Z's shape, dtype and device; with ``with_norm``, the pair ``(matrix, nuclear
        norm as a float)``.

    Raises:
        ConfigError: Z is not a finite 2-D float32 or float64 tensor, or tau is not a finite number >= 0.
    """
    _check_matrix(Z, "svt")
    tau = check_number(tau, "svt threshold tau", "nonnegative", ConfigError)
    U, S, Vh = _svt_factors(Z, tau)
    out = (U * S) @ Vh
    return (out, float(S.sum())) if with_norm else out


def nuclear(Z: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum(torch.linalg.matrix_norm(z, ord="nuc") for z in Z)


def rank(Z: Sequence[torch.Tensor], rtol: float = 1e-9) -> List[int]:
    """The numerical rank of each block: its singular values above ``rtol`` times the largest over all blocks.

    At the optimum this is the number of non-convex heads the solution needs per block: ``r = rank(Z*)`` heads
    reach the optimum of the non-convex problem (eq. 12; the map of Appendix A.2 after eq. 52), and
    [`map_back`][convex.map_back] keeps the singular pairs by the same rule.

    Args:
        Z: the blocks ``[Z_1, ..., Z_G]``, 2-D tensors.
        rtol: the relative threshold, a finite number >= 0.

    Returns:
        One int per block (all 0 when every block is zero).

    Raises:
        ConfigError: rtol is not a finite number >= 0, Z is not a list, or a block is not a finite 2-D float32 or
            float64 tensor.
    """
    rtol = check_number(rtol, "rtol", "nonnegative", ConfigError)
    if not isinstance(Z, (list, tuple)):
        raise ConfigError(f"rank needs a list of blocks (2-D tensors), got {type(Z).__name__}")
    for i, z in enumerate(Z):
        _check_matrix(z, f"rank (block {i})")
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
    """``(loss, targets)`` checked against the head and its prepared data ([`Head.prepare`][convex.Head.prepare]): the
    targets as a finite ``(N, c)`` tensor (integer labels in [0, c) are one-hot encoded)."""
    if not isinstance(head, Head):
        raise ConfigError(f"head must be a convex.Head, got {type(head).__name__}")
    if not isinstance(data, dict) or not isinstance(data.get("X"), torch.Tensor):
        raise ConfigError("data must be the dict that head.prepare(X, mask) returns")
    X = data["X"]
    if X.shape[0] < 1:
        raise TokenError(f"head {head.name} needs at least one example, got N=0")
    if data.get("prepared_by") != head.signature():
        raise ConfigError(f"data must be the dict that this head's prepare(X, mask) returns: it was prepared by "
                          f"{data.get('prepared_by', 'no head')!r}, not by {head.signature()!r}")
    entries = sum(r * q for r, q in head.blocks())     # Z, its candidates, gradients, momentum: about 8 copies
    check_memory(8 * entries * X.element_size(), f"head {head.name}: blocks {head.blocks()} ({entries:,} entries of "
                 f"{X.dtype})", ConfigError, "use a smaller d, s or c", device=X.device)
    loss = get_loss(loss)
    return loss, loss.targets(Y, X.shape[0], head.c, X)


def _finite(values: Dict[str, float], what: str) -> Dict[str, float]:
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise TokenError(f"{what} is not finite ({', '.join(f'{k}={v}' for k, v in bad.items())}): the features, "
                         "targets or iterate overflow float64; rescale the features")
    return values


def beta_max(head: Head, data: dict, Y: torch.Tensor, loss="cross_entropy") -> float:
    """``max_g ||A_g*(grad l(0))||_2``: Z = 0 solves the problem iff beta >= beta_max.

    The dual constraint of the convex program (eq. 38, Lemma A.2; its nuclear-norm form eq. 46) is
    ``max_g ||A_g*(V)||_2 <= beta``; Z = 0 is optimal iff the dual point ``V = grad l(0)`` satisfies it.

    Args:
        head: the convex head ([`convex.make_head`][convex.make_head]).
        data: the dict that ``head.prepare(X, mask)`` returns.
        Y: the targets: integer labels in [0, c) (one-hot encoded) or an ``(N, c)`` tensor.
        loss: ``cross_entropy`` or ``squared``, or a `Loss`.

    Returns:
        beta_max as a float (the largest singular value over the blocks, from a full SVD).

    Raises:
        ConfigError: the head, data, loss or targets are refused.
        TokenError: no examples, or the value is not finite (the features overflow float64).
    """
    loss, Y = _problem(head, data, Y, loss)
    R0 = torch.zeros_like(Y)
    return _finite({"beta_max": _dual_norm(head.adjoint(loss.grad(R0, Y), data))}, "beta_max")["beta_max"]


def certificate(head: Head, data: dict, Y: torch.Tensor, Z: Sequence[torch.Tensor], beta: float,
                loss="cross_entropy") -> Dict[str, float]:
    """Primal value, dual value at the scaled gradient, duality gap (absolute and relative), the
    optimality ratio ``max_g ||A_g*(grad l)||_2 / beta`` (<= 1 at the optimum).

    Fenchel duality (eq. 38, Lemma A.2): at the dual point ``V = t grad l(A(Z))``,
    ``t = min(1, beta / max_g ||A_g*(grad l)||_2)`` (feasible: the dual constraint holds), the gap
    ``P(Z) + l*(V) >= 0`` bounds ``P(Z) - P*`` (module docstring). A certificate is never made of non-finite
    values: a [`TokenError`][energies.TokenError] says what overflowed; nor of a dual value above the objective by more
    than rounding (weak duality broken: the loss's conjugate is wrong), which would read as a zero gap.

    Args:
        head: the convex head ([`convex.make_head`][convex.make_head]).
        data: the dict that ``head.prepare(X, mask)`` returns.
        Y: the targets: integer labels in [0, c) (one-hot encoded) or an ``(N, c)`` tensor.
        Z: the blocks, a list of finite floating tensors of the shapes ``head.blocks()`` (moved to the
            features' dtype and device).
        beta: the nuclear-norm weight, a finite number > 0.
        loss: ``cross_entropy`` or ``squared``, or a `Loss`.

    Returns:
        A dict of floats: ``objective`` (P), ``loss``, ``penalty`` (``beta sum_g ||Z_g||_*``), ``dual``
        (``-l*(V)``), ``duality_gap`` (``max(P - dual, 0)``), ``duality_gap_rel`` (the gap over ``|P|``) and
        ``optimality_ratio``.

    Raises:
        ConfigError: the head, data, loss, targets, blocks or beta are refused, or the loss's dual value exceeds
            the objective (its conjugate is wrong).
        TokenError: no examples, or a part of the certificate is not finite.
    """
    loss, Y = _problem(head, data, Y, loss)
    beta = check_number(beta, "beta", "positive", ConfigError)
    return _certificate(head, data, Y, _blocks(head, Z, "Z", data["X"]), beta, loss)


def _certificate(head: Head, data: dict, Y: torch.Tensor, Z: Sequence[torch.Tensor], beta: float,
                 loss: Loss, R: Optional[torch.Tensor] = None, G: Optional[List[torch.Tensor]] = None
                 ) -> Dict[str, float]:
    """[`certificate`][convex.certificate] on arguments already checked (the solver's own calls). ``R = A(Z)`` and
    ``G = A*(grad l(R))`` may be passed when the caller has just computed them from this very Z (the same
    computation, not an approximation)."""
    R = head.forward(Z, data) if R is None else R
    l, pen = float(loss.value(R, Y)), float(beta * nuclear(Z))
    norm = _dual_norm(head.adjoint(loss.grad(R, Y), data) if G is None else G)
    t = 1.0 if norm <= beta else beta / norm
    dual = float(loss.dual_value(R, Y, t))
    P = l + pen
    _finite({"loss": l, "penalty": pen, "dual": dual, "dual_norm": norm}, "the certificate")
    slack = 64 * torch.finfo(R.dtype).eps * (abs(P) + abs(dual))     # rounding of P and of the dual value
    if dual > P + slack:        # weak duality: never, for a correct conjugate; a gap clamped to 0 would certify it
        raise ConfigError(f"loss {loss.name!r}: the dual value {dual:.17g} exceeds the objective {P:.17g} by more than "
                          f"rounding ({slack:.3g}): its conjugate (dual_value) is not the loss's, and no duality gap "
                          "can be certified")
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
    """What [`solve`][convex.solve] returns: the solution of the convex program ``min l(A(Z)) + beta sum_g ||Z_g||_*``
    (the head's equation, e.g. eq. 13) with its certificate (eq. 38) and the traced objective.

    Attributes:
        Z: the solution's blocks ``[Z_1, ..., Z_G]`` (the last kept iterate), of the shapes ``head.blocks()`` and
            the features' dtype and device.
        beta: the nuclear-norm weight it was solved for.
        method: ``fista``, ``pg`` or ``newton``.
        iterations: steps of fista/pg; for newton the same unit of work: FISTA and proximal steps, Hessian-vector
            products and Newton candidates, each one application of A and one of A* (what ``max_iter`` bounds).
        converged: whether the relative duality gap reached ``tol``.
        certificate: [`certificate`][convex.certificate] at Z (objective, dual, duality gap absolute and relative,
            optimality ratio).
        beta_max: [`beta_max`][convex.beta_max] of the problem (Z = 0 iff beta >= beta_max).
        ranks: [`rank`][convex.rank] of each block (rtol 1e-9).
        seconds: wall-clock seconds of the solve, from after the argument checks to the end.
        trace: per-iteration float64 ``{"loss": (1, K+1), "penalty": (1, K+1)}`` of the kept iterates (one
            column per FISTA / proximal step and per Newton step).
        candidates: objective of every candidate (what plain FISTA would have kept; Newton candidates included).
        lipschitz: the step's L (step size 1/L, after backtracking) at every candidate.
        operator_calls: applications of A and of A* in all (certificates included).
        newton_steps: Newton steps kept (method="newton").
    """

    Z: List[torch.Tensor]
    beta: float
    method: str
    iterations: int
    converged: bool
    certificate: Dict[str, float]
    beta_max: float
    ranks: List[int]
    seconds: float
    trace: Dict[str, torch.Tensor] = field(default_factory=dict)
    candidates: List[float] = field(default_factory=list)
    lipschitz: List[float] = field(default_factory=list)
    operator_calls: int = 0
    newton_steps: int = 0

    @property
    def rank(self) -> int:
        """The total rank, the sum of [`ranks`][convex.ConvexSolution.ranks]: the number of non-convex heads
        [`map_back`][convex.map_back] gives."""
        return sum(self.ranks)

    def report(self) -> DescentReport:
        """The energy-trace report of the objective across iterations (increases flagged)."""
        return report_from_values(self.trace, torch.float64, guaranteed=True)

    def objective_curve(self) -> torch.Tensor:
        """The objective P of every kept iterate, ``(K+1,)`` float64 (loss + penalty of
        [`trace`][convex.ConvexSolution.trace])."""
        return sum(self.trace.values())[0]


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return sum(float((x * y).sum()) for x, y in zip(a, b))


def _balanced(U: torch.Tensor, V: torch.Tensor):
    """``(U', V', S)`` with ``U' V'^T = U V^T``, ``U' = Q_U A sqrt(S)``, ``V' = Q_V B sqrt(S)`` from the SVD
    ``A S B^T`` of ``R_U R_V^T`` (QR factors ``U = Q_U R_U``, ``V = Q_V R_V``): the balanced factors, whose
    ``1/2 (||U'||^2 + ||V'||^2) = sum S`` is the nuclear norm of ``U V^T``; zero singular values dropped."""
    if U.shape[1] == 0:
        return U, V, U.new_zeros(0)
    Qu, Ru = torch.linalg.qr(U)
    Qv, Rv = torch.linalg.qr(V)
    A, S, Bh = torch.linalg.svd(Ru @ Rv.T)
    k = int((S > 0).sum())
    r = S[:k].sqrt()
    return (Qu @ A[:, :k]) * r, (Qv @ Bh[:k].T) * r, S[:k]


class _Run:
    """State of one [`solve`][convex.solve] call: the kept iterate ``Z`` with ``R = A(Z)`` and its objective, the step
    size, the trace and the operator counts."""

    def __init__(self, head, data, Y, beta, loss, Z, fixed_lipschitz):
        self.head, self.data, self.Y, self.beta, self.loss = head, data, Y, beta, loss
        self.calls = 0
        self.fixed = fixed_lipschitz
        self.Z = Z
        self.R = self.fwd(Z)
        self.lz, self.nz = float(loss.value(self.R, Y)), float(nuclear(Z))
        _finite({"loss": self.lz, "penalty": beta * self.nz}, "the objective at the start")
        self.losses, self.pens, self.cands, self.lips = [self.lz], [beta * self.nz], [], []
        self.G: Optional[List[torch.Tensor]] = None          # A*(grad l(R)) at Z, when known

    @property
    def P(self) -> float:
        return self.losses[-1] + self.pens[-1]

    def fwd(self, Z):
        self.calls += 1
        return self.head.forward(Z, self.data)

    def adj(self, R):
        self.calls += 1
        return self.head.adjoint(R, self.data)

    def gradient(self) -> List[torch.Tensor]:
        if self.G is None:
            self.G = self.adj(self.loss.grad(self.R, self.Y))
        return self.G

    def keep(self, Z, R, lz, nz, G=None) -> None:
        self.Z, self.R, self.lz, self.nz, self.G = Z, R, lz, nz, G

    def record(self) -> None:
        """Append the kept iterate's objective to the trace (one column per step)."""
        self.losses.append(self.lz)
        self.pens.append(self.beta * self.nz)

    def prox(self, Yk, RY, G):
        """One proximal-gradient step from ``Yk`` (``RY = A(Yk)``, ``G = A*(grad l(RY))``) with backtracking:
        ``Z' = SVT_{beta/L}(Yk - G/L)``, L doubled until ``l(A Z') <= l(A Yk) + <G, Z' - Yk> + L/2 ||Z' - Yk||^2``.
        Returns ``(Z', A(Z'), l(A Z'), ||Z'||_*, factors [(U_k, S_k, Vh_k)] per block)``."""
        beta, loss = self.beta, self.loss
        f = float(loss.value(RY, self.Y))
        L = self.fixed or max(self.L * SHRINK, 1e-12)       # try a longer step first; backtracking restores the bound
        for _ in range(64):
            parts = [_svt_factors(y - g / L, beta / L) for y, g in zip(Yk, G)]
            Zn = [(U * S) @ Vh for U, S, Vh in parts]
            Rn = self.fwd(Zn)
            fn = float(loss.value(Rn, self.Y))
            if self.fixed:
                break
            D = [zn - y for zn, y in zip(Zn, Yk)]
            bound = f + _dot(G, D) + 0.5 * L * _dot(D, D)
            if fn <= bound + ROUNDING * abs(f):               # the descent lemma, up to rounding
                break
            L *= 2.0
        self.L = L
        return Zn, Rn, fn, sum(float(S.sum()) for _, S, _ in parts), parts

    def certificate(self) -> Dict[str, float]:
        return _certificate(self.head, self.data, self.Y, self.Z, self.beta, self.loss, R=self.R, G=self.gradient())


def _fista(run: _Run, method: str, steps: int, tol: float, check_every: int, first: int = 1):
    """``steps`` monotone FISTA (or plain, ``method="pg"``) steps on ``run``; returns ``(converged, last step,
    certificate or None)``; certificates every ``check_every`` steps (numbered from ``first``)."""
    Zp, Rp, t, w = None, None, 1.0, 0.0                    # previous kept iterate, momentum
    cert = None
    it = first - 1
    for it in range(first, first + steps):
        if method == "fista" and w > 0:
            Yk = [z + w * (z - zp) for z, zp in zip(run.Z, Zp)]
            RY = run.R + w * (run.R - Rp)                  # A is linear: A(Y) without applying A
            G = run.adj(run.loss.grad(RY, run.Y))
        else:
            Yk, RY, G = run.Z, run.R, run.gradient()
        Zc, Rc, lc, nc, _ = run.prox(Yk, RY, G)
        Pc = lc + run.beta * nc
        run.cands.append(Pc)
        run.lips.append(run.L)
        if method == "pg" or Pc <= run.P:
            Zp, Rp = run.Z, run.R
            run.keep(Zc, Rc, lc, nc)
            if method == "fista":
                t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                w, t = (t - 1.0) / t_new, t_new
        else:                                              # the candidate went up: restart the momentum
            w, t = 0.0, 1.0
        run.record()
        if it % check_every == 0:
            cert = run.certificate()
            if cert["duality_gap_rel"] <= tol:
                return True, it, cert
    return False, it, cert


def _newton(run: _Run, budget: int, tol: float, cg_iters: int):
    """Rounds of one proximal step and one trust-region Newton-CG step (module docstring) until the certificate
    is within ``tol``, ``budget`` units of work are spent, or float64 cannot see a descent any more (the
    proximal candidate does not lower P by more than its rounding and the full Newton step's predicted decrease
    is below it: the iterate is optimal to the resolution of P, and further steps would only be kept or refused
    by rounding). The Newton step starts from the balanced factors of the proximal candidate, kept or not (a
    candidate refused by rounding still carries the singular directions the proximal step found); it is kept
    only if its objective does not exceed the kept one. Returns ``(converged, work, certificate, Newton steps
    kept)``."""
    work, kept, cert, radius = 0, 0, None, None
    while work < budget:
        (Zc, Rc, lc, parts), prox_descends, resolution, cert = _prox_round(run)     # (i): finds the rank
        work += 1
        if cert["duality_gap_rel"] <= tol:
            return True, work, cert, kept
        if work >= budget:
            break
        # (ii) a Newton step on f(U, V) at the balanced factors of the proximal candidate
        Us, Vs, G, g, gn, f = _factor_model(run, Zc, Rc, lc, parts)
        if not gn > 0:                                     # rank 0 everywhere (or a stationary point of f)
            if not prox_descends:
                break
            continue
        if radius is None:
            radius = 0.1 * math.sqrt(_dot(Us, Us) + _dot(Vs, Vs)) or 1.0
        step, Hstep, used, hit = _steihaug(g, _hvp(run, Rc, G, Us, Vs), radius,
                                           min(FORCING, math.sqrt(gn / max(abs(f), 1e-300))),
                                           min(cg_iters, budget - work - 1))
        work += used
        if step is None:
            continue
        pred = -(_dot(g, step) + 0.5 * _dot(step, Hstep))
        if not hit and not pred > resolution and not prox_descends:
            break                                          # optimal to the resolution of P (docstring)
        radius, better = _newton_candidate(run, Us, Vs, step, f, pred, hit, radius)
        work += 1
        if better:
            kept += 1
            cert = run.certificate()                       # G at the Newton iterate: the next round needs it too
            if cert["duality_gap_rel"] <= tol:
                return True, work, cert, kept
    cert = run.certificate()
    return cert["duality_gap_rel"] <= tol, work, cert, kept


def _prox_round(run: _Run):
    """Part (i) of a Newton round: one proximal-gradient step from the kept iterate, kept if it does not raise P,
    recorded and certified. Returns ``((Z', A(Z'), l(A Z'), its SVT factors), whether it lowers P by more than
    the rounding of P, that rounding, the certificate at the kept iterate)``."""
    Zc, Rc, lc, nc, parts = run.prox(run.Z, run.R, run.gradient())
    Pc = lc + run.beta * nc
    run.cands.append(Pc)
    run.lips.append(run.L)
    resolution = ROUNDING * max(abs(run.P), 1e-300)
    prox_descends = Pc < run.P - resolution
    if Pc <= run.P:
        run.keep(Zc, Rc, lc, nc)
    run.record()
    return (Zc, Rc, lc, parts), prox_descends, resolution, run.certificate()


def _factor_model(run: _Run, Zc, Rc, lc: float, parts):
    """The balanced factors ``U_g = U sqrt(S)``, ``V_g = V sqrt(S)`` of the proximal candidate ``Zc`` (factors
    ``parts``, ``Rc = A(Zc)``, ``lc = l(Rc)``) and f there: ``(Us, Vs, G, grad f, ||grad f||, f)`` with
    ``G = A*(grad l(Rc))`` (module docstring)."""
    beta = run.beta
    G = run.gradient() if run.Z is Zc else run.adj(run.loss.grad(Rc, run.Y))
    Us = [U * S.sqrt() for U, S, _ in parts]
    Vs = [Vh.T * S.sqrt() for _, S, Vh in parts]
    g = [gg @ v + beta * u for gg, u, v in zip(G, Us, Vs)] + [gg.T @ u + beta * v for gg, u, v in zip(G, Us, Vs)]
    gn = math.sqrt(_dot(g, g))
    f = lc + 0.5 * beta * (_dot(Us, Us) + _dot(Vs, Vs))
    return Us, Vs, G, g, gn, f


def _hvp(run: _Run, Rc, G, Us, Vs):
    """The product ``d -> H[dU, dV]`` with the Hessian of f(U, V) at the factors ``Us, Vs`` (module docstring;
    ``Rc = A(U V^T)``, ``G = A*(grad l(Rc))``): one application of A and one of A* per product."""
    beta, loss, Y, nb = run.beta, run.loss, run.Y, len(Us)

    def hvp(d):
        dZ = [du @ v.T + u @ dv.T for du, dv, u, v in zip(d[:nb], d[nb:], Us, Vs)]
        dG = run.adj(loss.hess(Rc, run.fwd(dZ), Y))
        return ([dg @ v + gg @ dv + beta * du for dg, gg, du, dv, v in zip(dG, G, d[:nb], d[nb:], Vs)]
                + [dg.T @ u + gg.T @ du + beta * dv for dg, gg, du, dv, u in zip(dG, G, d[:nb], d[nb:], Us)])
    return hvp


def _newton_candidate(run: _Run, Us, Vs, step, f: float, pred: float, hit: bool, radius: float):
    """Part (ii) of a Newton round after the CG: the candidate ``(U + dU, V + dV)`` for ``step`` (predicted
    decrease ``pred`` of f, ``hit``: on the trust-region boundary). Its ratio of actual to predicted decrease
    updates the radius; it is recorded when it lowers f by at least ``RHO_MIN`` of ``pred``, and kept when its
    objective P does not exceed the kept one. Returns ``(new radius, kept)``."""
    beta, nb = run.beta, len(Us)
    U2 = [u + d for u, d in zip(Us, step[:nb])]
    V2 = [v + d for v, d in zip(Vs, step[nb:])]
    Z2 = [u @ v.T for u, v in zip(U2, V2)]
    R2 = run.fwd(Z2)
    l2 = float(run.loss.value(R2, run.Y))
    f2 = l2 + 0.5 * beta * (_dot(U2, U2) + _dot(V2, V2))
    ratio = (f - f2) / pred if pred > 0 else -math.inf
    size = math.sqrt(_dot(step, step))
    if not ratio >= 0.25:                                  # NaN included
        radius = 0.25 * size if math.isfinite(size) else 0.25 * radius
    elif ratio > 0.75 and hit:
        radius *= 2.0
    if not (math.isfinite(f2) and f2 < f and ratio >= RHO_MIN):
        return radius, False
    n2 = sum(float(S.sum()) for _, _, S in (_balanced(u, v) for u, v in zip(U2, V2)))
    P2 = l2 + beta * n2
    run.cands.append(P2)
    run.lips.append(run.L)
    better = P2 <= run.P
    if better:
        run.keep(Z2, R2, l2, n2)
    run.record()
    return radius, better


def _steihaug(g, hvp, radius: float, forcing: float, max_products: int):
    """Steihaug-Toint truncated CG for ``min_s <g, s> + 1/2 <s, H s>`` s.t. ``||s|| <= radius``: stops at
    ``||H s + g|| <= forcing ||g||``, on the boundary, or along a direction of non-positive curvature (to the
    boundary). Returns ``(s, H s, products used, hit the boundary)``; ``s`` is None when no product was allowed."""
    if max_products < 1:
        return None, None, 0, False
    gn = math.sqrt(_dot(g, g))
    x = [torch.zeros_like(t) for t in g]
    Hx = [torch.zeros_like(t) for t in g]
    r = [-t for t in g]
    d = [t.clone() for t in r]
    rr = gn * gn
    used = 0

    def to_boundary(Hd):
        xx, xd, dd = _dot(x, x), _dot(x, d), _dot(d, d)
        tau = (-xd + math.sqrt(max(xd * xd + dd * (radius * radius - xx), 0.0))) / dd
        return [xi + tau * di for xi, di in zip(x, d)], [hi + tau * h for hi, h in zip(Hx, Hd)], used, True

    while used < max_products:
        Hd = hvp(d)
        used += 1
        dHd = _dot(d, Hd)
        if not dHd > 0:                                    # non-positive curvature (or NaN): go to the boundary
            return to_boundary(Hd)
        a = rr / dHd
        xn = [xi + a * di for xi, di in zip(x, d)]
        if _dot(xn, xn) >= radius * radius:
            return to_boundary(Hd)
        x, Hx = xn, [hi + a * h for hi, h in zip(Hx, Hd)]
        r = [ri - a * h for ri, h in zip(r, Hd)]
        rr_new = _dot(r, r)
        if math.sqrt(rr_new) <= forcing * gn:
            break
        d = [ri + (rr_new / rr) * di for ri, di in zip(r, d)]
        rr = rr_new
    return x, Hx, used, False


def _checked(head, data, Y, beta, loss, method, max_iter, tol, check_every, warmup, cg_iters, fixed_lipschitz):
    """[`solve`][convex.solve]'s arguments checked (the first refused in this order: method, beta, loss and targets, the
    budgets, newton's need of a Hessian): ``(beta, loss, targets, max_iter, tol, check_every, warmup, cg_iters,
    fixed_lipschitz)``."""
    if not isinstance(method, str) or method not in METHODS:
        raise ConfigError(f"unknown solver method {method!r}; valid: {list(METHODS)}")
    beta = check_number(beta, "beta", "positive", ConfigError)
    loss, Y = _problem(head, data, Y, loss)
    max_iter = check_int(max_iter, "max_iter", 1, error=ConfigError)
    tol = check_number(tol, "tol", "nonnegative", ConfigError)
    check_every = check_int(check_every, "check_every", 1, error=ConfigError)
    warmup = check_int(warmup, "warmup", 0, error=ConfigError)
    cg_iters = check_int(cg_iters, "cg_iters", 1, error=ConfigError)
    if fixed_lipschitz is not None:
        fixed_lipschitz = check_number(fixed_lipschitz, "fixed_lipschitz", "positive", ConfigError)
    if method == "newton" and type(loss).hess is Loss.hess:
        raise ConfigError(f"method 'newton' needs the Hessian of the loss ({type(loss).__name__}.hess); "
                          f"loss {loss.name!r} has none: use method 'fista' or 'pg'")
    return beta, loss, Y, max_iter, tol, check_every, warmup, cg_iters, fixed_lipschitz


def _start(head: Head, data: dict, Y, beta: float, loss: Loss, Z0, fixed_lipschitz) -> _Run:
    """The run at ``Z0`` (default zeros) with its first step size: ``fixed_lipschitz``, else
    ``curvature ||A||^2 / N`` from the power iteration (its 60 applications of A and A* counted)."""
    X = data["X"]
    Z = ([z.clone() for z in _blocks(head, Z0, "Z0", X)] if Z0 is not None
         else [torch.zeros(r, q).to(X) for r, q in head.blocks()])
    run = _Run(head, data, Y, beta, loss, Z, fixed_lipschitz)
    if fixed_lipschitz:
        run.L = fixed_lipschitz
    else:
        norm2 = operator_norm2(head, data)
        run.calls += 60                                    # 30 power iterations, one A and one A* each
        if not math.isfinite(norm2):
            raise TokenError(f"head {head.name}: ||A||^2 overflows float64 (largest |feature| "
                             f"{float(X.abs().max()):.3g}): rescale the features")
        run.L = max(loss.curvature * norm2 / X.shape[0], 1e-12)
    return run


def _iterate(run: _Run, method: str, max_iter: int, tol: float, check_every: int, warmup: int, cg_iters: int):
    """The steps of ``method`` on ``run`` until the certificate is within ``tol`` or ``max_iter`` is spent, and
    the certificate of the final iterate: ``(converged, iterations, certificate, Newton steps kept)``."""
    kept = 0
    if method == "newton":
        first = min(warmup, max_iter)
        converged, it, cert = _fista(run, "fista", first, tol, check_every) if first else (False, 0, None)
        if not converged and it < max_iter:
            converged, work, cert, kept = _newton(run, max_iter - it, tol, cg_iters)
            it += work
    else:
        converged, it, cert = _fista(run, method, max_iter, tol, check_every)
    if not converged:                      # the certificate of the final iterate (already made when converged)
        cert = run.certificate()
        converged = cert["duality_gap_rel"] <= tol
    return converged, it, cert, kept


def _solution(run: _Run, method: str, it: int, converged: bool, cert: Dict[str, float], kept: int,
              t0: float) -> ConvexSolution:
    """The [`ConvexSolution`][convex.ConvexSolution] of a finished run (trace, ``beta_max``, ranks, seconds since
    ``t0``)."""
    trace = {"loss": torch.tensor([run.losses], dtype=torch.float64),
             "penalty": torch.tensor([run.pens], dtype=torch.float64)}
    bmax = beta_max(run.head, run.data, run.Y, run.loss)
    return ConvexSolution(Z=run.Z, beta=float(run.beta), method=method, iterations=it, converged=converged,
                          certificate=cert, beta_max=bmax, ranks=rank(run.Z), seconds=time.perf_counter() - t0,
                          trace=trace, candidates=run.cands, lipschitz=run.lips, operator_calls=run.calls + 1,
                          newton_steps=kept)


def solve(head: Head, data: dict, Y: torch.Tensor, beta: float, loss="cross_entropy", method: str = "fista",
          max_iter: int = 500, tol: float = 1e-7, Z0: Optional[Sequence[torch.Tensor]] = None,
          check_every: int = 10, fixed_lipschitz: Optional[float] = None, warmup: int = WARMUP,
          cg_iters: int = CG_ITERS) -> ConvexSolution:
    """Minimise the head's convex program ``l(A(Z)) + beta sum_g ||Z_g||_*`` (its equation: ``head.equation``,
    e.g. eq. 13 for ``sa_linear``; module docstring); stops when the relative duality gap is below ``tol``
    (checked every ``check_every`` FISTA/pg steps, after every Newton round) or after ``max_iter`` iterations
    (for ``newton``: units of work, see [`ConvexSolution.iterations`][convex.ConvexSolution.iterations]).

    ``method``: ``fista`` (monotone FISTA), ``pg`` (plain proximal gradient) or ``newton`` (``warmup``
    FISTA steps, then proximal steps alternating with trust-region Newton-CG steps of at most ``cg_iters``
    Hessian-vector products on the Burer-Monteiro factors; needs a loss with `Loss.hess`). The gap of
    the first-order methods stalls in flat directions of ill-conditioned problems (once a step's decrease of
    P is below float64's resolution of P, no candidate is seen to descend); the Newton steps of ``newton``
    still descend measurably there and reach gaps of about 1e-9 to 1e-14 on the problems measured (it stops
    where no step can be seen to descend any more, see `_newton`). ``fixed_lipschitz``: a constant L,
    no backtracking (for experiments and negative controls: an L below the true constant breaks the
    majorization, and the trace shows it).

    Args:
        head: the convex head ([`convex.make_head`][convex.make_head]): the linear map A of the block variables Z.
        data: the dict that ``head.prepare(X, mask)`` returns.
        Y: the targets: integer labels in [0, c) (one-hot encoded) or an ``(N, c)`` tensor.
        beta: the nuclear-norm weight, > 0.
        loss: ``cross_entropy`` or ``squared``, or a `Loss`.
        method: ``fista``, ``pg`` or ``newton`` (above).
        max_iter: the iteration budget, >= 1.
        tol: the relative duality gap at which it stops (its certificate), >= 0.
        Z0: a starting point (default zeros): finite floating blocks of the shapes ``head.blocks()``.
        check_every: how often the gap is computed, in first-order steps, >= 1.
        fixed_lipschitz: a constant step's L instead of backtracking (negative controls), > 0.
        warmup: FISTA steps before Newton's, >= 0.
        cg_iters: Hessian-vector products per Newton-CG step, >= 1.

    Returns:
        A [`ConvexSolution`][convex.ConvexSolution]: Z, whether the gap reached ``tol``, the certificate (the duality
        gap and its parts), the ranks, and the loss and penalty traced per iteration.

    Raises:
        ConfigError: an argument refused (named with its value), or ``newton`` with a loss without a Hessian.
        TokenError: no examples, or features whose ``||A||^2`` or objective overflows float64.
    """
    beta, loss, Y, max_iter, tol, check_every, warmup, cg_iters, fixed_lipschitz = _checked(
        head, data, Y, beta, loss, method, max_iter, tol, check_every, warmup, cg_iters, fixed_lipschitz)
    t0 = time.perf_counter()
    run = _start(head, data, Y, beta, loss, Z0, fixed_lipschitz)
    converged, it, cert, kept = _iterate(run, method, max_iter, tol, check_every, warmup, cg_iters)
    return _solution(run, method, it, converged, cert, kept, t0)


def map_back(head: Head, Z: Sequence[torch.Tensor], rtol: float = 1e-9):
    """The equivalent non-convex heads: per block, one head per singular pair above ``rtol`` (relative),
    split evenly, ``u = sqrt(sigma) U_k``, ``v = sqrt(sigma) V_k``, so that the weight decay
    ``beta/2 (||W1||^2 + ||W2||^2)`` equals ``beta sigma``, the nuclear norm's share.

    This is the map from a solution of the convex program (eq. 13) to one of the non-convex problem (eq. 12)
    in the proof of Theorem 3.1 (Appendix A.2, after eq. 52: ``W1_j = sqrt(sigma_j) vec^-1(u_j)``,
    ``W2_j = sqrt(sigma_j) vec^-1(v_j)^T``); each head's [`Head.unfactor`][convex.Head.unfactor] does the reshaping.

    Args:
        head: the convex head Z belongs to ([`convex.make_head`][convex.make_head]).
        Z: the blocks, a list of finite floating tensors of the shapes ``head.blocks()``.
        rtol: the relative threshold on the singular values (as [`rank`][convex.rank]), a finite number >= 0.

    Returns:
        A list of ``(g, W1_j, W2_j)``: the block and the non-convex head's weights, in the shapes
        [`Head.unfactor`][convex.Head.unfactor] gives (what [`Head.nonconvex`][convex.Head.nonconvex] and
        [`Head.lift`][convex.Head.lift] read).

    Raises:
        ConfigError: rtol, the head, or the blocks (finite float32 or float64 tensors) are refused.
    """
    rtol = check_number(rtol, "rtol", "nonnegative", ConfigError)
    if not isinstance(head, Head):
        raise ConfigError(f"head must be a convex.Head, got {type(head).__name__}")
    Z = [_check_matrix(z, f"map_back (block {g})") for g, z in enumerate(_blocks(head, Z, "Z"))]
    heads = []
    top = max(float(torch.linalg.svdvals(z).max()) if z.numel() else 0.0 for z in Z)
    for g, z in enumerate(Z):
        U, S, Vh = torch.linalg.svd(z, full_matrices=False)
        for k in range(int((S > rtol * top).sum()) if top > 0 else 0):
            r = math.sqrt(float(S[k]))
            heads.append((g, *head.unfactor(g, r * U[:, k], r * Vh[k])))
    return heads
