"""The bundle format: the files a bundle holds, the keys of its ``bundle.json`` (the manifest), the versions read,
and which of a run's metrics it carries to its model card.

Format 2 (what the code writes) holds `SAFETENSORS`, `CONFIG_JSON`, the vocabulary (`VOCAB_FILES`: ``vocab.json``,
or a subword model's ``tokenizer.json``), `CARD` and, where ``model.graph`` is an edge-list file, the graph's copy
(``graph.npy``); format 1 (still read) holds one of `WEIGHTS`, `CONFIG_YAML` and ``vocab.json``. `BUNDLE` names
them all with their sha256 under the keys `MANIFEST_KEYS` (and, where they apply, `OPTIONAL_KEYS` or
`OPTIONAL_KEYS_V2`). The rules that read these names live with the reader (`experiments.app.bundle.read`) and
the writer (`experiments.app.bundle.write`); this module holds the names and the small rules both apply.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

from ..graph_pin import GRAPH_FILE

#: the manifest's file name
BUNDLE = "bundle.json"
#: the manifest's ``format`` and the version written
FORMAT, VERSION = "unfolded-transformers/bundle", 2
#: the bundle versions `experiments.app.bundle.load_model` reads (1: torch-file weights, read weights_only;
#: 2: safetensors)
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
#: the keys every manifest holds
MANIFEST_KEYS = ("format", "version", "weights", "label_names", "dataset", "data_fingerprint", "sha256")
#: keys a manifest may hold besides `MANIFEST_KEYS` (``graph``: the pinned edge-list graph, where there is one;
#: format 2: ``metrics`` and ``command``, what the model card says; ``task``, where the model's task is not
#: ``classify``: ``masked_tokens``, whose bundle has no label names)
OPTIONAL_KEYS = ("graph",)
OPTIONAL_KEYS_V2 = ("graph", "metrics", "command", "task")
#: what a weights file holds: the trainer's best.pt (model, config, epoch, val_accuracy), save_model's model.pt
#: (model, format, version)
WEIGHTS_KEYS = ("model", "config", "epoch", "val_accuracy", "format", "version")
#: the files a bundle can hold: all that from_pretrained downloads from the Hub (never a .pt checkpoint)
BUNDLE_FILES = (BUNDLE, SAFETENSORS, CONFIG_JSON, *VOCAB_FILES, CARD, GRAPH_FILE)
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


def vocab_file(config: Dict[str, Any]) -> str:
    """The vocabulary's file of a model built from ``config``: ``tokenizer.json`` for a subword tokenizer."""
    return VOCAB_FILES[0] if config["data"].get("tokenizer", "words") == "words" else VOCAB_FILES[1]


def task_name(config: Dict[str, Any]) -> Optional[str]:
    """The config's ``task`` where it is not ``classify`` (what a manifest records), else None."""
    task = config.get("task", "classify")
    return None if task == "classify" else task


def card_metrics(metrics: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The entries of `CARD_METRICS` that ``metrics`` (a run's metrics.json, or a bundle's own) holds as
    finite numbers, booleans, strings or nulls (`card_value`); None for none."""
    if not isinstance(metrics, dict):
        return None
    out = {k: metrics[k] for k in CARD_METRICS if k in metrics and card_value(metrics[k])}
    return out or None


def card_value(v: Any) -> bool:
    """Whether ``v`` may be a value of a manifest's ``metrics``: null, a boolean, a string, an integer or a finite
    float."""
    return v is None or isinstance(v, (bool, str, int)) or (isinstance(v, float) and math.isfinite(v))
