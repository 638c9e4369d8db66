"""Spline probe: is a module a spline along rays through its input, and of which degree?

``python -m experiments.studies.spline_probe (--attention softmax|relu|softplus [--causal] [--cross WHICH]
| --config FILE [k=v ...] | --checkpoint runs/NAME/best.pt) [--layers T] [--json]``

Lai, Lim, Liu ("Attention is a smoothed cubic spline") show that ReLU attention is a cubic spline,
a t-layer ReLU encoder a spline of degree 3^t (Lemma 3.2, Theorem 3.3), and that a spline is only
promised to be continuous (Definition 2.2), not C^1 or C^2. Along a ray ``X(t) = X0 + t D`` the probe

1. reads the sign pattern of every ReLU pre-activation (forward hooks on every ``nn.ReLU``, and
   the ReLU kinks of our own MM steps, which are ``nn.ReLU`` modules too) and splits t into pieces where
   the pattern is constant (breakpoints located by bisection);
2. freezes each piece's pattern (every ReLU becomes multiplication by its fixed 0/1 pattern), which
   gives a map equal to the module on the piece and defined on the whole ray, and fits it with
   polynomials of degree 0, 1, ... on the whole ray in float64 (Chebyshev least squares), keeping
   the smallest degree whose worst residual is below ``tol`` times the output scale (a fit on the
   piece alone would pass any smooth map once pieces are short);
3. measures the jump of the output across every breakpoint (continuity gap) and the jump of the
   slope (reported, never required to vanish: C^1 is not claimed).

Verdict ``spline`` when every piece fits a polynomial of degree <= ``max_degree`` and the map is
continuous at every breakpoint; ``non-spline`` otherwise (softmax, LayerNorm, row normalisation:
no finite degree fits), with the evidence. `static_degree` gives the bound of Lemma 3.2 /
Theorem 3.3 for a module built from known parts (attention 3, encoder block 3, t layers 3^t,
encoder-decoder attention 2 / 1 / 3 in context / queries / both, encoder-decoder block 5), or None
where the paper's argument does not apply.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from energies.errors import CheckpointError, ConfigError, UnfoldError
from unfold.attention import Attention
from unfold.cli import finite_float, nonnegative_int, one_line, positive_float, positive_int, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.classifier import SequenceClassifier, upgrade_state_dict
from unfold.encoders import FreeEncoder, FreeLayer, GuaranteedEncoder, TorchEncoder
from unfold.strict_json import dumps as json_dumps

__all__ = ["probe", "relu_pattern", "static_degree", "degree_analysis", "EncoderBlock", "Encoder", "probe_attention",
           "probe_model", "load_model"]


# ------------------------------------------------------------------ modules with known degree
class EncoderBlock(nn.Module):
    """Encoder block of the paper's eq. 6 (no LayerNorm): ``h = X + attn(X)``, ``out = h + ffn(h)``."""

    def __init__(self, d: int, heads: int = 1, activation: str = "relu", causal: bool = False, layernorm: bool = False):
        super().__init__()
        self.attn = Attention(d, heads, activation, causal=causal)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d) if layernorm else None

    def forward(self, x):
        h = x + self.attn(x)
        out = h + self.ffn(h)
        return self.norm(out) if self.norm is not None else out


class Encoder(nn.Sequential):
    """t encoder blocks: a spline of degree 3^t with ReLU attention (Theorem 3.3)."""


_NOT_SPLINE = {"softmax": "softmax attention (exponential and row normalisation)",
               "softplus": "softplus attention (smooth, not piecewise polynomial)"}


def degree_analysis(module: nn.Module, wrt: str = "both", layers: Optional[int] = None) -> Tuple[Optional[int], List[str]]:
    """``(bound, reasons)``: the degree bound of Lemma 3.2 / Theorem 3.3 for a module built from known
    parts, or ``None`` with the parts that make it no spline (softmax, softplus, LayerNorm, a step
    divided by a Y-dependent curvature). ``layers`` overrides an encoder's depth."""
    if isinstance(module, Attention):
        if module.activation_name != "relu":
            return None, [_NOT_SPLINE[module.activation_name]]
        return {"both": 3, "context": 2, "x": 1}[wrt], []
    if isinstance(module, SequenceClassifier):
        return degree_analysis(module.encoder, wrt, layers)
    if isinstance(module, (GuaranteedEncoder, FreeEncoder, TorchEncoder)):
        return _encoder_degree(module, layers)
    if isinstance(module, nn.LayerNorm):
        return None, ["LayerNorm (division by the standard deviation)"]
    if isinstance(module, (EncoderBlock, FreeLayer)):
        # out = h + ffn(h), h = x + attn(x) [then LayerNorm]: degree of attention times 1 (ReLU-linear ffn)
        parts = [module.attn] + [m for m in module.modules() if isinstance(m, nn.LayerNorm)]
        return _product(degree_analysis(m) for m in parts)
    if isinstance(module, nn.Sequential):
        return _product(degree_analysis(m) for m in module)
    if isinstance(module, (nn.Linear, nn.ReLU, nn.Identity, nn.Dropout)):
        return 1, []
    return None, [f"{type(module).__name__} (unknown to the degree accounting)"]


def _product(results: Iterable[Tuple[Optional[int], List[str]]]) -> Tuple[Optional[int], List[str]]:
    """Degrees multiply under composition (Lemma 3.2); one non-spline part makes the whole non-spline."""
    deg, reasons = 1, []
    for d, why in results:
        reasons += [r for r in why if r not in reasons]
        deg = None if (deg is None or d is None) else deg * d
    return (deg if not reasons else None), reasons


def _encoder_degree(enc: nn.Module, layers: Optional[int]) -> Tuple[Optional[int], List[str]]:
    T = enc.layers if layers is None else int(layers)
    if isinstance(enc, TorchEncoder):
        act = [] if enc.attention == "relu" else [_NOT_SPLINE[enc.attention]]
        return None, act + ["LayerNorm (torch.nn.TransformerEncoderLayer is post-LN)"]
    if isinstance(enc, FreeEncoder):
        return _product(degree_analysis(b) for b in list(enc.blocks)[:T])
    reasons = []
    if enc.rho.name != "relu":
        reasons.append(f"rho={enc.rho.spec()}: kernel rho' is not piecewise polynomial")
    if enc.curvature == "adaptive":
        reasons.append("each step divides by the weighted degree sum_v rho'(z_uv) (adaptive curvature): "
                       "a rational function of Y on every piece (curvature=constant removes it)")
    if enc.use_layernorm:
        reasons.append("LayerNorm rescaling term (division by ||y||)")
    # per step: Y - a grad E(Y) / c with c constant, grad = W W^T sum_v relu(c - z_uv)(y_u - y_v) + linear: cubic
    return (None, reasons) if reasons else (3 ** T, [])


def static_degree(module: nn.Module, wrt: str = "both", layers: Optional[int] = None) -> Optional[int]:
    """Degree bound of Lemma 3.2 / Theorem 3.3, or None (see `degree_analysis`)."""
    return degree_analysis(module, wrt, layers)[0]


# ------------------------------------------------------------------ the probe
class KinkTape:
    """Records sign patterns (``replay=None``) or replays given ones, one per ReLU call, in call order, through
    forward hooks on ``nn.ReLU`` modules (`run_taped`). Replaying applies ``where(pattern, x, 0)``: the
    map with its pieces frozen, linear at every kink."""

    def __init__(self, replay: Optional[Sequence[torch.Tensor]] = None):
        self.signs: List[torch.Tensor] = []
        self.replay = None if replay is None else list(replay)
        self.pos = 0
        #: every ReLU input seen was finite: an overflow inside the module (scores at inf, then NaN) can come out
        #: finite (a ReLU pattern that drops it, a row normalisation, a nan_to_num), and the tape is where it shows
        self.finite = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.finite and not bool(torch.isfinite(x).all()):
            self.finite = False
        if self.replay is None:
            self.signs.append((x > 0).reshape(-1).detach().cpu())
            return torch.relu(x)
        if self.pos >= len(self.replay) or self.replay[self.pos].numel() != x.numel():
            raise RuntimeError(f"kink tape out of step at ReLU call {self.pos}: the replayed map evaluates "
                               "different ReLUs than the recorded one")
        pattern = self.replay[self.pos].reshape(x.shape).to(x.device)
        self.pos += 1
        return torch.where(pattern, x, torch.zeros((), dtype=x.dtype, device=x.device))

    def hook(self, module, inputs, output):
        """Forward hook for ``nn.ReLU``: the module's output goes through the tape."""
        return self(inputs[0])

    def pattern(self) -> torch.Tensor:
        """All recorded signs, concatenated (empty when no ReLU ran)."""
        return torch.cat(self.signs) if self.signs else torch.zeros(0, dtype=torch.bool)


def run_taped(module: nn.Module, fn: Callable[[], torch.Tensor], replay=None) -> Tuple[torch.Tensor, KinkTape]:
    """``(fn(), tape)`` with every ReLU that ``fn`` evaluates through an ``nn.ReLU`` module of ``module`` on one
    `KinkTape` (forward hooks): the ReLUs of feed-forward blocks and ReLU attention, and the library's
    own kinks, which are modules too: the ReLU kernel of rho = relu:C (``ReluRho.kink``) and the ReLU prox of the
    MM steps (``NonNegativity.project``). ``replay``: freeze the pieces to those patterns instead of recording.
    Functional ``F.relu`` calls are invisible to the tape. The hooks live only while ``fn`` runs."""
    tp = KinkTape(replay)
    hooks = [m.register_forward_hook(tp.hook) for m in module.modules() if isinstance(m, nn.ReLU)]
    try:
        with torch.no_grad():
            out = fn()
    finally:
        for h in hooks:
            h.remove()
    return out, tp


def relu_pattern(module: nn.Module, fn: Callable[[], torch.Tensor]):
    """``(output, pattern)``: ``fn()`` and the concatenated signs (> 0) of every ReLU input (`run_taped`)."""
    out, tp = run_taped(module, fn)
    return out, tp.pattern()


def _cheb_fit(ts: np.ndarray, ys: np.ndarray, a: float, b: float, degree: int):
    x = (2 * ts - (a + b)) / (b - a)
    coef = np.polynomial.chebyshev.chebfit(x, ys, degree)
    resid = np.abs(np.polynomial.chebyshev.chebval(x, coef).T - ys).max()
    return coef, float(resid)


def _slope(coef: np.ndarray, t: float, t_max: float) -> np.ndarray:
    """Derivative in t of a Chebyshev fit on [-t_max, t_max]."""
    return np.polynomial.chebyshev.chebval(t / t_max, np.polynomial.chebyshev.chebder(coef)) / t_max


#: the largest polynomial degree the probe fits (a static bound above it is capped, as in `probe_model`)
MAX_DEGREE = 100


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


#: the range of ``tol``, a fit's largest residual relative to the output scale: below float64 round-off
#: (about 1e-15) an exact polynomial fails; above 1e-6 smooth maps pass (softplus attention, at the default
#: ``t_max``, fits degree 8 within 1e-4)
TOL_RANGE = (1e-14, 1e-6)


#: the largest ``t_max`` of `probe`: the ray's length ``2 t_max`` (the fit's interval) is finite in float64
T_MAX_LIMIT = float(np.finfo(np.float64).max) / 2

#: ``--t-max`` of the command line, whose rays are ``X0 + t D`` with X0 and D of one scale (unit Gaussians for
#: ``--attention``, D at X0's rms for models): below float64's eps, ``X0 + t D`` rounds to X0 (the ray does not
#: move); above sqrt(float64 max), ``|t D|^2`` -- the squared distance that every attention score and energy
#: forms -- is not finite
CLI_T_MAX_RANGE = (float(np.finfo(np.float64).eps), math.sqrt(float(np.finfo(np.float64).max)))

#: the most tokens (``--n``) and layers (``--layers``) of a command-line probe: the ReLU pattern of n tokens can
#: change at O(n^2) points of the ray, each located by 40 evaluations, and every evaluation runs every layer
CLI_MAX_TOKENS, CLI_MAX_LAYERS = 256, 64


class NonFiniteSample(ConfigError):
    """A sample of the probed map is not finite -- its output, or the input of a ReLU inside it (an overflow that
    a later step may hide): no verdict is computed from it."""


def check_probe_options(t_max=3.0, grid=1025, max_degree=12, tol=1e-9) -> None:
    """The probe's options in range, else a [`ConfigError`][energies.ConfigError] naming the option and the value: ``t_max``
    finite in ``(0, T_MAX_LIMIT]`` (the ray is ``[-t_max, t_max]``), ``grid`` an integer >= 2, ``max_degree`` an integer in
    ``[0, MAX_DEGREE]``, ``tol`` in `TOL_RANGE`."""
    if not (_is_real(t_max) and 0 < t_max <= T_MAX_LIMIT):
        raise ConfigError(f"t_max must be a finite number in (0, {T_MAX_LIMIT:.6g}] (the ray [-t_max, t_max] must have a "
                          f"finite length in float64), got {t_max!r}")
    if not (_is_int(grid) and grid >= 2):
        raise ConfigError(f"grid must be an integer >= 2, got {grid!r}")
    if not (_is_int(max_degree) and 0 <= max_degree <= MAX_DEGREE):
        raise ConfigError(f"max_degree must be an integer in [0, {MAX_DEGREE}], got {max_degree!r}")
    if not (_is_real(tol) and TOL_RANGE[0] <= tol <= TOL_RANGE[1]):
        raise ConfigError(f"tol must be a number in [{TOL_RANGE[0]:g}, {TOL_RANGE[1]:g}] (a residual relative to "
                          f"the output scale), got {tol!r}")


def _sampler(f: Callable[[float], torch.Tensor], module: nn.Module, t_max: float):
    """``at(t, replay=None) -> (output as float64 numpy, tape)``, refusing a non-finite sample (NonFiniteSample)."""
    def at(t: float, replay=None):
        out, tp = run_taped(module, lambda: f(t), replay)
        y = out.detach().reshape(-1).double().cpu().numpy()
        if not np.isfinite(y).all() or not tp.finite:  # overflow (a far point of the ray): evidence of nothing
            where = "the output" if not np.isfinite(y).all() else "a ReLU input inside the module"
            frozen = " of a piece's frozen map" if replay is not None else ""
            raise NonFiniteSample(f"{where}{frozen} is not finite at t = {t:.6g} (float64 overflow): no verdict; "
                                  f"lower t_max={t_max!r}")
        return y, tp
    return at


def _breakpoints(at, ts: np.ndarray, pats: List[torch.Tensor]) -> List[float]:
    """Every t where the ReLU pattern changes, left to right, each located by 40 bisection steps."""
    breaks: List[float] = []
    for i in range(len(ts) - 1):
        lo, hi, p_lo, p_hi = float(ts[i]), float(ts[i + 1]), pats[i], pats[i + 1]
        while not torch.equal(p_lo, p_hi):      # every change inside (lo, hi), left to right
            a, b = lo, hi
            for _ in range(40):
                mid = 0.5 * (a + b)
                if torch.equal(at(mid)[1].pattern(), p_lo):
                    a = mid
                else:
                    b = mid
            breaks.append(0.5 * (a + b))
            lo, p_lo = b, at(b)[1].pattern()
            if b >= hi:
                break
    return breaks


def _fit_piece(at, a: float, b: float, nodes: np.ndarray, scale: float, t_max: float, max_degree: int,
               tol: float) -> Tuple[dict, Optional[tuple]]:
    """``(piece record, (degree, coefficients) or None)``: the lowest degree fitting the piece's frozen map."""
    mid = 0.5 * (a + b)
    y_mid, tp = at(mid)
    consistent = float(np.abs(at(mid, replay=tp.signs)[0] - y_mid).max()) <= 1e-12 * scale
    try:
        ys = np.stack([at(float(t), replay=tp.signs)[0] for t in nodes])
    except NonFiniteSample:
        raise
    except UnfoldError as exc:   # e.g. a frozen curvature that reaches 0: a pole, so no polynomial
        ys, undefined = None, str(exc)
    best, resid = None, math.inf
    if consistent and ys is not None and np.isfinite(ys).all():
        fscale = max(scale, float(np.abs(ys).max()))
        for k in range(max_degree + 1):
            coef, r = _cheb_fit(nodes, ys, -t_max, t_max, k)
            resid = r / fscale
            if resid <= tol:
                best = (k, coef)
                break
    piece = {"interval": [a, b], "degree": best[0] if best else None, "residual": resid}
    if not consistent:
        piece["frozen_map_differs"] = True
    if ys is None:
        piece["frozen_map_undefined"] = undefined
    return piece, best


def _fit_pieces(at, breaks: List[float], scale: float, t_max: float, max_degree: int, tol: float):
    """``(pieces, worst residual, degree or None, fits)`` over the pieces between the breakpoints."""
    edges = [-t_max] + breaks + [t_max]
    m = max_degree + 8
    nodes = t_max * np.cos(np.pi * (np.arange(m) + 0.5) / m)
    pieces, worst, degree, fits = [], 0.0, 0, []
    for a, b in zip(edges[:-1], edges[1:]):
        if b - a < 1e-12 * t_max:
            continue
        piece, best = _fit_piece(at, a, b, nodes, scale, t_max, max_degree, tol)
        pieces.append(piece)
        worst = max(worst, piece["residual"])
        degree = None if (degree is None or best is None) else max(degree, best[0])
        fits.append(best[1] if best else None)
    return pieces, worst, degree, fits


def _jumps(at, breaks: List[float], fits: list, scale: float, t_max: float) -> Tuple[List[float], List[float]]:
    """``(continuity gaps, slope jumps)`` at the breakpoints, relative to the output scale."""
    gaps, slope_jumps = [], []
    eps = 1e-9 * t_max
    for b in breaks:
        gaps.append(float(np.abs(at(b + eps)[0] - at(b - eps)[0]).max()) / scale)
    for b, left, right in zip(breaks, fits[:-1], fits[1:]):
        if left is not None and right is not None:
            slope_jumps.append(float(np.abs(_slope(left, b, t_max) - _slope(right, b, t_max)).max()) / scale)
    return gaps, slope_jumps


def probe(f: Callable[[float], torch.Tensor], module: nn.Module, t_max: float = 3.0, grid: int = 1025,
          max_degree: int = 12, tol: float = 1e-9) -> dict:
    """Probe ``t -> f(t)`` on ``[-t_max, t_max]`` (``f`` evaluates the module in float64; see the
    module docstring). Returns pieces, breakpoints, fitted degrees, residuals, gaps and a verdict.

    Each piece is tested through its frozen map (every ReLU replaced by the fixed 0/1 pattern it has
    on the piece, `KinkTape`), which equals f on the piece and is defined on the whole
    ray: for a spline it is one polynomial there, so the fit is made on ``[-t_max, t_max]``, not only
    on the piece. (A smooth non-polynomial map is fitted by a low degree on a short enough interval;
    on the whole ray it is not, and that is what separates softmax from ReLU here.)

    Checked ([`ConfigError`][energies.ConfigError], `check_probe_options`): the options; a sample that is not finite
    anywhere on the ray -- the output, the input of any ReLU inside the module (an overflow that a later step
    may turn into a finite 0), or a piece's frozen map at a fit node -- gives no verdict but an error
    (`NonFiniteSample`). The verdict is only as
    good as the ray is long: on a short ray (``t_max`` well below the scale on which the map bends, e.g.
    0.5 for softmax attention at ``tol=1e-9``) a smooth map is fitted by a polynomial too."""
    check_probe_options(t_max=t_max, grid=grid, max_degree=max_degree, tol=tol)
    at = _sampler(f, module, t_max)
    ts = np.linspace(-t_max, t_max, grid)
    if not (np.diff(ts) > 0).all():       # subnormal t_max: grid points coincide, the samples repeat one point
        raise ConfigError(f"t_max={t_max!r} is too small: the {grid} grid points of [-t_max, t_max] are not distinct "
                          "in float64")
    samples = [at(float(t)) for t in ts]
    pats = [tp.pattern() for _, tp in samples]
    scale = max(max(float(np.abs(y).max()) for y, _ in samples), 1e-300)
    breaks = _breakpoints(at, ts, pats)
    pieces, worst, degree, fits = _fit_pieces(at, breaks, scale, t_max, max_degree, tol)
    gaps, slope_jumps = _jumps(at, breaks, fits, scale, t_max)
    eps = 1e-9 * t_max
    continuous = all(g <= max(1e3 * eps / t_max, tol) for g in gaps)
    verdict = "spline" if degree is not None and continuous else "non-spline"
    return {"verdict": verdict, "degree": degree, "pieces": len(pieces), "breakpoints": len(breaks),
            "max_residual": worst, "max_continuity_gap": max(gaps, default=0.0),
            "max_slope_jump": max(slope_jumps, default=0.0), "max_degree_tried": max_degree, "tol": tol,
            "piece_detail": pieces[:50]}


def check_ray(X0: torch.Tensor, D: torch.Tensor, t_max: float, grid: int = 1025) -> None:
    """The ray ``X0 + t D`` must move in float64 at the probe's resolution: one grid step ``2 t_max / (grid - 1)``
    along D must change some entry of X0; else (a ``t_max`` so small that ``X0 + t D`` rounds to X0) every sample
    is one point, the map looks constant whatever it is, and a [`ConfigError`][energies.ConfigError] naming ``t_max`` is raised
    instead of the verdict "degree 0"."""
    check_probe_options(t_max=t_max, grid=grid)
    step = 2.0 * t_max / (grid - 1)
    if not bool(((X0 + step * D) != X0).any()):
        scale = float(X0.abs().max()) / max(float(D.abs().max()), 1e-300)
        raise ConfigError(f"t_max={t_max!r} is too short for float64: a grid step of {step:.3g} along the ray does not "
                          f"change its start point (X0 + t D rounds to X0), so every sample would be the same point; "
                          f"use t_max >= {scale * np.finfo(np.float64).eps * (grid - 1):.3g}")


def probe_attention(activation: str = "relu", n: int = 6, d: int = 4, heads: int = 1, causal: bool = False,
                    cross: Optional[str] = None, seed: int = 0, **kw) -> dict:
    """Probe one standard attention module with random weights along a random ray (float64).
    ``cross``: None (self-attention), or which input of encoder-decoder attention moves: ``context``,
    ``x`` or ``both``."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    att = Attention(d, heads, activation, causal=causal).double()
    X0, D = (torch.randn(1, n, d, dtype=torch.float64, generator=gen) for _ in range(2))
    C0, DC = (torch.randn(1, n + 1, d, dtype=torch.float64, generator=gen) for _ in range(2))
    t_max, grid = kw.get("t_max", 3.0), kw.get("grid", 1025)
    if cross is None:
        check_ray(X0, D, t_max, grid)
        f = lambda t: att(X0 + t * D)  # noqa: E731
    else:
        mx, mc = cross in ("x", "both"), cross in ("context", "both")
        check_ray(*((torch.cat([X0.flatten(), C0.flatten()]), torch.cat([D.flatten(), DC.flatten()])) if mx and mc
                    else (X0, D) if mx else (C0, DC)), t_max, grid)
        f = lambda t: att(X0 + (t * D if mx else 0), context=C0 + (t * DC if mc else 0))  # noqa: E731
    out = probe(f, att, **kw)
    out["static_degree_bound"] = static_degree(att, cross or "both")
    out["module"] = f"attention({activation}{', causal' if causal else ''}{', cross wrt ' + cross if cross else ''})"
    return out


def load_model(config: Optional[str] = None, checkpoint: Optional[str] = None, overrides: Iterable[str] = (),
               vocab_size: int = 1000, num_classes: int = 2) -> SequenceClassifier:
    """A model from a config file (random weights) or a training checkpoint (``best.pt``, whose config
    it holds; ``config`` then overrides nothing), in float64 and eval mode. A checkpoint is read with
    `experiments.app.checkpoint.safe_load` and checked by `checkpoint_model`."""
    from ..app.config import load_config
    from ..app.build import build_model

    if checkpoint is not None:
        model = checkpoint_model(checkpoint)
    else:
        cfg = load_config(config, overrides)
        model = build_model(cfg, vocab_size, num_classes)
    return model.double().eval()



def checkpoint_model(path: str) -> SequenceClassifier:
    """The model a checkpoint holds, checked, else a [`CheckpointError`][energies.CheckpointError] naming the file: a dict with a
    ``config`` (valid once the keys it lacks take their defaults, `experiments.app.config.validate`) and a
    ``model`` state dict (names -> tensors) with 2-D ``embedding.embed.weight`` (``embed.weight`` in checkpoints
    written before the encoders were modules: their keys are upgraded) and ``head.weight``, every floating
    weight finite (a NaN weight makes every output NaN: nothing to probe), and the weights fit the model the
    config describes."""
    from ..app.checkpoint import safe_load
    from ..app.config import validate, with_defaults
    from ..app.build import build_model

    state = safe_load(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a model checkpoint (best.pt: a dict "
                              "with 'config' and 'model')")
    missing = [k for k in ("config", "model") if k not in state]
    if missing:
        raise CheckpointError(f"{path} has no {missing}: not a model checkpoint (best.pt); keys found: "
                              f"{sorted(map(str, state))[:12]}")
    if not isinstance(state["config"], dict):
        raise CheckpointError(f"{path}: 'config' must be a dict, got a {type(state['config']).__name__}")
    weights = state["model"]
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in weights.items()):
        raise CheckpointError(f"{path}: 'model' must be a state dict (parameter name -> tensor), got a "
                              f"{type(weights).__name__} holding other values")
    weights = upgrade_state_dict(dict(weights))
    for key in ("embedding.embed.weight", "head.weight"):
        if key not in weights or weights[key].ndim != 2 or min(weights[key].shape) < 1:
            raise CheckpointError(f"{path}: 'model' needs a non-empty 2-D {key!r} ({key.split('.', 1)[-1]!r} in "
                                  "checkpoints of earlier versions), got "
                                  f"{tuple(weights[key].shape) if key in weights else 'none'}")
    bad = [k for k, v in weights.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"{path}: weights {bad[:3]} hold NaN or Inf; every output would be NaN")
    try:
        cfg = validate(with_defaults(state["config"]))   # keys added since it was written: defaults
    except ConfigError as exc:
        raise CheckpointError(f"{path}: its config is not valid ({exc})") from None
    emb = weights["embedding.embed.weight"]   # GloVe-initialised embeddings set their own width (50)
    try:
        model = build_model(cfg, emb.shape[0], weights["head.weight"].shape[0],
                            glove=torch.zeros_like(emb) if cfg["data"]["glove"] != "none" else None)
        model.load_state_dict(weights)
    except (RuntimeError, ValueError) as exc:   # missing / unexpected keys, shapes; UnfoldError is a ValueError
        raise CheckpointError(f"{path}: its weights do not fit the model its config describes "
                              f"({one_line(exc)[:300]})") from None
    return model


def probe_model(model: SequenceClassifier, n: int = 6, seed: int = 0, layers: Optional[int] = None,
                ids: Optional[torch.Tensor] = None, **kw) -> dict:
    """Probe a model's encoder (embedded tokens X -> Y_T) along
    the ray ``X0 + t D``: X0 the embeddings of n random tokens, D Gaussian at X0's scale. The embedding,
    pooling and head are outside the probed map (the paper's section 1.11). ``max_degree`` defaults to
    the static bound where there is one (at most 100), else 12. ``ids`` ``(n,)``: start the ray at these
    tokens (a real sentence) instead of n random ones: a trained ReLU kernel max(C - z, 0) can be
    zero for every pair of random tokens, and the layer then piecewise linear on that ray."""
    gen = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    if ids is None:
        ids = torch.randint(1, model.embedding.embed.num_embeddings, (1, n), generator=gen)
    else:
        ids = torch.as_tensor(ids).reshape(1, -1)
        n = ids.shape[1]
    mask = torch.ones(1, n, dtype=torch.bool)
    enc = model.encoder
    graph = enc.token_graph(mask)
    with torch.no_grad():
        X0 = graph.zero_padded(model.embedding(ids))
    D = torch.randn(X0.shape, dtype=torch.float64, generator=gen) * X0.pow(2).mean().sqrt()
    check_ray(X0[mask], D[mask], kw.get("t_max", 3.0), kw.get("grid", 1025))
    bound, reasons = degree_analysis(model, layers=layers)
    if "max_degree" not in kw:
        kw["max_degree"] = min(bound, 100) if bound is not None else 12
    unroll = {"layers" if enc.weight_shared else "first_layers": layers}   # an untied stack: its first layers
    out = probe(lambda t: enc(X0 + t * D, mask, graph=graph, **unroll).Y, model, **kw)
    depth = enc.layers if layers is None else int(layers)
    out.update(static_degree_bound=bound, non_spline_parts=reasons,
               module=f"{enc.kind} model, {depth} layers" + (
                   f", rho={enc.rho.spec()}, curvature={enc.curvature}" if isinstance(enc, GuaranteedEncoder) else
                   f", attention={enc.attention}, norm={getattr(enc, 'norm', 'post')}"))
    return out


PROG = "python -m experiments.studies.spline_probe"


def _degree_arg(text: str) -> int:
    """argparse ``type=``: a polynomial degree, an integer in ``[0, MAX_DEGREE]``."""
    value = nonnegative_int(text)
    if value > MAX_DEGREE:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer in [0, {MAX_DEGREE}]")
    return value


def _t_max_arg(text: str) -> float:
    """argparse ``type=``: a ray half-length in `CLI_T_MAX_RANGE` (derived from float64's range)."""
    value = positive_float(text)
    lo, hi = CLI_T_MAX_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number in [{lo:.3g}, {hi:.3g}]: below, float64 rounds X0 + t D to X0 (the ray does "
            f"not move); above, t_max^2 -- the squared distances along the ray -- is not finite in float64")
    return value


def _bounded_int(limit: int, why: str):
    def convert(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"{text!r} must be an integer in [1, {limit}] ({why})")
        return value
    return convert


def _tol_arg(text: str) -> float:
    """argparse ``type=``: a relative residual in `TOL_RANGE`."""
    value = finite_float(text)
    if not TOL_RANGE[0] <= value <= TOL_RANGE[1]:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number in [{TOL_RANGE[0]:g}, {TOL_RANGE[1]:g}] "
                                         "(between float64 round-off and a fit that lets smooth maps pass)")
    return value


def _parser() -> argparse.ArgumentParser:
    """The command line's parser (module docstring)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--attention", choices=["softmax", "relu", "softplus"], help="one standard attention module")
    src.add_argument("--config", help="a model config (random weights), e.g. experiments/configs/default.yaml")
    src.add_argument("--checkpoint", help="a trained model: runs/NAME/best.pt")
    p.add_argument("--causal", action="store_true", help="causal self-attention (with --attention)")
    p.add_argument("--cross", choices=["context", "x", "both"],
                   help="probe encoder-decoder attention (with --attention)")
    p.add_argument("--layers", type=_bounded_int(CLI_MAX_LAYERS, "every evaluation of the probe runs every layer"),
                   help=f"unroll this many layers, at most {CLI_MAX_LAYERS} (model probes; untied modes: at most the "
                        "model's own)")
    p.add_argument("--n", type=_bounded_int(CLI_MAX_TOKENS, "the pieces along the ray grow as n^2"), default=6,
                   help=f"tokens, at most {CLI_MAX_TOKENS}")
    p.add_argument("--max-degree", type=_degree_arg, help=f"in [0, {MAX_DEGREE}]; default 12 (modules) or the "
                                                          "static bound (models)")
    p.add_argument("--tol", type=_tol_arg, default=1e-9,
                   help=f"largest relative residual of a fit, in [{TOL_RANGE[0]:g}, {TOL_RANGE[1]:g}]")
    p.add_argument("--t-max", type=_t_max_arg, default=3.0,
                   help=f"the ray is t in [-T_MAX, T_MAX], T_MAX in [{CLI_T_MAX_RANGE[0]:.3g}, {CLI_T_MAX_RANGE[1]:.3g}] "
                        "(float64's eps and the square root of its largest number); a short ray lets smooth maps "
                        "pass as polynomials")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true", help="only the JSON line")
    p.add_argument("overrides", nargs="*", help="section.key=value config overrides (with --config)")
    return p


def _report(out: dict, as_json: bool) -> None:
    """Print the verdict line and what makes the map no spline (unless ``as_json``), then the JSON line."""
    if not as_json:
        print(f"{out['module']}: {out['verdict']}, degree {out['degree']}, static bound "
              f"{out['static_degree_bound']}, {out['pieces']} pieces, max residual {out['max_residual']:.2e}, "
              f"continuity gap {out['max_continuity_gap']:.2e}, slope jump {out['max_slope_jump']:.2e}")
        for why in out.get("non_spline_parts", []) + ([out["non_finite"]] if "non_finite" in out else []):
            print(f"  not a spline: {why}")
    out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
    print(json_dumps({k: v for k, v in out.items() if k != "piece_detail"}))


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.overrides and args.config is None:
        p.error(f"config overrides {args.overrides[:3]} need --config")
    if args.attention is None and (args.causal or args.cross):
        p.error("argument --causal/--cross: probe one attention module, only with --attention")
    if args.attention is not None and args.layers is not None:
        p.error("argument --layers: unrolls a model (--config, --checkpoint), not one --attention module")
    kw = dict(tol=args.tol, t_max=args.t_max)
    if args.max_degree is not None:
        kw["max_degree"] = args.max_degree

    def body() -> int:
        if args.attention:
            out = probe_attention(args.attention, n=args.n, causal=args.causal, cross=args.cross, seed=args.seed, **kw)
        else:
            model = load_model(args.config, args.checkpoint, args.overrides)
            out = probe_model(model, n=args.n, seed=args.seed, layers=args.layers, **kw)
        _report(out, args.json)
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
