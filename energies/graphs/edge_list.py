"""Graphs from a user edge list ([`from_edge_index`][energies.from_edge_index]) and from a PyG ``Data``/``Batch``
([`from_pyg`][energies.from_pyg])."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..checks import check_flag
from ..errors import GraphError

from .container import TokenGraph
from .edges import canonical_edges
from .kit import check_sizes, from_pattern


def from_edge_index(edge_index, n: int, batch_size: int = 1, mask=None, shared: bool = True,
                    name: str = "edge_index") -> TokenGraph:
    """Graph from a user edge list.

    ``shared=True``: ids in ``[0, n)``, the same graph for every example of the batch.
    ``shared=False``: flat ids in ``[0, batch_size * n)`` (PyG batching), one graph per example.

    Args:
        edge_index: a ``(2, m)`` integer tensor (or array) of ids, each undirected edge once in either orientation
            or in both; no self loop, no edge repeated in one orientation.
        n: token slots per example.
        batch_size: examples in the batch.
        mask: ``(B, n)`` bool, True where a token is real; edges touching a padded slot are dropped.
        shared: True for per-example ids shared by every example, False for flat ids.
        name: a label for reports.

    Returns:
        The [`TokenGraph`][energies.TokenGraph].

    Raises:
        GraphError: a size that is not an integer >= 1, ``shared`` not a bool, or an edge list that fails its
            checks (shape, dtype, ids out of range, self loops, repeats, edges between examples).
    """
    n, batch_size, _ = check_sizes(n, batch_size)
    check_flag(shared, "shared", GraphError, numpy_bool=True)
    if shared:
        canon = canonical_edges(edge_index, n, n)  # validates once, on per-example ids
        return from_pattern(canon, n, batch_size, mask, name)
    return TokenGraph(batch_size, n, mask, edge_index, name=name)


def from_pyg(data) -> Tuple[TokenGraph, Optional[torch.Tensor]]:
    """Graph (and dense tokens) from a ``torch_geometric.data.Data`` or ``Batch``.

    Each graph of the batch is one example of ``n_max`` slots (the largest graph's node count), its nodes the
    first real slots; PyG's convention of both orientations per edge is accepted.

    Args:
        data: a ``Data`` or ``Batch`` with ``edge_index`` (ids in ``[0, num_nodes)``), optionally ``batch`` and
            ``x``.

    Returns:
        ``(graph, Y)`` where ``Y = data.x`` laid out as ``(B, n_max, d)`` with padding
        (``torch_geometric.utils.to_dense_batch``), or ``None`` when ``data.x`` is absent.

    Raises:
        GraphError: no ``edge_index``, ids outside ``[0, num_nodes)``, or an edge list that fails its checks.
    """
    from torch_geometric.utils import to_dense_batch

    if not hasattr(data, "edge_index") or data.edge_index is None:
        raise GraphError("the PyG data object has no edge_index")
    num = int(data.num_nodes)
    batch = getattr(data, "batch", None)
    if batch is None:
        batch = torch.zeros(num, dtype=torch.long)
    counts = torch.bincount(batch)
    B, n_max = int(counts.numel()), int(counts.max()) if counts.numel() else 0
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    ei = torch.as_tensor(data.edge_index)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= num):
        raise GraphError(f"PyG edge_index holds ids outside [0, {num})")
    local = torch.arange(num) - ptr[batch]
    flat = batch * n_max + local
    mask = torch.zeros(B * n_max, dtype=torch.bool)
    mask[flat] = True
    g = TokenGraph(B, n_max, mask.reshape(B, n_max), flat[ei] if ei.numel() else ei.reshape(2, 0).long(),
                   name="pyg")
    x = getattr(data, "x", None)
    Y = None if x is None else to_dense_batch(x, batch, max_num_nodes=n_max)[0]
    return g, Y
