"""Fine-tuning from a pretrained run: ``model.init_from: RUN``.

``RUN`` is anything [TrainedModel.from_pretrained][experiments.app.bundle.TrainedModel.from_pretrained] reads: a
finished run folder or a saved bundle (a masked-token pretraining run or a classifier), or a Hub id. The bundle is
read with every check the loader makes (hashes, fingerprint, card, weight dtypes, finite weights); a bundle that
fails one is refused, naming ``model.init_from``.

What is taken from RUN, as a Hugging Face checkpoint carries its tokenizer:

* the tokenizer or word vocabulary (`read_pretrained` returns it; the run's data is encoded with it, never with a
  vocabulary built anew, so every token id means what it meant in pretraining);
* the embedding and the encoder, bit for bit (`transfer_weights`); the task's head is new, drawn from the run's
  own seed.

What must agree (`check_compatible`): every ``model`` key that shapes the encoder or changes what a layer computes
(``mode, d, heads, d_head, layers, rho, tau, graph, alpha, ffn, relu, layernorm, positional, ffn_mult,
curvature, attention, attention_temperature, norm``), the tokenizer (``data.tokenizer``), the positions covered
(``data.max_len`` where the positions are learned) and whether the embedding is GloVe's width
(``data.glove`` none or not). Free to differ: `FREE_MODEL_KEYS` (dropout, the kernel that computes the same
attention, the energy-chosen depth) and everything of ``train``. A difference is one ConfigError naming every
differing key with both values (exit 2 at the command line, before anything is written).

``data.glove`` keeps one meaning under ``init_from``: ``frozen`` keeps the embedding table fixed; the GloVe file is
not read (the table comes from RUN).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from energies.errors import ConfigError, UnfoldError

from .config import with_defaults

#: ``model`` keys a fine-tuned run may set apart from its pretraining run: dropout, the kernel (kernels swap, the
#: math does not), the energy-chosen depth, and ``init_from`` itself
FREE_MODEL_KEYS = ("dropout", "kernel", "stop_rel", "init_from")
#: the module prefixes of a model's state dict that fine-tuning takes from the pretrained run
TRANSFERRED = ("embedding.", "encoder.")


@dataclass
class Pretrained:
    """What a fine-tuned run takes from ``model.init_from``.

    Attributes:
        source: the value of ``model.init_from`` as given.
        config: the pretrained run's resolved config.
        vocab: its tokenizer or word vocabulary (a
            [TextTokenizer][experiments.data.subword.TextTokenizer]).
        state: its embedding and encoder weights (``embedding.*``, ``encoder.*``), on the CPU.
        fingerprint: its data fingerprint (None where the bundle records none).
        task: its task (``classify`` for a classifier bundle).
    """

    source: str
    config: Dict[str, Any]
    vocab: Any
    state: Dict[str, torch.Tensor]
    fingerprint: Optional[Dict[str, Any]]
    task: str

    def record(self) -> Dict[str, Any]:
        """What the fine-tuned run's metrics (so its model card) say of its pretraining run: the name as given,
        the task, and the sha256 of its data fingerprint (canonical JSON, as the bundle's card binds its fields;
        None where the bundle records none)."""
        from .bundle import canonical_sha256

        digest = None if self.fingerprint is None else canonical_sha256(self.fingerprint)
        return {"init_from": self.source, "init_from_task": self.task, "init_from_fingerprint_sha256": digest}


def read_pretrained(source: Any) -> Pretrained:
    """The pretrained run ``model.init_from`` names, read and checked by the bundle loader.

    Args:
        source: a run folder, a bundle folder or a Hub id (a non-empty string).

    Returns:
        A `Pretrained`: config, tokenizer, the embedding and encoder weights, fingerprint and task.

    Raises:
        ConfigError: ``source`` is not a non-empty string, or the bundle cannot be read or fails a check (the
            loader's message, after ``model.init_from=...``).
    """
    from .bundle import TrainedModel

    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"config key 'model.init_from'={source!r}: expected a run folder, a bundle folder or a "
                          "Hub id")
    try:
        trained = TrainedModel.from_pretrained(source)
    except UnfoldError as exc:
        raise ConfigError(f"config key 'model.init_from'={source!r}: not a usable pretrained model ({exc})") from None
    state = {k: v.detach().to("cpu", copy=True) for k, v in trained.model.state_dict().items()
             if k.startswith(TRANSFERRED)}
    task = str(trained.config.get("task") or "classify")
    return Pretrained(source, trained.config, trained.vocab, state, trained.data_fingerprint, task)


def _compared(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The keys of ``cfg`` a fine-tuned run must share with its pretraining run (module docstring)."""
    mc, dc = cfg["model"], cfg["data"]
    keys = {f"model.{k}": v for k, v in mc.items() if k not in FREE_MODEL_KEYS}
    keys["data.tokenizer"] = dc["tokenizer"]
    keys["data.glove"] = "none" if dc["glove"] == "none" else "GloVe (finetune or frozen)"
    if mc.get("positional") not in (False, "none", "sinusoidal"):
        keys["data.max_len"] = dc["max_len"]
    return keys


def check_compatible(cfg: Dict[str, Any], pretrained: Pretrained) -> None:
    """Refuse a fine-tuning config that would not rebuild the pretrained encoder.

    Args:
        cfg: the fine-tuning run's resolved config.
        pretrained: what `read_pretrained` read.

    Raises:
        ConfigError: naming every differing key with the run's value and the pretrained run's.
    """
    mine, theirs = _compared(cfg), _compared(with_defaults(pretrained.config))   # keys newer than the bundle:
    # their defaults, which is how it was built
    diff = [f"{k}={mine[k]!r} (the pretrained run has {theirs.get(k)!r})" for k in mine if mine[k] != theirs.get(k)]
    if diff:
        raise ConfigError(f"config: model.init_from={pretrained.source!r} was trained with another encoder or "
                          f"tokenizer: {'; '.join(diff)}. Set these keys as the pretrained run has them "
                          f"(its config.json), or train without model.init_from")


def transfer_weights(model: torch.nn.Module, pretrained: Pretrained) -> List[str]:
    """Copy the pretrained embedding and encoder into ``model`` bit for bit.

    Args:
        model: the freshly built model of the fine-tuning run (its head stays as drawn).
        pretrained: what `read_pretrained` read.

    Returns:
        The names of the parameters and buffers copied, in state-dict order.

    Raises:
        ConfigError: the model lacks one of them, has one the pretrained run lacks, or one differs in shape or
            dtype (named).
    """
    own = {k: v for k, v in model.state_dict().items() if k.startswith(TRANSFERRED)}
    missing, extra = sorted(set(pretrained.state) - set(own)), sorted(set(own) - set(pretrained.state))
    if missing or extra:
        raise ConfigError(f"config: model.init_from={pretrained.source!r}: the weights do not fit this model "
                          f"(not in this model: {missing[:5]}; not in the pretrained run: {extra[:5]})")
    for k, v in own.items():
        w = pretrained.state[k]
        if w.shape != v.shape or w.dtype != v.dtype:
            raise ConfigError(f"config: model.init_from={pretrained.source!r}: {k} is {tuple(w.shape)} {w.dtype} "
                              f"there, {tuple(v.shape)} {v.dtype} here")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(pretrained.state[k])
    return list(own)
