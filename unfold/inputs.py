"""The input checks of the encoders and of the models built on them: what a constructor or a forward pass refuses.

Constructor arguments: `check_choice` (a name from a list), `check_stop_rel` (the energy-chosen depth's threshold),
`check_stack_args` (the untied stacks' heads, feed-forward width, dropout and attention). Forward arguments:
`check_input_tokens` (the tokens' type, dtype and shape), `check_same_device` (tokens or ids on the model's device),
`bool_mask` and `check_mask_values` (a padding mask), `check_empty_rows` (an example with no real token),
`check_inference_layers` (the one depth rule) and `check_batch_size` (the one batch-size rule of the entry points
that batch examples themselves). `host_checks` states when a check may read values (a host read).

Each refusal is the framework's typed error ([`InputError`][energies.InputError] for the inputs of a forward,
[`ConfigError`][energies.ConfigError] for arguments) naming the argument and its value. The encoders
(`unfold.encoders`), the classifier and the masked-token model call these checks; an application checking its own
flags with the same rule (``unfold-predict --layers``, ``--batch-size``) calls them too.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from energies.checks import as_bool_mask, check_int, check_number
from energies.errors import ConfigError, InputError

from .attention import ACTIVATIONS

__all__ = ["host_checks", "check_empty_rows", "check_same_device", "bool_mask", "check_mask_values", "check_choice",
           "check_stop_rel", "MAX_INFERENCE_LAYERS", "check_inference_layers", "MAX_BATCH_SIZE", "check_batch_size",
           "check_input_tokens", "check_stack_args"]

#: most layers an inference may unroll (``layers=``, ``unfold-predict --layers``): a guard against typos
MAX_INFERENCE_LAYERS = 4096

#: most examples per batch of an inference or an evaluation (``batch_size=``), the trainer's ``train.batch_size`` bound
MAX_BATCH_SIZE = 2 ** 20


def host_checks(t: torch.Tensor, validate: bool = False) -> bool:
    """Whether value checks (host reads) run on ``t``.

    The rule of every input check of the encoders and the classifier: checks of metadata (type, dtype, shape,
    device) always run; checks of values (ids in the vocabulary, an example with no real token, finite tokens, 0/1
    masks) run always with ``validate=True``, and otherwise only where the values are in host memory (the CPU) and
    nothing is being compiled -- never on ``meta`` (there are no values: a meta forward checks shapes) and never on
    an accelerator without ``validate`` (a device sync in every forward).

    Args:
        t: the tensor whose values a check would read.
        validate: the model's debugging switch (checks on every device).

    Returns:
        True where value checks run.
    """
    if t.device.type == "meta":
        return False
    return validate or (t.device.type == "cpu" and not torch.compiler.is_compiling())


def check_empty_rows(mask: torch.Tensor, validate: bool = False) -> None:
    """Refuse an example with no real token (a mask row all False) where `host_checks` says values are read.

    It has no tokens to encode, and the trace of its padding would read as descent over steps of nothing. Where the
    check does not run (an accelerator without ``validate``), the trace gives such an example NaN energies
    ([`from_layers`][unfold.EnergyTrace.from_layers]), so every one of its steps fails the verdict.

    Args:
        mask: the ``(B, n)`` bool padding mask (True at real tokens).
        validate: the model's debugging switch (`host_checks`).

    Raises:
        InputError: an example's mask row is all False (the first five such examples named).
    """
    if host_checks(mask, validate) and mask.shape[1] and not bool(mask.any(1).all()):
        rows = (~mask.any(1)).nonzero().flatten()[:5].tolist()
        raise InputError(f"mask: every example needs at least one real token (mask row all False): example(s) {rows}")


def check_same_device(t: torch.Tensor, module: nn.Module, what: str) -> None:
    """Refuse ``t`` unless it is on the device of ``module``'s parameters (metadata only, no host read).

    A mix of devices (meta ids into a CPU model) is named, not torch's error from deep inside a layer.

    Args:
        t: the tokens or ids a forward pass received.
        module: the model (a module without parameters accepts any device).
        what: how the error names ``t`` (``"tokens X"``, ``"ids"``).

    Raises:
        InputError: ``t`` and the parameters are on different devices.
    """
    param = next(module.parameters(), None)
    if param is not None and t.device != param.device:
        raise InputError(f"{what} are on {t.device}, the model on {param.device}: move one to the other")


def bool_mask(mask: Optional[torch.Tensor], shape, device, what: str = "tokens", validate: bool = False) -> torch.Tensor:
    """A padding mask as bool ``(B, n)``.

    None means all real; an integer 0/1 attention mask (Hugging Face's convention) is read as ``mask != 0``. A
    floating mask is refused: torch's float attention masks are additive (0 keeps, -inf drops), the opposite reading
    of a 0/1 mask. Whether an integer mask holds only 0 and 1 is a host read, checked (`check_mask_values`) only
    with ``validate=True``.

    Args:
        mask: None, a bool mask (True at real tokens) or a 0/1 integer mask.
        shape: the ``(B, n)`` the mask must have.
        device: the device the mask must be on.
        what: how the error names the tensor the mask goes with (``"tokens"``, ``"ids"``).
        validate: check an integer mask's values (one host read).

    Returns:
        The bool ``(B, n)`` mask on ``device``.

    Raises:
        InputError: a mask of another type, a floating mask, another shape or device, or (``validate``) an integer
            mask with values other than 0 and 1.
    """
    if mask is None:
        return torch.ones(tuple(shape), dtype=torch.bool, device=device)
    real = as_bool_mask(mask, InputError)      # the one dtype rule of every mask (energies.checks)
    if tuple(mask.shape) != tuple(shape):
        raise InputError(f"{what} {tuple(shape)} and a mask of the same shape are required, "
                         f"got mask {tuple(mask.shape)}")
    if mask.device != torch.device(device):
        raise InputError(f"the mask is on {mask.device}, the {what} on {torch.device(device)}: move one to the other")
    if validate:
        check_mask_values(mask)
    return real


def check_mask_values(mask: Optional[torch.Tensor]) -> None:
    """Refuse an integer attention mask holding values other than 0 and 1.

    One host read: call it behind ``validate=True``. None, a bool mask and a ``meta`` mask (no values) pass.

    Args:
        mask: the mask to check.

    Raises:
        InputError: the mask holds other values (up to five of them named).
    """
    if mask is None or mask.dtype == torch.bool or mask.device.type == "meta":
        return
    u64 = mask.dtype == torch.uint64     # few kernels for uint64: its bits as int64 (2^63 and up read < 0)
    m = mask.view(torch.int64) if u64 else mask
    bad = m[(m != 0) & (m != 1)]
    if bad.numel():
        vals = [int(v) % 2 ** 64 if u64 else int(v) for v in bad.unique().tolist()[:5]]
        raise InputError(f"an integer attention mask holds 0 and 1 only, got values {vals}")


def check_choice(value, what: str, valid) -> str:
    """A constructor argument that names one of ``valid`` (``curvature``, ``norm``, ``attention``).

    Args:
        value: the argument.
        what: its name in the error.
        valid: the names accepted.

    Returns:
        ``value``.

    Raises:
        ConfigError: ``value`` is not a string among ``valid`` (the valid names listed).
    """
    if not isinstance(value, str) or value not in valid:
        raise ConfigError(f"{what}={value!r} is unknown; valid: {list(valid)}")
    return value


def check_stop_rel(value, what: str = "stop_rel", error: type = ConfigError) -> Optional[float]:
    """The energy-chosen depth's threshold EPS ([`GuaranteedEncoder`][unfold.GuaranteedEncoder]).

    EPS >= 1 would stop every example after its first layer (a relative decrease is below 1 unless the energy
    crosses zero), a negative EPS never stops one: both refused.

    Args:
        value: None or 0 (off), or a finite real number in (0, 1).
        what: the argument's name in the error (a config key, a flag).
        error: the error type raised.

    Returns:
        None (off), else ``value`` as a float.

    Raises:
        ConfigError: (or ``error``) anything else, naming ``what`` and the value.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} must be null/0 (off) or a number in (0, 1), got {value!r}")
    value = float(value)
    if value == 0.0:
        return None
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise error(f"{what} must be null/0 (off) or a finite number in (0, 1), got {value!r}")
    return value


def check_inference_layers(encoder, layers, what: str = "layers", error: type = ConfigError,
                           first: bool = False) -> Optional[int]:
    """The one depth rule, applied by [`Encoder.forward`][unfold.Encoder.forward] (so by every model, encoder and
    command line).

    ``layers`` for an inference at another depth than trained: None (the trained depth) or an integer in
    [1, `MAX_INFERENCE_LAYERS`], and only for a weight-shared encoder
    ([`Encoder.weight_shared`][unfold.Encoder.weight_shared]: one step unrolled any number of times); an untied stack
    (free, baseline) has no layer beyond its last, and fewer layers would drop trained ones: refused.

    Args:
        encoder: the encoder asked (its ``kind``, ``layers`` and ``weight_shared`` are read).
        layers: the depth asked for, or None.
        what: the argument's name in the error.
        error: the error type raised.
        first: ``first_layers=`` of [`Encoder.forward`][unfold.Encoder.forward]: the explicit prefix of an untied
            stack, its first 1 .. ``encoder.layers`` layers (the studies that probe a stack layer by layer);
            refused for a weight-shared encoder, whose depth is ``layers``.

    Returns:
        ``layers`` (None: the trained depth).

    Raises:
        ConfigError: (or ``error``) a depth the rule refuses, naming ``what``, the value and the encoder.
    """
    if layers is None:
        return None
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= MAX_INFERENCE_LAYERS:
        raise error(f"{what} must be an integer in [1, {MAX_INFERENCE_LAYERS}], got {layers!r}")
    kind = getattr(encoder, "kind", type(encoder).__name__)
    if first:
        if getattr(encoder, "weight_shared", False) or layers > getattr(encoder, "layers", 0):
            raise error(f"{what}={layers}: the first layers of an untied stack, 1 .. its depth; the {kind} encoder "
                        f"has {getattr(encoder, 'layers', '?')} "
                        + ("weight-shared layers (pass layers= to unroll its step)"
                           if getattr(encoder, "weight_shared", False) else "layers"))
        return layers
    if not getattr(encoder, "weight_shared", False):
        raise error(f"{what}={layers}: the {getattr(encoder, 'kind', type(encoder).__name__)} encoder's "
                    f"{getattr(encoder, 'layers', '?')} layers are untied (no weight-shared step to unroll "
                    "more or fewer times); another inference depth applies to weight-shared encoders (guaranteed)")
    return layers


def check_batch_size(batch_size, what: str = "batch_size", error: type = ConfigError) -> int:
    """The one batch-size rule of the entry points that batch examples themselves (``TrainedModel.predict``,
    ``evaluate_at``, ``unfold-predict --batch-size``): never an empty loop that evaluates nothing.

    Args:
        batch_size: an integer in [1, `MAX_BATCH_SIZE`] (the framework's integer rule,
            `energies.checks.check_int`: a bool, a fraction, NaN refused).
        what: the argument's name in the error.
        error: the error type raised.

    Returns:
        ``batch_size`` as an int.

    Raises:
        ConfigError: (or ``error``) anything else, naming ``what`` and the value.
    """
    return check_int(batch_size, what, 1, MAX_BATCH_SIZE, error=error)


def check_input_tokens(X, d: int) -> None:
    """Metadata checks of an encoder's tokens (no host read).

    An empty batch has no example to encode and no step to judge: refused.

    Args:
        X: the tokens, which must be a floating tensor ``(B, n, d)`` with ``B, n >= 1``.
        d: the encoder's token width.

    Raises:
        InputError: anything else, naming X.
    """
    if not isinstance(X, torch.Tensor):
        raise InputError(f"tokens X must be a (B, n, {d}) tensor, got {type(X).__name__}")
    if not X.dtype.is_floating_point:
        raise InputError(f"tokens X must have a floating dtype (float32 or float64), got {X.dtype}")
    if X.ndim != 3 or X.shape[-1] != d:
        raise InputError(f"tokens must be (B, n, {d}), got {tuple(X.shape)}")
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise InputError(f"tokens X must hold at least one example of at least one token, got shape {tuple(X.shape)}")


def check_stack_args(heads, ffn_mult, dropout, attention, temperature=1.0) -> Tuple[int, int, float, str]:
    """The arguments the untied stacks (the free and baseline encoders) share, checked.

    Args:
        heads: attention heads, an integer >= 1.
        ffn_mult: the feed-forward width multiple, an integer >= 1.
        dropout: the dropout probability, in [0, 1).
        attention: the attention activation, one of `unfold.ACTIVATIONS`.
        temperature: the softplus activation's temperature, positive (checked whatever the activation, as every
            argument is).

    Returns:
        ``(heads, ffn_mult, dropout, attention)``, the numbers as int, int, float.

    Raises:
        ConfigError: an argument outside its rule, named with its value.
    """
    check_number(temperature, "attention_temperature", "positive", ConfigError)
    heads = check_int(heads, "heads", 1, error=ConfigError)
    ffn_mult = check_int(ffn_mult, "ffn_mult", 1, error=ConfigError)
    dropout = check_number(dropout, "dropout", "probability", ConfigError)
    if dropout >= 1.0:
        raise ConfigError(f"dropout must lie in [0, 1), got {dropout}")
    attention = check_choice(attention, "attention", sorted(ACTIVATIONS))
    return heads, ffn_mult, dropout, attention
