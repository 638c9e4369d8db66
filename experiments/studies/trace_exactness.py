"""Does the in-model trace ever count an increase exact arithmetic denies? ``python -m experiments.studies.trace_exactness
[--seeds K] [--json]``.

For every kernel whose pass can evaluate the energy: the guaranteed encoder (rho = exp, tau = 1, identity metric, no
feed-forward or ReLU term) on a near-equal cluster of tokens (spread 1e-8) plus one token far away, at scales from
ordinary to just below the precision guard's switch to explicit differences (float64: ``max|y - mean|^2 / tau <=
2^-30 / eps``, |y| about 2,000). Per kernel: the steps the kernels' own values read as increases (what a verdict on
those values alone would count), the steps the exact re-evaluation decided (``rechecked``: those flagged, and those
whose read change lies within the values' rounding bound of the tolerance) and the increases the verdict counts. Also the cost of the re-evaluation machinery on the default encoder's
forward with the trace on, with and without it (no step flagged: the parameters' copy and the states kept)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from unfold.cli import positive_int

from unfold.encoders import Encoder, GuaranteedEncoder
from unfold.trace import report_from_values
from unfold.strict_json import dumps as json_dumps

#: kernel -> the graph it runs (banded needs a shift-invariant graph that is not complete)
KERNELS = {"fused": "complete", "dense": "complete", "softmax": "complete", "streamed": "complete",
           "triton": "complete", "banded": "window:2", "edges": "complete"}
SCALES = (1.0, 30.0, 300.0, 1000.0, 1400.0, 2000.0)


def cluster_far(seed: int, scale: float, n: int = 6, d: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(1, n, d, dtype=torch.float64, generator=g) * 1e-8
    Y[0, 0] = scale * torch.randn(d, dtype=torch.float64, generator=g).sign()
    return Y


def grid(kernel: str, graph: str, seeds: int, layers: int = 6) -> dict:
    read = decided = increases = steps = 0
    for seed in range(seeds):
        for scale in SCALES:
            torch.manual_seed(seed)
            enc = GuaranteedEncoder(d=3, heads=1, layers=layers, rho="exp", tau=1.0, ffn=False, relu=False,
                                    kernel=kernel, graph=graph).double()
            with torch.no_grad():
                enc.W.copy_(torch.eye(3, dtype=torch.float64)[None])
            trace = enc(cluster_far(seed, scale), trace=True).energies
            rep = report_from_values(trace, torch.float64, guaranteed=True)
            trace.exact = None                       # the same values, judged without the exact re-evaluation
            read += report_from_values(trace, torch.float64, guaranteed=True).num_increases
            decided, increases, steps = decided + rep.rechecked, increases + rep.num_increases, steps + rep.steps
    return {"kernel": kernel, "graph": graph, "steps": steps, "read_as_increase_by_kernel_values": read,
            "decided_exactly": decided, "increases_counted": increases}


def cost(repeat: int = 15) -> dict:
    """Forward of the default encoder (T = 4, d = 64, 2 heads, B = 8, n = 64), trace off, on, and on without the
    re-evaluation machinery (``finish`` given no anchor), interleaved medians."""
    torch.manual_seed(0)
    enc = GuaranteedEncoder()
    X = torch.randn(8, 64, 64).relu()
    original = Encoder.finish

    def bare(self, *a, **kw):
        kw["X"] = None
        return original(self, *a, **kw)
    runs = {"off": lambda: enc(X), "on": lambda: enc(X, trace=True)}

    def on_bare():
        Encoder.finish = bare
        try:
            enc(X, trace=True)
        finally:
            Encoder.finish = original
    runs["on_without_recheck"] = on_bare
    times = {k: [] for k in runs}
    with torch.no_grad():
        for _ in range(2):
            for f in runs.values():
                f()
        for _ in range(repeat):
            for k, f in runs.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_s": med, "trace_on_over_off": med["on"] / med["off"],
            "trace_on_over_off_without_recheck": med["on_without_recheck"] / med["off"],
            "recheck_machinery_cost": med["on"] / med["on_without_recheck"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.studies.trace_exactness", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=positive_int, default=10)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from energies.kernels import KERNELS as REGISTERED
    rows = []
    for kernel, graph in KERNELS.items():
        if kernel not in REGISTERED:
            continue
        try:
            rows.append(grid(kernel, graph, a.seeds))
        except Exception as exc:          # a kernel that cannot run here (triton without its interpreter)
            rows.append({"kernel": kernel, "graph": graph, "skipped": f"{type(exc).__name__}: {exc}"[:200]})
    out = {"scales": list(SCALES), "seeds": a.seeds, "rows": rows, "cost": cost()}
    if not a.json:
        for r in rows:
            print(r)
        print(out["cost"])
    print(json_dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
