"""Reading a bundle, every file checked before anything is built: `read_bundle` (what
`experiments.app.bundle.load_model` returns as a `TrainedModel`).

The hashes are checked before anything is built (a weights file replaced after the bundle was written is refused,
not silently paired with another vocabulary), and the weights are read from the very bytes that were hashed
(format 1: from the very file descriptor that was hashed; a file swapped between the check and the load is not
read).

**What is checked** (each a `CheckpointError` naming the file, the key and the value): ``bundle.json`` is a JSON
object with exactly the keys ``format`` (this format's name), ``version`` (an integer, 1 or 2), ``weights``
(format 2: ``model.safetensors``; format 1: ``best.pt`` or ``model.pt``), ``label_names`` (at least two distinct
strings), ``dataset`` (a string or null), ``data_fingerprint`` (null or a fingerprint) and ``sha256`` (exactly
the bundle's files -- format 2: weights, ``config.json``, ``vocab.json``, ``README.md``; format 1: weights,
``config.yaml``, ``vocab.json``; and ``graph.npy`` where there is one -- to 64-digit hex digests) and, optionally,
``graph`` (null, or ``{"spec": the config's model.graph, "file": "graph.npy"}``: present exactly where
``graph.npy`` is hashed) and, format 2 only, ``metrics`` (null or an object of numbers, booleans, strings or
nulls) and ``command`` (null or a string); JSON files are read strictly (`unfold.strict_json.loads`: no NaN,
nesting at most 100 levels, so a ``[[[[...`` bomb is a one-line refusal, not a ``RecursionError``); every file
is a regular file (a symbolic link is followed, and what it points to is hashed and read like any file; a FIFO
or device is refused); ``model.safetensors`` is a valid safetensors file whose metadata names this format, of
tensors only; every floating weight is finite (a NaN or inf weight is refused naming the parameter: a model that
cannot give a meaningful verdict is not loaded); every weight has the dtype the model declares for it (an
integer, boolean or other-precision tensor is refused naming it, never cast); format 1: the weights file's own
``config`` (``best.pt`` stores one) must be ``config.yaml``'s.

**The manifest's fields are verified too.** The data fingerprint is recomputed from what is loaded: its digests
of the vocabulary (tokens in id order) and of the label names must be those of ``vocab.json`` and ``label_names``
(swapped label names, or a reordered vocabulary with recomputed sha256, are refused naming the field). The model
card's record of every field and file (`experiments.app.bundle.card`) must be the manifest's: a field edited
without rewriting the card is refused naming it. A card written before cards recorded these digests must be
exactly the card of the manifest's fields. A forger who rewrites ``bundle.json``, the card and every digest
consistently is not detected: that would take a signature.

**A folder without bundle.json** is not verifiable: nothing ties its weights to its config and vocabulary, and
because ``bundle.json`` can be deleted, no file's presence or absence can prove that a folder predates bundles.
So such a folder is read only on request -- ``load_model(folder, legacy=True)``, ``unfold-predict --legacy``
-- and even then it is refused when it holds anything only a bundle format writes, which would mean its
``bundle.json`` was removed: a ``model.safetensors`` (only ever written with ``bundle.json``; refused even
without ``legacy``), a ``model.pt`` (written by format 1's ``save_model`` together with ``bundle.json``, and
marked with the bundle format), or a checksummed checkpoint (``last.pt``/``prev.pt`` with ``sha256``: written
by a trainer that ends every run with ``bundle.json``; an unfinished run is finished with ``--resume``, which
writes it). A legacy folder's label names come from its dataset, loaded again.

**An edge-list graph without its copy** (a bundle written before bundles held their graph, or a legacy folder):
nothing recorded what the file held, so it is read once from the path ``model.graph`` names, when it is there
and is a valid edge list for ``data.max_len``, and kept in memory from then on (``save_model`` writes a bundle
holding it); a file that is gone is refused, naming the path to restore it at.
"""
from __future__ import annotations

import copy
import hashlib
import os
import re
import stat
from typing import Any, Dict, List, NamedTuple, Optional

import safetensors.torch
import torch
from safetensors import SafetensorError

from energies.errors import CheckpointError
from unfold.documents import read_document
from unfold.strict_json import load as json_load, loads as json_loads

from ..checkpoint import DIGEST, LAST, PREV, check_fingerprint, nonfinite_tensor, safe_load, show
from ..graph_pin import GRAPH_FILE, is_graph_file, parse_edges, pin, read_edges
from .card import CARD_KEY, bound_keys, card_binding, model_card
from .format import (BUNDLE, CARD, CONFIG_JSON, CONFIG_YAML, FORMAT, META, MANIFEST_KEYS, OPTIONAL_KEYS,
                     OPTIONAL_KEYS_V2, SAFETENSORS, VERSIONS, VOCAB_FILES, WEIGHTS, WEIGHTS_KEYS, card_metrics,
                     card_value, task_name, vocab_file)

def file_sha256(path: str) -> str:
    """The sha256 of the file at ``path`` (hex), refused unless it is a regular file (`CheckpointError`)."""
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


def _manifest_vocab(manifest: Optional[Dict[str, Any]]) -> str:
    """The vocabulary's file a manifest hashes (``vocab.json`` where there is no manifest)."""
    hashes = manifest.get("sha256") if manifest is not None else None
    return VOCAB_FILES[1] if manifest is not None and manifest.get("version") == 2 and isinstance(hashes, dict) \
        and VOCAB_FILES[1] in hashes else VOCAB_FILES[0]


def _key_error(path: str, key: str, value: Any, rule: str) -> CheckpointError:
    """The refusal of a key of the file at ``path`` whose value breaks ``rule``."""
    return CheckpointError(f"{path}: key {key!r} = {show(value)} {rule}")


def _read_json(path: str) -> Any:
    """The JSON document at ``path`` (strict, depth-limited: `unfold.strict_json.loads`), through
    `unfold.documents.read_document`: any problem is one `CheckpointError` naming the file."""
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
            isinstance(k, str) and card_value(v) for k, v in metrics.items())):
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
    """The JSON name of ``x``'s type (``array``, ``string``, ...), for a refusal."""
    return {list: "array", str: "string", bool: "boolean", type(None): "null", int: "number",
            float: "number"}.get(type(x), type(x).__name__)


def _read_vocab(path: str):
    """``vocab.json`` as a `Vocab`: ``{"itos": [distinct strings, "<pad>", "<unk>"
    first]}``, every problem naming the file."""
    from ...data import DataError, Vocab

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
    from ...data import DataError
    from ...data.subword import SubwordTokenizer

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
    metadata checked to name this format. Any problem is a `CheckpointError` naming the file."""
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
    """``model.graph`` as ``config.json`` writes it (None where there is no such string: `_read_config_json`
    then says what is wrong)."""
    try:
        doc = json_loads(data.decode("utf-8"))
    except Exception:  # noqa: BLE001 -- reported by _read_config_json, which reads the same bytes
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    spec = model.get("graph") if isinstance(model, dict) else None
    return spec if isinstance(spec, str) else None


def _read_config_json(data: bytes, path: str, graph_path: Optional[str]) -> Dict[str, Any]:
    """``config.json``'s bytes as the validated config (`experiments.app.config.validate`, unknown keys
    refused naming them); ``graph_path``: the pinned graph's path put in ``model.graph`` (to build on)."""
    from ..config import DEFAULTS, merge_config, validate
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
        merge_config(cfg, doc, DEFAULTS, "")
        if graph_path:
            cfg["model"]["graph"] = graph_path
        validate(cfg)
    except ConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    return cfg


class BundleParts(NamedTuple):
    """What `read_bundle` reads from a bundle, in the order of `experiments.app.bundle.TrainedModel`'s fields."""

    model: torch.nn.Module
    config: Dict[str, Any]
    vocab: Any
    label_names: List[str]
    data_fingerprint: Optional[Dict[str, Any]]
    dataset: Optional[str]
    graph_file: Optional[bytes]
    metrics: Optional[Dict[str, Any]]
    command: Optional[str]


def read_bundle(folder: str, map_location="cpu", legacy: bool = False) -> BundleParts:
    """The model of the bundle in ``folder`` and what it takes to use it, every file checked (module docstring).
    Every problem (no such folder, a file missing, malformed or changed since the bundle was written, a non-finite
    weight, weights that do not fit the config) raises `CheckpointError` naming the file. ``legacy``: read a
    folder without ``bundle.json`` (a run from before bundles), under the module docstring's rule."""
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
    vocab = _bundle_vocab(folder, manifest, vocab_name, cfg, config_path)
    sd = _checked_state(wpath, state, cfg, config_path)
    label_names, fingerprint, dataset, metrics, command = _bundle_labels(folder, manifest, version, cfg)
    _check_task(folder, manifest, cfg, config_path)
    model = _built_model(wpath, config_path, sd, cfg, build_cfg, len(vocab), label_names, edges)
    if manifest is not None:          # the fields of bundle.json against what was loaded and what the card records
        _check_fingerprint_parts(folder, manifest, vocab, label_names)
        if version == 2:
            _check_card(folder, manifest, config_bytes, card_bytes)
    model = model.to(map_location).eval()
    return BundleParts(model, cfg, vocab, label_names, fingerprint, dataset, graph_bytes, metrics, command)


def _bundle_vocab(folder: str, manifest: Optional[Dict[str, Any]], vocab_name: str, cfg: Dict[str, Any],
                  config_path: str):
    """The bundle's vocabulary (``vocab.json``) or subword tokenizer (``tokenizer.json``), refused unless it is
    the kind the config's ``data.tokenizer`` saves."""
    vocab = _read_vocab(os.path.join(folder, "vocab.json")) if vocab_name == VOCAB_FILES[0] \
        else _read_tokenizer(os.path.join(folder, vocab_name), manifest)
    if vocab_name != vocab_file(cfg):
        raise CheckpointError(f"{os.path.join(folder, vocab_name)}: {config_path} has data.tokenizer="
                              f"{cfg['data']['tokenizer']!r}, whose vocabulary is saved as {vocab_file(cfg)}")
    return vocab


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
            if file_sha256(path) != manifest["sha256"][name]:
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
    from ...runfolder.fingerprint import mismatched_parts

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
    from ...runfolder.strict_yaml import load_yaml
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
    records (`card_binding`); a card written before cards recorded them must be the card of the manifest's
    fields, as `model_card` writes it (`_check_older_card`)."""
    path, card_path = os.path.join(folder, BUNDLE), os.path.join(folder, CARD)
    recorded = _card_front(card_bytes, card_path).get(CARD_KEY)
    if recorded is None:
        return _check_older_card(path, card_path, manifest, config_bytes, card_bytes)
    if not (isinstance(recorded, dict) and set(recorded) == {"fields", "files"}
            and all(isinstance(recorded[k], dict) for k in recorded)):
        raise CheckpointError(f"{card_path}: front-matter key {CARD_KEY!r} = {show(recorded)} is not the record of a "
                              f"bundle (a mapping of 'fields' and 'files' to sha256 digests)")
    now = card_binding(manifest)
    for key in bound_keys(manifest, recorded["fields"]):
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
                          manifest["data_fingerprint"], manifest.get("metrics"), manifest.get("command"),
                          names_checkpoint=False)    # such cards were written before cards named their checkpoint
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
    from ..config import load_config

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
    from ..config import with_defaults

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
    from ..tasks import TASKS

    task = cfg.get("task", "classify")
    if manifest is not None and task_name(cfg) != manifest.get("task"):
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
        from ...data import load_configured

        dc = cfg["data"]
        splits = load_configured(dc)
        label_names, fingerprint, dataset = list(splits.label_names), None, splits.name
    return label_names, fingerprint, dataset, metrics, command


def _built_model(wpath: str, config_path: str, sd: Dict[str, torch.Tensor], cfg: Dict[str, Any],
                 build_cfg: Dict[str, Any], vocab_size: int, label_names: List[str], edges) -> torch.nn.Module:
    """The model built from ``build_cfg`` (its ``task``'s model: a classifier, or a masked-token model) on the
    pinned graph with ``sd`` loaded, refused where a classifier's head's classes are not the label names or the
    weights do not fit the config."""
    from ..build import build_model

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
    """A format-1 run folder's test metrics for its card (`card_metrics` of ``metrics.json``), None where
    there is no readable one: the card is not part of the model, so a missing or broken file only leaves it out."""
    path = os.path.join(folder, "metrics.json")
    if not os.path.lexists(path):
        return None
    try:
        return card_metrics(_read_json(path))
    except CheckpointError:
        return None


def _config_graph(path: str) -> Any:
    """``model.graph`` as ``config.yaml`` writes it (None where the file holds no such string: the config's own
    reading then says what is wrong)."""
    from ...runfolder.strict_yaml import load_yaml

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
