"""Energy functions of token matrices on token graphs.

Every layer of an unfolded transformer is one majorization-minimization step on one of these
energies (see [`unfold`][unfold]). Main objects:

* [`TokenGraph`][energies.TokenGraph] and builders [`complete`][energies.complete], [`window`][energies.window],
  [`strided`][energies.strided], [`dilated`][energies.dilated], [`star`][energies.star], [`random`][energies.random],
  [`from_edge_index`][energies.from_edge_index], [`from_pyg`][energies.from_pyg];
* penalties rho ([`get_rho`][energies.get_rho]: ``exp``, ``relu``, ``softplus``, ``cauchy``, ``lp``), validated on value
  and derivative when built, each value at full relative precision;
* pairwise kernels ([`KERNELS`][energies.KERNELS], [`register_kernel`][energies.register_kernel]: ``edges``, ``dense``,
  ``softmax``, ``fused``, ``streamed``, ``banded``), selected by name or ``auto``;
* terms ([`PairwiseAttention`][energies.PairwiseAttention], [`Residual`][energies.Residual],
  [`FeedForward`][energies.FeedForward], [`NonNegativity`][energies.NonNegativity], [`Centering`][energies.Centering],
  [`Rescaling`][energies.Rescaling]) and the composite [`Energy`][energies.Energy]; each term owns its value, gradient,
  curvature bound and Jacobi diagonal ([`MMParts`][energies.MMParts]) and, for an indicator, its proximal map.

Layer: the bottom of the project. May import: nothing of the project outside [`energies`][energies] (torch, numpy;
PyG and Triton lazily). The code of graphs and kernels is in `energies.graphs` and `energies.kernels`, one
builder or kernel a file (every kernel's code under `energies.kernels`), their public names re-exported by
`energies.graphs` and `energies.kernels`.
"""
from .energy import Energy, attention_energy, feedforward_energy, layernorm_energy, nonnegativity_energy
from .errors import CheckpointError, ConfigError, DescentError, EnergyError, GraphError, InputError, StepError, TokenError, UnfoldError
from .graphs import (GRAPHS, TokenGraph, check_graph_spec, check_tokens, from_edge_index, from_pyg, graph_from_spec,
                     mask_from_lengths, random, register_graph)
# the builders named like their modules, imported from the modules (a reader of the source then cannot take the
# name for the module)
from .graphs.complete import complete
from .graphs.dilated import dilated
from .graphs.star import star
from .graphs.strided import strided
from .graphs.window import window
from .rho import RHOS, CauchyRho, ExpRho, LpRho, ReluRho, Rho, SoftplusRho, check_rho, get_rho, register_rho
from .kernels import KERNELS, Kernel, kernel_names, register_kernel
from .terms import (ACCUM_DTYPE, Centering, EnergyTerm, FeedForward, MMParts, NonNegativity, PairwiseAttention,
                    PassStats, Rescaling, Residual)


#: the public API, stated (not computed) so that tools reading the source (the API reference) see it
__all__ = [
    "ACCUM_DTYPE", "CauchyRho", "Centering", "CheckpointError", "ConfigError", "DescentError", "Energy",
    "EnergyError", "EnergyTerm", "ExpRho", "FeedForward", "GRAPHS", "GraphError", "InputError", "KERNELS",
    "Kernel", "LpRho", "MMParts", "NonNegativity", "PairwiseAttention", "PassStats", "RHOS", "ReluRho", "Rescaling",
    "Residual", "Rho", "SoftplusRho", "StepError", "TokenError", "TokenGraph", "UnfoldError",
    "attention_energy", "check_graph_spec", "check_rho", "check_tokens", "complete", "dilated", "feedforward_energy",
    "from_edge_index", "from_pyg", "get_rho", "graph_from_spec", "kernel_names", "layernorm_energy",
    "mask_from_lengths", "nonnegativity_energy", "random", "register_graph",
    "register_kernel", "register_rho", "star", "strided", "window",
]
