"""Benchmarks: ``python -m experiments.studies.bench SUITE [--quick] [--json]``.

Every suite times our code against a reference run side by side in the same process and reports
ratios (never an absolute time alone). The last line printed is one JSON object:
``{"suite", "device", "quick", "figures", "ratios", "targets"}``. Suites so far:

* ``energy``: forward time of the default guaranteed model (T = 4) with the energy trace on vs off
  (``trace_on_over_off``; also at T = 8, 16: the per-layer energies are free, E(Y_T) costs one pass), and the pairwise attention energy read off the attention pass (LSE identity)
  vs the reference method that materialises every pair difference (``reference_over_ours``);
* ``sparse``: one attention MM step (forward + backward) on a window graph, our edge kernel vs PyG
  ``TransformerConv`` on the same ``edge_index`` (``ours_over_pyg_time`` at the largest n), and the
  peak memory of each per edge;
* ``attention``: one attention layer (exact MM step, rho = exp, forward + backward) vs
  ``scaled_dot_product_attention`` at n = 256 ... 8192: time and peak memory (``ours_over_sdpa_time``);
* ``scaling``: time and peak memory against n for the complete and window graphs, log-log slopes and
  ``bench/scaling.png``;
* ``model``: training steps per second of the default guaranteed model vs ``torch.nn.TransformerEncoder``
  of the same width and depth (``ours_over_torch_steps_per_s``);
* ``gpu``: the Triton kernel on a GPU (``--device cuda``): tokens/s and peak memory of one layer against SDPA and
  FlexAttention (complete graph) and on window:8, n = 512 ... 65,536, float32 and bfloat16, the graph variants
  (window:8, strided:16, star) against the complete graph, and the trace's cost at T = 4
  (``trace_on_over_off_n4096_plus``, ``ours_over_sdpa_time``, ``window8_over_complete_tokens_per_s``);
* ``speed``: the GPU benchmark (``--device cuda``): our attention pass vs SDPA with its backend pinned and its
  arithmetic stated, our whole layer vs ``nn.TransformerEncoderLayer``, the trace's cost, every rho, each timing
  beside its error against the float64 form (`experiments.studies.bench_speed`);
* ``compile``: ``torch.compile`` readiness of the hot path: graph breaks (``torch._dynamo.explain``) of the
  default classifier's forward with the trace off (``graph_breaks_trace_off``, target 0) and on
  (``graph_breaks_trace_on``), of a cached ``UnfoldedAttentionConv`` (``conv_graph_breaks``), and training
  steps per second of the compiled model over the eager one (``compiled_over_eager_steps_per_s``).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Callable, Dict

import torch

from energies.errors import ConfigError
from energies.graphs import complete, window
from energies.registry import claim
from energies.terms import PairwiseAttention
from unfold.cli import run_main
from unfold.plugins import add_import_arg
from unfold.model import UnfoldedTransformer
from unfold.steps import AttentionStep
from unfold.strict_json import dumps as json_dumps

SUITES: Dict[str, Callable[[bool, torch.device], dict]] = {}
#: how the suites measure memory (`_peak_above_base`)
PEAK_NOTE = "peak RSS of a fresh process running the case once, minus that at n = 8"


def suite(name: str):
    def deco(fn):
        if claim(SUITES, name, fn, "bench suite registry (experiments.studies.bench.SUITES)", ConfigError):
            SUITES[name] = fn
        return fn

    return deco


def timeit(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA synchronised)."""
    return timeit_interleaved([fn], repeat, warmup)[0]


def timeit_interleaved(fns, repeat: int = 20, warmup: int = 2):
    """Median wall times of several functions timed in alternation (drift on a shared machine hits
    them alike, so their ratio is steadier than with back-to-back runs)."""
    for _ in range(warmup):
        for f in fns:
            f()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, f in enumerate(fns):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            f()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _tokens(B: int, n: int, vocab: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (B, n), generator=gen)
    return ids.to(device), torch.ones(B, n, dtype=torch.bool, device=device)


def reference_pair_energy(Y: torch.Tensor, tau: float, chunk: int = 64) -> torch.Tensor:
    """The reference method: materialise every pair difference y_u - y_v (in row chunks) and sum
    -tau exp(-|y_u - y_v|^2 / 2tau) over u < v."""
    B, n, d = Y.shape
    total = torch.zeros(B, dtype=torch.float64, device=Y.device)
    for s in range(0, n, chunk):
        diff = Y[:, s:s + chunk, None, :] - Y[:, None, :, :]          # (B, c, n, d): every pair materialised
        z = (diff * diff).sum(-1) / (2 * tau)
        vals = -tau * torch.exp(-z)
        rows = torch.arange(s, min(s + chunk, n), device=Y.device)[:, None]
        vals = torch.where(rows < torch.arange(n, device=Y.device)[None, :], vals, torch.zeros((), device=Y.device,
                                                                                                dtype=vals.dtype))
        total += vals.to(torch.float64).sum((1, 2))
    return total


@suite("energy")
def energy_suite(quick: bool, device: torch.device) -> dict:
    B, n, d = (8, 32, 32) if quick else (32, 64, 64)
    model = UnfoldedTransformer(5000, 2, d=d, heads=2, layers=4).to(device).eval()
    ids, mask = _tokens(B, n, 5000, device)
    by_layers = {}
    with torch.no_grad():
        for T in ((4,) if quick else (4, 8, 16)):   # the default model has T = 4; E(Y_T) costs one pass
            by_layers[T] = timeit_interleaved([lambda: model(ids, mask, trace=True, layers=T),
                                               lambda: model(ids, mask, trace=False, layers=T)],
                                              repeat=3 if quick else 40)
    t_on, t_off = by_layers[4]
    # n = 512 (B = 4: the same 2,048 tokens per batch): the attention passes dominate, so the trace's share shows
    B5, n5 = (2, 128) if quick else (4, 512)
    ids5, mask5 = _tokens(B5, n5, 5000, device, seed=1)
    with torch.no_grad():
        t5_on, t5_off = timeit_interleaved([lambda: model(ids5, mask5, trace=True),
                                            lambda: model(ids5, mask5, trace=False)], repeat=3 if quick else 30)
    n2, d2 = (256, 32) if quick else (2048, 128)
    Y = torch.randn(1, n2, d2, device=device)
    tau = math.sqrt(d2)
    g = complete(n2).to(device)
    term = PairwiseAttention("exp", tau)
    ours = lambda: term.pass_value(Y, g)  # noqa: E731  (energy-only pass: LSE identity)
    ref = lambda: reference_pair_energy(Y, tau)  # noqa: E731
    e_ours, e_ref = ours(), ref()
    t_ours, t_ref = timeit_interleaved([ours, ref], repeat=2 if quick else 5, warmup=0)
    return {
        "figures": {"model": {"B": B, "n": n, "d": d, "layers": 4, "trace_on_s": t_on, "trace_off_s": t_off,
                              "trace_on_over_off_by_layers": {T: a / b for T, (a, b) in by_layers.items()}},
                    "model_long": {"B": B5, "n": n5, "d": d, "layers": 4, "trace_on_s": t5_on, "trace_off_s": t5_off},
                    "pair_energy": {"n": n2, "d": d2, "ours_s": t_ours, "reference_s": t_ref,
                                    "rel_diff": float(((e_ours - e_ref).abs() / e_ref.abs()).max())}},
        "ratios": {"trace_on_over_off": t_on / t_off, "trace_on_over_off_n512": t5_on / t5_off,
                   "reference_over_ours": t_ref / t_ours},
        "targets": {"trace_on_over_off": "<= 1.10 (CPU), <= 1.05 (GPU)", "trace_on_over_off_n512": "<= 1.03 (CPU)",
                    "reference_over_ours": ">= 100"},
    }


@suite("sparse")
def sparse_suite(quick: bool, device: torch.device) -> dict:
    """Window graph: our edge kernel vs PyG ``TransformerConv`` on the same ``edge_index``; time and
    peak memory (CPU), with the memory per edge to show it is linear in |E|."""
    d, radius = 64, 4
    graph = f"window:{radius}"
    sizes = [128, 512] if quick else [1024, 4096, 16384, 65536]
    rows, base = [], {}
    for n in sizes:
        edges = int(window(n, radius).edges().shape[1])
        t_ours, t_pyg = timeit_interleaved([_case("ours", n, d, 1, device, graph), _case("pyg", n, d, 1, device, graph)],
                                           2 if quick else 7, warmup=1)
        row = {"n": n, "edges": edges, "ours_s": t_ours, "pyg_s": t_pyg, "ours_over_pyg": t_ours / t_pyg}
        if _memory_row(device, quick):
            for kind in ("ours", "pyg"):
                mb = _peak_above_base(kind, n, d, 1, graph, base)
                row[f"{kind}_peak_mb"] = mb
                row[f"{kind}_bytes_per_edge"] = mb * 2 ** 20 / edges
        rows.append(row)
    return {"figures": {"d": d, "graph": graph, "rows": rows,
                        "memory": PEAK_NOTE},
            "ratios": {"ours_over_pyg_time": rows[-1]["ours_over_pyg"]},
            "targets": {"ours_over_pyg_time": "<= 1.0"}}


@suite("model")
def model_suite(quick: bool, device: torch.device) -> dict:
    B, n, d, layers = (8, 32, 32, 2) if quick else (32, 64, 64, 4)
    ids, mask = _tokens(B, n, 5000, device)
    labels = torch.randint(0, 2, (B,), generator=torch.Generator().manual_seed(1)).to(device)
    figures = {"B": B, "n": n, "d": d, "layers": layers}

    def trainer(mode):
        torch.manual_seed(0)
        model = UnfoldedTransformer(5000, 2, d=d, heads=2, layers=layers, mode=mode).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            out = model(ids, mask, trace=mode == "guaranteed")
            loss = torch.nn.functional.cross_entropy(out.logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()

        return step

    modes = ("guaranteed", "baseline")
    times = timeit_interleaved([trainer(m) for m in modes], repeat=3 if quick else 20)
    for mode, t in zip(modes, times):
        figures[f"{mode}_steps_per_s"] = 1.0 / t
    return {"figures": figures,
            "ratios": {"ours_over_torch_steps_per_s": figures["guaranteed_steps_per_s"] / figures["baseline_steps_per_s"]},
            "targets": {"ours_over_torch_steps_per_s": ">= 0.8"}}


def graph_breaks(fn, *args):
    """``(count, reasons)`` of ``torch._dynamo.explain(fn)(*args)`` (dynamo's caches reset first)."""
    import torch._dynamo

    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    reasons = sorted({(b.reason.splitlines()[0][:160] + (f" @ {b.user_stack[-1].filename.split('/')[-1]}:"
                                                           f"{b.user_stack[-1].lineno}" if b.user_stack else ""))
                      for b in ex.break_reasons})
    return ex.graph_break_count, reasons


def _padded_batch(B: int, n: int, device):
    """``(ids, mask, labels)``: a batch of random tokens, padded as the data loader pads, and random labels."""
    ids, _ = _tokens(B, n, 5000, device)
    gen = torch.Generator().manual_seed(2)        # padded batches, as the data loader makes them
    mask = (torch.arange(n)[None] < torch.randint(n // 2, n + 1, (B,), generator=gen)[:, None]).to(device)
    ids = ids * mask
    labels = torch.randint(0, 2, (B,), generator=torch.Generator().manual_seed(1)).to(device)
    return ids, mask, labels


def _conv_breaks(quick: bool, device: torch.device):
    """``(nodes, edge_index, count, reasons)``: graph breaks of the PyG conv on a random graph (cache filled)."""
    from torch_geometric.utils import erdos_renyi_graph
    from unfold.pyg import UnfoldedAttentionConv

    N, d = (60, 16) if quick else (2000, 64)
    torch.manual_seed(0)
    ei = erdos_renyi_graph(N, 8.0 / N).to(device)
    x, x0 = torch.randn(N, d, device=device), torch.randn(N, d, device=device)
    conv = UnfoldedAttentionConv(d, heads=2, head_channels=d // 2, relu=True, cached=True).to(device)
    conv(x.relu(), ei, x0)                       # fills the cache (the preprocessing reads indices on the host)
    conv_breaks, conv_why = graph_breaks(lambda h: conv(h, ei, x0, return_energy=True), x.relu())
    return N, ei, conv_breaks, conv_why


def _train_step(model, net, ids, mask, labels):
    """One AdamW training step of ``model``'s parameters through ``net`` (``model`` or its compiled form)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        loss = torch.nn.functional.cross_entropy(net(ids, mask, trace=False).logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


@suite("compile")
def compile_suite(quick: bool, device: torch.device) -> dict:
    """Graph breaks of the model (trace off and on) and of the PyG conv, and compiled against eager training steps."""
    from experiments.app.config import load_config
    from experiments.app.build import build_model

    B, n = (4, 16) if quick else (32, 64)
    cfg = load_config(None, ["model.d=16", "model.layers=2"] if quick else [])   # the default model
    torch.manual_seed(0)
    model = build_model(cfg, 5000, 2).to(device).train()
    ids, mask, labels = _padded_batch(B, n, device)
    off, off_why = graph_breaks(lambda i, m: model(i, m, trace=False).logits, ids, mask)
    on, on_why = graph_breaks(lambda i, m: (lambda o: (o.logits, dict(o.energies)))(model(i, m, trace=True)), ids, mask)
    N, ei, conv_breaks, conv_why = _conv_breaks(quick, device)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    eager_step = _train_step(model, model, ids, mask, labels)
    compiled_step = _train_step(model, compiled, ids, mask, labels)
    t0 = time.perf_counter()
    compiled_step()                              # compiles forward and backward
    compile_s = time.perf_counter() - t0
    times = timeit_interleaved([eager_step, compiled_step], repeat=3 if quick else 15)
    figures = {"B": B, "n": n, "d": cfg["model"]["d"], "layers": cfg["model"]["layers"], "conv_nodes": N,
               "conv_edges": int(ei.shape[1]), "eager_steps_per_s": 1.0 / times[0],
               "compiled_steps_per_s": 1.0 / times[1], "compile_seconds": compile_s,
               "break_reasons_trace_off": off_why, "break_reasons_trace_on": on_why, "break_reasons_conv": conv_why}
    return {"figures": figures,
            "ratios": {"graph_breaks_trace_off": off, "graph_breaks_trace_on": on, "conv_graph_breaks": conv_breaks,
                       "compiled_over_eager_steps_per_s": times[0] / times[1]},
            "targets": {"graph_breaks_trace_off": "== 0", "graph_breaks_trace_on": "<= 2", "conv_graph_breaks": "<= 2",
                        "compiled_over_eager_steps_per_s": "> 1 (reported)"}}


# VmHWM (the process's own peak RSS, reset by exec), not ru_maxrss: a child started from a large
# parent inherits the parent's ru_maxrss across fork + exec.
_PEAK_CODE = """
import sys, torch
sys.path.insert(0, {root!r})
from experiments.studies.bench import _case
fn = _case({kind!r}, {n}, {d}, {B}, torch.device('cpu'), {graph!r})
fn()
print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])
"""


def _case(kind: str, n: int, d: int, B: int, device: torch.device, graph: str = "complete"):
    """One attention layer, forward + backward, as a closure:

    * ``ours``: the exact MM step (rho = exp, kernel auto) on ``graph`` (complete | window:K);
    * ``guaranteed``: one layer of the guaranteed encoder (2 heads, feed-forward and ReLU terms, kernel auto,
      trace off) on ``graph``, the gradient of its output reaching the weights and the input;
    * ``torch_layer``: ``nn.TransformerEncoderLayer`` (2 heads, feed-forward 2d, no dropout; complete graph);
    * ``sdpa``: ``scaled_dot_product_attention`` with q = k = v, the same n, d, batch;
    * ``pyg``: PyG ``TransformerConv`` (one head, no root weight) on the same graph's ``edge_index``."""
    from energies.graphs import graph_from_spec

    gen = torch.Generator().manual_seed(n)
    Y = torch.randn(B, n, d, generator=gen).to(device).requires_grad_()
    g = graph_from_spec(graph, n, batch_size=B).to(device)
    if kind == "ours":
        step = AttentionStep("exp", tau=math.sqrt(d), alpha=1.0)
        return lambda: step(Y, g).sum().backward()
    if kind == "guaranteed":
        from unfold.encoders import GuaranteedEncoder

        torch.manual_seed(0)
        enc = GuaranteedEncoder(d=d, heads=2, layers=1, graph=graph).to(device)
        X, mask = Y.detach().relu().requires_grad_(), torch.ones(B, n, dtype=torch.bool, device=device)
        return lambda: enc(X, mask).Y.sum().backward()
    if kind == "torch_layer":
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True).to(device)
        return lambda: layer(Y).sum().backward()
    if kind == "pyg":
        from torch_geometric.nn import TransformerConv

        torch.manual_seed(0)
        conv = TransformerConv(d, d, heads=1, root_weight=False).to(device)
        X, ei = Y.detach().reshape(B * n, d).requires_grad_(), g.directed_edge_index()
        return lambda: conv(X, ei).sum().backward()
    if graph != "complete":
        raise ValueError("sdpa runs on the complete graph only")
    Q = Y[:, None]
    return lambda: torch.nn.functional.scaled_dot_product_attention(Q, Q, Q).sum().backward()


def _peak_rss_mb(kind: str, n: int, d: int, B: int, graph: str = "complete") -> float:
    """Peak resident memory (MB) of a fresh process that runs one case once (CPU)."""
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout
    code = _PEAK_CODE.format(root=root, kind=kind, n=n, d=d, B=B, graph=graph)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def _memory_row(device: torch.device, quick: bool) -> bool:
    """Whether a row measures peak memory: on the CPU, every size; never with ``--quick`` (each figure is a fresh
    process that imports torch; the quick runs check the timings' code and the JSON, and the memory probe has its
    own test, ``tests/test_bench.py``)."""
    return device.type == "cpu" and not quick


def _peak_above_base(kind: str, n: int, d: int, B: int, graph: str, base: dict) -> float:
    """Peak RSS of the case minus that of the same case at n = 8 (the interpreter and libraries)."""
    key = (kind, graph)
    if key not in base:
        base[key] = _peak_rss_mb(kind, 8, d, B, graph)
    return _peak_rss_mb(kind, n, d, B, graph) - base[key]


@suite("attention")
def attention_suite(quick: bool, device: torch.device) -> dict:
    d, B = 64, 2
    sizes = [64, 128] if quick else [256, 1024, 2048, 4096, 8192]
    base: dict = {}
    rows = []
    for n in sizes:
        rep = 2 if quick or n >= 4096 else 7
        t_ours, t_sdpa = timeit_interleaved([_case("ours", n, d, B, device), _case("sdpa", n, d, B, device)],
                                            rep, warmup=1)
        row = {"n": n, "ours_s": t_ours, "sdpa_s": t_sdpa, "ours_over_sdpa": t_ours / t_sdpa}
        if _memory_row(device, quick):
            row["ours_peak_mb"] = _peak_above_base("ours", n, d, B, "complete", base)
            row["sdpa_peak_mb"] = _peak_above_base("sdpa", n, d, B, "complete", base)
        rows.append(row)
    return {"figures": {"d": d, "B": B, "rows": rows,
                        "memory": PEAK_NOTE},
            "ratios": {"ours_over_sdpa_time": rows[-1]["ours_over_sdpa"]},
            "targets": {"ours_over_sdpa_time": "<= 1.5 (CPU)"}}


def _loglog_slope(rs, key="seconds"):
    """The log-log slope of ``key`` against n between the first and last rows (NaN where it cannot be taken)."""
    if len(rs) < 2 or key not in rs[0] or min(rs[0][key], rs[-1][key]) <= 0:
        return float("nan")
    return math.log(rs[-1][key] / rs[0][key]) / math.log(rs[-1]["n"] / rs[0]["n"])


def _plot_scaling(pick: dict, cases: tuple, d: int, B: int, path: str) -> None:
    """Tokens per second and peak memory against n, log-log, one line per case, saved to ``path``."""
    from unfold.plot import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(10, 4.2))
    names = {cases[0]: "guaranteed, complete (fused)", cases[1]: "guaranteed, window:4 (edges)",
             cases[2]: "TransformerEncoderLayer"}
    for key, ax, label in (("tokens_per_s", axes[0], "tokens / s (forward + backward)"), ("peak_mb", axes[1], "peak MB")):
        for c, rs in pick.items():
            pts = [(r["n"], r[key]) for r in rs if r.get(key, 0) > 0]
            if pts:
                ax.loglog(*zip(*pts), marker="o", label=names[c])
        ax.set(xlabel="tokens n", ylabel=label, title=f"one layer, d = {d}, B = {B}")
        ax.legend()
    save_figure(fig, path)


@suite("scaling")
def scaling_suite(quick: bool, device: torch.device) -> dict:
    """Tokens per second and peak memory of one layer (forward + backward) against n = 256 ... 65,536: the
    guaranteed layer on the complete graph (kernel auto) and on window:4, and ``nn.TransformerEncoderLayer``
    (complete: it has no sparse form without an n x n mask); log-log slopes and ``bench/scaling.png``."""
    import os

    d, B = 64, 1
    sizes = [64, 256] if quick else [256, 1024, 4096, 16384, 65536]
    cases = (("guaranteed", "complete"), ("guaranteed", "window:4"), ("torch_layer", "complete"))
    rows, base = [], {}
    for kind, graph in cases:
        for n in sizes:
            big = n >= 16384
            seconds = timeit(_case(kind, n, d, B, device, graph), 1 if quick or big else 3, warmup=0 if big else 1)
            row = {"layer": kind, "graph": graph, "n": n, "seconds": seconds, "tokens_per_s": B * n / seconds}
            if _memory_row(device, quick):
                row["peak_mb"] = _peak_above_base(kind, n, d, B, graph, base)
            rows.append(row)
    pick = {c: [r for r in rows if (r["layer"], r["graph"]) == c] for c in cases}
    comp, win, ref = (pick[c] for c in cases)
    os.makedirs("bench", exist_ok=True)
    _plot_scaling(pick, cases, d, B, os.path.join("bench", "scaling.png"))
    last = {c: rs[-1]["tokens_per_s"] for c, rs in pick.items()}
    return {"figures": {"d": d, "B": B, "rows": rows, "plot": "bench/scaling.png", "memory": PEAK_NOTE},
            "ratios": {"complete_time_loglog_slope": _loglog_slope(comp),
                       "window_time_loglog_slope": _loglog_slope(win),
                       "complete_memory_loglog_slope": _loglog_slope(comp, "peak_mb"),
                       "window_memory_loglog_slope": _loglog_slope(win, "peak_mb"),
                       "guaranteed_over_torch_tokens_per_s": last[cases[0]] / last[cases[2]],
                       "window_over_torch_tokens_per_s": last[cases[1]] / last[cases[2]]},
            "targets": {"complete_time_loglog_slope": "~2 (quadratic)", "window_time_loglog_slope": "~1 (linear in |E|)",
                        "complete_memory_loglog_slope": "~1 (no n x n matrix)",
                        "window_memory_loglog_slope": "~1 (linear in |E|)",
                        "guaranteed_over_torch_tokens_per_s": "reported (largest n)",
                        "window_over_torch_tokens_per_s": "reported (largest n)"}}


PROG = "python -m experiments.studies.bench"


def _cuda_peak_mb(fn) -> float:
    """Peak CUDA memory (MB) allocated by one call of ``fn`` above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def _gpu_cases(n: int, d: int, B: int, H: int, device, dtype, graph: str = "complete", flex: bool = True):
    """Closures for the gpu suite, each forward + backward of one attention layer on (B, n, d) tokens: ``ours`` (one
    guaranteed layer, H heads of d / H, the Triton kernel, trace off), ``sdpa`` and ``flex`` (torch's attention on
    q = k = v of H heads of d / H; flex compiled, None where it cannot run: no backward off CUDA, or ``flex=False``)."""
    from unfold.encoders import GuaranteedEncoder

    gen = torch.Generator().manual_seed(n)
    X = torch.randn(B, n, d, generator=gen).relu().to(device=device, dtype=dtype).requires_grad_()
    mask = torch.ones(B, n, dtype=torch.bool, device=device)
    torch.manual_seed(0)
    enc = GuaranteedEncoder(d=d, heads=H, layers=1, graph=graph, kernel="triton").to(device=device, dtype=dtype)
    cases = {"ours": lambda: enc(X, mask).Y.sum().backward()}
    if graph == "complete":
        Q = X.detach().reshape(B, n, H, d // H).transpose(1, 2).contiguous().requires_grad_()
        cases["sdpa"] = lambda: torch.nn.functional.scaled_dot_product_attention(Q, Q, Q).sum().backward()
        cases["flex"] = None
        if device.type == "cuda" and flex:
            try:
                from torch.nn.attention.flex_attention import flex_attention
                compiled = torch.compile(flex_attention)
                compiled(Q, Q, Q).sum().backward()          # compiled here: a build that cannot compile it says so
                cases["flex"] = lambda: compiled(Q, Q, Q).sum().backward()
            except Exception as exc:       # pragma: no cover - depends on the GPU's torch build and compiler
                print(f"flex_attention left out at n = {n}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                cases["flex"] = None
    return enc, X, mask, cases


def _gpu_batch(n: int, quick: bool) -> int:
    """Examples per call: 16,384 tokens in all (one example from n = 16,384 on)."""
    return 1 if quick else max(1, 16384 // n)


def gpu_layer_row(n: int, dtype, device, quick: bool, d: int, H: int, flex: bool = True) -> dict:
    """One row of the gpu suite: tokens/s (and peak MiB on CUDA) of one layer, forward + backward, on the complete
    graph (ours, SDPA, FlexAttention) and on window:8 (ours), with the ratios read off them."""
    B = _gpu_batch(n, quick)
    rep = 1 if quick else (3 if n >= 16384 else 7)
    row = {"n": n, "B": B, "dtype": str(dtype).replace("torch.", "")}
    for graph in ("complete", "window:8"):
        _, _, _, cases = _gpu_cases(n, d, B, H, device, dtype, graph, flex=flex)
        names = [k for k, f in cases.items() if f is not None]
        times = timeit_interleaved([cases[k] for k in names], rep, warmup=1)
        tag = "" if graph == "complete" else "window_"
        for k, t in zip(names, times):
            row[f"{tag}{k}_tokens_per_s"] = B * n / t
            if device.type == "cuda":
                row[f"{tag}{k}_peak_mb"] = _cuda_peak_mb(cases[k])
    row["ours_over_sdpa_time"] = row["sdpa_tokens_per_s"] / row["ours_tokens_per_s"]
    if "flex_tokens_per_s" in row:
        row["ours_over_flex_time"] = row["flex_tokens_per_s"] / row["ours_tokens_per_s"]
    row["window_over_complete_tokens_per_s"] = row["window_ours_tokens_per_s"] / row["ours_tokens_per_s"]
    return row


#: the graph variants the gpu suite compares with the complete graph (Triton kernel, float32)
GPU_VARIANTS = ("complete", "window:8", "strided:16", "star")


def gpu_variants_row(n: int, device, quick: bool, d: int, H: int) -> dict:
    """Tokens/s of one layer (forward + backward, float32, the Triton kernel) on each of `GPU_VARIANTS`, timed
    in alternation, and each over the complete graph's."""
    B = _gpu_batch(n, quick)
    fns = [_gpu_cases(n, d, B, H, device, torch.float32, g, flex=False)[3]["ours"] for g in GPU_VARIANTS]
    times = timeit_interleaved(fns, 1 if quick else (3 if n >= 16384 else 5), warmup=1)
    row = {"n": n, "B": B}
    for g, t in zip(GPU_VARIANTS, times):
        row[f"{g}_tokens_per_s"] = B * n / t
        row[f"{g}_over_complete"] = times[0] / t
    return row


def gpu_trace_row(n: int, device, quick: bool, d: int, H: int) -> dict:
    """The default guaranteed encoder (T = 4, Triton kernel) forward with the energy trace on vs off, and the
    trace's verdict."""
    from unfold.encoders import GuaranteedEncoder

    B = _gpu_batch(n, quick)
    gen = torch.Generator().manual_seed(n)
    X = torch.randn(B, n, d, generator=gen).relu().to(device)
    mask = torch.ones(B, n, dtype=torch.bool, device=device)
    torch.manual_seed(0)
    enc = GuaranteedEncoder(d=d, heads=H, layers=4, kernel="triton").to(device)
    with torch.no_grad():
        off, on = timeit_interleaved([lambda: enc(X, mask), lambda: enc(X, mask, trace=True)],
                                     1 if quick else 7, warmup=1)
        rep = enc(X, mask, trace=True).report()
    return {"n": n, "B": B, "off_s": off, "on_s": on, "on_over_off": on / off,
            "increases": rep.num_increases, "verdict": rep.verdict}


@suite("gpu")
def gpu_suite(quick: bool, device: torch.device) -> dict:
    """The Triton kernel on a GPU (``--device cuda``): tokens per second and peak memory of one layer (forward +
    backward) on the complete graph against ``scaled_dot_product_attention`` and FlexAttention, and on window:8, for
    n = 512 ... 65,536 (d = 64, 2 heads) in float32 and bfloat16 (ours computes bfloat16 inputs in float32); the
    graph variants (`GPU_VARIANTS`) against the complete graph; and the default model's forward (T = 4) with
    the energy trace on vs off. On the CPU only ``--quick`` runs (Triton's interpreter: it checks the code and the
    JSON, not the speed)."""
    from energies.kernels import triton_unavailable

    why = triton_unavailable(device.type)
    if why is not None:
        raise ConfigError(f"the gpu suite: the triton kernel {why}")
    if device.type != "cuda" and not quick:
        raise ConfigError("the gpu suite times a GPU: pass --device cuda (on the CPU only --quick runs, interpreted)")
    d, H = (16, 2) if quick else (64, 2)
    # --quick: one size, two of the interpreter's 16-token tiles per side (the code and the JSON, not the scaling)
    sizes = [32] if quick else [512, 2048, 4096, 8192, 16384, 65536]
    dtypes = [torch.float32] if quick else [torch.float32, torch.bfloat16]
    rows = [gpu_layer_row(n, dtype, device, quick, d, H) for dtype in dtypes for n in sizes]
    variants = [gpu_variants_row(n, device, quick, d, H) for n in (sizes if quick else [2048, 8192, 65536])]
    trace = [gpu_trace_row(n, device, quick, d, H) for n in sizes if n <= 16384]    # T = 4 at 65,536: minutes
    f32 = [r for r in rows if r["dtype"] == "float32"]
    big = [t for t in trace if t["n"] >= 4096] or trace
    return {"figures": {"d": d, "heads": H, "rows": rows, "variants": variants, "trace": trace,
                        "memory": "torch.cuda.max_memory_allocated during one call, above what was allocated before"},
            "ratios": {"trace_on_over_off_n4096_plus": max(t["on_over_off"] for t in big),
                       "ours_over_sdpa_time": f32[-1]["ours_over_sdpa_time"],
                       "window8_over_complete_tokens_per_s": f32[-1]["window_over_complete_tokens_per_s"]},
            "targets": {"trace_on_over_off_n4096_plus": "<= 1.10", "ours_over_sdpa_time": "<= 1.3",
                        "window8_over_complete_tokens_per_s": ">= 10 at n = 65,536"}}


@suite("speed")
def speed_suite(quick: bool, device: torch.device) -> dict:
    """The GPU benchmark (`experiments.studies.bench_speed`): our attention pass vs SDPA with its
    backend pinned, our whole layer vs ``nn.TransformerEncoderLayer``, the trace's cost, every rho, errors
    against the float64 form beside each timing."""
    from .bench_speed import speed_suite as run
    return run(quick, device, timeit_interleaved)


def suite_arg(text: str) -> str:
    """argparse ``type=``: the name of a suite (`SUITES`)."""
    if text not in SUITES:
        raise argparse.ArgumentTypeError(f"unknown suite {text!r}; valid: {sorted(SUITES)}")
    return text


def device_arg(text: str) -> torch.device:
    """argparse ``type=``: ``cpu``, ``cuda`` or ``cuda:K`` naming a device this machine has."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index is not None):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: expected cpu, cuda or cuda:K")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA device(s), "
                                             f"cuda:0 .. cuda:{count - 1}")
    return device


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("suite", type=suite_arg, help=f"one of {sorted(SUITES)}")
    p.add_argument("--quick", action="store_true", help="a small version (checks the JSON, not the speed)")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    p.add_argument("--device", type=device_arg, default=torch.device("cpu"), help="cpu (default), cuda or cuda:K")
    args = p.parse_args(argv)

    def body() -> int:
        device = args.device
        result = {"suite": args.suite, "device": str(device), "quick": args.quick, "threads": torch.get_num_threads()}
        result.update(SUITES[args.suite](args.quick, device))
        if not args.json:
            for k, v in result["ratios"].items():
                print(f"{k}: {v:.3f}  (target {result['targets'].get(k, '-')})")
        print(json_dumps(result))
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
