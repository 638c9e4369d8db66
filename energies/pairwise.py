"""Pairwise sums over a token graph: the one place where edges meet tensors.

Five kernels compute the same quantities, so that energies and updates share the math and only
swap the kernel:

* ``edges``: gather/scatter over the canonical edge list (any graph, O(|E| d) memory), z from explicit
  differences;
* ``dense``: an ``(B, n, n)`` weight matrix (complete graphs or small n);
* ``softmax``: complete graph with rho = exp only: softmax over all keys of the logits
  ``-z_uv = (y_u.y_v - |y_v|^2 / 2 - |y_u|^2 / 2) / tau`` (the key bias ``log beta_v`` of supplement
  eq. 35, 39 plus a per-query constant, which the softmax ignores), self included, explicit n x n logits;
* ``fused``: the same softmax in one flash-attention kernel call (:mod:`energies.fused`): no n x n
  matrix, the log-sum-exp differentiable, CPU only;
* ``streamed``: complete graph, any rho, tiles of ``STREAM_TILE`` keys: O(B n tile) memory forward
  and backward (a custom autograd function recomputes one tile at a time in the backward pass).
  ``gamma = rho'(z)`` is bounded for every rho here and the step divides by ``1 + deg``, so plain
  sums of tiles are safe.

For edge weights ``gamma_uv = rho'(z_uv)``, ``z_uv = ||y_u - y_v||^2 / (2 tau)``, one pass returns

    agg_u = sum_{v in N(u)} gamma_uv (y_v - y_u),     deg_u = sum_{v in N(u)} gamma_uv,

and, from the same pass, the pairwise energy ``sum_{{u,v} in E} tau rho(z_uv)`` per example. ``agg`` is
minus the gradient of the pairwise energy: it depends on differences only, so a token with no pull
gets exactly 0 and a fixed point of the step stays exactly fixed (``num_u = agg_u + deg_u y_u`` is
also available). On the softmax kernels, with ``S_u = sum_v exp(-z_uv) = 1 + deg_u`` (self included)
and ``P`` the softmax, ``agg_u = S_u (P Y - Y)_u``: the self term contributes ``p_uu (y_u - y_u) = 0``,
so nothing has to be removed with a separately rounded diagonal logit, ``deg_u = expm1(LSE_u)`` and
the energy is ``-tau/2 sum_u deg_u`` (../shared/NOTES.md).

Precision at every scale. z depends on differences only, so the kernels that use the expansion
``|a|^2 + |b|^2 - 2 a.b`` (dense, softmax, fused, streamed) work on tokens centred per example; its
rounding error is then about ``eps * max_u |y_u - mean|^2 / tau`` in z, which :func:`expansion_dtype`
keeps below ``EXPANSION_Z_ERROR[dtype]`` by computing in float64, or, where even float64 cannot
(``max |y|^2 / tau`` beyond ~4e6, or a tiny tau), by the streamed pass with explicit differences:
a stable formulation of every kernel, chosen per call (one host read of the largest norm; skipped
under ``torch.compile``, where the kernel runs as asked).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional

import torch

from .errors import EnergyError
from .fused import fused_available, fused_attention
from .graph import TokenGraph
from .rho import ExpRho, Rho, kernel_sensitivity

__all__ = ["KERNELS", "Kernel", "register_kernel", "kernel_names", "pick_kernel", "edge_z", "dense_z", "explicit_z",
           "expansion_dtype", "PairwisePass", "pairwise_pass", "pairwise_pass_heads", "weighted_neighbour_sums", "pairwise_energy",
           "EXPANSION_Z_ERROR"]
#: key tile of the streamed kernel, and the n above which ``auto`` streams a complete graph
STREAM_TILE = 256
STREAM_MIN_N = 1024
#: largest (B * n * tile * d) element count of one tile of explicit differences
EXPLICIT_TILE_ELEMENTS = 1 << 22
#: largest tolerated rounding error of z in the expansion, per compute dtype: ``eps * max|y|^2 / tau``.
#: 2^-30 (float64) keeps kernels within ~1e-9 of the step; 2^-14 (float32: max|y|^2 / tau <= 512) is
#: near float32's own rounding of a sum of a few hundred terms. Others (half, bfloat16) compute in float32.
EXPANSION_Z_ERROR = {torch.float64: 2.0 ** -30, torch.float32: 2.0 ** -14}


class PairwisePass(NamedTuple):
    agg: Optional[torch.Tensor]     # (B, n, d)  sum_v gamma_uv (y_v - y_u), or None (energy-only pass)
    deg: torch.Tensor               # (B, n)     sum_v gamma_uv
    energy: Optional[torch.Tensor]  # (B,) float64, sum_E tau rho(z), or None when not asked for
    Y: Optional[torch.Tensor] = None       # the (zero-padded) tokens of the pass, for :attr:`num`
    metric: Optional[torch.Tensor] = None  # the pass's metric W, for :attr:`num`

    @property
    def num(self) -> Optional[torch.Tensor]:
        """``sum_v gamma_uv z_v = agg_u + deg_u z_u`` ``(B, n, d)``, z = W^T y (not translation invariant)."""
        return None if self.agg is None else self.agg + self.deg[..., None] * _apply(self.Y, self.metric)


class Kernel(NamedTuple):
    """A registered pairwise kernel (:func:`register_kernel`).

    ``run(Y, graph, rho, tau, energy, num, metric) -> PairwisePass``. A kernel with ``expansion=False`` gets the
    zero-padded tokens Y and the metric W (or None) and must form z from them itself; one with
    ``expansion=True`` gets the centred features ``Z = W^T (y - mean)`` already in the dtype that resolves the
    expansion ``|a|^2 + |b|^2 - 2 a.b`` (:func:`expansion_dtype`), ``metric=None`` and the keyword ``sq``
    (``|z_u|^2`` when already computed, else None), so it may use the expansion freely."""
    name: str
    run: Callable[..., PairwisePass]
    #: ``supports(graph, rho)``: None where the kernel applies, else why not, worded to follow
    #: "the NAME kernel ..." (e.g. "needs the complete graph")
    supports: Callable[[TokenGraph, Rho], Optional[str]]
    expansion: bool


#: the pairwise kernels by name (``auto`` is not one: :func:`pick_kernel` chooses among them)
KERNELS: Dict[str, Kernel] = {}


def _any_graph(graph: TokenGraph, rho: Rho) -> Optional[str]:
    return None


def register_kernel(name: str, supports: Optional[Callable[[TokenGraph, Rho], Optional[str]]] = None,
                    expansion: bool = False):
    """``@register_kernel("name")`` on ``run(Y, graph, rho, tau, energy, num, metric) -> PairwisePass``: the
    kernel becomes selectable by name everywhere a kernel is (terms, steps, models, configs, CLIs); see
    :class:`Kernel` for the contract. Every kernel must return the same ``agg``, ``deg`` and energy as
    ``edges`` to rounding (the tests compare each registered kernel with it)."""
    if not isinstance(name, str) or not name or name == "auto" or ":" in name:
        raise EnergyError(f"a kernel name must be a non-empty string other than 'auto' without ':', got {name!r}")

    def deco(run):
        KERNELS[name] = Kernel(name, run, supports or _any_graph, bool(expansion))
        return run

    return deco


def kernel_names():
    """``['auto', *registered kernels]``: the values a ``kernel`` argument takes."""
    return ["auto"] + list(KERNELS)


def _complete_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    return None if graph.is_complete else f"is for the complete graph; got graph {graph.name!r} (use 'edges')"


def _softmax_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    if graph.is_complete and isinstance(rho, ExpRho):
        return None
    return f"needs the complete graph and rho='exp'; got graph {graph.name!r}, rho {rho.spec()!r}"


def _fused_only(graph: TokenGraph, rho: Rho) -> Optional[str]:
    why = _softmax_only(graph, rho)
    if why is None and not fused_available(graph.mask.device.type):
        why = (f"needs PyTorch's CPU flash-attention op, not available on {graph.mask.device.type!r}; "
               "use 'softmax' or 'streamed'")
    return why


def pick_kernel(graph: TokenGraph, rho: Rho, kernel: str = "auto") -> str:
    """``auto``: off the CPU (a GPU, or the ``meta`` device that stands in for one) the ``triton`` kernel where
    Triton is installed and the penalty has Triton functions; on the CPU, and elsewhere without Triton: on the
    complete graph with rho = exp the fused kernel where its op exists (CPU), else softmax (streamed above
    ``STREAM_MIN_N`` tokens); other rho on the complete graph: dense, streamed above ``STREAM_MIN_N``; a
    shift-invariant graph on the CPU where its tiles pay (:func:`~energies.banded.banded_pays`): banded;
    any other graph: edges. A kernel that does not apply is an error."""
    if kernel == "auto":
        if graph.mask.device.type != "cpu" and "triton" in KERNELS and KERNELS["triton"].supports(graph, rho) is None:
            return "triton"
        if not graph.is_complete:
            if graph.mask.device.type == "cpu" and "banded" in KERNELS:
                from .banded import banded_pays
                if banded_pays(graph):
                    return "banded"
            return "edges"
        if isinstance(rho, ExpRho):
            if fused_available(graph.mask.device.type):
                return "fused"
            return "streamed" if graph.num_nodes > STREAM_MIN_N else "softmax"
        return "streamed" if graph.num_nodes > STREAM_MIN_N else "dense"
    if kernel not in KERNELS:
        raise EnergyError(f"unknown pairwise kernel {kernel!r}; valid: {kernel_names()}")
    why = KERNELS[kernel].supports(graph, rho)
    if why is not None:
        raise EnergyError(f"the {kernel} kernel {why}")
    return kernel


def edge_z(Yf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, tau: float) -> torch.Tensor:
    """``z_e = ||y_src - y_dst||^2 / (2 tau)`` per edge, from explicit differences."""
    diff = Yf[src] - Yf[dst]
    return (diff * diff).sum(-1) / (2.0 * tau)


def dense_z(Y: torch.Tensor, tau: float, K: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(B, n, m)`` matrix of ``z_uv = |y_u - k_v|^2 / (2 tau)`` for keys K (default: Y itself) by the
    expansion ``|y_u|^2 + |k_v|^2 - 2 y_u.k_v``, clamped at 0 (accurate when the tokens are centred and
    :func:`expansion_dtype` accepts their scale)."""
    K = Y if K is None else K
    d2 = (Y * Y).sum(-1)[:, :, None] + (K * K).sum(-1)[:, None, :] - 2.0 * Y @ K.transpose(1, 2)
    return torch.clamp(d2, min=0.0) / (2.0 * tau)


def explicit_z(Y: torch.Tensor, K: torch.Tensor, tau: float, metric: Optional[torch.Tensor] = None):
    """``(z, W^T (k_v - y_u))`` for queries Y ``(B, n, d)`` and keys K ``(B, m, d)`` from explicit differences
    ``(B, n, m, d)``, taken in token space and then mapped by the metric W (if any): exact to rounding at any
    scale, at d times the memory of :func:`dense_z`."""
    diff = _apply(K[:, None, :, :] - Y[:, :, None, :], metric)
    return (diff * diff).sum(-1) / (2.0 * tau), diff


def _explicit_tile(Y: torch.Tensor, width: int, cap: int) -> int:
    """Keys per tile of explicit differences: at most ``cap`` and ``EXPLICIT_TILE_ELEMENTS`` elements of
    ``(B, n, tile, width)``."""
    B, n, _ = Y.shape
    return max(1, min(cap, EXPLICIT_TILE_ELEMENTS // max(1, B * n * width)))


def _centred(Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
    """Y (zero on padded slots) minus the mean of each example's real tokens (padded slots stay 0). z and agg
    depend on differences only, so this changes nothing but the rounding of the expansion; the mean is
    detached (translation invariance makes its gradient contribution zero)."""
    m = graph.mask.to(Y.dtype)[..., None]
    mean = Y.detach().sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1.0)
    return (Y - mean) * m


def expansion_dtype(Yc: torch.Tensor, tau: float, sensitivity: float = 1.0,
                    sq: Optional[torch.Tensor] = None) -> Optional[torch.dtype]:
    """The dtype in which the expansion ``|a|^2 + |b|^2 - 2 a.b`` of centred tokens Yc resolves the edge weights
    to ``EXPANSION_Z_ERROR``: Yc's own dtype (float32 or float64), else float64, else None (use explicit
    differences). Rounding of the expansion: ``|dz| <~ eps * max_u |y_u|^2 / tau``; a weight rho'(z) then moves
    by ``|dz| * sensitivity`` relative to the largest (:meth:`~energies.rho.Rho.kernel_sensitivity`, at least 1
    here: 1 for exp, ``(1 - p/2) / eps`` for lp). One host read of the largest norm (none under
    ``torch.compile``, which keeps Yc's dtype). ``sq``: ``|y_u|^2`` of Yc when already computed."""
    own = _own_dtype(Yc)
    if torch.compiler.is_compiling() or Yc.numel() == 0:
        return own
    sq = (Yc.detach() * Yc.detach()).sum(-1) if sq is None else sq.detach()
    return _scale_dtype(float(sq.max()) / tau * max(1.0, float(sensitivity)), own)


def _scale_dtype(scale: float, own: torch.dtype) -> Optional[torch.dtype]:
    """The rule of :func:`expansion_dtype` for ``scale = max |y|^2 / tau * sensitivity``: ``own``, else float64,
    where ``scale * eps(dtype) <= EXPANSION_Z_ERROR[dtype]``; None where neither resolves it."""
    for dt in dict.fromkeys((own, torch.float64)):
        if math.isfinite(scale) and scale * torch.finfo(dt).eps <= EXPANSION_Z_ERROR[dt]:
            return dt
    return None


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


#: key feature of padded tokens in the fused form: logit below -PAD_LOGIT, so that p = 0 exactly
PAD_LOGIT = 1.0e4


def _softmax_parts(Y: torch.Tensor, graph: TokenGraph, tau: float, fused: bool, num: bool,
                   sq: Optional[torch.Tensor] = None):
    """``(P Y - Y or None, LSE)`` of the softmax over all keys of the logits ``-z_uv`` (self included, so
    ``LSE_u = log(1 + deg_u) >= 0``), for centred tokens Y. Explicit: ``(B, n, n)`` logits with the diagonal
    exactly 0. Fused: one flash-attention call; the biases are folded into two extra features,
    ``[y_u, 1, -|y_u|^2/2] . [y_v, -|y_v|^2/2, 1] / tau = -z_uv``, and the values are the queries (their
    two extra output columns are not used), so q, k, v share one head size and no n x n matrix is formed."""
    if not fused:
        z = dense_z(Y, tau)
        eye = torch.eye(Y.shape[1], dtype=torch.bool, device=Y.device)
        logits = (-z).masked_fill(eye, 0.0).masked_fill(~graph.mask[:, None, :], -math.inf)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        diff = torch.exp(logits - lse) @ Y - Y if num else None
        return diff, lse[..., 0]
    diff, lse = _fused_parts(Y[:, None], graph.mask, tau, None if sq is None else sq[:, None])
    return (diff[:, 0] if num else None), lse[:, 0]


def _fused_parts(Z: torch.Tensor, mask: torch.Tensor, tau: float, sq: Optional[torch.Tensor] = None):
    """``(P Z - Z, LSE)`` for heads of centred features ``Z`` ``(B, H, n, c)`` (mask ``(B, n)``), one flash call:
    ``[z_u, 1, -|z_u|^2/2] . [z_v, -|z_v|^2/2, 1] / tau = -z_uv`` (padded keys at ``-PAD_LOGIT``), the values the
    queries themselves (their two extra output columns are dropped, so the gradient reaching them is 0 and the
    shared tensor gets exactly the gradient of ``[Z, 0, 0]`` as values), and a spare zero column that the
    backward uses for the LSE gradient (:func:`~energies.fused.fused_attention`)."""
    half_sq = 0.5 * ((Z * Z).sum(-1) if sq is None else sq)
    B, H, n, c = Z.shape
    q, k = Z.new_empty(B, H, n, c + 3), Z.new_empty(B, H, n, c + 3)
    q[..., :c], k[..., :c] = Z, Z
    q[..., c], q[..., c + 1] = 1.0, -half_sq
    k[..., c] = torch.where(mask[:, None], -half_sq, torch.full_like(half_sq, -PAD_LOGIT * tau))
    k[..., c + 1] = 1.0
    q[..., c + 2], k[..., c + 2] = 0.0, 0.0
    attn, lse = fused_attention(q, k, q, 1.0 / tau, spare=True)
    return attn[..., :c] - Z, lse


def _apply(Y: torch.Tensor, metric: Optional[torch.Tensor]) -> torch.Tensor:
    return Y if metric is None else Y @ metric.to(device=Y.device, dtype=Y.dtype)


def pairwise_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                  energy: bool = False, num: bool = True, metric: Optional[torch.Tensor] = None,
                  guard: bool = True) -> PairwisePass:
    """One pass over the graph: ``(agg, deg)`` in Y's dtype and, if asked, the pairwise energy.
    ``num=False`` skips the weighted sums over neighbours (``agg`` is then None): an energy-only pass.
    ``metric`` W ``(d, d_h)``: the pass works on the features ``z_u = W^T y_u`` (``agg`` is then ``(B, n, d_h)``),
    formed from differences or centred tokens, never from ``Y W`` of tokens far from the origin.

    ``guard``: for an expansion kernel, read the tokens' scale (one host read) and widen the dtype, or fall
    back to explicit differences, where the expansion cannot resolve z (:func:`expansion_dtype`). With
    ``guard=False`` (a forward pass with the trace off) there is no host read: the expansion runs in the
    tokens' own dtype on centred tokens, z erring by about ``eps * max_u |y_u - mean|^2 / tau``."""
    kernel = KERNELS[pick_kernel(graph, rho, kernel)]
    Y = graph.zero_padded(Y)
    if not kernel.expansion:
        return kernel.run(Y, graph, rho, tau, energy, num, metric)._replace(Y=Y, metric=metric)
    Zc = _apply(_centred(Y, graph), metric)
    sq = (Zc * Zc).sum(-1)
    if guard and Y.device.type != "cpu" and not torch.compiler.is_compiling():
        return _guarded_on_device(kernel, Y, Zc, sq, graph, rho, tau, energy, num, metric)
    dt = expansion_dtype(Zc, tau, kernel_sensitivity(rho), sq=sq) if guard else _own_dtype(Zc)
    if dt is None:   # the expansion cannot resolve z at this scale: explicit differences, tile by tile, of the
        # tokens themselves (exact); with a metric, of centred features (W needs its gradient through autograd)
        out = _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric)
    elif dt != Zc.dtype:   # centred again in the wider dtype: no rounding of y - mean in the narrow one
        out = kernel.run(_apply(_centred(Y.to(dt), graph), metric), graph, rho, tau, energy, num, None)
        out = PairwisePass(None if out.agg is None else out.agg.to(Y.dtype), out.deg.to(Y.dtype), out.energy)
    else:
        out = kernel.run(Zc, graph, rho, tau, energy, num, None, sq=sq)
    return out._replace(Y=Y, metric=metric)


def _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric) -> PairwisePass:
    """The pass from explicit differences (exact to rounding at any scale), where the expansion cannot resolve z: on
    the complete graph the streamed tiles, of the tokens (with a metric, of the centred features Zc, W getting its
    gradient through autograd); on any other graph the edge list, differences in token space mapped by W."""
    if graph.is_complete:
        return _streamed_pass(Y if metric is None else Zc, graph, rho, tau, energy, num, explicit=True)
    return _edges_pass(Y, graph, rho, tau, energy, num, metric)


def expansion_ok(sq: torch.Tensor, tau: float, sensitivity: float, dtype: torch.dtype) -> torch.Tensor:
    """The rule of :func:`expansion_dtype` decided on the device, per example: a bool ``(B,)`` (or ``sq``'s leading
    shape), True where ``max_u |z_u|^2 / tau * max(1, sensitivity) * eps(dtype) <= EXPANSION_Z_ERROR[dtype]``
    (``sq`` the squared norms of the centred features, ``(..., n)``); NaN and inf give False. No host read."""
    bound = EXPANSION_Z_ERROR[dtype] / (torch.finfo(dtype).eps * max(1.0, float(sensitivity)))
    return sq.detach().amax(-1) / tau <= bound


def _guarded_on_device(kernel: Kernel, Y, Zc, sq, graph, rho, tau, energy, num, metric) -> PairwisePass:
    """The precision guard without a host read (tokens off the CPU, where reading the scale would wait for the
    device): both the kernel's expansion in the tokens' own dtype and the explicit-difference pass (exact to
    rounding at any scale), selected per example on the device by :func:`expansion_ok`. The CPU keeps the
    one read of :func:`expansion_dtype` (host memory: nothing to wait for) and computes one path only."""
    ok = expansion_ok(sq, tau, kernel_sensitivity(rho), Zc.dtype)                 # (B,)
    fast = kernel.run(Zc, graph, rho, tau, energy, num, None, sq=sq)
    safe = _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric)

    def pick(a, b):
        return None if a is None else torch.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, b.to(a.dtype))
    return PairwisePass(pick(fast.agg, safe.agg), pick(fast.deg, safe.deg), pick(fast.energy, safe.energy),
                        Y=Y, metric=metric)


def pairwise_pass_heads(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str, metrics,
                        energy: bool = False, num: bool = True, guard: bool = True):
    """:func:`pairwise_pass` for several metrics W_1..W_H of one shape (the heads of a multi-head energy) where one
    kernel call can serve them all: the softmax kernels (complete graph, rho = exp) on the heads' centred
    features ``(B, H, n, d_h)`` from one centring and one matmul by ``[W_1 .. W_H]``; the fused kernel with its
    neighbour sums (one flash call over H heads), or the energy-only pass of either (:func:`_softmax_degrees`
    over B H examples); the banded kernel over ``(B, H)`` at once. Each head gets exactly the quantities of its own pass (the same formulas; tested).
    Returns one :class:`PairwisePass` per metric, or None where they cannot share a call (another kernel, a
    dtype other than float32/64, or a scale guard asking some head for a wider dtype or explicit differences,
    read for all heads in one host read): then call :func:`pairwise_pass` per head."""
    if len(metrics) < 2 or len({tuple(w.shape) for w in metrics}) != 1:
        return None
    name = pick_kernel(graph, rho, kernel)
    if name == "triton":
        return _triton_heads(graph.zero_padded(Y), graph, rho, tau, metrics, energy, num)
    if Y.dtype not in EXPANSION_Z_ERROR or (guard and Y.device.type != "cpu"):   # (off the CPU: per head, guarded
        return None                                                                # on the device)
    if name not in ("fused", "banded") and (num or name != "softmax"):
        return None
    Y = graph.zero_padded(Y)
    B, n, _ = Y.shape
    H, dh = len(metrics), metrics[0].shape[1]
    W = torch.cat([w.to(device=Y.device, dtype=Y.dtype) for w in metrics], 1)            # (d, H d_h)
    Z = (_centred(Y, graph) @ W).unflatten(-1, (H, dh)).transpose(1, 2)                 # (B, H, n, d_h)
    sq = (Z * Z).sum(-1)                                                                 # (B, H, n)
    if guard and not torch.compiler.is_compiling():
        sens = max(1.0, float(kernel_sensitivity(rho)))
        top = (sq.detach().amax((0, 2)) / tau).tolist()                                 # one host read, all heads
        if any(_scale_dtype(t * sens, Z.dtype) != Z.dtype for t in top):
            return None
    if name == "banded":                            # (B, H, n, d_h) in one call (energies.banded)
        from .banded import banded_sums
        agg, deg, e = banded_sums(Z, graph, rho, tau, energy, num, sq)
    else:
        if num:
            diff, lse = _fused_parts(Z, graph.mask, tau, sq)
            agg, deg = _from_lse(diff, lse, graph.mask.to(Y.dtype)[:, None])
        else:
            deg = _softmax_degrees(Z.reshape(B * H, n, dh), graph.mask.repeat_interleave(H, 0), tau,
                                   sq.reshape(B * H, n)).view(B, H, n)
            agg = None
        e = _degree_energy(deg, tau) if energy else None
    return [PairwisePass(None if agg is None else agg[:, h], deg[:, h], None if e is None else e[:, h], Y=Y,
                         metric=metrics[h]) for h in range(H)]


def _own_dtype(Zc: torch.Tensor) -> torch.dtype:
    return Zc.dtype if Zc.dtype in EXPANSION_Z_ERROR else torch.float32


_TRITON: Dict[str, Optional[str]] = {}


def triton_unavailable(device_type: str) -> Optional[str]:
    """Why the ``triton`` kernel cannot run on tensors of this device type (worded to follow "the triton kernel
    ..."), or None. It runs on CUDA (compiled), on the CPU only in Triton's interpreter (``TRITON_INTERPRET=1``
    set before Triton is first imported: numpy per program, for tests), and on ``meta`` (shapes only). Probed
    once per device type."""
    if device_type not in _TRITON:
        try:
            from . import triton_pairwise
        except ImportError as exc:
            _TRITON[device_type] = (f"needs Triton (pip install 'unfolded-transformers[gpu]' or pip install triton): "
                                    f"{type(exc).__name__}: {exc}")
        else:
            why = None
            if device_type == "cpu" and not triton_pairwise.INTERPRETED:
                why = ("runs on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 before the first "
                       "import of triton (e.g. TRITON_INTERPRET=1 unfold-check --kernel triton ...), or use a GPU")
            elif device_type not in ("cpu", "cuda", "meta"):
                why = f"runs on CUDA devices (and CPU through TRITON_INTERPRET=1), not on {device_type!r}"
            _TRITON[device_type] = why
    return _TRITON[device_type]


def _triton_supports(graph: TokenGraph, rho: Rho) -> Optional[str]:
    why = triton_unavailable(graph.mask.device.type)
    if why is None and rho.triton() is None:
        why = f"needs a rho with Triton functions (Rho.triton); {rho.spec()!r} has none"
    return why


@register_kernel("triton", _triton_supports)
def _triton_kernel(Y, graph, rho, tau, energy, num, metric=None) -> PairwisePass:
    """Triton kernels (:mod:`energies.triton_pairwise`): the complete graph and shift-invariant graphs tile by
    tile, any other graph by neighbour lists; every rho with Triton functions; the precision guard on the device."""
    return _triton_heads(Y, graph, rho, tau, [metric], energy, num)[0]


def _triton_heads(Y, graph, rho, tau, metrics, energy, num):
    """One launch for every head: features ``W_h^T (y - mean)`` ``(B, H, n, d_h)`` in the compute dtype (float32
    for the half types), one :class:`PairwisePass` per metric (None: the tokens themselves)."""
    from .triton_pairwise import layout_for, pairwise_heads
    dt = _own_dtype(Y)
    Yc = _centred(Y.to(dt), graph)
    if metrics[0] is None:
        Z = Yc[:, None]
    else:
        H, dh = len(metrics), metrics[0].shape[1]
        W = torch.cat([w.to(device=Y.device, dtype=dt) for w in metrics], 1)
        Z = (Yc @ W).unflatten(-1, (H, dh)).transpose(1, 2)
    agg, deg, e = pairwise_heads(Z, graph.mask, layout_for(graph, Z.shape[-1], dt), rho, tau, num, energy,
                                 kernel_sensitivity(rho))
    return [PairwisePass(None if agg is None else agg[:, h].to(Y.dtype), deg[:, h].to(Y.dtype),
                         None if e is None else e[:, h], Y=Y, metric=metrics[h]) for h in range(len(metrics))]


@register_kernel("softmax", _softmax_only, expansion=True)
def _softmax_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None, fused: bool = False) -> PairwisePass:
    """Softmax over all keys of the logits ``-z_uv`` (self included): ``deg_u = expm1(LSE_u)``,
    ``agg_u = (1 + deg_u) (P Y - Y)_u``, the energy ``-tau/2 sum_u deg_u`` (module docstring)."""
    if not num:                                     # energy-only: no neighbour sums, half the exponentials
        deg = _softmax_degrees(Y, graph.mask, tau, sq)
        agg = None
    else:
        diff, lse = _softmax_parts(Y, graph, tau, fused, num, sq)
        agg, deg = _from_lse(diff, lse, graph.mask.to(Y.dtype))
    return PairwisePass(agg, deg, _degree_energy(deg, tau) if energy else None)


def _from_lse(diff: torch.Tensor, lse: torch.Tensor, real: torch.Tensor):
    """``(agg, deg)`` of the softmax kernels from ``P Y - Y`` and the log-sum-exp ``LSE = log(1 + deg)`` (self
    included): ``deg = expm1(LSE)``, ``agg = (1 + deg) (P Y - Y)``; ``real`` the 0/1 mask of real queries
    (broadcast against LSE), padded queries 0."""
    log_s = torch.clamp(lse, min=0.0) * real        # log(1 + deg) >= 0; padded queries: 0
    return (torch.exp(log_s) * real)[..., None] * diff, torch.expm1(log_s)    # the (., n) factors joined first


def _degree_energy(deg: torch.Tensor, tau: float) -> torch.Tensor:
    """The pairwise energy of rho = exp from the degrees: ``-tau/2 sum_u deg_u`` (float64, per example)."""
    return -0.5 * tau * deg.sum(-1, dtype=torch.float64)


#: largest element count of one block of logits in :func:`_softmax_degrees` (16 MiB in float32)
DEGREE_BLOCK_ELEMENTS = 1 << 22


def _softmax_degrees(Y: torch.Tensor, mask: torch.Tensor, tau: float, sq: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
    """``deg_u = sum_{v != u, v real} exp(-z_uv)`` ``(B, n)`` (0 on padded u, ``mask`` ``(B, n)``) for centred tokens Y: the
    energy-only pass of the softmax kernels (rho = exp, complete graph; the energy is ``-tau/2 sum_u deg_u``).

    The logits are symmetric, ``-z_uv = (y_u.y_v + b_u + b_v) / tau`` with ``b_u = -|y_u|^2 / 2``
    (``-PAD_LOGIT tau`` on padded slots, where exp gives exactly 0), i.e. ``f_u . g_v / tau`` with
    ``f = [y, b, 1]`` and ``g = [y, 1, b]``. Blocks of query rows are taken against the keys from their own
    block on: each entry right of the diagonal block counts for its row and its column, so about half of
    the n^2 exponentials are computed. ``-z <= 0`` needs no max shift; the diagonal is left out exactly
    (no cancellation as in ``deg = exp(LSE) - 1``); float32 sums are torch's cascade sums (error about eps
    relative, measured in the tests against float64)."""
    B, n, _ = Y.shape
    half = 0.5 * ((Y * Y).sum(-1) if sq is None else sq)
    b = torch.where(mask, -half, torch.full_like(half, -PAD_LOGIT * tau))[..., None]
    one = torch.ones_like(b)
    f = torch.cat([Y, b, one], -1)
    g = (torch.cat([Y, one, b], -1) * (1.0 / tau)).transpose(1, 2)
    rows = max(1, min(n, max(64, -(-n // 8)), DEGREE_BLOCK_ELEMENTS // max(1, B * n)))
    inplace = not (torch.is_grad_enabled() and Y.requires_grad)
    deg = Y.new_zeros(B, n)
    for s in range(0, n, rows):
        e = min(n, s + rows)
        K = torch.bmm(f[:, s:e], g[:, :, s:])                       # (B, r, n - s): logits of rows s..e
        if inplace:
            K = K.exp_()
            K[:, :, :e - s].diagonal(dim1=1, dim2=2).zero_()
        else:
            eye = torch.eye(e - s, n - s, dtype=torch.bool, device=Y.device)
            K = torch.where(eye, torch.zeros((), dtype=K.dtype, device=K.device), K.exp())
        deg[:, s:e] += K.sum(-1)
        if e < n:
            deg[:, e:] += K[:, :, e - s:].sum(-2)
    return deg


@register_kernel("fused", _fused_only, expansion=True)
def _fused_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """The softmax kernel in one flash-attention call (:mod:`energies.fused`)."""
    return _softmax_kernel(Y, graph, rho, tau, energy, num, sq=sq, fused=True)


@register_kernel("streamed", _complete_only, expansion=True)
def _streamed_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """Complete graph, any rho, tiles of ``STREAM_TILE`` keys."""
    return _streamed_pass(Y, graph, rho, tau, energy, num)


@register_kernel("dense", expansion=True)
def _dense_kernel(Y, graph, rho, tau, energy, num, metric=None, sq=None) -> PairwisePass:
    """An ``(B, n, n)`` weight matrix masked by the graph's adjacency."""
    z = dense_z(Y, tau)
    pm = graph.pair_mask()
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)
    e = 0.5 * tau * _f64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return PairwisePass(gamma @ Y - deg[..., None] * Y if num else None, deg, e)


@register_kernel("edges")
def _edges_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                metric: Optional[torch.Tensor] = None) -> PairwisePass:
    """Gather/scatter over the canonical edge list: ``agg`` from the explicit differences of each edge (taken
    in token space, then mapped by the metric)."""
    B, n, d = Y.shape
    Yf = Y.reshape(B * n, d)
    src, dst, valid = graph.fixed_edges()          # fixed shape: edges at padded slots weigh 0 (no host read)
    diff = _apply(Yf[dst] - Yf[src], metric)
    z = (diff * diff).sum(-1) / (2.0 * tau)
    gamma = rho.derivative(z)
    if valid is not None:
        gamma = torch.where(valid, gamma, torch.zeros((), dtype=gamma.dtype, device=gamma.device))
    agg = None
    if num:
        msg = gamma[:, None] * diff
        agg = torch.zeros(B * n, diff.shape[-1], dtype=Y.dtype, device=Y.device)
        agg = agg.index_add(0, src, msg).index_add(0, dst, -msg).reshape(B, n, -1)
    deg = torch.zeros(B * n, dtype=Y.dtype, device=Y.device).index_add(0, src, gamma).index_add(0, dst, gamma)
    e = None
    if energy:
        v = _f64(tau * rho.value(z))
        if valid is not None:
            v = torch.where(valid, v, torch.zeros((), dtype=v.dtype, device=v.device))
        e = torch.zeros(B, dtype=torch.float64, device=Y.device).index_add(0, src // n, v)
    return PairwisePass(agg, deg.reshape(B, n), e)


def _tile(Y: torch.Tensor, mask: torch.Tensor, rho: Rho, tau: float, s: int, tile: int, energy: bool,
          explicit: bool = False):
    """Queries = all tokens, keys = tokens s .. s + tile: ``(deg part, agg part, energy part or None)``."""
    n = Y.shape[1]
    K = Y[:, s:s + tile]
    rows = torch.arange(n, device=Y.device)
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    pm = mask[:, :, None] & mask[:, None, s:s + tile] & (rows[:, None] != rows[None, s:s + tile])
    if explicit:
        z, diff = explicit_z(Y, K, tau)
    else:
        z = dense_z(Y, tau, K)
    gamma = torch.where(pm, rho.derivative(z), zero)
    deg = gamma.sum(-1)
    agg = (gamma[..., None] * diff).sum(2) if explicit else gamma @ K - deg[..., None] * Y
    e = 0.5 * tau * _f64(torch.where(pm, rho.value(z), zero)).sum((1, 2)) if energy else None
    return deg, agg, e


class _StreamedSums(torch.autograd.Function):
    """``(agg, deg, energy)`` over key tiles; the backward pass recomputes one tile at a time, so the
    memory held is O(B n tile) forward and backward. The energy output is not differentiable."""

    @staticmethod
    def forward(ctx, Y, mask, rho, tau, tile, energy, explicit):
        ctx.save_for_backward(Y, mask)
        ctx.rho, ctx.tau, ctx.tile, ctx.explicit = rho, tau, tile, explicit
        B, n, d = Y.shape
        agg, deg = torch.zeros_like(Y), torch.zeros(B, n, dtype=Y.dtype, device=Y.device)
        e = torch.zeros(B, dtype=torch.float64, device=Y.device)
        for s in range(0, n, tile):
            dg, ag, en = _tile(Y, mask, rho, tau, s, tile, energy, explicit)
            deg += dg
            agg += ag
            if energy:
                e += en
        ctx.mark_non_differentiable(e)
        return agg, deg, e

    @staticmethod
    def backward(ctx, g_agg, g_deg, g_e):
        Y, mask = ctx.saved_tensors
        grad = torch.zeros_like(Y)
        for s in range(0, Y.shape[1], ctx.tile):
            with torch.enable_grad():
                Yd = Y.detach().requires_grad_()
                dg, ag, _ = _tile(Yd, mask, ctx.rho, ctx.tau, s, ctx.tile, False, ctx.explicit)
                outs, grads = [], []
                for o, g in ((dg, g_deg), (ag, g_agg)):
                    if g is not None:
                        outs.append(o)
                        grads.append(g)
                if outs:
                    grad += torch.autograd.grad(outs, Yd, grads)[0]
        return grad, None, None, None, None, None, None


def _streamed_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, energy: bool, num: bool,
                   tile: Optional[int] = None, explicit: bool = False) -> PairwisePass:
    """The complete-graph pass over key tiles (see the module docstring); ``explicit``: z from explicit
    differences (any scale), with tiles small enough to hold ``EXPLICIT_TILE_ELEMENTS``."""
    tile = tile or STREAM_TILE
    if explicit:
        tile = _explicit_tile(Y, Y.shape[-1], tile)
    agg, deg, e = _StreamedSums.apply(Y, graph.mask, rho, tau, tile, energy, explicit)
    return PairwisePass(agg if num else None, deg, e if energy else None)


def weighted_neighbour_sums(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto"):
    """``(num, deg)`` with ``num_u = sum_v gamma_uv y_v`` ``(B, n, d)`` and ``deg_u = sum_v gamma_uv`` ``(B, n)``."""
    out = pairwise_pass(Y, graph, rho, tau, kernel)
    return out.num, out.deg


def pairwise_energy(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                    metric: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``sum_{{u,v} in E} tau * rho(z_uv)`` per example, ``(B,)`` float64, each undirected edge once.

    The independent evaluation every check uses: directly from the pairs, never from a log-sum-exp, and always
    from explicit differences (the edge list; on the complete graph key tiles of ``(B, n, tile, d)``
    differences), so z, and so each ``rho(z)``, is exact to rounding at every scale: an expansion
    ``|a|^2 + |b|^2 - 2 a.b`` would err by about ``eps |y|^2`` per pair, which can exceed a tolerance relative
    to a small energy. With a metric W the differences are taken in token space, then mapped:
    ``z_uv = |W^T (y_u - y_v)|^2 / 2 tau``. Differentiable. ``kernel`` is checked but not used."""
    kernel = pick_kernel(graph, rho, kernel)
    Y = graph.zero_padded(Y)
    if not graph.is_complete:
        return _edges_pass(Y, graph, rho, tau, energy=True, num=False, metric=metric).energy
    B, n, d = Y.shape
    tile = _explicit_tile(Y, d if metric is None else d + metric.shape[-1], n)
    rows = torch.arange(n, device=Y.device)
    mask = graph.mask
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    e = torch.zeros(B, dtype=torch.float64, device=Y.device)
    for s in range(0, n, tile):
        z, _ = explicit_z(Y, Y[:, s:s + tile], tau, metric)
        pm = mask[:, :, None] & mask[:, None, s:s + tile] & (rows[:, None] < rows[None, s:s + tile])  # each pair once
        e = e + tau * _f64(torch.where(pm, rho.value(torch.where(pm, z, zero)), zero)).sum((1, 2))
    return e
