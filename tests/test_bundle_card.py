"""The model card and the training log say which checkpoint the test figures come from: the best-validation
epoch (``best.pt``, the weights the bundle holds) with its validation accuracy, and whether it is the last epoch
(`experiments.app.bundle.card.checkpoint_sentence`, from what ``metrics.json`` records). A card written before
cards recorded their binding never named it, and is still checked against the card without it."""
import copy
import re

import pytest

from experiments.app.bundle import model_card
from experiments.app.bundle.card import checkpoint_sentence
from experiments.app.config import DEFAULTS

LABELS = ["neg", "pos"]


def config(epochs):
    cfg = copy.deepcopy(DEFAULTS)
    cfg["train"]["epochs"] = epochs
    return cfg


def card(metrics, epochs=6, **kw):
    return model_card(config(epochs), LABELS, "toy", None, metrics, "unfold-train --config tiny", **kw)


def names_its_checkpoint(text, best, epochs, val):
    """Whether a card states, above its test metrics' table, the best-validation epoch of the run's epochs with
    its validation accuracy, and whether it is the last epoch's."""
    section = text.split("## Test metrics", 1)[1].split("| metric |", 1)[0]
    last = "the last" if best == epochs else "not the last epoch's weights"
    return bool(re.search(rf"best-validation checkpoint: epoch {best} of {epochs}\b", section)) \
        and f"validation accuracy {val:.4f}" in section and last in section


@pytest.mark.parametrize("best, epochs", [(2, 6), (6, 6)])
def test_the_card_names_the_epoch_its_test_figures_come_from(best, epochs):
    metrics = {"test_accuracy": 0.79, "val_accuracy": 0.8125, "best_epoch": best}
    text = card(metrics, epochs)
    assert names_its_checkpoint(text, best, epochs, 0.8125), text
    assert checkpoint_sentence(metrics, epochs) in text
    assert ("validation did not improve after epoch 2" in text) == (best < epochs)


def test_a_card_without_the_sentence_fails_the_check():
    """The negative control: the same card without the checkpoint (as older cards were written) is caught, and so
    is a card naming another epoch."""
    metrics = {"test_accuracy": 0.79, "val_accuracy": 0.8125, "best_epoch": 2}
    assert not names_its_checkpoint(card(metrics, names_checkpoint=False), 2, 6, 0.8125)
    assert not names_its_checkpoint(card(metrics), 3, 6, 0.8125)
    assert not names_its_checkpoint(card({**metrics, "best_epoch": 6}), 2, 6, 0.8125)


def test_no_sentence_where_no_epoch_is_recorded():
    """A bundle not written at the end of a run (no best_epoch, or a malformed one) names no checkpoint."""
    for metrics in (None, {"test_accuracy": 0.7}, {"best_epoch": True}, {"best_epoch": 0}, {"best_epoch": "2"}):
        assert checkpoint_sentence(metrics, 6) is None
        assert "best-validation" not in card(metrics)
    assert "validation accuracy not recorded" in checkpoint_sentence({"best_epoch": 1}, 6)
