"""Masked-token pretraining (task: masked_tokens): a tiny model learns, the masking is BERT's and never touches
padding or special tokens, resume is bit-identical, fill-mask answers as Hugging Face's pipeline does, and tasks
are registered parts."""
import json
import math
import os
import random

import pytest
import safetensors.torch
import torch

from experiments.app import predict as P
from experiments.app import train as T
from experiments.app.bundle import TrainedModel
from experiments.app.config import load_config
from experiments.app.fill_mask import FillMaskPrediction
from experiments.app.tasks import TASKS, register_task, task_of
from experiments.app.tasks.classify import Classify
from experiments.app.tasks.masked_tokens import (IGNORE, batch_generator, heldout_split, mask_batch)
from experiments.data import Vocab

GROUPS = [[f"g{g}w{i}" for i in range(6)] for g in range(5)]


def write_topics(folder, n_train=400, seed=0):
    """Texts whose words all come from one of 5 groups of 6: a masked word's group is read from its context, so
    a model that learns beats the unigram guess (about 1/30) by far (about 1/6)."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", n_train), ("val", 20), ("test", 20)):
        with open(os.path.join(folder, f"{split}.jsonl"), "w") as fh:
            for _ in range(n):
                g = rng.randrange(5)
                text = " ".join(rng.choice(GROUPS[g]) for _ in range(rng.randint(8, 14)))
                fh.write(json.dumps({"text": text, "label": rng.randint(0, 1)}) + "\n")
    return str(folder)


def config(data, *extra):
    return load_config("tiny", [f"data.dataset={data}", "task=masked_tokens", "train.batch_size=16",
                                "train.lr=0.01", "model.dropout=0", "pretrain.heldout=0.2", "train.progress=false",
                                "train.tensorboard=false", *extra])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrain")
    data = write_topics(root / "topics")
    cfg = config(data, "train.epochs=8")
    metrics = T.train(cfg, str(root / "run"))
    return cfg, str(root / "run"), metrics


def test_the_loss_falls_and_masked_accuracy_beats_the_unigram_baseline(pretrained):
    cfg, run, metrics = pretrained
    history = json.load(open(os.path.join(run, "history.json")))
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.2
    assert metrics["task"] == "masked_tokens" and "test_accuracy" not in metrics
    # the unigram baseline computed here: the held-out texts masked as the run masks them
    vocab = Vocab.load(os.path.join(run, "vocab.json"))
    texts = [json.loads(line)["text"] for line in open(os.path.join(cfg["data"]["dataset"], "train.jsonl"))]
    _, held = heldout_split(len(texts), 0.2, cfg["data"]["seed"])
    assert metrics["heldout_texts"] == len(held) == 80 and metrics["pretrain_texts"] == 320
    from experiments.data import encode

    ids, mask, _ = encode([(texts[i], 0) for i in held.tolist()], vocab, cfg["data"]["max_len"])
    targets = []
    for b, start in enumerate(range(0, len(held), 16), start=1):
        m = mask[start:start + 16]
        L = int(m.sum(1).max())
        _, t = mask_batch(ids[start:start + 16, :L], m[:, :L], vocab, 0.15, None, batch_generator(0, 0, b))
        targets.append(t[t != IGNORE])
    counts = torch.bincount(torch.cat(targets))
    unigram = float(counts.max()) / float(counts.sum())
    assert metrics["unigram_masked_accuracy"] == pytest.approx(unigram)
    assert metrics["masked_accuracy"] > unigram + 0.04, (metrics["masked_accuracy"], unigram)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["masked_loss"]))


def test_pretraining_is_traced_at_every_layer_with_no_increase(pretrained):
    _, run, metrics = pretrained
    assert metrics["train_energy_steps"] > 0 and metrics["train_energy_increases"] == 0
    assert metrics["energy_verdict"] == "descent" and metrics["energy_increases"] == 0
    assert metrics["energy_steps"] == 80 * 2 and metrics["untrained"]["energy_increases"] == 0
    trace = torch.load(os.path.join(run, "energy_trace.pt"), weights_only=True)
    assert trace["dtype"] == "float64" and all(v.shape == (80, 3) for v in trace["energies"].values())


def test_the_bundle_says_its_task_and_loads(pretrained):
    _, run, metrics = pretrained
    manifest = json.load(open(os.path.join(run, "bundle.json")))
    assert manifest["task"] == "masked_tokens" and manifest["label_names"] == []
    card = open(os.path.join(run, "README.md")).read()
    assert "pipeline_tag: fill-mask" in card and "masked_accuracy" in card
    model = TrainedModel.from_pretrained(run)
    assert model.task == "masked_tokens" and model.label_names == []
    assert model.model.head.tied            # d = 16 = the embedding's width (no GloVe): tied to the table
    preds = model.predict(["g2w0 g2w1 [MASK] g2w3 g2w4"], top_k=3)
    assert isinstance(preds[0], FillMaskPrediction) and len(preds[0].masks[0]) == 3


def test_a_classify_bundle_edited_to_claim_a_task_is_refused(pretrained, tmp_path):
    import shutil
    from energies.errors import CheckpointError

    _, run, _ = pretrained
    copy = tmp_path / "b"
    shutil.copytree(run, copy)
    manifest = json.load(open(copy / "bundle.json"))
    del manifest["task"]
    (copy / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="label_names"):
        TrainedModel.from_pretrained(str(copy))


def _json_lines(capsys, argv):
    code = P.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_fill_mask_text_and_json(pretrained, capsys):
    _, run, _ = pretrained
    code, out, err = _json_lines(capsys, [run, "--text", "g1w0 g1w2 [MASK] g1w3 [MASK]", "--text", "[MASK] g4w1",
                                          "--json", "--top-k", "4"])
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and [len(r["masks"]) for r in rows] == [2, 1]
    for row in rows:
        assert row["verdict"] == "descent" and row["increases"] == 0 and len(row["energies"]) == 3
        for k, cands in enumerate(row["masks"]):
            scores = [c["score"] for c in cands]
            assert len(cands) == 4 and scores == sorted(scores, reverse=True)
            assert all(math.isfinite(s) and 0 <= s <= 1 for s in scores) and sum(scores) <= 1 + 1e-9
            for c in cands:
                assert set(c) == {"score", "token", "token_str", "sequence"}
                assert c["token_str"] not in ("<pad>", "<unk>", "<mask>")
                parts = row["text"].split("[MASK]")
                assert c["sequence"] == "[MASK]".join(parts[:k + 1]) + c["token_str"] + "[MASK]".join(parts[k + 1:])
    code, out, err = _json_lines(capsys, [run, "--text", "g1w0 [MASK] g1w3"])
    assert code == 0 and out.count("\n") == 1 and "descent (0 increases)" in out and out.startswith("[g")


def test_a_text_without_mask_is_refused(pretrained, capsys):
    _, run, _ = pretrained
    code, out, err = _json_lines(capsys, [run, "--text", "g1w0 g1w2"])
    assert code == 2 and out == "" and "[MASK]" in err


def test_masking_is_bert_s_and_never_touches_padding_or_special_tokens():
    vocab = Vocab.build([[f"t{i}" for i in range(60)]], mask_token=True)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(vocab), (400, 50), generator=g)
    ids[:, ::7] = Vocab.UNK
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 40:] = False
    ids[:, 40:] = Vocab.PAD
    inputs, targets = mask_batch(ids, mask, vocab, 0.15, None, torch.Generator().manual_seed(1))
    again = mask_batch(ids, mask, vocab, 0.15, None, torch.Generator().manual_seed(1))
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])        # deterministic
    chosen = targets != IGNORE
    special = (ids == Vocab.UNK) | ~mask
    assert not chosen[special].any() and torch.equal(inputs[special], ids[special])
    assert torch.equal(targets[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    n = int((~special).sum())
    k = int(chosen.sum())
    assert abs(k - 0.15 * n) < 5 * math.sqrt(n * 0.15 * 0.85)
    as_mask = int((inputs[chosen] == vocab.mask_id).sum())
    kept = int((inputs[chosen] == ids[chosen]).sum())
    rand = k - as_mask - kept
    for count, p in ((as_mask, 0.8), (rand, 0.1 * 56 / 57), (kept, 0.1 + 0.1 / 57)):
        assert abs(count - p * k) < 5 * math.sqrt(k * p * (1 - p)), (count, p, k)
    assert not torch.isin(inputs[chosen & (inputs != vocab.mask_id)], torch.tensor([0, 1, 2])).any()


def test_span_masking_chooses_geometric_spans_at_the_rate():
    vocab = Vocab.build([[f"t{i}" for i in range(60)]], mask_token=True)
    ids = torch.randint(3, len(vocab), (300, 60), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    runs = {}
    for span in (None, 3.0):
        _, targets = mask_batch(ids, mask, vocab, 0.15, span, torch.Generator().manual_seed(2))
        chosen = targets != IGNORE
        assert abs(int(chosen.sum()) - round(0.15 * 60) * 300) <= (0 if span else 5 * math.sqrt(18000 * 0.13))
        lengths = [len(r) for row in chosen.tolist() for r in "".join("x" if c else " " for c in row).split()]
        runs[span] = sum(lengths) / len(lengths)
    assert runs[None] < 1.4 and 2.2 < runs[3.0] < 4.5, runs


def interrupt_after(epoch_to_stop, cfg, folder, monkeypatch):
    """Train ``cfg`` into ``folder``, interrupted (Ctrl-C) after epoch ``epoch_to_stop`` has been saved."""
    real = T._end_epoch

    def stop(run, epoch, *args):
        real(run, epoch, *args)
        if epoch == epoch_to_stop:
            raise KeyboardInterrupt

    monkeypatch.setattr(T, "_end_epoch", stop)
    with pytest.raises(KeyboardInterrupt):
        T.train(cfg, str(folder))
    monkeypatch.setattr(T, "_end_epoch", real)


def assert_resume_is_uninterrupted(cfg, tmp_path, monkeypatch, stop_after=2):
    """A run interrupted after epoch ``stop_after`` and resumed ends with the weights of an uninterrupted one."""
    T.train(cfg, str(tmp_path / "whole"))
    interrupt_after(stop_after, cfg, tmp_path / "cut", monkeypatch)
    T.train(cfg, str(tmp_path / "cut"), resume=True)
    a = safetensors.torch.load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = safetensors.torch.load_file(str(tmp_path / "cut" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_mid_pretraining_gives_the_uninterrupted_weights(tmp_path, monkeypatch):
    data = write_topics(tmp_path / "topics", n_train=120)
    assert_resume_is_uninterrupted(config(data, "train.epochs=3", "pretrain.span_mean=2"), tmp_path, monkeypatch)


def test_baseline_mode_pretrains_with_the_same_recipe(tmp_path, capsys):
    data = write_topics(tmp_path / "topics", n_train=120)
    metrics = T.train(config(data, "train.epochs=2", "model.mode=baseline"), str(tmp_path / "run"))
    assert metrics["mode"] == "baseline" and metrics["task"] == "masked_tokens"
    assert math.isfinite(metrics["masked_loss"]) and metrics["energy_steps"] > 0
    code, out, err = _json_lines(capsys, [str(tmp_path / "run"), "--text", "g0w1 [MASK]", "--json"])
    assert code == 0 and len(json.loads(out)["masks"][0]) == 5


def test_an_unknown_task_is_refused_naming_the_key(tmp_path, capsys):
    code = T.main(["--config", "tiny", "--run-dir", str(tmp_path / "r"), "task=nonsense"])
    err = capsys.readouterr().err
    assert code == 2 and "'task'" in err and "masked_tokens" in err and not (tmp_path / "r").exists()


class CountingClassify(Classify):
    """A plug-in's task: classify, counting its batches."""

    batches_seen = 0

    def batches(self, tensors, batch_size, generator=None, epoch=None):
        for batch in super().batches(tensors, batch_size, generator, epoch):
            CountingClassify.batches_seen += 1
            yield batch


@pytest.fixture
def counting_task():
    """The plug-in's task registered for one test, then removed (a registry is process-wide: left behind, it would
    appear in every later listing of the tasks, the config reference among them)."""
    register_task("counting_classify")(CountingClassify)
    try:
        yield CountingClassify
    finally:
        TASKS.pop("counting_classify", None)


def test_a_task_registered_by_a_plug_in_is_picked_up(tmp_path, counting_task):
    data = write_topics(tmp_path / "topics", n_train=120)
    cfg = load_config("tiny", [f"data.dataset={data}", "task=counting_classify", "train.epochs=1",
                               "train.progress=false", "train.tensorboard=false"])
    assert isinstance(task_of(cfg), CountingClassify)
    before = CountingClassify.batches_seen
    metrics = T.train(cfg, str(tmp_path / "run"))
    assert metrics["task"] == "counting_classify" and CountingClassify.batches_seen > before
    assert "test_accuracy" in metrics and TrainedModel.from_pretrained(str(tmp_path / "run")).task == \
        "counting_classify"


def run_card_snippet(folder) -> str:
    """The Python block of the "Use" section of ``folder``'s model card, run on ``folder``: what it prints."""
    import contextlib
    import io
    import re

    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    (code,) = re.findall(r"## Use\n\n```python\n(.*?)```", card, re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace("PATH_OR_HUB_ID", str(folder)), {})      # the card's own text, as a reader copies it
    return out.getvalue()


def test_the_cards_use_section_fills_a_mask(pretrained):
    _, run, _ = pretrained
    printed = run_card_snippet(run)
    assert printed.startswith("[(") and "descent" in printed and printed.count("', 0.") == 5, printed
