"""The config reference page (``docs/config_reference.md``) cannot drift from the schema or from what is enforced.

* the committed page is byte-for-byte what ``python -m experiments.app.config --reference`` prints (a fresh
  process: a plug-in another test registered cannot change the choices listed);
* every key of :data:`DEFAULTS` has one row, and nothing else does; its default cell reads back as the default;
* every range the page states is the one :func:`load_config` enforces, read from the page's text (not from the
  schema): a closed bound itself accepted, an open one refused, and the value just beyond refused with a
  :class:`ConfigError` naming the key (``math.nextafter`` for floats, +-1 for integers);
* every choice the page lists is accepted and a name it does not list is refused naming the key; booleans too;
* negative controls: a page with one range or one choice altered is caught by the same probes.
"""
import math
import os
import re
import subprocess
import sys

import pytest

from experiments.app.config import (CHOICE_KEYS, DEFAULTS, KEYS, RULES, SCHEMA, Choice, ConfigError, Key, Range,
                                    load_config, load_yaml, reference)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "config_reference.md")

RANGE = re.compile(r"^(an integer|a finite number) in ([\[(])([^,]+), ([^\])]+)([\])])(, or `null`)?$")


def _rows(text: str) -> dict:
    """``{dotted key: (default, type, allowed, meaning)}`` from the page's tables (cells unescaped)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if not m:
            continue
        cells = [c.replace("\\|", "|").replace("\\\\", "\\").strip() for c in re.split(r"(?<!\\) \| ", m.group(2))]
        assert len(cells) == 4, line
        assert m.group(1) not in rows, f"{m.group(1)} has two rows"
        rows[m.group(1)] = tuple(cells)
    return rows


def _leaves(defaults=DEFAULTS, prefix=""):
    for k, v in defaults.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _text(value) -> str:
    if isinstance(value, float):
        return {math.inf: ".inf", -math.inf: "-.inf"}.get(value) or repr(value)
    return str(value)


def _extra(key: str, value=None) -> list:
    """Other overrides a probe of ``key`` needs so that only ``key``'s own rule decides (rules between keys)."""
    if key == "model.heads" and isinstance(value, int) and value > 0:
        return [f"model.d={2 * value}"]
    if key.startswith("data.listops_"):
        return ["data.dataset=listops", "data.max_len=65536"] + [
            f"data.listops_{k}={v}" for k, v in (("min_len", 1), ("max_len", 65536)) if key != f"data.listops_{k}"]
    return []


def _accepted(key: str, value) -> str:
    """None when ``key=value`` loads and reads back as ``value``, else why not."""
    try:
        cfg = load_config(None, [f"{key}={_text(value)}"] + _extra(key, value))
    except ConfigError as exc:
        return f"{key}={value!r} refused: {exc}"
    node = cfg
    for k in key.split("."):
        node = node[k]
    return None if node == value else f"{key}={value!r} read as {node!r}"


def _refused(key: str, value) -> str:
    """None when ``key=value`` is refused with a ConfigError naming ``key``, else what happened."""
    try:
        load_config(None, [f"{key}={_text(value)}"] + _extra(key, value))
    except ConfigError as exc:
        return None if key in str(exc) else f"{key}={value!r} refused without naming the key: {exc}"
    return f"{key}={value!r} accepted"


def _range_probes(key: str, allowed: str) -> list:
    """What the page says of ``key``'s range that load_config does not do (empty: the page is the enforcement)."""
    m = RANGE.match(allowed)
    assert m, f"{key}: {allowed!r} is not a range"
    integer = m.group(1) == "an integer"
    num = int if integer else float
    lo, hi = num(m.group(3)), (math.inf if m.group(4) == "inf" else num(m.group(4)))
    lo_open, hi_open = m.group(2) == "(", m.group(5) == ")"
    step = (lambda v, d: v + d) if integer else (lambda v, d: math.nextafter(v, d * math.inf))
    out = []
    for bound, is_open, outward in ((lo, lo_open, -1), (hi, hi_open, +1)):
        if not math.isfinite(bound):
            out.append(_refused(key, bound))                        # inf itself: never a finite number
            continue
        if is_open:
            out += [_refused(key, bound), _accepted(key, step(bound, -outward))]
        else:
            out += [_accepted(key, bound), _refused(key, step(bound, outward))]
    if integer:
        out.append(_refused(key, float(lo) + 0.5))                 # a float is not an integer
    return [p for p in out if p]


def _choice_probes(key: str, allowed: str) -> list:
    names = re.findall(r"`([^`]+)`", allowed.split(" (registered in")[0].split(", or `null`")[0])
    out = []
    for name in names:
        if name != "null":
            try:
                load_config(None, [f"{key}={name}"])
            except ConfigError as exc:                     # only a rule between keys may refuse a listed choice
                if not ("mode" in str(exc) or "applies to" in str(exc)):
                    out.append(f"{key}={name} (listed) refused: {exc}")
    out.append(_refused(key, "not-a-listed-choice"))
    return [p for p in out if p]


@pytest.fixture(scope="module")
def generated():
    proc = subprocess.run([sys.executable, "-m", "experiments.app.config", "--reference"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def page():
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def test_committed_page_is_the_generated_one(page, generated):
    assert page == generated, ("docs/config_reference.md differs from the schema: regenerate it with "
                               "python -m experiments.app.config --reference > docs/config_reference.md")
    assert reference() == generated          # the function and the command print one page


def test_every_key_has_one_row_and_its_default(page):
    rows = _rows(page)
    keys = dict(_leaves())
    assert list(rows) == list(keys)          # every key, nothing else, in the config's order
    for key, default in keys.items():
        assert load_yaml(rows[key][0].strip("`")) == default, key
        assert rows[key][3] and "\n" not in rows[key][3], f"{key} has no meaning"


def test_schema_declares_each_key_once_with_a_rule_and_a_meaning():
    for where, key in KEYS.items():
        assert isinstance(key, Key) and key.meaning.strip(), where
        assert key.rule is not None or isinstance(key.default, bool), f"{where}: no rule"
        assert key.default is None or isinstance(key.default, key.allowed_types()), where
        assert not key.nullable or key.types, f"{where}: a null default needs its types"
    assert set(CHOICE_KEYS) == {w for w, k in KEYS.items() if isinstance(k.rule, Choice)}
    assert {w for w, r in RULES.items() if isinstance(r, Range)} == {w for w, k in KEYS.items()
                                                                     if isinstance(k.rule, Range)}
    assert "data" in SCHEMA and "name" in SCHEMA


def test_every_documented_range_is_the_enforced_one(page):
    rows = _rows(page)
    ranged = {k for k, r in rows.items() if RANGE.match(r[2])}
    assert ranged == {".".join(w) for w, r in RULES.items() if isinstance(r, Range)}   # none undocumented
    problems = [p for key in sorted(ranged) for p in _range_probes(key, rows[key][2])]
    assert not problems, problems


def test_every_documented_choice_is_the_enforced_one(page):
    rows = _rows(page)
    listed = {k for k, r in rows.items() if r[2].startswith("one of ")}
    assert listed == {".".join(w) for w in CHOICE_KEYS}
    problems = [p for key in sorted(listed) for p in _choice_probes(key, rows[key][2])]
    assert not problems, problems


def test_booleans_take_true_and_false_only(page):
    rows = _rows(page)
    bools = [k for k, r in rows.items() if r[1] == "bool"]
    assert bools and all(rows[k][2] == "`true` or `false`" for k in bools)
    for key in bools:
        assert _accepted(key, True) is None and _accepted(key, False) is None
        assert _refused(key, "maybe") is None


@pytest.mark.parametrize("key,was,now", [
    ("model.alpha", "a finite number in (0, 1]", "a finite number in (0, 2]"),          # a wider range
    ("model.dropout", "a finite number in [0, 1)", "a finite number in [0, 1]"),       # a closed end
    ("data.max_len", "an integer in [1, 65536]", "an integer in [2, 65536]"),           # a moved bound
    ("train.lr", "a finite number in (0, inf)", "a finite number in [0, inf)"),
])
def test_negative_control_a_drifted_range_is_caught(page, key, was, now):
    allowed = _rows(page)[key][2]
    assert allowed == was
    assert _range_probes(key, allowed) == []
    assert _range_probes(key, now), f"a page saying {now!r} for {key} would pass"


def test_negative_control_a_drifted_choice_is_caught(page):
    allowed = _rows(page)["train.precision"][2]
    assert _choice_probes("train.precision", allowed) == []
    assert _choice_probes("train.precision", allowed.replace("`bfloat16`", "`bfloat16`, `float16`"))
