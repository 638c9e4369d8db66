"""TF-IDF + logistic regression baseline, without scikit-learn.

``python -m experiments.app.tfidf --dataset rotten_tomatoes [--seed S] [--json]``

Features: word n-grams (1-2 by default) of `experiments.data.tokenize`, vocabulary and
document frequencies from the training split only (``min_df``), weights ``tf * idf`` with the
smoothed ``idf = ln((1 + N) / (1 + df)) + 1`` (N training documents), raw counts as ``tf`` or
``1 + ln(count)`` with ``sublinear_tf=True`` (off by default: in short texts nearly every count is
one), each row scaled to unit l2 norm. N-grams unseen in training are dropped.

Model: multinomial logistic regression, one weight column per class plus an unpenalised bias,
minimising ``C * sum_i CE_i + ||W||^2 / 2`` (scikit-learn's convention, L2 strength ``1 / C``),
by full-batch L-BFGS (strong Wolfe line search) in float64 on torch sparse CSR matrices until
the largest entry of the gradient of the objective divided by N falls below ``tol``; Cs are fitted in
increasing order, each warm-started from the previous solution. ``C`` is picked on
the validation split (first best in the order given); the test split is scored once, with it.

The last line printed is a JSON object: dataset, test_accuracy, val_accuracy, best_C,
val_accuracy_by_C, features, seconds.

The data come from `experiments.data.load_dataset`, so the baseline refuses what the trainer refuses
(colliding labels, an empty split, one class), each as one ``error:`` line with exit 2.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Sequence

import torch

from experiments.data import DataError, Splits, check_classes, folder_arg, load_dataset, split_seed_arg, tokenize
from unfold.cli import positive_float, positive_int, run_main
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps


def ngrams(tokens: Sequence[str], ngram=(1, 2)) -> list[str]:
    """All n-grams of ``tokens`` for ``n`` in ``ngram[0] .. ngram[1]``, joined by a space."""
    lo, hi = ngram
    out = []
    for n in range(lo, hi + 1):
        out.extend(" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return out


class TfidfVectorizer:
    """Fit n-gram TF-IDF statistics on training texts; turn texts into l2-normalised sparse rows."""

    def __init__(self, ngram=(1, 2), min_df: int = 1, sublinear_tf: bool = False):
        if len(ngram) != 2 or not 1 <= ngram[0] <= ngram[1]:
            raise DataError(f"ngram must be (lo, hi) with 1 <= lo <= hi, got {ngram!r}")
        if isinstance(min_df, bool) or not isinstance(min_df, int) or min_df < 1:
            raise DataError(f"min_df must be an integer >= 1, got {min_df!r}")
        self.ngram, self.min_df, self.sublinear_tf = tuple(ngram), min_df, sublinear_tf
        self.index: dict[str, int] = {}
        self.idf: torch.Tensor | None = None

    def fit(self, texts: Sequence[str]) -> TfidfVectorizer:
        """Vocabulary (n-grams in at least ``min_df`` documents, sorted) and idf from ``texts``."""
        df = collections.Counter()
        for t in texts:
            df.update(set(ngrams(tokenize(t), self.ngram)))
        terms = sorted(g for g, c in df.items() if c >= self.min_df)
        self.index = {g: i for i, g in enumerate(terms)}
        n = len(texts)
        self.idf = torch.tensor([math.log((1 + n) / (1 + df[g])) + 1.0 for g in terms], dtype=torch.float64)
        return self

    def transform(self, texts: Sequence[str]) -> torch.Tensor:
        """Sparse CSR float64 matrix (len(texts), features) of l2-normalised TF-IDF rows."""
        if self.idf is None:
            raise RuntimeError("fit the vectorizer first")
        crow, cols, vals = [0], [], []
        for t in texts:
            counts = collections.Counter(g for g in ngrams(tokenize(t), self.ngram) if g in self.index)
            row = sorted((self.index[g], c) for g, c in counts.items())
            w = [(1.0 + math.log(c)) if self.sublinear_tf else float(c) for _, c in row]
            w = [wi * float(self.idf[j]) for wi, (j, _) in zip(w, row)]
            norm = math.sqrt(sum(x * x for x in w)) or 1.0
            cols.extend(j for j, _ in row)
            vals.extend(x / norm for x in w)
            crow.append(len(cols))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(torch.tensor(crow, dtype=torch.int64), torch.tensor(cols, dtype=torch.int64),
                                           torch.tensor(vals, dtype=torch.float64),
                                           size=(len(texts), len(self.index)), check_invariants=True)


def fit_logreg(X: torch.Tensor, y: torch.Tensor, num_classes: int, C: float, init=None,
               tol: float = 1e-6, max_iter: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression with L2 strength ``1 / C`` by full-batch L-BFGS (float64).

    Minimises ``(C * sum_i CE_i + ||W||^2 / 2) / N`` over ``W`` (features x classes) and an
    unpenalised bias ``b``; the gradient is computed in closed form through the sparse ``X``
    and ``X^T``. Stops when the largest gradient entry is below ``tol`` (a RuntimeWarning if
    ``max_iter`` ran out first). ``init`` = ``(W, b)`` warm-starts. Returns ``(W, b)``.

    With two classes this softmax form, one penalised column per class, equals a binary
    (sigmoid) logistic regression with ``C`` doubled: at the optimum ``W[:, 1] = -W[:, 0]``.
    """
    n, f = X.shape
    Xt = X.t().to_sparse_csr()
    Y = torch.nn.functional.one_hot(y, num_classes).to(torch.float64)
    W = torch.zeros(f, num_classes, dtype=torch.float64) if init is None else init[0].clone()
    b = torch.zeros(num_classes, dtype=torch.float64) if init is None else init[1].clone()
    params = torch.cat([W.reshape(-1), b]).requires_grad_(False)
    theta = torch.nn.Parameter(params)
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=max_iter, history_size=20, tolerance_grad=tol,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure():
        with torch.no_grad():
            Wc = theta[:f * num_classes].view(f, num_classes)
            bc = theta[f * num_classes:]
            logits = X @ Wc + bc
            lse = torch.logsumexp(logits, dim=1)
            loss = (C * (lse - (logits * Y).sum(1)).sum() + 0.5 * (Wc * Wc).sum()) / n
            R = C * (torch.softmax(logits, dim=1) - Y) / n
            gW = Xt @ R + Wc / n
            theta.grad = torch.cat([gW.reshape(-1), R.sum(0)])
        return loss

    opt.step(closure)
    closure()
    if float(theta.grad.abs().max()) > 10 * tol:
        warnings.warn(f"L-BFGS stopped before convergence (C={C}, max |grad| = "
                      f"{float(theta.grad.abs().max()):.2e} > {10 * tol:.0e})", RuntimeWarning, stacklevel=2)
    with torch.no_grad():
        return theta[:f * num_classes].view(f, num_classes).clone(), theta[f * num_classes:].clone()


def accuracy(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of rows of ``X`` whose arg-max class under ``(W, b)`` is ``y``."""
    if X.shape[0] == 0:
        return float("nan")
    return float(((X @ W + b).argmax(1) == y).double().mean())


def tfidf_logreg(splits: Splits, ngram=(1, 2), min_df: int = 1, Cs=(0.25, 0.5, 1, 2, 4, 8, 16), seed: int = 0,
                 sublinear_tf: bool = False) -> dict:
    """Fit TF-IDF + logistic regression on ``splits.train``, pick C on val, score test.

    The fit is deterministic (zero init, full batch); ``seed`` only seeds torch for form's sake
    and is reported. Refused (`DataError`): an empty split, training data of one class, label names
    that collide or do not match the class ids (`experiments.data.check_classes`, the check every loaded
    dataset passes: a baseline on a dataset the trainer refuses would compare against nothing), a C that is not
    a finite positive number, no n-gram kept (``min_df`` above every count). Returns ``test_accuracy``, ``val_accuracy``, ``best_C``,
    ``val_accuracy_by_C``, ``features`` (number of n-grams) and ``seconds``.
    """
    if not Cs or any(isinstance(c, bool) or not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0)
                     for c in Cs):
        raise DataError(f"Cs must be a non-empty list of finite positive numbers, got {Cs!r}")
    empty = [s for s in ("train", "val", "test") if not getattr(splits, s)]
    if empty:
        raise DataError(f"dataset {splits.name}: the TF-IDF baseline needs non-empty train, val and test splits; "
                        f"empty: {', '.join(empty)}")
    check_classes(splits)      # one class in training: any classifier is "100 % accurate", which means nothing
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    vec = TfidfVectorizer(ngram, min_df, sublinear_tf).fit([t for t, _ in splits.train])
    if not vec.index:          # a bias-only model: its "accuracy" is the majority class share, not a baseline
        raise DataError(f"dataset {splits.name}: no {ngram[0]}-{ngram[1]}-gram occurs in min_df={min_df} of its "
                        f"{len(splits.train)} training texts: no features")
    Xs = {s: vec.transform([t for t, _ in getattr(splits, s)]) for s in ("train", "val", "test")}
    ys = {s: torch.tensor([lab for _, lab in getattr(splits, s)], dtype=torch.long) for s in ("train", "val", "test")}
    by_C, models, init = {}, {}, None
    for C in sorted(Cs):                   # warm start: each C from the solution of the previous
        init = models[C] = fit_logreg(Xs["train"], ys["train"], splits.num_classes, float(C), init=init)
        by_C[C] = accuracy(Xs["val"], ys["val"], *init)
    best_C = next(c for c in Cs if by_C[c] == max(by_C.values()))
    W, b = models[best_C]
    best = {
        "dataset": splits.name,
        "test_accuracy": accuracy(Xs["test"], ys["test"], W, b),
        "val_accuracy": by_C[best_C],
        "best_C": best_C,
        "val_accuracy_by_C": {str(c): by_C[c] for c in Cs},
        "features": len(vec.index),
        "train_accuracy": accuracy(Xs["train"], ys["train"], W, b),
        "ngram": list(ngram), "min_df": min_df, "sublinear_tf": sublinear_tf, "seed": seed,
        "sizes": splits.sizes(),
    }
    best["seconds"] = time.perf_counter() - t0
    return best


PROG = "python -m experiments.app.tfidf"


def main(argv=None) -> int:
    """Command line: run the baseline on one dataset; the last line printed is JSON (errors:
    `unfold.cli.run_main`)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--dataset", default="rotten_tomatoes", help="a name load_dataset accepts")
    p.add_argument("--seed", type=split_seed_arg, default=0, help="split seed, in [0, 2**32)")
    p.add_argument("--data-dir", type=folder_arg, default=None)
    p.add_argument("--min-df", type=positive_int, default=1)
    p.add_argument("--ngram", type=positive_int, nargs=2, default=(1, 2), metavar=("LO", "HI"))
    p.add_argument("--sublinear-tf", action="store_true")
    p.add_argument("--Cs", type=positive_float, nargs="+", default=[0.25, 0.5, 1, 2, 4, 8, 16])
    p.add_argument("--max-train-examples", type=positive_int, default=None, metavar="N",
                   help="train on the first N training examples only (as train.max_train_examples does)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch CPU threads (default 1: the sparse products are small and memory-bound)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    args = p.parse_args(argv)
    if args.ngram[0] > args.ngram[1]:
        p.error(f"argument --ngram: LO {args.ngram[0]} must not exceed HI {args.ngram[1]}")

    def body() -> int:
        torch.set_num_threads(args.threads)
        splits = load_dataset(args.dataset, seed=args.seed, data_dir=args.data_dir)
        if args.max_train_examples is not None:
            splits = dataclasses.replace(splits, train=splits.train[:args.max_train_examples])
        res = tfidf_logreg(splits, ngram=tuple(args.ngram), min_df=args.min_df, Cs=tuple(args.Cs),
                           seed=args.seed, sublinear_tf=args.sublinear_tf)
        if not args.json:
            print(f"{res['dataset']}: {res['features']} features, best C = {res['best_C']}, "
                  f"val {res['val_accuracy']:.4f}, test {res['test_accuracy']:.4f} ({res['seconds']:.1f} s)")
        print(json_dumps(res, sort_keys=True))
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
