"""Pretraining on a text file read as a stream (``task: masked_tokens`` with ``data.texts``): the held-out rule is
stateless and deterministic, the shuffle buffer permutes with at most its size held, the stream splits texts into
disjoint training and held-out texts whatever its limits, its memory stays flat as the file grows, and a run
pretrains on it, learns, resumes bit for bit and fine-tunes."""
import json
import os
import random
import tracemalloc

import pytest
import torch

from experiments.app import train as T
from experiments.app.config import load_config
from experiments.data import DataError
from experiments.data.stream import TextStream, held_out, shuffle_buffer
from test_pretrain import GROUPS, assert_resume_is_uninterrupted, interrupt_after, run_card_snippet, write_topics


def write_lines(path, n, seed=0):
    """``n`` topic texts (`test_pretrain.write_topics`'s kind), one a line, with blank lines between some."""
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(n):
            g = rng.randrange(5)
            fh.write(" ".join(rng.choice(GROUPS[g]) for _ in range(rng.randint(8, 14))) + ("\n\n" if i % 7 else "\n"))
    return str(path)


def test_the_held_out_rule_is_a_stateless_share_of_the_numbers():
    picks = [held_out(3, i, 0.05) for i in range(20000)]
    assert picks == [held_out(3, i, 0.05) for i in range(20000)]            # the same on every reading
    assert abs(sum(picks) - 1000) < 5 * (20000 * 0.05 * 0.95) ** 0.5       # binomial: 5 standard deviations
    assert picks != [held_out(4, i, 0.05) for i in range(20000)]             # the seed matters
    assert not any(held_out(0, i, 1e-12) for i in range(1000)) and all(held_out(0, i, 1.0) for i in range(1000))


def test_the_shuffle_buffer_permutes_holding_at_most_its_size():
    items = list(range(1000))
    g = torch.Generator().manual_seed(0)
    out = list(shuffle_buffer(iter(items), 50, g))
    assert sorted(out) == items and out != items
    assert out == list(shuffle_buffer(iter(items), 50, torch.Generator().manual_seed(0)))
    assert list(shuffle_buffer(iter(items), 1, g)) == items                  # size 1: the order kept
    pulled = []

    def source():
        for x in items:
            pulled.append(x)
            yield x

    first = next(shuffle_buffer(source(), 50, g))
    assert len(pulled) == 51 and first in pulled                             # 50 held, the 51st replaces one
    # far from a full shuffle, but each item moves: the mean displacement grows with the buffer
    shift = [sum(abs(i - x) for i, x in enumerate(shuffle_buffer(iter(items), b, g))) / 1000 for b in (2, 200)]
    assert shift[0] < 5 < 50 < shift[1]


def test_the_stream_splits_disjoint_training_and_held_out_texts(tmp_path):
    path = write_lines(tmp_path / "a.txt", 500)
    texts = [line.strip() for line in open(path) if line.strip()]
    s = TextStream(path, 0.1, 0, heldout_max=1000)
    train = [t for t, _ in s]
    assert len(train) == len(s) and len(train) + len(s.heldout_texts) == 500
    assert sorted(train + s.heldout_texts) == sorted(texts) and 25 < len(s.heldout_texts) < 80
    assert [t for i, t in enumerate(texts) if held_out(0, i, 0.1)] == s.heldout_texts
    capped = TextStream(path, 0.1, 0, heldout_max=5, limit=30)
    assert capped.heldout_texts == s.heldout_texts[:5] and len(capped) == 30
    assert [t for t, _ in capped] == [t for t in texts if t not in capped.heldout_texts][:30]
    batches = list(s.batches(lambda b: b, 64, 100, torch.Generator().manual_seed(1)))
    assert [len(b) for b in batches[:-1]] == [64] * (len(batches) - 1) and \
        sorted(t for b in batches for t in b) == sorted(train)
    assert [t for b in s.batches(lambda b: b, 64, 100) for t in b] == train   # no generator: file order
    with pytest.raises(DataError, match="held-out"):
        TextStream(path, 1e-9, 0, heldout_max=10)
    with open(path, "a") as fh:                          # the file changes under the stream: refused, not read
        fh.write("g0w1 g0w2\n")
    with pytest.raises(DataError, match="a.txt changed while the run read it"):
        next(s.batches(lambda b: b, 64, 100))


def test_memory_stays_flat_as_the_file_grows(tmp_path):
    peaks = []
    for n in (2000, 16000):
        path = write_lines(tmp_path / f"{n}.txt", n)
        tracemalloc.start()
        s = TextStream(path, 0.01, 0, heldout_max=10)
        sum(len(b) for b in s.batches(lambda b: b, 32, 100, torch.Generator().manual_seed(0)))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    # 8 times the texts (about 1.5 MB against 190 kB of file): the heap holds the buffer, the batch and 10
    # held-out texts either way; a reader that loads the file would grow with it
    assert peaks[1] < 1.5 * peaks[0] + 20_000 and peaks[1] < os.path.getsize(tmp_path / "16000.txt") / 4, peaks


def _config(data, texts, *extra):
    return load_config("tiny", [f"data.dataset={data}", "task=masked_tokens", f"data.texts={texts}",
                                "train.batch_size=16", "train.lr=0.01", "model.dropout=0", "pretrain.heldout=0.1",
                                "pretrain.shuffle_buffer=64", "train.progress=false", "train.tensorboard=false",
                                *extra])


def test_a_run_pretrains_on_the_file_learns_and_fine_tunes(tmp_path):
    data = write_topics(tmp_path / "topics", n_train=40)           # the dataset is not what is pretrained on
    texts = write_lines(tmp_path / "texts.txt", 600)
    metrics = T.train(_config(data, texts, "train.epochs=16", "train.lr=0.02"), str(tmp_path / "pre"))
    assert metrics["pretrain_texts"] + metrics["heldout_texts"] == 600 and metrics["texts"] == texts
    # the sibling test's margin (test_pretrain): a masked word's group is read from its context (about 1/6 right
    # then), against the most frequent masked word (about 1/15 here)
    assert metrics["masked_accuracy"] > metrics["unigram_masked_accuracy"] + 0.04, metrics
    assert metrics["energy_increases"] == 0 and metrics["train_energy_increases"] == 0
    history = json.load(open(tmp_path / "pre" / "history.json"))
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.2
    fine = T.train(load_config("tiny", [f"data.dataset={data}", f"model.init_from={tmp_path / 'pre'}",
                                        "train.epochs=1", "train.progress=false", "train.tensorboard=false"]),
                   str(tmp_path / "fine"))
    assert fine["task"] == "classify" and 0 <= fine["test_accuracy"] <= 1
    card = open(tmp_path / "pre" / "README.md", encoding="utf-8").read()
    assert f"Pretrained on the unlabelled texts of `{texts}`" in card and "Pretrained on" not in \
        open(tmp_path / "fine" / "README.md", encoding="utf-8").read()
    printed = run_card_snippet(tmp_path / "fine")                    # the classifier's card: its own "Use"
    assert printed.split()[0] in ("0", "1", "neg", "pos", "negative", "positive") and "descent" in printed, printed


def test_resume_mid_stream_pretraining_gives_the_uninterrupted_weights(tmp_path, monkeypatch):
    data = write_topics(tmp_path / "topics", n_train=40)
    cfg = _config(data, write_lines(tmp_path / "texts.txt", 150), "train.epochs=3")
    assert_resume_is_uninterrupted(cfg, tmp_path, monkeypatch)


def test_a_changed_text_file_stops_a_resume(tmp_path, monkeypatch):
    data = write_topics(tmp_path / "topics", n_train=40)
    texts = write_lines(tmp_path / "texts.txt", 150)
    cfg = _config(data, texts, "train.epochs=2")
    interrupt_after(1, cfg, tmp_path / "cut", monkeypatch)
    with open(texts, "a") as fh:
        fh.write("g0w1 g0w2 g0w3 g0w4\n" * 3)
    code = T.main(["--config", "tiny", "--run-dir", str(tmp_path / "cut"), "--resume", *[
        f"{k}={v}" for k, v in (("data.dataset", data), ("task", "masked_tokens"), ("data.texts", texts),
                                ("train.batch_size", 16), ("train.lr", 0.01), ("model.dropout", 0),
                                ("pretrain.heldout", 0.1), ("pretrain.shuffle_buffer", 64),
                                ("train.progress", "false"), ("train.tensorboard", "false"), ("train.epochs", 2))]])
    assert code != 0 and not (tmp_path / "cut" / "metrics.json").exists()


def test_the_memory_benchmark_pretrains_on_its_file(tmp_path):
    from experiments.studies.stream_memory import measure

    doc = measure(0.3, "bpe:300", 128, 0, pretrain_texts=64)
    # about 200 held out (binomial over the file's lines, at most 200), spread over the file
    assert doc["pretrain_texts"] == 64 and 150 <= doc["pretrain_heldout_texts"] <= 200
    assert doc["pretrain_energy_increases"] == 0 and doc["lines_read"] == doc["file_lines"]
    assert doc["rss_peak_mb"] == doc["rss_after_pretrain_mb"] >= doc["rss_after_train_mb"]
