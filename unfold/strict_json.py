"""Strict JSON: every JSON file and line this project writes goes through `dumps`.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which are not JSON (RFC 8259) and break
other readers. `json_safe` turns non-finite floats into the strings ``"nan"``, ``"inf"``,
``"-inf"`` (numpy and torch scalars first into Python numbers), and `dumps` then writes with
``allow_nan=False``, so a non-finite number that slipped through fails loudly instead of writing invalid JSON.

Reading: `loads` / `load` are the project's JSON readers for its own files (``bundle.json``,
``vocab.json``): strict JSON too (``NaN``/``Infinity`` refused, and so is a number such as ``1e400`` that
``float`` would read as inf), and a document nested more deeply than
`MAX_DEPTH` levels (``[[[[...`` 5,000 deep, which would exhaust Python's recursion limit inside the
parser) is a `ValueError` saying so, like any other malformed document, never a ``RecursionError``.
"""
from __future__ import annotations

import json
import re
import math
import numbers

__all__ = ["json_safe", "dumps", "loads", "load", "nesting_depth", "MAX_DEPTH"]

#: the deepest nesting `loads` reads (the project's files nest 3 levels; the parser would fail near 1,000)
MAX_DEPTH = 100


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


_STRINGS = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def nesting_depth(text: str) -> int:
    """How deeply the arrays and objects of the JSON ``text`` nest (brackets inside strings not counted),
    computed without recursion."""
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", _STRINGS.sub("", text)):
        depth += 1 if ch in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _constant(name: str):
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or exponent as a float; one beyond float64's range (``1e400``, which ``float``
    reads as inf) is refused, as the NaN and Infinity constants are: it would be read as a non-finite value."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} overflows a float64 (it would be read as {value})")
    return value


def loads(text):
    """The JSON value of ``text`` (str or UTF-8 bytes): strict (no NaN/Infinity, no number beyond float64's range),
    at most `MAX_DEPTH` levels deep; anything else raises `ValueError` (``json.JSONDecodeError`` is
    one) saying why."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ValueError(f"nested {depth} levels deep, more than the {MAX_DEPTH} this reader accepts")
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_finite_float)
    except RecursionError:     # not reachable under MAX_DEPTH; kept so that no reader ever sees one
        raise ValueError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None


def load(fh):
    """`loads` of an open text (or binary) file."""
    return loads(fh.read())
