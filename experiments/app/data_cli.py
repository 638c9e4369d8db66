"""The command line, ``unfold-data``::

    unfold-data fetch [--dataset NAME ...] [--data-dir DIR] [--force]
    unfold-data export --dataset NAME --out DIR [--overwrite] [--seed S] [--data-dir DIR] [--split KEY=NAME ...]
                                      [--option KEY=INT ...]
    unfold-data inspect PATH [section.key=value ...] [--config NAME|FILE] [--json]

``--option`` sets an option of a generated dataset (``listops``: ``min_len``, ``max_len``, ``max_depth``,
``max_args``, ``train``, ``val``, ``test``; `experiments.data.listops`), the generated splits are written.
``export`` writes ``train.jsonl``, ``val.jsonl``, ``test.jsonl`` (``{"text": ..., "label": int}`` a line, in
the order the trainer sees them) and ``labels.json``, all or nothing; ``load_dataset(DIR)`` reads such a
directory back unchanged. ``--out`` must be new or empty; ``--overwrite`` replaces a folder that holds an
earlier export and nothing else; the folder the dataset is read from (or that holds its file) is always
refused (`experiments.data.files.export`). ``inspect`` shows what ``unfold-train`` would read from PATH (the
trainer's reader, config and overrides; `experiments.app.inspect_data`) and the command that trains on it; it writes nothing. The
commands run under `unfold.cli.run_main`: bad input (a `DataError`,
a file where a folder is expected, ...) exits with status 2 and one line.
"""
from __future__ import annotations

import argparse
import sys

from energies.checks import parse_int
from unfold.cli import folder_arg, output_folder_arg, run_main
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..data.core import SPLIT_NAMES, DataError, split_seed_arg
from ..data.files import check_export_target, export
from .inspect_data import inspect_argv_parser, inspect_dataset, render, split_items
from ..data.load import load_dataset, source_paths, valid_names
from ..data.sources import SOURCES, fetch
from ..data.store import DATA_DIR_ENV, DEFAULT_DATA_DIR, data_dir

PROG = "unfold-data"


def _nonempty_arg(text: str) -> str:
    """argparse ``type=``: a non-empty string (a dataset name, a column name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _split_arg(text: str) -> tuple[str, str]:
    """argparse ``type=``: ``KEY=NAME``, a trainer split (train, val, test) and a split name of the dataset."""
    key, sep, name = text.partition("=")
    if not sep or key not in SPLIT_NAMES or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} must be KEY=NAME with KEY one of {', '.join(SPLIT_NAMES)} and "
                                         "NAME a split of the dataset, e.g. val=validation")
    return key, name


def _option_arg(text: str) -> tuple[str, int]:
    """argparse ``type=``: ``KEY=INT``, an option of a generated dataset and its integer value."""
    key, sep, value = text.partition("=")
    try:
        number = parse_int(value) if sep and key.strip() else None     # ASCII digits only
    except ValueError:
        number = None
    if number is None:
        raise argparse.ArgumentTypeError(f"{text!r} must be KEY=INT, an option of a generated dataset, e.g. "
                                         "max_len=512")
    return key.strip(), number


def _pair_map(pairs, flag: str) -> dict | None:
    """The ``KEY=VALUE`` pairs of a repeatable flag (``--option``, ``--split``) as a mapping (``None`` when none
    was given); a key given twice is a `DataError` naming the flag."""
    if not pairs:
        return None
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DataError(f"{flag} {key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def _inspect_main(argv: list) -> int:
    """``inspect PATH [overrides] [--config C] [--json]``: its own parser, overrides anywhere on the line."""
    args = inspect_argv_parser(PROG).parse_intermixed_args(argv)

    def body() -> int:
        path, overrides = split_items(args.items)
        report = inspect_dataset(path, args.config, overrides)
        print(json_dumps(report, sort_keys=True) if args.json else render(report), end="\n" if args.json else "")
        return 0

    return run_main(PROG, body, argv)


def _add_export_parser(sub) -> None:
    """The ``export`` subcommand's parser and its options, added to the subparsers ``sub``."""
    e = sub.add_parser("export", help="write train/val/test.jsonl and labels.json of a dataset")
    add_import_arg(e, subcommand=True)
    e.add_argument("--dataset", required=True, type=_nonempty_arg, help=valid_names())
    e.add_argument("--out", required=True, type=output_folder_arg, help="output directory, new or empty")
    e.add_argument("--overwrite", action="store_true",
                   help="replace --out when it holds an earlier export (train/val/test.jsonl, labels.json and "
                        "nothing else); a folder with other files is never replaced")
    e.add_argument("--seed", type=split_seed_arg, default=0, help="split seed, in [0, 2**32)")
    e.add_argument("--data-dir", type=folder_arg, default=None)
    e.add_argument("--text-field", type=_nonempty_arg, default="text")
    e.add_argument("--label-field", type=_nonempty_arg, default="label")
    e.add_argument("--split", type=_split_arg, action="append", metavar="KEY=NAME",
                   help="hf: datasets: take split KEY (train, val, test) from the dataset's split NAME, e.g. "
                        "val=validation (repeatable; default: train; validation|val|dev; test)")
    e.add_argument("--option", type=_option_arg, action="append", metavar="KEY=INT",
                   help="generated datasets (listops): a generator option, e.g. max_len=512 (repeatable)")


def _parser() -> argparse.ArgumentParser:
    """The parser of ``fetch`` and ``export`` (``inspect`` is listed; `_inspect_main` parses it)."""
    p = argparse.ArgumentParser(prog=PROG, description="Fetch text datasets and GloVe vectors; export splits.")
    add_import_arg(p)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the data files (default: all of them)")
    add_import_arg(f, subcommand=True)
    f.add_argument("--dataset", nargs="+", action="extend", metavar="NAME", choices=list(SOURCES),
                   help=f"one or more of {', '.join(SOURCES)} (default: all)")
    f.add_argument("--data-dir", type=output_folder_arg, default=None,
                   help=f"default ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR}")
    f.add_argument("--force", action="store_true", help="download again even if present and valid")
    f.add_argument("--quiet", action="store_true")
    sub.add_parser("inspect", add_help=False, help="show what unfold-train would read from a dataset: "
                                                   "inspect PATH [section.key=value ...] [--config C] [--json]")
    _add_export_parser(sub)
    return p


def _fetch(args) -> int:
    """``fetch``: download the files asked for and print the report as one JSON line."""
    report = fetch(args.dataset or list(SOURCES), data_dir=args.data_dir, quiet=args.quiet,
                   force=args.force)
    print(json_dumps({"data_dir": str(data_dir(args.data_dir)), **report}, sort_keys=True))
    return 0


def _export(args) -> int:
    """``export``: read the dataset as asked, write its splits (`experiments.data.files.export`) and print
    what was written as one JSON line."""
    sources = source_paths(args.dataset, args.data_dir)
    check_export_target(args.out, args.overwrite, sources)          # before the dataset is read
    splits = load_dataset(args.dataset, seed=args.seed, data_dir=args.data_dir,
                          text_field=args.text_field, label_field=args.label_field,
                          splits=_pair_map(args.split, "--split"), options=_pair_map(args.option, "--option"))
    out = export(splits, args.out, overwrite=args.overwrite, sources=sources)
    print(json_dumps({"out": str(out), "dataset": splits.name, "num_classes": splits.num_classes,
                      "label_names": splits.label_names, **splits.sizes()}))
    return 0


def main(argv=None) -> int:
    """``fetch``, ``export`` and ``inspect`` subcommands under `unfold.cli.run_main` (bad input: one line,
    exit 2)."""
    rest = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(rest) and rest[i].startswith("--import"):   # the main parser's only option before a command
        i += 1 if "=" in rest[i] else 2
    if i < len(rest) and rest[i] == "inspect":               # its own parser: overrides anywhere on the line
        return _inspect_main(rest[:i] + rest[i + 1:])
    args = _parser().parse_args(argv)

    def body() -> int:
        return _fetch(args) if args.command == "fetch" else _export(args)

    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
