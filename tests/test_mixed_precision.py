"""Mixed precision training (``train.precision``) and the spectral bounds cached per weights version.

* ``train.precision: float32 | bfloat16``: a bad value is refused at the boundary; a bfloat16 run trains its forward
  under ``torch.autocast`` (checked from inside the encoder), records the precision, and its trace -- float32
  energies of the bfloat16 step's tokens -- has no NaN and no increase, while the float64 test-set check runs as
  before, without autocast.
* Under autocast the step's products are bfloat16 (the terms' gradients and degrees come back in bfloat16, and the
  layer's output moves away from the float32 layer's by far more than float32 rounding), while the traced energies are
  float64 numbers from a float32 evaluation that agree with a float64 re-evaluation of the same tokens within
  ``EVAL_TOL_FACTOR * eps(float32) * sum_k |E_k|``; the negative control: the bfloat16 step's own energies, which the
  trace recorded before, miss that tolerance.
* ``GuaranteedEncoder.spectral_bounds`` (||W_h||_2^2, lambda_max(S)): the same tensors while the weights are
  unchanged (every layer and every forward), fresh values after an optimiser step or ``load_state_dict``; a forward on
  ``meta`` still runs (no host read), and so does one of a model built under ``torch.inference_mode``.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from clifuzz import expect_refusal, run_cli
from energies.errors import EnergyError
from energies.terms import FeedForward, PairwiseAttention, autocast_dtype, finite_f64, full_precision
from experiments.app.config import choices, load_config
from test_train import CONFIGS, synthetic_text_dir
from unfold import encoders
from unfold.encoders import GuaranteedEncoder, trace_dtype
from unfold.prox import ProxMMStep

TINY = os.path.join(CONFIGS, "tiny.yaml")
TRAIN = "experiments.app.train"
F32_EPS = torch.finfo(torch.float32).eps
#: the rule of the traced energies' accuracy: |E_trace(Y_t) - E_float64(Y_t)| <= EVAL_TOL_FACTOR * eps(float32) *
#: sum_k |E_k(Y_t)| per example and layer boundary -- an eighth of the verdict's own budget (64 eps(float32) *
#: sum_k |E_k|, unfold.trace), so that the evaluation's rounding can never decide a verdict. Measured: under 0.4.
EVAL_TOL_FACTOR = 8.0


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return synthetic_text_dir(tmp_path_factory.mktemp("data") / "toy", n_train=160, n_eval=40)


# ---------------------------------------------------------------------------------------------- the config key
def test_the_key_defaults_to_float32_and_takes_bfloat16():
    assert load_config(TINY)["train"]["precision"] == "float32"
    assert load_config(TINY, ["train.precision=bfloat16"])["train"]["precision"] == "bfloat16"
    assert choices(("train", "precision")) == ("float32", "bfloat16")


@pytest.mark.parametrize("value", ["float16", "bf16", "float64", "null", "3"])
def test_a_bad_precision_is_refused_before_anything_is_written(tmp_path, toy, value):
    line = expect_refusal(TRAIN, ["--config", TINY, "--run-dir", "run", f"data.dataset={toy}", "data.glove=none",
                                  f"train.precision={value}"], str(tmp_path), names=["train.precision"], watch=[toy])
    assert value in line


# ---------------------------------------------------------------------------------------------- a training run
def test_a_bfloat16_run_trains_under_autocast_and_its_trace_descends(tmp_path, toy, monkeypatch):
    """The training forward runs under autocast(bfloat16) (seen from inside the encoder); validation, test and the
    float64 check do not; the run records its precision, and every traced step of training and of the float64 check
    is finite and descends."""
    seen = []
    run = GuaranteedEncoder.run

    def spy(self, X, *args, **kw):
        seen.append((autocast_dtype(X.device), X.dtype, torch.is_grad_enabled()))
        return run(self, X, *args, **kw)

    monkeypatch.setattr(GuaranteedEncoder, "run", spy)
    code, out, err = run_cli(TRAIN, ["--config", TINY, "--run-dir", "run", f"data.dataset={toy}", "data.glove=none",
                                     "train.epochs=2", "train.progress=false", "train.batch_size=32",
                                     "train.precision=bfloat16"], str(tmp_path))
    assert code == 0, err[-3000:]
    training = [s for s in seen if s[2]]                       # forwards with autograd on: the training passes
    assert training and all(s[0] == torch.bfloat16 and s[1] == torch.float32 for s in training), set(seen)
    assert all(s[0] is None for s in seen if not s[2])         # evaluation and the check: no autocast
    assert any(s[1] == torch.float64 for s in seen)            # the float64 test-set check ran (as before)
    run_dir = tmp_path / "run"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["train_precision"] == "bfloat16" and metrics["train_energy_dtype"] == "float32"
    assert load_config(str(run_dir / "config.yaml"))["train"]["precision"] == "bfloat16"
    assert metrics["train_energy_steps"] > 0 and metrics["train_energy_increases"] == 0
    assert metrics["descent_monitor"]["flagged"] == 0
    assert metrics["energy_steps"] == 40 * 2 and metrics["energy_increases"] == 0 and metrics["energy_nonfinite"] == 0
    assert "eps(float64)" in metrics["energy_tol_rule"]
    trace = torch.load(run_dir / "energy_trace.pt", weights_only=True)
    assert trace["dtype"] == "float64"
    assert all(v.dtype == torch.float64 and bool(torch.isfinite(v).all()) for v in trace["energies"].values())


# ---------------------------------------------------------------------------------------------- the step and the trace
def _encoder(d=16, n=12, layers=3, seed=0):
    torch.manual_seed(seed)
    enc = GuaranteedEncoder(d=d, heads=2, layers=layers).eval()
    X = torch.randn(3, n, d)
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, n // 2:] = False
    return enc, X, mask


def test_under_autocast_the_step_runs_in_bfloat16():
    enc, X, mask = _encoder()
    graph = enc.token_graph(mask)
    X = graph.zero_padded(X)
    energy = enc.energy(X)
    heads = [energy.terms["head0"], energy.terms["head1"]]
    with bf16():
        parts = PairwiseAttention.joint_mm(heads, X, graph) or [h.mm(X, graph) for h in heads]
        one = heads[0]._pass(X, graph)
        ffn = energy.terms["ffn"].mm(X, graph)
        Y_low = ProxMMStep(energy).update(X, graph)
    assert one.agg.dtype == torch.bfloat16 and one.deg.dtype == torch.bfloat16     # the kernel's pass: bfloat16
    assert all(p.grad.dtype == torch.bfloat16 for p in parts)
    assert all(p.curvature.dtype == torch.float32 for p in parts)   # the bound formed in float32 (never rounded down)
    assert isinstance(energy.terms["ffn"], FeedForward) and ffn.grad.dtype == torch.bfloat16
    assert energy.terms["ffn"].W.dtype == torch.float32           # S, part of the energy, not rounded by autocast
    # the layer's output: float32 tokens (the residual stream), moved by bfloat16 products
    Y32 = ProxMMStep(energy).update(X, graph)
    assert Y_low.dtype == torch.float32
    moved = float((Y_low - Y32).detach().abs().max() / Y32.detach().abs().max())
    assert 100 * F32_EPS < moved < 0.1, moved                    # far above float32 rounding: bfloat16 ran


@pytest.mark.parametrize("d,n", [(16, 12), (64, 48)])
def test_traced_energies_are_float32_evaluations_of_the_bf16_tokens(d, n):
    enc, X, mask = _encoder(d, n)
    with bf16():
        out = enc(X, mask, trace=True, keep_states=True)
    assert out.Y.dtype == torch.float32 and trace_dtype(out.Y.dtype) == torch.float32
    assert all(v.dtype == torch.float64 for v in out.energies.values())
    graph = enc.token_graph(mask)
    energy = enc.energy(graph.zero_padded(X))                     # the same energy, outside autocast
    pass_err = []
    for t, Y in enumerate(out.states):
        ref = energy.term_values(Y.double(), graph)               # explicit differences, float64
        scale = sum(v.abs() for v in ref.values())
        traced = sum(out.energies[k][:, t] for k in ref)
        err = (traced - sum(ref.values())).abs()
        assert bool((err <= EVAL_TOL_FACTOR * F32_EPS * scale).all()), (t, (err / (F32_EPS * scale)).tolist())
        if t < len(out.states) - 1:       # negative control: the bfloat16 step's own values at the same tokens
            with bf16():
                _, vals, _ = ProxMMStep(energy).step_with_trace(Y, graph, values=True)
            pass_err.append((sum(vals.values()) - sum(ref.values())).abs() / (F32_EPS * scale))
    assert all(bool((e > EVAL_TOL_FACTOR).all()) for e in pass_err), [e.tolist() for e in pass_err]
    rep = out.report()
    assert rep.num_increases == 0 and "eps(float32)" in rep.tol_rule


def test_the_verdict_of_half_tokens_uses_float32s_tolerance():
    """bfloat16 tokens (a model cast to bfloat16): evaluated and judged in float32 (trace_dtype); with bfloat16's
    eps the rule would read 64 * 2^-7 = half the energy, which accepts almost any rise."""
    assert trace_dtype(torch.bfloat16) == torch.float32 and trace_dtype(torch.float16) == torch.float32
    assert trace_dtype(torch.float64) == torch.float64
    enc, X, mask = _encoder()
    out = enc(X.bfloat16().float(), mask, trace=True)
    assert "eps(float32)" in out.report().tol_rule


def test_autocast_helpers():
    assert autocast_dtype("cpu") is None and autocast_dtype("meta") is None
    with bf16():
        assert autocast_dtype(torch.device("cpu")) == torch.bfloat16
        with full_precision("cpu"):
            assert autocast_dtype("cpu") is None
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_the_precision_is_passed_to_the_kernel_passes_not_read_by_them():
    """A term's kernel passes run in the precision passed to it, whatever autocast says: bfloat16 outside autocast
    when asked, the tokens' float32 under autocast with None, the same numbers inside and outside autocast."""
    enc, X, mask = _encoder()
    graph = enc.token_graph(mask)
    X = graph.zero_padded(X)
    low = enc.energy(X, precision=torch.bfloat16).terms["head0"]
    full = enc.energy(X, precision=None).terms["head0"]
    outside = low._pass(X, graph)
    assert outside.agg.dtype == torch.bfloat16 and full._pass(X, graph).agg.dtype == torch.float32
    with bf16():
        assert full._pass(X, graph).agg.dtype == torch.float32          # autocast on, not read: float32
        inside = low._pass(X, graph)
        default = enc.energy(X).terms["head0"]._pass(X, graph)           # AUTOCAST: the term reads it itself
    assert torch.equal(inside.agg, outside.agg) and torch.equal(inside.deg, outside.deg)
    assert torch.equal(default.agg, outside.agg)
    with pytest.raises(EnergyError, match="precision"):
        PairwiseAttention(precision="fp8")
    with pytest.raises(EnergyError, match="precision"):
        PairwiseAttention(precision=torch.int8)


@pytest.mark.parametrize("trace", [False, True])
def test_the_encoder_reads_autocast_once_and_passes_it(monkeypatch, trace):
    """Under autocast the forward reads autocast's dtype once and hands it to the step's terms: no term of the
    forward reads it (its precision is bfloat16 for the step, None for the trace), and the output equals the one of
    the explicit bfloat16 step."""
    enc, X, mask = _encoder()
    reads, seen = [], []
    real_read, real_pass = encoders.autocast_dtype, PairwiseAttention.pass_precision
    monkeypatch.setattr(encoders, "autocast_dtype", lambda device: reads.append(device) or real_read(device))
    monkeypatch.setattr(PairwiseAttention, "pass_precision", lambda self, Y: seen.append(self.precision) or
                        real_pass(self, Y))
    with bf16():
        out = enc(X, mask, trace=trace)
    assert len(reads) == 1 and torch.bfloat16 in seen and "autocast" not in seen, (reads, set(map(str, seen)))
    assert set(seen) == ({torch.bfloat16, None} if trace else {torch.bfloat16})
    graph = enc.token_graph(mask)
    Xp = graph.zero_padded(X)
    step = ProxMMStep(enc.energy(Xp, precision=torch.bfloat16))
    Y = enc.nonneg.prox(Xp, graph)
    with bf16():                                  # the products with S are autocast's; the kernels' are passed
        for _ in range(enc.layers):
            Y = step.update(Y, graph)
    assert torch.equal(out.Y, Y)


def test_float64_tokens_under_autocast_stay_float64():
    """autocast leaves float64 alone; so does the kernels' entry (a float64 check run inside an autocast region)."""
    enc, X, mask = _encoder()
    enc = enc.double()
    ref = enc(X.double(), mask, trace=True)
    with bf16():
        out = enc(X.double(), mask, trace=True)
    assert out.Y.dtype == torch.float64 and torch.equal(out.Y, ref.Y)
    assert all(torch.equal(out.energies[k], ref.energies[k]) for k in ref.energies)


# ---------------------------------------------------------------------------------------------- spectral bounds cache
def _fresh(enc):
    n2 = torch.linalg.matrix_norm(finite_f64(enc.W), ord=2) ** 2
    lam = torch.linalg.eigvalsh(finite_f64(enc.ffn_weight())).max().clamp_min(0.0)
    return n2, lam


def test_spectral_bounds_are_computed_once_per_weights_version():
    enc, X, mask = _encoder()
    enc.train()
    first = enc.spectral_bounds()
    assert all(a is b for a, b in zip(first, enc.spectral_bounds()))          # reused: the very same tensors
    calls = []
    real = torch.linalg.eigvalsh

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    torch.linalg.eigvalsh = counting
    try:
        enc(X, mask, trace=True)
        enc(X, mask)
        assert calls == []                    # two forwards of three layers each at the same weights: no eigvalsh
        opt = torch.optim.SGD(enc.parameters(), lr=0.5)
        enc(X, mask).Y.square().sum().backward()
        opt.step()
        after = enc.spectral_bounds()
        assert len(calls) == 1                # the step moved A's version: computed again, once
    finally:
        torch.linalg.eigvalsh = real
    fresh = _fresh(enc)
    assert torch.equal(after[0], fresh[0]) and torch.equal(after[1], fresh[1])
    assert not torch.equal(after[0], first[0]) and not torch.equal(after[1], first[1])   # it did change


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_foreach", "adamw_fused", "sgd_momentum"])
def test_every_optimizer_step_invalidates_the_bounds(optimizer):
    enc, X, mask = _encoder()
    params = list(enc.parameters())
    opt = {"adamw": lambda: torch.optim.AdamW(params, lr=0.05, foreach=False),
           "adamw_foreach": lambda: torch.optim.AdamW(params, lr=0.05, foreach=True),
           "adamw_fused": lambda: torch.optim.AdamW(params, lr=0.05, fused=True),
           "sgd_momentum": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9)}[optimizer]()
    for _ in range(3):
        out = enc(X, mask, trace=True)
        out.Y.square().sum().backward()
        opt.step()
        opt.zero_grad()
        got, fresh = enc.spectral_bounds(), _fresh(enc)
        assert torch.equal(got[0], fresh[0]) and torch.equal(got[1], fresh[1])


def test_load_state_dict_and_conversions_invalidate_the_bounds():
    enc, X, mask = _encoder()
    other, _, _ = _encoder(seed=1)
    enc.spectral_bounds()
    enc.load_state_dict(other.state_dict())
    assert torch.equal(enc.spectral_bounds()[0], _fresh(other)[0])
    enc64 = enc.double()                                          # .to() swaps the parameters' data
    got = enc64.spectral_bounds()
    assert torch.equal(got[0], _fresh(enc64)[0]) and torch.equal(got[1], _fresh(enc64)[1])


def test_the_bounds_keep_no_graph_and_training_still_backpropagates():
    """The bounds are detached constants of the step (as they always were): a cached one holds no autograd graph, so
    a second training step's backward does not meet a freed graph; W and A get their gradients through the step."""
    enc, X, mask = _encoder()
    enc.train()
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-3)
    for _ in range(2):
        for _ in range(2):                # two forwards at the same weights, the second from the cache
            out = enc(X, mask, trace=True)
            out.Y.square().sum().backward()
        assert all(b.grad_fn is None and not b.requires_grad for b in enc.spectral_bounds())
        assert enc.W.grad is not None and enc.A.grad is not None and bool(enc.A.grad.abs().sum() > 0)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("trace", [False, True])
def test_a_forward_on_meta_still_runs(trace):
    with torch.device("meta"):
        enc = GuaranteedEncoder(d=8, heads=2, layers=2)
        X = torch.randn(2, 5, 8)
        mask = torch.ones(2, 5, dtype=torch.bool)
        for _ in range(2):                                        # the second from the cache
            out = enc(X, mask, trace=trace)
            assert out.Y.device.type == "meta" and out.Y.shape == (2, 5, 8)
        n2, lam = enc.spectral_bounds()
        assert n2.device.type == "meta" and n2.shape == (2,) and lam.shape == ()
        if not trace:
            out.Y.sum().backward()


def test_inference_mode_weights_are_not_cached_but_work():
    """Inference tensors have no version counter: the bounds are computed each time (never stale)."""
    with torch.inference_mode():
        enc, X, mask = _encoder()
        a, b = enc.spectral_bounds(), enc.spectral_bounds()
        assert a[0] is not b[0] and torch.equal(a[0], b[0])
        assert enc(X, mask, trace=True).report().num_increases == 0


def test_train_compile_runs_the_training_forward_compiled_and_descends(tmp_path, toy, monkeypatch):
    """``train.compile=true``: the training forward goes through ``torch.compile`` (the compiled module is called
    for every training batch; evaluation and the float64 check run the model itself), the run finishes and its
    trace descends; a value that is not a bool is refused naming the key."""
    calls = []
    real = torch.compile

    def counting(module, *a, **kw):
        compiled = real(module, *a, **kw)

        def call(*args, **kwargs):
            calls.append(torch.is_grad_enabled())
            return compiled(*args, **kwargs)
        return call
    monkeypatch.setattr(torch, "compile", counting)
    code, out, err = run_cli(TRAIN, ["--config", TINY, "--run-dir", "run", f"data.dataset={toy}", "data.glove=none",
                                     "train.epochs=1", "train.progress=false", "train.batch_size=64",
                                     "train.max_train_examples=64", "model.layers=1", "model.d=8",
                                     "train.compile=true"], str(tmp_path))
    assert code == 0, err[-3000:]
    assert calls and all(calls)                    # one compiled call per training batch, autograd on
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["energy_increases"] == 0 and metrics["train_energy_increases"] == 0
    expect_refusal(TRAIN, ["--config", TINY, "--run-dir", "r2", f"data.dataset={toy}", "train.compile=maybe"],
                   str(tmp_path), names=["train.compile"], watch=[toy])
