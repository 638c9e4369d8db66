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
from experiments.data.listops import generate
from experiments.app.fingerprint import data_fingerprint
from unfold.classifier import TokenEmbedding, positional_kind, sinusoidal_positions

SMALL = {"min_len": 8, "max_len": 64, "max_depth": 6, "max_args": 5, "train": 300, "val": 30, "test": 30}


# --------------------------------------------------------------------- an independent evaluator of the text
def parse(tokens: list) -> tuple:
    """Tokens of one expression (``[``, op, args..., ``]``; digits) as a nested tuple ``(op, [args])`` or an int;
    any malformed input raises ValueError."""
    pos = 0

    def node():
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("truncated")
        t = tokens[pos]
        pos += 1
        if t.isdigit() and len(t) == 1:
            return int(t)
        if t != "[":
            raise ValueError(f"unexpected {t!r}")
        op = tokens[pos]
        pos += 1
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


def test_brackets_are_tokens():
    assert tokenize("[MAX 2 9 [MIN 4 7 ] 0 ]") == ["[", "max", "2", "9", "[", "min", "4", "7", "]", "0", "]"]
    assert tokenize("[SM 1 2 ]") == ["[", "sm", "1", "2", "]"]


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
    for bad in ("[MAX 1 2", "[MAX 1 2 ] ]", "MAX 1 2 ]"):
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


#: seed 0's first example under SMALL (checked by hand: MED 2 4 1 4 = 3, MAX = 7, SM 7 9 7 = 3, MED 9 4 4 = 4,
#: SM 2 4 9 = 5, MIN 7 5 3 5 = 3)
PINNED_FIRST = ("[MIN 7 5 [SM [MAX [MED 2 4 1 4 ] 3 7 3 ] 9 7 ] [SM 2 [MED 9 4 4 ] 9 ] ]", 3)


def test_refusals_of_the_generator():
    with pytest.raises(DataError, match="listops_min_len"):
        generate(0, {**SMALL, "min_len": 100})
    with pytest.raises(DataError, match="unknown listops option"):
        generate(0, {"depth": 3})
    with pytest.raises(DataError, match="max_depth"):
        generate(0, {"max_depth": 1})
    with pytest.raises(DataError, match="never reached"):                # no tree has 2..4 tokens: no endless loop
        generate(0, {"min_len": 2, "max_len": 4, "train": 1, "val": 1, "test": 1})
    with pytest.raises(DataError, match="options"):
        load_dataset("rotten_tomatoes", options={"max_len": 10})


@pytest.mark.parametrize("overrides, names", [
    (["data.dataset=listops"], ["data.listops_max_len", "2000", "data.max_len"]),        # default 2000 > 64
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
    expect_refusal("experiments.train", ["--config", "tiny", "--run-dir", str(tmp_path / "run"), *overrides],
                   str(tmp_path), names=names[:1])


def test_config_path_to_loader():
    cfg = load_config("listops")
    dc = cfg["data"]
    assert dc["dataset"] == "listops" and dc["listops_max_len"] <= dc["max_len"]
    assert config_options(dc)["max_len"] == dc["listops_max_len"]
    assert config_options(load_config(None)["data"]) is None
    lra = load_config("listops_lra")["data"]
    assert (lra["listops_min_len"], lra["listops_max_len"]) == (500, 2000) and lra["max_len"] >= 2000
    cfg = load_config(None, ["data.dataset=listops", "data.max_len=64", "data.listops_max_len=64",
                             "data.listops_min_len=16", "data.listops_train=40", "data.listops_val=5",
                             "data.listops_test=5"])
    splits = load_dataset("listops", seed=1, options=config_options(cfg["data"]))
    assert splits.sizes() == {"train": 40, "val": 5, "test": 5}
    assert all(16 <= len(tokenize(t)) <= 64 for t, _ in splits.train)


def test_export_round_trip(tmp_path):
    opts = ["--option", "min_len=8", "--option", "max_len=40", "--option", "train=20", "--option", "val=4",
            "--option", "test=4"]
    code, out, err = run_cli("experiments.data", ["export", "--dataset", "listops", "--out", str(tmp_path / "a"),
                                                  "--seed", "5", *opts], str(tmp_path))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["train"] == 20
    back = load_dataset(str(tmp_path / "a"))
    want = generate(5, {"min_len": 8, "max_len": 40, "train": 20, "val": 4, "test": 4})
    assert (back.train, back.val, back.test, back.label_names) == (want.train, want.val, want.test, want.label_names)
    code, _, err = run_cli("experiments.data", ["export", "--dataset", "listops", "--out", str(tmp_path / "b"),
                                                "--seed", "5", *opts], str(tmp_path))
    assert code == 0, err
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "labels.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    expect_refusal("experiments.data", ["export", "--dataset", "listops", "--out", str(tmp_path / "c"),
                                        "--option", "max_depth=1"], str(tmp_path), names=["max_depth", "1"])
    expect_refusal("experiments.data", ["export", "--dataset", "rotten_tomatoes", "--out", str(tmp_path / "c"),
                                        "--option", "max_len=9"], str(tmp_path), names=["rotten_tomatoes"])


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
