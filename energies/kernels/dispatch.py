"""The pass over a graph: `pick_kernel` (``auto`` and the checks of a named kernel), `kernel_problem` (whether a
named kernel runs a graph spec and rho on a device: the one rule every constructor and build check asks),
`pairwise_pass` (centring, the precision guard, the fallback to explicit differences), `pairwise_pass_heads` (one
call for several heads), and the independent energy every check uses (`pairwise_energy`). Reaches the kernels through
the registry ([`KERNELS`][energies.KERNELS] and its auto and heads rules) and the exact passes it falls
back to (`edges`, `streamed`) directly."""
from __future__ import annotations

from typing import Optional

import torch

from ..checks import check_number
from ..errors import EnergyError, TokenError, UnfoldError
from .fused_ops import fused_available
from ..graphs import TokenGraph, graph_from_spec
from ..rho import ExpRho, Rho, get_rho, kernel_sensitivity
from .edges import edges_pass
from .guard import (EXPANSION_Z_ERROR, centred, expansion_dtype, expansion_ok, explicit_tile, explicit_z, own_dtype,
                    scale_dtype, to_float64)
from .registry import AUTO_RULES, HEADS_PASSES, KERNELS, Kernel, PairwisePass, apply_metric, check_kernel
from .lse import degree_energy, softmax_degrees
from .streamed import STREAM_MIN_N, streamed_pass
from .triton import triton_heads


def _check_parts(graph, rho) -> None:
    """``graph`` a [`TokenGraph`][energies.TokenGraph] and ``rho`` a [`Rho`][energies.Rho] instance, else an
    [`EnergyError`][energies.EnergyError] naming them."""
    if not isinstance(graph, TokenGraph):
        raise EnergyError(f"graph must be a TokenGraph, got {type(graph).__name__}")
    if not isinstance(rho, Rho):
        raise EnergyError(f"rho must be a Rho (energies.get_rho(spec)), got {rho!r:.60}")


def _check_entry(Y, graph, rho, tau) -> None:
    """The public passes' entry checks (``validate=True``; metadata only, no host read, so that a timed call is not
    slowed): `_check_parts`, tau a finite number > 0, and Y a floating ``(B, n, d)`` tensor of the graph's
    ``(B, n)`` on its device (a [`TokenError`][energies.TokenError], not torch's error from inside a kernel)."""
    _check_parts(graph, rho)
    check_number(tau, "tau", "positive", EnergyError)
    if not (isinstance(Y, torch.Tensor) and Y.dtype.is_floating_point and Y.ndim == 3
            and tuple(Y.shape[:2]) == (graph.batch_size, graph.num_nodes) and Y.shape[2] >= 1):
        raise TokenError(f"Y must be floating tokens (B, n, d) = ({graph.batch_size}, {graph.num_nodes}, d >= 1), "
                         f"got {getattr(Y, 'dtype', type(Y).__name__)} {tuple(getattr(Y, 'shape', ()))}")
    if Y.device != graph.device:
        raise TokenError(f"Y is on {Y.device} but the graph is on {graph.device}")


def pick_kernel(graph: TokenGraph, rho: Rho, kernel: str = "auto", validate: bool = True) -> str:
    """``auto``: off the CPU (a GPU, or the ``meta`` device that stands in for one) on the complete graph with
    rho = exp the ``fused`` kernel (torch's own fused attention on CUDA), else the ``triton`` kernel where
    Triton is installed and the penalty has Triton functions; on the CPU, and elsewhere without Triton: on the
    complete graph with rho = exp the fused kernel where its op exists (CPU), else softmax (streamed above
    ``STREAM_MIN_N`` tokens); other rho on the complete graph: dense, streamed above ``STREAM_MIN_N``; a
    graph that is not complete, on the CPU: the first registered kernel whose auto rule says it pays
    (`AUTO_RULES`: banded, where a shift-invariant graph's tiles pay,
    `banded_pays`); any other graph: edges. A kernel that does not apply is an error.

    The name is checked (`check_kernel`) unless ``validate`` is False: the
    caller checked it where it entered (a term's constructor), so the layers' passes check nothing by name."""
    if validate:
        _check_parts(graph, rho)
    if kernel == "auto":
        off_cpu = graph.mask.device.type != "cpu"
        if off_cpu and graph.is_complete and isinstance(rho, ExpRho) and fused_available(graph.mask.device.type):
            return "fused"
        if off_cpu and "triton" in KERNELS and KERNELS["triton"].supports(graph, rho) is None:
            return "triton"
        if not graph.is_complete:
            if graph.mask.device.type == "cpu":
                for name, pays in AUTO_RULES.items():
                    if name in KERNELS and pays(graph):
                        return name
            return "edges"
        if isinstance(rho, ExpRho):
            if fused_available(graph.mask.device.type):
                return "fused"
            return "streamed" if graph.num_nodes > STREAM_MIN_N else "softmax"
        return "streamed" if graph.num_nodes > STREAM_MIN_N else "dense"
    if validate:
        check_kernel(kernel)
    why = KERNELS[kernel].supports(graph, rho)
    if why is not None:
        raise EnergyError(f"the {kernel} kernel {why}")
    return kernel


def kernel_problem(kernel: str, graph: str, rho, device=None) -> Optional[str]:
    """Why the pairwise ``kernel`` cannot run the graph spec ``graph`` with ``rho`` on tensors of ``device``, or None.

    Asked of the kernel's ``supports`` on a two-token probe graph of that kind (shift-invariant or not, as the spec
    builds it) on that device: no tokens, no memory. The one rule of where a kernel runs: an encoder's constructor
    asks it without a device (does the kernel run anywhere?), a build check asks it for the device a run trains on.

    Args:
        kernel: a registered kernel name or ``auto`` (checked by the caller, `check_kernel`).
        graph: a graph spec (``complete``, ``window:8``, ...).
        rho: a [`Rho`][energies.Rho] or its spec.
        device: the device the kernel would run on; None: any device this library runs on (the CPU, or a GPU,
            probed on ``meta``), the reason given being the CPU's.

    Returns:
        None where the kernel runs (always for ``auto``, which picks one that does, and for a CUDA device this
        machine lacks, which the device check reports), else why not, worded to follow "the KERNEL kernel ...".
    """
    if kernel == "auto":
        return None
    rho = rho if isinstance(rho, Rho) else get_rho(rho)
    if device is None:
        why = kernel_problem(kernel, graph, rho, "cpu")
        return None if why is None or kernel_problem(kernel, graph, rho, "meta") is None else why
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        return None
    with torch.device("cpu"):          # a probe of the graph's kind (also when built under a device context)
        try:                           # shift-invariant (offsets) or not, as the spec builds it (the banded kernel)
            shift = graph != "complete" and graph_from_spec(graph, 2).offsets is not None
        except UnfoldError:
            shift = False
        probe = TokenGraph(1, 2, None, None if graph == "complete" else torch.zeros(2, 0, dtype=torch.long), name=graph,
                           offsets=() if shift else None)
    return KERNELS[kernel].supports(probe.to(torch.device(device.type)), rho)


def pairwise_pass(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                  energy: bool = False, num: bool = True, metric: Optional[torch.Tensor] = None,
                  guard: bool = True, validate: bool = True) -> PairwisePass:
    """One pass over the graph with edge weights ``gamma_uv = rho'(z_uv)``, ``z_uv = |y_u - y_v|^2 / (2 tau)``:
    ``agg_u = sum_{v in N(u)} gamma_uv (y_v - y_u)``, ``deg_u = sum_{v in N(u)} gamma_uv`` and, if asked, the
    pairwise energy ``sum_{{u,v} in E} tau rho(z_uv)`` (supplement eq. 33), all from one pass.

    Args:
        Y: the tokens ``(B, n, d)``.
        graph: the token graph of the batch.
        rho: the concave penalty ([`energies.get_rho`][energies.get_rho]).
        tau: the temperature, > 0.
        kernel: a registered kernel or ``auto`` (`pick_kernel`).
        energy: also return the pairwise energy per example (float64).
        num: compute the neighbour sums (``agg``); False gives an energy-only pass (``agg`` None).
        metric: W ``(d, d_h)``: the pass works on the features ``z_u = W^T y_u`` (``agg`` is then
            ``(B, n, d_h)``), formed from differences or centred tokens, never from ``Y W`` of tokens far from the
            origin.
        guard: for an expansion kernel, read the tokens' scale (one host read) and widen the dtype, or fall back to
            explicit differences, where the expansion cannot resolve z (`expansion_dtype`). With False (a
            forward pass with the trace off) there is no host read: the expansion runs in the tokens' own dtype on
            centred tokens, z erring by about ``eps * max_u |y_u - mean|^2 / tau``.
        validate: check the arguments (the kernel's name, graph, rho, tau, Y's metadata; no host read); False
            where the caller checked them where they entered (a term's constructor): its passes check nothing.

    Returns:
        A `PairwisePass` ``(agg, deg, energy)``, ``agg`` and ``deg`` in Y's dtype.
    """
    if validate:
        _check_entry(Y, graph, rho, tau)
    kernel = KERNELS[pick_kernel(graph, rho, kernel, validate)]
    Y = graph.zero_padded(Y)
    if not kernel.expansion:
        return kernel.run(Y, graph, rho, tau, energy, num, metric)._replace(Y=Y, metric=metric)
    return _expansion_pass(kernel, Y, graph, rho, tau, energy, num, metric, guard)


def _expansion_pass(kernel: Kernel, Y, graph, rho, tau, energy, num, metric, guard) -> PairwisePass:
    """`pairwise_pass` for an expansion kernel: on centred features, the precision guard choosing the dtype
    (or explicit differences) on the host, or on the device without a host read; without the guard, in the
    tokens' own dtype."""
    Zc = apply_metric(centred(Y, graph), metric)
    sq = (Zc * Zc).sum(-1)
    if guard and Y.device.type != "cpu" and not torch.compiler.is_compiling():
        return _guarded_on_device(kernel, Y, Zc, sq, graph, rho, tau, energy, num, metric)
    if guard:
        dt = expansion_dtype(Zc, tau, kernel_sensitivity(rho), sq=sq)
    else:
        dt = Zc.dtype if _native_half(kernel, Zc) else own_dtype(Zc)
    if dt is None:   # the expansion cannot resolve z at this scale: explicit differences, tile by tile, of the
        # tokens themselves (exact); with a metric, of centred features (W needs its gradient through autograd)
        out = _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric)
    elif dt != Zc.dtype:   # centred again in the wider dtype: no rounding of y - mean in the narrow one
        out = kernel.run(apply_metric(centred(Y.to(dt), graph), metric), graph, rho, tau, energy, num, None)
        out = PairwisePass(None if out.agg is None else out.agg.to(Y.dtype), out.deg.to(Y.dtype), out.energy)
    else:
        out = kernel.run(Zc, graph, rho, tau, energy, num, None, sq=sq)
    return out._replace(Y=Y, metric=metric)


def _native_half(kernel: Kernel, Zc: torch.Tensor) -> bool:
    """Whether the kernel takes these bfloat16 / float16 features as they are
    ([`Kernel.native_half`][energies.Kernel.native_half], off the CPU, guard off): the step in the half type on its own
    tensor-core path, never a certified energy."""
    return kernel.native_half and Zc.dtype in (torch.bfloat16, torch.float16) and Zc.device.type != "cpu"


def explicit_energy(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float,
                    metric: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
    """The pairwise energy ``(B,)`` float64 from the precision guard's exact side (`_explicit_pass`: explicit
    differences of centred features, exact to rounding at any scale, in Y's dtype), whatever kernel the layers use,
    with no host read: what a decision that must not rest on the expansion's rounding reads (the energy-chosen
    depth), at the cost of one pass, d_h per pair. ``validate``: as for `pairwise_pass` (the checks read
    metadata only)."""
    if validate:
        _check_entry(Y, graph, rho, tau)
    Y = graph.zero_padded(Y)
    return _explicit_pass(Y, apply_metric(centred(Y, graph), metric), graph, rho, tau, True, False, metric).energy


def _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric) -> PairwisePass:
    """The pass from explicit differences (exact to rounding at any scale), where the expansion cannot resolve z: on
    the complete graph the streamed tiles, of the tokens (with a metric, of the centred features Zc, W getting its
    gradient through autograd); on any other graph the edge list, differences in token space mapped by W."""
    if graph.is_complete:
        return streamed_pass(Y if metric is None else Zc, graph, rho, tau, energy, num, explicit=True)
    return edges_pass(Y, graph, rho, tau, energy, num, metric)


def _guarded_on_device(kernel: Kernel, Y, Zc, sq, graph, rho, tau, energy, num, metric) -> PairwisePass:
    """The precision guard without a host read (tokens off the CPU, where reading the scale would wait for the
    device): both the kernel's expansion in the tokens' own dtype and the explicit-difference pass (exact to
    rounding at any scale), selected per example on the device by `expansion_ok`. The CPU keeps the
    one read of `expansion_dtype` (host memory: nothing to wait for) and computes one path only."""
    own = Y.dtype
    if Zc.dtype not in EXPANSION_Z_ERROR:           # half types: the rule and the pass in float32, the result in own
        Zc = apply_metric(centred(Y.float(), graph), metric)
        Y, sq = Y.float(), (Zc * Zc).sum(-1)
    ok = expansion_ok(sq, tau, kernel_sensitivity(rho), Zc.dtype)                 # (B,)
    # the fast pass sees the refused examples as zeros: at their scale it may overflow (the compact layout's
    # LSE - |z|^2/2tau), and the where's zero gradient times inf would be NaN in their gradient
    keep = ok[:, None]
    fast = kernel.run(torch.where(keep[..., None], Zc, 0.0), graph, rho, tau, energy, num, None,
                      sq=torch.where(keep, sq, 0.0))
    safe = _safe_pass(kernel, Y, Zc, ok, graph, rho, tau, energy, num, metric)

    def pick(a, b, dtype=None):
        if a is None:
            return None
        return torch.where(ok.reshape(ok.shape + (1,) * (a.ndim - 1)), a, b.to(a.dtype)).to(dtype or a.dtype)
    return PairwisePass(pick(fast.agg, safe.agg, own), pick(fast.deg, safe.deg, own), pick(fast.energy, safe.energy),
                        Y=Y.to(own), metric=metric)


def _safe_pass(kernel: Kernel, Y, Zc, ok, graph, rho, tau, energy, num, metric) -> PairwisePass:
    """The guard's exact side: the explicit-difference pass; for the fused kernel on the complete graph, where
    Triton serves the device, the ``triton`` kernel on the examples the rule refuses only (the others' tokens
    masked out), which decides per example in the kernel and takes explicit differences where the expansion
    cannot resolve z."""
    if kernel.name == "fused" and "triton" in KERNELS and KERNELS["triton"].supports(graph, rho) is None:
        sub = graph.with_mask(graph.mask & ~ok[:, None])
        return KERNELS["triton"].run(Y, sub, rho, tau, energy, num, metric)
    return _explicit_pass(Y, Zc, graph, rho, tau, energy, num, metric)


def pairwise_pass_heads(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str, metrics,
                        energy: bool = False, num: bool = True, guard: bool = True, validate: bool = True):
    """`pairwise_pass` for several metrics W_1..W_H of one shape (the heads of a multi-head energy) where one
    kernel call can serve them all: the softmax kernels (complete graph, rho = exp) on the heads' centred
    features ``(B, H, n, d_h)`` from one centring and one matmul by ``[W_1 .. W_H]``; the fused kernel with its
    neighbour sums (one flash call over H heads), or the energy-only pass of either (`softmax_degrees`
    over B H examples); the banded kernel over ``(B, H)`` at once. Each head gets exactly the quantities of its own pass (the same formulas; tested).
    Returns one `PairwisePass` per metric, or None where they cannot share a call (another kernel, a
    dtype other than float32/64, or a scale guard asking some head for a wider dtype or explicit differences,
    read for all heads in one host read): then call `pairwise_pass` per head. ``validate``: as for
    `pairwise_pass`."""
    if len(metrics) < 2 or len({tuple(w.shape) for w in metrics}) != 1:
        return None
    if validate:
        _check_entry(Y, graph, rho, tau)
    name = pick_kernel(graph, rho, kernel, validate)
    if name == "triton":
        return triton_heads(graph.zero_padded(Y), graph, rho, tau, metrics, energy, num)
    native = not guard and name == "fused" and _native_half(KERNELS[name], Y)
    if (Y.dtype not in EXPANSION_Z_ERROR and not native) or (guard and Y.device.type != "cpu"):
        return None                                      # (off the CPU: per head, guarded on the device)
    if name == "fused" and not fused_available(Y.device.type, Y.dtype):
        return None                                      # (no op for this dtype: per head, the exact torch forms)
    if name not in HEADS_PASSES and (num or name != "softmax"):
        return None
    Y = graph.zero_padded(Y)
    B, n, _ = Y.shape
    H, dh = len(metrics), metrics[0].shape[1]
    W = torch.cat([w.to(device=Y.device, dtype=Y.dtype) for w in metrics], 1)            # (d, H d_h)
    Z = (centred(Y, graph) @ W).unflatten(-1, (H, dh)).transpose(1, 2)                 # (B, H, n, d_h)
    sq = (Z * Z).sum(-1)                                                                 # (B, H, n)
    if guard and not torch.compiler.is_compiling():
        sens = max(1.0, float(kernel_sensitivity(rho)))
        top = (sq.detach().amax((0, 2)) / tau).tolist()                                 # one host read, all heads
        if any(scale_dtype(t * sens, Z.dtype) != Z.dtype for t in top):
            return None
    if name in HEADS_PASSES:                        # (B, H, n, d_h) in one call (fused, banded)
        agg, deg, e = HEADS_PASSES[name](Z, graph, rho, tau, energy, num, sq)
    else:                                           # the softmax kernel's energy-only pass
        deg = softmax_degrees(Z.reshape(B * H, n, dh), graph.mask.repeat_interleave(H, 0), tau,
                               sq.reshape(B * H, n)).view(B, H, n)
        agg = None
        e = degree_energy(deg, tau) if energy else None
    return [PairwisePass(None if agg is None else agg[:, h], deg[:, h], None if e is None else e[:, h], Y=Y,
                         metric=metrics[h]) for h in range(H)]


def weighted_neighbour_sums(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                            validate: bool = True):
    """``(num, deg)`` with ``num_u = sum_v gamma_uv y_v`` ``(B, n, d)`` and ``deg_u = sum_v gamma_uv`` ``(B, n)``
    (``validate``: as for `pairwise_pass`)."""
    out = pairwise_pass(Y, graph, rho, tau, kernel, validate=validate)
    return out.num, out.deg


def pairwise_energy(Y: torch.Tensor, graph: TokenGraph, rho: Rho, tau: float, kernel: str = "auto",
                    metric: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
    """``sum_{{u,v} in E} tau * rho(z_uv)`` per example, ``(B,)`` float64, each undirected edge once.

    The independent evaluation every check uses: directly from the pairs, never from a log-sum-exp, and always
    from explicit differences (the edge list; on the complete graph key tiles of ``(B, n, tile, d)``
    differences), so z, and so each ``rho(z)``, is exact to rounding at every scale: an expansion
    ``|a|^2 + |b|^2 - 2 a.b`` would err by about ``eps |y|^2`` per pair, which can exceed a tolerance relative
    to a small energy. With a metric W the differences are taken in token space, then mapped:
    ``z_uv = |W^T (y_u - y_v)|^2 / 2 tau``. Differentiable. ``kernel`` is checked (its name unless ``validate``
    is False, as for `pairwise_pass`, and that it applies to the graph) but not used."""
    if validate:
        _check_entry(Y, graph, rho, tau)
    kernel = pick_kernel(graph, rho, kernel, validate)
    Y = graph.zero_padded(Y)
    if not graph.is_complete:
        return edges_pass(Y, graph, rho, tau, energy=True, num=False, metric=metric).energy
    B, n, d = Y.shape
    tile = explicit_tile(Y, d if metric is None else d + metric.shape[-1], n)
    rows = torch.arange(n, device=Y.device)
    mask = graph.mask
    zero = torch.zeros((), dtype=Y.dtype, device=Y.device)
    e = torch.zeros(B, dtype=torch.float64, device=Y.device)
    for s in range(0, n, tile):
        z, _ = explicit_z(Y, Y[:, s:s + tile], tau, metric)
        pm = mask[:, :, None] & mask[:, None, s:s + tile] & (rows[:, None] < rows[None, s:s + tile])  # each pair once
        e = e + tau * to_float64(torch.where(pm, rho.value(torch.where(pm, z, zero)), zero)).sum((1, 2))
    return e
