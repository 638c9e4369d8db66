"""Unlabelled text read as a stream, in bounded memory: one text a line, from a plain text file or a folder of
``*.txt`` files (taken in sorted order).

* `iter_text_lines`: the texts of a file or folder, each line decoded as strict UTF-8, stripped, blank lines
  skipped. Lines are read at most `MAX_LINE_BYTES` + 1 bytes at a time, so memory stays bounded whatever the
  size of the file (a 1 GB file is never loaded) or the length of a line; a longer line, or a byte that is not
  UTF-8, is a `DataError` naming the file and the line's number.
* `bounded_lines` and `decoded_lines`: the two steps of that reading, shared with `unfold-predict --file`
  (`experiments.app.predict`), which reads its texts by the same rule and refuses with its own error type.
* `text_files` and `check_text_source`: the files a path names, and the check the config key ``data.texts`` gets
  when a config is loaded (it exists, it is readable, it is a file or a folder holding ``*.txt`` files).
* `TextStream`: the texts of a file or folder split into training and held-out texts by a rule on each text's
  number (no text is held in memory but the held-out ones, at most ``heldout_max``), and its training texts read
  again at every epoch through a seeded shuffle buffer (`shuffle_buffer`) into padded batches: pretraining on a
  file of any size in bounded memory.

Part of the data package: imports nothing of the application.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterable, Iterator
from typing import Optional

import torch

from .core import DataError

__all__ = ["MAX_LINE_BYTES", "bounded_lines", "decoded_lines", "iter_text_lines", "text_files", "check_text_source",
           "TextStream", "held_out", "shuffle_buffer"]

#: the longest line (text) read, in bytes of UTF-8 without its line break: 1 MiB. Lines are read at most this much
#: at a time; a longer line is refused naming its number (a model reads only a text's first ``data.max_len``
#: tokens anyway)
MAX_LINE_BYTES = 2 ** 20


def _bytes(n: int) -> str:
    return f"{n:,} bytes" + (" (1 MiB)" if n == 2 ** 20 else "")


def bounded_lines(read_line: Callable[[int], bytes], where: str, max_line_bytes: int = MAX_LINE_BYTES,
                  error: type = DataError) -> Iterator[bytes]:
    """The byte lines of a stream, each read in at most ``max_line_bytes + 1`` bytes.

    Args:
        read_line: a ``readline(size)`` returning at most ``size`` bytes (``b""`` at the end).
        where: what the stream is, for the message (a file's path, ``--file - (stdin)``).
        max_line_bytes: the longest line accepted, its line break not counted.
        error: the exception type raised (`DataError` here, `ConfigError` for `unfold-predict`).

    Returns:
        An iterator of the raw lines (each ending with ``\\n``, but perhaps the last). A line longer than
        ``max_line_bytes`` raises ``error`` naming ``where`` and the line's number.
    """
    number = 0
    while True:
        raw = read_line(max_line_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) - raw.endswith(b"\n") > max_line_bytes:      # its bytes, the line break not counted
            raise error(f"{where}: line {number} is longer than {_bytes(max_line_bytes)}, the most a line may hold "
                        "(the model reads only a text's first data.max_len tokens): cut the line, or break the "
                        "input into lines")
        yield raw


def decoded_lines(raw_lines: Iterable[bytes], where: str, error: type = DataError) -> Iterator[str]:
    """The texts of byte lines, one line held at a time.

    Each line is decoded as strict UTF-8 and split at every line break ``str.splitlines`` knows; blank texts are
    skipped, so the result is the texts of ``all_bytes.decode().splitlines()`` that are not blank.

    Args:
        raw_lines: byte lines (`bounded_lines`).
        where: what the stream is, for the message.
        error: the exception type raised for bytes that are not UTF-8; the message names ``where``, the byte
            offset in the whole input and the line's number.

    Returns:
        An iterator of the texts, as they are in the input (not stripped).
    """
    offset = 0
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {offset + exc.start}, line {number})"
                        ) from None
        offset += len(raw)
        for text in line.splitlines():
            if text.strip():
                yield text


def text_files(path) -> list:
    """The files ``path`` names: itself when it is a file, the ``*.txt`` files of a folder (not its sub-folders)
    in sorted order; a `DataError` naming the path when it is neither, or a folder holding no ``*.txt`` file."""
    p = pathlib.Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        try:
            files = sorted(f for f in p.iterdir() if f.suffix == ".txt" and f.is_file())
        except OSError as exc:
            raise DataError(f"{path}: the folder cannot be read ({exc.strerror or exc})") from None
        if not files:
            raise DataError(f"{path}: the folder holds no *.txt file (unlabelled text: one text a line in .txt "
                            "files, or one text file)")
        return files
    what = "does not exist" if not os.path.lexists(p) else "is neither a file nor a folder"
    raise DataError(f"{path} {what}: unlabelled text is a text file (one text a line) or a folder of *.txt files")


def check_text_source(path) -> None:
    """Refuse, with a `DataError` naming it, a ``path`` that is not a readable text file or folder of ``*.txt``
    files (`text_files`); each file is opened, nothing is read."""
    for f in text_files(path):
        try:
            with open(f, "rb"):
                pass
        except OSError as exc:
            raise DataError(f"{f} cannot be read ({exc.strerror or exc})") from None


def iter_text_lines(path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The texts of a text file or of a folder's ``*.txt`` files (sorted), one a line, read as a stream.

    Args:
        path: a file, or a folder whose ``*.txt`` files are read in sorted order (`text_files`).
        max_line_bytes: the longest line accepted, in bytes (`bounded_lines`); each read asks for at most one
            more byte than this, so memory stays bounded however large the file is.

    Returns:
        An iterator of the non-blank lines, stripped, decoded as strict UTF-8. A byte that is not UTF-8, or a line
        over ``max_line_bytes``, raises `DataError` naming the file and the line's number.
    """
    if isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int) or max_line_bytes < 1:
        raise DataError(f"max_line_bytes must be an integer >= 1, got {max_line_bytes!r}")
    for f in text_files(path):
        with open(f, "rb") as fh:
            for text in decoded_lines(bounded_lines(fh.readline, str(f), max_line_bytes), str(f)):
                yield text.strip()


_MASK64 = 2 ** 64 - 1


def held_out(seed: int, number: int, fraction: float) -> bool:
    """Whether text ``number`` (from 0) of a stream is picked for holding out: ``u < fraction`` with ``u`` in [0, 1)
    the SplitMix64 hash of ``(seed, number)`` (Steele et al., 2014), so that the choice needs no state, no memory and
    no pass over the file, and is the same on every reading."""
    z = (seed * 0x9E3779B97F4A7C15 + (number + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) * 2.0 ** -53 < fraction


def shuffle_buffer(items: Iterable, size: int, generator: torch.Generator, chunk: int = 4096) -> Iterator:
    """``items`` in a random order drawn with a buffer of ``size`` items (the shuffle buffer of ``tf.data`` and
    ``torchdata``): the first ``size`` fill it; then each new item takes the place of a uniformly drawn one, which
    is yielded; at the end the rest come in a random permutation. At most ``size`` items are held; ``size`` 1 keeps
    the order. The draws come from ``generator`` (``chunk`` at a time), so a seeded generator gives one order."""
    buf: list = []
    draws: list = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        if not draws:
            draws = torch.randint(size, (chunk,), generator=generator).tolist()[::-1]
        j = draws.pop()
        yield buf[j]
        buf[j] = item
    for j in torch.randperm(len(buf), generator=generator).tolist():
        yield buf[j]


class TextStream:
    """The unlabelled texts of a file or folder (`iter_text_lines`), split by `held_out` into training texts,
    read again at every epoch, and held-out texts, kept in memory.

    Text ``i`` (from 0, blank lines not counted) is held out when `held_out` picks it and fewer than ``heldout_max``
    were picked before it; every other text is a training text, up to the first ``limit`` of them. Construction
    reads the source once, to count the training texts and keep the held-out ones; it refuses a source with no
    training text or no held-out text. Iterating yields ``(text, 0)`` for each training text in file order, and
    ``len`` is their number, so that the stream stands for a list of unlabelled examples (a data fingerprint hashes
    it as it would the list).

    Args:
        path: a text file, or a folder of ``*.txt`` files (`text_files`).
        heldout: the share of texts `held_out` picks, in (0, 1).
        seed: the seed of that rule.
        heldout_max: the most held-out texts kept.
        limit: the most training texts used (None: all).
    """

    def __init__(self, path, heldout: float, seed: int, heldout_max: int, limit: Optional[int] = None):
        self.path, self.heldout, self.seed, self.heldout_max, self.limit = path, heldout, seed, heldout_max, limit
        self.stamp = self._stamp()
        self.heldout_texts: list = []
        self.count = 0
        for train, text in self._split():
            if train:
                self.count += 1
            else:
                self.heldout_texts.append(text)
        if not self.count or not self.heldout_texts:
            raise DataError(f"data.texts={path}: {self.count} training and {len(self.heldout_texts)} held-out texts "
                            f"(pretrain.heldout={heldout}); pretraining needs at least one of each: give more "
                            "lines or a larger pretrain.heldout")

    def _stamp(self) -> list:
        """Each file's path, size and modification time: what a later reading checks is unchanged."""
        return [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in text_files(self.path)]

    def check_unchanged(self) -> None:
        """Refuse, with a `DataError` naming the file, a source whose files changed (added, removed, resized or
        rewritten) since the stream was made: its training texts would no longer be the ones counted, held out
        and fingerprinted."""
        now = self._stamp()
        if now != self.stamp:
            changed = sorted({f for f, *_ in now} ^ {f for f, *_ in self.stamp} | {a[0] for a, b in zip(now, self.stamp)
                                                                               if a != b})
            raise DataError(f"data.texts={self.path}: {', '.join(changed)} changed while the run read it (size or "
                            "modification time): the texts counted, held out and fingerprinted are no longer those "
                            "of the file; restore it, or start a new run on the new texts")

    def _split(self) -> Iterator:
        """``(is_training, text)`` in file order, up to the last training text ``limit`` allows."""
        picked = used = 0
        for number, text in enumerate(iter_text_lines(self.path)):
            if picked < self.heldout_max and held_out(self.seed, number, self.heldout):
                picked += 1
                yield False, text
            elif self.limit is None or used < self.limit:
                used += 1
                yield True, text
            elif picked >= self.heldout_max:
                return

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator:
        left = self.count
        for train, text in self._split():
            if left and train:
                left -= 1
                yield text, 0
            if not left:            # past the last training text: the rest of the file is not read again
                return

    def batches(self, encode: Callable, batch_size: int, buffer: int,
                generator: Optional[torch.Generator] = None) -> Iterator:
        """The training texts in batches of ``batch_size`` (the last may be smaller), each ``encode(texts)``;
        shuffled through a buffer of ``buffer`` texts (`shuffle_buffer`) with ``generator``, in file order with
        ``generator`` None. A source changed since the stream was made is refused first (`check_unchanged`)."""
        self.check_unchanged()
        texts = (text for text, _ in self)
        if generator is not None:
            texts = shuffle_buffer(texts, buffer, generator)
        batch: list = []
        for text in texts:
            batch.append(text)
            if len(batch) == batch_size:
                yield encode(batch)
                batch = []
        if batch:
            yield encode(batch)
