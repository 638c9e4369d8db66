"""``UnfoldedTransformer``: the classifier of the experiments in one constructor.

``UnfoldedTransformer(vocab_size, num_classes, mode=...)`` is a [`SequenceClassifier`][unfold.SequenceClassifier]
of a [`TokenEmbedding`][unfold.TokenEmbedding], the encoder registered as ``mode`` in
[`unfold.encoders.ENCODERS`][unfold.ENCODERS] (``guaranteed``, ``free``, ``baseline`` or a plug-in's) and a linear head:
a convenience for the keyword arguments of the three built-in encoders. To build your own model, compose the
parts (README, "Use it in your own model").
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from energies.checks import check_int
from energies.memory import check_memory
from energies.errors import ConfigError

from .classifier import ModelOutput, SequenceClassifier, TokenEmbedding
from .encoders import CURVATURES, ENCODERS, NORMS, build_encoder

__all__ = ["UnfoldedTransformer", "ModelOutput", "MODES", "CURVATURES", "NORMS"]


#: the encoder names (``model.mode``): the registry `unfold.encoders.ENCODERS` itself (plug-ins included)
MODES = ENCODERS

#: arguments every mode uses (the embedding, the pooled tokens' dropout, the debug switch), never refused
_EVERY_MODE = ("d", "dropout", "validate")


def _at_default(value, default) -> bool:
    """``value`` equals ``default`` as a plain Python value: a tensor, or a bool where the default is a number (or
    the reverse), is not the default (``True == 1.0`` would pass otherwise, and a tensor's ``==`` is no truth)."""
    if isinstance(value, torch.Tensor) or isinstance(value, bool) != isinstance(default, bool):
        return False
    try:
        return bool(value == default)
    except Exception:       # a value whose == raises is no default
        return False


def _refuse_inapplicable(given, params, mode) -> None:
    """A ConfigError for the first argument in ``given`` that ``mode``'s encoder does not take (``params``) and
    that is not at [`UnfoldedTransformer`][unfold.UnfoldedTransformer]'s default."""
    defaults = inspect.signature(UnfoldedTransformer.__init__).parameters
    for key, value in given.items():
        if key in params or key in _EVERY_MODE:
            continue
        default = defaults[key].default
        off = value is None or _at_default(value, 0) if key == "stop_rel" else _at_default(value, default)  # (0: off)
        if not off:
            takes = sorted(k for k in given if k in params and k not in _EVERY_MODE)
            raise ConfigError(f"{key}={value!r} does not apply to mode={mode}, whose encoder takes {takes}; "
                              f"leave {key} at its default ({default!r})")


class UnfoldedTransformer(SequenceClassifier):
    """Embedding, the ``mode`` encoder, masked mean pooling and a linear head (module docstring). An encoder
    argument the mode's encoder does not take is refused unless left at its default (``alpha`` with ``free``,
    ``ffn_mult`` with ``guaranteed``, ...): nothing given is silently ignored.

    Args:
        vocab_size: the embedding's rows.
        num_classes: the head's outputs.
        d: the token width.
        heads: attention heads.
        d_head: each head's width (guaranteed; default ``d // heads``).
        layers: T.
        mode: a registered encoder (``guaranteed``, ``free``, ``baseline`` or a plug-in's).
        rho: the attention energy's penalty ([`energies.get_rho`][energies.get_rho]).
        tau: the temperature (default sqrt(d_head) for guaranteed, sqrt(d) for the traced E1 of the others).
        graph: the token graph spec.
        alpha: the step size (guaranteed), in (0, 1].
        ffn: include the feed-forward term.
        relu: include the ReLU (non-negativity) term.
        layernorm: include the LayerNorm terms.
        embed_dim: the embedding width when it differs from d (a projection follows).
        pretrained: an embedding matrix to start from (GloVe).
        freeze_embed: keep the embedding fixed.
        positional: ``learned``, ``sinusoidal`` or ``none`` (True/False: learned/none).
        max_len: the longest sequence the positions cover.
        ffn_mult: the feed-forward width multiple (free / baseline).
        dropout: the dropout probability of the embedding and of the pooled tokens (every mode) and of the layers
            (free / baseline).
        pad_idx: the padding token id.
        curvature: ``adaptive`` or ``constant`` (guaranteed).
        attention: the attention activation (free / baseline).
        attention_temperature: its temperature (free / baseline).
        norm: the normalisation (free only).
        kernel: the pairwise kernel or ``auto``.
        validate: check inputs at every forward (host reads: a debugging switch).
        stop_rel: the energy-chosen depth's EPS (guaranteed; None or 0: off;
            [`GuaranteedEncoder`][unfold.GuaranteedEncoder]).
    """

    def __init__(self, vocab_size: int, num_classes: int, d: int = 64, heads: int = 2, d_head: Optional[int] = None,
                 layers: int = 4, mode: str = "guaranteed", rho: str = "exp", tau: Optional[float] = None,
                 graph: str = "complete", alpha: float = 1.0, ffn: bool = True, relu: bool = True,
                 layernorm: bool = False, embed_dim: Optional[int] = None, pretrained: Optional[torch.Tensor] = None,
                 freeze_embed: bool = False, positional: bool | str = True, max_len: int = 512, ffn_mult: int = 2,
                 dropout: float = 0.1, pad_idx: int = 0, curvature: str = "adaptive",
                 attention: Optional[str] = None, attention_temperature: float = 1.0, norm: Optional[str] = None,
                 kernel: str = "auto", validate: bool = False, stop_rel: Optional[float] = None):
        if not isinstance(mode, str) or mode not in ENCODERS:
            raise ConfigError(f"mode={mode!r} is unknown; valid: {sorted(ENCODERS)}")
        if mode == "guaranteed" and attention is not None:
            raise ConfigError(f"attention={attention!r} applies to the free and baseline encoders; in the guaranteed "
                              "encoder the attention kernel is rho's derivative: rho=exp (softmax), relu:C (ReLU), "
                              "softplus:C:T (softplus)")
        if mode != "free" and norm is not None:
            raise ConfigError(f"norm applies to the free encoder only (mode={mode}); the guaranteed encoder has the "
                              "LayerNorm energy terms (layernorm), the baseline torch's post-LN layers")
        if mode != "guaranteed" and curvature != "adaptive":
            raise ConfigError(f"curvature applies to the guaranteed encoder only (mode={mode})")
        params = inspect.signature(ENCODERS[mode]).parameters
        if "stop_rel" not in params and stop_rel is not None and stop_rel != 0:
            raise ConfigError(f"stop_rel={stop_rel!r} (the energy-chosen depth) applies to weight-shared encoders "
                              f"that take it (guaranteed), not to mode={mode}")
        num_classes = check_int(num_classes, "num_classes", 1, error=ConfigError)
        given = dict(d=d, heads=heads, d_head=d_head, layers=layers, rho=rho, tau=tau, graph=graph, alpha=alpha,
                     ffn=ffn, relu=relu, layernorm=layernorm, curvature=curvature, kernel=kernel, ffn_mult=ffn_mult,
                     dropout=dropout, attention=attention, attention_temperature=attention_temperature, norm=norm,
                     validate=validate, stop_rel=stop_rel)
        _refuse_inapplicable(given, params, mode)
        kwargs = {k: v for k, v in given.items() if k in params and v is not None}
        # embedding, head, encoder: the order in which earlier versions drew the initial weights of a seed
        embedding = TokenEmbedding(vocab_size, d, embed_dim, pretrained, freeze_embed, positional, max_len,
                                   dropout, pad_idx)
        check_memory(8 * (int(d) + 1) * num_classes, f"head with d={int(d)}, num_classes={num_classes}", ConfigError,
                     "use fewer classes", device=torch.get_default_device())        # not the allocator's TypeError
        head = nn.Linear(int(d), num_classes)
        super().__init__(embedding, build_encoder(mode, **kwargs), head, dropout, validate)
        self.mode = mode

    # ------------------------------------------------------------------ the encoder's attributes, as before
    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            encoder = self._modules.get("encoder")
            if encoder is not None and hasattr(encoder, name):
                return getattr(encoder, name)
            raise

    @property
    def graph_spec(self) -> str:
        return self.encoder.graph_spec

    @property
    def max_len(self) -> int:
        return self.embedding.max_len

    def energy(self, B: torch.Tensor):
        """The energy the encoder descends (guaranteed) or is traced against (the others), anchored at B."""
        return self.encoder.energy(B)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    def encode(self, X: torch.Tensor, mask: torch.Tensor, graph=None, trace: bool = False, keep_states: bool = False,
               layers: Optional[int] = None):
        """The layer stack alone: ``(Y_T, energies, states)`` from embedded tokens X (zero on padded slots)."""
        out = self.encoder(X, mask, graph=graph, trace=trace, keep_states=keep_states, layers=layers)
        return out.Y, out.energies, out.states

