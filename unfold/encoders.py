"""Encoders: ``(B, n, d)`` tokens and a padding mask (or a token graph) -> ``Y_T`` and the energy trace.

Embedding-agnostic layer stacks, each an ``nn.Module``, registered by name in [`ENCODERS`][unfold.ENCODERS]:

* [`GuaranteedEncoder`][unfold.GuaranteedEncoder] (``"guaranteed"``): one MM step with weights shared over the T layers
  ([`unfold.mm.mm_step`][unfold.mm_step], ``"bound"`` preconditioner), on

      E(Y) = sum_h sum_{{u,v} in G} tau rho(||W_h^T (y_u - y_v)||^2 / (2 tau))     (one term per head)
             + 1/2 ||Y - B||^2 + 1/2 tr(Y S Y^T) + indicator(Y >= 0)
             [+ LayerNorm centring and rescaling terms, supplement F.3, if ``layernorm``]

  with B = X (the input tokens, initial residual F.4), any W_h and S = A A^T - (1 - eps) I for any A (exactly
  the symmetric S with I + S >= eps I, so E is bounded below). Read as a network: multi-head attention with
  queries = keys = W_h^T y and value/output map W_h W_h^T, a symmetric feed-forward map S, the initial
  residual, ReLU, and a per-token step 1 / c_u. Every layer descends E for ANY parameter values (proof in
  `unfold.prox`), trained or not. The energy at layer t is read off the same pass that computes layer t;
  only E(Y_T) costs one more (energy-only) pass. ``curvature="constant"``: the per-token step uses rho'(0) x
  degree in place of the weighted degree (a cubic spline per layer with rho = relu:C, Lai, Lim, Liu, Theorem 3.3).
* [`FreeEncoder`][unfold.FreeEncoder] (``"free"``): untied standard post-LN transformer layers whose attention (softmax,
  relu or softplus, [`Attention`][unfold.Attention]) is restricted to the token graph; ``norm="none"``
  drops the LayerNorms. Traced against the token-space attention energy
  E1(Y) = sum_G tau rho(||y_u - y_v||^2 / 2tau) + 1/2 ||Y - B||^2: it shows how far a standard layer strays.
* [`TorchEncoder`][unfold.TorchEncoder] (``"baseline"``): ``torch.nn.TransformerEncoder`` of the same width and depth
  (complete graph), traced with the same E1; a relu or softplus ``attention`` replaces its self-attention.

``encoder(X, mask)`` returns an [`EncoderOutput`][unfold.EncoderOutput] (``Y``, ``energies``, ``states``, ``report()``).
The forward pass does no host read off the CPU with the trace off (``validate=False``, the default): the token graph
is built on the tokens' device and cached (`GraphCache`), the energy's terms are built
without checks (their inputs are the encoder's own tensors), the kernels run without their precision guard (on a
GPU the guard would mean a host read or both paths); ``validate=True`` checks the inputs (finite real tokens, no
empty example) and turns the guard on, and the trace turns it on too. On the CPU the guard is always on: its one
read of the tokens' scale is of host memory (nothing to wait for), and without it an extreme scale (``tau=1e-10``)
gives NaN logits from the expansion where the traced forward is exact. What a constructor or a forward refuses is
checked by `unfold.inputs`. Nothing here knows of config files: `experiments` builds encoders from this registry.
"""
from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from energies.checks import check_flag, check_int, check_number
from energies.memory import check_memory
from energies.energy import Energy
from energies.errors import ConfigError
from energies.graphs import GraphCache, TokenGraph, check_graph_spec, check_tokens
from energies.kernels import check_kernel, kernel_problem
from energies.registry import Registry
from energies.rho import get_rho
from energies.terms import (ACCUM_DTYPE, AUTOCAST, Centering, finite_f64, FeedForward, NonNegativity, PairwiseAttention,
                            Rescaling, Residual, autocast_dtype, full_precision, version_cached)

from .attention import Attention
from .inputs import (MAX_INFERENCE_LAYERS, bool_mask, check_choice, check_empty_rows, check_inference_layers,
                     check_input_tokens, check_same_device, check_stack_args, check_stop_rel)
from .prox import ProxMMStep
from .trace import (DescentReport, EnergyTrace, keeps_going, report_from_values, resolution,
                    term_values_or_nan)

__all__ = ["ENCODERS", "register_encoder", "Encoder", "EncoderOutput", "GuaranteedEncoder", "FreeEncoder",
           "TorchEncoder", "CURVATURES", "NORMS", "build_encoder"]

ENCODERS: Registry = Registry("encoder", ConfigError, "kind", "unfold.ENCODERS")
register_encoder = ENCODERS.register
"""``@register_encoder("name")`` on an [`Encoder`][unfold.Encoder] subclass: selectable by name
(``model.mode=name``)."""

CURVATURES = PairwiseAttention.CURVATURES
NORMS = ("post", "none")


@dataclass
class EncoderOutput:
    """What an [`Encoder`][unfold.Encoder] returns: ``Y_T`` and the energy trace E(Y_0) .. E(Y_T), whose verdict
    ``E(Y_t+1) <= E(Y_t) + tol_t`` (`unfold.trace`) [`report`][unfold.EncoderOutput.report] gives.

    Attributes:
        Y: ``(B, n, d)`` tokens after the last layer.
        energies: ``{term: (B, T+1)}`` float64 energies at Y_0 .. Y_T (an [`EnergyTrace`][unfold.EnergyTrace]), or
            None (not traced).
        states: ``[Y_0, ..., Y_T]`` with ``keep_states=True``, else None.
        guaranteed: whether every layer is guaranteed to descend the traced energy.
        layers_used: ``(B,)`` int64 on the tokens' device: the layers each example ran (its depth; < T where
            ``stop_rel`` stopped it, [`GuaranteedEncoder`][unfold.GuaranteedEncoder]).
    """

    Y: torch.Tensor
    energies: Optional[EnergyTrace] = None
    states: Optional[List[torch.Tensor]] = None
    guaranteed: bool = False
    layers_used: Optional[torch.Tensor] = None

    def report(self, tol_factor: float = 64.0) -> DescentReport:
        """The verdict of every layer step of the trace ([`report_from_values`][unfold.report_from_values])."""
        if self.energies is None:
            raise ConfigError("no energy trace: call the encoder with trace=True")
        return report_from_values(self.energies, trace_dtype(self.Y.dtype), tol_factor, self.guaranteed)


class Encoder(nn.Module):
    """Base of the registered encoders: ``forward(X, mask=None, graph=None, trace=False, keep_states=False,
    layers=None) -> EncoderOutput``. Subclasses implement [`run`][unfold.Encoder.run] (the stack) and
    [`energy`][unfold.Encoder.energy] (what is traced); the bookkeeping of the trace (E(Y_t) at every layer boundary,
    `unfold.trace`) is shared here.

    Args:
        d: the token width, an integer >= 1.
        layers: T, the number of layers, an integer in [1, `MAX_INFERENCE_LAYERS`] (the depth rule of an
            inference too: 10**30 shared layers would be an unroll that never ends).
        graph: the token graph spec (``complete``, ``window:8``, ...;
            [`energies.graph_from_spec`][energies.graph_from_spec]).
        validate: check tokens and masks at every forward (host reads: a debugging switch).
    """

    kind = "encoder"
    #: every layer descends the traced energy, for any parameters
    guaranteed = False
    #: one step shared by every layer: the stack unrolls to any depth (``layers=``; `check_inference_layers`)
    weight_shared = False

    def __init__(self, d: int, layers: int, graph: str = "complete", validate: bool = False):
        super().__init__()
        self.d = check_int(d, "d", 1, error=ConfigError)
        self.layers = check_int(layers, "layers", 1, MAX_INFERENCE_LAYERS, ConfigError)   # as at inference
        if not isinstance(graph, str) or not graph:
            raise ConfigError(f"graph must be a graph spec such as 'complete' or 'window:8', got {graph!r}")
        self.graph_spec = check_graph_spec(graph, ConfigError, files=False)   # refused here, not at a forward
        self.graphs = GraphCache(graph)
        self.validate = check_flag(validate, "validate", ConfigError)

    def check_weights(self, entries: int, what: str) -> None:
        """Before the weights are allocated: ``entries`` float32 parameters (held twice while initialised) that
        cannot fit in memory are refused, a [`ConfigError`][energies.ConfigError] naming the sizes
        (`energies.memory.check_memory`, the one memory rule), never the allocator's untyped error."""
        check_memory(8 * entries, f"{type(self).__name__} with d={self.d}, {what}: {entries:,} float32 weights",
                     ConfigError, "use a smaller d")

    def token_graph(self, mask: torch.Tensor) -> TokenGraph:
        """The token graph of a ``(B, n)`` bool mask, on the mask's device (cached, `GraphCache`)."""
        return self.graphs(mask)

    def energy(self, B: torch.Tensor) -> Energy:
        raise NotImplementedError

    def forward(self, X: torch.Tensor, mask: Optional[torch.Tensor] = None, graph: Optional[TokenGraph] = None,
                trace: bool = False, keep_states: bool = False, layers: Optional[int] = None,
                first_layers: Optional[int] = None) -> EncoderOutput:
        """``layers``: unroll a weight-shared step that many times (`check_inference_layers`, the one depth
        rule: refused for an untied stack); ``first_layers``: run only the first layers of an untied stack (an
        explicit prefix, for probes)."""
        check_flag(trace, "trace", ConfigError), check_flag(keep_states, "keep_states", ConfigError)
        if first_layers is not None:
            if layers is not None:
                raise ConfigError("pass layers or first_layers, not both")
            layers = check_inference_layers(self, first_layers, "first_layers", first=True)
        else:
            layers = check_inference_layers(self, layers)
        check_input_tokens(X, self.d)
        check_same_device(X, self, "tokens X")
        mask = bool_mask(graph.mask if mask is None and graph is not None else mask, X.shape[:2], X.device,
                         validate=self.validate)
        graph = self.token_graph(mask) if graph is None else graph
        if self.validate:
            check_tokens(X, graph, "X")
        check_empty_rows(mask, self.validate)
        X = graph.zero_padded(X)
        return self.run(X, mask, graph, trace, keep_states, layers)

    def run(self, X, mask, graph, trace, keep_states, layers) -> EncoderOutput:
        raise NotImplementedError

    def finish(self, Y, energy, graph, values, res, states, trace, keep_states, guaranteed, layers_used=None,
               ran=None, X=None, curvatures=None) -> EncoderOutput:
        """The output after the last layer: Y_T kept, E(Y_T) appended to the trace (one energy-only pass).
        ``layers_used`` ``(B,)``: each example's depth; ``ran``: one ``(B,)`` bool per layer, the examples it ran
        for ([`EnergyTrace`][unfold.EnergyTrace]), or None (all). With the trace on, ``states`` holds Y_0..Y_T-1 and
        ``X`` the energy's anchor: the trace's exact re-evaluation ([`exact_values`][unfold.Encoder.exact_values]).
        ``res``: the resolution at Y_0..Y_T-1 (`resolution`), or, with ``curvatures`` (the passes' curvature bounds at
        Y_0..Y_T-1), computed here for all boundaries at once with the values' rounding bound
        ([`bounds`][unfold.Encoder.bounds])."""
        if keep_states or trace:
            states.append(Y)
        energies = None
        if trace:
            vals, curv = self.trace_values(energy, Y, graph)
            values.append(vals)
            bounds = None
            exact = None if X is None else self.exact_values(X, graph, states)
            if curvatures is None:
                res.append(resolution(energy, Y, graph, curv))
            else:       # read when the verdict is, of the energy as it was in this forward (the weights kept for
                # the exact evaluation), not of parameters an optimiser step may have moved since
                bounds = self.bounds((lambda: energy) if exact is None else exact.rebuild, graph,
                                     [Y.detach() for Y in states], curvatures + [curv], exact is not None)
            # an example with no real token has no energy to descend: NaN (on the CPU it is refused up front)
            energies = EnergyTrace.from_layers(values, res, energy.indicators, mask=graph.mask, ran=ran, exact=exact,
                                               bounds=bounds)
        return EncoderOutput(Y, energies, states if keep_states else None, guaranteed, layers_used)

    @staticmethod
    def bounds(energy_fn, graph: TokenGraph, states: List[torch.Tensor], curvatures: list, rounding: bool = True):
        """``bounds(trace) -> (resolution, error)``, both ``(S, T+1)`` over the boundaries Y_0..Y_T (``states``) of
        the energy ``energy_fn()`` (called when they are read):
        the tolerance's resolution (`resolution`) and, with ``rounding``, the passes' rounding
        bound ([`value_error`][energies.Energy.value_error]; None without), for all boundaries in one batch of device
        ops (no host read), from the trace's values and the passes' curvature bounds ``curvatures`` (scalar or
        ``(B, n)`` each). The tokens are read in the dtype the passes read them (`trace_dtype`)."""
        B, n = graph.mask.shape

        def compute(trace) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
            energy = energy_fn()
            with torch.no_grad():
                Ys = torch.stack(states)
                Ys = Ys.to(trace_dtype(Ys.dtype))
                C = torch.stack([torch.as_tensor(c, device=Ys.device).to(ACCUM_DTYPE).expand(B, n) for c in curvatures])
                res = resolution(energy, Ys, graph, C).T
                err = energy.value_error(Ys, graph, {k: v.T for k, v in trace.items()}, C).T if rounding else None
            return res, err
        return compute

    @staticmethod
    def exact_total(energy: Energy, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """``E(Y)`` ``(B,)`` float64, every term evaluated exactly to rounding at any scale (a pairwise term from
        explicit differences, [`explicit_value`][energies.PairwiseAttention.explicit_value]; the others' own values),
        without a host read: what the energy-chosen depth decides on. The kernels' own values err by up to the
        precision guard's bound, so a decrease they read below ``stop_rel`` need not be one; the price is one
        explicit-difference pass per layer, only with ``stop_rel`` on."""
        Yt = Y.detach().to(trace_dtype(Y.dtype))
        with torch.no_grad(), full_precision(Y.device):
            total = torch.zeros(Y.shape[0], dtype=ACCUM_DTYPE, device=Y.device)
            for term in energy.terms.values():
                total = total + getattr(term, "explicit_value", term.value)(Yt, graph).to(ACCUM_DTYPE)
        return total

    def exact_values(self, X: torch.Tensor, graph: TokenGraph, states: List[torch.Tensor]):
        """``exact(t, rows=None) -> {term: (B,)}``: every term's independent evaluation at Y_t, of the examples
        ``rows`` only when given ([`EnergyTrace.exact`][unfold.EnergyTrace.exact]: explicit differences in float64 for
        float64 tokens, the guarded float64 passes for tokens judged in float32), of the energy as it was in this
        forward pass. A verdict asks it only for the examples the kernels' own values flag, when it is read
        (``report()``, maybe after an optimiser step has moved the weights), so the weights are kept as they are now:
        one detached copy of the parameters (device copies, no host read), swapped in while the energy is rebuilt from
        ``X``."""
        weights = {name: p.detach().clone() for name, p in self.named_parameters()}
        B, states = X.detach(), [Y.detach() for Y in states]
        # float64 tokens: explicit differences (their rounding is that of the tolerance's own dtype); tokens judged in
        # float32: the guarded float64 passes, whose rounding bound (value_error at float64's eps) is 2^-29 of the
        # float32 one, at the cost of a layer's pass instead of explicit differences (d_h times the work)
        how = True if trace_dtype(states[0].dtype) == ACCUM_DTYPE else "pass"

        def exact(t: int, rows: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
            Y, anchor, g = states[t], B, graph
            if rows is not None:              # the examples asked for only: their states, anchors and graph
                Y, anchor, g = Y[rows], B[rows], graph.select(rows)
            with torch.no_grad(), full_precision(Y.device), _swapped(self, weights):
                return term_values_or_nan(self.energy(anchor.to(trace_dtype(anchor.dtype))), Y.to(ACCUM_DTYPE), g,
                                          explicit=how)

        def rebuild() -> Energy:
            """The energy of this forward pass, built from the kept weights."""
            with torch.no_grad(), _swapped(self, weights):
                return self.energy(B)
        exact.rebuild = rebuild
        return exact

    @staticmethod
    def trace_values(energy: Energy, Y: torch.Tensor, graph: TokenGraph):
        """``(values, c)``: every term's value at Y (float64 per example) by the layers' own kernels (energy-only
        passes) and the MM curvature bound c at Y (for the tolerance's resolution).

        Always a float32 (or float64) evaluation, also under ``torch.autocast`` (mixed precision): autocast is off
        here, and tokens of a half type are read as float32 (exactly: every bfloat16 and float16 value is a float32
        value). So the energy a verdict judges is a float32 energy of the very tokens the (bfloat16) step produced,
        never a bfloat16 one (`trace_dtype`)."""
        vals: Dict[str, torch.Tensor] = OrderedDict()
        curv = 0.0
        Y = Y.to(trace_dtype(Y.dtype))
        with torch.no_grad(), full_precision(Y.device):
            for group in energy.groups():       # a run of one class: one joint pass where the class offers it
                terms = [t for _, t in group]
                if terms[0].is_indicator:
                    vals[group[0][0]] = terms[0].pass_value(Y, graph).to(ACCUM_DTYPE)
                    continue
                pairs = type(terms[0]).joint_pass_values(terms, Y, graph) if len(terms) > 1 else None
                for (name, _), (v, c) in zip(group, pairs if pairs is not None else
                                             [t.pass_value_and_curvature(Y, graph) for t in terms]):
                    vals[name] = v.to(ACCUM_DTYPE)
                    curv = curv + c
        return vals, curv


@contextlib.contextmanager
def _swapped(module: nn.Module, weights: Dict[str, torch.Tensor]):
    """Inside: ``module``'s parameters hold ``weights`` (their ``.data`` swapped, so no version counter moves and no
    tensor saved for a pending backward changes); restored on the way out."""
    params = dict(module.named_parameters())
    saved = {name: params[name].data for name in weights}
    try:
        for name, w in weights.items():
            params[name].data = w
        yield
    finally:
        for name, d in saved.items():
            params[name].data = d


def trace_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the trace evaluates and judges the energy of tokens of ``dtype``: float32 or float64 as
    they are, float32 for the half types (bfloat16, float16). The tolerance of a verdict is this dtype's (``tol =
    64 eps(float32) * ...``): with bfloat16's eps (2^-7 x 64 = half the energy) a verdict would accept almost any
    rise. [`Encoder.trace_values`][unfold.Encoder.trace_values] evaluates in it;
    [`EncoderOutput.report`][unfold.EncoderOutput.report] judges in it."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


@register_encoder("guaranteed")
class GuaranteedEncoder(Encoder):
    """The shared MM step of the module docstring, T layers of it: every layer descends the one energy for any
    weights (paper, Thm. 4.1).

    **Depth chosen by the energy** (``stop_rel`` = EPS in (0, 1); None or 0: off): ``layers`` (or the forward's
    ``layers=``) is then a maximum T. With E_k the total energy at Y_k (float64, per example: the values the trace
    records, read off the pass of layer k+1, [`step_with_trace`][unfold.ProxMMStep.step_with_trace]), an example runs
    layer 1, and runs layer k+1 (1 <= k < T) iff it ran layer k and

        (E_{k-1} - E_k) / max(|E_{k-1}|, tiny)  >=  EPS                (`keeps_going`)

    so its depth is the first k whose relative decrease falls below EPS (that layer is kept), else T. Both energies
    are known before layer k+1 is applied, so a stopped example's output is exactly Y_k of the full unroll. On the
    device, no host read: every layer still runs for the whole batch and ``torch.where`` keeps a stopped example's
    tokens; ``EncoderOutput.layers_used`` holds each depth, and the trace marks the frozen layers
    (``EnergyTrace.ran``) so that the verdict judges every layer that ran and no other.

    **Mixed precision** (a forward under ``torch.autocast(device, torch.bfloat16)``, ``train.precision=bfloat16``):
    the step may run in bfloat16, the energy a verdict judges may not. The step's products run in autocast's dtype
    (the forward reads it once and passes it to the heads' kernel passes, which get the tokens in bfloat16 with
    autocast off inside them: ``precision`` of [`PairwiseAttention`][energies.PairwiseAttention];
    the products with W and S are autocast's), while the tokens between layers stay float32 (the step adds its
    bfloat16 direction to float32 tokens) and the energy's own weights -- W, S = A A^T - (1 - eps) I, the bounds
    ||W_h||^2 and lambda_max(S) -- are float32/float64, never rounded by autocast. At **every** layer boundary Y_0 ..
    Y_T (not a sample) the traced values come from a float32 energy-only pass with autocast off
    ([`Encoder.trace_values`][unfold.Encoder.trace_values]) instead of the step's bfloat16 pass, and the verdict uses
    float32's tolerance (`trace_dtype`). So each verdict is what it says: a float32 evaluation (within 8 eps(float32)
    sum_k |E_k| of the float64 energy, tests/test_mixed_precision.py) of the tokens the bfloat16 step actually produced
    found ``E(Y_t+1) <= E(Y_t) + tol``; bfloat16 rounding that breaks the descent is counted as an increase, never
    hidden in a bfloat16 tolerance (64 eps(bfloat16) would be half the energy). The price: with the trace on, one
    float32 energy-only pass per layer on top of the step (without autocast the energy is read off the step's own pass).
    float64 tokens are left alone by autocast, and so is their trace.

    Args:
        d: the token width.
        heads: attention heads, each a pairwise term of the energy on its own metric W_h.
        d_head: each head's width (default ``d // heads``).
        layers: T, the layers (the shared step applied T times; with ``stop_rel``, the most).
        rho: the penalty ([`energies.get_rho`][energies.get_rho] spec or object).
        tau: the temperature (default ``sqrt(d_head)``).
        graph: the token graph spec ([`energies.graph_from_spec`][energies.graph_from_spec]).
        alpha: the step size in (0, 1].
        ffn: include the symmetric feed-forward term S.
        relu: include the non-negativity indicator (its prox is the ReLU).
        layernorm: include the LayerNorm terms (supplement F.3).
        curvature: ``adaptive`` or ``constant`` (the surrogate's curvature bound).
        kernel: a registered pairwise kernel or ``auto``.
        validate: check tokens and masks at every forward (host reads: a debugging switch).
        stop_rel: EPS of the energy-chosen depth above, or None.
    """

    guaranteed = True
    weight_shared = True
    EPS_S = 0.1

    def __init__(self, d: int = 64, heads: int = 2, d_head: Optional[int] = None, layers: int = 4, rho="exp",
                 tau: Optional[float] = None, graph: str = "complete", alpha: float = 1.0, ffn: bool = True,
                 relu: bool = True, layernorm: bool = False, curvature: str = "adaptive", kernel: str = "auto",
                 validate: bool = False, stop_rel: Optional[float] = None):
        super().__init__(d, layers, graph, validate)
        self.stop_rel = check_stop_rel(stop_rel)
        self.heads = check_int(heads, "heads", 1, error=ConfigError)
        self.d_head = check_int(d_head, "d_head", 1, error=ConfigError) if d_head is not None else max(self.d // self.heads, 1)
        self.rho = get_rho(rho)
        self.tau = (check_number(tau, "tau", "positive", ConfigError) if tau is not None
                    else math.sqrt(self.d_head))
        self.alpha = check_number(alpha, "alpha", "unit", ConfigError)
        self.use_ffn, self.use_relu = check_flag(ffn, "ffn", ConfigError), check_flag(relu, "relu", ConfigError)
        self.use_layernorm = check_flag(layernorm, "layernorm", ConfigError)
        self.curvature = check_choice(curvature, "curvature", CURVATURES)
        self.kernel = check_kernel(kernel, ConfigError)
        why = kernel_problem(self.kernel, graph, self.rho)   # runs nowhere on this graph and rho: refused now
        if why is not None:
                raise ConfigError(f"kernel={self.kernel!r} does not apply to graph={graph!r}, rho={self.rho.spec()!r}: "
                                  f"the {self.kernel} kernel {why}")
        self.check_weights(self.heads * self.d * self.d_head + (self.d * self.d if self.use_ffn else 0),
                           f"heads={self.heads}, d_head={self.d_head}, ffn={self.use_ffn}")
        self.W = nn.Parameter(torch.empty(self.heads, self.d, self.d_head))
        self.A = nn.Parameter(torch.empty(self.d, self.d)) if self.use_ffn else None
        self.nonneg = NonNegativity() if self.use_relu else None
        self.reset_parameters()

    def kernel_problem(self, device) -> Optional[str]:
        """Why this encoder's ``kernel`` cannot run on ``device``, or None: the kernels' own rule,
        `energies.kernels.kernel_problem`, for this encoder's graph and rho. The constructor accepts a kernel that
        runs on some device (the triton kernel on a GPU, the fused one on the CPU); a caller that knows where the
        model will run (the trainer's build check, ``train.device``) asks here."""
        return kernel_problem(self.kernel, self.graph_spec, self.rho, device)

    def reset_parameters(self) -> None:
        """W_h ~ N(0, 1/d) entries; A with S = A A^T - (1 - eps) I = 0."""
        with torch.no_grad():
            self.W.copy_(torch.randn(self.W.shape) / math.sqrt(self.d))   # the draws of earlier versions
            if self.A is not None:
                self.A.copy_(math.sqrt(1.0 - self.EPS_S) * torch.eye(self.d))

    def ffn_weight(self) -> torch.Tensor:
        """The symmetric feed-forward weight S = A A^T - (1 - eps) I, in A's dtype also under ``torch.autocast``: S
        defines the energy (the trace's and the step's alike), so it is not rounded to bfloat16 (a bfloat16 product
        need not even be symmetric); the step's products with S run in autocast's dtype."""
        eye = torch.eye(self.d, dtype=self.A.dtype, device=self.A.device)
        with full_precision(self.A.device):
            return self.A @ self.A.T - (1.0 - self.EPS_S) * eye

    def spectral_bounds(self):
        """``(n2, lam)``: ``||W_h||_2^2`` of every head ``(H,)`` and ``max(lambda_max(S), 0)`` (None without the S
        term), float64 0-d/1-d tensors on the weights' device, detached (the step treats its curvature bound as a
        constant, as it always has, so a cached value holds no autograd graph). Computed once per value of the
        weights and reused by every layer and every forward until the weights may have changed: a ``torch.optim``
        optimiser step (fused ones included), an in-place write that moves W's or A's version counter
        (``load_state_dict``, ``copy_`` under ``no_grad``), ``.to()`` (`version_cached`; a write
        through ``W.data`` outside an optimiser step is not seen). In training (one forward per optimiser step) it is
        computed once per step, as before; forwards at fixed weights (validation, test, the float64 check, predict)
        reuse it -- on a GPU also sparing the host syncs torch documents for SVD and eigvalsh."""
        n2 = version_cached(self, "_norm2_cache", self.W,
                            lambda W: torch.linalg.matrix_norm(finite_f64(W), ord=2) ** 2)     # (H,), one call
        if self.A is None:
            return n2, None
        lam = version_cached(self, "_ffn_curv_cache", self.A,
                             lambda A: torch.linalg.eigvalsh(finite_f64(self.ffn_weight())).max().clamp_min(0.0))
        return n2, lam

    def energy(self, B: torch.Tensor, guard: bool = True, precision=AUTOCAST) -> Energy:
        """The energy every layer descends, anchored at B; ``guard``: the kernels' precision guard; ``precision``:
        the dtype of the heads' kernel passes ([`PairwiseAttention`][energies.PairwiseAttention]; a forward passes
        the dtype it read once, None for the trace's)."""
        norm2, lam = self.spectral_bounds()
        terms = [(f"head{h}", PairwiseAttention(self.rho, self.tau, kernel=self.kernel, metric=self.W[h],
                                                curvature=self.curvature, metric_norm2=norm2[h], guard=guard,
                                                validate=False, precision=precision))   # (checked by the constructor)
                 for h in range(self.heads)]
        terms.append(("residual", Residual(B, validate=False)))
        if self.A is not None:
            # S symmetric by construction: no checks; its curvature bound max(lambda_max(S), 0) as a tensor (no host read)
            terms.append(("ffn", FeedForward(self.ffn_weight(), sym_tol=math.inf, validate=False, curvature=lam)))
        if self.use_layernorm:
            terms += [("center", Centering()), ("rescale", Rescaling())]
        if self.nonneg is not None:
            terms.append(("relu", self.nonneg))
        return Energy(terms)

    def run(self, X, mask, graph, trace, keep_states, layers):
        # the one read of torch.autocast in a forward: the dtype of the step's kernel passes, passed to its terms
        # (autocast leaves float64 alone, and so does the step); the trace's energy runs in the tokens' own dtype
        low = autocast_dtype(X.device) if X.dtype != ACCUM_DTYPE else None
        guard = trace or self.validate or X.device.type == "cpu"
        energy = self.energy(X, guard=guard, precision=None)
        # mixed precision (autocast or half tokens): the step's pass runs in bfloat16, so its energy is not what a
        # verdict may judge; the values come from a float32 energy-only pass at each Y_t instead (trace_values):
        # every layer, not a sample. Nothing is then read off the step's pass, so off the CPU it runs without the
        # precision guard, as with the trace off (bfloat16 features reach the kernels' own half-precision path: the
        # fused kernel's flash op), while the trace's passes keep it
        narrow = trace_dtype(X.dtype) != X.dtype or low is not None
        unguarded = narrow and trace and not self.validate and X.device.type != "cpu"
        step = ProxMMStep(energy if low is None and not unguarded else      # the shared layer
                          self.energy(X, guard=guard and not unguarded, precision=low), self.alpha)
        Y = self.nonneg.prox(X, graph) if self.nonneg is not None else X
        T = self.layers if layers is None else check_int(layers, "layers", 0, error=ConfigError)
        eps = check_stop_rel(self.stop_rel)       # an attribute a study may set: checked where it is used
        values: List[Dict[str, torch.Tensor]] = []
        curvs: list = []                          # the passes' curvature bounds at Y_0..Y_T-1
        states: List[torch.Tensor] = []
        ran: List[torch.Tensor] = []              # stop rule: per layer, the examples it ran for (device bools)
        active = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
        before: Optional[torch.Tensor] = None     # E_{k-1} per example
        for _ in range(T):
            if keep_states or trace:
                states.append(Y)
            want = trace or eps is not None
            Y_next, vals, curv = step.step_with_trace(Y, graph, values=want and not narrow)
            if want and narrow:
                vals, curv = self.trace_values(energy, Y, graph)
            if eps is not None:                   # E_k at this layer's input Y_k decides on layer k+1: the exact
                E = self.exact_total(energy, Y, graph)      # evaluation, not the kernels' values (their rounding)
                if before is not None:
                    active = active & keeps_going(before, E, eps)
                before = E
                ran.append(active)
                Y_next = torch.where(active[:, None, None], Y_next, Y)
            if trace:
                values.append(OrderedDict((k, v.detach() if v.requires_grad else v) for k, v in vals.items()))
                curvs.append(curv)
            Y = Y_next
        layers_used = (torch.stack(ran, 1).sum(1) if ran else
                       torch.full((X.shape[0],), T, dtype=torch.long, device=X.device))
        return self.finish(Y, energy, graph, values, [], states, trace, keep_states, 0.0 < self.alpha <= 1.0,
                           layers_used, ran or None, X=X, curvatures=curvs)

    def extra_repr(self) -> str:
        parts = [f"d={self.d}", f"heads={self.heads}", f"d_head={self.d_head}", f"layers={self.layers}",
                 f"rho={self.rho.spec()}", f"tau={self.tau:g}", f"graph={self.graph_spec!r}", f"alpha={self.alpha:g}"]
        parts += [name for name, on in (("ffn", self.use_ffn), ("relu", self.use_relu),
                                        ("layernorm", self.use_layernorm)) if on]
        if self.curvature != "adaptive":
            parts.append(f"curvature={self.curvature}")
        if self.kernel != "auto":
            parts.append(f"kernel={self.kernel}")
        if self.stop_rel is not None:
            parts.append(f"stop_rel={self.stop_rel:g}")
        return ", ".join(parts)


class _TracedStack(Encoder):
    """An untied stack traced against E1 = pairwise (token space) + residual (free and baseline encoders)."""

    def __init__(self, d, layers, graph, rho, tau, validate):
        super().__init__(d, layers, graph, validate)
        self.rho = get_rho(rho)
        self.tau = check_number(tau, "tau", "positive", ConfigError) if tau is not None else math.sqrt(self.d)

    def energy(self, B: torch.Tensor) -> Energy:
        return Energy(attention=PairwiseAttention(self.rho, self.tau, validate=False), residual=Residual(B, validate=False))

    def blocks_for(self):
        raise NotImplementedError

    def apply_block(self, block, Y, mask, graph):
        raise NotImplementedError

    def run(self, X, mask, graph, trace, keep_states, layers):
        if layers is not None and not 0 <= int(layers) <= self.layers:
            raise ConfigError(f"this encoder has {self.layers} untied layers; it cannot unroll {layers} "
                              f"(0 .. {self.layers}: the first layers only)")
        energy = self.energy(X) if trace else None
        values: List[Dict[str, torch.Tensor]] = []
        curvs: list = []
        states: List[torch.Tensor] = []
        Y = X
        blocks = list(self.blocks_for())[:layers]
        for block in blocks:
            if keep_states or trace:
                states.append(Y)
            if trace:
                vals, curv = self.trace_values(energy, Y, graph)
                values.append(vals)
                curvs.append(curv)
            Y = graph.zero_padded(self.apply_block(block, Y, mask, graph))
        return self.finish(Y, energy, graph, values, [], states, trace, keep_states, False,
                           torch.full((X.shape[0],), len(blocks), dtype=torch.long, device=X.device), X=X, curvatures=curvs)


class FreeLayer(nn.Module):
    """Standard transformer layer: attention ([`Attention`][unfold.Attention], activation softmax |
    relu | softplus, restricted to the token graph) and a ReLU feed-forward map, each added to its
    input; post-LN (``norm="post"``) or the paper's add-only block (``norm="none"``, Lai, Lim, Liu
    eq. 6 / section 1.10: a spline of degree 3 with ReLU attention)."""

    def __init__(self, d: int, heads: int, ffn_mult: int, dropout: float, activation: str = "softmax",
                 temperature: float = 1.0, norm: str = "post"):
        super().__init__()
        self.attn = Attention(d, heads, activation, temperature=temperature, bias=True, dropout=dropout)
        self.ffn = nn.Sequential(nn.Linear(d, ffn_mult * d), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_mult * d, d))
        self.ln1, self.ln2 = (nn.LayerNorm(d), nn.LayerNorm(d)) if norm == "post" else (nn.Identity(), nn.Identity())
        self.drop = nn.Dropout(dropout)

    def forward(self, Y, allowed):
        Y = self.ln1(Y + self.drop(self.attn(Y, allowed=allowed)))
        return self.ln2(Y + self.drop(self.ffn(Y)))


@register_encoder("free")
class FreeEncoder(_TracedStack):
    """Untied standard layers restricted to the token graph (module docstring), traced against
    E1(Y) = sum_G tau rho(||y_u - y_v||^2 / 2tau) + 1/2 ||Y - B||^2 (supplement eq. 33), which they need not descend.

    Args:
        d: the token width.
        heads: attention heads (must divide d).
        layers: T, the untied layers.
        ffn_mult: the feed-forward width multiple (an integer >= 1).
        dropout: the dropout probability, in [0, 1).
        attention: the attention activation, ``softmax``, ``relu`` or ``softplus``.
        attention_temperature: the softplus activation's temperature.
        norm: ``post`` (post-LN) or ``none`` (the add-only block).
        graph: the token graph spec.
        rho: the penalty of the traced E1 ([`energies.get_rho`][energies.get_rho]).
        tau: the temperature of the traced E1 (default sqrt(d)).
        validate: check tokens and masks at every forward (host reads: a debugging switch).
    """

    def __init__(self, d: int = 64, heads: int = 2, layers: int = 4, ffn_mult: int = 2, dropout: float = 0.1,
                 attention: str = "softmax", attention_temperature: float = 1.0, norm: str = "post",
                 graph: str = "complete", rho="exp", tau: Optional[float] = None, validate: bool = False):
        super().__init__(d, layers, graph, rho, tau, validate)
        heads, ffn_mult, dropout, attention = check_stack_args(heads, ffn_mult, dropout, attention,
                                                      attention_temperature)
        if self.d % heads:
            raise ConfigError(f"d={self.d} must be divisible by heads={heads}")
        self.heads, self.attention, self.norm = heads, attention, check_choice(norm, "norm", NORMS)
        self.check_weights(self.layers * (4 + 2 * ffn_mult) * self.d * self.d, f"layers={self.layers}, "
                           f"ffn_mult={ffn_mult}")
        self.blocks = nn.ModuleList([FreeLayer(self.d, heads, ffn_mult, dropout, attention, attention_temperature,
                                               self.norm) for _ in range(self.layers)])

    def blocks_for(self):
        return self.blocks

    def apply_block(self, block, Y, mask, graph):
        eye = torch.eye(graph.num_nodes, dtype=torch.bool, device=Y.device)
        allowed = graph.pair_mask() | (eye & mask[:, :, None])
        allowed = allowed | ~mask[:, :, None]   # padded queries attend somewhere (outputs ignored)
        return block(Y, allowed)

    def extra_repr(self) -> str:
        return (f"d={self.d}, heads={self.heads}, layers={self.layers}, attention={self.attention}, norm={self.norm}, "
                f"graph={self.graph_spec!r}, traced rho={self.rho.spec()}, tau={self.tau:g}")


class _AsMultiheadAttention(nn.Module):
    """[`Attention`][unfold.Attention] behind ``nn.MultiheadAttention``'s call, so that
    ``nn.TransformerEncoderLayer`` (the baseline) runs with a relu or softplus activation."""

    #: read by ``nn.TransformerEncoderLayer`` only to decide on its fused fast path, which needs
    #: ``nn.MultiheadAttention``'s own weights; False sends it down the module path (tensors stay batch-first)
    batch_first = False

    def __init__(self, attn: Attention):
        super().__init__()
        self.attn = attn

    def forward(self, query, key, value, attn_mask=None, key_padding_mask=None, need_weights=False, is_causal=False):
        real = None
        if key_padding_mask is not None:   # torch: True (bool) or -inf (float, its canonical form) = ignore this key
            real = ~key_padding_mask if key_padding_mask.dtype == torch.bool else key_padding_mask == 0
        if attn_mask is not None or is_causal:
            raise ConfigError("the baseline's relu/softplus attention takes a key padding mask only")
        return self.attn(query, key_padding_mask=real), None


@register_encoder("baseline")
class TorchEncoder(_TracedStack):
    """``torch.nn.TransformerEncoder`` (post-LN, complete graph) traced with
    E1(Y) = sum_G tau rho(||y_u - y_v||^2 / 2tau) + 1/2 ||Y - B||^2 (module docstring; supplement eq. 33).

    Args:
        d: the token width.
        heads: attention heads (must divide d).
        layers: T, the untied layers.
        ffn_mult: the feed-forward width multiple (an integer >= 1).
        dropout: the dropout probability, in [0, 1).
        attention: ``softmax`` (torch's own attention), or ``relu`` / ``softplus`` in its place.
        attention_temperature: the softplus activation's temperature.
        graph: ``complete`` only (torch's encoder attends to every token).
        rho: the penalty of the traced E1 ([`energies.get_rho`][energies.get_rho]).
        tau: the temperature of the traced E1 (default sqrt(d)).
        validate: check tokens and masks at every forward (host reads: a debugging switch).
    """

    def __init__(self, d: int = 64, heads: int = 2, layers: int = 4, ffn_mult: int = 2, dropout: float = 0.1,
                 attention: str = "softmax", attention_temperature: float = 1.0, graph: str = "complete", rho="exp",
                 tau: Optional[float] = None, validate: bool = False):
        if graph != "complete":
            raise ConfigError("the baseline encoder (torch.nn.TransformerEncoder) supports only graph='complete'")
        super().__init__(d, layers, graph, rho, tau, validate)
        heads, ffn_mult, dropout, attention = check_stack_args(heads, ffn_mult, dropout, attention,
                                                      attention_temperature)
        if self.d % heads:
            raise ConfigError(f"d={self.d} must be divisible by heads={heads}")
        self.heads, self.attention = heads, attention
        self.check_weights((self.layers + 1) * (4 + 2 * ffn_mult) * self.d * self.d, f"layers={self.layers}, "
                           f"ffn_mult={ffn_mult}")
        layer = nn.TransformerEncoderLayer(self.d, heads, ffn_mult * self.d, dropout, batch_first=True)
        if attention != "softmax":
            layer.self_attn = _AsMultiheadAttention(Attention(self.d, heads, attention, temperature=attention_temperature,
                                                              bias=True, dropout=dropout))
        self.torch_encoder = nn.TransformerEncoder(layer, self.layers, enable_nested_tensor=False)

    def blocks_for(self):
        return self.torch_encoder.layers

    def apply_block(self, block, Y, mask, graph):
        return block(Y, src_key_padding_mask=~mask)

    def extra_repr(self) -> str:
        return (f"d={self.d}, heads={self.heads}, layers={self.layers}, attention={self.attention}, "
                f"traced rho={self.rho.spec()}, tau={self.tau:g}")


def build_encoder(kind: str, **kwargs) -> Encoder:
    """``ENCODERS[kind](**kwargs)``, an unknown kind refused with the registered names.

    Args:
        kind: a registered encoder name (``guaranteed``, ``free``, ``baseline`` or a plug-in's).
        **kwargs: the encoder's constructor arguments.

    Returns:
        The [`Encoder`][unfold.Encoder].

    Raises:
        ConfigError: an unknown ``kind`` (the registered names listed).
    """
    return ENCODERS.lookup(kind)(**kwargs)
