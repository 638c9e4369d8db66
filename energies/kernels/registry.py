"""The pairwise-kernel registry: what a kernel returns (`PairwisePass`), what it is ([`Kernel`][energies.Kernel]), the
table [`KERNELS`][energies.KERNELS] and [`register_kernel`][energies.register_kernel], which also takes the two optional
rules a kernel may declare for the dispatcher (``auto``: when ``auto`` picks it for a sparse graph on the CPU;
``heads``: one call for the heads of a multi-head energy). Imports nothing of the kernels themselves, so a kernel module
(in this package or a plug-in anywhere) imports only this."""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch

from ..errors import EnergyError
from ..graphs import TokenGraph
from ..registry import Registry, claim
from ..rho import Rho

__all__ = ["AUTO_RULES", "HEADS_PASSES", "KERNELS", "Kernel", "PairwisePass", "apply_metric", "check_kernel",
           "kernel_names", "register_kernel"]


class PairwisePass(NamedTuple):
    """What a kernel returns: one pass over the graph with edge weights ``gamma_uv = rho'(z_uv)``.

    Attributes:
        agg: ``(B, n, d)`` ``sum_v gamma_uv (y_v - y_u)``, or None (energy-only pass).
        deg: ``(B, n)`` ``sum_v gamma_uv``.
        energy: ``(B,)`` float64, ``sum_E tau rho(z)``, or None when not asked for.
        Y: the (zero-padded) tokens of the pass, for `num` (the dispatcher sets it).
        metric: the pass's metric W, for `num` (the dispatcher sets it).
    """
    agg: Optional[torch.Tensor]     # (B, n, d)  sum_v gamma_uv (y_v - y_u), or None (energy-only pass)
    deg: torch.Tensor               # (B, n)     sum_v gamma_uv
    energy: Optional[torch.Tensor]  # (B,) float64, sum_E tau rho(z), or None when not asked for
    Y: Optional[torch.Tensor] = None       # the (zero-padded) tokens of the pass, for `num`
    metric: Optional[torch.Tensor] = None  # the pass's metric W, for `num`

    @property
    def num(self) -> Optional[torch.Tensor]:
        """``sum_v gamma_uv z_v = agg_u + deg_u z_u`` ``(B, n, d)``, z = W^T y (not translation invariant)."""
        return None if self.agg is None else self.agg + self.deg[..., None] * apply_metric(self.Y, self.metric)


class Kernel(NamedTuple):
    """A registered pairwise kernel ([`register_kernel`][energies.register_kernel]).

    ``run(Y, graph, rho, tau, energy, num, metric) -> PairwisePass``. A kernel with ``expansion=False`` gets the
    zero-padded tokens Y and the metric W (or None) and must form z from them itself; one with
    ``expansion=True`` gets the centred features ``Z = W^T (y - mean)`` already in the dtype that resolves the
    expansion ``|a|^2 + |b|^2 - 2 a.b`` (`expansion_dtype`), ``metric=None`` and the keyword ``sq``
    (``|z_u|^2`` when already computed, else None), so it may use the expansion freely.

    Attributes:
        name: the kernel's registered name.
        run: ``run(Y, graph, rho, tau, energy, num, metric) -> PairwisePass``: the pass itself.
        supports: ``supports(graph, rho)``: None where the kernel applies, else why not, worded to follow
            "the NAME kernel ..." (e.g. "needs the complete graph").
        expansion: whether it takes the centred features and may use the expansion ``|a|^2 + |b|^2 - 2 a.b``.
        native_half: an expansion kernel that takes bfloat16 / float16 features as they are off the CPU when the
            precision guard is off (others get them in float32).
    """
    name: str
    run: Callable[..., PairwisePass]
    #: ``supports(graph, rho)``: None where the kernel applies, else why not, worded to follow
    #: "the NAME kernel ..." (e.g. "needs the complete graph")
    supports: Callable[[TokenGraph, Rho], Optional[str]]
    expansion: bool
    #: an expansion kernel that takes bfloat16 / float16 features as they are off the CPU when the precision guard
    #: is off (a step with the trace off, e.g. under autocast); others get them in float32
    native_half: bool = False


#: the pairwise kernels by name (``auto`` is not one: `pick_kernel` chooses among them)
KERNELS: Registry = Registry("pairwise kernel", EnergyError, None, "energies.KERNELS")

#: ``auto`` on the CPU, for a graph that is not complete: ``{kernel: pays(graph)}``, consulted in registration order
#: (a registered kernel whose rule says True is picked; else ``edges``)
AUTO_RULES: Dict[str, Callable[[TokenGraph], bool]] = {}
#: ``{kernel: heads(Z, graph, rho, tau, energy, num, sq) -> (agg, deg, energy)}`` over ``(B, H, n, d_h)``
#: centred features: one call for every head (`pairwise_pass_heads`)
HEADS_PASSES: Dict[str, Callable] = {}


def _any_graph(graph: TokenGraph, rho: Rho) -> Optional[str]:
    return None


def register_kernel(name: str, supports: Optional[Callable[[TokenGraph, Rho], Optional[str]]] = None,
                    expansion: bool = False, native_half: bool = False,
                    auto: Optional[Callable[[TokenGraph], bool]] = None, heads: Optional[Callable] = None):
    """``@register_kernel("name")`` on ``run(Y, graph, rho, tau, energy, num, metric) -> PairwisePass``: the
    kernel becomes selectable by name everywhere a kernel is (terms, steps, models, configs, CLIs); see
    [`Kernel`][energies.Kernel] for the contract. A name already registered (``edges``, a plug-in's earlier kernel) is
    refused with an [`EnergyError`][energies.EnergyError] naming it. Every kernel must return the same ``agg``, ``deg``
    and energy as ``edges`` to rounding (the tests compare each registered kernel with it).

    Args:
        name: the kernel's name (not ``auto``, no ``:``).
        supports: ``supports(graph, rho)``: None where the kernel applies, else why not.
        expansion: whether it takes centred features and may use ``|a|^2 + |b|^2 - 2 a.b``
            ([`Kernel`][energies.Kernel]).
        native_half: whether it takes bfloat16 / float16 features as they are off the CPU, unguarded.
        auto: ``pays(graph)``: let ``auto`` pick this kernel on the CPU for a graph that is not complete where it
            says True (rules consulted in registration order; else ``edges``).
        heads: ``heads(Z, graph, rho, tau, energy, num, sq) -> (agg, deg, energy)`` over ``(B, H, n, d_h)`` centred
            features: every head of a multi-head energy in one call.

    Returns:
        The decorator: it registers ``run`` as a [`Kernel`][energies.Kernel] in [`KERNELS`][energies.KERNELS] (with its
        ``auto`` rule and ``heads`` pass, where given) and returns ``run`` unchanged.

    Raises:
        EnergyError: a name that is empty, ``auto`` or holds ``:`` (when called), or one already taken (when
            applied).
    """
    if not isinstance(name, str) or not name or name == "auto" or ":" in name:
        raise EnergyError(f"a kernel name must be a non-empty string other than 'auto' without ':', got {name!r}")

    def deco(run):
        kernel = Kernel(name, run, supports or _any_graph, bool(expansion), bool(native_half))
        if claim(KERNELS, name, kernel, KERNELS.label, EnergyError):
            KERNELS[name] = kernel
            if auto is not None:
                AUTO_RULES[name] = auto
            if heads is not None:
                HEADS_PASSES[name] = heads
        return run

    return deco


def kernel_names():
    """The values a ``kernel`` argument takes: ``auto`` and every registered kernel.

    Returns:
        ``['auto', *KERNELS]``: a new list of names, registered kernels in registration order.
    """
    return ["auto"] + list(KERNELS)


def check_kernel(kernel, error=EnergyError) -> str:
    """The one rule for a ``kernel`` argument, applied where it enters (a term's, step's or encoder's constructor):
    ``auto`` or a registered kernel, else ``error`` (the caller's layer's typed error) in the registries' wording,
    ``unknown pairwise kernel 'x'; valid: [...]``.

    Args:
        kernel: the argument as given.
        error: the typed error to raise.

    Returns:
        The kernel's name, unchanged.
    """
    if not (isinstance(kernel, str) and kernel == "auto"):
        KERNELS.check(kernel, " or 'auto'", error)
    return kernel


def apply_metric(Y: torch.Tensor, metric: Optional[torch.Tensor]) -> torch.Tensor:
    """``Y W`` (the features ``z_u = W^T y_u``), or Y itself without a metric.

    Args:
        Y: the tokens ``(..., d)``.
        metric: W ``(d, d_h)``, or None.

    Returns:
        The features ``(..., d_h)`` in Y's dtype, or Y itself.
    """
    return Y if metric is None else Y @ metric.to(device=Y.device, dtype=Y.dtype)

