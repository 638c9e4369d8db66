"""The one majorization-minimization step: every MM layer of the framework is this function.

For an energy E = sum_k E_k (+ at most one indicator term) whose smooth terms each give, at Y, their
gradient, a per-token curvature bound c^k_u and, where it exists, the Jacobi diagonal j^k_u of their
surrogate ([`MMParts`][energies.MMParts], [`mm`][energies.EnergyTerm.mm]):

    y_u <- prox( y_u - alpha * grad_u E(Y) / P_u ),         P_u = sum_k c^k_u   (``"bound"``)
                                                            P_u = sum_k j^k_u   (``"jacobi"``)

with ``prox`` the indicator term's proximal map ([`prox`][energies.EnergyTerm.prox], ReLU for Y >= 0)
or the identity.

* ``"bound"``: a proximal gradient step on a majorizer of E in the metric diag(P) / alpha, so E never
  increases for any parameters and 0 < alpha <= 1: each concave rho replaced by its tangent at Y (the edge
  weights of the supplement's Algorithm 3, Prop. B.1) gives a quadratic surrogate Q >= E with Q(Y) = E(Y) and
  ``Q(Y') <= Q(Y) + <grad E(Y), Y' - Y> + 1/2 sum_u P_u ||y'_u - y_u||^2`` (the bounds c^k_u cover the
  surrogate's Hessian), ``prox`` is a projection in every diagonal metric (ReLU as a proximal step, Thm 5.1),
  so E(Y') <= Q(Y') <= Q(Y) = E(Y): [`ProxMMStep`][unfold.ProxMMStep], the guaranteed encoder, the PyG conv's
  metric form.
* ``"jacobi"``: the Jacobi step of the attention surrogate, P_u = 1 + sum_v gamma_uv (supplement eq. 36-37,
  Algorithm 3): on E1 = pairwise + residual it is ``y_u + alpha (sum_v gamma_uv (y_v - y_u) + b_u - y_u) /
  (1 + deg_u)``, and E1 never increases for 0 < alpha <= 1 (Theorem B.2, Prop. B.1):
  [`AttentionStep`][unfold.AttentionStep] (``update="exact"``) and the PyG conv's exact form.

The step is formed from the gradient, a difference-only quantity, so a fixed point stays exactly fixed.
The terms' values at Y come from the same passes when asked for (``values=True``). No host read happens
here: what the terms' passes read is their own business (the precision guard,
[`PairwiseAttention.guard`][energies.PairwiseAttention.guard]).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, NamedTuple, Tuple

import torch

from energies.energy import Energy
from energies.checks import check_number
from energies.errors import StepError
from energies.graphs import TokenGraph, check_tokens

__all__ = ["PRECONDITIONERS", "MMStepResult", "mm_direction", "mm_step"]

PRECONDITIONERS = ("bound", "jacobi")


class MMStepResult(NamedTuple):
    """What [`mm_step`][unfold.mm_step] returns: the step ``y_u <- prox(y_u - alpha * grad_u E(Y) / P_u)`` and, from the
    same passes, the energy and curvature at its input.

    Attributes:
        Y: the step's output ``(B, n, d)`` (padded slots as in the input).
        values: each term's value at the input, float64 (empty unless asked).
        curvature: ``(B, n)``: sum_k c^k_u at the input (the tolerance's resolution uses it).
    """

    Y: torch.Tensor
    values: "OrderedDict[str, torch.Tensor]"
    curvature: torch.Tensor


def mm_direction(energy: Energy, Y: torch.Tensor, graph: TokenGraph, preconditioner: str = "bound",
                 values: bool = False, validate: bool = True) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], torch.Tensor]:
    """The preconditioned descent direction ``-grad E(Y) / P`` of the module docstring (before the step size alpha
    and the prox), P_u = sum_k c^k_u (``bound``) or sum_k j^k_u (``jacobi``, supplement eq. 36-37).

    Args:
        energy: E, a sum of terms (indicator terms give no direction; their values are still read when asked).
        Y: the tokens ``(B, n, d)``.
        graph: the token graph of the batch.
        preconditioner: ``bound`` or ``jacobi`` ([`PRECONDITIONERS`][unfold.PRECONDITIONERS]).
        values: also return each term's value at Y, from the same passes.
        validate: check ``preconditioner``, the energy's type and the tokens ([`check_tokens`][energies.check_tokens],
            one host read); False for a step that checked them at its construction.

    Returns:
        ``(direction, values, c)``: the direction ``(B, n, d)``, the terms' values at Y (float64; empty unless
        asked) and the summed curvature bound c ``(B, n)``.

    Raises:
        StepError: an unknown preconditioner; with ``jacobi``, a smooth term that has no Jacobi diagonal (a learned
            metric), named.
    """
    if validate:
        check_preconditioner(preconditioner)
        if not isinstance(energy, Energy):
            raise StepError(f"energy must be an Energy, got {type(energy).__name__}")
        Y = check_tokens(Y, graph)
    grad = None
    curv = torch.zeros(Y.shape[:2], dtype=Y.dtype, device=Y.device)
    precond = torch.zeros(Y.shape[:2], dtype=Y.dtype, device=Y.device)
    vals: Dict[str, torch.Tensor] = OrderedDict()
    for name, term, parts in _term_parts(energy, Y, graph, values):
        if term.is_indicator:
            if values:
                vals[name] = term.value(Y, graph)
            continue
        grad = parts.grad if grad is None else grad + parts.grad
        curv = curv + parts.curvature
        if preconditioner == "bound":
            precond = precond + parts.curvature
        elif parts.jacobi is None:
            raise StepError(f"term {name!r} ({type(term).__name__}) has no Jacobi diagonal (a learned metric); "
                            "use the 'bound' preconditioner")
        else:
            precond = precond + parts.jacobi
        if values:
            vals[name] = parts.value
    if grad is None:                               # no smooth term (an energy of indicators only)
        grad = torch.zeros_like(Y)
    return grad / (-precond)[..., None], vals, curv      # the sign on the (B, n) divisor: one pass less over Y


def _term_parts(energy: Energy, Y: torch.Tensor, graph: TokenGraph, values: bool):
    """``(name, term, MMParts or None)`` for every term in order; consecutive smooth terms of one class are offered
    to that class's [`joint_mm`][energies.EnergyTerm.joint_mm] (the heads of a multi-head energy: one kernel call),
    the others (and those it declines) to their own [`mm`][energies.EnergyTerm.mm]."""
    for group in energy.groups():
        terms = [t for _, t in group]
        if terms[0].is_indicator:
            yield group[0][0], terms[0], None
            continue
        joint = type(terms[0]).joint_mm(terms, Y, graph, values) if len(terms) > 1 else None
        for (name, term), parts in zip(group, joint if joint is not None else [t.mm(Y, graph, values) for t in terms]):
            yield name, term, parts


def mm_step(energy: Energy, Y: torch.Tensor, graph: TokenGraph, alpha: float = 1.0, preconditioner: str = "bound",
            values: bool = False, validate: bool = True) -> MMStepResult:
    """One MM step ``y_u <- prox(y_u - alpha * grad_u E(Y) / P_u)`` (module docstring); padded slots keep their input.

    Args:
        energy: E, a sum of terms with at most one indicator (its prox closes the step).
        Y: the tokens ``(B, n, d)``.
        graph: the token graph of the batch.
        alpha: the step size; E never increases for 0 < alpha <= 1.
        preconditioner: ``bound`` (P_u = sum_k c^k_u, any parameters) or ``jacobi`` (the attention surrogate's
            diagonal, supplement eq. 36-37).
        values: also return each term's value at Y, from the same passes.
        validate: check ``alpha``, ``preconditioner``, the energy's type and the tokens
            ([`check_tokens`][energies.check_tokens]: shape, graph, finite real tokens: one host read); False for a step
            that checked them at its construction (its forward then checks nothing).

    Returns:
        An [`MMStepResult`][unfold.MMStepResult]: the new tokens, the terms' values at Y (float64; empty unless asked)
        and the curvature sum ``(B, n)`` at Y.

    Raises:
        StepError: ``alpha`` not a finite number > 0, an unknown preconditioner, or (``jacobi``) a smooth term
            without a Jacobi diagonal. With ``validate``: a StepError for an energy that is not an Energy; a
            [`TokenError`][energies.TokenError] / GraphError for tokens or a graph that
            [`check_tokens`][energies.check_tokens] refuses.
    """
    if validate:
        alpha = check_number(alpha, "alpha", "positive", StepError)
        Y = check_tokens(Y, graph)
    direction, vals, curv = mm_direction(energy, Y, graph, preconditioner, values, validate)
    out = Y + alpha * direction
    for term in energy.terms.values():
        if term.is_indicator:
            out = term.prox(out, graph)
    return MMStepResult(graph.keep_padded(out, Y), vals, curv)


def check_preconditioner(preconditioner) -> str:
    """``preconditioner`` if it is one of [`PRECONDITIONERS`][unfold.PRECONDITIONERS], else a StepError naming it and
    the valid ones."""
    if not isinstance(preconditioner, str) or preconditioner not in PRECONDITIONERS:
        raise StepError(f"unknown preconditioner {preconditioner!r}; valid: {list(PRECONDITIONERS)}")
    return preconditioner
