"""ListOps (Nangia & Bowman 2018, as the Long Range Arena generates it, Tay et al. 2021): a seeded generator.

An example is a nested list expression over the digits 0-9 and its value, one of 10 classes ``"0"`` .. ``"9"``.
LRA writes ``[MAX 2 9 [MIN 4 7 ] 0 ]`` (value 9) and counts it as 9 tokens: an operator with its opening bracket
(``[MAX``, ``[MIN``, ``[MED``, ``[SM``) is one token, ``]`` one, a digit one. This generator writes the same
expression as ::

    MAX 2 9 MIN 4 7 ] 0 ]        -> 9

(the operator's name opens its list, ``]`` closes it), so that `tokenize`, the
tokenizer the model is fed through, makes exactly LRA's tokens of it (``max 2 9 min 4 7 ] 0 ]``: 9) and a length
in tokens *as the model sees it* is LRA's length. The vocabulary is LRA's 15 tokens: ``max min med sm`` (LRA's
``[MAX [MIN [MED [SM``), ``]`` and the ten digits. `to_lra` gives LRA's spelling of a text and
`from_lra` reads LRA's (its TSV files' ``( ... )`` included). The closing brackets stay tokens: the original
LRA release stripped every bracket from the model's input (a known bug).

Before this rule the text was LRA's spelling, which the tokenizer splits into two tokens per operator (``[``,
``max``), and lengths were counted in those tokens, 1.14 times LRA's count on average: ``listops_lra``'s
500-2000 tokens were 431-1762 LRA tokens, 8.4 % of its training split below LRA's 500 (measurements below).
Splits, vocabularies and data fingerprints of the same seed and options changed with the rule (the trees drawn
are the same, the ones kept differ): a run started before cannot be resumed (its checkpoint's data fingerprint
differs: refused, as is the depth study of its bundle on regenerated data), and a bundle trained before still
loads and predicts on the spelling it was trained on (``[MAX ...``: `to_lra`).

The operators, on a list ``a_1 .. a_k`` of values (``k >= 2``):

* ``MAX``: ``max(a)``;  ``MIN``: ``min(a)``;
* ``MED``: the median as LRA computes it, ``int(numpy.median(a))``: the middle value of the sorted list for odd
  ``k``, ``floor((s_{k/2} + s_{k/2+1}) / 2)`` of the sorted list ``s`` for even ``k`` (values are non-negative);
* ``SM`` (sum modulo): ``sum(a) mod 10`` (LRA's spelling ``[SM``).

The tree (LRA's ``generate_tree``): the root is at depth 1; a node at depth ``< max_depth`` is an operator with
probability 1/4 and a digit otherwise (a node at ``max_depth`` is a digit); an operator takes ``k`` arguments,
``k`` uniform in ``[2, max_args]``, each a node one level deeper, and one of the four operators, uniformly. Its
length is LRA's: a digit 1, an operator ``2 +`` the lengths of its arguments. A tree is kept when its length is in
``[min_len, max_len]`` (both included) and its text is new (rejection sampling, as LRA does; a tree is abandoned
as soon as it must grow past ``max_len``). LRA keeps ``500 < length < 2000``: the defaults, and
``configs/listops_lra.yaml``, are ``min_len=501``, ``max_len=1999``. The shape is drawn breadth first and the
digits at ``max_depth`` only for a tree that is kept, so the random stream differs from LRA's; the distribution
is LRA's.

Randomness: one ``random.Random(seed)``, read through ``random()`` only (a float from the Mersenne Twister,
the same on every machine and Python release): the same seed and options give byte-identical splits. The first
``train`` accepted examples are the training split, the next ``val`` the validation split, the next ``test`` the
test split (disjoint: no text repeats). Labels are the values, so class ``k`` is named ``"k"``.

Measured (seed 0, a shared 2-core CPU): ``configs/listops_lra.yaml``'s 100,000 examples take 42 s; the lengths of
its 96,000 training examples are 501 / 576 / 704 / 954 / 1309 / 1643 / 1999 tokens (min, 10 %, 25 %, median, 75 %,
90 %, max; mean 1035.5), as an independent re-implementation of LRA's own sampling loop gives them (20,000
examples: 501 / 578 / 701 / 953 / 1309 / 1648 / 1999, mean 1035.2). Before LRA's rule (``[MAX`` two tokens,
500-2000 of them) the same split had 431 / 512 / 632 / 870 / 1192 / 1479 / 1762 LRA tokens (mean 935.0: 9.7 %
shorter), 8.4 % of it below 500. Labels (32-512 tokens, 20,000 examples, 3 s): ``0`` 15.7 %, ``9`` 15.8 %, the
others 7.4-9.4 % each (MAX and MIN pull values to the ends); the majority class (``0``) is 15.6 % of the test split of
``configs/listops.yaml`` (16-128 tokens) and 17.4 % of ``listops_lra``'s.
"""
from __future__ import annotations

import random
from collections.abc import Mapping

from energies.memory import check_memory

from .core import DataError, Splits

#: generator options and their defaults: LRA's lengths (``500 < length < 2000``), depth, arguments and split sizes;
#: lengths in LRA's tokens, which are the model's (module docstring), both bounds included
DEFAULTS = {"min_len": 501, "max_len": 1999, "max_depth": 10, "max_args": 10, "train": 96000, "val": 2000,
            "test": 2000}
#: the config keys of the options (``data.listops_<option>``)
CONFIG_KEYS = {k: f"data.listops_{k}" for k in DEFAULTS}
#: the operators, as written (upper case) in the text: each opens its list (LRA's ``[MAX`` ...), ``]`` closes it
OPERATORS = ("MAX", "MIN", "MED", "SM")
CLOSE = "]"
LABELS = [str(v) for v in range(10)]
#: probability that a node above the depth limit is an operator (LRA's ``VALUE_P``)
OP_P = 0.25
#: past ``TRY_SLACK`` trees, keeping fewer than one in ``MAX_TRIES_PER_EXAMPLE`` is refused as infeasible
MAX_TRIES_PER_EXAMPLE, TRY_SLACK = 2000, 100_000


def apply_op(op: str, values: list) -> int:
    """The value of operator ``op`` on ``values`` (module docstring: MED rounds down, SM is the sum mod 10)."""
    if op == "MAX":
        return max(values)
    if op == "MIN":
        return min(values)
    if op == "MED":
        s = sorted(values)
        k = len(s)
        return s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) // 2
    if op == "SM":
        return sum(values) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def check_options(options: Mapping | None = None) -> dict:
    """The generator options, defaults filled in, each an int in range (else a `DataError` naming its
    config key and value): ``1 <= min_len <= max_len``, ``max_depth >= 2``, ``max_args >= 2``, split sizes
    ``>= 1``. An unknown option is refused naming the valid ones."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise DataError(f"unknown listops option(s) {unknown}; valid: {', '.join(DEFAULTS)}")
    out = {k: options[k] if options.get(k) is not None else v for k, v in DEFAULTS.items()}
    least = {"max_depth": 2, "max_args": 2}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < least.get(k, 1):
            raise DataError(f"{CONFIG_KEYS[k]} must be an integer >= {least.get(k, 1)}, got {v!r}")
    if out["min_len"] > out["max_len"]:
        raise DataError(f"{CONFIG_KEYS['min_len']}={out['min_len']} exceeds {CONFIG_KEYS['max_len']}="
                        f"{out['max_len']}")
    want = out["train"] + out["val"] + out["test"]      # the one memory rule, before a tree is drawn
    check_memory(want * (2 * out["min_len"] + EXAMPLE_OVERHEAD),
                 f"listops train={out['train']}, val={out['val']}, test={out['test']} "
                 f"({CONFIG_KEYS['train']}, {CONFIG_KEYS['val']}, {CONFIG_KEYS['test']}; --option KEY=INT): "
                 f"{want:,} examples of at least {CONFIG_KEYS['min_len']}={out['min_len']} tokens", DataError,
                 "ask for fewer examples")
    return out


#: bytes an example holds beyond its text's characters while generated (the str and tuple headers, the label, its
#: slots in the example list and the set of texts seen); a text of L tokens has at least 2 L - 1 characters
EXAMPLE_OVERHEAD = 160


def _shape(u, max_len: int, max_depth: int, max_args: int):
    """The shape of one tree, drawn breadth first with ``u`` (a ``random()``), as ``(root, length)``: ``root`` a
    digit or an operator node ``[op, children]`` (a child: a node, a digit, or ``None`` for a digit at
    ``max_depth`` whose value `_write` draws later), ``length`` its tokens; ``None`` as soon as it must
    exceed ``max_len`` tokens. One draw ``r`` decides a node above ``max_depth``: an operator when ``r < OP_P``,
    else the digit ``int((r - OP_P) / (1 - OP_P) * 10)`` (uniform, given ``r >= OP_P``); an operator then draws its
    argument count and its name. ``length`` counts decided tokens plus one per undecided argument, in LRA's tokens:
    a digit adds nothing to it, an operator with ``k`` arguments ``1 + k`` (its name, which opens it, ``]``, ``k``
    arguments, one slot used)."""
    r = u() if max_depth > 1 else 1.0
    if r >= OP_P:
        return min(9, int((r - OP_P) * _SCALE)), 1
    span, ops = max_args - 1, OPERATORS
    k = 2 + int(u() * span)
    root = [ops[int(u() * 4)], []]
    length = 2 + k
    if length > max_len:
        return None
    frontier, depth = [(root, k)], 1
    while frontier and depth + 1 < max_depth:        # children at depth + 1 may be operators
        nxt = []
        for node, k in frontier:
            children = node[1]
            for _ in range(k):
                r = u()
                if r < OP_P:
                    k2 = 2 + int(u() * span)
                    child = [ops[int(u() * 4)], []]
                    children.append(child)
                    nxt.append((child, k2))
                    length += 1 + k2
                    if length > max_len:
                        return None
                else:
                    children.append(min(9, int((r - OP_P) * _SCALE)))
        frontier, depth = nxt, depth + 1
    for node, k in frontier:                         # their arguments are at max_depth: digits
        node[1].extend([None] * k)
    return root, length


def _write(root, u) -> tuple[list, int]:
    """``(parts, value)`` of a tree from `_shape` (``parts``: ``"MAX"``, digits, ``"]"`` in text order, one
    per token); a ``None`` digit is drawn here, ``int(u() * 10)``, in text order. Iterative (depth-first)."""
    if not isinstance(root, list):
        return [_DIGITS[root]], root
    parts: list = []
    append = parts.append
    stack = [(root, iter(root[1]), [])]
    append(root[0])
    while True:
        node, it, values = stack[-1]
        for c in it:
            if c is None:
                c = min(9, int(u() * 10))
            elif isinstance(c, list):
                append(c[0])
                stack.append((c, iter(c[1]), []))
                break
            append(_DIGITS[c])
            values.append(c)
        else:
            stack.pop()
            append(CLOSE)
            value = apply_op(node[0], values)
            if not stack:
                return parts, value
            stack[-1][2].append(value)


_SCALE = 10 / (1 - OP_P)
_DIGITS = [str(d) for d in range(10)]
_LRA_OPERATORS = {"[" + op: op for op in OPERATORS}


def to_lra(text: str) -> str:
    """LRA's spelling of a generated text: each operator with its opening bracket (``MAX 2 9 ]`` ->
    ``[MAX 2 9 ]``), the same tokens one for one (the text this generator wrote before LRA's length rule)."""
    return " ".join("[" + w if w in OPERATORS else w for w in text.split())


def from_lra(text: str) -> str:
    """This generator's spelling of an LRA expression (``[MAX 2 9 ]`` -> ``MAX 2 9 ]``); the ``(`` and ``)`` of
    LRA's TSV files (``( ( ( [MAX 2 ) 9 ) ] )``) are dropped. Any other word is a `DataError`."""
    out = []
    for w in text.split():
        if w in ("(", ")"):
            continue
        if w in _LRA_OPERATORS:
            out.append(_LRA_OPERATORS[w])
        elif w == CLOSE or w in _DIGITS:
            out.append(w)
        else:
            raise DataError(f"not an LRA ListOps token: {w!r} (expected [MAX, [MIN, [MED, [SM, ], a digit 0-9)")
    return " ".join(out)


def lra_length(text: str) -> int:
    """The length of a generated text as LRA counts it (`to_lra`'s words; also the number of tokens
    `tokenize` makes of ``text``)."""
    return len(text.split())


def generate(seed: int, options: Mapping | None = None) -> Splits:
    """The ListOps splits of ``seed`` and ``options`` (`check_options`; module docstring). A length range
    that too few distinct trees reach (past `TRY_SLACK` trees, fewer than one kept in
    `MAX_TRIES_PER_EXAMPLE`) is a `DataError` naming the options, not an endless loop."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise DataError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    o = check_options(options)
    want = o["train"] + o["val"] + o["test"]
    u = random.Random(seed).random
    lo, hi, seen, examples = o["min_len"], o["max_len"], set(), []
    tries = 0
    while len(examples) < want:
        tries += 1
        if tries > TRY_SLACK and MAX_TRIES_PER_EXAMPLE * len(examples) < tries:
            raise DataError(f"listops: {len(examples)} of {want} distinct examples after {tries - 1} trees: lengths "
                            f"{CONFIG_KEYS['min_len']}={lo} .. {CONFIG_KEYS['max_len']}={hi} with "
                            f"{CONFIG_KEYS['max_depth']}={o['max_depth']}, {CONFIG_KEYS['max_args']}={o['max_args']} "
                            "are (almost) never reached or hold too few distinct trees; widen the range or ask "
                            "for fewer examples")
        shape = _shape(u, hi, o["max_depth"], o["max_args"])
        if shape is None or shape[1] < lo:
            continue
        tokens, value = _write(shape[0], u)
        text = " ".join(tokens)
        if text in seen:
            continue
        seen.add(text)
        examples.append((text, value))
    a, b = o["train"], o["train"] + o["val"]
    return Splits(examples[:a], examples[a:b], examples[b:], len(LABELS), list(LABELS), "listops")


def load_listops(seed: int = 0, data_dir=None, **options) -> Splits:
    """The registered loader (``data_dir`` unused: nothing is read): `generate`."""
    return generate(seed, options)
