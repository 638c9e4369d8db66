"""Token graphs: one representation for complete and sparse graphs, batched, with padding.

A :class:`TokenGraph` describes ``B`` sequences of ``n`` token slots each. Slot ``i``
of example ``b`` has the flat id ``b * n + i`` (PyTorch Geometric's batching
convention). The graph is *undirected by definition*: it holds each undirected
edge ``{u, v}`` exactly once, canonically as ``u < v`` (supplement B.1 sums over
the edge set ``E`` once per edge), so every energy counts an edge once whatever
orientation(s) the user wrote it in.

A padding ``mask`` (``True`` where a token is real) removes padded slots from the
graph: they are in no edge, and energies skip them in every term.

The complete graph is kept implicit (``edge_index is None``); :meth:`TokenGraph.edges`
materialises it as all pairs ``u < v`` of real tokens when an edge list is needed.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch

from . import checks
from .checks import one_line
from .errors import GraphError, TokenError
from .registry import registrar

__all__ = [
    "TokenGraph",
    "complete",
    "window",
    "strided",
    "dilated",
    "star",
    "random",
    "from_edge_index",
    "from_pyg",
    "mask_from_lengths",
    "GRAPHS",
    "register_graph",
    "graph_from_spec",
    "canonical_edges",
    "GraphCache",
    "MASK_FREE",
    "check_tokens",
]


def mask_from_lengths(lengths, n: int) -> torch.Tensor:
    """Padding mask ``(B, n)``, ``True`` on the first ``lengths[b]`` slots of example ``b``."""
    n = check_int(n, "n (slots per example)", 1)
    try:
        raw = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError):
        raise GraphError(f"lengths must be a 1-D sequence of integers, got {lengths!r}") from None
    if raw.dtype == torch.bool or raw.dtype.is_complex or (raw.dtype.is_floating_point and not (
            bool(torch.isfinite(raw).all()) and bool((raw == raw.round()).all()))):
        raise GraphError(f"lengths must be integers, got {raw.tolist() if raw.numel() <= 16 else raw.dtype}")
    lengths = raw.to(torch.long)
    if lengths.ndim != 1:
        raise GraphError(f"lengths must be 1-D, got shape {tuple(lengths.shape)}")
    if (lengths < 0).any() or (lengths > n).any():
        raise GraphError(f"lengths must lie in [0, {n}], got {lengths.tolist()}")
    return torch.arange(n)[None, :] < lengths[:, None]


def _check_mask(mask, batch_size: int, n: int) -> torch.Tensor:
    if mask is None:
        return torch.ones(batch_size, n, dtype=torch.bool)
    # a numpy mask is copied: sharing its memory would let later writes to the array change the graph unseen
    mask = mask if isinstance(mask, torch.Tensor) else torch.tensor(np.asarray(mask))
    if mask.ndim == 1:
        mask = mask[None, :]
    if mask.dtype != torch.bool:
        raise GraphError(f"mask must be a bool tensor (True = real token), got dtype {mask.dtype}")
    if tuple(mask.shape) != (batch_size, n):
        raise GraphError(f"mask has shape {tuple(mask.shape)}, expected (batch_size, n) = ({batch_size}, {n})")
    return mask


def canonical_edges(edge_index, total: int, n: int, lenient: bool = False) -> torch.Tensor:
    """Validate a directed edge list over flat ids and return each undirected edge once, ``u < v``, sorted:
    the one canonicalisation of every edge list in the framework (token graphs and the PyG conv).

    Accepts each edge once (either orientation) or in both orientations (PyG convention).
    Rejects: wrong shape/dtype, ids out of ``[0, total)``, an edge joining two different examples and, unless
    ``lenient`` (PyG inputs: ``add_self_loops`` / multigraph conventions), self loops and an edge repeated in the
    same orientation, which ``lenient`` drops instead. The ids stay on their device; the checks read them once.
    """
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
    ei = ei.to(torch.long)
    if ei.numel() == 0:
        return ei.reshape(2, 0)
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


def check_int(value, what: str, minimum: Optional[int] = None, maximum: Optional[int] = None) -> int:
    """:func:`energies.checks.check_int` raising :class:`GraphError`."""
    return checks.check_int(value, what, minimum, maximum, GraphError)


def check_number(value, what: str, rule: str = "finite") -> float:
    """:func:`energies.checks.check_number` raising :class:`GraphError`."""
    return checks.check_number(value, what, rule, GraphError)


def check_seed(value, what: str = "seed") -> int:
    """:func:`energies.checks.check_seed` raising :class:`GraphError`."""
    return checks.check_seed(value, what, GraphError)


#: the most token slots (batch_size x num_nodes) of a graph: flat edge keys ``u * slots + v`` stay in int64
MAX_SLOTS = 2 ** 31


#: the integer dtype of each floating dtype's width: a padding mask applied as a bitwise AND (:func:`mask_bits`)
SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
                  torch.bfloat16: torch.int16}


def _and_bits(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    return torch.bitwise_and(x.view(SAME_WIDTH_INT[x.dtype]), bits).view(x.dtype)


class _MaskBits(torch.autograd.Function):
    """``_and_bits`` with its gradient (backward, double backward) for eager and compiled code."""

    @staticmethod
    def forward(ctx, x, bits):
        ctx.save_for_backward(bits)
        return _and_bits(x, bits)

    @staticmethod
    def backward(ctx, grad):
        (bits,) = ctx.saved_tensors
        return mask_bits(grad, bits), None     # differentiable again (double backward)


class _BitsFunc(torch.autograd.Function):
    """Base of the Functions with forward mode and vmap rules (``torch.func``, dual tensors; eager only: dynamo
    does not trace a custom jvp): the last input is the bit mask, kept for both directions."""

    generate_vmap_rule = True

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[-1])
        ctx.save_for_forward(inputs[-1])


class _MaskBitsFunc(_BitsFunc):
    forward = staticmethod(_and_bits)
    backward = staticmethod(_MaskBits.backward)

    @staticmethod
    def jvp(ctx, tangent, _):
        (bits,) = ctx.saved_tensors
        return mask_bits(tangent, bits)


def _select_bits(a: torch.Tensor, b: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    it = SAME_WIDTH_INT[a.dtype]
    return torch.bitwise_or(torch.bitwise_and(a.view(it), bits),
                            torch.bitwise_and(b.view(it), torch.bitwise_not(bits))).view(a.dtype)


class _SelectBits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, bits):
        ctx.save_for_backward(bits)
        return _select_bits(a, b, bits)

    @staticmethod
    def backward(ctx, grad):
        (bits,) = ctx.saved_tensors
        return mask_bits(grad, bits), mask_bits(grad, torch.bitwise_not(bits)), None


class _SelectBitsFunc(_BitsFunc):
    forward = staticmethod(_select_bits)
    backward = staticmethod(_SelectBits.backward)

    @staticmethod
    def jvp(ctx, ta, tb, _):
        (bits,) = ctx.saved_tensors
        ta = torch.zeros_like(tb) if ta is None else ta
        tb = torch.zeros_like(ta) if tb is None else tb
        return select_bits(ta, tb, bits)


def _route(*xs: torch.Tensor) -> int:
    """0: no derivative can pass (no grad mode, or plain tensors that need none and carry no forward-mode
    tangent); 1: backward mode only (compiled code); 2: the full autograd Function (``torch.func`` transforms,
    dual tensors, and tensors that need a gradient in eager code)."""
    if not torch.is_grad_enabled():
        return 0
    if torch.compiler.is_compiling():
        return 1
    if all(type(x) is torch.Tensor and not x.requires_grad and not torch._C._functorch.is_functorch_wrapped_tensor(x)
           and torch.autograd.forward_ad.unpack_dual(x).tangent is None for x in xs):
        return 0
    return 2


def select_bits(a: torch.Tensor, b: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``a`` where ``bits`` are set, ``b`` where they are not (see :func:`mask_bits`), bit for bit: -0.0 and
    NaN payloads kept; gradients (backward and forward mode) routed alike."""
    route = _route(a, b)
    return (_select_bits(a, b, bits) if route == 0 else
            _SelectBits.apply(a, b, bits) if route == 1 else _SelectBitsFunc.apply(a, b, bits))


def mask_bits(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``x`` (floating) AND ``bits`` (an integer of x's width, broadcast against x, each entry all ones or all
    zeros): x bit for bit where the bits are set, exactly +0.0 where they are not, whatever x holds there (NaN
    and inf included); the gradient (backward and forward mode) is masked alike. The padding masks of
    :class:`TokenGraph` use it."""
    route = _route(x)
    return _and_bits(x, bits) if route == 0 else _MaskBits.apply(x, bits) if route == 1 else _MaskBitsFunc.apply(x, bits)


class TokenGraph:
    """Undirected graph over ``batch_size`` examples of ``num_nodes`` token slots each.

    Parameters
    ----------
    batch_size, num_nodes:
        ``B`` and ``n``; token tensors are ``(B, n, d)``.
    mask:
        ``(B, n)`` bool, ``True`` where the slot holds a real token; ``None`` means all real.
    edge_index:
        ``None`` for the complete graph, else a ``(2, m)`` integer tensor of *flat* ids in
        ``[0, B * n)`` (see :func:`from_edge_index` for per-example ids). Each undirected edge
        once in either orientation, or in both: the same graph either way.
    name:
        a label for reports (``"complete"``, ``"window:2"``, ...).

    Edges touching a padded slot are dropped: padded tokens are in no edge.
    """

    def __init__(self, batch_size: int, num_nodes: int, mask=None, edge_index=None, name: str = "custom",
                 offsets=None):
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self.num_nodes = check_int(num_nodes, "num_nodes", 1)
        if self.batch_size * self.num_nodes > MAX_SLOTS:
            raise GraphError(f"batch_size x num_nodes = {self.batch_size * self.num_nodes} token slots, more than "
                             f"{MAX_SLOTS} (edge keys u * slots + v must fit in int64)")
        if not isinstance(name, str):
            raise GraphError(f"graph name must be a string, got {type(name).__name__}")
        self.name = name
        self.mask = _check_mask(mask, self.batch_size, self.num_nodes)
        self.is_complete = edge_index is None
        self._edges: Optional[torch.Tensor] = None
        #: the edge list before the current mask dropped any (fixed shape whatever the mask: :meth:`with_mask` keeps
        #: it and :meth:`fixed_edges` weighs its edges by the mask on the device); None for the complete graph
        self._all: Optional[torch.Tensor] = None
        #: for a shift-invariant graph (window, strided, dilated): its offsets o >= 1, the edges being every pair
        #: ``{i, i + o}`` of real tokens of each example (the tiled layout of the Triton kernel uses them); else None
        self.offsets = None if offsets is None else tuple(sorted({int(o) for o in offsets if 0 < int(o) < self.num_nodes}))
        if edge_index is not None:
            canon = canonical_edges(edge_index, self.batch_size * self.num_nodes, self.num_nodes)
            flat_mask = self.mask.reshape(-1).to(canon.device)
            keep = flat_mask[canon[0]] & flat_mask[canon[1]]
            self._edges = canon[:, keep].to(self.mask.device)
            self._all = self._edges

    # ------------------------------------------------------------------ basic facts
    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def total_nodes(self) -> int:
        return self.batch_size * self.num_nodes

    def zero_padded(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, n, ...)`` with padded slots set to zero (so NaN/Inf there cannot leak through 0 * x); real
        slots bit for bit. Floating x: a bitwise AND with the slot mask (:func:`mask_bits`, exact and NaN-safe,
        at the speed of a copy: ``torch.where`` with a broadcast bool mask is not vectorised on CPU, 5x slower)."""
        if x.dtype in SAME_WIDTH_INT:
            return mask_bits(x, self._slot_bits(x))
        return torch.where(self._slot_mask(x), x, torch.zeros((), dtype=x.dtype, device=x.device))

    def keep_padded(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new`` on real slots, ``old`` on padded ones: padded slots pass through every step unchanged.
        Floating tensors of one dtype and shape: bit for bit, by :func:`select_bits`."""
        if new.dtype in SAME_WIDTH_INT and old.dtype == new.dtype and old.shape == new.shape:
            return select_bits(new, old, self._slot_bits(new))
        return torch.where(self._slot_mask(new), new, old)

    def _slot_mask(self, x: torch.Tensor) -> torch.Tensor:
        return self.mask.reshape(self.mask.shape + (1,) * (x.ndim - 2))

    def _slot_bits(self, x: torch.Tensor) -> torch.Tensor:
        """The slot mask as an integer of x's width, all bits set on real slots, none on padded ones, shaped
        to broadcast against x (cached per width, rank and device while the mask is unchanged)."""
        itype = SAME_WIDTH_INT[x.dtype]
        mask = self.mask
        if torch.compiler.is_compiling() or mask.is_inference():     # no version counter to key a cache on
            return -self._slot_mask(x).to(device=x.device, dtype=itype)
        key = (itype, x.ndim, str(x.device), mask._version)
        cache = self.__dict__.get("_bits")
        if cache is None or cache[0] is not mask:      # the mask object itself owns the cache (a new mask: a new one)
            cache = self.__dict__["_bits"] = (mask, {})
        bits = cache[1].get(key)
        if bits is None:
            if len(cache[1]) > 8:
                cache[1].clear()
            bits = cache[1][key] = -self._slot_mask(x).to(device=x.device, dtype=itype)
        return bits

    def to(self, device) -> "TokenGraph":
        g = object.__new__(TokenGraph)
        g.__dict__.update(self.__dict__)
        g.__dict__.pop("_bits", None)
        g.mask = self.mask.to(device)
        g._edges = None if self._edges is None else self._edges.to(device)
        g._all = None if self._all is None else self._all.to(device)
        g.__dict__.pop("_layouts", None)
        return g

    def with_mask(self, mask) -> "TokenGraph":
        """The same edges under a new padding mask ``(B, n)`` (on the graph's device): edges touching a padded
        slot count no more. Right for graphs whose edges do not depend on the mask (:data:`MASK_FREE` builders).
        No host read: the edge list keeps its shape (the kernels weigh each edge by the mask,
        :meth:`fixed_edges`); :meth:`edges` compacts it when asked."""
        g = object.__new__(TokenGraph)
        g.__dict__.update(self.__dict__)
        g.__dict__.pop("_bits", None)
        g.mask = _check_mask(mask, self.batch_size, self.num_nodes).to(self.device)
        g._edges = None
        return g

    def fixed_edges(self):
        """``(src, dst, valid)``: the edge list of fixed shape (``u < v`` flat ids, whatever the mask) and a bool per
        edge, True where both tokens are real, or None where every listed edge is real; all device ops, no host read
        (the edge kernel, degrees and the dense adjacency use it). The complete graph lists all pairs of slots of
        each example, weighed by the mask (so it runs on ``meta`` too, and without a sync on a GPU)."""
        if self.is_complete and self._edges is None:
            src, dst = self._all_pairs()
            flat = self.mask.reshape(-1)
            return src, dst, flat[src] & flat[dst]
        if self._edges is not None or self._all is None:     # compacted already: every edge real
            src, dst = self.edges()
            return src, dst, None
        src, dst = self._all
        flat = self.mask.reshape(-1)
        return src, dst, flat[src] & flat[dst]

    def edges(self) -> torch.Tensor:
        """``(2, m)`` flat ids ``u < v``, each undirected edge once (materialised if complete)."""
        if self._edges is None and self._all is not None:      # a mask applied by with_mask: drop its edges now
            src, dst, valid = self.fixed_edges()
            self._edges = self._all[:, valid]
        if self._edges is None:
            src, dst = self._all_pairs()
            flat = self.mask.reshape(-1)
            keep = flat[src] & flat[dst]
            self._edges = torch.stack([src[keep], dst[keep]])
        return self._edges

    def _all_pairs(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Flat ids ``u < v`` of every pair of slots within each example (the complete graph before the mask)."""
        n = self.num_nodes
        iu = torch.triu_indices(n, n, offset=1, device=self.device)
        offs = torch.arange(self.batch_size, device=self.device)[:, None] * n
        return (offs + iu[0][None]).reshape(-1), (offs + iu[1][None]).reshape(-1)

    def to_sparse(self) -> "TokenGraph":
        """The same graph with an explicit edge list (the complete graph materialised)."""
        return TokenGraph(self.batch_size, self.num_nodes, self.mask, self.edges(), name=self.name, offsets=self.offsets)

    def pair_mask(self) -> torch.Tensor:
        """Dense ``(B, n, n)`` bool adjacency, symmetric, zero diagonal, padded slots excluded."""
        B, n = self.batch_size, self.num_nodes
        if self.is_complete:
            eye = torch.eye(n, dtype=torch.bool, device=self.device)
            return self.mask[:, :, None] & self.mask[:, None, :] & ~eye
        A = torch.zeros(B * n * n, dtype=torch.bool, device=self.device)
        src, dst, valid = self.fixed_edges()       # each pair once: writing `valid` sets exactly the real edges
        b, i, j = src // n, src % n, dst % n
        valid = True if valid is None else valid
        A[b * n * n + i * n + j] = valid
        A[b * n * n + j * n + i] = valid
        return A.reshape(B, n, n)

    def num_edges(self) -> torch.Tensor:
        """Undirected edges per example, ``(B,)``."""
        src = self.edges()[0]
        return torch.bincount(src // self.num_nodes, minlength=self.batch_size)

    def degree(self) -> torch.Tensor:
        """Neighbours per token slot, ``(B, n)`` (0 on padded slots)."""
        if self.is_complete:
            real = self.mask.to(torch.long)
            return (real.sum(1, keepdim=True) - 1) * real
        src, dst, valid = self.fixed_edges()       # fixed shapes: no host read
        w = torch.ones_like(src) if valid is None else valid.to(torch.long)
        deg = torch.zeros(self.total_nodes, dtype=torch.long, device=src.device).index_add(0, src, w).index_add(0, dst, w)
        return deg.reshape(self.batch_size, self.num_nodes)

    def directed_edge_index(self) -> torch.Tensor:
        """Both orientations, ``(2, 2m)``: PyTorch Geometric's convention for message passing."""
        src, dst = self.edges()
        return torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])

    def __repr__(self) -> str:
        m = "implicit" if self.is_complete and self._edges is None else int(self.edges().shape[1])
        return (f"TokenGraph(name={self.name!r}, batch_size={self.batch_size}, n={self.num_nodes}, "
                f"complete={self.is_complete}, edges={m}, real_tokens={int(self.mask.sum())})")


# ---------------------------------------------------------------------- builders
GRAPHS: Dict[str, Callable[..., TokenGraph]] = {}


#: builders whose edges do not depend on the mask: building with a mask equals building without one and dropping
#: the edges at padded slots (:meth:`TokenGraph.with_mask`), so that :class:`GraphCache` builds them once per shape
MASK_FREE = set()
_register = registrar(GRAPHS)


def register_graph(name: str, mask_free: bool = False):
    """``@register_graph("name")`` registers a builder ``f(n, *args, batch_size=1, mask=None, seed=0)``;
    ``mask_free=True`` declares that its edges do not depend on the mask (see :data:`MASK_FREE`)."""
    def deco(builder):
        _register(name)(builder)
        (MASK_FREE.add if mask_free else MASK_FREE.discard)(name)
        return builder

    return deco


def _sizes(n, batch_size, seed=0) -> Tuple[int, int, int]:
    """A builder's ``(n, batch_size, seed)`` validated (the sizes integers >= 1 with at most :data:`MAX_SLOTS`
    slots in all, the seed in [0, 2**63))."""
    n, batch_size = check_int(n, "n (tokens per example)", 1), check_int(batch_size, "batch_size", 1)
    if n * batch_size > MAX_SLOTS:
        raise GraphError(f"n x batch_size = {n} x {batch_size} token slots, more than {MAX_SLOTS}")
    return n, batch_size, check_seed(seed)


#: the most edges (over the whole batch) a builder materialises: 2 x 2**28 int64 ids take 4 GiB, and validating
#: them several times that. The complete graph stays implicit and is not counted.
MAX_EDGES = 2 ** 28


def _check_edges(count: float, batch_size: int, what: str) -> None:
    """Refuse, before any allocation, a graph of more than :data:`MAX_EDGES` edges in all."""
    if count * batch_size > MAX_EDGES:
        raise GraphError(f"{what} would have {count:.3g} edges per example x batch_size {batch_size}, more than "
                         f"the {MAX_EDGES} edges a builder materialises; use a smaller n, radius or p (or 'complete', "
                         "which stays implicit)")


def _from_pattern(pairs: torch.Tensor, n: int, batch_size: int, mask, name: str, offsets=None) -> TokenGraph:
    """Offset a per-example ``(2, m)`` pattern over the batch and build the graph (``offsets``: the pattern is every
    pair ``{i, i + o}``, :attr:`TokenGraph.offsets`)."""
    offs = torch.arange(batch_size)[:, None] * n
    src = (offs + pairs[0][None]).reshape(-1)
    dst = (offs + pairs[1][None]).reshape(-1)
    return TokenGraph(batch_size, n, mask, torch.stack([src, dst]), name=name, offsets=offsets)


def _pairs_at_offsets(n: int, offsets, batch_size: int = 1, what: str = "graph") -> torch.Tensor:
    """All pairs ``(i, i + o)`` inside ``[0, n)`` for the given positive offsets: O(|E|) memory. The callers
    pass offsets below n only (at most n - 1 of them), so time and memory are O(n + |E|) whatever the spec;
    more than :data:`MAX_EDGES` edges in all is refused before anything is allocated."""
    offsets = [o for o in offsets if 0 < o < n]
    _check_edges(sum(n - o for o in offsets), batch_size, what)
    src, dst = [], []
    for o in offsets:
        i = torch.arange(n - o)
        src.append(i)
        dst.append(i + o)
    if not src:
        return torch.zeros(2, 0, dtype=torch.long)
    return torch.stack([torch.cat(src), torch.cat(dst)])


@register_graph("complete", mask_free=True)
def complete(n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """All pairs ``u < v`` of real tokens (plain self-attention, main paper eq. 9)."""
    n, batch_size, _ = _sizes(n, batch_size, seed)
    return TokenGraph(batch_size, n, mask, None, name="complete")


@register_graph("window", mask_free=True)
def window(n: int, k: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Sliding window of radius ``k``: ``{i, j}`` with ``0 < |i - j| <= k``. A radius of n - 1 or more
    is the complete graph's edge list (the radius is clamped to n - 1: O(n + |E|) for any k)."""
    n, batch_size, _ = _sizes(n, batch_size, seed)
    k = _positive_int(k, "window radius k")
    offsets = range(1, min(k, n - 1) + 1)
    return _from_pattern(_pairs_at_offsets(n, offsets, batch_size, f"window:{k} on n={n}"),
                         n, batch_size, mask, f"window:{k}", offsets)


@register_graph("strided", mask_free=True)
def strided(n: int, k: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Sparse Transformer strided pattern (Child et al. 2019) with stride ``k``.

    The union of its two heads: the local head ``0 < |i - j| < k`` and the strided head
    ``|i - j| = 0 (mod k)``. A stride of n or more leaves the local head alone, all pairs (offsets are
    clamped to n - 1: O(n + |E|) for any k).
    """
    n, batch_size, _ = _sizes(n, batch_size, seed)
    k = _positive_int(k, "stride k")
    if k < 2:
        raise GraphError(f"stride k must be >= 2, got {k}")
    offsets = sorted(set(range(1, min(k, n))) | set(range(k, n, k)))
    return _from_pattern(_pairs_at_offsets(n, offsets, batch_size, f"strided:{k} on n={n}"), n, batch_size, mask,
                         f"strided:{k}", offsets)


@register_graph("dilated", mask_free=True)
def dilated(n: int, k: int, radius: int = 1, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Dilated window: ``{i, i + m k}`` for ``m = 1..radius``. Offsets of n or more join no pair, so the
    radius is clamped to ``(n - 1) // k`` (O(n + |E|) for any k and radius; no edge when k >= n)."""
    n, batch_size, _ = _sizes(n, batch_size, seed)
    k = _positive_int(k, "dilation k")
    radius = _positive_int(radius, "dilated radius")
    reach = min(radius, (n - 1) // k)
    offsets = [k * m for m in range(1, reach + 1)]
    return _from_pattern(_pairs_at_offsets(n, offsets, batch_size, f"dilated:{k}:{radius} on n={n}"), n, batch_size,
                         mask, f"dilated:{k}:{radius}", offsets)


@register_graph("star")
def star(n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Star-Transformer graph (Guo et al. 2019): a relay joined to all tokens, plus a ring.

    The relay is the first real token of each example (a [CLS]-like slot); the other real
    tokens form a ring in sequence order (closed when there are at least three of them).
    """
    n, batch_size, _ = _sizes(n, batch_size, seed)
    mask_t = _check_mask(mask, batch_size, n)
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


#: up to this many candidate pairs per example, :func:`random` draws one uniform number per pair (its
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

    O(n + |E|) time and memory above :data:`RANDOM_PAIRWISE_MAX` candidate pairs per example."""
    n, batch_size, seed = _sizes(n, batch_size, seed)
    p = check_number(p, "edge probability p", "probability")
    pairs = n * (n - 1) // 2
    _check_edges(p * pairs, batch_size, f"random:{p:g} on n={n}")
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


def from_edge_index(edge_index, n: int, batch_size: int = 1, mask=None, shared: bool = True,
                    name: str = "edge_index") -> TokenGraph:
    """Graph from a user edge list.

    ``shared=True``: ids in ``[0, n)``, the same graph for every example of the batch.
    ``shared=False``: flat ids in ``[0, batch_size * n)`` (PyG batching), one graph per example.
    """
    n, batch_size, _ = _sizes(n, batch_size)
    if not isinstance(shared, (bool, np.bool_)):
        raise GraphError(f"shared must be True or False, got {shared!r}")
    if shared:
        canon = canonical_edges(edge_index, n, n)  # validates once, on per-example ids
        return _from_pattern(canon, n, batch_size, mask, name)
    return TokenGraph(batch_size, n, mask, edge_index, name=name)


def from_pyg(data) -> Tuple[TokenGraph, Optional[torch.Tensor]]:
    """Graph (and dense tokens) from a ``torch_geometric.data.Data`` or ``Batch``.

    Returns ``(graph, Y)`` where ``Y = data.x`` laid out as ``(B, n_max, d)`` with padding
    (``torch_geometric.utils.to_dense_batch``), or ``None`` when ``data.x`` is absent.
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


def _positive_int(v, what: str) -> int:
    """A graph parameter (a spec's text or a number) as an integer >= 1, of any size (builders clamp)."""
    try:
        iv = check_int(v, what)
    except GraphError:
        raise GraphError(f"{what} must be an integer, got {v!r}") from None
    if iv < 1:
        raise GraphError(f"{what} must be a positive integer, got {v!r}")
    return iv


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


def graph_from_spec(spec: str, n: int, batch_size: int = 1, mask=None, seed: int = 0) -> TokenGraph:
    """Build a graph from a short spec: ``complete | window:K | strided:K | dilated:K[:R] | star |
    random:P`` or a path to a ``.npy`` file holding a ``2 x m`` edge list (ids in ``[0, n)``)."""
    if not isinstance(spec, (str, os.PathLike)):
        raise GraphError(f"graph spec must be a string or a path, got {type(spec).__name__}")
    spec = os.fspath(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise GraphError(f"graph spec must be a non-empty string, got {spec!r}")
    n, batch_size, seed = _sizes(n, batch_size, seed)
    if spec.endswith(".npy") or os.path.sep in spec:
        if os.path.isdir(spec):
            raise GraphError(f"graph file {spec!r} is a folder, not a .npy edge list")
        if not os.path.isfile(spec):
            raise GraphError(f"graph file {spec!r} does not exist")
        try:
            arr = np.load(spec, allow_pickle=False)
        except Exception as exc:  # numpy raises several types on a corrupt file
            raise GraphError(f"graph file {spec!r} could not be read as .npy: {one_line(exc, 200)}") from None
        if not isinstance(arr, np.ndarray):
            arr.close()
            raise GraphError(f"graph file {spec!r} is an .npz archive, not one .npy edge list")
        if not np.issubdtype(arr.dtype, np.integer):
            raise GraphError(f"graph file {spec!r} must hold integers, got dtype {arr.dtype}")
        # every integer dtype but uint64 fits int64 value for value; uint64 ids of 2^63 and more would wrap to
        # negative there, so they go as uint64 and are named by their true value (canonical_edges)
        wide = np.uint64 if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 else np.int64
        return from_edge_index(torch.from_numpy(np.ascontiguousarray(arr, dtype=wide)), n, batch_size, mask, name=spec)
    name, _, rest = spec.partition(":")
    if name not in GRAPHS:
        raise GraphError(f"unknown graph {name!r}; valid: {sorted(GRAPHS)} or a path to a .npy edge list")
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


class GraphCache:
    """Token graphs of one spec for batches of masks, built on the mask's device and cached by shape.

    ``cache(mask)`` equals ``graph_from_spec(spec, n, batch_size=B, mask=mask, seed=seed)`` on the mask's device.
    The complete graph is implicit: built per call from the mask with no host read. A :data:`MASK_FREE` spec is
    built once per ``(B, n, device)`` and masked on the device (:meth:`TokenGraph.with_mask`: one selection of
    the edges). Any other spec (``star``, user graphs not declared mask-free) depends on the mask: it is built
    on the host from the mask (one read) and cached by the mask's bytes, up to ``maxsize`` patterns; on ``meta``
    (no values: a forward there computes shapes) it is the graph of all-real examples under the meta mask."""

    def __init__(self, spec: str = "complete", seed: int = 0, maxsize: int = 64):
        self.spec, self.seed = spec, check_seed(seed)
        self.maxsize = check_int(maxsize, "maxsize", 1)
        self._graphs: Dict[tuple, TokenGraph] = {}

    @property
    def mask_free(self) -> bool:
        name = self.spec.partition(":")[0]
        return name in MASK_FREE or self.spec.endswith(".npy") or os.path.sep in self.spec

    def __call__(self, mask: torch.Tensor) -> TokenGraph:
        B, n = mask.shape
        if self.spec == "complete":
            return TokenGraph(B, n, mask, None, name="complete")
        return self._sparse(mask)

    @torch.compiler.disable
    def _sparse(self, mask: torch.Tensor) -> TokenGraph:
        """A sparse graph: built (on the host, outside any compiled region) and cached, then masked."""
        B, n = mask.shape
        if self.mask_free:
            key = (B, n, str(mask.device))
            if key not in self._graphs:
                with torch.device("cpu"):          # built on the host (also under a device context), then moved
                    graph = graph_from_spec(self.spec, n, batch_size=B, seed=self.seed)
                self._store(key, graph.to(mask.device))
            return self._graphs[key].with_mask(mask)
        meta = mask.device.type == "meta"     # no values to build from: a meta forward computes shapes (those of
        host = torch.ones(B, n, dtype=torch.bool, device="cpu") if meta else mask.detach().cpu()   # all-real ones)
        key = (B, n, str(mask.device), host.numpy().tobytes())
        if key not in self._graphs:
            with torch.device("cpu"):
                graph = graph_from_spec(self.spec, n, batch_size=B, mask=host, seed=self.seed)
            self._store(key, graph.to(mask.device))
        return self._graphs[key].with_mask(mask) if meta else self._graphs[key]

    def _store(self, key, graph: TokenGraph) -> None:
        if len(self._graphs) >= self.maxsize:
            self._graphs.pop(next(iter(self._graphs)))
        self._graphs[key] = graph

    def clear(self) -> None:
        self._graphs.clear()

    def __repr__(self) -> str:
        return f"GraphCache(spec={self.spec!r}, cached={len(self._graphs)})"


# ---------------------------------------------------------------------- tokens
def check_tokens(Y, graph: Optional[TokenGraph] = None, name: str = "Y") -> torch.Tensor:
    """Validate a token tensor and return it as ``(B, n, d)``.

    Accepts ``(n, d)`` (one example) or ``(B, n, d)``. Requires a floating dtype, a shape that
    matches ``graph``, and finite values on every real token (padded slots are not checked; a meta tensor has no
    values, and only its shape, dtype and device are checked).
    """
    if not isinstance(Y, torch.Tensor):
        raise TokenError(f"{name} must be a torch.Tensor, got {type(Y).__name__}")
    if not Y.dtype.is_floating_point:
        raise TokenError(f"{name} must have a floating dtype (float32 or float64), got {Y.dtype}")
    if Y.ndim == 2:
        Y = Y[None]
    if Y.ndim != 3:
        raise TokenError(f"{name} must have shape (n, d) or (B, n, d), got {tuple(Y.shape)}")
    if Y.shape[-1] < 1:
        raise TokenError(f"{name} has no features: shape {tuple(Y.shape)}")
    if graph is not None:
        if (Y.shape[0], Y.shape[1]) != (graph.batch_size, graph.num_nodes):
            raise TokenError(f"{name} has shape {tuple(Y.shape)} but the graph is for "
                             f"(B, n) = ({graph.batch_size}, {graph.num_nodes})")
        if Y.device != graph.device:
            raise TokenError(f"{name} is on {Y.device} but the graph is on {graph.device}")
        valid = graph.mask
    else:
        valid = torch.ones(Y.shape[:2], dtype=torch.bool, device=Y.device)
    if Y.device.type == "meta":                      # no values: the shape checks above are all there is
        return Y
    lo, hi = torch.aminmax(Y.detach(), dim=-1)       # one pass; NaN propagates to both, +-inf shows in one
    bad = ~(torch.isfinite(lo) & torch.isfinite(hi)) & valid
    if bad.any():
        b, i = bad.nonzero()[0].tolist()
        kind = "NaN" if torch.isnan(Y[b, i]).any() else "Inf"
        raise TokenError(f"{name} holds {kind} at example {b}, token {i}")
    return Y
