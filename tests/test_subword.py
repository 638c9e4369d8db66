"""Subword tokenizers (``data.tokenizer: bpe:N | wordpiece:N | PATH``) from the Hugging Face ``tokenizers`` library:
the spec and its refusals (exit 2 from ``unfold-train``, nothing written), deterministic training (byte-identical
``tokenizer.json``, across processes too), the special ids, unknown-token counts, the cut to ``data.max_len``, the
word vocabulary unchanged by default and its optional ``<mask>``, and the bundle round trip of ``tokenizer.json``
(hashed, fingerprinted, tampering refused). One tiny run (1 layer, 1 epoch, ``bpe:200``) is trained per module."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from energies.errors import CheckpointError, ConfigError
from experiments.data import DataError, Vocab, encode, tokenize
from experiments.data.subword import SubwordTokenizer, parse_tokenizer_spec
from test_train import CONFIGS, ROOT, run_train, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")
TEXTS = [f"the film number {i} is {'good' if i % 3 else 'bad'}, very moving and rather long {i % 7}"
         for i in range(200)] + ["a [MASK] film", "Another FILM: café"]


# ------------------------------------------------------------------------------------------- the spec
@pytest.mark.parametrize("spec, kind, size, path", [("words", "words", None, None), ("bpe:200", "bpe", 200, None),
                                                     ("wordpiece:32", "wordpiece", 32, None),
                                                     ("tok/tokenizer.json", "file", None, "tok/tokenizer.json")])
def test_the_spec_is_read(spec, kind, size, path):
    got = parse_tokenizer_spec(spec)
    assert (got.kind, got.size, got.path, got.subword) == (kind, size, path, kind != "words")


@pytest.mark.parametrize("spec, words", [("bpe:5", ["bpe:5", "[32,"]), ("bpe", ["bpe:N"]), ("bpe:x", ["'bpe:x'"]),
                                         ("wordpiece:2000000", ["wordpiece:2000000"]), ("Words", ["'Words'"]),
                                         ("bpe:-3", ["'bpe:-3'"]), ("bpe:１００", ["bpe:１００"])])
def test_a_bad_spec_is_refused(spec, words):
    with pytest.raises(DataError) as exc:
        parse_tokenizer_spec(spec)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def _train_main(args, capsys):
    from experiments.app.train import main

    code = main(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("overrides, words", [
    (["data.tokenizer=bpe:5"], ["data.tokenizer", "bpe:5"]),
    (["data.tokenizer=sentencepiece:100"], ["data.tokenizer", "sentencepiece:100"]),
    (["data.tokenizer=bpe:200", "data.glove=finetune"], ["data.glove", "data.tokenizer", "bpe:200"]),
    (["data.tokenizer=bpe:200", "data.max_vocab=100"], ["data.max_vocab", "data.tokenizer"]),
    (["data.tokenizer=missing/tokenizer.json"], ["data.tokenizer", "missing/tokenizer.json"]),
    (["data.tokenizer={bad}"], ["data.tokenizer", "bad.json", "not a tokenizer.json"]),
    (["data.texts=missing_texts"], ["data.texts", "missing_texts", "does not exist"]),
])
def test_unfold_train_refuses_with_exit_2_and_writes_nothing(tmp_path, capsys, monkeypatch, overrides, words):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": {"type": "nothing"}}')
    run = tmp_path / "run"
    code, err = _train_main(["--config", TINY, "--run-dir", str(run), "train.progress=false"]
                            + [o.replace("{bad}", str(bad)) for o in overrides], capsys)
    assert code == 2 and err.count("error:") == 1, err
    assert all(w in err for w in words), err
    assert not run.exists() and sorted(os.listdir(tmp_path)) == ["bad.json"]


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_training_is_deterministic_and_the_specials_have_fixed_ids(kind):
    a = SubwordTokenizer.train(kind, 120, TEXTS)
    b = SubwordTokenizer.train(kind, 120, iter(TEXTS) if kind == "bpe" else lambda: iter(TEXTS))
    assert a.to_json() == b.to_json() and a.tokenizer_digest == b.tokenizer_digest
    assert a.itos[:3] == ["[PAD]", "[UNK]", "[MASK]"] and (a.pad_id, a.unk_id, a.mask_id) == (0, 1, 2)
    assert a.special_ids == (0, 1, 2) and a.kind == "subword" and a.file_name == "tokenizer.json"
    assert len(a) <= 120 and len(a) == len(a.itos) and a.id_to_token(2) == "[MASK]"
    other = SubwordTokenizer.train(kind, 120, TEXTS[:100])      # the negative control: other texts, another file
    assert other.to_json() != a.to_json()


SCRIPT = ("import sys; sys.path.insert(0, {root!r}); from experiments.data.subword import SubwordTokenizer; "
          "texts = [l.rstrip('\\n') for l in open({path!r}, encoding='utf-8')]; "
          "sys.stdout.write(SubwordTokenizer.train({kind!r}, 150, texts).tokenizer_digest)")


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_training_gives_the_same_file_in_another_process(tmp_path, kind):
    """tokenizers 0.23 numbers WordPiece's ##x tokens in hash-map order (huggingface/tokenizers#1794): without the
    continuation tokens declared up front, two processes disagree. Three processes, one digest."""
    path = tmp_path / "texts.txt"
    rt = [f"{w} {v}ing {w}ed un{v}able {v}{w}" for w in ("run", "walk", "talk", "jump", "read", "play")
          for v in ("bake", "make", "take", "wake", "fake", "rake", "lake")]
    path.write_text("\n".join(TEXTS + rt) + "\n", encoding="utf-8")
    digests = {subprocess.run([sys.executable, "-c", SCRIPT.format(root=ROOT, path=str(path), kind=kind)],
                              capture_output=True, text=True, check=True).stdout for _ in range(3)}
    here = SubwordTokenizer.train(kind, 150, TEXTS + rt).tokenizer_digest
    assert digests == {here}


def test_the_json_round_trips_and_a_bad_file_is_refused(tmp_path):
    tok = SubwordTokenizer.train("bpe", 100, TEXTS)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    back = SubwordTokenizer.load(path)
    assert back == tok and back.to_json() == path.read_text(encoding="utf-8")
    doc = json.loads(tok.to_json())
    bad_cases = {"notjson.json": "{not json", "nan.json": '{"a": NaN}', "list.json": "[1, 2]"}
    doc_pad = json.loads(tok.to_json())
    third = tok.id_to_token(3)
    doc_pad["model"]["vocab"]["[PAD]"], doc_pad["model"]["vocab"][third] = 3, 0
    doc_pad["added_tokens"] = [t for t in doc_pad["added_tokens"] if t["content"] != "[PAD]"]
    doc_unk = json.loads(tok.to_json())
    doc_unk["model"]["unk_token"] = None
    for name, text in {**bad_cases, "pad.json": json.dumps(doc_pad), "unk.json": json.dumps(doc_unk)}.items():
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        with pytest.raises(DataError) as exc:
            SubwordTokenizer.load(p)
        assert str(p) in str(exc.value), (name, str(exc.value))
    assert "padding token" in _message(tmp_path / "pad.json") and "unknown token" in _message(tmp_path / "unk.json")
    with pytest.raises(DataError, match="cannot read tokenizer"):
        SubwordTokenizer.load(tmp_path / "absent.json")
    assert doc["model"]["type"] == "BPE"


def _message(path):
    try:
        SubwordTokenizer.load(path)
    except DataError as exc:
        return str(exc)
    return ""


def test_encoding_cuts_to_max_len_counts_unknown_pieces_and_reads_mask():
    tok = SubwordTokenizer.train("bpe", 120, TEXTS)
    pieces = []
    rows = tok.encode_texts(["a [MASK] film ✓", "", "film " * 50], 8, pieces)
    assert rows[0][1] == tok.mask_id and rows[0][-1] == tok.unk_id and rows[1] == [] and len(rows[2]) == 8
    assert pieces[0][1] == "[MASK]" and pieces[0][-1] == "✓" and pieces[1] == []
    ids, mask, labels = encode([("a film ✓ ✓", 0), ("", 1), ("film " * 50, 0)], tok, 8)
    assert ids.shape == (3, 8) and ids[1, 0] == tok.unk_id and mask[1].sum() == 1 and (ids[~mask] == 0).all()
    assert int(((ids == tok.unk_id) & mask).sum()) == 3             # two ✓ and the empty text's stand-in
    assert mask[2].all() and labels.tolist() == [0, 1, 0]


# ------------------------------------------------------------------------------------------- the word vocabulary
def test_the_word_vocabulary_keeps_its_ids_and_gets_a_mask_only_when_asked():
    token_lists = [tokenize(t) for t in ["b a a c", "a b d", "e"]]
    v = Vocab.build(token_lists)
    assert v.itos == ["<pad>", "<unk>", "a", "b", "c", "d", "e"]            # by count, ties by the string
    assert (v.pad_id, v.unk_id, v.mask_id, v.special_ids) == (0, 1, None, (0, 1))
    assert v.kind == "words" and v.file_name == "vocab.json" and v.tokenizer_digest is None
    assert v.encode_texts(["a [MASK] zz"]) == [[2, 1, 1, 1, 1]]           # no mask token: a [ mask ] zz
    m = Vocab.build(token_lists, mask_token=True)
    assert m.itos == ["<pad>", "<unk>", "<mask>", "a", "b", "c", "d", "e"]
    assert (m.mask_id, m.special_ids, m.id_to_token(2)) == (2, (0, 1, 2), "<mask>")
    assert m.encode_texts(["a [MASK] zz", "[MASK]"], tokens=(kept := [])) == [[3, 2, 1], [2]]
    assert kept == [["a", "<mask>", "zz"], ["<mask>"]]
    assert Vocab.from_json(m.to_json()).mask_id == 2 and Vocab.build(token_lists, max_size=2, mask_token=True).itos \
        == ["<pad>", "<unk>", "<mask>", "a", "b"]


def test_build_data_default_is_the_word_vocabulary_of_before(tmp_path):
    """The default tokenizer builds the vocabulary as earlier versions did (tokens by count, from the training
    split), the fingerprint is the word fingerprint (no tokenizer digest), and no <mask> is added."""
    from experiments.app.build import build_data, fingerprint, train_examples
    from experiments.app.config import load_config
    from experiments.runfolder.fingerprint import data_fingerprint

    data = synthetic_text_dir(tmp_path / "toy", n_train=60, n_eval=20)
    cfg = load_config(TINY, [f"data.dataset={data}"])
    splits, vocab, tensors, glove = build_data(cfg)
    train = train_examples(cfg, splits)
    before = Vocab.build([tokenize(t) for t, _ in train], min_freq=2)
    assert vocab == before and vocab.mask_id is None and glove is None
    assert fingerprint(cfg, splits, vocab) == data_fingerprint(before.itos, train, splits.val, splits.test,
                                                               splits.label_names)
    assert torch.equal(tensors["train"][0], encode(train, before, cfg["data"]["max_len"])[0])
    masked = build_data(cfg, mask_token=True)[1]
    assert masked.itos == ["<pad>", "<unk>", "<mask>"] + before.itos[2:]
    sub_cfg = load_config(TINY, [f"data.dataset={data}", "data.tokenizer=bpe:64", "data.glove=none"])
    sub = build_data(sub_cfg)[1]
    fp = fingerprint(sub_cfg, splits, sub)
    assert fp["vocab"] != data_fingerprint(sub.itos, train, splits.val, splits.test, splits.label_names)["vocab"]
    assert fp["sizes"]["vocab"] == len(sub)


def test_a_tokenizer_file_is_used_as_it_is(tmp_path):
    from experiments.app.build import build_tokenizer
    from experiments.app.config import load_config

    tok = SubwordTokenizer.train("wordpiece", 100, TEXTS)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    cfg = load_config(TINY, [f"data.tokenizer={path}", "data.glove=none"])
    assert build_tokenizer(cfg, [("other texts entirely", 0)]) == tok


# ------------------------------------------------------------------------------------------- the bundle
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("subword_bundle")
    data = synthetic_text_dir(tmp / "toy", n_train=120, n_eval=40)
    folder = tmp / "run"
    proc = run_train(["--config", TINY, "--run-dir", str(folder), f"data.dataset={data}", "data.glove=none",
                      "data.tokenizer=bpe:200", "train.epochs=1", "train.progress=false", "model.layers=1",
                      "train.tensorboard=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(folder)


PROBES = ["w2 great w5 ✓✓", "bad w3 " * 40, "zzz"]


def test_the_run_and_its_bundle_hold_tokenizer_json(run):
    from experiments.app.bundle import TrainedModel

    files = os.listdir(run)
    assert "tokenizer.json" in files and "vocab.json" not in files
    manifest = json.load(open(os.path.join(run, "bundle.json")))
    digest = hashlib.sha256(open(os.path.join(run, "tokenizer.json"), "rb").read()).hexdigest()
    assert manifest["sha256"]["tokenizer.json"] == digest and "vocab.json" not in manifest["sha256"]
    model = TrainedModel.from_pretrained(run)
    assert isinstance(model.vocab, SubwordTokenizer) and model.vocab.tokenizer_digest == digest
    preds = model.predict(PROBES)
    assert preds[0].unknown_tokens == 2 and preds[0].unknown_words == ["✓"]
    assert preds[1].truncated and preds[1].tokens == 32 and not preds[1].prior_only      # tiny: data.max_len=32
    assert preds[2].prior_only and preds[2].unknown_tokens == preds[2].tokens == 3


def test_save_and_from_pretrained_give_the_same_logits(run, tmp_path):
    from experiments.app.bundle import TrainedModel

    model = TrainedModel.from_pretrained(run)
    out = model.save_pretrained(str(tmp_path / "copy"))
    back = TrainedModel.from_pretrained(out)
    assert sorted(n for n in os.listdir(out) if n != ".lock") == ["README.md", "bundle.json", "config.json", "model.safetensors",
                                       "tokenizer.json"]
    assert back.vocab == model.vocab
    assert torch.equal(back.logits(PROBES), model.logits(PROBES))
    assert "`tokenizer.json`" in open(os.path.join(out, "README.md")).read()


def test_a_tampered_tokenizer_is_refused(run, tmp_path):
    from experiments.app.bundle import TrainedModel

    folder = shutil.copytree(run, tmp_path / "t", ignore=shutil.ignore_patterns("*.png", "tensorboard", ".lock"))
    path = folder / "tokenizer.json"
    other = SubwordTokenizer.train("bpe", 200, ["completely different words here"] * 5)
    other.save(path)
    with pytest.raises(CheckpointError, match="tokenizer.json changed since bundle.json was written"):
        TrainedModel.from_pretrained(str(folder))
    doc = json.loads(open(os.path.join(run, "tokenizer.json"), encoding="utf-8").read())
    vocab = doc["model"]["vocab"]                                # two token ids swapped: same size, other ids
    a, b = sorted(vocab, key=vocab.get)[10:12]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(doc), encoding="utf-8")
    manifest = json.load(open(folder / "bundle.json"))           # and its sha256 recomputed: still refused
    manifest["sha256"]["tokenizer.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        TrainedModel.from_pretrained(str(folder))
    manifest["data_fingerprint"] = None                          # no fingerprint: the model card still refuses it
    (folder / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="bundle.json"):
        TrainedModel.from_pretrained(str(folder))
    shutil.copy(os.path.join(run, "tokenizer.json"), path)       # the positive control: restored, it loads
    shutil.copy(os.path.join(run, "bundle.json"), folder / "bundle.json")
    assert TrainedModel.from_pretrained(str(folder)).vocab == TrainedModel.from_pretrained(run).vocab


def test_a_config_that_names_words_does_not_take_tokenizer_json(run, tmp_path):
    from experiments.app.bundle import TrainedModel

    folder = shutil.copytree(run, tmp_path / "w", ignore=shutil.ignore_patterns("*.png", "tensorboard", ".lock"))
    cfg = json.load(open(folder / "config.json"))
    cfg["data"]["tokenizer"] = "words"
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    with pytest.raises(CheckpointError):
        TrainedModel.from_pretrained(str(folder))


def test_unfold_predict_reads_the_subword_bundle(run, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.app.predict", run, "--text", "w2 great ✓", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[0])
    assert out["unknown_tokens"] == 1 and out["unknown_words"] == ["✓"] and out["verdict"] == "descent"


def test_the_guide_python_block_runs_as_written(capsys):
    text = open(os.path.join(ROOT, "docs", "guides", "tokenizers.md"), encoding="utf-8").read()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "tokenizers.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "['[PAD]', '[UNK]', '[MASK]'] 0 1 2"
    assert lines[1].startswith("[[") and ", 2, " in lines[1] and lines[1].endswith(", 1]]")
    assert lines[2] == "['<pad>', '<unk>', '<mask>', 'a', 'cat', 'film'] 2"
