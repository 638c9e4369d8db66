"""Convex heads on frozen token features of the text task, solved to certified optimality.

``python -m experiments.studies.convex_heads [--quick] [--features glove model] [--checkpoint runs/default/best.pt]
[--out runs/convex_heads] [--json]``

Every head of `convex.heads` is fitted (softmax cross-entropy, ``beta = --beta-frac x beta_max``,
``--method newton`` by default: ``--warmup`` monotone FISTA steps with singular-value thresholding, then
proximal steps alternating with trust-region Newton-CG steps on the Burer-Monteiro factors, until the
relative duality gap is below ``--tol``; ``fista`` and ``pg`` are the first-order methods alone)
on frozen token features: GloVe 50d vectors, and the last layer Y_T of a trained unfolded model
(``--checkpoint``; skipped with a note when the file does not exist). Features are projected on
their top ``--dim`` right singular vectors (uncentred, so padded tokens stay zero; fitted on the
training tokens) and sequences cut to ``--tokens`` tokens, as the paper reduces its gMLP features
to d = 100. Writes ``table.md`` (test accuracy, objective, duality gap, rank, parameters of the
equivalent non-convex head, fit time, iterations, applications of A and A*, objective increases),
``results.json`` and ``objective.png`` (objective minus its final value per recorded step) to ``--out``;
with ``--json`` the last line is ``{"FEATURES/HEAD": {...}}``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, List

import torch

from convex import HEADS, make_head, map_back, solve
from convex.solver import METHODS
from convex.solver import beta_max
from energies.errors import CheckpointError, ConfigError, TokenError
from unfold.cli import nonnegative_float, nonnegative_int, positive_int, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_open
from ..app.config import load_config
from ..runfolder.atomic import atomic_write_text
from ..app.build import build_data

PROG = "python -m experiments.studies.convex_heads"
HEAD_OPTIONS = {"mlp_gated": {"gates": 4}, "sa_gated": {"gates": 2}, "mixer_gated": {"gates": 2},
                "sa_block": {"groups": 2}, "bfno": {"groups": 2}}
#: the most float64 entries the blocks Z of one head may have (512 MB), checked before it is fitted
MAX_BLOCK_ENTRIES = 2 ** 26


def beta_fraction(text: str) -> float:
    """``--beta-frac``: beta as a fraction of beta_max, in (0, 1] (at 1 and above the solution is Z = 0)."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number in (0, 1] (beta / beta_max)")
    return v


def _subset(tensors, n, seed, tokens):
    """A seeded subset of ``n`` examples (all with None), padded to exactly ``tokens`` slots."""
    ids, mask, labels = tensors
    if n is not None and n < len(labels):
        idx = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:n]
        ids, mask, labels = ids[idx], mask[idx], labels[idx]
    pad = tokens - ids.shape[1]
    if pad > 0:
        ids = torch.nn.functional.pad(ids, (0, pad))
        mask = torch.nn.functional.pad(mask, (0, pad))
    return ids[:, :tokens], mask[:, :tokens], labels


@torch.no_grad()
def token_features(kind: str, ids, mask, glove, model=None, batch: int = 256) -> torch.Tensor:
    """``(N, s, d)`` float64 features: GloVe vectors, or the trained model's last layer Y_T."""
    if kind == "glove":
        return glove.to(torch.float64)[ids] * mask[..., None]
    out = []
    for i in range(0, len(ids), batch):
        m = mask[i:i + batch]
        out.append(model.encoder(model.embedding(ids[i:i + batch]), m).Y)
    return torch.cat(out) * mask[..., None]


def projection(X: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Top ``dim`` right singular vectors of the real training tokens, scaled to unit token RMS."""
    T = X[mask]
    if T.shape[0] < 1:
        raise TokenError("the training examples hold no real token")
    if not bool(torch.isfinite(T).all()):
        raise TokenError("the training features hold NaN or Inf")
    if dim > min(T.shape):
        raise ConfigError(f"--dim {dim} exceeds the rank bound of the training features: {T.shape[1]} features, "
                          f"{T.shape[0]} real tokens")
    _, S, Vh = torch.linalg.svd(T, full_matrices=False)
    P = Vh[:dim].T
    rms = float((T @ P).pow(2).sum(-1).mean().sqrt())
    if not (math.isfinite(rms) and rms > 0):
        raise TokenError(f"the training features cannot be scaled to unit RMS (RMS of the projection {rms:g}; "
                         f"largest |feature| {float(T.abs().max()):.3g})")
    return P / rms


def fit_all(kind, train, test, Xtr, Xte, heads: List[str], args) -> Dict[str, dict]:
    (_, mtr, ytr), (_, mte, yte) = train, test
    P = projection(Xtr, mtr, args.dim)
    Xtr, Xte = Xtr @ P * mtr[..., None], Xte @ P * mte[..., None]
    c = int(max(ytr.max(), yte.max())) + 1
    Y = ytr                                   # class labels: the solver one-hot encodes (and checks) them
    rows = {}
    for name in heads:
        head = make_head(name, args.dim, Xtr.shape[1], c, seed=args.seed, **HEAD_OPTIONS.get(name, {}))
        entries = sum(r * q for r, q in head.blocks())
        if entries > MAX_BLOCK_ENTRIES:
            raise ConfigError(f"head {name} with --dim {args.dim}, --tokens {args.tokens} and {c} classes has "
                              f"{entries} convex variables, more than {MAX_BLOCK_ENTRIES}: lower --dim or --tokens")
        t0 = time.perf_counter()
        data = head.prepare(Xtr, mtr)
        bmax = beta_max(head, data, Y)
        sol = solve(head, data, Y, args.beta_frac * bmax, method=args.method, max_iter=args.max_iter, tol=args.tol,
                    warmup=args.warmup, cg_iters=args.cg_iters)
        seconds = time.perf_counter() - t0
        pred = head.forward(sol.Z, head.prepare(Xte, mte)).argmax(-1)
        weights = map_back(head, sol.Z)
        rep = sol.report()
        rows[f"{kind}/{name}"] = {
            "features": kind, "head": name, "equation": head.equation,
            "test_accuracy": float((pred == yte).double().mean()),
            "train_accuracy": float((head.forward(sol.Z, data).argmax(-1) == ytr).double().mean()),
            "objective": sol.certificate["objective"], "duality_gap_rel": sol.certificate["duality_gap_rel"],
            "optimality_ratio": sol.certificate["optimality_ratio"], "beta": sol.beta, "beta_max": bmax,
            "rank": sol.rank, "ranks": sol.ranks, "converged": sol.converged, "iterations": sol.iterations,
            "objective_increases": rep.num_increases, "seconds": seconds, "operator_calls": sol.operator_calls,
            "newton_steps": sol.newton_steps,
            "nonconvex_params": sum(W1.numel() + W2.numel() for _, W1, W2 in weights),
            "convex_variables": sum(r * q for r, q in head.blocks()),
            "curve": (sol.objective_curve() - sol.certificate["objective"]).tolist(),
        }
        r = rows[f"{kind}/{name}"]
        print(f"{kind:5s} {name:13s} test {r['test_accuracy']:.4f} objective {r['objective']:.6f} gap "
              f"{r['duality_gap_rel']:.1e} rank {r['rank']} iterations {r['iterations']} {seconds:.1f}s", file=sys.stderr, flush=True)
    return rows


def plot(rows: Dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({r["features"] for r in rows.values()})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for key, r in rows.items():
            if r["features"] != kind:
                continue
            gap = torch.tensor(r["curve"]).clamp_min(1e-16)
            ax.semilogy(gap.numpy(), label=f"{r['head']} (eq. {r['equation']})")
        ax.set_title(f"{kind} features: objective minus final objective")
        ax.set_xlabel("recorded step (FISTA, proximal or Newton)")
        ax.set_ylabel("P(Z_k) - P(Z_final)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


def markdown(rows: Dict[str, dict], args) -> str:
    method = (f"newton (FISTA warm-up {args.warmup}, at most {args.cg_iters} CG products a Newton step)"
              if args.method == "newton" else args.method)
    lines = [f"{args.train_examples} training examples, {args.tokens} tokens, d = {args.dim}, beta = "
             f"{args.beta_frac} x beta_max, softmax cross-entropy, {method}, max {args.max_iter} iterations, "
             f"tol {args.tol:g}.", "",
             "| features | head | eq. | test acc | objective | duality gap (rel) | rank | non-convex params "
             "| fit s | iterations | A/A* calls | objective increases |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.values():
        lines.append(f"| {r['features']} | {r['head']} | {r['equation']} | {r['test_accuracy']:.4f} | "
                     f"{r['objective']:.5f} | {r['duality_gap_rel']:.1e} | {r['rank']} | {r['nonconvex_params']} | "
                     f"{r['seconds']:.1f} | {r['iterations']} | {r['operator_calls']} | {r['objective_increases']} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--quick", action="store_true", help="a small version (under two minutes on a CPU)")
    p.add_argument("--features", nargs="+", default=["glove", "model"], choices=["glove", "model"])
    p.add_argument("--checkpoint", default="runs/default/best.pt", help="trained unfolded model for 'model' features")
    p.add_argument("--config", default="default", help="data section of this config (a file or a shipped config name)")
    p.add_argument("--heads", nargs="+", default=sorted(HEADS), metavar="HEAD")
    p.add_argument("--out", default="runs/convex_heads")
    p.add_argument("--dim", type=positive_int, default=None, help="feature dimension after projection (default 12, quick 6)")
    p.add_argument("--tokens", type=positive_int, default=None, help="tokens kept per text (default 32, quick 16)")
    p.add_argument("--train-examples", type=positive_int, default=None, help="default 2000, quick 300")
    p.add_argument("--beta-frac", type=beta_fraction, default=0.02, help="beta / beta_max, in (0, 1]")
    p.add_argument("--method", default="newton", choices=list(METHODS),
                   help="newton (default): FISTA warm-up, then proximal + Newton-CG steps; fista; pg")
    p.add_argument("--warmup", type=nonnegative_int, default=50, help="newton: FISTA steps before the first Newton step")
    p.add_argument("--cg-iters", type=positive_int, default=100,
                   help="newton: most Hessian-vector products (CG iterations) per Newton step")
    p.add_argument("--max-iter", type=positive_int, default=None, help="default 2000, quick 800")
    p.add_argument("--tol", type=nonnegative_float, default=1e-7, help="relative duality gap to stop at (>= 0)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--json", action="store_true", help="end with one JSON line of per-head results")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides (data section)")
    return p


def check_out(path: str) -> None:
    """``--out``: a folder that exists and is writable, or can be created (its nearest existing parent is a
    writable folder); checked before any work, so that a run never fails at its end."""
    if not path:
        raise ConfigError("--out must name a folder, got ''")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--out {path!r} is a file, not a folder")
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(f"--out {path!r}: {probe!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {path!r}: folder {probe!r} is not writable")


def load_trained(checkpoint: str):
    """``(model, vocab)`` of a training run's checkpoint (and the run's ``vocab.json`` beside it); any failure
    is a [`CheckpointError`][energies.CheckpointError] naming the file."""
    from ..data import Vocab
    from .spline_probe import load_model

    if os.path.isdir(checkpoint):
        raise CheckpointError(f"--checkpoint {checkpoint!r} is a folder, not a checkpoint file")
    try:
        model = load_model(checkpoint=checkpoint)
    except CheckpointError as exc:
        raise CheckpointError(f"--checkpoint: {exc}") from None
    except (KeyError, TypeError, IndexError, AttributeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"--checkpoint {checkpoint!r} is not a training checkpoint of this project "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
    vocab_path = os.path.join(os.path.dirname(checkpoint), "vocab.json")
    try:
        vocab = Vocab.load(vocab_path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"--checkpoint {checkpoint!r}: its run's vocabulary {vocab_path!r} cannot be read "
                              f"({' '.join(str(exc).split())[:160]})") from None
    return model, vocab


def main(argv=None) -> int:
    return run_main(PROG, lambda: _main(argv), argv)


def _parse_args(argv) -> argparse.Namespace:
    """The command line, with the defaults that depend on ``--quick`` filled in and unknown heads refused."""
    args = build_parser().parse_args(argv)
    q = args.quick
    args.dim = args.dim or (6 if q else 12)
    args.tokens = args.tokens or (16 if q else 32)
    args.train_examples = args.train_examples or (300 if q else 2000)
    args.max_iter = args.max_iter or (800 if q else 2000)
    args.heads = list(dict.fromkeys(args.heads))
    args.features = list(dict.fromkeys(args.features))
    unknown = [h for h in args.heads if h not in HEADS]
    if unknown:
        raise ConfigError(f"unknown head(s) {unknown}; valid: {sorted(HEADS)}")
    return args


def _load_trained_if_asked(args):
    """``(model, vocab)`` for ``model`` features when ``--checkpoint`` exists, else None (with a note if asked)."""
    trained = None           # the model is loaded (and checked) before any data is read
    if "model" in args.features:
        if os.path.isfile(args.checkpoint) or os.path.isdir(args.checkpoint):
            trained = load_trained(args.checkpoint)
        else:
            print(f"model features skipped: {args.checkpoint} does not exist (train one with "
                  "unfold-train --config experiments/configs/default.yaml)", file=sys.stderr)
    return trained


def _fit_features(args, splits, tensors, glove, trained, n_test) -> Dict[str, dict]:
    """``{"FEATURES/HEAD": row}``: every head fitted on each kind of features asked for."""
    train = _subset(tensors["train"], args.train_examples, args.seed, args.tokens)
    test = _subset(tensors["test"], n_test, args.seed, args.tokens)
    rows: Dict[str, dict] = {}
    for kind in args.features:
        model = None
        if kind == "model":
            if trained is None:
                continue
            from ..data import encode

            model, run_vocab = trained
            enc = {n: encode(ex, run_vocab, args.tokens) for n, ex in (("train", splits.train), ("test", splits.test))}
            tr = _subset(enc["train"], args.train_examples, args.seed, args.tokens)
            te = _subset(enc["test"], n_test, args.seed, args.tokens)
        else:
            tr, te = train, test
        Xtr = token_features(kind, tr[0], tr[1], glove, model)
        Xte = token_features(kind, te[0], te[1], glove, model)
        rows.update(fit_all(kind, tr, te, Xtr, Xte, args.heads, args))
    return rows


def _write_results(rows: Dict[str, dict], args) -> None:
    """Write ``table.md``, ``results.json`` and ``objective.png`` to ``--out``; print the table (and the JSON line)."""
    os.makedirs(args.out, exist_ok=True)
    table = markdown(rows, args)
    atomic_write_text(table, os.path.join(args.out, "table.md"))
    atomic_write_text(json_dumps(rows, indent=1), os.path.join(args.out, "results.json"))
    if rows:
        plot(rows, os.path.join(args.out, "objective.png"))
    print(table)
    if args.json:
        keep = ("objective", "duality_gap_rel", "objective_increases", "rank", "test_accuracy", "converged",
                "iterations", "operator_calls", "seconds", "nonconvex_params")
        print(json_dumps({k: {f: (None if isinstance(r[f], float) and not math.isfinite(r[f]) else r[f]) for f in keep}
                          for k, r in rows.items()}))


def _main(argv) -> int:
    """The experiment (module docstring): options checked, the model loaded, then data, fits and the outputs."""
    args = _parse_args(argv)
    check_out(args.out)
    cfg = load_config(args.config, [f"data.max_len={args.tokens}", *args.set])
    if cfg["data"]["glove"] == "none" and "glove" in args.features:
        raise ConfigError("glove features need data.glove != none")
    trained = _load_trained_if_asked(args)
    splits, vocab, tensors, glove = build_data(cfg)
    n_test = 300 if args.quick else None
    rows = _fit_features(args, splits, tensors, glove, trained, n_test)
    _write_results(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
