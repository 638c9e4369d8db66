"""The graph-builder kit: what a graph builder may use besides [`TokenGraph`][energies.TokenGraph] and
[`register_graph`][energies.register_graph].

A builder `f(n, *args, batch_size=1, mask=None, seed=0) -> TokenGraph` validates its sizes with `check_sizes` and
each spec argument with `positive_int` (or `energies.graphs.edges.check_number` for a real number), refuses a graph
beyond `MAX_EDGES` with `check_edge_count` before it allocates anything, and builds a shift-invariant pattern with
`pairs_at_offsets` and `from_pattern` (its `offsets` let the `banded` kernel serve it). A builder whose edges
depend on the mask reads the mask through `energies.graphs.edges.check_mask`. Every name here is public and
listed in `__all__`; the builders of this package (`complete.py`, `window.py`, ...) use nothing else of it.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

from ..errors import GraphError
from ..memory import check_memory

from .container import TokenGraph
from .edges import MAX_SLOTS, check_int, check_seed

__all__ = ["EDGE_BYTES", "MAX_EDGES", "check_edge_count", "check_sizes", "from_pattern", "pairs_at_offsets",
           "positive_int"]

#: the most edges (over the whole batch) a builder materialises: 2 x 2**28 int64 ids take 4 GiB, and validating
#: them several times that. The complete graph stays implicit and is not counted.
MAX_EDGES = 2 ** 28

#: bytes a builder holds per edge at its peak: the (2, m) int64 pattern, its offset copy over the batch and the
#: container's validated list (three (2, m) int64 tensors; a lower bound, for `energies.memory.check_memory`)
EDGE_BYTES = 3 * 2 * 8


def check_sizes(n, batch_size, seed=0) -> Tuple[int, int, int]:
    """A builder's sizes and seed, validated.

    Args:
        n: token slots per example, an integer >= 1.
        batch_size: examples in the batch, an integer >= 1; ``n * batch_size`` at most `MAX_SLOTS`.
        seed: the builder's seed, an integer in ``[0, 2**63)``.

    Returns:
        ``(n, batch_size, seed)`` as Python integers.

    Raises:
        GraphError: a size or seed that is not an integer in its range, named with its value.
    """
    n, batch_size = check_int(n, "n (tokens per example)", 1), check_int(batch_size, "batch_size", 1)
    if n * batch_size > MAX_SLOTS:
        raise GraphError(f"n x batch_size = {n} x {batch_size} token slots, more than {MAX_SLOTS}")
    return n, batch_size, check_seed(seed)


def check_edge_count(count: float, batch_size: int, what: str) -> None:
    """Refuse, before any allocation, a graph of more than `MAX_EDGES` edges in all, or whose edge list cannot fit
    in the memory this process may allocate (`energies.memory.check_memory`, `EDGE_BYTES` an edge).

    Args:
        count: the edges per example (expected edges for a random graph).
        batch_size: examples in the batch.
        what: the graph, as the error names it (``"window:3 on n=512"``).

    Raises:
        GraphError: the graph is too large, named by ``what`` with its edge count.
    """
    if count * batch_size > MAX_EDGES:
        raise GraphError(f"{what} would have {count:.3g} edges per example x batch_size {batch_size}, more than "
                         f"the {MAX_EDGES} edges a builder materialises; use a smaller n, radius or p (or 'complete', "
                         "which stays implicit)")
    check_memory(count * batch_size * EDGE_BYTES, f"{what}: {count:.3g} edges per example x batch_size {batch_size}",
                 GraphError, "use a smaller n, batch, radius or p (or 'complete', which stays implicit)")


def from_pattern(pairs: torch.Tensor, n: int, batch_size: int, mask, name: str,
                 offsets: Optional[Iterable[int]] = None) -> TokenGraph:
    """The graph whose every example holds the same per-example pattern of pairs.

    Args:
        pairs: the ``(2, m)`` per-example ids in ``[0, n)``.
        n: token slots per example.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real (None: all real); padded slots are in no edge.
        name: the graph's name, as its spec reads (``"window:3"``).
        offsets: where the pattern is every pair ``{i, i + o}`` for these offsets (`pairs_at_offsets`), the
            offsets, kept as [`TokenGraph.offsets`][energies.TokenGraph.offsets]; None otherwise.

    Returns:
        The [`TokenGraph`][energies.TokenGraph], the pattern offset over the batch.
    """
    offs = torch.arange(batch_size)[:, None] * n
    src = (offs + pairs[0][None]).reshape(-1)
    dst = (offs + pairs[1][None]).reshape(-1)
    return TokenGraph(batch_size, n, mask, torch.stack([src, dst]), name=name, offsets=offsets)


def pairs_at_offsets(n: int, offsets: Iterable[int], batch_size: int = 1, what: str = "graph") -> torch.Tensor:
    """All pairs ``(i, i + o)`` inside ``[0, n)`` for the given positive offsets, in O(|E|) memory. Offsets outside
    ``(0, n)`` join no pair and are skipped, so a caller passing offsets below n (at most n - 1 of them) spends
    O(n + |E|) time and memory whatever the spec; more than `MAX_EDGES` edges in all is refused
    (`check_edge_count`) before anything is allocated.

    Args:
        n: token slots per example.
        offsets: the offsets o.
        batch_size: examples in the batch (for the edge budget).
        what: the graph, as a refusal names it.

    Returns:
        A ``(2, m)`` int64 tensor of the pairs, offset by offset.
    """
    offsets = [o for o in offsets if 0 < o < n]
    check_edge_count(sum(n - o for o in offsets), batch_size, what)
    src, dst = [], []
    for o in offsets:
        i = torch.arange(n - o)
        src.append(i)
        dst.append(i + o)
    if not src:
        return torch.zeros(2, 0, dtype=torch.long)
    return torch.stack([torch.cat(src), torch.cat(dst)])


def positive_int(value, what: str) -> int:
    """A graph parameter (a spec's text or a number) as an integer >= 1, of any size (builders clamp).

    Args:
        value: the parameter, as the spec or the caller gives it.
        what: its name in the refusal (``"window radius k"``).

    Returns:
        The integer.

    Raises:
        GraphError: a value that is not an integer >= 1, named by ``what``.
    """
    try:
        iv = check_int(value, what)
    except GraphError:
        raise GraphError(f"{what} must be an integer, got {value!r}") from None
    if iv < 1:
        raise GraphError(f"{what} must be a positive integer, got {value!r}")
    return iv
