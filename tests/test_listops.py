"""ListOps, the generated dataset (experiments/data/listops.py), its config keys, and the positional signal
option of the token embedding (model.positional: learned | sinusoidal | none)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from clifuzz import expect_refusal, run_cli
from energies.errors import ConfigError
from experiments.app.config import load_config
from experiments.data import DataError, config_options, load_dataset, tokenize
from experiments.data.listops import CLOSE, DEFAULTS, OPERATORS, from_lra, generate, lra_length, to_lra
from experiments.runfolder.fingerprint import data_fingerprint
from unfold.classifier import TokenEmbedding, positional_kind, sinusoidal_positions

SMALL = {"min_len": 8, "max_len": 64, "max_depth": 6, "max_args": 5, "train": 300, "val": 30, "test": 30}


# --------------------------------------------------------------------- an independent evaluator of the text
OPS = ("max", "min", "med", "sm")


def parse(tokens: list) -> tuple:
    """Tokens of one expression as a nested tuple ``(op, [args])`` or an int: an operator opens a list that ``]``
    closes, spelled as the generator writes it (``max``), as LRA does (``[max``) or in two tokens (``[``, ``max``);
    digits; any malformed input raises ValueError."""
    pos = 0

    def node():
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("truncated")
        t = tokens[pos]
        pos += 1
        if t.isdigit() and len(t) == 1:
            return int(t)
        if t == "[":
            op = tokens[pos]
            pos += 1
        else:
            op = t[1:] if t.startswith("[") else t
        if op not in OPS:
            raise ValueError(f"unexpected {t!r}")
        args = []
        while tokens[pos] != "]":
            args.append(node())
        pos += 1
        return (op, args)

    tree = node()
    if pos != len(tokens):
        raise ValueError("trailing tokens")
    return tree


def evaluate(tree, med=lambda a: int(np.median(a))) -> int:
    """LRA's semantics (MED as ``int(numpy.median(...))``, ``sm`` the sum mod 10), written apart from the generator."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [evaluate(a, med) for a in args]
    return {"max": max, "min": min, "med": med, "sm": lambda a: sum(a) % 10}[op](vals)


def shape(tree, depth=1):
    """(deepest level, fewest and most arguments of an operator)."""
    if isinstance(tree, int):
        return depth, math.inf, 0
    subs = [shape(a, depth + 1) for a in tree[1]]
    return (max(s[0] for s in subs), min([len(tree[1])] + [s[1] for s in subs]),
            max([len(tree[1])] + [s[2] for s in subs]))


@pytest.fixture(scope="module")
def small():
    return generate(3, SMALL)


#: hand-built expressions in LRA's spelling, their LRA length (LRA's generate_tree: a digit 1, an operator 2 + its
#: arguments' lengths) and value, worked out by hand
HAND = [("[MAX 2 9 [MIN 4 7 ] 0 ]", 9, 9), ("[SM 1 2 ]", 4, 3), ("7", 1, 7),
        ("[MED [SM 9 9 ] 1 [MAX 0 0 3 ] 6 ]", 13, 4),           # SM 9 9 = 8, MAX = 3; median of 8 1 3 6 = 4.5 -> 4
        ("[MIN [MIN [MIN [MIN 5 6 ] 7 ] 8 ] 9 ]", 13, 5)]


@pytest.mark.parametrize("lra, length, value", HAND)
def test_one_token_per_lra_token(lra, length, value):
    """The model's tokenizer makes exactly LRA's tokens of a text: ``[MAX`` (written ``MAX``) is one, ``]`` one, a
    digit one; the count is LRA's length, and both spellings evaluate to the hand-computed value."""
    text = from_lra(lra)
    assert "[" not in text and to_lra(text) == lra
    tokens = tokenize(text)
    assert len(tokens) == lra_length(text) == len(lra.split()) == length
    assert [t.lstrip("[") for t in lra.lower().split()] == tokens             # one for one, in order
    assert set(tokens) <= set(OPS) | {CLOSE} | {str(d) for d in range(10)}
    assert evaluate(parse(tokens)) == evaluate(parse(lra.lower().split())) == value
    # negative control: LRA's own spelling through the same tokenizer is the old two-token rule
    n_ops = sum(t in OPS for t in tokens)
    assert len(tokenize(lra)) == length + n_ops


def test_from_lra_reads_lra_files():
    """LRA's TSV text (``to_string`` with its ``( ... )`` pairs) reads as the same expression; other words are
    refused, naming the word."""
    tsv = "( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"
    assert from_lra(tsv) == "MAX 2 9 MIN 4 7 ] 0 ]" == from_lra("[MAX 2 9 [MIN 4 7 ] 0 ]")
    for bad in ("[MAX 2 10 ]", "[SUM_MOD 1 2 ]", "MAX 1 2 ]", "[ MAX 1 2 ]"):
        with pytest.raises(DataError, match="not an LRA ListOps token"):
            from_lra(bad)
    assert OPERATORS == ("MAX", "MIN", "MED", "SM") and [from_lra("[" + o + " 1 2 ]") for o in OPERATORS] == [
        "MAX 1 2 ]", "MIN 1 2 ]", "MED 1 2 ]", "SM 1 2 ]"]


def test_labels_grammar_and_limits(small):
    every = small.train + small.val + small.test
    assert small.sizes() == {"train": 300, "val": 30, "test": 30}
    assert small.label_names == [str(k) for k in range(10)] and small.name == "listops"
    assert len({t for t, _ in every}) == len(every)                 # disjoint splits, no repeats
    depth = (math.inf, 0)
    for text, label in every:
        tokens = tokenize(text)
        assert SMALL["min_len"] <= len(tokens) <= SMALL["max_len"], text
        tree = parse(tokens)
        assert evaluate(tree) == label, text
        deepest, fewest, most = shape(tree)
        assert deepest <= SMALL["max_depth"] and 2 <= fewest and most <= SMALL["max_args"], text
        depth = (min(depth[0], deepest), max(depth[1], deepest))
    assert depth[1] >= 4                                            # the trees do nest
    assert len({y for _, y in every}) == 10


def test_evaluator_can_fail(small):
    """Negative controls: a wrong label, a median that rounds half up, a malformed text are all caught."""
    text, label = small.train[0]
    assert evaluate(parse(tokenize(text))) != (label + 1) % 10
    half_up = lambda a: int(math.floor(np.median(a) + 0.5))
    every = small.train + small.val + small.test
    assert any(evaluate(parse(tokenize(t)), half_up) != y for t, y in every)
    for bad in ("MAX 1 2", "MAX 1 2 ] ]", "1 2 ]", "[MAX 1 2", "FOO 1 2 ]", "] 1"):
        with pytest.raises((ValueError, IndexError)):
            parse(tokenize(bad))


def test_deterministic_by_seed(small):
    again = generate(3, SMALL)
    assert (again.train, again.val, again.test) == (small.train, small.val, small.test)
    other = generate(4, SMALL)
    assert other.train != small.train
    fp = lambda s: data_fingerprint([], s.train, s.val, s.test, s.label_names)
    assert fp(again) == fp(small) != fp(other)
    # pinned: the first example of seed 0 on every machine (random.Random's stream is specified)
    first = generate(0, {**SMALL, "train": 1, "val": 1, "test": 1}).train[0]
    assert first == generate(0, {**SMALL, "train": 1, "val": 1, "test": 1}).train[0]
    assert first == PINNED_FIRST
    # the same tree as before LRA's length rule (the first tree drawn is kept under both): only the spelling moved
    assert (to_lra(first[0]), first[1]) == PINNED_BEFORE


#: seed 0's first example under SMALL (checked by hand: MED 2 4 1 4 = 3, MAX = 7, SM 7 9 7 = 3, MED 9 4 4 = 4,
#: SM 2 4 9 = 5, MIN 7 5 3 5 = 3)
PINNED_FIRST = ("MIN 7 5 SM MAX MED 2 4 1 4 ] 3 7 3 ] 9 7 ] SM 2 MED 9 4 4 ] 9 ] ]", 3)
PINNED_BEFORE = ("[MIN 7 5 [SM [MAX [MED 2 4 1 4 ] 3 7 3 ] 9 7 ] [SM 2 [MED 9 4 4 ] 9 ] ]", 3)


def test_refusals_of_the_generator():
    with pytest.raises(DataError, match="listops_min_len"):
        generate(0, {**SMALL, "min_len": 100})
    with pytest.raises(DataError, match="unknown listops option"):
        generate(0, {"depth": 3})
    with pytest.raises(DataError, match="max_depth"):
        generate(0, {"max_depth": 1})
    with pytest.raises(DataError, match="never reached"):   # no tree has 2..3 tokens (MAX 1 2 ] has 4): no endless loop
        generate(0, {"min_len": 2, "max_len": 3, "train": 1, "val": 1, "test": 1})
    four = generate(0, {"min_len": 2, "max_len": 4, "train": 5, "val": 1, "test": 1})      # its control: 4 is reached
    assert {len(tokenize(t)) for t, _ in four.train} == {4}
    with pytest.raises(DataError, match="options"):
        load_dataset("rotten_tomatoes", options={"max_len": 10})


@pytest.mark.parametrize("overrides, names", [
    (["data.dataset=listops"], ["data.listops_max_len", "1999", "data.max_len"]),        # default 1999 > 64
    (["data.dataset=listops", "data.max_len=100", "data.listops_max_len=101"], ["data.listops_max_len", "101"]),
    (["data.dataset=listops", "data.max_len=100", "data.listops_max_len=50", "data.listops_min_len=60"],
     ["data.listops_min_len", "60"]),
    (["data.listops_train=10"], ["data.listops_train", "10", "rotten_tomatoes"]),       # not listops: refused
    (["data.dataset=listops", "data.max_len=3000", "data.listops_max_depth=1"], ["data.listops_max_depth", "1"]),
    (["data.dataset=listops", "data.max_len=3000", "data.listops_val=0"], ["data.listops_val", "0"]),
    (["data.dataset=listops", "data.max_len=3000", "data.listops_max_args=2.5"], ["data.listops_max_args", "2.5"]),
    (["model.positional=rotary"], ["model.positional", "rotary"]),
    (["model.positional=1"], ["model.positional", "1"]),
])
def test_config_refusals(overrides, names, tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    for n in names:
        assert n in str(e.value), (n, str(e.value))
    expect_refusal("experiments.app.train", ["--config", "tiny", "--run-dir", str(tmp_path / "run"), *overrides],
                   str(tmp_path), names=names[:1])


def test_config_path_to_loader():
    cfg = load_config("listops")
    dc = cfg["data"]
    assert dc["dataset"] == "listops" and dc["listops_max_len"] <= dc["max_len"]
    assert config_options(dc)["max_len"] == dc["listops_max_len"]
    assert config_options(load_config(None)["data"]) is None
    lra = load_config("listops_lra")["data"]
    assert (lra["listops_min_len"], lra["listops_max_len"]) == (501, 1999) and lra["max_len"] >= 1999
    assert (DEFAULTS["min_len"], DEFAULTS["max_len"]) == (501, 1999)        # LRA keeps 500 < length < 2000
    cfg = load_config(None, ["data.dataset=listops", "data.max_len=64", "data.listops_max_len=64",
                             "data.listops_min_len=16", "data.listops_train=40", "data.listops_val=5",
                             "data.listops_test=5"])
    splits = load_dataset("listops", seed=1, options=config_options(cfg["data"]))
    assert splits.sizes() == {"train": 40, "val": 5, "test": 5}
    assert all(16 <= len(tokenize(t)) <= 64 for t, _ in splits.train)


def test_export_round_trip(tmp_path):
    opts = ["--option", "min_len=8", "--option", "max_len=40", "--option", "train=20", "--option", "val=4",
            "--option", "test=4"]
    code, out, err = run_cli("experiments.app.data_cli", ["export", "--dataset", "listops", "--out", str(tmp_path / "a"),
                                                  "--seed", "5", *opts], str(tmp_path))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["train"] == 20
    back = load_dataset(str(tmp_path / "a"))
    want = generate(5, {"min_len": 8, "max_len": 40, "train": 20, "val": 4, "test": 4})
    assert (back.train, back.val, back.test, back.label_names) == (want.train, want.val, want.test, want.label_names)
    code, _, err = run_cli("experiments.app.data_cli", ["export", "--dataset", "listops", "--out", str(tmp_path / "b"),
                                                "--seed", "5", *opts], str(tmp_path))
    assert code == 0, err
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "labels.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    expect_refusal("experiments.app.data_cli", ["export", "--dataset", "listops", "--out", str(tmp_path / "c"),
                                        "--option", "max_depth=1"], str(tmp_path), names=["max_depth", "1"])
    expect_refusal("experiments.app.data_cli", ["export", "--dataset", "rotten_tomatoes", "--out", str(tmp_path / "c"),
                                        "--option", "max_len=9"], str(tmp_path), names=["rotten_tomatoes"])


# --------------------------------------------------------------------- the LRA-size config, as the model sees it
LRA_SAMPLE = ["data.listops_train=240", "data.listops_val=40", "data.listops_test=40"]


def lra_lengths_refused(counts, lo=501, hi=1999) -> list:
    """The counts outside LRA's ``500 < length < 2000`` (``lo``..``hi`` inclusive)."""
    return [c for c in counts if not lo <= c <= hi]


@pytest.fixture(scope="module")
def lra_data():
    from experiments.app.build import build_data

    cfg = load_config("listops_lra", LRA_SAMPLE)
    return cfg, build_data(cfg)


def test_lra_config_lengths_as_the_model_sees_them(lra_data):
    """Every example of ``listops_lra`` (a sample of its split sizes; the lengths and tree options as configured)
    reaches the model as 501..1999 tokens (the padding mask of the trainer's own encoding) and that count is LRA's
    (the LRA spelling's words); the vocabulary is LRA's 15 tokens; every label is the independent evaluation of
    the text, in either spelling."""
    cfg, (splits, vocab, tensors, _) = lra_data
    assert splits.sizes() == {"train": 240, "val": 40, "test": 40}
    assert set(vocab.itos[2:]) == set(OPS) | {CLOSE} | {str(d) for d in range(10)}
    counts = []
    for name in ("train", "val", "test"):
        examples = getattr(splits, name)
        ids, mask, labels = tensors[name]
        seen = mask.sum(1).tolist()
        assert seen == [len(to_lra(t).split()) for t, _ in examples] == [lra_length(t) for t, _ in examples]
        assert not (ids[mask] == vocab.UNK).any()
        for text, label in examples:
            assert evaluate(parse(tokenize(text))) == label, text
            assert evaluate(parse(to_lra(text).lower().split())) == label, text
        counts += seen
    assert lra_lengths_refused(counts) == []
    assert cfg["data"]["max_len"] >= max(counts)                   # nothing truncated
    assert min(counts) < 560 and max(counts) > 1400                 # the range is used, not a corner of it
    assert len({y for _, y in splits.train}) == 10


def test_negative_control_old_two_token_rule():
    """The old rule (LRA's spelling through the tokenizer: ``[`` and ``max`` two tokens) kept trees of 500-2000 of
    its tokens; drawn from the same trees, some of those are below LRA's 500 (and the check above flags them), and
    the new rule's sample holds none. Trees are drawn down to 380 LRA tokens so that the old rule's can be found."""
    wide = generate(0, {"min_len": 380, "max_len": 1999, "train": 400, "val": 1, "test": 1}).train
    lra = [len(tokenize(t)) for t, _ in wide]
    old = [len(tokenize(to_lra(t))) for t, _ in wide]
    assert all(o == n + sum(w in OPERATORS for w in t.split()) for o, n, (t, _) in zip(old, lra, wide))
    kept_before = [n for n, o in zip(lra, old) if 500 <= o <= 2000]
    assert len(kept_before) > 100
    short = lra_lengths_refused(kept_before)
    assert short and max(short) <= 500 and len(short) >= 0.02 * len(kept_before), (len(short), len(kept_before))
    kept_now = [n for n in lra if 501 <= n <= 1999]
    assert lra_lengths_refused(kept_now) == []


def test_old_runs_are_refused_on_resume():
    """A run started before LRA's rule trained on the old spelling: its data fingerprint (vocabulary and splits)
    differs from what the generator makes now, so resuming it or studying it on regenerated data is refused
    (``experiments/app/train.py``, ``experiments/studies/depth.py`` compare fingerprints); the old spelling of the
    same trees is what :func:`to_lra` gives (the bundle still loads, with its own vocabulary)."""
    from experiments.runfolder.fingerprint import compare_fingerprints

    now = generate(3, SMALL)
    before = [[(to_lra(t), y) for t, y in getattr(now, s)] for s in ("train", "val", "test")]
    fp = lambda splits, vocab: data_fingerprint(vocab, *splits, now.label_names)
    vocab_now = sorted({w for t, _ in now.train for w in tokenize(t)})
    vocab_before = sorted({w for t, _ in before[0] for w in tokenize(t)})
    assert "[" in vocab_before and "[" not in vocab_now
    changed = compare_fingerprints(fp(before, vocab_before), fp((now.train, now.val, now.test), vocab_now))
    assert [c.split()[0] for c in changed] == ["vocab", "train", "val", "test"]
    assert compare_fingerprints(fp((now.train, now.val, now.test), vocab_now),
                                fp((now.train, now.val, now.test), vocab_now)) == []      # negative control


# --------------------------------------------------------------------- model.positional
def test_sinusoidal_table_against_formula():
    for d in (6, 7):
        pe = sinusoidal_positions(50, d, dtype=torch.float64)
        assert pe.shape == (50, d)
        for p in (0, 1, 17, 49):
            for j in range(d):
                i2 = j - j % 2
                want = (math.sin if j % 2 == 0 else math.cos)(p / 10000 ** (i2 / d))
                assert abs(pe[p, j].item() - want) < 1e-12, (d, p, j)
    assert not torch.equal(sinusoidal_positions(5, 4), sinusoidal_positions(5, 4).flip(0))  # negative control


def test_positional_options():
    torch.manual_seed(0)
    kinds = {k: TokenEmbedding(20, 8, positional=k, max_len=16) for k in ("learned", "sinusoidal", "none")}
    count = {k: sum(p.numel() for p in e.parameters()) for k, e in kinds.items()}
    assert count["sinusoidal"] == count["none"] == count["learned"] - 16 * 8       # no parameters, no buffers
    assert set(kinds["sinusoidal"].state_dict()) == set(kinds["none"].state_dict())
    assert "pos.weight" in kinds["learned"].state_dict()
    ids = torch.randint(0, 20, (2, 10))
    sin, none = kinds["sinusoidal"], kinds["none"]
    sin.load_state_dict(none.state_dict())
    assert torch.allclose(sin(ids) - none(ids), sinusoidal_positions(10, 8)[None].expand(2, 10, 8), atol=1e-6)
    with pytest.raises(ConfigError, match="exceeds max_len"):
        sin(torch.zeros(1, 17, dtype=torch.long))
    # old booleans: true = learned, false = none
    assert TokenEmbedding(20, 8, positional=True).positional == "learned"
    assert TokenEmbedding(20, 8, positional=False).pos is None
    assert positional_kind(True) == "learned" and positional_kind(False) == "none"
    with pytest.raises(ConfigError, match="model.positional"):
        positional_kind("rope", "model.positional")
    for v in (True, False, "learned", "sinusoidal", "none"):
        assert load_config(None, [f"model.positional={str(v).lower()}"])["model"]["positional"] == v


def test_sinusoidal_on_meta():
    emb = TokenEmbedding(20, 8, positional="sinusoidal", max_len=16).to("meta")
    out = emb(torch.zeros(2, 9, dtype=torch.long, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 9, 8)
    assert sinusoidal_positions(9, 8, device="meta").shape == (9, 8)


def test_build_model_positional_and_energy():
    """build_model takes every form; the sinusoidal signal is in X (the encoder's input), not in the energy."""
    from experiments.app.build import build_model

    for v in ("sinusoidal", True, False):
        cfg = load_config("tiny", [f"model.positional={str(v).lower()}"])
        model = build_model(cfg, 30, 3)
        assert model.embedding.positional == positional_kind(v)
    cfg = load_config("tiny", ["model.positional=sinusoidal", "model.dropout=0"])
    model = build_model(cfg, 30, 3).eval()
    ids = torch.randint(2, 30, (2, 7))
    out = model(ids, torch.ones(2, 7, dtype=torch.bool), trace=True)
    assert out.energies is not None and torch.isfinite(out.logits).all()
