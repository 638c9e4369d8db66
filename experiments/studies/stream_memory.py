"""Peak memory while streaming a large text file: ``python -m experiments.studies.stream_memory [--size-mb 1024]
[--tokenizer bpe:8000] [--batch-size 256] [--pretrain-texts N] [--out FILE.json] [--quick] [--json]``.

Writes a text file of about ``--size-mb`` MB (seeded synthetic sentences, one a line) into a temporary folder,
then streams it twice, as pretraining on unlabelled text does: once to train the subword tokenizer
(`experiments.data.subword.SubwordTokenizer.train` on `experiments.data.stream.iter_text_lines`, the library's
``train_from_iterator``), once more through `iter_text_lines` and the tokenizer's ``encode_texts`` in batches of
``--batch-size`` lines. With ``--pretrain-texts N`` it then pretrains on the file as ``unfold-train`` does with
``task=masked_tokens data.texts=FILE`` (the ``tiny`` model, that tokenizer, one epoch over the first N training
texts; about 200 texts held out, spread over the whole file, so that `experiments.data.stream.TextStream`
reads every line).
It reports the process's peak resident memory (``resource.getrusage``'s ``ru_maxrss``) after writing the file,
after training, after encoding and after pretraining, against the file's size: a bounded reader keeps the peak
flat whatever the size. The temporary folder is removed at the end. ``--out``: the JSON document written
there too (atomically); ``--json``: it is printed as the last line (else a short summary). ``--quick``: a 2 MB
file (the test suite's). Bad arguments: one ``error:`` line, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time

import numpy as np

from unfold.cli import run_main
from unfold.plugins import add_import_arg
from unfold.strict_json import dumps as json_dumps

from ..data.core import DataError
from ..data.stream import MAX_LINE_BYTES, iter_text_lines
from ..data.subword import SubwordTokenizer, parse_tokenizer_spec
from ..runfolder.atomic import atomic_open

PROG = "python -m experiments.studies.stream_memory"
QUICK_MB = 2.0
#: the words the synthetic sentences draw from (a Zipf-like law over them)
WORDS = 20000


def _rss_mb() -> float:
    """The peak resident memory of this process so far, in MB (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2 ** 20 if sys.platform == "darwin" else 2 ** 10)


def write_text_file(path: str, size_bytes: int, seed: int = 0) -> dict:
    """Write about ``size_bytes`` of seeded synthetic sentences (5-40 words a line) to ``path`` (atomic), a block
    at a time; returns ``{"bytes", "lines"}``."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(WORDS)]
    weights = 1.0 / np.arange(1, WORDS + 1)
    weights /= weights.sum()
    written = lines = 0
    with atomic_open(path, "wb") as fh:
        while written < size_bytes:
            lengths = rng.integers(5, 41, size=2000)
            ids = rng.choice(WORDS, size=int(lengths.sum()), p=weights)
            block, start = [], 0
            for n in lengths:
                block.append(" ".join(vocab[i] for i in ids[start:start + n]))
                start += n
            data = ("\n".join(block) + "\n").encode("ascii")
            fh.write(data)
            written += len(data)
            lines += len(block)
    return {"bytes": written, "lines": lines}


def pretrain(path: str, tok, texts: int, work: str, lines: int) -> dict:
    """One epoch of masked-token pretraining of the ``tiny`` model on the first ``texts`` training texts of the
    file at ``path`` (streamed; tokenizer ``tok``), run in this process in ``work``: its figures for the JSON.
    About 200 of the file's ``lines`` texts are held out, spread over the whole file, so that the stream reads
    every line to find them."""
    from ..app.config import load_config
    from ..app.train import train
    from .variants import write_toy_data

    tok_path = os.path.join(work, "tokenizer.json")
    tok.save(tok_path)
    toy = write_toy_data(os.path.join(work, "toy"), 40, 10, 0)       # the dataset a fine-tuning would use
    cfg = load_config("tiny", [f"data.dataset={toy}", "task=masked_tokens", f"data.texts={path}",
                               f"data.tokenizer={tok_path}", "data.glove=none", f"train.max_train_examples={texts}",
                               f"pretrain.heldout={min(0.5, 200 / max(lines, 1))!r}", "pretrain.heldout_max=200",
                               "train.epochs=1", "train.progress=false", "train.tensorboard=false"])
    t0 = time.perf_counter()
    metrics = train(cfg, os.path.join(work, "run"))
    return {"pretrain_texts": metrics["pretrain_texts"], "pretrain_heldout_texts": metrics["heldout_texts"],
            "pretrain_energy_increases": metrics["energy_increases"] + metrics["train_energy_increases"],
            "pretrain_seconds": time.perf_counter() - t0, "rss_after_pretrain_mb": _rss_mb()}


def measure(size_mb: float, tokenizer: str = "bpe:8000", batch_size: int = 256, seed: int = 0,
            pretrain_texts: int = 0) -> dict:
    """The study (module docstring): the JSON document."""
    spec = parse_tokenizer_spec(tokenizer)
    if spec.kind not in ("bpe", "wordpiece"):
        raise DataError(f"the tokenizer must be bpe:N or wordpiece:N, got {tokenizer!r}")
    out = {"tokenizer": tokenizer, "batch_size": batch_size, "max_line_bytes": MAX_LINE_BYTES, "seed": seed,
           "rss_start_mb": _rss_mb(), "python": platform.python_version()}
    with tempfile.TemporaryDirectory(prefix="stream_memory_") as tmp:
        path = os.path.join(tmp, "texts.txt")
        t0 = time.perf_counter()
        out.update({f"file_{k}": v for k, v in write_text_file(path, int(size_mb * 2 ** 20), seed).items()})
        out["rss_after_write_mb"], out["write_seconds"] = _rss_mb(), time.perf_counter() - t0
        t0 = time.perf_counter()
        tok = SubwordTokenizer.train(spec.kind, spec.size, lambda: iter_text_lines(path))
        out["rss_after_train_mb"], out["train_seconds"] = _rss_mb(), time.perf_counter() - t0
        t0 = time.perf_counter()
        lines = tokens = 0
        batch: list = []
        for text in iter_text_lines(path):
            batch.append(text)
            if len(batch) == batch_size:
                tokens += sum(map(len, tok.encode_texts(batch)))
                lines += len(batch)
                batch = []
        tokens += sum(map(len, tok.encode_texts(batch)))
        lines += len(batch)
        out["rss_peak_mb"], out["encode_seconds"] = _rss_mb(), time.perf_counter() - t0
        if pretrain_texts:
            out.update(pretrain(path, tok, pretrain_texts, tmp, out["file_lines"]))
            out["rss_peak_mb"] = out["rss_after_pretrain_mb"]
    out.update({"lines_read": lines, "tokens": tokens, "vocabulary": len(tok),
                "file_mb": out["file_bytes"] / 2 ** 20,
                "peak_over_file": out["rss_peak_mb"] / (out["file_bytes"] / 2 ** 20)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_import_arg(p)
    p.add_argument("--size-mb", type=float, default=1024.0, help="size of the text file written, in MB (1024)")
    p.add_argument("--tokenizer", default="bpe:8000", help="the subword tokenizer trained on the stream (bpe:8000)")
    p.add_argument("--batch-size", type=int, default=256, help="lines encoded at a time (256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic text (0)")
    p.add_argument("--pretrain-texts", type=int, default=0, metavar="N",
                   help="then pretrain the tiny model on the file's first N training texts (0: no pretraining)")
    p.add_argument("--out", help="also write the JSON document to this file")
    p.add_argument("--quick", action="store_true", help=f"a {QUICK_MB:g} MB file (tests)")
    p.add_argument("--json", action="store_true", help="print the JSON document as the last line")
    args = p.parse_args(argv)

    def body() -> int:
        from energies.errors import ConfigError

        size = QUICK_MB if args.quick else args.size_mb
        if not 0 < size <= 2 ** 20:
            raise ConfigError(f"--size-mb must be in (0, {2 ** 20}], got {size!r}")
        if args.batch_size < 1:
            raise ConfigError(f"--batch-size must be an integer >= 1, got {args.batch_size}")
        if args.pretrain_texts < 0:
            raise ConfigError(f"--pretrain-texts must be an integer >= 0, got {args.pretrain_texts}")
        if args.seed < 0:
            raise ConfigError(f"--seed must be an integer >= 0, got {args.seed}")
        try:
            spec = parse_tokenizer_spec(args.tokenizer)
        except Exception as exc:  # noqa: BLE001 -- a DataError: one line naming the flag
            raise ConfigError(f"--tokenizer {args.tokenizer!r}: {exc}") from None
        if spec.kind not in ("bpe", "wordpiece"):
            raise ConfigError(f"--tokenizer must be bpe:N or wordpiece:N, got {args.tokenizer!r}")
        if args.out:
            folder = os.path.dirname(os.path.abspath(args.out))
            if not os.path.isdir(folder):
                raise ConfigError(f"--out {args.out!r}: its folder {folder!r} does not exist")
        doc = measure(size, args.tokenizer, args.batch_size, args.seed, args.pretrain_texts)
        text = json_dumps(doc, indent=1)
        if args.out:
            with atomic_open(args.out, "w") as fh:
                fh.write(text + "\n")
        if args.json:
            print(json_dumps(doc))
        else:
            print(f"{doc['file_mb']:.1f} MB, {doc['lines_read']:,} lines, {doc['tokens']:,} tokens: peak RSS "
                  f"{doc['rss_peak_mb']:.0f} MB (after writing {doc['rss_after_write_mb']:.0f} MB, after training the "
                  f"tokenizer {doc['rss_after_train_mb']:.0f} MB); train {doc['train_seconds']:.1f} s, encode "
                  f"{doc['encode_seconds']:.1f} s" + (f"; pretraining on {doc['pretrain_texts']:,} texts "
                                                      f"{doc['pretrain_seconds']:.1f} s, peak after it "
                                                      f"{doc['rss_after_pretrain_mb']:.0f} MB"
                                                      if "pretrain_texts" in doc else ""))
        return 0
    return run_main(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
