"""Update rules that descend the energies of [`energies`][energies], unrolled into layers.

* steps: [`AttentionStep`][unfold.AttentionStep] (exact and ``printed``), [`FeedForwardStep`][unfold.FeedForwardStep],
  [`GradientStep`][unfold.GradientStep], [`ReLUProxStep`][unfold.ReLUProxStep], [`CenterStep`][unfold.CenterStep],
  [`RescaleStep`][unfold.RescaleStep], [`Sequence`][unfold.Sequence] (alternating steps, Thm 4.1),
  [`layernorm_step`][unfold.layernorm_step];
* [`unroll`][unfold.unroll] (an unrolled model is an iterator over steps) and [`trace_descent`][unfold.trace_descent]
  (per-example, per-layer, per-term energy trace: every step a verdict, descent, increase or
  non-finite, under a stated tolerance rule);
* [`mm_step`][unfold.mm_step]: the one MM step every MM layer takes ([`ProxMMStep`][unfold.ProxMMStep],
  [`AttentionStep`][unfold.AttentionStep]'s exact update, the encoders, the PyG conv);
* encoders ([`ENCODERS`][unfold.ENCODERS], [`register_encoder`][unfold.register_encoder]):
  [`GuaranteedEncoder`][unfold.GuaranteedEncoder], [`FreeEncoder`][unfold.FreeEncoder],
  [`TorchEncoder`][unfold.TorchEncoder], ``(B, n, d)`` tokens and a mask to ``Y_T`` and the energy trace;
* [`SequenceClassifier`][unfold.SequenceClassifier] (embedding, encoder, pooling, head) and
  [`UnfoldedTransformer`][unfold.UnfoldedTransformer] (the experiments' classifier in one constructor);
* [`MaskedTokenModel`][unfold.MaskedTokenModel] (embedding, encoder, a [`TokenHead`][unfold.TokenHead] at every
  position: masked-token pretraining);
* [`Attention`][unfold.Attention]: standard attention with a softmax, relu or softplus activation;
* ``python -m unfold.check``: the descent checker.

Layer: the layers on [`energies`][energies]. May import: [`energies`][energies], nothing else of the project (no config
keys, no run folders: `experiments.app` builds models from these registries).
"""
from .steps import (STEPS, UPDATES, AttentionStep, CenterStep, FeedForwardStep, GradientStep, ReLUProxStep,
                    RescaleStep, Sequence, Step, layernorm_step, register_step, theorem41_bound)
from .trace import DEFAULT_TOL_FACTOR, DescentReport, tolerance, trace_descent, unroll

from .prox import ProxMMStep  # noqa: E402

from .attention import ACTIVATIONS, Attention  # noqa: E402
from .mm import PRECONDITIONERS, MMStepResult, mm_direction, mm_step  # noqa: E402
from .encoders import (ENCODERS, Encoder, EncoderOutput, FreeEncoder, GuaranteedEncoder, TorchEncoder,  # noqa: E402
                       build_encoder, register_encoder)
from .classifier import SequenceClassifier, TokenEmbedding, masked_mean  # noqa: E402
from .masked_lm import MaskedTokenModel, TokenHead, tied_head  # noqa: E402
from .model import MODES, ModelOutput, UnfoldedTransformer  # noqa: E402
from .trace import EnergyTrace, check_tol_factor, report_from_values  # noqa: E402

#: the public API, stated (not computed) so that tools reading the source (the API reference) see it
__all__ = [
    "ACTIVATIONS", "Attention", "AttentionStep", "CenterStep", "DEFAULT_TOL_FACTOR", "DescentReport",
    "ENCODERS", "Encoder", "EncoderOutput", "EnergyTrace", "FeedForwardStep", "FreeEncoder", "GradientStep",
    "GuaranteedEncoder", "MMStepResult", "MODES", "MaskedTokenModel", "ModelOutput", "PRECONDITIONERS", "ProxMMStep",
    "ReLUProxStep", "RescaleStep", "STEPS", "Sequence", "SequenceClassifier", "Step", "TokenEmbedding",
    "TokenHead", "TorchEncoder", "UPDATES", "UnfoldedTransformer", "build_encoder", "check_tol_factor", "layernorm_step",
    "masked_mean", "mm_direction", "mm_step", "register_encoder", "register_step", "report_from_values",
    "theorem41_bound", "tied_head", "tolerance", "trace_descent", "unroll",
]
