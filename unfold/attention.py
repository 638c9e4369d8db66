"""Standard attention modules with a choice of activation (Lai, Lim, Liu, "Attention is a smoothed
cubic spline", section 1.3-1.7), for the free mode, baselines and the spline probe.

Rows are tokens here (the paper's columns). For queries from X ``(B, n, d)`` and keys/values from a
context C ``(B, m, d)`` (C = X for self-attention), per head h with ``Q = X W_q^h``, ``K = C W_k^h``,
``V = C W_v^h``:

    S = Q K^T / sqrt(d_h)                                 (the paper's K(X)^T Q(X), eq. 3)
    softmax:  A = SoftMax_row(S)                          (eq. 3)
    relu:     A = ReLU(S) / m_j                           (section 1.9: ReLU attention)
    softplus: A = t Softplus(S / t) / m_j                 (section 4: the smooth proxy of ReLU)
    out = concat_h(A V) W_o

``causal=True`` is the masked attention of eq. 8-9: query j sees keys i <= j only (masked scores
are -inf before the activation, so their weight is 0 for all three activations). ``forward(x,
context)`` with a context is the encoder-decoder attention gamma(X, Y) of eq. 13: keys and values
from the encoder output, queries from the decoder, so that with ReLU it is quadratic in the
context, linear in x, cubic in both (Theorem 3.3). m_j is the number of keys query j may see
(all m keys without a mask; j + 1 under the causal mask; the real keys of a padded batch): a
constant for a given mask, so it keeps outputs of order one, makes an example's output independent
of how much padding its batch has, and leaves the spline degree unchanged.

The activation is a module (``nn.ReLU``, ``nn.Softplus``, `RowSoftmax`), so that hooks see
every pre-activation (the spline probe reads ReLU sign patterns this way).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
from torch import nn

from energies.checks import as_bool_mask, check_flag, check_int, check_number
from energies.errors import ConfigError, TokenError
from energies.memory import check_memory

__all__ = ["Attention", "ACTIVATIONS", "RowSoftmax", "TemperedSoftplus", "make_activation"]


class RowSoftmax(nn.Module):
    """Softmax over the keys (last dimension)."""

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s, dim=-1)


class TemperedSoftplus(nn.Module):
    """``t softplus(s / t) = relu(s) + t log(1 + exp(-|s| / t))``: smooth for every t > 0, within
    ``t log 2`` of ReLU (attained at s = 0), and computed without overflow or a linear switch-over
    (torch's ``nn.Softplus`` turns linear above a threshold, which is not smooth)."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.t = float(temperature)
        if not self.t > 0:
            raise ConfigError(f"softplus attention needs temperature > 0, got {temperature}")

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        out = torch.relu(s) + self.t * torch.log1p(torch.exp(-s.abs() / self.t))
        return torch.where(torch.isneginf(s), torch.zeros_like(out), out)   # masked scores weigh 0


ACTIVATIONS: Dict[str, Callable[[float], nn.Module]] = {
    "softmax": lambda temperature: RowSoftmax(),
    "relu": lambda temperature: nn.ReLU(),
    "softplus": TemperedSoftplus,
}


def make_activation(name: str, temperature: float = 1.0) -> nn.Module:
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ConfigError(f"unknown attention activation {name!r}; valid: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name](temperature)


class Attention(nn.Module):
    """Multi-head attention ``out = concat_h(A V) W_o`` with ``A`` the ``softmax | relu | softplus`` activation of
    ``S = Q K^T / sqrt(d_h)`` (module docstring; Lai, Lim, Liu eq. 3, heads stacked as in eq. 5; section 1.9,
    section 4).

    ``key_padding_mask`` ``(B, m)``: True (or 1, a 0/1 integer mask) where a key is real; padded keys get weight
    0; a float mask is refused (`energies.checks.as_bool_mask`). ``dropout``
    acts on the attention weights in training mode.

    Args:
        d: the token width, >= 1.
        heads: the number of heads, >= 1.
        activation: ``softmax``, ``relu`` or ``softplus`` ([`ACTIVATIONS`][unfold.ACTIVATIONS]).
        causal: the masked attention of eq. 8-9 (query j sees keys i <= j only).
        temperature: t of the softplus activation ``t Softplus(S / t)``, > 0 (unused by the others).
        bias: give the query, key, value and output maps a bias.
        d_head: each head's width d_h (None or 0: ``max(d // heads, 1)``).
        dropout: the dropout probability on the attention weights.
    """

    def __init__(self, d: int, heads: int = 1, activation: str = "softmax", causal: bool = False,
                 temperature: float = 1.0, bias: bool = False, d_head: Optional[int] = None,
                 dropout: float = 0.0):
        super().__init__()
        self.d, self.heads = check_int(d, "d", 1, error=ConfigError), check_int(heads, "heads", 1, error=ConfigError)
        self.d_head = (check_int(d_head, "d_head", 1, error=ConfigError) if d_head is not None
                       else max(self.d // self.heads, 1))
        dropout = check_number(dropout, "dropout", "probability", ConfigError)
        try:        # checked whatever the activation, in the softplus activation's wording
            check_number(temperature, "temperature", "positive", ConfigError)
        except ConfigError:
            raise ConfigError(f"attention needs a finite temperature > 0, got temperature={temperature!r}") from None
        check_flag(causal, "causal", ConfigError), check_flag(bias, "bias", ConfigError)
        inner = self.heads * self.d_head
        check_memory(8 * (4 * self.d * inner + 4 * inner), f"attention with d={self.d}, heads={self.heads}, "
                     f"d_head={self.d_head}: {4 * self.d * inner:,} float32 weights", ConfigError,
                     "use a smaller d, heads or d_head", device=torch.get_default_device())   # not torch's TypeError
        self.q, self.k, self.v = (nn.Linear(self.d, inner, bias=bias) for _ in range(3))
        self.o = nn.Linear(inner, self.d, bias=bias)
        self.activation_name = activation
        self.act = make_activation(activation, temperature)
        self.causal = bool(causal)
        self.drop = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, n, _ = x.shape
        return x.reshape(B, n, self.heads, self.d_head).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None, allowed: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        """``allowed`` ``(B, n, m)`` bool (True = query may see key) restricts attention to a token graph."""
        context = x if context is None else context
        for name, t in (("x", x), ("context", context)):
            if not isinstance(t, torch.Tensor) or t.ndim != 3 or t.shape[-1] != self.d:
                raise TokenError(f"attention {name} must be (B, n, {self.d}), got {tuple(getattr(t, 'shape', ()))}")
        B, n, m = x.shape[0], x.shape[1], context.shape[1]
        Q, K, V = self._split(self.q(x)), self._split(self.k(context)), self._split(self.v(context))
        S = Q @ K.transpose(-1, -2) / math.sqrt(self.d_head)                       # (B, H, n, m)
        keep = torch.ones(n, m, dtype=torch.bool, device=x.device)
        if self.causal:
            if context is not x and m != n:
                raise ConfigError("causal attention needs as many keys as queries")
            keep = torch.tril(keep)                                                 # key i <= query j
        keep = keep[None].expand(B, n, m)
        if key_padding_mask is not None:        # bool or 0/1 integers, as every mask (`as_bool_mask`)
            keep = keep & as_bool_mask(key_padding_mask, TokenError)[:, None, :]
        if allowed is not None:
            keep = keep & allowed
        S = S.masked_fill(~keep[:, None], -math.inf)
        A = self.act(S)
        if self.activation_name != "softmax":
            A = A / keep.sum(-1, keepdim=True).clamp_min(1)[:, None].to(A.dtype)    # m_j keys visible
        # rows with no key at all (softmax of all -inf is NaN) weigh nothing; any other NaN or inf (an overflow)
        # stays what it is, so that it is seen downstream (nan_to_num here once made overflow read as 0)
        A = self.drop(torch.where(keep.any(-1, keepdim=True)[:, None], A, torch.zeros((), dtype=A.dtype,
                                                                                      device=A.device)))
        out = (A @ V).transpose(1, 2).reshape(B, n, self.heads * self.d_head)
        return self.o(out)

    def extra_repr(self) -> str:
        return f"d={self.d}, heads={self.heads}, activation={self.activation_name}, causal={self.causal}"
