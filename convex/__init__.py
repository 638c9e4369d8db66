"""Convex attention, MLP-Mixer, FNO and MLP heads solved to global optimality, with certificates.

* `convex.heads`: the heads as linear maps of block variables Z (``make_head``, ``HEADS``), their
  adjoints, the lift from non-convex multi-head weights and the map back;
* `convex.losses`: squared and softmax cross-entropy losses with their conjugates and Hessian products;
* `convex.solver`: proximal gradient / monotone FISTA with singular-value thresholding, and
  ``method="newton"`` (FISTA warm-up, then proximal steps alternating with trust-region Newton-CG steps on
  the Burer-Monteiro factors), duality gap, ``beta_max``, ranks, and the objective traced per iteration.

Layer: beside [`unfold`][unfold]. May import: [`energies`][energies] and [`unfold`][unfold], nothing else of the
project.
"""
from .heads import HEADS, Head, make_head, register_head
from .losses import LOSSES, get_loss, register_loss
from .solver import ConvexSolution, beta_max, certificate, map_back, rank, solve, svt

#: the public API, stated (not computed) so that tools reading the source (the API reference) see it
__all__ = [
    "ConvexSolution", "HEADS", "Head", "LOSSES", "beta_max", "certificate", "get_loss", "make_head", "map_back",
    "rank", "register_head", "register_loss", "solve", "svt",
]
