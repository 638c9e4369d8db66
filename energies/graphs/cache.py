"""The graph cache: `GraphCache`, the graphs of one spec for batches of masks, built on the mask's device once
per shape (or per mask pattern for a builder whose edges depend on the mask)."""
from __future__ import annotations

import os
from typing import Dict

import torch

from .container import TokenGraph
from .edges import check_int, check_seed
from .registry import MASK_FREE
from .spec import edge_array_graph, graph_from_spec

#: ``torch.compiler.disable`` made at a function's first call, not when this module is imported: the decorator
#: imports ``torch._dynamo`` (seconds), which a command that never compiles (``unfold-data inspect``,
#: ``unfold-train --print-config``) should not pay. torch's own lazy form, the one torch uses inside itself for this
#: reason; ``torch.compiler.disable`` where a torch lacks it.
_not_compiled = getattr(torch, "_disable_dynamo", torch.compiler.disable)


class GraphCache:
    """Token graphs of one spec for batches of masks, built on the mask's device and cached by shape.

    ``cache(mask)`` equals ``graph_from_spec(spec, n, batch_size=B, mask=mask, seed=seed)`` on the mask's device.
    The complete graph is implicit: built per call from the mask with no host read. A `MASK_FREE` spec is
    built once per ``(B, n, device)`` and masked on the device ([`TokenGraph.with_mask`][energies.TokenGraph.with_mask]:
    one selection of the edges). Any other spec (``star``, user graphs not declared mask-free) depends on the mask: it
    is built on the host from the mask (one read) and cached by the mask's bytes, up to ``maxsize`` patterns; on
    ``meta`` (no values: a forward there computes shapes) it is the graph of all-real examples under the meta mask.

    ``edges``: the ``2 x m`` edge list of a file spec, already read (a pinned graph, as a model bundle holds it):
    the graphs are built from this array, never from the file, which may since have changed or gone."""

    def __init__(self, spec: str = "complete", seed: int = 0, maxsize: int = 64, edges=None):
        self.spec, self.seed = spec, check_seed(seed)
        self.maxsize = check_int(maxsize, "maxsize", 1)
        self.edges = edges
        self._graphs: Dict[tuple, TokenGraph] = {}

    def _build(self, n: int, B: int, mask=None) -> TokenGraph:
        if self.edges is not None:
            return edge_array_graph(self.edges, n, B, mask, self.spec)
        return graph_from_spec(self.spec, n, batch_size=B, mask=mask, seed=self.seed)

    @property
    def mask_free(self) -> bool:
        if self.edges is not None:
            return True
        name = self.spec.partition(":")[0]
        return name in MASK_FREE or self.spec.endswith(".npy") or os.path.sep in self.spec

    def __call__(self, mask: torch.Tensor) -> TokenGraph:
        B, n = mask.shape
        if self.spec == "complete":
            return TokenGraph(B, n, mask, None, name="complete")
        return self._sparse(mask)

    @_not_compiled
    def _sparse(self, mask: torch.Tensor) -> TokenGraph:
        """A sparse graph: built (on the host, outside any compiled region) and cached, then masked."""
        B, n = mask.shape
        if self.mask_free:
            key = (B, n, str(mask.device))
            if key not in self._graphs:
                with torch.device("cpu"):          # built on the host (also under a device context), then moved
                    graph = self._build(n, B)
                self._store(key, graph.to(mask.device))
            return self._graphs[key].with_mask(mask)
        meta = mask.device.type == "meta"     # no values to build from: a meta forward computes shapes (those of
        host = torch.ones(B, n, dtype=torch.bool, device="cpu") if meta else mask.detach().cpu()   # all-real ones)
        key = (B, n, str(mask.device), host.numpy().tobytes())
        if key not in self._graphs:
            with torch.device("cpu"):
                graph = self._build(n, B, host)
            self._store(key, graph.to(mask.device))
        return self._graphs[key].with_mask(mask) if meta else self._graphs[key]

    def _store(self, key, graph: TokenGraph) -> None:
        if len(self._graphs) >= self.maxsize:
            self._graphs.pop(next(iter(self._graphs)))
        self._graphs[key] = graph

    def clear(self) -> None:
        self._graphs.clear()

    def __repr__(self) -> str:
        return f"GraphCache(spec={self.spec!r}, cached={len(self._graphs)})"
