"""``UnfoldedAttentionConv``: the attention MM step as a PyTorch Geometric layer.

Node features X ``(N, d)`` on the undirected graph of ``edge_index`` (either orientation or both;
self loops and duplicates are dropped), anchor B (``x0``, the initial residual of supplement F.4;
zero when not given), heads h with metrics W_h ``(d, d_h)``:

    E(X) = sum_h sum_{{u,v} in E} tau rho( ||W_h^T (x_u - x_v)||^2 / (2 tau) ) + 1/2 ||X - B||^2
           [+ indicator(X >= 0) with ``relu=True``]                              (supplement eq. 33)

One layer is one majorization-minimization step on E ([`unfold.mm.mm_step`][unfold.mm_step], the step every MM layer of
the framework takes), with ``gamma^h_uv = rho'(z^h_uv)``:

* no metric (``head_channels=None``, one head): the Jacobi step of eq. 36-37,
  ``x_u <- (1 - alpha) x_u + alpha (sum_v gamma_uv x_v + b_u) / (1 + sum_v gamma_uv)``, computed as
  ``x_u + alpha (sum_v gamma_uv (x_v - x_u) + b_u - x_u) / (1 + deg_u)`` (exactly fixed at a fixed point):
  [`AttentionStep`][unfold.AttentionStep]'s exact update;
* learned metrics: the majorized proximal step of [`ProxMMStep`][unfold.ProxMMStep],
  ``x_u <- [ReLU]( x_u - alpha grad_u E / c_u )``, ``c_u = 1 + sum_h 2 deg_h(u) ||W_h||_2^2``.

Both never increase E, for any weights and any 0 < alpha <= 1. The energy terms are the library's own
([`PairwiseAttention`][energies.PairwiseAttention] per head, [`Residual`][energies.Residual],
[`NonNegativity`][energies.NonNegativity]) on a [`TokenGraph`][energies.TokenGraph] of the nodes, and the sums
over edges are the registered ``edges`` kernel (gather/scatter over the canonical edge list, as PyG's message
passing): nothing is derived twice. The energy at the layer's input comes from the same pass
(``return_energy=True``).

Graph inputs: a ``(2, E)`` integer ``edge_index`` (or a ``torch_geometric.EdgeIndex``), a sparse adjacency
``adj_t`` (a ``torch.sparse`` COO/CSR/CSC matrix, or a ``torch_sparse.SparseTensor``), and ``batch`` (the
node-to-graph vector of a mini-batch) for per-graph energies. Node ids are read on the host (checked, each
undirected edge kept once) with ``validate=True``, under ``torch_geometric.debug()``, for ids on the CPU outside
``torch.compile``, with ``cached=True`` (once, then reused, as PyG's ``GCNConv(cached=True)``: transductive
settings, one graph) and with ``batch`` (the layout's sizes come from the ids). Otherwise (ids on a GPU or
``meta``, or a compiled forward) nothing is read: the edges stay a list of fixed shape whose repeats and self
loops weigh 0 ([`from_listed`][energies.TokenGraph.from_listed]), ids out of range fail ``torch._assert_async``,
and the forward compiles whole (0 graph breaks, ``tests/test_pyg_compile.py``) and runs on ``meta``. Node
features are checked for shape always and for finiteness only with ``validate=True`` or under
``torch_geometric.debug()`` (a host read).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import NamedTuple, Optional

import torch
import torch_geometric
from torch import nn
from torch_geometric.nn import MessagePassing

from energies.checks import check_flag, check_int, check_number
from energies.energy import Energy
from energies.errors import GraphError, StepError, TokenError
from energies.graphs import MAX_SLOTS, TokenGraph, canonical_edges
from energies.memory import check_memory
from energies.rho import get_rho
from energies.terms import NonNegativity, PairwiseAttention, Residual, finite_f64, version_cached

from . import mm as _mm
from .steps import check_alpha

__all__ = ["UnfoldedAttentionConv", "undirected_edges", "NodeLayout"]


def _edge_tensor(edge_index) -> torch.Tensor:
    """A ``(2, E)`` integer tensor from an edge_index, an ``EdgeIndex``, a torch sparse adjacency or a
    ``torch_sparse.SparseTensor`` (each nonzero (i, j) one edge; orientation does not matter here)."""
    if type(edge_index).__name__ == "SparseTensor" and hasattr(edge_index, "coo"):
        row, col, _ = edge_index.coo()
        return torch.stack([row, col])
    if isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided:
        if edge_index.ndim != 2 or edge_index.shape[0] != edge_index.shape[1]:
            raise GraphError(f"a sparse adjacency must be square (N, N), got {tuple(edge_index.shape)}")
        return edge_index.to_sparse_coo().coalesce().indices()
    if not isinstance(edge_index, torch.Tensor) or edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise GraphError(f"edge_index must be a (2, E) tensor, got {getattr(edge_index, 'shape', type(edge_index))}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise GraphError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    return edge_index.as_subclass(torch.Tensor) if type(edge_index) is not torch.Tensor else edge_index


def _check_adjacency_size(edge_index, num_nodes: int) -> None:
    """A sparse adjacency (torch sparse or ``torch_sparse.SparseTensor``) must be ``(num_nodes, num_nodes)``: one of
    another size belongs to another graph, even where its nonzeros happen to fall within the nodes."""
    if type(edge_index).__name__ == "SparseTensor" and hasattr(edge_index, "sparse_sizes"):
        size = tuple(edge_index.sparse_sizes())
    elif isinstance(edge_index, torch.Tensor) and edge_index.layout != torch.strided:
        size = tuple(edge_index.shape)
    else:
        return
    if size != (num_nodes, num_nodes):
        raise GraphError(f"a sparse adjacency of {num_nodes} nodes must be ({num_nodes}, {num_nodes}), got {size}")


def undirected_edges(edge_index, num_nodes: int) -> torch.Tensor:
    """Both orientations of every undirected edge once, no self loops; checks ids and dtype (the canonical
    edges of `energies.graphs.canonical_edges`, written both ways as PyG's message passing expects)."""
    ei = _edge_tensor(edge_index)
    _check_adjacency_size(edge_index, num_nodes)
    ei = canonical_edges(ei, num_nodes, num_nodes, lenient=True)
    return torch.stack([torch.cat([ei[0], ei[1]]), torch.cat([ei[1], ei[0]])])


class NodeLayout(NamedTuple):
    """Where the nodes sit in the ``(G, n_max)`` token layout of their graphs: ``slots`` (flat slot per node), or
    None when there is one graph and the layout is the nodes themselves."""
    graph: TokenGraph
    slots: Optional[torch.Tensor]
    num_nodes: int


def _batch_counts(batch, num_nodes: int, device):
    """``(b, counts, G, n_max)`` of a PyG ``batch`` vector: the graph ids as long on ``device``, the nodes per graph,
    the number of graphs and the largest; refused (GraphError) where it is not a ``(num_nodes,)`` integer tensor,
    holds negative ids, or lays out more token slots than `MAX_SLOTS` or memory holds."""
    if (not isinstance(batch, torch.Tensor) or batch.shape != (num_nodes,) or batch.dtype.is_floating_point
            or batch.dtype in (torch.bool, torch.complex64, torch.complex128)):
        raise GraphError(f"batch must be a ({num_nodes},) integer tensor, got "
                         f"{getattr(batch, 'shape', type(batch).__name__)} {getattr(batch, 'dtype', '')}")
    b = batch.to(device=device, dtype=torch.long)
    if num_nodes and int(b.min()) < 0:
        raise GraphError(f"batch holds negative graph ids ({int(b.min())})")
    top = int(b.max()) if num_nodes else 0
    if top >= MAX_SLOTS:       # bincount would allocate top + 1 counters before any other check
        raise GraphError(f"batch holds graph id {top}: more than the {MAX_SLOTS} token slots a layout holds")
    counts = torch.bincount(b)
    G, n_max = int(counts.numel()), int(counts.max()) if num_nodes else 1
    if G * n_max > MAX_SLOTS:
        raise GraphError(f"batch lays out {G} graphs x {n_max} nodes (the largest) = {G * n_max} token slots, "
                         f"more than {MAX_SLOTS}: number the graphs 0, 1, ... without gaps")
    check_memory(17 * G * n_max, f"the layout of batch: {G} graphs x {n_max} nodes (the largest)", GraphError,
                 "number the graphs 0, 1, ... without gaps")
    return b, counts, G, n_max


class UnfoldedAttentionConv(MessagePassing):
    """One attention MM step on a graph (module docstring). Usable like any PyG conv:
    ``x = conv(x, edge_index, x0)``; ``conv(x, edge_index, x0, return_energy=True)`` also returns the terms
    of E at the input (float64: scalars, or ``(G,)`` per graph with ``batch``); `energy` evaluates E
    alone. Apply one conv T times for a true unrolled optimisation."""

    def __init__(self, channels: int, heads: int = 1, head_channels: Optional[int] = None, rho: str = "exp",
                 tau: Optional[float] = None, alpha: float = 1.0, relu: bool = False, cached: bool = False,
                 validate: bool = False):
        super().__init__(aggr="add", node_dim=0)
        self.channels = check_int(channels, "channels", 1, error=StepError)
        self.heads = check_int(heads, "heads", 1, error=StepError)
        if head_channels is not None:   # a head maps d features to d_h <= d (more adds nothing: W W^T has rank <= d)
            head_channels = check_int(head_channels, "head_channels", 1, self.channels, StepError)
        self.rho = get_rho(rho)
        self.alpha = check_alpha(alpha)
        self.relu, self.cached, self.validate = (check_flag(flag, name, StepError, numpy_bool=True) for name, flag in
                                                 (("relu", relu), ("cached", cached), ("validate", validate)))
        metric = head_channels is not None or self.heads > 1
        self.head_channels = (head_channels or self.channels) if metric else self.channels
        self.tau = (check_number(tau, "tau", "positive", StepError) if tau is not None
                    else math.sqrt(self.head_channels))
        if relu and not metric:
            raise StepError("relu=True needs the proximal form: give head_channels (a learned metric)")
        if metric:                     # before allocating: the allocator's untyped error otherwise
            entries = self.heads * self.channels * self.head_channels
            check_memory(8 * entries, f"UnfoldedAttentionConv with channels={self.channels}, heads={self.heads}, "
                         f"head_channels={self.head_channels}: {entries:,} float32 weights", StepError,
                         "use smaller channels, heads or head_channels")
        self.W = nn.Parameter(torch.empty(self.heads, self.channels, self.head_channels)) if metric else None
        self.nonneg = NonNegativity() if self.relu else None
        self.preconditioner = "bound" if metric else "jacobi"
        self._cached_layout: Optional[NodeLayout] = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_h with i.i.d. N(0, 1/d) entries; the cached graph is dropped."""
        super().reset_parameters()
        if self.W is not None:
            with torch.no_grad():   # the draws of earlier versions
                self.W.copy_(torch.randn(self.W.shape) / math.sqrt(self.channels))
        self._cached_layout = None

    # ------------------------------------------------------------------ graph preprocessing
    def layout(self, edge_index, num_nodes: int, batch: Optional[torch.Tensor] = None,
               device: Optional[torch.device] = None) -> NodeLayout:
        """The token graph of the nodes (cached with ``cached=True``): one example of N nodes, or with
        ``batch`` one example per graph (``to_dense_batch``'s layout) so that energies come per graph."""
        if self.cached and self._cached_layout is not None:
            if self._cached_layout.num_nodes != num_nodes:
                raise GraphError(f"cached=True: this conv cached a graph of {self._cached_layout.num_nodes} nodes, "
                                 f"got {num_nodes} (call reset_parameters() to drop it)")
            return self._cached_layout
        ei = _edge_tensor(edge_index)               # refuses a non-square adjacency first
        _check_adjacency_size(edge_index, num_nodes)
        device = ei.device if device is None else torch.device(device)
        checked = self.cached or batch is not None or self._reads_ids(ei)
        if ei.device.type == "meta" and (checked or device.type != "meta"):
            raise GraphError("edge_index is on the meta device: its node ids are read on the host (give it on cpu or "
                             "on x's device)")
        if not checked:     # no host read: a graph of fixed shape (compiles whole, runs on meta)
            return NodeLayout(TokenGraph.from_listed(ei.to(device), num_nodes, name="pyg"), None, num_nodes)
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= num_nodes):
            raise GraphError(f"edge_index holds node ids in [{int(ei.min())}, {int(ei.max())}], "
                             f"outside [0, {num_nodes}) for {num_nodes} nodes")
        if batch is None:
            canon = canonical_edges(ei, num_nodes, num_nodes, lenient=True)
            out = NodeLayout(TokenGraph(1, num_nodes, None, canon, name="pyg").to(device), None, num_nodes)
        else:
            b, counts, G, n_max = _batch_counts(batch, num_nodes, ei.device)
            ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
            order = torch.argsort(b, stable=True)
            local = torch.empty_like(b)
            local[order] = torch.arange(num_nodes, device=b.device) - ptr[b[order]]
            slots = b * n_max + local
            mask = torch.zeros(G * n_max, dtype=torch.bool, device=b.device)
            mask[slots] = True
            canon = canonical_edges(slots[ei.long()], G * n_max, n_max, lenient=True)
            graph = TokenGraph(G, n_max, mask.reshape(G, n_max), canon, name="pyg")
            out = NodeLayout(graph.to(device), slots.to(device), num_nodes)
        if self.cached:
            self._cached_layout = out
        return out

    def _reads_ids(self, ei: torch.Tensor) -> bool:
        """Whether the node ids are checked (read on the host): with ``validate=True`` or under
        ``torch_geometric.debug()``, and for ids on the CPU outside ``torch.compile`` (no device to wait for);
        not for ids on a GPU or ``meta`` with validation off, nor while compiling (a graph break)."""
        if self.validate or torch_geometric.is_debug_enabled():
            return True
        return ei.device.type == "cpu" and not torch.compiler.is_compiling()

    def _tokens(self, x: torch.Tensor, lay: NodeLayout) -> torch.Tensor:
        """Node rows ``(N, d)`` -> tokens ``(G, n_max, d)`` of the layout."""
        if lay.slots is None:
            return x[None]
        g = lay.graph
        return x.new_zeros(g.total_nodes, x.shape[-1]).index_copy(0, lay.slots, x).reshape(g.batch_size, g.num_nodes, -1)

    @staticmethod
    def _nodes(Y: torch.Tensor, lay: NodeLayout) -> torch.Tensor:
        return Y[0] if lay.slots is None else Y.reshape(-1, Y.shape[-1])[lay.slots]

    def _check(self, x, x0):
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[1] != self.channels:
            raise TokenError(f"x must be (num_nodes, {self.channels}), got {tuple(getattr(x, 'shape', ()))}")
        if not x.dtype.is_floating_point:
            raise TokenError(f"x must be a finite floating tensor (dtype {x.dtype}; NaN/Inf not allowed)")
        # devices: metadata only, no host sync; x on meta (shape inference, ids read from a host edge_index) runs
        if self.W is not None and self.W.device != x.device and x.device.type != "meta":
            raise TokenError(f"x is on {x.device}, the conv's weights on {self.W.device}: move one (conv.to(device))")
        if x0 is not None:
            if not isinstance(x0, torch.Tensor) or not x0.dtype.is_floating_point:
                raise TokenError(f"x0 must be a floating tensor like x, got {getattr(x0, 'dtype', type(x0).__name__)}")
            if x0.shape != x.shape:
                raise TokenError(f"x0 has shape {tuple(x0.shape)}, x has {tuple(x.shape)}")
            if x0.device != x.device and x.device.type != "meta":
                raise TokenError(f"x0 is on {x0.device}, x on {x.device}: give both on one device")
        if self.validate or torch_geometric.is_debug_enabled():   # host reads: behind the switch (meta: no values)
            for name, t in (("x", x), ("x0", x0)):
                if t is not None and t.device.type != "meta" and not bool(torch.isfinite(t).all()):
                    raise TokenError(f"{name} must be a finite floating tensor (dtype {x.dtype}; NaN/Inf not allowed)")

    # ------------------------------------------------------------------ the energy and the step
    def energy_of(self, x0_tokens: Optional[torch.Tensor]) -> Energy:
        """E of the module docstring on the layout's tokens, anchored at ``x0_tokens`` (None: B = 0)."""
        if self.W is None:
            terms = [("attention", PairwiseAttention(self.rho, self.tau, kernel="edges", validate=False))]
        else:
            norm2 = version_cached(self, "_norm2_cache", self.W,                            # (H,), float64, once
                                   lambda W: torch.linalg.matrix_norm(finite_f64(W), ord=2) ** 2)   # per weights
            names = ["attention"] if self.heads == 1 else [f"head{h}" for h in range(self.heads)]
            terms = [(names[h], PairwiseAttention(self.rho, self.tau, kernel="edges", metric=self.W[h],
                                                  metric_norm2=norm2[h], validate=False)) for h in range(self.heads)]
        terms.append(("residual", Residual(x0_tokens, validate=False)))
        if self.nonneg is not None:
            terms.append(("relu", self.nonneg))
        return Energy(terms)

    def _prepare(self, x, edge_index, x0, batch):
        self._check(x, x0)
        lay = self.layout(edge_index, x.shape[0], batch, x.device)
        Y = self._tokens(x, lay)
        B = None if x0 is None else self._tokens(x0.to(x.dtype), lay)
        return lay, Y, self.energy_of(B)

    def _values(self, vals, lay: NodeLayout):
        return OrderedDict((k, v[0] if lay.slots is None else v) for k, v in vals.items())

    def forward(self, x: torch.Tensor, edge_index, x0: Optional[torch.Tensor] = None, return_energy: bool = False,
                batch: Optional[torch.Tensor] = None):
        if isinstance(x, torch.Tensor) and x.ndim == 2 and x.shape[0] == 0:   # no nodes: nothing moves, E = 0
            self._check(x, x0)
            zero = torch.zeros((), dtype=torch.float64, device=x.device)
            return (x, OrderedDict((k, zero) for k in self.energy_of(None).terms)) if return_energy else x
        lay, Y, energy = self._prepare(x, edge_index, x0, batch)
        res = _mm.mm_step(energy, Y, lay.graph, self.alpha, self.preconditioner, values=return_energy,
                           validate=False)
        out = self._nodes(res.Y, lay)
        return (out, self._values(res.values, lay)) if return_energy else out

    def mm(self, x: torch.Tensor, edge_index, x0: Optional[torch.Tensor] = None, batch: Optional[torch.Tensor] = None):
        """``(direction, curvature)`` per node: the step is ``prox(x + alpha * direction)`` with
        ``direction = -grad E / P`` (P the Jacobi diagonal or the curvature bound,
        [`unfold.mm.mm_direction`][unfold.mm_direction]) and ``curvature`` c_u the summed curvature bound (its
        majorizer's metric)."""
        lay, Y, energy = self._prepare(x, edge_index, x0, batch)
        direction, _, curv = _mm.mm_direction(energy, Y, lay.graph, self.preconditioner, validate=False)
        return self._nodes(direction, lay), (curv[0] if lay.slots is None else curv.reshape(-1)[lay.slots])

    def energy(self, x: torch.Tensor, edge_index, x0: Optional[torch.Tensor] = None,
               batch: Optional[torch.Tensor] = None) -> torch.Tensor:
        """E(x) (float64: a scalar, or ``(G,)`` per graph with ``batch``), by the same kernel pass as the step's
        energy (``return_energy=True``), without the neighbour sums."""
        if isinstance(x, torch.Tensor) and x.ndim == 2 and x.shape[0] == 0:
            self._check(x, x0)
            return torch.zeros((), dtype=torch.float64, device=x.device)
        lay, Y, energy = self._prepare(x, edge_index, x0, batch)
        total = sum(t.pass_value(Y, lay.graph) for t in energy.terms.values())
        return total[0] if lay.slots is None else total

    def __repr__(self) -> str:
        form = "exact" if self.W is None else f"prox, heads={self.heads}, head_channels={self.head_channels}"
        return (f"{type(self).__name__}({self.channels}, {form}, rho={self.rho.spec()}, tau={self.tau:g}, "
                f"alpha={self.alpha:g}{', relu' if self.relu else ''}{', cached' if self.cached else ''})")
