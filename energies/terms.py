"""Energy terms E(Y) of token matrices on token graphs.

Every term maps tokens ``Y`` ``(B, n, d)`` on a [`TokenGraph`][energies.TokenGraph] to one value
per example ``(B,)``, evaluated in float64 (the accumulation dtype of every check), summed over
real tokens only. ``grad`` is the analytic gradient (zero on padded slots), which the update
steps use and the tests compare against autograd of ``value``.

Equation numbers refer to Yang, Huang, Wipf (NeurIPS 2022), "Transformers from an
Optimization Perspective", main paper and supplement.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple, Optional, Union

import torch

from .errors import EnergyError, GraphError, TokenError
from .checks import check_flag, check_number
from .graphs import TokenGraph
from .kernels import (check_kernel, explicit_energy, pairwise_energy, pairwise_pass, pairwise_pass_heads,
                       weighted_neighbour_sums)
from .rho import Rho, get_rho

__all__ = [
    "MMParts",
    "PassStats",
    "EnergyTerm",
    "PairwiseAttention",
    "Residual",
    "FeedForward",
    "NonNegativity",
    "Centering",
    "Rescaling",
    "ACCUM_DTYPE",
    "autocast_dtype",
    "AUTOCAST",
    "check_precision",
    "version_cached",
    "full_precision",
]

ACCUM_DTYPE = torch.float64


class MMParts(NamedTuple):
    """What a smooth term gives a majorized step at Y ([`EnergyTerm.mm`][energies.EnergyTerm.mm]), from one pass where
    it can.

    ``grad`` ``(B, n, d)``: the gradient at Y (zero on padded slots); ``curvature`` (scalar or ``(B, n)``): a
    per-token bound c_u on the Hessian of the term's MM surrogate, so that
    ``E(Y + D) <= E(Y) + <grad, D> + sum_u c_u |D_u|^2 / 2``; ``value`` ``(B,)`` float64 at Y, or None;
    ``jacobi`` (scalar or ``(B, n)``): what the Jacobi preconditioner (supplement eq. 37) adds per token: the
    surrogate Hessian's diagonal where that Hessian is a multiple of the identity on each token, else the curvature
    bound, or None (attention with a learned metric).

    Attributes:
        grad: the gradient at Y ``(B, n, d)``, zero on padded slots.
        curvature: the per-token bound c_u (scalar or ``(B, n)``) on the Hessian of the term's MM surrogate:
            ``E(Y + D) <= E(Y) + <grad, D> + sum_u c_u |D_u|^2 / 2``.
        value: the term's value at Y per example ``(B,)`` float64, or None when not asked for.
        jacobi: what the Jacobi preconditioner adds per token (scalar or ``(B, n)``; supplement eq. 37): the
            surrogate Hessian's diagonal where it is a multiple of the identity on each token (attention without a
            metric: ``deg_u``; the residual and rescaling: 1), else the term's curvature bound (feed-forward:
            ``lambda_max(W)_+``; centring: 1); None for attention with a learned metric.
    """
    grad: torch.Tensor
    curvature: Union[float, torch.Tensor]
    value: Optional[torch.Tensor]
    jacobi: Union[None, float, torch.Tensor] = None


#: optimiser steps taken in this process, counted by a global post-step hook of ``torch.optim`` (registered by the first
#: `version_cached`): part of every cache key, because not every optimiser moves the version counters of the
#: parameters it writes (``torch.optim.AdamW(fused=True)`` does not, torch 2.13)
_OPTIMISER_STEPS = [0]
_STEP_HOOK: list = []


def _count_step(optimizer, args, kwargs) -> None:
    _OPTIMISER_STEPS[0] += 1


def version_cached(owner, attr: str, tensor: torch.Tensor, compute):
    """``compute(tensor)``, kept in ``owner.__dict__[attr]`` and recomputed only when ``tensor`` may have changed. The
    key: the tensor object itself (a new tensor starts anew), its version counter (every in-place write through
    autograd's view of it moves it: ``copy_`` under ``no_grad``, ``load_state_dict``, most optimiser steps), the
    count of ``torch.optim`` optimiser steps taken in this process (any optimiser's step, a fused one included,
    starts anew: fused AdamW does not move version counters), its storage address, dtype and device (``module.to()``
    swaps a parameter's data under the same object). Not seen: a write through ``tensor.data`` outside an
    optimiser step (``.data`` has a version counter of its own). Computed afresh, never stored, while compiling
    (dynamo does not trace version counters), for an inference tensor (no version counter) and for a tensor without
    storage (a ``torch.func`` wrapper). For values that need no autograd (spectral bounds from `finite_f64`,
    which detaches): a cached tensor outlives the graph of the forward that computed it."""
    if torch.compiler.is_compiling() or tensor.is_inference():
        return compute(tensor)
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK.append(register_optimizer_step_post_hook(_count_step))
    try:
        key = (tensor._version, _OPTIMISER_STEPS[0], tensor.data_ptr(), tensor.dtype, tensor.device)
    except RuntimeError:
        return compute(tensor)
    hit = owner.__dict__.get(attr)
    if hit is None or hit[0] is not tensor or hit[1] != key:
        hit = (tensor, key, compute(tensor))
        owner.__dict__[attr] = hit
    return hit[2]


def autocast_dtype(device) -> Optional[torch.dtype]:
    """The dtype ``torch.autocast`` runs its matmuls in on ``device`` (a device or its type) where autocast is on
    there, else None (off, or a device type autocast does not know, such as ``meta``)."""
    kind = device.type if isinstance(device, torch.device) else str(device)
    try:
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    except RuntimeError:
        return None


#: ``precision=AUTOCAST`` (a term's default): its kernel passes run in the dtype ``torch.autocast`` has on the tokens'
#: device when the pass runs, read by the term, the outer boundary of a term used on its own
AUTOCAST = "autocast"


def check_precision(precision, error: type = EnergyError):
    """The rule of a ``precision`` argument (the dtype of a term's kernel passes).

    Args:
        precision: None (the tokens' own dtype), a half dtype (``torch.bfloat16``, ``torch.float16``) or
            `AUTOCAST`.
        error: the typed error raised.

    Returns:
        ``precision``, unchanged.

    Raises:
        EnergyError: (or ``error``) anything else, naming the value.
    """
    if (precision is None or (isinstance(precision, str) and precision == AUTOCAST)
            or (isinstance(precision, torch.dtype) and precision in (torch.bfloat16, torch.float16))):
        return precision
    raise error(f"precision must be None, torch.bfloat16, torch.float16 or {AUTOCAST!r}, got {precision!r}")


def _kernel_call(Y: torch.Tensor, call, precision: Optional[torch.dtype]):
    """``call(Y)`` for a pairwise kernel pass in the dtype ``precision``, passed by the caller (the kernel reads no
    global state): with a dtype, the kernels get the tokens in it (float64 tokens as they are, as autocast leaves
    float64 alone) with ``torch.autocast`` off inside, so that a pass sees one dtype throughout (it decides its own
    arithmetic: today's CPU kernels upcast half types to float32), never float32 tokens whose products come back in
    bfloat16 mid-pass. With None: ``call(Y)`` in the tokens' dtype, autocast (where a caller left it on) off inside."""
    with full_precision(Y.device):
        return call(Y if precision is None or Y.dtype == ACCUM_DTYPE else Y.to(precision))


def full_precision(device):
    """A context in which ``torch.autocast`` is off on ``device``'s type (a no-op where it is not on): what is
    computed inside runs in the dtypes of its tensors. Autograd is unaffected."""
    if autocast_dtype(device) is None:
        return contextlib.nullcontext()
    kind = device.type if isinstance(device, torch.device) else str(device)
    return torch.autocast(kind, enabled=False)


def finite_f64(W: torch.Tensor) -> torch.Tensor:
    """``W`` detached in float64 with non-finite entries set to 0, for a spectral bound (eigvalsh, SVD) that must
    not raise on diverged weights: a NaN weight makes the step's output NaN anyway, which the checks catch."""
    W = W.detach().to(ACCUM_DTYPE)
    return torch.where(torch.isfinite(W), W, torch.zeros((), dtype=W.dtype, device=W.device))


#: the dtype in which `_f64_sum` accumulates a tensor of each dtype (half types in float32)
_PASS_ACCUM = {torch.float64: torch.float64, torch.float32: torch.float32}
#: most elements `_f64_sum` adds in one cascade (its error measured within 2 eps sum|x| up to here)
SUM_CHUNK = 1 << 22


def _f64_sum(x: torch.Tensor) -> torch.Tensor:
    """Per-example sum ``(B,)`` float64 of a ``(B, n, ...)`` tensor, in one reduction: accumulated in x's dtype
    (float32 for float32 and the half types, float64 for float64) by torch's cascade summation, the result
    returned in float64; more than ``SUM_CHUNK`` (2^22) elements per example in chunks of that size, whose sums
    are added in float64. Its error, measured against exactly rounded sums (tests/test_trace_cost.py), stays
    within ``4 eps(accumulation dtype) * sum |x|`` (about 2 eps measured up to 2^22; 5.5 eps for one cascade
    over 2^26, hence the chunks), well inside the trace's tolerance ``tol_factor * eps * sum_k |E_k|`` at its
    default factor 64 (a factor below about 4 is tighter than this rounding, and than the per-token sums used
    before): a separate float64 sweep over the tokens buys nothing the verdict can see."""
    acc = _PASS_ACCUM.get(x.dtype, torch.float32)
    flat = x.reshape(x.shape[0], -1)
    if flat.shape[1] <= SUM_CHUNK:
        return (flat.sum(1) if acc == x.dtype else flat.sum(1, dtype=acc)).to(ACCUM_DTYPE)
    # beyond SUM_CHUNK elements per example the cascade's error grows (measured 5.5 eps at 2^26): chunks of at
    # most SUM_CHUNK summed in acc, the chunk sums added in float64
    parts = [c.sum(1) if acc == x.dtype else c.sum(1, dtype=acc) for c in flat.split(SUM_CHUNK, 1)]
    return torch.stack(parts, 1).to(ACCUM_DTYPE).sum(1)


def check_Y_graph(Y, graph, name: str = "Y") -> None:
    """A term's tokens against its graph, from metadata only (no host read, no device sync: fine in the layers' hot
    path): ``Y`` a floating ``(B, n, d)`` tensor with ``(B, n)`` the graph's ``(batch_size, num_nodes)``, on the
    graph's device; else a [`TokenError`][energies.TokenError] naming ``name``, its shape or device and the graph's
    (a [`GraphError`][energies.GraphError] when ``graph`` is not a graph). Never torch's untyped RuntimeError from
    deep inside a kernel."""
    if not isinstance(Y, torch.Tensor):
        raise TokenError(f"{name} must be a torch.Tensor of tokens (B, n, d), got {type(Y).__name__}")
    if not all(hasattr(graph, a) for a in ("batch_size", "num_nodes", "mask")):
        raise GraphError(f"graph must be a TokenGraph, got {type(graph).__name__}")
    if not Y.dtype.is_floating_point:
        raise TokenError(f"{name} must have a floating dtype, got {Y.dtype}")
    if Y.ndim != 3 or (Y.shape[0], Y.shape[1]) != (graph.batch_size, graph.num_nodes):
        raise TokenError(f"{name} has shape {tuple(Y.shape)} but the graph is for (B, n) = "
                         f"({graph.batch_size}, {graph.num_nodes}): tokens must be (B, n, d)")
    if Y.device != graph.mask.device:
        raise TokenError(f"{name} is on {Y.device} but the graph is on {graph.mask.device}")


#: the public methods of a term that take ``(Y, graph, ...)``: each checks Y against the graph first
#: (`check_Y_graph`), in every subclass (`EnergyTerm.__init_subclass__`); the static ``joint_*`` take
#: ``(terms, Y, graph, ...)``
_Y_GRAPH_METHODS = ("value", "explicit_value", "grad", "curvature", "pass_value_and_curvature", "pass_value", "mm", "prox", "forward",
                    "neighbour_sums", "messages", "mm_pass")
_JOINT_METHODS = ("joint_mm", "joint_pass_values")


def _checked(fn):
    """``fn`` checking its ``(Y, graph)`` first: a term's method ``(self, Y, graph, ...)`` or a static ``joint_*``
    ``(terms, Y, graph, ...)``, the same positions."""
    if getattr(fn, "_checks_Y_graph", False):
        return fn

    @functools.wraps(fn)
    def checked(first, Y, graph, *args, **kwargs):
        check_Y_graph(Y, graph)
        return fn(first, Y, graph, *args, **kwargs)
    checked._checks_Y_graph = True
    return checked


def _check_methods(cls) -> None:
    for attr in _Y_GRAPH_METHODS:
        fn = cls.__dict__.get(attr)
        if callable(fn) and not isinstance(fn, (staticmethod, classmethod)):
            setattr(cls, attr, _checked(fn))
    for attr in _JOINT_METHODS:
        fn = cls.__dict__.get(attr)
        if isinstance(fn, staticmethod):
            setattr(cls, attr, staticmethod(_checked(fn.__func__)))


class PassStats:
    """Statistics of the tokens at which the layers' passes read the terms' values, shared by the terms' rounding
    bounds ([`EnergyTerm.value_error`][energies.EnergyTerm.value_error]), each computed once on first use (float64
    results, no host read).

    ``Y`` may hold several boundaries at once, ``(..., B, n, d)`` (the trace stacks Y_0..Y_T), against the graph's
    ``(B, n)`` mask; every statistic then has shape ``(..., B)``.

    Args:
        Y: the tokens, in the dtype the passes read them (its eps is [`eps`][energies.PassStats.eps]), padded slots
            ignored.
        graph: the token graph (its mask marks the real tokens).
        curvature: the passes' summed per-token curvature bound at Y (scalar or ``(..., B, n)``).
    """

    def __init__(self, Y: torch.Tensor, graph: TokenGraph, curvature):
        self.Y, self.graph = Y.detach(), graph
        self.curvature = curvature
        #: the unit roundoff of the passes' dtype
        self.eps = torch.finfo(Y.dtype).eps
        self.n, self.d = Y.shape[-2], Y.shape[-1]
        self._cache: dict = {}

    def _once(self, name: str, compute):
        """The statistic ``name``, computed on first use (a plain dict: no lock for a compiler to trace)."""
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    @property
    def real(self) -> torch.Tensor:
        """Real tokens per example, ``n_r``."""
        return self._once("real", lambda: self.graph.mask.sum(-1, dtype=ACCUM_DTYPE))

    @property
    def _norms(self):
        return self._once("norms", self._centred_norms)

    def _centred_norms(self):
        m = self.graph.mask[..., None]
        Y = torch.where(m, self.Y, torch.zeros((), dtype=self.Y.dtype, device=self.Y.device))
        mean = Y.sum(-2, keepdim=True) / self.real.clamp_min(1.0).to(Y.dtype)[..., None, None]
        return (torch.where(m, Y - mean, Y).square().sum(-1, dtype=ACCUM_DTYPE), Y.square().sum((-2, -1), dtype=ACCUM_DTYPE))

    @property
    def spread(self) -> torch.Tensor:
        """``max_u |y_u - mean|^2`` over the real tokens."""
        return self._norms[0].amax(-1)

    @property
    def sq(self) -> torch.Tensor:
        """``sum_u |y_u|^2`` over the real tokens."""
        return self._norms[1]

    @property
    def curv_sum(self) -> torch.Tensor:
        """``sum_u max(c_u, 0)`` over the real tokens."""
        def compute():
            c = torch.as_tensor(self.curvature, dtype=ACCUM_DTYPE, device=self.Y.device).clamp_min(0.0)
            return torch.where(self.graph.mask, c, torch.zeros((), dtype=ACCUM_DTYPE, device=self.Y.device)).sum(-1)
        return self._once("curv_sum", compute)

    @property
    def edges(self) -> torch.Tensor:
        """Undirected edges per example, ``N_E``."""
        return self._once("edges", lambda: self.graph.degree().sum(-1, dtype=ACCUM_DTYPE) / 2)


class EnergyTerm(torch.nn.Module):
    """One named term of an energy. Subclasses implement [`value`][energies.EnergyTerm.value] and
    [`grad`][energies.EnergyTerm.grad]. Every public method that takes ``(Y, graph)`` (value, grad, curvature, mm,
    pass_value, prox, ... in this class and every subclass, plug-ins included) checks Y against the graph first
    (`check_Y_graph`: shapes and device, metadata only).

    A term E_k(Y) maps tokens ``(B, n, d)`` to one float64 value per example ``(B,)``; a smooth term also gives
    a per-token curvature bound c^k_u of its MM surrogate ([`curvature`][energies.EnergyTerm.curvature]), an indicator
    its proximal map ([`prox`][energies.EnergyTerm.prox]) instead.
    """

    name = "term"
    #: True when the term can take the value +inf (indicators); its gradient is then a subgradient.
    is_indicator = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _check_methods(cls)

    def value(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        raise NotImplementedError

    def grad(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        raise NotImplementedError

    def curvature(self, Y: torch.Tensor, graph: TokenGraph):
        """A per-token bound c_u (scalar or ``(B, n)``) on the Hessian of the term's MM surrogate at Y:
        H <= diag(c) (x) I_d, so ``E(Y + D) <= E(Y) + <grad E(Y), D> + sum_u c_u |D_u|^2 / 2`` for every D (the
        surrogate majorizes the term). Smooth terms only; indicators have a proximal map instead. It sets
        both the step ([`ProxMMStep`][unfold.ProxMMStep]) and the resolution part of the descent tolerance
        (`unfold.trace.resolution`)."""
        raise NotImplementedError(f"{type(self).__name__} has no curvature bound")

    def min_curvature(self) -> float:
        """A lower bound, over every Y, of the per-token curvature bound [`curvature`][energies.EnergyTerm.curvature] (0
        unless a term knows better): a proximal MM step needs the sum over its terms to be positive, checked when
        built."""
        return 0.0

    def pass_value_and_curvature(self, Y: torch.Tensor, graph: TokenGraph):
        """``(pass_value, curvature)`` at Y, from one pass where the term can (the last layer of a trace)."""
        return self.pass_value(Y, graph), self.curvature(Y, graph)

    def pass_value(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """The value as the layers' own pass computes it (Y's dtype, float64 sums); ``value`` is the
        independent float64 evaluation. Equal up to rounding."""
        return self.value(Y, graph)

    def value_error(self, stats: PassStats, value: torch.Tensor) -> torch.Tensor:
        """A bound (float64, the shape of ``value``) on ``|pass value - value|``: how far the value a layer's own pass
        reads ([`pass_value`][energies.EnergyTerm.pass_value], [`mm`][energies.EnergyTerm.mm],
        [`pass_value_and_curvature`][energies.EnergyTerm.pass_value_and_curvature], in the tokens' dtype) may lie from
        the independent evaluation [`value`][energies.EnergyTerm.value], the one the trace's exact re-evaluation makes.
        The trace rechecks a step exactly whenever its pass-read change lies within these bounds of the tolerance.

        The default: 0 where the class reads its pass values through [`value`][energies.EnergyTerm.value] itself (the
        same evaluation of the same tokens), +inf where it overrides a pass without stating a bound (its steps are then
        always rechecked: unknown rounding is never read as descent).

        Args:
            stats: the statistics of the tokens the pass read ([PassStats][energies.PassStats]).
            value: the pass's value there, ``(..., B)``.

        Returns:
            The bound per example (+inf where unknown).
        """
        cls = type(self)
        own = all(getattr(cls, m) is getattr(EnergyTerm, m) for m in ("pass_value", "mm", "pass_value_and_curvature",
                                                                      "joint_mm", "joint_pass_values"))
        return torch.full(value.shape, 0.0 if own else math.inf, dtype=ACCUM_DTYPE, device=value.device)

    def mm(self, Y: torch.Tensor, graph: TokenGraph, value: bool = True) -> MMParts:
        """[`MMParts`][energies.MMParts] at Y, the ingredients of a majorized step (one pass where possible); ``value``
        is None unless asked for. The default: [`grad`][energies.EnergyTerm.grad],
        [`curvature`][energies.EnergyTerm.curvature] (also as the Jacobi diagonal: a term whose curvature bound is exact
        on each token, such as the residual, says so
        by this default)."""
        c = self.curvature(Y, graph)
        return MMParts(self.grad(Y, graph), c, (self.value(Y, graph) if value else None), c)

    @staticmethod
    def joint_mm(terms, Y: torch.Tensor, graph: TokenGraph, value: bool = True):
        """[`mm`][energies.EnergyTerm.mm] of several terms of this class at once where one pass can serve them all (a
        list of [`MMParts`][energies.MMParts], one per term, equal to each term's own), else None: each term's own
        [`mm`][energies.EnergyTerm.mm] then. The MM step groups consecutive terms of one class this way."""
        return None

    @staticmethod
    def joint_pass_values(terms, Y: torch.Tensor, graph: TokenGraph):
        """[`pass_value_and_curvature`][energies.EnergyTerm.pass_value_and_curvature] of several terms at once (a list
        of pairs), or None (see [`joint_mm`][energies.EnergyTerm.joint_mm])."""
        return None

    def prox(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """The proximal map of an indicator term (the projection onto its set, in any per-token metric):
        ``argmin_X indicator(X) + sum_u c_u |x_u - y_u|^2 / 2``. Indicators only."""
        raise NotImplementedError(f"{type(self).__name__} is not an indicator; it has no proximal step here")

    def forward(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        return self.value(Y, graph)

    def extra_repr(self) -> str:
        return self.describe()

    def describe(self) -> str:
        return ""


_check_methods(EnergyTerm)


def _check_bound(given, what: str, of: str, exact, source: Optional[torch.Tensor]):
    """A caller-given spectral bound (``what``, standing for ``of``): None, or a real number or one-element floating
    tensor, finite, >= 0 and, where ``exact`` (a callable computing the quantity from ``source``) is given and
    ``source`` holds values, not below it beyond rounding (64 eps of ``source``'s dtype, relative): a smaller bound
    would make the MM step too long, and its descent guarantee a claim the theorem does not give. ``exact`` None:
    the bound applies to nothing (no metric), refused. A host read, at construction (``validate=True``) only.
    Returns the bound as the terms use it: a tensor as given, a number as a 0-d float64 tensor (None for None)."""
    if given is None:
        return None
    if exact is None:
        raise EnergyError(f"{what} is given, but there is no metric W for it to bound")
    if isinstance(given, torch.Tensor) and (given.numel() != 1 or not given.dtype.is_floating_point):
        raise EnergyError(f"{what} must be one floating number ({of}), got a {given.dtype} tensor of shape "
                          f"{tuple(given.shape)}")
    if isinstance(given, torch.Tensor) and given.device.type == "meta":
        return given
    value = check_number(given, what, "nonnegative", EnergyError)
    if source is not None and source.device.type != "meta" and bool(torch.isfinite(source).all()):
        true = float(exact())
        if value < true * (1.0 - 64 * torch.finfo(source.dtype).eps):
            raise EnergyError(f"{what}={value:.6g} is below {of} = {true:.6g}: the MM step would be too long for its "
                              "descent guarantee")
    return given if isinstance(given, torch.Tensor) else torch.tensor(value, dtype=ACCUM_DTYPE)


class PairwiseAttention(EnergyTerm):
    """Pairwise part of the attention energy E1 (supplement eq. 33 with temperature tau):

        sum_{{u,v} in E} tau * rho( ||W^T (y_u - y_v)||^2 / (2 tau) ),

    each undirected edge once; ``metric`` W (d x d_h) defaults to the identity. With rho(z) = -exp(-z)
    and tau = sqrt(d) its MM step is softmax attention with the usual 1/sqrt(d) scale (main paper
    Thm 3.1); with a metric the logits are ``(W^T y_u).(W^T y_v) / tau``: queries and keys W^T y,
    in the same coordinates as the energy. Gradient, with ``gamma_uv = rho'(z_uv)``:

        grad_u = W W^T sum_{v in N(u)} gamma_uv (y_u - y_v)     (= -W agg_u, from differences only).

    Curvature: the tangent surrogate's Hessian is L_gamma (x) W W^T <= 2 D_gamma ||W||_2^2, since a
    graph Laplacian satisfies L <= 2 D. ``curvature="adaptive"`` (default) uses the weighted degree
    D_gamma = sum_v gamma_uv of the current pass; ``"constant"`` the larger bound
    2 rho'(0) deg(u) ||W||_2^2 (gamma <= rho'(0) for a concave rho), which does not depend on Y: the
    step is then Y minus a fixed multiple of the gradient, a polynomial in Y wherever the kernel is
    (rho = relu:C: a cubic spline, as ReLU attention in Lai, Lim, Liu, Theorem 3.3), at the price of
    shorter steps. Without a metric the surrogate's Jacobi diagonal is ``D_gamma`` (supplement eq. 37).

    Args:
        rho: the concave, non-decreasing penalty: a [`Rho`][energies.Rho] or a spec for
            [`get_rho`][energies.get_rho] (default ``"exp"``: softmax attention, supplement eq. 35).
        tau: the temperature, finite and > 0 (default 1).
        kernel: the pairwise kernel, a registered name ([`kernel_names`][energies.kernel_names]) or ``"auto"``.
        metric: W ``(d, d_h)``, a floating tensor (queries = keys = W^T y); None for the identity.
        curvature: the curvature bound, ``"adaptive"`` (``2 D_gamma ||W||_2^2``) or ``"constant"``
            (``2 rho'(0) deg(u) ||W||_2^2``; needs a finite rho'(0)).
        metric_norm2: ``||W||_2^2`` when the caller computed it (a model computing all heads' norms at once);
            None to compute it from W (cached while W is unchanged).
        guard: the expansion kernels' precision guard (one host read per pass): widen the dtype or fall back to
            explicit differences where the expansion cannot resolve z (`pairwise_pass`).
        validate: check the arguments here (curvature's name, tau, the kernel's name, the metric's shape and
            dtype); False for a model that builds this term per forward from arguments it checked itself.
        precision: the dtype the kernel passes run in (`check_precision`): None for the tokens' own dtype, a half
            dtype (an encoder's step under mixed precision passes the dtype it read once), or `AUTOCAST` (the
            default: the dtype ``torch.autocast`` has on the tokens' device when a pass runs, the tokens' own
            without autocast). float64 tokens always run as they are.

    Raises:
        EnergyError: (``validate=True``) an unknown curvature bound, ``constant`` with a non-finite rho'(0), tau not
            finite and > 0, an unknown kernel, a metric that is not a floating ``(d, d_h)`` tensor, or a
            ``metric_norm2`` without a metric, not one finite number >= 0, or below ``||W||_2^2``; and (always) an
            invalid ``rho`` spec, ``guard`` or ``validate`` not a bool, a ``precision`` `check_precision` refuses.
    """

    name = "attention"

    CURVATURES = ("adaptive", "constant")

    def __init__(self, rho="exp", tau: float = 1.0, kernel: str = "auto", metric: Optional[torch.Tensor] = None,
                 curvature: str = "adaptive", metric_norm2: Optional[torch.Tensor] = None, guard: bool = True,
                 validate: bool = True, precision=AUTOCAST):
        super().__init__()
        check_flag(guard, "guard", EnergyError), check_flag(validate, "validate", EnergyError)
        #: the dtype of the kernel passes (None: the tokens'; `AUTOCAST`: autocast's at each pass)
        self.precision = check_precision(precision)
        self.rho: Rho = get_rho(rho)
        self.curvature_kind = curvature
        if curvature == "constant":
            self.max_weight = self.rho.max_derivative()
        if validate:   # a model building this term per forward from arguments it checked itself passes False
            tau = self._check(tau, kernel, metric, curvature)
            metric_norm2 = _check_bound(metric_norm2, "metric_norm2", "||W||_2^2", None if metric is None else
                         (lambda: torch.linalg.matrix_norm(metric.detach().to(ACCUM_DTYPE), ord=2) ** 2), metric)
        self.tau = tau
        self.kernel = kernel
        self.metric = metric
        #: ``||W||_2^2`` when the caller computed it (a model computing all heads' norms at once), else from W
        self._given_norm2 = metric_norm2
        #: precision guard of the expansion kernels (one host read per pass; `pairwise_pass`)
        self.guard = bool(guard)

    def _check(self, tau, kernel, metric, curvature) -> float:
        """The arguments' checks (EnergyError naming each): the curvature bound's name (and a finite rho'(0) for
        ``constant``), tau finite and > 0 (returned as a float), the kernel's name (the one place a term checks
        it: its passes do not), and the metric's shape and dtype (not its values: they are not read here)."""
        if curvature not in self.CURVATURES:
            raise EnergyError(f"unknown curvature bound {curvature!r}; valid: {list(self.CURVATURES)}")
        if curvature == "constant" and not (math.isfinite(self.max_weight) and self.max_weight >= 0):
            raise EnergyError(f"curvature='constant' needs a finite rho'(0), got {self.max_weight} for "
                              f"rho={self.rho.spec()}")
        try:
            tau = check_number(tau, "tau", "positive", EnergyError)
        except EnergyError:
            raise EnergyError(f"temperature tau must be a finite number > 0, got tau={tau!r}") from None
        check_kernel(kernel)
        if metric is not None:
            if not isinstance(metric, torch.Tensor) or metric.ndim != 2 or min(metric.shape) < 1:
                raise EnergyError(f"attention metric W must be a (d, d_h) tensor with d, d_h >= 1, got "
                                  f"{tuple(metric.shape) if isinstance(metric, torch.Tensor) else type(metric).__name__}")
            if not metric.dtype.is_floating_point:
                raise EnergyError(f"attention metric W must be a floating tensor, got dtype {metric.dtype}")
        return tau

    def features(self, Y: torch.Tensor) -> torch.Tensor:
        """``Z = Y W`` (queries = keys), or Y itself without a metric."""
        W = self._metric(Y)
        return Y if W is None else Y @ W.to(dtype=Y.dtype)

    def _metric(self, Y: torch.Tensor) -> Optional[torch.Tensor]:
        """The metric W (None without one), checked against the tokens' width."""
        if self.metric is not None and self.metric.shape[0] != Y.shape[-1]:
            raise TokenError(f"tokens have d={Y.shape[-1]} features but the attention metric is "
                             f"{tuple(self.metric.shape)}")
        return self.metric

    def value(self, Y, graph):
        """The independent float64 evaluation: explicit differences ``W^T (y_u - y_v)`` of every pair."""
        Y = Y.to(ACCUM_DTYPE)
        W = self._metric(Y)
        return pairwise_energy(Y, graph, self.rho, self.tau, self.kernel, None if W is None else W.to(ACCUM_DTYPE),
                               validate=False)

    def explicit_value(self, Y, graph):
        """The value from explicit differences of centred features ``W^T (y - mean)`` in Y's dtype (the precision
        guard's exact side, `explicit_energy`): exact to rounding at any scale like
        [`value`][energies.PairwiseAttention.value], at the cost of one pass
        ([`value`][energies.PairwiseAttention.value] maps every pair's difference by W in float64)."""
        return explicit_energy(Y, graph, self.rho, self.tau, self._metric(Y), validate=False)

    def pass_precision(self, Y: torch.Tensor) -> Optional[torch.dtype]:
        """The dtype this term's kernel passes on ``Y`` run in.

        Args:
            Y: the tokens of the pass.

        Returns:
            ``precision`` as given, or with `AUTOCAST` the dtype ``torch.autocast`` has on Y's device now (None
            where it is off): the one place a term reads autocast.
        """
        return autocast_dtype(Y.device) if isinstance(self.precision, str) else self.precision

    def neighbour_sums(self, Y, graph):
        """``(num, deg)``: ``sum_v gamma_uv z_v`` and ``sum_v gamma_uv`` in Y's dtype (z = W^T y; with a precision,
        in that dtype, `_kernel_call`)."""
        return _kernel_call(Y, lambda Yk: weighted_neighbour_sums(self.features(Yk), graph, self.rho, self.tau,
                                                                  self.kernel, validate=False), self.pass_precision(Y))

    def _pass(self, Y, graph, energy: bool = False, num: bool = True):
        """The layers' kernel pass on the features W^T y (`pairwise_pass`), on the tokens in the term's precision
        (`pass_precision`, `_kernel_call`)."""
        W = self._metric(Y)
        return _kernel_call(Y, lambda Yk: pairwise_pass(Yk, graph, self.rho, self.tau, self.kernel, energy=energy,
                                                        num=num, metric=W, guard=self.guard, validate=False),
                            self.pass_precision(Y))

    def messages(self, Y, graph):
        """``(agg, deg)``: ``sum_v gamma_uv (z_v - z_u)`` (translation invariant: exactly 0 for a token
        with no pull) and ``sum_v gamma_uv`` in Y's dtype (z = W^T y)."""
        out = self._pass(Y, graph)
        return out.agg, out.deg

    def mm_pass(self, Y, graph, value: bool = True):
        """One pass: ``(grad, deg, value)``: the gradient at Y, the kernel's degrees and the term's
        value per example (float64), the latter read off the same pass (LSE identity on softmax)."""
        out = self._pass(Y, graph, energy=value)
        return self._grad(graph, out), out.deg, out.energy

    def _grad(self, graph, out) -> torch.Tensor:
        """``-W agg`` (zero on padded slots) from a pass (the metric's sign folded into the small W)."""
        return graph.zero_padded(-out.agg if self.metric is None else out.agg @ (-self.metric.to(dtype=out.agg.dtype)).T)

    def _parts(self, Y, graph, out) -> MMParts:
        return MMParts(self._grad(graph, out), self._curvature_from(Y, graph, out.deg), out.energy,
                       out.deg if self.metric is None else None)

    @staticmethod
    def _joint(terms, Y, graph, energy: bool, num: bool):
        """One pass for heads that differ only in their metric (`pairwise_pass_heads`),
        or None."""
        t0 = terms[0]
        if len(terms) < 2 or any(type(t) is not PairwiseAttention or t.metric is None or t.rho.spec() != t0.rho.spec()
                                 or t.tau != t0.tau or t.kernel != t0.kernel or t.guard != t0.guard
                                 or t.precision != t0.precision for t in terms):
            return None
        metrics = [t._metric(Y) for t in terms]
        return _kernel_call(Y, lambda Yk: pairwise_pass_heads(Yk, graph, t0.rho, t0.tau, t0.kernel, metrics,
                                                              energy=energy, num=num, guard=t0.guard, validate=False),
                            t0.pass_precision(Y))

    @staticmethod
    def joint_mm(terms, Y, graph, value: bool = True):
        """The heads of a multi-head energy in one kernel call
        ([`EnergyTerm.joint_mm`][energies.EnergyTerm.joint_mm])."""
        outs = PairwiseAttention._joint(terms, Y, graph, value, True)
        return None if outs is None else [t._parts(Y, graph, out) for t, out in zip(terms, outs)]

    @staticmethod
    def joint_pass_values(terms, Y, graph):
        """The heads' energy-only passes in one call
        ([`EnergyTerm.joint_pass_values`][energies.EnergyTerm.joint_pass_values])."""
        outs = PairwiseAttention._joint(terms, Y, graph, True, False)
        return None if outs is None else [(out.energy, t._curvature_from(Y, graph, out.deg))
                                          for t, out in zip(terms, outs)]

    def pass_value_and_curvature(self, Y, graph):
        """One energy-only pass: the value and the curvature bound from its degrees (no neighbour sums)."""
        out = self._pass(Y, graph, energy=True, num=False)
        return out.energy, self._curvature_from(Y, graph, out.deg)

    def _curvature_from(self, Y, graph: TokenGraph, deg: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``2 deg ||W||^2`` with the weighted degrees ``deg`` of a pass at Y (adaptive), or with
        ``rho'(0) x degree`` (constant: no pass needed); formed in float32 at least (a pass under autocast gives
        bfloat16 degrees: the bound rounded to bfloat16 could fall below the one it stands for)."""
        if self.curvature_kind == "constant":
            deg = self.max_weight * graph.degree().to(device=Y.device, dtype=Y.dtype)
        dt = torch.promote_types(deg.dtype, torch.float32)
        return 2.0 * deg.to(dt) * self.metric_norm2().to(device=deg.device, dtype=dt)

    def pass_value(self, Y, graph):
        """An energy-only pass of the layers' kernel (LSE identity on softmax; no neighbour sums)."""
        return self._pass(Y, graph, energy=True, num=False).energy

    def mm(self, Y, graph, value: bool = True) -> MMParts:
        """One kernel pass: gradient, curvature bound ``2 deg ||W||^2``, value and, without a metric, the Jacobi
        diagonal ``deg_u = sum_v gamma_uv`` of the surrogate's Laplacian (supplement eq. 37)."""
        return self._parts(Y, graph, self._pass(Y, graph, energy=value))

    def curvature(self, Y, graph):
        """From the degrees of a pass without neighbour sums or energy (none with constant curvature)."""
        deg = None if self.curvature_kind == "constant" else self._pass(Y, graph, num=False).deg
        return self._curvature_from(Y, graph, deg)

    def value_error(self, stats, value):
        """The rounding bound of a kernel pass's energy ([`EnergyTerm.value_error`][energies.EnergyTerm.value_error]),
        one rule for every registered kernel and dtype, with eps = eps(Y's dtype) (a kernel widened by the precision
        guard rounds less), ``M = ||W||_2^2 max_u |y_u - mean|^2`` and ``n_r`` real tokens:

            err = 2 eps [ c_z M (G + ||W||^2 n_r / 2)  +  c_s (|V| + tau n_r / 2 + 2 tau N_E s) ],
            G = min(sum_u c_u / 4, ||W||^2 k |V| / tau),
            c_z = 2 d_h + 20 + 2 d ||W||_F / ||W||_2 (2 d + 20 without a metric),   c_s = n + d + 16.

        First part: each edge's z errs by at most ``c_z eps ||W||^2 max|y - mean|^2 / tau``
        (`EXPANSION_Z_ULPS`: ``(a d_h + b)`` for the expansion, ieee or 3xTF32;
        ``2 (d_h + 2)`` for explicit differences, whose z is at most ``2 M / tau``; mapping the tokens by W rounds
        each feature vector by up to ``d eps |y| ||W||_F``, hence ``2 d ||W||_F / ||W||_2`` more), and moves
        ``tau rho(z)`` by ``tau rho'(z) |dz|``; ``G`` bounds ``sum_e rho'(z_e) ||W||^2 = sum_u deg_u ||W||^2 / 2``:
        by ``sum_u c_u / 4`` (the curvature bound ``c_u >= 2 deg_u ||W||^2``) and, where ``rho' <= k |rho|``
        ([Rho.slope_per_value][energies.rho.Rho.slope_per_value]: k = 1 for exp), by ``||W||^2 k |V| / tau``; the softmax kernel's
        log-sum-exp adds the self terms (``n_r / 2``). Second part: the sums of ``tau rho`` over at most n
        neighbours in the pass's dtype, and the softmax kernel's ``exp(LSE_u + log beta_u) - 1`` (``n_r`` ones, with
        the factor ``tau / 2``); ``sum_e tau |rho(z_e)|`` is ``|V|`` when rho keeps one sign on ``[0, inf)``, else
        at most ``|V| + 2 tau N_E |rho(0)|`` (``s`` = 1, ``N_E`` the edges: rho rises from ``rho(0) < 0``). The
        factor 2 covers the change of rho' across ``dz``. Checked against 50-digit and explicit float64
        evaluations for every kernel (tests/test_trace_sound.py)."""
        w2 = self.metric_norm2().to(device=value.device, dtype=ACCUM_DTYPE)
        V = value.to(ACCUM_DTYPE).abs()
        if self.metric is None:
            cz = 2 * stats.d + 20
        else:           # mapping y by W rounds each feature vector by up to d eps |y| ||W||_F
            frob2 = torch.linalg.matrix_norm(self.metric.detach().to(device=value.device, dtype=ACCUM_DTYPE)) ** 2
            cz = 2 * self.metric.shape[1] + 20 + 2 * stats.d * (frob2 / w2.clamp_min(1e-300)).sqrt()
        weights = torch.minimum(stats.curv_sum / 4, w2 * self.rho.slope_per_value() * V / self.tau)
        zpart = cz * w2 * stats.spread * (weights + w2 * stats.real / 2)
        spread = V + self.tau * stats.real / 2
        low, high = self.rho.sign_range()
        if low < 0 < high:      # rho changes sign on [0, inf): sum |rho| is not |V|
            spread = spread + 2 * self.tau * abs(low) * stats.edges
        err = 2 * stats.eps * (zpart + (stats.n + stats.d + 16) * spread)
        return torch.nan_to_num(err, nan=math.inf)

    def metric_norm2(self) -> torch.Tensor:
        """``||W||_2^2`` (1 without a metric; cached while W is unchanged)."""
        if self.metric is None:
            return torch.ones(())
        if self._given_norm2 is not None:
            return self._given_norm2
        return version_cached(self, "_norm2", self.metric,
                       lambda W: torch.linalg.matrix_norm(finite_f64(W), ord=2) ** 2)

    def grad(self, Y, graph):
        return self.mm_pass(Y, graph)[0]

    def describe(self):
        m = "" if self.metric is None else f", W{tuple(self.metric.shape)}"
        c = "" if self.curvature_kind == "adaptive" else ", constant curvature"
        return f"rho={self.rho.spec()}, tau={self.tau:g}{m}{c}"


class Residual(EnergyTerm):
    """R(Y) = 1/2 ||Y - B||_F^2 (supplement eq. 33 with R of eq. 9; initial residual of F.4).

    ``B = None`` is the plain regulariser 1/2 ||Y||^2; a given ``B`` (``(n, d)`` or ``(B, n, d)``,
    e.g. f(X) of the input) is the initial residual. Gradient ``Y - B``; curvature bound 1 per token, exact (the
    Hessian is I), so it is also the Jacobi diagonal.

    Args:
        B: the anchor, a floating ``(n, d)`` or ``(B, n, d)`` tensor with every size >= 1; None for ``B = 0``.
        validate: check that B is finite (a host read); False for a model that builds B itself.

    Raises:
        EnergyError: B not a floating tensor, of another rank or with an empty size, or (``validate``) holding
            NaN or Inf.
    """

    name = "residual"

    def __init__(self, B: Optional[torch.Tensor] = None, validate: bool = True):
        super().__init__()
        check_flag(validate, "validate", EnergyError)
        if B is not None:
            if not isinstance(B, torch.Tensor) or not B.dtype.is_floating_point:
                raise EnergyError("residual anchor B must be a floating torch.Tensor")
            if B.ndim not in (2, 3) or min(B.shape) < 1:
                raise EnergyError(f"residual anchor B must have shape (n, d) or (B, n, d) with every size >= 1, "
                                  f"got {tuple(B.shape)}")
            if validate and B.device.type != "meta" and not torch.isfinite(B).all():   # a host read (models that
                # build B themselves skip it); meta holds no values
                raise EnergyError("residual anchor B holds NaN or Inf")
        self.B = B

    def anchor(self, Y: torch.Tensor) -> torch.Tensor:
        """B broadcast to Y's shape and dtype (zeros when B is None)."""
        if self.B is None:
            return torch.zeros_like(Y)
        Bt = self.B if self.B.ndim == 3 else self.B[None]
        if Bt.shape[1:] != Y.shape[1:] or Bt.shape[0] not in (1, Y.shape[0]):
            raise TokenError(f"residual anchor B has shape {tuple(self.B.shape)}, tokens have {tuple(Y.shape)}")
        return Bt.to(device=Y.device, dtype=Y.dtype).expand_as(Y)

    def value(self, Y, graph):
        Y = Y.to(ACCUM_DTYPE)
        r = graph.zero_padded(Y - self.anchor(Y))
        return 0.5 * (r * r).sum((1, 2))

    def grad(self, Y, graph):
        return self._r(Y, graph)

    def _r(self, Y, graph):
        """``Y - B`` zero on padded slots (no subtraction when B is None)."""
        return graph.zero_padded(Y if self.B is None else Y - self.anchor(Y))

    def curvature(self, Y, graph):
        return 1.0

    def min_curvature(self):
        return 1.0

    def mm(self, Y, graph, value: bool = True) -> MMParts:
        R = self._r(Y, graph)
        return MMParts(R, 1.0, (0.5 * _f64_sum(R * R) if value else None), 1.0)

    def pass_value(self, Y, graph):
        R = self._r(Y, graph)
        return 0.5 * _f64_sum(R * R)

    def value_error(self, stats, value):
        """``16 eps |V|``: the pass forms ``r = y - b`` and ``r^2`` in Y's dtype (3 roundings, relative) and sums
        them by `_f64_sum` (within ``4 eps sum r^2``); [`value`][energies.Residual.value] does it all in float64."""
        return 16.0 * stats.eps * value.to(ACCUM_DTYPE).abs()

    def describe(self):
        return "B=0" if self.B is None else f"B{tuple(self.B.shape)}"


class FeedForward(EnergyTerm):
    """Feed-forward part of E2 (main paper eq. 13): 1/2 tr(Y W Y^T), W symmetric (d x d).

    Gradient ``Y W``; with the residual term, a gradient step of size a2 is the linear layer
    ``Y (I - a2 (W + I)) + a2 B``. Curvature bound ``max(lambda_max(W), 0)`` per token (the Hessian of each
    token's ``1/2 y^T W y`` is W).

    Args:
        W: the weight, a floating square ``(d, d)`` tensor, d >= 1, symmetric (use ``(W + W.T) / 2``; supplement
            F.1).
        sym_tol: the symmetry tolerance, >= 0: ``max |W - W^T| <= sym_tol * max(max |W|, 1)``; inf skips the check.
        validate: check that W is finite and symmetric (host reads); False for a W symmetric by construction.
        curvature: ``max(lambda_max(W), 0)`` when the caller knows it; None to compute it from W (cached while W
            is unchanged).

    Raises:
        EnergyError: W not a floating square tensor, sym_tol negative or NaN, ``validate`` not a bool, or
            (``validate``) W holding NaN or Inf or not symmetric within sym_tol, or a ``curvature`` that is not one
            finite number >= 0 or lies below ``max(lambda_max(W), 0)`` (a shorter bound voids the guarantee).
    """

    name = "ffn"

    def __init__(self, W: torch.Tensor, sym_tol: float = 1e-6, validate: bool = True,
                 curvature: Optional[torch.Tensor] = None):
        super().__init__()
        if not isinstance(W, torch.Tensor) or not W.dtype.is_floating_point:
            raise EnergyError("feed-forward weight W must be a floating torch.Tensor")
        if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
            raise EnergyError(f"feed-forward weight W must be square (d, d) with d >= 1, got {tuple(W.shape)}")
        sym_tol = check_number(sym_tol, "sym_tol", "nonnegative_or_inf", EnergyError)   # inf: no symmetry check
        check_flag(validate, "validate", EnergyError)
        if validate and W.device.type != "meta":   # host reads (a model whose W is symmetric by construction skips
            # them; meta holds no values)
            if not torch.isfinite(W).all():
                raise EnergyError("feed-forward weight W holds NaN or Inf")
            asym = (W - W.T).abs().max().item()
            scale = max(W.abs().max().item(), 1.0)
            if asym > sym_tol * scale:
                raise EnergyError(f"feed-forward weight W must be symmetric: max |W - W^T| = {asym:.3g} "
                                  "(use (W + W.T) / 2; supplement F.1)")
        if validate:
            curvature = _check_bound(curvature, "curvature", "max(lambda_max(W), 0)",
                                     lambda: torch.linalg.eigvalsh(W.detach().to(ACCUM_DTYPE)).max().clamp_min(0.0), W)
        self.W = W
        #: ``max(lambda_max(W), 0)`` when the caller knows it, else computed from W
        self._given_curvature = curvature

    def _weight(self, Y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """W on Y's device in ``dtype``, checked against the tokens' width (metadata only, as the attention
        metric is: a TokenError naming both, not torch's matmul error)."""
        if Y.shape[-1] != self.W.shape[0]:
            raise TokenError(f"tokens have d={Y.shape[-1]} features but the feed-forward weight W is "
                             f"{tuple(self.W.shape)}")
        return self.W.to(device=Y.device, dtype=dtype)

    def value(self, Y, graph):
        Y = graph.zero_padded(Y.to(ACCUM_DTYPE))
        W = self._weight(Y, ACCUM_DTYPE)
        return 0.5 * ((Y @ W) * Y).sum((1, 2))

    def grad(self, Y, graph):
        return graph.zero_padded(Y @ self._weight(Y, Y.dtype))

    def mm(self, Y, graph, value: bool = True) -> MMParts:
        G = self.grad(Y, graph)
        c = self.curvature(Y, graph)
        return MMParts(G, c, (0.5 * _f64_sum(G * Y) if value else None), c)

    def pass_value(self, Y, graph):
        return 0.5 * _f64_sum(self.grad(Y, graph) * Y)

    def value_error(self, stats, value):
        """``(d + 16) eps ||W||_F sum_u |y_u|^2 / 2``: the pass's product ``Y W`` in Y's dtype errs per entry by at
        most ``d eps (|Y| |W|)_uj <= d eps |y_u| ||W_j||``, so ``sum Y o (Y W)`` by ``d eps ||W||_F sum_u |y_u|^2``;
        the product with Y and `_f64_sum` add at most ``5 eps`` of the same sum."""
        frob = torch.linalg.matrix_norm(self.W.detach().to(device=value.device, dtype=ACCUM_DTYPE))
        return 0.5 * (stats.d + 16) * stats.eps * frob * stats.sq

    def curvature(self, Y, graph):
        """max(lambda_max(W), 0): the Hessian of each token's 1/2 y^T W y is W (cached while W is unchanged). A
        0-d float64 tensor on W's device (no host read)."""
        if self._given_curvature is not None:
            return self._given_curvature
        return version_cached(self, "_curv", self.W,
                       lambda W: torch.linalg.eigvalsh(finite_f64(W)).max().clamp_min(0.0))

    def describe(self):
        return f"W{tuple(self.W.shape)}"


class NonNegativity(EnergyTerm):
    """Indicator of the non-negative orthant: 0 if every real entry is >= 0, else +inf.

    Its proximal operator is ReLU (main paper Thm 5.1; supplement eq. 49). ``grad`` returns the
    zero subgradient, valid where the term is finite.
    """

    name = "relu"
    is_indicator = True

    def __init__(self):
        super().__init__()
        #: the projection, a module so that forward hooks see its sign patterns (the spline probe)
        self.project = torch.nn.ReLU()

    def prox(self, Y, graph):
        """ReLU: the projection onto Y >= 0, in any per-token (diagonal) metric (main paper Thm 5.1)."""
        return self.project(Y)

    def value(self, Y, graph):
        """+inf where a real entry is negative (a real token's NaN is left to the other terms' values)."""
        low = Y.amin(tuple(range(2, Y.ndim))) if Y.ndim > 2 else Y        # (B, n): per token, no copy of Y
        neg = ((low < 0) & graph.mask).any(-1)
        out = torch.zeros(Y.shape[0], dtype=ACCUM_DTYPE, device=Y.device)
        return torch.where(neg, torch.full_like(out, math.inf), out)

    def grad(self, Y, graph):
        return torch.zeros_like(Y)


class Centering(EnergyTerm):
    """LayerNorm centring as an energy (supplement F.3, step 1): sum_u (1^T y_u)^2 / (2 d).

    Gradient ``(mean_i y_u,i) 1``; a gradient step of size 1 subtracts the token mean exactly. Curvature bound 1
    per token (the Hessian ``1 1^T / d`` has largest eigenvalue 1).
    """

    name = "center"

    def value(self, Y, graph):
        Y = graph.zero_padded(Y.to(ACCUM_DTYPE))
        s = Y.sum(-1)
        return (s * s).sum(-1) / (2.0 * Y.shape[-1])

    def grad(self, Y, graph):
        return graph.zero_padded(Y.mean(-1, keepdim=True).expand_as(Y))

    def curvature(self, Y, graph):
        return 1.0  # Hessian 1 1^T / d per token

    def min_curvature(self):
        return 1.0


class Rescaling(EnergyTerm):
    """LayerNorm rescaling as an energy (supplement F.3, step 2):

        sum_u ( 1/2 ||y_u||^2 - r ||y_u|| ),

    minimised on the sphere ||y_u|| = r. ``radius=None`` uses r = sqrt(d), the norm of a
    LayerNorm output (unit variance); r = 1 is F.3 as printed. Gradient ``y_u - r y_u / ||y_u||``. Curvature
    bound 1 per token: the concave part ``-r ||y||`` is majorized by its tangent, leaving the Hessian I of
    ``||y||^2 / 2``.

    Args:
        radius: r, finite and > 0; None for r = sqrt(d).

    Raises:
        EnergyError: radius not a finite number > 0.
    """

    name = "rescale"

    def __init__(self, radius: Optional[float] = None):
        super().__init__()
        self.radius = None if radius is None else check_number(radius, "rescaling radius", "positive", EnergyError)

    def r(self, d: int) -> float:
        return math.sqrt(d) if self.radius is None else self.radius

    def value(self, Y, graph):
        Y = graph.zero_padded(Y.to(ACCUM_DTYPE))
        norm = torch.linalg.vector_norm(Y, dim=-1)
        return (0.5 * norm * norm - self.r(Y.shape[-1]) * norm).sum(-1)

    def curvature(self, Y, graph):
        """1: the concave part -r ||y|| is majorized by its tangent, leaving the Hessian I of ||y||^2 / 2."""
        return 1.0

    def min_curvature(self):
        return 1.0

    def grad(self, Y, graph):
        norm = torch.linalg.vector_norm(Y, dim=-1, keepdim=True)
        unit = Y / torch.clamp(norm, min=torch.finfo(Y.dtype).tiny)
        return graph.zero_padded(Y - self.r(Y.shape[-1]) * unit)

    def describe(self):
        return "r=sqrt(d)" if self.radius is None else f"r={self.radius:g}"
