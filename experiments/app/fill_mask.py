"""Fill-mask: what a masked-token model (``task: masked_tokens``) proposes at each ``[MASK]`` of a text, as Hugging
Face's ``fill-mask`` pipeline answers, with the energy verdict of the text's forward pass.

The literal ``[MASK]`` in a text is the mask token for both kinds of tokenizer (the word vocabulary reads it as
one ``<mask>`` token before tokenising, `experiments.data.Vocab.tokens_of`; a subword tokenizer has ``[MASK]``
as a special token). A text with no ``[MASK]`` left after truncation to ``data.max_len`` is refused
(`NO_MASK`). For each ``[MASK]``, in order, the ``top_k`` most probable ordinary tokens (special tokens are never
proposed: the probabilities are a softmax over the ordinary tokens), each a `Candidate`: ``score`` (its
probability), ``token`` (its id), ``token_str`` (its string) and ``sequence`` (the text with that ``[MASK]``
replaced by it, the others left as they are) -- the fields of the pipeline's answer. The energy trace is that of a
copy of the model in ``train.check_dtype`` (float64 by default), judged by the project's tolerance rule, as for a
classifier's `experiments.app.bundle.Prediction`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import torch

from energies.checks import check_int
from energies.errors import ConfigError
from unfold.trace import report_from_values

from .verdict import EnergyVerdict, unknown_words, verdict_fields

#: how a text writes the mask token
MASK_TEXT = "[MASK]"
#: the refusal of a text without a mask
NO_MASK = ("has no [MASK] within its first data.max_len tokens: a masked-token model fills masks, so each text "
           "needs at least one (e.g. \"a [MASK] film\")")


@dataclass
class Candidate:
    """One proposal for one ``[MASK]`` (Hugging Face's fill-mask fields).

    Attributes:
        score: its probability among the ordinary tokens.
        token: its id.
        token_str: its string (a WordPiece continuation without its ``##``).
        sequence: the text with this ``[MASK]`` replaced by ``token_str``.
    """

    score: float
    token: int
    token_str: str
    sequence: str


@dataclass
class FillMaskPrediction(EnergyVerdict):
    """One text's answer: for each ``[MASK]`` in order its top-k `Candidate`s, best first (``masks``), then the
    energy verdict of the forward pass (`experiments.app.verdict.EnergyVerdict`)."""

    text: str
    masks: List[List[Candidate]]

    @property
    def prior_only(self) -> bool:
        """Never: a [MASK] is always read in its context (there is no prior-only fill)."""
        return False

    @property
    def finite(self) -> bool:
        """Whether every proposed probability is a finite number."""
        return all(math.isfinite(c.score) for cands in self.masks for c in cands)


def _token_str(token: str) -> str:
    return token[2:] if token.startswith("##") and len(token) > 2 else token


def _sequence(text: str, k: int, token_str: str) -> str:
    """``text`` with its ``k``-th (from 0) ``[MASK]`` replaced by ``token_str``."""
    parts = text.split(MASK_TEXT)
    if k + 1 >= len(parts):
        return text
    return MASK_TEXT.join(parts[:k + 1]) + token_str + MASK_TEXT.join(parts[k + 1:])


def _candidates(text: str, probs: torch.Tensor, vocab, top_k: int) -> List[List[Candidate]]:
    """The top-k `Candidate`s of each mask position (``probs``: ``(masks, V)`` on the host, 0 at the special
    tokens, which are never proposed)."""
    k = min(top_k, probs.shape[1] - len(vocab.special_ids))
    out = []
    for row in probs:
        values, ids = row.topk(k)
        strings = [_token_str(vocab.id_to_token(i)) for i in ids.tolist()]
        out.append([Candidate(v, i, t, _sequence(text, len(out), t))
                    for v, i, t in zip(values.tolist(), ids.tolist(), strings)])
    return out


@torch.no_grad()
def fill_mask_chunk(trained, chunk: List[str], checker, dtype: torch.dtype, tol_factor: float, layers, top_k: int,
                    first: int = 0) -> List[FillMaskPrediction]:
    """The `FillMaskPrediction` of each text of one batch (``trained``: an
    `experiments.app.bundle.TrainedModel` of a masked-token model; ``checker``: its energy copy in ``dtype``;
    ``first``: the number of texts before this batch, for messages)."""
    check_int(top_k, "top_k", 1, error=ConfigError)
    kept: list = []
    ids, mask, truncated = trained._encode(chunk, tokens=kept)
    vocab = trained.vocab
    is_mask = (ids == vocab.mask_id) & mask
    counts = is_mask.sum(1).tolist()
    for i, c in enumerate(counts):
        if c == 0:
            raise ConfigError(f"text {first + i + 1} {' '.join(chunk[i].split())[:60]!r} {NO_MASK}")
    positions = is_mask.reshape(-1).nonzero().squeeze(1)
    trained.model.eval()
    logits = trained.model(ids, mask, trace=False, layers=layers, positions=positions).logits.double()
    logits[:, list(vocab.special_ids)] = -math.inf
    probs = torch.softmax(logits, dim=-1).cpu()
    res = checker(ids, mask, trace=True, layers=layers, positions=positions)
    rep = report_from_values(res.energies, dtype, tol_factor=tol_factor, guaranteed=checker.encoder.guaranteed)
    totals, terms = rep.totals.cpu(), {k: v.detach().double().cpu() for k, v in res.energies.items()}
    inc, bad = rep.increases.sum(1).cpu(), rep.nonfinite.sum(1).cpu()
    unknown_at = ((ids == vocab.unk_id) & mask).cpu()
    out, start = [], 0
    for i, text in enumerate(chunk):
        masks = _candidates(text, probs[start:start + counts[i]], vocab, top_k)
        start += counts[i]
        n_bad = int(bad[i]) + int(not torch.isfinite(probs[start - counts[i]:start]).all())
        out.append(FillMaskPrediction(
            text=text, masks=masks,
            **verdict_fields(totals[i], {name: vals[i] for name, vals in terms.items()}, int(inc[i]), n_bad,
                             int(mask[i].sum()), bool(truncated[i]), int(unknown_at[i].sum()),
                             unknown_words(kept[i], unknown_at[i]))))
    return out

