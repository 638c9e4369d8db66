"""Text to tensors: the tokeniser (`tokenize`, GloVe / Penn Treebank style), the vocabulary
(`Vocab`), padding into id and mask tensors (`encode`) and mini-batches (`batches`)."""
from __future__ import annotations

import collections
import html
import json
import pathlib
import re
import unicodedata
from collections.abc import Iterator, Sequence

import torch

from unfold.strict_json import dumps as json_dumps

from .core import DataError
from .store import atomic_write_bytes

_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u201c": '"', "\u201d": '"',
                         "\u2013": "-", "\u2014": "--"})
_NT_RE = re.compile(r"(?<=[^\W_])n't\b")
_DOTS_RE = re.compile(r"\.{2,}")
_URL_RE = re.compile(r"(?:https?://|www\.)\S+")
URL_TOKEN = "<url>"
_TOKEN_RE = re.compile(
    r"<url>"                          # a web address, replaced by _URL_RE
    r"|n't\b"                         # negation clitic, split off by _NT_RE: do n't, ca n't
    r"|'(?:s|m|re|ve|ll|d)\b"         # clitics: it 's, i 'm, they 're, we 've, you 'll, i 'd
    r"|(?:[^\W\d_]\.){2,}"            # abbreviations: u.s., e.g.
    r"|\d+(?:[.,]\d+)+"               # numbers with separators: 3.5, 1,000
    r"|[^\W_]+"                       # words (letters, digits); hyphens split: three - hour
    r"|\.\.\.|-{2,}"                   # ellipsis (any run of dots becomes ...), dash runs
    r"|\S"                            # any other single non-space character
)


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lowercase tokens, GloVe (Penn Treebank) style; deterministic.

    HTML entities are unescaped, the text is NFKC-normalised (so ``…`` becomes ``...``), curly
    quotes become straight ones, control characters are dropped, and every web address
    (``http://...``, ``https://...``, ``www....``) becomes the one token ``<url>``. Contractions are split like the
    corpus GloVe was trained on: ``don't`` -> ``do n't``, ``can't`` -> ``ca n't``, ``it's`` ->
    ``it 's``. Words (runs of letters and digits), numbers with ``.``/``,`` (``3.5``, ``1,000``),
    dotted abbreviations (``u.s.``), ``...`` (any run of two or more dots) and dash runs (``--``)
    are tokens; every other non-space character, a single hyphen included, is a token of its
    own. Hyphenated compounds are split (``three-hour`` -> ``three - hour``): most compounds of a
    review corpus are rare and missing from GloVe, their parts are not.
    """
    if "&" in text:
        text = html.unescape(text)
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).lower()
    if any(unicodedata.category(c) == "Cc" for c in text):
        text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    text = _URL_RE.sub(" <url> ", text)
    text = _NT_RE.sub(" n't", text)
    text = _DOTS_RE.sub("...", text)
    return _TOKEN_RE.findall(text)


class Vocab:
    """Token <-> id table. Ids 0 and 1 are ``<pad>`` and ``<unk>``, then ``<mask>`` at id 2 where the vocabulary
    was built with one (``Vocab.build(..., mask_token=True)``); the rest by frequency.

    ``itos`` is the list of tokens by id, ``stoi`` the inverse dict. The word kind of
    `experiments.data.subword.TextTokenizer` (``kind``, ``file_name``, ``pad_id``, ``unk_id``, ``mask_id``,
    ``special_ids``, ``id_to_token``, ``encode_texts``, ``tokenizer_digest``).
    """

    PAD, UNK = 0, 1
    PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
    SPECIALS = (PAD_TOKEN, UNK_TOKEN)
    #: the mask token (id 2 where present) and how a text writes it (the same as for subword tokenizers)
    MASK, MASK_TOKEN, MASK_TEXT = 2, "<mask>", "[MASK]"
    kind, file_name, tokenizer_digest = "words", "vocab.json", None
    pad_id, unk_id = PAD, UNK

    def __init__(self, itos: Sequence[str]):
        itos = list(itos)
        if itos[:2] != list(self.SPECIALS):
            raise DataError(f"a vocabulary must start with {list(self.SPECIALS)}, got {itos[:2]}")
        if len(set(itos)) != len(itos):
            raise DataError("a vocabulary must not repeat tokens")
        self.itos = itos
        self.stoi = {t: i for i, t in enumerate(itos)}

    @classmethod
    def build(cls, token_lists, min_freq: int = 1, max_size: int | None = None, mask_token: bool = False) -> Vocab:
        """Vocabulary of the tokens seen at least ``min_freq`` times in ``token_lists``.

        Tokens are ordered by decreasing count, ties by the token string (so the result does not
        depend on the order of the input); ``max_size`` caps the number of ordinary tokens (the
        specials come on top). Occurrences of the special strings themselves are ignored.
        ``mask_token``: add ``<mask>`` at id 2 (for masked-token training; the ordinary tokens then start at 3).
        False, the default, gives the vocabulary of earlier versions, id for id.
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise DataError(f"min_freq must be an integer >= 1, got {min_freq!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0):
            raise DataError(f"max_size must be None or an integer >= 0, got {max_size!r}")
        counts = collections.Counter()
        for tokens in token_lists:
            counts.update(tokens)
        specials = cls.SPECIALS + ((cls.MASK_TOKEN,) if mask_token else ())
        for s in specials:
            counts.pop(s, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[:max_size]
        return cls(list(specials) + kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token) -> bool:
        return token in self.stoi

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Ids of ``tokens``; unknown tokens map to ``UNK``."""
        get = self.stoi.get
        return [get(t, self.UNK) for t in tokens]

    @property
    def mask_id(self) -> int | None:
        """The id of ``<mask>`` (2), None where the vocabulary has none."""
        return self.MASK if len(self.itos) > self.MASK and self.itos[self.MASK] == self.MASK_TOKEN else None

    @property
    def special_ids(self) -> tuple:
        """The ids of the special tokens: ``<pad>``, ``<unk>`` and ``<mask>`` where there is one."""
        return (self.PAD, self.UNK) + ((self.MASK,) if self.mask_id is not None else ())

    def id_to_token(self, i: int) -> str:
        """The token of id ``i``."""
        return self.itos[i]

    def tokens_of(self, text: str) -> list[str]:
        """The tokens of ``text`` (`tokenize`); with a mask token, each ``[MASK]`` written in the text is one
        ``<mask>`` token."""
        if self.mask_id is None or self.MASK_TEXT not in text:
            return tokenize(text)
        pieces = [tokenize(p) for p in text.split(self.MASK_TEXT)]
        return [t for i, p in enumerate(pieces) for t in ([self.MASK_TOKEN] if i else []) + p]

    def encode_texts(self, texts: Sequence[str], max_len: int | None = None, tokens: list | None = None) -> list:
        """The ids of each text's first ``max_len`` tokens (`tokens_of`; None: all); ``tokens``: a list receiving
        each text's kept token strings. A text with no token gives an empty list."""
        rows = []
        for text in texts:
            kept = self.tokens_of(text)[:max_len]
            rows.append(self.encode(kept))
            if tokens is not None:
                tokens.append(kept)
        return rows

    def to_json(self) -> str:
        """JSON text ``{"itos": [...]}`` (read back by `from_json`)."""
        return json_dumps({"itos": self.itos}, ensure_ascii=False)

    @classmethod
    def from_json(cls, data) -> Vocab:
        """A vocabulary from `to_json` output (a JSON string or the decoded dict)."""
        try:
            obj = json.loads(data) if isinstance(data, (str, bytes)) else data
            itos = obj["itos"]
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise DataError(f"not a vocabulary JSON ({e})") from None
        if not isinstance(itos, list) or not all(isinstance(t, str) for t in itos):
            raise DataError("not a vocabulary JSON (itos must be a list of strings)")
        return cls(itos)

    def save(self, path) -> None:
        """Write `to_json` to ``path`` (atomic)."""
        atomic_write_bytes(pathlib.Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path) -> Vocab:
        """Read a vocabulary written by `save`."""
        try:
            return cls.from_json(pathlib.Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise DataError(f"cannot read vocabulary {path} ({e})") from None


def encode(examples: Sequence[tuple[str, int]], vocab: Vocab, max_len: int, tokens: list | None = None):
    """Tokenise, map to ids and pad ``examples`` into tensors. ``vocab``: a `Vocab` or any
    `experiments.data.subword.TextTokenizer` (its ``encode_texts``, ``pad_id``, ``unk_id``).

    Returns ``ids`` (N, L) long, ``mask`` (N, L) bool (True at real tokens) and ``labels`` (N,)
    long, with ``L = min(max_len, longest example)``. Longer texts keep their first ``max_len``
    tokens; a text with no token becomes a single ``<unk>``, so every row has a real token.
    ``tokens``: a list to which each example's kept tokens (the strings behind its row of ``ids``, before the
    ``<unk>`` stand-in of a text with no token) are appended, so that a caller can name the unknown ones
    without tokenising again.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise DataError(f"max_len must be an integer >= 1, got {max_len!r}")
    rows = [r or [vocab.unk_id] for r in vocab.encode_texts([text for text, _ in examples], max_len, tokens)]
    n = len(rows)
    L = max((len(r) for r in rows), default=1)
    ids = torch.full((n, L), vocab.pad_id, dtype=torch.long)
    mask = torch.zeros((n, L), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = True
    labels = torch.tensor([int(lab) for _, lab in examples], dtype=torch.long)
    return ids, mask, labels


def batches(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, batch_size: int,
            shuffle: bool = False, generator: torch.Generator | None = None
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield ``(ids, mask, labels)`` mini-batches, each trimmed to its own longest real length.

    In order, or in the order of ``torch.randperm(N, generator=generator)`` when ``shuffle``;
    the last batch may be smaller.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    n = ids.shape[0]
    if mask.shape != ids.shape or labels.shape[0] != n:
        raise DataError(f"ids {tuple(ids.shape)}, mask {tuple(mask.shape)} and labels "
                        f"{tuple(labels.shape)} do not match")
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    lengths = mask.sum(dim=1)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        L = max(int(lengths[idx].max()), 1)
        yield ids[idx, :L], mask[idx, :L], labels[idx]
