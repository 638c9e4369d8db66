"""The ``window:K`` graph: each token linked to the K tokens on each side."""
from __future__ import annotations

from .container import TokenGraph
from .kit import check_sizes, from_pattern, pairs_at_offsets, positive_int
from .registry import register_graph


@register_graph("window", mask_free=True)
def window(n: int, k: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Sliding window of radius ``k``: ``{i, j}`` with ``0 < |i - j| <= k``. A radius of n - 1 or more
    is the complete graph's edge list (the radius is clamped to n - 1: O(n + |E|) for any k).

    Args:
        n: token slots per example.
        k: the radius, an integer >= 1.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: unused (every builder takes it).

    Returns:
        The [`TokenGraph`][energies.TokenGraph], with its offsets (shift-invariant: the ``banded``
        kernel's case).
    """
    n, batch_size, _ = check_sizes(n, batch_size, seed)
    k = positive_int(k, "window radius k")
    offsets = range(1, min(k, n - 1) + 1)
    return from_pattern(pairs_at_offsets(n, offsets, batch_size, f"window:{k} on n={n}"),
                         n, batch_size, mask, f"window:{k}", offsets)
