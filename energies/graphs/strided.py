"""The ``strided:K`` graph: the Sparse Transformer pattern (Child et al. 2019), local and strided heads joined."""
from __future__ import annotations

from ..errors import GraphError

from .container import TokenGraph
from .kit import check_sizes, from_pattern, pairs_at_offsets, positive_int
from .registry import register_graph


@register_graph("strided", mask_free=True)
def strided(n: int, k: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Sparse Transformer strided pattern (Child et al. 2019) with stride ``k``.

    The union of its two heads: the local head ``0 < |i - j| < k`` and the strided head
    ``|i - j| = 0 (mod k)``. A stride of n or more leaves the local head alone, all pairs (offsets are
    clamped to n - 1: O(n + |E|) for any k).

    Args:
        n: token slots per example.
        k: the stride, an integer >= 2.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: unused (every builder takes it).

    Returns:
        The [`TokenGraph`][energies.TokenGraph] named ``strided:K``, with its offsets (shift-invariant:
        the ``banded`` kernel's case).

    Raises:
        GraphError: a size that is not an integer >= 1, k not an integer >= 2, or more edges than a builder
            materialises.
    """
    n, batch_size, _ = check_sizes(n, batch_size, seed)
    k = positive_int(k, "stride k")
    if k < 2:
        raise GraphError(f"stride k must be >= 2, got {k}")
    offsets = sorted(set(range(1, min(k, n))) | set(range(k, n, k)))
    return from_pattern(pairs_at_offsets(n, offsets, batch_size, f"strided:{k} on n={n}"), n, batch_size, mask,
                         f"strided:{k}", offsets)
