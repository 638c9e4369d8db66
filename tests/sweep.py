"""The verdict sweep: one exact attention MM step on every kernel, at token scales, temperatures, shapes,
graphs, rhos, step sizes and anchors chosen adversarially (issue: "descent verdicts you can trust").

For one configuration :func:`run_case` measures

* ``disagreement``: per kernel, ``max_ui (|Y1_k - Y1_edges| - 2 eps max(|Y1_k|, |Y1_edges|))_+ / max |Y1_edges - Y0|``:
  the step of every kernel against the edge list (explicit differences), relative to the step's size, once
  the rounding of Y1 itself (one ulp in each result) is allowed for;
* ``increases``: per kernel, the failed checks of :func:`unfold.trace.trace_descent` over ``LAYERS`` layers
  (an exact step must never be flagged: no false alarm);
* ``mp_rise``: with n <= ``MP_MAX_N``, ``(E(Y1) - E(Y0)) / tol`` of the edge kernel's computed step, both energies
  in 50-digit arithmetic (``tests/precision.py``), ``tol`` the rule's tolerance: <= 1 means the computed
  step did not raise E beyond the stated tolerance, exactly evaluated.

``python tests/sweep.py`` runs the whole grid and prints the largest numbers measured.
"""
import itertools
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import energies as E  # noqa: E402
import unfold as U  # noqa: E402
from precision import energy_mp  # noqa: E402
from matrix import rho_specs  # noqa: E402

SCALES = {torch.float64: [1e-6, 1e-3, 1.0, 1e3, 1e5], torch.float32: [1e-3, 1.0, 1e3]}
TAUS = [0.05, 1.0, 10.0]
SHAPES = [(1, 1, "complete"), (2, 1, "complete"), (2, 3, "complete"), (5, 2, "complete"), (9, 4, "complete"),
          (7, 3, "random:0.5"), (7, 2, "star"), (6, 2, "window:1")]
RHOS = rho_specs("kernels")  # drawn from the registry (tests/matrix.py)
ALPHAS = [0.37, 1.0]
LAYERS = 3
MP_MAX_N = 5
#: kernel agreement bound relative to the step's size, per dtype (measured maxima in the README)
AGREE = {torch.float64: 1e-7, torch.float32: 2e-3}


def tokens(n, d, scale, dtype, near_dup, seed):
    """``(1, n, d)`` tokens of the given scale; ``near_dup``: half of them (at least 2) within 1e-4 x scale of
    token 0, the case where the expansion |a|^2 + |b|^2 - 2 a.b loses z."""
    gen = torch.Generator().manual_seed(seed)
    Y = scale * torch.randn(1, n, d, dtype=torch.float64, generator=gen)
    if near_dup and n >= 2:
        k = max(2, n // 2)
        Y[0, 1:k] = Y[0, :1] + 1e-4 * scale * torch.randn(k - 1, d, dtype=torch.float64, generator=gen)
    return Y.to(dtype)


def kernels(graph, rho):
    ks = ["edges"]
    if graph.is_complete:
        ks += ["dense", "streamed"] + (["softmax", "fused"] if rho == "exp" else [])
    return ks


def run_case(dtype, scale, tau, n, d, spec, rho, alpha, with_b, near_dup, seed=0, mp=True):
    Y = tokens(n, d, scale, dtype, near_dup, seed)
    graph = E.graph_from_spec(spec, n, batch_size=1, seed=seed)
    B = Y[0].clone() if with_b else None
    eps = torch.finfo(dtype).eps
    out = {"disagreement": {}, "increases": {}, "nonfinite": {}, "mp_rise": None}
    steps = {}
    for k in kernels(graph, rho):
        step = U.AttentionStep(rho, tau=tau, alpha=alpha, B=B, kernel=k)
        steps[k] = step(Y, graph)
        _, rep = U.trace_descent(step, Y, graph, layers=LAYERS)
        out["increases"][k] = rep.num_increases
        out["nonfinite"][k] = rep.num_nonfinite
        if k == "edges":
            tol0 = float(rep.tol[0, 0])
    ref = steps["edges"]
    size = max(float((ref - Y).abs().max()), 1e-300)
    for k, Y1 in steps.items():
        excess = (Y1 - ref).abs() - 2 * eps * torch.maximum(Y1.abs(), ref.abs())
        out["disagreement"][k] = float(excess.clamp_min(0).max()) / size
    if mp and n <= MP_MAX_N:
        edges = [tuple(e) for e in graph.edges().T.tolist()]
        b = None if B is None else B.tolist()
        rise = energy_mp(ref[0].tolist(), edges, rho, tau, b) - energy_mp(Y[0].tolist(), edges, rho, tau, b)
        out["mp_rise"] = float(rise) / tol0 if tol0 > 0 else (math.inf if rise > 0 else 0.0)
    return out


def grid():
    for dtype, scales in SCALES.items():
        for scale, tau, (n, d, spec), rho, alpha, with_b, near in itertools.product(
                scales, TAUS, SHAPES, RHOS, ALPHAS, (False, True), (False, True)):
            yield dtype, scale, tau, n, d, spec, rho, alpha, with_b, near


def main():
    worst = {}
    cases = bad = 0
    for case in grid():
        r = run_case(*case)
        cases += 1
        dt = str(case[0]).replace("torch.", "")
        for k, v in r["disagreement"].items():
            key = (dt, k)
            if v > worst.get(key, (0.0, None))[0]:
                worst[key] = (v, case)
        if any(r["increases"].values()) or (r["mp_rise"] is not None and r["mp_rise"] > 1.0):
            bad += 1
            print("FAILED", case, r)
        if r["mp_rise"] is not None and r["mp_rise"] > worst.get((dt, "mp_rise"), (-math.inf, None))[0]:
            worst[(dt, "mp_rise")] = (r["mp_rise"], case)
    print(f"{cases} cases, {bad} with an increase or a confirmed rise")
    for key, (v, case) in sorted(worst.items()):
        print(f"{key[0]:8s} {key[1]:9s} max {v:.3e}  at {case[1:]}")


if __name__ == "__main__":
    main()
