"""Token graphs, one builder a file (as PyG's ``nn/conv/``), apart from the container, the registry and the cache.

* :mod:`.edges`: edge lists and masks checked (:func:`~.edges.canonical_edges`, :func:`~.edges.mask_from_lengths`);
* :mod:`.container`: :class:`~.container.TokenGraph` and :func:`~.container.check_tokens`;
* :mod:`.registry`: :data:`~.registry.GRAPHS`, :func:`~.registry.register_graph` and what builders share;
* the builders, registered in this order when this package is imported: :mod:`.complete`, :mod:`.window`,
  :mod:`.strided`, :mod:`.dilated`, :mod:`.star`, :mod:`.random_graph` (``random``);
* :mod:`.edge_list` (:func:`~.edge_list.from_edge_index`, :func:`~.edge_list.from_pyg`), :mod:`.spec`
  (:func:`~.spec.graph_from_spec`), :mod:`.cache` (:class:`~.cache.GraphCache`).

:mod:`energies.graph` re-exports every name of these modules (the documented import path). May import: energies'
errors, checks and registry helpers; nothing else of the project. A new graph is one new file that imports
:mod:`.registry` (and :class:`~.container.TokenGraph`) and decorates its builder with ``register_graph``.
"""
from . import complete, window, strided, dilated, star, random_graph  # noqa: F401  (registers them, in this order)
from . import edge_list, spec, cache  # noqa: F401

__all__ = ["cache", "complete", "dilated", "edge_list", "random_graph", "spec", "star", "strided", "window"]
