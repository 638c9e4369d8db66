"""Energy-descent sweep: ``python -m experiments.studies.descent [--out DIR] [--quick]``.

For every graph builder x every penalty rho x alpha, unroll exact attention MM steps (and the
``printed`` eq. 38 variant as the negative control) on seeded random token matrices in float64,
trace the energy at every layer, and write

* ``DIR/summary.json``: one record per configuration (steps, increases, max relative increase),
  plus totals, the last line printed is the same totals as JSON;
* ``DIR/summary.md``: the same as a table;
* ``DIR/descent.png``: mean normalised energy per layer for every graph (exact steps, rho = exp);
* ``DIR/negative_control.png``: the printed update on a random graph, increases marked.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from energies.graphs import graph_from_spec
from experiments.data import output_folder_arg
from unfold.cli import positive_int, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.steps import AttentionStep
from unfold.trace import trace_descent
from unfold.strict_json import dumps as json_dumps

GRAPHS = ["complete", "window:2", "strided:4", "dilated:2:3", "star", "random:0.3"]
RHOS = ["exp", "relu:1", "cauchy", "lp:1"]
ALPHAS = [1.0, 0.5]


def sweep(samples: int, layers: int, n: int, d: int, seed: int):
    records, reports = [], {}
    gen = torch.Generator().manual_seed(seed)
    for graph_spec in GRAPHS:
        g = graph_from_spec(graph_spec, n, batch_size=samples, seed=seed)
        Y = torch.randn(samples, n, d, dtype=torch.float64, generator=gen)
        for rho in RHOS:
            for alpha in ALPHAS:
                for update in ("exact", "printed"):
                    step = AttentionStep(rho, tau=math.sqrt(d), alpha=alpha, update=update)
                    _, rep = trace_descent(step, Y, g, layers=layers)
                    records.append({"graph": g.name, "rho": step.rho.spec(), "alpha": alpha, "update": update,
                                    "steps": rep.steps, "increases": rep.num_increases,
                                    "max_rel_increase": rep.max_rel_increase(),
                                    "rel_decrease": float(((rep.totals[:, 0] - rep.totals[:, -1])
                                                           / rep.totals[:, 0].abs()).mean())})
                    reports[(g.name, rho, alpha, update)] = rep
    return records, reports


def negative_control(samples: int, layers: int, seed: int):
    """The printed update where it is known to fail: small d, random sparse graph, small tokens."""
    g = graph_from_spec("random:0.3", 32, batch_size=samples, seed=seed)
    Y = 0.5 * torch.randn(samples, 32, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    _, printed = trace_descent(AttentionStep("exp", 2.0, 1.0, update="printed"), Y, g, layers=layers)
    _, exact = trace_descent(AttentionStep("exp", 2.0, 1.0), Y, g, layers=layers)
    return printed, exact


def plot_sweep(reports, path: str, layers: int) -> None:
    from unfold.plot import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for graph_spec in GRAPHS:
        name = next(k[0] for k in reports if k[0].split(":")[0] == graph_spec.split(":")[0])
        rep = reports[(name, "exp", 1.0, "exact")]
        tot = rep.totals
        gap = (tot - tot[:, -1:]) / tot[:, :1].abs()  # distance to the last layer, relative to |E_0|
        axes[0].plot(range(layers + 1), (tot / tot[:, :1].abs()).mean(0).numpy(), marker="o", ms=3, label=name)
        axes[1].semilogy(range(layers), gap[:, :-1].mean(0).clamp_min(1e-16).numpy(), marker="o", ms=3, label=name)
    axes[0].set(xlabel="layer t", ylabel="E(Y_t) / |E(Y_0)|  (mean over examples)",
                title="exact attention MM steps, rho = exp, alpha = 1")
    axes[1].set(xlabel="layer t", ylabel="(E(Y_t) - E(Y_T)) / |E(Y_0)|",
                title="distance to the last layer's energy")
    for ax in axes:
        ax.legend(fontsize=8)
    save_figure(fig, path)


def write_markdown(records, totals, path: str) -> None:
    lines = ["| graph | rho | alpha | update | steps | increases | max rel. increase | mean rel. decrease |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['graph']} | {r['rho']} | {r['alpha']:g} | {r['update']} | {r['steps']} | "
                     f"{r['increases']} | {r['max_rel_increase']:.2e} | {r['rel_decrease']:.3f} |")
    lines += ["", "```", json_dumps(totals, indent=1), "```"]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


PROG = "python -m experiments.studies.descent"


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2). The
    output folder is checked before the sweep and created after it: a failed sweep writes nothing."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--out", type=output_folder_arg, default="runs/descent", help="output folder (default runs/descent)")
    p.add_argument("--samples", type=positive_int, default=16, help="random token matrices per graph")
    p.add_argument("--layers", type=positive_int, default=12, help="MM steps unrolled")
    p.add_argument("--n", type=_tokens_arg, default=32, help=f"tokens per matrix, >= {MIN_TOKENS}")
    p.add_argument("--d", type=positive_int, default=16, help="token width")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--quick", action="store_true", help="4 samples, 4 layers, n = 12")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.layers, args.n = 4, 4, 12
    return run_main(PROG, lambda: _run(args), argv)


#: fewest tokens of a sweep: attention relates pairs of tokens, one token has none (0 increases would say nothing)
MIN_TOKENS = 2


def _tokens_arg(text: str) -> int:
    """argparse ``type=``: a token count, an integer >= `MIN_TOKENS`."""
    n = positive_int(text)
    if n < MIN_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= {MIN_TOKENS} (attention relates pairs of "
                                         "tokens)")
    return n


def _run(args) -> int:
    t0 = time.perf_counter()
    records, reports = sweep(args.samples, args.layers, args.n, args.d, args.seed)
    printed, exact = negative_control(max(args.samples, 16) * 4, max(args.layers, 10), args.seed)
    from unfold.plot import plot_report

    os.makedirs(args.out, exist_ok=True)
    plot_sweep(reports, os.path.join(args.out, "descent.png"), args.layers)
    plot_report(printed, os.path.join(args.out, "negative_control.png"),
                title="negative control: printed eq. 38 update, random:0.3 graph, n=32, d=4 (red x: increases)")
    ex = [r for r in records if r["update"] == "exact"]
    pr = [r for r in records if r["update"] == "printed"]
    totals = {
        "exact_steps": sum(r["steps"] for r in ex), "exact_increases": sum(r["increases"] for r in ex),
        "printed_steps": sum(r["steps"] for r in pr), "printed_increases": sum(r["increases"] for r in pr),
        "negative_control": {"printed_steps": printed.steps, "printed_increases": printed.num_increases,
                             "printed_max_rel_increase": printed.max_rel_increase(),
                             "exact_steps": exact.steps, "exact_increases": exact.num_increases},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        fh.write(json_dumps({"records": records, "totals": totals}, indent=1))
    write_markdown(records, totals, os.path.join(args.out, "summary.md"))
    print(f"exact MM steps: {totals['exact_increases']} increases in {totals['exact_steps']} layer-steps "
          f"({len(GRAPHS)} graphs x {len(RHOS)} rho x {len(ALPHAS)} alpha)")
    print(f"printed eq. 38 (negative control): {totals['printed_increases']} increases in the sweep, "
          f"{printed.num_increases} in {printed.steps} steps on random:0.3 with d=4 "
          f"(max relative increase {printed.max_rel_increase():.2e})")
    print(f"wrote {args.out}/summary.json, summary.md, descent.png, negative_control.png")
    print(json_dumps(totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
