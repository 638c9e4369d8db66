"""Numbers read from text are read one way: ASCII digits only, through
:func:`energies.checks.parse_int` / :func:`~energies.checks.parse_float`. Python's ``int()`` and ``float()`` also
read other scripts' digits (Arabic-Indic ``٣`` as 3, fullwidth ``３``) and ``_`` between digits, and YAML 1.1 reads
``1_000``, ``0x10`` and ``10:30`` (= 630): other spellings of one number, which gave one graph two identities
(``window:٣`` and ``window:3`` trained twice). Every place a number is parsed from user text -- graph specs, rho
specs, config files and overrides, command-line numbers, dataset options -- refuses them with its typed error; the
plain spellings (the controls) are accepted.
"""
import argparse

import pytest

from energies import checks
from energies.checks import check_int, check_number
from energies.errors import ConfigError, EnergyError, GraphError, UnfoldError

#: the old code had no parse_int/parse_float: there Python's own readers stand in (and the tests fail)
parse_int, parse_float = getattr(checks, "parse_int", int), getattr(checks, "parse_float", float)

ARABIC_3, FULLWIDTH_3, ARABIC_HALF = "\u0663", "\uff13", "\u0660.\u0665"
NOT_ASCII = [ARABIC_3, FULLWIDTH_3, "\u0969", "1\u0660", "\U0001d7d1"]      # Devanagari 3, mathematical bold 3


@pytest.mark.parametrize("text", NOT_ASCII + ["1_0", "0x3", "", " ", "3.0", "+-3"])
def test_parse_int_refuses_all_but_ascii_digits(text):
    with pytest.raises(ValueError):
        parse_int(text)
    with pytest.raises(UnfoldError):
        check_int(text, "k")


@pytest.mark.parametrize("text", NOT_ASCII + [ARABIC_HALF, "1_0.5", "0x1p3", "5e", ".", ""])
def test_parse_float_refuses_all_but_ascii(text):
    with pytest.raises(ValueError):
        parse_float(text)
    with pytest.raises(UnfoldError):
        check_number(text, "p")


def test_the_plain_spellings_are_read():
    assert [parse_int(t) for t in ("3", " 3 ", "+3", "-0", "08")] == [3, 3, 3, 0, 8]
    assert [parse_float(t) for t in (".05", "0.05", "5e-2", "1.", "-2E+1", "inf", "nan")][:5] == \
        [0.05, 0.05, 0.05, 1.0, -20.0]
    assert check_int(8, "k") == 8 and check_number(0.5, "p") == 0.5


@pytest.mark.parametrize("spec", [f"window:{ARABIC_3}", f"strided:{FULLWIDTH_3}", f"dilated:2:{ARABIC_3}",
                                  f"random:{ARABIC_HALF}", "window:1_0"])
def test_graph_specs_refuse_non_ascii_numbers(spec):
    from energies.graphs import graph_from_spec

    with pytest.raises(GraphError):
        graph_from_spec(spec, 8)


@pytest.mark.parametrize("spec", [f"relu:{ARABIC_3}", f"softplus:{FULLWIDTH_3}:1", f"softplus:1:{ARABIC_HALF}",
                                  "relu:1_0"])
def test_rho_specs_refuse_non_ascii_numbers(spec):
    from energies.rho import get_rho

    with pytest.raises(EnergyError):
        get_rho(spec)
    assert get_rho("softplus:3:1").spec() == "softplus:3:1"            # control


@pytest.mark.parametrize("override", [f"model.layers={ARABIC_3}", f"train.lr={ARABIC_HALF}",
                                      f"train.epochs={FULLWIDTH_3}", "train.lr=1_0.5", "model.layers=0x3",
                                      "model.layers=1_0", "train.batch_size=1:04", f"model.graph=window:{ARABIC_3}",
                                      f"model.rho=softplus:{ARABIC_3}:1"])
def test_config_overrides_refuse_non_ascii_and_yaml_only_numbers(override):
    from experiments.app.config import load_config

    with pytest.raises(ConfigError):
        load_config("tiny", [override])


def test_config_files_refuse_yaml_only_numbers(tmp_path):
    from experiments.app.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("model:\n  layers: 0x2\n")
    with pytest.raises(ConfigError, match="plain digits"):
        load_config(str(path))
    path.write_text("model:\n  layers: 2\ntrain:\n  lr: 1e-3\n  weight_decay: .01\n")   # control
    cfg = load_config(str(path))
    assert cfg["model"]["layers"] == 2 and cfg["train"]["lr"] == 0.001 and cfg["train"]["weight_decay"] == 0.01
    assert load_config("tiny", ["name=1_000", "model.layers=3"])["name"] == "1_000"   # a text key stays text


@pytest.mark.parametrize("convert", ["positive_int", "nonnegative_int", "seed_int", "finite_float",
                                     "positive_float", "probability", "any_int", "any_float"])
def test_command_line_numbers_refuse_non_ascii(convert):
    import unfold.cli as cli

    f = getattr(cli, convert)
    for text in (ARABIC_3, FULLWIDTH_3, "1_0"):
        with pytest.raises(argparse.ArgumentTypeError):
            f(text)
    assert f("1") == 1                                                   # control


def test_dataset_options_refuse_non_ascii():
    from experiments.app.data_cli import _option_arg

    with pytest.raises(argparse.ArgumentTypeError):
        _option_arg(f"max_len={ARABIC_3}")
    assert _option_arg("max_len=30") == ("max_len", 30)


@pytest.mark.parametrize("flag", ["--layers", "--seed", "--tol-factor", "--samples"])
def test_unfold_check_refuses_non_ascii_numbers(flag, tmp_path):
    from clifuzz import run_cli
    code, _, err = run_cli("unfold.check", [flag, ARABIC_3], str(tmp_path))
    assert code == 2 and flag in err and ARABIC_3 in err
