"""The ``random:P`` graph: each pair of real tokens an edge with probability P, seeded."""
from __future__ import annotations

from typing import Tuple

import torch

from .container import TokenGraph
from .edges import check_number
from .kit import check_edge_count, check_sizes
from .registry import register_graph


#: up to this many candidate pairs per example, `random` draws one uniform number per pair (its
#: realisations for a seed are those of every earlier version); above, it draws the edge count and then the
#: edges themselves: the same distribution in O(n + |E|) time and memory.
RANDOM_PAIRWISE_MAX = 2 ** 21


def _distinct(N: int, m: int, gen: torch.Generator) -> torch.Tensor:
    """``m`` distinct integers drawn uniformly from ``[0, N)`` (a uniform m-subset), sorted; ``m <= N / 2``."""
    out = torch.zeros(0, dtype=torch.long)
    while out.numel() < m:
        draw = torch.randint(0, N, (int(1.1 * (m - out.numel())) + 16,), generator=gen)
        out = torch.unique(torch.cat([out, draw]))
    if out.numel() > m:   # a uniform subset of the distinct draws (themselves a uniform subset given their count)
        out = torch.sort(out[torch.randperm(out.numel(), generator=gen)[:m]]).values
    return out


def _upper_pairs(k: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row-major index k of the strict upper triangle of an n x n matrix -> ``(i, j)``, ``i < j``."""
    def start(i):
        return i * (2 * n - i - 1) // 2

    i = torch.floor(((2 * n - 1) - torch.sqrt(torch.clamp((2.0 * n - 1) ** 2 - 8.0 * k.double(), min=0.0))) / 2).long()
    i = i.clamp(0, n - 2)
    for _ in range(3):   # float64 rounding may leave i off by one either way
        i = torch.where(k < start(i), i - 1, i)
        i = torch.where(k >= start(i + 1), i + 1, i)
    return i, k - start(i) + i + 1


@register_graph("random", mask_free=True)
def random(n: int, p: float, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Erdos-Renyi graph: each pair ``u < v`` of each example is an edge with probability ``p``, independently.

    O(n + |E|) time and memory above `RANDOM_PAIRWISE_MAX` candidate pairs per example. The edges are drawn
    over all n slots whatever the mask (so the graph is ``mask_free``); those touching a padded slot are dropped.

    Args:
        n: token slots per example.
        p: the edge probability, in [0, 1].
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: the generator's seed, an integer in [0, 2^63): the same seed gives the same edges.

    Returns:
        The [`TokenGraph`][energies.TokenGraph] named ``random:P``.

    Raises:
        GraphError: a size that is not an integer >= 1, p outside [0, 1], a seed out of range, or more expected
            edges than a builder materialises.
    """
    n, batch_size, seed = check_sizes(n, batch_size, seed)
    p = check_number(p, "edge probability p", "probability")
    pairs = n * (n - 1) // 2
    check_edge_count(p * pairs, batch_size, f"random:{p:g} on n={n}")
    gen = torch.Generator().manual_seed(seed)
    src, dst = [], []
    if pairs <= RANDOM_PAIRWISE_MAX:
        iu = torch.triu_indices(n, n, offset=1)
        for b in range(batch_size):
            keep = torch.rand(iu.shape[1], generator=gen) < p
            src.append(iu[0, keep] + b * n)
            dst.append(iu[1, keep] + b * n)
    else:
        counts = torch.binomial(torch.full((batch_size,), float(pairs), dtype=torch.float64),
                                torch.full((batch_size,), p, dtype=torch.float64), generator=gen)
        for b in range(batch_size):
            m = min(int(counts[b]), pairs)
            if 2 * m <= pairs:
                keys = _distinct(pairs, m, gen)
            else:             # dense: draw the pairs left out (fewer), keep the rest (|E| >= pairs / 2)
                keep = torch.ones(pairs, dtype=torch.bool)
                keep[_distinct(pairs, pairs - m, gen)] = False
                keys = keep.nonzero().reshape(-1)
            i, j = _upper_pairs(keys, n)
            src.append(i + b * n)
            dst.append(j + b * n)
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    return TokenGraph(batch_size, n, mask, ei, name=f"random:{p:g}")
