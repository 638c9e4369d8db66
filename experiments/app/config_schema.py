"""The training config's schema: every key declared once, with its default, its rule and its meaning.

`SCHEMA` holds one `Key` per config key (sections as nested mappings, in the order a saved ``config.yaml`` lists
them); a key's rule is a `Range` (numbers), a `Text` (strings, with a pattern or the library's own check), a
`Checked` (a mapping the library checks) or a `Choice` (names, read from a library registry at each check), ``None``
for a boolean. Everything the loader needs is derived from it here: `KEYS` (the leaves), `DEFAULTS`, `NULLABLE`,
`TYPES`, `CHOICE_KEYS`, `RULES` and `choices`. Loading (files, ``extends``, overrides), validation against these
rules, the rules between keys and the reference page ``docs/config_reference.md`` are `experiments.app.config`'s.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from energies.errors import ConfigError

__all__ = ["SCHEMA", "KEYS", "Key", "Range", "Text", "Checked", "Choice", "DEFAULTS", "NULLABLE", "TYPES",
           "CHOICE_KEYS", "RULES", "choices", "is_graph_file", "MAX_SIZE", "MAX_COUNT"]

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
    an `UnfoldError`); ``rule`` says in words what is accepted."""

    rule: str = "a non-empty string"
    pattern: Optional[str] = None
    check: Optional[Callable[[str], Any]] = None


@dataclass(frozen=True)
class Checked:
    """A value of another kind (a mapping) accepted when ``check`` (the library's own check, raising an
    `UnfoldError`) passes; ``rule`` says in words what is accepted."""

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
    """One config key, declared once: its ``default``, the ``rule`` its values obey (`Range`, `Text`,
    `Checked` or `Choice`; ``None`` for a boolean), the ``types`` it takes where they are not just
    the default's (a ``None`` default: the types it takes besides null), and its ``meaning`` in one line.
    `DEFAULTS`, `RULES`, `NULLABLE`, `TYPES`, `CHOICE_KEYS`, `validate` and
    the reference page (`reference`) are all read from `SCHEMA`."""

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


def is_graph_file(spec: str) -> bool:
    """Whether a ``model.graph`` spec names an edge-list file rather than a registered graph.

    Args:
        spec: the spec as written.

    Returns:
        True for a ``.npy`` file or a spec holding a path separator.
    """
    return spec.endswith(".npy") or os.path.sep in spec


def _check_graph(spec: str) -> None:
    """Parse a named spec and build it for a 4-token sequence (its arguments are checked; radii are clamped to
    n). An edge-list file is checked against ``data.max_len`` when a config is validated (`experiments.app.config`)."""
    from energies.graphs import check_graph_spec

    if not is_graph_file(spec):
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

#: every config key, declared once (`Key`: default, rule, types, meaning), sections as nested mappings in
#: the order a saved ``config.yaml`` lists them. Everything else -- `DEFAULTS`, `RULES`,
#: `NULLABLE`, `TYPES`, `CHOICE_KEYS`, `choices`, `validate`, the reference page
#: ``docs/config_reference.md`` (`reference`) -- is derived from this table.
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


#: ``{("section", "key"): Key}`` for every leaf of `SCHEMA`, in its order
KEYS: Dict[tuple, Key] = dict(_leaves(SCHEMA))


def _defaults(schema: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _defaults(v) if isinstance(v, dict) else copy.deepcopy(v.default) for k, v in schema.items()}


#: every key's default, sections as mappings (from `SCHEMA`)
DEFAULTS: Dict[str, Any] = _defaults(SCHEMA)

#: keys whose default is null and the types they take otherwise
NULLABLE = {where: key.allowed_types() for where, key in KEYS.items() if key.nullable}

#: keys that take more than their default's type (and no null): old configs hold booleans for model.positional
TYPES = {where: key.types for where, key in KEYS.items() if not key.nullable and key.types}

#: the keys whose values are names from a list (`choices`)
CHOICE_KEYS = tuple(where for where, key in KEYS.items() if isinstance(key.rule, Choice))

#: the declared range of every numeric key and the rule of every free-text key (choice keys: `choices`;
#: booleans: true | false). ``validate`` checks each value against its rule, then the cross-key rules.
RULES: Dict[tuple, Any] = {where: key.rule for where, key in KEYS.items() if isinstance(key.rule, (Range, Text, Checked))}


def choices(where: tuple) -> tuple:
    """The valid values of a choice key, read from the library's registries (never retyped here).

    Args:
        where: the key as a tuple, such as ``("model", "mode")``.

    Returns:
        The names its `Choice` holds now (a plug-in's registration counts).
    """
    return KEYS[where].rule.names()
