"""The PyG conv's hot path reads no node id on the host: with validation off, a compiled forward (and one whose ids
are on a GPU or ``meta``) keeps the edges as a list of fixed shape (``TokenGraph.from_listed``), so
``torch._dynamo.explain`` finds 0 graph breaks (no ``int(ei.min())``, no host read of the edges, no
data-dependent shape) and the forward runs on ``meta``. The checks that read the ids stay where the data enters:
``validate=True``, ``torch_geometric.debug()``, ids on the CPU in eager code, ``cached=True`` (once), and
``TokenGraph``'s constructor, with the same messages."""
import pytest
import torch
import torch._dynamo
import torch_geometric
from torch_geometric.utils import erdos_renyi_graph

from energies.errors import GraphError
from energies.graphs import TokenGraph, canonical_edges
from unfold.pyg import UnfoldedAttentionConv

CONVS = {"exact": {}, "prox": {"heads": 2, "head_channels": 3, "relu": True}}


def case(N=30, d=6, seed=0, dtype=torch.float64):
    """Node features, an anchor, and PyG-style ids with both orientations, repeats and self loops."""
    torch.manual_seed(seed)
    ei = erdos_renyi_graph(N, 0.2)
    ei = torch.cat([ei, ei[:, :7], torch.tensor([[3, 5], [3, 5]]), ei[:, 3:9].flip(0)], 1)
    return torch.randn(N, d, dtype=dtype).relu(), ei, torch.randn(N, d, dtype=dtype)


def breaks(fn, *args):
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    return ex.graph_break_count, [b.reason.splitlines()[0] for b in ex.break_reasons]


@pytest.mark.parametrize("form", sorted(CONVS))
def test_the_forward_with_validation_off_compiles_whole(form):
    x, ei, x0 = case()
    conv = UnfoldedAttentionConv(6, **CONVS[form]).double()
    assert breaks(lambda h: conv(h, ei, x0, return_energy=True), x) == (0, [])
    assert breaks(lambda h: conv.energy(h, ei, x0), x) == (0, [])
    assert breaks(lambda h: conv.mm(h, ei, x0), x) == (0, [])
    cached = UnfoldedAttentionConv(6, cached=True, **CONVS[form]).double()
    cached(x, ei, x0)                                   # fills the cache (the ids read once, on the host)
    assert breaks(lambda h: cached(h, ei, x0, return_energy=True), x) == (0, [])


def test_validate_true_still_reads_the_ids_when_compiled():
    """The negative control: validation is a host read, and explain sees it."""
    x, ei, x0 = case()
    count, reasons = breaks(lambda h: UnfoldedAttentionConv(6, validate=True).double()(h, ei, x0), x)
    assert count > 0 and any("item" in r.lower() or "dynamic" in r.lower() for r in reasons)


@pytest.mark.parametrize("form", sorted(CONVS))
def test_the_forward_runs_on_meta_ids_included(form):
    """Everything on meta (x, x0, edge_index, weights): no host read anywhere in the forward (meta refuses one)."""
    x, ei, x0 = case()
    conv = UnfoldedAttentionConv(6, **CONVS[form]).double().to("meta")
    out, vals = conv(x.to("meta"), ei.to("meta"), x0.to("meta"), return_energy=True)
    assert out.device.type == "meta" and out.shape == x.shape
    assert all(v.device.type == "meta" and v.shape == () for v in vals.values())
    assert conv.energy(x.to("meta"), ei.to("meta")).shape == ()
    direction, curv = conv.mm(x.to("meta"), ei.to("meta"))
    assert direction.shape == x.shape and curv.shape == (x.shape[0],)


def test_ids_on_meta_are_refused_where_they_must_be_read():
    x, ei, _ = case()
    meta = ei.to("meta")
    for conv, xs in ((UnfoldedAttentionConv(6), x),                          # x on the CPU: ids needed there
                     (UnfoldedAttentionConv(6, validate=True), x.to("meta")),  # validation reads them
                     (UnfoldedAttentionConv(6, cached=True), x.to("meta"))):
        with pytest.raises(GraphError, match="meta device"):
            conv.double()(xs, meta)
    with pytest.raises(GraphError, match="meta device"):
        UnfoldedAttentionConv(6).double()(x.to("meta"), meta, batch=torch.zeros(30, dtype=torch.long, device="meta"))
    with torch_geometric.debug(), pytest.raises(GraphError, match="meta device"):
        UnfoldedAttentionConv(6).double()(x.to("meta"), meta)


def unchecked(monkeypatch):
    """The path of a compiled forward (or of ids on a GPU), taken in eager code on the CPU."""
    monkeypatch.setattr(UnfoldedAttentionConv, "_reads_ids", lambda self, ei: False)


@pytest.mark.parametrize("form", sorted(CONVS))
def test_the_unread_graph_gives_the_checked_graphs_step_and_energy(form, monkeypatch):
    x, ei, x0 = case()
    conv = UnfoldedAttentionConv(6, **CONVS[form]).double()
    ref, ref_vals = conv(x, ei, x0, return_energy=True)
    ref_e, (ref_d, ref_c) = conv.energy(x, ei, x0), conv.mm(x, ei, x0)
    unchecked(monkeypatch)
    out, vals = conv(x, ei, x0, return_energy=True)
    assert (out - ref).abs().max() < 1e-12
    assert vals.keys() == ref_vals.keys()
    assert all(torch.allclose(vals[k], ref_vals[k], rtol=1e-12) for k in vals if k != "relu")
    assert torch.allclose(conv.energy(x, ei, x0), ref_e, rtol=1e-12)
    d, c = conv.mm(x, ei, x0)
    assert (d - ref_d).abs().max() < 1e-12 and (c - ref_c).abs().max() < 1e-12


def test_from_listed_is_the_canonical_graph():
    x, ei, _ = case()
    for e in (ei, ei[:, :0], torch.tensor([[2, 2, 4], [2, 2, 1]]), ei.to(torch.int32)):
        fast, ref = TokenGraph.from_listed(e, 30), TokenGraph(1, 30, None, canonical_edges(e, 30, 30, lenient=True))
        src, dst, valid = fast.fixed_edges()
        assert src.shape == dst.shape == valid.shape == (e.shape[1],)           # the input's shape: no compaction
        assert torch.equal(fast.degree(), ref.degree()) and torch.equal(fast.pair_mask(), ref.pair_mask())
        assert torch.equal(fast.to("cpu").degree(), ref.degree()) and torch.equal(fast.edges(), ref.edges())
        masked = torch.arange(30)[None] % 3 != 0
        assert torch.equal(fast.with_mask(masked).degree(), ref.with_mask(masked).degree())
        assert torch.equal(fast.with_mask(masked).edges(), ref.with_mask(masked).edges())
    g = TokenGraph.from_listed(ei.to("meta"), 30)
    assert g.device.type == "meta" and g.fixed_edges()[2].shape == (ei.shape[1],)
    with pytest.raises(GraphError, match=r"\(2, m\) integer"):
        TokenGraph.from_listed(ei.float(), 30)


def test_ids_out_of_range_fail_on_the_device(monkeypatch):
    """Not read, still checked: torch._assert_async (a RuntimeError on the CPU, a device assert on a GPU)."""
    for bad in ([[0, 30], [1, 2]], [[0, -1], [1, 2]]):
        with pytest.raises(RuntimeError, match=r"outside \[0, 30\) for 30 nodes"):
            TokenGraph.from_listed(torch.tensor(bad), 30)
    x, ei, x0 = case()
    conv = UnfoldedAttentionConv(6).double()
    with pytest.raises(GraphError, match=r"outside \[0, 30\) for 30 nodes"):      # eager, CPU ids: read, named
        conv(x, torch.tensor([[0, 30], [1, 2]]))
    unchecked(monkeypatch)
    with pytest.raises(RuntimeError, match=r"outside \[0, 30\)"):
        conv(x, torch.tensor([[0, 30], [1, 2]]))
    assert conv(x, ei, x0).shape == x.shape                     # the positive control


def test_the_compiled_forward_matches_eager():
    """One real compilation (inductor, CPU): the exact form with its energy (one example: its energy a sum; a
    scatter into one slot failed inductor's CPU code generation)."""
    x, ei, x0 = case(N=20, dtype=torch.float32)
    conv = UnfoldedAttentionConv(6)
    ref, ref_vals = conv(x, ei, x0, return_energy=True)
    torch._dynamo.reset()
    out, vals = torch.compile(lambda h: conv(h, ei, x0, return_energy=True), fullgraph=True)(x)
    assert (out - ref).abs().max() < 1e-5
    assert all(torch.allclose(vals[k], ref_vals[k], rtol=1e-5) for k in vals)
