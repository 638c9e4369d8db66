"""A model and its data built from a config: the one place both training (`experiments.app.train`) and model
bundles (`experiments.app.bundle`) build from, so that neither imports the other for it.

* `build_model`: the classifier a config describes, composed from the library's registries (embedding, the
  encoder registered as ``model.mode``, a linear head), the library's errors renamed to config keys;
* `check_buildable`: the same on the meta device, every model-level rule checked before any data is read;
* `build_data`, `train_examples`: the splits, vocabulary, encoded tensors and GloVe matrix a run
  trains on; `fingerprint`: their data fingerprint (`experiments.runfolder.fingerprint`);
* `build_tokenizer`: the word vocabulary or subword tokenizer ``data.tokenizer`` names; `train_texts`: a
  dataset's unlabelled text (its training texts, labels ignored).
"""
from __future__ import annotations

import inspect
import logging
import re
import time
from typing import Any, Dict, Optional

import torch

from energies.errors import ConfigError
from unfold.classifier import TokenEmbedding
from unfold.devices import resolve_device
from unfold.encoders import ENCODERS

from .config import DEFAULTS
from .tasks import task_of
from ..runfolder.fingerprint import data_fingerprint
from ..runfolder.runlog import LOGGER


#: model keys that configure one kind of encoder only: set on another kind (away from their default) they are
#: refused, with a hint where one helps
ENCODER_ONLY_KEYS = ("attention", "norm", "curvature", "kernel")
_HINTS = {("guaranteed", "attention"): "; in guaranteed mode the attention kernel is rho's derivative: model.rho=exp "
                                       "(softmax), relu:C (ReLU), softplus:C:T (softplus)",
          ("guaranteed", "norm"): "; guaranteed mode has the LayerNorm energy terms (model.layernorm)",
          ("baseline", "norm"): "; the baseline has torch's post-LN layers"}


def build_model(cfg: Dict[str, Any], vocab_size: int, num_classes: int, glove: Optional[torch.Tensor] = None,
                task=None) -> torch.nn.Module:
    """The model a config describes, composed from the library's registries: a
    [`TokenEmbedding`][unfold.TokenEmbedding], the encoder registered as ``model.mode`` (its constructor's
    parameters read from the ``model`` keys of the same names) and the head of the config's ``task``
    (`experiments.app.tasks`: ``classify``, a linear head in a `SequenceClassifier`; ``masked_tokens``, a token
    head in a `unfold.MaskedTokenModel`), composed by the task. ``task``: the run's task object (default: a new
    one for ``cfg``). The library's errors, which name its parameters, come back naming the config keys."""
    mc = cfg["model"]
    mode = mc["mode"]
    if mode not in ENCODERS:
        raise ConfigError(f"config key 'model.mode'={mode!r} is unknown; valid: {sorted(ENCODERS)}")
    cls = ENCODERS[mode]
    params = inspect.signature(cls).parameters
    for key in ENCODER_ONLY_KEYS:
        if key not in params and mc[key] != DEFAULTS["model"][key]:
            raise ConfigError(f"config key 'model.{key}'={mc[key]!r} applies to another encoder, not to "
                              f"model.mode={mode}{_HINTS.get((mode, key), '')}")
    kwargs = {k: mc[k] for k in params if k in mc and mc[k] is not None}
    try:   # embedding, head, encoder: the order in which earlier versions drew the initial weights of a seed
        embedding = TokenEmbedding(vocab_size, mc["d"], pretrained=glove, freeze=cfg["data"]["glove"] == "frozen",
                                   positional=mc["positional"], max_len=cfg["data"]["max_len"], dropout=mc["dropout"])
        task = task_of(cfg) if task is None else task
        head = task.head(embedding, vocab_size, num_classes)
        return task.model(embedding, cls(**kwargs), head)
    except ConfigError as exc:
        raise ConfigError(_config_names(str(exc), mc)) from None


def _config_names(message: str, mc: Dict[str, Any]) -> str:
    """A library message naming parameters ``name=...`` with the config keys ``model.name=...``."""
    keys = "|".join(sorted((re.escape(k) for k in mc), key=len, reverse=True))
    return "config: " + re.sub(rf"(?<![\w.])({keys})(?==)", r"model.\1", message).replace("max_len=", "data.max_len=")


def check_buildable(cfg: Dict[str, Any]) -> int:
    """Build the model on the meta device (no memory, no data) so that every model-level rule between keys is
    checked before anything is loaded or written; returns its parameter count without the embedding. The meta
    device is the check's own business: what it cannot know, the device the run trains on, is asked of the encoder
    (``model.kernel`` on ``train.device``), and every refusal is a ConfigError naming the config keys and that
    device, never the check's meta device. A config it accepts builds and trains there."""
    with torch.device("meta"):
        model = build_model(cfg, 2, 2)
    problem = getattr(model.encoder, "kernel_problem", None)
    why = problem(resolve_device(cfg["train"]["device"])) if problem is not None else None
    if why is not None:
        mc = cfg["model"]
        raise ConfigError(f"config: model.kernel={mc['kernel']!r} cannot run on train.device={cfg['train']['device']!r} "
                          f"(model.graph={mc['graph']!r}, model.rho={mc['rho']!r}): the {mc['kernel']} kernel {why}")
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("embedding."))


def build_data(cfg: Dict[str, Any], mask_token: bool = False, vocab=None, embed_shape: Optional[tuple] = None):
    """Splits, vocabulary, encoded tensors and (optional) GloVe matrix as the trainer sees them.

    The vocabulary is the tokenizer ``data.tokenizer`` names (`build_tokenizer`): a word
    [Vocab][experiments.data.text.Vocab] or a [SubwordTokenizer][experiments.data.subword.SubwordTokenizer], both
    [TextTokenizer][experiments.data.subword.TextTokenizer]s. ``mask_token``: the word vocabulary gets ``<mask>``
    at id 2 (masked-token training); False keeps the ids of earlier versions. A trained subword tokenizer always
    has ``[MASK]`` at id 2. ``vocab``: a tokenizer to encode with instead (a pretrained run's, ``model.init_from``:
    nothing is learnt from the data); ``embed_shape``: then the shape of its embedding table, whose weights come
    from that run (zeros stand for GloVe's rows, which are not read)."""
    from .. import data as D

    dc = cfg["data"]
    log = logging.getLogger(LOGGER)
    log.info(f"reading data.dataset={dc['dataset']} ...")       # the first line, before any slow step
    t0 = time.perf_counter()
    splits = D.load_configured(dc)
    train = train_examples(cfg, splits)
    log.info(f"read {splits.name}: {len(train)}/{len(splits.val)}/{len(splits.test)} train/val/test examples, "
             f"{splits.num_classes} classes ({time.perf_counter() - t0:.1f} s); tokenising ...")
    t0 = time.perf_counter()
    if vocab is None:
        vocab = build_tokenizer(cfg, train, mask_token)
    elif mask_token and vocab.mask_id is None:
        raise ConfigError(f"model.init_from={cfg['model']['init_from']!r}: its vocabulary has no mask token, which "
                          "masked-token training needs")
    tensors = {name: D.encode(ex, vocab, dc["max_len"]) for name, ex in
               (("train", train), ("val", splits.val), ("test", splits.test))}
    what = f"{len(vocab)} words (data.min_freq={dc['min_freq']})" if vocab.kind == "words" else \
        f"{len(vocab)} subword tokens (data.tokenizer={dc['tokenizer']})"
    log.info(f"vocabulary: {what}; texts encoded to data.max_len={dc['max_len']} tokens "
             f"({time.perf_counter() - t0:.1f} s)")
    glove = None
    if embed_shape is not None:
        glove = torch.zeros(embed_shape) if dc["glove"] != "none" else None
    elif dc["glove"] != "none":
        glove, coverage = D.load_glove(vocab, data_dir=dc["data_dir"])
        log.info(f"GloVe 50d: {coverage:.1%} of the vocabulary found")
    return splits, vocab, tensors, glove


def build_tokenizer(cfg: Dict[str, Any], train: list, mask_token: bool = False):
    """The tokenizer ``data.tokenizer`` names, learnt from the run's training texts: the lines of ``data.texts``
    where set (read as a stream, `experiments.data.stream.iter_text_lines`), else the texts of ``train`` (the
    training examples, `train_examples`; never a validation or test text). ``words``: the word vocabulary
    (``data.min_freq``, ``data.max_vocab``; ``mask_token``: with ``<mask>`` at id 2); ``bpe:N`` / ``wordpiece:N``:
    trained, deterministically (``data.min_freq``: the fewest occurrences of a merged pair); a path: that
    ``tokenizer.json``, which must have a mask token when ``mask_token`` asks for one."""
    from .. import data as D
    from ..data.subword import SubwordTokenizer

    dc = cfg["data"]
    spec = D.parse_tokenizer_spec(dc["tokenizer"])
    stream = (lambda: D.iter_text_lines(dc["texts"])) if dc["texts"] is not None else None
    if spec.kind == "words":
        tokens = [D.tokenize(t) for t, _ in train] if stream is None else map(D.tokenize, stream())
        return D.Vocab.build(tokens, min_freq=dc["min_freq"], max_size=dc["max_vocab"], mask_token=mask_token)
    if spec.kind == "file":
        tok = SubwordTokenizer.load(spec.path)
        if mask_token and tok.mask_id is None:
            raise D.DataError(f"data.tokenizer={spec.path}: the tokenizer has no mask token ([MASK] or <mask>), "
                              "which masked-token training needs")
        return tok
    return SubwordTokenizer.train(spec.kind, spec.size, stream or [t for t, _ in train], min_freq=dc["min_freq"])


def train_texts(cfg: Dict[str, Any], splits) -> list:
    """The unlabelled text of a dataset: the texts of the training examples a run uses (the training split, its
    first ``train.max_train_examples`` when set), labels ignored; never a validation or test text, so that a
    model pretrained on them is still tested on texts it has not seen."""
    return [t for t, _ in _used_train(cfg, splits)]


def _used_train(cfg: Dict[str, Any], splits) -> list:
    """The training split, its first ``train.max_train_examples`` when set."""
    limit = cfg["train"]["max_train_examples"]
    return splits.train if limit is None else splits.train[:limit]


def train_examples(cfg: Dict[str, Any], splits) -> list:
    """The training examples a run uses: the training split, its first ``train.max_train_examples`` when set.
    A subsample holding one class only is refused (it would train to a meaningless 100 %)."""
    limit = cfg["train"]["max_train_examples"]
    train = _used_train(cfg, splits)
    classes = {y for _, y in train}
    if len(classes) < 2:
        raise ConfigError(f"train.max_train_examples={limit}: the first {len(train)} training examples of "
                          f"{splits.name} hold one class only ({sorted(classes)}); use more examples")
    return train


def fingerprint(cfg: Dict[str, Any], splits, vocab) -> Dict[str, Any]:
    """The data fingerprint of a run (`experiments.runfolder.fingerprint`): vocabulary (a subword tokenizer's
    whole ``tokenizer.json`` included), the splits as trained on."""
    return data_fingerprint(vocab.itos, train_examples(cfg, splits), splits.val, splits.test, splits.label_names,
                            tokenizer=vocab.tokenizer_digest)
