"""The container: [`TokenGraph`][energies.TokenGraph] (B examples of n token slots, each undirected edge once, padded
slots in no edge; the complete graph implicit), the bitwise padding masks it applies, and
[`check_tokens`][energies.check_tokens]."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..errors import GraphError, TokenError
from ..memory import check_memory

from .edges import MAX_SLOTS, canonical_edges, check_int, check_mask, listed_edges


#: the integer dtype of each floating dtype's width: a padding mask applied as a bitwise AND (`mask_bits`)
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
    """``a`` where ``bits`` are set, ``b`` where they are not (see `mask_bits`), bit for bit: -0.0 and
    NaN payloads kept; gradients (backward and forward mode) routed alike."""
    route = _route(a, b)
    return (_select_bits(a, b, bits) if route == 0 else
            _SelectBits.apply(a, b, bits) if route == 1 else _SelectBitsFunc.apply(a, b, bits))


def mask_bits(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``x`` (floating) AND ``bits`` (an integer of x's width, broadcast against x, each entry all ones or all
    zeros): x bit for bit where the bits are set, exactly +0.0 where they are not, whatever x holds there (NaN
    and inf included); the gradient (backward and forward mode) is masked alike. The padding masks of
    [`TokenGraph`][energies.TokenGraph] use it."""
    route = _route(x)
    return _and_bits(x, bits) if route == 0 else _MaskBits.apply(x, bits) if route == 1 else _MaskBitsFunc.apply(x, bits)


def _check_offsets(offsets, n: int) -> Optional[Tuple[int, ...]]:
    """A shift-invariant graph's offsets as [`TokenGraph.offsets`][energies.TokenGraph.offsets] keeps them: integers >=
    1 (a bool, a fraction, a string or o < 1 refused, [`GraphError`][energies.GraphError]), sorted, once each, those >=
    n dropped (they join no pair); None for None."""
    if offsets is None:
        return None
    if isinstance(offsets, (str, bytes)) or not hasattr(offsets, "__iter__"):
        raise GraphError(f"offsets must be a list of integers >= 1, got {offsets!r:.80}")
    values = [check_int(o, "offset", 1) for o in (offsets.tolist() if isinstance(offsets, torch.Tensor) else offsets)]
    return tuple(sorted({o for o in values if o < n}))


class TokenGraph:
    """Undirected graph over ``batch_size`` examples of ``num_nodes`` token slots each: the edge set E of the
    attention energy ``sum_{{u,v} in E} tau rho(z_uv)`` (supplement eq. 33; the complete graph is main paper
    eq. 9's plain self-attention, kept implicit).

    Edges touching a padded slot are dropped: padded tokens are in no edge. The edge list is validated and
    canonicalised once (`canonical_edges`: each undirected edge once, ``u < v``).

    Args:
        batch_size: ``B``, an integer >= 1; token tensors are ``(B, n, d)``.
        num_nodes: ``n``, the token slots per example, an integer >= 1 (``B * n`` at most ``MAX_SLOTS`` = 2^31).
        mask: ``(B, n)`` bool (or ``(n,)`` for one example; a numpy array is copied), ``True`` where the slot holds
            a real token, or a 0/1 integer attention mask read as ``mask != 0`` (`check_mask`); ``None`` means all
            real.
        edge_index: ``None`` for the complete graph, else a ``(2, m)`` integer tensor of *flat* ids in
            ``[0, B * n)`` (see [`from_edge_index`][energies.from_edge_index] for per-example ids). Each undirected edge
            once in either orientation, or in both: the same graph either way; no self loop, no edge between
            examples.
        name: a label for reports (``"complete"``, ``"window:2"``, ...).
        offsets: for a shift-invariant graph (window, strided, dilated), its offsets o >= 1, the edges being every
            pair ``{i, i + o}`` of real tokens of each example (kept sorted, once each, those < n); else None.
            Checked against the edge list (the kernels that read offsets must pass over the same graph).

    Raises:
        GraphError: a size that is not an integer >= 1, more than 2^31 slots, a name that is not a string, a mask
            of the wrong dtype or shape, an edge list that fails its checks (the message names the edge), or
            offsets that are not integers >= 1 or not the edge list's pattern (all of 1 .. n-1 without one).
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
        self.mask = check_mask(mask, self.batch_size, self.num_nodes)
        self.is_complete = edge_index is None
        self._edges: Optional[torch.Tensor] = None
        #: the edge list before the current mask dropped any (fixed shape whatever the mask: `with_mask` keeps
        #: it and `fixed_edges` weighs its edges by the mask on the device); None for the complete graph
        self._all: Optional[torch.Tensor] = None
        #: a bool per edge of ``_all`` for a graph from `from_listed` (False: a repeat or a self loop of the
        #: listing, weighing 0); None where every listed edge is one of the graph's
        self._keep: Optional[torch.Tensor] = None
        #: for a shift-invariant graph (window, strided, dilated): its offsets o >= 1, the edges being every pair
        #: ``{i, i + o}`` of real tokens of each example (the tiled layout of the Triton kernel uses them); else None
        self.offsets = _check_offsets(offsets, self.num_nodes)
        if edge_index is None:
            if self.offsets is not None and self.offsets != tuple(range(1, self.num_nodes)):
                raise GraphError(f"offsets {list(self.offsets)[:8]} do not describe the complete graph on n="
                                 f"{self.num_nodes} tokens (offsets 1 .. n-1): give the edge list they describe")
        else:
            canon = canonical_edges(edge_index, self.batch_size * self.num_nodes, self.num_nodes)
            flat_mask = self.mask.reshape(-1).to(canon.device)
            keep = flat_mask[canon[0]] & flat_mask[canon[1]]
            self._edges = canon[:, keep].to(self.mask.device)
            self._all = self._edges
            if self.offsets is not None:
                self._check_pattern()

    @classmethod
    def from_listed(cls, edge_index: torch.Tensor, num_nodes: int, name: str = "listed") -> "TokenGraph":
        """One example of ``num_nodes`` real tokens on the edge list's device, its edges those of ``edge_index`` in a
        list of fixed shape (``energies.graphs.edges.listed_edges``): each undirected edge once, self loops and
        repeats (either orientation) listed but weighing 0 in [`fixed_edges`][energies.TokenGraph.fixed_edges], dropped
        by [`edges`][energies.TokenGraph.edges].

        No host read and no shape that depends on the ids: a compiled forward builds it without a graph break, and
        it builds on ``meta``. The ids are checked on their device, not read: ids outside ``[0, num_nodes)`` fail
        ``torch._assert_async`` (a RuntimeError on the CPU, a device-side assert on a GPU; nothing on ``meta``,
        which holds no ids). The constructor's `canonical_edges` reads them once and
        names the first bad edge (a GraphError).

        Args:
            edge_index: a ``(2, m)`` integer tensor of node ids in ``[0, num_nodes)``, either orientation or both.
            num_nodes: the nodes, a Python int >= 1 (a tensor's shape).
            name: a label for reports.

        Returns:
            The graph, on ``edge_index``'s device.

        Raises:
            GraphError: ``edge_index`` not a ``(2, m)`` integer tensor (metadata only: the ids are not read).
            RuntimeError: an id outside ``[0, num_nodes)`` (on the CPU; on a GPU a device-side assert).
        """
        if (not isinstance(edge_index, torch.Tensor) or edge_index.ndim != 2 or edge_index.shape[0] != 2
                or edge_index.dtype.is_floating_point or edge_index.dtype.is_complex or edge_index.dtype == torch.bool):
            got = getattr(edge_index, "shape", type(edge_index).__name__)
            raise GraphError(f"edge_index must be a (2, m) integer tensor, got {got} {getattr(edge_index, 'dtype', '')}")
        bound = num_nodes if isinstance(num_nodes, int) else "num_nodes"     # a symbolic size is not printed
        torch._assert_async(((edge_index >= 0) & (edge_index < num_nodes)).all(),
                            f"edge_index holds node ids outside [0, {bound}) for {bound} nodes")
        g = object.__new__(cls)
        g.batch_size, g.num_nodes, g.name, g.is_complete, g.offsets, g._edges = 1, num_nodes, name, False, None, None
        g.mask = torch.ones(1, num_nodes, dtype=torch.bool, device=edge_index.device)
        src, dst, g._keep = listed_edges(edge_index, num_nodes)
        g._all = torch.stack([src, dst])
        return g

    def _check_pattern(self) -> None:
        """The edges between real tokens are exactly the pairs ``{i, i + o}`` of real tokens, o in
        [`offsets`][energies.TokenGraph.offsets] (the kernels that read the offsets, ``banded`` and the Triton tiles,
        would otherwise pass over another graph than the edge list: the step would descend one energy and the trace
        evaluate another). Each kept edge's span is an offset, and there are as many as such pairs: the same set. One
        host read, at construction."""
        e, m = self._edges, self.mask
        offs = torch.tensor(self.offsets, dtype=e.dtype, device=e.device)
        spans_ok = bool(torch.isin(e[1] - e[0], offs).all()) if e.numel() else True
        want = sum(int((m[:, :-o] & m[:, o:]).sum()) for o in self.offsets)
        if not spans_ok or e.shape[1] != want:
            raise GraphError(f"offsets {list(self.offsets)[:8]} do not describe the edge list: it has {e.shape[1]} "
                             f"edges between real tokens, the pairs {{i, i + o}} of real tokens number {want}"
                             + ("" if spans_ok else ", and some edge spans no listed offset"))

    # ------------------------------------------------------------------ basic facts
    @property
    def device(self) -> torch.device:
        return self.mask.device

    @property
    def total_nodes(self) -> int:
        return self.batch_size * self.num_nodes

    def select(self, rows: torch.Tensor) -> "TokenGraph":
        """The graph of the examples ``rows`` (a 1-D integer tensor of distinct example indices, in the order
        given): their masks and their edges, renumbered; the same name and offsets.

        Args:
            rows: the examples to keep.

        Returns:
            A graph of ``len(rows)`` examples of ``num_nodes`` slots.

        Raises:
            GraphError: an index repeated or out of range.
        """
        rows = rows.to(device=self.mask.device, dtype=torch.long).reshape(-1)
        if rows.unique().numel() != rows.numel() or not bool(((rows >= 0) & (rows < self.batch_size)).all()):
            raise GraphError(f"select needs distinct example indices in [0, {self.batch_size}), got "
                             f"{rows.tolist()[:8]}")
        mask = self.mask[rows]
        if self.is_complete:
            return TokenGraph(int(rows.numel()), self.num_nodes, mask, name=self.name, offsets=self.offsets)
        src, dst = self.edges()
        n = self.num_nodes
        where = torch.full((self.batch_size,), -1, dtype=torch.long, device=src.device)
        where[rows.to(src.device)] = torch.arange(rows.numel(), device=src.device)
        new = where[src // n]
        keep = new >= 0
        ei = torch.stack([new[keep] * n + src[keep] % n, new[keep] * n + dst[keep] % n])
        return TokenGraph(int(rows.numel()), n, mask, edge_index=ei, name=self.name, offsets=self.offsets)

    def zero_padded(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, n, ...)`` with padded slots set to zero (so NaN/Inf there cannot leak through 0 * x); real
        slots bit for bit. Floating x: a bitwise AND with the slot mask (`mask_bits`, exact and NaN-safe,
        at the speed of a copy: ``torch.where`` with a broadcast bool mask is not vectorised on CPU, 5x slower)."""
        if x.dtype in SAME_WIDTH_INT:
            return mask_bits(x, self._slot_bits(x))
        return torch.where(self._slot_mask(x), x, torch.zeros((), dtype=x.dtype, device=x.device))

    def keep_padded(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new`` on real slots, ``old`` on padded ones: padded slots pass through every step unchanged.
        Floating tensors of one dtype and shape: bit for bit, by `select_bits`."""
        if new.dtype in SAME_WIDTH_INT and old.dtype == new.dtype and old.shape == new.shape:
            return select_bits(new, old, self._slot_bits(new))
        return torch.where(self._slot_mask(new), new, old)

    def _slot_mask(self, x: torch.Tensor) -> torch.Tensor:
        return self.mask.reshape(self.mask.shape + (1,) * (x.ndim - 2))

    def _slot_bits(self, x: torch.Tensor) -> torch.Tensor:
        """The slot mask as an integer of x's width, all bits set on real slots, none on padded ones, shaped
        to broadcast against x (cached per width, rank and device while the mask is unchanged)."""
        itype = SAME_WIDTH_INT[x.dtype]
        return self.mask_cached("_bits", (itype, x.ndim, str(x.device)),
                                lambda: -self._slot_mask(x).to(device=x.device, dtype=itype))

    def mask_cached(self, slot: str, key, build):
        """``build()``, cached under ``key`` in the graph's ``slot`` while the mask is the same object and unchanged
        (its version counter joins the key; a new mask object starts a new cache; at most 9 entries a slot). Not
        cached while compiling or for an inference-mode mask (no version counter to key on): built each time.
        Every layer of an unroll meets the same graph, so what depends only on the mask is built once."""
        mask = self.mask
        if torch.compiler.is_compiling() or mask.is_inference():
            return build()
        key = (key, mask._version)
        cache = self.__dict__.get(slot)
        if cache is None or cache[0] is not mask:      # the mask object itself owns the cache (a new mask: a new one)
            cache = self.__dict__[slot] = (mask, {})
        out = cache[1].get(key)
        if out is None:
            if len(cache[1]) > 8:
                cache[1].clear()
            out = cache[1][key] = build()
        return out

    def to(self, device) -> "TokenGraph":
        g = object.__new__(TokenGraph)
        g.__dict__.update(self.__dict__)
        g.__dict__.pop("_bits", None)
        g.mask = self.mask.to(device)
        g._edges = None if self._edges is None else self._edges.to(device)
        g._all = None if self._all is None else self._all.to(device)
        g._keep = None if self._keep is None else self._keep.to(device)
        g.__dict__.pop("_layouts", None)
        return g

    def with_mask(self, mask) -> "TokenGraph":
        """The same edges under a new padding mask ``(B, n)`` (on the graph's device): edges touching a padded
        slot count no more. Right for graphs whose edges do not depend on the mask (`MASK_FREE` builders).
        No host read: the edge list keeps its shape (the kernels weigh each edge by the mask,
        [`fixed_edges`][energies.TokenGraph.fixed_edges]); [`edges`][energies.TokenGraph.edges] compacts it when
        asked."""
        g = object.__new__(TokenGraph)
        g.__dict__.update(self.__dict__)
        g.__dict__.pop("_bits", None)
        g.mask = check_mask(mask, self.batch_size, self.num_nodes).to(self.device)
        g._edges = None
        return g

    def fixed_edges(self):
        """``(src, dst, valid)``: the edge list of fixed shape (``u < v`` flat ids, whatever the mask) and a bool per
        edge, True where both tokens are real, or None where every listed edge is real; all device ops, no host read
        (the edge kernel, degrees and the dense adjacency use it). The complete graph lists all pairs of slots of
        each example, weighed by the mask (so it runs on ``meta`` too, and without a sync on a GPU). A graph from
        [`from_listed`][energies.TokenGraph.from_listed] also lists its repeats and self loops as loops ``(u, u)``,
        ``valid`` False there."""
        if self.is_complete and self._edges is None:
            src, dst = self._all_pairs()
            flat = self.mask.reshape(-1)
            return src, dst, flat[src] & flat[dst]
        if self._edges is not None or self._all is None:     # compacted already: every edge real
            src, dst = self.edges()
            return src, dst, None
        src, dst = self._all
        flat = self.mask.reshape(-1)
        valid = flat[src] & flat[dst]
        return src, dst, valid if self._keep is None else valid & self._keep

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
        """Flat ids ``u < v`` of every pair of slots within each example (the complete graph before the mask);
        a list that cannot fit in memory is refused before it is built (`energies.memory.check_memory`: the
        ids, the mask's pick and the kept copy, 40 bytes a pair)."""
        n = self.num_nodes
        pairs = self.batch_size * n * (n - 1) // 2
        check_memory(40 * pairs, f"the complete graph's edge list on n={n} tokens x batch_size {self.batch_size} "
                     f"({pairs:,} pairs)", GraphError, "keep the complete graph implicit: use a kernel that does not "
                     "list its edges (dense, softmax, streamed, fused, triton), or a smaller n", device=self.device)
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


def check_tokens(Y, graph: Optional[TokenGraph] = None, name: str = "Y") -> torch.Tensor:
    """Validate a token tensor and return it as ``(B, n, d)``.

    Accepts ``(n, d)`` (one example) or ``(B, n, d)``. Requires a floating dtype, a shape that
    matches ``graph``, and finite values on every real token (padded slots are not checked; a meta tensor has no
    values, and only its shape, dtype and device are checked).

    Args:
        Y: the tokens, a floating ``(n, d)`` or ``(B, n, d)`` tensor with d >= 1.
        graph: the token graph Y must match (its ``(B, n)``, device and mask); None checks every token.
        name: what the messages call the tensor.

    Returns:
        Y as ``(B, n, d)`` (a view with a leading batch dimension for ``(n, d)``; else Y itself).

    Raises:
        TokenError: Y not a tensor, not floating, of the wrong rank, shape or device, or holding NaN / Inf on a
            real token (the message names the example and token).
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
        if not isinstance(graph, TokenGraph):
            raise GraphError(f"graph must be a TokenGraph, got {type(graph).__name__}")
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
