"""Descent monitor: watches the energy trace of every training forward pass.

``DescentMonitor(mode)`` with mode ``off`` (nothing checked), ``warn`` (violations counted and
logged: where, layer, example, the terms that went up, the energies and the tolerance) or
``strict`` (the first confirmed violation raises [`DescentError`][energies.DescentError] with the
same detail). A non-finite energy (NaN, or inf on a term that is not an indicator) is a failure like
an increase, and reported as one. Only layers whose descent is guaranteed are judged (a free or baseline model's trace
is a diagnostic, not a promise). The tolerance is the trace's own rule (``tol_rule`` of the
report: ``tol_factor * eps(dtype) * sum_k |E_k|``, from the dtype and the energy's size) and is
stated in every message. A step flagged in the training dtype is re-evaluated in float64 on the
same embedded input (the whole batch, so that the token graph is the same) and judged by the
independent energy evaluation (explicit differences) before it is reported: rounding in float32, or
in a kernel's own energy pass, clears there; a real increase does not.
"""
from __future__ import annotations

import copy
import sys
from typing import Callable, List, Optional

import torch

from energies.checks import check_int
from energies.errors import ConfigError, DescentError

from .trace import (DEFAULT_TOL_FACTOR, EnergyTrace, check_tol_factor, report_from_values, resolution,
                    term_values_or_nan)

__all__ = ["DescentMonitor", "MONITOR_MODES"]

MONITOR_MODES = ("off", "warn", "strict")


def _describe(v: dict, where: str, example: int, tol_rule: str) -> str:
    if v.get("kind") == "nonfinite_tokens":
        return f"descent check failed ({where}): example {example}: {v['message']}"
    if v.get("kind") == "nonfinite":
        return (f"descent check failed ({where}): example {example}, layer {v['layer'] + 1}: non-finite energy "
                f"{v['before']:.9e} -> {v['after']:.9e} in terms {v.get('nonfinite_terms')} (a NaN or inf energy "
                f"is a failure, never a pass; {tol_rule})")
    terms = ", ".join(f"{k} {t['before']:.6e} -> {t['after']:.6e}" for k, t in v["terms"].items()
                      if k in v["terms_up"]) or "none individually"
    return (f"descent violation ({where}): example {example}, layer {v['layer'] + 1}: energy {v['before']:.9e} -> "
            f"{v['after']:.9e} (+{v['increase']:.3e} > tol {v['tol']:.3e}; {tol_rule}); terms up: {terms}")


class DescentMonitor:
    """See the module docstring. ``observe(model, out, where)`` after every forward pass."""

    def __init__(self, mode: str = "warn", tol_factor: float = DEFAULT_TOL_FACTOR,
                 log: Optional[Callable[[str], None]] = None, max_logged: int = 20):
        if mode not in MONITOR_MODES:
            raise ConfigError(f"descent monitor mode {mode!r} is unknown; valid: {list(MONITOR_MODES)}")
        self.mode, self.tol_factor = mode, check_tol_factor(tol_factor)
        self.max_logged = check_int(max_logged, "descent monitor max_logged", 0, error=ConfigError)
        if log is not None and not callable(log):
            raise ConfigError(f"descent monitor log must be a callable taking one message, got {log!r}")
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.steps = self.flagged = self.confirmed = self.cleared = 0
        self.tol_rule = ""
        self.messages: List[str] = []

    def observe(self, model, out, where: str = "", report=None) -> int:
        """Check one forward pass; returns the confirmed violations (raises in strict mode). ``report``:
        ``out.report(tol_factor)`` when the caller has it already (it is not computed twice)."""
        if self.mode == "off" or out.energies is None or not out.guaranteed:
            return 0
        rep = report if report is not None else out.report(self.tol_factor)
        self.steps += rep.steps
        self.tol_rule = rep.tol_rule
        if rep.num_increases == 0:
            return 0
        samples = sorted({v["sample"] for v in rep.violations})
        self.flagged += len(rep.violations)
        confirmed = self._recheck(model, out, samples)
        self.cleared += len(rep.violations) - len(confirmed)
        self.confirmed += len(confirmed)
        for example, v, rule in confirmed:
            msg = _describe(v, where, example, rule)
            if self.mode == "strict":
                raise DescentError(msg)
            if len(self.messages) < self.max_logged:
                self.messages.append(msg)
                self.log(msg)
        if len(rep.violations) > len(confirmed) and len(self.messages) < self.max_logged:
            msg = (f"descent monitor ({where}): {len(rep.violations) - len(confirmed)} step(s) flagged in "
                   f"{out.states_dtype} cleared by the float64 re-evaluation (rounding)")
            self.messages.append(msg)
            self.log(msg)
        return len(confirmed)

    def _recheck(self, model, out, samples):
        """The flagged examples' layers again in float64, judged by the independent energy evaluation.

        The whole batch is re-run (a token graph may depend on the batch, e.g. ``random:P``, so a sub-batch
        could be a different energy), its states are kept, and every term is evaluated at each state by
        [`term_values`][energies.Energy.term_values] (explicit differences, not the kernel's own pass): what is
        confirmed is confirmed by an evaluation exact to rounding."""
        if out.inputs is None:
            raise DescentError("the descent monitor needs ModelOutput.inputs (the embedded tokens) to re-check")
        X, mask = out.inputs
        # the encoder (of a SequenceClassifier or an UnfoldedTransformer, or an encoder itself): its API is
        # the one every model has (token_graph, forward with keep_states, energy)
        checker = copy.deepcopy(getattr(model, "encoder", model)).to(torch.float64)
        X64 = X.to(torch.float64)
        with torch.no_grad():
            graph = checker.token_graph(mask)
            states = checker(X64, mask, graph=graph, trace=False, keep_states=True).states
            energy = checker.energy(X64)
            values = EnergyTrace.from_layers([term_values_or_nan(energy, Y, graph) for Y in states],
                                             [resolution(energy, torch.nan_to_num(Y), graph) for Y in states],
                                             energy.indicators, mask=graph.mask)
        rep64 = report_from_values(values, torch.float64, self.tol_factor, guaranteed=True)
        flagged = set(samples)
        return [(v["sample"], v, rep64.tol_rule) for v in rep64.violations if v["sample"] in flagged]

    COUNTERS = ("steps", "flagged", "confirmed", "cleared", "tol_rule", "messages")

    def state(self) -> dict:
        """Counters and messages, for a checkpoint."""
        return {k: getattr(self, k) for k in self.COUNTERS}

    def load_state(self, state: dict) -> None:
        for k in self.COUNTERS:
            setattr(self, k, state[k])

    def summary(self) -> dict:
        return {"mode": self.mode, "tol_rule": self.tol_rule, "steps_checked": self.steps,
                "flagged": self.flagged, "confirmed": self.confirmed, "cleared_in_float64": self.cleared,
                "messages": self.messages}
