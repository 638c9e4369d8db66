"""A sequence classifier composed of parts: embedding -> encoder -> pooling -> head.

``SequenceClassifier(embedding, encoder, head)``: any module mapping ids ``(B, n)`` to tokens ``(B, n, d)``
([`TokenEmbedding`][unfold.TokenEmbedding] by default), any registered [`Encoder`][unfold.Encoder] (or any module with
the same call), masked mean pooling over real tokens, and any head ``(B, d) -> (B, classes)``. ``forward(ids, mask)``
returns a [`ModelOutput`][unfold.ModelOutput]: logits, the energy trace of every layer (``trace=True``) and its verdict
([`ModelOutput.report`][unfold.ModelOutput.report]). The mask is bool (True = real token) or an integer 0/1 attention
mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from energies.checks import check_flag, check_int, check_number
from energies.errors import ConfigError, InputError, TokenError
from energies.memory import check_memory

from .encoders import Encoder, trace_dtype
from .inputs import bool_mask, check_empty_rows, check_inference_layers, check_same_device, host_checks
from .trace import DescentReport, report_from_values

__all__ = ["ModelOutput", "POSITIONAL", "TokenEmbedding", "SequenceClassifier", "masked_mean", "positional_kind",
           "sinusoidal_positions", "upgrade_state_dict"]

#: state-dict keys of checkpoints written before the encoders were modules of their own -> today's keys
_OLD_KEYS = (("embed.", "embedding.embed."), ("proj.", "embedding.proj."), ("pos.", "embedding.pos."),
             ("W", "encoder.W"), ("A", "encoder.A"), ("blocks.", "encoder.blocks."),
             ("encoder.layers.", "encoder.torch_encoder.layers."))


def upgrade_state_dict(state: dict, prefix: str = "") -> dict:
    """Rename, in place, the keys of a classifier checkpoint written before the encoders were modules of their
    own (``embed.weight`` -> ``embedding.embed.weight``, ``W`` -> ``encoder.W``, ...); today's keys are left alone.
    Returns ``state``."""
    if any(k.startswith(prefix + "embedding.") for k in state):
        return state
    for key in [k for k in state if k.startswith(prefix)]:
        rest = key[len(prefix):]
        for old, new in _OLD_KEYS:
            if rest == old or (old.endswith(".") and rest.startswith(old)):
                state[prefix + new + rest[len(old):]] = state.pop(key)
                break
    return state


@dataclass
class ModelOutput:
    """What [`SequenceClassifier`][unfold.SequenceClassifier] returns: the logits and the encoder's energy trace E(Y_0)
    .. E(Y_T), whose verdict ``E(Y_t+1) <= E(Y_t) + tol_t`` (`unfold.trace`) [`report`][unfold.ModelOutput.report]
    gives.

    Attributes:
        logits: ``(B, classes)``, the head's output.
        energies: ``{term: (B, T+1)}`` float64 energies at Y_0 .. Y_T (an [`EnergyTrace`][unfold.EnergyTrace]: also
            the tolerance's resolution at each Y_t and the indicator terms' names; None when not traced).
        states: per-layer states ``[Y_0, ..., Y_T]`` when ``keep_states=True``, else None.
        guaranteed: whether every layer is guaranteed to descend the traced energy (the encoder's claim).
        states_dtype: dtype in which the trace evaluated the energies of the states, which sets the tolerance of
            [`report`][unfold.ModelOutput.report]: the states' dtype, float32 for half-type states (`trace_dtype`).
        inputs: ``(X, mask)``: the embedded tokens the layers started from (detached; for re-checks).
        layers_used: ``(B,)`` int64 on the device: the layers each example ran (fewer than T where the encoder's
            ``stop_rel`` stopped it; [`GuaranteedEncoder`][unfold.GuaranteedEncoder]), or None when the encoder does not
            say.
    """

    logits: torch.Tensor
    energies: Optional[Dict[str, torch.Tensor]] = None
    states: Optional[List[torch.Tensor]] = None
    guaranteed: bool = False
    states_dtype: torch.dtype = torch.float32
    inputs: Optional[tuple] = None
    layers_used: Optional[torch.Tensor] = None

    def report(self, tol_factor: float = 64.0) -> DescentReport:
        """Descent statistics of the trace (increases flagged with the dtype-aware tolerance)."""
        return report_from_values(self.energies, self.states_dtype, tol_factor, self.guaranteed)


#: the positional signals of `TokenEmbedding` (``positional``); ``True`` is ``learned``, ``False`` ``none``
POSITIONAL = ("learned", "sinusoidal", "none")


def positional_kind(value, name: str = "positional") -> str:
    """``value`` as one of `POSITIONAL`: ``True`` (configs and bundles written before the choice) is
    ``learned``, ``False`` is ``none``; anything else is a [`ConfigError`][energies.ConfigError] naming ``name`` and the
    value."""
    if value is True or value is False:
        return "learned" if value else "none"
    if isinstance(value, str) and value in POSITIONAL:
        return value
    raise ConfigError(f"{name} must be one of {' | '.join(POSITIONAL)} (or true = learned, false = none), got "
                      f"{value!r:.80}")


def sinusoidal_positions(n: int, d: int, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The fixed encoding of Vaswani et al. (2017, section 3.5), ``(n, d)``: for position ``p`` and ``i >= 0``,

        PE[p, 2i] = sin(p / 10000^(2i / d)),    PE[p, 2i + 1] = cos(p / 10000^(2i / d))

    (an odd ``d`` ends with a sine column). Computed in float64 on ``device`` (``meta`` included: no data, no
    host sync), returned in ``dtype``; no parameters."""
    p = torch.arange(n, device=device, dtype=torch.float64)
    two_i = torch.arange(0, d, 2, device=device, dtype=torch.float64)
    angle = p[:, None] / torch.pow(10000.0, two_i / d)[None]
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(1)[:, :d].to(dtype)


class TokenEmbedding(nn.Module):
    """ids ``(B, n)`` -> tokens ``(B, n, d)``: an embedding table (``embed_dim`` wide, optionally ``pretrained``
    and frozen), a linear map to ``d``, a positional signal added (``positional``, for ``n <= max_len``) and
    dropout: ``X = drop(proj(embed(ids)) + P[:n])``, ``P`` learned (``"learned"`` or ``True``: a parameter
    table, ``pos.weight``), `sinusoidal_positions` (``"sinusoidal"``: fixed, computed in the forward pass,
    nothing in the state dict) or zero (``"none"`` or ``False``). ``P`` acts before the encoder: the energy the
    layers descend stays a function of their states ``Y`` alone.

    Args:
        vocab_size: the table's rows, an integer >= 1.
        d: the token width, an integer >= 1.
        embed_dim: the table's width (default d; taken from ``pretrained`` when given).
        pretrained: a floating ``(vocab_size, dim)`` table to start from (GloVe), or None.
        freeze: keep the table fixed (no gradient).
        positional: ``learned`` (or True), ``sinusoidal`` or ``none`` (or False).
        max_len: the longest sequence the positions cover, an integer >= 1.
        dropout: the dropout probability, in [0, 1].
        pad_idx: the padding id, in ``[0, vocab_size)`` (its row gets no gradient).
    """

    def __init__(self, vocab_size: int, d: int, embed_dim: Optional[int] = None,
                 pretrained: Optional[torch.Tensor] = None, freeze: bool = False, positional: bool | str = True,
                 max_len: int = 512, dropout: float = 0.0, pad_idx: int = 0):
        super().__init__()
        vocab_size = check_int(vocab_size, "vocab_size", 1, error=ConfigError)
        d = check_int(d, "d", 1, error=ConfigError)
        self.max_len = check_int(max_len, "max_len", 1, error=ConfigError)
        dropout = check_number(dropout, "dropout", "probability", ConfigError)
        if pretrained is not None:
            if not isinstance(pretrained, torch.Tensor) or pretrained.ndim != 2 or not pretrained.dtype.is_floating_point:
                raise ConfigError(f"pretrained embeddings must be a floating (vocab_size, dim) tensor, got "
                                  f"{getattr(pretrained, 'shape', type(pretrained).__name__)}")
            if pretrained.shape[0] != vocab_size:
                raise ConfigError(f"pretrained embeddings have {pretrained.shape[0]} rows, vocabulary has {vocab_size}")
            embed_dim = pretrained.shape[1]
        embed_dim = check_int(embed_dim, "embed_dim", 1, error=ConfigError) if embed_dim is not None else d
        pad_idx = check_int(pad_idx, "pad_idx", 0, vocab_size - 1, ConfigError)
        entries = vocab_size * embed_dim + (embed_dim + 1) * d + self.max_len * d
        check_memory(8 * entries, f"token embedding with vocab_size={vocab_size}, embed_dim={embed_dim}, d={d}, "
                     f"max_len={self.max_len}: {entries:,} float32 weights", ConfigError,
                     "use smaller sizes", device=torch.get_default_device())      # not the allocator's TypeError
        check_flag(freeze, "freeze", ConfigError)
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_idx)
        if pretrained is not None:
            with torch.no_grad():
                self.embed.weight.copy_(pretrained)
        self.embed.weight.requires_grad_(not freeze)
        self.proj = nn.Linear(embed_dim, d)
        self.positional = positional_kind(positional)
        self.pos = nn.Embedding(self.max_len, d) if self.positional == "learned" else None
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``(B, n)`` of any integer dtype (`check_ids`: refused otherwise,
        [`TokenError`][energies.TokenError] naming ids and the value), on the embedding's device (metadata: a meta or
        CPU mix is named, never torch's error); their range ``[0, vocab_size)`` is checked where `host_checks` (the CPU;
        never ``meta``; an accelerator with ``validate``), so that a bad id is named, not torch's IndexError."""
        if isinstance(ids, torch.Tensor):
            check_same_device(ids, self, "ids")
        ids = check_ids(ids, self.embed.num_embeddings)
        X = self.proj(self.embed(ids))
        if self.positional != "none":
            if ids.shape[1] > self.max_len:
                raise ConfigError(f"sequence length {ids.shape[1]} exceeds max_len={self.max_len}")
            if self.pos is not None:
                X = X + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
            else:
                X = X + sinusoidal_positions(ids.shape[1], X.shape[-1], X.device, X.dtype)[None]
        return self.drop(X)


#: integer dtypes whose every value is an int64 too: widened for the embedding (which takes int32 and int64 only)
_WIDEN = (torch.int8, torch.int16, torch.uint8, torch.uint16, torch.uint32)


def check_ids(ids, vocab_size: int, validate: bool = False) -> torch.Tensor:
    """Token ids as the embedding takes them: a ``(B, n)`` tensor of an integer dtype (else
    [`TokenError`][energies.TokenError] naming ids and the dtype or shape). int8/int16/uint8/uint16/uint32 are widened
    to int64 (value for value); uint64 is read as its int64 bits. Where `host_checks` (CPU, or ``validate``; never meta)
    every id must lie in ``[0, vocab_size)``, else a [`TokenError`][energies.TokenError] naming the first bad id by its
    true value (a uint64 id of 2^64 - 1 is named so, not as the -1 of its int64 bits) and its position."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TokenError(f"ids must be an integer tensor of token ids, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.ndim != 2:
        raise InputError(f"ids must be a (B, n) tensor of token ids, got shape {tuple(ids.shape)}")
    u64 = ids.dtype == torch.uint64
    ids = ids.view(torch.int64) if u64 else ids.to(torch.int64) if ids.dtype in _WIDEN else ids
    if ids.numel() and host_checks(ids, validate):
        bad = (ids < 0) | (ids >= vocab_size)
        if bool(bad.any()):
            pos = tuple(int(i) for i in bad.nonzero()[0])
            value = int(ids[pos]) % 2 ** 64 if u64 else int(ids[pos])
            raise TokenError(f"ids must lie in [0, {vocab_size}) (the vocabulary), got {value} at {pos}")
    return ids


def masked_mean(Y: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of the real tokens of each example, ``sum_u m_u y_u / max(sum_u m_u, 1)`` (an example with none pools
    to 0).

    Args:
        Y: the tokens ``(B, n, d)``.
        mask: ``(B, n)``: the padding masks the encoders take, by their one rule (`bool_mask`): bool (True where a
            token is real), a 0/1 integer attention mask (Hugging Face's; read as ``mask != 0``), or None (every
            token real).

    Returns:
        ``(B, d)`` in Y's dtype.

    Raises:
        TokenError: Y not a floating ``(B, n, d)`` tensor; ([`InputError`][energies.InputError], a TokenError) a
            mask of another shape or device, or a float mask (torch's float masks are additive: ambiguous).
            Metadata only: no host read.
    """
    if not (isinstance(Y, torch.Tensor) and Y.ndim == 3 and Y.dtype.is_floating_point):
        raise TokenError(f"masked_mean: Y must be a floating (B, n, d) tensor, got "
                         f"{getattr(Y, 'dtype', type(Y).__name__)} {tuple(getattr(Y, 'shape', ()))}")
    mask = bool_mask(mask, Y.shape[:2], Y.device, "masked_mean: tokens Y")
    return (Y * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1).to(Y.dtype)


class SequenceClassifier(nn.Module):
    """embedding -> encoder -> masked mean pooling -> dropout -> head (module docstring). Inputs are checked at
    this boundary by the rule of `host_checks`: their type, dtype, shape and device always
    ([`InputError`][energies.InputError] / [`TokenError`][energies.TokenError] naming ids or the mask); their
    values (ids in the vocabulary, no example without a real token) on the CPU, and with ``validate=True`` on any
    device but meta (a host read; off the CPU the default leaves it to the data loader, and the trace marks an
    example with no real token as failed). The encoder's layer loop reads nothing.

    Args:
        embedding: a module mapping ids ``(B, n)`` to tokens ``(B, n, d)`` ([`TokenEmbedding`][unfold.TokenEmbedding]).
        encoder: a registered [`Encoder`][unfold.Encoder] (or any module with the same call).
        head: a module ``(B, d) -> (B, classes)``.
        dropout: the dropout probability on the pooled tokens, in [0, 1].
        validate: check the inputs' values on any device but meta (host reads: a debugging switch).
    """

    def __init__(self, embedding: nn.Module, encoder: Encoder, head: nn.Module, dropout: float = 0.0,
                 validate: bool = False):
        super().__init__()
        self.embedding, self.encoder, self.head = embedding, encoder, head
        self.drop = nn.Dropout(check_number(dropout, "dropout", "probability", ConfigError))
        self.validate = check_flag(validate, "validate", ConfigError)
        self.register_load_state_dict_pre_hook(lambda module, state, prefix, *rest: upgrade_state_dict(state, prefix))

    def forward(self, ids: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None, trace: bool = True,
                keep_states: bool = False, layers: Optional[int] = None, input_ids: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> ModelOutput:
        """``ids`` and ``mask`` (or Hugging Face's ``input_ids`` and ``attention_mask``, 0/1 integers); ``layers``
        unrolls the shared step more or fewer times than trained (weight-shared encoders; an untied stack refuses
        it, `check_inference_layers`, checked before anything runs)."""
        check_inference_layers(self.encoder, layers)
        if mask is not None and attention_mask is not None:
            raise ConfigError("pass mask or attention_mask, not both")
        if ids is not None and input_ids is not None:
            raise ConfigError("pass ids or input_ids, not both")
        ids = input_ids if ids is None else ids
        mask = attention_mask if mask is None else mask
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            raise InputError(f"ids must be a (B, n) tensor of token ids, got {getattr(ids, 'shape', type(ids).__name__)}")
        if ids.shape[0] < 1 or ids.shape[1] < 1:
            raise InputError(f"ids must hold at least one example of at least one token, got shape {tuple(ids.shape)}")
        check_same_device(ids, self, "ids")     # metadata: no host read
        mask = bool_mask(mask, ids.shape, ids.device, "ids", validate=self.validate)
        check_empty_rows(mask, self.validate)
        if self.validate and isinstance(self.embedding, TokenEmbedding):   # off the CPU too (a host read)
            check_ids(ids, self.embedding.embed.num_embeddings, validate=True)
        graph = self.encoder.token_graph(mask)
        X = graph.zero_padded(self.embedding(ids))
        out = self.encoder(X, mask, graph=graph, trace=trace, keep_states=keep_states, layers=layers)
        logits = self.head(self.drop(masked_mean(out.Y, mask)))
        return ModelOutput(logits, out.energies, out.states, guaranteed=out.guaranteed,
                           states_dtype=trace_dtype(out.Y.dtype), inputs=(X.detach(), mask),
                           layers_used=getattr(out, "layers_used", None))
