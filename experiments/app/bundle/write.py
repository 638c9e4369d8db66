"""Writing a bundle: `write_bundle` (every file atomically, ``bundle.json`` last), `write_run_bundle` (what the
trainer calls last: its run folder made a bundle), `write_bundle_manifest` (``bundle.json`` for the files in a
folder) and `write_read_back` (a bundle written, then read back and compared before it counts).
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

import safetensors.torch
import torch

from energies.errors import CheckpointError
from unfold.strict_json import dumps as json_dumps

from ...runfolder.atomic import atomic_open
from ..checkpoint import nonfinite_tensor
from ..graph_pin import GRAPH_FILE, is_graph_file, write_edges
from .card import card_binding, model_card
from .format import (BUNDLE, CARD, CONFIG_JSON, CONFIG_YAML, FORMAT, META, SAFETENSORS, VOCAB_FILES, WEIGHTS,
                     card_metrics, task_name, vocab_file)
from .read import file_sha256, read_bundle

if TYPE_CHECKING:
    from .model import TrainedModel


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
    hashes = {name: file_sha256(os.path.join(folder, name)) for name in files if with_card or name != CARD}
    manifest = {"format": FORMAT, "version": version, "weights": weights, "label_names": names,
                "dataset": dataset, "data_fingerprint": fingerprint, "sha256": hashes}
    if is_graph_file(graph):
        manifest["graph"] = {"spec": graph, "file": GRAPH_FILE}
    if version == 2:
        manifest["metrics"], manifest["command"] = card_metrics(metrics), command
    if task is not None:
        manifest["task"] = task
    return manifest


def _write_manifest(folder: str, manifest: Dict[str, Any]) -> str:
    """``manifest`` written as ``folder/bundle.json`` (atomic); returns its path."""
    path = os.path.join(folder, BUNDLE)
    with atomic_open(path, "w") as fh:
        fh.write(json_dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return path


def _safetensors_bytes(state: Dict[str, torch.Tensor]) -> bytes:
    """``state`` as a safetensors file (every tensor its own contiguous CPU copy: safetensors refuses tensors that
    share memory), its metadata naming the bundle format and version (`META`)."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    return safetensors.torch.save(tensors, metadata=META)


def _write_bytes(data: bytes, path: str) -> None:
    """``data`` written to ``path`` atomically."""
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def _write_text(text: str, path: str) -> None:
    """``text`` written to ``path`` atomically."""
    with atomic_open(path, "w") as fh:
        fh.write(text)


def write_bundle(folder: str, state: Dict[str, torch.Tensor], config: Dict[str, Any], vocab: Any,
                 label_names: Sequence[str], fingerprint: Optional[Dict[str, Any]], dataset: Optional[str],
                 graph_file: Optional[bytes] = None, metrics: Optional[Dict[str, Any]] = None,
                 command: Optional[str] = None) -> str:
    """Write a format-2 bundle of ``state`` into ``folder`` (`experiments.app.bundle`), each file atomically,
    ``bundle.json`` last: ``model.safetensors``, ``config.json``, ``vocab.json`` or, for a subword tokenizer,
    ``tokenizer.json`` (``vocab``: the vocabulary or tokenizer; None: the one there is kept), ``graph.npy``
    (where ``model.graph`` is an edge-list file: ``graph_file``'s bytes; None: the copy there is kept),
    ``README.md`` (`model_card`). A non-finite weight is refused before anything is written. Returns the path of
    ``bundle.json``."""
    bad = nonfinite_tensor(state)
    if bad:
        raise CheckpointError(f"{folder}: not saved: model weight {bad[0]!r} is not finite ({bad[1]})")
    _write_bytes(_safetensors_bytes(state), os.path.join(folder, SAFETENSORS))
    _write_text(json_dumps(config, indent=1, ensure_ascii=False) + "\n", os.path.join(folder, CONFIG_JSON))
    vocab_name = vocab_file(config)
    if vocab is not None:
        if getattr(vocab, "file_name", VOCAB_FILES[0]) != vocab_name:
            raise CheckpointError(f"{folder}: not saved: config data.tokenizer={config['data'].get('tokenizer')!r} "
                                  f"is saved as {vocab_name}, and the model's vocabulary is a {type(vocab).__name__}")
        vocab.save(os.path.join(folder, vocab_name))
    spec = config["model"]["graph"]
    if is_graph_file(spec) and graph_file is not None:
        write_edges(graph_file, folder)
    carried = card_metrics(metrics)
    task = task_name(config)
    bound = _manifest(folder, SAFETENSORS, label_names, fingerprint, dataset, spec, carried, command, False,
                      vocab_file=vocab_name, task=task)
    card = model_card(config, label_names, dataset, fingerprint, carried, command, binding=card_binding(bound))
    _write_text(card, os.path.join(folder, CARD))
    return _write_manifest(folder, _manifest(folder, SAFETENSORS, label_names, fingerprint, dataset, spec,
                                             carried, command, vocab_file=vocab_name, task=task))


def write_run_bundle(run_dir: str, state: Dict[str, torch.Tensor], config: Dict[str, Any],
                     label_names: Sequence[str], fingerprint: Optional[Dict[str, Any]], dataset: Optional[str] = None,
                     metrics: Optional[Dict[str, Any]] = None) -> str:
    """Make a finished run folder a format-2 bundle (what the trainer calls last): the best epoch's weights
    ``state`` as ``model.safetensors``, ``config`` as ``config.json``, the card from ``metrics`` and the trainer's
    command (`trainer_command`), ``bundle.json`` last; ``vocab.json`` and ``graph.npy`` are the run's own.
    The bundle is read back (`read_bundle`) and its weights compared bit for bit before this returns; on a
    difference ``bundle.json`` is removed again. The checkpoints (``best.pt``, ``last.pt``) stay for ``--resume``.
    Returns the path of ``bundle.json``."""
    state = {k: v.detach().cpu() for k, v in state.items()}
    path = write_bundle(run_dir, state, config, None, label_names, fingerprint, dataset, metrics=metrics,
                        command=trainer_command())
    try:
        back = read_bundle(run_dir).model.state_dict()
        if back.keys() != state.keys() or not all(torch.equal(back[k].cpu(), state[k]) for k in state):
            raise CheckpointError(f"{run_dir}: the bundle read back holds other weights than the run's best epoch")
    except BaseException:
        if os.path.exists(path):
            os.unlink(path)        # not a bundle unless it reads back as the model trained
        raise
    return path


def write_read_back(trained: TrainedModel, state: Dict[str, torch.Tensor], graph: Optional[bytes], target: str,
                    folder: str) -> None:
    """Write ``trained`` (a `TrainedModel`: its config, vocabulary, label names, fingerprint, dataset, metrics
    and command) with the weights ``state`` and the graph bytes ``graph`` as a bundle into ``target``
    (`write_bundle`), and refuse it unless it reads back (`read_bundle`) with the same weights bit for bit and
    the same graph; ``folder``: the folder named in the refusal (where the bundle is going)."""
    write_bundle(target, state, trained.config, trained.vocab, trained.label_names,
                 trained.data_fingerprint, trained.dataset, graph, trained.metrics, trained.command)
    back = read_bundle(target, map_location=trained.device)
    sd, saved = back.model.state_dict(), trained.model.state_dict()
    same = sd.keys() == saved.keys() and all(torch.equal(sd[k].cpu(), saved[k].cpu()) for k in sd) \
        and back.graph_file == graph
    if not same:
        raise CheckpointError(f"{folder}: the bundle read back holds other weights than the model saved")
