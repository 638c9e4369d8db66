"""Strict JSON: every JSON file and line this project writes goes through :func:`dumps`.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which are not JSON (RFC 8259) and break
other readers. :func:`json_safe` turns non-finite floats into the strings ``"nan"``, ``"inf"``,
``"-inf"`` (numpy and torch scalars first into Python numbers), and :func:`dumps` then writes with
``allow_nan=False``, so a non-finite number that slipped through fails loudly instead of writing invalid JSON.
"""
from __future__ import annotations

import json
import math
import numbers

__all__ = ["json_safe", "dumps"]


def json_safe(x):
    """``x`` with every non-finite float replaced by ``"nan"``, ``"inf"`` or ``"-inf"`` (recursively)."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:   # numpy / torch scalars
        return json_safe(x.item())
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def dumps(x, **kwargs) -> str:
    """``json.dumps(json_safe(x), allow_nan=False, **kwargs)``: strict JSON."""
    return json.dumps(json_safe(x), allow_nan=False, **kwargs)
