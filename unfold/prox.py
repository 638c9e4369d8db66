"""A majorized proximal step that descends a whole energy for ANY parameter values.

For an energy E = sum_k E_k + indicator(Y >= 0) whose smooth terms each give a per-token curvature
bound c^k_u on the Hessian of their MM surrogate (concave parts replaced by tangents, e.g. rho in
the attention terms, -r||y|| in the LayerNorm rescaling term):

    Q(Y') <= Q(Y) + <grad E(Y), Y' - Y> + 1/2 sum_u c_u ||y'_u - y_u||^2,   c_u = sum_k c^k_u,

so the step

    y_u <- ReLU( y_u - alpha * grad_u E(Y) / c_u ),   0 < alpha <= 1,

is a proximal gradient step on a majorizer of E in the metric diag(c) / alpha (ReLU is the
projection onto the orthant in any diagonal metric), and E(Y') <= E(Y): whatever W, S, B, tau.
For the attention energy with heads W_h, a residual and a symmetric feed-forward map S, the
surrogate's Hessian is ``H = sum_h L_h (x) W_h W_h^T + I + S`` with L_h the graph Laplacian of the
tangent weights rho'(z_uv); a Laplacian satisfies ``L <= 2 D`` (D its weighted degrees), so H is
bounded by the per-token c_u = sum_h 2 deg_h(u) ||W_h||^2 + 1 + max(lambda_max(S), 0),
deg_h(u) = sum_v rho'(z_uv) the weighted degree, or rho'(0) times the plain degree (a larger bound,
constant in Y) for attention terms built with ``curvature="constant"``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Tuple

import torch

from energies.energy import Energy
from energies.errors import StepError
from energies.graphs import TokenGraph

from . import mm as _mm
from .steps import Step, check_alpha, check_energy, register_step

__all__ = ["ProxMMStep"]


@register_step("prox_mm")
class ProxMMStep(Step):
    """``Y <- prox( Y - alpha grad E(Y) / c(Y) )`` with the curvature bound c of every smooth term: the
    ``"bound"`` form of [`unfold.mm.mm_step`][unfold.mm_step], the one definition of the MM step.

    Guarantee: E never increases, for any parameter values, when 0 < alpha <= 1 (module docstring).
    The energy's value at Y is read off the same pass that computes the step
    ([`step_with_energy`][unfold.ProxMMStep.step_with_energy]).

    Args:
        energy: E, an [`Energy`][energies.Energy] with at most one indicator term, whose smooth terms' curvature
            bounds sum to a positive bound on every token (a Residual, Centering or Rescaling term).
        alpha: the step size, in (0, 1].
    """

    guarantee = "E never increases for any parameters when 0 < alpha <= 1 (majorized proximal step)"

    def __init__(self, energy: Energy, alpha: float = 1.0):
        super().__init__()
        self.energy = check_energy(energy, "ProxMMStep")
        self.alpha = check_alpha(alpha)
        ind = [n for n, t in energy.terms.items() if t.is_indicator]
        if len(ind) > 1:
            raise StepError(f"ProxMMStep supports one indicator term, got {ind}")
        self.indicator = ind[0] if ind else None
        if not sum(t.min_curvature() for t in energy.terms.values() if not t.is_indicator) > 0:
            raise StepError("ProxMMStep needs a curvature bound that is positive on every token for every Y: add a "
                            "Residual term (or Centering / Rescaling)")

    def guaranteed(self) -> bool:
        return 0.0 < self.alpha <= 1.0

    def step_with_energy(self, Y: torch.Tensor, graph: TokenGraph, values: bool = True
                         ) -> Tuple[torch.Tensor, "OrderedDict[str, torch.Tensor]"]:
        """``(Y', values)``: the step from Y and every term's value at Y (float64, per example); with
        ``values=False`` no energy is evaluated and the dict is empty."""
        out, vals, _ = self.step_with_trace(Y, graph, values)
        return out, vals

    def step_with_trace(self, Y: torch.Tensor, graph: TokenGraph, values: bool = True):
        """``(Y', values, c)``: [`step_with_energy`][unfold.ProxMMStep.step_with_energy] and the curvature bound c
        ``(B, n)`` of the step (the descent tolerance's resolution at Y uses it, `unfold.trace.resolution`)."""
        return _mm.mm_step(self.energy, Y, graph, self.alpha, "bound", values, validate=False)

    def update(self, Y, graph):
        return self.step_with_energy(Y, graph, values=False)[0]
