"""Seed sweeps: ``unfold-sweep --config FILE --seeds 5 [--run-dir DIR] [k=v ...]``.

Runs one training run per seed ``K`` (``K = first, ..., first + seeds - 1``) in ``DIR/seed-K`` with the
overrides ``train.seed=K`` and ``data.seed=K`` (``--seed-keys`` chooses the keys: by default each seed draws
its own initial weights, data order *and* train/val/test split, so the spread includes the test-set noise of
one split), then writes ``DIR/summary.json`` and ``DIR/summary.md``: for every numeric metric of the runs'
``metrics.json`` (nested keys joined by dots) its mean, sample standard deviation (``n - 1``; ``null`` for one
run), minimum, maximum and count.

``--tfidf`` sweeps the TF-IDF + logistic-regression baseline (`experiments.app.tfidf`) over split seeds
instead (``--dataset NAME``); ``--table DIR [DIR ...]`` prints the README's comparison table (mean +- std)
from finished sweeps.

Work is never lost or mixed: the sweep folder has one owner (`RunLock`); each
seed is a separate process writing its own run folder; a seed whose ``metrics.json`` exists with the same
config is kept as it is, one interrupted after an epoch is resumed from its checkpoint (``--resume`` of the
trainer), so running the same command again finishes an interrupted sweep. A seed that fails is reported
in the summary (``failed``) and the exit status is 1; the other seeds still run.

Files read back are checked, never trusted: a seed's existing ``metrics.json`` that is not readable JSON, not an
object, or whose ``test_accuracy``/``val_accuracy`` is not a number refuses the sweep before anything runs (one
[`ConfigError`][energies.ConfigError] line naming the file and the key, exit 2: it is neither a finished run nor
one to resume). ``--table`` checks each ``summary.json`` (`check_summary`: an object with ``name``,
``runs`` and ``metrics``, each statistic a mapping of finite numbers or null) and refuses a malformed one the
same way, instead of a ``KeyError``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from energies.errors import ConfigError
from unfold.cli import positive_int, run_main, seed_int
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..runfolder.atomic import atomic_open, open_append
from .checkpoint import LAST
from .config import load_config
from ..runfolder.runlock import RunLock, check_writable

PROG = "unfold-sweep"
SUMMARY_JSON, SUMMARY_MD = "summary.json", "summary.md"
SEED_KEYS = ("train.seed", "data.seed")


def seed_dir(root: str, seed: int) -> str:
    return os.path.join(root, f"seed-{seed}")


NONFINITE_TEXT = {"nan", "inf", "-inf", "infinity", "-infinity"}


def _number(value) -> Optional[float]:
    """``value`` as a float when it is a number (not a bool) or the text strict JSON writes for a non-finite one
    (``"nan"``, ``"inf"``); ``None`` otherwise. An int too large for a float is ``inf``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and value.strip().lower() in NONFINITE_TEXT:
        return float(value.strip().lower().replace("infinity", "inf"))
    return None


def flatten(metrics: Dict[str, Any], prefix: str = "") -> Dict[str, float]:
    """The numeric leaves of ``metrics`` (bools and other strings skipped), nested keys joined by dots. A value
    that is not finite, as a float or as the text strict JSON writes for one (``"nan"``, ``"inf"``), is kept
    as ``nan``/``inf`` so that `summarize` counts it instead of dropping it. Iterative: any nesting."""
    out: Dict[str, float] = {}
    stack = [(metrics, prefix)]
    while stack:
        node, pre = stack.pop()
        for key, value in node.items():
            name = f"{pre}{key}"
            if isinstance(value, dict):
                stack.append((value, name + "."))
            elif _number(value) is not None:
                out[name] = _number(value)
    return dict(sorted(out.items()))


def describe(values: Sequence[float]) -> Dict[str, Any]:
    """``{mean, std, min, max, n, nonfinite}`` over the finite ``values`` (``n`` of them; ``nonfinite`` counts the
    others, which make no mean but are never hidden): ``std`` is the sample standard deviation (divisor
    ``n - 1``), ``None`` for one value (it is not zero: one run says nothing about the spread); all ``None``
    when no value is finite."""
    finite = [v for v in values if math.isfinite(v)]
    n, bad = len(finite), len(values) - len(finite)
    if not n:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0, "nonfinite": bad}
    mean = math.fsum(finite) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "min": min(finite), "max": max(finite), "n": n, "nonfinite": bad}


def summarize(runs: Dict[int, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per metric, `describe` over the runs that have it (a metric missing from some runs has a smaller
    ``n``; non-finite values are left out of the statistics and counted in ``nonfinite``)."""
    flat = {seed: flatten(m) for seed, m in runs.items()}
    keys = sorted({k for f in flat.values() for k in f})
    out = {}
    for key in keys:
        values = [f[key] for f in flat.values() if key in f]
        out[key] = describe(values)
    return out


def _fmt(stat: Dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    bad = f" ({stat['nonfinite']} non-finite)" if stat.get("nonfinite") else ""
    if stat["mean"] is None:
        return "non-finite" + bad
    if stat["std"] is None:
        return f"{stat['mean'] * scale:.{digits}f}{bad}"
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}{bad}"


def markdown(summary: Dict[str, Any]) -> str:
    """``summary.md``: what was swept, then one row per metric (mean ± std, min, max, n)."""
    lines = [f"# Sweep {summary['name']}: {len(summary['seeds'])} seeds", "",
             f"Seeds {summary['seeds']} (keys {', '.join(summary['seed_keys'])}); finished {len(summary['runs'])}, "
             f"failed {summary['failed'] or 'none'}; wall {summary['wall_seconds']:.0f} s.", "",
             *([f"Note: {summary['note']}", ""] if summary.get("note") else []),
             "| metric | mean ± std | min | max | n |", "|---|---|---|---|---|"]
    for key, stat in summary["metrics"].items():
        lo, hi = ("-", "-") if stat["min"] is None else (f"{stat['min']:.6g}", f"{stat['max']:.6g}")
        lines.append(f"| {key} | {_fmt(stat, digits=6)} | {lo} | {hi} | {stat['n']} |")
    return "\n".join(lines) + "\n"


def lost_results(old: Any, new: Dict[str, Any]) -> List[str]:
    """The finished seeds of the summary already written (``old``, as read) that ``new`` lacks: a finished result is
    never replaced by a worse one (a re-run whose seeds were all refused, say under changed overrides)."""
    runs = old.get("runs") if isinstance(old, dict) else None
    if not isinstance(runs, dict):
        return []
    return sorted((str(s) for s in runs if str(s) not in new["runs"]), key=lambda s: (len(s), s))


def write_summary(root: str, summary: Dict[str, Any]) -> None:
    with atomic_open(os.path.join(root, SUMMARY_JSON), "w") as fh:
        fh.write(json_dumps(summary, indent=1) + "\n")
    with atomic_open(os.path.join(root, SUMMARY_MD), "w") as fh:
        fh.write(markdown(summary))


def _load_json(path: str) -> tuple:
    """``(value, None)`` for a readable JSON file, ``(None, why)`` otherwise (``why`` is ``"missing"`` when there
    is no such file)."""
    if not os.path.lexists(path):
        return None, "missing"
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh), None
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except UnicodeDecodeError as e:
        return None, f"is not UTF-8 text ({e.reason} at byte {e.start})"
    except ValueError as e:
        return None, f"is not valid JSON ({' '.join(str(e).split())[:120]})"
    except RecursionError:
        return None, "is not valid JSON (nested too deeply)"


def _read_json(path: str) -> Any:
    """The JSON value in ``path``, or ``None`` when it is missing or unreadable."""
    return _load_json(path)[0]


def metrics_problem(metrics: Any) -> Optional[str]:
    """Why ``metrics`` (a seed's ``metrics.json``) is no finished run's metrics, or ``None``: it must be an
    object whose ``test_accuracy`` (a labelled task's: ``classify``, the default) and ``val_accuracy`` are numbers
    (or the text strict JSON writes for a non-finite one); a run of a task without labels (``masked_tokens``)
    scores no test split, so only its ``val_accuracy`` is asked for."""
    if not isinstance(metrics, dict):
        return f"holds a JSON {_json_type(metrics)}, not an object of metrics"
    labelled = metrics.get("task", "classify") == "classify" or "test_accuracy" in metrics
    for key in ("test_accuracy", "val_accuracy") if labelled else ("val_accuracy",):
        if key not in metrics:
            return f"has no {key!r}"
        if _number(metrics[key]) is None:
            return f"has {key!r} = {_short(metrics[key])}, not a number"
    return None


def _read_metrics(path: str) -> Optional[Dict[str, Any]]:
    """A seed's existing ``metrics.json``: ``None`` when there is none; a [`ConfigError`][energies.ConfigError] naming the file
    and the key when it is unreadable or malformed (`metrics_problem`)."""
    value, why = _load_json(path)
    if why == "missing":
        return None
    why = why or metrics_problem(value)
    if why:
        raise ConfigError(f"{path} {why}: it is neither a finished run nor one to resume; move the seed's folder "
                          "away (or fix the file) and run the sweep again")
    return value


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else _json_type(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _holds_config(folder: str, cfg: Dict[str, Any]) -> Optional[bool]:
    """Whether the run in ``folder`` was started with ``cfg`` (``None``: the folder holds no config)."""
    if not os.path.isfile(os.path.join(folder, "config.yaml")):
        return None
    try:
        return load_config(os.path.join(folder, "config.yaml")) == cfg
    except ConfigError:
        return False


def _train_command(config: Optional[str], overrides: List[str], folder: str, imports: List[str],
                   own: bool = False) -> List[str]:
    """The seed's training command: ``--resume`` for an interrupted run of the same config (checked by the
    caller), a new run otherwise (which the trainer refuses in a folder holding another run, or anything else);
    ``own``: the folder's config.yaml is this seed's (a seed stopped before its first checkpoint), which the
    new run replaces (``--overwrite``: swapped in when complete)."""
    base = [sys.executable, "-m", "experiments.app.train"] + [f"--import={m}" for m in imports]
    if os.path.isfile(os.path.join(folder, LAST)):        # an interrupted seed: continue it
        return base + ["--resume", folder]
    return base + (["--config", config] if config else []) + ["--run-dir", folder] + (
        ["--overwrite"] if own else []) + overrides


def _tfidf_command(dataset: str, seed: int, imports: List[str], max_train: Optional[int] = None) -> List[str]:
    limit = [] if max_train is None else ["--max-train-examples", str(max_train)]
    return [sys.executable, "-m", "experiments.app.tfidf", "--dataset", dataset, "--seed", str(seed), "--json"] + limit + [
        f"--import={m}" for m in imports]


def _seed_configs(seeds: Sequence[int], config: Optional[str], overrides: List[str], seed_keys: Sequence[str],
                  tfidf: Optional[str]) -> tuple:
    """``(configs, name)``: each seed's config, validated before anything runs or is written (none for a TF-IDF
    sweep), and the sweep's name."""
    configs = {}
    if tfidf is None:
        for seed in seeds:          # every seed's config validated before anything runs or is written
            configs[seed] = load_config(config, overrides + [f"{k}={seed}" for k in seed_keys])
        name = configs[seeds[0]]["name"]
    else:
        name = f"tfidf-{tfidf}"
    return configs, name


class _Seeds:
    """The seeds of one sweep in ``root``: which are finished already, and the others run as processes of their
    own, at most ``jobs`` at once; ``runs``, ``failed`` and ``seconds`` collect what they gave."""

    def __init__(self, root: str, config: Optional[str], overrides: List[str], seed_keys: Sequence[str],
                 configs: Dict[int, Any], tfidf: Optional[str], imports: List[str], say, max_train: Optional[int]):
        self.root, self.config, self.overrides, self.seed_keys = root, config, overrides, seed_keys
        self.configs, self.tfidf, self.imports, self.say, self.max_train = configs, tfidf, imports, say, max_train
        self.runs: Dict[int, Dict[str, Any]] = {}
        self.failed: List[int] = []
        self.seconds: Dict[int, float] = {}
        self.procs: Dict[int, Any] = {}

    def pending(self, seeds: Sequence[int]) -> List[int]:
        """The seeds still to run: a finished one (same config) is kept, one holding another config failed."""
        pending = []
        for seed in seeds:
            folder = seed_dir(self.root, seed)
            done = _read_metrics(os.path.join(folder, "metrics.json"))   # malformed: refused, nothing run
            if self.tfidf is None:
                same = _holds_config(folder, self.configs[seed])
                done = done if same else None
            else:
                same = None
                done = done if done and done.get("seed") == seed and done.get("dataset_spec") == self.tfidf and \
                    done.get("max_train_examples") == self.max_train else None
            if done is not None:
                self.say(f"seed {seed}: finished already ({folder})")
                self.runs[seed] = done
            elif same is False:
                self.failed.append(seed)         # never resumed, overwritten or counted under another config
                self.say(f"seed {seed}: FAILED: {folder} holds a run of another config (move it away, or use another "
                         "--run-dir)")
            else:
                pending.append(seed)
        return pending

    def start(self, seed: int) -> None:
        """Start the seed's process (training, or the TF-IDF baseline), its stderr to its ``sweep.log``."""
        folder = seed_dir(self.root, seed)
        os.makedirs(folder, exist_ok=True)
        log = open_append(os.path.join(folder, "sweep.log"), binary=True)   # never through a link
        if self.tfidf is None:
            cmd = _train_command(self.config, self.overrides + [f"{k}={seed}" for k in self.seed_keys], folder,
                                 self.imports, own=_holds_config(folder, self.configs[seed]) is True)
            out = log
        else:
            cmd = _tfidf_command(self.tfidf, seed, self.imports, self.max_train)
            out = subprocess.PIPE
        self.say(f"seed {seed}: {' '.join(cmd[1:])}")
        self.procs[seed] = (subprocess.Popen(cmd, stdout=out, stderr=log), log, time.perf_counter())

    def _tfidf_metrics(self, folder: str, stdout: bytes) -> Optional[str]:
        """Write the TF-IDF run's ``metrics.json`` from the JSON line ending its ``stdout``; why not, or ``None``."""
        try:
            result = json.loads((stdout.decode(errors="replace").strip().splitlines() or [""])[-1])
            result.update(dataset_spec=self.tfidf, train_seconds=result["seconds"], max_train_examples=self.max_train)
        except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
            return "its output ends in no JSON result line"
        with atomic_open(os.path.join(folder, "metrics.json"), "w") as fh:
            fh.write(json_dumps(result, indent=1) + "\n")
        return None

    def finish(self, seed: int) -> None:
        """Collect the seed's ended process: its checked metrics in ``runs``, or the seed in ``failed``."""
        proc, log, started = self.procs.pop(seed)
        stdout = proc.communicate()[0]
        log.close()
        self.seconds[seed] = time.perf_counter() - started
        folder = seed_dir(self.root, seed)
        why = None
        if proc.returncode == 0 and self.tfidf is not None:
            why = self._tfidf_metrics(folder, stdout)
        metrics = None
        if proc.returncode == 0 and why is None:
            metrics, why = _load_json(os.path.join(folder, "metrics.json"))
            why = why or metrics_problem(metrics)
            metrics = None if why else metrics
        if metrics is None:
            self.failed.append(seed)
            detail = f": metrics.json {why}" if why else ""
            self.say(f"seed {seed}: FAILED (exit {proc.returncode}{detail}; log {os.path.join(folder, 'sweep.log')})")
        else:
            self.runs[seed] = metrics
            score = "test_accuracy" if "test_accuracy" in metrics else "masked_accuracy"
            self.say(f"seed {seed}: {score} {metrics.get(score)} ({self.seconds[seed]:.0f} s)")

    def run(self, pending: List[int], jobs: int) -> None:
        """Run the ``pending`` seeds, ``jobs`` at once, until all have ended; interrupted, each is let stop."""
        try:
            while pending or self.procs:
                while pending and len(self.procs) < jobs:
                    self.start(pending.pop(0))
                for seed in list(self.procs):
                    if self.procs[seed][0].poll() is not None:
                        self.finish(seed)
                time.sleep(0.2)
        finally:
            for proc, log, _ in self.procs.values():   # interrupted: each seed got the Ctrl-C too; let it stop cleanly
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.terminate()
                    proc.wait()
                log.close()


def _write_unless_worse(root: str, summary: Dict[str, Any], say) -> None:
    """Write ``summary`` unless the one already written holds finished seeds it lacks (then ``kept`` says so)."""
    lost = lost_results(_load_json(os.path.join(root, SUMMARY_JSON))[0], summary)
    if lost:                 # kept as it is: this run finished less than the one it would replace
        summary["kept"] = (f"{os.path.join(root, SUMMARY_JSON)} kept as it was: it holds finished seeds "
                           f"{', '.join(lost)}, which this run did not finish")
        say(summary["kept"])
    else:
        write_summary(root, summary)


def run_sweep(root: str, seeds: Sequence[int], config: Optional[str] = None, overrides: Sequence[str] = (),
              seed_keys: Sequence[str] = SEED_KEYS, jobs: int = 1, tfidf: Optional[str] = None,
              imports: Sequence[str] = (), say=print, max_train: Optional[int] = None) -> Dict[str, Any]:
    """Run (or finish) the sweep in ``root`` and write its summary (module docstring); returns the summary."""
    imports, overrides = list(imports), list(overrides)
    configs, name = _seed_configs(seeds, config, overrides, seed_keys, tfidf)
    check_writable(root)
    t0 = time.perf_counter()
    work = _Seeds(root, config, overrides, seed_keys, configs, tfidf, imports, say, max_train)
    with RunLock(root):
        work.run(work.pending(seeds), jobs)
        ordered = {seed: work.runs[seed] for seed in seeds if seed in work.runs}
        summary = {"name": name, "config": config, "overrides": overrides, "tfidf": tfidf,
                   "seeds": list(seeds), "seed_keys": list(seed_keys) if tfidf is None else ["data.seed"],
                   "runs": {str(s): m for s, m in ordered.items()}, "failed": sorted(work.failed),
                   "seconds_per_seed": {str(s): v for s, v in sorted(work.seconds.items())},
                   "wall_seconds": time.perf_counter() - t0,
                   "metrics": summarize(ordered) if ordered else {}, "note": _same_split_note(root, ordered, seed_keys)}
        _write_unless_worse(root, summary, say)
    return summary


def _same_split_note(root: str, runs: Dict[int, Any], seed_keys: Sequence[str]) -> Optional[str]:
    """A warning when ``data.seed`` is swept but every seed tested on the same examples (a dataset with its own
    splits, which is not resplit): the spread then leaves out the test-set noise."""
    if "data.seed" not in seed_keys or len(runs) < 2:
        return None
    tests = set()
    for seed in runs:
        bundle = _read_json(os.path.join(seed_dir(root, seed), "bundle.json"))
        prints = bundle.get("data_fingerprint") if isinstance(bundle, dict) else None
        test = prints.get("test") if isinstance(prints, dict) else None
        tests.add(test if isinstance(test, str) else None)
    if len(tests) == 1 and None not in tests:
        return ("every seed tested on the same test split (the dataset has fixed splits; data.seed does not resplit "
                "it): the spread is that of training only")
    return None


# --------------------------------------------------------------------------------------------
# The README's comparison table
# --------------------------------------------------------------------------------------------

def table_row(summary: Dict[str, Any], label: Optional[str] = None) -> str:
    """One row of `table` for a checked ``summary.json`` (`check_summary`), named `label` (default its name)."""
    m = summary["metrics"]
    acc = _fmt(m["test_accuracy"], 100) + " %"
    val = _fmt(m["val_accuracy"], 100) + " %"
    secs = _fmt(m["train_seconds"], digits=0) if "train_seconds" in m else "n/a"
    if "energy_increases" in m and "untrained.energy_increases" in m and m["energy_steps"]["mean"] is not None:
        steps = int(m["energy_steps"]["mean"])
        energy = (f"{_fmt(m['energy_increases'], digits=0)} / {_fmt(m['untrained.energy_increases'], digits=0)} "
                  f"of {steps:,}")
    else:
        energy = "n/a"
    return f"| {label or summary['name']} | {acc} | {val} | {secs} | {energy} | {len(summary['runs'])} |"


#: the head of `table`
TABLE_HEADER = ("| model | test acc. | val acc. | train s | energy increases, trained / untrained | seeds |",
                "|---|---|---|---|---|---|")
#: the statistics of ``summary.json`` that `table_row` reads: required, then read when present
TABLE_REQUIRED = ("test_accuracy", "val_accuracy")
TABLE_OPTIONAL = ("train_seconds", "energy_increases", "untrained.energy_increases", "energy_steps")
#: the range of each statistic's values (mean, min, max; the std at most the width): accuracies are fractions,
#: seconds and counts are >= 0 and below 2**63 (a count beyond is no count a run makes)
TABLE_RANGES = {"test_accuracy": (0.0, 1.0), "val_accuracy": (0.0, 1.0), "train_seconds": (0.0, 2.0 ** 63),
                "energy_increases": (0.0, 2.0 ** 63), "untrained.energy_increases": (0.0, 2.0 ** 63),
                "energy_steps": (0.0, 2.0 ** 63)}


def _check_stat(stat: Any, key: str, path: str) -> None:
    """One statistic of `describe`: ``mean``, ``std`` (and ``min``, ``max`` when present) finite numbers or
    null, ``std`` >= 0, ``n`` (and ``nonfinite`` when present) integers >= 0."""
    where = f"metrics.{key}"
    if not isinstance(stat, dict):
        raise ConfigError(f"{path}: {where!r} must be an object of statistics (mean, std, n, ...), got a JSON "
                          f"{_json_type(stat)}")
    for field in ("mean", "std", "min", "max"):
        if field not in stat:
            if field in ("mean", "std"):
                raise ConfigError(f"{path}: {where!r} has no {field!r}")
            continue
        v = stat[field]
        lo, hi = TABLE_RANGES.get(key, (-math.inf, math.inf))
        if field == "std":
            lo, hi = 0.0, hi - lo
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or not lo <= v <= hi):
            rule = "a finite number" + (f" in [{lo:g}, {hi:g}]" if math.isfinite(hi) else
                                        f" >= {lo:g}" if math.isfinite(lo) else "") + " or null"
            raise ConfigError(f"{path}: '{where}.{field}' must be {rule}, got {_short(v)}")
    for field in ("n", "nonfinite"):
        if field not in stat:
            if field == "n":
                raise ConfigError(f"{path}: {where!r} has no 'n'")
            continue
        v = stat[field]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{path}: '{where}.{field}' must be an integer >= 0, got {_short(v)}")


def read_checked(root: str, name: str, what: str, check):
    """``check(value, path)`` of the JSON file ``root/name`` a finished run of ``what`` wrote (``--table``); a
    missing or unreadable file is one [`ConfigError`][energies.ConfigError] line naming the folder and the file."""
    path = os.path.join(root, name)
    value, why = _load_json(path)
    if why == "missing":
        raise ConfigError(f"--table {root!r}: no {name} (run {what} first)")
    if why:
        raise ConfigError(f"--table {root!r}: {path} {why}")
    return check(value, path)


def check_summary(summary: Any, path: str) -> Dict[str, Any]:
    """``summary`` (a ``summary.json``) when `table` can read it, else a [`ConfigError`][energies.ConfigError] naming
    ``path`` and the key: an object with ``name`` (a non-empty string), ``runs`` (an object, at least one
    finished seed) and ``metrics`` (an object holding `TABLE_REQUIRED`; those and any of
    `TABLE_OPTIONAL` present checked by `_check_stat`; ``energy_steps`` given with the energy
    increases)."""
    if not isinstance(summary, dict):
        raise ConfigError(f"{path} holds a JSON {_json_type(summary)}, not a sweep summary (an object with name, "
                          "runs, metrics)")
    name = summary.get("name")
    if not isinstance(name, str) or not name.strip() or not name.isprintable() or "|" in name:
        raise ConfigError(f"{path}: 'name' must be one line of printable text without '|' (no newline, tab or "
                          f"control character), got {_short(name)}")
    runs = summary.get("runs")
    if not isinstance(runs, dict):
        raise ConfigError(f"{path}: 'runs' must be an object (seed -> metrics), got "
                          f"{'nothing' if 'runs' not in summary else 'a JSON ' + _json_type(runs)}")
    if not runs:
        raise ConfigError(f"{path}: the sweep has no finished seed ('runs' is empty)")
    metrics = summary.get("metrics")
    if not isinstance(metrics, dict):
        raise ConfigError(f"{path}: 'metrics' must be an object (metric -> statistics), got "
                          f"{'nothing' if 'metrics' not in summary else 'a JSON ' + _json_type(metrics)}")
    for key in TABLE_REQUIRED:
        if key not in metrics:
            raise ConfigError(f"{path}: 'metrics' has no {key!r}")
    for key in TABLE_REQUIRED + TABLE_OPTIONAL:
        if key in metrics:
            _check_stat(metrics[key], key, path)
    if "energy_increases" in metrics and "untrained.energy_increases" in metrics and "energy_steps" not in metrics:
        raise ConfigError(f"{path}: 'metrics' has energy increases but no 'energy_steps' to count them in")
    return summary


def table(roots: Sequence[str]) -> str:
    """A markdown table, one row per sweep folder: test and validation accuracy, training seconds and the
    float64 energy increases on the test set (trained / untrained), each mean ± std over the seeds. Each
    ``summary.json`` is checked first (`check_summary`)."""
    lines = list(TABLE_HEADER)
    for root in roots:
        lines.append(table_row(read_checked(root, SUMMARY_JSON, "the sweep", check_summary)))
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    """The parser of ``unfold-sweep``."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--config", default=None, help="a config file or a shipped config's name (e.g. default)")
    p.add_argument("--seeds", type=positive_int, default=5, help="number of seeds (default 5)")
    p.add_argument("--first-seed", type=seed_int, default=0)
    p.add_argument("--seed-keys", default=",".join(SEED_KEYS),
                   help=f"comma-separated config keys set to the seed (default {','.join(SEED_KEYS)})")
    p.add_argument("--run-dir", default=None, help="sweep folder (default runs/sweep-NAME)")
    p.add_argument("--jobs", type=positive_int, default=1, help="seeds run at once (default 1)")
    p.add_argument("--tfidf", action="store_true", help="sweep the TF-IDF baseline over split seeds")
    p.add_argument("--dataset", default="rotten_tomatoes", help="with --tfidf: the dataset")
    p.add_argument("--max-train-examples", type=positive_int, default=None, metavar="N",
                   help="with --tfidf: its first N training examples only (as train.max_train_examples)")
    p.add_argument("--table", nargs="+", metavar="DIR", help="print the comparison table of finished sweeps")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for every seed")
    return p


def _seed_keys(args) -> List[str]:
    """The keys of ``--seed-keys``; a [`ConfigError`][energies.ConfigError] for none, for an override of one of them, and for
    options that do not go together (``--tfidf`` with a config, ``--max-train-examples`` without ``--tfidf``)."""
    keys = [k.strip() for k in args.seed_keys.split(",") if k.strip()]
    if not keys:
        raise ConfigError(f"--seed-keys {args.seed_keys!r} names no key")
    clash = [o for o in args.overrides if o.split("=", 1)[0].strip() in keys]
    if clash:
        raise ConfigError(f"override(s) {clash} set a seed key; the sweep sets {', '.join(keys)} itself")
    if args.tfidf and (args.config or args.overrides or args.seed_keys != ",".join(SEED_KEYS)):
        raise ConfigError("--tfidf takes --dataset (its seed is the split seed), not --config, --seed-keys or "
                          "overrides")
    if args.max_train_examples is not None and not args.tfidf:
        raise ConfigError("--max-train-examples goes with --tfidf; a training sweep takes "
                          "train.max_train_examples=N")
    return keys


def _sweep_root(args) -> str:
    """The sweep folder: ``--run-dir``, else ``runs/sweep-NAME`` (the config's name, ``tfidf-DATASET``)."""
    if args.tfidf:
        name = f"tfidf-{args.dataset}"
    else:
        name = load_config(args.config, args.overrides)["name"]
    root = args.run_dir if args.run_dir is not None else os.path.join("runs", f"sweep-{name}")
    if not root.strip():
        raise ConfigError("--run-dir must name a folder, got an empty path")
    return root


def _sweep(args) -> int:
    """Run the sweep ``args`` ask for and print where its summary went and its result as one JSON line; exit
    status 1 when a seed failed."""
    keys = _seed_keys(args)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    root = _sweep_root(args)
    summary = run_sweep(root, seeds, args.config, args.overrides, keys, args.jobs,
                        tfidf=args.dataset if args.tfidf else None, imports=args.plugins or [],
                        say=lambda msg: print(msg, file=sys.stderr, flush=True), max_train=args.max_train_examples)
    print(summary["kept"] if summary.get("kept") else f"wrote {os.path.join(root, SUMMARY_JSON)} and {SUMMARY_MD}")
    acc = summary["metrics"].get("test_accuracy")
    print(json_dumps({"run_dir": root, "seeds": summary["seeds"], "failed": summary["failed"],
                      "test_accuracy": acc, "wall_seconds": summary["wall_seconds"]}))
    return 1 if summary["failed"] else 0


def main(argv=None) -> int:
    """``unfold-sweep``: a seed sweep, or ``--table`` of finished ones, under `unfold.cli.run_main` (bad
    input: one line, exit 2)."""
    args = _parser().parse_args(argv)

    def body() -> int:
        if args.table:
            print(table(args.table), end="")
            return 0
        return _sweep(args)

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
