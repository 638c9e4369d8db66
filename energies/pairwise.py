"""Pairwise sums over a token graph: the one place where edges meet tensors (the documented import path).

The code lives in :mod:`energies.kernels`, one kernel a file (:mod:`~energies.kernels.registry`,
:mod:`~energies.kernels.guard`, :mod:`~energies.kernels.dispatch` and the kernels); this module re-exports every
name of them, so ``from energies.pairwise import pairwise_pass, register_kernel, ...`` keeps working. A module
attribute set here (a test patching ``STREAM_TILE``) does not reach the kernels: patch their own module.

The kernels compute the same quantities, so that energies and updates share the math and only
swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory), z from explicit
  differences;
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n);
* ``softmax``: complete graph with rho = exp only: softmax over all keys of the logits
  ``-z_uv = (y_u.y_v - |y_v|^2 / 2 - |y_u|^2 / 2) / tau`` (the key bias ``log beta_v`` of supplement
  eq. 35, 39 plus a per-query constant, which the softmax ignores), self included, explicit n x n logits;
* ``fused``: the same softmax in one flash-attention kernel call (:mod:`energies.fused`): no n x n
  matrix, the log-sum-exp differentiable, CPU only;
* ``streamed``: complete graph, any rho, tiles of ``STREAM_TILE`` keys: O(B n tile) memory forward
  and backward (a custom autograd function recomputes one tile at a time in the backward pass).
  ``gamma = rho'(z)`` is bounded for every rho here and the step divides by ``1 + deg``, so plain
  sums of tiles are safe.

For edge weights ``gamma_uv = rho'(z_uv)``, ``z_uv = ||y_u - y_v||^2 / (2 tau)``, one pass returns

    agg_u = sum_{v in N(u)} gamma_uv (y_v - y_u),     deg_u = sum_{v in N(u)} gamma_uv,

and, from the same pass, the pairwise energy ``sum_{{u,v} in E} tau rho(z_uv)`` per example. ``agg`` is
minus the gradient of the pairwise energy: it depends on differences only, so a token with no pull
gets exactly 0 and a fixed point of the step stays exactly fixed (``num_u = agg_u + deg_u y_u`` is
also available). On the softmax kernels, with ``S_u = sum_v exp(-z_uv) = 1 + deg_u`` (self included)
and ``P`` the softmax, ``agg_u = S_u (P Y - Y)_u``: the self term contributes ``p_uu (y_u - y_u) = 0``,
so nothing has to be removed with a separately rounded diagonal logit, ``deg_u = expm1(LSE_u)`` and
the energy is ``-tau/2 sum_u deg_u`` (../shared/NOTES.md).

Precision at every scale. z depends on differences only, so the kernels that use the expansion
``|a|^2 + |b|^2 - 2 a.b`` (dense, softmax, fused, streamed) work on tokens centred per example; its
rounding error is then about ``eps * max_u |y_u - mean|^2 / tau`` in z, which :func:`expansion_dtype`
keeps below ``EXPANSION_Z_ERROR[dtype]`` by computing in float64, or, where even float64 cannot
(``max |y|^2 / tau`` beyond ~4e6, or a tiny tau), by the streamed pass with explicit differences:
a stable formulation of every kernel, chosen per call (one host read of the largest norm; skipped
under ``torch.compile``, where the kernel runs as asked).
"""

from __future__ import annotations

from . import kernels  # noqa: F401  (registers the kernels, in order)
from .kernels.dense import _dense_kernel
from .kernels.dispatch import (_explicit_pass, _guarded_on_device, explicit_energy, pairwise_energy, pairwise_pass, pairwise_pass_heads,
                               pick_kernel, weighted_neighbour_sums)
from .kernels.edges import _edges_pass
from .kernels.fused import _fused_kernel, _fused_only
from .kernels.guard import (EXPANSION_Z_ERROR, EXPLICIT_TILE_ELEMENTS, _centred, _explicit_tile, _f64, _own_dtype,
                            _scale_dtype, dense_z, edge_z, expansion_dtype, expansion_ok, explicit_z)
from .kernels.registry import (AUTO_RULES, HEADS_PASSES, KERNELS, Kernel, PairwisePass, _any_graph, apply_metric,
                               kernel_names, register_auto_rule, register_heads_pass, register_kernel)
from .kernels.softmax import (DEGREE_BLOCK_ELEMENTS, PAD_LOGIT, _degree_energy, _from_lse, _fused_parts,
                              _softmax_degrees, _softmax_kernel, _softmax_only, _softmax_parts)
from .kernels.streamed import STREAM_MIN_N, STREAM_TILE, _complete_only, _streamed_kernel, _streamed_pass, _StreamedSums, _tile
from .kernels.triton_kernel import _TRITON, _triton_heads, _triton_kernel, _triton_supports, triton_unavailable
from .rho import kernel_sensitivity

_apply = apply_metric

#: every name of the kernel modules that this module has always offered, private ones included (tests use them)
__all__ = ["AUTO_RULES", "DEGREE_BLOCK_ELEMENTS", "EXPANSION_Z_ERROR", "EXPLICIT_TILE_ELEMENTS", "HEADS_PASSES",
           "KERNELS", "Kernel", "PAD_LOGIT", "PairwisePass", "STREAM_MIN_N", "STREAM_TILE", "_StreamedSums",
           "_TRITON", "_any_graph", "_apply", "_centred", "_complete_only", "_degree_energy", "_dense_kernel",
           "_edges_pass", "_explicit_pass", "_explicit_tile", "_f64", "_from_lse", "_fused_kernel", "_fused_only",
           "_fused_parts", "_guarded_on_device", "_own_dtype", "_scale_dtype", "_softmax_degrees", "_softmax_kernel",
           "_softmax_only", "_softmax_parts", "_streamed_kernel", "_streamed_pass", "_tile", "_triton_heads",
           "_triton_kernel", "_triton_supports", "apply_metric", "dense_z", "edge_z", "expansion_dtype",
           "expansion_ok", "explicit_z", "kernel_names", "kernel_sensitivity", "kernels",
           "explicit_energy", "pairwise_energy", "pairwise_pass",
           "pairwise_pass_heads", "pick_kernel", "register_auto_rule", "register_heads_pass", "register_kernel",
           "triton_unavailable", "weighted_neighbour_sums"]
