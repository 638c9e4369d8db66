"""Unrolling steps into layers, and the energy trace that checks monotone descent.

An unrolled model is an iterator over steps (:func:`unroll`). :func:`trace_descent` runs it and
records, per example, per layer and per energy term, the float64 energy before and after every
layer (and every sub-step of a :class:`~unfold.steps.Sequence`), then flags each step whose total
energy went up by more than a tolerance tied to the dtype and the energy's size:

    increase at layer t  <=>  E(Y_{t+1}) > E(Y_t) + tol_t,
    tol_t = tol_factor * eps(dtype of Y) * max(sum_k |E_k(Y_t)|, 1e-300).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence as Seq, Tuple, Union

import torch

from energies.energy import Energy
from energies.graph import TokenGraph, check_tokens
from energies.terms import ACCUM_DTYPE

from .steps import Step

__all__ = ["unroll", "trace_descent", "report_from_values", "DescentReport", "tolerance", "DEFAULT_TOL_FACTOR"]

DEFAULT_TOL_FACTOR = 64.0

Steps = Union[Step, Seq[Step]]


def _layers(steps: Steps, layers: Optional[int]) -> List[Step]:
    if isinstance(steps, Step):
        if layers is None:
            raise ValueError("layers is required with a single (weight-shared) step")
        return [steps] * int(layers)
    steps = list(steps)
    if layers is not None and layers != len(steps):
        raise ValueError(f"got {len(steps)} untied steps but layers={layers}")
    return steps


def unroll(steps: Steps, Y: torch.Tensor, graph: TokenGraph, layers: Optional[int] = None
           ) -> Iterator[Tuple[int, torch.Tensor]]:
    """Yield ``(t, Y_t)`` for t = 0..T: a shared step repeated ``layers`` times, or untied steps."""
    Y = check_tokens(Y, graph)
    yield 0, Y
    for t, step in enumerate(_layers(steps, layers), start=1):
        Y = step(Y, graph)
        yield t, Y


def tolerance(values: Dict[str, torch.Tensor], dtype: torch.dtype, factor: float = DEFAULT_TOL_FACTOR
              ) -> torch.Tensor:
    """``factor * eps(dtype) * sum_k |E_k|`` per example (infinite terms left out of the scale)."""
    scale = torch.zeros_like(next(iter(values.values())))
    for v in values.values():
        scale = scale + torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
    return factor * torch.finfo(dtype).eps * scale.clamp_min(1e-300)


def _change(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``after - before``, with +inf -> +inf counted as no change (an indicator that stays infeasible)."""
    return torch.where(torch.isinf(before) & torch.isinf(after), torch.zeros_like(before), after - before)


def _increase(before: torch.Tensor, after: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """``after > before + tol``; +inf -> +inf is no increase, finite -> +inf is one."""
    return _change(before, after) > tol


def _total(values: Dict[str, torch.Tensor]) -> torch.Tensor:
    out = torch.zeros_like(next(iter(values.values())))
    for v in values.values():
        out = out + v
    return out


@dataclass
class DescentReport:
    """What the energy did at every step. Tensors are float64 with a leading example axis S.

    ``terms[name]``: ``(S, T+1)`` term values at every layer boundary (for untied steps with
    different energies, the value of each layer's energy before it and, last, after the final layer);
    ``before``/``after``: ``(S, T)`` total energy of layer t's own energy before and after it;
    ``tol``: ``(S, T)``; ``increases``: ``(S, T)`` bool; ``term_increases[name]``: ``(S, T)`` bool;
    ``violations``: one dict per flagged layer or sub-step, saying where and by how much.
    """

    terms: Dict[str, torch.Tensor]
    before: torch.Tensor
    after: torch.Tensor
    tol: torch.Tensor
    increases: torch.Tensor
    term_increases: Dict[str, torch.Tensor]
    term_delta: Dict[str, torch.Tensor]
    tol_rule: str
    guaranteed: List[bool]
    violations: List[dict] = field(default_factory=list)
    substep_increases: int = 0
    #: tol = tol_unit * sum_k |E_k(Y_t)|, tol_unit = tol_factor * eps(dtype)
    tol_unit: float = 1.0

    @property
    def totals(self) -> torch.Tensor:
        """``(S, T+1)``: E(Y_0), ..., E(Y_T) (each layer's own energy; identical for shared steps)."""
        return torch.cat([self.before, self.after[:, -1:]], dim=1)

    @property
    def steps(self) -> int:
        return int(self.increases.numel())

    @property
    def num_increases(self) -> int:
        return int(self.increases.sum())

    def rel_increase(self) -> torch.Tensor:
        """``max(E_{t+1} - E_t, 0) / max(|E_t|, |E_{t+1}|, sum_k |E_k(Y_t)|)`` per step, ``(S, T)``: relative
        to the energy's size, so that a total at or near zero (terms cancelling, or an initial residual
        term that starts at 0) does not make it meaningless."""
        diff = _change(self.before, self.after)
        after = torch.where(torch.isfinite(self.after), self.after.abs(), torch.zeros_like(self.after))
        size = torch.maximum(torch.maximum(self.before.abs(), after), self.tol / self.tol_unit).clamp_min(1e-300)
        return diff.clamp_min(0.0) / size

    def max_rel_increase(self) -> float:
        r = self.rel_increase()
        return float(r.max()) if r.numel() else 0.0

    def summary(self) -> dict:
        """JSON-ready dict (non-finite numbers as the strings 'inf', '-inf', 'nan')."""
        tot = self.totals
        out = {
            "steps": self.steps,
            "increases": self.num_increases,
            "max_rel_increase": self.max_rel_increase(),
            "tol_rule": self.tol_rule,
            "max_tol": float(self.tol.max()) if self.tol.numel() else 0.0,
            "energy_first": tot[:, 0].tolist(),
            "energy_last": tot[:, -1].tolist(),
            "energies": tot.tolist(),
            "guaranteed": all(self.guaranteed),
            "terms": {
                name: {
                    "first": v[:, 0].tolist(),
                    "last": v[:, -1].tolist(),
                    "increases": int(self.term_increases[name].sum()) if name in self.term_increases else None,
                    "max_increase": _max_pos(self.term_delta.get(name)),
                    "energies": v.tolist(),
                }
                for name, v in self.terms.items()
            },
            "substep_increases": self.substep_increases,
            "violations": self.violations[:20],
        }
        return _json_safe(out)


def _max_pos(x: Optional[torch.Tensor]) -> Optional[float]:
    if x is None:
        return None
    return float(x.clamp_min(0).max()) if x.numel() else 0.0


def _json_safe(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _eval(energy: Energy, Y: torch.Tensor, graph: TokenGraph) -> Dict[str, torch.Tensor]:
    with torch.no_grad():
        return dict(energy.term_values(Y, graph))


def trace_descent(steps: Steps, Y: torch.Tensor, graph: TokenGraph, layers: Optional[int] = None,
                  tol_factor: float = DEFAULT_TOL_FACTOR, substeps: bool = True
                  ) -> Tuple[torch.Tensor, DescentReport]:
    """Run the unrolled steps from ``Y`` and trace every layer's energy.

    ``steps``: one :class:`Step` shared over ``layers`` layers, or a list of untied steps.
    ``substeps``: also evaluate the layer's energy after each sub-step of a Sequence, so that a
    violation names the sub-step that raised it (layer-level counts are unaffected).
    Returns ``(Y_T, report)``. A diagnostic: it runs without autograd (use :func:`unroll` to train).
    """
    Y = check_tokens(Y, graph)
    plan = _layers(steps, layers)
    pairs: List[Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]] = []
    violations: List[dict] = []
    sub_incs = 0
    after: Optional[Dict[str, torch.Tensor]] = None
    prev_energy: Optional[Energy] = None
    for t, step in enumerate(plan):
        energy = step.energy
        before = after if (after is not None and energy is prev_energy) else _eval(energy, Y, graph)
        subs = step.substeps() if substeps else [step]
        with torch.no_grad():
            if len(subs) > 1:
                tol = tolerance(before, Y.dtype, tol_factor)
                vals_cur = before
                for k, sub in enumerate(subs):
                    Y_next = graph.keep_padded(sub.update(Y, graph), Y)
                    vals_next = _eval(energy, Y_next, graph)
                    inc = _increase(_total(vals_cur), _total(vals_next), tol)
                    sub_incs += int(inc.sum())
                    for s in inc.nonzero().reshape(-1).tolist():
                        violations.append(_violation(s, t, k, type(sub).__name__, vals_cur, vals_next, tol, "substep"))
                    Y, vals_cur = Y_next, vals_next
                after = vals_cur
            else:
                Y = step(Y, graph)
                after = _eval(energy, Y, graph)
        pairs.append((before, after))
        prev_energy = energy
    report = _assemble(pairs, Y.dtype, tol_factor, [s.guaranteed() for s in plan], graph.batch_size, Y.device,
                       [type(s).__name__ for s in plan], violations, sub_incs)
    return Y, report


def _violation(sample: int, layer: int, sub: Optional[int], step_name: str, before: Dict[str, torch.Tensor],
               after: Dict[str, torch.Tensor], tol: torch.Tensor, level: str) -> dict:
    b, a = float(_total(before)[sample]), float(_total(after)[sample])
    terms = {k: {"before": float(before[k][sample]), "after": float(after[k][sample])} for k in before}
    rose = [k for k, v in terms.items() if v["after"] > v["before"]]
    return {"level": level, "sample": sample, "layer": layer, "substep": sub, "step": step_name,
            "before": b, "after": a, "increase": a - b, "rel_increase": (a - b) / max(abs(b), 1e-300),
            "tol": float(tol[sample]), "terms_up": rose, "terms": terms}


def report_from_values(values: Dict[str, torch.Tensor], dtype: torch.dtype, tol_factor: float = DEFAULT_TOL_FACTOR,
                       guaranteed: bool = False) -> DescentReport:
    """A :class:`DescentReport` from stored term values ``{name: (S, T+1)}`` of one energy at Y_0..Y_T
    (as returned by :class:`~unfold.model.UnfoldedTransformer`), with the same tolerance rule."""
    first = next(iter(values.values()))
    S, T1 = first.shape
    cols = [{k: v[:, t] for k, v in values.items()} for t in range(T1)]
    pairs = list(zip(cols[:-1], cols[1:]))
    return _assemble(pairs, dtype, tol_factor, [guaranteed] * (T1 - 1), S, first.device, ["layer"] * (T1 - 1))


def _assemble(pairs, dtype: torch.dtype, tol_factor: float, guaranteed: List[bool], S: int, device,
              step_names: List[str], violations: Optional[List[dict]] = None, sub_incs: int = 0) -> DescentReport:
    """The report of layers whose energies before and after are ``pairs[t] = (before, after)``."""
    violations = list(violations or [])
    befores, afters, tols, incs = [], [], [], []
    term_incs: Dict[str, List[torch.Tensor]] = {}
    term_deltas: Dict[str, List[torch.Tensor]] = {}
    for t, (vb, va) in enumerate(pairs):
        tol = tolerance(vb, dtype, tol_factor)
        b, a = _total(vb), _total(va)
        inc = _increase(b, a, tol)
        for s in inc.nonzero().reshape(-1).tolist():
            violations.append(_violation(s, t, None, step_names[t], vb, va, tol, "layer"))
        befores.append(b); afters.append(a); tols.append(tol); incs.append(inc)
        for k, v in vb.items():
            term_incs.setdefault(k, []).append(_increase(v, va[k], tol))
            term_deltas.setdefault(k, []).append(_change(v, va[k]))

    def stack(xs, dt=ACCUM_DTYPE):
        return torch.stack(xs, dim=1) if xs else torch.zeros(S, 0, dtype=dt, device=device)

    boundary = [vb for vb, _ in pairs] + [pairs[-1][1]] if pairs else []
    names = list(dict.fromkeys(k for vals in boundary for k in vals))
    nan = torch.full((S,), math.nan, dtype=ACCUM_DTYPE, device=device)
    full = len(pairs)
    return DescentReport(
        terms={k: stack([vals.get(k, nan) for vals in boundary]) for k in names},
        before=stack(befores), after=stack(afters), tol=stack(tols), increases=stack(incs, torch.bool),
        term_increases={k: stack(v, torch.bool) for k, v in term_incs.items() if len(v) == full},
        term_delta={k: stack(v) for k, v in term_deltas.items() if len(v) == full},
        tol_rule=_tol_rule(tol_factor, dtype), guaranteed=guaranteed, violations=violations,
        substep_increases=sub_incs, tol_unit=tol_factor * torch.finfo(dtype).eps)


def _tol_rule(tol_factor: float, dtype: torch.dtype) -> str:
    return (f"E_t+1 > E_t + tol, tol = {tol_factor:g} * eps({str(dtype).replace('torch.', '')}) * sum_k |E_k(Y_t)|"
            f" = {tol_factor * torch.finfo(dtype).eps:.3g} * scale")
