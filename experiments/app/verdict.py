"""What every prediction of a trained model carries besides its answer: the energy at every layer boundary of the
text's forward pass and the descent verdict on it, and what was read of the text (tokens kept, truncation, unknown
tokens).

* `EnergyVerdict`: those fields, shared by a classifier's `experiments.app.bundle.Prediction` and a masked-token
  model's `experiments.app.fill_mask.FillMaskPrediction`, which add their answer before them;
* `verdict_fields`: the fields of one text from the checked forward's per-text figures, the one place a verdict is
  named (``descent``, ``increase``, ``non-finite``);
* `unknown_words`: the first `UNKNOWN_WORDS_SHOWN` distinct unknown tokens of a text, in order.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Sequence

__all__ = ["EnergyVerdict", "verdict_fields", "unknown_words", "UNKNOWN_WORDS_SHOWN"]

#: how many distinct unknown words a prediction names (the count is always whole)
UNKNOWN_WORDS_SHOWN = 5


@dataclass(kw_only=True)
class EnergyVerdict:
    """The float64 energy at every layer boundary (``energies[t]`` = E(Y_t), t = 0..T; ``energy_terms`` per term)
    with the descent check's count of increases beyond tolerance, of non-finite steps, and its verdict
    (``non-finite`` as well when an output probability is not finite: a NaN weight never reads as descent);
    ``tokens`` counted after truncation to ``data.max_len`` (``truncated`` says whether the text was longer);
    ``unknown_tokens``: how many of those tokens are not in the model's vocabulary, and ``unknown_words`` the
    first `UNKNOWN_WORDS_SHOWN` distinct ones, in order."""

    energies: List[float]
    energy_terms: Dict[str, List[float]]
    increases: int
    nonfinite: int
    descent: bool
    verdict: str
    tokens: int
    truncated: bool
    unknown_tokens: int = 0
    unknown_words: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object of ``unfold-predict --json``: the prediction's own fields (its text and answer, nested
        dataclasses as objects), then the verdict's."""
        shared = [f.name for f in fields(EnergyVerdict)]
        data = asdict(self)
        return {name: data[name] for name in [*(k for k in data if k not in shared), *shared]}


def verdict_fields(totals: Sequence, terms: Dict[str, Sequence], increases: int, nonfinite: int, tokens: int,
                   truncated: bool, unknown: int, words: List[str]) -> Dict[str, Any]:
    """The `EnergyVerdict` fields of one text: ``totals`` its energy per boundary, ``terms`` each term's,
    ``increases`` and ``nonfinite`` the check's counts (``nonfinite`` including a non-finite output), then what was
    read of the text."""
    ok = increases == 0 and nonfinite == 0
    return {"energies": [float(v) for v in totals],
            "energy_terms": {name: [float(v) for v in vals] for name, vals in terms.items()},
            "increases": increases, "nonfinite": nonfinite, "descent": ok,
            "verdict": "descent" if ok else ("non-finite" if nonfinite else "increase"),
            "tokens": tokens, "truncated": truncated, "unknown_tokens": unknown, "unknown_words": words}


def unknown_words(kept: Sequence[str], unknown_at) -> List[str]:
    """The first `UNKNOWN_WORDS_SHOWN` distinct tokens of ``kept`` (a text's kept token strings) at the positions
    ``unknown_at`` marks (a sequence of booleans, or a 1-d bool tensor), in order."""
    return list(dict.fromkeys(w for j, w in enumerate(kept) if unknown_at[j]))[:UNKNOWN_WORDS_SHOWN]
