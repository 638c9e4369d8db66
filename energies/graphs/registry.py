"""The graph-builder registry ([`GRAPHS`][energies.GRAPHS], [`register_graph`][energies.register_graph], `MASK_FREE`)
and what builders share: validated sizes (`_sizes`), the edge budget (`MAX_EDGES`), patterns of pairs at offsets.
Imports no builder: a builder (in this package or a plug-in) imports this and [`TokenGraph`][energies.TokenGraph]."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from ..errors import GraphError
from ..memory import check_memory
from ..registry import Registry

from .container import TokenGraph
from .edges import MAX_SLOTS, check_int, check_seed


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


def _sizes(n, batch_size, seed=0) -> Tuple[int, int, int]:
    """A builder's ``(n, batch_size, seed)`` validated (the sizes integers >= 1 with at most `MAX_SLOTS`
    slots in all, the seed in [0, 2**63))."""
    n, batch_size = check_int(n, "n (tokens per example)", 1), check_int(batch_size, "batch_size", 1)
    if n * batch_size > MAX_SLOTS:
        raise GraphError(f"n x batch_size = {n} x {batch_size} token slots, more than {MAX_SLOTS}")
    return n, batch_size, check_seed(seed)


#: the most edges (over the whole batch) a builder materialises: 2 x 2**28 int64 ids take 4 GiB, and validating
#: them several times that. The complete graph stays implicit and is not counted.
MAX_EDGES = 2 ** 28


#: bytes a builder holds per edge at its peak: the (2, m) int64 pattern, its offset copy over the batch and the
#: container's validated list (three (2, m) int64 tensors; a lower bound, for `energies.memory.check_memory`)
EDGE_BYTES = 3 * 2 * 8


def _check_edges(count: float, batch_size: int, what: str) -> None:
    """Refuse, before any allocation, a graph of more than `MAX_EDGES` edges in all, or whose edge list
    cannot fit in the memory this process may allocate (`energies.memory.check_memory`)."""
    if count * batch_size > MAX_EDGES:
        raise GraphError(f"{what} would have {count:.3g} edges per example x batch_size {batch_size}, more than "
                         f"the {MAX_EDGES} edges a builder materialises; use a smaller n, radius or p (or 'complete', "
                         "which stays implicit)")
    check_memory(count * batch_size * EDGE_BYTES, f"{what}: {count:.3g} edges per example x batch_size {batch_size}",
                 GraphError, "use a smaller n, batch, radius or p (or 'complete', which stays implicit)")


def _from_pattern(pairs: torch.Tensor, n: int, batch_size: int, mask, name: str, offsets=None) -> TokenGraph:
    """Offset a per-example ``(2, m)`` pattern over the batch and build the graph (``offsets``: the pattern is every
    pair ``{i, i + o}``, [`TokenGraph.offsets`][energies.TokenGraph.offsets])."""
    offs = torch.arange(batch_size)[:, None] * n
    src = (offs + pairs[0][None]).reshape(-1)
    dst = (offs + pairs[1][None]).reshape(-1)
    return TokenGraph(batch_size, n, mask, torch.stack([src, dst]), name=name, offsets=offsets)


def _pairs_at_offsets(n: int, offsets, batch_size: int = 1, what: str = "graph") -> torch.Tensor:
    """All pairs ``(i, i + o)`` inside ``[0, n)`` for the given positive offsets: O(|E|) memory. The callers
    pass offsets below n only (at most n - 1 of them), so time and memory are O(n + |E|) whatever the spec;
    more than `MAX_EDGES` edges in all is refused before anything is allocated."""
    offsets = [o for o in offsets if 0 < o < n]
    _check_edges(sum(n - o for o in offsets), batch_size, what)
    src, dst = [], []
    for o in offsets:
        i = torch.arange(n - o)
        src.append(i)
        dst.append(i + o)
    if not src:
        return torch.zeros(2, 0, dtype=torch.long)
    return torch.stack([torch.cat(src), torch.cat(dst)])


def _positive_int(v, what: str) -> int:
    """A graph parameter (a spec's text or a number) as an integer >= 1, of any size (builders clamp)."""
    try:
        iv = check_int(v, what)
    except GraphError:
        raise GraphError(f"{what} must be an integer, got {v!r}") from None
    if iv < 1:
        raise GraphError(f"{what} must be a positive integer, got {v!r}")
    return iv
