"""The pairwise kernels, one file each, and their registry (as PyG's ``nn/conv/``).

* :mod:`.registry`: :class:`~.registry.PairwisePass`, :class:`~.registry.Kernel`, :data:`~.registry.KERNELS`,
  :func:`~.registry.register_kernel` (and the optional auto and multi-head rules of a kernel);
* :mod:`.guard`: the precision guard of the expansion kernels and the z helpers;
* the kernels, registered in this order when this package is imported: :mod:`.triton_kernel` (``triton``),
  :mod:`.softmax`, :mod:`.fused`, :mod:`.streamed`, :mod:`.dense`, :mod:`.edges`; ``banded`` is
  :mod:`energies.banded`, registered by :mod:`energies` after these;
* :mod:`.dispatch`: :func:`~.dispatch.pick_kernel`, :func:`~.dispatch.pairwise_pass` and the passes built on it.

:mod:`energies.pairwise` re-exports every name of these modules (the documented import path). May import:
the rest of :mod:`energies` below the terms (errors, graph, rho, fused, triton_pairwise), nothing else of the
project. A new kernel is one new file that imports :mod:`.registry` and calls ``register_kernel``.
"""
from . import triton_kernel, softmax, fused, streamed, dense, edges  # noqa: F401  (registers them, in this order)
from . import dispatch  # noqa: F401

__all__ = ["dense", "dispatch", "edges", "fused", "softmax", "streamed", "triton_kernel"]
