"""The graph-builder registry ([`GRAPHS`][energies.GRAPHS], [`register_graph`][energies.register_graph], `MASK_FREE`).
Imports no builder: a builder (in this package or a plug-in) imports this, [`TokenGraph`][energies.TokenGraph] and
what builders share from the kit (`energies.graphs.kit`)."""
from __future__ import annotations

import os
from typing import Optional

from ..errors import GraphError
from ..registry import Registry


# ---------------------------------------------------------------------- builders
def _file_like(name: str) -> Optional[str]:
    """Why a graph name cannot be registered: a spec ending in ``.npy`` or holding a path separator names an
    edge-list file (``graph_from_spec`` reads it as one), so a builder of that name could never be selected."""
    if name.endswith(".npy") or os.sep in name or (os.altsep and os.altsep in name) or "/" in name:
        return f"{name!r} reads as an edge-list file path (it ends in .npy or holds a path separator)"
    return None


GRAPHS: Registry = Registry("graph", GraphError, None, "energies.graphs.GRAPHS", reserved=_file_like)


#: builders whose edges do not depend on the mask: building with a mask equals building without one and dropping
#: the edges at padded slots (`TokenGraph.with_mask`), so that `GraphCache` builds them once per shape
MASK_FREE = set()
_register = GRAPHS.register


def register_graph(name: str, mask_free: bool = False):
    """``@register_graph("name")`` registers a builder, selectable by name in every graph spec (``name:ARG``).

    Args:
        name: the graph's name (refused when taken: the registry's wording).
        mask_free: declare that its edges do not depend on the mask (see `MASK_FREE`), so that
            `GraphCache` builds it once per shape.

    Returns:
        The decorator, for ``f(n, *args, batch_size=1, mask=None, seed=0) -> TokenGraph``.
    """
    def deco(builder):
        _register(name)(builder)
        (MASK_FREE.add if mask_free else MASK_FREE.discard)(name)
        return builder

    return deco
