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

Part of the data package: imports nothing of the application.
"""
from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterable, Iterator

from .core import DataError

__all__ = ["MAX_LINE_BYTES", "bounded_lines", "decoded_lines", "iter_text_lines", "text_files", "check_text_source"]

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
