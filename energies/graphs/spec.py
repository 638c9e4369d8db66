"""Graphs by spec: [`graph_from_spec`][energies.graph_from_spec] (``complete | window:K | ... | FILE.npy``), read from
the registry."""
from __future__ import annotations

import functools
import inspect
import os
from typing import Tuple

import numpy as np
import torch

from ..checks import load_npy, parse_float, parse_int
from ..errors import GraphError

from .container import TokenGraph
from .edge_list import from_edge_index
from .kit import check_sizes
from .registry import GRAPHS


@functools.lru_cache(maxsize=None)
def _spec_arity(builder) -> Tuple[int, int]:
    """How many ``:`` arguments a builder's spec takes (its positional parameters after n, before batch_size)."""
    try:
        params = list(inspect.signature(builder).parameters.values())[1:]
    except (TypeError, ValueError):
        return 0, 2 ** 31
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 0, 2 ** 31
    spec = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in ("batch_size", "mask", "seed")]
    return sum(p.default is p.empty for p in spec), len(spec)


def edge_array_graph(arr: np.ndarray, n: int, batch_size: int = 1, mask=None, name: str = "edge list") -> TokenGraph:
    """The graph of a ``2 x m`` integer edge list read from a ``.npy`` file (``name``: the file, for messages), as
    a file spec builds it: [`graph_from_spec`][energies.graph_from_spec] reads the file, a pinned graph
    (`GraphCache` with ``edges``) holds the array it was read into."""
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.integer):
        raise GraphError(f"graph file {name!r} must hold integers, got "
                         f"{f'dtype {arr.dtype}' if isinstance(arr, np.ndarray) else type(arr).__name__}")
    # every integer dtype but uint64 fits int64 value for value; uint64 ids of 2^63 and more would wrap to
    # negative there, so they go as uint64 and are named by their true value (canonical_edges)
    wide = np.uint64 if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 else np.int64
    return from_edge_index(torch.from_numpy(np.ascontiguousarray(arr, dtype=wide)), n, batch_size, mask, name=name)


def _canonical_arg(text: str) -> str:
    """One spelling of a spec argument: an integer in plain digits (``08``, ``+8`` -> ``8``), a number as its
    shortest round-trip form (``.05``, ``5e-2`` -> ``0.05``); other text as it is (refused later by its builder)."""
    try:
        return str(parse_int(text))
    except ValueError:
        pass
    try:
        value = parse_float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def canonical_spec(spec: str) -> str:
    """The one spelling of a graph spec, for identity (two specs naming one graph are one variant): a registered
    graph as ``NAME:ARG:...`` with every argument its builder takes, defaults filled in
    (``dilated:4`` -> ``dilated:4:1``), each number in one spelling (`_canonical_arg`, ASCII digits only:
    ``window:08`` and ``window:8``, ``random:.05`` and ``random:0.05`` are one graph); an edge-list file as its
    real path. A spec this cannot read is returned as it is (building it says what is wrong)."""
    if not isinstance(spec, str):
        return spec
    text = spec.strip()
    if text.endswith(".npy") or os.path.sep in text:
        return os.path.realpath(text)
    name, _, rest = text.partition(":")
    if name not in GRAPHS:
        return spec
    args = [a for a in rest.split(":") if a] if rest else []
    try:
        params = [p for p in list(inspect.signature(GRAPHS[name]).parameters.values())[1:]
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in ("batch_size", "mask", "seed")]
    except (TypeError, ValueError):
        params = []
    for p in params[len(args):]:
        if p.default is p.empty or p.default is None:
            break
        args.append(str(p.default))
    return ":".join([name] + [_canonical_arg(a) for a in args])


def check_graph_spec(spec, error=GraphError, files: bool = True) -> str:
    """The one check of a graph spec where it enters (an encoder's constructor, a config): a named graph is built
    for a 4-token sequence, so its name and arguments are checked (radii are clamped to n); an edge-list file must
    be a readable ``.npy`` array (its contents are checked where a graph of n tokens is built from it).

    Args:
        spec: the spec, as [`graph_from_spec`][energies.graph_from_spec] takes it.
        error: the caller's typed error (the encoder's ConfigError), raised with
            [`graph_from_spec`][energies.graph_from_spec]'s message.
        files: read an edge-list file now; False leaves it to the first graph built (an encoder whose file a model
            bundle pins: the graphs come from the bundle's copy, whatever became of the file).

    Returns:
        ``spec``, unchanged.

    Raises:
        GraphError: (or ``error``) a spec [`graph_from_spec`][energies.graph_from_spec] refuses.
    """
    try:
        if isinstance(spec, str) and (spec.endswith(".npy") or os.path.sep in spec):
            if files:
                load_npy(spec, "graph file", "edge list", GraphError)
        else:
            with torch.device("cpu"):      # a probe, on the host also under a device context (a model built on meta)
                graph_from_spec(spec, 4)
    except GraphError as exc:
        if error is GraphError:
            raise
        raise error(str(exc)) from None
    return spec


def graph_from_spec(spec: str, n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Build a token graph from a short spec.

    Args:
        spec: ``complete | window:K | strided:K | dilated:K[:R] | star | random:P`` (any registered graph), or a
            path to a ``.npy`` file holding a ``2 x m`` edge list (ids in ``[0, n)``).
        n: token slots per example.
        batch_size: examples in the batch (PyG's batching: slot i of example b is node ``b * n + i``).
        mask: ``(B, n)`` bool, True where a token is real; padded slots are in no edge.
        seed: the seed of a random graph.

    Returns:
        The [`TokenGraph`][energies.TokenGraph], each undirected edge held once.

    Raises:
        GraphError: an unknown name (the registered ones listed), bad arguments or sizes, an invalid edge list.
    """
    if not isinstance(spec, (str, os.PathLike)):
        raise GraphError(f"graph spec must be a string or a path, got {type(spec).__name__}")
    spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise GraphError(f"graph spec must be a non-empty string, got {spec!r}")
    n, batch_size, seed = check_sizes(n, batch_size, seed)
    if spec.endswith(".npy") or os.path.sep in spec:
        return edge_array_graph(load_npy(spec, "graph file", "edge list", GraphError), n, batch_size, mask, spec)
    name, _, rest = spec.partition(":")
    if name not in GRAPHS:
        GRAPHS.check(name, " or a path to a .npy edge list")
    args = [a for a in rest.split(":") if a] if rest else []
    lo, hi = _spec_arity(GRAPHS[name])
    if not lo <= len(args) <= hi:
        takes = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise GraphError(f"graph {name!r} takes {takes} argument(s) after its name, got {len(args)} in spec {spec!r}")
    try:
        return GRAPHS[name](n, *args, batch_size=batch_size, mask=mask, seed=seed)
    except TypeError as exc:
        raise GraphError(f"bad arguments for graph {name!r} in spec {spec!r}: {exc}") from None
    except GraphError as exc:
        raise GraphError(f"graph spec {spec!r}: {exc}") from None
