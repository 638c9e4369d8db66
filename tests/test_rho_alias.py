"""``softmax`` (the README's name for the exp penalty) is accepted wherever a rho spec is, and builds the
registered ``exp`` penalty, whose canonical spec stays ``exp``."""
import json

import pytest
import torch

import energies as E
from energies.errors import EnergyError
from energies.rho import RHO_ALIASES, RHOS, ExpRho, get_rho


def test_softmax_builds_exp_with_its_canonical_spec():
    rho = get_rho("softmax")
    assert type(rho) is ExpRho and rho.spec() == "exp"
    z = torch.linspace(0, 5, 11, dtype=torch.float64)
    assert torch.equal(rho.value(z), get_rho("exp").value(z))
    assert torch.equal(rho.derivative(z), get_rho("exp").derivative(z))
    assert "softmax" not in RHOS and RHO_ALIASES["softmax"] == "exp"    # mapped at parse time, not registered


def test_alias_refusals_still_name_the_spec():
    with pytest.raises(EnergyError, match="too many arguments for rho 'exp'"):
        get_rho("softmax:1")                       # exp takes no argument, under either name
    with pytest.raises(EnergyError, match=r"unknown rho 'softmaxx'.*also accepted: \['softmax \(= exp\)'\]"):
        E.get_rho("softmaxx")                      # the negative control: a near-miss is still refused


def test_model_rho_softmax_in_a_config(tmp_path):
    from experiments.app.build import build_model
    from experiments.app.config import load_config

    cfg = load_config("tiny", ["model.rho=softmax", "model.layers=1", "model.d=8"])
    model = build_model(cfg, 20, 2)
    specs = {m.rho.spec() for m in model.modules() if isinstance(getattr(m, "rho", None), E.Rho)}
    assert specs == {"exp"}
    ref = build_model(load_config("tiny", ["model.rho=exp", "model.layers=1", "model.d=8"]), 20, 2)
    assert [type(m).__name__ for m in model.modules()] == [type(m).__name__ for m in ref.modules()]


def test_check_cli_rho_softmax(capsys):
    from unfold.check import main

    argv = ["--graph", "complete", "--layers", "2", "--samples", "2", "--json"]
    assert main(argv + ["--rho", "softmax"]) == 0
    soft = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv + ["--rho", "exp"]) == 0
    exp = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert soft["config"]["rho"] == "exp"
    soft.pop("elapsed_s", None), exp.pop("elapsed_s", None)
    assert soft == exp
