"""Depth chosen by the energy: ``python -m experiments.studies.depth RUN_DIR [--eps 1e-1,1e-2,1e-3,1e-4,0]
[--depths 1,2,4,8,16] [--json] [--out DIR] [--quick] [--device cpu]``.

Loads a finished run (its bundle, `experiments.app.bundle.load_model`: hashes checked, weights read with
``torch.load(weights_only=True)``) and evaluates it on the run's test split (checked against the bundle's data
fingerprint), in float64 with the energy trace on, two ways:

* **stopping rule** (``--eps``): for each EPS the shared step runs at most the trained depth T, and an example
  stops after the first layer k whose relative energy decrease (E_{k-1} - E_k) / max(|E_{k-1}|, tiny) is below
  EPS ([`unfold.GuaranteedEncoder`][unfold.GuaranteedEncoder], ``stop_rel``; EPS = 0: off, every example runs T layers):
  accuracy, mean layers used, the histogram of depths, and the descent verdict over every layer that ran;
* **inference depth** (``--depths``; default 1 ... 4T: 1, 2, T/2, T, 2T, 3T, 4T and the powers of two up to 4T):
  the shared step unrolled K times instead of T: accuracy, the verdict (energy increases: 0 expected, every
  layer of a weight-shared MM step descends) and the mean final energy.

Writes ``depth.json``, ``depth.md`` and ``depth.png`` (two panels: accuracy and mean layers used against EPS;
accuracy against inference depth), each atomically (`experiments.runfolder.atomic`), into ``--out`` (default
``RUN_DIR/depth``); ``--json`` prints the JSON document on one line, else the markdown. ``--quick``: the first
`QUICK_EXAMPLES` test examples only (the documents say so). Only for weight-shared encoders that take
``stop_rel`` (guaranteed): an untied free/baseline run is refused. Every error is one line, exit 2
(`unfold.cli.run_main`), nothing written. The evaluation helper `evaluate_at` is the Python call.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from energies.errors import ConfigError, InputError
from unfold.cli import folder_arg, folder_problem, run_main
from unfold.devices import check_device
from unfold.inputs import MAX_INFERENCE_LAYERS, check_batch_size, check_inference_layers, check_stop_rel
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_open

__all__ = ["evaluate_at", "study", "default_depths", "parse_eps", "parse_depths", "DEFAULT_EPS", "QUICK_EXAMPLES"]

PROG = "python -m experiments.studies.depth"
DEFAULT_EPS = (1e-1, 1e-2, 1e-3, 1e-4, 0.0)
#: test examples a ``--quick`` study evaluates (the first ones of the split)
QUICK_EXAMPLES = 128
STOP_RULE = ("an example runs layer k+1 iff it ran layer k and (E_{k-1} - E_k) / max(|E_{k-1}|, tiny) >= EPS "
             "(E_k: its float64 total energy at Y_k); layer 1 always runs; EPS = 0: off")


def _split_list(text: str, what: str) -> List[str]:
    items = [t.strip() for t in str(text).split(",")]
    if not text.strip() or any(not t for t in items):
        raise ConfigError(f"{what} {text!r}: a comma-separated list without empty items, e.g. "
                          f"{'1e-2,1e-3,0' if what == '--eps' else '1,2,4,8'}")
    return items


def parse_eps(text: str) -> List[float]:
    """``--eps``: comma-separated thresholds, each 0 (off) or a finite number in (0, 1)
    (`unfold.inputs.check_stop_rel`), distinct; kept in the given order."""
    out: List[float] = []
    for item in _split_list(text, "--eps"):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"--eps {item!r} is not a number (0 for off, or a finite number in (0, 1))") from None
        eps = check_stop_rel(value, f"--eps value {item!r}")
        value = 0.0 if eps is None else eps
        if value in out:
            raise ConfigError(f"--eps {text!r} lists {item} twice")
        out.append(value)
    return out


def parse_depths(text: str) -> List[int]:
    """``--depths``: comma-separated inference depths, integers in [1, MAX_INFERENCE_LAYERS]; sorted, distinct."""
    out = set()
    for item in _split_list(text, "--depths"):
        try:
            value = int(item)
        except ValueError:
            raise ConfigError(f"--depths {item!r} is not an integer (an inference depth >= 1)") from None
        if not 1 <= value <= MAX_INFERENCE_LAYERS:
            raise ConfigError(f"--depths {item!r} must lie in [1, {MAX_INFERENCE_LAYERS}]")
        out.add(value)
    return sorted(out)


def default_depths(trained: int) -> List[int]:
    """1 ... 4T: 1, 2, T/2, T, 2T, 3T, 4T and every power of two up to 4T."""
    T = int(trained)
    out = {1, 2, max(T // 2, 1), T, 2 * T, 3 * T, 4 * T} | {2 ** i for i in range(0, 13) if 2 ** i <= 4 * T}
    return sorted(d for d in out if 1 <= d <= min(4 * T, MAX_INFERENCE_LAYERS))


@torch.no_grad()
def evaluate_at(model, tensors, batch_size: int = 64, device="cpu", layers: Optional[int] = None,
                stop_rel: Optional[float] = None) -> Dict[str, Any]:
    """Evaluate a classifier with a weight-shared encoder at another depth and/or with the energy-chosen depth:
    ``layers`` (None: the trained depth; `unfold.inputs.check_inference_layers`, so an untied stack is
    refused naming ``layers``), ``stop_rel`` (None/0: off; else EPS in (0, 1)). ``tensors``: ``(ids, mask,
    labels)``. The model is used as it is (its dtype, eval mode; its encoder's ``stop_rel`` is set for the call
    and restored), with the trace on. Returns ``accuracy``, ``mean_layers``, ``layers_hist`` (depth -> examples), the verdict over every layer
    that ran (``steps``, ``frozen_steps``, ``increases``, ``nonfinite``, ``max_rel_increase``) and the mean
    energy at the input and after the last layer."""
    encoder = model.encoder
    layers = check_inference_layers(encoder, layers)
    batch_size = check_batch_size(batch_size)
    eps = check_stop_rel(stop_rel)
    _check_tensors(model, tensors)
    if eps is not None and not hasattr(encoder, "stop_rel"):
        raise ConfigError(f"stop_rel={stop_rel!r}: the {getattr(encoder, 'kind', type(encoder).__name__)} encoder "
                          "has no energy-chosen depth")
    own = getattr(encoder, "stop_rel", None)
    if hasattr(encoder, "stop_rel"):
        encoder.stop_rel = eps
    try:
        return _evaluate(model, tensors, batch_size, device, layers)
    finally:
        if hasattr(encoder, "stop_rel"):
            encoder.stop_rel = own


def _check_tensors(model, tensors) -> None:
    """``tensors`` as `evaluate_at` reads them: ``(ids (N, n), mask (N, n), labels (N,))`` with N >= 1 and
    integer labels in [0, K) (K: the model's classes), else an [`InputError`][energies.InputError] naming what is
    wrong -- never an accuracy over nothing, nor one counted against labels no class can match."""
    if not isinstance(tensors, (tuple, list)) or len(tensors) != 3:
        raise InputError(f"tensors must be (ids, mask, labels), got {type(tensors).__name__}"
                         + (f" of {len(tensors)}" if isinstance(tensors, (tuple, list)) else ""))
    ids, mask, labels = tensors
    for name, t, ndim in (("ids", ids, 2), ("mask", mask, 2), ("labels", labels, 1)):
        if not isinstance(t, torch.Tensor) or t.ndim != ndim:
            raise InputError(f"tensors: {name} must be a {ndim}-d tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise InputError(f"tensors: labels must be integer class ids, got {labels.dtype}")
    if not (ids.shape[0] == mask.shape[0] == labels.shape[0]) or ids.shape != mask.shape:
        raise InputError(f"tensors: ids {tuple(ids.shape)}, mask {tuple(mask.shape)} and labels {tuple(labels.shape)} "
                         "must hold the same examples")
    if labels.numel() == 0:
        raise InputError("tensors: no example to evaluate (labels is empty)")
    classes = getattr(getattr(model, "head", None), "out_features", None)
    if isinstance(classes, int):
        bad = (labels < 0) | (labels >= classes)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise InputError(f"tensors: labels must lie in [0, {classes}) (the model's classes), got {int(labels[i])} "
                             f"at {i}")


def _evaluate(model, tensors, batch_size, device, layers) -> Dict[str, Any]:
    model.eval()
    ids, mask, labels = tensors
    correct = total = steps = frozen = increases = nonfinite = 0
    max_rel, used_sum, first_sum, last_sum = 0.0, 0, 0.0, 0.0
    hist: Dict[int, int] = {}
    for start in range(0, int(labels.numel()), batch_size):
        b_ids, b_mask = ids[start:start + batch_size].to(device), mask[start:start + batch_size].to(device)
        b_labels = labels[start:start + batch_size].to(device)
        out = model(b_ids, b_mask, trace=True, layers=layers)
        rep = out.report()
        correct += int((out.logits.argmax(-1) == b_labels).sum())
        total += int(b_labels.numel())
        used = out.layers_used.cpu()
        used_sum += int(used.sum())
        for k, n in zip(*torch.unique(used, return_counts=True)):
            hist[int(k)] = hist.get(int(k), 0) + int(n)
        steps, frozen = steps + rep.steps, frozen + rep.frozen_steps
        increases, nonfinite = increases + rep.num_increases, nonfinite + rep.num_nonfinite
        max_rel = max(max_rel, rep.max_rel_increase())
        totals = rep.totals
        first_sum += float(totals[:, 0].sum())
        last_sum += float(totals[:, -1].sum())
    n = max(total, 1)
    return {"accuracy": correct / n, "mean_layers": used_sum / n,
            "layers_hist": {str(k): hist[k] for k in sorted(hist)}, "steps": steps, "frozen_steps": frozen,
            "increases": increases, "nonfinite": nonfinite, "max_rel_increase": max_rel,
            "energy_first_mean": first_sum / n, "energy_last_mean": last_sum / n, "examples": total}


def _test_split(trained, quick: bool):
    """``(ids, mask, labels)`` of the run's test split, encoded with the run's vocabulary and ``data.max_len``,
    refused when the split is not the one the run was tested on (the bundle's data fingerprint)."""
    from ..data import encode, load_configured
    from ..runfolder.fingerprint import data_fingerprint

    dc = trained.config["data"]
    splits = load_configured(dc)
    stored = trained.data_fingerprint
    if stored is not None:
        now = data_fingerprint(trained.vocab.itos, [], [], splits.test, splits.label_names)
        changed = [part for part in ("test", "label_names") if stored.get(part) != now.get(part)]
        if changed:
            raise ConfigError(f"the {' and '.join(changed)} of data.dataset={dc['dataset']!r} differ from those the "
                              "run was trained and tested on (the bundle's data fingerprint): no comparable study")
    test = splits.test[:QUICK_EXAMPLES] if quick else splits.test
    return encode(test, trained.vocab, dc["max_len"]), splits.name


def study(run_dir: str, eps: Sequence[float] = DEFAULT_EPS, depths: Optional[Sequence[int]] = None,
          quick: bool = False, device="cpu") -> Dict[str, Any]:
    """The study of the module docstring, as a JSON-ready dict (nothing written)."""
    from ..app.bundle import load_model

    t0 = time.perf_counter()
    trained = load_model(run_dir, map_location=device)
    encoder = trained.model.encoder
    if not getattr(encoder, "weight_shared", False) or not hasattr(encoder, "stop_rel"):
        raise ConfigError(f"{run_dir}: model.mode={trained.config['model']['mode']!r} is an untied stack; the depth "
                          "study (--eps, --depths) applies to weight-shared encoders (guaranteed)")
    T = int(encoder.layers)
    depths = list(default_depths(T) if depths is None else depths)
    tensors, dataset = _test_split(trained, quick)
    checker = copy.deepcopy(trained.model).to(torch.float64).eval()
    bs = int(trained.config["train"]["batch_size"])
    eps_rows = [{"eps": e, **evaluate_at(checker, tensors, bs, device, stop_rel=e)} for e in eps]
    depth_rows = [{"layers": k, **evaluate_at(checker, tensors, bs, device, layers=k)} for k in depths]
    return {"run_dir": os.path.abspath(run_dir), "dataset": dataset, "mode": trained.config["model"]["mode"],
            "trained_layers": T, "trained_stop_rel": trained.config["model"].get("stop_rel"),
            "dtype": "float64", "examples": int(tensors[2].numel()), "quick": bool(quick),
            "stop_rule": STOP_RULE, "eps": eps_rows, "depths": depth_rows,
            "seconds": time.perf_counter() - t0}


def _fmt_eps(e: float) -> str:
    return "0 (off)" if e == 0 else f"{e:g}"


def to_markdown(doc: Dict[str, Any]) -> str:
    T = doc["trained_layers"]
    lines = [f"# Depth chosen by the energy: {doc['dataset']} ({doc['mode']}, trained depth T = {T})", "",
             f"{doc['examples']} test examples{' (--quick: the first ones)' if doc['quick'] else ''}, float64, "
             f"trace on. Stopping rule: {doc['stop_rule']}.", "",
             "## Accuracy and layers used against EPS (at most T layers)", "",
             "| EPS | accuracy | mean layers used | depths (layers: examples) | steps judged | frozen | increases |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["eps"]:
        hist = ", ".join(f"{k}: {v}" for k, v in r["layers_hist"].items())
        lines.append(f"| {_fmt_eps(r['eps'])} | {100 * r['accuracy']:.2f} % | {r['mean_layers']:.3f} | {hist} | "
                     f"{r['steps']} | {r['frozen_steps']} | {r['increases']} |")
    lines += ["", "## Accuracy against inference depth (the shared step unrolled K times)", "",
              "| K | K / T | accuracy | mean E(Y_K) | steps judged | increases | non-finite |", "|---|---|---|---|---|---|---|"]
    for r in doc["depths"]:
        mark = " (trained)" if r["layers"] == T else ""
        lines.append(f"| {r['layers']}{mark} | {r['layers'] / T:g} | {100 * r['accuracy']:.2f} % | "
                     f"{r['energy_last_mean']:.6g} | {r['steps']} | {r['increases']} | {r['nonfinite']} |")
    lines += ["", f"{doc['seconds']:.1f} s."]
    return "\n".join(lines) + "\n"


def plot(doc: Dict[str, Any], path: str) -> None:
    """Two panels, written atomically: accuracy and mean layers used against EPS (log axis; EPS = 0, off, as a
    dashed line), and accuracy against inference depth K (the trained depth marked, increases in the title)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = doc["trained_layers"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    on = sorted((r for r in doc["eps"] if r["eps"] > 0), key=lambda r: r["eps"])
    off = [r for r in doc["eps"] if r["eps"] == 0]
    if on:
        ax1.plot([r["eps"] for r in on], [100 * r["accuracy"] for r in on], "o-", color="C0", label="accuracy")
        ax1.set_xscale("log")
    for r in off:
        ax1.axhline(100 * r["accuracy"], color="C0", ls="--", lw=1, label=f"accuracy, off ({T} layers)")
    ax1.set_xlabel("EPS (stop when the relative energy decrease < EPS)")
    ax1.set_ylabel("test accuracy (%)", color="C0")
    ax1b = ax1.twinx()
    if on:
        ax1b.plot([r["eps"] for r in on], [r["mean_layers"] for r in on], "s-", color="C1", label="mean layers used")
    ax1b.set_ylim(0, T + 0.5)
    ax1b.set_ylabel(f"mean layers used (max {T})", color="C1")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
    ax1.set_title("depth chosen by the energy")
    rows = doc["depths"]
    ax2.plot([r["layers"] for r in rows], [100 * r["accuracy"] for r in rows], "o-", color="C2")
    ax2.axvline(T, color="grey", ls=":", lw=1, label=f"trained depth T = {T}")
    ax2.set_xlabel("inference depth K (layers of the shared step)")
    ax2.set_ylabel("test accuracy (%)")
    inc = sum(r["increases"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    ax2.set_title(f"inference depth: {inc} energy increases in {steps} float64 steps", fontsize=10)
    ax2.legend(fontsize=8, loc="best")
    fig.suptitle(f"{doc['dataset']}: {doc['examples']} test examples{' (quick)' if doc['quick'] else ''}", fontsize=10)
    fig.tight_layout()
    with atomic_open(path) as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)


def write(doc: Dict[str, Any], out: str) -> Dict[str, str]:
    """``depth.json``, ``depth.md``, ``depth.png`` into ``out`` (created), each atomically; returns the paths."""
    os.makedirs(out, exist_ok=True)
    paths = {k: os.path.join(out, f"depth.{k}") for k in ("json", "md", "png")}
    plot(doc, paths["png"])
    with atomic_open(paths["md"], "w") as fh:
        fh.write(to_markdown(doc))
    with atomic_open(paths["json"], "w") as fh:
        fh.write(json_dumps(doc, indent=1) + "\n")
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("run_dir", type=folder_arg, metavar="RUN_DIR", help="a finished run folder (a bundle)")
    p.add_argument("--eps", default=",".join(f"{e:g}" for e in DEFAULT_EPS),
                   help="stopping thresholds, comma-separated (0: off); default %(default)s")
    p.add_argument("--depths", default=None, help="inference depths, comma-separated; default 1 ... 4x the trained "
                                                  "depth")
    p.add_argument("--json", action="store_true", help="print the JSON document (else the markdown)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/depth)")
    p.add_argument("--quick", action="store_true", help=f"the first {QUICK_EXAMPLES} test examples only")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    args = p.parse_args(argv)

    def body() -> int:
        eps = parse_eps(args.eps)
        depths = parse_depths(args.depths) if args.depths is not None else None
        out = args.out if args.out is not None else os.path.join(args.run_dir, "depth")
        why = folder_problem(out, writable=True)
        if why:
            raise ConfigError(f"--out {out!r} {why}")
        device = check_device(args.device, "--device", ConfigError)
        doc = study(args.run_dir, eps, depths, args.quick, device)
        write(doc, out)
        print(json_dumps(doc) if args.json else to_markdown(doc), end="" if not args.json else "\n")
        return 0

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
