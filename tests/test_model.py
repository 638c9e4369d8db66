import math

import pytest
import torch

import energies as E
import unfold as U
from energies.errors import ConfigError


def batch(B=6, n=14, vocab=50, seed=0, min_len=2):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, n + 1, (B,), generator=gen)
    lengths[0] = n
    mask = torch.arange(n)[None] < lengths[:, None]
    ids = torch.randint(2, vocab, (B, n), generator=gen) * mask
    return ids, mask


def scramble(model, scale, seed):
    """Arbitrary parameter values: the guarantee must not depend on them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("graph", ["complete", "window:2", "strided:3", "star", "random:0.4"])
@pytest.mark.parametrize("rho", ["exp", "relu:2", "softplus:2:0.5", "cauchy", "lp:1"])
def test_guaranteed_model_never_increases_energy_for_any_parameters(graph, rho):
    ids, mask = batch()
    total = 0
    for seed, scale in enumerate((None, 0.5, 3.0)):
        for layernorm in (False, True):
            model = U.UnfoldedTransformer(50, 3, d=12, heads=2, layers=5, rho=rho, graph=graph,
                                          layernorm=layernorm, alpha=0.5 + 0.5 * (seed % 2),
                                          curvature=("adaptive", "constant")[(seed + layernorm) % 2]).double().eval()
            if scale is not None:
                scramble(model, scale, seed)
            rep = model(ids, mask).report()
            assert rep.guaranteed == [True] * 5
            assert rep.num_increases == 0, rep.violations[:1]
            total += rep.steps
    assert total == 6 * 6 * 5


def test_trace_equals_separate_evaluation_on_stored_states():
    ids, mask = batch(seed=1)
    for graph in ("complete", "window:3"):
        model = U.UnfoldedTransformer(50, 2, d=16, heads=3, d_head=4, layers=4, graph=graph).double().eval()
        scramble(model, 0.7, 1)
        out = model(ids, mask, keep_states=True)
        graph_obj = model.token_graph(mask)
        X = model.embed_tokens(ids)
        X = torch.where(mask[..., None], X, torch.zeros((), dtype=X.dtype))
        energy = model.energy(X)
        assert len(out.states) == 5
        for t, Yt in enumerate(out.states):
            direct = energy.term_values(Yt, graph_obj)
            for k, v in direct.items():
                assert torch.allclose(out.energies[k][:, t], v, rtol=1e-8, atol=1e-8), (graph, t, k)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_padding_does_not_change_outputs_or_energy(mode):
    torch.manual_seed(0)
    graph = "complete" if mode == "baseline" else "window:2"
    model = U.UnfoldedTransformer(40, 2, d=16, heads=2, layers=3, mode=mode, graph=graph).double().eval()
    ids, mask = batch(B=4, n=12, vocab=40, seed=3)
    out = model(ids, mask)
    for b in range(4):
        L = int(mask[b].sum())
        alone = model(ids[b:b + 1, :L], mask[b:b + 1, :L])
        assert torch.allclose(alone.logits, out.logits[b:b + 1], atol=1e-10)
        for k in out.energies:
            assert torch.allclose(alone.energies[k][0], out.energies[k][b], rtol=1e-10, atol=1e-10)
    ids2 = ids.clone()
    ids2[~mask] = 7  # garbage in padded slots changes nothing
    out2 = model(ids2, mask)
    assert torch.allclose(out2.logits, out.logits, atol=1e-12)


def test_metric_attention_energy_and_update_share_coordinates():
    """Asymmetric, non-square W: the gradient the layer uses is the gradient of the energy it traces."""
    gen = torch.Generator().manual_seed(4)
    W = torch.randn(6, 3, dtype=torch.float64, generator=gen)
    for graph in (E.complete(7, 2), E.window(7, 2, 2)):
        term = E.PairwiseAttention("exp", 1.3, metric=W)
        Y = torch.randn(2, 7, 6, dtype=torch.float64, generator=gen, requires_grad=True)
        (auto,) = torch.autograd.grad(term.value(Y, graph).sum(), Y)
        grad, deg, value = term.mm_pass(Y.detach(), graph)
        assert torch.allclose(grad, auto, atol=1e-10)
        assert torch.allclose(value, term.value(Y.detach(), graph), rtol=1e-10)
        # negative control: the transposed product (the reference code's mismatch) is a different energy
        wrong = E.PairwiseAttention("exp", 1.3, metric=W @ W.T @ W)
        assert not torch.allclose(wrong.value(Y.detach(), graph), value, rtol=1e-3)


def test_constant_curvature_is_the_larger_bound_and_descends_more_slowly():
    """c_u = 2 rho'(0) deg(u) ||W||^2 + ... bounds the adaptive 2 sum_v rho'(z_uv) ||W||^2 + ... from above
    (rho' <= rho'(0)); both descend, the constant one by shorter steps."""
    ids, mask = batch(seed=8)
    finals = {}
    for curvature in ("adaptive", "constant"):
        torch.manual_seed(0)
        model = U.UnfoldedTransformer(50, 2, d=12, heads=2, layers=8, rho="relu:2", curvature=curvature).double().eval()
        scramble(model, 0.4, 8)
        g = model.token_graph(mask)
        X = g.zero_padded(model.embed_tokens(ids))
        curv = {n: t.mm(X, g)[1] for n, t in model.energy(X).terms.items() if n.startswith("head")}
        finals[curvature] = (curv, model(ids, mask).report())
    for name, c_adaptive in finals["adaptive"][0].items():
        assert bool((finals["constant"][0][name] >= c_adaptive - 1e-12).all())
        assert bool((finals["constant"][0][name] > c_adaptive + 1e-9)[mask].any())
    (_, rep_a), (_, rep_c) = finals["adaptive"], finals["constant"]
    assert rep_a.num_increases == rep_c.num_increases == 0
    assert bool((rep_c.totals[:, -1] >= rep_a.totals[:, -1] - 1e-9).all())   # shorter steps: less descent
    with pytest.raises(E.EnergyError, match="unknown curvature bound 'loose'"):
        E.PairwiseAttention("exp", 1.0, curvature="loose")


@pytest.mark.parametrize("mode", ["free", "baseline"])
@pytest.mark.parametrize("attention", ["relu", "softplus"])
def test_free_and_baseline_take_relu_and_softplus_attention(mode, attention):
    torch.manual_seed(0)
    model = U.UnfoldedTransformer(40, 2, d=16, heads=2, layers=2, mode=mode, attention=attention,
                                  attention_temperature=0.5).double().eval()
    attn = model.blocks[0].attn if mode == "free" else model.encoder.torch_encoder.layers[0].self_attn.attn
    assert attn.activation_name == attention
    ids, mask = batch(B=4, n=10, vocab=40, seed=9)
    out = model(ids, mask)
    for b in range(4):   # relu/softplus weights are divided by the real keys: padding changes nothing
        L = int(mask[b].sum())
        assert torch.allclose(model(ids[b:b + 1, :L], mask[b:b + 1, :L]).logits, out.logits[b:b + 1], atol=1e-10)
    softmax = U.UnfoldedTransformer(40, 2, d=16, heads=2, layers=2, mode=mode).double().eval()
    assert softmax.attention == "softmax"
    model.train()
    loss = model(ids, mask).logits.sum()
    loss.backward()
    assert attn.q.weight.grad is not None and torch.isfinite(attn.q.weight.grad).all()


def test_free_mode_without_norm_is_the_papers_add_only_block():
    model = U.UnfoldedTransformer(40, 2, d=8, heads=1, layers=1, mode="free", attention="relu", norm="none")
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert any(isinstance(m, torch.nn.LayerNorm) for m in U.UnfoldedTransformer(40, 2, d=8, heads=1, mode="free").modules())


def test_prox_step_negative_control_overshoot_is_caught():
    ids, mask = batch(seed=5)
    model = U.UnfoldedTransformer(50, 2, d=12, heads=2, layers=6, graph="complete", relu=False).double().eval()
    scramble(model, 0.3, 5)
    X = model.embed_tokens(ids)
    g = model.token_graph(mask)
    step = U.ProxMMStep(model.energy(X), alpha=1.0)
    _, rep = U.trace_descent(step, X, g, layers=6)
    assert rep.num_increases == 0
    step.alpha = 6.0  # bypasses the (0, 1] check on purpose: steps far past the majorizer's bound
    _, rep_bad = U.trace_descent(step, X, g, layers=6)
    assert rep_bad.num_increases > 0


def test_free_and_baseline_are_traced_but_not_guaranteed():
    ids, mask = batch(seed=6)
    for mode in ("free", "baseline"):
        model = U.UnfoldedTransformer(50, 2, d=16, heads=2, layers=3, mode=mode).double().eval()
        out = model(ids, mask)
        assert set(out.energies) == {"attention", "residual"}
        rep = out.report()
        assert rep.guaranteed == [False] * 3 and rep.steps == 18
        assert model(ids, mask, trace=False).energies is None


def test_model_bad_input_errors():
    """The library names its own parameters (no config keys: those are the application's, experiments.app.config)."""
    with pytest.raises(ConfigError, match="mode='fancy' is unknown; valid"):
        U.UnfoldedTransformer(10, 2, mode="fancy")
    with pytest.raises(ConfigError, match=r"alpha must be a number in \(0, 1\]"):
        U.UnfoldedTransformer(10, 2, alpha=1.5)
    with pytest.raises(ConfigError, match="divisible"):
        U.UnfoldedTransformer(10, 2, d=10, heads=3, mode="free")
    with pytest.raises(ConfigError, match=r"attention='relu' applies to the free and baseline.*relu:C"):
        U.UnfoldedTransformer(10, 2, attention="relu")
    with pytest.raises(ConfigError, match=r"attention='gelu' is unknown; valid: \['relu', 'softmax', 'softplus'\]"):
        U.UnfoldedTransformer(10, 2, mode="free", attention="gelu")
    with pytest.raises(ConfigError, match="norm applies to the free encoder only"):
        U.UnfoldedTransformer(10, 2, mode="baseline", norm="none")
    with pytest.raises(ConfigError, match="curvature applies to the guaranteed encoder only"):
        U.UnfoldedTransformer(10, 2, mode="free", curvature="constant")
    with pytest.raises(ConfigError, match=r"curvature='tight' is unknown; valid: \['adaptive', 'constant'\]"):
        U.UnfoldedTransformer(10, 2, curvature="tight")
    with pytest.raises(ConfigError, match="layers=5: the free encoder.s 2 layers are untied"):
        U.UnfoldedTransformer(10, 2, mode="free", layers=2)(torch.ones(1, 3, dtype=torch.long),
                                                            torch.ones(1, 3, dtype=torch.bool), layers=5)
    with pytest.raises(ConfigError, match="only graph='complete'"):
        U.UnfoldedTransformer(10, 2, mode="baseline", graph="window:2")
    model = U.UnfoldedTransformer(10, 2, d=8, validate=True)     # checks of the inputs' values: behind the switch
    ids, mask = batch(B=2, n=5, vocab=10)
    with pytest.raises(ConfigError, match="at least one real token"):
        model(ids, torch.zeros_like(mask))
    with pytest.raises(ConfigError, match="a mask of the same shape"):
        model(ids, mask[:, :3])
    model.eval()   # an integer 0/1 attention mask (Hugging Face's convention) is the bool mask
    assert torch.equal(model(ids, mask.long()).logits, model(ids, mask).logits)
    assert torch.equal(model(input_ids=ids, attention_mask=mask.int()).logits, model(ids, mask).logits)


def test_energy_trace_on_float32_training_forward_has_gradients():
    ids, mask = batch(seed=7)
    model = U.UnfoldedTransformer(50, 2, d=16, heads=2, layers=3)
    out = model(ids, mask)
    out.logits.sum().backward()
    assert model.W.grad is not None and torch.isfinite(model.W.grad).all()
    assert all(v.dtype == torch.float64 and not v.requires_grad for v in out.energies.values())
    assert out.report().tol_rule.startswith("E_t+1 > E_t + tol") and "float32" in out.report().tol_rule
    assert math.isfinite(float(out.energies["head0"].sum()))


def test_model_trace_lives_on_the_models_device(device):
    ids, mask = batch(seed=8)
    model = U.UnfoldedTransformer(50, 2, d=16, heads=2, layers=3).double().to(device).eval()
    out = model(ids.to(device), mask.to(device))
    assert all(v.device.type == device and v.dtype == torch.float64 for v in out.energies.values())
    assert out.report().num_increases == 0


def test_trace_off_gives_the_same_outputs():
    ids, mask = batch(seed=9)
    for graph in ("complete", "window:2"):
        model = U.UnfoldedTransformer(50, 2, d=16, heads=2, layers=3, graph=graph).double().eval()
        on, off = model(ids, mask, trace=True), model(ids, mask, trace=False)
        assert off.energies is None and on.energies is not None
        assert torch.equal(on.logits, off.logits)
