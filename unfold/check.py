"""Descent checker: ``python -m unfold.check [options]``.

Unrolls attention MM steps on random token matrices (or one given matrix) over a chosen graph
and penalty, traces the energy at every layer per example and per term, and reports every
step whose energy went up by more than the stated tolerance. A check larger than ``MAX_WORK`` (layers x features x
(pairs + token slots)) is refused before any work; one past ``NOTE_WORK`` is announced on stderr. Exits 0 whether or not increases
occur (the output says), and 2 with one ``error:`` line on a bad option or a bad file (the project's
error contract, `unfold.cli.run_main`): every option is checked before any work, and nothing is
written unless the run succeeds (the plot lands whole or not at all).
"""
from __future__ import annotations

import argparse
import builtins
import math
import os
import sys
from typing import List, Optional

import numpy as np
import torch

from energies.kernels import kernel_names
from energies.checks import load_npy
from energies.errors import UnfoldError
from energies.graphs import graph_from_spec
from energies.memory import check_memory
from energies.rho import get_rho

from .cli import any_float, any_int, finite_float, positive_float, positive_int, run_main
from .devices import check_device
from .plugins import add_import_arg, plugin_output
from .steps import UPDATES, AttentionStep, ReLUProxStep, Sequence
from .strict_json import dumps as json_dumps, json_safe
from .trace import DEFAULT_TOL_FACTOR, MAX_TOL_FACTOR, MIN_TOL_FACTOR, check_tol_factor, trace_descent

DTYPES = {"float32": torch.float32, "float64": torch.float64}
PROG = "python -m unfold.check"
#: the largest token tensor (samples x n x d entries) and unroll depth the checker builds
MAX_TOKEN_ENTRIES = 2 ** 27
MAX_LAYERS = 100_000
#: the most work a check does, counted as ``--layers x --d x (pairs of the graph over all samples + token slots)``:
#: about 7 minutes on one CPU core at the complete graph's rate (a sparse graph's pairs cost a few times more); a
#: larger check is refused before any work, naming the options
MAX_WORK = 2 ** 32
#: work past which the checker says on stderr, before it starts, how much it is about to do
NOTE_WORK = 2 ** 28


class CheckError(UnfoldError):
    """Bad option or bad input file for the checker (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The options: argparse converters (`unfold.cli`) refuse what is not a number, or not a finite one;
    `_validate` checks each range, device, file and path by name, before any work."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_import_arg(p)
    p.add_argument("--graph", default="complete",
                   help="complete | window:K | strided:K | dilated:K[:R] | star | random:P | path to a .npy 2 x m edge list")
    p.add_argument("--rho", default="exp", help="exp (or softmax) | relu[:C] | softplus:C:T | cauchy | lp:P[:EPS]")
    p.add_argument("--alpha", type=finite_float, default=1.0, help="residual weight, 0 < alpha <= 1")
    p.add_argument("--tau", type=finite_float, default=None, help="temperature (default sqrt(d))")
    p.add_argument("--update", choices=UPDATES, default="exact",
                   help="exact MM step, or 'printed' (supplement eq. 38, the negative control)")
    p.add_argument("--kernel", choices=kernel_names(), default="auto",
                   help="a registered pairwise kernel (energies.KERNELS, plug-ins included) or auto")
    p.add_argument("--relu", action="store_true", help="follow each attention step by the ReLU prox step")
    p.add_argument("--residual", choices=["none", "input"], default="none",
                   help="R(Y) = |Y|^2/2 (none) or the initial residual |Y - Y_0|^2/2 (input)")
    p.add_argument("--layers", type=any_int, default=8, help="unrolled layers T (weights shared)")
    p.add_argument("--samples", type=positive_int, default=16, help="random token matrices S")
    p.add_argument("--n", type=positive_int, default=None, help="tokens per matrix (default 32)")
    p.add_argument("--d", type=positive_int, default=None, help="features per token (default 16)")
    p.add_argument("--scale", type=positive_float, default=1.0, help="std of the random tokens")
    p.add_argument("--seed", type=any_int, default=0)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float64")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:K")
    p.add_argument("--input", default=None, help="one n x d token matrix (.npy) instead of random samples")
    p.add_argument("--tol-factor", type=any_float, default=DEFAULT_TOL_FACTOR,
                   help=f"tol = factor * eps(dtype) * (sum_k |E_k| + eps * sum_u c_u |y_u|^2), factor in "
                        f"[{MIN_TOL_FACTOR:g}, {MAX_TOL_FACTOR:g}]")
    p.add_argument("--plot", default=None, help="write an energy-descent plot (PNG) here")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    return p


def _load_input(path: str) -> np.ndarray:
    arr = load_npy(path, "--input file", "matrix", CheckError)
    if arr.ndim != 2 or min(arr.shape) < 1:
        raise CheckError(f"--input must hold one n x d matrix with n, d >= 1, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise CheckError(f"--input must hold floating-point numbers, got dtype {arr.dtype}")
    if arr.size > MAX_TOKEN_ENTRIES:
        raise CheckError(f"--input has {arr.size} entries, more than the checker's limit of {MAX_TOKEN_ENTRIES}")
    if not np.isfinite(arr).all():
        i, j = np.argwhere(~np.isfinite(arr))[0]
        raise CheckError(f"--input holds a non-finite value at token {i}, feature {j}")
    return arr


def _check_device(text: str) -> torch.device:
    return check_device(text, "--device", CheckError)


def _check_plot(path: str) -> None:
    """``--plot``: a file path whose folder exists and is writable, in a format matplotlib writes."""
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise CheckError(f"--plot {path!r}: not a writable file path (its folder must exist and be writable)")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = sorted(FigureCanvasBase.get_supported_filetypes())
        if ext not in formats:
            raise CheckError(f"--plot {path!r}: format {ext!r} is not one matplotlib writes ({', '.join(formats)})")


def _validate(args) -> None:
    """Every option, before any work (each error names its flag and value)."""
    if not (0.0 < args.alpha <= 1.0):
        raise CheckError(f"--alpha must lie in (0, 1], got {args.alpha}")
    if args.tau is not None and not (args.tau > 0 and math.isfinite(args.tau)):
        raise CheckError(f"--tau must be > 0, got {args.tau}")
    if not 1 <= args.layers <= MAX_LAYERS:
        raise CheckError(f"--layers must be >= 1 and at most {MAX_LAYERS}, got {args.layers}")
    for name in ("samples", "n", "d"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CheckError(f"--{name} must be >= 1, got {v}")
    try:
        check_tol_factor(args.tol_factor)
    except UnfoldError:
        raise CheckError(f"--tol-factor must be a finite number in [{MIN_TOL_FACTOR:g}, {MAX_TOL_FACTOR:g}], "
                         f"got {args.tol_factor}") from None
    if not math.isfinite(args.scale) or args.scale <= 0:
        raise CheckError(f"--scale must be a finite number > 0, got {args.scale}")
    _check_device(args.device)
    if not 0 <= args.seed < 2 ** 63:
        raise CheckError(f"--seed must lie in [0, 2^63), got {args.seed}")
    if args.input is None:
        entries = args.samples * (args.n or 32) * (args.d or 16)
        if entries > MAX_TOKEN_ENTRIES:
            raise CheckError(f"--samples x --n x --d = {entries} token entries, more than the checker's limit of "
                             f"{MAX_TOKEN_ENTRIES}")
        _check_memory(args)
    if args.plot is not None:
        _check_plot(args.plot)
    if args.update == "printed" and args.residual != "none":
        raise CheckError("--update printed (eq. 38) has no initial residual: use --residual none")


def _check_memory(args) -> None:
    """The one memory rule (`energies.memory.check_memory`) before anything is allocated: the random tokens
    (their float64 draw and about six copies in ``--dtype``: the states, the residual's B, the step's sums) and, for
    ``--kernel dense``, its ``(samples, n, n)`` matrices, for ``--kernel edges`` on the complete graph its list of
    pairs; refused naming the options and values. Other edge lists are judged by the graph builders before they
    are built."""
    n, d, size = args.n or 32, args.d or 16, 8 if args.dtype == "float64" else 4
    need = args.samples * n * d * (8 + 6 * size)
    what = f"--samples {args.samples} x --n {n} x --d {d} {args.dtype} tokens"
    if args.kernel == "dense":
        need += args.samples * n * n * (4 * size + 1)
        what += f" with --kernel dense's (--samples, --n, --n) = ({args.samples}, {n}, {n}) matrices"
    if args.kernel == "edges" and args.graph == "complete":      # the complete graph's pairs, listed
        need += args.samples * (n * (n - 1) // 2) * 40
        what += f" with --kernel edges' list of the --graph complete's {args.samples * (n * (n - 1) // 2):,} pairs"
    check_memory(need, what, CheckError, "use a smaller --samples, --n or --d" +
                 (", or --kernel streamed" if args.kernel in ("dense", "edges") else ""))


def _check_work(args, graph, samples: int, n: int, d: int) -> None:
    """Refuse a check larger than `MAX_WORK` (the graph's pairs over all samples plus the token slots, times the
    features and the layers), before any token is drawn; past `NOTE_WORK`, say on stderr how large it is."""
    pairs = samples * (n * (n - 1) // 2) if graph.is_complete else int(graph.num_edges().sum())
    work = args.layers * d * (pairs + samples * n)
    what = (f"--layers {args.layers} x --d {d} x ({pairs:,} pairs of --graph {args.graph} over {samples} sample(s) "
            f"+ {samples * n:,} token slots) = {work:,}")
    if work > MAX_WORK:
        raise CheckError(f"this check is too large: {what}, more than the checker's limit of {MAX_WORK:,} (hours on "
                         "a CPU); use a smaller --n, --samples, --d or --layers, or a sparser --graph")
    if work > NOTE_WORK:
        print(f"{PROG}: note: checking {what} (this may take minutes)", file=sys.stderr, flush=True)


def _write_plot(report, path: str, title: str) -> None:
    """The plot written to a temporary file beside ``path``, then renamed over it: whole or not at all."""
    from .plot import plot_report

    folder, base = os.path.split(os.path.abspath(path))
    ext = os.path.splitext(base)[1] or ".png"
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.tmp{ext}")
    try:
        plot_report(report, tmp, title=title)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:
        raise CheckError(f"--plot {path!r} could not be written: {' '.join(str(exc).split())[:200]}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def run(args) -> dict:
    """Run the check described by parsed ``args``; returns the JSON-ready result."""
    _validate(args)
    dtype = DTYPES[args.dtype]
    device = torch.device(args.device)
    if args.input is not None:
        arr = _load_input(args.input)
        n, d = arr.shape
        for name, v in (("n", args.n), ("d", args.d)):
            if v is not None and v != {"n": n, "d": d}[name]:
                raise CheckError(f"--{name} {v} does not match --input of shape {arr.shape}")
        Y = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)[None]
        if not bool(torch.isfinite(Y).all()):
            raise CheckError(f"--input {args.input!r} holds values beyond the range of --dtype {args.dtype} "
                             f"(largest magnitude {float(np.abs(arr).max()):.3g})")
        samples = 1
    else:
        n, d = args.n or 32, args.d or 16
        samples = args.samples
        graph = graph_from_spec(args.graph, n, batch_size=samples, seed=args.seed)   # first: its sizes refused
        gen = torch.Generator().manual_seed(args.seed)                                # before the tokens exist
        Y = args.scale * torch.randn(samples, n, d, generator=gen, dtype=torch.float64).to(dtype)
    Y = Y.to(device)
    tau = args.tau if args.tau is not None else math.sqrt(d)
    if args.input is not None:
        graph = graph_from_spec(args.graph, n, batch_size=samples, seed=args.seed)
    _check_work(args, graph, samples, n, d)
    graph = graph.to(device)
    get_rho(args.rho)  # validates the spec before any work
    B = Y.clone() if args.residual == "input" else None
    step = AttentionStep(args.rho, tau=tau, alpha=args.alpha, B=B, update=args.update, kernel=args.kernel)
    if args.relu:
        step = Sequence([step, ReLUProxStep()])
    _, report = trace_descent(step, Y, graph, layers=args.layers, tol_factor=args.tol_factor)
    out = {
        "config": {"graph": graph.name, "rho": step.energy.terms["attention"].rho.spec(), "alpha": args.alpha,
                   "tau": tau, "update": args.update, "kernel": args.kernel, "relu": args.relu,
                   "residual": args.residual, "layers": args.layers, "samples": samples, "n": n, "d": d,
                   "dtype": args.dtype, "device": str(device), "seed": args.seed,
                   "input": args.input, "edges_per_sample": graph.num_edges().tolist()},
        "guarantee": step.guarantee if not args.relu else "exact attention (alpha <= 1/2) + ReLU: proximal MM step",
    }
    out.update(report.summary())
    out = json_safe(out)
    if args.plot:
        _write_plot(report, args.plot, f"{graph.name}, rho={out['config']['rho']}, update={args.update}, "
                                       f"alpha={args.alpha:g}")
        out["plot"] = args.plot
    return out


def _print_human(out: dict, file=None) -> None:
    file = sys.stdout if file is None else file

    def print(*parts):                     # the report's lines, to ``file`` (the standard output saved by _main)
        builtins.print(*parts, file=file)
    c = out["config"]
    print(f"graph={c['graph']} rho={c['rho']} update={c['update']} alpha={c['alpha']:g} tau={c['tau']:.4g} "
          f"n={c['n']} d={c['d']} samples={c['samples']} layers={c['layers']} dtype={c['dtype']} device={c['device']}")
    print(f"guarantee: {out['guarantee']}  (holds for these parameters: {out['guaranteed']})")
    energies = np.array(out["energies"], dtype=float)
    print("layer  mean energy        min step change")
    for t in range(energies.shape[1]):
        with np.errstate(invalid="ignore", over="ignore"):   # inf - inf: the verdict below names it, no warning
            change = "" if t == 0 else f"{np.min(energies[:, t] - energies[:, t - 1]): .3e}"
            print(f"{t:5d}  {energies[:, t].mean(): .10e}  {change}")
    for name, term in out["terms"].items():
        print(f"term {name:10s} increases={term['increases']} non-finite={term['nonfinite']} "
              f"max_increase={term['max_increase']}")
    print(f"tolerance: {out['tol_rule']}")
    verdict = {"descent": "monotone descent", "increase": "ENERGY INCREASED",
               "nonfinite": "NON-FINITE ENERGY (a failed check)"}[out["verdict"]]
    print(f"{verdict}: {out['increases']} failed checks in {out['steps']} layer-steps "
          f"({out['nonfinite']} non-finite), max relative increase {out['max_rel_increase']}")
    for v in out["violations"][:5]:
        if v["kind"] == "nonfinite_tokens":
            print(f"  sample {v['sample']}: {v['message']}")
            continue
        print(f"  sample {v['sample']} layer {v['layer']} ({v['level']} {v['step']}, {v['kind']}): "
              f"{v['before']} -> {v['after']} (change {v['increase']}, tol {v['tol']}); terms up: {v['terms_up']}"
              + (f"; non-finite terms: {v['nonfinite_terms']}" if v["kind"] == "nonfinite" else ""))


def main(argv: Optional[List[str]] = None) -> int:
    """The checker under the project's error contract (`unfold.cli.run_main`); argparse exits 2 itself
    on an unknown option or a value its converter refuses."""
    return run_main(PROG, lambda: _main(argv), argv)


def _main(argv: Optional[List[str]]) -> int:
    """Parse, check and report. The report goes to the standard output as it was on entry; the check itself runs
    with ``sys.stdout`` sent to stderr (`unfold.plugins.plugin_output`), so that a plug-in's prints (a penalty, a
    graph builder) never mix with it."""
    args = build_parser().parse_args(argv)          # --help to stdout; --import's prints go to stderr
    out_file = sys.stdout
    with plugin_output():
        out = run(args)
    _print_human(out, out_file)
    if args.json:
        print(json_dumps(out), file=out_file)
    out_file.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
