"""Training configuration: YAML files plus dotted ``key=value`` overrides, validated against defaults.

Every key is declared once in :data:`SCHEMA` (:class:`Key`: default, rule, types, a one-line meaning), from which
:data:`DEFAULTS`, the rules :func:`validate` enforces and the reference page ``docs/config_reference.md``
(:func:`reference`, ``python -m experiments.app.config --reference``) are derived. Every key must exist in
:data:`DEFAULTS` (an unknown key is a :class:`ConfigError` listing the valid keys at that level) and every value
must have the default's type (``None`` defaults accept the types listed in :data:`NULLABLE`).

Every YAML text the project reads goes through :func:`~experiments.runfolder.strict_yaml.load_yaml` (re-exported
here), the strict safe loader of :mod:`experiments.runfolder.strict_yaml`.
"""
from __future__ import annotations

import copy
import json
import math
import os
import pathlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional

import yaml

from energies.checks import parse_float
from energies.errors import ConfigError, UnfoldError
from unfold.documents import read_document

from ..runfolder.strict_yaml import MAX_YAML_DEPTH, StrictYAMLError, _show, load_yaml

__all__ = ["SCHEMA", "KEYS", "Key", "Choice", "Checked", "reference", "DEFAULTS", "RULES", "Range", "Text", "choices", "load_config", "apply_overrides", "validate", "dump_config",
           "ConfigError", "load_yaml", "load_config_sources", "dump_config_sources", "config_chain", "EXTENDS", "StrictYAMLError", "MAX_YAML_DEPTH"]

#: largest sizes accepted (a guard against typos that would allocate terabytes, far above any CPU/GPU run)
MAX_SIZE = 2 ** 16
MAX_COUNT = 2 ** 31 - 1


def _number(v: float, integer: bool) -> str:
    """``v`` as written in a rule: an integer's digits; a float's shortest ``g`` form when it reads back exactly,
    else its ``repr`` (so that a documented bound is the enforced one to the last bit)."""
    if integer:
        return str(int(v))
    text = f"{v:g}"
    return text if float(text) == v else repr(float(v))


@dataclass(frozen=True)
class Range:
    """A numeric range ``lo <= v <= hi`` (``<`` on an open end); ints when ``integer``; always finite."""

    lo: float
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def holds(self, v) -> bool:
        if not isinstance(v, int) and not math.isfinite(v):   # an int of any size is compared exactly
            return False
        return (v > self.lo if self.lo_open else v >= self.lo) and (v < self.hi if self.hi_open else v <= self.hi)

    def describe(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        lo = f"{'(' if self.lo_open else '['}{_number(self.lo, self.integer)}"
        hi = f"{_number(self.hi, self.integer)}{')' if self.hi_open else ']'}" if math.isfinite(self.hi) else "inf)"
        return f"{what} in {lo}, {hi}"


@dataclass(frozen=True)
class Text:
    """A non-empty string, optionally matching ``pattern`` (full match) or passing ``check`` (which raises
    an :class:`~energies.errors.UnfoldError`); ``rule`` says in words what is accepted."""

    rule: str = "a non-empty string"
    pattern: Optional[str] = None
    check: Optional[Callable[[str], Any]] = None


@dataclass(frozen=True)
class Checked:
    """A value of another kind (a mapping) accepted when ``check`` (the library's own check, raising an
    :class:`~energies.errors.UnfoldError`) passes; ``rule`` says in words what is accepted."""

    rule: str
    check: Callable[[Any], Any]


@dataclass(frozen=True)
class Choice:
    """One of a list of names: ``values`` is the tuple itself or a function returning the names a library registry
    holds (read at each check, never retyped here, so that a plug-in's registration counts); ``source`` names
    that registry."""

    values: Any
    source: str = ""

    def names(self) -> tuple:
        return tuple(self.values() if callable(self.values) else self.values)


@dataclass(frozen=True)
class Key:
    """One config key, declared once: its ``default``, the ``rule`` its values obey (:class:`Range`, :class:`Text`,
    :class:`Checked` or :class:`Choice`; ``None`` for a boolean), the ``types`` it takes where they are not just
    the default's (a ``None`` default: the types it takes besides null), and its ``meaning`` in one line.
    :data:`DEFAULTS`, :data:`RULES`, :data:`NULLABLE`, :data:`TYPES`, :data:`CHOICE_KEYS`, :func:`validate` and
    the reference page (:func:`reference`) are all read from :data:`SCHEMA`."""

    default: Any
    meaning: str
    rule: Any = None
    types: Optional[tuple] = None

    def allowed_types(self) -> tuple:
        """The Python types a non-null value may have."""
        return self.types or (type(self.default),)

    @property
    def nullable(self) -> bool:
        return self.default is None


def _check_rho(spec: str) -> None:
    from energies.rho import get_rho

    get_rho(spec)


def _is_graph_file(spec: str) -> bool:
    return spec.endswith(".npy") or os.path.sep in spec


def _check_graph(spec: str) -> None:
    """Parse a named spec and build it for a 4-token sequence (its arguments are checked; radii are clamped to
    n). An edge-list file is checked by :func:`_check_cross` against ``data.max_len``."""
    from energies.graphs import check_graph_spec

    if not _is_graph_file(spec):
        check_graph_spec(spec)


def _check_tokenizer(spec: str) -> None:
    from ..data.subword import parse_tokenizer_spec    # the data package's own rule, one definition

    parse_tokenizer_spec(spec)


def _subword_sizes() -> tuple:
    from ..data.subword import MAX_SUBWORD_VOCAB, MIN_SUBWORD_VOCAB

    return MIN_SUBWORD_VOCAB, MAX_SUBWORD_VOCAB


_SUBWORD = _subword_sizes()


def _check_splits(value) -> None:
    from ..data.hf import check_split_map    # the loader's own rule, one definition

    check_split_map(value)


def _check_positional(value) -> None:
    from unfold.classifier import positional_kind    # the embedding's own rule, one definition

    positional_kind(value, "model.positional")


def _check_device(spec: str) -> None:
    """The library's one device rule (`unfold.devices.parse_device`), its syntax only: a config written for a GPU
    is read anywhere; whether this machine has the device is checked when a run starts."""
    from unfold.devices import parse_device

    if spec != "auto":       # the GPU where torch sees one, else the CPU (unfold.devices.resolve_device)
        parse_device(spec, "config key 'train.device'", ConfigError)




def _encoders() -> tuple:
    from unfold.encoders import ENCODERS

    return tuple(ENCODERS)


def _curvatures() -> tuple:
    from unfold.encoders import CURVATURES

    return tuple(CURVATURES)


def _activations() -> tuple:
    from unfold.attention import ACTIVATIONS

    return tuple(sorted(ACTIVATIONS))


def _norms() -> tuple:
    from unfold.encoders import NORMS

    return tuple(NORMS)


def _kernels() -> tuple:
    from energies.kernels import kernel_names

    return tuple(kernel_names())


def _tasks() -> tuple:
    from .tasks import TASKS

    return tuple(TASKS)


def _listops(what: str, lra: str) -> str:
    return f"data.dataset=listops only: {what} (null: {lra}, LRA's value)"


_SIZE = Range(1, MAX_SIZE, integer=True)
_LISTOPS_COUNT = Range(1, 10 ** 7, integer=True)

#: every config key, declared once (:class:`Key`: default, rule, types, meaning), sections as nested mappings in
#: the order a saved ``config.yaml`` lists them. Everything else -- :data:`DEFAULTS`, :data:`RULES`,
#: :data:`NULLABLE`, :data:`TYPES`, :data:`CHOICE_KEYS`, :func:`choices`, :func:`validate`, the reference page
#: ``docs/config_reference.md`` (:func:`reference`) -- is derived from this table.
SCHEMA: Dict[str, Any] = {
    "name": Key("default", "the run's name: runs/NAME is its default folder (null in a file: the file's stem)",
                Text("1-128 characters of letters, digits, '.', '_', '-' (a folder name under runs/, no path)",
                     pattern=r"(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}")),
    "task": Key("classify", "what the run learns: classify (a label per text) | masked_tokens (masked-token "
                "pretraining on the training split's texts, labels ignored)",
                Choice(_tasks, "experiments.app.tasks.TASKS")),
    "data": {
        "dataset": Key("rotten_tomatoes", "the data: rotten_tomatoes | crowdflower | listops | path/to/file.csv|.jsonl"
                       " or a folder of splits | hf:NAME[:CONFIG] (a Hugging Face dataset)", Text()),
        "seed": Key(0, "seed of the train/val/test split", Range(0, 2 ** 32 - 1, integer=True)),
        "max_len": Key(64, "tokens kept per text (longer texts are cut)", _SIZE),
        "min_freq": Key(1, "vocabulary: a token is kept when it occurs at least this often in the training split",
                        Range(1, MAX_COUNT, integer=True)),
        "max_vocab": Key(None, "vocabulary: the most frequent tokens kept (null: all)",
                         Range(1, MAX_COUNT, integer=True), (int,)),
        "glove": Key("finetune", "word vectors: none (learned from scratch) | frozen | finetune (GloVe 6B 50d)",
                     Choice(("none", "frozen", "finetune"))),
        "tokenizer": Key("words", "how texts become tokens: words (the word vocabulary; GloVe applies) | bpe:N | "
                         "wordpiece:N (a subword tokenizer of N entries learnt from the training texts) | a "
                         "tokenizer.json file", Text(f"words | bpe:N | wordpiece:N (N an integer in [{_SUBWORD[0]}, "
                                                     f"{_SUBWORD[1]}]) | path/to/tokenizer.json",
                                                     check=_check_tokenizer)),
        "texts": Key(None, "unlabelled text: a text file or a folder of *.txt files, one text a line, read as a "
                     "stream; the vocabulary or tokenizer is learnt from it (null: from the training split), and "
                     "task=masked_tokens pretrains on it",
                     Text(), (str,)),
        "data_dir": Key(None, "where data files are found and fetched to (null: $UNFOLD_DATA or "
                        "~/.cache/unfolded-transformers)", Text(), (str,)),
        "text_field": Key("text", "the column holding the text (CSV, JSONL, Hugging Face datasets)", Text()),
        "label_field": Key("label", "the column holding the label", Text()),
        "splits": Key(None, "hf: datasets: which split is train, val, test (null: train; validation | val | dev; "
                      "test, a missing val/test carved from train 80/10/10)",
                      Checked("a mapping of train/val/test to split names of the dataset, e.g. {val: validation}",
                              check=_check_splits), (dict,)),
        # data.dataset=listops only (experiments/data/listops.py; null: the LRA value shown): lengths in tokens
        "listops_min_len": Key(None, _listops("shortest example, in tokens", "501"), _SIZE, (int,)),
        "listops_max_len": Key(None, _listops("longest example, in tokens (at most data.max_len)", "1999"), _SIZE,
                               (int,)),
        "listops_max_depth": Key(None, _listops("deepest nesting of operators", "10"), Range(2, 64, integer=True),
                                 (int,)),
        "listops_max_args": Key(None, _listops("most arguments of one operator", "10"),
                                Range(2, 1024, integer=True), (int,)),
        "listops_train": Key(None, _listops("training examples generated", "96000"), _LISTOPS_COUNT, (int,)),
        "listops_val": Key(None, _listops("validation examples generated", "2000"), _LISTOPS_COUNT, (int,)),
        "listops_test": Key(None, _listops("test examples generated", "2000"), _LISTOPS_COUNT, (int,)),
    },
    "model": {
        "mode": Key("guaranteed", "the encoder: guaranteed (every layer an MM step of one energy, descent proved) | "
                    "free (untied post-LN transformer layers) | baseline (torch.nn.TransformerEncoder)",
                    Choice(_encoders, "unfold.encoders.ENCODERS")),
        "d": Key(64, "token width", _SIZE),
        "heads": Key(2, "attention heads", Range(1, 1024, integer=True)),
        "d_head": Key(None, "width of each head's projection (null: d / heads, at least 1)", _SIZE, (int,)),
        "layers": Key(4, "layers (unfolded steps)", Range(1, 1024, integer=True)),
        "rho": Key("exp", "the attention penalty rho of the energy (exp, alias softmax: softmax attention)",
                   Text("a rho spec: exp | relu:C | softplus:C:T | cauchy | lp:P or a registered name",
                        check=_check_rho)),
        "tau": Key(None, "guaranteed: the attention energy's temperature tau (null: sqrt(d_head))",
                   Range(0, 1e12, lo_open=True), (float, int)),
        "graph": Key("complete", "the token graph: which pairs of tokens attend to each other",
                     Text("a graph spec: complete | window:K | strided:K | dilated:K[:R] | star | random:P "
                          "or a .npy edge list", check=_check_graph)),
        "alpha": Key(1.0, "guaranteed: the step size alpha of each MM step (1: the full step)",
                     Range(0, 1, lo_open=True)),
        "ffn": Key(True, "guaranteed: the symmetric feed-forward term joins the energy"),
        "relu": Key(True, "guaranteed: the ReLU term (tokens kept non-negative) joins the energy"),
        "layernorm": Key(False, "guaranteed: the two LayerNorm terms (supplement F.3) join the energy"),
        "positional": Key(True, "position embedding: learned (true) | sinusoidal | none (false)",
                          Checked("learned | sinusoidal | none, or true (learned) | false (none)",
                                  check=_check_positional), (bool, str)),
        "ffn_mult": Key(2, "free/baseline: the feed-forward hidden width is ffn_mult x d",
                        Range(1, 64, integer=True)),
        "dropout": Key(0.1, "dropout probability", Range(0, 1, hi_open=True)),
        "curvature": Key("adaptive", "guaranteed: adaptive (weighted degree) | constant (rho'(0) x degree)",
                         Choice(_curvatures, "unfold.encoders.CURVATURES")),
        "attention": Key(None, "free/baseline: the attention activation (null: softmax)",
                         Choice(_activations, "unfold.attention.ACTIVATIONS"), (str,)),
        "attention_temperature": Key(1.0, "softplus attention: t softplus(s / t)", Range(0, 1e6, lo_open=True)),
        "norm": Key(None, "free: post (LayerNorm after each block) | none (add-only blocks) (null: post)",
                    Choice(_norms, "unfold.encoders.NORMS"), (str,)),
        "kernel": Key("auto", "guaranteed: the pairwise kernel computing attention (auto: chosen per graph and "
                      "device)", Choice(_kernels, "energies.kernels.kernel_names()")),
        # null or 0: off (every example runs model.layers layers); else EPS in (0, 1) (unfold.inputs.check_stop_rel)
        "stop_rel": Key(None, "guaranteed: depth chosen by the energy: an example stops when its relative energy "
                        "decrease at a layer is below this (null or 0: off)", Range(0, 1, hi_open=True),
                        (float, int)),
        "init_from": Key(None, "fine-tune: start the embedding and encoder from this pretrained run (a run folder, "
                         "a bundle or a Hub id), with its tokenizer and a new head (null: from scratch)",
                         Text("a run folder, a bundle folder or a Hub id"), (str,)),
    },
    "train": {
        "epochs": Key(6, "passes over the training split", Range(1, 10 ** 6, integer=True)),
        "batch_size": Key(32, "examples per optimiser step", Range(1, 2 ** 20, integer=True)),
        "lr": Key(0.002, "AdamW learning rate", Range(0, math.inf, lo_open=True, hi_open=True)),
        "weight_decay": Key(0.01, "AdamW weight decay", Range(0, math.inf, hi_open=True)),
        "grad_clip": Key(1.0, "largest gradient norm (0: no clipping)", Range(0, math.inf, hi_open=True)),
        "seed": Key(0, "seed of the weights, dropout and batch order", Range(0, 2 ** 63 - 1, integer=True)),
        "device": Key("cpu", "where training runs: cpu | cuda | cuda:K | auto (the GPU where torch sees one, else "
                      "the CPU)", Text("auto | cpu | cuda | cuda:K", check=_check_device)),
        "threads": Key(None, "CPU threads torch uses (null: torch's default)", Range(1, 4096, integer=True), (int,)),
        "trace": Key(True, "record the energy of every layer during training (model dtype)"),
        "monitor": Key(None, "descent monitor on the training trace: off | warn | strict (null: warn with the trace "
                       "on, off without it)", Choice(("off", "warn", "strict")), (str,)),
        "check_dtype": Key("float64", "dtype of the descent check on the test set",
                           Choice(("float32", "float64"))),
        "precision": Key("float32", "training passes: float32 | bfloat16 (torch.autocast; the trace's energies stay "
                         "float32, the test-set check train.check_dtype)", Choice(("float32", "bfloat16"))),
        "max_train_examples": Key(None, "use only the first N training examples (smoke runs; null: all)",
                                  Range(1, MAX_COUNT, integer=True), (int,)),
        "progress": Key(True, "a progress bar per epoch"),
        "compile": Key(False, "torch.compile the training forward (python -m experiments.studies.bench compile)"),
        "tensorboard": Key(True, "scalars to RUN_DIR/tensorboard/ when the tensorboard package is installed"),
        "freeze_encoder_epochs": Key(0, "fine-tune: train only the head for the first N epochs (the embedding and "
                                     "encoder from model.init_from kept fixed)", Range(0, 10 ** 6, integer=True)),
    },
    "pretrain": {       # task=masked_tokens (experiments/app/tasks/masked_tokens.py)
        "mask_rate": Key(0.15, "masked_tokens: the share of each text's real, non-special tokens chosen (of those "
                         "80 % become the mask token, 10 % a random token, 10 % stay)", Range(0, 1, lo_open=True)),
        "span_mean": Key(None, "masked_tokens: choose spans of geometric length with this mean (at most 10 "
                         "tokens; SpanBERT) instead of single tokens (null: single tokens)", Range(1, 10),
                         (float, int)),
        "heldout": Key(0.05, "masked_tokens: the share of the training texts held out (validation, test metrics "
                       "and the descent check; at least one text)", Range(0, 1, lo_open=True, hi_open=True)),
        "heldout_max": Key(2000, "masked_tokens on data.texts: the most held-out texts kept (the first this many "
                           "the held-out rule picks; later picks are trained on)", Range(1, 10 ** 6, integer=True)),
        "shuffle_buffer": Key(10000, "masked_tokens on data.texts: texts held at once to shuffle the stream (a "
                              "shuffle buffer: memory stays bounded whatever the file's size)",
                              Range(1, 10 ** 7, integer=True)),
    },
}


def _leaves(schema: Dict[str, Any], path: tuple = ()):
    for key, node in schema.items():
        if isinstance(node, dict):
            yield from _leaves(node, path + (key,))
        else:
            yield path + (key,), node


#: ``{("section", "key"): Key}`` for every leaf of :data:`SCHEMA`, in its order
KEYS: Dict[tuple, Key] = dict(_leaves(SCHEMA))


def _defaults(schema: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default) for k, v in schema.items()}


#: every key's default, sections as mappings (from :data:`SCHEMA`)
DEFAULTS: Dict[str, Any] = _defaults(SCHEMA)

#: keys whose default is null and the types they take otherwise
NULLABLE = {where: key.allowed_types() for where, key in KEYS.items() if key.nullable}

#: keys that take more than their default's type (and no null): old configs hold booleans for model.positional
TYPES = {where: key.types for where, key in KEYS.items() if not key.nullable and key.types}

#: the keys whose values are names from a list (:func:`choices`)
CHOICE_KEYS = tuple(where for where, key in KEYS.items() if isinstance(key.rule, Choice))

#: the declared range of every numeric key and the rule of every free-text key (choice keys: :func:`choices`;
#: booleans: true | false). ``validate`` checks each value against its rule, then the cross-key rules.
RULES: Dict[tuple, Any] = {where: key.rule for where, key in KEYS.items() if isinstance(key.rule, (Range, Text, Checked))}


def _choices(where: tuple) -> tuple:
    """Valid values of a choice key, read from the library's registries (never retyped here)."""
    return KEYS[where].rule.names()


def with_defaults(cfg: Dict[str, Any], defaults: Dict[str, Any] = None) -> Dict[str, Any]:
    """A copy of ``cfg`` with every key it lacks taken from ``defaults`` (:data:`DEFAULTS`), section by section: a
    config written before a key existed reads as it ran."""
    defaults = DEFAULTS if defaults is None else defaults
    out = copy.deepcopy(defaults)
    for key, value in cfg.items():
        both = isinstance(defaults.get(key), dict) and isinstance(value, dict)
        out[key] = with_defaults(value, defaults[key]) if both else copy.deepcopy(value)
    return out


def monitor_mode(cfg: Dict[str, Any]) -> str:
    """``train.monitor`` with its default resolved: warn when the training trace is on, off otherwise."""
    tc = cfg["train"]
    return tc["monitor"] or ("warn" if tc["trace"] else "off")


def choices(where: tuple) -> tuple:
    """The valid values of choice key ``where`` (a tuple such as ``("model", "mode")``)."""
    return _choices(where)


def _valid_keys(defaults: Dict[str, Any]) -> str:
    return ", ".join(sorted(defaults))


def merge_config(base: Dict[str, Any], new: Dict[str, Any], defaults: Dict[str, Any], path: str,
                 sources: Optional[Dict[str, str]] = None, origin: str = "") -> None:
    """Merge the config document ``new`` into ``base`` section by section (a leaf replaces, a section merges),
    refusing a key that ``defaults`` does not hold or a section that is not a mapping (`ConfigError` naming it;
    ``path``: the dotted section ``new`` is, "" for a whole config); where ``sources`` is given, each leaf written
    records ``origin`` under its dotted key. A config file, an override and a bundle's ``config.json`` are read
    through it, over a copy of `DEFAULTS`, then `validate`d."""
    if not isinstance(new, dict):
        raise ConfigError(f"config section {path or '<root>'} must be a mapping, got {type(new).__name__}")
    for key, value in new.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in defaults:
            raise ConfigError(f"unknown config key {_show(where)}; valid keys{' in ' + path if path else ''}: "
                              f"{_valid_keys(defaults)}")
        if isinstance(defaults[key], dict):
            merge_config(base[key], value, defaults[key], where, sources, origin)
        else:
            base[key] = value
            if sources is not None:
                sources[where] = origin


def _check_rule(where: tuple, value) -> None:
    name = ".".join(where)
    if where in CHOICE_KEYS and value not in choices(where):
        raise ConfigError(f"config key {name!r} must be one of {list(choices(where))}, got {_show(value)}")
    rule = RULES.get(where)
    if isinstance(rule, Range):
        if rule.integer and isinstance(value, float):
            raise ConfigError(f"config key {name!r} must be {rule.describe()}, got {_show(value)}")
        if not rule.holds(value):
            raise ConfigError(f"config key {name!r} must be {rule.describe()}, got {_show(value)}")
    elif isinstance(rule, Text) and (not value.strip() or (rule.pattern and not re.fullmatch(rule.pattern, value))):
        raise ConfigError(f"config key {name!r} must be {rule.rule}, got {_show(value)}")
    if isinstance(rule, (Text, Checked)) and rule.check is not None:
        try:
            rule.check(value)
        except ConfigError:
            raise
        except UnfoldError as exc:
            raise ConfigError(f"config key {name!r}={_show(value)}: {exc}") from None


def _takes(mode: str, param: str) -> bool:
    """Whether the encoder registered as ``mode`` takes the constructor argument ``param`` (plug-ins included)."""
    import inspect

    from unfold.encoders import ENCODERS

    return mode in ENCODERS and param in inspect.signature(ENCODERS[mode]).parameters


def _check_cross(cfg: Dict[str, Any]) -> None:
    """Rules between keys: each names both keys and their values."""
    tc = cfg["train"]
    spec = cfg["model"]["graph"]
    if _is_graph_file(spec):       # its node ids must fit the longest sequence
        from energies.graphs import graph_from_spec

        try:
            graph_from_spec(spec, cfg["data"]["max_len"])
        except UnfoldError as exc:
            raise ConfigError(f"config key 'model.graph'={spec!r} with data.max_len={cfg['data']['max_len']}: "
                              f"{exc}") from None
    stop_rel, mode = cfg["model"]["stop_rel"], cfg["model"]["mode"]
    if stop_rel not in (None, 0) and not _takes(mode, "stop_rel"):
        raise ConfigError(f"config key 'model.stop_rel'={_show(stop_rel)} (the depth chosen by the energy) applies to "
                          f"weight-shared encoders that take it (guaranteed), not to model.mode={mode!r}: set "
                          "model.stop_rel=null")
    _check_listops(cfg["data"])
    _check_subword(cfg["data"])
    if tc["monitor"] not in (None, "off") and not tc["trace"]:
        raise ConfigError(f"config key 'train.monitor'={tc['monitor']!r} watches the training energy trace, which "
                          "train.trace=false turns off: set train.trace=true or train.monitor=off")


def _check_subword(dc: Dict[str, Any]) -> None:
    """A subword tokenizer (``data.tokenizer`` other than words) takes no GloVe word vectors and no
    ``data.max_vocab`` (its size is its own N): both refused naming the two keys, never silently ignored."""
    spec = dc["tokenizer"]
    if spec == "words":
        return
    if dc["glove"] != "none":
        raise ConfigError(f"config key 'data.glove'={_show(dc['glove'])} gives GloVe vectors to words, and "
                          f"data.tokenizer={_show(spec)} makes subword tokens: set data.glove=none (or "
                          "data.tokenizer=words)")
    if dc["max_vocab"] is not None:
        raise ConfigError(f"config key 'data.max_vocab'={dc['max_vocab']} caps the word vocabulary; "
                          f"data.tokenizer={_show(spec)} has its own size: set data.max_vocab=null")


def check_config_files(cfg: Dict[str, Any]) -> None:
    """The files a config names for its data, checked when the config is loaded (`load_config_sources`),
    not when a bundle's config is read (a bundle holds its own tokenizer and needs none of them):
    ``data.texts`` must be a readable text file or folder of ``*.txt`` files, and ``data.tokenizer``, where it
    is a path, a readable ``tokenizer.json`` (a `DataError` naming the file, read as the trainer reads it)."""
    from ..data.core import DataError
    from ..data.stream import check_text_source
    from ..data.subword import SubwordTokenizer, parse_tokenizer_spec

    dc = cfg["data"]
    if dc["texts"] is not None:
        try:
            check_text_source(dc["texts"])
        except UnfoldError as exc:
            raise ConfigError(f"config key 'data.texts'={_show(dc['texts'])}: {exc}") from None
    spec = parse_tokenizer_spec(dc["tokenizer"])
    if spec.kind == "file":
        try:
            SubwordTokenizer.load(spec.path)
        except DataError as exc:
            raise DataError(f"config key 'data.tokenizer'={_show(spec.path)}: {exc}") from None


def _check_listops(dc: Dict[str, Any]) -> None:
    """``data.listops_*`` apply to ``data.dataset=listops`` only (elsewhere refused, never silently ignored);
    there, ``min_len <= max_len <= data.max_len`` (a longer example would be truncated), null being the
    generator's default (:data:`experiments.data.listops.DEFAULTS`)."""
    from ..data.listops import CONFIG_KEYS, DEFAULTS as LISTOPS

    if dc["dataset"] != "listops":
        for k, key in CONFIG_KEYS.items():
            if dc.get(f"listops_{k}") is not None:
                raise ConfigError(f"config key {key!r}={_show(dc[f'listops_{k}'])} applies to data.dataset=listops "
                                  f"only, not to data.dataset={_show(dc['dataset'])}; leave it null")
        return
    lo = dc["listops_min_len"] if dc["listops_min_len"] is not None else LISTOPS["min_len"]
    hi = dc["listops_max_len"] if dc["listops_max_len"] is not None else LISTOPS["max_len"]
    if lo > hi:
        raise ConfigError(f"config key 'data.listops_min_len'={lo} exceeds data.listops_max_len={hi}")
    if hi > dc["max_len"]:
        default = " (the default)" if dc["listops_max_len"] is None else ""
        raise ConfigError(f"config key 'data.listops_max_len'={hi}{default} exceeds data.max_len={dc['max_len']}: "
                          "longer examples would be truncated; raise data.max_len or lower data.listops_max_len")


def validate(cfg: Dict[str, Any], defaults: Dict[str, Any] = DEFAULTS, path: tuple = ()) -> Dict[str, Any]:
    """Check every value's type against the defaults and its declared rule (:data:`RULES`, :func:`choices`),
    then (at the top level) the rules between keys; returns ``cfg``, numbers normalised (int -> float keys)."""
    for key, default in defaults.items():
        where = path + (key,)
        value = cfg.get(key, default)
        name = ".".join(where)
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config section {name!r} must be a mapping, got {type(value).__name__}")
            validate(value, default, where)
            continue
        if value is None:
            if default is not None and where not in NULLABLE:
                raise ConfigError(f"config key {name!r} must not be null")
            continue
        allowed = NULLABLE.get(where) or TYPES.get(where) or (type(default),)
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = cfg[key] = float(value)
        if float in allowed and isinstance(value, str):      # YAML 1.1 reads 1e-3 (no dot) as a string
            try:                                             # (ASCII digits only: energies.checks.parse_float)
                value = cfg[key] = parse_float(value)
            except ValueError:
                pass
        if isinstance(value, bool) and bool not in allowed:
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, got bool {value!r}")
        if not isinstance(value, allowed):
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, "
                              f"got {type(value).__name__} {_show(value)}")
        _check_rule(where, value)
    if not path:
        _check_cross(cfg)
    return cfg


def _is_text_key(where: tuple) -> bool:
    node: Any = DEFAULTS
    for k in where:
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return isinstance(node, str) or str in NULLABLE.get(where, ())


def _too_deep(value, limit: int = MAX_YAML_DEPTH) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels deep (iterative; shared parts once)."""
    stack, seen = [(value, 1)], set()
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, (dict, list)) or id(v) in seen:
            continue
        if depth > limit:
            return True
        seen.add(id(v))
        stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[str],
                    sources: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML by :func:`load_yaml`: 3, 0.5, true, null, text;
    a value that is not YAML is taken as text). A value with a repeated key or nested deeper than
    :data:`MAX_YAML_DEPTH` levels (key path included) is a :class:`ConfigError` naming the override."""
    for item in overrides:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"override {_show(item)} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        keys = dotted.strip().split(".")
        try:
            value = load_yaml(raw)
        except StrictYAMLError as exc:
            if not _is_text_key(tuple(keys)):
                raise ConfigError(f"override {_show(item)}: {exc}") from None
            value = raw        # a text key takes the text as typed (below), whatever YAML makes of it
        except (yaml.YAMLError, ValueError):   # ValueError: an integer beyond Python's digit limit
            value = raw
        if _is_text_key(tuple(keys)) and value is not None:
            value = raw        # a text key takes the text as typed (YAML would read "hf:x" as a mapping, "007" as 7)
        nested: Dict[str, Any] = value
        for k in reversed(keys):
            nested = {k: nested}
        if len(keys) > MAX_YAML_DEPTH or _too_deep(nested):
            raise ConfigError(f"override {_show(item)}: nested deeper than {MAX_YAML_DEPTH} levels (a config is "
                              "3 levels deep)")
        merge_config(cfg, nested, DEFAULTS, "", sources, "override")
    return cfg


#: the configs shipped with the package (package data), found by name: ``--config default``
CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"


def config_names() -> list:
    """Names of the shipped configs (``experiments/configs/NAME.yaml``), sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


#: the extensions of a config file: a bare name with one of them may name a user's file, one without never does
CONFIG_EXTENSIONS = (".yaml", ".yml")


def _is_path(spec: str) -> bool:
    """Whether a config spec is an explicit path (it holds a path separator: ``./tiny``, ``sub/a.yaml``)."""
    return os.sep in spec or "/" in spec or bool(os.altsep and os.altsep in spec)


def _shipped(spec: str) -> Optional[str]:
    """The shipped config a bare name names (``tiny`` or ``tiny.yaml``), or None. A path never names one."""
    if _is_path(spec):
        return None
    stem = spec[:-len(".yaml")] if spec.endswith(".yaml") else spec
    return str(CONFIG_DIR / f"{stem}.yaml") if stem in config_names() else None


def resolve_config(spec: str) -> str:
    """The file a ``--config`` value names. A shipped config's name without extension (``default``, from
    `CONFIG_DIR`, so that it works outside the repository) is always the shipped config, whatever file of that
    name the current folder holds (write ``./default`` for that file); a path (it holds a separator) or an existing
    file is read as given; else a shipped config's file name (``default.yaml``). A value that is none of these is
    refused listing the shipped names."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"--config must name a config file or a shipped config, got {spec!r}; shipped: "
                          f"{', '.join(config_names())}")
    shipped = _shipped(spec)
    if shipped is not None and not spec.endswith(CONFIG_EXTENSIONS):
        return shipped                  # a built-in name: the built-in config, never a stray file
    if os.path.isfile(spec) or _is_path(spec):
        return spec                     # a file, or a path: read (and its problems reported) as a path
    if shipped is not None:
        return shipped
    raise ConfigError(f"config {spec!r} is neither a file nor a shipped config; shipped: {', '.join(config_names())}")


#: the key of a config file that names the config it builds on (a shipped name or a path relative to the file)
EXTENDS = "extends"

#: longest chain of ``extends`` followed (far beyond any real use; a guard, the circle check comes first)
MAX_EXTENDS = 32


def _parent_file(spec, child: str) -> str:
    """The file ``extends: SPEC`` of ``child`` names, by three rules: a path (``./tiny``, ``sub/base.yaml``, one
    holding a separator) is that file, relative to ``child``'s folder; a bare name with a config extension
    (``base.yaml``, ``base.yml``) is the file of that name beside ``child`` where it exists, else the shipped config
    of that file name; a bare name without one (``tiny``) is a shipped config only (`CONFIG_DIR`), never a file --
    an extension-less file beside ``child`` is named ``./tiny``. Returns the file's path (a user's file as an
    absolute path, so that ``--print-config`` names the file read)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"config file {child!r}: '{EXTENDS}' must name a shipped config ({', '.join(config_names())}) "
                          f"or a file relative to it, got {_show(spec)}")
    relative = os.path.abspath(os.path.join(os.path.dirname(child), spec))
    if _is_path(spec):
        if os.path.isfile(relative):
            return relative
        raise ConfigError(f"config file {child!r}: '{EXTENDS}: {spec}' names no file ({relative!r} does not exist)")
    if spec.endswith(CONFIG_EXTENSIONS) and os.path.isfile(relative):
        return relative
    shipped = _shipped(spec)
    if shipped is not None:
        return shipped
    beside = (f" (a file {relative!r} exists, but a name without .yaml/.yml names a shipped config only: write "
              f"'{EXTENDS}: ./{spec}' to build on that file)" if os.path.isfile(relative) else "")
    raise ConfigError(f"config file {child!r}: '{EXTENDS}: {spec}' is neither a file beside it nor a shipped "
                      f"config{beside}; shipped: {', '.join(config_names())}")


def _read_file(path: str) -> Dict[str, Any]:
    loaded = read_document(path, load_yaml, ConfigError, f"config file {path!r}", "YAML",
                           (yaml.YAMLError, ValueError))
    loaded = {} if loaded is None else loaded
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections (data, model, train), "
                          f"got a YAML {type(loaded).__name__}")
    return loaded


def config_chain(path: str) -> list:
    """``[(file, mapping), ...]`` from the first ancestor to ``path`` itself, following ``extends`` (removed
    from each mapping). A circular chain is a :class:`ConfigError` naming the files in order."""
    chain: list = []
    seen: list = []
    current = path
    while True:
        real = os.path.realpath(current)
        if real in seen:
            loop = [f for f, _ in chain[seen.index(real):]] + [current]
            raise ConfigError(f"circular '{EXTENDS}' chain: {' -> '.join(loop)}")
        if len(seen) >= MAX_EXTENDS:
            raise ConfigError(f"config file {path!r}: '{EXTENDS}' chain longer than {MAX_EXTENDS} files")
        seen.append(real)
        loaded = _read_file(current)
        has_parent = EXTENDS in loaded
        parent = loaded.pop(EXTENDS, None)
        chain.append((current, loaded))
        if not has_parent:
            return chain[::-1]
        current = _parent_file(parent, current)


def _is_section(dotted: str) -> bool:
    node: Any = DEFAULTS
    for k in dotted.split("."):
        node = node[k]
    return isinstance(node, dict)


def load_config_sources(path: Optional[str] = None, overrides: Iterable[str] = ()) -> tuple:
    """``(cfg, sources)``: the config :func:`load_config` returns and, for every leaf key (dotted), where its
    value came from: ``default``, ``config FILE`` (the file of the chain that set it last) or ``override``.
    ``path`` is a file or a shipped config's name (:func:`resolve_config`); each file may build on another with
    ``extends: NAME|PATH`` (:func:`config_chain`; its keys override the parent's, section by section);
    ``name`` is the file's own (a parent's is not inherited), else the file's stem."""
    cfg = copy.deepcopy(DEFAULTS)
    sources: Dict[str, str] = {}
    if path is not None:
        path = resolve_config(path)
        chain = config_chain(path)
        for i, (file, loaded) in enumerate(chain):
            if i < len(chain) - 1:
                loaded.pop("name", None)
            merge_config(cfg, loaded, DEFAULTS, "", sources, f"config {file}")
        if "name" not in chain[-1][1]:
            stem = os.path.splitext(os.path.basename(path))[0]
            cfg["name"] = re.sub(r"[^A-Za-z0-9._-]", "_", stem).strip(".") or "config"
            sources["name"] = f"config {path}"
    apply_overrides(cfg, overrides, sources)
    validate(cfg)
    check_config_files(cfg)
    leaves: Dict[str, str] = {}

    def walk(node, prefix):
        for k, v in node.items():
            where = f"{prefix}.{k}" if prefix else k
            if _is_section(where):
                walk(v, where)
            else:
                leaves[where] = sources.get(where, "default")
    walk(cfg, "")
    return cfg, leaves


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Dict[str, Any]:
    """Defaults <- YAML file (after its ``extends`` chain) <- overrides, validated. ``path`` is a file or a
    shipped config's name (:func:`resolve_config`); ``name`` defaults to the file's stem
    (:func:`load_config_sources`)."""
    return load_config_sources(path, overrides)[0]


def dump_config(cfg: Dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)


def _flow(value) -> str:
    """One value as one line of YAML (flow style); a text YAML would fold over lines is written as JSON."""
    text = yaml.safe_dump(value, default_flow_style=True, width=2 ** 31, allow_unicode=True)
    text = text[:-len("...\n")] if text.endswith("\n...\n") else text
    text = text.strip()
    if "\n" in text:
        text = json.dumps(value)
    return text


def dump_config_sources(cfg: Dict[str, Any], sources: Dict[str, str]) -> str:
    """``cfg`` as YAML, each key with a trailing comment saying where its value came from (``sources``, from
    :func:`load_config_sources`); it reads back (:func:`load_yaml`) as ``cfg``."""
    lines = []

    def note(where):
        return sources.get(where, "default").replace("\n", " ").replace("\r", " ")

    for key, value in cfg.items():
        if isinstance(DEFAULTS.get(key), dict):
            lines.append(f"{_flow(key)}:")
            for k, v in value.items():
                lines.append(f"  {_flow(k)}: {_flow(v)}  # {note(key + '.' + k)}")
        else:
            lines.append(f"{_flow(key)}: {_flow(value)}  # {note(key)}")
    return "\n".join(lines) + "\n"


#: the rules between keys that :func:`_check_cross` enforces, in words (for the reference page)
CROSS_RULES = (
    "`model.graph` as a `.npy` edge list: its node ids must be below `data.max_len`.",
    "`model.stop_rel` (not null or 0) applies to encoders that take it (`model.mode=guaranteed`).",
    "`data.listops_*` apply to `data.dataset=listops` only (elsewhere leave them null); there "
    "`listops_min_len <= listops_max_len <= data.max_len` (null: the LRA value).",
    "`train.monitor` warn or strict needs `train.trace=true`.",
    "`data.tokenizer` other than `words` (a subword tokenizer) needs `data.glove=none` and `data.max_vocab=null`.",
    "`data.texts` (checked when a config is loaded, not in a bundle): a readable text file or a folder of `*.txt` "
    "files; `data.tokenizer` as a path: a readable `tokenizer.json`.",
)


def _cell(text: str) -> str:
    """``text`` made safe for one cell of a Markdown table."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _allowed(key: Key) -> str:
    """What values ``key`` accepts, in words, read from its rule (so the page says what is enforced)."""
    rule = key.rule
    if isinstance(rule, Range):
        text = rule.describe()
    elif isinstance(rule, (Text, Checked)):
        text = rule.rule
    elif isinstance(rule, Choice):
        text = "one of " + ", ".join(f"`{name}`" for name in rule.names())
        if rule.source:
            text += f" (registered in `{rule.source}`; a plug-in adds its own)"
    else:
        text = "`true` or `false`"
    return text + (", or `null`" if key.nullable else "")


def _type_name(key: Key) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "str", dict: "mapping"}
    types = key.allowed_types()
    if float in types:                       # an int is read as a float
        types = tuple(t for t in types if t is not int)
    return " or ".join(names.get(t, t.__name__) for t in types) + (" or null" if key.nullable else "")


def reference() -> str:
    """The config reference page (``docs/config_reference.md``): every key of :data:`SCHEMA` with its default,
    type, the values it accepts (its rule's own words and numbers, as :func:`validate` enforces them) and its
    meaning, then the rules between keys. Choice keys list the names registered when it runs."""
    out = ["# Config reference", "",
           "<!-- Generated from the schema (experiments/app/config.py, SCHEMA) by",
           "     python -m experiments.app.config --reference > docs/config_reference.md",
           "     Do not edit by hand: tests/test_config_reference.py fails when this page and the schema differ. -->",
           "",
           "Every key a training config takes. Set a key in a YAML file (`section:` then `key: value`), or on the "
           "command line as `section.key=value` (`--print-config` shows the resolved config and where each value "
           "came from). An unknown key, a value of another type, or a value outside the range below is refused "
           "with a `ConfigError` naming the key. A number key given an integer where it takes a float reads it as "
           "a float.", ""]
    sections = [("Top level", "", {k: v for k, v in SCHEMA.items() if not isinstance(v, dict)})]
    sections += [(f"`{name}`", f"{name}.", node) for name, node in SCHEMA.items() if isinstance(node, dict)]
    for title, prefix, keys in sections:
        out += [f"## {title}", "", "| key | default | type | allowed | meaning |", "|---|---|---|---|---|"]
        for name, key in keys.items():
            out.append(f"| `{prefix}{name}` | `{_cell(_flow(key.default))}` | {_cell(_type_name(key))} | "
                       f"{_cell(_allowed(key))} | {_cell(key.meaning)} |")
        out.append("")
    out += ["## Rules between keys", ""] + [f"- {rule}" for rule in CROSS_RULES] + [""]
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m experiments.app.config --reference``: print the config reference page."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m experiments.app.config",
                                     description="The training config's schema.")
    parser.add_argument("--reference", action="store_true", required=True,
                        help="print the config reference page (Markdown; docs/config_reference.md)")
    parser.parse_args(argv)
    import sys

    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
