"""Argument checks shared by the framework's constructors: each returns the value converted, or raises the
caller's error type (a [`UnfoldError`][energies.UnfoldError] subclass) naming the argument and the value.

They run once, when an object is built or an input enters, never in a forward pass (no host sync there).
"""
from __future__ import annotations

import math
import numbers
import re
from typing import Optional

import numpy as np
import torch

from .errors import UnfoldError

__all__ = ["check_int", "check_number", "check_seed", "NUMBER_RULES", "one_line", "parse_int", "parse_float",
           "as_bool_mask"]

#: a number as the project reads it from text (spec arguments, overrides, command lines): ASCII digits only, an
#: optional sign, blanks around it ignored. Python's int() and float() also read the digits of every other script
#: (Arabic-Indic "\u0663" as 3, fullwidth "\uff13"), "_" between digits and, in float(), "infinity": two spellings
#: of one value would otherwise name two things (two variants training the same graph).
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf(?:inity)?|nan)", re.I)
_BLANKS = " \t\n\r\f\v"


def parse_int(text: str) -> int:
    """The integer ``text`` spells in ASCII digits (an optional sign; blanks around it ignored); anything else,
    other scripts' digits included, raises ``ValueError`` (as ``int()`` does for what it refuses)."""
    if not isinstance(text, str) or not _INT_TEXT.fullmatch(text.strip(_BLANKS)):
        raise ValueError(f"not an integer in ASCII digits: {text!r}")
    return int(text.strip(_BLANKS))


def parse_float(text: str) -> float:
    """The number ``text`` spells in ASCII (``3``, ``-0.5``, ``.05``, ``1e-3``, ``inf``, ``nan``; blanks around it
    ignored); anything else, other scripts' digits and ``_`` included, raises ``ValueError``."""
    if not isinstance(text, str) or not _FLOAT_TEXT.fullmatch(text.strip(_BLANKS)):
        raise ValueError(f"not a number in ASCII digits: {text!r}")
    return float(text.strip(_BLANKS))


def one_line(text, limit: Optional[int] = None) -> str:
    """``text`` (an exception's message) with every run of whitespace folded into one space, cut to ``limit``."""
    out = " ".join(str(text).split())
    return out if limit is None or len(out) <= limit else out[:limit - 3] + "..."



def check_int(value, what: str, minimum: Optional[int] = None, maximum: Optional[int] = None,
              error: type = UnfoldError) -> int:
    """``value`` as a Python int: an integer (int, numpy or 0-d torch integer, an integral float, or a decimal
    string such as a spec's ``"3"``) in ``[minimum, maximum]``; a bool, a fraction, NaN or Inf is refused."""
    if minimum is not None and maximum is not None:
        rule = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        rule = f"an integer >= {minimum}"
    else:
        rule = "an integer" if maximum is None else f"an integer <= {maximum}"
    iv = None
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        pass
    elif isinstance(value, str):
        try:
            iv = parse_int(value)
        except ValueError:
            iv = None
    elif isinstance(value, numbers.Integral):
        iv = int(value)
    elif isinstance(value, numbers.Real):
        f = float(value)
        iv = int(f) if math.isfinite(f) and f.is_integer() else None
    elif isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        f = float(value)
        iv = int(f) if math.isfinite(f) and f.is_integer() else None
    if iv is None or (minimum is not None and iv < minimum) or (maximum is not None and iv > maximum):
        raise error(f"{what} must be {rule}, got {value!r}")
    return iv


#: the rules of `check_number`: name -> (predicate on a float, wording)
NUMBER_RULES = {
    "finite": (math.isfinite, "a finite number"),
    "positive": (lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    "nonnegative": (lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"),
    "nonnegative_or_inf": (lambda v: v >= 0, "a number >= 0 (inf allowed)"),
    "unit": (lambda v: 0.0 < v <= 1.0, "a number in (0, 1]"),
    "probability": (lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]"),
}


def check_flag(value, what: str, error: type = UnfoldError, numpy_bool: bool = False) -> bool:
    """``value`` if it is True or False (``numpy_bool``: a numpy bool too, as a Python bool), else ``error`` naming
    ``what``: a truthy string such as ``'no'``, a number or NaN would otherwise switch it on."""
    if not isinstance(value, (bool, np.bool_) if numpy_bool else bool):
        raise error(f"{what} must be True or False, got {value!r}")
    return bool(value)


def check_number(value, what: str, rule: str = "finite", error: type = UnfoldError) -> float:
    """``value`` as a float obeying ``rule`` (a key of `NUMBER_RULES`: ``finite``, ``positive``,
    ``nonnegative``, ``nonnegative_or_inf``, ``unit`` = (0, 1], ``probability`` = [0, 1]); a bool or a
    non-number is refused."""
    ok, wording = NUMBER_RULES[rule]
    f = None
    if not isinstance(value, (bool, np.bool_, bytes)) and not (isinstance(value, torch.Tensor)
                                                               and (value.numel() != 1 or value.dtype == torch.bool)):
        try:
            f = parse_float(value) if isinstance(value, str) else float(value)
        except (TypeError, ValueError, OverflowError, RuntimeError):
            f = None
    if f is None or not ok(f):
        raise error(f"{what} must be {wording}, got {value!r}")
    return f


def check_seed(value, what: str = "seed", error: type = UnfoldError) -> int:
    """A random seed: an integer in [0, 2**63 - 1] (what ``torch.Generator.manual_seed`` accepts)."""
    return check_int(value, what, 0, 2 ** 63 - 1, error)


def as_bool_mask(mask, error: type = UnfoldError) -> torch.Tensor:
    """A padding mask's dtype rule, the one every taker of a mask applies (the encoders and models through
    `unfold.inputs.bool_mask`, the pooling, the token graphs, attention's key padding mask, the convex heads).

    A bool mask is True at real tokens. An integer mask is a 0/1 attention mask (Hugging Face's convention), read as
    ``mask != 0``: a device op, no host read (whether it holds only 0 and 1 is a host read, left to the caller's
    ``validate``). A floating mask is refused: torch's float attention masks are additive (0 keeps, -inf drops), the
    opposite reading of a 0/1 mask. Metadata only, so it may run in a forward pass.

    Args:
        mask: the mask, a tensor (its shape and device are the caller's to check).
        error: the error type raised.

    Returns:
        The bool mask (``mask`` itself when it is bool).

    Raises:
        UnfoldError: (or ``error``) not a tensor, or a floating or complex dtype, naming the type or dtype.
    """
    if not isinstance(mask, torch.Tensor):
        raise error(f"the mask must be a bool or 0/1 integer tensor, got {type(mask).__name__}")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise error(f"the mask has dtype {mask.dtype}: pass a bool mask (True at real tokens) or a 0/1 integer "
                    "attention mask; a float mask is ambiguous (torch's float masks are additive, -inf drops)")
    return mask if mask.dtype == torch.bool else mask != 0


def load_npy(path: str, label: str, content: str, error: type = UnfoldError) -> np.ndarray:
    """One ``.npy`` array from ``path``, never executing code (``allow_pickle=False``); a folder, a missing file,
    an unreadable file or an ``.npz`` archive is refused with ``error`` naming ``label`` (e.g. ``"graph file"``) and
    the path; ``content`` names what one array should be (``"edge list"``)."""
    import os

    if os.path.isdir(path):
        raise error(f"{label} {path!r} is a folder, not a .npy {content}")
    if not os.path.isfile(path):
        raise error(f"{label} {path!r} does not exist")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types on a corrupt or unreadable file
        raise error(f"{label} {path!r} could not be read as .npy: {one_line(exc, 200)}") from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise error(f"{label} {path!r} is an .npz archive, not one .npy {content}")
    return arr
