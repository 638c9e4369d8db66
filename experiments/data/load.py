"""`load_dataset`, the one entry point: a dataset name to the loader that reads it (registered corpora,
files and split directories, ``hf:`` datasets), and the check that the result holds two classes."""
from __future__ import annotations

import logging
import os
import pathlib

from .core import DataError, Splits, check_classes, fix, overlap_warning
from .corpora import CF_FILE, DATASETS, GENERATORS, RT_FILE
from .files import FILE_SUFFIXES, load_directory, load_file
from .hf import check_split_map, find_folder, load_hf, parse_spec
from .store import data_dir as _data_dir

#: the logger of the data loaders (a child of the ``experiments`` logger, so a run's ``train.log`` gets it)
LOGGER = "experiments.data"
#: the files of the registered corpora in the data folder
CORPUS_FILES = {"rotten_tomatoes": (RT_FILE,), "crowdflower": (CF_FILE,)}


def valid_names() -> str:
    """One line listing what ``load_dataset`` accepts."""
    return (", ".join(sorted(DATASETS)) + ", a .csv/.jsonl/.json/.parquet file, a folder of splits "
            "(train, val, test files of those kinds), or hf:NAME[:CONFIG]")


def load_dataset(name: str, seed: int = 0, data_dir=None, text_field: str = "text",
                 label_field: str = "label", splits=None, options=None) -> Splits:
    """Load a labelled text dataset as a `Splits`.

    ``name`` is a registered name (``rotten_tomatoes``, ``crowdflower``, ``listops``), a ``.csv``/
    ``.jsonl``/``.json``/``.parquet`` file (columns ``text_field`` and ``label_field``; cleaned and split 80/10/10 by
    ``seed``), a folder of splits (train, val, test files, used as-is; a missing val or test carved out of train by
    ``seed``: `load_directory`), or ``hf:NAME[:CONFIG]``
    (`experiments.data.hf`: a local Hugging Face dataset folder, ``<data_dir>/hf/NAME``, or the hub).
    ``seed`` matters for the registered names, single files and ``hf:`` datasets that lack a validation or
    test split; ``data_dir`` for the registered names and ``hf:``. ``splits`` (``hf:`` only; ``None``: the
    automatic choice) maps the trainer's ``train``/``val``/``test`` to split names of the dataset, e.g.
    ``{"val": "validation"}``. ``options`` (a generated dataset, `GENERATORS`,
    only; ``None``: its defaults) are the generator's keyword arguments, e.g. ``{"max_len": 512}`` for ``listops``
    (`config_options` reads them from a config's ``data`` section).

    Every result passes `check_classes` (three non-empty splits, label names that
    do not collide, at least two classes, in training too); the loaders refuse colliding label values and empty
    split files earlier, naming the file. Every refusal about the data ends with the config keys that fix it, as
    overrides to paste (`fix`: ``; fix: set data.label_field=topic``). Every consumer
    (trainer, ``export``, ``inspect``, TF-IDF, bundles) reads data here. Validation or test examples whose text
    is exactly that of an example of an earlier split are counted and logged as a warning (logger
    ``experiments.data``; `experiments.data.core.overlap_warning`).
    """
    out = _load(name, seed, data_dir, text_field, label_field, splits, options)
    warning = overlap_warning(out)
    if warning is not None:
        logging.getLogger(LOGGER).warning(warning)
    return out


def _load(name, seed, data_dir, text_field, label_field, splits, options) -> Splits:
    """`load_dataset` but the warning of overlapping splits: the loader ``name`` needs, its result checked
    by `check_classes`."""
    if not isinstance(name, (str, os.PathLike)):
        raise DataError(f"dataset name must be a string, got {type(name).__name__}" + fix("data.dataset=PATH"))
    name = os.fspath(name)
    splits = check_split_map(splits)
    if options is not None and (name not in GENERATORS or not isinstance(options, dict)):
        raise DataError(f"options={options!r} (a mapping) configure a generated dataset ({', '.join(GENERATORS)}); "
                        f"{name!r} is {'one' if name in GENERATORS else 'not one (leave them unset)'}")
    if name.startswith("hf:"):
        return check_classes(load_hf(name[3:], seed, text_field, label_field, data_dir=data_dir, splits=splits),
                             label_field)
    if splits is not None:
        raise DataError(f"splits={splits!r} maps the splits of an hf: dataset; {name!r} is not one (leave splits "
                        "null; a folder of splits names its files train, val, test)" + fix("data.splits=null"))
    if name in DATASETS:
        return check_classes(DATASETS[name](seed=seed, data_dir=data_dir, **(options or {})))
    if not name.strip():
        raise DataError(f"the dataset name is empty; valid names: {valid_names()}" + fix("data.dataset=PATH"))
    path = pathlib.Path(name).expanduser()
    if path.is_dir():
        return check_classes(load_directory(path, text_field, label_field, seed), label_field)
    if path.suffix.lower() in FILE_SUFFIXES:
        return check_classes(load_file(path, seed, text_field, label_field), label_field)
    raise unknown_dataset(name, path)


def unknown_dataset(name: str, path: pathlib.Path) -> DataError:
    """The refusal of a dataset name that is none of those `load_dataset` reads: a file of another kind
    (convert it), a path that does not exist (where it was looked for), or a name (the valid ones)."""
    if path.is_file():
        kind = f"a {path.suffix} file" if path.suffix else "a file without suffix"
        return DataError(f"unknown dataset {name!r}: {kind}; readable files are {', '.join(FILE_SUFFIXES)}: save it as "
                         "one of them" + fix(f"data.dataset={path.with_suffix('.csv')}",
                                             why="a CSV file with a header row"))
    if path.suffix or os.sep in name or "/" in name:
        return DataError(f"dataset {name!r}: no such file or folder (looked at {path.absolute()})"
                         + fix("data.dataset=PATH", why="an existing file or folder; a relative path is read from "
                                                        "the folder the command runs in"))
    return DataError(f"unknown dataset {name!r}; valid names: {valid_names()}" + fix("data.dataset=PATH"))


def source_paths(name: str, data_dir=None) -> list[pathlib.Path]:
    """The files or folders on this machine that the dataset ``name`` (as `load_dataset` takes it) is read
    from: the file or folder of a path, the local folder of ``hf:``, the data folder of a registered corpus
    (a generated one reads nothing); what `experiments.data.files.export` must not write onto."""
    name = os.fspath(name)
    if name.startswith("hf:"):
        try:
            folder = find_folder(parse_spec(name[3:])[0], data_dir)[0]
        except DataError:
            return []
        return [folder] if folder is not None else []
    if name in DATASETS:
        root = _data_dir(data_dir)
        return [] if name in GENERATORS else [root, *(root / f for f in CORPUS_FILES.get(name, ()))]
    return [pathlib.Path(name).expanduser()]


def config_options(dc: dict) -> dict | None:
    """The generator options of a config's ``data`` section: ``{option: value}`` of its ``data.listops_<option>``
    keys that are set, for ``data.dataset=listops``; ``None`` for any other dataset (the config validator refuses
    those keys there)."""
    if dc.get("dataset") != "listops":
        return None
    return {k[len("listops_"):]: v for k, v in dc.items() if k.startswith("listops_") and v is not None}


def load_configured(dc: dict) -> Splits:
    """The dataset a config's ``data`` section names, read as every consumer of a config reads it (trainer,
    bundles, studies): `load_dataset` with the section's seed, folder, fields, split map and generator
    options (`config_options`), so that a run's data are the same wherever they are read again."""
    return load_dataset(dc["dataset"], seed=dc["seed"], data_dir=dc["data_dir"], text_field=dc["text_field"],
                        label_field=dc["label_field"], splits=dc["splits"], options=config_options(dc))
