"""Unfolded transformer models for sequence classification, with an energy trace at every layer.

``UnfoldedTransformer(mode=...)``: token embeddings -> T layers -> masked mean pool -> linear head.

* ``guaranteed``: one :class:`~unfold.prox.ProxMMStep` with weights shared over the T layers, on

      E(Y) = sum_h sum_{{u,v} in G} tau rho(||W_h^T (y_u - y_v)||^2 / (2 tau))     (one term per head)
             + 1/2 ||Y - B||^2 + 1/2 tr(Y S Y^T) + indicator(Y >= 0)
             [+ LayerNorm centring and rescaling terms, supplement F.3, if ``layernorm``]

  with B = X (the embedded input, initial residual F.4), any W_h and S = A A^T - (1 - eps) I for any
  A (exactly the symmetric S with I + S >= eps I, so E is bounded below and has a minimiser). Read as a
  network: multi-head attention with queries = keys = W_h^T y and value/output map W_h W_h^T, a
  symmetric feed-forward map S, the initial residual, ReLU, and a per-token step 1 / c_u. Every
  layer descends E for ANY parameter values (proof in :mod:`unfold.prox`), trained or not.
  The energy at layer t is read off the same attention pass that computes layer t (LSE identity
  on the complete graph with rho = exp); only E(Y_T) costs one more pass.
  With ``curvature="constant"`` the per-token step 1 / c_u uses rho'(0) x degree in place of the
  weighted degree: a fixed linear map of the gradient, so that with rho = relu:C every layer is a
  cubic spline (Lai, Lim, Liu, Lemma 3.2; checked by :mod:`experiments.spline_probe`).
* ``free``: untied standard post-LN transformer layers (Q, K, V, O, feed-forward, LayerNorm) whose
  attention (softmax, relu or softplus: :class:`~unfold.attention.Attention`) is restricted to the
  token graph; ``norm="none"`` drops the LayerNorms (the paper's add-only blocks). Its trace is the token-space attention energy
  E1(Y) = sum_G tau rho(||y_u - y_v||^2 / 2tau) + 1/2 ||Y - B||^2, evaluated on every layer's
  output: it shows how far a standard layer strays; nothing is guaranteed.
* ``baseline``: ``torch.nn.TransformerEncoder`` of the same width and depth (complete graph), traced
  with the same E1 as ``free``; a relu or softplus ``attention`` replaces its self-attention.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from energies import kinks
from energies.energy import Energy
from energies.errors import ConfigError
from energies.graph import TokenGraph, graph_from_spec
from energies.rho import get_rho
from energies.terms import ACCUM_DTYPE, Centering, FeedForward, NonNegativity, PairwiseAttention, Rescaling, Residual

from .attention import ACTIVATIONS, Attention
from .prox import ProxMMStep
from .trace import DescentReport, EnergyTrace, report_from_values, resolution

__all__ = ["UnfoldedTransformer", "ModelOutput", "MODES"]

MODES = ("guaranteed", "free", "baseline")
NORMS = ("post", "none")
CURVATURES = PairwiseAttention.CURVATURES


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


class _FreeLayer(nn.Module):
    """Standard transformer layer: attention (:class:`~unfold.attention.Attention`, activation softmax |
    relu | softplus, restricted to the token graph) and a ReLU feed-forward map, each added to its
    input; post-LN (``norm="post"``) or the paper's add-only block (``norm="none"``, Lai, Lim, Liu
    eq. 6 / section 1.10: a spline of degree 3 with ReLU attention)."""

    def __init__(self, d: int, heads: int, ffn_mult: int, dropout: float, activation: str = "softmax",
                 temperature: float = 1.0, norm: str = "post"):
        super().__init__()
        self.attn = Attention(d, heads, activation, temperature=temperature, bias=True, dropout=dropout)
        self.ffn = nn.Sequential(nn.Linear(d, ffn_mult * d), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_mult * d, d))
        self.ln1, self.ln2 = (nn.LayerNorm(d), nn.LayerNorm(d)) if norm == "post" else (nn.Identity(), nn.Identity())
        self.drop = nn.Dropout(dropout)

    def forward(self, Y, allowed):
        Y = self.ln1(Y + self.drop(self.attn(Y, allowed=allowed)))
        return self.ln2(Y + self.drop(self.ffn(Y)))


class _AsMultiheadAttention(nn.Module):
    """:class:`~unfold.attention.Attention` behind ``nn.MultiheadAttention``'s call, so that
    ``nn.TransformerEncoderLayer`` (the baseline) runs with a relu or softplus activation."""

    #: read by ``nn.TransformerEncoderLayer`` only to decide on its fused fast path, which needs
    #: ``nn.MultiheadAttention``'s own weights; False sends it down the module path (tensors stay batch-first)
    batch_first = False

    def __init__(self, attn: Attention):
        super().__init__()
        self.attn = attn

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None, need_weights=False, is_causal=False):
        real = None
        if key_padding_mask is not None:   # torch: True (bool) or -inf (float, its canonical form) = ignore this key
            real = ~key_padding_mask if key_padding_mask.dtype == torch.bool else key_padding_mask == 0
        if attn_mask is not None or is_causal:
            raise ConfigError("the baseline's relu/softplus attention takes a key padding mask only")
        return self.attn(query, key_padding_mask=real), None


class UnfoldedTransformer(nn.Module):
    """See the module docstring. ``forward(ids, mask)`` returns a :class:`ModelOutput`.

    Parameters: ``vocab_size``, ``num_classes``; ``d`` width, ``heads``, ``d_head`` (guaranteed mode;
    default d // heads), ``layers`` T, ``mode``; attention energy ``rho``, ``tau`` (default
    sqrt(d_head) in guaranteed mode, sqrt(d) for the traced E1 of the other modes), ``graph`` spec
    (complete | window:K | strided:K | dilated:K[:R] | star | random:P), ``alpha`` (step scale in
    (0, 1]), ``ffn`` (the S term), ``relu`` (the indicator term), ``layernorm`` (F.3 terms);
    ``embed_dim`` (defaults to d; 50 for GloVe), ``pretrained`` embedding matrix, ``freeze_embed``,
    ``positional`` (learned positions), ``max_len``, ``ffn_mult`` (free/baseline), ``dropout``;
    ``curvature`` (guaranteed: ``adaptive`` weighted degrees, or ``constant`` rho'(0) x degree, see
    :class:`~energies.terms.PairwiseAttention`); ``attention`` (free/baseline: softmax | relu |
    softplus, with ``attention_temperature`` for softplus; in guaranteed mode the kernel is rho's
    derivative instead: exp, relu:C, softplus:C:T); ``norm`` (free: ``post`` LayerNorm or ``none``).
    """

    EPS_S = 0.1

    def __init__(self, vocab_size: int, num_classes: int, d: int = 64, heads: int = 2, d_head: Optional[int] = None,
                 layers: int = 4, mode: str = "guaranteed", rho: str = "exp", tau: Optional[float] = None,
                 graph: str = "complete", alpha: float = 1.0, ffn: bool = True, relu: bool = True,
                 layernorm: bool = False, embed_dim: Optional[int] = None, pretrained: Optional[torch.Tensor] = None,
                 freeze_embed: bool = False, positional: bool = True, max_len: int = 512, ffn_mult: int = 2,
                 dropout: float = 0.1, pad_idx: int = 0, curvature: str = "adaptive",
                 attention: Optional[str] = None, attention_temperature: float = 1.0, norm: Optional[str] = None):
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"model.mode={mode!r} is unknown; valid: {list(MODES)}")
        if curvature not in CURVATURES:
            raise ConfigError(f"model.curvature={curvature!r} is unknown; valid: {list(CURVATURES)}")
        if attention is not None and attention not in ACTIVATIONS:
            raise ConfigError(f"model.attention={attention!r} is unknown; valid: {sorted(ACTIVATIONS)}")
        if norm is not None and norm not in NORMS:
            raise ConfigError(f"model.norm={norm!r} is unknown; valid: {list(NORMS)}")
        if mode == "guaranteed" and attention is not None:
            raise ConfigError(f"model.attention={attention!r} applies to the free and baseline modes; in guaranteed "
                              "mode the attention kernel is rho's derivative: model.rho=exp (softmax), relu:C "
                              "(ReLU), softplus:C:T (softplus)")
        if mode != "free" and norm is not None:
            raise ConfigError(f"model.norm applies to the free mode only (mode={mode}); guaranteed mode has the "
                              "LayerNorm energy terms (model.layernorm), the baseline torch's post-LN layers")
        if mode != "guaranteed" and curvature != "adaptive":
            raise ConfigError(f"model.curvature applies to the guaranteed mode only (mode={mode})")
        for name, v in (("d", d), ("heads", heads), ("layers", layers), ("vocab_size", vocab_size),
                        ("num_classes", num_classes), ("max_len", max_len)):
            if int(v) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {v}")
        if not (0.0 < float(alpha) <= 1.0):
            raise ConfigError(f"model.alpha must lie in (0, 1], got {alpha}")
        if tau is not None and not float(tau) > 0:
            raise ConfigError(f"model.tau must be > 0, got {tau}")
        if mode != "guaranteed" and int(d) % int(heads):
            raise ConfigError(f"model.d={d} must be divisible by model.heads={heads} in {mode} mode")
        if mode == "baseline" and graph != "complete":
            raise ConfigError("model.mode=baseline (torch.nn.TransformerEncoder) supports only graph=complete")
        get_rho(rho)
        self.mode, self.d, self.layers, self.heads = mode, d, layers, heads
        self.rho, self.graph_spec, self.alpha = rho, graph, float(alpha)
        self.use_ffn, self.use_relu, self.use_layernorm = ffn, relu, layernorm
        self.curvature = curvature
        self.attention = attention or ("softmax" if mode != "guaranteed" else None)
        self.norm = norm or ("post" if mode == "free" else None)
        self.d_head = d_head or max(d // heads, 1)
        self.tau = float(tau) if tau is not None else math.sqrt(self.d_head if mode == "guaranteed" else d)
        self.trace_tau = float(tau) if tau is not None else math.sqrt(d)
        embed_dim = pretrained.shape[1] if pretrained is not None else (embed_dim or d)
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_idx)
        if pretrained is not None:
            if pretrained.shape[0] != vocab_size:
                raise ConfigError(f"pretrained embeddings have {pretrained.shape[0]} rows, vocabulary has {vocab_size}")
            self.embed.weight.data.copy_(pretrained)
        self.embed.weight.requires_grad_(not freeze_embed)
        self.proj = nn.Linear(embed_dim, d)
        self.pos = nn.Embedding(max_len, d) if positional else None
        self.max_len = max_len
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d, num_classes)
        if mode == "guaranteed":
            self.W = nn.Parameter(torch.randn(heads, d, self.d_head) / math.sqrt(d))
            # S = A A^T - (1 - eps) I: exactly the symmetric matrices with lambda_min(S) >= -(1 - eps), so
            # that I + S >= eps I and E is bounded below (a true minimisation); A starts at S = 0.
            self.A = nn.Parameter(math.sqrt(1.0 - self.EPS_S) * torch.eye(d)) if ffn else None
        elif mode == "free":
            self.blocks = nn.ModuleList([_FreeLayer(d, heads, ffn_mult, dropout, self.attention, attention_temperature,
                                                    self.norm) for _ in range(layers)])
        else:
            layer = nn.TransformerEncoderLayer(d, heads, ffn_mult * d, dropout, batch_first=True)
            if self.attention != "softmax":
                layer.self_attn = _AsMultiheadAttention(Attention(d, heads, self.attention, temperature=attention_temperature,
                                                                  bias=True, dropout=dropout))
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    # ------------------------------------------------------------------ energies
    def energy(self, B: torch.Tensor) -> Energy:
        """The energy every layer descends (guaranteed) or is traced against (free, baseline), anchored at B."""
        if self.mode != "guaranteed":
            return Energy(attention=PairwiseAttention(self.rho, self.trace_tau), residual=Residual(B))
        terms = [(f"head{h}", PairwiseAttention(self.rho, self.tau, metric=self.W[h], curvature=self.curvature))
                 for h in range(self.heads)]
        terms.append(("residual", Residual(B)))
        if self.A is not None:
            terms.append(("ffn", FeedForward(self.ffn_weight(), sym_tol=math.inf)))
        if self.use_layernorm:
            terms += [("center", Centering()), ("rescale", Rescaling())]
        if self.use_relu:
            terms.append(("relu", NonNegativity()))
        return Energy(terms)

    def ffn_weight(self) -> torch.Tensor:
        """The symmetric feed-forward weight S = A A^T - (1 - eps) I (guaranteed mode)."""
        eye = torch.eye(self.d, dtype=self.A.dtype, device=self.A.device)
        return self.A @ self.A.T - (1.0 - self.EPS_S) * eye

    def token_graph(self, mask: torch.Tensor) -> TokenGraph:
        B, n = mask.shape
        return graph_from_spec(self.graph_spec, n, batch_size=B, mask=mask.cpu()).to(mask.device)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        X = self.proj(self.embed(ids))
        if self.pos is not None:
            if ids.shape[1] > self.max_len:
                raise ConfigError(f"sequence length {ids.shape[1]} exceeds model.max_len={self.max_len}")
            X = X + self.pos(torch.arange(ids.shape[1], device=ids.device))[None]
        return self.drop(X)

    # ------------------------------------------------------------------ forward
    def forward(self, ids: torch.Tensor, mask: torch.Tensor, trace: bool = True, keep_states: bool = False,
                layers: Optional[int] = None) -> ModelOutput:
        """``layers`` unrolls the shared step more or fewer times than trained (guaranteed mode), or runs
        the first ``layers`` untied layers only (free, baseline)."""
        if ids.shape != mask.shape or mask.dtype != torch.bool:
            raise ConfigError(f"ids {tuple(ids.shape)} and a bool mask of the same shape are required, "
                              f"got mask {tuple(mask.shape)} {mask.dtype}")
        if not bool(mask.any(1).all()):
            raise ConfigError("every example needs at least one real token (mask row all False)")
        graph = self.token_graph(mask)
        X = graph.zero_padded(self.embed_tokens(ids))
        Y, energies, states = self.encode(X, mask, graph, trace, keep_states, layers)
        pooled = (Y * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).to(Y.dtype)
        logits = self.head(self.drop(pooled))
        return ModelOutput(logits, energies, states,
                           guaranteed=self.mode == "guaranteed" and 0 < self.alpha <= 1, states_dtype=Y.dtype,
                           inputs=(X.detach(), mask))

    def encode(self, X: torch.Tensor, mask: torch.Tensor, graph: Optional[TokenGraph] = None, trace: bool = False,
               keep_states: bool = False, layers: Optional[int] = None):
        """The layer stack alone: embedded tokens ``X`` ``(B, n, d)`` (zero on padded slots) to
        ``(Y_T, energies, states)``: the map the spline probe follows along rays through X."""
        graph = self.token_graph(mask) if graph is None else graph
        energy = self.energy(X) if (trace or self.mode == "guaranteed") else None  # the guaranteed step needs it
        values: List[Dict[str, torch.Tensor]] = []
        res: List[torch.Tensor] = []
        states: List[torch.Tensor] = []
        if self.mode == "guaranteed":
            Y = kinks.relu(X) if self.use_relu else X
            step = ProxMMStep(energy, self.alpha)
            for _ in range(self.layers if layers is None else int(layers)):
                if keep_states:
                    states.append(Y)
                Y_next, vals, curv = step.step_with_trace(Y, graph, values=trace)
                if trace:
                    values.append(OrderedDict((k, v.detach()) for k, v in vals.items()))
                    res.append(resolution(energy, Y, graph, curv))
                Y = Y_next
        else:
            if layers is not None and not 0 <= int(layers) <= self.layers:
                raise ConfigError(f"mode={self.mode} has {self.layers} untied layers; it cannot unroll {layers} "
                                  f"(0 .. {self.layers}: the first layers only)")
            Y = X
            allowed = None
            if self.mode == "free":
                eye = torch.eye(graph.num_nodes, dtype=torch.bool, device=X.device)
                allowed = graph.pair_mask() | (eye & mask[:, :, None])
                allowed = allowed | ~mask[:, :, None]  # padded queries attend somewhere (outputs ignored)
            blocks = self.blocks if self.mode == "free" else self.encoder.layers
            for block in list(blocks)[:layers]:
                if keep_states:
                    states.append(Y)
                if trace:
                    vals, curv = _values(energy, Y, graph)
                    values.append(vals)
                    res.append(resolution(energy, Y, graph, curv))
                Y = block(Y, allowed) if self.mode == "free" else block(Y, src_key_padding_mask=~mask)
                Y = graph.zero_padded(Y)
        if keep_states:
            states.append(Y)
        energies = None
        if trace:
            vals, curv = _values(energy, Y, graph)
            values.append(vals)
            res.append(resolution(energy, Y, graph, curv))
            energies = EnergyTrace.from_layers(values, res, energy.indicators)
        return Y, energies, (states if keep_states else None)


def _values(energy: Energy, Y: torch.Tensor, graph: TokenGraph):
    """``(values, c)``: every term's value at Y (float64 per example) by the layers' own kernels (energy-only
    passes), and the MM curvature bound c at Y (for the tolerance's resolution)."""
    vals: Dict[str, torch.Tensor] = OrderedDict()
    curv = 0.0
    with torch.no_grad():
        for name, term in energy.terms.items():
            if term.is_indicator:
                vals[name] = term.pass_value(Y, graph).to(ACCUM_DTYPE)
                continue
            v, c = term.pass_value_and_curvature(Y, graph)
            vals[name] = v.to(ACCUM_DTYPE)
            curv = curv + c
    return vals, curv
