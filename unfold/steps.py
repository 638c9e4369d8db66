"""Update steps that descend the energies of [`energies`][energies], one layer each.

Every step holds the energy it descends (``step.energy``, built from the *same* term objects the
update reads its parameters from, so what is traced is what is descended), states the condition
under which descent is guaranteed (``step.guarantee``) and checks it for its current parameters
(``step.guaranteed()``). ``STEPS`` is the registry of step types.

Equation numbers: Yang, Huang, Wipf (NeurIPS 2022) main paper and supplement.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional

import torch

from energies.energy import Energy, attention_energy, feedforward_energy
from energies.errors import StepError
from energies.checks import check_number
from energies.graphs import TokenGraph, check_tokens
from energies.kernels import edge_z
from energies.registry import Registry
from energies.terms import ACCUM_DTYPE, Centering, NonNegativity, Rescaling

from . import mm as _mm

__all__ = [
    "Step",
    "AttentionStep",
    "FeedForwardStep",
    "GradientStep",
    "ReLUProxStep",
    "CenterStep",
    "RescaleStep",
    "Sequence",
    "layernorm_step",
    "theorem41_bound",
    "STEPS",
    "register_step",
    "UPDATES",
    "check_alpha",
    "check_energy",
]

STEPS: Registry = Registry("step", StepError, "kind", "unfold.steps.STEPS")
UPDATES = ("exact", "printed")


register_step = STEPS.register


def check_alpha(alpha, what: str = "alpha") -> float:
    """A step's residual weight checked where the step is built (`ProxMMStep`, the PyG conv use it too).

    Args:
        alpha: the weight, a number in (0, 1].
        what: its name in the refusal.

    Returns:
        alpha as a float.

    Raises:
        StepError: a weight outside (0, 1], named with its value.
    """
    try:
        return check_number(alpha, what, "unit", StepError)
    except StepError:
        raise StepError(f"residual weight {what} must lie in (0, 1], got {what}={alpha!r}") from None


def check_energy(energy, owner: str) -> Energy:
    """A step's energy checked where the step is built: an [`Energy`][energies.Energy].

    Args:
        energy: what the caller gave.
        owner: the step's class name, for the refusal.

    Returns:
        The energy.

    Raises:
        StepError: anything else, named by its type.
    """
    if not isinstance(energy, Energy):
        raise StepError(f"{owner} needs an Energy (energies.Energy), got {type(energy).__name__}")
    return energy


class Step(torch.nn.Module):
    """One update ``Y -> Y' = update(Y)`` (padded slots kept) descending ``self.energy`` under ``self.guarantee``:
    one layer of the unrolled MM iteration (paper eq. 3), whose descent [`trace_descent`][unfold.trace_descent] checks.

    Subclasses set ``energy`` and implement [`update`][unfold.Step.update] (and [`guaranteed`][unfold.Step.guaranteed]
    where a theorem applies); the base takes no constructor arguments.
    """

    kind = "step"
    energy: Energy
    guarantee: str = ""
    #: check the tokens (shape, finite real tokens: one host read) on every call; set False where the
    #: inputs were validated where they entered (a compiled or GPU training loop)
    validate: bool = True

    def guaranteed(self) -> bool:
        """Whether the stated descent condition holds for the current parameters."""
        return False

    def update(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        if self.validate:
            Y = check_tokens(Y, graph)
        out = self.update(Y, graph)
        if self.validate and not (isinstance(out, torch.Tensor) and out.shape == Y.shape):   # metadata only
            raise StepError(f"{type(self).__name__}.update returned {type(out).__name__} "
                            f"{tuple(getattr(out, 'shape', ()))}: a step maps tokens {tuple(Y.shape)} to the same shape")
        return graph.keep_padded(out, Y)

    def substeps(self) -> List["Step"]:
        return [self]


@register_step("attention")
class AttentionStep(Step):
    """One MM step on the attention energy E1 (supplement eq. 33, Algorithm 3, Theorem B.2).

    Step 1 majorizes each concave rho by its tangent: ``gamma_uv = rho'(z_uv)``. Step 2 takes one
    Jacobi-preconditioned gradient step of size ``alpha`` on the quadratic surrogate
    ``E~(Y) = sum_E gamma_uv ||y_u - y_v||^2 / 2 + ||Y - B||^2 / 2`` (eq. 36-37), whose Jacobi
    diagonal is ``D_u = 1 + sum_v gamma_uv``:

        ``exact``:   y_u <- (1 - alpha) y_u + alpha (sum_{v in N(u)} gamma_uv y_v + b_u) / (1 + sum_{v in N(u)} gamma_uv)

    computed as ``y_u + alpha (sum_v gamma_uv (y_v - y_u) + b_u - y_u) / (1 + deg_u)``
    ([`increment`][unfold.AttentionStep.increment]): the same point, from differences only, so that a fixed point stays
    exactly fixed at any token scale.

    The self term is not in the numerator. Guarantee: E1 does not increase for any
    0 < alpha <= 1 (the surrogate's Hessian L_gamma + I <= 2 D and it majorizes E1).

        ``printed``: y_u <- (1 - alpha) y_u + alpha sum_{v in N~(u)} gamma_uv y_v / sum_{v in N~(u)} gamma_uv

    with N~(u) = N(u) + {u} and gamma_uu = rho'(0): eq. 38/39 as printed in the supplement. It is
    not the Jacobi step of E~ and can raise E1 (the negative control); B must be None.

    Kernels (`energies.kernels`): ``edges`` (any graph), ``dense`` (n x n weights), ``softmax``
    (complete graph, rho=exp: softmax over all keys with key bias log beta_v = -|y_v|^2/(2 tau), self
    included, self contribution removed from the output, so that the exact step is
    ``attn_u + p_uu (b_u - y_u)``), ``fused`` (the same softmax form in one flash-attention kernel
    call with a differentiable log-sum-exp, CPU), ``streamed`` (complete graph, any rho, key tiles),
    ``auto`` (`energies.kernels.pick_kernel`).

    Args:
        rho: the penalty, a [`Rho`][energies.Rho] or a spec ([`energies.get_rho`][energies.get_rho]).
        tau: the temperature, > 0.
        alpha: the step size, in (0, 1] (refused outside it: a StepError).
        B: the initial residual ``(B, n, d)`` of ``|Y - B|^2 / 2`` (supplement F.4), or None for ``B = 0``.
        update: ``exact`` (the Jacobi MM step above) or ``printed`` (eq. 38/39, the negative control).
        kernel: the pairwise kernel, a registered name or ``auto``.
    """

    guarantee = "E1 never increases for 0 < alpha <= 1 with update='exact' (Theorem B.2 + Prop. B.1)"

    def __init__(self, rho="exp", tau: float = 1.0, alpha: float = 1.0, B: Optional[torch.Tensor] = None,
                 update: str = "exact", kernel: str = "auto"):
        super().__init__()
        if not isinstance(update, str) or update not in UPDATES:
            raise StepError(f"unknown attention update {update!r}; valid: {list(UPDATES)}")
        if update == "printed" and B is not None:
            raise StepError("the printed update (supplement eq. 38) has no initial residual; use B=None")
        self.alpha = check_alpha(alpha)
        self.update_rule = update
        self.kernel = kernel
        self.energy = attention_energy(rho, tau, B, kernel=kernel)
        self.pairwise = self.energy.terms["attention"]
        self.residual = self.energy.terms["residual"]

    @property
    def rho(self):
        return self.pairwise.rho

    @property
    def tau(self) -> float:
        return self.pairwise.tau

    def guaranteed(self) -> bool:
        return self.update_rule == "exact" and 0.0 < self.alpha <= 1.0

    def increment(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """``target - Y`` from differences only (``agg_u = sum_v gamma_uv (y_v - y_u)``):

            exact:    (agg_u + b_u - y_u) / (1 + deg_u),      printed: agg_u / (deg_u + rho'(0)),

        so a token with no pull and ``b_u = y_u`` gets exactly 0 and a fixed point stays exactly fixed. The exact
        increment is the Jacobi direction of [`unfold.mm.mm_direction`][unfold.mm_direction] (the one definition of the
        MM step); the printed one is its own rule (the negative control)."""
        if self.update_rule == "exact":
            return _mm.mm_direction(self.energy, Y, graph, "jacobi", validate=False)[0]
        agg, deg = self.pairwise.messages(Y, graph)
        c0 = self.rho.derivative(torch.zeros((), dtype=Y.dtype, device=Y.device))
        return agg / (deg + c0)[..., None]

    def target(self, Y: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """The alpha = 1 point of the step (the per-token minimiser of E~ for ``exact``)."""
        return Y + self.increment(Y, graph)

    def update(self, Y, graph):
        """``y + alpha (target - y)``: the same point as ``(1 - alpha) y + alpha target`` in exact arithmetic,
        and exactly y where the increment is 0."""
        return Y + self.alpha * self.increment(Y, graph)

    # ---------------------------------------------------------------- the MM surrogate, for tests
    def jacobi_diagonal(self, Y0: torch.Tensor, graph: TokenGraph) -> torch.Tensor:
        """``D_u = 1 + sum_v gamma_uv(Y0)`` ``(B, n)``: the surrogate Hessian's diagonal (eq. 37)."""
        return 1.0 + self.pairwise.messages(Y0, graph)[1]

    def surrogate(self, Y0: torch.Tensor, graph: TokenGraph):
        """``E~(.; Y0)`` as a function, shifted so that ``E~(Y0; Y0) = E1(Y0)``; it majorizes E1.

        E~(Y) = sum_{{u,v} in E} [tau rho(z0_uv) + gamma0_uv (||y_u - y_v||^2 / 2 - tau z0_uv)] + R(Y).
        """
        Y0 = check_tokens(Y0, graph).detach().to(ACCUM_DTYPE)
        src, dst = graph.edges()
        B, n, d = Y0.shape
        Y0f = Y0.reshape(B * n, d)
        tau = self.tau
        z0 = edge_z(Y0f, src, dst, tau)
        g0 = self.rho.derivative(z0)
        const = tau * self.rho.value(z0) - g0 * tau * z0
        residual = self.residual

        def E_tilde(Y):
            Y = Y.to(ACCUM_DTYPE)
            quad = g0 * tau * edge_z(Y.reshape(B * n, d), src, dst, tau) + const
            pair = torch.zeros(B, dtype=ACCUM_DTYPE, device=Y.device).index_add(0, src // n, quad)
            return pair + residual.value(Y, graph)

        return E_tilde


@register_step("gradient")
class GradientStep(Step):
    """Plain gradient step ``Y <- Y - a grad E(Y)`` on a smooth energy (main paper eq. 14).

    Guarantee: E does not increase when ``a * L <= 2`` and decreases by at least
    ``a / 2 ||grad||^2`` when ``a * L <= 1`` (Prop. A.1), L a Lipschitz bound of grad E, if given.

    Args:
        energy: E, a smooth [`Energy`][energies.Energy].
        step_size: a, > 0 (finite).
        lipschitz: L, a Lipschitz bound of grad E (> 0), or None (then [`guaranteed`][unfold.GradientStep.guaranteed] is
            False; so it is for an energy with an indicator term, which is not smooth).
    """

    guarantee = "E never increases when step_size * L <= 1 (L: Lipschitz constant of grad E)"

    def __init__(self, energy: Energy, step_size: float, lipschitz: Optional[float] = None):
        super().__init__()
        self.energy = check_energy(energy, type(self).__name__)
        self.step_size = check_number(step_size, "step_size", "positive", StepError)
        self._L = None if lipschitz is None else check_number(lipschitz, "lipschitz", "positive", StepError)

    def lipschitz(self) -> Optional[float]:
        return self._L

    def guaranteed(self) -> bool:
        """``step_size * L <= 1`` for a given L, on a smooth energy: an indicator term (ReLU's) is no part of Prop.
        A.1 (its zero subgradient does not keep Y feasible, and the step can send E to +inf), so none is claimed."""
        if self.energy.indicators:
            return False
        L = self.lipschitz()
        return L is not None and self.step_size * L <= 1.0 + 1e-12

    def update(self, Y, graph):
        return Y - self.step_size * self.energy.grad(Y, graph)


@register_step("feedforward")
class FeedForwardStep(GradientStep):
    """Gradient step of size a2 on E2 = 1/2 tr(Y W Y^T) + 1/2 ||Y - B||^2 (main paper eq. 13-14):

        Y <- Y - a2 (Y W + Y - B) = Y (I - a2 (I + W)) + a2 B,

    a linear layer with a symmetric weight plus residual. L = max |eig(I + W)|; guarantee a2 L <= 1.

    Args:
        W: the symmetric weight ``(d, d)``, floating.
        step_size: a2, > 0 (finite).
        B: the initial residual ``(B, n, d)`` of ``||Y - B||^2 / 2``, or None for ``B = 0``.
    """

    def __init__(self, W: torch.Tensor, step_size: float = 1.0, B: Optional[torch.Tensor] = None):
        super().__init__(feedforward_energy(W, B), step_size)
        self.ffn = self.energy.terms["ffn"]

    def lipschitz(self) -> float:
        eig = torch.linalg.eigvalsh(self.ffn.W.to(ACCUM_DTYPE))
        return float((1.0 + eig).abs().max())


@register_step("relu")
class ReLUProxStep(Step):
    """Proximal step of the non-negativity indicator: ``Y <- ReLU(Y)`` (main paper Thm 5.1, eq. 49).

    Alone it sends the indicator to 0. After a gradient step of size a <= 1/L on a smooth energy f
    (or an attention step with alpha <= 1/2), it completes a proximal gradient step that does not
    increase f + indicator (supplement A.2, eq. 27); see [`Sequence`][unfold.Sequence].
    """

    guarantee = "the indicator of Y >= 0 never increases (ReLU is its proximal map)"

    def __init__(self):
        super().__init__()
        self.energy = Energy(relu=NonNegativity())

    def guaranteed(self) -> bool:
        return True

    def update(self, Y, graph):
        return self.energy.terms["relu"].prox(Y, graph)


class TermMinimisingStep(Step):
    """A unit gradient step on a single term that lands on that term's minimiser (LayerNorm parts)."""

    guarantee = "the step's term never increases (the step reaches its minimum)"

    def guaranteed(self) -> bool:
        return True

    def update(self, Y, graph):
        return Y - self.energy.grad(Y, graph)


@register_step("center")
class CenterStep(TermMinimisingStep):
    """LayerNorm centring (supplement F.3, step 1): a unit gradient step on sum_u (1^T y_u)^2 / (2d),

        y_u <- y_u - mean(y_u) 1,

    which sends that term to its minimum 0."""

    def __init__(self):
        super().__init__()
        self.energy = Energy(center=Centering())


@register_step("rescale")
class RescaleStep(TermMinimisingStep):
    """LayerNorm rescaling (supplement F.3, step 2): a unit gradient step on
    sum_u (||y_u||^2 / 2 - r ||y_u||),

        y_u <- r y_u / ||y_u||,

    the term's minimiser on every non-zero token (zero tokens stay put).

    Args:
        radius: r, > 0, or None for r = sqrt(d) ([`Rescaling`][energies.Rescaling]).
    """

    def __init__(self, radius: Optional[float] = None):
        super().__init__()
        self.energy = Energy(rescale=Rescaling(radius))


def theorem41_bound(alpha1: float, alpha2: float, L_g: float) -> float:
    """Theorem 4.1's bound 1 / b on delta, b = |1 - alpha1 / alpha2| + alpha1 L_g (supplement eq. 40-46).

    The largest delta(y) = ||grad f|| / ||grad h|| for which Thm 4.1 guarantees descent of h = f + g (f, g convex
    and L-smooth) under the alternating steps y' = y - alpha1 grad f(y), y'' = y' - alpha2 grad g(y'), given
    alpha2 L_h <= 1. The supplement's eq. 40 writes ``||(1 - alpha1 / alpha2) grad f||`` as
    ``(1 - alpha1 / alpha2) ||grad f||``, true only for alpha1 <= alpha2; with the absolute value kept, b >= 0
    always and the rest of the proof (eq. 41-46) holds as printed. For alpha1 <= alpha2 this is eq. 46's b; for
    alpha1 > alpha2 eq. 46's b is smaller than the true one (negative where alpha1 > alpha2 (1 + alpha1 L_g)), and
    its bound is no bound: alpha1 = 5, alpha2 = 0.5 on f = g = |y|^2 / 2 raise h four-fold at delta = 1/2.

    Args:
        alpha1: the step size of the step on f, > 0.
        alpha2: the step size of the step on g, > 0.
        L_g: a Lipschitz bound of grad g, >= 0.

    Returns:
        The bound 1 / b as a float; ``inf`` only where b = 0 (alpha1 = alpha2 and L_g = 0: the two steps are one
        gradient step on h, descent for every delta).

    Raises:
        StepError: an argument that is not a finite number in its range (named).
    """
    alpha1 = check_number(alpha1, "alpha1", "positive", StepError)
    alpha2 = check_number(alpha2, "alpha2", "positive", StepError)
    L_g = check_number(L_g, "L_g", "nonnegative", StepError)
    b = abs(1.0 - alpha1 / alpha2) + alpha1 * L_g
    return math.inf if b == 0 else 1.0 / b


@register_step("sequence")
class Sequence(Step):
    """Steps applied in order, one layer: its energy is the sum of theirs (alternating
    minimisation, main paper Sec. 4, Theorem 4.1).

    Each sub-step descends its own energy; the sum is guaranteed to descend only where a theorem
    says so, and ``guaranteed()`` only claims these cases:

    * a single guaranteed step;
    * a gradient step with a L <= 1, or an exact attention step with alpha <= 1/2, followed by
      ReLU: a proximal gradient step on (its energy + indicator) (supplement A.2, Thm 5.1);
    * centring then rescaling (LayerNorm) on their own energy: each reaches its term's minimum and
      rescaling keeps the mean at zero.

    Two gradient steps (Thm 4.1) are guaranteed per input only: see [`theorem41`][unfold.Sequence.theorem41].

    Args:
        steps: the steps, an iterable of at least one [`Step`][unfold.Step] (a Sequence among them is flattened into
            [`substeps`][unfold.Sequence.substeps]).
    """

    guarantee = "see the class docstring: only the listed combinations are claimed"

    def __init__(self, steps: Iterable[Step]):
        super().__init__()
        if isinstance(steps, Step) or not isinstance(steps, Iterable):
            raise StepError(f"a Sequence takes an iterable of steps, got {type(steps).__name__}")
        steps = list(steps)
        for i, s in enumerate(steps):
            if not isinstance(s, Step):
                raise StepError(f"Sequence step {i} must be a Step, got {type(s).__name__}")
        self.steps = torch.nn.ModuleList(steps)
        if not len(self.steps):
            raise StepError("a Sequence needs at least one step")
        energy = Energy()
        for s in self.steps:
            energy = energy + s.energy
        self.energy = energy

    def substeps(self) -> List[Step]:
        out: List[Step] = []
        for s in self.steps:
            out.extend(s.substeps())
        return out

    def guaranteed(self) -> bool:
        subs = self.substeps()
        if len(subs) == 1:
            return subs[0].guaranteed()
        if len(subs) == 2 and isinstance(subs[1], ReLUProxStep):
            first = subs[0]
            if isinstance(first, AttentionStep):
                return first.update_rule == "exact" and first.alpha <= 0.5
            return isinstance(first, GradientStep) and first.guaranteed()
        if len(subs) == 2 and isinstance(subs[0], CenterStep) and isinstance(subs[1], RescaleStep):
            return True
        return False

    def update(self, Y, graph):
        for s in self.steps:
            Y = graph.keep_padded(s.update(Y, graph), Y)
        return Y

    def theorem41(self, Y: torch.Tensor, graph: TokenGraph) -> Dict[str, torch.Tensor]:
        """Thm 4.1's sufficient condition at Y for two gradient steps f then g.

        Returns per example ``delta = ||grad f|| / ||grad (f + g)||``, ``bound`` (eq. 46) and
        ``holds`` (delta <= bound and alpha2 L_h <= 1, with L_h <= L_f + L_g)."""
        subs = self.substeps()
        if len(subs) != 2 or not all(isinstance(s, GradientStep) for s in subs):
            raise StepError("theorem41 applies to a Sequence of exactly two gradient steps")
        f, g = subs
        ind = [name for s in subs for name in s.energy.indicators]
        if ind:         # Thm 4.1 is about smooth f and g: an indicator's zero subgradient says nothing of h = +inf
            raise StepError(f"theorem41 applies to smooth energies; the steps' energies have indicator terms {ind}")
        Lf, Lg = f.lipschitz(), g.lipschitz()
        if Lf is None or Lg is None:
            raise StepError("theorem41 needs Lipschitz constants of both gradient steps")
        Y = check_tokens(Y, graph).to(ACCUM_DTYPE)
        gf, gg = f.energy.grad(Y, graph), g.energy.grad(Y, graph)
        delta = gf.flatten(1).norm(dim=1) / (gf + gg).flatten(1).norm(dim=1).clamp_min(1e-300)
        bound = theorem41_bound(f.step_size, g.step_size, Lg)
        holds = (delta <= bound) & torch.tensor(g.step_size * (Lf + Lg) <= 1.0)
        return {"delta": delta, "bound": torch.full_like(delta, bound), "holds": holds}


def layernorm_step(radius: Optional[float] = None) -> Sequence:
    """LayerNorm without affine parameters as two energy steps (supplement F.3): centring
    ``y_u <- y_u - mean(y_u) 1``, then rescaling ``y_u <- r y_u / ||y_u||``.

    Args:
        radius: r, > 0, or None for r = sqrt(d).

    Returns:
        The [`Sequence`][unfold.Sequence] ``[CenterStep(), RescaleStep(radius)]`` (guaranteed: each step reaches its
        term's minimum).
    """
    return Sequence([CenterStep(), RescaleStep(radius)])
