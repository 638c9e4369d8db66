"""Hostile sizes: one memory rule (:mod:`energies.memory`), applied before anything is
allocated or written. Each request too large for the memory this process may allocate is refused with the typed
error of its layer, naming its sizes (options or parameters and values), the estimate and what is available;
before, these died in the allocator with an untyped ``RuntimeError`` (``complete(10**6).edges()``,
``GuaranteedEncoder(100000)``, ``unfold-check --samples 1000000 --n 10 --d 10`` under a memory limit), or ran on
without bound (``unfold-data export --dataset listops --option train=10000000000``, ``--kernel dense --n 100000``).

The available memory is pinned to 2 GiB (``energies.memory.memory_available`` patched) so that every case is
decided the same way on any machine; the positive controls run under the same limit.
"""
import pytest
import torch

from clifuzz import expect_refusal, run_cli
from energies.errors import ConfigError, EnergyError, GraphError
from energies.graphs import complete, strided, window
from energies.kernels import pairwise_pass
from energies.rho import get_rho

LIMIT = 2 * 2 ** 30


@pytest.fixture(autouse=True)
def two_gib(monkeypatch):
    import energies.memory as M

    monkeypatch.setattr(M, "memory_available", lambda: LIMIT)


def _encoder(name, d):
    from unfold import encoders as E

    return getattr(E, name)(d)


def _dense_pass(n):
    Y = torch.randn(1, n, 1, dtype=torch.float64)
    return pairwise_pass(Y, complete(n), get_rho("cauchy"), 1.0, kernel="dense")


def _listops(**options):
    from experiments.data.listops import check_options

    return check_options(options)


LIBRARY_CASES = [
    # (id, call, error, words the message must hold)
    ("complete-1e6-edges", lambda: complete(10 ** 6).edges(), GraphError, ["n=1000000", "GiB", "2.00 GiB"]),
    ("complete-batch-edges", lambda: complete(3000, batch_size=100).edges(), GraphError, ["n=3000", "batch_size 100"]),
    ("complete-pair-list", lambda: complete(10 ** 5).to_sparse(), GraphError, ["n=100000"]),
    ("strided-30000", lambda: strided(30000, 2), GraphError, ["strided:2", "n=30000", "GiB"]),
    ("window-wide", lambda: window(10 ** 6, 100), GraphError, ["window", "GiB"]),
    ("guaranteed-d-100000", lambda: _encoder("GuaranteedEncoder", 100000), ConfigError, ["d=100000", "GiB"]),
    ("guaranteed-d-30000", lambda: _encoder("GuaranteedEncoder", 30000), ConfigError, ["d=30000", "GiB"]),
    ("free-d-100000", lambda: _encoder("FreeEncoder", 100000), ConfigError, ["d=100000", "layers=4"]),
    ("torch-d-100000", lambda: _encoder("TorchEncoder", 100000), ConfigError, ["d=100000", "layers=4"]),
    ("dense-n-100000", lambda: _dense_pass(100000), EnergyError, ["dense", "(1, 100000, 100000)", "GiB"]),
    ("listops-train-1e10", lambda: _listops(train=10 ** 10), Exception, ["data.listops_train", "10000000000", "GiB"]),
    ("listops-long-texts", lambda: _listops(min_len=10 ** 6, max_len=10 ** 6, train=10 ** 4), Exception,
     ["data.listops_min_len=1000000", "GiB"]),
]


@pytest.mark.parametrize("call,error,names", [c[1:] for c in LIBRARY_CASES], ids=[c[0] for c in LIBRARY_CASES])
def test_a_request_beyond_memory_is_refused_by_its_layer_before_allocating(call, error, names):
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    assert "needs about" in msg and "may allocate" in msg, msg
    for name in names:
        assert name.lower() in msg.lower(), f"{name!r} not named in {msg!r}"
    if error is Exception:
        from experiments.data import DataError
        assert isinstance(info.value, DataError)


CHECK = "unfold.check"
CLI_CASES = [
    (CHECK, ["--samples", "1000000", "--n", "10", "--d", "10"], ["--samples 1000000", "--n 10", "--d 10", "GiB"]),
    (CHECK, ["--samples", "1", "--n", "30000", "--graph", "strided:2"], ["strided:2", "n=30000", "GiB"]),
    (CHECK, ["--kernel", "dense", "--n", "100000"], ["--kernel dense", "--n 100000", "GiB"]),
    (CHECK, ["--kernel", "dense", "--n", "20000", "--samples", "1", "--d", "1"], ["--kernel dense", "20000"]),
    (CHECK, ["--kernel", "edges", "--n", "100000", "--samples", "1", "--d", "1"], ["--kernel edges", "--n 100000", "GiB"]),
    ("experiments.app.data_cli", ["export", "--dataset", "listops", "--option", "train=10000000000", "--out", "out"],
     ["train=10000000000", "GiB"]),
    ("experiments.app.data_cli", ["export", "--dataset", "listops", "--option", "test=99999999999999", "--out", "out"],
     ["test=99999999999999", "GiB"]),
]


@pytest.mark.parametrize("module,argv,names", CLI_CASES, ids=[" ".join(c[1]) for c in CLI_CASES])
def test_a_command_beyond_memory_is_refused_in_one_line_writing_nothing(tmp_path, module, argv, names):
    expect_refusal(module, argv, str(tmp_path), names=names)


def test_the_positive_controls_pass_under_the_same_limit(tmp_path):
    """Requests that fit run under the 2 GiB limit: the rule refuses only what cannot fit."""
    from unfold.encoders import GuaranteedEncoder

    assert complete(200).edges().shape == (2, 200 * 199 // 2)
    assert strided(3000, 2).num_edges().item() > 0
    assert GuaranteedEncoder(64).W.shape == (2, 64, 32)
    assert _dense_pass(300).deg.shape == (1, 300)
    assert _listops(train=10, val=2, test=2)["train"] == 10
    code, out, err = run_cli(CHECK, ["--n", "8", "--samples", "2", "--d", "4", "--kernel", "dense", "--layers", "2"],
                             str(tmp_path))
    assert code == 0, err


def test_the_rule_reads_the_machine_and_training_uses_the_same_reading(monkeypatch):
    """One rule: training's memory check reads :func:`energies.memory.memory_available` (moved there from
    ``experiments.app.train``); the rule refuses only past what is available, and judges nothing where the
    memory cannot be read, on another device, or on ``meta``."""
    import energies.memory as M
    from experiments.app import train

    import inspect

    source = inspect.getsource(train)
    assert "def memory_available" not in source and "from energies.memory import memory_available" in source
    M.check_memory(LIMIT, "fits", ConfigError)                      # equal: fits
    with pytest.raises(ConfigError, match="one byte more needs about"):
        M.check_memory(LIMIT + 1, "one byte more", ConfigError)
    M.check_memory(10 ** 30, "on meta", ConfigError, device=torch.device("meta"))
    monkeypatch.setattr(M, "memory_available", lambda: None)
    M.check_memory(10 ** 30, "unknown", ConfigError)
