"""Graph variants: ``unfold-variants --config NAME --graphs complete,window:8,star --seeds 3 [k=v ...]``.

For one config, trains and evaluates each token graph of ``--graphs`` (specs as ``model.graph`` takes them:
``complete | window:K | strided:K | dilated:K[:R] | star | random:P | FILE.npy``) over the seeds ``first, ...,
first + K - 1``, then writes the comparison into ``--run-dir DIR`` (default ``runs/variants-NAME``):

* ``DIR/variants.md`` and ``DIR/variants.json``: per variant, test accuracy mean +- std over the seeds,
  training throughput (``train_tokens_per_second``: real tokens through the training passes per second of
  those passes, validation and checks excluded; mean over the seeds), peak memory of the training passes
  (``peak_memory_bytes`` and the growth over the epoch's start, mean over the seeds; what they measure:
  `experiments.app.throughput`), the float64 energy increases of the trained and the untrained model on the
  test set (summed over the seeds, with the layer-steps checked), and the seeds finished and failed;
* ``DIR/variants_accuracy.png``: test accuracy against training tokens/s, one labelled point per variant with
  the standard deviation over the seeds as error bars;
* ``DIR/variants_energy.png``: the total energy per layer (mean over the test examples of each seed's
  ``energy_trace.pt``, then over the seeds), one line per variant.

Each variant is a seed sweep (`experiments.app.sweep.run_sweep`) in ``DIR/<slug>`` (``window:8`` ->
``window-8``) with the override ``model.graph=SPEC``: so it resumes as the sweeps do -- running the same
command again keeps the finished seeds, resumes interrupted ones from their checkpoints and trains nothing
else. ``DIR`` has one owner (`RunLock`); every file is written atomically.

Everything is checked before anything runs or is written: every spec of ``--graphs`` by the config's own
rules for ``model.graph`` (and the model built on the meta device), a refusal naming ``--graphs`` and the spec
(one [`ConfigError`][energies.ConfigError] line, exit 2). A seed that fails is counted in its row and the exit
status is 1.

``--quick``: a tiny version (config ``tiny``, graphs ``complete,window:2,star``, one seed, 200 training
examples of a separable synthetic text set written into ``DIR/toy-data``: offline) for the test suite.
``--table DIR`` reprints the table of a finished variants folder; ``--json`` prints the JSON summary instead.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from energies.errors import ConfigError, UnfoldError
from energies.checks import parse_int
from unfold.cli import run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_open
from ..app.config import load_config
from ..runfolder.runlock import RunLock, check_writable
from ..app.sweep import SEED_KEYS, describe, read_checked, run_sweep, seed_dir

PROG = "unfold-variants"
VARIANTS_JSON, VARIANTS_MD = "variants.json", "variants.md"
ACCURACY_PNG, ENERGY_PNG = "variants_accuracy.png", "variants_energy.png"
DEFAULT_GRAPHS = "complete,window:8,strided:16,dilated:4:8,star,random:0.05"
QUICK_GRAPHS = "complete,window:2,star"
#: the overrides of ``--quick`` (before the user's own); ``data.dataset`` is set to ``DIR/toy-data``
QUICK_OVERRIDES = ("data.glove=none", "train.max_train_examples=200", "train.epochs=4", "train.batch_size=32",
                   "train.lr=0.005",
                   "train.progress=false", "train.tensorboard=false", "model.layers=2")


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------

def slug(spec: str) -> str:
    """The folder name of a graph spec: ``window:8`` -> ``window-8``; a ``.npy`` file -> ``file-NAME``."""
    if spec.endswith(".npy") or os.sep in spec:
        spec = "file-" + os.path.basename(spec)[:-4 if spec.endswith(".npy") else None]
    return re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-.") or "graph"


def parse_graphs(text: str) -> List[str]:
    """The specs of ``--graphs`` (comma-separated, blanks around them ignored): at least one, no repeats, no two
    spellings of one graph (`energies.graphs.spec.canonical_spec`: ``window:8`` and ``window:08``), no two
    with the same folder (`slug`)."""
    from energies.graphs.spec import canonical_spec

    specs = [s.strip() for s in text.split(",")]
    if not any(specs) or not all(specs):
        raise ConfigError(f"--graphs {text!r}: give a comma-separated list of graph specs, none empty "
                          f"(e.g. {DEFAULT_GRAPHS})")
    same: Dict[str, str] = {}
    for spec in specs:
        other = same.setdefault(canonical_spec(spec), spec)
        if other != spec:
            raise ConfigError(f"--graphs {text!r}: {other!r} and {spec!r} are one graph ({canonical_spec(spec)}): "
                              "each would train it again; list it once")
    seen: Dict[str, str] = {}
    for spec in specs:
        other = seen.setdefault(slug(spec), spec)
        if other != spec or specs.count(spec) > 1:
            raise ConfigError(f"--graphs {text!r}: {spec!r} is listed twice" if other == spec else
                              f"--graphs {text!r}: {other!r} and {spec!r} would share the folder {slug(spec)!r}")
    return specs


#: at most this many seeds per variant: each is a training run (and a larger count would be a list built first)
MAX_SEEDS = 1000


def check_seeds(config: Optional[str], overrides: Sequence[str], first: int, count: int) -> range:
    """The seeds ``first, ..., first + count - 1``, checked before anything is built or written: at most
    `MAX_SEEDS`, and the first and the last within the rules of every key they set (`SEED_KEYS`:
    ``data.seed`` stops at 2**32 - 1), a refusal naming ``--first-seed`` and ``--seeds``."""
    if count > MAX_SEEDS:
        raise ConfigError(f"--seeds {count}: at most {MAX_SEEDS} seeds per variant (each seed is a training run)")
    for seed in sorted({first, first + count - 1}):
        try:
            load_config(config, list(overrides) + [f"{k}={seed}" for k in SEED_KEYS])
        except ConfigError as exc:
            raise ConfigError(f"--first-seed {first} --seeds {count}: seed {seed} is refused: {exc}") from None
    return range(first, first + count)


def check_variants(config: Optional[str], overrides: Sequence[str], specs: Sequence[str]) -> Dict[str, Any]:
    """Every variant's config, validated before anything runs: the config and overrides alone first (their own
    errors), then each spec by the rules of ``model.graph`` and the model built on the meta device
    (`experiments.app.build.check_buildable`), a refusal naming ``--graphs`` and the spec. Returns the base
    config."""
    from ..app.build import check_buildable

    base = load_config(config, list(overrides))
    for spec in specs:
        try:
            check_buildable(load_config(config, list(overrides) + [f"model.graph={spec}"]))
        except (ConfigError, UnfoldError) as exc:
            raise ConfigError(f"--graphs: the spec {spec!r} is refused: {exc}") from None
    return base


def count_arg(flag: str, text: str, what: str) -> int:
    """A count of a command line (``--seeds``, ``--jobs``): an integer >= 1 in ASCII digits
    (`energies.checks.parse_int`), else a one-line [`ConfigError`][energies.ConfigError] naming the flag."""
    try:
        value = parse_int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{flag} {text!r} must be an integer >= 1 (the number of {what})")
    return value


def seeds_arg(text: str) -> int:
    """``--seeds``: an integer >= 1, else a one-line [`ConfigError`][energies.ConfigError] naming it."""
    return count_arg("--seeds", text, "seeds per variant")


# --------------------------------------------------------------------------------------------
# The quick run's data
# --------------------------------------------------------------------------------------------

def write_toy_data(folder: str, n_train: int = 200, n_eval: int = 100, seed: int = 0) -> str:
    """A separable synthetic sentiment set (sentiment words among filler words) as JSONL splits in ``folder``,
    the same bytes every time (seeded), written atomically: offline data for ``--quick``."""
    rng = random.Random(seed)
    pos, neg = ["good", "great", "fine", "lovely", "superb"], ["bad", "awful", "poor", "dull", "boring"]
    filler = [f"w{i}" for i in range(40)]
    for name, n in (("train", n_train), ("val", n_eval), ("test", n_eval)):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            words = [rng.choice(filler) for _ in range(rng.randint(3, 12))]
            for _ in range(rng.randint(1, 3)):
                words.insert(rng.randint(0, len(words)), rng.choice(pos if label else neg))
            rows.append(json.dumps({"text": " ".join(words), "label": label}) + "\n")
        path = os.path.join(folder, f"{name}.jsonl")
        text = "".join(rows)
        if _read_text(path) != text:
            with atomic_open(path, "w") as fh:
                fh.write(text)
    return folder


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------------------------
# One variant's row
# --------------------------------------------------------------------------------------------

def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def energy_per_layer(root: str, seeds: Sequence[int]) -> Optional[List[float]]:
    """The total energy per layer, mean over the test examples of each seed's ``energy_trace.pt`` (read and
    checked by `experiments.app.plot_energy.load_trace`), then mean over the seeds; ``None`` when no seed has
    a trace. Non-finite entries are left out of the means."""
    import numpy as np

    from ..app.plot_energy import load_trace

    curves = []
    for seed in seeds:
        path = os.path.join(seed_dir(root, seed), "energy_trace.pt")
        if not os.path.isfile(path):
            continue
        trace = load_trace(path)
        total = sum(v.double() for v in trace["energies"].values()).numpy()
        total = np.where(np.isfinite(total), total, np.nan)
        with np.errstate(all="ignore"):
            curves.append(np.nanmean(total, axis=0))
    if not curves or len({len(c) for c in curves}) != 1:
        return None
    with np.errstate(all="ignore"):
        mean = np.nanmean(np.stack(curves), axis=0)
    return [float(v) if math.isfinite(v) else None for v in mean]


def variant_row(spec: str, root: str, summary: Dict[str, Any]) -> Dict[str, Any]:
    """One variant's entry of ``variants.json`` from its sweep summary and its seeds' files."""
    runs = {int(s): m for s, m in summary["runs"].items()}
    stats = summary["metrics"]
    empty = describe([])

    def total(key: str, sub: Optional[str] = None) -> int:
        return sum(_int((m.get(sub) if sub else m).get(key)) if isinstance(m.get(sub) if sub else m, dict) else 0
                   for m in runs.values())

    kinds = sorted({m["peak_memory_kind"] for m in runs.values() if isinstance(m.get("peak_memory_kind"), str)})
    return {"graph": spec, "folder": os.path.basename(root), "finished": sorted(runs), "failed": summary["failed"],
            "mode": next((m.get("mode") for m in runs.values()), None),
            "test_accuracy": stats.get("test_accuracy", empty),
            "train_tokens_per_second": stats.get("train_tokens_per_second", empty),
            "peak_memory_bytes": stats.get("peak_memory_bytes", empty),
            "peak_memory_growth_bytes": stats.get("peak_memory_growth_bytes", empty),
            "peak_memory_kind": "; ".join(kinds) or None,
            "energy_increases": total("energy_increases"), "energy_steps": total("energy_steps"),
            "untrained_energy_increases": total("energy_increases", "untrained"),
            "untrained_energy_steps": total("energy_steps", "untrained"),
            "energy_per_layer": energy_per_layer(root, sorted(runs))}


# --------------------------------------------------------------------------------------------
# Table and plots
# --------------------------------------------------------------------------------------------

def _mean_std(stat: Dict[str, Any], scale: float = 1.0, digits: int = 1) -> str:
    if stat.get("mean") is None:
        return "n/a"
    text = f"{stat['mean'] * scale:.{digits}f}"
    return text + (f" ± {stat['std'] * scale:.{digits}f}" if stat.get("std") is not None else "")


def _mib(stat: Dict[str, Any]) -> str:
    return "n/a" if stat.get("mean") is None else f"{stat['mean'] / 2 ** 20:,.0f}"


def markdown(summary: Dict[str, Any]) -> str:
    """``variants.md``: a header saying what was run, then one row per variant."""
    seeds = summary["seeds"]
    lines = [f"# Graph variants of {summary['name']}: {len(summary['variants'])} graphs x {len(seeds)} seed(s)", "",
             f"Config {summary['config']!s}, overrides {summary['overrides'] or 'none'}; seeds {seeds}; wall "
             f"{summary['wall_seconds']:.0f} s. Tokens/s: real tokens through the training passes per second of "
             "those passes (mean over seeds). Peak memory (mean over seeds), MiB: "
             f"{summary.get('peak_memory_kind') or 'n/a'}; in brackets its growth during the training passes. "
             "Energy increases: float64 check on the test set, summed over seeds.", "",
             "| graph | test acc. % (mean ± std) | train tokens/s | peak memory MiB (growth) | "
             "energy increases trained / untrained (of layer-steps) | seeds finished / failed |",
             "|---|---|---|---|---|---|"]
    for v in summary["variants"]:
        energy = (f"{v['energy_increases']} / {v['untrained_energy_increases']} "
                  f"(of {v['energy_steps']:,} / {v['untrained_energy_steps']:,})")
        lines.append(f"| {v['graph']} | {_mean_std(v['test_accuracy'], 100, 2)} | "
                     f"{_mean_std(v['train_tokens_per_second'], digits=0)} | {_mib(v['peak_memory_bytes'])} "
                     f"({_mib(v['peak_memory_growth_bytes'])}) | {energy} | {len(v['finished'])} / "
                     f"{len(v['failed'])}{' ' + str(v['failed']) if v['failed'] else ''} |")
    return "\n".join(lines) + "\n"


def _save_png(fig, path: str) -> str:
    """``fig`` as a PNG written atomically at ``path``; the figure is closed."""
    from unfold.plot import pyplot

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    pyplot().close(fig)
    with atomic_open(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path


def plot_accuracy(summary: Dict[str, Any], path: str) -> str:
    """Test accuracy (%) against training tokens/s, one labelled point per variant, error bars: the standard
    deviation over the seeds (none for one seed); variants without figures are left out."""
    from unfold.plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for v in summary["variants"]:
        acc, tps = v["test_accuracy"], v["train_tokens_per_second"]
        if acc.get("mean") is None or tps.get("mean") is None:
            continue
        ax.errorbar(tps["mean"], 100 * acc["mean"], yerr=100 * (acc.get("std") or 0.0),
                    xerr=tps.get("std") or 0.0, fmt="o", capsize=4, label=v["graph"])
        ax.annotate(v["graph"].replace("$", r"\$"), (tps["mean"], 100 * acc["mean"]), textcoords="offset points",
                    xytext=(6, 6), fontsize=9)
    ax.margins(0.2)                           # room for the labels at the edges
    ax.set(xlabel="training tokens / s (mean over seeds)", ylabel="test accuracy % (mean ± std over seeds)",
           title=f"{summary['name']}: graph variants, {len(summary['seeds'])} seed(s)".replace("$", r"\$"))
    ax.grid(alpha=0.3)
    return _save_png(fig, path)


def plot_energy(summary: Dict[str, Any], path: str) -> str:
    """The total energy per layer (mean over test examples and seeds), one line per variant."""
    from unfold.plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    drawn = 0
    for v in summary["variants"]:
        curve = v.get("energy_per_layer")
        if not curve:
            continue
        xs = [t for t, e in enumerate(curve) if e is not None]
        ax.plot(xs, [curve[t] for t in xs], marker="o", ms=4, label=v["graph"].replace("$", r"\$"))
        drawn += 1
    ax.set(xlabel="layer t", ylabel="E(Y^t), mean over test examples and seeds",
           title=f"{summary['name']}: energy per layer (float64 check, trained models)".replace("$", r"\$"))
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no energy traces", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    return _save_png(fig, path)


def write_outputs(root: str, summary: Dict[str, Any]) -> None:
    """``variants.json``, ``variants.md`` and both plots, each written atomically."""
    with atomic_open(os.path.join(root, VARIANTS_JSON), "w") as fh:
        fh.write(json_dumps(summary, indent=1) + "\n")
    with atomic_open(os.path.join(root, VARIANTS_MD), "w") as fh:
        fh.write(markdown(summary))
    plot_accuracy(summary, os.path.join(root, ACCURACY_PNG))
    plot_energy(summary, os.path.join(root, ENERGY_PNG))


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

def run_variants(root: str, specs: Sequence[str], seeds: Sequence[int], config: Optional[str],
                 overrides: Sequence[str] = (), jobs: int = 1, imports: Sequence[str] = (), say=print
                 ) -> Dict[str, Any]:
    """Run (or finish) every variant's sweep in ``root`` and write the table and plots (module docstring);
    returns the summary. The specs are expected checked (`check_variants`)."""
    name = load_config(config, list(overrides))["name"]
    check_writable(root)
    t0 = time.perf_counter()
    with RunLock(root):
        rows = []
        for spec in specs:
            folder = os.path.join(root, slug(spec))
            say(f"variant {spec}: {folder}")
            sweep = run_sweep(folder, seeds, config, list(overrides) + [f"model.graph={spec}"], SEED_KEYS, jobs,
                              imports=imports, say=lambda msg, s=spec: say(f"  [{s}] {msg}"))
            rows.append(variant_row(spec, folder, sweep))
        kinds = sorted({v["peak_memory_kind"] for v in rows if v["peak_memory_kind"]})
        summary = {"name": name, "config": config, "overrides": list(overrides), "graphs": list(specs),
                   "seeds": list(seeds), "seed_keys": list(SEED_KEYS), "peak_memory_kind": "; ".join(kinds) or None,
                   "wall_seconds": time.perf_counter() - t0, "variants": rows}
        lost = lost_variants(root, summary)
        if lost:       # a finished result is never replaced by a worse one (a re-run whose seeds were refused)
            summary["kept"] = (f"{os.path.join(root, VARIANTS_JSON)}, {VARIANTS_MD} and the plots kept as they were: "
                               f"they hold finished runs this run did not finish ({', '.join(lost[:6])}"
                               f"{f' and {len(lost) - 6} more' if len(lost) > 6 else ''})")
            say(summary["kept"])
        else:
            write_outputs(root, summary)
    return summary


def lost_variants(root: str, summary: Dict[str, Any]) -> List[str]:
    """``GRAPH seed K`` for each run finished in the ``variants.json`` already written that ``summary`` did not
    finish (graphs compared by `energies.graphs.spec.canonical_spec`); a file that is not a readable summary
    holds no finished result."""
    from energies.graphs.spec import canonical_spec

    if not os.path.lexists(os.path.join(root, VARIANTS_JSON)):
        return []
    try:
        old = read_table(root)
    except ConfigError:
        return []
    done = {(canonical_spec(v["graph"]), s) for v in summary["variants"] for s in v["finished"]}
    return [f"{v['graph']} seed {s}" for v in old["variants"] for s in v["finished"]
            if (canonical_spec(v["graph"]), s) not in done]


STAT_KEYS = ("test_accuracy", "train_tokens_per_second", "peak_memory_bytes", "peak_memory_growth_bytes")
COUNT_KEYS = ("energy_increases", "energy_steps", "untrained_energy_increases", "untrained_energy_steps")
#: the range of each statistic's mean (its std: >= 0 and at most the range's width): an accuracy is a fraction,
#: throughput and memory are >= 0 and below 2**63 (bytes, tokens/s); a count is an integer in [0, 2**63 - 1]
STAT_RANGES = {"test_accuracy": (0.0, 1.0), "train_tokens_per_second": (0.0, 2.0 ** 63),
               "peak_memory_bytes": (0.0, 2.0 ** 63), "peak_memory_growth_bytes": (0.0, 2.0 ** 63)}
MAX_COUNT = 2 ** 63 - 1


def one_line_text(value: Any) -> bool:
    """Whether ``value`` prints as one cell of a table: a string of printable characters (no newline, tab or
    other control or format character) without ``|``."""
    return isinstance(value, str) and value.isprintable() and "|" not in value


def check_summary(value: Any, path: str) -> Dict[str, Any]:
    """``value`` (a ``variants.json``) when `markdown` can print it, else a [`ConfigError`][energies.ConfigError] naming
    ``path`` and the key."""
    def bad(where: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: {where} {why}")

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    def seed(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT

    if not isinstance(value, dict):
        raise bad("the file", "holds no JSON object (a variants summary)")
    for key, kind in (("name", str), ("seeds", list), ("variants", list), ("overrides", list)):
        if not isinstance(value.get(key), kind):
            raise bad(repr(key), f"must be a JSON {'string' if kind is str else 'array'}")
    if not one_line_text(value["name"]):
        raise bad("'name'", f"must be one line of printable text without '|', got {value['name']!r:.80}")
    for key in ("config", "peak_memory_kind"):
        if value.get(key) is not None and not one_line_text(value[key]):
            raise bad(repr(key), f"must be null or one line of printable text without '|', got {value[key]!r:.80}")
    for i, o in enumerate(value["overrides"]):
        if not one_line_text(o):
            raise bad(f"'overrides[{i}]'", f"must be one line of printable text without '|', got {o!r:.80}")
    if not all(seed(s) for s in value["seeds"]) or len(value["seeds"]) > MAX_SEEDS:
        raise bad("'seeds'", f"must be at most {MAX_SEEDS} seeds, each an integer in [0, 2**63 - 1]")
    if not number(value.get("wall_seconds")) or value["wall_seconds"] < 0:
        raise bad("'wall_seconds'", "must be a finite number >= 0")
    for i, v in enumerate(value["variants"]):
        where = f"variants[{i}]"
        if not isinstance(v, dict) or not one_line_text(v.get("graph")) or not v["graph"]:
            raise bad(where, "must be an object whose 'graph' is one line of printable text without '|'")
        for key in ("finished", "failed"):
            if not isinstance(v.get(key), list) or not all(seed(s) for s in v[key]) or len(v[key]) > MAX_SEEDS:
                raise bad(f"{where}.{key}", f"must be a JSON array of at most {MAX_SEEDS} seeds (integers in "
                                            "[0, 2**63 - 1])")
        for key in COUNT_KEYS:
            if not seed(v.get(key)):
                raise bad(f"{where}.{key}", f"must be an integer in [0, 2**63 - 1], got {v.get(key)!r:.40}")
        for key in STAT_KEYS:
            stat, (lo, hi) = v.get(key), STAT_RANGES[key]
            if not isinstance(stat, dict) or not all(stat.get(f) is None or number(stat[f]) for f in ("mean", "std")):
                raise bad(f"{where}.{key}", "must be an object whose 'mean' and 'std' are finite numbers or null")
            if stat.get("mean") is not None and not lo <= stat["mean"] <= hi:
                raise bad(f"{where}.{key}.mean", f"must lie in [{lo:g}, {hi:g}], got {stat['mean']!r}")
            if stat.get("std") is not None and not 0 <= stat["std"] <= hi - lo:
                raise bad(f"{where}.{key}.std", f"must lie in [0, {hi - lo:g}], got {stat['std']!r}")
    return value


def read_table(root: str) -> Dict[str, Any]:
    """The checked summary of a finished variants folder (``--table``)."""
    return read_checked(root, VARIANTS_JSON, "the variants", check_summary)


def _parser() -> argparse.ArgumentParser:
    """The command line's parser (module docstring)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--config", default=None, help="a config file or a shipped config's name (e.g. default)")
    p.add_argument("--graphs", default=None, help=f"comma-separated graph specs (default {DEFAULT_GRAPHS}; "
                                                  f"--quick: {QUICK_GRAPHS})")
    p.add_argument("--seeds", default=None, help="seeds per variant (default 3; --quick: 1)")
    p.add_argument("--first-seed", type=seed_int, default=0)
    p.add_argument("--run-dir", default=None, help="variants folder (default runs/variants-NAME)")
    p.add_argument("--jobs", default="1", help="seeds run at once (default 1)")
    p.add_argument("--quick", action="store_true", help="a tiny run for the test suite (module docstring)")
    p.add_argument("--table", metavar="DIR", help="reprint the table of a finished variants folder")
    p.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for every variant and seed")
    return p


def _options(args: argparse.Namespace):
    """``(jobs, config, specs, seeds_n, overrides, toy, root)`` from the command line, checked; nothing written."""
    jobs = count_arg("--jobs", args.jobs, "seeds run at once")
    if args.config is None and not args.quick:
        raise ConfigError("--config NAME|FILE is required (or --quick, or --table DIR)")
    config = args.config if args.config is not None else "tiny"
    specs = parse_graphs(args.graphs if args.graphs is not None else QUICK_GRAPHS if args.quick else DEFAULT_GRAPHS)
    seeds_n = seeds_arg(args.seeds) if args.seeds is not None else 1 if args.quick else 3
    for o in args.overrides:
        key = o.split("=", 1)[0].strip()
        if key == "model.graph" or key in SEED_KEYS:
            raise ConfigError(f"override {o!r} sets {key}, which the variants set themselves (--graphs, --seeds)")
    if args.run_dir is not None and not args.run_dir.strip():
        raise ConfigError("--run-dir must name a folder, got an empty path")
    overrides, toy, root = list(args.overrides), None, args.run_dir
    if args.quick:
        root = root if root is not None else os.path.join("runs", "variants-quick")
        toy = os.path.join(root, "toy-data")
        overrides = [*QUICK_OVERRIDES, f"data.dataset={toy}"] + overrides
    return jobs, config, specs, seeds_n, overrides, toy, root


def _run(args: argparse.Namespace) -> int:
    """The command (module docstring): reprint a table, or check every variant, then train and report them."""
    if args.table is not None:
        summary = read_table(args.table)
        print(json_dumps(summary, indent=1) if args.json else markdown(summary), end="\n" if args.json else "")
        return 0
    jobs, config, specs, seeds_n, overrides, toy, root = _options(args)
    base = check_variants(config, overrides, specs)         # nothing written before this
    seeds = list(check_seeds(config, overrides, args.first_seed, seeds_n))
    root = root if root is not None else os.path.join("runs", f"variants-{base['name']}")
    if toy is not None:
        check_writable(root)
        write_toy_data(toy)
    summary = run_variants(root, specs, seeds, config, overrides, jobs, args.plugins or [],
                           say=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        print(json_dumps(summary, indent=1))
    else:
        print(markdown(summary), end="")
        print(summary["kept"] if summary.get("kept") else
              f"wrote {os.path.join(root, VARIANTS_MD)}, {VARIANTS_JSON}, {ACCURACY_PNG}, {ENERGY_PNG}")
    return 1 if summary.get("kept") or any(v["failed"] for v in summary["variants"]) else 0


def main(argv=None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2)."""
    args = _parser().parse_args(argv)
    return run_main(PROG, lambda: _run(args), argv)


if __name__ == "__main__":
    sys.exit(main())
