"""A masked-token model composed of parts: embedding -> encoder -> a token head at every position.

``MaskedTokenModel(embedding, encoder, head)``: the same embedding and encoder as
[`SequenceClassifier`][unfold.SequenceClassifier] (any registered [`Encoder`][unfold.Encoder], ``baseline``
included), and a [`TokenHead`][unfold.TokenHead] giving a score for every entry of the vocabulary at
every position (or at the positions asked for). The masked inputs are the ids the model is given: whoever masks
(the application's ``masked_tokens`` task) replaces them before the call, so the encoder's energy trace traces
exactly what the model runs. ``forward`` returns a [`ModelOutput`][unfold.ModelOutput] whose ``logits`` are
``(B, n, V)``, or ``(K, V)`` for ``positions`` (K flat indices into ``B * n``).

The head is BERT's (Devlin et al., 2019): a transform ``LayerNorm(gelu(W y))`` of width ``embed_dim`` then a
decoder, tied to the embedding table (``tied=True``: ``logits = t E^T + b`` with ``E`` the
[`TokenEmbedding`][unfold.TokenEmbedding]'s table, so the head adds only ``W``, the LayerNorm and ``b``) or a
linear map of its own (``tied=False``: an embedding that is not a `TokenEmbedding`).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from energies.checks import check_flag, check_int, check_number
from energies.errors import ConfigError, InputError

from .classifier import ModelOutput, TokenEmbedding, check_ids
from .encoders import Encoder, trace_dtype
from .inputs import bool_mask, check_empty_rows, check_inference_layers, check_same_device

__all__ = ["MaskedTokenModel", "TokenHead", "tied_head"]


class TokenHead(nn.Module):
    """Scores over the vocabulary from token states: ``logits = decode(LayerNorm(gelu(W y)))``, ``decode`` tied to
    an embedding table ``E`` passed at the call (``tied``: ``t E^T / sqrt(width) + b``, T5's rescaling, so that
    logits start of unit variance over unit-variance rows) or a linear map of its own, plus a bias ``b`` per
    entry.

    Args:
        d: the token width of the states, an integer >= 1.
        vocab_size: the vocabulary's size, an integer >= 1.
        width: the transform's width (the tied table's width), an integer >= 1 (default d).
        tied: decode with the table given to `forward` (True) or with a linear map of its own (False).
    """

    def __init__(self, d: int, vocab_size: int, width: Optional[int] = None, tied: bool = True):
        super().__init__()
        d = check_int(d, "d", 1, error=ConfigError)
        vocab_size = check_int(vocab_size, "vocab_size", 1, error=ConfigError)
        width = d if width is None else check_int(width, "width", 1, error=ConfigError)
        self.tied = check_flag(tied, "tied", ConfigError)
        self.transform = nn.Linear(d, width)
        self.norm = nn.LayerNorm(width)
        self.decoder = None if self.tied else nn.Linear(width, vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        #: tied: the states scaled by width^-1/2 before the table (T5's rescaling): the table's rows are the
        #: embedding's, of unit-variance entries, and unscaled logits would start with a variance of ``width``
        self.scale = width ** -0.5 if self.tied else 1.0

    def forward(self, Y: torch.Tensor, table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Scores ``(..., vocab_size)`` of states ``Y`` ``(..., d)``.

        Args:
            Y: the token states.
            table: the tied ``(vocab_size, width)`` embedding table (required when ``tied``; else unused).

        Returns:
            The logits, in Y's dtype.
        """
        h = self.norm(nn.functional.gelu(self.transform(Y)))
        if not self.tied:
            return self.decoder(h) + self.bias
        if table is None:
            raise InputError("TokenHead(tied=True) decodes with the embedding table: pass table=")
        return nn.functional.linear(h, table, self.bias) if self.scale == 1.0 else \
            nn.functional.linear(h * self.scale, table, self.bias)


def tied_head(embedding: nn.Module, d: int, vocab_size: int) -> TokenHead:
    """The head a masked-token model over ``embedding`` takes: tied to its table where ``embedding`` is a
    [`TokenEmbedding`][unfold.TokenEmbedding] of ``vocab_size`` rows (any table width: the transform maps ``d`` to
    it), else a linear head of its own.

    Args:
        embedding: the model's embedding module.
        d: the token width.
        vocab_size: the vocabulary's size.

    Returns:
        A [`TokenHead`][unfold.TokenHead]; ``head.tied`` says which.
    """
    if isinstance(embedding, TokenEmbedding) and embedding.embed.num_embeddings == vocab_size:
        return TokenHead(d, vocab_size, embedding.embed.embedding_dim, tied=True)
    return TokenHead(d, vocab_size, tied=False)


class MaskedTokenModel(nn.Module):
    """embedding -> encoder -> token head at every position (module docstring). Inputs are checked at this
    boundary as [`SequenceClassifier`][unfold.SequenceClassifier] checks them.

    Args:
        embedding: a module mapping ids ``(B, n)`` to tokens ``(B, n, d)`` ([`TokenEmbedding`][unfold.TokenEmbedding]).
        encoder: a registered [`Encoder`][unfold.Encoder] (or any module with the same call).
        head: a [`TokenHead`][unfold.TokenHead] (`tied_head` builds the usual one); a tied head decodes
            with ``embedding.embed.weight``.
        dropout: the dropout probability on the states before the head, in [0, 1].
        validate: check the inputs' values on any device but meta (host reads: a debugging switch).
    """

    def __init__(self, embedding: nn.Module, encoder: Encoder, head: TokenHead, dropout: float = 0.0,
                 validate: bool = False):
        super().__init__()
        if getattr(head, "tied", False) and not isinstance(embedding, TokenEmbedding):
            raise ConfigError("a tied TokenHead needs a TokenEmbedding (its table decodes); use tied=False")
        self.embedding, self.encoder, self.head = embedding, encoder, head
        self.drop = nn.Dropout(check_number(dropout, "dropout", "probability", ConfigError))
        self.validate = check_flag(validate, "validate", ConfigError)

    def forward(self, ids: torch.Tensor, mask: Optional[torch.Tensor] = None, trace: bool = True,
                keep_states: bool = False, layers: Optional[int] = None,
                positions: Optional[torch.Tensor] = None) -> ModelOutput:
        """Scores of every vocabulary entry at every position (``logits (B, n, V)``) or at ``positions`` (flat
        indices into ``B * n``, int64 on ids' device: ``logits (K, V)``, the cheap way to score the masked
        positions alone, with no host read), with the encoder's energy trace.

        Args:
            ids: token ids ``(B, n)``, the masked ones already replaced.
            mask: ``(B, n)`` bool (True = real token) or 0/1 integers; None: every token real.
            trace: record the energy of every layer.
            keep_states: keep every layer's states.
            layers: unroll the shared step this many times (weight-shared encoders only).
            positions: the flat positions to score, or None for all.

        Returns:
            A [`ModelOutput`][unfold.ModelOutput].
        """
        check_inference_layers(self.encoder, layers)
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise InputError(f"ids must be a (B, n) tensor of at least one token, got "
                             f"{tuple(getattr(ids, 'shape', ())) or type(ids).__name__}")
        check_same_device(ids, self, "ids")
        mask = bool_mask(mask, ids.shape, ids.device, "ids", validate=self.validate)
        check_empty_rows(mask, self.validate)
        if self.validate and isinstance(self.embedding, TokenEmbedding):
            check_ids(ids, self.embedding.embed.num_embeddings, validate=True)
        graph = self.encoder.token_graph(mask)
        X = graph.zero_padded(self.embedding(ids))
        out = self.encoder(X, mask, graph=graph, trace=trace, keep_states=keep_states, layers=layers)
        Y = self.drop(out.Y)
        if positions is not None:
            Y = Y.reshape(-1, Y.shape[-1]).index_select(0, positions)
        table = self.embedding.embed.weight if self.head.tied else None
        return ModelOutput(self.head(Y, table), out.energies, out.states, guaranteed=out.guaranteed,
                           states_dtype=trace_dtype(out.Y.dtype), inputs=(X.detach(), mask),
                           layers_used=getattr(out, "layers_used", None))
