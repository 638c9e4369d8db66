"""Model bundles: everything needed to use a trained model, in one folder, loaded without executing code.

A bundle is a folder (a finished run folder is one) holding

* ``best.pt`` (a run's best epoch) or ``model.pt`` (:func:`save_model`): ``{"model": state_dict, ...}``;
* ``config.yaml``: the config the model was built from (:func:`experiments.train.build_model`);
* ``vocab.json``: the vocabulary, ids in order (:class:`experiments.data.Vocab`);
* ``bundle.json``: the format version, the label names (class id -> name), the data fingerprint of the training
  data (:mod:`experiments.fingerprint`) and the sha256 of the three files above.

:func:`load_model` checks the three hashes before it builds anything (a weights file replaced after the bundle
was written is refused, not silently paired with another vocabulary), loads the weights with
``torch.load(weights_only=True)`` (tensors and plain containers only) and returns a :class:`TrainedModel`,
whose :meth:`~TrainedModel.predict` maps texts to label names, class probabilities and the per-layer energy
with its descent verdict. A run folder written before bundles existed (no ``bundle.json``) is read too: its
label names come from its dataset, loaded again.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from energies.errors import CheckpointError
from unfold.classifier import SequenceClassifier
from unfold.strict_json import dumps as json_dumps
from unfold.trace import DEFAULT_TOL_FACTOR, report_from_values

from .atomic import atomic_open
from .checkpoint import safe_load

__all__ = ["TrainedModel", "Prediction", "load_model", "save_model", "write_bundle_manifest", "BUNDLE",
           "FORMAT", "VERSION"]

BUNDLE = "bundle.json"
FORMAT, VERSION = "unfolded-transformers/bundle", 1
WEIGHTS = ("model.pt", "best.pt")
CHECK_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_bundle_manifest(folder: str, weights: str, label_names: Sequence[str],
                          fingerprint: Optional[Dict[str, Any]], dataset: Optional[str] = None) -> str:
    """Write ``folder/bundle.json`` (atomic) for the files already in ``folder``; returns its path."""
    names = [str(n) for n in label_names]
    if len(names) < 2 or len(set(names)) != len(names):
        raise CheckpointError(f"a bundle needs at least two distinct label names, got {names!r}")
    manifest = {"format": FORMAT, "version": VERSION, "weights": weights, "label_names": names,
                "dataset": dataset, "data_fingerprint": fingerprint,
                "sha256": {name: _sha256(os.path.join(folder, name)) for name in (weights, "config.yaml", "vocab.json")}}
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
    """A trained classifier with what it takes to use it on text: config, vocabulary, label names."""

    model: SequenceClassifier
    config: Dict[str, Any]
    vocab: Any
    label_names: List[str]
    data_fingerprint: Optional[Dict[str, Any]] = None
    dataset: Optional[str] = None

    @classmethod
    def from_pretrained(cls, folder: str, map_location="cpu") -> "TrainedModel":
        """:func:`load_model` (the Hugging Face spelling)."""
        return load_model(folder, map_location)

    def save_pretrained(self, folder: str) -> str:
        """:func:`save_model` (the Hugging Face spelling)."""
        return save_model(self, folder)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode(self, texts: Sequence[str]):
        """``(ids, mask, truncated)``: ``texts`` as the trainer encodes them (first ``data.max_len`` tokens), and
        whether each was longer (read off an encoding one token longer: each text is tokenised once)."""
        from .data import encode

        max_len = self.config["data"]["max_len"]
        ids, mask, _ = encode([(t, 0) for t in texts], self.vocab, max_len + 1)
        truncated = mask[:, max_len] if mask.shape[1] > max_len else torch.zeros(len(texts), dtype=torch.bool)
        return ids[:, :max_len].to(self.device), mask[:, :max_len].to(self.device), truncated

    def encode(self, texts: Sequence[str]):
        """``(ids, mask)`` of ``texts`` as the trainer encodes them (first ``data.max_len`` tokens)."""
        return self._encode(texts)[:2]

    @torch.no_grad()
    def _logits(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        return self.model(ids, mask, trace=False).logits

    def logits(self, texts: Sequence[str]) -> torch.Tensor:
        """The model's logits ``(N, K)`` for ``texts`` (eval mode, trace off, the model's own dtype)."""
        return self._logits(*self.encode(texts))

    def _energy_model(self) -> SequenceClassifier:
        """A copy of the model as it is now (weights, device) in ``train.check_dtype``: made per call, so that
        weights changed in place are never checked through a stale copy."""
        return copy.deepcopy(self.model).to(CHECK_DTYPES[self.config["train"]["check_dtype"]]).eval()

    @torch.no_grad()
    def predict(self, texts: Sequence[str], batch_size: int = 64,
                tol_factor: float = DEFAULT_TOL_FACTOR) -> List[Prediction]:
        """One :class:`Prediction` per text: probabilities from the model as trained (its dtype, trace off), the
        energies from a copy in ``train.check_dtype`` (float64 by default) with the trace on, checked layer by
        layer with the project's tolerance rule (:func:`unfold.trace.report_from_values`)."""
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
            probs = torch.softmax(self._logits(ids, mask).double(), dim=-1).cpu()
            res = checker(ids, mask, trace=True)
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


def _read_manifest(folder: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(folder, BUNDLE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a model bundle manifest (format {manifest.get('format')!r} "
                              f"if a mapping), expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{path} has bundle version {manifest.get('version')!r}; this version reads {VERSION}")
    for key in ("weights", "label_names", "sha256"):
        if key not in manifest:
            raise CheckpointError(f"{path} has no {key!r}")
    if manifest["weights"] not in WEIGHTS:
        raise CheckpointError(f"{path}: weights {manifest['weights']!r} must be one of {list(WEIGHTS)}")
    names = manifest["label_names"]
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) for n in names) \
            or len(set(names)) != len(names):
        raise CheckpointError(f"{path}: label_names must be at least two distinct strings, got {names!r:.200}")
    hashes, files = manifest["sha256"], {manifest["weights"], "config.yaml", "vocab.json"}
    if not isinstance(hashes, dict) or set(hashes) != files or not all(
            isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) for v in hashes.values()):
        raise CheckpointError(f"{path}: sha256 must map exactly {sorted(files)} to 64-digit hex digests, got "
                              f"{hashes!r:.200}")
    return manifest


def load_model(folder: str, map_location="cpu") -> TrainedModel:
    """The :class:`TrainedModel` of a bundle or run folder (module docstring). Every problem (no such folder, a
    file missing or changed since the bundle was written, weights that do not fit the config) raises
    :class:`~energies.errors.CheckpointError` naming the file."""
    from .config import load_config
    from .data import Vocab
    from .train import build_model

    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CheckpointError(f"{folder!r}: no such model folder (a finished run folder or a saved bundle)")
    manifest = _read_manifest(folder)
    if manifest is not None:
        for name, digest in manifest["sha256"].items():
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                raise CheckpointError(f"{path}: missing (listed in {BUNDLE})")
            if _sha256(path) != digest:
                raise CheckpointError(f"{path} changed since {BUNDLE} was written (sha256 differs): the weights, "
                                      "config and vocabulary would no longer belong together")
        weights = manifest["weights"]
    else:
        weights = next((w for w in WEIGHTS if os.path.isfile(os.path.join(folder, w))), None)
        if weights is None:
            raise CheckpointError(f"{folder}: no {BUNDLE} and no weights ({' or '.join(WEIGHTS)}): the run has not "
                                  "finished an epoch")
    for name in ("config.yaml", "vocab.json"):
        if not os.path.isfile(os.path.join(folder, name)):
            raise CheckpointError(f"{os.path.join(folder, name)}: missing")
    cfg = load_config(os.path.join(folder, "config.yaml"))
    vocab = Vocab.load(os.path.join(folder, "vocab.json"))
    state = safe_load(os.path.join(folder, weights), map_location="cpu")
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{os.path.join(folder, weights)} holds no model state")
    sd = state["model"]
    if manifest is not None:
        label_names, fingerprint, dataset = list(manifest["label_names"]), manifest.get("data_fingerprint"), \
            manifest.get("dataset")
    else:                            # a run from before bundles: its label names come from its dataset
        from .data import load_dataset

        dc = cfg["data"]
        splits = load_dataset(dc["dataset"], seed=dc["seed"], data_dir=dc["data_dir"], text_field=dc["text_field"],
                              label_field=dc["label_field"], splits=dc["splits"])
        label_names, fingerprint, dataset = list(splits.label_names), None, splits.name
    head = sd.get("head.weight")
    if head is None or head.shape[0] != len(label_names):
        raise CheckpointError(f"{os.path.join(folder, weights)}: the head has "
                              f"{None if head is None else head.shape[0]} classes, the bundle names {len(label_names)}")
    embed = sd.get("embedding.embed.weight")
    glove = torch.zeros(tuple(embed.shape)) if embed is not None and cfg["data"]["glove"] != "none" else None
    model = build_model(cfg, len(vocab), len(label_names), glove)
    try:
        model.load_state_dict(sd)
    except RuntimeError as exc:
        raise CheckpointError(f"{os.path.join(folder, weights)} does not fit {os.path.join(folder, 'config.yaml')} "
                              f"({' '.join(str(exc).split())[:300]})") from None
    model = model.to(map_location).eval()
    return TrainedModel(model, cfg, vocab, label_names, fingerprint, dataset)


def save_model(trained: TrainedModel, folder: str, overwrite: bool = False) -> str:
    """Write ``trained`` as a bundle in ``folder``: ``model.pt`` (the state dict, tensors only), ``config.yaml``,
    ``vocab.json``, then ``bundle.json`` last, each atomically; the bundle is read back with :func:`load_model`
    and its weights compared bit for bit (NaN where NaN) before this returns; on a difference ``bundle.json`` is
    removed again. A folder holding a bundle or run already is refused unless
    ``overwrite``. Returns the folder."""
    from .config import dump_config
    from .runlock import RUN_FILES

    folder = os.fspath(folder)
    if not isinstance(trained, TrainedModel):
        raise CheckpointError(f"save_model takes a TrainedModel (load_model's result), got {type(trained).__name__}")
    taken = [n for n in (BUNDLE, "model.pt", *RUN_FILES) if os.path.exists(os.path.join(folder, n))]
    if taken and not overwrite:
        raise CheckpointError(f"{folder} holds a model already ({', '.join(taken)}); pass overwrite=True to replace it")
    os.makedirs(folder, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in trained.model.state_dict().items()}
    with atomic_open(os.path.join(folder, "model.pt")) as fh:
        torch.save({"model": state}, fh)
    with atomic_open(os.path.join(folder, "config.yaml"), "w") as fh:
        fh.write(dump_config(trained.config))
    trained.vocab.save(os.path.join(folder, "vocab.json"))
    manifest = write_bundle_manifest(folder, "model.pt", trained.label_names, trained.data_fingerprint,
                                     trained.dataset)
    try:
        back = load_model(folder, map_location=trained.device)
        sd, saved = back.model.state_dict(), trained.model.state_dict()
        same = sd.keys() == saved.keys() and all(torch.equal(sd[k].cpu(), saved[k].cpu()) or (
            sd[k].is_floating_point() and torch.allclose(sd[k].cpu(), saved[k].cpu(), rtol=0, atol=0, equal_nan=True))
            for k in sd)
        if not same:
            raise CheckpointError(f"{folder}: the bundle read back holds other weights than the model saved")
    except BaseException:
        os.unlink(manifest)             # not a bundle unless it reads back as the model saved
        raise
    return folder

