"""Pairwise sums over a token graph: the one place where edges meet tensors; every kernel, one home each, and
their registry (as PyG's ``nn/conv/``).

The kernels compute the same quantities, so that energies and updates share the math and only
swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory), z from explicit
  differences;
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n);
* ``softmax``: complete graph with rho = exp only: softmax over all keys of the logits
  ``-z_uv = (y_u.y_v - |y_v|^2 / 2 - |y_u|^2 / 2) / tau`` (the key bias ``log beta_v`` of supplement
  eq. 35, 39 plus a per-query constant, which the softmax ignores), self included, explicit n x n logits;
* ``fused``: the same softmax in one flash-attention kernel call (`energies.kernels.fused_ops`): no n x n
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
the energy is ``-tau/2 sum_u deg_u``: with rho(z) = -exp(-z), gamma_uv = exp(-z_uv) and the pairwise energy
``sum_{{u,v}} -tau exp(-z_uv) = -tau/2 sum_{u != v} gamma_uv``, so the pass that computes the update also
gives the energy (supplement eq. 35 for the softmax form of gamma).

Precision at every scale. z depends on differences only, so the kernels that use the expansion
``|a|^2 + |b|^2 - 2 a.b`` (dense, softmax, fused, streamed) work on tokens centred per example; its
rounding error is then about ``eps * max_u |y_u - mean|^2 / tau`` in z, which `expansion_dtype`
keeps below ``EXPANSION_Z_ERROR[dtype]`` by computing in float64, or, where even float64 cannot
(``max |y|^2 / tau`` beyond ~4e6, or a tiny tau), by the streamed pass with explicit differences:
a stable formulation of every kernel, chosen per call (one host read of the largest norm; skipped
under ``torch.compile``, where the kernel runs as asked).

Where things are:

* `registry`: `PairwisePass`, [`Kernel`][energies.Kernel], [`KERNELS`][energies.KERNELS],
  [`register_kernel`][energies.register_kernel] (a kernel declares its ``auto`` rule and its multi-head pass there);
* `guard`: the precision guard of the expansion kernels (the dtype rules `expansion_dtype`, `scale_dtype`,
  `own_dtype`, `expansion_ok`), the centring (`centred`), z from the expansion or from explicit differences, tiles
  of explicit differences and the float64 sums of energies;
* `lse`: the log-sum-exp form of rho = exp on the complete graph (`fused_parts`, `from_lse`, `softmax_degrees`,
  `degree_energy`, `softmax_supports`), shared by the softmax, fused and banded kernels and the multi-head pass;
* the kernels, registered in this order when this package is imported: `triton` (``triton``: a
  sub-package holding the Triton kernels, `triton.pairwise`, and the penalties' Triton functions,
  `triton.rho`, imported only when it runs), `softmax`, `fused` (over the fused-attention ops
  of `fused_ops`, whose plain-torch reference op stands beside them), `streamed`, `dense`,
  `edges`, `banded`; the exact passes the dispatcher falls back to are public in their kernels' modules
  (`edges.edges_pass`, `streamed.streamed_pass`, `triton.triton_heads`);
* `dispatch`: `pick_kernel`, `kernel_problem` (where a named kernel runs), `pairwise_pass` and the passes built
  on it.

May import: the rest of [`energies`][energies] below the terms (errors, graph, graphs, rho), nothing else of the
project. What a kernel may use is public and listed in the `__all__` of `registry`, `guard` and `lse`
(`tests/test_public_kits.py` fails when a private name crosses a module boundary). A new kernel is one new file
that imports `registry` and calls ``register_kernel``.
"""
from . import triton, softmax, fused, streamed, dense, edges, banded  # noqa: F401  (registers them, in this order)
from .dispatch import (explicit_energy, kernel_problem, pairwise_energy, pairwise_pass, pairwise_pass_heads,
                       pick_kernel, weighted_neighbour_sums)
from .guard import EXPANSION_Z_ERROR, dense_z, edge_z, expansion_dtype, expansion_ok, explicit_z
from .registry import (AUTO_RULES, HEADS_PASSES, KERNELS, Kernel, PairwisePass, apply_metric, check_kernel,
                       kernel_names, register_kernel)
from .streamed import STREAM_MIN_N
from .triton import triton_unavailable

#: the public names (the documented import path: ``from energies.kernels import pairwise_pass, register_kernel``);
#: private helpers are imported from their homes (energies.kernels.softmax, ...)
__all__ = ["AUTO_RULES", "EXPANSION_Z_ERROR", "HEADS_PASSES", "KERNELS", "Kernel", "PairwisePass", "STREAM_MIN_N",
           "apply_metric", "check_kernel", "dense_z", "edge_z", "expansion_dtype", "expansion_ok", "explicit_energy",
           "explicit_z", "kernel_names", "kernel_problem", "pairwise_energy", "pairwise_pass", "pairwise_pass_heads", "pick_kernel",
           "register_kernel", "triton_unavailable", "weighted_neighbour_sums"]
