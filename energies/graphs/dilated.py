"""The ``dilated:K[:R]`` graph: a dilated window, ``{i, i + m k}`` for ``m = 1..R``."""
from __future__ import annotations

from .container import TokenGraph
from .kit import check_sizes, from_pattern, pairs_at_offsets, positive_int
from .registry import register_graph


@register_graph("dilated", mask_free=True)
def dilated(n: int, k: int, radius: int = 1, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Dilated window: ``{i, i + m k}`` for ``m = 1..radius``. Offsets of n or more join no pair, so the
    radius is clamped to ``(n - 1) // k`` (O(n + |E|) for any k and radius; no edge when k >= n).

    Args:
        n: token slots per example.
        k: the dilation, an integer >= 1.
        radius: how many multiples of k, an integer >= 1 (default 1).
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: unused (every builder takes it).

    Returns:
        The [`TokenGraph`][energies.TokenGraph] named ``dilated:K:R``, with its offsets
        (shift-invariant: the ``banded`` kernel's case).

    Raises:
        GraphError: a size, k or radius that is not an integer >= 1, or more edges than a builder materialises.
    """
    n, batch_size, _ = check_sizes(n, batch_size, seed)
    k = positive_int(k, "dilation k")
    radius = positive_int(radius, "dilated radius")
    reach = min(radius, (n - 1) // k)
    offsets = [k * m for m in range(1, reach + 1)]
    return from_pattern(pairs_at_offsets(n, offsets, batch_size, f"dilated:{k}:{radius} on n={n}"), n, batch_size,
                         mask, f"dilated:{k}:{radius}", offsets)
