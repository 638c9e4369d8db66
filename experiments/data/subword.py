"""Subword tokenizers from the Hugging Face ``tokenizers`` library, behind the one interface the application uses for
both kinds of tokenizer (`TextTokenizer`): the word vocabulary (`experiments.data.text.Vocab`, ``data.tokenizer:
words``) and a subword tokenizer (`SubwordTokenizer`: ``bpe:N``, ``wordpiece:N`` or a ``tokenizer.json`` file).

* `parse_tokenizer_spec`: the value of ``data.tokenizer`` read and checked (`TokenizerSpec`).
* `SubwordTokenizer.train`: BPE or WordPiece of at most N entries learnt from texts, streamed
  (``train_from_iterator``), deterministically: the same texts give a byte-identical ``tokenizer.json``.
  Normalisation: NFKC, then BERT's cleaning (control characters dropped, CJK characters split) and lower case
  (accents kept); pre-tokenizer: BERT's (whitespace and punctuation). The special tokens come first at fixed ids:
  ``[PAD]`` = 0, ``[UNK]`` = 1, ``[MASK]`` = 2.
* `SubwordTokenizer.load` / `SubwordTokenizer.from_json`: a ``tokenizer.json`` read and checked: id 0 must be a
  padding token (``[PAD]`` or ``<pad>``: the model pads with id 0), the model must have an unknown token (else
  unknown characters would vanish silently); ``[MASK]`` or ``<mask>`` is the mask token where there is one.
  Truncation and padding settings in the file are switched off (the application cuts texts to ``data.max_len``
  itself) and no post-processor's tokens are added (``add_special_tokens=False``).

A note on WordPiece: ``tokenizers`` 0.23 numbers WordPiece's continuation tokens (``##x``) in hash-map order, so
two trainings on the same texts can break ties between merges differently (huggingface/tokenizers#1794). Here the
continuation tokens of every character seen inside a word are declared up front, in sorted order, so that the
training is deterministic; they are ordinary vocabulary entries of the result, as the library's own training
makes them.

Part of the data package: imports nothing of the application.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Optional, Protocol, Union

from unfold.strict_json import loads as strict_loads

from .core import DataError
from .store import atomic_write_bytes

__all__ = ["TextTokenizer", "SubwordTokenizer", "TokenizerSpec", "parse_tokenizer_spec", "SPECIAL_TOKENS",
           "MIN_SUBWORD_VOCAB", "MAX_SUBWORD_VOCAB", "SUBWORD_KINDS", "TOKENIZER_FILE"]

#: the special tokens of a trained subword tokenizer, at ids 0, 1, 2
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[MASK]")
#: the kinds of subword tokenizer ``data.tokenizer`` trains (``KIND:N``)
SUBWORD_KINDS = ("bpe", "wordpiece")
#: the smallest and largest vocabulary size N of ``bpe:N`` / ``wordpiece:N``
MIN_SUBWORD_VOCAB, MAX_SUBWORD_VOCAB = 32, 2 ** 20
#: the file a subword tokenizer is saved as (the library's format), in run folders and bundles
TOKENIZER_FILE = "tokenizer.json"
_PADS, _MASKS = ("[PAD]", "<pad>"), ("[MASK]", "<mask>")


class TextTokenizer(Protocol):
    """What the application uses of a tokenizer, either kind (`experiments.data.text.Vocab`, `SubwordTokenizer`).

    Attributes:
        kind: ``"words"`` or ``"subword"``.
        file_name: the file it is saved as in a run folder or bundle (``vocab.json``, ``tokenizer.json``).
        pad_id: the id texts are padded with (0).
        unk_id: the id of the unknown token (1 for the word vocabulary and trained subword tokenizers).
        mask_id: the id of the mask token, None where the vocabulary has none.
        special_ids: the ids of the special tokens, sorted.
        itos: the tokens in id order (what the data fingerprint hashes).
        tokenizer_digest: None for the word vocabulary; for a subword tokenizer the sha256 of its canonical JSON,
            which the data fingerprint covers too.
    """

    kind: str
    file_name: str
    pad_id: int
    unk_id: int
    mask_id: Optional[int]
    special_ids: tuple
    itos: list
    tokenizer_digest: Optional[str]

    def __len__(self) -> int: ...

    def id_to_token(self, i: int) -> str: ...

    def encode_texts(self, texts: Sequence[str], max_len: Optional[int] = None,
                     tokens: Optional[list] = None) -> list: ...

    def to_json(self) -> str: ...

    def save(self, path) -> None: ...


@dataclass(frozen=True)
class TokenizerSpec:
    """``data.tokenizer`` read: ``kind`` is ``words``, ``bpe``, ``wordpiece`` or ``file``; ``size`` the N of
    ``KIND:N``; ``path`` the ``tokenizer.json`` of ``file``."""

    kind: str
    size: Optional[int] = None
    path: Optional[str] = None

    @property
    def subword(self) -> bool:
        """Whether the spec names a subword tokenizer (anything but ``words``)."""
        return self.kind != "words"


def parse_tokenizer_spec(spec: str) -> TokenizerSpec:
    """Read a ``data.tokenizer`` value: ``words``, ``bpe:N``, ``wordpiece:N`` (N an integer in
    [`MIN_SUBWORD_VOCAB`, `MAX_SUBWORD_VOCAB`]) or the path of a ``.json`` file (not read here).

    Args:
        spec: the value.

    Returns:
        The `TokenizerSpec`; anything else is a `DataError` saying what is accepted.
    """
    accepted = (f"words, bpe:N, wordpiece:N (N an integer in [{MIN_SUBWORD_VOCAB}, {MAX_SUBWORD_VOCAB}]) or the "
                "path of a tokenizer.json")
    if not isinstance(spec, str) or not spec.strip():
        raise DataError(f"must be {accepted}, got {spec!r}")
    if spec == "words":
        return TokenizerSpec("words")
    kind, sep, size = spec.partition(":")
    if kind in SUBWORD_KINDS:
        if not sep or not size.isascii() or not size.isdigit():
            raise DataError(f"{kind} needs its vocabulary size, an integer: {kind}:N, got {spec!r}")
        n = int(size)
        if not MIN_SUBWORD_VOCAB <= n <= MAX_SUBWORD_VOCAB:
            raise DataError(f"the vocabulary size of {spec!r} must be in [{MIN_SUBWORD_VOCAB}, {MAX_SUBWORD_VOCAB}]")
        return TokenizerSpec(kind, size=n)
    if spec.endswith(".json"):
        return TokenizerSpec("file", path=spec)
    raise DataError(f"must be {accepted}, got {spec!r}")


def _tokenizers():
    import tokenizers

    return tokenizers


def _texts(texts, again: bool) -> Iterable[str]:
    """An iterator of ``texts`` (a collection, or a function returning a fresh iterator at each call)."""
    if callable(texts):
        return texts()
    if again and iter(texts) is texts:
        raise DataError("texts must be a collection or a function returning a fresh iterator: a WordPiece "
                        "training reads them twice")
    return iter(texts)


class SubwordTokenizer:
    """A ``tokenizers.Tokenizer`` behind `TextTokenizer` (the module docstring says what is checked).

    Args:
        tokenizer: the library's tokenizer (truncation and padding are switched off).
        where: what it was read from, for messages.
    """

    kind = "subword"
    file_name = TOKENIZER_FILE

    def __init__(self, tokenizer, where: str = "tokenizer"):
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.itos = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
        if any(t is None for t in self.itos):
            raise DataError(f"{where}: its token ids are not 0..{len(self.itos) - 1} without gaps")
        if not self.itos or self.itos[0] not in _PADS:
            raise DataError(f"{where}: id 0 must be the padding token ({' or '.join(_PADS)}: the model pads with "
                            f"id 0), got {self.itos[0] if self.itos else None!r}")
        self.pad_id = 0
        self.unk_id = self._unk_id(where)
        self.mask_id = next((i for i in map(tokenizer.token_to_id, _MASKS) if i is not None), None)
        self.special_ids = tuple(sorted(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special))
        self._json = tokenizer.to_str()
        self.tokenizer_digest = hashlib.sha256(self._json.encode("utf-8")).hexdigest()

    def _unk_id(self, where: str) -> int:
        model = json.loads(self.tokenizer.to_str()).get("model", {})
        unk = model.get("unk_id") if model.get("type") == "Unigram" else \
            self.tokenizer.token_to_id(model.get("unk_token") or "")
        if not isinstance(unk, int) or isinstance(unk, bool) or not 0 < unk < len(self.itos):
            raise DataError(f"{where}: its model ({model.get('type')}) has no unknown token in the vocabulary: text "
                            "it cannot split would be dropped silently")
        return unk

    @classmethod
    def train(cls, kind: str, size: int, texts: Union[Iterable[str], Callable[[], Iterable[str]]],
              min_freq: int = 1) -> "SubwordTokenizer":
        """A tokenizer learnt from ``texts``, deterministically (module docstring).

        Args:
            kind: ``bpe`` or ``wordpiece``.
            size: the vocabulary size N (special tokens included; the alphabet is kept whole even if larger).
            texts: a collection of texts, or a function returning a fresh iterator of them at each call (a stream,
                `experiments.data.stream.iter_text_lines`); read as a stream, twice for WordPiece.
            min_freq: a pair of pieces is merged only when it occurs at least this often.

        Returns:
            The trained tokenizer, ``[PAD]``, ``[UNK]``, ``[MASK]`` at ids 0, 1, 2.
        """
        if kind not in SUBWORD_KINDS:
            raise DataError(f"kind must be one of {list(SUBWORD_KINDS)}, got {kind!r}")
        tk = _tokenizers()
        model = tk.models.BPE(unk_token="[UNK]") if kind == "bpe" else tk.models.WordPiece(unk_token="[UNK]")
        tok = tk.Tokenizer(model)
        tok.normalizer = tk.normalizers.Sequence([tk.normalizers.NFKC(), tk.normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True)])
        tok.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
        specials = list(SPECIAL_TOKENS)
        if kind == "wordpiece":
            tok.decoder = tk.decoders.WordPiece()
            specials += ["##" + c for c in sorted(_inner_characters(tok, _texts(texts, True)))]
            trainer = tk.trainers.WordPieceTrainer(vocab_size=size, min_frequency=min_freq, show_progress=False,
                                                   special_tokens=specials)
        else:
            trainer = tk.trainers.BpeTrainer(vocab_size=size, min_frequency=min_freq, show_progress=False,
                                             special_tokens=specials)
        tok.train_from_iterator(_texts(texts, False), trainer=trainer)
        if kind == "wordpiece":       # the continuation tokens declared up front are ordinary entries
            doc = json.loads(tok.to_str())
            doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] in SPECIAL_TOKENS]
            tok = tk.Tokenizer.from_str(json.dumps(doc, ensure_ascii=False))
        return cls(tok, f"{kind}:{size}")

    @classmethod
    def from_json(cls, data: Union[str, bytes], where: str = "tokenizer.json") -> "SubwordTokenizer":
        """A tokenizer from the text of a ``tokenizer.json``; anything else is a `DataError` naming ``where``."""
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            strict_loads(text)       # strict JSON first: no NaN, nesting bounded
            tok = _tokenizers().Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001 -- the library raises plain Exceptions: one line naming the file
            raise DataError(f"{where} is not a tokenizer.json of the tokenizers library "
                            f"({' '.join(str(exc).split())[:200]})") from None
        return cls(tok, where)

    @classmethod
    def load(cls, path) -> "SubwordTokenizer":
        """Read and check the ``tokenizer.json`` at ``path`` (a `DataError` naming it when it is unreadable)."""
        try:
            data = pathlib.Path(path).read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read tokenizer {path} ({exc.strerror or exc})") from None
        return cls.from_json(data, str(path))

    def to_json(self) -> str:
        """The library's JSON of the tokenizer (compact; the same text for the same tokenizer)."""
        return self._json

    def save(self, path) -> None:
        """Write `to_json` to ``path`` (atomic)."""
        atomic_write_bytes(pathlib.Path(path), self._json.encode("utf-8"))

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token) -> bool:
        return isinstance(token, str) and self.tokenizer.token_to_id(token) is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, SubwordTokenizer) and self._json == other._json

    def __repr__(self) -> str:
        return f"SubwordTokenizer({len(self)} tokens)"

    def id_to_token(self, i: int) -> str:
        """The token of id ``i``."""
        return self.itos[i]

    def encode_texts(self, texts: Sequence[str], max_len: Optional[int] = None,
                     tokens: Optional[list] = None) -> list:
        """The ids of each text (no special token added), its first ``max_len`` where given.

        Args:
            texts: the texts.
            max_len: how many ids of each text to keep (None: all).
            tokens: a list receiving, for each text, the pieces of the text behind its kept ids (the original
                characters, so that an unknown piece can be shown as written).

        Returns:
            A list of id lists; a text with no token gives an empty list.
        """
        texts = list(texts)
        rows = []
        for text, enc in zip(texts, self.tokenizer.encode_batch(texts, add_special_tokens=False)):
            rows.append(enc.ids[:max_len])
            if tokens is not None:
                tokens.append([text[a:b] for a, b in enc.offsets[:max_len]])
        return rows


def _inner_characters(tok, texts: Iterable[str]) -> set:
    """The characters found inside words (after a word's first) of ``texts``, normalised and split as ``tok``
    does: those WordPiece makes ``##x`` continuation tokens of."""
    norm, pre = tok.normalizer, tok.pre_tokenizer
    seen: set = set()
    for text in texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            seen.update(word[1:])
    return seen
