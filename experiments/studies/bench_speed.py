"""The GPU speed suite: ``python -m experiments.studies.bench speed --device cuda [--json]``.

Three tables, each timed side by side with its reference in the same process (interleaved medians) and each
timing next to the error of our result against the explicit float64 form:

* ``attention``: our attention pass alone (the pairwise pass of every head: neighbour sums, degrees and, with the
  trace on, the energy; forward + backward) against ``scaled_dot_product_attention`` on the same heads, its backend
  pinned and its arithmetic stated (CUDA float32: the memory-efficient kernel, 3xTF32 tensor-core products;
  bfloat16: FlashAttention-2), for every rho, trace on and off;
* ``layer``: one whole guaranteed layer (attention, feed-forward, ReLU prox, curvature bound) against
  ``nn.TransformerEncoderLayer`` of the same width and heads (feed-forward 2d, no dropout), forward + backward,
  float32 and bfloat16 (autocast for both);
* ``trace``: the default encoder (T = 4) forward with the energy trace on over off, every rho.

Ratios are ours over the reference (time), so <= 1 means ours is faster. On the CPU only ``--quick`` runs: it
checks the code and the JSON, not the speed."""
from __future__ import annotations

import math
from typing import Dict, List

import torch

from energies.graphs import complete
from energies.kernels.dispatch import pairwise_pass, pairwise_pass_heads, pick_kernel
from energies.rho import get_rho

#: the size at which the layer table also times the ``torch.compile``d layer (one compile per dtype)
COMPILED_N = 2048
#: every documented rho (the README's list), each timed
SPEED_RHOS = ("exp", "relu:1.5", "softplus:2:0.5", "cauchy", "lp:1")


def sdpa_backend(dtype: torch.dtype, device: torch.device):
    """``(backends, arithmetic)``: the SDPA backend the suite pins, and what its products are."""
    from torch.nn.attention import SDPBackend
    if device.type != "cuda":
        return [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], "CPU (torch's own choice of its CPU kernels)"
    if dtype == torch.float32:
        return [SDPBackend.EFFICIENT_ATTENTION], "memory-efficient (CUTLASS), float32 via 3xTF32 tensor-core products"
    return [SDPBackend.FLASH_ATTENTION], "FlashAttention-2, bfloat16 products, float32 accumulation"


def _features(B: int, n: int, d: int, H: int, device, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, d, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    W = [torch.randn(d, d // H, generator=gen).div(math.sqrt(d)).to(device=device, dtype=dtype) for _ in range(H)]
    return Y, W


def _ours(Y, W, graph, rho, tau, trace: bool):
    """Forward + backward of our attention pass over every head (the energy too with the trace on)."""
    def run():
        outs = pairwise_pass_heads(Y, graph, rho, tau, "auto", W, energy=trace, num=True, guard=trace)
        if outs is None:
            outs = [pairwise_pass(Y, graph, rho, tau, "auto", energy=trace, metric=w, guard=trace) for w in W]
        loss = sum(o.agg.float().sum() + o.deg.float().sum() for o in outs)
        if trace:
            loss = loss + sum(o.energy.sum() for o in outs).float()
        loss.backward()
    return run


def _sdpa(Y, W, dtype, device):
    backends, _ = sdpa_backend(dtype, device)
    from torch.nn.attention import sdpa_kernel
    B, n, _ = Y.shape
    Q = torch.stack([(Y.detach() @ w) for w in W], 1).contiguous().requires_grad_()

    def run():
        with sdpa_kernel(backends):
            torch.nn.functional.scaled_dot_product_attention(Q, Q, Q).float().sum().backward()
    return run


def attention_error(n: int, d: int, H: int, rho_spec: str, device, dtype) -> Dict[str, float]:
    """Largest errors of our pass (one example, n tokens, the row's dtype and kernel) against the edge list in
    float64 on the same features: degrees and neighbour sums relative to their largest value, energy relative."""
    tau = math.sqrt(d // H)
    Y, W = _features(1, n, d, H, device, dtype, seed=1)
    g = complete(n, 1).to(device)
    rho = get_rho(rho_spec)
    with torch.no_grad():
        got = pairwise_pass(Y, g, rho, tau, "auto", energy=True, metric=W[0], guard=True)
        ref = pairwise_pass(Y.double().cpu(), complete(n, 1), rho, tau, "edges", energy=True,
                            metric=W[0].double().cpu())
    deg_err = (got.deg.double().cpu() - ref.deg).abs().max() / ref.deg.abs().max().clamp_min(1e-300)
    agg_err = (got.agg.double().cpu() - ref.agg).abs().max() / ref.agg.abs().max().clamp_min(1e-300)
    e_err = (got.energy.double().cpu() - ref.energy).abs().max() / ref.energy.abs().max().clamp_min(1e-300)
    return {"deg_rel_err": float(deg_err), "agg_rel_err": float(agg_err), "energy_rel_err": float(e_err),
            "error_n": n}


def attention_rows(sizes: List[int], rhos, dtypes, device, quick: bool, d: int, H: int, timer) -> List[dict]:
    rows = []
    for dtype in dtypes:
        for rho_spec in rhos:
            for n in sizes:
                B = 1 if quick else max(1, 16384 // n)
                Y, W = _features(B, n, d, H, device, dtype)
                g = complete(n, B).to(device)
                rho, tau = get_rho(rho_spec), math.sqrt(d // H)
                fns = [_ours(Y, W, g, rho, tau, False), _ours(Y, W, g, rho, tau, True), _sdpa(Y, W, dtype, device)]
                off, on, ref = timer(fns, 1 if quick else (3 if n >= 16384 else 7))
                row = {"n": n, "B": B, "dtype": str(dtype).replace("torch.", ""), "rho": rho_spec,
                       "kernel": pick_kernel(g, rho), "sdpa": sdpa_backend(dtype, device)[1],
                       "ours_s": off, "ours_trace_s": on, "sdpa_s": ref,
                       "ours_over_sdpa": off / ref, "ours_trace_over_sdpa": on / ref, "trace_on_over_off": on / off}
                row.update(attention_error(min(n, 64 if quick else 1024), d, H, rho_spec, device, dtype))
                rows.append(row)
    return rows


def _encoder_case(n: int, quick: bool, d: int, H: int, device, **kw):
    """``(B, X, mask, encoder)``: 16,384 tokens a call (one example in ``--quick``), non-negative tokens of n, all
    real, and a seeded guaranteed encoder with ``kw``."""
    from unfold.encoders import GuaranteedEncoder
    B = 1 if quick else max(1, 16384 // n)
    gen = torch.Generator().manual_seed(n)
    X = torch.randn(B, n, d, generator=gen).relu().to(device)
    torch.manual_seed(0)
    return B, X, torch.ones(B, n, dtype=torch.bool, device=device), GuaranteedEncoder(d=d, heads=H, **kw).to(device)


def layer_rows(sizes: List[int], dtypes, device, quick: bool, d: int, H: int, timer) -> List[dict]:
    """One guaranteed layer vs ``nn.TransformerEncoderLayer(d, H, 2 d)``, forward + backward, autocast for bf16."""
    rows = []
    for dtype in dtypes:
        for n in sizes:
            B, X, mask, enc = _encoder_case(n, quick, d, H, device, layers=1)
            X.requires_grad_()
            ref = torch.nn.TransformerEncoderLayer(d, H, 2 * d, dropout=0.0, batch_first=True).to(device)
            cast = dtype != torch.float32

            def wrap(fn):
                def run():
                    with torch.autocast(device.type, dtype=dtype, enabled=cast):
                        out = fn()
                    out.float().sum().backward()
                return run
            fns = [wrap(lambda: enc(X, mask).Y), wrap(lambda: enc(X, mask, trace=True).Y), wrap(lambda: ref(X))]
            compiled = not quick and n == COMPILED_N        # the small ops fused around the kernel (train.compile)
            if compiled:
                cenc = torch.compile(enc)
                fns.append(wrap(lambda: cenc(X, mask).Y))
            times = timer(fns, 1 if quick else (3 if n >= 16384 else 7))
            off, on, t_ref = times[:3]
            row = {"n": n, "B": B, "dtype": str(dtype).replace("torch.", ""), "ours_s": off, "ours_trace_s": on,
                   "torch_layer_s": t_ref, "ours_over_torch_layer": off / t_ref, "ours_trace_over_torch_layer": on / t_ref}
            if compiled:
                row.update(ours_compiled_s=times[3], ours_compiled_over_torch_layer=times[3] / t_ref)
            rows.append(row)
    return rows


def trace_rows(sizes: List[int], rhos, device, quick: bool, d: int, H: int, timer) -> List[dict]:
    """The default encoder (T = 4) forward, trace on over off, every rho, and the trace's verdict."""
    rows = []
    for rho_spec in rhos:
        for n in sizes:
            B, X, mask, enc = _encoder_case(n, quick, d, H, device, layers=4, rho=rho_spec)
            with torch.no_grad():
                off, on = timer([lambda: enc(X, mask), lambda: enc(X, mask, trace=True)], 1 if quick else 7)
                rep = enc(X, mask, trace=True).report()
            rows.append({"n": n, "B": B, "rho": rho_spec, "off_s": off, "on_s": on, "on_over_off": on / off,
                         "increases": rep.num_increases, "verdict": rep.verdict})
    return rows


def speed_suite(quick: bool, device: torch.device, timer) -> dict:
    from energies.errors import ConfigError
    if device.type != "cuda" and not quick:
        raise ConfigError("the speed suite times a GPU: pass --device cuda (on the CPU only --quick runs)")
    d, H = (16, 2) if quick else (64, 2)
    sizes = [32, 48] if quick else [512, 2048, 8192, 16384, 65536]
    dtypes = [torch.float32] if quick else [torch.float32, torch.bfloat16]
    rhos = ("exp", "cauchy") if quick else SPEED_RHOS
    att = attention_rows(sizes, ("exp",), dtypes, device, quick, d, H, timer)
    att += attention_rows(sizes[:1] if quick else [2048, 16384], [r for r in rhos if r != "exp"], [torch.float32],
                          device, quick, d, H, timer)
    layer = layer_rows(sizes if quick else [512, 2048, 8192], dtypes, device, quick, d, H, timer)
    trace = trace_rows(sizes[:1] if quick else [4096], rhos, device, quick, d, H, timer)
    exp_rows = [r for r in att if r["rho"] == "exp"]
    other = [r for r in att if r["rho"] != "exp"]
    return {"figures": {"d": d, "heads": H, "attention": att, "layer": layer, "trace": trace},
            "ratios": {"exp_ours_over_sdpa_max": max(r["ours_over_sdpa"] for r in exp_rows),
                       "other_rho_ours_over_sdpa_max": max((r["ours_over_sdpa"] for r in other), default=float("nan")),
                       "trace_on_over_off_max": max(r["on_over_off"] for r in trace),
                       "layer_over_torch_layer_max": max(r["ours_over_torch_layer"] for r in layer)},
            "targets": {"exp_ours_over_sdpa_max": "<= 1.3", "other_rho_ours_over_sdpa_max": "<= 2",
                        "trace_on_over_off_max": "<= 1.10", "layer_over_torch_layer_max": "<= 1.5"}}
