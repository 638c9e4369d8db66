"""A sequence classifier composed of parts: embedding -> encoder -> pooling -> head.

``SequenceClassifier(embedding, encoder, head)``: any module mapping ids ``(B, n)`` to tokens ``(B, n, d)``
(:class:`TokenEmbedding` by default), any registered :class:`~unfold.encoders.Encoder` (or any module with the
same call), masked mean pooling over real tokens, and any head ``(B, d) -> (B, classes)``. ``forward(ids, mask)``
returns a :class:`ModelOutput`: logits, the energy trace of every layer (``trace=True``) and its verdict
(:meth:`ModelOutput.report`). The mask is bool (True = real token) or an integer 0/1 attention mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from energies.checks import check_int, check_number
from energies.errors import ConfigError

from .encoders import Encoder, bool_mask
from .trace import DescentReport, report_from_values

__all__ = ["ModelOutput", "TokenEmbedding", "SequenceClassifier", "masked_mean", "upgrade_state_dict"]

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
    logits: torch.Tensor
    #: ``{term: (B, T+1)}`` float64 energies at Y_0 .. Y_T (an :class:`~unfold.trace.EnergyTrace`: also the
    #: tolerance's resolution at each Y_t and the indicator terms' names; None when not traced)
    energies: Optional[Dict[str, torch.Tensor]] = None
    #: per-layer states ``[Y_0, ..., Y_T]`` when ``keep_states=True``
    states: Optional[List[torch.Tensor]] = None
    guaranteed: bool = False
    #: dtype of the states, which sets the tolerance of :meth:`report`
    states_dtype: torch.dtype = torch.float32
    #: ``(X, mask)``: the embedded tokens the layers started from (detached; for re-checks)
    inputs: Optional[tuple] = None

    def report(self, tol_factor: float = 64.0) -> DescentReport:
        """Descent statistics of the trace (increases flagged with the dtype-aware tolerance)."""
        return report_from_values(self.energies, self.states_dtype, tol_factor, self.guaranteed)


class TokenEmbedding(nn.Module):
    """ids ``(B, n)`` -> tokens ``(B, n, d)``: an embedding table (``embed_dim`` wide, optionally ``pretrained``
    and frozen), a linear map to ``d``, learned positions (``positional``, up to ``max_len``) and dropout."""

    def __init__(self, vocab_size: int, d: int, embed_dim: Optional[int] = None,
                 pretrained: Optional[torch.Tensor] = None, freeze: bool = False, positional: bool = True,
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
        if not 0 <= pad_idx < vocab_size:
            raise ConfigError(f"pad_idx={pad_idx} must lie in [0, {vocab_size})")
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_idx)
        if pretrained is not None:
            with torch.no_grad():
                self.embed.weight.copy_(pretrained)
        self.embed.weight.requires_grad_(not freeze)
        self.proj = nn.Linear(embed_dim, d)
        self.pos = nn.Embedding(self.max_len, d) if positional else None
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        X = self.proj(self.embed(ids))
        if self.pos is not None:
            if ids.shape[1] > self.max_len:
                raise ConfigError(f"sequence length {ids.shape[1]} exceeds max_len={self.max_len}")
            X = X + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
        return self.drop(X)


def masked_mean(Y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the real tokens of each example ``(B, d)`` (an example with none pools to 0)."""
    return (Y * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1).to(Y.dtype)


class SequenceClassifier(nn.Module):
    """embedding -> encoder -> masked mean pooling -> dropout -> head (module docstring). ``validate=True``
    checks ids and mask on every call (host reads); the default leaves that to the data loader."""

    def __init__(self, embedding: nn.Module, encoder: Encoder, head: nn.Module, dropout: float = 0.0,
                 validate: bool = False):
        super().__init__()
        self.embedding, self.encoder, self.head = embedding, encoder, head
        self.drop = nn.Dropout(check_number(dropout, "dropout", "probability", ConfigError))
        if not isinstance(validate, bool):
            raise ConfigError(f"validate must be True or False, got {validate!r}")
        self.validate = validate
        self.register_load_state_dict_pre_hook(lambda module, state, prefix, *rest: upgrade_state_dict(state, prefix))

    def forward(self, ids: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None, trace: bool = True,
                keep_states: bool = False, layers: Optional[int] = None, input_ids: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> ModelOutput:
        """``ids`` and ``mask`` (or Hugging Face's ``input_ids`` and ``attention_mask``, 0/1 integers); ``layers``
        unrolls the shared step more or fewer times than trained (guaranteed encoder), or runs the first layers
        only (untied encoders)."""
        if mask is not None and attention_mask is not None:
            raise ConfigError("pass mask or attention_mask, not both")
        if ids is not None and input_ids is not None:
            raise ConfigError("pass ids or input_ids, not both")
        ids = input_ids if ids is None else ids
        mask = attention_mask if mask is None else mask
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            raise ConfigError(f"ids must be a (B, n) tensor of token ids, got {getattr(ids, 'shape', type(ids).__name__)}")
        mask = bool_mask(mask, ids.shape, ids.device, "ids", validate=self.validate)
        if self.validate and not bool(mask.any(1).all()):
            raise ConfigError("every example needs at least one real token (mask row all False)")
        graph = self.encoder.token_graph(mask)
        X = graph.zero_padded(self.embedding(ids))
        out = self.encoder(X, mask, graph=graph, trace=trace, keep_states=keep_states, layers=layers)
        logits = self.head(self.drop(masked_mean(out.Y, mask)))
        return ModelOutput(logits, out.energies, out.states, guaranteed=out.guaranteed, states_dtype=out.Y.dtype,
                           inputs=(X.detach(), mask))
