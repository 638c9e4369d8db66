"""Unlabelled text: a dataset's training texts (never val/test), and a text file or folder of ``*.txt`` files read as
a stream in bounded memory (`experiments.data.stream.iter_text_lines`): lines stripped, blanks skipped, bad bytes
and overlong lines refused naming the file and line, a ~20 MB file read with a small, flat Python heap; a subword
tokenizer trained from the stream is the one trained from the same texts in a list; ``data.texts`` checked at
config load; the memory benchmark's ``--quick``."""
import json
import os
import subprocess
import sys
import tracemalloc

import pytest

from energies.errors import ConfigError
from experiments.data import DataError
from experiments.data.stream import MAX_LINE_BYTES, check_text_source, iter_text_lines, text_files
from experiments.data.subword import SubwordTokenizer
from test_train import CONFIGS, ROOT, synthetic_text_dir

TINY = os.path.join(CONFIGS, "tiny.yaml")


def test_lines_are_stripped_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"  first text \r\n\n   \nsecond\tone\ncaf\xc3\xa9 au lait\nlast without break")
    assert list(iter_text_lines(path)) == ["first text", "second\tone", "café au lait", "last without break"]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert list(iter_text_lines(empty)) == []


def test_a_folder_is_its_txt_files_in_sorted_order(tmp_path):
    (tmp_path / "b.txt").write_text("b1\nb2\n")
    (tmp_path / "a.txt").write_text("a1\n")
    (tmp_path / "other.md").write_text("not read\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("not read either\n")
    assert [f.name for f in text_files(tmp_path)] == ["a.txt", "b.txt"]
    assert list(iter_text_lines(tmp_path)) == ["a1", "b1", "b2"]
    (tmp_path / "a.txt").unlink()
    (tmp_path / "b.txt").unlink()
    with pytest.raises(DataError, match="no \\*.txt file"):
        check_text_source(tmp_path)
    with pytest.raises(DataError, match="does not exist"):
        list(iter_text_lines(tmp_path / "absent.txt"))


def test_a_bad_byte_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"good\nalso good\nbad \xff byte\nnever read\n")
    got = []
    with pytest.raises(DataError) as exc:
        for text in iter_text_lines(path):
            got.append(text)
    assert got == ["good", "also good"]                      # the lines before it were given
    assert str(path) in str(exc.value) and "line 3" in str(exc.value) and "not UTF-8" in str(exc.value)


def test_a_line_over_the_bound_is_refused_naming_it(tmp_path):
    path = tmp_path / "long.txt"
    path.write_bytes(b"ok\n" + b"x" * 101 + b"\nnext\n")
    with pytest.raises(DataError) as exc:
        list(iter_text_lines(path, max_line_bytes=100))
    assert str(path) in str(exc.value) and "line 2 is longer than 100 bytes" in str(exc.value)
    assert list(iter_text_lines(path, max_line_bytes=101))[1] == "x" * 101        # exactly the bound passes
    with pytest.raises(DataError, match="max_line_bytes"):
        list(iter_text_lines(path, max_line_bytes=0))
    assert MAX_LINE_BYTES == 2 ** 20


def test_a_20_mb_file_streams_in_bounded_memory(tmp_path):
    """The file is 20 MB, far beyond any read buffer; the Python heap's peak while reading it all stays under
    1 MB (a reader that loaded the file would hold 20 MB of bytes, then more as str)."""
    path = tmp_path / "big.txt"
    line = ("word " * 19 + "end\n").encode()
    with open(path, "wb") as fh:
        for _ in range(20 * 2 ** 20 // (len(line) * 1000) + 1):
            fh.write(line * 1000)
    size = path.stat().st_size
    assert size >= 20 * 2 ** 20
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_text_lines(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == size // len(line)
    assert peak < 2 ** 20, peak


def test_the_training_texts_exclude_validation_and_test(tmp_path):
    from experiments.app.build import train_examples, train_texts
    from experiments.app.config import load_config
    from experiments.data import load_configured

    data = synthetic_text_dir(tmp_path / "toy", n_train=80, n_eval=30)
    cfg = load_config(TINY, [f"data.dataset={data}"])
    splits = load_configured(cfg["data"])
    texts = train_texts(cfg, splits)
    assert texts == [t for t, _ in splits.train] and len(texts) == 80
    held_out = {t for t, _ in splits.val + splits.test}
    assert held_out and not held_out & set(texts)
    limited = load_config(TINY, [f"data.dataset={data}", "train.max_train_examples=25"])
    assert train_texts(limited, splits) == [t for t, _ in train_examples(limited, splits)] == texts[:25]


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_a_tokenizer_trained_from_the_stream_is_the_one_from_the_list(tmp_path, kind):
    path = tmp_path / "t.txt"
    texts = [f"stream text {i} about films and {'plots' if i % 2 else 'actors'}" for i in range(300)]
    path.write_text("\n".join(texts) + "\n")
    streamed = SubwordTokenizer.train(kind, 80, lambda: iter_text_lines(path))
    assert streamed.to_json() == SubwordTokenizer.train(kind, 80, texts).to_json()


def test_data_texts_is_where_the_vocabulary_is_learnt(tmp_path):
    from experiments.app.build import build_tokenizer
    from experiments.app.config import load_config

    path = tmp_path / "corpus.txt"
    path.write_text("zebra zebra quokka\n" * 50)
    words = build_tokenizer(load_config(TINY, [f"data.texts={path}"]), [("only this", 0)])
    assert "zebra" in words and "quokka" in words and "this" not in words
    sub = build_tokenizer(load_config(TINY, [f"data.texts={path}", "data.tokenizer=bpe:40", "data.glove=none"]),
                          [("only this", 0)])
    assert "zebra" in sub and sub.encode_texts(["zebra"]) == [[sub.tokenizer.token_to_id("zebra")]]


def test_data_texts_is_checked_when_the_config_is_loaded(tmp_path, capsys, monkeypatch):
    from experiments.app.config import load_config
    from experiments.app.train import main

    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ConfigError, match="data.texts.*no \\*.txt file"):
        load_config(TINY, [f"data.texts={tmp_path / 'empty_dir'}"])
    (tmp_path / "empty_dir" / "a.txt").write_text("a text\n")
    assert load_config(TINY, [f"data.texts={tmp_path / 'empty_dir'}"])["data"]["texts"] == str(tmp_path / "empty_dir")
    monkeypatch.chdir(tmp_path)
    code = main(["--config", TINY, "--run-dir", str(tmp_path / "run"), "data.texts=nowhere.txt"])
    err = capsys.readouterr().err
    assert code == 2 and "data.texts" in err and "nowhere.txt" in err and not (tmp_path / "run").exists()


def test_the_memory_benchmark_quick(tmp_path):
    out = tmp_path / "stream.json"
    proc = subprocess.run([sys.executable, "-m", "experiments.studies.stream_memory", "--quick", "--json",
                           "--tokenizer", "bpe:500", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**os.environ, "RAYON_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == json.loads(out.read_text())
    assert doc["lines_read"] == doc["file_lines"] > 0 and 1.9 < doc["file_mb"] < 2.2 and doc["vocabulary"] == 500
    assert doc["tokens"] >= doc["lines_read"] * 5          # 5 to 40 words a line, each at least one token
    assert doc["rss_start_mb"] <= doc["rss_after_write_mb"] <= doc["rss_after_train_mb"] <= doc["rss_peak_mb"]
    assert not [n for n in os.listdir(tmp_path) if n != "stream.json"]
