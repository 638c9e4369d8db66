import numpy as np
import pytest
import torch

import energies as E
from energies.errors import GraphError, TokenError


def edge_set(g, b=0):
    src, dst = g.edges()
    n = g.num_nodes
    sel = src // n == b
    return {(int(u) % n, int(v) % n) for u, v in zip(src[sel], dst[sel])}


def test_complete_is_all_pairs_once():
    g = E.complete(7, batch_size=2)
    assert edge_set(g, 0) == {(u, v) for u in range(7) for v in range(u + 1, 7)}
    assert g.num_edges().tolist() == [21, 21]
    assert g.degree().tolist() == [[6] * 7] * 2


def test_window_strided_dilated_star_structure():
    n = 10
    assert edge_set(E.window(n, 2)) == {(i, j) for i in range(n) for j in range(i + 1, n) if j - i <= 2}
    assert edge_set(E.strided(n, 3)) == {(i, j) for i in range(n) for j in range(i + 1, n)
                                         if j - i < 3 or (j - i) % 3 == 0}
    assert edge_set(E.dilated(n, 2, 2)) == {(i, j) for i in range(n) for j in range(i + 1, n) if j - i in (2, 4)}
    star = edge_set(E.star(n))
    relay = {(0, j) for j in range(1, n)}
    ring = {tuple(sorted((j, j + 1))) for j in range(1, n - 1)} | {(1, n - 1)}
    assert star == relay | ring
    assert E.star(n).degree()[0, 0].item() == n - 1


def test_random_graph_density_and_seed():
    g1 = E.random(60, 0.2, batch_size=3, seed=4)
    g2 = E.random(60, 0.2, batch_size=3, seed=4)
    assert torch.equal(g1.edges(), g2.edges())
    frac = g1.num_edges().float() / (60 * 59 / 2)
    assert ((frac > 0.15) & (frac < 0.25)).all()
    assert edge_set(g1, 0) != edge_set(g1, 1)  # one graph per example


def test_orientation_does_not_matter():
    once = torch.tensor([[0, 2, 3], [1, 1, 0]])           # mixed orientations, each edge once
    both = torch.tensor([[0, 1, 1, 2, 3, 0], [1, 0, 2, 1, 0, 3]])  # PyG convention
    g1, g2 = E.from_edge_index(once, 4), E.from_edge_index(both, 4)
    assert torch.equal(g1.edges(), g2.edges())
    assert g1.edges().shape[1] == 3
    Y = torch.randn(1, 4, 3, dtype=torch.float64)
    en = E.attention_energy()
    assert torch.equal(en.value(Y, g1), en.value(Y, g2))


@pytest.mark.parametrize("edges, msg", [
    ([[0, 5], [1, 2]], "out of range"),
    ([[0, -1], [1, 2]], "out of range"),
    ([[0, 2], [0, 1]], "self loop"),
    ([[0, 0], [1, 1]], "repeated in the same orientation"),
])
def test_bad_edges_are_named(edges, msg):
    with pytest.raises(GraphError, match=msg):
        E.from_edge_index(torch.tensor(edges), 4)


def test_bad_edge_dtype_shape_and_cross_example():
    with pytest.raises(GraphError, match="integers"):
        E.from_edge_index(torch.tensor([[0.0], [1.0]]), 4)
    with pytest.raises(GraphError, match=r"shape \(2, m\)"):
        E.from_edge_index(torch.tensor([[0, 1, 2]]), 4)
    with pytest.raises(GraphError, match="joins examples"):
        E.from_edge_index(torch.tensor([[0], [5]]), 4, batch_size=2, shared=False)


def test_padding_removes_edges_and_tokens():
    mask = E.mask_from_lengths([5, 3], 5)
    g = E.window(5, 1, batch_size=2, mask=mask)
    assert edge_set(g, 1) == {(0, 1), (1, 2)}
    gc = E.complete(5, batch_size=2, mask=mask)
    assert gc.num_edges().tolist() == [10, 3]
    assert E.star(5, batch_size=2, mask=mask).num_edges().tolist() == [8, 3]
    # padded slots may hold anything, even NaN: energies ignore them
    Y = torch.randn(2, 5, 3, dtype=torch.float64)
    Y2 = Y.clone()
    Y2[1, 3:] = float("nan")
    en = E.attention_energy(rho="cauchy", B=torch.randn(5, 3, dtype=torch.float64))
    for graph in (g, gc):
        assert torch.allclose(en.value(Y, graph), en.value(Y2, graph), rtol=0, atol=0)


def test_token_validation():
    g = E.complete(4)
    with pytest.raises(TokenError, match="NaN at example 0, token 2"):
        Y = torch.zeros(4, 3)
        Y[2, 1] = float("nan")
        E.check_tokens(Y, g)
    with pytest.raises(TokenError, match="Inf"):
        E.check_tokens(torch.full((4, 3), float("inf")), g)
    with pytest.raises(TokenError, match="floating dtype"):
        E.check_tokens(torch.zeros(4, 3, dtype=torch.long), g)
    with pytest.raises(TokenError, match="shape"):
        E.check_tokens(torch.zeros(5, 3), g)
    with pytest.raises(TokenError, match="shape"):
        E.check_tokens(torch.zeros(2, 2, 4, 3), g)


def test_specs_and_npy(tmp_path):
    assert E.graph_from_spec("window:3", 8).name == "window:3"
    assert E.graph_from_spec("random:0.5", 8, seed=1).name == "random:0.5"
    with pytest.raises(GraphError, match="unknown graph 'ring'"):
        E.graph_from_spec("ring", 8)
    with pytest.raises(GraphError, match="window radius k must be an integer"):
        E.graph_from_spec("window:x", 8)
    path = tmp_path / "edges.npy"
    np.save(path, np.array([[0, 1], [1, 2]]))
    assert edge_set(E.graph_from_spec(str(path), 3)) == {(0, 1), (1, 2)}
    np.save(path, np.array([[0, 1], [1, 9]]))
    with pytest.raises(GraphError, match="out of range"):
        E.graph_from_spec(str(path), 3)
    with pytest.raises(GraphError, match="does not exist"):
        E.graph_from_spec(str(tmp_path / "missing.npy"), 3)


def test_from_pyg_batch():
    from torch_geometric.data import Batch, Data

    d1 = Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]))
    d2 = Data(x=torch.randn(2, 2), edge_index=torch.tensor([[0], [1]]))
    g, Y = E.from_pyg(Batch.from_data_list([d1, d2]))
    assert (g.batch_size, g.num_nodes) == (2, 3)
    assert g.mask.tolist() == [[True, True, True], [True, True, False]]
    assert edge_set(g, 0) == {(0, 1), (1, 2)} and edge_set(g, 1) == {(0, 1)}
    assert torch.equal(Y[1, :2], d2.x) and torch.equal(Y[1, 2], torch.zeros(2))


def test_dense_pair_mask_matches_edges():
    g = E.random(9, 0.4, batch_size=2, seed=3, mask=E.mask_from_lengths([9, 6], 9))
    A = g.pair_mask()
    assert torch.equal(A, A.transpose(1, 2))
    assert int(A.sum()) == 2 * int(g.num_edges().sum())
    assert torch.equal(g.to_sparse().pair_mask(), A)
    assert torch.equal(E.complete(5).pair_mask(), E.complete(5).to_sparse().pair_mask())


def test_pattern_builders_scale_with_edges_not_n_squared():
    """n = 200,000 would need 10^11 candidate pairs (hundreds of GB) if built from all pairs."""
    n = 200_000
    assert int(E.window(n, 2).num_edges()[0]) == 2 * n - 3
    assert int(E.dilated(n, 3, 2).num_edges()[0]) == (n - 3) + (n - 6)
    assert int(E.strided(1000, 100).num_edges()[0]) == sum(1000 - o for o in list(range(1, 100)) + list(range(100, 1000, 100)))


@pytest.mark.parametrize("spec,per_token", [("window:8", 8), ("strided:16", 15 + 2048 // 16), ("dilated:4:8", 8),
                                            ("star", 2), ("random:0.002", None)])
def test_builders_scale_to_long_padded_sequences(spec, per_token):
    """Every builder at n = 2,048 (ListOps-LRA lengths) with ragged padding: it builds, its edge list is linear in
    the pattern's edges (at most ``per_token`` undirected edges per token slot, never n^2 / 2), and no edge
    touches a padded slot once weighed by the mask (the edges the kernels see carry weight 0 there)."""
    n, B = 2048, 2
    mask = E.mask_from_lengths(torch.tensor([n, 1500]), n)
    g = E.graph_from_spec(spec, n, B, mask=mask)
    src, dst, valid = g.fixed_edges()
    bound = (per_token * n if per_token is not None else 0.002 * n * n) * B
    assert src.numel() <= 1.5 * bound < B * n * (n - 1) / 2, (spec, src.numel(), bound)
    live = valid if valid is not None else torch.ones_like(src, dtype=torch.bool)
    assert bool(mask.reshape(-1)[src[live]].all()) and bool(mask.reshape(-1)[dst[live]].all())
    assert int(g.num_edges()[1]) < int(g.num_edges()[0])            # the padded example has fewer real edges
