"""The library as parts: one MM step behind every MM layer, registered kernels and encoders, encoders on
(B, n, d) tokens, the graph cache, the PyG conv's inputs and cache, compile-ready forward passes."""
import math

import pytest
import torch
from torch_geometric.utils import erdos_renyi_graph

import energies as E
import unfold as U
import unfold.mm
from energies.errors import ConfigError, EnergyError, GraphError, TokenError
from energies.graphs import GraphCache
from energies.kernels.edges import edges_pass
from energies.kernels import KERNELS, pairwise_pass, register_kernel
from unfold.classifier import upgrade_state_dict
from unfold.pyg import UnfoldedAttentionConv


def tokens(B=3, n=10, d=6, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, dtype=dtype, generator=gen)
    mask = torch.arange(n)[None] < torch.randint(2, n + 1, (B,), generator=gen)[:, None]
    return X, mask


# ----------------------------------------------------------------- one definition of the MM step
def test_every_mm_layer_goes_through_the_one_mm_direction(monkeypatch):
    """Zeroing unfold.mm.mm_direction freezes every MM layer: the attention step, the prox step, the conv and the
    guaranteed encoder have no update of their own (negative control: before the patch each moves its input)."""
    X, mask = tokens()
    g = E.complete(10, batch_size=3, mask=mask)
    Xp = torch.relu(X)
    ei = erdos_renyi_graph(12, 0.4)
    x, x0 = torch.rand(12, 6, dtype=torch.float64), torch.rand(12, 6, dtype=torch.float64)
    torch.manual_seed(0)
    enc = U.GuaranteedEncoder(6, heads=2, layers=2).double()
    layers = {
        "attention": lambda: U.AttentionStep("exp", 2.0, 0.7, B=X)(X, g),
        "prox": lambda: U.ProxMMStep(E.Energy(attention=E.PairwiseAttention(), residual=E.Residual(X),
                                              relu=E.NonNegativity()))(Xp, g),
        "conv_exact": lambda: UnfoldedAttentionConv(6)(x, ei, x0),
        "conv_metric": lambda: UnfoldedAttentionConv(6, heads=2, head_channels=3, relu=True).double()(x, ei, x0),
        "encoder": lambda: enc(Xp, mask).Y,
    }
    inputs = {"attention": X, "prox": Xp, "conv_exact": x, "conv_metric": x,
              "encoder": Xp * mask[..., None]}                      # the encoder zeroes padded slots
    for name, run in layers.items():
        assert not torch.equal(run(), inputs[name]), name            # the layer moves its input
    calls = []
    original = unfold.mm.mm_direction

    def frozen(*args, **kw):
        calls.append(1)
        direction, vals, curv = original(*args, **kw)
        return torch.zeros_like(direction), vals, curv

    monkeypatch.setattr(unfold.mm, "mm_direction", frozen)
    for name, run in layers.items():
        before = len(calls)
        assert torch.equal(run(), inputs[name]), name                # ... only through mm_direction
        assert len(calls) > before, name


def test_mm_step_forms_match_their_textbook_formulas():
    """'jacobi' is supplement eq. 36-37's (1 - a) y + a (sum gamma y_v + b) / (1 + deg); 'bound' is
    ReLU(Y - a grad E / c) with grad and c from autograd and the terms' bounds."""
    X, mask = tokens(seed=1)
    g = E.window(10, 3, batch_size=3, mask=mask)
    B = torch.randn_like(X)
    energy = E.attention_energy("cauchy", 1.5, B)
    out = U.mm_step(energy, X, g, 0.6, "jacobi").Y
    Xp = g.zero_padded(X)
    num, deg = energy.terms["attention"].neighbour_sums(Xp, g)
    ref = 0.4 * X + 0.6 * (num + B) / (1.0 + deg)[..., None]
    assert torch.allclose(g.zero_padded(out), g.zero_padded(ref), atol=1e-12)
    energy = E.Energy(attention=E.PairwiseAttention("exp", 2.0, metric=torch.randn(6, 3, dtype=torch.float64)),
                      residual=E.Residual(B), relu=E.NonNegativity())
    Y = torch.relu(X).requires_grad_()
    grad, = torch.autograd.grad(energy.value(Y, g).sum(), Y)
    c = energy.curvature(Y.detach(), g)
    ref = torch.relu(Y.detach() - 0.9 * grad / c[..., None])
    assert torch.allclose(g.zero_padded(U.mm_step(energy, Y.detach(), g, 0.9).Y), g.zero_padded(ref), atol=1e-10)
    with pytest.raises(Exception, match="no Jacobi diagonal"):
        U.mm_step(energy, Y.detach(), g, 0.9, "jacobi")


# ----------------------------------------------------------------- registered kernels
@pytest.fixture
def counting_kernel():
    calls = []

    @register_kernel("edges_counted")
    def run(Y, graph, rho, tau, energy, num, metric):
        calls.append(graph.name)
        return edges_pass(Y, graph, rho, tau, energy, num, metric)

    yield calls
    KERNELS.pop("edges_counted")


def test_a_registered_kernel_is_selectable_by_name_everywhere(counting_kernel, tmp_path):
    X, mask = tokens(seed=2)
    g = E.window(10, 2, batch_size=3, mask=mask)
    ref = pairwise_pass(X, g, E.get_rho("exp"), 1.3, "edges", energy=True)
    got = pairwise_pass(X, g, E.get_rho("exp"), 1.3, "edges_counted", energy=True)
    assert torch.equal(got.agg, ref.agg) and torch.equal(got.energy, ref.energy) and counting_kernel
    step = U.AttentionStep("exp", 1.3, kernel="edges_counted")
    assert torch.equal(step(X, g), U.AttentionStep("exp", 1.3, kernel="edges")(X, g))
    torch.manual_seed(0)
    a = U.GuaranteedEncoder(6, layers=2, graph="window:2", kernel="edges_counted").double()
    torch.manual_seed(0)
    b = U.GuaranteedEncoder(6, layers=2, graph="window:2", kernel="edges").double()
    n_before = len(counting_kernel)
    assert torch.equal(a(X, mask).Y, b(X, mask).Y) and len(counting_kernel) > n_before
    from experiments.app.config import load_config
    assert load_config(None, ["model.kernel=edges_counted"])["model"]["kernel"] == "edges_counted"
    with pytest.raises(ConfigError, match="model.kernel"):
        load_config(None, ["model.kernel=nope"])
    with pytest.raises(EnergyError, match="unknown pairwise kernel 'nope'"):
        E.PairwiseAttention(kernel="nope")
    with pytest.raises(EnergyError, match="kernel name"):
        register_kernel("auto")


# ----------------------------------------------------------------- encoders
@pytest.mark.parametrize("kind", ["guaranteed", "free", "baseline"])
def test_encoders_take_tokens_and_a_mask_and_return_the_trace(kind):
    X, mask = tokens(B=4, n=9, d=8, seed=3, dtype=torch.float32)
    torch.manual_seed(0)
    enc = U.build_encoder(kind, d=8, heads=2, layers=3).eval()
    out = enc(X, mask, trace=True, keep_states=True)
    assert out.Y.shape == X.shape and len(out.states) == 4
    assert set(out.energies) >= {"residual"} and all(v.shape == (4, 4) for v in out.energies.values())
    rep = out.report()
    assert rep.steps == 12 and (rep.num_increases == 0 if kind == "guaranteed" else True)
    assert out.guaranteed == (kind == "guaranteed")
    assert torch.equal(enc(X, mask.long()).Y, enc(X, mask).Y)            # 0/1 integer mask = bool mask
    assert torch.equal(enc(X, mask, graph=enc.token_graph(mask)).Y, out.Y)
    assert torch.equal(out.Y[~mask], torch.zeros_like(out.Y[~mask]))    # padded slots stay zero
    with pytest.raises(ConfigError, match="no energy trace"):
        enc(X, mask).report()


def test_guaranteed_encoder_descends_for_random_large_weights_on_every_graph():
    X, mask = tokens(B=4, n=12, d=8, seed=4)
    for graph in ("complete", "window:2", "star", "random:0.3"):
        for rho in ("exp", "relu:1.5", "cauchy"):
            torch.manual_seed(1)
            enc = U.GuaranteedEncoder(8, heads=3, layers=5, rho=rho, graph=graph, layernorm=True).double()
            with torch.no_grad():
                enc.W.mul_(4.0)
                enc.A.mul_(2.0)
            rep = enc(X, mask, trace=True).report()
            assert rep.verdict == "descent" and rep.num_increases == 0, (graph, rho)


def test_encoder_validation_is_behind_the_switch():
    X, mask = tokens(seed=5)
    X[0, 0, 0] = math.nan
    enc = U.GuaranteedEncoder(6, layers=1, validate=True).double()
    with pytest.raises(TokenError, match="NaN at example 0, token 0"):
        enc(X, mask)
    with pytest.raises(ConfigError, match="at least one real token"):
        enc(X.nan_to_num(), torch.zeros_like(mask))
    with pytest.raises(ConfigError, match=r"tokens must be \(B, n, 6\)"):
        enc(X[..., :5], mask)
    for bad, match in [(dict(d=0), "d must be"), (dict(heads=0), "heads"), (dict(alpha=0.0), "alpha"),
                       (dict(curvature="tight"), "curvature='tight'"), (dict(kernel="nope"), "unknown pairwise kernel 'nope'"),
                       (dict(ffn="yes"), "ffn must be True or False"), (dict(rho="nope"), "unknown rho")]:
        with pytest.raises((ConfigError, EnergyError), match=match):
            U.GuaranteedEncoder(**{"d": 6, **bad})
    with pytest.raises(ConfigError, match="unknown encoder 'deq'"):
        U.build_encoder("deq", d=4)


def test_a_plug_in_encoder_registers_by_name():
    @U.register_encoder("identity_test")
    class Identity(U.Encoder):
        def energy(self, B):
            return E.Energy(residual=E.Residual(B))

        def run(self, X, mask, graph, trace, keep_states, layers):
            return U.EncoderOutput(X)

    try:
        assert "identity_test" in U.MODES
        model = U.UnfoldedTransformer(20, 2, d=4, layers=1, mode="identity_test")
        assert model(torch.ones(2, 3, dtype=torch.long), trace=False).logits.shape == (2, 2)
    finally:
        U.ENCODERS.pop("identity_test")


def test_old_checkpoint_keys_load_into_the_composed_classifier():
    torch.manual_seed(0)
    for mode in ("guaranteed", "free", "baseline"):
        a = U.UnfoldedTransformer(30, 2, d=8, layers=2, mode=mode).eval()
        old = {}
        for k, v in a.state_dict().items():   # the names checkpoints had before the encoders were modules
            for new, prev in (("embedding.", ""), ("encoder.torch_encoder.", "encoder."), ("encoder.", "")):
                if k.startswith(new):
                    k = prev + k[len(new):]
                    break
            old[k] = v
        assert "embed.weight" in old and not any(k.startswith("embedding.") for k in old)
        torch.manual_seed(1)
        b = U.UnfoldedTransformer(30, 2, d=8, layers=2, mode=mode).eval()
        b.load_state_dict(old)
        ids = torch.randint(1, 30, (2, 5))
        assert torch.equal(a(ids, trace=False).logits, b(ids, trace=False).logits), mode
        assert set(upgrade_state_dict(dict(old))) == set(a.state_dict())


# ----------------------------------------------------------------- token graphs built on the device, cached
@pytest.mark.parametrize("spec", ["complete", "window:3", "strided:3", "dilated:2:2", "random:0.4", "star"])
def test_graph_cache_equals_building_from_the_mask(spec):
    cache = GraphCache(spec, seed=7)
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        mask = torch.rand(5, 11, generator=gen) < 0.7
        got, ref = cache(mask), E.graph_from_spec(spec, 11, batch_size=5, mask=mask, seed=7)
        assert torch.equal(got.edges(), ref.edges()) and torch.equal(got.mask, ref.mask), (spec, seed)
    assert len(cache._graphs) == (0 if spec == "complete" else 1 if spec != "star" else 4)


def test_a_user_graph_depending_on_the_mask_is_built_per_mask():
    @E.register_graph("first_two")
    def first_two(n, batch_size=1, mask=None, seed=0):   # joins the first two real tokens: depends on the mask
        m = torch.ones(batch_size, n, dtype=torch.bool) if mask is None else mask
        src, dst = [], []
        for b in range(batch_size):
            idx = m[b].nonzero().reshape(-1)
            if idx.numel() >= 2:
                src.append(int(idx[0]) + b * n)
                dst.append(int(idx[1]) + b * n)
        return E.TokenGraph(batch_size, n, m, torch.tensor([src, dst], dtype=torch.long).reshape(2, -1))

    try:
        cache = GraphCache("first_two")
        mask = torch.tensor([[False, True, True, True]])
        assert cache(mask).edges().tolist() == [[1], [2]]
    finally:
        E.GRAPHS.pop("first_two")


# ----------------------------------------------------------------- the PyG conv
def conv_case(N=30, d=5, seed=0):
    torch.manual_seed(seed)
    ei = erdos_renyi_graph(N, 0.2)
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(N, d, dtype=torch.float64, generator=gen), ei,
            torch.rand(N, d, dtype=torch.float64, generator=gen))


def test_conv_accepts_sparse_adjacency_and_edge_index_objects():
    x, ei, x0 = conv_case()
    conv = UnfoldedAttentionConv(5, heads=2, head_channels=3, relu=True).double()
    ref = conv(x, ei, x0)
    adj = torch.sparse_coo_tensor(ei, torch.ones(ei.shape[1]), (30, 30))
    assert torch.equal(conv(x, adj, x0), ref)
    assert torch.equal(conv(x, adj.to_sparse_csr(), x0), ref)
    assert torch.equal(conv(x, adj.t().coalesce(), x0), ref)                 # adj_t: the same undirected graph
    from torch_geometric import EdgeIndex
    assert torch.equal(conv(x, EdgeIndex(ei, sparse_size=(30, 30)), x0), ref)
    with pytest.raises(GraphError, match="square"):
        conv(x, torch.sparse_coo_tensor(ei, torch.ones(ei.shape[1]), (30, 31)), x0)


def test_conv_batch_gives_per_graph_energies_equal_to_each_graph_alone():
    graphs = [conv_case(N=n, seed=s) for n, s in ((12, 1), (20, 2), (7, 3))]
    xs, eis, x0s, batch, off = [], [], [], [], 0
    for g, (x, ei, x0) in enumerate(graphs):
        xs.append(x), eis.append(ei + off), x0s.append(x0), batch.append(torch.full((x.shape[0],), g))
        off += x.shape[0]
    x, ei, x0, batch = torch.cat(xs), torch.cat(eis, 1), torch.cat(x0s), torch.cat(batch)
    conv = UnfoldedAttentionConv(5, heads=2, head_channels=3, relu=True).double()
    out, vals = conv(x, ei, x0, return_energy=True, batch=batch)
    assert all(v.shape == (3,) for v in vals.values())
    per_graph = conv.energy(x, ei, x0, batch=batch)
    for g, (xg, eig, x0g) in enumerate(graphs):
        alone, alone_vals = conv(xg, eig, x0g, return_energy=True)
        assert torch.allclose(out[batch == g], alone, atol=1e-14)
        assert torch.allclose(sum(v[g] for v in vals.values()), sum(alone_vals.values()), rtol=1e-13)
        assert torch.allclose(per_graph[g], conv.energy(xg, eig, x0g), rtol=1e-13)
    assert torch.allclose(conv(x, ei, x0), out, atol=1e-14)                 # the same step without batch
    with pytest.raises(GraphError, match="joins examples"):
        conv(x, torch.tensor([[0], [15]]), x0, batch=batch)


def test_conv_cache_reset_parameters_and_repr():
    x, ei, x0 = conv_case()
    conv = UnfoldedAttentionConv(5, heads=2, head_channels=3, cached=True).double()
    out = conv(x, ei, x0)
    cached = conv._cached_layout
    assert cached is not None and torch.equal(conv(x, ei, x0), out) and conv._cached_layout is cached
    assert torch.equal(conv(x, ei[:, :3], x0), out)        # cached: the first graph is reused, as GCNConv's
    with pytest.raises(GraphError, match="cached a graph of 30 nodes"):
        conv(x[:10], ei, x0[:10])
    W = conv.W.detach().clone()
    conv.reset_parameters()
    assert conv._cached_layout is None and not torch.equal(conv.W, W)
    small = conv(x, ei[:, :3], x0)                                    # a fresh cache, of the small graph
    fresh = UnfoldedAttentionConv(5, heads=2, head_channels=3).double()
    fresh.load_state_dict(conv.state_dict())
    assert torch.equal(small, fresh(x, ei[:, :3], x0)) and not torch.equal(small, fresh(x, ei, x0))
    assert repr(conv) == ("UnfoldedAttentionConv(5, prox, heads=2, head_channels=3, rho=exp, tau=1.73205, "
                          "alpha=1, cached)")
    assert repr(UnfoldedAttentionConv(4, rho="cauchy", tau=2.0)) == \
        "UnfoldedAttentionConv(4, exact, rho=cauchy, tau=2, alpha=1)"


# ----------------------------------------------------------------- compile-ready forward passes
def _fullgraph(fn, *args):
    import torch._dynamo
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")(*args)


def test_forward_passes_compile_in_one_graph_without_host_reads():
    """fullgraph=True refuses any graph break (a .item(), a bool(tensor), a data-dependent branch): the
    classifier with the trace off and on and the cached conv have none. Negative control: validate=True
    (host reads by design) breaks the graph."""
    from experiments.app.config import load_config
    from experiments.app.build import build_model
    torch.manual_seed(0)
    model = build_model(load_config(None, ["model.d=8", "model.layers=2"]), 50, 2).eval()
    ids = torch.randint(1, 50, (3, 7))
    mask = torch.arange(7)[None] < torch.tensor([[7], [4], [2]])
    eager = model(ids, mask, trace=False).logits
    assert torch.allclose(_fullgraph(lambda i, m: model(i, m, trace=False).logits, ids, mask), eager, atol=1e-6)
    traced = _fullgraph(lambda i, m: dict(model(i, m, trace=True).energies), ids, mask)
    assert set(traced) == set(model(ids, mask).energies)
    x, ei, x0 = conv_case()
    conv = UnfoldedAttentionConv(5, heads=2, head_channels=3, relu=True, cached=True).double()
    conv(x, ei, x0)
    assert torch.equal(_fullgraph(lambda h: conv(h, ei, x0), x), conv(x, ei, x0))
    model.validate = True
    with pytest.raises(Exception, match="(?i)graph break|data-dependent|Unsupported"):
        _fullgraph(lambda i, m: model(i, m, trace=False).logits, ids, mask)


def test_a_user_rho_without_super_init_works_in_modules():
    class Scaled(E.Rho):
        name = "scaled_test"

        def __init__(self, s=2.0):   # no super().__init__(): adopted when built
            self.s = s

        def value(self, z):
            return -self.s * torch.exp(-z)

        def derivative(self, z):
            return self.s * torch.exp(-z)

    enc = U.GuaranteedEncoder(6, layers=2, rho=Scaled()).double()
    X, mask = tokens(seed=6)
    assert enc(torch.relu(X), mask, trace=True).report().num_increases == 0
    assert any(m is enc.rho for m in enc.modules())


def test_resuming_an_old_layout_checkpoint_keeps_each_adam_moment_with_its_parameter():
    """A checkpoint of the layout before the encoders were modules (keys W, A, embed.*, ... in that order, the
    optimizer's state in that order) is upgraded: keys renamed and the optimizer state permuted to today's order.
    Negative control: loading the old optimizer state as it is attaches moments to the wrong parameters."""
    from experiments.app.config import load_config
    from experiments.app.build import build_model
    from experiments.app.train import upgrade_checkpoint
    torch.manual_seed(0)
    model = build_model(load_config(None, ["model.d=8", "model.layers=2"]), 20, 2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(torch.randint(1, 20, (2, 5)), trace=False).logits.square().sum().backward()
    opt.step()
    new_names = [n for n, _ in model.named_parameters()]
    old_of = {"encoder.W": "W", "encoder.A": "A"}
    old_names = ["W", "A"] + [n.replace("embedding.", "") for n in new_names if n.startswith("embedding.")] + \
        [n for n in new_names if n.startswith("head.")]            # the old model's own parameters came first
    new_of_old = {old: new for new in new_names
                  for old in [old_of.get(new, new.replace("embedding.", ""))]}
    sd = model.state_dict()
    osd = opt.state_dict()
    ck = {"model": {old: sd[new_of_old[old]] for old in old_names},
          "optimizer": {"state": {i: osd["state"][new_names.index(new_of_old[old])] for i, old in enumerate(old_names)},
                        "param_groups": [dict(osd["param_groups"][0], params=list(range(len(old_names))))]}}
    wrong = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises((ValueError, RuntimeError, KeyError)):
        wrong.load_state_dict(ck["optimizer"])
        wrong.step()
    upgrade_checkpoint(ck, model)
    assert list(ck["model"]) and set(ck["model"]) == set(sd)
    fixed = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    fixed.load_state_dict(ck["optimizer"])
    for j, name in enumerate(new_names):
        assert torch.equal(fixed.state_dict()["state"][j]["exp_avg"], osd["state"][j]["exp_avg"]), name
    before = {k: list(v) for k, v in ck.items()}
    upgrade_checkpoint(ck, model)                                  # today's layout: unchanged
    assert {k: list(v) for k, v in ck.items()} == before
