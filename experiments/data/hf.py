"""``hf:NAME[:CONFIG]``: a dataset in the Hugging Face format, read offline from a local folder with pyarrow
(the ``datasets`` package is not needed), or from the hub through ``datasets`` when it is installed.

NAME is looked up in this order, the first match wins:

1. NAME is a folder (``~`` expanded): that folder;
2. ``<data dir>/hf/NAME`` is a folder (NAME may hold a ``/``, as in ``stanfordnlp/imdb``): that folder;
3. the ``datasets`` package is installed: ``datasets.load_dataset(NAME, CONFIG)``, the hub or its local cache
   (the hub is probed with a 3 s connect first; if it does not answer, ``HF_HUB_OFFLINE=1`` and
   ``HF_DATASETS_OFFLINE=1`` are set so that nothing waits on the network);
4. otherwise a `DataError` naming the places looked and what to do.

A folder holds one of two layouts:

* the output of ``Dataset(Dict).save_to_disk(folder)``: ``dataset_dict.json`` (``{"splits": [...]}``) and a
  folder per split with its ``data-*.arrow`` files (Arrow IPC streams, in the order its ``state.json`` lists
  them) and ``dataset_info.json`` (``features``); a single ``Dataset`` saved so (``state.json`` at the top) is
  the split ``train``. With a CONFIG, the subfolder CONFIG is read.
* a hub repository snapshot: ``README.md`` whose YAML front matter lists ``configs`` (``config_name``,
  ``data_files`` as ``{split, path}`` globs, ``data_dir``, ``default``) and ``dataset_info`` (``features``; a
  class label is ``dtype: {class_label: {names: {'0': neg, '1': pos}}}``), and the data files it names
  (``data/train-00000-of-00001.parquet``, ``CONFIG/train-*.parquet``). Without ``configs`` in the README, the
  configs and splits are read off the paths: parquet (or arrow) files at the top, under ``data/`` or under a
  folder named after a split make the default config; any other folder holding such files is a config of
  that name. A file's split is the folder it lies in under its config (``train/0000.parquet``), else its name
  up to the first ``-`` (``train-00000-of-00001.parquet``).

Labels: when the label column is a ``ClassLabel`` (in ``dataset_info.json``, the README, or the
``huggingface`` metadata that ``datasets`` writes into every file), its names are the label names (no two
alike: `experiments.data.core.check_label_names`), its ids are kept, and rows labelled -1 (the hub's "no
label") are dropped; any other label column is mapped by `experiments.data.core.label_table` over the
splits used (values that collide, such as ``1`` in one split's file and ``"1"`` in another's, are refused).
A split that holds no row, or none left once the rows labelled -1 are dropped, is refused naming it and its
files. The README's YAML front matter is read by `experiments.runfolder.strict_yaml.load_yaml` (repeated keys and deep
nesting refused).

Splits: the trainer's ``train``, ``val`` and ``test`` are the dataset's ``train``; ``validation``, ``val`` or
``dev``; ``test`` (any case), unless ``splits`` maps them, e.g. ``{"val": "validation"}``; a key left out of
the mapping follows the automatic rule, skipping a split that the mapping already uses. A missing ``val`` or
``test`` is carved out of ``train`` with the seeded 80/10/10 rule (`experiments.data.core.split_examples`).
The texts are used as they are (no cleaning).
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
from collections.abc import Mapping

import yaml

from .arrow import read_columns, read_schema
from .core import (SPLIT_NAMES, SPLIT_WORDS, DataError, Splits, check_label_names, column_fix, complete_splits, fix,
                   label_column_fix, label_table, show)
from .files import records_to_examples
from .store import data_dir as _data_dir

#: the dataset split names that the trainer's splits take when ``splits`` does not say (first found wins)
AUTO_SPLITS = {"train": ("train",), "val": ("validation", "val", "dev"), "test": ("test",)}
DATA_SUFFIXES = (".parquet", ".arrow")
_SPLIT_FOLDERS = {alias for aliases in AUTO_SPLITS.values() for alias in aliases}


def check_split_map(splits) -> dict | None:
    """``splits`` as a dict, or ``None`` for the automatic choice: a non-empty mapping whose keys are among
    ``train``, ``val``, ``test`` and whose values are non-empty strings (split names of the dataset);
    anything else is a `DataError` naming the key and the value."""
    if splits is None:
        return None
    if not isinstance(splits, Mapping) or not splits:
        raise DataError(f"splits must be null or a non-empty mapping of train/val/test to split names of the "
                        f"dataset, e.g. {{val: validation}}; got {show(splits)}"
                        + fix("data.splits.val=NAME", why="one key per trainer split; or data.splits=null"))
    unknown = [k for k in splits if k not in SPLIT_NAMES]
    if unknown:
        raise DataError(f"splits: unknown key(s) {show(unknown)}; valid keys: {', '.join(SPLIT_NAMES)}"
                        + fix("data.splits.val=NAME", why="the trainer's train, val or test, each the name of a split "
                                                          "of the dataset"))
    for key, value in splits.items():
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"splits: {key} must name a split of the dataset (a non-empty string), got {show(value)}"
                            + fix(f"data.splits.{key}=NAME"))
    return dict(splits)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``(NAME, CONFIG)`` of ``NAME[:CONFIG]`` (what follows ``hf:``); CONFIG is ``None`` when not given.

    A NAME that is an existing folder is taken whole, colons included; otherwise the text after the last
    ``:`` is the config."""
    if not spec.strip():
        raise DataError("hf: needs a dataset name, e.g. hf:imdb" + fix("data.dataset=hf:PATH",
                                                                     why="a Hugging Face dataset folder"))
    if os.path.isdir(os.path.expanduser(spec)):
        return spec, None
    name, sep, config = spec.rpartition(":")
    if not sep:
        return spec, None
    if not name.strip():
        raise DataError(f"hf:{spec}: needs a dataset name before the config, e.g. hf:imdb:plain_text"
                        + fix("data.dataset=hf:NAME:CONFIG"))
    if not config.strip():
        raise DataError(f"hf:{spec}: the config after ':' is empty; write hf:NAME or hf:NAME:CONFIG"
                        + fix(f"data.dataset=hf:{name}"))
    return name, config


def find_folder(name: str, data_dir=None) -> tuple[pathlib.Path | None, list[str]]:
    """The local folder of dataset ``name`` (resolution steps 1 and 2 of the module docstring), or ``None``;
    with the list of the places looked. An existing path that is not a folder is a `DataError`."""
    path = pathlib.Path(name).expanduser()
    looked = [str(path.absolute())]
    if path.is_dir():
        return path, looked
    if path.exists():
        raise DataError(f"hf:{name}: {path} is not a folder; hf: reads a Hugging Face dataset folder (the output "
                        "of save_to_disk or a hub snapshot)" + fix(f"data.dataset={name}", why="a file is read "
                                                                                             "without hf:"))
    rel = pathlib.PurePosixPath(name)
    if not rel.is_absolute() and ".." not in rel.parts and not name.startswith("~"):
        candidate = _data_dir(data_dir) / "hf" / rel
        looked.append(str(candidate))
        if candidate.is_dir():
            return candidate, looked
    return None, looked


def load_hf(spec: str, seed: int = 0, text_field: str = "text", label_field: str = "label", data_dir=None,
            splits=None) -> Splits:
    """``hf:SPEC`` (``SPEC`` = ``NAME[:CONFIG]``) as a `Splits` named ``hf:SPEC``: see the module docstring."""
    splits = check_split_map(splits)
    name, config = parse_spec(spec)
    label = f"hf:{spec}"
    folder, looked = find_folder(name, data_dir)
    if folder is not None:
        return _load_folder(folder, config, label, seed, text_field, label_field, splits)
    if not _datasets_installed():
        raise DataError(f"{label}: no dataset folder {' nor '.join(looked)}, and the `datasets` package that would "
                        f"look on the hub is not installed (the hub may be unreachable here anyway); put the dataset "
                        f"(a save_to_disk folder or a hub snapshot) at {looked[-1]}, or give its folder as hf:PATH, "
                        "or pip install datasets" + fix("data.dataset=hf:PATH", why="PATH: the dataset's folder"))
    return _load_hub(name, config, label, seed, text_field, label_field, splits)


# --------------------------------------------------------------------------------------------
# Choosing the splits, mapping the labels
# --------------------------------------------------------------------------------------------

def choose_splits(label: str, available, splits: dict | None) -> dict[str, str]:
    """``{trainer split: dataset split}`` for the dataset splits ``available`` (module docstring, "Splits").

    A name that ``splits`` gives and the dataset lacks, no train split, or one dataset split mapped to two
    trainer splits is a `DataError` listing the splits found."""
    available = list(available)
    found = sorted(available)
    splits = splits or {}
    chosen = {}
    for key, want in splits.items():
        if want not in available:
            raise DataError(f"{label}: no split {want!r} (splits: {key} -> {want!r}); splits found: {found}"
                            + fix(f"data.splits.{key}={_other(found, chosen, key) or 'NAME'}", why="a split found"))
        clash = [k for k, v in chosen.items() if v == want]
        if clash:
            raise DataError(f"{label}: split {want!r} is mapped to both {clash[0]} and {key}; a split can be "
                            f"used once; splits found: {found}"
                            + fix(f"data.splits.{key}={_other(found, {**chosen, key: want}, key) or 'NAME'}"))
        chosen[key] = want
    by_lower: dict[str, str] = {}
    for s in available:
        by_lower.setdefault(s.lower(), s)
    for key in SPLIT_NAMES:
        if key in chosen:
            continue
        for alias in AUTO_SPLITS[key]:
            s = by_lower.get(alias)
            if s is not None and s not in chosen.values():
                chosen[key] = s
                break
    if "train" not in chosen:
        raise DataError(f"{label}: no train split; splits found: {found}"
                        + fix(f"data.splits.train={_other(found, chosen, 'train') or 'NAME'}", why="the split to train on"))
    return {k: chosen[k] for k in SPLIT_NAMES if k in chosen}


def _other(found: list, chosen: dict, key: str) -> str | None:
    """A split of ``found`` to propose for the trainer's split ``key`` in a fix: one whose name says it is that
    split (`AUTO_SPLITS`, any case, or a name that begins so: ``training``), else one that no trainer split
    uses yet; ``None`` when none is left."""
    free = [s for s in found if s not in chosen.values()]
    return next((s for s in free if any(s.lower().startswith(a[:3]) for a in AUTO_SPLITS[key])),
                free[0] if free else None)


def _nonempty(label: str, sources: dict, key: str, split: str, rows: list, dropped: int = 0) -> list:
    """``rows``, or the refusal of the trainer split ``key`` (dataset split ``split``) having no row left."""
    if not rows:
        after = f" once its {dropped} row(s) labelled -1 (no label) are dropped" if dropped else ""
        files = f" ({sources[key]})" if key in sources else ""
        raise DataError(f"{label}: the {SPLIT_WORDS[key]} split is empty: split {split!r}{files} holds no "
                        f"row{after}; every split needs examples (an empty one would report a made-up accuracy)"
                        + fix(f"data.splits.{key}=NAME", why="another split of the dataset"))
    return rows


#: the reason ``Splits.dropped`` gives for the rows of a ClassLabel column labelled -1
DROP_UNLABELLED = "labelled -1 (no label)"


def _map_class_ids(label: str, raw: dict, class_names: list[str], label_field: str,
                   sources: dict) -> tuple[dict[str, list], list[str]]:
    """``(split lists, names)`` of ClassLabel ids in ``[0, K)``, rows labelled -1 dropped (counted in
    ``Splits.dropped`` by `_finish`), other labels refused."""
    mapped: dict[str, list] = {}
    k = len(class_names)
    for key, (split, texts, labels) in raw.items():
        out = []
        for i, (text, lab) in enumerate(zip(texts, labels)):
            if isinstance(lab, bool) or not isinstance(lab, int) or not -1 <= lab < k:
                raise DataError(f"{label}: split {split!r}, record {i} has label {show(lab)} ({label_field!r}), "
                                f"expected an integer in [0, {k}) (ClassLabel {show(class_names)}) or -1 (no "
                                "label)" + label_column_fix(label_field))
            if lab >= 0:
                out.append(("" if text is None else str(text), lab))
        mapped[key] = _nonempty(label, sources, key, split, out, len(labels) - len(out))
    return mapped, list(class_names)


def _map_label_values(label: str, raw: dict, text_field: str, label_field: str,
                      sources: dict) -> tuple[dict[str, list], list]:
    """``(split lists, names)`` with rows checked like a file's records, labels mapped by `label_table`."""
    pairs = {key: _nonempty(label, sources, key, split, records_to_examples(
                 ({text_field: t, label_field: lab} for t, lab in zip(texts, labels)),
                 text_field, label_field, f"{label}: split {split!r}"))
             for key, (split, texts, labels) in raw.items()}
    spans = [(raw[key][0], len(p)) for key, p in pairs.items()]

    def origin(i: int) -> str:             # the i-th label over the splits, in order
        for split, n in spans:
            if i < n:
                return f"split {split!r} record {i}"
            i -= n
        return "?"

    table, names = label_table((lab for p in pairs.values() for _, lab in p), label, label_field, origin)
    return {key: [(t, table[lab]) for t, lab in p] for key, p in pairs.items()}, names


def _finish(label: str, raw: dict, class_names: list[str] | None, seed, text_field: str,
            label_field: str, sources: dict | None = None, columns=()) -> Splits:
    """A `Splits` from ``raw`` = ``{trainer split: (dataset split, texts, labels)}``.

    With ``class_names`` (a ClassLabel) labels must be ids in ``[0, K)`` or -1, whose rows are dropped;
    without, labels are checked like a file's records and mapped by `label_table` (colliding values
    refused). A split with no row left is a `DataError` naming it and its files (``sources``: ``{trainer
    split: text}``). A missing val or test split is carved out of train (80/10/10, ``seed``). ``columns``: those
    found in the dataset (of its training split), recorded in the result."""
    sources = sources or {}
    if class_names is not None:
        mapped, names = _map_class_ids(label, raw, class_names, label_field, sources)
    else:
        mapped, names = _map_label_values(label, raw, text_field, label_field, sources)
    unlabelled = sum(len(labels) for _, _, labels in raw.values()) - sum(len(m) for m in mapped.values())
    given = {key: f"split {raw[key][0]!r}" + (f" ({sources[key]})" if key in sources else "") for key in mapped}
    mapped, derived = complete_splits(mapped, seed, f"{label}: split {raw['train'][0]!r}")
    origins = {key: given[key] if key not in derived else
              f"drawn from split {raw['train'][0]!r} (80/10/10, data.seed={seed})" for key in SPLIT_NAMES}
    return Splits(mapped["train"], mapped["val"], mapped["test"], len(names), names, label, derived, origins,
                  tuple(columns), {DROP_UNLABELLED: unlabelled} if unlabelled else {})


def class_label_names(features, label_field: str, where: str) -> list[str] | None:
    """The ClassLabel names of column ``label_field`` in ``features``, or ``None`` when it is no ClassLabel.

    ``features`` is the JSON form of ``datasets.Features`` (``{"label": {"_type": "ClassLabel", "names":
    [...]}}``, as in ``dataset_info.json`` and the files' ``huggingface`` metadata) or the README form (a list
    of ``{"name": ..., "dtype": {"class_label": {"names": {"0": ..., "1": ...}}}}``). Names that are not
    numbered ``0 .. K-1`` are a `DataError` naming ``where``."""
    names = None
    if isinstance(features, dict):
        feat = features.get(label_field)
        if not (isinstance(feat, dict) and feat.get("_type") == "ClassLabel"):
            return None
        names = feat.get("names")
        if names is None and isinstance(feat.get("num_classes"), int) and feat["num_classes"] > 0:
            names = [str(i) for i in range(feat["num_classes"])]
    elif isinstance(features, list):
        entry = next((f for f in features if isinstance(f, dict) and f.get("name") == label_field), None)
        dtype = entry.get("dtype") if entry is not None else None
        if not (isinstance(dtype, dict) and isinstance(dtype.get("class_label"), dict)):
            return None
        names = dtype["class_label"].get("names")
        if isinstance(names, dict):
            try:
                numbered = {int(str(k)): v for k, v in names.items()}
            except ValueError:
                numbered = {}
            if sorted(numbered) != list(range(len(names))):
                raise DataError(f"{where}: the class_label names of {label_field!r} are not numbered 0 .. K-1: "
                                f"{list(names)[:10]}")
            names = [numbered[i] for i in range(len(names))]
    else:
        return None
    if not isinstance(names, list) or not names:
        raise DataError(f"{where}: the ClassLabel {label_field!r} has no names (got {show(names)})")
    return check_label_names(names, f"{where}: the ClassLabel", label_field)


# --------------------------------------------------------------------------------------------
# Local folders
# --------------------------------------------------------------------------------------------

def _load_folder(folder: pathlib.Path, config, label, seed, text_field, label_field, splits) -> Splits:
    """A dataset folder (either layout) read with pyarrow."""
    files, features = _layout(folder, config, label)
    chosen = choose_splits(label, files, splits)
    columns = [text_field, label_field]
    schemas = {}
    for split in chosen.values():
        for f in files[split]:
            schema = schemas[f] = read_schema(f)
            missing = [c for c in columns if c not in schema.names]
            if missing:
                raise DataError(f"{label}: split {split!r} ({f}) has no column(s) {missing}; columns found: "
                                f"{schema.names}" + column_fix(missing, schema.names, text_field, label_field))
    if features is None:                   # the metadata that datasets writes into every file
        features = _schema_features(schemas[files[chosen["train"]][0]], files[chosen["train"]][0])
    names = class_label_names(features, label_field, f"{label} ({folder})")
    raw, sources = {}, {}
    for key, split in chosen.items():
        texts, labels = [], []
        for f in files[split]:
            got = read_columns(f, columns)
            texts += got[text_field]
            labels += got[label_field]
        raw[key] = (split, texts, labels)
        shown = [str(f) for f in files[split][:2]] + ([f"... {len(files[split]) - 2} more"] if len(files[split]) > 2
                                                      else [])
        sources[key] = ", ".join(shown)
    return _finish(label, raw, names, seed, text_field, label_field, sources,
                   schemas[files[chosen["train"]][0]].names)


def _layout(folder: pathlib.Path, config, label, card_features=None) -> tuple[dict, object]:
    """``({dataset split: [data files]}, features or None)`` of a dataset folder (module docstring)."""
    card = _front_matter(folder / "README.md", label)
    if card.get("configs"):
        return _layout_from_card(folder, card, config, label)
    features = card_features if card_features is not None else _card_features(card, config)
    if config is not None:
        sub = folder / config
        if not (sub.is_dir() and pathlib.PurePosixPath(config).name == config and config not in (".", "..")):
            found = _config_folders(folder)
            raise DataError(f"{label}: {folder} has no config {config!r}; configs found: {found}"
                            + fix(f"data.dataset={label.rpartition(':')[0]}:{found[0]}" if found
                                  else f"data.dataset={label.rpartition(':')[0]}"))
        return _layout(sub, None, label, features)
    if (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file():
        files, saved = _layout_saved(folder, label)
        return files, saved if saved is not None else features
    return _layout_from_paths(folder, label, features)


def _layout_saved(folder: pathlib.Path, label) -> tuple[dict, object]:
    """A ``save_to_disk`` folder: its splits' ``.arrow`` files and the features of its ``dataset_info.json``."""
    if (folder / "dataset_dict.json").is_file():
        meta = _read_json(folder / "dataset_dict.json", label)
        names = meta.get("splits") if isinstance(meta, dict) else None
        if not isinstance(names, list) or not names or not all(_plain_name(n) for n in names):
            raise DataError(f"{label}: {folder / 'dataset_dict.json'} must hold {{\"splits\": [split folder names]}}, "
                            f"got {meta!r:.80}")
        dirs = {n: folder / n for n in names}
    else:
        state = _read_json(folder / "state.json", label)
        split = state.get("_split") if isinstance(state, dict) else None
        dirs = {split if isinstance(split, str) and split else "train": folder}
    files, features = {}, None
    for split, d in dirs.items():
        files[split] = _arrow_files(d, label)
        info = d / "dataset_info.json"
        if features is None and info.is_file():
            meta = _read_json(info, label)
            features = meta.get("features") if isinstance(meta, dict) else None
    return files, features


def _arrow_files(d: pathlib.Path, label) -> list[pathlib.Path]:
    """The ``.arrow`` files of one saved split, in the order of its ``state.json`` (else by name)."""
    if not d.is_dir():
        raise DataError(f"{label}: the split folder {d} is missing")
    listed = None
    if (d / "state.json").is_file():
        state = _read_json(d / "state.json", label)
        entries = state.get("_data_files") if isinstance(state, dict) else None
        if entries is not None:
            if not isinstance(entries, list) or not all(isinstance(e, dict) and _plain_name(e.get("filename"))
                                                        for e in entries):
                raise DataError(f"{label}: {d / 'state.json'}: '_data_files' must list {{\"filename\": ...}} entries")
            listed = [d / e["filename"] for e in entries]
    files = listed if listed is not None else sorted(d.glob("data-*.arrow"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DataError(f"{label}: {missing[0]} is missing ({d / 'state.json'} lists it)")
    if not files:
        raise DataError(f"{label}: {d} holds no data-*.arrow file")
    return files


def _layout_from_card(folder: pathlib.Path, card: dict, config, label) -> tuple[dict, object]:
    """A hub snapshot whose README lists ``configs``: the files of the chosen config, its features."""
    readme = folder / "README.md"
    configs = card["configs"]
    if not isinstance(configs, list) or not all(isinstance(c, dict) and isinstance(c.get("config_name"), str)
                                                for c in configs):
        raise DataError(f"{label}: {readme}: 'configs' must be a list of mappings, each with a config_name")
    names = [c["config_name"] for c in configs]
    if config is not None:
        entry = next((c for c in configs if c["config_name"] == config), None)
        if entry is None:
            raise DataError(f"{label}: no config {config!r} in {readme}; configs found: {names}"
                            + fix(f"data.dataset={label.rpartition(':')[0]}:{names[0]}" if names else "data.dataset=hf:PATH"))
    else:
        marked = [c for c in configs if c.get("default") is True] or [c for c in configs
                                                                         if c["config_name"] == "default"]
        if not marked and len(configs) > 1:
            raise DataError(f"{label}: {readme} lists configs {names} and marks none as the default; choose one: "
                            f"{label}:{names[0]}" + fix(f"data.dataset={label}:{names[0]}"))
        entry = marked[0] if marked else configs[0]
    sub = entry.get("data_dir") or ""
    if not isinstance(sub, str) or not _relative(sub):
        raise DataError(f"{label}: {readme}: data_dir of config {entry['config_name']!r} must be a relative path "
                        f"inside the folder, got {sub!r}")
    base = folder / sub
    features = _card_features(card, entry["config_name"])
    if entry.get("data_files") is None:
        files, _ = _layout_from_paths(base, label, None)
        return files, features
    files = {}
    for split, patterns in _data_file_patterns(entry["data_files"], readme, label):
        files.setdefault(split, [])
        for f in _glob(base, patterns, split, readme, label):
            if f not in files[split]:
                files[split].append(f)
    return files, features


def _data_file_patterns(data_files, readme, label) -> list[tuple[str, list[str]]]:
    """``[(split, [glob patterns])]`` of a config's ``data_files``: a pattern or a list of them (split
    ``train``), a list of ``{split, path}``, or a mapping ``{split: pattern(s)}``."""
    def patterns(p):
        if isinstance(p, str):
            return [p]
        if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            return list(p)
        raise DataError(f"{label}: {readme}: a data_files path must be a glob pattern or a list of them, got {p!r:.80}")

    if isinstance(data_files, (str, list)) and (isinstance(data_files, str)
                                                or all(isinstance(x, str) for x in data_files)):
        return [("train", patterns(data_files))]
    if isinstance(data_files, dict):
        return [(str(split), patterns(p)) for split, p in data_files.items()]
    if isinstance(data_files, list) and all(isinstance(x, dict) and "path" in x for x in data_files):
        return [(str(x.get("split", "train")), patterns(x["path"])) for x in data_files]
    raise DataError(f"{label}: {readme}: data_files must be patterns, a list of {{split, path}} or a mapping of "
                    f"split to patterns, got {data_files!r:.80}")


def _glob(base: pathlib.Path, patterns: list[str], split: str, readme, label) -> list[pathlib.Path]:
    """The data files under ``base`` that ``patterns`` (relative globs) match, sorted per pattern; only
    ``.parquet`` and ``.arrow`` files are read here."""
    out = []
    for pattern in patterns:
        if not _relative(pattern):
            raise DataError(f"{label}: {readme}: data file pattern {pattern!r} of split {split!r} must be a relative "
                            "path inside the folder")
        out += sorted(p for p in base.glob(pattern) if p.is_file())
    if not out:
        raise DataError(f"{label}: split {split!r}: no file under {base} matches {patterns} ({readme})")
    other = [p for p in out if p.suffix not in DATA_SUFFIXES]
    if other:
        readable = other[0].suffix.lower() in (".csv", ".jsonl", ".json")
        raise DataError(f"{label}: split {split!r}: {other[0]} is a {other[0].suffix or 'suffix-less'} file; only "
                        "parquet and arrow data files are read from a local folder"
                        + (fix(f"data.dataset={other[0]}", why="the file read without hf:, split 80/10/10 by "
                                                               "data.seed") if readable else ""))
    return out


def _layout_from_paths(folder: pathlib.Path, label, features) -> tuple[dict, object]:
    """Configs and splits read off the paths of the data files (module docstring)."""
    if not folder.is_dir():
        raise DataError(f"{label}: {folder} is not a folder")
    top = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)
    sub = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and _data_under(p))
    default = [(f, f.relative_to(folder)) for f in top]
    for d in sub:
        if d.name == "data":
            default += [(f, f.relative_to(d)) for f in _data_under(d)]
        elif d.name.lower() in _SPLIT_FOLDERS:
            default += [(f, f.relative_to(folder)) for f in _data_under(d)]
    configs = [d for d in sub if d.name != "data" and d.name.lower() not in _SPLIT_FOLDERS]
    if not default:
        if len(configs) == 1:
            return _layout_from_paths(configs[0], label, features)
        if configs:
            names = [d.name for d in configs]
            raise DataError(f"{label}: {folder} holds configs {names}; choose one: {label}:{names[0]}"
                            + fix(f"data.dataset={label}:{names[0]}"))
        raise DataError(f"{label}: {folder} is no Hugging Face dataset folder: no dataset_dict.json or state.json "
                        "(save_to_disk), no README.md listing configs, no .parquet or .arrow file"
                        + fix(f"data.dataset={folder}", why="a folder of train/val/test .csv, .jsonl or .json files "
                                                            "is read without hf:"))
    files: dict[str, list] = {}
    for f, rel in default:
        split = rel.parts[0] if len(rel.parts) > 1 else f.stem.split("-", 1)[0]
        files.setdefault(split, []).append(f)
    return files, features


def _data_under(d: pathlib.Path) -> list[pathlib.Path]:
    """The ``.parquet`` and ``.arrow`` files anywhere under ``d`` (hidden folders skipped), sorted."""
    return sorted(p for p in d.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(d).parts))


def _config_folders(folder: pathlib.Path) -> list[str]:
    """Names of the subfolders of ``folder`` that may be configs (not hidden), for messages."""
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _front_matter(path: pathlib.Path, label) -> dict:
    """The YAML front matter of a dataset card (``README.md``) as a dict; ``{}`` without card or front matter."""
    if not path.is_file():
        return {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{label}: {path}: cannot read ({e})") from None
    if not lines or lines[0].strip() != "---":
        return {}
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise DataError(f"{label}: {path}: the YAML front matter has no closing '---' line")
    from ..runfolder.strict_yaml import load_yaml      # the project's one strict YAML reader (repeated keys, deep nesting)

    try:
        meta = load_yaml("\n" + "\n".join(lines[1:end]))     # "\n" for the "---": line numbers as in the README
    except (yaml.YAMLError, ValueError) as e:
        raise DataError(f"{label}: {path}: the YAML front matter is not valid YAML "
                        f"({' '.join(str(e).split())[:200]})") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise DataError(f"{label}: {path}: the YAML front matter must be a mapping, got {type(meta).__name__}")
    return meta


def _card_features(card: dict, config) -> object:
    """The ``features`` of ``config`` (``None``: the only or unnamed one) in a card's ``dataset_info``."""
    info = card.get("dataset_info")
    if isinstance(info, list):
        named = [i for i in info if isinstance(i, dict)]
        info = next((i for i in named if i.get("config_name") == config), None)
        if info is None and config is None and len(named) == 1:
            info = named[0]
    if isinstance(info, dict) and (config is None or info.get("config_name") in (None, config)):
        return info.get("features")
    return None


def _schema_features(schema, path) -> object:
    """The features ``datasets`` stored in a file's schema metadata (``huggingface``), or ``None``."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        return json.loads(raw)["info"]["features"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise DataError(f"{path}: the 'huggingface' metadata is corrupt ({type(e).__name__}: {e})") from None


def _read_json(path: pathlib.Path, label):
    """A JSON file of a dataset folder; unreadable is a `DataError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise DataError(f"{label}: {path}: cannot read ({' '.join(str(e).split())[:200]})") from None


def _plain_name(name) -> bool:
    """Whether ``name`` is a plain file or folder name (no path separator, not ``.``/``..``)."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _relative(path: str) -> bool:
    """Whether ``path`` is a relative path that stays inside its folder (no ``..``)."""
    p = pathlib.PurePosixPath(path)
    return not p.is_absolute() and ".." not in p.parts and ":" not in path.split("/", 1)[0]


# --------------------------------------------------------------------------------------------
# The hub, through `datasets`
# --------------------------------------------------------------------------------------------

def _datasets_installed() -> bool:
    """Whether the ``datasets`` package can be found (without importing it)."""
    try:
        return importlib.util.find_spec("datasets") is not None
    except (ImportError, ValueError):
        return False


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(name: str, config, label, seed, text_field, label_field, splits) -> Splits:
    """``datasets.load_dataset(name, config)`` (the hub or its cache), failing fast when the hub is unreachable
    and the dataset is not cached (module docstring, step 3)."""
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("1", "true", "True") and not _hub_reachable():
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets  # optional and heavy: imported only here
        ds = datasets.load_dataset(name, config)
    except ImportError as e:
        raise DataError(f"{label}: the `datasets` package is not usable ({e})"
                        + fix("data.dataset=hf:PATH", why="the dataset's folder, read without datasets")) from None
    except Exception as e:  # noqa: BLE001 - the hub raises many types; all mean "could not load"
        raise DataError(f"{label}: could not load (hub unreachable or dataset not cached): "
                        f"{type(e).__name__}: {str(e)[:200]}"
                        + fix("data.dataset=hf:PATH", why="a copy of the dataset's folder, read offline")) from None
    chosen = choose_splits(label, list(ds), splits)
    for split in chosen.values():
        for col in (text_field, label_field):
            if col not in ds[split].column_names:
                raise DataError(f"{label}: no column {col!r} in split {split!r}; columns found: "
                                f"{ds[split].column_names}"
                                + column_fix([c for c in (text_field, label_field) if c not in ds[split].column_names],
                                             ds[split].column_names, text_field, label_field))
    feat = ds[chosen["train"]].features.get(label_field)
    names = getattr(feat, "names", None) or None
    if names is not None:
        names = check_label_names(list(names), f"{label}: the ClassLabel", label_field)
    raw = {key: (split, list(ds[split][text_field]), list(ds[split][label_field])) for key, split in chosen.items()}
    return _finish(label, raw, names, seed, text_field, label_field, None, ds[chosen["train"]].column_names)
