"""Measured figures with one source: every figure a page gives is read from a committed JSON that the command
which measured it wrote, and the pages are regenerated from those files, never typed by hand.

A page marks a figure with two HTML comments (invisible once rendered):

    <!-- fig docs/measured/default_run.json /metrics/test_accuracy %.2f -->78.90<!-- /fig --> %

* the JSON file, from the repository root;
* a JSON Pointer into it (RFC 6901: ``/metrics/test_accuracy``, ``/run1/0/n``; ``~1`` stands for a ``/`` in a
  key, ``~0`` for a ``~``), optionally ``over`` a second pointer (into the same file, or into another named
  before it) for the ratio of the two values, or ``minus`` one for their difference;
* a Python format spec (``.2f``, ``,.0f``, ``,d``, ``.1f``), with ``%`` in front for a fraction written as a
  percentage (``%.2f``: 0.789 -> ``78.90``).

A number that is set, not measured here (a configuration default such as a masking rate, a limit, a rule's
constant, a target, a figure quoted from a publication), is marked as such, one number a marker, so that the count
of figures typed by hand (``tests/test_figures_match.py``) does not take it for a measurement:

    masks <!-- set -->15 %<!-- /set --> of the tokens

Numbers in inline code (an expression, a command's argument) and products written ``16 x 16`` are not counted
either; ratios are written ``1.7x``.

A generated table spans lines: ``<!-- table NAME FILE [FILE ...] -->``, the table, ``<!-- /table -->``, where NAME
is one of `TABLES` (the Markdown table of the JSONs, made by the code of the command that wrote them).

Command line:

    python -m experiments.studies.figures [--check]      # every marked figure against its JSON; exit 1 on a difference
    python -m experiments.studies.figures --write        # regenerate every marked figure and table of the pages
    python -m experiments.studies.figures measure-run    # time `unfold-train --config default`, record it
    python -m experiments.studies.figures measure-suite  # run the test suite, record its counts and seconds
    python -m experiments.studies.figures measure OUT.json -- python -m experiments.studies.pyg_sbm --json
    python -m experiments.studies.figures record-run RUN --wall-seconds S --commit SHA
    python -m experiments.studies.figures record-suite LOG --commit SHA

``measure-*`` run the command on the checkout and record its commit (``dirty`` when tracked files differ from
it); ``record-*`` record a run folder or a pytest log measured earlier, on the commit given (on the machine that
measured it). Both write `RUN_JSON` / `SUITE_JSON` atomically. ``measure OUT -- COMMAND`` runs any command whose
last line of output is one JSON object (a study's ``--json``) and writes that object to OUT with the command,
its wall time, the commit and the machine.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from energies.errors import ConfigError
from unfold.cli import run_main

from ..runfolder.atomic import atomic_write_text

PROG = "python -m experiments.studies.figures"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: where the default run's figures live (`record_run`)
RUN_JSON = "docs/measured/default_run.json"
#: where the test suite's figures live (`record_suite`)
SUITE_JSON = "docs/measured/suite.json"
#: the commands whose figures `measure-run` and `measure-suite` record
RUN_COMMAND = ["unfold-train", "--config", "default"]
SUITE_COMMAND = ["python", "-m", "pytest", "-q", "-n", "2"]

#: a marker right after a backquote is an example in code, not a figure
FIG = re.compile(r"(?<!`)<!-- fig ([^>]*?) -->(.*?)<!-- /fig -->")
TABLE = re.compile(r"(?<!`)<!-- table ([^>]*?) -->\n(.*?)<!-- /table -->", re.S)
#: a number set by the code or a config (a default, a limit, a target) or quoted from a publication, not measured
SET = re.compile(r"(?<!`)<!-- set -->(.*?)<!-- /set -->")
#: pytest's closing line: ``4257 passed, 99 skipped, 48 warnings in 877.48s (0:14:37)``
PYTEST_SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in ([\d.]+)s\b", re.M)


def _variants_table(summary: Dict[str, Any]) -> str:
    """The table of ``unfold-variants`` for its ``variants.json``."""
    from . import variants
    return "".join(line + "\n" for line in variants.markdown(summary).splitlines() if line.startswith("|"))


def _tokens(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 99_500 else f"{value / 1e3:.0f} k"


def _times(value: float) -> str:
    return f"{value:.0f}x" if value >= 100 else f"{value:.1f}x"


def _gpu_layer_table(record: Dict[str, Any]) -> str:
    """One layer on the GPU (`experiments.studies.bench` gpu rows of ``docs/gpu/*.json``): float32 rows of the
    first run, the bfloat16 ratio where the second run measured it."""
    rows = [r for run in ("run1", "run2") for r in record.get(run, []) if r.get("kind") == "layer"]
    bf16 = {r["n"]: r["ours_over_sdpa_time"] for r in rows if r["dtype"] == "bfloat16"}
    lines = ["| n | ours f32 tokens/s | SDPA f32 | Flex f32 | ours / SDPA time | window:8 / complete | bf16: ours / SDPA |",
             "|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["dtype"] == "float32"):
        flex = _tokens(r["flex_tokens_per_s"]) if "flex_tokens_per_s" in r else ""
        lines.append(f"| {r['n']:,d} | {_tokens(r['ours_tokens_per_s'])} | {_tokens(r['sdpa_tokens_per_s'])} | {flex} "
                     f"| {r['ours_over_sdpa_time']:.1f} | {_times(r['window_over_complete_tokens_per_s'])} "
                     f"| {format(bf16[r['n']], '.1f') if r['n'] in bf16 else ''} |")
    return "\n".join(lines) + "\n"


def _gpu_variants_table(record: Dict[str, Any]) -> str:
    """Graph variants on the GPU: tokens/s over the complete graph's, rows of the latest run that measured them."""
    run = next(name for name in ("run2", "run1") if any(r.get("kind") == "variants" for r in record.get(name, [])))
    lines = ["| n | window:8 | strided:16 | star |", "|---|---|---|---|"]
    for r in (r for r in record[run] if r.get("kind") == "variants"):
        ratios = " | ".join(_times(r[f"{g}_over_complete"]) for g in ("window:8", "strided:16", "star"))
        lines.append(f"| {r['n']:,d} | {ratios} |")
    return "\n".join(lines) + "\n"


def _sweeps_table(*summaries: Dict[str, Any]) -> str:
    """The table of ``unfold-sweep --table`` for sweeps' ``summary.json`` files, one row each (a TF-IDF sweep on
    part of the training split says how much)."""
    from ..app.sweep import TABLE_HEADER, check_summary, table_row
    rows = []
    for summary in summaries:
        check_summary(summary, "the sweep")
        part = summary["metrics"].get("max_train_examples", {}).get("mean")
        label = f"{summary['name']} (first {part:,.0f} training examples)" if part else None
        rows.append(table_row(summary, label))
    return "\n".join(list(TABLE_HEADER) + rows) + "\n"


def _depth_tables(record: Dict[str, Any]) -> str:
    """The two tables of `experiments.studies.depth` (against EPS, against the inference depth) for a record of
    ``measure`` around its ``--json``."""
    from . import depth
    blocks = depth.to_markdown(record["result"]).split("\n\n")
    return "\n".join(b.strip() + "\n" for b in blocks if b.startswith("|"))


def _convex_table(record: Dict[str, Any]) -> str:
    """The heads of `experiments.studies.convex_heads` (its ``--json`` line, recorded by ``measure``): one row a
    fit, without its seconds."""
    lines = ["| features | head | test acc | objective | duality gap (rel) | rank | non-convex params | iterations "
             "| A/A* calls | objective increases |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in record["result"].items():
        features, head = key.split("/", 1)
        lines.append(f"| {features} | {head} | {r['test_accuracy']:.4f} | {r['objective']:.5f} | "
                     f"{r['duality_gap_rel']:.1e} | {r['rank']} | {r['nonconvex_params']} | {r['iterations']} | "
                     f"{r['operator_calls']} | {r['objective_increases']} |")
    return "\n".join(lines) + "\n"


#: the generated tables a page may hold: name -> the Markdown of its JSON files
TABLES: Dict[str, Callable[..., str]] = {"variants": _variants_table, "gpu_layers": _gpu_layer_table,
                                         "gpu_variants": _gpu_variants_table, "sweeps": _sweeps_table,
                                         "depth": _depth_tables, "convex_heads": _convex_table}
#: how many JSON files each table reads (None: one or more)
TABLE_FILES = {"variants": 1, "gpu_layers": 1, "gpu_variants": 1, "sweeps": None, "depth": 1, "convex_heads": 1}


def pages(root: str = ROOT) -> Iterator[str]:
    """The pages that may hold figures, relative to `root`: README.md, CONTRIBUTING.md and every ``docs/**.md``."""
    for name in ("README.md", "CONTRIBUTING.md"):
        if os.path.exists(os.path.join(root, name)):
            yield name
    for folder, dirs, files in os.walk(os.path.join(root, "docs")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")


def pointer(document: Any, text: str, where: str) -> Any:
    """The value at JSON Pointer `text` (RFC 6901) in `document`; a `ConfigError` naming `where` and the first
    step that does not exist."""
    if not text.startswith("/"):
        raise ConfigError(f"{where}: the pointer {text!r} must start with '/'")
    value = document
    for step in text[1:].split("/"):
        key = step.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise ConfigError(f"{where}: the pointer {text!r} has no {key!r}")
    return value


def render(value: Any, spec: str, where: str) -> str:
    """`value` written with format `spec` (``%`` in front: times 100)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: the value {value!r} is not a number")
    if spec.startswith("%"):
        value, spec = value * 100, spec[1:]
    try:
        return format(value, spec)
    except ValueError as exc:
        raise ConfigError(f"{where}: the format {spec!r} does not apply to {value!r} ({exc})") from None


class Sources:
    """The JSON files the pages name, each read once (a missing or invalid one is a `ConfigError`)."""

    def __init__(self, root: str):
        self.root = root
        self.files: Dict[str, Any] = {}

    def __call__(self, name: str, where: str) -> Any:
        if name not in self.files:
            path = os.path.join(self.root, name)
            if os.path.isabs(name) or ".." in name.split("/") or not name.endswith(".json"):
                raise ConfigError(f"{where}: the source {name!r} must be a .json file inside the repository")
            try:
                with open(path, encoding="utf-8") as fh:
                    self.files[name] = json.load(fh)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{where}: the source {name!r} cannot be read ({exc})") from None
        return self.files[name]


def figure(spec: str, sources: Sources, where: str) -> str:
    """The text a ``fig`` marker's `spec` (``FILE POINTER [over|minus POINTER] FORMAT``) stands for."""
    words = spec.split()
    if len(words) in (5, 6) and words[2] in ("over", "minus"):
        name, top, operation, *other, fmt = words
        other_name, other = other if len(other) == 2 else [name] + other
    elif len(words) == 3:
        (name, top, fmt), operation = words, None
    else:
        raise ConfigError(f"{where}: a figure is 'FILE POINTER [over|minus [FILE] POINTER] FORMAT', got {spec!r}")
    value = pointer(sources(name, where), top, where)
    if operation is not None:
        second = pointer(sources(other_name, where), other, where)
        for text, number in ((top, value), (other, second)):
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise ConfigError(f"{where}: the value at {text!r} is {number!r}, not a number")
        if operation == "over" and second == 0:
            raise ConfigError(f"{where}: the divisor {other!r} is 0")
        value = value / second if operation == "over" else value - second
    return render(value, fmt, where)


def table(spec: str, sources: Sources, where: str) -> str:
    """The text a ``table`` marker's `spec` (``NAME FILE [FILE ...]``) stands for."""
    name, *files = spec.split() or [""]
    if name not in TABLES or not files or TABLE_FILES[name] not in (None, len(files)):
        raise ConfigError(f"{where}: a table is 'NAME FILE [FILE ...]' with NAME one of {sorted(TABLES)} and the "
                          f"number of files it reads, got {spec!r}")
    return TABLES[name](*(sources(file, where) for file in files))


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def regenerate(text: str, page: str, sources: Sources) -> Tuple[str, List[Tuple[int, str, str]]]:
    """`text` with every marked figure and table regenerated, and the differences found: (line, written,
    generated)."""
    found: List[Tuple[int, str, str]] = []

    def replace(pattern, render, wrap, current: str) -> str:
        """`current` with each `pattern` marker's content rendered anew (lines counted in `current` itself)."""
        def sub(match):
            line = _line(current, match.start())
            new = render(match.group(1), sources, f"{page}:{line}")
            if new != match.group(2):
                found.append((line, match.group(2), new))
            return wrap(match.group(1), new)
        return pattern.sub(sub, current)

    text = replace(FIG, figure, lambda spec, new: f"<!-- fig {spec} -->{new}<!-- /fig -->", text)
    text = replace(TABLE, table, lambda spec, new: f"<!-- table {spec} -->\n{new}<!-- /table -->", text)
    return text, found


def _first_difference(written: str, generated: str) -> str:
    """``'x', the JSON gives 'y'`` for the first line where two texts differ."""
    pairs = zip(written.splitlines() + [""], generated.splitlines() + [""])
    old, new = next(((a, b) for a, b in pairs if a != b), (written, generated))
    return f"{old!r}, the JSON gives {new!r}"


def check_pages(root: str = ROOT, write: bool = False) -> List[str]:
    """Every difference between a page's marked figures and their JSONs, one line each
    (``page:line: written 'x', the JSON gives 'y'``); with `write`, the pages are rewritten first."""
    sources, report = Sources(root), []
    for page in pages(root):
        path = os.path.join(root, page)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        new, found = regenerate(text, page, sources)
        report += [f"{page}:{line}: written {_first_difference(old, value)}" for line, old, value in found]
        if write and new != text:
            atomic_write_text(new, path)
    return report


def markers(root: str = ROOT) -> Dict[str, List[str]]:
    """Page -> the specs of its ``fig`` markers, in order (what tests compare across pages)."""
    out = {}
    for page in pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as fh:
            specs = FIG.findall(fh.read())
        if specs:
            out[page] = [spec for spec, _ in specs]
    return out


# ---- recording: the commands that measure write the JSONs the pages read ----------------------------------------

def git_commit(root: str = ROOT) -> Dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ConfigError(f"cannot read the commit of {root} ({exc})") from None


def machine() -> Dict[str, Any]:
    """What the figures were measured on."""
    import platform
    import torch
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__}


def record_run(run_dir: str, wall_seconds: float, commit: Dict[str, Any], command: Sequence[str]) -> Dict[str, Any]:
    """The default run's figures: the run folder's ``metrics.json`` (written by ``unfold-train``), the wall time
    of the whole command, the commit and the machine."""
    path = os.path.join(run_dir, "metrics.json")
    try:
        with open(path, encoding="utf-8") as fh:
            metrics = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"record-run: {path} cannot be read ({exc})") from None
    if not isinstance(metrics, dict) or "test_accuracy" not in metrics:
        raise ConfigError(f"record-run: {path} holds no 'test_accuracy': not a finished classifier run")
    if not (isinstance(wall_seconds, (int, float)) and wall_seconds > 0):
        raise ConfigError(f"record-run: --wall-seconds must be > 0, got {wall_seconds!r}")
    return {"command": " ".join(command), **commit, "machine": machine(), "wall_seconds": wall_seconds,
            "metrics": metrics}


def parse_pytest(log: str) -> Dict[str, Any]:
    """The counts and seconds of pytest's last summary line in `log`; a `ConfigError` if there is none or the
    suite did not pass (a failure or an error)."""
    found = PYTEST_SUMMARY.findall(log)
    if not found:
        raise ConfigError("record-suite: the log holds no pytest summary line ('N passed ... in S s')")
    counts_text, seconds = found[-1]
    counts = {word: int(n) for n, word in (item.split() for item in counts_text.split(", "))}
    bad = {k: v for k, v in counts.items() if k in ("failed", "error", "errors") and v}
    if bad or not counts.get("passed"):
        raise ConfigError(f"record-suite: the suite did not pass ({counts_text}); nothing recorded")
    return {"counts": counts, "seconds": float(seconds)}


def record_suite(log: str, commit: Dict[str, Any], command: Sequence[str]) -> Dict[str, Any]:
    """The test suite's figures: pytest's summary of `log`, the commit and the machine."""
    return {"command": " ".join(command), **commit, "machine": machine(), **parse_pytest(log)}


def write_json(record: Dict[str, Any], name: str, root: Optional[str] = None) -> str:
    """Write `record` to `name` (from `root`, default the repository) atomically; its path."""
    path = os.path.join(root or ROOT, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", path)
    return path


def measure_run(root: str = ROOT) -> Dict[str, Any]:
    """Run ``unfold-train --config default`` in a fresh run folder, timed; its record."""
    commit = git_commit(root)
    with tempfile.TemporaryDirectory(prefix="figures-run-") as tmp:
        run_dir = os.path.join(tmp, "default")
        start = time.perf_counter()
        subprocess.run(RUN_COMMAND + ["--run-dir", run_dir], cwd=root, check=True)
        return record_run(run_dir, time.perf_counter() - start, commit, RUN_COMMAND)


def measure_suite(root: str = ROOT) -> Dict[str, Any]:
    """Run the test suite as the README says; its record (the log is echoed)."""
    commit = git_commit(root)
    done = subprocess.run([sys.executable] + SUITE_COMMAND[1:], cwd=root, capture_output=True, text=True)
    sys.stdout.write(done.stdout[-2000:])
    return record_suite(done.stdout, commit, SUITE_COMMAND)


def measure_json(command: Sequence[str], root: Optional[str] = None) -> Dict[str, Any]:
    """Run `command` (its last line of output one JSON object) on the checkout; the object with the command, its
    wall time, the commit and the machine."""
    if not command:
        raise ConfigError("measure: give the command after '--'")
    commit = git_commit(root or ROOT)
    start = time.perf_counter()
    done = subprocess.run(list(command), cwd=root or ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise ConfigError(f"measure: {' '.join(command)!r} exited {done.returncode} without a JSON object on its "
                          f"last line ({(done.stderr.strip().splitlines() or ['no error output'])[-1]})")
    return {"command": " ".join(command), **commit, "machine": machine(), "wall_seconds": seconds,
            "result": result}


def _given_commit(text: str) -> Dict[str, Any]:
    if not re.fullmatch(r"[0-9a-f]{40}", text or ""):
        raise ConfigError(f"--commit must be the 40-hex commit the figures were measured on, got {text!r}")
    return {"commit": text, "dirty": False}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="regenerate the pages' figures from their JSONs")
    p.add_argument("--check", action="store_true", help="list the figures that differ from their JSONs (default)")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("measure-run", help="time `unfold-train --config default` and record it")
    sub.add_parser("measure-suite", help="run the test suite and record it")
    any_json = sub.add_parser("measure", help="run a command printing a JSON line and record it")
    any_json.add_argument("out", help="the JSON file to write, from the repository root")
    any_json.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")
    run = sub.add_parser("record-run", help="record a default run measured earlier")
    run.add_argument("run_dir")
    run.add_argument("--wall-seconds", type=float, required=True)
    run.add_argument("--commit", required=True)
    suite = sub.add_parser("record-suite", help="record a pytest log of the suite measured earlier")
    suite.add_argument("log")
    suite.add_argument("--commit", required=True)
    return p


def _record(args: argparse.Namespace) -> int:
    if args.command == "measure-run":
        path = write_json(measure_run(), RUN_JSON)
    elif args.command == "measure-suite":
        path = write_json(measure_suite(), SUITE_JSON)
    elif args.command == "measure":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not args.out.endswith(".json") or os.path.isabs(args.out) or ".." in args.out.split("/"):
            raise ConfigError(f"measure: OUT must be a .json path inside the repository, got {args.out!r}")
        path = write_json(measure_json(argv), args.out)
    elif args.command == "record-run":
        path = write_json(record_run(args.run_dir, args.wall_seconds, _given_commit(args.commit), RUN_COMMAND),
                          RUN_JSON)
    else:
        commit = _given_commit(args.commit)
        with open(args.log, encoding="utf-8", errors="replace") as fh:
            log = fh.read()
        path = write_json(record_suite(log, commit, SUITE_COMMAND), SUITE_JSON)
    print(f"wrote {path}; now `{PROG} --write` regenerates the pages")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command:
        return _record(args)
    report = check_pages(write=args.write)
    for line in report:
        print(line)
    if args.write:
        print(f"{len(report)} figure(s) regenerated")
        return 0
    return 1 if report else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line (module docstring); errors under `unfold.cli.run_main` (one line, exit 2)."""
    args = _parser().parse_args(argv)
    return run_main(PROG, lambda: _run(args), argv)


if __name__ == "__main__":
    sys.exit(main())
