"""``unfold-data inspect PATH [section.key=value ...]``: what ``unfold-train`` would read from a dataset, before
training on it.

The dataset is read by the trainer's own reader, `experiments.data.load.load_configured`, with the config
that ``unfold-train`` would resolve (``--config NAME|FILE``, its ``extends`` chain and the overrides, through
`experiments.app.config.load_config_sources`), so what is shown is what a run gets; there is no second
reader. The training split is then cut to ``train.max_train_examples`` and the vocabulary built from it as the
trainer does (`Vocab`, ``data.min_freq``, ``data.max_vocab``), and the texts
tokenised by the trainer's tokeniser (`tokenize`).

`inspect_dataset` returns a JSON-ready report:

* ``format``: what the path is (a CSV, JSON lines, JSON or parquet file, a folder of splits, a Hugging Face
  dataset, a registered corpus);
* ``columns``: the columns found, the one read as text and the one read as labels, with the config key that
  chose each and where its value came from (default, config file, override);
* ``classes``: the label names and the count of each per split, and the share of the most frequent class in the
  test split (the accuracy of always predicting it);
* ``splits``: the size of each split and where it comes from (a file, a split of the dataset, or drawn from the
  training data by ``data.seed``: ``derived``);
* ``lengths``: per split, text lengths in tokens (min, median, max) and the share longer than ``data.max_len``
  (those are truncated);
* ``vocabulary``: its size, and the share of validation and test tokens it does not hold (read as ``<unk>``);
* ``glove``: the share of the vocabulary found in GloVe 6B 50d (what the trainer logs) and of the tokens of each
  split unknown to it, when the GloVe files are present in the data folder; ``available: false`` and the reason
  otherwise (nothing is downloaded);
* ``dropped``: the rows read but left out (``rows``: how many; ``reasons``: ``{reason: count}``, e.g. empty texts,
  repeated texts, texts whose copies disagree on the label, ``hf:`` rows labelled -1);
* ``overlap``: the validation and test examples whose text is exactly that of a training (or, for test,
  validation) example (`experiments.data.core.split_overlap`);
* ``notes``: what deserves a look (many truncated texts, a tiny split, GloVe needed but absent, rows dropped,
  held-out texts seen in training, ...);
* ``command``: the ``unfold-train`` command that trains on it, with the same config and overrides.

Bad input (a refused dataset, a bad override) is the loader's typed refusal, which names the config keys that
fix it; nothing is written.
"""
from __future__ import annotations

import pathlib
import re
import shlex
import statistics
from collections import Counter

from energies.errors import ConfigError

from .config import load_config_sources
from ..data.core import SPLIT_NAMES, DataError, split_overlap
from ..data.corpora import DATASETS
from ..data.glove import read_glove
from ..data.load import load_configured
from ..data.store import data_dir as _data_dir
from ..data.text import Vocab, tokenize

#: the suffixes of the files a dataset may be, in words
FORMATS = {".csv": "CSV file", ".jsonl": "JSON lines file", ".json": "JSON file", ".parquet": "parquet file"}
#: a share of truncated texts above which a note proposes a larger data.max_len
TRUNCATED_NOTE = 0.10


def dataset_format(name: str) -> str:
    """What the dataset ``name`` is, in words, from its name alone (the reader decides the same way:
    `experiments.data.load.load_dataset`)."""
    if name.startswith("hf:"):
        return "Hugging Face dataset (hf:)"
    if name in DATASETS:
        return f"registered corpus {name!r}"
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return "folder of splits"
    return FORMATS.get(path.suffix.lower(), f"{path.suffix or 'suffix-less'} file")


def _run_name(name: str) -> str:
    """A run folder name for the dataset ``name``: its file or folder name, a suffix written ``_suffix``
    (``reviews.csv`` -> ``reviews_csv``, so that ``reviews.parquet`` beside it gets a folder of its own), safe
    characters only."""
    path = pathlib.PurePath(name[3:] if name.startswith("hf:") else name)
    stem = path.stem + (f"_{path.suffix[1:]}" if path.suffix else "")
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_") or "data"


def train_command(dataset: str, config: str | None, overrides) -> list[str]:
    """The ``unfold-train`` command line (argv) that trains on ``dataset`` with ``config`` and ``overrides``, in
    the run folder ``runs/<dataset name>``."""
    argv = ["unfold-train"] + (["--config", config] if config is not None else [])
    return argv + [f"data.dataset={dataset}", *overrides, "--run-dir", f"runs/{_run_name(dataset)}"]


def _lengths(token_lists: list, max_len: int) -> dict:
    """Min, median and max length in tokens of ``token_lists``, and the share longer than ``max_len``."""
    n = [len(t) for t in token_lists]
    return {"min": min(n), "median": statistics.median(n), "max": max(n),
            "truncated": sum(k > max_len for k in n) / len(n)}


def _glove_words(root: pathlib.Path) -> set:
    """The GloVe vocabulary in the data folder ``root``, read and checked as the trainer reads it
    (`experiments.data.glove.read_glove`); a `DataError` when the files are absent or corrupt."""
    return set(read_glove(root)[1])


def _used_splits(cfg: dict, splits) -> dict:
    """The examples the trainer uses per split: the training split cut to ``train.max_train_examples``; a
    [`ConfigError`][energies.ConfigError] when those hold one class only (the trainer's refusal,
    `experiments.app.build.train_examples`)."""
    limit = cfg["train"]["max_train_examples"]
    used = {"train": splits.train if limit is None else splits.train[:limit], "val": splits.val, "test": splits.test}
    if len({y for _, y in used["train"]}) < 2:        # the trainer's refusal (experiments.app.build.train_examples)
        raise ConfigError(f"train.max_train_examples={limit}: the first {len(used['train'])} training examples of "
                          f"{splits.name} hold one class only; use more examples")
    return used


def _unknown(token_lists: list, known) -> float:
    """The share of the tokens of ``token_lists`` not in ``known`` (0.0 when there are none)."""
    n = sum(len(t) for t in token_lists)
    return sum(tok not in known for t in token_lists for tok in t) / n if n else 0.0


def _columns(dataset: str, splits, dc: dict, sources: dict) -> dict:
    """The ``columns`` entry: the columns found, those read as text and label and what chose each."""
    if dataset in DATASETS:                                 # a corpus reads its own columns
        return {"found": [], "text": None, "label": None, "text_set_by": "the corpus", "label_set_by": "the corpus"}
    return {
        "found": list(splits.columns),
        "text": dc["text_field"], "text_set_by": f"data.text_field ({sources['data.text_field']})",
        "label": dc["label_field"], "label_set_by": f"data.label_field ({sources['data.label_field']})",
    }


def _classes(names, used: dict) -> dict:
    """The ``classes`` entry: the label names, the count of each per split, the test split's majority share."""
    counts = {s: Counter(y for _, y in used[s]) for s in SPLIT_NAMES}
    return {
        "names": list(names),
        "counts": {s: {names[k]: counts[s].get(k, 0) for k in range(len(names))} for s in SPLIT_NAMES},
        "test_majority_share": max(counts["test"].values()) / len(used["test"]),
    }


def _glove(dc: dict, vocab, tokens: dict) -> dict:
    """The ``glove`` entry: the share of the vocabulary in GloVe and of each split's tokens unknown to it, or
    ``available: false`` and the reason when the files are not in the data folder."""
    glove = {"used": dc["glove"]}
    root = _data_dir(dc["data_dir"])
    try:
        words = _glove_words(root)
    except DataError as e:
        glove.update({"available": False, "reason": str(e)})
    else:
        ordinary = vocab.itos[len(Vocab.SPECIALS):]
        glove.update({
            "available": True,
            "vocabulary_found": sum(w in words for w in ordinary) / len(ordinary) if ordinary else 0.0,
            "unknown_tokens": {s: _unknown(tokens[s], words) for s in SPLIT_NAMES}})
    return glove


def inspect_dataset(dataset: str, config: str | None = None, overrides=()) -> dict:
    """The report of ``dataset`` read as ``unfold-train --config CONFIG data.dataset=DATASET OVERRIDES`` reads it
    (module docstring). A refused dataset is the loader's `DataError`, a bad override a
    [`ConfigError`][energies.ConfigError]."""
    overrides = list(overrides)
    given = [o for o in overrides if o.split("=", 1)[0].strip() == "data.dataset"]
    if given:
        raise ConfigError(f"{given[0]!r}: the dataset is the PATH argument of inspect; drop the data.dataset override")
    cfg, sources = load_config_sources(config, [*overrides, f"data.dataset={dataset}"])
    dc = cfg["data"]
    splits = load_configured(dc)
    used = _used_splits(cfg, splits)
    tokens = {s: [tokenize(t) for t, _ in used[s]] for s in SPLIT_NAMES}
    vocab = Vocab.build(tokens["train"], min_freq=dc["min_freq"], max_size=dc["max_vocab"])
    report = {
        "dataset": dataset,
        "name": splits.name,
        "format": dataset_format(dataset),
        "config": config,
        "columns": _columns(dataset, splits, dc, sources),
        "classes": _classes(splits.label_names, used),
        "splits": {s: {"size": len(used[s]), "derived": s in splits.derived,
                       "from": splits.origin.get(s, splits.name)} for s in SPLIT_NAMES},
        "max_train_examples": cfg["train"]["max_train_examples"],
        "train_available": len(splits.train),
        "lengths": {"unit": "tokens", "max_len": dc["max_len"],
                    **{s: _lengths(tokens[s], dc["max_len"]) for s in SPLIT_NAMES}},
        "vocabulary": {"size": len(vocab), "min_freq": dc["min_freq"], "max_vocab": dc["max_vocab"],
                       "unknown_tokens": {s: _unknown(tokens[s], vocab.stoi) for s in ("val", "test")}},
        "glove": _glove(dc, vocab, tokens),
        "dropped": {"rows": sum(splits.dropped.values()), "reasons": dict(splits.dropped)},
        "overlap": split_overlap(splits),
    }
    argv = train_command(dataset, config, overrides)
    report["command"] = shlex.join(argv)
    report["argv"] = argv
    report["notes"] = _notes(report)
    return report


def _notes(r: dict) -> list[str]:
    """What deserves a look before training, one sentence each (``notes`` of the report)."""
    notes = []
    lengths = r["lengths"]
    worst = max(SPLIT_NAMES, key=lambda s: lengths[s]["truncated"])
    if lengths[worst]["truncated"] > TRUNCATED_NOTE:
        longest = max(lengths[s]["max"] for s in SPLIT_NAMES)
        notes.append(f"{lengths[worst]['truncated']:.0%} of the {worst} texts are longer than data.max_len="
                     f"{lengths['max_len']} tokens and are cut: set data.max_len={min(longest, 4096)} to keep them "
                     "whole (costs memory and time)")
    small = [s for s in ("val", "test") if r["splits"][s]["size"] < 30]
    if small:
        notes.append(f"the {' and '.join(small)} split{'s' if len(small) > 1 else ''} "
                     f"hold{'' if len(small) > 1 else 's'} fewer than 30 examples: their accuracy moves in steps of "
                     f"{1 / min(r['splits'][s]['size'] for s in small):.0%} or more")
    missing = [k for k, n in r["classes"]["counts"]["train"].items() if n == 0]
    if missing:
        notes.append(f"class(es) {missing} have no training example: the model cannot learn them")
    glove = r["glove"]
    if not glove["available"] and glove["used"] != "none":
        notes.append(f"data.glove={glove['used']} needs the GloVe files, which are not available here: fetch them "
                     "(unfold-data fetch --dataset glove) or set data.glove=none")
    if glove["available"] and glove["used"] != "none" and glove["vocabulary_found"] < 0.5:
        notes.append(f"only {glove['vocabulary_found']:.0%} of the vocabulary is in GloVe (English words): "
                     "data.glove=none may do as well")
    if r["max_train_examples"] is not None and r["max_train_examples"] < r["train_available"]:
        notes.append(f"train.max_train_examples={r['max_train_examples']}: {r['splits']['train']['size']} of the "
                     f"{r['train_available']} training examples are used")
    return notes + _data_notes(r)


def _data_notes(r: dict) -> list[str]:
    """The notes on the rows themselves: rows dropped while reading, held-out texts repeated from training."""
    notes = []
    d = r["dropped"]
    if d["rows"]:
        notes.append(f"{d['rows']} row(s) read were left out: "
                     + "; ".join(f"{n} {reason}" for reason, n in d["reasons"].items()))
    seen = {k: n for k, n in r["overlap"].items() if n}
    if seen:
        said = ", ".join(f"{n} {k.split('_')[0]} example(s) repeat a {k.split('_')[-1]} text" for k, n in seen.items())
        notes.append(f"{said} (exact duplicates): accuracy on them overstates what the model does on unseen text")
    return notes


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _render_columns(r: dict, line) -> None:
    """The ``columns`` block of `render`, each line through ``line(key, text)``."""
    c = r["columns"]
    if c["text"] is None:
        line("columns", "the corpus's own (data.text_field and data.label_field do not apply)")
    else:
        line("columns", f"found {', '.join(c['found'])}")
        line("", f"text:  {c['text']!r}, chosen by {c['text_set_by']}")
        line("", f"label: {c['label']!r}, chosen by {c['label_set_by']}")


def _render_classes(r: dict, line) -> None:
    """The ``classes`` block of `render`: a table of examples per class and split, the majority share."""
    names = r["classes"]["names"]
    width = max([len(n) for n in names] + [5])
    line("classes", f"{len(names)}; examples per split:")
    line("", f"{'':<{width}}  " + "  ".join(f"{s:>6}" for s in SPLIT_NAMES))
    for n in names:
        line("", f"{n:<{width}}  " + "  ".join(f"{r['classes']['counts'][s][n]:>6}" for s in SPLIT_NAMES))
    line("", f"the most frequent class is {_pct(r['classes']['test_majority_share'])} of the test split (the "
             "accuracy of always predicting it)")


def _render_splits(r: dict, line) -> None:
    """The ``splits`` and ``lengths`` blocks of `render`: sizes and origins, then lengths in tokens."""
    line("splits", "")
    for s in SPLIT_NAMES:
        sp = r["splits"][s]
        line("", f"{s:<6}{sp['size']:>8}  {'derived: ' if sp['derived'] else 'given: '}{sp['from']}")
    if r["max_train_examples"] is not None and r["max_train_examples"] < r["train_available"]:
        line("", f"(train: the first {r['splits']['train']['size']} of {r['train_available']}, "
                 f"train.max_train_examples={r['max_train_examples']})")
    d = r["dropped"]
    line("", f"dropped {d['rows']} row(s) read" + (": " + "; ".join(f"{n} {why}" for why, n in d["reasons"].items())
                                                   if d["rows"] else ""))
    o = r["overlap"]
    line("", "exact duplicate texts: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in o.items()))
    L = r["lengths"]
    line("lengths", f"in tokens (min / median / max; truncated at data.max_len={L['max_len']})")
    for s in SPLIT_NAMES:
        x = L[s]
        line("", f"{s:<6}{x['min']:>6} / {x['median']:g} / {x['max']}  {_pct(x['truncated'])} truncated")


def _render_words(r: dict, line) -> None:
    """The ``vocabulary`` and ``glove`` blocks of `render`: the vocabulary and the words unknown to it and
    to GloVe."""
    v = r["vocabulary"]
    line("vocabulary", f"{v['size']} entries: <pad>, <unk> and the training split's words seen data.min_freq="
                       f"{v['min_freq']} times or more" + (f" (the data.max_vocab={v['max_vocab']} most frequent)"
                                                           if v["max_vocab"] is not None else ""))
    line("", f"words unknown to it (read as <unk>): {_pct(v['unknown_tokens']['val'])} of val tokens, "
             f"{_pct(v['unknown_tokens']['test'])} of test tokens")
    g = r["glove"]
    if g["available"]:
        u = g["unknown_tokens"]
        line("glove", f"GloVe 6B 50d (data.glove={g['used']}): {_pct(g['vocabulary_found'])} of the vocabulary "
                      f"found; unknown words: {_pct(u['train'])} of train, {_pct(u['val'])} of val, "
                      f"{_pct(u['test'])} of test tokens")
    else:
        line("glove", f"GloVe not available (data.glove={g['used']}): {g['reason']}")


def render(r: dict) -> str:
    """The report as text, one topic a block (what ``unfold-data inspect`` prints without ``--json``)."""
    out = []

    def line(key: str, text: str = "") -> None:
        out.append(f"{key:<12}{text}".rstrip())

    line("dataset", f"{r['dataset']} ({r['format']})")
    if r["config"] is not None:
        line("config", r["config"])
    for block in (_render_columns, _render_classes, _render_splits, _render_words):
        block(r, line)
    for i, n in enumerate(r["notes"]):
        line("note" if i == 0 else "", n)
    line("train with", r["command"])
    return "\n".join(out) + "\n"


def inspect_argv_parser(prog: str):
    """The parser of ``inspect``: PATH, overrides anywhere on the line, ``--config``, ``--json``."""
    import argparse

    from unfold.plugins import add_import_arg
    p = argparse.ArgumentParser(prog=f"{prog} inspect", usage="%(prog)s [-h] [--import MODULE] [--config C] [--json] "
                                                             "PATH [section.key=value ...]", description=(
        "Show what unfold-train would read from a dataset (the same config, overrides and reader): format, columns "
        "chosen as text and label, classes per split, lengths in tokens, splits, GloVe coverage, and the command "
        "that trains on it. Writes nothing; a refusal exits 2 and names the config keys that fix it."))
    add_import_arg(p, subcommand=True)
    p.add_argument("items", nargs="+", metavar="PATH",
                   help="the dataset (a .csv/.jsonl/.json/.parquet file, a folder of splits, hf:PATH or a registered "
                        "name, as data.dataset takes it) and overrides as unfold-train takes them, e.g. "
                        "data.text_field=body data.label_field=topic, in any order")
    p.add_argument("--config", default=None, help="a config name or file, as unfold-train --config takes it "
                                                  "(default: the defaults)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p


#: an override, ``section.key=value`` (what is not one among inspect's arguments is the dataset)
_OVERRIDE = re.compile(r"[A-Za-z_]\w*\.[\w.]+=")


def split_items(items: list[str]) -> tuple[str, list[str]]:
    """``(PATH, overrides)`` of inspect's arguments: the overrides are the ``section.key=value`` items, the one
    other item is the dataset; none or several others is a [`ConfigError`][energies.ConfigError] naming them."""
    paths = [a for a in items if not _OVERRIDE.match(a)]
    if len(paths) != 1:
        raise ConfigError(f"inspect takes one dataset PATH and section.key=value overrides; got "
                          f"{len(paths)} other argument(s): {paths}")
    return paths[0], [a for a in items if _OVERRIDE.match(a)]


__all__ = ["inspect_dataset", "render", "train_command", "dataset_format", "inspect_argv_parser", "split_items"]
