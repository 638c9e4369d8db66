"""Training configuration: YAML files plus dotted ``key=value`` overrides, validated against defaults.

Every key must exist in :data:`DEFAULTS` (an unknown key is a :class:`ConfigError` listing the valid
keys at that level) and every value must have the default's type (``None`` defaults accept the
types listed in :data:`NULLABLE`).
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Iterable, Optional

import yaml

from energies.errors import ConfigError

__all__ = ["DEFAULTS", "load_config", "apply_overrides", "validate", "dump_config", "ConfigError"]

DEFAULTS: Dict[str, Any] = {
    "name": "default",
    "data": {
        "dataset": "rotten_tomatoes",   # rotten_tomatoes | crowdflower | path/to/file.csv|.jsonl|dir | hf:NAME
        "seed": 0,                      # split seed
        "max_len": 64,                  # tokens kept per text
        "min_freq": 1,                  # vocabulary: minimum count in the training split
        "max_vocab": None,              # vocabulary: most frequent tokens kept
        "glove": "finetune",            # none | frozen | finetune (GloVe 6B 50d)
        "data_dir": None,               # default $UNFOLD_DATA or ~/.cache/unfolded-transformers
        "text_field": "text",
        "label_field": "label",
    },
    "model": {
        "mode": "guaranteed",           # guaranteed | free | baseline
        "d": 64,
        "heads": 2,
        "d_head": None,
        "layers": 4,
        "rho": "exp",
        "tau": None,
        "graph": "complete",
        "alpha": 1.0,
        "ffn": True,
        "relu": True,
        "layernorm": False,
        "positional": True,
        "ffn_mult": 2,
        "dropout": 0.1,
        "curvature": "adaptive",        # guaranteed: adaptive (weighted degree) | constant (rho'(0) x degree)
        "attention": None,              # free/baseline: softmax (default) | relu | softplus
        "attention_temperature": 1.0,   # softplus attention: t softplus(s / t)
        "norm": None,                   # free: post (default, LayerNorm) | none (add-only blocks)
    },
    "train": {
        "epochs": 6,
        "batch_size": 32,
        "lr": 0.002,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
        "seed": 0,
        "device": "cpu",
        "threads": None,
        "trace": True,                  # energy trace during training (model dtype)
        "monitor": "warn",              # descent monitor on the training trace: off | warn | strict
        "check_dtype": "float64",       # dtype of the descent check on the test set
        "max_train_examples": None,     # subsample the training split (smoke runs)
        "progress": True,
    },
}

NULLABLE = {
    ("data", "max_vocab"): (int,), ("data", "data_dir"): (str,), ("model", "d_head"): (int,),
    ("model", "tau"): (float, int), ("model", "attention"): (str,), ("model", "norm"): (str,), ("train", "threads"): (int,), ("train", "max_train_examples"): (int,),
}
CHOICES = {
    ("data", "glove"): ("none", "frozen", "finetune"),
    ("model", "mode"): ("guaranteed", "free", "baseline"),
    ("model", "curvature"): ("adaptive", "constant"),
    ("model", "attention"): ("softmax", "relu", "softplus"),
    ("model", "norm"): ("post", "none"),
    ("train", "check_dtype"): ("float32", "float64"),
    ("train", "monitor"): ("off", "warn", "strict"),
}


def _valid_keys(defaults: Dict[str, Any]) -> str:
    return ", ".join(sorted(defaults))


def _merge(base: Dict[str, Any], new: Dict[str, Any], defaults: Dict[str, Any], path: str) -> None:
    if not isinstance(new, dict):
        raise ConfigError(f"config section {path or '<root>'} must be a mapping, got {type(new).__name__}")
    for key, value in new.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in defaults:
            raise ConfigError(f"unknown config key {where!r}; valid keys{' in ' + path if path else ''}: "
                              f"{_valid_keys(defaults)}")
        if isinstance(defaults[key], dict):
            _merge(base[key], value, defaults[key], where)
        else:
            base[key] = value


def validate(cfg: Dict[str, Any], defaults: Dict[str, Any] = DEFAULTS, path: tuple = ()) -> Dict[str, Any]:
    """Type-check every value against the defaults; returns ``cfg``."""
    for key, default in defaults.items():
        where = path + (key,)
        value = cfg.get(key, default)
        name = ".".join(where)
        if isinstance(default, dict):
            validate(value, default, where)
            continue
        if value is None:
            if default is not None and where not in NULLABLE:
                raise ConfigError(f"config key {name!r} must not be null")
            continue
        allowed = NULLABLE.get(where) or (type(default),)
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = cfg[key] = float(value)
        if float in allowed and isinstance(value, str):      # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = cfg[key] = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) and bool not in allowed:
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, got bool {value!r}")
        if not isinstance(value, allowed):
            raise ConfigError(f"config key {name!r} must be {'/'.join(t.__name__ for t in allowed)}, "
                              f"got {type(value).__name__} {value!r}")
        if where in CHOICES and value not in CHOICES[where]:
            raise ConfigError(f"config key {name!r} must be one of {list(CHOICES[where])}, got {value!r}")
    return cfg


def apply_overrides(cfg: Dict[str, Any], overrides: Iterable[str]) -> Dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML: 3, 0.5, true, null, text)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        keys = dotted.strip().split(".")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        nested: Dict[str, Any] = value
        for k in reversed(keys):
            nested = {k: nested}
        _merge(cfg, nested, DEFAULTS, "")
    return cfg


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Dict[str, Any]:
    """Defaults <- YAML file <- overrides, validated. ``name`` defaults to the file's stem."""
    cfg = copy.deepcopy(DEFAULTS)
    if path is not None:
        if not os.path.isfile(path):
            raise ConfigError(f"config file {path!r} does not exist")
        try:
            with open(path) as fh:
                loaded = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
        if "name" not in loaded:
            loaded["name"] = os.path.splitext(os.path.basename(path))[0]
        _merge(cfg, loaded, DEFAULTS, "")
    apply_overrides(cfg, overrides)
    return validate(cfg)


def dump_config(cfg: Dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
