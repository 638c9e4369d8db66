"""Edge lists and masks checked: `canonical_edges` (every undirected edge once, ``u < v``, ids in range; its
sync-free counterpart of fixed shape, ``listed_edges``, checks nothing), the padding mask from lengths and its
checks, and the integer and number checks of graph arguments (raising [`GraphError`][energies.GraphError])."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .. import checks
from ..errors import GraphError


def mask_from_lengths(lengths, n: int) -> torch.Tensor:
    """Padding mask ``(B, n)``, ``True`` on the first ``lengths[b]`` slots of example ``b``.

    Args:
        lengths: the real tokens per example, a 1-D sequence (or tensor) of integers in ``[0, n]``.
        n: token slots per example, an integer >= 1.

    Returns:
        The ``(B, n)`` bool mask, ``B = len(lengths)``, on the lengths' device.

    Raises:
        GraphError: lengths that are not a non-empty 1-D sequence of integers in ``[0, n]`` (or on ``meta``), or n
            not an integer in ``[1, MAX_SLOTS]``.
    """
    n = check_int(n, "n (slots per example)", 1, MAX_SLOTS)
    try:
        raw = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise GraphError(f"lengths must be a 1-D sequence of integers, got {lengths!r:.200}") from None
    if raw.device.type == "meta":
        raise GraphError("lengths are on the meta device, which holds no values: give them on the CPU or a GPU")
    if raw.numel() == 0:
        raise GraphError(f"lengths must hold at least one example, got {lengths!r:.80}")
    if raw.dtype == torch.bool or raw.dtype.is_complex or (raw.dtype.is_floating_point and not (
            bool(torch.isfinite(raw).all()) and bool((raw == raw.round()).all()))):
        raise GraphError(f"lengths must be integers, got {raw.tolist() if raw.numel() <= 16 else raw.dtype}")
    lengths = raw.to(torch.long)
    if lengths.ndim != 1:
        raise GraphError(f"lengths must be 1-D, got shape {tuple(lengths.shape)}")
    if (lengths < 0).any() or (lengths > n).any():
        raise GraphError(f"lengths must lie in [0, {n}], got {lengths.tolist()}")
    return torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]


def check_mask(mask, batch_size: int, n: int) -> torch.Tensor:
    """A padding mask checked: what [`TokenGraph`][energies.TokenGraph] and a builder whose edges depend on the mask
    (`star`) read.

    Args:
        mask: ``(B, n)`` (or ``(n,)`` for one example) tensor or array: bool, True where a token is real, or a 0/1
            integer attention mask (Hugging Face's), read as ``mask != 0`` as the encoders read it; None: all real.
        batch_size: examples in the batch (B).
        n: token slots per example.

    Returns:
        The ``(B, n)`` bool tensor (a numpy mask copied).

    Raises:
        GraphError: a mask that is neither bool nor integer (a float mask is ambiguous: torch's float masks are
            additive, -inf drops), or not of shape ``(batch_size, n)``.
    """
    if mask is None:
        return torch.ones(batch_size, n, dtype=torch.bool)
    # a numpy mask is copied: sharing its memory would let later writes to the array change the graph unseen
    mask = mask if isinstance(mask, torch.Tensor) else torch.tensor(np.asarray(mask))
    if mask.ndim == 1:
        mask = mask[None, :]
    mask = checks.as_bool_mask(mask, GraphError)
    if tuple(mask.shape) != (batch_size, n):
        raise GraphError(f"mask has shape {tuple(mask.shape)}, expected (batch_size, n) = ({batch_size}, {n})")
    return mask


def _integer_ids(edge_index, total: int) -> torch.Tensor:
    """The edge list as a ``(2, m)`` int64 tensor on its device, refused unless of that shape, integer and readable."""
    if isinstance(edge_index, torch.Tensor) and type(edge_index) is not torch.Tensor:
        edge_index = edge_index.as_subclass(torch.Tensor)   # torch_geometric.EdgeIndex and other subclasses
    ei = torch.as_tensor(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphError(f"edge_index must have shape (2, m), got {tuple(ei.shape)}")
    if ei.dtype.is_floating_point or ei.dtype == torch.bool or ei.dtype.is_complex:
        raise GraphError(f"edge_index must hold integers, got dtype {ei.dtype}")
    if ei.device.type == "meta":      # the checks read the ids: a meta tensor has none (build, then graph.to("meta"))
        raise GraphError("edge_index is on the meta device, which holds no ids to check: build the graph from "
                         "ids on the CPU (or a GPU) and move it with graph.to('meta')")
    if ei.dtype == torch.uint64 and ei.numel():   # ids of 2^63 and more would wrap to negative in int64: the true
        top = ei.view(torch.int64) < 0            # value is named (the message once said -1 for 2^64 - 1)
        if bool(top.any()):
            k = int(top.any(0).nonzero()[0, 0])
            u, v = (int(x) % 2 ** 64 for x in ei[:, k].view(torch.int64).tolist())
            raise GraphError(f"edge {k} = ({u}, {v}) is out of range: node ids must lie in [0, {total})")
    return ei.to(torch.long)


def _checked_pairs(ei: torch.Tensor, total: int, n: int, lenient: bool) -> torch.Tensor:
    """``ei`` (non-empty, int64) refused for ids out of ``[0, total)``, self loops (dropped when ``lenient``) and
    edges joining two examples of ``n`` slots; returned without the dropped loops."""
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0 or hi >= total:
        bad = ((ei < 0) | (ei >= total)).any(0).nonzero()[0, 0].item()
        raise GraphError(
            f"edge {bad} = ({ei[0, bad].item()}, {ei[1, bad].item()}) is out of range: "
            f"node ids must lie in [0, {total})"
        )
    if lenient:
        ei = ei[:, ei[0] != ei[1]]
    loops = (ei[0] == ei[1]).nonzero()
    if loops.numel():
        k = loops[0, 0].item()
        raise GraphError(f"edge {k} = ({ei[0, k].item()}, {ei[1, k].item()}) is a self loop; "
                         "the attention energy has no self terms")
    cross = (ei[0] // n != ei[1] // n).nonzero()
    if cross.numel():
        k = cross[0, 0].item()
        raise GraphError(f"edge {k} = ({ei[0, k].item()}, {ei[1, k].item()}) joins examples "
                         f"{ei[0, k].item() // n} and {ei[1, k].item() // n}")
    return ei


def canonical_edges(edge_index, total: int, n: int, lenient: bool = False) -> torch.Tensor:
    """Validate a directed edge list over flat ids and return each undirected edge once, ``u < v``, sorted:
    the one canonicalisation of every edge list in the framework (token graphs and the PyG conv).

    Accepts each edge once (either orientation) or in both orientations (PyG convention).
    Rejects: wrong shape/dtype, ids out of ``[0, total)``, an edge joining two different examples and, unless
    ``lenient`` (PyG inputs: ``add_self_loops`` / multigraph conventions), self loops and an edge repeated in the
    same orientation, which ``lenient`` drops instead. The ids stay on their device; the checks read them once.
    """
    ei = _integer_ids(edge_index, total)
    if ei.numel() == 0:
        return ei.reshape(2, 0)
    ei = _checked_pairs(ei, total, n, lenient)
    key = ei[0] * total + ei[1]
    uniq, counts = torch.unique(key, return_counts=True)
    if not lenient and (counts > 1).any():
        dup = uniq[counts > 1][0].item()
        raise GraphError(f"edge ({dup // total}, {dup % total}) is repeated in the same orientation "
                         f"({counts[counts > 1][0].item()} times)")
    lo_ids = torch.minimum(ei[0], ei[1])
    hi_ids = torch.maximum(ei[0], ei[1])
    canon = torch.unique(lo_ids * total + hi_ids)  # sorted, each undirected edge once
    return torch.stack([canon // total, canon % total])


def listed_edges(edge_index: torch.Tensor, total: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The undirected edges of a ``(2, m)`` integer edge list over ids in ``[0, total)``, in a list of fixed shape:
    the sync-free counterpart of ``canonical_edges(edge_index, total, total, lenient=True)``.

    Each listed pair becomes ``u <= v``, the pairs are sorted, and a bool per position says whether it is the first
    listing of an undirected edge ``u < v`` (False for a self loop and for a repeat, in either orientation, which
    are rewritten as the loop ``(u, u)``: a dense adjacency written from the list stays exact). Device ops only, no
    host read, and the shapes do not depend on the ids: the path a compiled forward takes (``torch.compile`` traces
    it whole) and a ``meta`` forward runs. Nothing here checks the ids (``TokenGraph.from_listed`` does, on the
    device; `canonical_edges` reads them, naming the first bad edge).

    Args:
        edge_index: a ``(2, m)`` integer tensor of ids in ``[0, total)`` (on any device, ``meta`` included).
        total: the number of ids (token slots), ``total * total`` within int64.

    Returns:
        ``(src, dst, keep)``: two ``(m,)`` int64 tensors of ids, ``src <= dst``, sorted by ``(src, dst)``, and the
        ``(m,)`` bool tensor True on each undirected edge's one kept position (``src < dst``).
    """
    ei = edge_index.to(torch.long)
    key, _ = torch.sort(torch.minimum(ei[0], ei[1]) * total + torch.maximum(ei[0], ei[1]))
    src, dst = key // total, key % total
    first = torch.cat([torch.ones_like(key[:1], dtype=torch.bool), key[1:] != key[:-1]])
    keep = first & (src != dst)
    return src, torch.where(keep, dst, src), keep


def check_int(value, what: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    """`energies.checks.check_int` raising [`GraphError`][energies.GraphError]."""
    return checks.check_int(value, what, minimum, maximum, GraphError)


def check_number(value, what: str, rule: str = "finite") -> float:
    """`energies.checks.check_number` raising [`GraphError`][energies.GraphError]."""
    return checks.check_number(value, what, rule, GraphError)


def check_seed(value, what: str = "seed") -> int:
    """`energies.checks.check_seed` raising [`GraphError`][energies.GraphError]."""
    return checks.check_seed(value, what, GraphError)


#: the most token slots (batch_size x num_nodes) of a graph: flat edge keys ``u * slots + v`` stay in int64
MAX_SLOTS = 2 ** 31
