"""``task: classify`` (the default): a text's label, from the mean of its tokens' states through a linear head.

The run trains on the dataset's training split, chooses its best epoch by validation accuracy and reports test
accuracy against always predicting the test split's most frequent class.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from unfold.classifier import SequenceClassifier

from .registry import Task, register_task


def majority_class_accuracy(examples) -> float:
    """The accuracy of always predicting the most frequent label of ``examples`` (``(text, label)`` pairs): the
    score a model must beat to have learned anything (0.0 for no example)."""
    counts: Dict[Any, int] = {}
    for _, label in examples:
        counts[label] = counts.get(label, 0) + 1
    return max(counts.values()) / len(examples) if counts else 0.0


@register_task("classify")
class Classify(Task):
    """A label per text (module docstring)."""

    def head(self, embedding: torch.nn.Module, vocab_size: int, num_classes: int) -> torch.nn.Module:
        return torch.nn.Linear(self.cfg["model"]["d"], num_classes)

    def model(self, embedding, encoder, head) -> SequenceClassifier:
        return SequenceClassifier(embedding, encoder, head, dropout=self.cfg["model"]["dropout"])

    def batches(self, tensors, batch_size: int, generator: Optional[torch.Generator] = None,
                epoch: Optional[int] = None):
        from ...data import batches

        ids, mask, labels = tensors
        return batches(ids, mask, labels, batch_size, shuffle=generator is not None, generator=generator)

    def metrics(self, accuracy: float, loss: float, info, tensors, splits) -> Dict[str, Any]:
        majority = majority_class_accuracy(splits.test)
        return {"majority_class_accuracy": majority, "no_better_than_majority": bool(accuracy <= majority + 1e-12)}
