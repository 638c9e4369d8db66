"""Model bundles: everything needed to use a trained model, in one folder, loaded without executing code.

A bundle (format version 2, what :func:`save_model`, ``save_pretrained`` and the trainer write; a finished run
folder is one) is the layout the Hugging Face ecosystem shares models in:

* ``model.safetensors``: the weights (the state dict), read with ``safetensors`` (a JSON header and raw tensor
  bytes: no pickle, nothing in it can run); its header's metadata names the bundle format and version;
* ``config.json``: the resolved config the model was built from (:func:`experiments.app.build.build_model`);
* ``vocab.json``: the vocabulary, ids in order (:class:`experiments.data.Vocab`); or, for a model with a subword
  tokenizer (``data.tokenizer`` other than ``words``), ``tokenizer.json`` instead: the Hugging Face ``tokenizers``
  file (`experiments.data.subword.SubwordTokenizer`), read as JSON and checked, hashed like the other files and
  covered by the data fingerprint;
* ``graph.npy``, where ``model.graph`` is an edge-list file: the graph the model was trained on, copied when the
  run started (:mod:`experiments.app.graph_pin`). The graph is part of the model: the bundle predicts with this
  copy, checked against its sha256, never with the file ``model.graph`` names, which may since have been edited,
  moved or deleted;
* ``README.md``: the model card (Hugging Face front matter: library, tags, dataset, metrics; then the data
  fingerprint, the test metrics, the descent verdict with its tolerance rule, the config and the command that
  made the bundle), written from ``bundle.json``'s ``metrics`` and ``command`` (:func:`model_card`);
* ``bundle.json``: the format version, the label names (class id -> name), the data fingerprint of the training
  data (:mod:`experiments.runfolder.fingerprint`), the card's metrics and command, and the sha256 of every file above.

A run folder also holds the trainer's checkpoints (``best.pt``, ``last.pt``, ``prev.pt``: torch files for
``--resume``); they are not part of the bundle, which never reads them. :class:`TrainedModel` is a
``huggingface_hub`` ``ModelHubMixin``: ``TrainedModel.from_pretrained(folder)`` (a local folder is read offline,
with :func:`load_model`; a Hub id is downloaded first, bundle files only), ``save_pretrained(folder)``
(:func:`save_model`) and ``push_to_hub(repo_id)`` (the mixin's: a bundle written to a temporary folder, uploaded).

**Format 1** (bundles written before this one, still read, with every check below): ``best.pt`` (a run's best
epoch) or ``model.pt`` (the old :func:`save_model`): ``{"model": state_dict, ...}``, read with
``torch.load(weights_only=True)`` (tensors and plain containers only); ``config.yaml`` instead of
``config.json``; no card. ``python -m experiments.app.bundle convert OLD NEW`` (:func:`convert`) writes the same
model as a format-2 bundle, verified (same weights bit for bit, same predictions and energies) before it is put
in place; OLD is only read.

:func:`load_model` checks the hashes before it builds anything (a weights file replaced after the bundle
was written is refused, not silently paired with another vocabulary), reads the weights from the very bytes it
hashed (format 1: from the very file descriptor it hashed; a file swapped between the check and the load is not
read), and returns a :class:`TrainedModel`, whose :meth:`~TrainedModel.predict` maps texts to label names, class
probabilities and the per-layer energy with its descent verdict.

**What is checked** (each a :class:`~energies.errors.CheckpointError` naming the file, the key and the value):
``bundle.json`` is a JSON object with exactly the keys ``format`` (this format's name), ``version`` (an
integer, 1 or 2), ``weights`` (format 2: ``model.safetensors``; format 1: ``best.pt`` or ``model.pt``),
``label_names`` (at least two distinct strings), ``dataset`` (a string or null), ``data_fingerprint`` (null or a
fingerprint) and ``sha256`` (exactly the bundle's files -- format 2: weights, ``config.json``, ``vocab.json``,
``README.md``; format 1: weights, ``config.yaml``, ``vocab.json``; and ``graph.npy`` where there is one -- to
64-digit hex digests) and, optionally, ``graph`` (null, or ``{"spec": the config's model.graph, "file":
"graph.npy"}``: present exactly where ``graph.npy`` is hashed) and, format 2 only, ``metrics`` (null or an object
of numbers, booleans, strings or nulls) and ``command`` (null or a string);
JSON files are read strictly (:func:`unfold.strict_json.loads`: no NaN,
nesting at most 100 levels, so a ``[[[[...`` bomb is a one-line refusal, not a ``RecursionError``); every file
is a regular file (a symbolic link is followed, and what it points to is hashed and read like any file; a FIFO
or device is refused); ``model.safetensors`` is a valid safetensors file whose metadata names this format, of
tensors only; every floating weight is finite (a NaN or inf weight is refused naming the parameter:
a model that cannot give a meaningful verdict is not loaded); every weight has the dtype the model declares for
it (an integer, boolean or other-precision tensor is refused naming it, never cast); format 1: the weights file's
own ``config`` (``best.pt`` stores one) must be ``config.yaml``'s.

**The manifest's fields are verified too.** The data fingerprint is recomputed from what is loaded: its digests
of the vocabulary (tokens in id order) and of the label names must be those of ``vocab.json`` and ``label_names``
(swapped label names, or a reordered vocabulary with recomputed sha256, are refused naming the field). The model
card records in its front matter (key ``bundle_sha256``) the sha256 of every field of ``bundle.json`` (format,
version, weights, label names, dataset, fingerprint, graph, metrics, command) and of every other file, and
``bundle.json`` hashes the card: the card's hash is the root of trust, so a field edited without rewriting the
card is refused naming it (the metrics a bundle reports are the card's). A card written before cards recorded
these digests must be exactly the card of the manifest's fields. A forger who rewrites ``bundle.json``, the card
and every digest consistently is not detected: that would take a signature.

**A folder without bundle.json** is not verifiable: nothing ties its weights to its config and vocabulary, and
because ``bundle.json`` can be deleted, no file's presence or absence can prove that a folder predates bundles.
So such a folder is read only on request -- ``load_model(folder, legacy=True)``, ``unfold-predict --legacy``
-- and even then it is refused when it holds anything only a bundle format writes, which would mean its
``bundle.json`` was removed: a ``model.safetensors`` (only ever written with ``bundle.json``; refused even
without ``legacy``), a ``model.pt`` (written by format 1's :func:`save_model` together with ``bundle.json``, and
marked with the bundle format), or a checksummed checkpoint (``last.pt``/``prev.pt`` with ``sha256``: written
by a trainer that ends every run with ``bundle.json``; an unfinished run is finished with ``--resume``, which
writes it). A legacy folder's label names come from its dataset, loaded again.

**An edge-list graph without its copy** (a bundle written before bundles held their graph, or a legacy folder):
nothing recorded what the file held, so it is read once from the path ``model.graph`` names, when it is there
and is a valid edge list for ``data.max_len``, and kept in memory from then on (:func:`save_model` writes a
bundle holding it); a file that is gone is refused, naming the path to restore it at.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import itertools
import logging
import math
import os
import re
import secrets
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import safetensors.torch
import torch
from huggingface_hub.hub_mixin import ModelHubMixin
from safetensors import SafetensorError

from energies.errors import CheckpointError
from unfold.classifier import SequenceClassifier
from unfold.inputs import check_batch_size, check_inference_layers
from unfold.cli import read_document
from unfold.strict_json import dumps as json_dumps, load as json_load, loads as json_loads
from unfold.trace import DEFAULT_TOL_FACTOR, report_from_values

from ..runfolder.atomic import atomic_open
from .fill_mask import fill_mask_chunk
from .checkpoint import DIGEST, LAST, PREV, check_fingerprint, nonfinite_tensor, safe_load, show
from .graph_pin import GRAPH_FILE, is_graph_file, parse_edges, pin, read_edges, write_edges

__all__ = ["TrainedModel", "Prediction", "load_model", "save_model", "write_bundle", "write_run_bundle",
           "write_bundle_manifest", "model_card", "convert", "BUNDLE", "FORMAT", "VERSION", "VERSIONS"]

BUNDLE = "bundle.json"
FORMAT, VERSION = "unfolded-transformers/bundle", 2
#: the bundle versions :func:`load_model` reads (1: torch-file weights, read weights_only; 2: safetensors)
VERSIONS = (1, 2)
#: format 1's weights files (the trainer's best.pt, the old save_model's model.pt)
WEIGHTS = ("model.pt", "best.pt")
SAFETENSORS, CONFIG_JSON, CARD, CONFIG_YAML = "model.safetensors", "config.json", "README.md", "config.yaml"
#: model.safetensors' metadata: one key, so that the file's bytes are the same at every save (safetensors writes
#: several metadata keys in no fixed order)
META = {"format": f"{FORMAT}/{VERSION}"}
#: the files of a format-2 bundle besides its weights (and graph.npy, where there is one); a subword model has
#: tokenizer.json in place of vocab.json (`VOCAB_FILES`)
FILES_V2 = (CONFIG_JSON, "vocab.json", CARD)
#: the vocabulary's file: the word vocabulary's, or a subword tokenizer's (format 2 only)
VOCAB_FILES = ("vocab.json", "tokenizer.json")
MANIFEST_KEYS = ("format", "version", "weights", "label_names", "dataset", "data_fingerprint", "sha256")
#: keys a manifest may hold besides :data:`MANIFEST_KEYS` (``graph``: the pinned edge-list graph, where there is one;
#: format 2: ``metrics`` and ``command``, what the model card says; ``task``, where the model's task is not
#: ``classify``: ``masked_tokens``, whose bundle has no label names)
OPTIONAL_KEYS = ("graph",)
OPTIONAL_KEYS_V2 = ("graph", "metrics", "command", "task")
#: the metrics.json entries a bundle carries to its card (test metrics, the descent verdict and its rule)
CARD_METRICS = ("test_accuracy", "test_loss", "val_accuracy", "best_epoch", "majority_class_accuracy",
                "no_better_than_majority", "check_dtype_test_accuracy", "energy_verdict", "energy_steps",
                "energy_increases", "energy_nonfinite", "energy_max_rel_increase", "energy_tol_rule",
                "train_energy_increases", "train_energy_steps", "mode", "params",
                # task=masked_tokens (experiments.app.tasks.masked_tokens)
                "masked_accuracy", "masked_loss", "perplexity", "unigram_masked_accuracy", "check_dtype_accuracy",
                "pretrain_texts", "heldout_texts", "head",
                # model.init_from (experiments.app.init_from): the pretraining run a fine-tuned model started from
                "init_from", "init_from_task", "init_from_fingerprint_sha256")
CHECK_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _sha256(path: str) -> str:
    with _open_regular(path) as fh:
        return _sha256_of(fh)


def _sha256_of(fh) -> str:
    """The sha256 of an open binary file from its start (left at its end)."""
    fh.seek(0)
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _open_regular(path: str):
    """``path`` opened for reading in binary, refused unless it is a regular file (a symbolic link is followed:
    what it points to is checked): a FIFO or a device (``/dev/zero``) would hang or never end."""
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:           # a dangling or looping link, no permission
        raise CheckpointError(f"{path} cannot be opened ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
            raise CheckpointError(f"{path} is {kind}; a bundle's files are regular files")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _vocab_file(config: Dict[str, Any]) -> str:
    """The vocabulary's file of a model built from ``config``: ``tokenizer.json`` for a subword tokenizer."""
    return VOCAB_FILES[0] if config["data"].get("tokenizer", "words") == "words" else VOCAB_FILES[1]


def _manifest_vocab(manifest: Optional[Dict[str, Any]]) -> str:
    """The vocabulary's file a manifest hashes (``vocab.json`` where there is no manifest)."""
    hashes = manifest.get("sha256") if manifest is not None else None
    return VOCAB_FILES[1] if manifest is not None and manifest.get("version") == 2 and isinstance(hashes, dict) \
        and VOCAB_FILES[1] in hashes else VOCAB_FILES[0]


def write_bundle_manifest(folder: str, weights: str, label_names: Sequence[str],
                          fingerprint: Optional[Dict[str, Any]], dataset: Optional[str] = None,
                          graph: Optional[str] = None, metrics: Optional[Dict[str, Any]] = None,
                          command: Optional[str] = None, vocab_file: str = "vocab.json") -> str:
    """Write ``folder/bundle.json`` (atomic) for the files already in ``folder``; returns its path. ``weights``
    ``model.safetensors`` writes format 2 (hashing ``config.json``, ``vocab.json``, ``README.md``, with the card's
    ``metrics`` and ``command``), ``best.pt``/``model.pt`` format 1 (``config.yaml``, ``vocab.json``: how bundles
    were written before, kept for reading and testing them). ``graph``: the config's ``model.graph``; where it is
    an edge-list file, ``folder/graph.npy`` (its copy) must be there and is hashed with the others. ``vocab_file``:
    ``tokenizer.json`` for a subword model (format 2)."""
    manifest = _manifest(folder, weights, label_names, fingerprint, dataset, graph, metrics, command,
                         vocab_file=vocab_file)
    return _write_manifest(folder, manifest)


def _manifest(folder: str, weights: str, label_names: Sequence[str], fingerprint: Optional[Dict[str, Any]],
              dataset: Optional[str], graph: Optional[str], metrics: Optional[Dict[str, Any]],
              command: Optional[str], with_card: bool = True, vocab_file: str = "vocab.json",
              task: Optional[str] = None) -> Dict[str, Any]:
    """The manifest of the files in ``folder`` (`write_bundle_manifest`), each file hashed from disk; the
    card's digest left out unless ``with_card`` (the manifest the card itself binds, made before it is written).
    ``task``: the model's task where it is not ``classify`` (format 2; such a model has no label names)."""
    names = [str(n) for n in label_names]
    if not (task is not None and not names) and (len(names) < 2 or len(set(names)) != len(names)):
        raise CheckpointError(f"a bundle needs at least two distinct label names (none: a task without labels, "
                              f"masked_tokens), got {names!r}")
    version = 2 if weights == SAFETENSORS else 1
    if version == 1 and weights not in WEIGHTS:
        raise CheckpointError(f"a bundle's weights are {SAFETENSORS} (or, format 1, one of {list(WEIGHTS)}), got "
                              f"{weights!r}")
    if vocab_file not in VOCAB_FILES or (version == 1 and vocab_file != VOCAB_FILES[0]):
        raise CheckpointError(f"a bundle's vocabulary file is vocab.json (or, format 2, tokenizer.json), got "
                              f"{vocab_file!r}")
    files = (weights,) + ((CONFIG_JSON, vocab_file, CARD) if version == 2 else (CONFIG_YAML, "vocab.json")) \
        + ((GRAPH_FILE,) if is_graph_file(graph) else ())
    hashes = {name: _sha256(os.path.join(folder, name)) for name in files if with_card or name != CARD}
    manifest = {"format": FORMAT, "version": version, "weights": weights, "label_names": names,
                "dataset": dataset, "data_fingerprint": fingerprint, "sha256": hashes}
    if is_graph_file(graph):
        manifest["graph"] = {"spec": graph, "file": GRAPH_FILE}
    if version == 2:
        manifest["metrics"], manifest["command"] = _card_metrics(metrics), command
    if task is not None:
        manifest["task"] = task
    return manifest


def _write_manifest(folder: str, manifest: Dict[str, Any]) -> str:
    path = os.path.join(folder, BUNDLE)
    with atomic_open(path, "w") as fh:
        fh.write(json_dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return path


#: the manifest's fields the model card binds (`_card_binding`): everything but the card's own digest
BOUND_KEYS = ("format", "version", "weights", "label_names", "dataset", "data_fingerprint", "graph", "metrics",
              "command")
#: the card's front-matter key holding the binding
CARD_KEY = "bundle_sha256"


def canonical_sha256(value: Any) -> str:
    """The sha256 of ``value`` as canonical JSON (sorted keys, no spaces, ASCII): the same for the same data
    whichever file it was read from."""
    return hashlib.sha256(json_dumps(value, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=True).encode("ascii")).hexdigest()


def _card_binding(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """What a format-2 model card records of its ``bundle.json`` (front-matter key `CARD_KEY`): the sha256
    of each field of `BOUND_KEYS` (canonical JSON) and the sha256 of every other file of the bundle.
    ``bundle.json`` hashes the card, so its hash of the card is the root of trust: a field of ``bundle.json``
    (label names, fingerprint, metrics, ...) or a file hash edited without rewriting the card is refused on load.
    """
    return {"fields": {k: canonical_sha256(manifest.get(k)) for k in _bound_keys(manifest)},
            "files": {n: manifest["sha256"][n] for n in sorted(manifest["sha256"]) if n != CARD}}


def _bound_keys(*records: Dict[str, Any]) -> tuple:
    """`BOUND_KEYS`, and ``task`` where one of ``records`` (a manifest, a card's recorded fields) has it: a
    classifier's manifest has none, and its card binds what it always did."""
    return BOUND_KEYS + (("task",) if any("task" in r for r in records) else ())


def _card_metrics(metrics: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The entries of :data:`CARD_METRICS` that ``metrics`` (a run's metrics.json, or a bundle's own) holds as
    finite numbers, booleans, strings or nulls; None for none."""
    if not isinstance(metrics, dict):
        return None
    out = {k: metrics[k] for k in CARD_METRICS if k in metrics and _card_value(metrics[k])}
    return out or None


def _card_value(v: Any) -> bool:
    return v is None or isinstance(v, (bool, str, int)) or (isinstance(v, float) and math.isfinite(v))


def trainer_command(argv: Optional[Sequence[str]] = None) -> Optional[str]:
    """The trainer's command line as typed (``unfold-train ...`` or ``python -m experiments.app.train ...``) when this
    process is the trainer's command; None when it is not (a library call, a test)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return None
    prog = os.path.normpath(argv[0])
    for tail, shown in ((os.path.join("experiments", "app", "train.py"), "python -m experiments.app.train"),
                        ("unfold-train", "unfold-train")):
        if prog == tail or prog.endswith(os.sep + tail):
            return " ".join([shown] + [shlex.quote(a) for a in argv[1:]])
    return None


def _safetensors_bytes(state: Dict[str, torch.Tensor]) -> bytes:
    """``state`` as a safetensors file (every tensor its own contiguous CPU copy: safetensors refuses tensors that
    share memory), its metadata naming the bundle format and version (:data:`META`)."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    return safetensors.torch.save(tensors, metadata=META)


def _write_bytes(data: bytes, path: str) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def _write_text(text: str, path: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def _front_matter(doc: Dict[str, Any]) -> str:
    import yaml

    return "---\n" + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) + "---\n"


def model_card(config: Dict[str, Any], label_names: Sequence[str], dataset: Optional[str],
               fingerprint: Optional[Dict[str, Any]], metrics: Optional[Dict[str, Any]],
               command: Optional[str], binding: Optional[Dict[str, Any]] = None) -> str:
    """The bundle's ``README.md``: Hugging Face front matter (library_name, tags, datasets where the dataset is a
    name rather than a path, metrics, pipeline tag; ``binding``, where given: the digests of ``bundle.json``'s
    fields and of the other files, `_card_binding`, under `CARD_KEY`), then what the model is, its test
    metrics, the descent verdict and the tolerance rule it was decided by, the data fingerprint, the command that
    made it, how to load it, and the config. Written from the bundle's own fields only, so the same bundle always
    gets the same card."""
    m = dict(metrics or {})
    mode, task = config["model"]["mode"], _task_name(config)
    pipeline = "text-classification" if task is None else "fill-mask"
    front: Dict[str, Any] = {"library_name": "unfolded-transformers",
                             "tags": ["unfolded-transformer", "energy-based", pipeline, "safetensors",
                                      f"mode-{mode}", "model_hub_mixin"] + ([f"task-{task}"] if task else []),
                             "pipeline_tag": pipeline}
    if dataset and not any(c in dataset for c in "/\\:") and not dataset.startswith("."):
        front["datasets"] = [dataset]
    front["metrics"] = ["accuracy"]
    if binding is not None:
        front[CARD_KEY] = binding
    lines = [f"# {config.get('name', 'model')}: an energy-based unfolded transformer ({mode})", "",
             (f"A text classifier over {len(label_names)} classes ({', '.join(map(str, label_names))})" if task is None
              else f"A masked-token model (`task: {task}`: pretrained to predict the masked tokens of its training "
                   "texts; `unfold-predict PATH --text \"a [MASK] film\"` fills the mask)") + " whose layers "
             "are steps that lower an energy (unfolded optimisation). Files: `model.safetensors` (weights), "
             f"`config.json` (resolved config), `{_vocab_file(config)}`, `bundle.json` (format, label names, sha256 of every "
             "file)" + (", `graph.npy` (the token graph trained on)" if is_graph_file(config["model"]["graph"])
                         else "") + ".", "", "## Descent verdict", ""]
    if m.get("init_from"):
        lines[2:2] = [f"Fine-tuned from `{m['init_from']}` (task `{m.get('init_from_task')}`, data fingerprint "
                      f"sha256 `{m.get('init_from_fingerprint_sha256')}`): its tokenizer, embedding and encoder, "
                      "with a new head.", ""]
    lines += _card_verdict(m, config, task)
    lines += _card_tail(config, dataset, fingerprint, command)
    return _front_matter(front) + "\n" + "\n".join(lines)


def _card_verdict(m: Dict[str, Any], config: Dict[str, Any], task: Optional[str] = None) -> List[str]:
    """The card's lines from the descent verdict to the test metrics' table (``m``: the card's metrics; ``task``:
    the model's task where it is not classify, whose check ran on held-out training texts)."""
    lines: List[str] = []
    verdict = m.get("energy_verdict")
    if verdict is None:
        lines.append("Not recorded (this bundle was not written at the end of a training run).")
    else:
        lines.append(f"**{verdict}**: {m.get('energy_increases', '?')} energy increases beyond tolerance and "
                     f"{m.get('energy_nonfinite', '?')} non-finite values in {m.get('energy_steps', '?')} layer-steps "
                     f"on {'the test split' if task is None else 'the held-out training texts, masked'}, checked in "
                     f"{config['train']['check_dtype']} "
                     f"(largest relative increase {m.get('energy_max_rel_increase', '?')}).")
        if "train_energy_steps" in m:
            lines.append(f"During training: {m.get('train_energy_increases', '?')} increases in "
                         f"{m['train_energy_steps']} layer-steps.")
    lines += ["", "Tolerance rule: " + (f"`{m['energy_tol_rule']}`" if m.get("energy_tol_rule") else
                                        "E_t+1 > E_t + tol is an increase, tol tied to the dtype and to the size "
                                        "of the energy (unfold.trace.report_from_values)."),
              "", "## Test metrics", ""]
    shown = [k for k in ("test_accuracy", "test_loss", "val_accuracy", "best_epoch", "majority_class_accuracy",
                         "no_better_than_majority", "check_dtype_test_accuracy", "masked_accuracy", "masked_loss",
                         "perplexity", "unigram_masked_accuracy", "check_dtype_accuracy", "pretrain_texts",
                         "heldout_texts", "head", "params") if k in m]
    if shown:
        lines += ["| metric | value |", "|---|---|"] + [f"| {k} | {m[k]} |" for k in shown]
    else:
        lines.append("Not recorded.")
    return lines


def _card_tail(config: Dict[str, Any], dataset: Optional[str], fingerprint: Optional[Dict[str, Any]],
               command: Optional[str]) -> List[str]:
    """The card's lines from the data section to the end: data, command, use, config."""
    return ["", "## Data", "", f"Dataset: `{dataset}`" if dataset else "Dataset: not recorded", "",
            "Data fingerprint (sha256 of the vocabulary, of each split and of the label names the model was "
            "trained on, with their sizes: `experiments.runfolder.fingerprint`):",
            "", "```json", json_dumps(fingerprint, indent=1, ensure_ascii=False), "```", "",
            "## The command that made it", "", f"```\n{command}\n```" if command else "Not recorded.", "",
            "## Use", "", "```python", "from experiments.app.bundle import TrainedModel", "",
            'model = TrainedModel.from_pretrained("PATH_OR_HUB_ID")   # no pickle, no code: safetensors + JSON',
            'for p in model.predict(["a text to classify"]):', "    print(p.label, p.probabilities, p.verdict)",
            "```", "", "or `unfold-predict PATH --text \"...\"`.", "", "## Config", "", "```json",
            json_dumps(config, indent=1, ensure_ascii=False), "```", ""]


def write_bundle(folder: str, state: Dict[str, torch.Tensor], config: Dict[str, Any], vocab: Any,
                 label_names: Sequence[str], fingerprint: Optional[Dict[str, Any]], dataset: Optional[str],
                 graph_file: Optional[bytes] = None, metrics: Optional[Dict[str, Any]] = None,
                 command: Optional[str] = None) -> str:
    """Write a format-2 bundle of ``state`` into ``folder`` (module docstring), each file atomically, ``bundle.json``
    last: ``model.safetensors``, ``config.json``, ``vocab.json`` or, for a subword tokenizer, ``tokenizer.json``
    (``vocab``: the vocabulary or tokenizer; None: the one there is kept),
    ``graph.npy`` (where ``model.graph`` is an edge-list file: ``graph_file``'s bytes; None: the copy there is
    kept), ``README.md`` (:func:`model_card`). A non-finite weight is refused before anything is written. Returns
    the path of ``bundle.json``."""
    bad = nonfinite_tensor(state)
    if bad:
        raise CheckpointError(f"{folder}: not saved: model weight {bad[0]!r} is not finite ({bad[1]})")
    _write_bytes(_safetensors_bytes(state), os.path.join(folder, SAFETENSORS))
    _write_text(json_dumps(config, indent=1, ensure_ascii=False) + "\n", os.path.join(folder, CONFIG_JSON))
    vocab_file = _vocab_file(config)
    if vocab is not None:
        if getattr(vocab, "file_name", VOCAB_FILES[0]) != vocab_file:
            raise CheckpointError(f"{folder}: not saved: config data.tokenizer={config['data'].get('tokenizer')!r} "
                                  f"is saved as {vocab_file}, and the model's vocabulary is a {type(vocab).__name__}")
        vocab.save(os.path.join(folder, vocab_file))
    spec = config["model"]["graph"]
    if is_graph_file(spec) and graph_file is not None:
        write_edges(graph_file, folder)
    card_metrics = _card_metrics(metrics)
    task = _task_name(config)
    bound = _manifest(folder, SAFETENSORS, label_names, fingerprint, dataset, spec, card_metrics, command, False,
                      vocab_file=vocab_file, task=task)
    card = model_card(config, label_names, dataset, fingerprint, card_metrics, command, binding=_card_binding(bound))
    _write_text(card, os.path.join(folder, CARD))
    return _write_manifest(folder, _manifest(folder, SAFETENSORS, label_names, fingerprint, dataset, spec,
                                             card_metrics, command, vocab_file=vocab_file, task=task))


def _task_name(config: Dict[str, Any]) -> Optional[str]:
    """The config's ``task`` where it is not ``classify`` (what a manifest records), else None."""
    task = config.get("task", "classify")
    return None if task == "classify" else task


def write_run_bundle(run_dir: str, state: Dict[str, torch.Tensor], config: Dict[str, Any],
                     label_names: Sequence[str], fingerprint: Optional[Dict[str, Any]], dataset: Optional[str] = None,
                     metrics: Optional[Dict[str, Any]] = None) -> str:
    """Make a finished run folder a format-2 bundle (what the trainer calls last): the best epoch's weights
    ``state`` as ``model.safetensors``, ``config`` as ``config.json``, the card from ``metrics`` and the trainer's
    command (:func:`trainer_command`), ``bundle.json`` last; ``vocab.json`` and ``graph.npy`` are the run's own.
    The bundle is read back (:func:`load_model`) and its weights compared bit for bit before this returns; on a
    difference ``bundle.json`` is removed again. The checkpoints (``best.pt``, ``last.pt``) stay for ``--resume``.
    Returns the path of ``bundle.json``."""
    state = {k: v.detach().cpu() for k, v in state.items()}
    path = write_bundle(run_dir, state, config, None, label_names, fingerprint, dataset, metrics=metrics,
                        command=trainer_command())
    try:
        back = load_model(run_dir).model.state_dict()
        if back.keys() != state.keys() or not all(torch.equal(back[k].cpu(), state[k]) for k in state):
            raise CheckpointError(f"{run_dir}: the bundle read back holds other weights than the run's best epoch")
    except BaseException:
        if os.path.exists(path):
            os.unlink(path)        # not a bundle unless it reads back as the model trained
        raise
    return path


@dataclass
class Prediction:
    """One text's prediction: label name and id, class probabilities, and the float64 energy at every layer
    boundary (``energies[t]`` = E(Y_t), t = 0..T; ``energy_terms`` per term) with the descent check's count of
    increases beyond tolerance, of non-finite steps, and its verdict (``non-finite`` as well when a probability
    is not finite: a NaN weight never reads as descent); ``tokens`` counted after truncation to ``data.max_len``
    (``truncated`` says whether the text was longer); ``unknown_tokens``: how many of those tokens are not in the
    model's vocabulary (read as ``<unk>``; a text with no token at all is read as one ``<unk>``), and
    ``unknown_words`` the first :data:`UNKNOWN_WORDS_SHOWN` distinct ones, in order. When every token is
    unknown (:attr:`prior_only`) the text tells the model nothing: the prediction is the model's prior."""

    text: str
    label: str
    label_id: int
    probabilities: Dict[str, float]
    energies: List[float]
    energy_terms: Dict[str, List[float]]
    increases: int
    nonfinite: int
    descent: bool
    verdict: str
    tokens: int
    truncated: bool
    unknown_tokens: int = 0
    unknown_words: List[str] = field(default_factory=list)

    @property
    def prior_only(self) -> bool:
        """No token of the text is in the vocabulary: the prediction is the model's prior, not a reading."""
        return self.unknown_tokens >= self.tokens

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


#: how many distinct unknown words a :class:`Prediction` names (the count is always whole)
UNKNOWN_WORDS_SHOWN = 5
#: texts with no known token warned about one by one per predict call; the rest are counted in one last line
PRIOR_WARNINGS = 10


#: a Hugging Face Hub model id (``owner/name``): what from_pretrained downloads when no such local folder exists
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
#: the files a bundle can hold: all that from_pretrained downloads from the Hub (never a .pt checkpoint)
BUNDLE_FILES = (BUNDLE, SAFETENSORS, CONFIG_JSON, *VOCAB_FILES, CARD, GRAPH_FILE)


@dataclass
class TrainedModel(ModelHubMixin, library_name="unfolded-transformers", pipeline_tag="text-classification",
                   tags=["unfolded-transformer", "energy-based", "text-classification"]):
    """A trained classifier with what it takes to use it on text: config, vocabulary, label names;
    ``graph_file``: the bytes of its edge-list graph (``model.graph`` a ``.npy`` file), pinned in the model;
    ``metrics`` and ``command``: what its model card says (test metrics and descent verdict; the command that
    made it), None where unknown.

    A ``huggingface_hub`` :class:`~huggingface_hub.ModelHubMixin` whose loading and saving are this module's:
    :meth:`from_pretrained` reads a local folder with :func:`load_model` (offline, every check, no code run) and
    :meth:`save_pretrained` writes with :func:`save_model` (atomic, read back before it returns); the mixin's own
    ``push_to_hub`` uploads what :meth:`save_pretrained` writes. The mixin's generic paths are overridden because
    they read ``config.json`` with a plain ``json.load`` before any check, feed its keys to the constructor
    (``model`` and ``config`` are keys of both), and write into a folder non-atomically."""

    model: SequenceClassifier
    config: Dict[str, Any]
    vocab: Any
    label_names: List[str]
    data_fingerprint: Optional[Dict[str, Any]] = None
    dataset: Optional[str] = None
    graph_file: Optional[bytes] = None
    metrics: Optional[Dict[str, Any]] = None
    command: Optional[str] = None

    def __new__(cls, *args, **kwargs):
        # the mixin's __new__ records the constructor's JSON-able arguments as a Hub config; the bundle's
        # config.json is the model's config, written by save_model, so nothing is recorded here
        return object.__new__(cls)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, map_location="cpu", legacy: bool = False,
                        revision: Optional[str] = None, cache_dir=None, force_download: bool = False,
                        token=None, local_files_only: bool = False, **kwargs) -> "TrainedModel":
        """The model of a bundle: a local folder (any format :func:`load_model` reads; offline, nothing executed),
        or, where no such folder exists and the name is a Hub id (``owner/name``), the bundle files of that Hub
        repository (:data:`BUNDLE_FILES`, never a ``.pt`` file) downloaded, then read by :func:`load_model`."""
        model_id = _path_arg(pretrained_model_name_or_path, "pretrained_model_name_or_path", "from_pretrained")
        return cls._from_pretrained(model_id=model_id, revision=revision,
                                    cache_dir=cache_dir, force_download=force_download, token=token,
                                    local_files_only=local_files_only, map_location=map_location, legacy=legacy,
                                    **kwargs)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision=None, cache_dir=None, force_download: bool = False,
                         local_files_only: bool = False, token=None, map_location="cpu", legacy: bool = False,
                         **kwargs) -> "TrainedModel":
        if kwargs:
            raise CheckpointError(f"from_pretrained: unknown argument {sorted(kwargs)[0]!r} (the model is built "
                                  "from the bundle's config.json, nothing else)")
        folder = model_id
        if not os.path.lexists(model_id) and HUB_ID.fullmatch(model_id) and not model_id.startswith("."):
            from huggingface_hub import snapshot_download

            try:
                folder = snapshot_download(model_id, revision=revision, cache_dir=cache_dir, token=token,
                                           force_download=force_download, local_files_only=local_files_only,
                                           allow_patterns=list(BUNDLE_FILES))
            except Exception as exc:  # noqa: BLE001 -- offline, no such repository: one line naming it
                raise CheckpointError(f"{model_id!r}: no such model folder here, and not downloadable from the "
                                      f"Hugging Face Hub ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
                                      ) from None
        return load_model(folder, map_location, legacy=legacy)

    def save_pretrained(self, save_directory, *, config: Optional[Dict[str, Any]] = None,
                        repo_id: Optional[str] = None, push_to_hub: bool = False,
                        model_card_kwargs: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                        **push_to_hub_kwargs) -> str:
        """:func:`save_model` (the Hugging Face spelling): a format-2 bundle in ``save_directory``; with
        ``push_to_hub``, then uploaded by the mixin's ``push_to_hub`` (returns the commit's URL; else the folder).
        ``config``: the model's own config or None (a bundle's config is the model's); ``model_card_kwargs`` are
        refused (the card is written from the bundle, :func:`model_card`)."""
        if config is not None and config != self.config:
            raise CheckpointError("save_pretrained: config must be None or the model's own: a bundle's config.json "
                                  "is the config its model was built from")
        if model_card_kwargs:
            raise CheckpointError(f"save_pretrained: model_card_kwargs {sorted(model_card_kwargs)} are not used: the "
                                  "card is written from the bundle's metrics, verdict and config")
        folder = save_model(self, _path_arg(save_directory, "save_directory", "save_pretrained", output=True),
                            overwrite=overwrite)
        if push_to_hub:
            return self.push_to_hub(repo_id or os.path.basename(os.path.abspath(folder)), **push_to_hub_kwargs)
        return folder

    def _save_pretrained(self, save_directory) -> None:
        """The mixin's hook: the bundle written into ``save_directory`` (replacing what a bundle writes there)."""
        save_model(self, os.fspath(save_directory), overwrite=True)

    def generate_model_card(self, *args, **kwargs):
        """The bundle's card (:func:`model_card`) as a ``huggingface_hub`` ``ModelCard``."""
        from huggingface_hub import ModelCard

        return ModelCard(model_card(self.config, self.label_names, self.dataset, self.data_fingerprint,
                                    self.metrics, self.command))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode(self, texts: Sequence[str], tokens: Optional[list] = None):
        """``(ids, mask, truncated)``: ``texts`` as the trainer encodes them (first ``data.max_len`` tokens), and
        whether each was longer (read off an encoding one token longer: each text is tokenised once).
        ``tokens``: a list receiving each text's kept token strings (:func:`experiments.data.text.encode`)."""
        from ..data import encode

        max_len = self.config["data"]["max_len"]
        ids, mask, _ = encode([(t, 0) for t in texts], self.vocab, max_len + 1, tokens=tokens)
        truncated = mask[:, max_len] if mask.shape[1] > max_len else torch.zeros(len(texts), dtype=torch.bool)
        if tokens is not None:
            tokens[:] = [t[:max_len] for t in tokens]
        return ids[:, :max_len].to(self.device), mask[:, :max_len].to(self.device), truncated

    def encode(self, texts: Sequence[str]):
        """``(ids, mask)`` of ``texts`` as the trainer encodes them (first ``data.max_len`` tokens)."""
        return self._encode(texts)[:2]

    @torch.no_grad()
    def _logits(self, ids: torch.Tensor, mask: torch.Tensor, layers: Optional[int] = None) -> torch.Tensor:
        self.model.eval()
        return self.model(ids, mask, trace=False, layers=layers).logits

    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        """The model's logits ``(N, K)`` for ``texts`` (eval mode, trace off, the model's own dtype)."""
        return self._logits(*self.encode(texts))

    def _energy_model(self) -> SequenceClassifier:
        """A copy of the model as it is now (weights, device) in ``train.check_dtype``: made per call, so that
        weights changed in place are never checked through a stale copy."""
        return copy.deepcopy(self.model).to(CHECK_DTYPES[self.config["train"]["check_dtype"]]).eval()

    @property
    def task(self) -> str:
        """The model's task (``config['task']``): ``classify``, or ``masked_tokens`` (whose `predict` fills masks)."""
        return self.config.get("task", "classify")

    @torch.no_grad()
    def predict(self, texts: Sequence[str], batch_size: int = 64,
                tol_factor: float = DEFAULT_TOL_FACTOR, layers: Optional[int] = None, top_k: int = 5) -> List[Prediction]:
        """One :class:`Prediction` per text: probabilities from the model as trained (its dtype, trace off), the
        energies from a copy in ``train.check_dtype`` (float64 by default) with the trace on, checked layer by
        layer with the project's tolerance rule (:func:`unfold.trace.report_from_values`). ``layers``: unroll the
        shared step that many times instead of the trained depth (weight-shared encoders only; else a
        :class:`~energies.errors.ConfigError` naming it, :func:`unfold.inputs.check_inference_layers`).

        A masked-token model (``task: masked_tokens``) fills masks instead: one
        `experiments.app.fill_mask.FillMaskPrediction` per text, the ``top_k`` candidates of each ``[MASK]``
        (Hugging Face's fill-mask fields ``score``, ``token``, ``token_str``, ``sequence``) with the same energy
        verdict; a text without ``[MASK]`` is a ConfigError."""
        layers = check_inference_layers(self.model.encoder, layers)
        batch_size = check_batch_size(batch_size)
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise CheckpointError(f"texts must be strings; text {bad[0]} is a {type(texts[bad[0]]).__name__}")
        return [p for batch in self.predict_batches((texts[s:s + batch_size] for s in range(0, len(texts), batch_size)),
                                                    tol_factor, layers, top_k) for p in batch]

    def predict_iter(self, texts: Iterable[str], batch_size: int = 64, tol_factor: float = DEFAULT_TOL_FACTOR,
                     layers: Optional[int] = None, top_k: int = 5) -> Iterator[Prediction]:
        """:meth:`predict` as a stream: ``texts`` (any iterable, read lazily) taken ``batch_size`` at a time, each
        batch's predictions yielded as soon as it is done, so that memory is bounded by one batch whatever the
        number of texts. A text that is not a string is refused when its batch is reached."""
        batch_size = check_batch_size(batch_size)
        if isinstance(texts, str):
            texts = [texts]
        it = iter(texts)
        batches = iter(lambda: list(itertools.islice(it, batch_size)), [])
        for batch in self.predict_batches(batches, tol_factor=tol_factor, layers=layers, top_k=top_k):
            yield from batch

    @torch.no_grad()
    def predict_batches(self, batches: Iterable[Sequence[str]], tol_factor: float = DEFAULT_TOL_FACTOR,
                        layers: Optional[int] = None, top_k: int = 5) -> Iterator[List[Prediction]]:
        """The predictions of each batch of texts in ``batches`` (each a list, empty batches skipped), yielded
        batch by batch as :meth:`predict` computes them (one energy copy of the model for the whole stream). A
        text with no token in the vocabulary is warned about on the ``experiments.app.predict`` logger (stderr by
        default): the first :data:`PRIOR_WARNINGS` one by one, then one line counting the others at the end."""
        layers = check_inference_layers(self.model.encoder, layers)
        checker = self._energy_model()
        dtype = next(checker.parameters()).dtype
        log = logging.getLogger("experiments.app.predict")
        seen = prior = 0
        for chunk in batches:
            chunk = list(chunk)
            bad = [i for i, t in enumerate(chunk) if not isinstance(t, str)]
            if bad:
                raise CheckpointError(f"texts must be strings; text {seen + bad[0]} is a "
                                      f"{type(chunk[bad[0]]).__name__}")
            if not chunk:
                continue
            out = self._predict_chunk(chunk, checker, dtype, tol_factor, layers) if self.task == "classify" else \
                fill_mask_chunk(self, chunk, checker, dtype, tol_factor, layers, top_k, seen)
            for i, pred in enumerate(out):
                if pred.prior_only:
                    prior += 1
                    if prior <= PRIOR_WARNINGS:
                        log.warning(_prior_warning(seen + i + 1, pred))
            seen += len(chunk)
            yield out
        if prior > PRIOR_WARNINGS:
            log.warning(f"{prior - PRIOR_WARNINGS} more text(s) of the {seen} had no token the model knows (their "
                        f"predictions are the model's prior; {prior} in all)")

    @torch.no_grad()
    def _predict_chunk(self, chunk: List[str], checker: SequenceClassifier, dtype: torch.dtype, tol_factor: float,
                       layers: Optional[int]) -> List[Prediction]:
        """The :class:`Prediction` of each text of one non-empty batch (``checker``: the energy copy, ``dtype``)."""
        kept: list = []
        ids, mask, truncated = self._encode(chunk, tokens=kept)
        probs = torch.softmax(self._logits(ids, mask, layers).double(), dim=-1).cpu()
        res = checker(ids, mask, trace=True, layers=layers)
        rep = report_from_values(res.energies, dtype, tol_factor=tol_factor, guaranteed=checker.encoder.guaranteed)
        totals = rep.totals.cpu()
        terms = {k: v.detach().double().cpu() for k, v in res.energies.items()}
        inc, nonfinite = rep.increases.sum(1).cpu(), rep.nonfinite.sum(1).cpu()
        lengths = mask.sum(1).cpu()
        unknown_at = ((ids == self.vocab.unk_id) & mask).cpu()
        unknown = unknown_at.sum(1)
        out: List[Prediction] = []
        for i, text in enumerate(chunk):
            k = int(probs[i].argmax())
            n_inc, n_bad = int(inc[i]), int(nonfinite[i]) + int((~torch.isfinite(probs[i])).any())
            ok = n_inc == 0 and n_bad == 0
            words = list(dict.fromkeys(w for j, w in enumerate(kept[i]) if unknown_at[i, j]))[:UNKNOWN_WORDS_SHOWN]
            out.append(Prediction(
                text=text, label=self.label_names[k], label_id=k,
                probabilities={name: float(p) for name, p in zip(self.label_names, probs[i])},
                energies=[float(v) for v in totals[i]],
                energy_terms={name: [float(v) for v in vals[i]] for name, vals in terms.items()},
                increases=n_inc, nonfinite=n_bad, descent=ok,
                verdict="descent" if ok else ("non-finite" if n_bad else "increase"),
                tokens=int(lengths[i]), truncated=bool(truncated[i]),
                unknown_tokens=int(unknown[i]), unknown_words=words))
        return out


def _prior_warning(number: int, pred: Prediction) -> str:
    """The warning for a text none of whose tokens the model knows (number: its place in the input, from 1)."""
    text = " ".join(pred.text.split())
    shown = text if len(text) <= 60 else text[:59] + "…"
    what = (f"none of its {pred.tokens} token(s) is in the model's vocabulary ({', '.join(pred.unknown_words)})"
            if pred.unknown_words else "it has no token at all (read as one unknown token)")
    return f"text {number} {shown!r}: {what}: the prediction {pred.label!r} is the model's prior, not a reading of it"


def _key_error(path: str, key: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(f"{path}: key {key!r} = {show(value)} {rule}")


def _read_json(path: str) -> Any:
    """The JSON document at ``path`` (strict, depth-limited: :func:`unfold.strict_json.loads`), through
    :func:`unfold.cli.read_document`: any problem is one :class:`CheckpointError` naming the file."""
    if os.path.lexists(path) and not os.path.isdir(path):
        _open_regular(path).close()           # a FIFO or a device is refused before it is read
    return read_document(path, json_load, CheckpointError, path, "JSON")


def _read_manifest(folder: str) -> Optional[Dict[str, Any]]:
    """``folder/bundle.json`` validated key by key (module docstring), or None when there is none."""
    path = os.path.join(folder, BUNDLE)
    if not os.path.lexists(path):
        return None
    manifest = _read_json(path)
    version = _check_manifest_keys(path, manifest)
    if version == 2:
        _check_card_fields(path, manifest)
    _check_manifest_data(path, manifest)
    _check_manifest_files(path, manifest, version)
    return manifest


def _check_manifest_keys(path: str, manifest: Any) -> int:
    """Refuse a manifest that is not an object with its keys, this format, a version read here and its weights
    file; returns the version."""
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path} is not a model bundle manifest: it must hold a JSON object (a mapping of "
                              f"keys), got a JSON {_json_type(manifest)}")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise CheckpointError(f"{path} has no {missing[0]!r} (a manifest has the keys {list(MANIFEST_KEYS)})")
    if manifest["format"] != FORMAT or not isinstance(manifest["format"], str):
        raise _key_error(path, "format", manifest["format"], f"is not a model bundle manifest: expected {FORMAT!r}")
    version = manifest["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version not in VERSIONS:
        raise _key_error(path, "version", version, f"is not a bundle version this code reads (the integers "
                                                   f"{list(VERSIONS)})")
    optional = OPTIONAL_KEYS_V2 if version == 2 else OPTIONAL_KEYS
    unknown = sorted(k for k in manifest if k not in MANIFEST_KEYS + optional)
    if unknown:
        raise CheckpointError(f"{path}: key {unknown[0]!r} is not a manifest key of bundle version {version} (valid: "
                              f"{list(MANIFEST_KEYS + optional)})")
    weights = (SAFETENSORS,) if version == 2 else WEIGHTS
    if not isinstance(manifest["weights"], str) or manifest["weights"] not in weights:
        raise _key_error(path, "weights", manifest["weights"], f"must be one of {list(weights)} in a bundle of "
                                                               f"version {version}")
    return version


def _check_card_fields(path: str, manifest: Dict[str, Any]) -> None:
    """Refuse a format-2 manifest whose ``metrics`` or ``command`` (what the model card says) is malformed."""
    metrics, command = manifest.get("metrics"), manifest.get("command")
    if metrics is not None and not (isinstance(metrics, dict) and all(
            isinstance(k, str) and _card_value(v) for k, v in metrics.items())):
        raise _key_error(path, "metrics", metrics, "must be null or an object of numbers, booleans, strings or "
                                                   "nulls (the model card's metrics)")
    if command is not None and not isinstance(command, str):
        raise _key_error(path, "command", command, "must be null or a string (the command that made the bundle)")


def _check_manifest_data(path: str, manifest: Dict[str, Any]) -> None:
    """Refuse a manifest whose ``label_names``, ``dataset`` or ``data_fingerprint`` is malformed."""
    names, task = manifest["label_names"], manifest.get("task")
    if "task" in manifest and not (isinstance(task, str) and task != "classify" and task.strip() == task and task):
        raise _key_error(path, "task", task, "must be the name of a task other than classify (a classifier's "
                                             "manifest has no task)")
    if (task is None or names != []) and (not isinstance(names, list) or len(names) < 2 or not all(
            isinstance(n, str) for n in names) or len(set(names)) != len(names)):
        raise _key_error(path, "label_names", names, "must be at least two distinct strings (or [] with a task "
                                                     "without labels, masked_tokens)")
    if manifest["dataset"] is not None and not isinstance(manifest["dataset"], str):
        raise _key_error(path, "dataset", manifest["dataset"], "must be a string or null")
    if manifest["data_fingerprint"] is not None:
        try:
            check_fingerprint(path, manifest["data_fingerprint"])
        except CheckpointError as exc:
            raise CheckpointError(str(exc).replace(f"{path}: data_fingerprint", f"{path}: key 'data_fingerprint'",
                                                   1)) from None


def _check_manifest_files(path: str, manifest: Dict[str, Any], version: int) -> None:
    """Refuse a manifest whose ``graph`` is malformed or whose ``sha256`` does not map exactly the bundle's files
    to 64-digit hex digests."""
    graph = manifest.get("graph")
    if graph is not None and not (isinstance(graph, dict) and set(graph) == {"spec", "file"}
                                  and graph["file"] == GRAPH_FILE and is_graph_file(graph["spec"])):
        raise _key_error(path, "graph", graph, f"must be null or {{'spec': the edge-list file model.graph names, "
                                               f"'file': {GRAPH_FILE!r}}}")
    hashes = manifest["sha256"]
    files = {manifest["weights"], *((CONFIG_JSON, _manifest_vocab(manifest), CARD) if version == 2
                                    else (CONFIG_YAML, "vocab.json"))} | ({GRAPH_FILE} if graph is not None else set())
    if not isinstance(hashes, dict) or set(hashes) != files or not all(
            isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in hashes.values()):
        raise CheckpointError(f"{path}: key 'sha256' is wrong: sha256 must map exactly {sorted(files)} to 64-digit "
                              f"hex digests, got {show(hashes)}")


def _json_type(x: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null", int: "number",
            float: "number"}.get(type(x), type(x).__name__)


def _read_vocab(path: str):
    """``vocab.json`` as a :class:`~experiments.data.Vocab`: ``{"itos": [distinct strings, "<pad>", "<unk>"
    first]}``, every problem naming the file."""
    from ..data import DataError, Vocab

    doc = _read_json(path)
    if not isinstance(doc, dict) or set(doc) != {"itos"}:
        raise CheckpointError(f"{path} is not a vocabulary: it must hold a JSON object with the one key 'itos', "
                              f"got {show(doc)}")
    itos = doc["itos"]
    if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
        raise _key_error(path, "itos", itos, "must be a list of token strings")
    try:
        return Vocab(itos)
    except DataError as exc:
        raise CheckpointError(f"{path}: key 'itos' is not a vocabulary ({exc})") from None


def _read_tokenizer(path: str, manifest: Dict[str, Any]):
    """``tokenizer.json`` as a `experiments.data.subword.SubwordTokenizer`, read from the very bytes checked against
    the manifest's sha256; every problem naming the file."""
    from ..data import DataError
    from ..data.subword import SubwordTokenizer

    data = _read_checked(path, manifest, VOCAB_FILES[1])
    try:
        return SubwordTokenizer.from_json(data, path)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None


def _legacy_problem(folder: str, weights: str, state: Any) -> Optional[str]:
    """Why a folder without bundle.json must not be read even with ``legacy=True`` (module docstring)."""
    if isinstance(state, dict) and "format" in state:
        return (f"{weights} carries the bundle format ({show(state.get('format'))}): it was written with a "
                f"{BUNDLE}, which has been removed")
    for name in (LAST, PREV):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            try:
                ck = safe_load(path)
            except CheckpointError:
                continue
            if isinstance(ck, dict) and DIGEST in ck:
                return (f"{name} is a checksummed checkpoint: the run was written by a trainer that ends every run "
                        f"with {BUNDLE}, so it was removed or the run did not finish (finish it with "
                        f"unfold-train --resume {folder}, which writes {BUNDLE})")
    return None


#: what a weights file holds: the trainer's best.pt (model, config, epoch, val_accuracy), save_model's model.pt
#: (model, format, version)
WEIGHTS_KEYS = ("model", "config", "epoch", "val_accuracy", "format", "version")


def _check_weights_fields(path: str, state: Dict[str, Any]) -> None:
    """The fields of a weights file besides its model, each of its type and range."""
    unknown = sorted(str(k) for k in state if k not in WEIGHTS_KEYS)
    if unknown:
        raise CheckpointError(f"{path}: key {unknown[0]!r} is not a field of a weights file (valid: "
                              f"{list(WEIGHTS_KEYS)})")
    epoch = state.get("epoch", 1)
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        raise _key_error(path, "epoch", epoch, "must be an integer >= 1 (the epoch the weights are from)")
    acc = state.get("val_accuracy", 0.0)
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0 <= acc <= 1:
        raise _key_error(path, "val_accuracy", acc, "must be a validation accuracy in [0, 1]")
    if "format" in state and state["format"] != FORMAT:
        raise _key_error(path, "format", state["format"], f"must be {FORMAT!r}")
    if "version" in state and (type(state["version"]) is not int or state["version"] != 1):
        raise _key_error(path, "version", state["version"], "must be the integer 1 (a format-1 weights file)")


def _read_checked(path: str, manifest: Dict[str, Any], name: str) -> bytes:
    """The bytes of ``path`` (a regular file), refused unless their sha256 is the manifest's for ``name``: hashed
    and then used from this one read, so what was checked is what is used."""
    with _open_regular(path) as fh:
        data = fh.read()
    if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
        raise CheckpointError(f"{path} changed since {BUNDLE} was written (sha256 differs): the weights, "
                              "config and vocabulary would no longer belong together")
    return data


def _read_safetensors(data: bytes, path: str) -> Dict[str, Any]:
    """The state dict of a ``model.safetensors`` file's bytes (no pickle: a JSON header and raw tensors), its
    metadata checked to name this format. Any problem is a :class:`CheckpointError` naming the file."""
    try:
        sd = safetensors.torch.load(data)
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as exc:
        raise CheckpointError(f"{path} cannot be read as safetensors ({' '.join(str(exc).split())[:200]})") from None
    size = int.from_bytes(data[:8], "little")           # the header safetensors has just validated
    header = json_loads(data[8:8 + size].decode("utf-8"))
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if meta != META:
        raise CheckpointError(f"{path}: its metadata {show(meta)} is not the bundle format's ({META}): not a "
                              "bundle's weights")
    return sd


def _config_json_graph(data: bytes) -> Any:
    """``model.graph`` as ``config.json`` writes it (None where there is no such string: :func:`_read_config_json`
    then says what is wrong)."""
    try:
        doc = json_loads(data.decode("utf-8"))
    except Exception:  # noqa: BLE001 -- reported by _read_config_json, which reads the same bytes
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    spec = model.get("graph") if isinstance(model, dict) else None
    return spec if isinstance(spec, str) else None


def _read_config_json(data: bytes, path: str, graph_path: Optional[str]) -> Dict[str, Any]:
    """``config.json``'s bytes as the validated config (:func:`experiments.app.config.validate`, unknown keys
    refused naming them); ``graph_path``: the pinned graph's path put in ``model.graph`` (to build on)."""
    from .config import DEFAULTS, _merge, validate
    from energies.errors import ConfigError

    try:
        doc = json_loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except Exception as exc:  # noqa: BLE001 -- strict JSON: malformed, NaN, nested too deep
        raise CheckpointError(f"{path} is not valid JSON ({' '.join(str(exc).split())[:200]})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} must hold a JSON object (the config's sections), got a JSON {_json_type(doc)}")
    cfg = copy.deepcopy(DEFAULTS)
    try:
        _merge(cfg, doc, DEFAULTS, "")
        if graph_path:
            cfg["model"]["graph"] = graph_path
        validate(cfg)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return cfg


def load_model(folder: str, map_location="cpu", legacy: bool = False) -> TrainedModel:
    """The :class:`TrainedModel` of a bundle (module docstring). Every problem (no such folder, a file missing,
    malformed or changed since the bundle was written, a non-finite weight, weights that do not fit the config)
    raises :class:`~energies.errors.CheckpointError` naming the file. ``legacy``: read a folder without
    ``bundle.json`` (a run from before bundles), under the module docstring's rule."""
    folder = _path_arg(folder, "folder", "load_model")
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder!r}: no such model folder (a finished run folder or a saved bundle)")
    manifest = _read_manifest(folder)
    version = manifest["version"] if manifest is not None else 1
    config_name = CONFIG_JSON if version == 2 else CONFIG_YAML
    config_path = os.path.join(folder, config_name)
    weights, config_bytes, card_bytes = _check_bundle_files(folder, manifest, version, config_path)
    wpath = os.path.join(folder, weights)
    state = _read_weights(wpath, manifest, version, weights)
    if manifest is None:
        _refuse_unbundled(folder, weights, state, legacy)
    vocab_name = _manifest_vocab(manifest)
    for name in (config_name, vocab_name):
        if not os.path.lexists(os.path.join(folder, name)):
            raise CheckpointError(f"{os.path.join(folder, name)}: missing")
    cfg, build_cfg, graph_bytes, edges = _bundle_config(folder, manifest, version, config_path, config_bytes)
    vocab = _read_vocab(os.path.join(folder, "vocab.json")) if vocab_name == VOCAB_FILES[0] \
        else _read_tokenizer(os.path.join(folder, vocab_name), manifest)
    if vocab_name != _vocab_file(cfg):
        raise CheckpointError(f"{os.path.join(folder, vocab_name)}: {config_path} has data.tokenizer="
                              f"{cfg['data']['tokenizer']!r}, whose vocabulary is saved as {_vocab_file(cfg)}")
    sd = _checked_state(wpath, state, cfg, config_path)
    label_names, fingerprint, dataset, metrics, command = _bundle_labels(folder, manifest, version, cfg)
    _check_task(folder, manifest, cfg, config_path)
    model = _built_model(wpath, config_path, sd, cfg, build_cfg, len(vocab), label_names, edges)
    if manifest is not None:          # the fields of bundle.json against what was loaded and what the card records
        _check_fingerprint_parts(folder, manifest, vocab, label_names)
        if version == 2:
            _check_card(folder, manifest, config_bytes, card_bytes)
    model = model.to(map_location).eval()
    return TrainedModel(model, cfg, vocab, label_names, fingerprint, dataset, graph_bytes, metrics, command)


def _check_bundle_files(folder: str, manifest: Optional[Dict[str, Any]], version: int, config_path: str):
    """``(weights file name, config.json's checked bytes or None, README.md's checked bytes or None)``: with a
    manifest, every file but the weights (and graph.npy) checked against its sha256; without one, the format-1
    weights file that is there."""
    config_bytes = card_bytes = None
    if manifest is not None:
        weights = manifest["weights"]
        if version == 2:
            config_bytes = _read_checked(config_path, manifest, CONFIG_JSON)
            card_bytes = _read_checked(os.path.join(folder, CARD), manifest, CARD)
        for name in ((CONFIG_YAML,) if version == 1 else ()) + (_manifest_vocab(manifest),):
            path = os.path.join(folder, name)
            if _sha256(path) != manifest["sha256"][name]:
                raise CheckpointError(f"{path} changed since {BUNDLE} was written (sha256 differs): the weights, "
                                      "config and vocabulary would no longer belong together")
    else:
        if os.path.lexists(os.path.join(folder, SAFETENSORS)):
            raise CheckpointError(f"{folder} has no {BUNDLE}, so nothing ties its weights to its config and "
                                  f"vocabulary; and it is not a folder from before bundles: {SAFETENSORS} is written "
                                  f"only together with {BUNDLE}, which has been removed")
        weights = next((w for w in WEIGHTS if os.path.lexists(os.path.join(folder, w))), None)
        if weights is None:
            raise CheckpointError(f"{folder}: no {BUNDLE} and no weights ({' or '.join(WEIGHTS)}): not a model bundle")
    return weights, config_bytes, card_bytes


def _read_weights(wpath: str, manifest: Optional[Dict[str, Any]], version: int, weights: str) -> Any:
    """The weights file's content (format 2: ``{"model": state dict}``), read from the very bytes (format 1: the
    very file descriptor) whose sha256 was checked against the manifest's."""
    if version == 2:                  # hashed and parsed from one read: what was checked is what is read
        return {"model": _read_safetensors(_read_checked(wpath, manifest, weights), wpath)}
    with _open_regular(wpath) as fh:   # hashed and loaded from one descriptor: what was checked is what is read
        if manifest is not None and _sha256_of(fh) != manifest["sha256"][weights]:
            raise CheckpointError(f"{wpath} changed since {BUNDLE} was written (sha256 differs): the weights, "
                                  "config and vocabulary would no longer belong together")
        fh.seek(0)
        return safe_load(fh, map_location="cpu", name=wpath)


def _check_fingerprint_parts(folder: str, manifest: Dict[str, Any], vocab: Any, label_names: List[str]) -> None:
    """Refuse a manifest whose ``data_fingerprint`` does not describe the vocabulary (tokens in id order) and the
    label names (in class order) actually loaded: recomputed from them, never taken on trust."""
    fp = manifest.get("data_fingerprint")
    if fp is None:
        return
    from ..runfolder.fingerprint import mismatched_parts

    bad = mismatched_parts(fp, vocab.itos, label_names, tokenizer=vocab.tokenizer_digest)
    path = os.path.join(folder, BUNDLE)
    if "label_names" in bad:
        raise CheckpointError(f"{path}: key 'label_names' = {show(label_names)} is not what key 'data_fingerprint' "
                              "records (its 'label_names' digest is of other names, or another order): the classes "
                              "would be reported under other labels")
    if "vocab" in bad:
        then = (fp.get("sizes") or {}).get("vocab")
        raise CheckpointError(f"{os.path.join(folder, vocab.file_name)}: its {len(vocab.itos)} tokens in id order are not "
                              f"the vocabulary key 'data_fingerprint' of {path} records ({then} tokens): token ids "
                              "would be read as other words")


def _card_front(card_bytes: bytes, path: str) -> Dict[str, Any]:
    """The model card's front matter (the YAML between its first two ``---`` lines) as a mapping, read with the
    project's strict YAML reader; ``{}`` where the card has none."""
    from ..runfolder.strict_yaml import load_yaml
    import yaml

    try:
        text = card_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    end = text.find("\n---\n", 3)
    if not text.startswith("---\n") or end < 0:
        return {}
    try:
        doc = load_yaml(text[4:end + 1])
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise CheckpointError(f"{path}: its front matter is not valid YAML ({' '.join(str(exc).split())[:200]})"
                              ) from None
    return doc if isinstance(doc, dict) else {}


def _check_card(folder: str, manifest: Dict[str, Any], config_bytes: bytes, card_bytes: bytes) -> None:
    """Refuse a format-2 manifest whose fields or file digests are not what its model card (hashed in it)
    records (`_card_binding`); a card written before cards recorded them must be the card of the manifest's
    fields, as `model_card` writes it (`_check_older_card`)."""
    path, card_path = os.path.join(folder, BUNDLE), os.path.join(folder, CARD)
    recorded = _card_front(card_bytes, card_path).get(CARD_KEY)
    if recorded is None:
        return _check_older_card(path, card_path, manifest, config_bytes, card_bytes)
    if not (isinstance(recorded, dict) and set(recorded) == {"fields", "files"}
            and all(isinstance(recorded[k], dict) for k in recorded)):
        raise CheckpointError(f"{card_path}: front-matter key {CARD_KEY!r} = {show(recorded)} is not the record of a "
                              f"bundle (a mapping of 'fields' and 'files' to sha256 digests)")
    now = _card_binding(manifest)
    for key in _bound_keys(manifest, recorded["fields"]):
        if recorded["fields"].get(key) != now["fields"].get(key):
            raise CheckpointError(f"{path}: key {key!r} = {show(manifest.get(key))} is not what the model card "
                                  f"{card_path} (hashed in {BUNDLE}) records: {BUNDLE} was edited after the bundle "
                                  "was written")
    for name in sorted(set(recorded["files"]) | set(now["files"])):
        if recorded["files"].get(name) != now["files"].get(name):
            raise CheckpointError(f"{path}: key 'sha256' of {name!r} = {show(now['files'].get(name))} is not the "
                                  f"digest the model card {card_path} records: {name} was replaced and {BUNDLE} "
                                  "edited after the bundle was written")
    return None


def _check_older_card(path: str, card_path: str, manifest: Dict[str, Any], config_bytes: bytes,
                      card_bytes: bytes) -> None:
    """A card without `CARD_KEY` (written before cards recorded it): refused unless it is exactly the card
    `model_card` writes from the manifest's fields and ``config.json``, so that those fields are still covered by
    the card's hash."""
    try:
        card = model_card(json_loads(config_bytes.decode("utf-8")), manifest["label_names"], manifest["dataset"],
                          manifest["data_fingerprint"], manifest.get("metrics"), manifest.get("command"))
    except (KeyError, TypeError, AttributeError, ValueError):
        card = None
    if card is None or card.encode("utf-8") != card_bytes:
        raise CheckpointError(f"{card_path} is not the model card of {path}'s fields: its label names, dataset, data "
                              "fingerprint, metrics or command were edited after the bundle was written (the card, "
                              f"hashed in {BUNDLE}, says what they were)")


def _refuse_unbundled(folder: str, weights: str, state: Any, legacy: bool) -> None:
    """Refuse a folder without bundle.json unless ``legacy`` and it holds nothing only a bundle writes."""
    why = _legacy_problem(folder, weights, state)
    if why or not legacy:
        raise CheckpointError(f"{folder} has no {BUNDLE}, so nothing ties its weights to its config and vocabulary"
                              + (f"; and it is not a folder from before bundles: {why}" if why else
                                 "; a run folder from before bundles is read with legacy=True "
                                 "(unfold-predict --legacy), unverified"))


def _bundle_config(folder: str, manifest: Optional[Dict[str, Any]], version: int, config_path: str,
                   config_bytes: Optional[bytes]):
    """``(config, config to build on, graph bytes, edges)``: the validated config as written, and the one whose
    ``model.graph`` is the pinned graph's path (the same where no edge-list graph is pinned)."""
    from .config import load_config

    if version == 2:
        spec = _config_json_graph(config_bytes)
    else:
        if os.path.lexists(config_path):
            _open_regular(config_path).close()
        spec = _config_graph(config_path)
    graph_bytes = edges = graph_path = None
    if is_graph_file(spec):      # the graph is part of the model: its pinned copy, never the file named (docstring)
        graph_bytes, edges, graph_path = _pinned_graph(folder, manifest, spec)
    if version == 2:
        cfg = _read_config_json(config_bytes, config_path, graph_path)
    else:
        cfg = load_config(config_path, [f"model.graph={graph_path}"] if graph_path else [])
    build_cfg = cfg
    if graph_path:
        build_cfg, cfg = cfg, copy.deepcopy(cfg)
        cfg["model"]["graph"] = spec          # the config as written; the model is built on the pinned copy
    return cfg, build_cfg, graph_bytes, edges


def _checked_state(wpath: str, state: Any, cfg: Dict[str, Any], config_path: str) -> Dict[str, torch.Tensor]:
    """The state dict of a weights file's content, refused unless tensors under names, all finite, and (its own
    ``config``, where it stores one) trained under ``cfg``."""
    from .config import with_defaults

    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{wpath} holds no model state (a mapping under 'model')")
    _check_weights_fields(wpath, state)
    sd = state["model"]
    bad = [k for k, v in sd.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{wpath}: model[{show(bad[0])}] = {show(sd[bad[0]])} is not a tensor under a "
                              "parameter name")
    nonfinite = nonfinite_tensor(sd)
    if nonfinite:
        raise CheckpointError(f"{wpath}: model weight {nonfinite[0]!r} is not finite ({nonfinite[1]}): such a model "
                              "gives no meaningful prediction or verdict")
    own = state.get("config")
    if own is not None:
        if not isinstance(own, dict) or with_defaults(own) != cfg:
            raise CheckpointError(f"{wpath}: its own config (key 'config') is not {config_path}"
                                  "'s: the weights were trained under another config")
    return sd


def _check_task(folder: str, manifest: Optional[Dict[str, Any]], cfg: Dict[str, Any], config_path: str) -> None:
    """Refuse a bundle whose manifest's ``task`` (none: ``classify``) is not its config's ``task``, or whose task
    is not registered here (a plug-in's task: load its module first, ``--import``)."""
    from .tasks import TASKS

    task = cfg.get("task", "classify")
    if manifest is not None and _task_name(cfg) != manifest.get("task"):
        raise _key_error(os.path.join(folder, BUNDLE), "task", manifest.get("task"),
                         f"is not the task of {config_path} ({task!r}; a classifier's manifest has no task)")
    TASKS.check(task, " (a plug-in's task: import its module first)", CheckpointError)


def _bundle_labels(folder: str, manifest: Optional[Dict[str, Any]], version: int, cfg: Dict[str, Any]):
    """``(label names, data fingerprint, dataset, card metrics, command)`` from the manifest; a legacy folder's
    label names from its dataset, loaded again."""
    metrics = command = None
    if manifest is not None:
        label_names, fingerprint, dataset = list(manifest["label_names"]), manifest.get("data_fingerprint"), \
            manifest.get("dataset")
        metrics, command = (manifest.get("metrics"), manifest.get("command")) if version == 2 \
            else (_run_metrics(folder), None)
    else:                            # a run from before bundles: its label names come from its dataset
        from ..data import load_configured

        dc = cfg["data"]
        splits = load_configured(dc)
        label_names, fingerprint, dataset = list(splits.label_names), None, splits.name
    return label_names, fingerprint, dataset, metrics, command


def _built_model(wpath: str, config_path: str, sd: Dict[str, torch.Tensor], cfg: Dict[str, Any],
                 build_cfg: Dict[str, Any], vocab_size: int, label_names: List[str], edges) -> torch.nn.Module:
    """The model built from ``build_cfg`` (its ``task``'s model: a classifier, or a masked-token model) on the
    pinned graph with ``sd`` loaded, refused where a classifier's head's classes are not the label names or the
    weights do not fit the config."""
    from .build import build_model

    head = sd.get("head.weight")
    labelled = cfg.get("task", "classify") == "classify" or label_names    # else a token head: load_state_dict
    if labelled and (head is None or head.dim() != 2 or head.shape[0] != len(label_names)):
        raise CheckpointError(f"{wpath}: the head has {None if head is None else tuple(head.shape)[:1]} classes, the "
                              f"bundle names {len(label_names)}")
    embed = sd.get("embedding.embed.weight")
    glove = torch.zeros(tuple(embed.shape)) if embed is not None and cfg["data"]["glove"] != "none" else None
    model = pin(build_model(build_cfg, vocab_size, len(label_names), glove), edges)
    _check_dtypes(wpath, sd, model.state_dict())
    try:
        model.load_state_dict(sd)
    except RuntimeError as exc:
        raise CheckpointError(f"{wpath} does not fit {config_path} "
                              f"({' '.join(str(exc).split())[:300]})") from None
    return model


def _check_dtypes(wpath: str, sd: Dict[str, torch.Tensor], declared: Dict[str, torch.Tensor]) -> None:
    """Refuse a weight that is not floating point, or not of the dtype the model declares for it: loading would
    cast it silently (an integer or boolean tensor read as 0.0/1.0 weights predicts without a word of warning)."""
    for name, tensor in sd.items():
        want = declared.get(name)
        if want is None or tensor.dtype == want.dtype:
            continue            # a name the model does not have: load_state_dict names it
        kind = "not floating point" if not tensor.is_floating_point() else "not the model's dtype"
        raise CheckpointError(f"{wpath}: model weight {name!r} is {str(tensor.dtype).replace('torch.', '')} ({kind}): "
                              f"the model declares {str(want.dtype).replace('torch.', '')} for it, and a weight is "
                              "never cast on load")


def _run_metrics(folder: str) -> Optional[Dict[str, Any]]:
    """A format-1 run folder's test metrics for its card (:func:`_card_metrics` of ``metrics.json``), None where
    there is no readable one: the card is not part of the model, so a missing or broken file only leaves it out."""
    path = os.path.join(folder, "metrics.json")
    if not os.path.lexists(path):
        return None
    try:
        return _card_metrics(_read_json(path))
    except CheckpointError:
        return None


def _config_graph(path: str) -> Any:
    """``model.graph`` as ``config.yaml`` writes it (None where the file holds no such string: the config's own
    reading then says what is wrong)."""
    from ..runfolder.strict_yaml import load_yaml

    try:
        doc = read_document(path, load_yaml, CheckpointError, path, "YAML")
    except Exception:  # noqa: BLE001 -- reported by load_config, which reads the same file
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    spec = model.get("graph") if isinstance(model, dict) else None
    return spec if isinstance(spec, str) else None


def _pinned_graph(folder: str, manifest: Optional[Dict[str, Any]], spec: str):
    """``(bytes, edges, path)`` of the edge-list graph a bundle's model was trained on (module docstring): its
    copy ``graph.npy`` checked against the manifest's sha256; for a bundle without one, the file ``spec`` names,
    when it is there."""
    pinned = manifest.get("graph") if manifest is not None else None
    if pinned is not None:
        if pinned["spec"] != spec:
            raise CheckpointError(f"{os.path.join(folder, BUNDLE)}: key 'graph' names {pinned['spec']!r}, but "
                                  f"{os.path.join(folder, 'config.yaml')} has model.graph={spec!r}")
        path = os.path.join(folder, GRAPH_FILE)
        with _open_regular(path) as fh:       # hashed and parsed from one read: what was checked is what is used
            data = fh.read()
        if hashlib.sha256(data).hexdigest() != manifest["sha256"][GRAPH_FILE]:
            raise CheckpointError(f"{path} changed since {BUNDLE} was written (sha256 differs): it is the graph "
                                  f"the model was trained on (model.graph={spec!r}), which would no longer be")
        return data, parse_edges(data, path, CheckpointError), os.path.abspath(path)
    if not os.path.exists(spec):
        raise CheckpointError(f"{folder}: model.graph={spec!r} is an edge-list file, and this bundle holds no copy "
                              f"of it ({GRAPH_FILE}: written before bundles held their graph); the file is gone, so "
                              f"the graph the model was trained on is unknown: restore it at {spec!r} (then "
                              "load_model reads it, and save_model(model, NEW_FOLDER) writes a bundle holding it)")
    edges, data, _ = read_edges(spec, CheckpointError)
    return data, edges, None


def save_model(trained: TrainedModel, folder: str, overwrite: bool = False) -> str:
    """Write ``trained`` as a format-2 bundle in ``folder`` (`write_bundle`: ``model.safetensors``,
    ``config.json``, ``vocab.json``, ``graph.npy`` where used, ``README.md``, then ``bundle.json``). The whole
    bundle is written into a staging folder beside ``folder`` (``.NAME.overwrite``) and read back with
    `load_model`, its weights compared bit for bit; only then is it swapped in, in one atomic exchange of the two
    folders (`experiments.runfolder.runlock.Replacement`), and every name of the old folder that is not one of the
    new bundle's files (a run's checkpoints, metrics, logs, plots, someone else's files) moved back into it: a
    bundle replaces its own files only. A failure (a full disk, Ctrl-C) leaves ``folder`` as it was (a folder made
    for the bundle removed again) and no staging folder; a staging folder left by a killed save is finished or
    discarded by the next save into ``folder``. A model with a non-finite weight is refused before anything is
    written. A folder holding anything is refused unless ``overwrite``. Returns the folder."""
    from ..runfolder.runlock import Replacement, RunLock, folder_content, refuse_links

    folder = _path_arg(folder, "folder", "save_model", output=True)
    if os.path.islink(folder):      # the swap would move the link, not the folder it names
        raise CheckpointError(f"save_model: {folder!r} is a symbolic link; a bundle is never written through one: "
                              f"save to the folder it names ({os.path.realpath(folder)!r})")
    state = _state_to_save(trained, folder)
    _refuse_occupied(folder, overwrite)
    made = not os.path.lexists(folder)
    try:
        with RunLock(folder):
            refuse_links(folder)
            replacement = Replacement(folder, replaces=BUNDLE_FILES)
            replacement.recover()
            _refuse_occupied(folder, overwrite)     # under the lock: what a recovery installed counts too
            try:
                stage = replacement.begin()
                _write_read_back(trained, state, _graph_to_save(trained), stage, folder)
                replacement.replaces = tuple(folder_content(stage))    # the new bundle's files, nothing else
                replacement.commit()    # until this swap the folder is what it was, whole
            except BaseException:
                replacement.abort()
                raise
            finally:
                replacement.release()
    except BaseException:
        if made:
            _remove_if_only_lock(folder)
        raise
    return folder


def _remove_if_only_lock(folder: str) -> None:
    """Remove ``folder`` where it holds nothing but its lock file (made by a save that failed)."""
    try:
        if os.listdir(folder) == [".lock"] and not os.path.islink(os.path.join(folder, ".lock")):
            os.unlink(os.path.join(folder, ".lock"))
        os.rmdir(folder)
    except OSError:
        pass


def _path_arg(value: Any, name: str, where: str, output: bool = False) -> str:
    """``value`` as a path: a ``str`` or an ``os.PathLike`` naming one, without NUL characters; ``output``: also
    not empty and not ending in ``.`` or ``..`` (a folder to create must have a name of its own). Anything else is a
    `CheckpointError` naming the argument."""
    path = value
    if isinstance(value, os.PathLike):
        try:
            path = os.fspath(value)
        except Exception:  # noqa: BLE001 -- a broken __fspath__: refused below like any non-path
            path = None
    if not isinstance(path, str):
        raise CheckpointError(f"{where}: {name} must be a folder path (a str or os.PathLike), got "
                              f"{type(value).__name__} {show(value)}")
    if "\x00" in path:
        raise CheckpointError(f"{where}: {name} = {show(path)} contains a NUL character: not a path")
    if output and (not path.strip() or os.path.basename(os.path.normpath(path)) in ("", ".", "..")):
        raise CheckpointError(f"{where}: {name} = {path!r} does not name a new folder (empty, '.', '..' or the root): "
                              "name the folder to write")
    return path


def _state_to_save(trained: TrainedModel, folder: str) -> Dict[str, torch.Tensor]:
    """``trained``'s weights on the CPU, refused unless it is a :class:`TrainedModel` with finite weights."""
    if not isinstance(trained, TrainedModel):
        raise CheckpointError(f"save_model takes a TrainedModel (load_model's result), got {type(trained).__name__}")
    state = {k: v.detach().cpu() for k, v in trained.model.state_dict().items()}
    bad = nonfinite_tensor(state)
    if bad:
        raise CheckpointError(f"{folder}: not saved: model weight {bad[0]!r} is not finite ({bad[1]})")
    fp = trained.data_fingerprint
    if isinstance(fp, dict) and trained.vocab is not None:     # the bundle could not be loaded back
        from ..runfolder.fingerprint import mismatched_parts

        wrong = mismatched_parts(fp, list(trained.vocab.itos), [str(n) for n in trained.label_names],
                                 tokenizer=getattr(trained.vocab, "tokenizer_digest", None))
        if wrong:
            raise CheckpointError(f"{folder}: not saved: the model's data_fingerprint does not describe its own "
                                  f"{' and '.join(wrong)} (recomputed from them): the fingerprint belongs to "
                                  "other data")
    return state


def _refuse_occupied(folder: str, overwrite: bool) -> None:
    """Refuse a folder that holds anything, unless ``overwrite``."""
    from ..runfolder.runlock import folder_content

    names = folder_content(folder)
    if names and not overwrite:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        held = [n for n in names if n in (BUNDLE, SAFETENSORS, *WEIGHTS, "last.pt", "metrics.json")]
        raise CheckpointError(f"{folder} holds {'a model already' if held else 'files that are not a bundle'} "
                              f"({shown}); pass overwrite=True to replace it (the new bundle is written beside it "
                              "and swapped in once it reads back; files a bundle does not write are kept)")


def _graph_to_save(trained: TrainedModel) -> Optional[bytes]:
    """The bytes of ``trained``'s edge-list graph (a model built by hand: the file's graph now), None where
    ``model.graph`` is not an edge-list file."""
    spec = trained.config["model"]["graph"]
    graph = trained.graph_file
    if is_graph_file(spec) and graph is None:   # a model built by hand: the file's graph now
        graph = read_edges(spec, CheckpointError)[1]
    return graph if is_graph_file(spec) else None


def _write_read_back(trained: TrainedModel, state: Dict[str, torch.Tensor], graph: Optional[bytes], target: str,
                     folder: str) -> None:
    """Write the bundle into ``target`` (:func:`write_bundle`) and refuse it unless it reads back with the same
    weights bit for bit and the same graph."""
    write_bundle(target, state, trained.config, trained.vocab, trained.label_names,
                 trained.data_fingerprint, trained.dataset, graph, trained.metrics, trained.command)
    back = load_model(target, map_location=trained.device)
    sd, saved = back.model.state_dict(), trained.model.state_dict()
    same = sd.keys() == saved.keys() and all(torch.equal(sd[k].cpu(), saved[k].cpu()) for k in sd) \
        and back.graph_file == graph
    if not same:
        raise CheckpointError(f"{folder}: the bundle read back holds other weights than the model saved")


#: texts every conversion is checked on (besides the vocabulary's first words): the predictions and energies of
#: the converted bundle must equal the original's exactly
PROBES = ("", "good", "a text of several words that the model may or may not know", "zzzz-unknown-token")
CONVERT_CMD = "python -m experiments.app.bundle convert"


def convert(old: str, new: str, legacy: bool = False) -> str:
    """Write the model of the bundle ``old`` (any format `load_model` reads; ``legacy``: a run folder from
    before bundles) as a format-2 bundle at ``new``, which must not exist or be an empty folder. ``old`` is only
    read. The bundle is written into a staging folder beside ``new`` (``.NAME.<random>.convert``, locked while it
    is in use), read back, and checked -- the same weights bit for bit, and the same probabilities and per-layer
    energies as ``old``'s on probe texts -- before it is renamed to ``new``; on any failure or interruption the
    staging folder is removed and nothing is left at ``new``. A staging folder of ``new`` left by a killed
    conversion (its lock no longer held) is removed first. Returns ``new``."""
    old = _path_arg(old, "OLD", "convert")
    new = _path_arg(new, "NEW", "convert", output=True)
    src, dst = os.path.realpath(old), os.path.realpath(new)
    if dst == src or dst.startswith(src + os.sep):
        raise CheckpointError(f"convert: NEW {new!r} is {'OLD itself' if dst == src else 'inside OLD'} ({old!r}); "
                              "the old bundle is never changed: name a new folder outside it")
    if os.path.lexists(new) and (os.path.islink(new) or not os.path.isdir(new) or os.listdir(new)):
        raise CheckpointError(f"convert: {new!r} exists and is not an empty folder; name a new folder (nothing is "
                              "replaced)")
    trained = load_model(old, legacy=legacy)
    if trained.command is None:
        trained.command = f"{CONVERT_CMD} {shlex.quote(old)} {shlex.quote(new)}" + (" --legacy" if legacy else "")
    parent, base = os.path.split(os.path.abspath(new))
    os.makedirs(parent, exist_ok=True)
    _remove_stale_stages(parent, base)
    stage, lock = None, None
    try:
        while stage is None:           # named before it exists: an interruption from here on finds it below
            stage = os.path.join(parent, f".{base}.{secrets.token_hex(6)}{CONVERT_SUFFIX}")
            try:
                os.mkdir(stage, 0o700)
            except FileExistsError:    # someone else's (48 random bits): not ours to remove
                stage = None
        lock = _convert_lock(stage)
        _write_read_back(trained, _state_to_save(trained, new), _graph_to_save(trained), stage, new)
        _same_predictions(trained, load_model(stage), old)
        os.unlink(os.path.join(stage, ".lock"))    # still held through its descriptor until the rename is done
        os.chmod(stage, 0o755)         # the staging folder is private; a bundle is made to be shared
        if os.path.isdir(new):
            os.rmdir(new)              # empty (checked above)
        os.rename(stage, new)
        stage = None
    finally:
        if lock is not None:
            lock.release()
        if stage is not None and os.path.isdir(stage) and not os.path.islink(stage):
            shutil.rmtree(stage, ignore_errors=True)
    return new


#: the suffix of `convert`'s staging folders
CONVERT_SUFFIX = ".convert"


def _convert_lock(stage: str):
    """The run lock of a conversion's staging folder, held until the conversion ends: a staging folder whose lock
    is not held was left by a killed conversion (`_remove_stale_stages`)."""
    from ..runfolder.runlock import RunLock

    return RunLock(stage).acquire()


def _remove_stale_stages(parent: str, base: str) -> None:
    """Remove the staging folders of ``parent/base`` that killed conversions left: named as `convert` names them
    (or as it named them before: ``tempfile.mkdtemp``'s eight characters), real folders, holding a lock file that
    no process holds. A folder without a lock file may be a conversion that is just starting: it is left alone."""
    from ..runfolder.runlock import lock_owner

    pattern = re.compile(re.escape(f".{base}.") + r"(?:[0-9a-f]{12}|[a-z0-9_]{8})" + re.escape(CONVERT_SUFFIX))
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        if not pattern.fullmatch(name) or os.path.islink(path) or not os.path.isdir(path):
            continue
        owner = lock_owner(path)
        if owner is not None and not owner.held:
            shutil.rmtree(path, ignore_errors=True)


def _same_predictions(trained: TrainedModel, back: TrainedModel, old: str) -> None:
    """Refuse a converted bundle that does not predict as the original on the probe texts (probabilities,
    per-layer energies, verdicts), or whose label names or config differ. The probes are predicted without the
    warnings `TrainedModel.predict` gives for texts with no known word: they are this check's own texts."""
    probes = list(PROBES) + [" ".join(trained.vocab.itos[2:12])]
    a, b = _quiet_predictions(trained, probes), _quiet_predictions(back, probes)
    same = all(p.probabilities == q.probabilities and p.energies == q.energies and p.verdict == q.verdict
               for p, q in zip(a, b))
    if not same or back.label_names != trained.label_names or back.config != trained.config:
        raise CheckpointError(f"convert: the converted bundle does not predict as {old!r} does; nothing written")


def _quiet_predictions(model: TrainedModel, texts: List[str]) -> List[Prediction]:
    """`TrainedModel.predict` of ``texts`` as one batch, without its unknown-word warnings."""
    checker = model._energy_model()
    return model._predict_chunk(texts, checker, next(checker.parameters()).dtype, DEFAULT_TOL_FACTOR, None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m experiments.app.bundle convert OLD NEW [--legacy]``: :func:`convert`, printing what it wrote.
    Exit 0, or 2 with one ``error:`` line and nothing written."""
    from unfold.cli import run_main
    from unfold.plugins import add_import_arg

    p = argparse.ArgumentParser(prog=CONVERT_CMD.rsplit(" ", 1)[0],
                                description="Model bundles: convert a bundle to the current format "
                                            "(model.safetensors + config.json + model card).")
    add_import_arg(p)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="write OLD's model as a format-2 bundle at NEW (OLD is only read)")
    c.add_argument("old", metavar="OLD", help="a bundle of any format (a finished run folder, a saved bundle)")
    c.add_argument("new", metavar="NEW", help="the new bundle's folder (must not exist, or be empty)")
    c.add_argument("--legacy", action="store_true", help="OLD is a run folder from before bundles (no bundle.json)")
    args = p.parse_args(argv)

    def body() -> int:
        with _terminate_as_interrupt():     # a SIGTERM unwinds like Ctrl-C: the staging folder is removed
            out = convert(args.old, args.new, legacy=args.legacy)
        files = sorted(n for n in os.listdir(out) if not n.startswith("."))
        print(f"wrote {out}: {', '.join(files)} (format {VERSION}; {args.old} unchanged)")
        return 0
    return run_main(CONVERT_CMD.rsplit(" ", 1)[0], body, argv)


@contextlib.contextmanager
def _terminate_as_interrupt():
    """Within: SIGTERM raises KeyboardInterrupt (in the main thread), so that a conversion stopped by ``kill`` or a
    job scheduler cleans up as after Ctrl-C; the previous handler is restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":        # one module object: the home, not a second copy named __main__
    from experiments.app.bundle import main as _main

    sys.exit(_main())
