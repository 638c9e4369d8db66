"""The ``complete`` graph: all pairs of real tokens (plain self-attention), kept implicit."""
from __future__ import annotations

from .container import TokenGraph
from .kit import check_sizes
from .registry import register_graph


@register_graph("complete", mask_free=True)
def complete(n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """All pairs ``u < v`` of real tokens (plain self-attention, main paper eq. 9), kept implicit (no edge list).

    Args:
        n: token slots per example.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real.
        seed: unused (every builder takes it).

    Returns:
        The [`TokenGraph`][energies.TokenGraph] built with ``edge_index=None`` (``is_complete``; no edge
        list).
    """
    n, batch_size, _ = check_sizes(n, batch_size, seed)
    return TokenGraph(batch_size, n, mask, None, name="complete")
