"""Model bundles: everything needed to use a trained model, in one folder, loaded without executing code.

A bundle (format version 2, what `save_model`, ``save_pretrained`` and the trainer write; a finished run folder
is one) is the layout the Hugging Face ecosystem shares models in:

* ``model.safetensors``: the weights (the state dict), read with ``safetensors`` (a JSON header and raw tensor
  bytes: no pickle, nothing in it can run); its header's metadata names the bundle format and version;
* ``config.json``: the resolved config the model was built from (`experiments.app.build.build_model`);
* ``vocab.json``: the vocabulary, ids in order (`experiments.data.Vocab`); or, for a model with a subword
  tokenizer (``data.tokenizer`` other than ``words``), ``tokenizer.json`` instead: the Hugging Face ``tokenizers``
  file (`experiments.data.subword.SubwordTokenizer`), read as JSON and checked, hashed like the other files and
  covered by the data fingerprint;
* ``graph.npy``, where ``model.graph`` is an edge-list file: the graph the model was trained on, copied when the
  run started (`experiments.app.graph_pin`). The graph is part of the model: the bundle predicts with this
  copy, checked against its sha256, never with the file ``model.graph`` names, which may since have been edited,
  moved or deleted;
* ``README.md``: the model card (Hugging Face front matter: library, tags, dataset, metrics; then the data
  fingerprint, the test metrics and the checkpoint they were measured on, the descent verdict with its tolerance
  rule, the config and the command that made the bundle), written from ``bundle.json``'s ``metrics`` and
  ``command`` (`model_card`);
* ``bundle.json``: the format version, the label names (class id -> name), the data fingerprint of the training
  data (`experiments.runfolder.fingerprint`), the card's metrics and command, and the sha256 of every file above.

A run folder also holds the trainer's checkpoints (``best.pt``, ``last.pt``, ``prev.pt``: torch files for
``--resume``); they are not part of the bundle, which never reads them.

**Format 1** (bundles written before this one, still read, with every check): ``best.pt`` (a run's best epoch)
or ``model.pt`` (the old `save_model`): ``{"model": state_dict, ...}``, read with ``torch.load(weights_only=True)``
(tensors and plain containers only); ``config.yaml`` instead of ``config.json``; no card.
``python -m experiments.app.bundle convert OLD NEW`` (`convert`) writes the same model as a format-2 bundle.

The package, one module per role: `experiments.app.bundle.format` (the files, keys and versions),
`experiments.app.bundle.card` (the model card and what it binds), `experiments.app.bundle.write`,
`experiments.app.bundle.read` (every check, listed in its docstring), `experiments.app.bundle.model`
(`TrainedModel`, `Prediction`, `load_model`, `save_model`), `experiments.app.bundle.conversion` (`convert`) and
`experiments.app.bundle.cli` (the command line). This module exports their public names.
"""
from .card import BOUND_KEYS, CARD_KEY, canonical_sha256, model_card
from .cli import main
from .conversion import CONVERT_CMD, CONVERT_SUFFIX, PROBES, convert
from .format import (BUNDLE, BUNDLE_FILES, CARD, CARD_METRICS, CONFIG_JSON, CONFIG_YAML, FILES_V2, FORMAT,
                     MANIFEST_KEYS, META, OPTIONAL_KEYS, OPTIONAL_KEYS_V2, SAFETENSORS, VERSION, VERSIONS,
                     VOCAB_FILES, WEIGHTS, WEIGHTS_KEYS)
from .model import CHECK_DTYPES, HUB_ID, PRIOR_WARNINGS, Prediction, TrainedModel, load_model, save_model
from ..verdict import UNKNOWN_WORDS_SHOWN
from .write import trainer_command, write_bundle, write_bundle_manifest, write_run_bundle

__all__ = ["TrainedModel", "Prediction", "load_model", "save_model", "write_bundle", "write_run_bundle",
           "write_bundle_manifest", "model_card", "convert", "main", "canonical_sha256", "trainer_command",
           "BUNDLE", "FORMAT", "VERSION", "VERSIONS", "WEIGHTS", "SAFETENSORS", "CONFIG_JSON", "CARD",
           "CONFIG_YAML", "META", "FILES_V2", "VOCAB_FILES", "MANIFEST_KEYS", "OPTIONAL_KEYS", "OPTIONAL_KEYS_V2",
           "WEIGHTS_KEYS", "BUNDLE_FILES", "CARD_METRICS", "BOUND_KEYS", "CARD_KEY", "CHECK_DTYPES", "HUB_ID",
           "UNKNOWN_WORDS_SHOWN", "PRIOR_WARNINGS", "PROBES", "CONVERT_CMD", "CONVERT_SUFFIX"]
