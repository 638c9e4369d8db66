"""A trained model in use: `TrainedModel` (config, vocabulary, label names; `TrainedModel.predict` maps texts to
label names, class probabilities and the per-layer energy with its descent verdict, one `Prediction` per text),
`load_model` and `save_model`.

`TrainedModel` is a ``huggingface_hub`` ``ModelHubMixin``: ``TrainedModel.from_pretrained(folder)`` (a local
folder is read offline, with `load_model`; a Hub id is downloaded first, bundle files only),
``save_pretrained(folder)`` (`save_model`) and ``push_to_hub(repo_id)`` (the mixin's: a bundle written to a
temporary folder, uploaded).
"""
from __future__ import annotations

import copy
import itertools
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import torch
from huggingface_hub.hub_mixin import ModelHubMixin

from energies.errors import CheckpointError
from unfold.classifier import SequenceClassifier
from unfold.inputs import check_batch_size, check_inference_layers
from unfold.trace import DEFAULT_TOL_FACTOR, report_from_values

from ..checkpoint import nonfinite_tensor, show
from ..fill_mask import fill_mask_chunk
from ..graph_pin import is_graph_file, read_edges
from ..verdict import EnergyVerdict, unknown_words, verdict_fields
from .card import model_card
from .format import BUNDLE, BUNDLE_FILES, SAFETENSORS, WEIGHTS
from .read import read_bundle
from .write import write_read_back

#: the dtypes ``train.check_dtype`` names: the energy copy's, in which predictions check the descent
CHECK_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Prediction(EnergyVerdict):
    """One text's prediction: label name and id, class probabilities, then the energy verdict of its forward pass
    (`experiments.app.verdict.EnergyVerdict`). When every token is unknown (`prior_only`) the text tells the model
    nothing: the prediction is the model's prior."""

    text: str
    label: str
    label_id: int
    probabilities: Dict[str, float]

    @property
    def prior_only(self) -> bool:
        """No token of the text is in the vocabulary: the prediction is the model's prior, not a reading."""
        return self.unknown_tokens >= self.tokens


#: texts with no known token warned about one by one per predict call; the rest are counted in one last line
PRIOR_WARNINGS = 10


#: a Hugging Face Hub model id (``owner/name``): what from_pretrained downloads when no such local folder exists
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


@dataclass
class TrainedModel(ModelHubMixin, library_name="unfolded-transformers", pipeline_tag="text-classification",
                   tags=["unfolded-transformer", "energy-based", "text-classification"]):
    """A trained classifier with what it takes to use it on text: config, vocabulary, label names;
    ``graph_file``: the bytes of its edge-list graph (``model.graph`` a ``.npy`` file), pinned in the model;
    ``metrics`` and ``command``: what its model card says (test metrics and descent verdict; the command that
    made it), None where unknown.

    A ``huggingface_hub`` `ModelHubMixin` whose loading and saving are this module's:
    `from_pretrained` reads a local folder with `load_model` (offline, every check, no code run) and
    `save_pretrained` writes with `save_model` (atomic, read back before it returns); the mixin's own
    ``push_to_hub`` uploads what `save_pretrained` writes. The mixin's generic paths are overridden because
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
        """The model of a bundle: a local folder (any format `load_model` reads; offline, nothing executed),
        or, where no such folder exists and the name is a Hub id (``owner/name``), the bundle files of that Hub
        repository (`BUNDLE_FILES`, never a ``.pt`` file) downloaded, then read by `load_model`."""
        model_id = path_arg(pretrained_model_name_or_path, "pretrained_model_name_or_path", "from_pretrained")
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
        """`save_model` (the Hugging Face spelling): a format-2 bundle in ``save_directory``; with
        ``push_to_hub``, then uploaded by the mixin's ``push_to_hub`` (returns the commit's URL; else the folder).
        ``config``: the model's own config or None (a bundle's config is the model's); ``model_card_kwargs`` are
        refused (the card is written from the bundle, `model_card`)."""
        if config is not None and config != self.config:
            raise CheckpointError("save_pretrained: config must be None or the model's own: a bundle's config.json "
                                  "is the config its model was built from")
        if model_card_kwargs:
            raise CheckpointError(f"save_pretrained: model_card_kwargs {sorted(model_card_kwargs)} are not used: the "
                                  "card is written from the bundle's metrics, verdict and config")
        folder = save_model(self, path_arg(save_directory, "save_directory", "save_pretrained", output=True),
                            overwrite=overwrite)
        if push_to_hub:
            return self.push_to_hub(repo_id or os.path.basename(os.path.abspath(folder)), **push_to_hub_kwargs)
        return folder

    def _save_pretrained(self, save_directory) -> None:
        """The mixin's hook: the bundle written into ``save_directory`` (replacing what a bundle writes there)."""
        save_model(self, os.fspath(save_directory), overwrite=True)

    def generate_model_card(self, *args, **kwargs):
        """The bundle's card (`model_card`) as a ``huggingface_hub`` ``ModelCard``."""
        from huggingface_hub import ModelCard

        return ModelCard(model_card(self.config, self.label_names, self.dataset, self.data_fingerprint,
                                    self.metrics, self.command))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _encode(self, texts: Sequence[str], tokens: Optional[list] = None):
        """``(ids, mask, truncated)``: ``texts`` as the trainer encodes them (first ``data.max_len`` tokens), and
        whether each was longer (read off an encoding one token longer: each text is tokenised once).
        ``tokens``: a list receiving each text's kept token strings (`experiments.data.text.encode`)."""
        from ...data import encode

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
        """One `Prediction` per text: probabilities from the model as trained (its dtype, trace off), the
        energies from a copy in ``train.check_dtype`` (float64 by default) with the trace on, checked layer by
        layer with the project's tolerance rule (`unfold.trace.report_from_values`). ``layers``: unroll the
        shared step that many times instead of the trained depth (weight-shared encoders only; else a
        `ConfigError` naming it, `unfold.inputs.check_inference_layers`).

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
        """`predict` as a stream: ``texts`` (any iterable, read lazily) taken ``batch_size`` at a time, each
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
        batch by batch as `predict` computes them (one energy copy of the model for the whole stream). A
        text with no token in the vocabulary is warned about on the ``experiments.app.predict`` logger (stderr by
        default): the first `PRIOR_WARNINGS` one by one, then one line counting the others at the end."""
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
        """The `Prediction` of each text of one non-empty batch (``checker``: the energy copy, ``dtype``)."""
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
            n_bad = int(nonfinite[i]) + int((~torch.isfinite(probs[i])).any())
            out.append(Prediction(
                text=text, label=self.label_names[k], label_id=k,
                probabilities={name: float(p) for name, p in zip(self.label_names, probs[i])},
                **verdict_fields(totals[i], {name: vals[i] for name, vals in terms.items()}, int(inc[i]), n_bad,
                                 int(lengths[i]), bool(truncated[i]), int(unknown[i]),
                                 unknown_words(kept[i], unknown_at[i]))))
        return out


def _prior_warning(number: int, pred: Prediction) -> str:
    """The warning for a text none of whose tokens the model knows (number: its place in the input, from 1)."""
    text = " ".join(pred.text.split())
    shown = text if len(text) <= 60 else text[:59] + "…"
    what = (f"none of its {pred.tokens} token(s) is in the model's vocabulary ({', '.join(pred.unknown_words)})"
            if pred.unknown_words else "it has no token at all (read as one unknown token)")
    return f"text {number} {shown!r}: {what}: the prediction {pred.label!r} is the model's prior, not a reading of it"


def load_model(folder: str, map_location="cpu", legacy: bool = False) -> TrainedModel:
    """The `TrainedModel` of the bundle in ``folder``, every file checked before anything is built
    (`experiments.app.bundle.read`). Every problem (no such folder, a file missing, malformed or changed since the
    bundle was written, a non-finite weight, weights that do not fit the config) raises `CheckpointError` naming
    the file. ``legacy``: read a folder without ``bundle.json`` (a run from before bundles), unverified, under the
    rule of `experiments.app.bundle.read`."""
    return TrainedModel(*read_bundle(path_arg(folder, "folder", "load_model"), map_location, legacy))


def quiet_predictions(model: TrainedModel, texts: List[str]) -> List[Prediction]:
    """`TrainedModel.predict` of ``texts`` as one batch, without its unknown-word warnings: the predictions a
    check makes on texts of its own (`experiments.app.bundle.convert`'s probe texts), which are no user's input."""
    checker = model._energy_model()
    return model._predict_chunk(texts, checker, next(checker.parameters()).dtype, DEFAULT_TOL_FACTOR, None)


def save_model(trained: TrainedModel, folder: str, overwrite: bool = False) -> str:
    """Write ``trained`` as a format-2 bundle in ``folder`` (`write_bundle`: ``model.safetensors``,
    ``config.json``, ``vocab.json``, ``graph.npy`` where used, ``README.md``, then ``bundle.json``). The whole
    bundle is written into a staging folder beside ``folder`` (``.NAME.overwrite``) and read back
    (`write_read_back`), its weights compared bit for bit; only then is it swapped in, in one atomic exchange of the two
    folders (`experiments.runfolder.runlock.Replacement`), and every name of the old folder that is not one of the
    new bundle's files (a run's checkpoints, metrics, logs, plots, someone else's files) moved back into it: a
    bundle replaces its own files only. A failure (a full disk, Ctrl-C) leaves ``folder`` as it was (a folder made
    for the bundle removed again) and no staging folder; a staging folder left by a killed save is finished or
    discarded by the next save into ``folder``. A model with a non-finite weight is refused before anything is
    written. A folder holding anything is refused unless ``overwrite``. Returns the folder."""
    from ...runfolder.runlock import Replacement, RunLock, folder_content, refuse_links

    folder = path_arg(folder, "folder", "save_model", output=True)
    if os.path.islink(folder):      # the swap would move the link, not the folder it names
        raise CheckpointError(f"save_model: {folder!r} is a symbolic link; a bundle is never written through one: "
                              f"save to the folder it names ({os.path.realpath(folder)!r})")
    state = state_to_save(trained, folder)
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
                write_read_back(trained, state, graph_to_save(trained), stage, folder)
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


def path_arg(value: Any, name: str, where: str, output: bool = False) -> str:
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


def state_to_save(trained: TrainedModel, folder: str) -> Dict[str, torch.Tensor]:
    """``trained``'s weights on the CPU, refused unless it is a `TrainedModel` with finite weights."""
    if not isinstance(trained, TrainedModel):
        raise CheckpointError(f"save_model takes a TrainedModel (load_model's result), got {type(trained).__name__}")
    state = {k: v.detach().cpu() for k, v in trained.model.state_dict().items()}
    bad = nonfinite_tensor(state)
    if bad:
        raise CheckpointError(f"{folder}: not saved: model weight {bad[0]!r} is not finite ({bad[1]})")
    fp = trained.data_fingerprint
    if isinstance(fp, dict) and trained.vocab is not None:     # the bundle could not be loaded back
        from ...runfolder.fingerprint import mismatched_parts

        wrong = mismatched_parts(fp, list(trained.vocab.itos), [str(n) for n in trained.label_names],
                                 tokenizer=getattr(trained.vocab, "tokenizer_digest", None))
        if wrong:
            raise CheckpointError(f"{folder}: not saved: the model's data_fingerprint does not describe its own "
                                  f"{' and '.join(wrong)} (recomputed from them): the fingerprint belongs to "
                                  "other data")
    return state


def _refuse_occupied(folder: str, overwrite: bool) -> None:
    """Refuse a folder that holds anything, unless ``overwrite``."""
    from ...runfolder.runlock import folder_content

    names = folder_content(folder)
    if names and not overwrite:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        held = [n for n in names if n in (BUNDLE, SAFETENSORS, *WEIGHTS, "last.pt", "metrics.json")]
        raise CheckpointError(f"{folder} holds {'a model already' if held else 'files that are not a bundle'} "
                              f"({shown}); pass overwrite=True to replace it (the new bundle is written beside it "
                              "and swapped in once it reads back; files a bundle does not write are kept)")


def graph_to_save(trained: TrainedModel) -> Optional[bytes]:
    """The bytes of ``trained``'s edge-list graph (a model built by hand: the file's graph now), None where
    ``model.graph`` is not an edge-list file."""
    spec = trained.config["model"]["graph"]
    graph = trained.graph_file
    if is_graph_file(spec) and graph is None:   # a model built by hand: the file's graph now
        graph = read_edges(spec, CheckpointError)[1]
    return graph if is_graph_file(spec) else None
