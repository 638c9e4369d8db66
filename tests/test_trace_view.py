"""The energy trace read by layer as well as by term: ``trace[t]`` (a boundary), ``trace[a:b]`` (an EnergyTrace of
consecutive boundaries, judged as the whole trace judges those steps), ``layers``, ``num_layers``, ``totals`` and a
repr that shows the values. ``out.energies[:2]`` is a slice, not a TypeError (a slice is no dict key), and the
totals are read from the trace, not only from ``out.report().totals``. Reading by term is the dict's."""
import pytest
import torch

import unfold as U
from energies.errors import StepError
from unfold.trace import EnergyTrace


@pytest.fixture(scope="module")
def out():
    torch.manual_seed(0)
    enc = U.GuaranteedEncoder(8, heads=2, layers=4, graph="window:2")
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    return enc(torch.randn(2, 6, 8), mask, trace=True)


def test_by_term_the_trace_is_still_the_dict(out):
    trace = out.energies
    assert list(trace) == ["head0", "head1", "residual", "ffn", "relu"] and len(trace) == 5
    assert all(tuple(v.shape) == (2, 5) and v.dtype == torch.float64 for v in trace.values())
    assert trace["residual"] is dict.__getitem__(trace, "residual")
    with pytest.raises(KeyError):
        trace["nope"]


def test_a_boundary_is_the_terms_at_that_layer(out):
    trace = out.energies
    assert trace.num_layers == 4 and len(trace.layers) == 5
    for t in range(5):
        assert trace[t].keys() == trace.keys()
        assert all(torch.equal(trace[t][k], trace[k][:, t]) for k in trace)
        assert all(torch.equal(trace.layers[t][k], trace[k][:, t]) for k in trace)
    assert all(torch.equal(trace[-1][k], trace[4][k]) for k in trace)
    with pytest.raises(IndexError, match="Y_0 .. Y_4"):
        trace[5]
    with pytest.raises(IndexError):
        trace[-6]


def test_totals_are_the_sum_of_the_terms_and_the_reports_totals(out):
    trace = out.energies
    total = sum(trace[k] for k in trace)
    assert torch.equal(trace.totals, total) and tuple(trace.totals.shape) == (2, 5)
    assert torch.allclose(trace.totals, out.report().totals)
    assert bool((trace.totals[:, 1:] <= trace.totals[:, :-1]).all())        # the guaranteed encoder descends


def test_a_slice_is_a_trace_of_the_steps_inside_it(out):
    trace = out.energies
    full = out.report()
    for a, b in ((0, 2), (1, 4), (2, 5), (0, 5), (-3, None)):
        part = trace[a:b]
        lo, hi, _ = slice(a, b).indices(5)
        assert isinstance(part, EnergyTrace) and part.num_layers == hi - lo - 1 and list(part) == list(trace)
        assert all(torch.equal(part[k], trace[k][:, lo:hi]) for k in trace)
        assert torch.equal(part.resolution, trace.resolution[:, lo:hi])
        rep = U.report_from_values(part, out.Y.dtype)
        assert rep.steps == 2 * (hi - lo - 1)
        assert torch.equal(rep.tol, full.tol[:, lo:hi - 1]) and torch.equal(rep.increases, full.increases[:, lo:hi - 1])
        if part.exact is not None:                 # the exact evaluation of the part's boundary t is the trace's lo + t
            assert all(torch.equal(part.exact(0)[k], trace.exact(lo)[k]) for k in trace)
    assert trace[3:1].num_layers == 0 and trace[3:1].layers == []            # an empty slice, as a list's
    with pytest.raises(StepError, match="step 1"):
        trace[::2]


def test_a_slice_keeps_the_frozen_layers_of_an_energy_chosen_depth():
    """With ``stop_rel`` the slice carries the layers that ran; a window that starts after an example stopped holds
    no step of it, and the report refuses to read that as descent (its rule for ``ran``)."""
    torch.manual_seed(1)
    enc = U.GuaranteedEncoder(8, heads=2, layers=6, graph="complete", stop_rel=0.2)
    out = enc(torch.randn(3, 5, 8), trace=True)
    trace = out.energies
    assert trace.ran is not None and bool(trace.ran[:, 0].all()) and not bool(trace.ran[:, 2].any())
    part = trace[0:4]
    assert torch.equal(part.ran, trace.ran[:, 0:3])
    assert U.report_from_values(part, out.Y.dtype).steps == int(trace.ran[:, 0:3].sum())
    assert torch.equal(trace[2:5].ran, trace.ran[:, 2:4])
    with pytest.raises(StepError, match="ran must mark"):
        U.report_from_values(trace[2:5], out.Y.dtype)


def test_the_repr_names_terms_examples_layers_and_mean_totals(out):
    text = repr(out.energies)
    assert text.startswith("EnergyTrace(terms ['head0', 'head1', 'residual', 'ffn', 'relu'], 2 examples, 4 layers")
    means = [float(x) for x in text.split("mean total E(Y_t): ")[1].rstrip(")").split(" -> ")]
    assert means == pytest.approx(out.energies.totals.mean(0).tolist(), rel=1e-3)
    assert "1 layer (Y_0 .. Y_1)" in repr(out.energies[:2])
    assert repr(EnergyTrace()) == "EnergyTrace()"


def test_reading_by_layer_on_meta_reads_no_value():
    """Slicing, indexing and totals are device ops: on ``meta`` (no values at all) they give meta tensors, and the
    repr shows no value (a host read would fail there)."""
    values = [{"a": torch.empty(4, device="meta", dtype=torch.float64),
               "b": torch.empty(4, device="meta", dtype=torch.float64)} for _ in range(3)]
    trace = EnergyTrace.from_layers(values, [torch.empty(4, device="meta", dtype=torch.float64)] * 3)
    assert trace.totals.device.type == "meta" and tuple(trace.totals.shape) == (4, 3)
    assert trace[:2]["a"].device.type == "meta" and trace[1]["b"].shape == (4,)
    assert repr(trace).endswith("2 layers (Y_0 .. Y_2), torch.float64)")
