"""Composite energies: a sum of named terms that reports each term separately."""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

from .errors import EnergyError
from .graphs import TokenGraph, check_tokens
from .terms import (ACCUM_DTYPE, Centering, PassStats, EnergyTerm, FeedForward, NonNegativity, PairwiseAttention,
                    Rescaling, Residual)

__all__ = ["Energy", "attention_energy", "feedforward_energy", "layernorm_energy", "nonnegativity_energy"]


class Energy(torch.nn.Module):
    """E(Y) = sum_k E_k(Y): named terms, evaluated per example in float64 (the energies of supplement eq. 33 and
    main paper eq. 13 are such sums; each layer of an unfolded model is one MM step on one).

    ``Energy(attention=PairwiseAttention(), residual=Residual())`` or ``Energy([(name, term), ...])``.
    ``a + b`` merges two energies; a term object present in both is counted once, two different
    terms with the same name are kept apart as ``name`` and ``name@2``. The curvature bound of its MM
    surrogate is the sum of its smooth terms' bounds, ``c_u = sum_k c^k_u`` ([`curvature`][energies.Energy.curvature]).

    Args:
        terms: the terms as ``(name, term)`` pairs or a ``{name: term}`` dict, in order; None for none.
        **named: more terms by keyword, ``name=term``, after ``terms``.

    Raises:
        EnergyError: a term that is not an [`EnergyTerm`][energies.EnergyTerm], a name that is not a non-empty
            string without '.', or ``terms`` not pairs nor a dict (the message names it).
    """

    def __init__(self, terms: Union[None, Iterable[Tuple[str, EnergyTerm]], Dict[str, EnergyTerm]] = None,
                 **named: EnergyTerm):
        super().__init__()
        if isinstance(terms, dict):
            items = list(terms.items())
        elif terms is None:
            items = []
        elif isinstance(terms, (str, bytes, EnergyTerm)) or not isinstance(terms, Iterable):
            raise EnergyError(f"energy terms must be (name, term) pairs or a {{name: term}} dict, got "
                              f"{type(terms).__name__}")
        else:
            items = list(terms)
        for item in items:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise EnergyError(f"energy terms must be (name, term) pairs, got {type(item).__name__} {item!r:.80}")
        items += list(named.items())
        self.terms = torch.nn.ModuleDict()
        for name, term in items:
            self._add(name, term)

    def _add(self, name: str, term: EnergyTerm) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise EnergyError(f"energy term name must be a non-empty string without '.', got {name!r}")
        if not isinstance(term, EnergyTerm):
            raise EnergyError(f"energy term {name!r} must be an EnergyTerm, got {type(term).__name__}")
        if any(t is term for t in self.terms.values()):
            return
        base, k = name, 1
        while name in self.terms:
            k += 1
            name = f"{base}@{k}"
        self.terms[name] = term

    def __add__(self, other: "Energy") -> "Energy":
        out = Energy(list(self.terms.items()))
        for name, term in other.terms.items():
            out._add(name, term)
        return out

    @property
    def names(self):
        return list(self.terms.keys())

    def groups(self) -> List[List[Tuple[str, EnergyTerm]]]:
        """The ``(name, term)`` pairs in order, consecutive smooth terms of one class together (the runs that class's
        [`joint_mm`][energies.EnergyTerm.joint_mm] / ``joint_pass_values`` may serve in one pass, such as the
        attention heads of a multi-head energy), each indicator alone."""
        out: List[List[Tuple[str, EnergyTerm]]] = []
        for name, term in self.terms.items():
            last = out[-1][-1][1] if out else None
            if last is not None and not term.is_indicator and not last.is_indicator and type(term) is type(last):
                out[-1].append((name, term))
            else:
                out.append([(name, term)])
        return out

    def term_values(self, Y: torch.Tensor, graph: TokenGraph) -> "OrderedDict[str, torch.Tensor]":
        """Each term's value per example, ``{name: (B,)}``, float64."""
        Y = check_tokens(Y, graph)
        return OrderedDict((name, term.value(Y, graph)) for name, term in self.terms.items())

    def value(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """Total energy per example, ``(B,)``, float64."""
        vals = self.term_values(Y, graph)
        total = torch.zeros(graph.batch_size, dtype=ACCUM_DTYPE, device=Y.device)
        for v in vals.values():
            total = total + v
        return total

    forward = value

    def grad(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """Analytic gradient of the smooth terms (indicators contribute their zero subgradient)."""
        Y = check_tokens(Y, graph)
        g = torch.zeros_like(Y)
        for term in self.terms.values():
            g = g + term.grad(Y, graph)
        return g

    def curvature(self, Y: torch.Tensor, graph: TokenGraph):
        """``c_u = sum_k c^k_u`` over the smooth terms (scalar or ``(B, n)``): the per-token curvature bound of
        the energy's MM surrogate at Y ([`EnergyTerm.curvature`][energies.EnergyTerm.curvature]); a term without one
        counts 0."""
        c = 0.0
        for term in self.terms.values():
            if term.is_indicator:
                continue
            try:
                c = c + term.curvature(Y, graph)
            except NotImplementedError:
                continue
        return c

    def value_error(self, Y: torch.Tensor, graph: TokenGraph, values: Dict[str, torch.Tensor], curvature
                    ) -> torch.Tensor:
        """The bound (float64) on ``|sum_k pass value_k - sum_k value_k|`` at Y: the sum of the terms'
        [`value_error`][energies.EnergyTerm.value_error] (what the layers' own passes read against the independent
        evaluation), for the terms in ``values``, over statistics of Y computed once
        ([PassStats][energies.PassStats]).

        Args:
            Y: the tokens the passes read, in their dtype: ``(B, n, d)``, or ``(T+1, B, n, d)`` for several
                boundaries at once.
            graph: the token graph of the B examples.
            values: the passes' values ``{name: (B,)}`` (or ``(T+1, B)``).
            curvature: the summed per-token curvature bound of the passes at Y (scalar, ``(B, n)`` or
                ``(T+1, B, n)``).

        Returns:
            The bound per example, ``(B,)`` or ``(T+1, B)`` (+inf where a term's rounding is unknown).
        """
        stats = PassStats(Y, graph, curvature)
        err = torch.zeros(Y.shape[:-2], dtype=torch.float64, device=Y.device)
        with torch.no_grad():
            for name, v in values.items():
                err = err + self.terms[name].value_error(stats, v)
        return err

    @property
    def indicators(self):
        """Names of the indicator terms (their value +inf is legitimate: infeasible)."""
        return tuple(name for name, t in self.terms.items() if t.is_indicator)

    def describe(self) -> Dict[str, str]:
        return {name: f"{type(t).__name__}({t.describe()})" for name, t in self.terms.items()}


def attention_energy(rho="exp", tau: float = 1.0, B: Optional[torch.Tensor] = None,
                     kernel: str = "auto") -> Energy:
    """E1(Y) = sum_{{u,v} in E} tau rho(||y_u - y_v||^2 / (2 tau)) + 1/2 ||Y - B||^2 (supplement eq. 33, F.4).

    Args:
        rho: the concave penalty ([`energies.get_rho`][energies.get_rho] spec or object).
        tau: the temperature, > 0.
        B: the residual's anchor ``(n, d)`` or ``(B, n, d)``; None for ``B = 0``.
        kernel: the pairwise kernel or ``auto``.

    Returns:
        The [`Energy`][energies.Energy] with the terms ``attention`` and ``residual``.
    """
    return Energy(attention=PairwiseAttention(rho, tau, kernel), residual=Residual(B))


def feedforward_energy(W: torch.Tensor, B: Optional[torch.Tensor] = None) -> Energy:
    """E2(Y) = 1/2 tr(Y W Y^T) + 1/2 ||Y - B||^2, W symmetric (main paper eq. 13, F.4); its curvature bound is
    ``max(lambda_max(W), 0) + 1`` per token.

    Args:
        W: the symmetric weight ``(d, d)`` (checked: finite and symmetric, [`FeedForward`][energies.FeedForward]).
        B: the residual's anchor ``(n, d)`` or ``(B, n, d)``; None for ``B = 0``.

    Returns:
        The [`Energy`][energies.Energy] with the terms ``ffn`` and ``residual``.
    """
    return Energy(ffn=FeedForward(W), residual=Residual(B))


def layernorm_energy(radius: Optional[float] = None) -> Energy:
    """The two LayerNorm terms of supplement F.3: centring ``sum_u (1^T y_u)^2 / (2 d)`` and rescaling
    ``sum_u (1/2 ||y_u||^2 - r ||y_u||)``, each with curvature bound 1.

    Args:
        radius: r, > 0; None for r = sqrt(d), the norm of a LayerNorm output.

    Returns:
        The [`Energy`][energies.Energy] with the terms ``center`` and ``rescale``.
    """
    return Energy(center=Centering(), rescale=Rescaling(radius))


def nonnegativity_energy() -> Energy:
    """The ReLU term: the indicator of Y >= 0 (0 where every real entry is >= 0, else +inf), whose proximal map is
    ReLU (main paper Thm 5.1; supplement eq. 49).

    Returns:
        The [`Energy`][energies.Energy] with the one term ``relu`` ([`NonNegativity`][energies.NonNegativity]).
    """
    return Energy(relu=NonNegativity())


