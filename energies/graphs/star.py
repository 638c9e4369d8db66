"""The ``star`` graph: the Star-Transformer pattern (Guo et al. 2019), a relay joined to every token, plus a ring.

Its edges depend on the mask (the relay is the first real token), so it is not ``mask_free``."""
from __future__ import annotations

import torch

from .container import TokenGraph
from .edges import check_mask
from .kit import check_sizes
from .registry import register_graph


@register_graph("star")
def star(n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Star-Transformer graph (Guo et al. 2019): a relay joined to all tokens, plus a ring.

    The relay is the first real token of each example (a [CLS]-like slot); the other real
    tokens form a ring in sequence order (closed when there are at least three of them). The edges depend on
    the mask, so the graph is built per mask (not ``mask_free``).

    Args:
        n: token slots per example.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: unused (every builder takes it).

    Returns:
        The [`TokenGraph`][energies.TokenGraph] named ``star`` (an example with fewer than two real
        tokens has no edge).

    Raises:
        GraphError: a size that is not an integer >= 1, or a mask of the wrong dtype or shape.
    """
    n, batch_size, _ = check_sizes(n, batch_size, seed)
    mask_t = check_mask(mask, batch_size, n)
    src, dst = [], []
    for b in range(batch_size):
        idx = mask_t[b].nonzero().reshape(-1).cpu() + b * n
        if idx.numel() < 2:
            continue
        relay, sat = idx[0], idx[1:]
        src.append(relay.repeat(sat.numel()))
        dst.append(sat)
        if sat.numel() >= 2:  # a ring of two is one edge, written in both orientations
            src.append(sat)
            dst.append(torch.roll(sat, -1))
    if src:
        ei = torch.stack([torch.cat(src), torch.cat(dst)])
    else:
        ei = torch.zeros(2, 0, dtype=torch.long)
    return TokenGraph(batch_size, n, mask_t, ei, name="star")
