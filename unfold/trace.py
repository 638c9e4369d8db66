"""Unrolling steps into layers, and the energy trace that checks monotone descent.

An unrolled model is an iterator over steps ([`unroll`][unfold.unroll]). [`trace_descent`][unfold.trace_descent] runs it
and records, per example, per layer and per energy term, the float64 energy before and after every
layer (and every sub-step of a [`Sequence`][unfold.Sequence]), and gives every step a verdict:

* **increase**: ``E(Y_{t+1}) > E(Y_t) + tol_t`` with

      tol_t = f * eps * ( sum_k |E_k(Y_t)|  +  eps * sum_u c_u ||y_u||^2 ),      eps = eps(dtype of Y),

  ``f = tol_factor`` (finite, ``MIN_TOL_FACTOR <= f <= MAX_TOL_FACTOR``, default 64). The first part is
  the rounding of the energy's own evaluation and of the step (relative to the energy's size); the
  second is the resolution of Y itself: rounding every entry of Y by ``eps |y|`` changes E by at most
  ``eps^2 sum_u c_u ||y_u||^2 / 2`` where its gradient vanishes (c_u: the MM curvature bound at Y_t,
  [`curvature`][energies.Energy.curvature]), so a step that does not move, or moves by rounding only,
  is not flagged, also at E = 0;
* **non-finite**: a term value that is NaN or -inf, or +inf on a term that is not an indicator, before
  or after the step, or a NaN difference, is a *failed* check, never a pass: such steps count as
  increases, and separately as ``nonfinite``, with the terms named. A step that turns finite tokens
  into NaN/inf is blamed on that layer (``kind: nonfinite_tokens``), not on its input.

+inf -> +inf of an indicator (infeasible before and after) is no change; finite -> +inf is an increase.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence as Seq, Tuple, Union

import numpy as np
import torch

from energies.checks import check_flag
from energies.energy import Energy
from energies.errors import StepError, TokenError
from energies.graphs import TokenGraph, check_tokens
from energies.terms import ACCUM_DTYPE

from .steps import Step
from .strict_json import json_safe

__all__ = ["unroll", "trace_descent", "report_from_values", "settle", "DescentReport", "EnergyTrace", "tol_rule", "term_values_or_nan", "tolerance", "check_tol_factor",
           "DEFAULT_TOL_FACTOR", "MIN_TOL_FACTOR", "MAX_TOL_FACTOR", "resolution", "relative_decrease", "keeps_going"]

DEFAULT_TOL_FACTOR = 64.0
#: bounds of tol_factor: below 1 the tolerance no longer covers one rounding; above 4096 it would accept a
#: rise of 4096 eps (5e-4 of the energy in float32), which no longer confirms descent
MIN_TOL_FACTOR, MAX_TOL_FACTOR = 1.0, 4096.0

Steps = Union[Step, Seq[Step]]


def check_tol_factor(factor) -> float:
    """``factor`` as a float in ``[MIN_TOL_FACTOR, MAX_TOL_FACTOR]``: f of the tolerance
    ``tol_t = f * eps * (sum_k |E_k(Y_t)| + eps * sum_u c_u ||y_u||^2)`` (module docstring).

    Args:
        factor: the candidate f, a real number (a bool, a string or bytes is refused).

    Returns:
        f as a float, finite and in ``[MIN_TOL_FACTOR, MAX_TOL_FACTOR]`` = [1, 4096].

    Raises:
        StepError: when ``factor`` is not a number, or not finite and within the bounds; the message names it.
    """
    if isinstance(factor, (bool, np.bool_, str, bytes)) or (isinstance(factor, torch.Tensor)
                                                          and factor.dtype == torch.bool):
        raise StepError(f"tol_factor must be a number, got {factor!r}")
    try:
        f = float(factor)
    except (TypeError, ValueError, RuntimeError):
        raise StepError(f"tol_factor must be a number, got {factor!r}") from None
    if not (math.isfinite(f) and MIN_TOL_FACTOR <= f <= MAX_TOL_FACTOR):
        raise StepError(f"tol_factor must be a finite number in [{MIN_TOL_FACTOR:g}, {MAX_TOL_FACTOR:g}], "
                        f"got {factor}")
    return f


def _layers(steps: Steps, layers: Optional[int]) -> List[Step]:
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise StepError(f"layers must be an integer >= 1, got {layers!r}")
    if isinstance(steps, Step):
        if layers is None:
            raise StepError("layers is required with a single (weight-shared) step")
        return [steps] * layers
    steps = list(steps)
    if not steps or not all(isinstance(s, Step) for s in steps):
        raise StepError("steps must be a Step or a non-empty list of Steps")
    if layers is not None and layers != len(steps):
        raise StepError(f"got {len(steps)} untied steps but layers={layers}")
    return steps


def unroll(steps: Steps, Y: torch.Tensor, graph: TokenGraph, layers: Optional[int] = None
           ) -> Iterator[Tuple[int, torch.Tensor]]:
    """Yield ``(t, Y_t)`` for t = 0..T, ``Y_{t+1} = step_t(Y_t)``: a shared step repeated ``layers`` times, or
    untied steps (the unrolled MM iteration of the paper's eq. 3).

    Args:
        steps: one [`Step`][unfold.Step] shared over the layers, or a list of untied steps.
        Y: the tokens ``(B, n, d)``.
        graph: the token graph of the batch (its mask marks the real tokens).
        layers: how many times a shared step runs (ignored for a list).

    Yields:
        ``(t, Y_t)``, ``Y_0`` the checked input.
    """
    Y = check_tokens(Y, graph)
    yield 0, Y
    for t, step in enumerate(_layers(steps, layers), start=1):
        Y = step(Y, graph)
        yield t, Y


def relative_decrease(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``(E_before - E_after) / max(|E_before|, tiny)`` per example (float64, ``tiny`` the smallest normal float64):
    the relative energy decrease of one layer, the quantity of the stopping rule (`keeps_going`). NaN where
    either side is NaN or both are the same infinity."""
    before, after = before.to(ACCUM_DTYPE), after.to(ACCUM_DTYPE)
    return (before - after) / before.abs().clamp_min(torch.finfo(ACCUM_DTYPE).tiny)


def keeps_going(before: torch.Tensor, after: torch.Tensor, stop_rel: float) -> torch.Tensor:
    """``(S,)`` bool, on the device (no host read): whether an example goes on to the next layer after a layer that
    took its total energy from ``before`` = E_{k-1} to ``after`` = E_k. It stops when that layer's
    `relative_decrease` is below ``stop_rel``: ``(E_{k-1} - E_k) / max(|E_{k-1}|, tiny) < stop_rel`` (an
    increase, a zero decrease, a small one); a NaN decrease does not stop it (its steps fail the verdict instead)."""
    return ~(relative_decrease(before, after) < stop_rel)


class EnergyTrace(OrderedDict):
    """``{term: (S, T+1)}`` energy values E_k(Y_0) .. E_k(Y_T) (an ordinary ordered dict of the terms), carrying
    what a report of the descent check ``E(Y_t+1) <= E(Y_t) + tol_t`` (module docstring) needs besides.

    Read by term as a dict (``trace["residual"]``; ``len``, iteration and ``items()`` over the terms) and by layer:
    ``trace[t]`` is the boundary Y_t as ``{term: (S,)}`` (negative t from the end), ``trace[a:b]`` the boundaries
    a .. b-1 as an EnergyTrace, [`layers`][unfold.EnergyTrace.layers] all T + 1 boundaries,
    [`num_layers`][unfold.EnergyTrace.num_layers] T, [`totals`][unfold.EnergyTrace.totals] the total energy
    ``(S, T+1)``; its repr shows the mean total at every boundary. Building it reads nothing back to the host;
    reading its values does.

    With an energy-chosen depth (``stop_rel``), ``ran[s, t]`` is False for the layers t an example skipped after it
    stopped -- its tokens stay those it stopped at, so its energy at Y_t+1 repeats E(Y_t) -- and a verdict leaves
    those frozen layers out: they are no steps, neither counted nor judged.

    Args:
        *args: the dict's items, as for `OrderedDict` (``[(term, (S, T+1) tensor), ...]``).
        resolution: ``(S, T+1)`` `resolution` at each Y_t, or None (the tolerance's resolution part is 0).
        indicators: names of the indicator terms (+inf legitimate on them).
        ran: ``(S, T)`` bool, the layers that ran for each example, or None (every layer ran for every example).
        exact: ``exact(t, rows=None) -> {term: (S,)}``, the terms' independent evaluation at Y_t
            ([`exact`][unfold.EnergyTrace.exact]), of the examples ``rows`` (a 1-D index tensor) only when given, or
            None.
        error: ``(S, T+1)`` float64, a bound on how far the stored values' total lies from the independent
            evaluation's at each Y_t ([`error`][unfold.EnergyTrace.error]), or None (the values are the independent
            evaluation).
        bounds: ``bounds(trace) -> (resolution, error)``, computed when either is first read, or None.
        **kw: the dict's items by keyword, as for `OrderedDict`.
    """

    def __init__(self, *args, resolution: Optional[torch.Tensor] = None, indicators: Iterable[str] = (),
                 ran: Optional[torch.Tensor] = None, exact: Optional[Callable[[int], Dict[str, torch.Tensor]]] = None,
                 error: Optional[torch.Tensor] = None,
                 bounds: Optional[Callable[["EnergyTrace"], Tuple[torch.Tensor, torch.Tensor]]] = None, **kw):
        super().__init__(*args, **kw)
        #: ``bounds(trace) -> (resolution, error)``, both ``(S, T+1)``: computed when either is first read (a verdict
        #: reads them; a forward that nobody judges does not pay for them), then dropped
        self._bounds = bounds
        self._resolution, self._error = resolution, error
        self.indicators = tuple(indicators)
        self.ran = ran
        #: ``exact(t, rows=None) -> {term: (S,)}``: every term's independent evaluation at Y_t, of the examples
        #: ``rows`` only when given (float64: explicit differences, or the guarded float64 passes for a trace judged in
        #: float32, whose rounding is 2^-29 of that trace's), or None. A verdict reads the kernels' own passes, whose energy errs
        #: by up to `error`; where those values flag a step, or lie within that error of the tolerance,
        #: `report_from_values` asks this before the step is judged (`DescentReport.rechecked`)
        self.exact = exact
        #: steps already decided by the exact evaluation (`settle`), and how many of the flagged ones it cleared
        self.rechecked = self.cleared = 0

    def _pending(self, name: str):
        bounds = self.__dict__.get("_bounds")
        if bounds is not None:
            self._bounds = None
            self._resolution, self._error = bounds(self)
        return self.__dict__.get(name)

    @property
    def resolution(self) -> Optional[torch.Tensor]:
        """``(S, T+1)``: the tolerance's resolution part at each Y_t (`resolution`), or None (0)."""
        return self._pending("_resolution")

    @resolution.setter
    def resolution(self, value: Optional[torch.Tensor]) -> None:
        self._pending("_resolution")              # what is pending is computed first, so that this value stays
        self._resolution = value

    @property
    def error(self) -> Optional[torch.Tensor]:
        """``(S, T+1)``: a bound on ``|sum_k value_k - sum_k exact_k|`` at each Y_t, the rounding of the kernels'
        passes ([`value_error`][energies.Energy.value_error]), or None. A step whose read change lies within
        ``error_t + error_t+1`` of its tolerance is decided by [`exact`][unfold.EnergyTrace.exact], so that no real rise
        above the tolerance is read as a fall."""
        return self._pending("_error")

    @error.setter
    def error(self, value: Optional[torch.Tensor]) -> None:
        self._pending("_error")              # what is pending is computed first, so that this value stays
        self._error = value

    # ---------------------------------------------------------------- reading it by layer (reading may sync)
    def _width(self) -> int:
        first = next(iter(self.values()), None)
        return 0 if first is None else first.shape[1]

    @property
    def num_layers(self) -> int:
        """T: the layers traced (the trace holds T + 1 boundaries, Y_0 the input .. Y_T the output; 0 when empty)."""
        return max(self._width() - 1, 0)

    @property
    def totals(self) -> torch.Tensor:
        """``(S, T+1)``: the total energy E(Y_t) = sum of the terms at every boundary, as stored (float64). A device
        op, no host read. [`DescentReport.totals`][unfold.DescentReport.totals] gives the same where no step was
        re-evaluated exactly."""
        if not self:
            raise StepError("an EnergyTrace with no term has no total")
        return _total(self)

    @property
    def layers(self) -> List[Dict[str, torch.Tensor]]:
        """The trace boundary by boundary: T + 1 dicts ``{term: (S,)}``, ``layers[0]`` at the input Y_0,
        ``layers[t]`` after layer t (views, nothing copied): ``trace[t]`` for every t."""
        return [self[t] for t in range(self._width())]

    def __getitem__(self, key):
        """``trace["term"]``: that term's ``(S, T+1)`` values (the dict). ``trace[t]``, an integer (negative from the
        end): the boundary Y_t, ``{term: (S,)}``. ``trace[a:b]``: the trace of boundaries a .. b-1, an EnergyTrace
        whose steps, resolution, error bound and exact evaluation are those of the steps inside it (step 1 only)."""
        if isinstance(key, str):
            return super().__getitem__(key)
        if isinstance(key, slice):
            return self._window(key)
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            return self._boundary(int(key))
        return super().__getitem__(key)

    def _boundary(self, t: int) -> Dict[str, torch.Tensor]:
        T1 = self._width()
        if not -T1 <= t < T1:
            raise IndexError(f"layer boundary {t} is out of range: the trace holds Y_0 .. Y_{T1 - 1} "
                             f"({T1 - 1} layers; negative indices count from the end)")
        return {k: v[:, t] for k, v in self.items()}

    def _window(self, key: slice) -> "EnergyTrace":
        start, stop, step = key.indices(self._width())
        if step != 1:
            raise StepError(f"a slice of an EnergyTrace takes consecutive boundaries (step 1), got step {step}: "
                            "index the boundaries one by one (trace[t]) for others")
        stop = max(stop, start)

        def cut(x, end=stop):
            return None if x is None else x[:, start:end]
        pending = self.__dict__.get("_bounds") is not None
        out = EnergyTrace([(k, cut(v)) for k, v in self.items()], indicators=self.indicators,
                          ran=cut(self.ran, max(stop - 1, start)),
                          resolution=None if pending else cut(self._resolution),
                          error=None if pending else cut(self._error),
                          bounds=(lambda _: (cut(self.resolution), cut(self.error))) if pending else None)
        if self.exact is not None:
            inner = self.exact
            out.exact = lambda t, rows=None: inner(start + t) if rows is None else inner(start + t, rows)
        return out

    def __repr__(self) -> str:
        """The terms, the examples, the layers, and the mean total energy over the examples at every boundary (a
        host read; a trace on ``meta`` shows no values)."""
        if not self:
            return "EnergyTrace()"
        first = next(iter(self.values()))
        T = self.num_layers
        text = (f"EnergyTrace(terms {list(self)}, {first.shape[0]} examples, {T} layer{'s' * (T != 1)} "
                f"(Y_0 .. Y_{T}), {first.dtype}")
        if first.device.type != "meta" and first.numel():
            mean = self.totals.mean(0).tolist()
            shown = mean if len(mean) <= 12 else mean[:6] + [None] + mean[-5:]
            text += "; mean total E(Y_t): " + " -> ".join("..." if e is None else f"{e:.4g}" for e in shown)
        return text + ")"

    @classmethod
    def from_layers(cls, values: List[Dict[str, torch.Tensor]], resolution: List[torch.Tensor],
                    indicators: Iterable[str] = (), mask: Optional[torch.Tensor] = None,
                    ran: Optional[List[torch.Tensor]] = None,
                    exact: Optional[Callable[[int], Dict[str, torch.Tensor]]] = None,
                    bounds: Optional[Callable[["EnergyTrace"], Tuple[torch.Tensor, torch.Tensor]]] = None
                    ) -> "EnergyTrace":
        """A trace from one ``{term: (S,)}`` dict and one ``(S,)`` resolution per layer boundary Y_0..Y_T.
        ``mask`` ``(S, n)``: the padding mask; an example with no real token gets NaN in every term (device ops,
        no host read), so that every one of its steps fails the verdict: a verdict over no token is no descent
        (also in what ``exact`` returns). ``ran``: one ``(S,)`` bool per layer (the class docstring), or None;
        ``exact``: [`exact`][unfold.EnergyTrace.exact]; ``bounds``: computes ``(resolution, error)`` when first read
        ([`error`][unfold.EnergyTrace.error]), in place of the resolution list."""
        names = list(values[0])
        # every term at every boundary in one stack (S, T+1, K), NaN-filled at once: each term a (S, T+1) view
        table = torch.stack([v[k] for v in values for k in names], dim=1).unflatten(1, (len(values), len(names)))
        if mask is not None:
            empty = ~mask.any(1)
            table = table.masked_fill(empty[:, None, None], math.nan)
        trace = cls([(k, table[..., i]) for i, k in enumerate(names)],   # a list: torch 2.11's dynamo could not
                    # compile a generator handed to the dict ('remaining_items')
                    resolution=torch.stack(resolution, dim=1) if resolution else None, indicators=indicators,
                    ran=torch.stack(ran, dim=1) if ran else None, bounds=bounds)
        if mask is not None:
            empty = empty[:, None]
            if exact is not None:
                inner, none = exact, empty[:, 0]

                def exact(t, rows=None):
                    vals, no = (inner(t), none) if rows is None else (inner(t, rows), none[rows])
                    return {k: v.masked_fill(no, math.nan) for k, v in vals.items()}
        trace.exact = exact
        return trace

    @classmethod
    def cat(cls, traces: List["EnergyTrace"]) -> "EnergyTrace":
        """Traces of batches joined along the example axis (on CPU)."""
        first = traces[0]
        res = [getattr(t, "resolution", None) for t in traces]
        ran = [getattr(t, "ran", None) for t in traces]      # a trace without it: every layer ran
        steps = next(iter(first.values())).shape[1] - 1
        if any(getattr(t, "exact", None) is not None for t in traces):
            raise StepError("settle() each trace before joining them: a joined trace cannot re-evaluate a flagged "
                            "step exactly")
        out = cls(((k, torch.cat([t[k].cpu() for t in traces])) for k in first),
                   resolution=None if any(r is None for r in res) else torch.cat([r.cpu() for r in res]),
                   indicators=getattr(first, "indicators", ()),
                   ran=None if all(r is None for r in ran) else torch.cat(
                       [r.cpu() if r is not None else torch.ones(next(iter(t.values())).shape[0], steps,
                                                                 dtype=torch.bool) for r, t in zip(ran, traces)]))
        out.rechecked = sum(getattr(t, "rechecked", 0) for t in traces)
        out.cleared = sum(getattr(t, "cleared", 0) for t in traces)
        return out


def settle(trace: "EnergyTrace", dtype: torch.dtype, tol_factor: float = DEFAULT_TOL_FACTOR,
           guaranteed: bool = False) -> "EnergyTrace":
    """``trace`` as its verdict reads it, for keeping beyond its forward pass (joined over batches, saved): the rows
    of every example whose kernel-read values fail a step replaced by their exact evaluation
    ([`EnergyTrace.exact`][unfold.EnergyTrace.exact], [`report_from_values`][unfold.report_from_values]), ``exact``
    dropped (the states it holds are freed), and the counts kept in ``rechecked`` / ``cleared``. A trace without
    ``exact`` comes back as it is."""
    if getattr(trace, "exact", None) is None:
        return trace
    rep = report_from_values(trace, dtype, tol_factor, guaranteed)
    out = EnergyTrace([(k, rep.terms[k].to(trace[k].dtype)) for k in trace], resolution=trace.resolution,
                      indicators=trace.indicators, ran=trace.ran)
    out.rechecked, out.cleared = rep.rechecked, rep.cleared
    return out


def resolution(energy: Energy, Y: torch.Tensor, graph: TokenGraph, curvature=None) -> torch.Tensor:
    """``sum_u c_u ||y_u||^2`` per example ``(B,)`` float64 over real tokens, c_u the energy's MM curvature bound
    at Y ([`curvature`][energies.Energy.curvature]; pass ``curvature`` when the step computed it): the
    resolution part of the tolerance before its factor ``eps^2``. Rounding Y by D (|D_u| <= eps |y_u|) raises
    E by at most ``<grad E, D> + sum_u c_u |D_u|^2 / 2`` (the surrogate majorizes E)."""
    with torch.no_grad():
        c = energy.curvature(Y, graph) if curvature is None else curvature
        norm = torch.linalg.vector_norm(Y.detach(), dim=-1)              # (B, n), no (B, n, d) intermediate
        sq = torch.where(graph.mask, norm * norm, torch.zeros((), dtype=norm.dtype, device=Y.device))
        return torch.nan_to_num((c * sq).sum(-1, dtype=ACCUM_DTYPE), nan=0.0)   # a non-finite example fails on its values


def tolerance(values: Dict[str, torch.Tensor], dtype: torch.dtype, factor: float = DEFAULT_TOL_FACTOR,
              res: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The descent check's tolerance per example: a step is an increase when ``E(Y_t+1) > E(Y_t) + tol`` with

        tol = f * eps(dtype) * (sum_k |E_k| + eps(dtype) * res),

    the rounding of a float sum of the terms (non-finite terms left out of the scale; they fail the check on their
    own).

    Args:
        values: the terms' values ``{name: tensor}`` at the step's start, one shape for all (``(S,)`` per example).
        dtype: the states' dtype (its eps).
        factor: f, the multiple ([`DEFAULT_TOL_FACTOR`][unfold.DEFAULT_TOL_FACTOR]).
        res: `resolution` at the step's start (0 when not given).

    Returns:
        The tolerances, in the values' shape.

    Raises:
        StepError: ``factor`` outside [`check_tol_factor`][unfold.check_tol_factor]'s rule, ``dtype`` not a floating
            dtype, ``values`` not a non-empty dict of floating tensors (metadata only: no host read).
    """
    factor = check_tol_factor(factor)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise StepError(f"dtype must be the floating dtype of the states, got {dtype!r}")
    if not isinstance(values, dict) or not values or not all(
            isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in values.values()):
        raise StepError("values must be a non-empty dict {term: floating tensor}")
    eps = torch.finfo(dtype).eps
    scale = torch.zeros_like(next(iter(values.values())))
    for v in values.values():
        scale = scale + torch.where(torch.isfinite(v), v.abs(), torch.zeros_like(v))
    if res is not None:
        scale = scale + eps * torch.where(torch.isfinite(res), res, torch.zeros_like(res)).to(scale)
    return factor * eps * scale


def _change(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``after - before``, with +inf -> +inf counted as no change (an indicator that stays infeasible)."""
    return torch.where(torch.isinf(before) & torch.isinf(after) & (before > 0) & (after > 0),
                       torch.zeros_like(before), after - before)


def _bad(v: torch.Tensor, indicator: bool) -> torch.Tensor:
    """Values that fail a check: NaN, -inf, and +inf unless the term is an indicator."""
    return torch.isnan(v) | (v == -math.inf) | ((v == math.inf) & (not indicator))


def _nonfinite(values: Dict[str, torch.Tensor], indicators: Iterable[str]) -> Dict[str, torch.Tensor]:
    ind = set(indicators)
    return {k: _bad(v, k in ind) for k, v in values.items()}


def _total(values: Dict[str, torch.Tensor]) -> torch.Tensor:
    out = torch.zeros_like(next(iter(values.values())))
    for v in values.values():
        out = out + v
    return out


def _side(values: Dict[str, torch.Tensor], indicators) -> Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor,
                                                              torch.Tensor]:
    """``(bad terms, any bad, infeasible, total)`` of one side of a step: a total that is not finite although
    every term is (the sum overflowed float64) is bad too; only an indicator at +inf makes +inf legitimate."""
    ind = set(indicators)
    bad = _nonfinite(values, ind)
    total = _total(values)
    infeasible = torch.zeros_like(total, dtype=torch.bool)
    for k, v in values.items():
        if k in ind:
            infeasible = infeasible | (v == math.inf)
    term_bad = torch.zeros_like(infeasible)
    for m in bad.values():
        term_bad = term_bad | m
    bad["(total)"] = ~torch.isfinite(total) & ~infeasible & ~term_bad      # finite terms, overflowing sum
    any_bad = term_bad | bad["(total)"]
    return bad, any_bad, infeasible & ~any_bad, total


def _verdict(vb: Dict[str, torch.Tensor], va: Dict[str, torch.Tensor], tol: torch.Tensor, indicators
             ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
    """``(failed, nonfinite, bad terms)`` per example: failed = rose above tol, or non-finite (a term, the total,
    the difference or the tolerance; bad terms also name ``(total)`` and ``(tolerance)``)."""
    bb, bad_b, inf_b, tb = _side(vb, indicators)
    ba, bad_a, inf_a, ta = _side(va, indicators)
    bad_terms = {k: bb[k] | ba.get(k, torch.zeros_like(bb[k])) for k in bb}
    for k in ba:
        bad_terms.setdefault(k, ba[k])
    bad_terms["(tolerance)"] = ~torch.isfinite(tol)
    change = torch.where(inf_b & inf_a, torch.zeros_like(tb), ta - tb)   # infeasible -> infeasible: no change
    nonfinite = bad_b | bad_a | torch.isnan(change) | bad_terms["(tolerance)"]
    return (change > tol) | nonfinite, nonfinite, bad_terms


@dataclass
class DescentReport:
    """What the energy did at every step: the verdict ``E(Y_t+1) <= E(Y_t) + tol_t`` of the MM descent property
    (paper, Thm. 4.1) for every example and layer, under the tolerance rule of the module docstring.

    Tensors are float64 with a leading example axis S. With an energy-chosen depth
    ([`EnergyTrace`][unfold.EnergyTrace]), a frozen layer (``ran`` False) is no step -- not counted in
    [`steps`][unfold.DescentReport.steps], never an increase nor non-finite, 0 in
    [`rel_increase`][unfold.DescentReport.rel_increase] -- while every layer that ran, the one an example stopped at
    included, is judged.

    Attributes:
        terms: ``{name: (S, T+1)}`` term values at every layer boundary (for untied steps with different energies,
            the value of each layer's energy before it and, last, after the final layer).
        before: ``(S, T)`` total energy of layer t's own energy before it.
        after: ``(S, T)`` the same after it.
        tol: ``(S, T)`` the tolerance tol_t of every step ([`tolerance`][unfold.tolerance]).
        increases: ``(S, T)`` bool, the steps that *failed* the check (rose above tol, or non-finite).
        term_increases: ``{name: (S, T)}`` bool, the same per term.
        term_delta: ``{name: (S, T)}`` each term's change over the step (+inf -> +inf counted as 0).
        tol_rule: the tolerance rule in words, with its numbers (`tol_rule`).
        guaranteed: per layer, whether its step states a descent guarantee that holds for its parameters.
        violations: one dict per failed layer or sub-step, saying where, what kind and by how much.
        substep_increases: failed sub-steps of [`Sequence`][unfold.Sequence] layers
            ([`trace_descent`][unfold.trace_descent]).
        tol_unit: ``tol_factor * eps(dtype)``: the relative part of tol is ``tol_unit * sum_k |E_k(Y_t)|``.
        nonfinite: ``(S, T)`` bool, the steps with a non-finite value or difference (None: none, set to all
            False).
        term_nonfinite: ``{name: (S, T)}`` bool, the same per term.
        ran: ``(S, T)`` bool, the layers that ran for each example (None: all).
        rechecked: steps an exact re-evaluation decided ([`EnergyTrace.exact`][unfold.EnergyTrace.exact]): those the
            kernels' own values flag, and those whose read change lies within the values' rounding bound of the
            tolerance ([`EnergyTrace.error`][unfold.EnergyTrace.error]).
        cleared: how many of those the exact values found within the tolerance (not an increase).
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
    tol_unit: float = 1.0
    nonfinite: Optional[torch.Tensor] = None
    term_nonfinite: Dict[str, torch.Tensor] = field(default_factory=dict)
    ran: Optional[torch.Tensor] = None
    rechecked: int = 0
    cleared: int = 0

    def __post_init__(self):
        if self.nonfinite is None:
            self.nonfinite = torch.zeros_like(self.increases)

    @property
    def totals(self) -> torch.Tensor:
        """``(S, T+1)``: E(Y_0), ..., E(Y_T) (each layer's own energy; identical for shared steps)."""
        return torch.cat([self.before, self.after[:, -1:]], dim=1)

    @property
    def steps(self) -> int:
        """The layer steps judged: every (example, layer) that ran (frozen layers of a stopped example are none)."""
        return int(self.increases.numel()) if self.ran is None else int(self.ran.sum())

    @property
    def frozen_steps(self) -> int:
        """(example, layer) pairs skipped after an example stopped (energy-chosen depth); 0 without a stop rule."""
        return 0 if self.ran is None else int((~self.ran).sum())

    @property
    def num_increases(self) -> int:
        """Steps that failed the check (a rise above tol, or a non-finite value): 0 means descent confirmed."""
        return int(self.increases.sum())

    @property
    def num_nonfinite(self) -> int:
        return int(self.nonfinite.sum())

    @property
    def verdict(self) -> str:
        """``descent`` (every step passed), ``increase`` or ``nonfinite`` (any non-finite step: it wins)."""
        if self.num_nonfinite:
            return "nonfinite"
        return "increase" if self.num_increases else "descent"

    def rel_increase(self) -> torch.Tensor:
        """``max(E_{t+1} - E_t, 0) / max(|E_t|, |E_{t+1}|, sum_k |E_k(Y_t)|)`` per step, ``(S, T)``: relative
        to the energy's size, so that a total at or near zero (terms cancelling, or an initial residual
        term that starts at 0) does not make it meaningless. A non-finite step counts as +inf."""
        diff = _change(self.before, self.after)
        after = torch.where(torch.isfinite(self.after), self.after.abs(), torch.zeros_like(self.after))
        before = torch.where(torch.isfinite(self.before), self.before.abs(), torch.zeros_like(self.before))
        size = torch.maximum(torch.maximum(before, after), self.tol / self.tol_unit).clamp_min(1e-300)
        rel = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff).clamp_min(0.0) / size
        rel = torch.where(self.nonfinite, torch.full_like(rel, math.inf), rel)
        return rel if self.ran is None else torch.where(self.ran, rel, torch.zeros_like(rel))

    def max_rel_increase(self) -> float:
        r = self.rel_increase()
        return float(r.max()) if r.numel() else 0.0

    def summary(self) -> dict:
        """JSON-ready dict (non-finite numbers as the strings 'inf', '-inf', 'nan': strict JSON)."""
        tot = self.totals
        out = {
            "verdict": self.verdict,
            "steps": self.steps,
            **({} if self.ran is None else {"frozen_steps": self.frozen_steps}),
            "increases": self.num_increases,
            "nonfinite": self.num_nonfinite,
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
                    "nonfinite": int(self.term_nonfinite[name].sum()) if name in self.term_nonfinite else None,
                    "max_increase": _max_pos(self.term_delta.get(name)),
                    "energies": v.tolist(),
                }
                for name, v in self.terms.items()
            },
            "substep_increases": self.substep_increases,
            "violations": self.violations[:20],
        }
        return json_safe(out)


def _max_pos(x: Optional[torch.Tensor]) -> Optional[float]:
    if x is None:
        return None
    return float(x.clamp_min(0).max()) if x.numel() else 0.0


def _nonfinite_examples(Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
    """``(B,)`` bool: examples with a non-finite real token (padded slots may hold anything)."""
    return ~(torch.isfinite(Y) | ~graph.mask[..., None]).flatten(1).all(1)


def term_values_or_nan(energy: Energy, Y: torch.Tensor, graph: TokenGraph, explicit: Union[bool, str] = False
                       ) -> Dict[str, torch.Tensor]:
    """Every term's value at Y ``{name: (B,)}``; an example whose real tokens are not all finite gets NaN in
    every term (where [`Energy.term_values`][energies.Energy.term_values] would refuse the whole batch). ``explicit``: a
    term that has an ``explicit_value`` (the pairwise term: explicit differences of its features, exact to rounding at
    any scale in Y's dtype, at a fraction of ``value``'s cost with a metric) is evaluated by it; ``"pass"``: every term
    by its own pass in Y's dtype (for float64 tokens: the guarded float64 kernels, within their rounding bound
    ``value_error``)."""
    dead = _nonfinite_examples(Y, graph)
    return _eval(energy, torch.where(dead[:, None, None], torch.zeros_like(Y), Y), graph, dead, explicit)


def _eval(energy: Energy, Y: torch.Tensor, graph: TokenGraph, dead: Optional[torch.Tensor] = None,
          explicit: Union[bool, str] = False) -> Dict[str, torch.Tensor]:
    """Term values at Y; examples marked ``dead`` (their tokens went non-finite) get NaN."""
    with torch.no_grad():
        if explicit == "pass":
            vals = {name: t.pass_value(Y, graph).to(ACCUM_DTYPE) for name, t in energy.terms.items()}
        elif explicit:
            vals = {name: getattr(t, "explicit_value", t.value)(Y, graph).to(ACCUM_DTYPE)
                    for name, t in energy.terms.items()}
        else:
            vals = dict(energy.term_values(Y, graph))
    if dead is not None and bool(dead.any()):
        vals = {k: torch.where(dead, torch.full_like(v, math.nan), v) for k, v in vals.items()}
    return vals


def check_step_output(out, Y: torch.Tensor, what: str) -> torch.Tensor:
    """``out`` if it is floating tokens of ``Y``'s shape (what a step maps Y to), else a
    [`StepError`][energies.StepError] naming ``what`` (the step) and what it returned. Metadata only: no host read."""
    if not (isinstance(out, torch.Tensor) and out.shape == Y.shape and out.dtype.is_floating_point):
        raise StepError(f"{what} returned {type(out).__name__} {tuple(getattr(out, 'shape', ()))} "
                        f"{getattr(out, 'dtype', '')}: a step maps floating tokens {tuple(Y.shape)} to the same shape")
    return out


class _Tracer:
    """Runs one step (or sub-step) at a time, keeping examples whose tokens went non-finite out of later
    steps (their energies become NaN, so every later step of theirs fails), and blames the step."""

    def __init__(self, graph: TokenGraph, S: int, device):
        self.graph = graph
        self.dead = torch.zeros(S, dtype=torch.bool, device=device)
        self.violations: List[dict] = []

    def run(self, fn, Y: torch.Tensor, layer: int, sub: Optional[int], name: str) -> torch.Tensor:
        Y_next = check_step_output(fn(Y), Y, f"layer {layer}" + ("" if sub is None else f", sub-step {sub}")
                                   + f" ({name})")
        bad = _nonfinite_examples(Y_next, self.graph) & ~self.dead
        for s in bad.nonzero().reshape(-1).tolist():
            self.violations.append({"level": "substep" if sub is not None else "layer", "kind": "nonfinite_tokens",
                                    "sample": s, "layer": layer, "substep": sub, "step": name,
                                    "message": f"layer {layer} ({name}) produced non-finite tokens from finite input"})
        if bool(bad.any()):
            self.dead = self.dead | bad
        if bool(self.dead.any()):      # every step of a dead example, not only the one that killed it: its tokens
            # hold zeros from there (a step that turns zeros into NaN again would otherwise reach the energy's check)
            Y_next = torch.where(self.dead[:, None, None] & self.graph.mask[..., None], torch.zeros_like(Y_next), Y_next)
        return Y_next


def _check_judgeable(Y: torch.Tensor, graph: TokenGraph) -> None:
    """A verdict needs values on the host's reach and something to judge: tokens on ``meta`` (no values) are a
    [`TokenError`][energies.TokenError], and so is an example with no real token (its energy is 0 at every layer:
    "descent" over steps of nothing). [`trace_descent`][unfold.trace_descent] is a diagnostic, which reads the host
    anyway."""
    if Y.device.type == "meta":
        raise TokenError("Y is on the meta device, which holds no values: a descent verdict needs real tokens "
                         "(trace on the CPU or a GPU)")
    empty = ~graph.mask.any(1)
    if bool(empty.any()):
        raise TokenError(f"graph.mask: example(s) {empty.nonzero().flatten()[:5].tolist()} have no real token "
                         "(mask row all False): there is nothing to descend, and no verdict over it")


def _checked_run(steps: Steps, Y: torch.Tensor, graph: TokenGraph, layers: Optional[int], substeps) -> tuple:
    """[`trace_descent`][unfold.trace_descent]'s refusals, in order: ``substeps`` a bool, the tokens
    ([`check_tokens`][energies.check_tokens], judgeable), the plan of layers, and an energy on every step (what a
    verdict judges: a Step subclass sets it). Returns ``(Y, plan)``."""
    check_flag(substeps, "substeps", StepError)
    Y = check_tokens(Y, graph)
    _check_judgeable(Y, graph)
    plan = _layers(steps, layers)
    for s in {id(s): s for s in plan}.values():
        if not isinstance(getattr(s, "energy", None), Energy):
            raise StepError(f"{type(s).__name__} has no energy (an energies.Energy) to trace: set self.energy")
    return Y, plan


def trace_descent(steps: Steps, Y: torch.Tensor, graph: TokenGraph, layers: Optional[int] = None,
                  tol_factor: float = DEFAULT_TOL_FACTOR, substeps: bool = True
                  ) -> Tuple[torch.Tensor, DescentReport]:
    """Run the unrolled steps from ``Y`` and trace every layer's energy: each step must satisfy
    ``E(Y_{t+1}) <= E(Y_t) + tol``, the MM descent property (paper, Thm. 4.1), with ``tol`` the rounding rule of
    [`tolerance`][unfold.tolerance]. A diagnostic: it runs without autograd (use [`unroll`][unfold.unroll] to train).

    Args:
        steps: one [`Step`][unfold.Step] shared over ``layers`` layers, or a list of untied steps.
        Y: the tokens ``(B, n, d)``.
        graph: the token graph of the batch.
        layers: how many times a shared step runs (ignored for a list).
        tol_factor: the tolerance's multiple of the dtype's eps times the energy's scale
            ([`tolerance`][unfold.tolerance]).
        substeps: also evaluate the layer's energy after each sub-step of a Sequence, so that a violation names
            the sub-step that raised it (layer-level counts are unaffected).

    Returns:
        ``(Y_T, report)``: the last tokens (examples whose tokens went non-finite hold zeros and fail every step
        from there) and the [`DescentReport`][unfold.DescentReport] of every example at every layer.
    """
    tol_factor = check_tol_factor(tol_factor)
    Y, plan = _checked_run(steps, Y, graph, layers, substeps)
    tracer = _Tracer(graph, graph.batch_size, Y.device)
    pairs: List[Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]] = []
    res: List[torch.Tensor] = []
    indicators: set = set()
    violations: List[dict] = []
    sub_incs = 0
    sub_bad: List[torch.Tensor] = []      # per layer: a sub-step went non-finite (fails the layer)
    after: Optional[Dict[str, torch.Tensor]] = None
    prev_energy: Optional[Energy] = None
    for t, step in enumerate(plan):
        energy = step.energy
        indicators |= set(energy.indicators)
        before = after if (after is not None and energy is prev_energy) else _eval(energy, Y, graph, tracer.dead)
        r = resolution(energy, Y, graph)
        subs = step.substeps() if substeps else [step]
        Y, after, layer_bad, incs = _trace_layer(tracer, step, subs, Y, graph, t, before, r, tol_factor, violations)
        sub_incs += incs
        pairs.append((before, after))
        res.append(r)
        sub_bad.append(layer_bad)
        prev_energy = energy
    report = _assemble(pairs, Y.dtype, tol_factor, [s.guaranteed() for s in plan], graph.batch_size, Y.device,
                       [type(s).__name__ for s in plan], tracer.violations + violations, sub_incs, indicators, res,
                       sub_bad)
    return Y, report


def _trace_layer(tracer: "_Tracer", step: Step, subs: List[Step], Y: torch.Tensor, graph: TokenGraph, t: int,
                 before: Dict[str, torch.Tensor], r: torch.Tensor, tol_factor: float, violations: List[dict]
                 ) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], torch.Tensor, int]:
    """Layer ``t`` of [`trace_descent`][unfold.trace_descent], from energies ``before`` and resolution ``r`` at Y: run
    whole, or sub-step by sub-step (``subs``) with each sub-step judged against the layer's tolerance and its violations
    appended to ``violations``. Returns ``(Y', energies at Y', (B,) a sub-step went non-finite, sub-step
    increases)``."""
    energy = step.energy
    sub_incs = 0
    layer_bad = torch.zeros(graph.batch_size, dtype=torch.bool, device=Y.device)
    with torch.no_grad():
        if len(subs) > 1:
            tol = tolerance(before, Y.dtype, tol_factor, r)
            vals_cur = before
            for k, sub in enumerate(subs):
                Y_next = tracer.run(lambda X: graph.keep_padded(check_step_output(
                    sub.update(X, graph), X, f"layer {t}, sub-step {k} ({type(sub).__name__})"), X), Y, t, k,
                    type(sub).__name__)
                vals_next = _eval(energy, Y_next, graph, tracer.dead)
                inc, nonfin, bad = _verdict(vals_cur, vals_next, tol, energy.indicators)
                sub_incs += int(inc.sum())
                layer_bad = layer_bad | nonfin
                for s in inc.nonzero().reshape(-1).tolist():
                    violations.append(_violation(s, t, k, type(sub).__name__, vals_cur, vals_next, tol, "substep",
                                                 bool(nonfin[s]), bad))
                Y, vals_cur = Y_next, vals_next
            after = vals_cur
        else:
            Y = tracer.run(lambda X: step(X, graph), Y, t, None, type(step).__name__)
            after = _eval(energy, Y, graph, tracer.dead)
    return Y, after, layer_bad, sub_incs


def _violation(sample: int, layer: int, sub: Optional[int], step_name: str, before: Dict[str, torch.Tensor],
               after: Dict[str, torch.Tensor], tol: torch.Tensor, level: str, nonfinite: bool = False,
               bad: Optional[Dict[str, torch.Tensor]] = None) -> dict:
    b, a = float(_total(before)[sample]), float(_total(after)[sample])
    terms = {k: {"before": float(before[k][sample]), "after": float(after[k][sample])} for k in before}
    rose = [k for k, v in terms.items() if v["after"] > v["before"]]
    out = {"level": level, "kind": "nonfinite" if nonfinite else "increase", "sample": sample, "layer": layer,
           "substep": sub, "step": step_name, "before": b, "after": a, "increase": a - b,
           "rel_increase": (a - b) / max(abs(b), 1e-300) if math.isfinite(a - b) else math.inf,
           "tol": float(tol[sample]), "terms_up": rose, "terms": terms}
    if nonfinite:
        out["nonfinite_terms"] = sorted(k for k, m in (bad or {}).items() if bool(m[sample]))
    return out


def report_from_values(values: Dict[str, torch.Tensor], dtype: torch.dtype, tol_factor: float = DEFAULT_TOL_FACTOR,
                       guaranteed: bool = False, indicators: Iterable[str] = (),
                       resolution: Optional[torch.Tensor] = None, ran: Optional[torch.Tensor] = None) -> DescentReport:
    """The verdict ``E(Y_t+1) <= E(Y_t) + tol_t`` of every stored step (tolerance rule of the module docstring).

    Values are those of one energy at Y_0..Y_T (as returned by [`UnfoldedTransformer`][unfold.UnfoldedTransformer]); the
    tolerance rule and the verdicts are those of [`trace_descent`][unfold.trace_descent]. Where ``values`` is an
    [`EnergyTrace`][unfold.EnergyTrace] with ``exact``, a step the kernels' values flag counts only if the exact
    evaluation confirms it.

    Args:
        values: ``{name: (S, T+1)}`` floating term values, one shape, on one device (an
            [`EnergyTrace`][unfold.EnergyTrace]).
        dtype: the floating dtype of the states (its eps sets the tolerance).
        tol_factor: f of the tolerance ([`check_tol_factor`][unfold.check_tol_factor]).
        guaranteed: whether the layers claim a descent guarantee (stated per layer in the report).
        indicators: names of indicator terms (+inf legitimate); default: ``values.indicators``.
        resolution: ``(S, T+1)`` `resolution` at each Y_t (the tolerance's resolution part; 0 when not given);
            default: ``values.resolution``.
        ran: ``(S, T)`` bool, the layers that ran (an energy-chosen depth; frozen layers are no steps,
            [`DescentReport`][unfold.DescentReport]); default: ``values.ran``.

    Returns:
        The [`DescentReport`][unfold.DescentReport] of the S examples' T steps.

    Raises:
        StepError: naming what: no or ragged values, integer values, no example (S = 0), fewer than two layer
            boundaries, values on ``meta`` or on several devices, a resolution that is not a non-negative float
            (S, T+1) tensor, a ``ran`` that is not a bool (S, T) tensor on the values' device.
    """
    tol_factor = check_tol_factor(tol_factor)
    check_flag(guaranteed, "guaranteed", StepError)        # a truthy 'no' or NaN would state a guarantee in the report
    S, T1, device = _check_values(values, dtype, resolution)
    resolution = getattr(values, "resolution", None) if resolution is None else resolution
    indicators = tuple(indicators) or getattr(values, "indicators", ())
    ran = getattr(values, "ran", None) if ran is None else ran
    exact, values_in = getattr(values, "exact", None), values
    values = {k: v.to(ACCUM_DTYPE) for k, v in values.items()}
    res = _resolution_columns(resolution, S, T1)
    _check_ran(ran, S, T1, device)

    def judge(vals):
        cols = [{k: v[:, t] for k, v in vals.items()} for t in range(T1)]
        return _assemble(list(zip(cols[:-1], cols[1:])), dtype, tol_factor, [guaranteed] * (T1 - 1), S, device,
                         ["layer"] * (T1 - 1), indicators=indicators, res=res, ran=ran)
    prior = (getattr(values_in, "rechecked", 0), getattr(values_in, "cleared", 0))    # settled already
    report = judge(values)
    window = report.increases | _within_error(report, getattr(values_in, "error", None), ran)
    flagged = window.any(1)                    # (S,): every example with a step the kernels' values cannot decide
    if exact is None or not bool(flagged.any()):
        report.rechecked, report.cleared = prior
        return report
    return _confirm(report, flagged, window, exact, values, judge, prior, T1, device)


def _within_error(report: DescentReport, error: Optional[torch.Tensor], ran: Optional[torch.Tensor]) -> torch.Tensor:
    """``(S, T)`` bool: the steps whose read change ``E_t+1 - E_t`` exceeds ``tol_t - error_t - error_t+1``, so that
    the values, each within its ``error`` of the independent evaluation, cannot tell whether the exact change exceeds
    ``tol_t``; all False without ``error``. Frozen layers (``ran`` False) are no steps."""
    if error is None:
        return torch.zeros_like(report.increases)
    err = error.to(device=report.tol.device, dtype=ACCUM_DTYPE)
    near = ~((report.after - report.before) <= report.tol - err[:, :-1] - err[:, 1:])     # NaN: cannot tell
    return near if ran is None else near & ran


def _check_values(values, dtype, resolution) -> Tuple[int, int, torch.device]:
    """``(S, T+1, device)`` of stored term values, after the refusals of
    [`report_from_values`][unfold.report_from_values] on them, the dtype and a given resolution's type and device."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise StepError(f"dtype must be the floating dtype of the states, got {dtype!r}")
    if not isinstance(values, dict) or not values:
        raise StepError("values must be a non-empty dict {term: (S, T+1) tensor}")
    shapes = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in values.items()}
    first = next(iter(values.values()))
    if any(sh is None or len(sh) != 2 for sh in shapes.values()) or len(set(shapes.values())) != 1:
        raise StepError(f"values must be (S, T+1) tensors of one shape, got {shapes}")
    kinds = {k: str(v.dtype).replace("torch.", "") for k, v in values.items() if not v.dtype.is_floating_point}
    if kinds:       # an integer energy has lost its rounding: no tolerance rule applies to it
        raise StepError(f"values must be floating-point energies, got {kinds}")
    if resolution is not None and not (isinstance(resolution, torch.Tensor) and resolution.dtype.is_floating_point):
        raise StepError(f"resolution must be a floating-point tensor, got {getattr(resolution, 'dtype', resolution)!r}")
    devices = {str(v.device) for v in values.values()}
    if resolution is not None:
        devices.add(str(resolution.device))
    if len(devices) > 1 or "meta" in devices:   # a verdict reads the values: one device that holds them
        raise StepError(f"values (and resolution) must be on one device that holds values, got {sorted(devices)}")
    S, T1 = first.shape
    if S < 1:
        raise StepError(f"values hold no example (S = 0, shapes {shapes}): a verdict over nothing is no descent")
    if T1 < 2:
        raise StepError(f"values need at least two layer boundaries (T+1 >= 2) to judge a step, got T+1 = {T1}")
    return S, T1, first.device


def _resolution_columns(resolution: Optional[torch.Tensor], S: int, T1: int) -> Optional[List[torch.Tensor]]:
    """The resolution at the start of each step, ``[(S,)] * T`` (None without one), refused unless ``(S, T+1)``,
    non-negative and without NaN."""
    if resolution is not None and (tuple(resolution.shape) != (S, T1) or not bool(
            (~torch.isnan(resolution) & (resolution >= 0)).all())):
        raise StepError(f"resolution must be a non-negative (S, T+1) = ({S}, {T1}) tensor without NaN")
    return None if resolution is None else [resolution[:, t] for t in range(T1 - 1)]


def _check_ran(ran: Optional[torch.Tensor], S: int, T1: int, device: torch.device) -> None:
    """``ran`` None or a bool ``(S, T)`` tensor on ``device``, else a [`StepError`][energies.StepError] naming what it
    is."""
    if ran is not None and not (isinstance(ran, torch.Tensor) and ran.dtype == torch.bool
                                and tuple(ran.shape) == (S, T1 - 1) and ran.device == device):
        raise StepError(f"ran must be a bool (S, T) = ({S}, {T1 - 1}) tensor on {device}, got "
                        f"{getattr(ran, 'dtype', type(ran).__name__)} {tuple(getattr(ran, 'shape', ()))}")
    # an example runs layer 1 and stops once (EnergyTrace): its row is True up to its depth, False after; any other
    # row leaves layers that ran unjudged (all False: "descent" over no step, whatever the values)
    if ran is not None and not bool(ran[:, 0].all() & (ran[:, 1:] <= ran[:, :-1]).all()):
        bad = (~ran[:, 0] | (ran[:, 1:] > ran[:, :-1]).any(1)).nonzero().flatten()[:5].tolist()
        raise StepError(f"ran must mark each example's first layers (True from layer 1 up to where it stopped, False "
                        f"after), got rows {bad} that skip layer 1 or run a layer after a skipped one")


def _confirm(report: DescentReport, flagged: torch.Tensor, window: torch.Tensor, exact, values: Dict[str, torch.Tensor],
             judge, prior: Tuple[int, int], T1: int, device: torch.device) -> DescentReport:
    """The verdict again with the ``flagged`` examples' rows taken from the exact evaluation, counting the steps it
    decided (``window``: flagged by the kernels' values or within their error of the tolerance) and how many of those
    it cleared (on top of ``prior``, a settled trace's counts)."""
    # a step the kernels' values flag, or that lies within their error of the tolerance, is judged on the exact
    # evaluation of both its ends; the other examples keep the kernels' values
    # only the boundaries of the steps in the window are evaluated: a step outside it, judged with one end exact and
    # the other read, still changes E by at most tol_t (each end within its error of the exact value)
    need = torch.zeros(window.shape[0], T1, dtype=torch.bool, device=window.device)
    need[:, :-1] |= window
    need[:, 1:] |= window
    values = {k: v.clone() for k, v in values.items()}
    for t in range(T1):
        rows = need[:, t].nonzero().reshape(-1)
        if rows.numel():
            redo = exact(t, rows)
            for k, v in values.items():
                v[rows.to(device), t] = redo[k].to(device=device, dtype=ACCUM_DTYPE)
    confirmed = judge(values)
    decided = int(window.sum())
    confirmed.rechecked = prior[0] + decided
    confirmed.cleared = prior[1] + decided - int((confirmed.increases & window).sum())
    return confirmed


def _assemble(pairs, dtype: torch.dtype, tol_factor: float, guaranteed: List[bool], S: int, device,
              step_names: List[str], violations: Optional[List[dict]] = None, sub_incs: int = 0,
              indicators: Iterable[str] = (), res: Optional[List[torch.Tensor]] = None,
              sub_bad: Optional[List[torch.Tensor]] = None, ran: Optional[torch.Tensor] = None) -> DescentReport:
    """The report of layers whose energies before and after are ``pairs[t] = (before, after)``; ``sub_bad[t]``:
    examples whose layer t went non-finite at a sub-step (the layer fails even if its end is finite)."""
    violations = list(violations or [])
    indicators = tuple(indicators)
    befores, afters, tols, incs, nonfins = [], [], [], [], []
    term_incs: Dict[str, List[torch.Tensor]] = {}
    term_bad: Dict[str, List[torch.Tensor]] = {}
    term_deltas: Dict[str, List[torch.Tensor]] = {}
    for t, (vb, va) in enumerate(pairs):
        tol = tolerance(vb, dtype, tol_factor, None if res is None else res[t])
        inc, nonfin, bad = _verdict(vb, va, tol, indicators)
        if sub_bad is not None:
            nonfin = nonfin | sub_bad[t]
            inc = inc | sub_bad[t]
        if ran is not None:          # a frozen layer (the example stopped before it) is no step: nothing to judge
            inc, nonfin = inc & ran[:, t], nonfin & ran[:, t]
        for s in inc.nonzero().reshape(-1).tolist():
            violations.append(_violation(s, t, None, step_names[t], vb, va, tol, "layer", bool(nonfin[s]), bad))
        befores.append(_total(vb)); afters.append(_total(va)); tols.append(tol); incs.append(inc); nonfins.append(nonfin)
        on = torch.ones_like(inc) if ran is None else ran[:, t]
        for k, v in vb.items():
            if k not in va:
                continue
            term_bad.setdefault(k, []).append(bad[k] & on)
            term_incs.setdefault(k, []).append(((_change(v, va[k]) > tol) | bad[k]) & on)
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
        tol_rule=tol_rule(tol_factor, dtype), guaranteed=guaranteed, violations=violations,
        substep_increases=sub_incs, tol_unit=tol_factor * torch.finfo(dtype).eps,
        nonfinite=stack(nonfins, torch.bool),
        term_nonfinite={k: stack(v, torch.bool) for k, v in term_bad.items() if len(v) == full}, ran=ran)


def tol_rule(tol_factor: float, dtype: torch.dtype) -> str:
    """The tolerance rule in words, with its numbers (stated in every verdict)."""
    eps = torch.finfo(dtype).eps
    name = str(dtype).replace("torch.", "")
    return (f"E_t+1 > E_t + tol is an increase, tol = {tol_factor:g} * eps({name}) * (sum_k |E_k(Y_t)| + eps({name}) "
            f"* sum_u c_u ||y_u||^2) = {tol_factor * eps:.3g} * scale (+ {tol_factor * eps * eps:.3g} * sum_u c_u "
            f"||y_u||^2, c_u the MM curvature bound at Y_t); a NaN or inf energy (+inf allowed on indicators) fails")
