"""Token graphs: one representation for complete and sparse graphs, batched, with padding.

A [`TokenGraph`][energies.TokenGraph] describes ``B`` sequences of ``n`` token slots each. Slot ``i``
of example ``b`` has the flat id ``b * n + i`` (PyTorch Geometric's batching
convention). The graph is *undirected by definition*: it holds each undirected
edge ``{u, v}`` exactly once, canonically as ``u < v`` (supplement B.1 sums over
the edge set ``E`` once per edge), so every energy counts an edge once whatever
orientation(s) the user wrote it in.

A padding ``mask`` (``True`` where a token is real) removes padded slots from the
graph: they are in no edge, and energies skip them in every term.

The complete graph is kept implicit (``edge_index is None``); [`TokenGraph.edges`][energies.TokenGraph.edges]
materialises it as all pairs ``u < v`` of real tokens when an edge list is needed.

One builder a file (as PyG's ``nn/conv/``), apart from the container, the registry and the cache:

* `edges`: edge lists and masks checked (`canonical_edges`, [`mask_from_lengths`][energies.mask_from_lengths]);
* `container`: [`TokenGraph`][energies.TokenGraph] and [`check_tokens`][energies.check_tokens];
* `registry`: [`GRAPHS`][energies.GRAPHS] and [`register_graph`][energies.register_graph];
* `kit`: what a builder may use (checked sizes, the edge budget, patterns of pairs at offsets), public and
  listed in its `__all__`;
* the builders, registered in this order when this package is imported: `complete`, `window`,
  `strided`, `dilated`, `star`, `random_graph` (``random``);
* `edge_list` ([`from_edge_index`][energies.from_edge_index], [`from_pyg`][energies.from_pyg]), `spec`
  ([`graph_from_spec`][energies.graph_from_spec]), `cache` (`GraphCache`).

This package is the documented import path of their public names (``from energies.graphs import TokenGraph,
window, register_graph, ...``; the builders are also ``energies.window`` etc.). May import: energies' errors, checks
and registry helpers; nothing else of the project. A new graph is one new file that imports
[`TokenGraph`][energies.TokenGraph], `register_graph` and the kit (`energies.graphs.kit`), and decorates its builder
with ``register_graph``.
"""
from . import complete, window, strided, dilated, star, random_graph  # noqa: F401  (registers them, in this order)
from . import edge_list, spec, cache  # noqa: F401
from .cache import GraphCache
from .complete import complete  # noqa: F811  (the builder, as energies.complete; its module stays importable by path)
from .container import TokenGraph, check_tokens
from .dilated import dilated  # noqa: F811
from .edge_list import from_edge_index, from_pyg
from .edges import MAX_SLOTS, canonical_edges, mask_from_lengths
from .random_graph import RANDOM_PAIRWISE_MAX, random
from .kit import MAX_EDGES
from .registry import GRAPHS, MASK_FREE, register_graph
from .spec import check_graph_spec, graph_from_spec
from .star import star  # noqa: F811
from .strided import strided  # noqa: F811
from .window import window  # noqa: F811

#: the public names; private helpers are imported from their homes (energies.graphs.container, ...)
__all__ = ["GRAPHS", "GraphCache", "MASK_FREE", "MAX_EDGES", "MAX_SLOTS", "RANDOM_PAIRWISE_MAX", "TokenGraph",
           "canonical_edges", "check_graph_spec", "check_tokens", "complete", "dilated", "from_edge_index", "from_pyg", "graph_from_spec",
           "mask_from_lengths", "random", "register_graph", "star", "strided", "window"]
