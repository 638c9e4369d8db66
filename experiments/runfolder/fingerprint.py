"""Fingerprint of the data a run was trained on, checked when the run is resumed.

A resumed run must see the same id-to-word mapping and the same examples as the run it continues; a
changed dataset (new rows, another split seed, a re-fetched file, another ``min_freq``) would otherwise
resume silently with embeddings bound to other words. `data_fingerprint` hashes (SHA-256) the
vocabulary in id order, each split's ``(text, label)`` rows in order, and the label names;
`compare_fingerprints` names every part that differs. A model bundle stores the fingerprint of its training
data; `mismatched_parts` recomputes the parts a bundle holds itself (its vocabulary in id order, its label
names in class order) from what was actually loaded, so that a fingerprint that does not describe them is caught.
"""
from __future__ import annotations

import hashlib
import json
from typing import Dict, Iterable, List, Optional, Sequence

__all__ = ["data_fingerprint", "compare_fingerprints", "mismatched_parts", "PARTS"]

PARTS = ("vocab", "train", "val", "test", "label_names")


def _digest(items: Iterable) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _vocab_digest(vocab_itos: Sequence[str], tokenizer: Optional[str]) -> str:
    """The ``vocab`` part: the tokens in id order, and for a subword tokenizer the digest of its whole JSON."""
    items = list(vocab_itos) if tokenizer is None else [*vocab_itos, {"tokenizer.json": tokenizer}]
    return _digest(items)


def data_fingerprint(vocab_itos: Sequence[str], train: Sequence, val: Sequence, test: Sequence,
                     label_names: Optional[Sequence[str]], tokenizer: Optional[str] = None) -> Dict[str, object]:
    """``{part: sha256 hex}`` for `PARTS`, plus the split sizes (for the message). ``tokenizer``: for a
    subword tokenizer, the sha256 of its ``tokenizer.json`` (canonical text), covered by the ``vocab`` part with
    the tokens (None, the word vocabulary: the tokens alone, as before)."""
    rows = {"train": train, "val": val, "test": test}
    out: Dict[str, object] = {"vocab": _vocab_digest(vocab_itos, tokenizer)}
    for name, examples in rows.items():
        out[name] = _digest([str(t), int(y)] for t, y in examples)
    out["label_names"] = _digest(list(label_names or []))
    out["sizes"] = {"vocab": len(vocab_itos), **{name: len(ex) for name, ex in rows.items()}}
    return out


def compare_fingerprints(stored: Dict[str, object], now: Dict[str, object]) -> List[str]:
    """The parts of `PARTS` that differ, each with its sizes then and now (empty: same data)."""
    diff = []
    for part in PARTS:
        if stored.get(part) != now.get(part):
            then_n = (stored.get("sizes") or {}).get(part)
            now_n = (now.get("sizes") or {}).get(part)
            sizes = f" ({then_n} -> {now_n} entries)" if then_n is not None and now_n is not None else ""
            diff.append(f"{part}{sizes}")
    return diff


def mismatched_parts(stored: Dict[str, object], vocab_itos: Sequence[str], label_names: Sequence[str],
                     tokenizer: Optional[str] = None) -> List[str]:
    """The parts among ``vocab`` and ``label_names`` whose digest (or, for the vocabulary, size) in ``stored`` (a
    `data_fingerprint`) is not that of ``vocab_itos`` (tokens in id order) and ``label_names`` (in class id
    order); empty when both match.

    Args:
        stored: the fingerprint recorded when the model was trained.
        vocab_itos: the vocabulary as loaded, tokens in id order.
        label_names: the label names as loaded, in class id order.
        tokenizer: for a subword tokenizer, the sha256 of its canonical ``tokenizer.json`` (`data_fingerprint`).

    Returns:
        The names of the parts that differ (a subset of ``["vocab", "label_names"]``, in that order).
    """
    out = []
    size = (stored.get("sizes") or {}).get("vocab") if isinstance(stored.get("sizes"), dict) else None
    if stored.get("vocab") != _vocab_digest(vocab_itos, tokenizer) or (size is not None and size != len(vocab_itos)):
        out.append("vocab")
    if stored.get("label_names") != _digest(list(label_names)):
        out.append("label_names")
    return out
