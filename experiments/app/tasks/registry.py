"""The task registry: what a run learns (``task:`` in a config), one registered part per task.

A task is a class registered with ``@register_task("name")`` and subclassing [Task][experiments.app.tasks.Task];
the training loop (`experiments.app.train`), evaluation (`experiments.app.evaluation`) and bundles call only the
methods below, so a plug-in module (``--import MODULE``, `unfold.plugins`) that registers a task makes
``task: name`` work in every config. The loop constructs it once per run, ``TASKS.lookup(name)(cfg)``.

What a task owns:

* the vocabulary's needs (`Task.mask_token`: a mask token at id 2) and its data (`Task.data`: the tensors the run
  trains, validates and tests on, from the dataset's splits, plus figures for ``metrics.json``);
* the model's head (`Task.head`, built between the embedding and the encoder: the order of the initial weights)
  and the model composed of embedding, encoder and head (`Task.model`);
* how a batch of encoded texts ``(ids, mask, labels)`` becomes inputs and targets (`Task.batches`, training and
  evaluation), what the forward pass is given besides ids and mask (`Task.forward_args`) and which targets it
  scores (`Task.scored`);
* its loss (`Task.loss`, `Task.losses`) and metrics (`Task.hits`: correct predictions; `Task.metrics`: the
  figures of ``metrics.json``).

This module imports only the library, so that the config's ``task`` key (`experiments.app.config`) can list the
registered names without an import circle.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from energies.errors import ConfigError
from energies.registry import Registry

__all__ = ["TASKS", "Task", "register_task"]

#: the registered tasks: name -> class (``classify``, ``masked_tokens``, and any a plug-in registers)
TASKS: Registry = Registry("task", ConfigError, "name", "experiments.app.tasks.TASKS")
register_task = TASKS.register

Batch = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class Task:
    """The interface of a task (module docstring); ``cfg`` is the run's resolved config.

    Attributes:
        name: the registered name (set by `register_task`).
        mask_token: whether the vocabulary needs a mask token (``<mask>`` / ``[MASK]`` at id 2).
        labelled: whether the task predicts the dataset's labels (a bundle then carries label names).
        pipeline: the Hugging Face pipeline tag of its bundles.
    """

    name: str = ""
    mask_token: bool = False
    labelled: bool = True
    pipeline: str = "text-classification"

    def __init__(self, cfg: Dict[str, Any]):
        self.cfg = cfg

    def data(self, splits, vocab, tensors: Dict[str, Batch]) -> Tuple[Dict[str, Batch], Dict[str, Any]]:
        """The ``train``/``val``/``test`` tensors the run uses (from the dataset's ``splits`` and their encoded
        ``tensors``), and figures about them for ``metrics.json``."""
        return tensors, {}

    def fingerprint(self, vocab) -> Optional[Dict[str, Any]]:
        """The run's data fingerprint (`experiments.runfolder.fingerprint`) where the task trains on other data
        than the dataset's splits as they are; None: the splits' (`experiments.app.build.fingerprint`)."""
        return None

    def head(self, embedding: torch.nn.Module, vocab_size: int, num_classes: int) -> torch.nn.Module:
        """The head, built after the embedding and before the encoder."""
        raise NotImplementedError

    def model(self, embedding: torch.nn.Module, encoder: torch.nn.Module, head: torch.nn.Module) -> torch.nn.Module:
        """The model of embedding, encoder and head."""
        raise NotImplementedError

    def batches(self, tensors: Batch, batch_size: int, generator: Optional[torch.Generator] = None,
                epoch: Optional[int] = None) -> Iterator[Batch]:
        """``(ids, mask, targets)`` batches on the host: shuffled by ``generator`` for training (``epoch`` the
        epoch, from 1), in order with ``generator`` None (evaluation). Deterministic given these arguments."""
        raise NotImplementedError

    def size(self, part: Batch) -> int:
        """How many examples a part of `Task.data` holds (one epoch's texts for the training part)."""
        return len(part[2])

    def forward_args(self, targets: torch.Tensor, device) -> Dict[str, Any]:
        """What the forward pass takes besides ids and mask, from the host ``targets``."""
        return {}

    def scored(self, targets: torch.Tensor) -> torch.Tensor:
        """The targets the logits score, one per logit row."""
        return targets

    def units(self, targets: torch.Tensor) -> int:
        """How many predictions a batch's targets score (host tensor: no device read)."""
        return int(self.scored(targets).numel())

    def losses(self, out, scored: torch.Tensor) -> torch.Tensor:
        """The loss of each scored prediction, float32."""
        return torch.nn.functional.cross_entropy(out.logits.float(), scored, reduction="none")

    def loss(self, out, scored: torch.Tensor, dd, weight: float, global_size: int) -> torch.Tensor:
        """The batch's training loss (the mean over the global batch: distributed, this rank's sum divided by the
        global count, times the world size, so that DDP's average of the gradients is the global mean's)."""
        logits = out.logits.float()
        if dd.enabled:
            return torch.nn.functional.cross_entropy(logits, scored, reduction="sum") * (weight * dd.world / global_size)
        return torch.nn.functional.cross_entropy(logits, scored)

    def hits(self, out, scored: torch.Tensor) -> torch.Tensor:
        """How many predictions are right (a 0-d tensor)."""
        return (out.logits.argmax(-1) == scored).sum()

    def metrics(self, accuracy: float, loss: float, info: Dict[str, Any], tensors: Dict[str, Batch],
                splits) -> Dict[str, Any]:
        """The task's figures of ``metrics.json`` from the test ``accuracy`` and mean ``loss`` of the best
        weights."""
        return {}

