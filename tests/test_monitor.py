"""Descent monitor modes off / warn / strict, the float64 re-check, and a fault-injection negative control."""
import pytest
import torch

import unfold as U
from energies.errors import ConfigError, DescentError
from unfold.monitor import DescentMonitor


def batch(B=4, n=9, vocab=30, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, n + 1, (B,), generator=gen)
    mask = torch.arange(n)[None] < lengths[:, None]
    return torch.randint(1, vocab, (B, n), generator=gen) * mask, mask


def model(mode="guaranteed"):
    torch.manual_seed(0)
    return U.UnfoldedTransformer(30, 2, d=8, heads=2, layers=4, mode=mode, dropout=0.0)


def test_a_correct_model_passes_strict_and_warn():
    ids, mask = batch()
    m = model().train()
    for mode in ("warn", "strict"):
        mon = DescentMonitor(mode)
        assert mon.observe(m, m(ids, mask), "batch 1") == 0
        assert mon.steps == 16 and mon.confirmed == 0 and "eps(float32)" in mon.tol_rule


def test_strict_raises_with_detail_and_warn_logs(faulty):
    ids, mask = batch()
    m = model()
    out = m(ids, mask)
    with pytest.raises(DescentError, match=r"descent violation \(epoch 3, batch 7\): example 0, layer \d: energy .* "
                                           r"> tol .*eps\(float64\).*terms up: residual"):
        DescentMonitor("strict").observe(m, out, "epoch 3, batch 7")
    logged = []
    mon = DescentMonitor("warn", log=logged.append)
    assert mon.observe(m, out, "epoch 1, batch 1") > 0
    assert mon.confirmed > 0 and logged and all("example 0" in msg for msg in logged)
    assert DescentMonitor("off").observe(m, out) == 0


def test_float32_flags_are_rechecked_in_float64():
    ids, mask = batch(seed=1)
    m = model()
    out = m(ids, mask)
    out.energies["residual"][1, 2] += 10.0       # a spurious increase in the trace, not in the model
    assert out.report().cleared >= 1             # the trace's own exact re-evaluation clears it
    out.energies.exact = None                    # without it (a trace read back from a file): the monitor's replay
    logged = []
    mon = DescentMonitor("strict", log=logged.append)
    assert mon.observe(m, out, "batch 2") == 0       # strict does not raise: the float64 re-check clears it
    assert mon.flagged >= 1 and mon.cleared == mon.flagged and "cleared by the float64 re-evaluation" in logged[0]


def test_untied_modes_are_not_judged_and_bad_mode_is_named():
    ids, mask = batch()
    m = model("free")
    out = m(ids, mask)
    assert DescentMonitor("strict").observe(m, out) == 0
    with pytest.raises(ConfigError, match=r"descent monitor mode 'loud' is unknown; valid: \['off', 'warn', 'strict'\]"):
        DescentMonitor("loud")


def test_monitor_options_are_refused_by_name():
    """Adversarial review: max_logged went through int() (ValueError/OverflowError for 'x', NaN, inf; 2.5 and
    True taken as 2 and 1, -5 kept), and a log that is not callable was accepted until the first violation."""
    for bad in ("x", float("nan"), float("inf"), -5, 2.5, True):
        with pytest.raises(ConfigError, match="max_logged"):
            DescentMonitor("warn", max_logged=bad)
    for bad in (3, "print"):
        with pytest.raises(ConfigError, match="log must be a callable"):
            DescentMonitor("warn", log=bad)
    assert DescentMonitor("warn", max_logged=0, log=print).max_logged == 0
