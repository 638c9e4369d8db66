"""UnfoldedAttentionConv: the PyG MessagePassing form of the attention MM step."""
import math

import pytest
import torch
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import erdos_renyi_graph

import energies as E
import unfold as U
from energies.errors import GraphError, StepError, TokenError
from unfold.prox import ProxMMStep
from unfold.pyg import UnfoldedAttentionConv
from matrix import rho_specs

RHOS = rho_specs("families")  # drawn from the registry (tests/matrix.py)


def graph_case(N=40, d=6, p=0.15, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ei = erdos_renyi_graph(N, p)                     # PyG's generator, both orientations
    x = torch.randn(N, d, dtype=torch.float64, generator=gen)
    x0 = torch.randn(N, d, dtype=torch.float64, generator=gen)
    return x.to(device), ei.to(device), x0.to(device)


def total(vals):
    return sum(v for v in vals.values())


@pytest.mark.parametrize("rho", RHOS)
def test_exact_form_is_the_attention_step_on_the_same_graph(rho, device):
    x, ei, x0 = graph_case(device=device)
    conv = UnfoldedAttentionConv(6, rho=rho, tau=1.7, alpha=0.8).to(device)
    assert isinstance(conv, MessagePassing)
    out, vals = conv(x, ei, x0, return_energy=True)
    g = E.from_edge_index(ei.cpu(), 40).to(device)
    step = U.AttentionStep(rho, 1.7, 0.8, B=x0[None], kernel="edges")
    assert (out - step(x[None], g)[0]).abs().max() < 1e-12
    assert torch.allclose(total(vals), step.energy(x[None], g)[0], rtol=1e-12)
    # one orientation only, duplicates and self loops in the input: the same undirected graph
    one_way = torch.cat([ei[:, ei[0] < ei[1]], ei[:, :5], torch.tensor([[3], [3]], device=device)], 1)
    assert (conv(x, one_way, x0) - out).abs().max() < 1e-12


@pytest.mark.parametrize("relu", [False, True])
def test_metric_form_is_the_prox_mm_step_of_the_same_energy(relu, device):
    x, ei, x0 = graph_case(seed=1, device=device)
    conv = UnfoldedAttentionConv(6, heads=3, head_channels=2, alpha=0.9, relu=relu).double().to(device)
    if relu:
        x = torch.relu(x)
    out, vals = conv(x, ei, x0, return_energy=True)
    terms = [(f"head{h}", E.PairwiseAttention("exp", conv.tau, kernel="edges", metric=conv.W[h]))
             for h in range(3)] + [("residual", E.Residual(x0[None]))]
    if relu:
        terms.append(("relu", E.NonNegativity()))
    energy = E.Energy(terms)
    g = E.from_edge_index(ei.cpu(), 40).to(device)
    ref = ProxMMStep(energy, 0.9)(x[None], g)[0]
    assert (out - ref).abs().max() < 1e-12
    assert torch.allclose(total(vals), energy(x[None], g)[0], rtol=1e-12)
    # the same per-edge float64 values summed by the same kernel, in an order that may differ between its two calls
    # (CUDA's index_add adds with atomics: on an H200 the two differed in the last bits): reordering a sum of m terms
    # moves it by at most (m - 1) eps sum |terms|
    bound = ei.shape[1] * torch.finfo(torch.float64).eps * sum(float(v.detach().abs().sum()) for v in vals.values())
    assert (conv.energy(x, ei, x0) - total(vals)).abs() <= bound


@pytest.mark.parametrize("seed", range(6))
def test_never_increases_its_energy_for_random_weights(seed):
    """Any weights (scaled up to make steps aggressive), any rho, both forms: E(x_{t+1}) <= E(x_t)."""
    x, ei, x0 = graph_case(N=30, d=5, p=0.3, seed=seed)
    increases = 0
    for rho in RHOS:
        for kwargs in ({}, {"heads": 2, "head_channels": 3, "relu": True}):
            torch.manual_seed(seed)
            conv = UnfoldedAttentionConv(5, rho=rho, tau=0.5, alpha=1.0, **kwargs).double()
            if conv.W is not None:
                with torch.no_grad():
                    conv.W.mul_(3.0)
            h = torch.relu(x) if kwargs else x
            E_prev = conv.energy(h, ei, x0)
            for _ in range(8):
                h = conv(h, ei, x0)
                E_next = conv.energy(h, ei, x0)
                increases += int(E_next > E_prev + 1e-12 * abs(E_prev))
                E_prev = E_next
    assert increases == 0


def test_negative_control_a_too_long_step_is_caught():
    """The same check flags a step whose curvature bound is 20x too small."""
    x, ei, x0 = graph_case(N=30, d=5, p=0.3, seed=2)
    torch.manual_seed(0)
    conv = UnfoldedAttentionConv(5, heads=2, head_channels=3, tau=0.5).double()
    with torch.no_grad():
        conv.W.mul_(3.0)
    direction, curv = conv.mm(x, ei, x0)             # direction = -grad E / c (the metric form's preconditioner)
    assert conv.energy(x + direction, ei, x0) <= conv.energy(x, ei, x0)   # the real step descends
    bad = x + direction / 0.05
    assert conv.energy(bad, ei, x0) > conv.energy(x, ei, x0)


def test_gradients_flow_to_weights_and_inputs():
    x, ei, x0 = graph_case(seed=3)
    x = x.float().requires_grad_()
    conv = UnfoldedAttentionConv(6, heads=2, head_channels=3)
    out = conv(conv(x, ei, x0.float()), ei, x0.float())
    out.square().sum().backward()
    assert conv.W.grad is not None and conv.W.grad.abs().sum() > 0 and x.grad.abs().sum() > 0


def test_bad_input_gets_named_errors():
    x, ei, x0 = graph_case()
    conv = UnfoldedAttentionConv(6)
    with pytest.raises(GraphError, match=r"outside \[0, 40\)"):
        conv(x, torch.tensor([[0, 40], [1, 2]]))
    with pytest.raises(GraphError, match="integer node ids"):
        conv(x, ei.float())
    with pytest.raises(GraphError, match=r"\(2, E\)"):
        conv(x, ei[0])
    with pytest.raises(TokenError, match=r"\(num_nodes, 6\)"):
        conv(x[:, :5], ei)
    with pytest.raises(TokenError, match="NaN"):      # values are checked behind the switch (a host read)
        UnfoldedAttentionConv(6, validate=True)(torch.full_like(x, math.nan), ei)
    with pytest.raises(TokenError, match="x0 has shape"):
        conv(x, ei, x0[:3])
    with pytest.raises(StepError, match="relu=True needs the proximal form"):
        UnfoldedAttentionConv(6, relu=True)
    with pytest.raises(StepError, match="alpha"):
        UnfoldedAttentionConv(6, alpha=1.5)


def test_sbm_example_trains_with_the_energy_traced_at_every_layer():
    """A few shared convs on PyG's stochastic block model beat the features-only MLP, and the energy
    falls at every layer of every forward (float32)."""
    from experiments.studies.pyg_sbm import sbm_data, train

    data = sbm_data(blocks=3, size=100, sep=0.4, seed=0)
    ours = train(layers=3, epochs=40, data=data, seed=0)
    mlp = train(layers=0, epochs=40, data=data, seed=0)
    assert ours["layer_steps"] == 120 and ours["energy_increases"] == 0
    assert len(ours["energies"]) == 4 and ours["energies"][-1] < ours["energies"][0]
    assert ours["test_accuracy"] > mlp["test_accuracy"] + 0.03


def test_adjacency_of_another_size_huge_batch_ids_and_huge_weights_are_refused():
    """Adversarial review: a sparse adjacency of another size was silently read as this graph's, a batch vector
    with a huge graph id and a conv of 10^14 weights reached the allocator (its untyped RuntimeError)."""
    x = torch.randn(5, 4)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    conv = UnfoldedAttentionConv(4)
    for n in (4, 6):
        adj = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (n, n))
        for layout in (adj, adj.to_sparse_csr()):
            with pytest.raises(GraphError, match=r"must be \(5, 5\)"):
                conv(x, layout)
    adj = torch.sparse_coo_tensor(ei, torch.ones(4), (5, 5))
    assert torch.equal(conv(x, adj.to_sparse_csr()), conv(x, ei))           # the right size still reads
    with pytest.raises(GraphError, match="graph id"):
        conv(x, torch.tensor([[0], [1]]), batch=torch.tensor([0, 0, 1, 1, 10 ** 12]))
    with pytest.raises(StepError, match="float32 weights"):
        UnfoldedAttentionConv(10 ** 7, head_channels=10 ** 7)


def test_meta_and_mixed_device_inputs_are_refused_by_name():
    """Adversarial review: x0 or edge_index on the meta device and weights on another device than x reached torch
    (RuntimeError 'Tensor.item() cannot be called on meta tensors', NotImplementedError 'Cannot copy out of meta
    tensor'). Device checks read metadata only: no host sync. x on meta with the ids on the host still infers the
    shapes."""
    x = torch.randn(5, 4)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    conv = UnfoldedAttentionConv(4, heads=2, head_channels=2)
    assert conv(x.to("meta"), ei).shape == (5, 4)
    with pytest.raises(TokenError, match="x0 is on meta"):
        conv(x, ei, x.to("meta"))
    with pytest.raises(GraphError, match="meta device"):
        conv(x, ei.to("meta"))
    with pytest.raises(TokenError, match="weights on meta"):
        UnfoldedAttentionConv(4, heads=2, head_channels=2).to("meta")(x, ei)
    assert conv(x, ei, x).shape == x.shape                 # the positive control
