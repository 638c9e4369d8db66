"""Where does one layer's time go? ``python -m experiments.studies.profile_layer [--n N] [--batch B] [--json OUT]``.

Profiles forward + backward of one ``GuaranteedEncoder`` layer (d = 64, 2 heads, the gpu and speed suites' case)
for rho = exp (the ``fused`` kernel on CUDA) and rho = cauchy (the ``triton`` kernel), float32 and bfloat16
(autocast), trace off and on, against ``scaled_dot_product_attention`` on the same heads with its backend pinned
(memory-efficient for float32, flash for bfloat16), with ``torch.profiler``: the ten kernels that take the most
device time for each case, and each total over SDPA's. Runs on the CPU too (a smoke test of the script: the CPU's
kernels, CPU time). For hardware counters (spills, occupancy, tensor-core use) run one kernel under ``ncu``.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from unfold.cli import positive_int
from torch.profiler import ProfilerActivity, profile


def profiled(step, device, iters: int):
    """``(device or CPU time per step in us, top ten (name, us per step, calls per step))``."""
    for _ in range(3):
        step()                                                     # warm-up: compile, autotune, allocator
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(iters):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:10]
    total = sum(getattr(e, key, 0) for e in events) / iters
    return total, [(e.key, getattr(e, key, 0) / iters, e.count // iters) for e in rows]


def cases(n: int, B: int, device, dtype):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from unfold.encoders import GuaranteedEncoder

    d, H = 64, 2
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(B, n, d, generator=gen).relu().to(device).requires_grad_()
    mask = torch.ones(B, n, dtype=torch.bool, device=device)
    cast = dtype != torch.float32
    out = {}
    for rho in ("exp", "cauchy"):
        torch.manual_seed(0)
        enc = GuaranteedEncoder(d=d, heads=H, layers=1, rho=rho).to(device)
        for trace in (False, True):
            def step(enc=enc, trace=trace):
                with torch.autocast(device.type, dtype=dtype, enabled=cast):
                    Y = enc(X, mask, trace=trace).Y
                Y.float().sum().backward()
            out[f"ours_{rho}{'_trace' if trace else ''}"] = step
    Q = X.detach().to(dtype).reshape(B, n, H, d // H).transpose(1, 2).contiguous().requires_grad_()
    backend = SDPBackend.EFFICIENT_ATTENTION if dtype == torch.float32 else SDPBackend.FLASH_ATTENTION

    def sdpa():
        with sdpa_kernel([backend] if device.type == "cuda" else [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(Q, Q, Q).float().sum().backward()
    out["sdpa"] = sdpa
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.studies.profile_layer", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=positive_int, default=4096)
    p.add_argument("--batch", type=positive_int, default=4)
    p.add_argument("--iters", type=positive_int, default=10)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--json")
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "n": a.n, "batch": a.batch, "rows": {}}
    for name in a.dtypes.split(","):
        dtype = getattr(torch, name)
        table = {}
        for case, step in cases(a.n, a.batch, device, dtype).items():
            total, top = profiled(step, device, a.iters)
            table[case] = {"total_us": total, "top": top}
            print(f"\n{name} {case}: {total / 1e3:.3f} ms of {'device' if device.type == 'cuda' else 'cpu'} time a step")
            for k, t, c in top:
                print(f"  {t / 1e3:9.3f} ms  x{c:<3d} {k[:110]}")
        for case in table:
            table[case]["over_sdpa"] = table[case]["total_us"] / max(table["sdpa"]["total_us"], 1e-9)
        result["rows"][name] = table
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
