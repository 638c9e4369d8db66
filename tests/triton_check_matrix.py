"""``unfold-check --kernel triton`` against ``--kernel edges`` for every registered rho (its typical example,
``tests/matrix.py``) and the graphs of the acceptance list:
``TRITON_INTERPRET=1 python tests/triton_check_matrix.py [--n 12] [--samples 2] [--layers 4]`` (about two
minutes interpreted on a 2-core CPU; on a GPU drop the variable and add ``--device cuda``).

Each case runs the checker twice in float64 (one JSON line each) and reports the triton run's verdict and
increases and the largest relative difference of its per-layer energies from the edge kernel's; it exits 1 unless
every case has 0 increases and agrees to ``--rel`` (default 1e-12)."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from unfold.check import main as check
from matrix import rho_specs

RHOS = rho_specs("families")  # drawn from the registry (tests/matrix.py)
GRAPHS = ["complete", "window:3", "strided:4", "star"]


def run(kernel: str, rho: str, graph: str, args) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = check(["--kernel", kernel, "--rho", rho, "--graph", graph, "--dtype", "float64", "--json",
                    "--n", str(args.n), "--d", str(args.d), "--samples", str(args.samples), "--layers",
                    str(args.layers), "--device", args.device])
    if rc:
        raise SystemExit(f"unfold-check --kernel {kernel} --rho {rho} --graph {graph} exited {rc}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=12)
    p.add_argument("--d", type=int, default=4)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rel", type=float, default=1e-12)
    args = p.parse_args()
    worst, failed = 0.0, 0
    print("| rho | graph | verdict | increases | steps | max rel. energy difference from edges |")
    print("|---|---|---|---|---|---|")
    for rho in RHOS:
        for graph in GRAPHS:
            a, b = run("triton", rho, graph, args), run("edges", rho, graph, args)
            rel = max(abs(x - y) / max(abs(y), 1e-300) for ea, eb in zip(a["energies"], b["energies"])
                      for x, y in zip(ea, eb))
            worst = max(worst, rel)
            bad = a["increases"] != 0 or rel > args.rel
            failed += bad
            print(f"| {rho} | {graph} | {a['verdict']} | {a['increases']} | {a['steps']} | {rel:.1e} |")
    print(f"{len(RHOS) * len(GRAPHS) - failed} passed, {failed} failed; largest relative difference {worst:.1e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
