"""Pairwise sums over a token graph: the one place where edges meet tensors.

Two kernels compute the same quantities, so that energies and updates share the math
and only swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory);
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n).

For edge weights ``gamma_uv = rho'(z_uv)``, ``z_uv = ||y_u - y_v||^2 / (2 tau)``, they return

    num_u = sum_{v in N(u)} gamma_uv y_v,     deg_u = sum_{v in N(u)} gamma_uv,

and the pairwise energy ``sum_{{u,v} in E} tau rho(z_uv)`` per example.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .graph import TokenGraph
from .rho import Rho

__all__ = ["KERNELS", "pick_kernel", "edge_z", "dense_z", "weighted_neighbour_sums", "pairwise_energy"]

KERNELS = ("edges", "dense")


def pick_kernel(graph: TokenGraph, kernel: str = "auto") -> str:
    """``auto``: dense for complete graphs, edges otherwise."""
    if kernel == "auto":
        return "dense" if graph.is_complete else "edges"
    if kernel not in KERNELS:
        from .errors import EnergyError

        raise EnergyError(f"unknown pairwise kernel {kernel!r}; valid: {list(KERNELS) + ['auto']}")
    return kernel


def edge_z(Yf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, tau: float) -> torch.Tensor:
    """``z_e = ||y_src - y_dst||^2 / (2 tau)`` per edge, from explicit differences."""
    diff = Yf[src] - Yf[dst]
    return (diff * diff).sum(-1) / (2.0 * tau)


def dense_z(Y: torch.Tensor, tau: float) -> torch.Tensor:
    """``(B, n, n)`` matrix of ``z_uv`` by the expansion ``|y_u|^2 + |y_v|^2 - 2 y_u.y_v`` (clamped at 0)."""
    sq = (Y * Y).sum(-1)
    d2 = sq[:, :, None] + sq[:, None, :] - 2.0 * Y @ Y.transpose(1, 2)
    return torch.clamp(d2, min=0.0) / (2.0 * tau)


def _masked(Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
    """Padded slots set to zero so that NaN/Inf there cannot leak through 0 * x."""
    return torch.where(graph.mask[..., None], Y, torch.zeros((), dtype=Y.dtype, device=Y.device))


def weighted_neighbour_sums(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float,
                            kernel: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """``(num, deg)`` with ``num_u = sum_v gamma_uv y_v`` ``(B, n, d)`` and ``deg_u = sum_v gamma_uv`` ``(B, n)``."""
    kernel = pick_kernel(graph, kernel)
    Y = _masked(Y, graph)
    B, n, d = Y.shape
    if kernel == "dense":
        gamma = rho.derivative(dense_z(Y, tau)) * graph.pair_mask().to(Y.dtype)
        return gamma @ Y, gamma.sum(-1)
    Yf = Y.reshape(B * n, d)
    src, dst = graph.edges()
    gamma = rho.derivative(edge_z(Yf, src, dst, tau))
    num = torch.zeros_like(Yf).index_add(0, src, gamma[:, None] * Yf[dst]).index_add(0, dst, gamma[:, None] * Yf[src])
    deg = torch.zeros(B * n, dtype=Y.dtype, device=Y.device).index_add(0, src, gamma).index_add(0, dst, gamma)
    return num.reshape(B, n, d), deg.reshape(B, n)


def pairwise_energy(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float,
                    kernel: str = "auto") -> torch.Tensor:
    """``sum_{{u,v} in E} tau * rho(z_uv)`` per example, ``(B,)``, each undirected edge once."""
    kernel = pick_kernel(graph, kernel)
    Y = _masked(Y, graph)
    B, n, d = Y.shape
    if kernel == "dense":
        pm = graph.pair_mask()
        vals = torch.where(pm, rho.value(dense_z(Y, tau)), torch.zeros((), dtype=Y.dtype, device=Y.device))
        return 0.5 * tau * vals.sum((1, 2))  # every pair appears twice in the symmetric matrix
    src, dst = graph.edges()
    vals = tau * rho.value(edge_z(Y.reshape(B * n, d), src, dst, tau))
    return torch.zeros(B, dtype=Y.dtype, device=Y.device).index_add(0, src // n, vals)
