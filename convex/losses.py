"""Losses of the convex heads and their convex conjugates (for the duality gap).

A loss is the mean over N examples, ``l(R) = (1/N) sum_i ell(R_i, Y_i)``, of pooled outputs
``R`` ``(N, c)`` against targets ``Y`` ``(N, c)`` (one-hot or soft labels). For ``V = t grad l(R)``
(``t`` in [0, 1]) the conjugate is ``l*(V) = (1/N) sum_i ell*(t g_i)`` with ``g_i = N grad_i``:

* squared, ``ell = 1/2 ||r - y||^2``:  ``ell*(g) = 1/2 ||g||^2 + <g, y>``;  curvature 1;
* softmax cross-entropy, ``ell = logsumexp(r) - <y, r>``:  ``ell*(g) = sum_k q_k log q_k`` with
  ``q = y + g`` in the simplex (``q = (1 - t) y + t softmax(r)`` here, always feasible); curvature 1/2
  (the Hessian diag(p) - p p^T of logsumexp has spectral norm <= 1/2).

``hess(R, dR, Y)`` is the Hessian of l applied to a direction, ``(1/N) nabla^2 ell(R_i) dR_i`` per row (the
solver's Newton steps need it; a loss without it can still be solved by ``fista`` and ``pg``).
"""
from __future__ import annotations



import torch

from energies.errors import ConfigError
from energies.registry import Registry

__all__ = ["Loss", "SquaredLoss", "CrossEntropyLoss", "LOSSES", "get_loss", "register_loss"]


class Loss:
    name = "loss"
    #: bound on the Hessian of ell in its output (the step size is 1 / (curvature ||A||^2 / N))
    curvature = 1.0

    def targets(self, Y, N: int, c: int, like: torch.Tensor) -> torch.Tensor:
        """The targets as a finite ``(N, c)`` tensor of ``like``'s dtype and device, from either integer class
        labels ``(N,)`` in ``[0, c)`` (one-hot) or a floating ``(N, c)`` matrix; a [`ConfigError`][energies.ConfigError]
        names what is wrong (a label out of range, NaN or Inf, the wrong shape)."""
        if not isinstance(Y, torch.Tensor):
            raise ConfigError(f"targets must be a tensor: labels (N={N},) or a matrix (N={N}, c={c}), "
                              f"got {type(Y).__name__}")
        if Y.dtype == torch.bool or Y.dtype.is_complex:
            raise ConfigError(f"targets must be integer labels or a floating matrix, got dtype {Y.dtype}")
        if not Y.dtype.is_floating_point:          # class labels
            if Y.shape != (N,):
                raise ConfigError(f"target labels must be (N={N},), got {tuple(Y.shape)}")
            if N and (int(Y.min()) < 0 or int(Y.max()) >= c):
                bad = int(((Y < 0) | (Y >= c)).nonzero()[0, 0])
                raise ConfigError(f"target labels must be integers in [0, {c}), got {int(Y[bad])} at example {bad}")
            return torch.nn.functional.one_hot(Y.long(), c).to(like)
        if Y.shape != (N, c):
            raise ConfigError(f"targets must be (N={N}, c={c}), got {tuple(Y.shape)}")
        if not bool(torch.isfinite(Y).all()):
            i = int((~torch.isfinite(Y)).any(-1).nonzero()[0, 0])
            raise ConfigError(f"targets hold NaN or Inf (example {i})")
        return self._check_values(Y.to(like))

    def _check_values(self, Y: torch.Tensor) -> torch.Tensor:
        return Y

    def value(self, R: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def grad(self, R: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``d l / d R`` (includes the 1/N of the mean)."""
        raise NotImplementedError

    def dual_value(self, R: torch.Tensor, Y: torch.Tensor, t: float) -> torch.Tensor:
        """``-l*(t grad l(R))``: the dual objective at the scaled dual point."""
        raise NotImplementedError

    def hess(self, R: torch.Tensor, dR: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        """``d/de grad l(R + e dR)`` at e = 0: the Hessian of l applied to ``dR`` (includes the 1/N)."""
        raise NotImplementedError


LOSSES: Registry = Registry("loss", ConfigError, "name", "convex.losses.LOSSES")
register_loss = LOSSES.register


@register_loss("squared")
class SquaredLoss(Loss):
    curvature = 1.0

    def value(self, R, Y):
        return 0.5 * ((R - Y) ** 2).sum() / R.shape[0]

    def grad(self, R, Y):
        return (R - Y) / R.shape[0]

    def dual_value(self, R, Y, t):
        g = t * (R - Y)
        return -(0.5 * (g * g).sum(-1) + (g * Y).sum(-1)).mean()

    def hess(self, R, dR, Y):
        """``dR / N`` (the Hessian of 1/2 ||r - y||^2 is the identity)."""
        return dR / R.shape[0]


@register_loss("cross_entropy")
class CrossEntropyLoss(Loss):
    curvature = 0.5
    #: how far a target row may be from the probability simplex (rounding of soft labels)
    SIMPLEX_TOL = 1e-9

    def _check_values(self, Y):
        """Cross-entropy targets are distributions over the classes (one-hot or soft labels): the conjugate
        (and so the duality gap) is only defined there."""
        off = (Y < -self.SIMPLEX_TOL).any(-1) | ((Y.sum(-1) - 1.0).abs() > self.SIMPLEX_TOL * Y.shape[-1])
        if bool(off.any()):
            i = int(off.nonzero()[0, 0])
            raise ConfigError(f"cross-entropy targets must be probability rows (one-hot or soft labels, >= 0, "
                              f"summing to 1); example {i} is {[round(float(v), 6) for v in Y[i][:8]]}")
        return Y

    def value(self, R, Y):
        return (torch.logsumexp(R, -1) - (Y * R).sum(-1)).mean()

    def grad(self, R, Y):
        return (torch.softmax(R, -1) - Y) / R.shape[0]

    def dual_value(self, R, Y, t):
        q = (1.0 - t) * Y + t * torch.softmax(R, -1)
        return -torch.special.xlogy(q, q).sum(-1).mean()

    def hess(self, R, dR, Y):
        """``(diag(p) - p p^T) dR_i / N`` per row, ``p = softmax(R_i)`` (the Hessian of logsumexp)."""
        p = torch.softmax(R, -1)
        return (p * dR - p * (p * dR).sum(-1, keepdim=True)) / R.shape[0]


def get_loss(name) -> Loss:
    """The loss of the convex program ``l(A(Z))`` by name (``LOSSES``): the mean over examples of ``ell``, with
    its conjugate for the duality gap (module docstring; the dual of eq. 38 reads ``l*``).

    Args:
        name: ``squared`` or ``cross_entropy`` (any name in ``LOSSES``), or a `Loss`, returned as it is.

    Returns:
        A `Loss`: a new instance of the registered class, or ``name`` itself when it is one.

    Raises:
        ConfigError: an unknown name (the valid ones listed).
    """
    if isinstance(name, Loss):
        return name
    return LOSSES.lookup(name)()
