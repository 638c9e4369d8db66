"""Model bundles: everything needed to use a trained model, in one folder, loaded without executing code.

A bundle is a folder (a finished run folder is one) holding

* ``best.pt`` (a run's best epoch) or ``model.pt`` (:func:`save_model`): ``{"model": state_dict, ...}``;
* ``config.yaml``: the config the model was built from (:func:`experiments.app.build.build_model`);
* ``vocab.json``: the vocabulary, ids in order (:class:`experiments.data.Vocab`);
* ``graph.npy``, where ``model.graph`` is an edge-list file: the graph the model was trained on, copied when the
  run started (:mod:`experiments.app.graph_pin`). The graph is part of the model: the bundle predicts with this
  copy, checked against its sha256, never with the file ``model.graph`` names, which may since have been edited,
  moved or deleted;
* ``bundle.json``: the format version, the label names (class id -> name), the data fingerprint of the training
  data (:mod:`experiments.app.fingerprint`) and the sha256 of the files above.

:func:`load_model` checks the three hashes before it builds anything (a weights file replaced after the bundle
was written is refused, not silently paired with another vocabulary), loads the weights with
``torch.load(weights_only=True)`` (tensors and plain containers only) from the very file descriptor it hashed
(a file swapped between the check and the load is not read), and returns a :class:`TrainedModel`, whose
:meth:`~TrainedModel.predict` maps texts to label names, class probabilities and the per-layer energy with its
descent verdict.

**What is checked** (each a :class:`~energies.errors.CheckpointError` naming the file, the key and the value):
``bundle.json`` is a JSON object with exactly the keys ``format`` (this format's name), ``version`` (an
integer, this version), ``weights`` (``best.pt`` or ``model.pt``), ``label_names`` (at least two distinct
strings), ``dataset`` (a string or null), ``data_fingerprint`` (null or a fingerprint) and ``sha256`` (the
three files, and ``graph.npy`` where there is one, to 64-digit hex digests) and, optionally, ``graph`` (null, or
``{"spec": the config's model.graph, "file": "graph.npy"}``: present exactly where ``graph.npy`` is hashed);
JSON files are read strictly (:func:`unfold.strict_json.loads`: no NaN,
nesting at most 100 levels, so a ``[[[[...`` bomb is a one-line refusal, not a ``RecursionError``); every file
is a regular file (a symbolic link is followed, and what it points to is hashed and read like any file; a FIFO
or device is refused); every floating weight is finite (a NaN or inf weight is refused naming the parameter:
a model that cannot give a meaningful verdict is not loaded); the weights file's own ``config`` (``best.pt``
stores one) must be ``config.yaml``'s.

**A folder without bundle.json** is not verifiable: nothing ties its weights to its config and vocabulary, and
because ``bundle.json`` can be deleted, no file's presence or absence can prove that a folder predates bundles.
So such a folder is read only on request -- ``load_model(folder, legacy=True)``, ``unfold-predict --legacy``
-- and even then it is refused when it holds anything only this format writes, which would mean its
``bundle.json`` was removed: a ``model.pt`` (written by :func:`save_model` together with ``bundle.json``, and
marked with the bundle format), or a checksummed checkpoint (``last.pt``/``prev.pt`` with ``sha256``: written
by a trainer that ends every run with ``bundle.json``; an unfinished run is finished with ``--resume``, which
writes it). A legacy folder's label names come from its dataset, loaded again.

**An edge-list graph without its copy** (a bundle written before bundles held their graph, or a legacy folder):
nothing recorded what the file held, so it is read once from the path ``model.graph`` names, when it is there
and is a valid edge list for ``data.max_len``, and kept in memory from then on (:func:`save_model` writes a
bundle holding it); a file that is gone is refused, naming the path to restore it at.
"""
from __future__ import annotations

import copy
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from energies.errors import CheckpointError
from unfold.classifier import SequenceClassifier
from unfold.encoders import check_batch_size, check_inference_layers
from unfold.cli import read_document
from unfold.strict_json import dumps as json_dumps, load as json_load
from unfold.trace import DEFAULT_TOL_FACTOR, report_from_values

from .atomic import atomic_open, atomic_save
from .checkpoint import DIGEST, LAST, PREV, check_fingerprint, nonfinite_tensor, safe_load, show
from .graph_pin import GRAPH_FILE, is_graph_file, parse_edges, pin, read_edges, write_edges

__all__ = ["TrainedModel", "Prediction", "load_model", "save_model", "write_bundle_manifest", "BUNDLE",
           "FORMAT", "VERSION"]

BUNDLE = "bundle.json"
FORMAT, VERSION = "unfolded-transformers/bundle", 1
WEIGHTS = ("model.pt", "best.pt")
MANIFEST_KEYS = ("format", "version", "weights", "label_names", "dataset", "data_fingerprint", "sha256")
#: keys a manifest may hold besides :data:`MANIFEST_KEYS` (``graph``: the pinned edge-list graph, where there is one)
OPTIONAL_KEYS = ("graph",)
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


def write_bundle_manifest(folder: str, weights: str, label_names: Sequence[str],
                          fingerprint: Optional[Dict[str, Any]], dataset: Optional[str] = None,
                          graph: Optional[str] = None) -> str:
    """Write ``folder/bundle.json`` (atomic) for the files already in ``folder``; returns its path. ``graph``: the
    config's ``model.graph``; where it is an edge-list file, ``folder/graph.npy`` (its copy) must be there and is
    hashed with the others."""
    names = [str(n) for n in label_names]
    if len(names) < 2 or len(set(names)) != len(names):
        raise CheckpointError(f"a bundle needs at least two distinct label names, got {names!r}")
    files = (weights, "config.yaml", "vocab.json") + ((GRAPH_FILE,) if is_graph_file(graph) else ())
    manifest = {"format": FORMAT, "version": VERSION, "weights": weights, "label_names": names,
                "dataset": dataset, "data_fingerprint": fingerprint,
                "sha256": {name: _sha256(os.path.join(folder, name)) for name in files}}
    if is_graph_file(graph):
        manifest["graph"] = {"spec": graph, "file": GRAPH_FILE}
    path = os.path.join(folder, BUNDLE)
    with atomic_open(path, "w") as fh:
        fh.write(json_dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return path


@dataclass
class Prediction:
    """One text's prediction: label name and id, class probabilities, and the float64 energy at every layer
    boundary (``energies[t]`` = E(Y_t), t = 0..T; ``energy_terms`` per term) with the descent check's count of
    increases beyond tolerance, of non-finite steps, and its verdict (``non-finite`` as well when a probability
    is not finite: a NaN weight never reads as descent); ``tokens`` counted after truncation to ``data.max_len``
    (``truncated`` says whether the text was longer)."""

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

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class TrainedModel:
    """A trained classifier with what it takes to use it on text: config, vocabulary, label names;
    ``graph_file``: the bytes of its edge-list graph (``model.graph`` a ``.npy`` file), pinned in the model."""

    model: SequenceClassifier
    config: Dict[str, Any]
    vocab: Any
    label_names: List[str]
    data_fingerprint: Optional[Dict[str, Any]] = None
    dataset: Optional[str] = None
    graph_file: Optional[bytes] = None

    @classmethod
    def from_pretrained(cls, folder: str, map_location="cpu", legacy: bool = False) -> "TrainedModel":
        """:func:`load_model` (the Hugging Face spelling)."""
        return load_model(folder, map_location, legacy=legacy)

    def save_pretrained(self, folder: str) -> str:
        """:func:`save_model` (the Hugging Face spelling)."""
        return save_model(self, folder)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode(self, texts: Sequence[str]):
        """``(ids, mask, truncated)``: ``texts`` as the trainer encodes them (first ``data.max_len`` tokens), and
        whether each was longer (read off an encoding one token longer: each text is tokenised once)."""
        from ..data import encode

        max_len = self.config["data"]["max_len"]
        ids, mask, _ = encode([(t, 0) for t in texts], self.vocab, max_len + 1)
        truncated = mask[:, max_len] if mask.shape[1] > max_len else torch.zeros(len(texts), dtype=torch.bool)
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

    @torch.no_grad()
    def predict(self, texts: Sequence[str], batch_size: int = 64,
                tol_factor: float = DEFAULT_TOL_FACTOR, layers: Optional[int] = None) -> List[Prediction]:
        """One :class:`Prediction` per text: probabilities from the model as trained (its dtype, trace off), the
        energies from a copy in ``train.check_dtype`` (float64 by default) with the trace on, checked layer by
        layer with the project's tolerance rule (:func:`unfold.trace.report_from_values`). ``layers``: unroll the
        shared step that many times instead of the trained depth (weight-shared encoders only; else a
        :class:`~energies.errors.ConfigError` naming it, :func:`unfold.encoders.check_inference_layers`)."""
        layers = check_inference_layers(self.model.encoder, layers)
        batch_size = check_batch_size(batch_size)
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise CheckpointError(f"texts must be strings; text {bad[0]} is a {type(texts[bad[0]]).__name__}")
        out: List[Prediction] = []
        checker = self._energy_model()
        dtype = next(checker.parameters()).dtype
        for start in range(0, len(texts), batch_size):
            chunk = texts[start:start + batch_size]
            ids, mask, truncated = self._encode(chunk)
            probs = torch.softmax(self._logits(ids, mask, layers).double(), dim=-1).cpu()
            res = checker(ids, mask, trace=True, layers=layers)
            rep = report_from_values(res.energies, dtype, tol_factor=tol_factor, guaranteed=checker.encoder.guaranteed)
            totals = rep.totals.cpu()
            terms = {k: v.detach().double().cpu() for k, v in res.energies.items()}
            inc, nonfinite = rep.increases.sum(1).cpu(), rep.nonfinite.sum(1).cpu()
            lengths = mask.sum(1).cpu()
            for i, text in enumerate(chunk):
                k = int(probs[i].argmax())
                n_inc, n_bad = int(inc[i]), int(nonfinite[i]) + int((~torch.isfinite(probs[i])).any())
                ok = n_inc == 0 and n_bad == 0
                out.append(Prediction(
                    text=text, label=self.label_names[k], label_id=k,
                    probabilities={name: float(p) for name, p in zip(self.label_names, probs[i])},
                    energies=[float(v) for v in totals[i]],
                    energy_terms={name: [float(v) for v in vals[i]] for name, vals in terms.items()},
                    increases=n_inc, nonfinite=n_bad, descent=ok,
                    verdict="descent" if ok else ("non-finite" if n_bad else "increase"),
                    tokens=int(lengths[i]), truncated=bool(truncated[i])))
        return out


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
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path} is not a model bundle manifest: it must hold a JSON object (a mapping of "
                              f"keys), got a JSON {_json_type(manifest)}")
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise CheckpointError(f"{path} has no {missing[0]!r} (a manifest has the keys {list(MANIFEST_KEYS)})")
    unknown = sorted(k for k in manifest if k not in MANIFEST_KEYS + OPTIONAL_KEYS)
    if unknown:
        raise CheckpointError(f"{path}: key {unknown[0]!r} is not a manifest key (valid: "
                              f"{list(MANIFEST_KEYS + OPTIONAL_KEYS)})")
    if manifest["format"] != FORMAT or not isinstance(manifest["format"], str):
        raise _key_error(path, "format", manifest["format"], f"is not a model bundle manifest: expected {FORMAT!r}")
    version = manifest["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version != VERSION:
        raise _key_error(path, "version", version, f"is not a bundle version this code reads (the integer {VERSION})")
    if not isinstance(manifest["weights"], str) or manifest["weights"] not in WEIGHTS:
        raise _key_error(path, "weights", manifest["weights"], f"must be one of {list(WEIGHTS)}")
    names = manifest["label_names"]
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names) \
            or len(set(names)) != len(names):
        raise _key_error(path, "label_names", names, "must be at least two distinct strings")
    if manifest["dataset"] is not None and not isinstance(manifest["dataset"], str):
        raise _key_error(path, "dataset", manifest["dataset"], "must be a string or null")
    if manifest["data_fingerprint"] is not None:
        try:
            check_fingerprint(path, manifest["data_fingerprint"])
        except CheckpointError as exc:
            raise CheckpointError(str(exc).replace(f"{path}: data_fingerprint", f"{path}: key 'data_fingerprint'",
                                                   1)) from None
    graph = manifest.get("graph")
    if graph is not None and not (isinstance(graph, dict) and set(graph) == {"spec", "file"}
                                  and graph["file"] == GRAPH_FILE and is_graph_file(graph["spec"])):
        raise _key_error(path, "graph", graph, f"must be null or {{'spec': the edge-list file model.graph names, "
                                               f"'file': {GRAPH_FILE!r}}}")
    hashes = manifest["sha256"]
    files = {manifest["weights"], "config.yaml", "vocab.json"} | ({GRAPH_FILE} if graph is not None else set())
    if not isinstance(hashes, dict) or set(hashes) != files or not all(
            isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in hashes.values()):
        raise CheckpointError(f"{path}: key 'sha256' is wrong: sha256 must map exactly {sorted(files)} to 64-digit "
                              f"hex digests, got {show(hashes)}")
    return manifest


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
                        f"python -m experiments.train --resume {folder}, which writes {BUNDLE})")
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
    if "version" in state and (type(state["version"]) is not int or state["version"] != VERSION):
        raise _key_error(path, "version", state["version"], f"must be the integer {VERSION}")


def load_model(folder: str, map_location="cpu", legacy: bool = False) -> TrainedModel:
    """The :class:`TrainedModel` of a bundle (module docstring). Every problem (no such folder, a file missing,
    malformed or changed since the bundle was written, a non-finite weight, weights that do not fit the config)
    raises :class:`~energies.errors.CheckpointError` naming the file. ``legacy``: read a folder without
    ``bundle.json`` (a run from before bundles), under the module docstring's rule."""
    from .config import load_config, with_defaults
    from .build import build_model

    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder!r}: no such model folder (a finished run folder or a saved bundle)")
    manifest = _read_manifest(folder)
    if manifest is not None:
        weights = manifest["weights"]
        for name in ("config.yaml", "vocab.json"):
            path = os.path.join(folder, name)
            if _sha256(path) != manifest["sha256"][name]:
                raise CheckpointError(f"{path} changed since {BUNDLE} was written (sha256 differs): the weights, "
                                      "config and vocabulary would no longer belong together")
    else:
        weights = next((w for w in WEIGHTS if os.path.lexists(os.path.join(folder, w))), None)
        if weights is None:
            raise CheckpointError(f"{folder}: no {BUNDLE} and no weights ({' or '.join(WEIGHTS)}): not a model bundle")
    wpath = os.path.join(folder, weights)
    with _open_regular(wpath) as fh:      # hashed and loaded from one descriptor: what was checked is what is read
        if manifest is not None and _sha256_of(fh) != manifest["sha256"][weights]:
            raise CheckpointError(f"{wpath} changed since {BUNDLE} was written (sha256 differs): the weights, "
                                  "config and vocabulary would no longer belong together")
        fh.seek(0)
        state = safe_load(fh, map_location="cpu", name=wpath)
    if manifest is None:
        why = _legacy_problem(folder, weights, state)
        if why or not legacy:
            raise CheckpointError(f"{folder} has no {BUNDLE}, so nothing ties its weights to its config and vocabulary"
                                  + (f"; and it is not a folder from before bundles: {why}" if why else
                                     "; a run folder from before bundles is read with legacy=True "
                                     "(unfold-predict --legacy), unverified"))
    for name in ("config.yaml", "vocab.json"):
        if not os.path.lexists(os.path.join(folder, name)):
            raise CheckpointError(f"{os.path.join(folder, name)}: missing")
    if os.path.lexists(os.path.join(folder, "config.yaml")):
        _open_regular(os.path.join(folder, "config.yaml")).close()
    spec = _config_graph(os.path.join(folder, "config.yaml"))
    graph_bytes = edges = graph_path = None
    if is_graph_file(spec):      # the graph is part of the model: its pinned copy, never the file named (docstring)
        graph_bytes, edges, graph_path = _pinned_graph(folder, manifest, spec)
    cfg = load_config(os.path.join(folder, "config.yaml"), [f"model.graph={graph_path}"] if graph_path else [])
    build_cfg = cfg
    if graph_path:
        build_cfg, cfg = cfg, copy.deepcopy(cfg)
        cfg["model"]["graph"] = spec          # the config as written; the model is built on the pinned copy
    vocab = _read_vocab(os.path.join(folder, "vocab.json"))
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
            raise CheckpointError(f"{wpath}: its own config (key 'config') is not {os.path.join(folder, 'config.yaml')}"
                                  "'s: the weights were trained under another config")
    if manifest is not None:
        label_names, fingerprint, dataset = list(manifest["label_names"]), manifest.get("data_fingerprint"), \
            manifest.get("dataset")
    else:                            # a run from before bundles: its label names come from its dataset
        from ..data import load_configured

        dc = cfg["data"]
        splits = load_configured(dc)
        label_names, fingerprint, dataset = list(splits.label_names), None, splits.name
    head = sd.get("head.weight")
    if head is None or head.dim() != 2 or head.shape[0] != len(label_names):
        raise CheckpointError(f"{wpath}: the head has {None if head is None else tuple(head.shape)[:1]} classes, the "
                              f"bundle names {len(label_names)}")
    embed = sd.get("embedding.embed.weight")
    glove = torch.zeros(tuple(embed.shape)) if embed is not None and cfg["data"]["glove"] != "none" else None
    model = pin(build_model(build_cfg, len(vocab), len(label_names), glove), edges)
    try:
        model.load_state_dict(sd)
    except RuntimeError as exc:
        raise CheckpointError(f"{wpath} does not fit {os.path.join(folder, 'config.yaml')} "
                              f"({' '.join(str(exc).split())[:300]})") from None
    model = model.to(map_location).eval()
    return TrainedModel(model, cfg, vocab, label_names, fingerprint, dataset, graph_bytes)


def _config_graph(path: str) -> Any:
    """``model.graph`` as ``config.yaml`` writes it (None where the file holds no such string: the config's own
    reading then says what is wrong)."""
    from .strict_yaml import load_yaml

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
    """Write ``trained`` as a bundle in ``folder``: ``model.pt`` (the state dict, tensors only, marked with the
    bundle format and version), ``config.yaml``, ``vocab.json``, then ``bundle.json`` last, each atomically; the
    bundle is read back with :func:`load_model` and its weights compared bit for bit before this returns; on a
    difference ``bundle.json`` is removed again. A model with a non-finite weight is refused before anything is
    written (it could not be loaded back). A folder holding anything (a bundle, a run, someone else's files) is
    refused unless ``overwrite``; then the new bundle is written beside it and swapped in whole once it reads back
    (:class:`~experiments.app.runlock.Replacement`), files a bundle does not write kept. Returns the folder."""
    from .config import dump_config
    from .runlock import Replacement, RunLock, folder_content, refuse_links

    folder = os.fspath(folder)
    if not isinstance(trained, TrainedModel):
        raise CheckpointError(f"save_model takes a TrainedModel (load_model's result), got {type(trained).__name__}")
    state = {k: v.detach().cpu() for k, v in trained.model.state_dict().items()}
    bad = nonfinite_tensor(state)
    if bad:
        raise CheckpointError(f"{folder}: not saved: model weight {bad[0]!r} is not finite ({bad[1]})")
    names = folder_content(folder)
    if names and not overwrite:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        held = [n for n in names if n in (BUNDLE, *WEIGHTS, "last.pt", "metrics.json")]
        raise CheckpointError(f"{folder} holds {'a model already' if held else 'files that are not a bundle'} "
                              f"({shown}); pass overwrite=True to replace it (the new bundle is written beside it "
                              "and swapped in once it reads back; files a bundle does not write are kept)")
    with RunLock(folder):
        refuse_links(folder)
        replacement = Replacement(folder)
        replacement.recover()
        replacing = bool(folder_content(folder))
        target = replacement.begin() if replacing else folder
        manifest = None
        try:
            atomic_save({"model": state, "format": FORMAT, "version": VERSION}, os.path.join(target, "model.pt"))
            with atomic_open(os.path.join(target, "config.yaml"), "w") as fh:
                fh.write(dump_config(trained.config))
            trained.vocab.save(os.path.join(target, "vocab.json"))
            spec = trained.config["model"]["graph"]
            graph = trained.graph_file
            if is_graph_file(spec):       # the graph the model holds, else (a model built by hand) the file's now
                if graph is None:
                    graph = read_edges(spec, CheckpointError)[1]
                write_edges(graph, target)
            manifest = write_bundle_manifest(target, "model.pt", trained.label_names, trained.data_fingerprint,
                                             trained.dataset, graph=spec)
            back = load_model(target, map_location=trained.device)
            sd, saved = back.model.state_dict(), trained.model.state_dict()
            same = sd.keys() == saved.keys() and all(torch.equal(sd[k].cpu(), saved[k].cpu()) for k in sd) \
                and back.graph_file == (graph if is_graph_file(spec) else None)
            if not same:
                raise CheckpointError(f"{folder}: the bundle read back holds other weights than the model saved")
            if replacing:
                replacement.commit()    # the old folder is the old bundle, whole, until this swap
        except BaseException:
            if replacing:
                replacement.abort()
            elif manifest is not None and os.path.exists(manifest):
                os.unlink(manifest)     # not a bundle unless it reads back as the model saved
            raise
        finally:
            replacement.release()
    return folder
