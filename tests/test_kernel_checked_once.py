"""A ``kernel`` name is checked once, where it enters: the constructor of the encoder, step or term a user builds
(:func:`energies.kernels.check_kernel`, the registries' one rule). The terms a model builds from it, and every pass
of every forward and trace, check nothing by name (``validate=False``). The public passes
(:func:`energies.kernels.pairwise_pass` and kin) are entries too, so called directly they check: the negative
control that shows the counter sees a check on the pass path."""
import pytest
import torch

import energies as E
import unfold as U
from energies.errors import ConfigError, EnergyError
from energies.kernels import KERNELS, pairwise_energy, pairwise_pass


@pytest.fixture
def checks(monkeypatch):
    """The names the kernel registry was asked to check, in order."""
    seen = []
    real = KERNELS.check

    def counting(name, *a, **k):
        seen.append(name)
        return real(name, *a, **k)
    monkeypatch.setattr(KERNELS, "check", counting)
    return seen


def _tokens(B=2, n=7, d=6):
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, n, d, generator=g, dtype=torch.float64), torch.ones(B, n, dtype=torch.bool)


@pytest.mark.parametrize("kernel", ["dense", "edges"])
def test_an_encoder_checks_its_kernel_at_construction_only(checks, kernel):
    enc = U.GuaranteedEncoder(6, layers=3, heads=2, kernel=kernel).double()
    assert checks == [kernel]
    X, mask = _tokens()
    for _ in range(2):
        enc(X, mask, trace=True)          # steps, energy values and the trace's float64 values
    enc(X, mask)
    assert checks == [kernel]


def test_a_step_checks_its_kernel_once_and_its_trace_never(checks):
    step = U.AttentionStep("exp", tau=2.0, kernel="dense")
    assert checks == ["dense"]
    X, _ = _tokens()
    U.trace_descent(step, X, E.complete(7, 2), layers=3)
    assert checks == ["dense"]


def test_a_bad_name_is_refused_where_it_enters():
    with pytest.raises(EnergyError, match="unknown pairwise kernel 'nope'"):
        U.AttentionStep("exp", kernel="nope")
    with pytest.raises(EnergyError, match="unknown pairwise kernel 'nope'"):
        E.PairwiseAttention(kernel="nope")
    with pytest.raises(ConfigError, match="unknown pairwise kernel 'nope'"):
        U.GuaranteedEncoder(6, kernel="nope")


def test_the_public_passes_are_entries_and_check(checks):
    """Negative control: called directly, each public pass checks the name, so the zero counts above are the
    layers' passes skipping a check, not a counter that sees nothing."""
    X, _ = _tokens()
    g = E.complete(7, 2)
    rho = E.get_rho("exp")
    pairwise_pass(X, g, rho, 2.0, "dense")
    pairwise_energy(X, g, rho, 2.0, "dense")
    assert checks == ["dense", "dense"]
    with pytest.raises(EnergyError, match="unknown pairwise kernel 'nope'"):
        pairwise_pass(X, g, rho, 2.0, "nope")


def test_an_unchecked_term_computes_what_a_checked_one_does():
    """``validate=False`` skips the checks, not the set-up: the constant curvature bound's rho'(0) included."""
    X, _ = _tokens()
    g = E.complete(7, 2)
    for curvature in ("adaptive", "constant"):
        a = E.PairwiseAttention("exp", 2.0, "dense", curvature=curvature)
        b = E.PairwiseAttention("exp", 2.0, "dense", curvature=curvature, validate=False)
        pa, pb = a.mm(X, g), b.mm(X, g)
        assert torch.equal(pa.grad, pb.grad) and torch.equal(pa.curvature, pb.curvature)
        assert torch.equal(a.value(X, g), b.value(X, g))
