"""Fine-tuning from a pretrained run (``model.init_from``): the embedding and encoder of a masked-token run loaded bit
for bit with a new head, its vocabulary taken as it is, ``train.freeze_encoder_epochs`` keeping them fixed, the
fine-tuned card naming the pretraining run and its fingerprint, and the refusals (exit 2, nothing written): another
encoder shape (``model.d``), another tokenizer, a bundle that fails its checks. One tiny pretraining run per module."""
import hashlib
import json
import os
import shutil

import pytest
import torch

from energies.errors import ConfigError
from experiments.app import train as T
from experiments.app.bundle import TrainedModel
from experiments.app.config import load_config
from experiments.app.init_from import check_compatible, read_pretrained, transfer_weights
from test_train import synthetic_text_dir

BASE = ["data.glove=none", "model.layers=1", "train.progress=false", "train.tensorboard=false",
        "train.batch_size=32"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_text_dir(tmp_path_factory.mktemp("toy"), n_train=160, n_eval=40)


@pytest.fixture(scope="module")
def pre(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("pre") / "run"
    code = T.main(["--config", "tiny", "--run-dir", str(folder), f"data.dataset={data}", "task=masked_tokens",
                   "train.epochs=1", *BASE])
    assert code == 0
    return str(folder)


def _tensors(folder, prefix=("embedding.", "encoder.")):
    sd = TrainedModel.from_pretrained(folder).model.state_dict()
    return {k: v for k, v in sd.items() if k.startswith(prefix)}


def test_a_frozen_fine_tune_keeps_the_pretrained_encoder_bit_for_bit(pre, data, tmp_path):
    run = tmp_path / "fine"
    code = T.main(["--config", "tiny", "--run-dir", str(run), f"data.dataset={data}", f"model.init_from={pre}",
                   "train.epochs=2", "train.freeze_encoder_epochs=2", *BASE])
    assert code == 0
    before, after = _tensors(pre), _tensors(str(run))
    assert before.keys() == after.keys() and len(before) > 3
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the vocabulary is the pretrained run's file, byte for byte (with its <mask>), not one built anew
    assert open(os.path.join(pre, "vocab.json"), "rb").read() == open(run / "vocab.json", "rb").read()
    fine = TrainedModel.from_pretrained(str(run))
    assert fine.vocab.mask_id == 2 and fine.label_names and fine.metrics["init_from"] == pre


def test_an_unfrozen_fine_tune_moves_the_encoder_and_its_card_names_the_pretraining_run(pre, data, tmp_path):
    run = tmp_path / "fine"
    code = T.main(["--config", "tiny", "--run-dir", str(run), f"data.dataset={data}", f"model.init_from={pre}",
                   "train.epochs=1", *BASE])
    assert code == 0
    before, after = _tensors(pre), _tensors(str(run))
    assert any(not torch.equal(before[k], after[k]) for k in before)   # negative control of the frozen test
    metrics = json.load(open(run / "metrics.json"))
    fp = json.load(open(os.path.join(pre, "bundle.json")))["data_fingerprint"]
    digest = hashlib.sha256(json.dumps(fp, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert metrics["init_from"] == pre and metrics["init_from_task"] == "masked_tokens"
    assert metrics["init_from_fingerprint_sha256"] == digest
    card = open(run / "README.md", encoding="utf-8").read()
    assert pre in card and digest in card


def test_transfer_weights_copies_exactly_and_leaves_the_head(pre, data):
    cfg = load_config("tiny", [f"data.dataset={data}", f"model.init_from={pre}", *BASE])
    src = read_pretrained(pre)
    check_compatible(cfg, src)
    from experiments.app.build import build_model

    torch.manual_seed(0)
    model = build_model(cfg, len(src.vocab), 2, None)
    head = model.head.weight.detach().clone()
    copied = transfer_weights(model, src)
    sd = model.state_dict()
    assert copied and all(torch.equal(sd[k], src.state[k]) for k in copied)
    assert torch.equal(model.head.weight, head)


@pytest.mark.parametrize("override, key", [("model.d=24", "model.d"), ("data.tokenizer=bpe:200", "data.tokenizer"),
                                           ("model.layers=2", "model.layers"), ("model.rho=cauchy", "model.rho"),
                                           ("model.mode=baseline", "model.mode")])
def test_another_encoder_or_tokenizer_is_refused_naming_the_key(pre, data, tmp_path, capsys, override, key):
    run = tmp_path / "fine"
    code = T.main(["--config", "tiny", "--run-dir", str(run), f"data.dataset={data}", f"model.init_from={pre}",
                   "train.epochs=1", *BASE, override])
    err = capsys.readouterr().err
    assert code == 2 and f"{key}=" in err and "model.init_from" in err
    assert not run.exists()


def test_a_source_that_fails_its_checks_is_refused(pre, data, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(pre, bad)
    vocab = json.loads((bad / "vocab.json").read_text())
    vocab["itos"][3], vocab["itos"][4] = vocab["itos"][4], vocab["itos"][3]
    (bad / "vocab.json").write_text(json.dumps(vocab))
    run = tmp_path / "fine"
    code = T.main(["--config", "tiny", "--run-dir", str(run), f"data.dataset={data}", f"model.init_from={bad}",
                   "train.epochs=1", *BASE])
    err = capsys.readouterr().err
    assert code == 2 and "model.init_from" in err and "vocab.json" in err and not run.exists()
    with pytest.raises(ConfigError, match="model.init_from"):
        read_pretrained(str(tmp_path / "missing"))
