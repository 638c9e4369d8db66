"""Update rules that descend the energies of :mod:`energies`, unrolled into layers.

* steps: :class:`AttentionStep` (exact and ``printed``), :class:`FeedForwardStep`,
  :class:`GradientStep`, :class:`ReLUProxStep`, :class:`CenterStep`, :class:`RescaleStep`,
  :class:`Sequence` (alternating steps, Thm 4.1), :func:`layernorm_step`;
* :func:`unroll` (an unrolled model is an iterator over steps) and :func:`trace_descent`
  (per-example, per-layer, per-term energy trace: every step a verdict, descent, increase or
  non-finite, under a stated tolerance rule);
* :class:`ProxMMStep` (a majorized proximal step on a whole energy), :class:`UnfoldedTransformer`;
* :class:`Attention`: standard attention with a softmax, relu or softplus activation;
* ``python -m unfold.check``: the descent checker.
"""
from .steps import (STEPS, UPDATES, AttentionStep, CenterStep, FeedForwardStep, GradientStep, ReLUProxStep,
                    RescaleStep, Sequence, Step, layernorm_step, register_step, theorem41_bound)
from .trace import DEFAULT_TOL_FACTOR, DescentReport, tolerance, trace_descent, unroll

__all__ = [name for name in dir() if not name.startswith("_")]
from .prox import ProxMMStep  # noqa: E402

__all__.append("ProxMMStep")
from .attention import ACTIVATIONS, Attention  # noqa: E402
from .model import MODES, ModelOutput, UnfoldedTransformer  # noqa: E402
from .trace import EnergyTrace, check_tol_factor, report_from_values  # noqa: E402

__all__ += ["ACTIVATIONS", "Attention", "MODES", "ModelOutput", "UnfoldedTransformer", "report_from_values",
            "EnergyTrace", "check_tol_factor"]
