"""``UnfoldedAttentionConv``: the attention MM step as a PyTorch Geometric ``MessagePassing`` layer.

Node features X ``(N, d)`` on the undirected graph of ``edge_index`` (either orientation or both;
self loops and duplicates are dropped), anchor B (``x0``, the initial residual of supplement F.4;
zero when not given), heads h with metrics W_h ``(d, d_h)``:

    E(X) = sum_h sum_{{u,v} in E} tau rho( ||W_h^T (x_u - x_v)||^2 / (2 tau) ) + 1/2 ||X - B||^2
           [+ indicator(X >= 0) with ``relu=True``]                              (supplement eq. 33)

One layer is one majorization-minimization step on E, with ``gamma^h_uv = rho'(z^h_uv)``:

* no metric (``head_channels=None``, one head): the exact Jacobi step of eq. 36-37,
  ``x_u <- (1 - alpha) x_u + alpha (sum_v gamma_uv x_v + b_u) / (1 + sum_v gamma_uv)``, computed as
  ``x_u + alpha (sum_v gamma_uv (x_v - x_u) + b_u - x_u) / (1 + deg_u)`` (exactly fixed at a fixed point);
* learned metrics: the majorized proximal step of :mod:`unfold.prox`,
  ``x_u <- [ReLU]( x_u - alpha grad_u E / c_u )``, ``c_u = 1 + sum_h 2 deg_h(u) ||W_h||_2^2``.

Both never increase E, for any weights and any 0 < alpha <= 1. The energy at the layer's input
is read off the same message pass (``return_energy=True``): the edge weights and the edge values
come from the same ``z`` per edge.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from energies import kinks
from energies.errors import GraphError, StepError, TokenError
from energies.checks import check_int, check_number
from energies.rho import get_rho
from energies.terms import ACCUM_DTYPE

from .steps import _check_alpha

__all__ = ["UnfoldedAttentionConv", "undirected_edges"]


def undirected_edges(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Both orientations of every undirected edge once, no self loops; checks ids and dtype."""
    if not isinstance(edge_index, torch.Tensor) or edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise GraphError(f"edge_index must be a (2, E) tensor, got {getattr(edge_index, 'shape', type(edge_index))}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise GraphError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise GraphError(f"edge_index holds node ids in [{int(edge_index.min())}, {int(edge_index.max())}], "
                         f"outside [0, {num_nodes}) for {num_nodes} nodes")
    ei = remove_self_loops(edge_index.long())[0]
    return coalesce(to_undirected(ei, num_nodes=num_nodes), num_nodes=num_nodes)


class UnfoldedAttentionConv(MessagePassing):
    """One attention MM step on a graph (module docstring). Usable like any PyG conv:
    ``x = conv(x, edge_index, x0)``; ``conv(x, edge_index, x0, return_energy=True)`` also returns
    the terms of E at the input ``{"attention", "residual"[, "relu"]}`` (float64 scalars);
    :meth:`energy` evaluates E alone. Apply one conv T times for a true unrolled optimisation."""

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None, rho: str = "exp",
                 tau: Optional[float] = None, alpha: float = 1.0, relu: bool = False):
        super().__init__(aggr="add", node_dim=0)
        self.channels = check_int(channels, "channels", 1, error=StepError)
        self.heads = check_int(heads, "heads", 1, error=StepError)
        if head_channels is not None:   # a head maps d features to d_h <= d (more adds nothing: W W^T has rank <= d)
            head_channels = check_int(head_channels, "head_channels", 1, self.channels, StepError)
        self.rho = get_rho(rho)
        self.alpha = _check_alpha(alpha)
        if not isinstance(relu, (bool, np.bool_)):
            raise StepError(f"relu must be True or False, got {relu!r}")
        self.relu = bool(relu)
        metric = head_channels is not None or self.heads > 1
        self.head_channels = (head_channels or self.channels) if metric else self.channels
        self.tau = (check_number(tau, "tau", "positive", StepError) if tau is not None
                    else math.sqrt(self.head_channels))
        if relu and not metric:
            raise StepError("relu=True needs the proximal form: give head_channels (a learned metric)")
        self.W = nn.Parameter(torch.randn(self.heads, self.channels, self.head_channels)
                              / math.sqrt(self.channels)) if metric else None

    # ------------------------------------------------------------------ the one pass
    def _pass(self, x: torch.Tensor, edge_index: torch.Tensor, x0: Optional[torch.Tensor], values: bool,
              sums: bool = True):
        """``(z, agg, deg, b, values)`` with ``agg^h_u = sum_v gamma^h_uv (z^h_v - z^h_u)``; ``sums=False``
        skips the message passing (agg, deg None): an energy-only pass."""
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != self.channels:
            raise TokenError(f"x must be (num_nodes, {self.channels}), got {tuple(getattr(x, 'shape', ()))}")
        if not x.dtype.is_floating_point:
            raise TokenError(f"x must be a finite floating tensor (dtype {x.dtype}; NaN/Inf not allowed)")
        if x0 is not None and (not isinstance(x0, torch.Tensor) or not x0.dtype.is_floating_point):
            raise TokenError(f"x0 must be a floating tensor like x, got {getattr(x0, 'dtype', type(x0).__name__)}")
        b = torch.zeros_like(x) if x0 is None else x0.to(x.dtype)
        if b.shape != x.shape:
            raise TokenError(f"x0 has shape {tuple(b.shape)}, x has {tuple(x.shape)}")
        finite = torch.isfinite(x).all() if x0 is None else torch.isfinite(x).all() & torch.isfinite(b).all()
        if not bool(finite):   # one host sync for both, as before x0 was checked
            bad = "x" if not bool(torch.isfinite(x).all()) else "x0"
            raise TokenError(f"{bad} must be a finite floating tensor (dtype {x.dtype}; NaN/Inf not allowed)")
        ei = undirected_edges(edge_index, x.shape[0])
        N = x.shape[0]
        z = x[:, None, :] if self.W is None else torch.einsum("nd,hdk->nhk", x, self.W.to(x.dtype))  # (N, H, k)
        src, dst = ei
        ze = ((z[src] - z[dst]) ** 2).sum(-1) / (2.0 * self.tau)                     # (E, H), each pair twice
        agg = deg = None
        if sums:
            out = self.propagate(ei, z=z, gamma=self.rho.derivative(ze), size=(N, N))  # (N, H, k + 1)
            agg, deg = out[..., :-1], out[..., -1]
        vals = None
        if values:
            vals = OrderedDict(attention=0.5 * self.tau * self.rho.value(ze).to(ACCUM_DTYPE).sum(),
                               residual=0.5 * ((x - b).to(ACCUM_DTYPE) ** 2).sum())
            if self.relu:
                vals["relu"] = torch.where((x >= 0).all(), 0.0, math.inf).to(ACCUM_DTYPE)
        return z, agg, deg, b, vals

    def message(self, z_i: torch.Tensor, z_j: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        """``[gamma_uv (z_v - z_u), gamma_uv]`` per directed edge v -> u and head (differences only, so a
        node with no pull gets exactly 0)."""
        return torch.cat([gamma[..., None] * (z_j - z_i), gamma[..., None]], -1)

    def _prox_parts(self, x, agg, deg, b):
        """``(grad E, c)`` of the metric form: ``grad_u = -sum_h W_h agg^h_u + x_u - b_u``,
        ``c_u = 1 + sum_h 2 deg_h(u) ||W_h||_2^2``."""
        W = self.W.to(x.dtype)
        grad = (x - b) - torch.einsum("nhk,hdk->nd", agg, W)
        norm2 = torch.linalg.matrix_norm(W.detach(), ord=2) ** 2                      # (H,)
        return grad, 1.0 + 2.0 * (deg * norm2).sum(-1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, x0: Optional[torch.Tensor] = None,
                return_energy: bool = False):
        z, agg, deg, b, vals = self._pass(x, edge_index, x0, return_energy)
        if self.W is None:  # exact Jacobi step (eq. 36-37), as an increment: a fixed point stays exactly fixed
            out = x + self.alpha * (agg[:, 0] + (b - x)) / (1.0 + deg[:, 0])[:, None]
        else:              # majorized proximal step (unfold.prox)
            grad, curv = self._prox_parts(x, agg, deg, b)
            out = x - self.alpha * grad / curv[:, None]
            if self.relu:
                out = kinks.relu(out)
        return (out, vals) if return_energy else out

    def energy(self, x: torch.Tensor, edge_index: torch.Tensor, x0: Optional[torch.Tensor] = None) -> torch.Tensor:
        """E(x) (float64 scalar), from the same per-edge z as the step (no message passing needed)."""
        return sum(self._pass(x, edge_index, x0, True, sums=False)[4].values())

    def extra_repr(self) -> str:
        form = "exact" if self.W is None else f"prox, W {tuple(self.W.shape)}"
        return (f"{self.channels}, heads={self.heads}, rho={self.rho.spec()}, tau={self.tau:g}, "
                f"alpha={self.alpha:g}, {form}{', relu' if self.relu else ''}")
