"""The pairwise kernels, one home each, and their registry (as PyG's ``nn/conv/``).

* :mod:`.registry`: :class:`~.registry.PairwisePass`, :class:`~.registry.Kernel`, :data:`~.registry.KERNELS`,
  :func:`~.registry.register_kernel` (a kernel declares its ``auto`` rule and its multi-head pass there);
* :mod:`.guard`: the precision guard of the expansion kernels and the z helpers;
* the kernels, registered in this order when this package is imported: :mod:`.triton` (``triton``: a
  sub-package holding the Triton kernels, :mod:`.triton.pairwise`, and the penalties' Triton functions,
  :mod:`.triton.rho`, imported only when it runs), :mod:`.softmax`, :mod:`.fused` (over the fused-attention ops
  of :mod:`.fused_ops`, whose plain-torch reference op stands beside them), :mod:`.streamed`, :mod:`.dense`,
  :mod:`.edges`, :mod:`.banded`;
* :mod:`.dispatch`: :func:`~.dispatch.pick_kernel`, :func:`~.dispatch.pairwise_pass` and the passes built on it.

May import: the rest of :mod:`energies` below the terms (errors, graph, graphs, rho), nothing else of the project.
A new kernel is one new file that imports :mod:`.registry` and calls ``register_kernel``.
"""
from . import triton, softmax, fused, streamed, dense, edges, banded  # noqa: F401  (registers them, in this order)
from . import dispatch  # noqa: F401

__all__ = ["banded", "dense", "dispatch", "edges", "fused", "fused_ops", "softmax", "streamed", "triton"]
