"""A model's edge-list graph, pinned: ``model.graph`` = a ``.npy`` file is part of the model, so it is read once and
kept, never read again from a path that may since have changed or gone.

* `read_edges`: the file's bytes (one read, from one descriptor), their sha256 and the array they hold;
* `pin`: a built model's encoder made to build its graphs from that array (`energies.graphs.GraphCache`
  with ``edges``), whatever happens to the file afterwards; a batch narrower than the graph (texts shorter than
  its largest node id, at training or prediction) gets the graph among its slots only (`within`): the edges
  to slots it does not hold join padding, as the edges to a shorter text's padded slots do in a full-width batch;
* `GRAPH_FILE`: the copy a run folder (so a bundle) holds, its sha256 in ``bundle.json``
  (`experiments.app.bundle`).
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
from typing import Optional, Tuple, Type

import numpy as np

from energies.errors import UnfoldError
from energies.graphs import GraphCache
from energies.graphs.spec import edge_array_graph

__all__ = ["GRAPH_FILE", "is_graph_file", "read_edges", "parse_edges", "pin", "write_edges", "within"]

#: the name of the pinned copy of an edge-list graph inside a run folder or a bundle
GRAPH_FILE = "graph.npy"


def is_graph_file(spec) -> bool:
    """Whether a ``model.graph`` spec names an edge-list file rather than a registered graph."""
    return isinstance(spec, str) and (spec.endswith(".npy") or os.path.sep in spec)


def parse_edges(data: bytes, name: str, error: Type[UnfoldError]) -> np.ndarray:
    """The one integer array a ``.npy`` file's bytes hold (never executing code), else ``error`` naming ``name``."""
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 -- numpy raises several types on a corrupt file
        raise error(f"graph file {name!r} could not be read as .npy ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(arr, np.ndarray):
        raise error(f"graph file {name!r} is an .npz archive, not one .npy edge list")
    if not np.issubdtype(arr.dtype, np.integer):
        raise error(f"graph file {name!r} must hold integers, got dtype {arr.dtype}")
    return arr


def read_edges(path: str, error: Type[UnfoldError]) -> Tuple[np.ndarray, bytes, str]:
    """``(array, bytes, sha256)`` of the edge-list file ``path``, read once from one descriptor (a regular file:
    a FIFO or a device is refused), every problem an ``error`` naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"graph file {path!r} does not exist") from None
    except OSError as exc:
        raise error(f"graph file {path!r} cannot be opened ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"graph file {path!r} is not a regular file")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        data = fh.read()
    return parse_edges(data, path, error), data, hashlib.sha256(data).hexdigest()


def write_edges(data: bytes, folder: str) -> str:
    """Write the graph file's bytes as ``folder/graph.npy`` (atomic); returns its path."""
    from ..runfolder.atomic import atomic_open

    path = os.path.join(folder, GRAPH_FILE)
    with atomic_open(path, "wb") as fh:
        fh.write(data)
    return path


def within(edges: np.ndarray, n: int) -> np.ndarray:
    """The edges of a ``2 x m`` edge list whose two ends are both below ``n`` (the slots a batch of width ``n``
    holds); an array of another shape is returned as it is (the graph builder refuses it), and so are negative
    ids. A text of fewer tokens than the graph's largest id reads as it would padded to the full width: padded
    slots are in no edge, so dropping the edges to slots past ``n`` changes nothing for the real tokens.

    Args:
        edges: the pinned edge list (``2 x m`` integers).
        n: the batch's width in token slots.

    Returns:
        ``edges`` itself where every id is below ``n``, else the columns whose ids all are.
    """
    if not isinstance(edges, np.ndarray) or edges.ndim != 2 or edges.shape[0] != 2 or edges.size == 0:
        return edges
    keep = (edges < n).all(axis=0)
    return edges if keep.all() else edges[:, keep]


class _PinnedGraphs(GraphCache):
    """A `GraphCache` of a pinned edge list whose graph for ``n`` slots is the one among those slots (`within`)."""

    def _build(self, n: int, B: int, mask=None):
        return edge_array_graph(within(self.edges, n), n, B, mask, self.spec)


def pin(model, edges: Optional[np.ndarray]):
    """Make ``model``'s encoder build its token graphs from ``edges`` (the array its edge-list file held when it
    was read), never from the file again; a batch of ``n`` slots gets the edges among them (`within`: a
    short text, or a batch of short texts, is read as the same texts padded to the graph's width would be).
    ``edges`` None: nothing to pin. Returns the model."""
    if edges is None:
        return model
    encoder = model.encoder
    old = encoder.graphs
    encoder.graphs = _PinnedGraphs(old.spec, seed=old.seed, maxsize=old.maxsize, edges=edges)
    return model
