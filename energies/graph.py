"""Token graphs: one representation for complete and sparse graphs, batched, with padding.

A :class:`TokenGraph` describes ``B`` sequences of ``n`` token slots each. Slot ``i``
of example ``b`` has the flat id ``b * n + i`` (PyTorch Geometric's batching
convention). The graph is *undirected by definition*: it holds each undirected
edge ``{u, v}`` exactly once, canonically as ``u < v`` (supplement B.1 sums over
the edge set ``E`` once per edge), so every energy counts an edge once whatever
orientation(s) the user wrote it in.

A padding ``mask`` (``True`` where a token is real) removes padded slots from the
graph: they are in no edge, and energies skip them in every term.

The complete graph is kept implicit (``edge_index is None``); :meth:`TokenGraph.edges`
materialises it as all pairs ``u < v`` of real tokens when an edge list is needed.

The code lives in :mod:`energies.graphs`, one builder a file (the container :mod:`~energies.graphs.container`, the
edge checks :mod:`~energies.graphs.edges`, the registry :mod:`~energies.graphs.registry`, the builders, the spec
reader :mod:`~energies.graphs.spec` and the cache :mod:`~energies.graphs.cache`); this module re-exports every name
of them (the documented import path: ``from energies.graph import TokenGraph, window, register_graph, ...``).
"""

from __future__ import annotations

from . import graphs  # noqa: F401  (registers the builders, in order)
from .graphs.cache import GraphCache
from .graphs.complete import complete
from .graphs.container import (SAME_WIDTH_INT, TokenGraph, _and_bits, _BitsFunc, _MaskBits, _MaskBitsFunc, _route,
                               _select_bits, _SelectBits, _SelectBitsFunc, check_tokens, mask_bits, select_bits)
from .graphs.dilated import dilated
from .graphs.edge_list import from_edge_index, from_pyg
from .graphs.edges import MAX_SLOTS, _check_mask, canonical_edges, check_int, check_number, check_seed, mask_from_lengths
from .graphs.random_graph import RANDOM_PAIRWISE_MAX, _distinct, _upper_pairs, random
from .graphs.registry import (GRAPHS, MASK_FREE, MAX_EDGES, _check_edges, _from_pattern, _pairs_at_offsets,
                              _positive_int, _register, _sizes, register_graph)
from .graphs.spec import _spec_arity, graph_from_spec
from .graphs.star import star
from .graphs.strided import strided
from .graphs.window import window

#: the public names (as before the split); every other name imported above stays importable from here too
__all__ = [
    "TokenGraph",
    "complete",
    "window",
    "strided",
    "dilated",
    "star",
    "random",
    "from_edge_index",
    "from_pyg",
    "mask_from_lengths",
    "GRAPHS",
    "register_graph",
    "graph_from_spec",
    "canonical_edges",
    "GraphCache",
    "MASK_FREE",
    "check_tokens",
]
#: the rest of what this module offered (helpers the tests and plug-ins use), listed so that it counts as used
_REEXPORTED = (graphs, SAME_WIDTH_INT, _and_bits, _BitsFunc, _MaskBits, _MaskBitsFunc, _route, _select_bits,
               _SelectBits, _SelectBitsFunc, mask_bits, select_bits, MAX_SLOTS, _check_mask, check_int,
               check_number, check_seed, RANDOM_PAIRWISE_MAX, _distinct, _upper_pairs, MAX_EDGES, _check_edges,
               _from_pattern, _pairs_at_offsets, _positive_int, _register, _sizes, _spec_arity)
