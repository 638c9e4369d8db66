"""Hostile calls to the library's entry points, and a table-driven fuzz.

Every bad input is refused with the framework's typed error naming the argument and the value -- never a raw
torch error, never a verdict computed from nothing (an example with no real token, a probe ray that overflowed or
did not move), never a check that rejects a config the real build accepts.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

import unfold as U
from energies import from_edge_index
from energies.errors import ConfigError, GraphError, StepError, TokenError, UnfoldError
from energies.graphs import graph_from_spec, window
from tests.clifuzz import expect_refusal, run_cli
from unfold.trace import EnergyTrace, report_from_values, trace_descent
from matrix import rho_specs

VOCAB = 10


def _model(mode="guaranteed", graph="window:2", **kw):
    torch.manual_seed(0)
    return U.UnfoldedTransformer(VOCAB, 2, d=8, heads=2, layers=2, mode=mode, graph=graph, **kw)


def _ids(B=2, n=5):
    return torch.randint(1, VOCAB, (B, n), generator=torch.Generator().manual_seed(1))


def _values(S=2, T1=3, dtype=torch.float64, device="cpu"):
    return {"a": torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64).repeat(S, 1)[:, :T1].to(dtype).to(device)}


# --------------------------------------------------------------------- (17) ids, devices, empty examples, verdicts

@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.uint16, torch.uint32,
                                   torch.uint64])
def test_valid_ids_of_every_integer_dtype_give_the_int64_logits(dtype):
    """Valid uint8/int8/int16/uint16/uint32/uint64 ids give the very logits of int64 ids (no RuntimeError from
    nn.Embedding, no NotImplementedError from the range check on uint64)."""
    model = _model().eval()
    ids, mask = _ids(), torch.ones(2, 5, dtype=torch.bool)
    ref = model(ids, mask).logits
    assert torch.equal(model(ids.to(dtype), mask).logits, ref)


@pytest.mark.parametrize("dtype,bad", [(torch.uint64, 2 ** 64 - 1), (torch.uint64, 2 ** 63), (torch.uint32, 2 ** 32 - 1),
                                       (torch.uint16, 2 ** 16 - 1), (torch.int8, -128), (torch.int64, -(2 ** 63))])
def test_an_out_of_vocabulary_id_is_named_by_its_true_value(dtype, bad):
    model = _model()
    ids = _ids()
    if dtype == torch.uint64:
        ids = ids.view(torch.uint64).clone()
        ids.view(torch.int64)[1, 2] = bad - 2 ** 64 if bad >= 2 ** 63 else bad
    else:
        ids = ids.to(dtype)
        ids[1, 2] = bad
    with pytest.raises(TokenError, match=rf"ids must lie in \[0, {VOCAB}\).*got {bad} at \(1, 2\)"):
        model(ids)


def test_meta_ids_into_a_cpu_embedding_are_named_not_read_as_garbage():
    """TokenEmbedding(meta ids) on a CPU table is refused naming both devices, never numbers read from nowhere;
    with the table on meta too it is a meta forward."""
    emb = U.TokenEmbedding(VOCAB, 8)
    with pytest.raises(TokenError, match="ids are on meta, the model on cpu"):
        emb(_ids().to("meta"))
    with torch.device("meta"):                            # the negative control: all on meta is a meta forward
        meta_emb = U.TokenEmbedding(VOCAB, 8)
        assert meta_emb(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, 8)


@pytest.mark.parametrize("mode", ["guaranteed", "free", "baseline"])
def test_an_example_with_no_real_token_is_a_token_error_on_the_cpu_and_fails_the_verdict_elsewhere(mode, monkeypatch):
    """An all-False mask row is a TokenError (a ConfigError) naming the example; where values are not read, the
    trace fails that example and the verdict is not "descent"; one real token suffices."""
    from unfold import classifier as C, inputs as I

    model = _model(mode, graph="complete" if mode == "baseline" else "window:2")
    ids, mask = _ids(3), torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    with pytest.raises(TokenError, match=r"mask: every example needs at least one real token.*\[1\]") as info:
        model(ids, mask)
    assert isinstance(info.value, ConfigError)            # callers that caught ConfigError keep working
    # where values are not read (an accelerator without validate=True), the trace fails the empty example
    monkeypatch.setattr(I, "host_checks", lambda t, validate=False: False)
    monkeypatch.setattr(C, "host_checks", lambda t, validate=False: False)
    rep = model(ids, mask, trace=True).report()
    assert rep.verdict != "descent" and bool(rep.nonfinite[1].all()) and not bool(rep.nonfinite[[0, 2]].any())
    mask[1, 3] = True                                     # the negative control: one real token suffices
    assert model(ids, mask, trace=True).report().num_nonfinite == 0


def test_trace_descent_refuses_an_example_with_no_real_token():
    """trace_descent refuses an example of padding only (energy 0 at every layer) naming it; one real token gives
    "descent"."""
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0] = False
    graph = window(6, 2, batch_size=2, mask=mask)
    step = U.AttentionStep(rho="cauchy", tau=2.0, alpha=1.0)
    Y = torch.randn(2, 6, 4, dtype=torch.float64)
    with pytest.raises(TokenError, match=r"graph.mask: example\(s\) \[0\] have no real token"):
        trace_descent(step, Y, graph, layers=3)
    mask[0, 2] = True                                     # negative control
    assert trace_descent(step, Y, window(6, 2, batch_size=2, mask=mask), layers=3)[1].verdict == "descent"


def test_an_energy_trace_of_an_empty_example_fails_every_step():
    vals = [{"a": torch.tensor([1.0, 2.0], dtype=torch.float64)} for _ in range(3)]
    res = [torch.zeros(2, dtype=torch.float64) for _ in range(3)]
    mask = torch.tensor([[True, False], [False, False]])
    rep = report_from_values(EnergyTrace.from_layers(vals, res, mask=mask), torch.float64)
    assert rep.verdict == "nonfinite" and rep.increases.tolist() == [[False, False], [True, True]]


@pytest.mark.parametrize("what", ["empty", "meta", "mixed"])
def test_report_from_values_refuses_a_verdict_over_nothing(what):
    """S = 0 examples, meta values or a mix with meta are a StepError, never "descent" over 0 steps nor torch's
    RuntimeError; real values give "descent"."""
    values = {"empty": lambda: _values(S=0), "meta": lambda: _values(device="meta"),
              "mixed": lambda: {**_values(), "b": _values(device="meta")["a"]}}[what]()
    with pytest.raises(StepError, match="no example|meta"):
        report_from_values(values, torch.float64)
    assert report_from_values(_values(), torch.float64).verdict == "descent"      # negative control


def test_an_encoder_validates_on_meta_without_reading_values():
    """validate=True on the meta device runs a traced forward without a bool() of a meta tensor."""
    with torch.device("meta"):
        enc = U.GuaranteedEncoder(8, heads=2, layers=2, graph="window:2", validate=True)
        out = enc(torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.long), trace=True)
    assert out.Y.device.type == "meta"


@pytest.mark.parametrize("graph,kernel", [("star", "auto"), ("star", "dense"), ("complete", "edges")])
def test_a_meta_forward_runs_with_mask_dependent_graphs_and_the_edge_kernel(graph, kernel, monkeypatch):
    """A meta forward and backward with a mask-dependent graph or the edge kernel run (no nonzero on meta, no
    'Cannot copy out of meta tensor'); on the CPU the same encoder gives "descent"."""
    from energies import kernels as P
    from energies.kernels import triton as TK
    monkeypatch.setitem(TK._TRITON, "meta", "disabled for this test")
    with torch.device("meta"):
        enc = U.GuaranteedEncoder(8, heads=2, layers=2, graph=graph, kernel=kernel)
        X = torch.randn(2, 5, 8)
        out = enc(X, torch.ones(2, 5, dtype=torch.bool), trace=True)
        enc(X, torch.ones(2, 5, dtype=torch.bool)).Y.sum().backward()
    assert out.Y.shape == (2, 5, 8)
    cpu = U.GuaranteedEncoder(8, heads=2, layers=2, graph=graph, kernel=kernel)   # negative control: CPU values
    assert cpu(torch.rand(2, 5, 8), trace=True).report().verdict == "descent"


def test_the_edge_kernel_on_the_complete_graph_agrees_with_dense_under_padding():
    torch.manual_seed(0)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[0, 4:] = False
    X = torch.rand(2, 6, 8, dtype=torch.float64)
    outs = []
    for kernel in ("edges", "dense"):
        torch.manual_seed(1)
        enc = U.GuaranteedEncoder(8, heads=2, layers=2, rho="cauchy", kernel=kernel).double()
        outs.append(enc(X, mask, trace=True))
    assert torch.allclose(outs[0].Y, outs[1].Y, atol=1e-12)
    assert torch.allclose(outs[0].energies["head0"], outs[1].energies["head0"], rtol=1e-12)


# --------------------------------------------------------------------- (15b) edge ids by their true value

INT_DTYPES = [(torch.uint8, 255), (torch.uint16, 2 ** 16 - 1), (torch.uint32, 2 ** 32 - 1), (torch.uint64, 2 ** 64 - 1),
              (torch.uint64, 2 ** 63), (torch.int8, 127), (torch.int8, -128), (torch.int16, -1), (torch.int32, 2 ** 31 - 1),
              (torch.int64, -(2 ** 63)), (torch.int64, 2 ** 63 - 1)]


def _edges(dtype, bad):
    ei = torch.tensor([[0, 1], [1, 2]], dtype=torch.int64)
    if dtype == torch.uint64:
        ei[1, 1] = bad - 2 ** 64 if bad >= 2 ** 63 else bad
        return ei.view(torch.uint64)
    ei = ei.to(dtype)
    ei[1, 1] = bad
    return ei


@pytest.mark.parametrize("dtype,bad", INT_DTYPES, ids=[f"{d}-{b}".replace("torch.", "") for d, b in INT_DTYPES])
def test_an_edge_id_is_reported_by_its_true_value_in_every_integer_dtype(dtype, bad):
    """An out-of-range edge id is named by its true value in every integer dtype (2^64 - 1 as uint64, not -1)."""
    with pytest.raises(GraphError, match=rf"edge 1 = \(1, {bad}\) is out of range"):
        from_edge_index(_edges(dtype, bad), 3)
    assert from_edge_index(_edges(dtype, 2), 3).num_nodes == 3          # negative control


@pytest.mark.parametrize("np_dtype,bad", [(np.uint64, 2 ** 64 - 1), (np.uint64, 2 ** 63), (np.uint32, 2 ** 32 - 1),
                                          (np.int8, -1), (np.uint8, 200)])
def test_an_edge_file_id_is_reported_by_its_true_value(tmp_path, np_dtype, bad):
    """An out-of-range id in a .npy edge list is named by its true value in its own dtype (a uint64 2^64 - 1, not
    -1 after a cast to int64); an in-range file loads."""
    arr = np.array([[0, 1], [1, 2]], dtype=np_dtype)
    arr[1, 1] = bad
    np.save(tmp_path / "edges.npy", arr)
    with pytest.raises(GraphError, match=rf"edge 1 = \(1, {bad}\) is out of range"):
        graph_from_spec(str(tmp_path / "edges.npy"), 3)
    arr[1, 1] = 2
    np.save(tmp_path / "ok.npy", arr)
    assert graph_from_spec(str(tmp_path / "ok.npy"), 3).num_nodes == 3


def test_the_check_cli_names_a_uint64_edge_id_of_a_file(tmp_path):
    np.save(tmp_path / "edges.npy", np.array([[0], [2 ** 64 - 1]], dtype=np.uint64))
    expect_refusal("unfold.check", ["--graph", "edges.npy", "--n", "4", "--samples", "1", "--layers", "1"],
                   str(tmp_path), names=["18446744073709551615"])


# --------------------------------------------------------------------- (8) the spline probe

class _HidesOverflow(nn.Module):
    """ReLU attention with ``nan_to_num`` on every row: an overflow of the scores reads as weight 0."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x):
        s = self.relu(x @ x.transpose(-1, -2))
        return torch.nan_to_num(s / s.sum(-1, keepdim=True)) @ x


def test_the_probe_never_computes_a_verdict_from_an_overflow_the_module_hid():
    """A module whose output stays finite (0 far out) while a ReLU input inside it overflows gives no verdict: the
    probe refuses the sample naming t_max; a short ray gives a verdict."""
    from experiments.studies.spline_probe import NonFiniteSample, probe

    mod = _HidesOverflow().double()
    X0, D = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    f = lambda t: mod(X0 + t * D)  # noqa: E731
    assert torch.isfinite(f(1e300)).all()                  # the output hides it ...
    with pytest.raises(NonFiniteSample, match=r"a ReLU input inside the module is not finite .*t_max=1e\+300"):
        probe(f, mod, t_max=1e300, grid=33)                # ... the tape does not
    assert probe(f, mod, t_max=3.0, grid=33)["verdict"] in ("spline", "non-spline")    # negative control


def test_the_probe_refuses_a_ray_that_does_not_move():
    """A t_max too short for float64 to move the ray is refused (never one point sampled 1025 times and reported
    "spline, degree 0"); a ray of length 1 gives a degree."""
    from experiments.studies.spline_probe import probe_attention

    with pytest.raises(ConfigError, match=r"t_max=1e-15 is too short for float64"):
        probe_attention("softmax", n=3, t_max=1e-15)
    assert probe_attention("relu", n=3, t_max=1.0, grid=65)["degree"] is not None     # negative control


def test_the_cli_refuses_t_max_1e300_naming_the_overflow(tmp_path):
    line = expect_refusal("experiments.studies.spline_probe", ["--attention", "relu", "--t-max", "1e300", "--n", "3", "--json"],
                          str(tmp_path), names=["--t-max", "1e300"])
    assert "float64" in line
    code, out, _ = run_cli("experiments.studies.spline_probe", ["--attention", "relu", "--t-max", "1e100", "--n", "3", "--json"],
                           str(tmp_path))
    assert code == 0 and '"verdict": "spline", "degree": 3' in out                   # negative control


# --------------------------------------------------------------------- (10) the build check agrees with the build

def _kernels():
    from energies.kernels import kernel_names
    return kernel_names()


GRAPHS = ["complete", "window:2", "star", "random:0.5"]
RHOS = rho_specs("shapes")  # drawn from the registry (tests/matrix.py)


def _check(cfg):
    from experiments.app.build import check_buildable
    try:
        check_buildable(cfg)
    except ConfigError as exc:
        msg = str(exc)
        assert "meta" not in msg.lower(), msg
        assert re.search(r"model\.(kernel|graph|rho)", msg), msg
        return msg
    except Exception as exc:   # noqa: BLE001 -- anything else is the bug this test is about
        pytest.fail(f"check_buildable raised {type(exc).__name__}: {exc}")
    return None


@pytest.mark.parametrize("kernel", _kernels())
def test_the_build_check_accepts_what_trains_and_names_keys_for_what_it_refuses(kernel, monkeypatch):
    """Every documented model.kernel x graphs x every documented rho, on train.device=cpu: accepted configs
    train a forward/backward on a tiny CPU batch and descend; refused ones are ConfigErrors naming model.* keys,
    never 'meta', and the real build refuses them too (at build, or at its first forward on that device). So
    model.kernel=triton on the CPU is refused by the check, not at the first training step, and the check, first in
    a process, accepts model.kernel=fused wherever the op works (it never probes the fused op with meta tensors)."""
    from energies.kernels import fused_ops as F
    from experiments.app.config import load_config
    from experiments.app.build import build_model

    monkeypatch.setattr(F, "_PROBED", {})                 # as in a fresh process: the check probes first

    accepted = 0
    for gi, graph in enumerate(GRAPHS):
        for ri, rho in enumerate(RHOS):
            cfg = load_config("tiny", [f"model.kernel={kernel}", f"model.graph={graph}", f"model.rho={rho}",
                                       "model.layers=1", "model.d=8"])
            refused = _check(cfg)
            torch.manual_seed(0)
            ids, mask = torch.randint(1, 20, (2, 6)), torch.ones(2, 6, dtype=torch.bool)
            if refused is not None:
                with pytest.raises(UnfoldError):
                    build_model(cfg, 20, 2)(ids, mask)
                if kernel == "fused" and graph == "complete" and rho == "exp":
                    from energies.kernels.fused_ops import _probe
                    assert not _probe(), f"fused refused although the op works here: {refused}"
                continue
            accepted += 1
            if kernel == "triton" and ri % len(GRAPHS) != gi:    # interpreted (slow): every rho once, every graph
                continue
            model = build_model(cfg, 20, 2)
            out = model(ids, mask)
            torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 1])).backward()
            assert out.report().verdict == "descent", (kernel, graph, rho)
    valid_everywhere = kernel in ("auto", "edges", "dense")
    assert accepted == (len(GRAPHS) * len(RHOS) if valid_everywhere else accepted)
    if kernel in ("softmax", "fused"):
        assert accepted <= 1
    if kernel == "streamed":
        assert accepted == len(RHOS)                      # the complete graph, every rho


def test_where_a_kernel_runs_is_one_rule_that_the_encoder_and_the_build_check_ask():
    """`energies.kernels.kernel_problem` decides; the encoder's constructor refuses exactly the kernels it says run
    nowhere (with its sentence), the build check exactly those it says do not run on train.device."""
    from energies.kernels import kernel_problem
    from experiments.app.config import load_config
    from unfold.encoders import GuaranteedEncoder

    seen = set()
    for kernel in _kernels():
        for graph in ("complete", "window:2", "random:0.5"):
            for rho in RHOS[:2]:
                anywhere, here = kernel_problem(kernel, graph, rho), kernel_problem(kernel, graph, rho, "cpu")
                seen.add(here is None)
                assert anywhere is None or here is not None       # runs on the CPU: runs somewhere
                build = lambda: GuaranteedEncoder(d=4, heads=1, layers=1, graph=graph, rho=rho, kernel=kernel)
                if anywhere is None:
                    build()
                else:
                    with pytest.raises(ConfigError) as info:
                        build()
                    assert anywhere in str(info.value), (kernel, graph, rho)
                msg = _check(load_config("tiny", [f"model.kernel={kernel}", f"model.graph={graph}",
                                                  f"model.rho={rho}", "model.layers=1", "model.d=8"]))
                assert (msg is None) == (here is None), (kernel, graph, rho, msg)
                assert here is None or here.split(";")[-1] in msg             # its sentence, keys renamed
    assert seen == {True, False}                              # both answers were exercised
    assert kernel_problem("auto", "window:2", RHOS[0], "cpu") is None
    assert kernel_problem("softmax", "window:2", "exp", "cpu") is not None   # the negative control
    assert kernel_problem("softmax", "complete", "exp", "cpu") is None


def test_a_kernel_that_cannot_run_on_the_training_device_is_named_with_it(monkeypatch):
    """The check knows where the run trains (train.device); its meta device is never the reason."""
    from energies.kernels import fused_ops as F
    from experiments.app.config import load_config

    for dt in (torch.float32, torch.float64):             # a PyTorch without the CPU flash-attention op
        monkeypatch.setitem(F._PROBED, ("cpu", dt), (None, "has no fused-attention op here (disabled by the test)"))
    msg = _check(load_config("tiny", ["model.kernel=fused"]))
    assert msg is not None and "model.kernel='fused'" in msg and "'cpu'" in msg
    monkeypatch.undo()
    from energies import kernels as P
    from energies.kernels import triton as TK
    if P.triton_unavailable("meta") is not None:
        pytest.skip("Triton is not installed")
    # a CPU without Triton's interpreter (the tests run with TRITON_INTERPRET=1): the kernel is for a GPU
    monkeypatch.setitem(TK._TRITON, "cpu", "runs on CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1)")
    msg = _check(load_config("tiny", ["model.kernel=triton"]))
    assert msg is not None and "train.device='cpu'" in msg and "model.kernel='triton'" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_build_check_accepts_what_trains_there():
    from experiments.app.config import load_config
    from experiments.app.build import build_model

    assert _check(load_config("tiny", ["model.kernel=fused", "train.device=cuda"])) is None   # CUDA's fused ops
    for kernel in _kernels():
        cfg = load_config("tiny", [f"model.kernel={kernel}", "train.device=cuda", "model.layers=1", "model.d=8"])
        if _check(cfg) is None:
            model = build_model(cfg, 20, 2).cuda()
            out = model(torch.randint(1, 20, (2, 6), device="cuda"))
            out.logits.sum().backward()
            assert out.report().verdict == "descent", kernel


# --------------------------------------------------------------------- the hostile table

def _enc(**kw):
    torch.manual_seed(0)
    return U.GuaranteedEncoder(8, heads=2, layers=2, graph="window:2", **kw)


def _classifier(validate=False):
    m = _model()
    m.validate = validate
    return m


def _nan(shape=(2, 5, 8), value=math.nan, at=(1, 2, 3)):
    X = torch.rand(*shape)
    X[at] = value
    return X


def _trace(Y, mask=None, layers=2):
    graph = window(Y.shape[1] if Y.ndim == 3 else 6, 2, batch_size=Y.shape[0] if Y.ndim == 3 else 2, mask=mask)
    return trace_descent(U.AttentionStep(rho="cauchy", tau=2.0), Y, graph, layers=layers)


def _probe(f_kind, **kw):
    from experiments.studies.spline_probe import probe, probe_attention
    if f_kind == "attention":
        return probe_attention("relu", n=3, grid=33, **kw)
    mod = _HidesOverflow().double()
    X0, D = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    return probe(lambda t: mod(X0 + t * D), mod, grid=33, **kw)


_ALL_FALSE = torch.zeros(2, 5, dtype=torch.bool)
_ONE_FALSE = torch.tensor([[True] * 5, [False] * 5])
_U64_IDS = torch.full((2, 5), -1, dtype=torch.int64).view(torch.uint64)

LIBRARY_CASES = [
    # (id, call, error, names)
    ("values-int64", lambda: report_from_values(_values(dtype=torch.int64), torch.float64), StepError, ["floating"]),
    ("values-uint8", lambda: report_from_values(_values(dtype=torch.uint8), torch.float64), StepError, ["uint8"]),
    ("values-complex", lambda: report_from_values(_values(dtype=torch.complex128), torch.float64), StepError, ["complex"]),
    ("values-no-example", lambda: report_from_values(_values(S=0), torch.float64), StepError, ["no example"]),
    ("values-one-boundary", lambda: report_from_values(_values(T1=1), torch.float64), StepError, ["T+1 = 1"]),
    ("values-meta", lambda: report_from_values(_values(device="meta"), torch.float64), StepError, ["meta"]),
    ("values-cpu-meta-mix", lambda: report_from_values({**_values(), "b": _values(device="meta")["a"]}, torch.float64),
     StepError, ["meta", "cpu"]),
    ("values-ragged", lambda: report_from_values({**_values(), "b": torch.zeros(2, 4, dtype=torch.float64)},
                                                 torch.float64), StepError, ["one shape"]),
    ("values-empty-dict", lambda: report_from_values({}, torch.float64), StepError, ["non-empty"]),
    ("resolution-nan", lambda: report_from_values(_values(), torch.float64,
                                                  resolution=torch.full((2, 3), math.nan, dtype=torch.float64)),
     StepError, ["resolution"]),
    ("resolution-int", lambda: report_from_values(_values(), torch.float64, resolution=torch.zeros(2, 3, dtype=torch.long)),
     StepError, ["resolution"]),
    ("tol-factor-nan", lambda: report_from_values(_values(), torch.float64, tol_factor=math.nan), StepError, ["tol_factor", "nan"]),
    ("tol-factor-inf", lambda: report_from_values(_values(), torch.float64, tol_factor=math.inf), StepError, ["tol_factor", "inf"]),
    ("dtype-int", lambda: report_from_values(_values(), torch.int64), StepError, ["dtype", "int64"]),
    ("ids-float", lambda: _model()(_ids().float()), TokenError, ["ids", "float32"]),
    ("ids-bool", lambda: _model()(_ids() > 3), TokenError, ["ids", "bool"]),
    ("ids-complex", lambda: _model()(_ids().to(torch.complex64)), TokenError, ["ids", "complex64"]),
    ("ids-equal-vocab", lambda: _model()(torch.full((2, 5), VOCAB)), TokenError, ["ids", f"got {VOCAB}"]),
    ("ids-negative", lambda: _model()(torch.full((2, 5), -7)), TokenError, ["ids", "got -7"]),
    ("ids-huge", lambda: _model()(torch.full((2, 5), 2 ** 62)), TokenError, ["ids", str(2 ** 62)]),
    ("ids-uint64-max", lambda: _model()(_U64_IDS), TokenError, ["ids", "18446744073709551615"]),
    ("ids-int8-negative", lambda: _model()(torch.full((2, 5), -1, dtype=torch.int8)), TokenError, ["ids", "got -1"]),
    ("ids-uint8-beyond", lambda: _model()(torch.full((2, 5), 200, dtype=torch.uint8)), TokenError, ["ids", "got 200"]),
    ("ids-uint16-beyond", lambda: _model()(torch.full((2, 5), 60000, dtype=torch.uint16)), TokenError, ["ids", "60000"]),
    ("ids-uint32-beyond", lambda: _model()(torch.full((2, 5), 2 ** 32 - 1, dtype=torch.uint32)), TokenError,
     ["ids", str(2 ** 32 - 1)]),
    ("ids-meta-cpu-model", lambda: _model()(_ids().to("meta")), TokenError, ["ids", "meta"]),
    ("ids-3d", lambda: _model()(_ids()[None]), TokenError, ["ids"]),
    ("ids-1d", lambda: _model()(_ids()[0]), TokenError, ["ids"]),
    ("ids-empty-batch", lambda: _model()(_ids()[:0]), TokenError, ["ids", "(0, 5)"]),
    ("ids-no-tokens", lambda: _model()(_ids()[:, :0]), TokenError, ["ids", "(2, 0)"]),
    ("ids-not-a-tensor", lambda: _model()([[1, 2, 3]]), TokenError, ["ids"]),
    ("validate-ids-beyond", lambda: _classifier(True)(torch.full((2, 5), VOCAB + 3)), TokenError, ["ids", str(VOCAB + 3)]),
    ("mask-all-false", lambda: _model()(_ids(), _ALL_FALSE), TokenError, ["mask", "[0, 1]"]),
    ("mask-one-example-false", lambda: _model()(_ids(), _ONE_FALSE), TokenError, ["mask", "[1]"]),
    ("attention-mask-all-zero", lambda: _model()(input_ids=_ids(), attention_mask=_ALL_FALSE.long()), TokenError,
     ["mask", "[0, 1]"]),
    ("mask-float", lambda: _model()(_ids(), torch.ones(2, 5)), TokenError, ["mask", "float32"]),
    ("mask-shape", lambda: _model()(_ids(), torch.ones(2, 4, dtype=torch.bool)), TokenError, ["mask", "(2, 4)"]),
    ("mask-meta-cpu-ids", lambda: _model()(_ids(), torch.ones(2, 5, dtype=torch.bool, device="meta")), TokenError,
     ["mask", "meta"]),
    ("mask-value-2", lambda: _classifier(True)(_ids(), torch.full((2, 5), 2)), TokenError, ["mask", "[2]"]),
    ("mask-uint64-max", lambda: _classifier(True)(_ids(), torch.full((2, 5), -1).view(torch.uint64)), TokenError,
     ["mask", "18446744073709551615"]),
    ("mask-list", lambda: _model()(_ids(), [[1] * 5] * 2), TokenError, ["mask", "list"]),
    ("X-int", lambda: _enc()(torch.ones(2, 5, 8, dtype=torch.long)), TokenError, ["X", "int64"]),
    ("X-bool", lambda: _enc()(torch.ones(2, 5, 8, dtype=torch.bool)), TokenError, ["X", "bool"]),
    ("X-nan-validate", lambda: _enc(validate=True)(_nan()), TokenError, ["X", "NaN", "example 1, token 2"]),
    ("X-inf-validate", lambda: _enc(validate=True)(_nan(value=math.inf)), TokenError, ["X", "Inf"]),
    ("X-neg-inf-validate", lambda: _enc(validate=True)(_nan(value=-math.inf, at=(0, 0, 0))), TokenError, ["X", "Inf"]),
    ("X-wrong-width", lambda: _enc()(torch.rand(2, 5, 7)), TokenError, ["(B, n, 8)", "(2, 5, 7)"]),
    ("X-2d", lambda: _enc()(torch.rand(5, 8)), TokenError, ["(B, n, 8)", "(5, 8)"]),
    ("X-empty-batch", lambda: _enc()(torch.rand(0, 5, 8)), TokenError, ["X", "(0, 5, 8)"]),
    ("X-meta-cpu-encoder", lambda: _enc()(torch.rand(2, 5, 8, device="meta")), TokenError, ["X", "meta"]),
    ("X-not-a-tensor", lambda: _enc()(np.zeros((2, 5, 8))), TokenError, ["X", "ndarray"]),
    ("encoder-mask-all-false", lambda: _enc()(torch.rand(2, 5, 8), _ALL_FALSE), TokenError, ["mask", "[0, 1]"]),
    ("trace-Y-nan", lambda: _trace(_nan((2, 6, 4))), TokenError, ["Y", "NaN"]),
    ("trace-Y-int", lambda: _trace(torch.ones(2, 6, 4, dtype=torch.long)), TokenError, ["Y", "int64"]),
    ("trace-Y-meta", lambda: _trace(torch.rand(2, 6, 4, device="meta")), TokenError, ["meta"]),
    ("trace-mask-all-false", lambda: _trace(torch.rand(2, 6, 4), mask=torch.zeros(2, 6, dtype=torch.bool)), TokenError,
     ["mask", "[0, 1]"]),
    ("trace-layers-0", lambda: _trace(torch.rand(2, 6, 4), layers=0), StepError, ["layers", "0"]),
    ("trace-layers-nan", lambda: _trace(torch.rand(2, 6, 4), layers=math.nan), StepError, ["layers", "nan"]),
    ("edge-uint64-max", lambda: from_edge_index(torch.tensor([[0], [-1]]).view(torch.uint64), 4), GraphError,
     ["18446744073709551615"]),
    ("edge-uint64-2^63", lambda: from_edge_index(torch.tensor([[0], [-(2 ** 63)]]).view(torch.uint64), 4), GraphError,
     [str(2 ** 63)]),
    ("edge-int8-negative", lambda: from_edge_index(torch.tensor([[0], [-1]], dtype=torch.int8), 4), GraphError, ["(0, -1)"]),
    ("edge-uint16-max", lambda: from_edge_index(torch.tensor([[0], [65535]], dtype=torch.uint16), 4), GraphError, ["65535"]),
    ("edge-uint32-max", lambda: from_edge_index(torch.tensor([[0], [2 ** 32 - 1]], dtype=torch.uint32), 4), GraphError,
     [str(2 ** 32 - 1)]),
    ("edge-float", lambda: from_edge_index(torch.tensor([[0.0], [1.0]]), 4), GraphError, ["edge_index", "float32"]),
    ("edge-bool", lambda: from_edge_index(torch.tensor([[True], [False]]), 4), GraphError, ["edge_index", "bool"]),
    ("edge-meta", lambda: from_edge_index(torch.tensor([[0], [1]], device="meta"), 4), GraphError, ["edge_index", "meta"]),
    ("edge-shape", lambda: from_edge_index(torch.zeros(3, 2, dtype=torch.long), 4), GraphError, ["edge_index", "(3, 2)"]),
    ("edge-self-loop", lambda: from_edge_index(torch.tensor([[1], [1]]), 4), GraphError, ["(1, 1)", "self loop"]),
    ("embedding-float-ids", lambda: U.TokenEmbedding(VOCAB, 8)(torch.ones(2, 5)), TokenError, ["ids", "float32"]),
    ("embedding-meta-ids", lambda: U.TokenEmbedding(VOCAB, 8)(_ids().to("meta")), TokenError, ["ids", "meta"]),
    ("embedding-uint64-ids", lambda: U.TokenEmbedding(VOCAB, 8)(_U64_IDS), TokenError, ["ids", "18446744073709551615"]),
    ("probe-t-max-beyond-range", lambda: _probe("overflow", t_max=1.7e308), ConfigError, ["t_max", "1.7e+308"]),
    ("probe-t-max-nan", lambda: _probe("overflow", t_max=math.nan), ConfigError, ["t_max", "nan"]),
    ("probe-t-max-negative", lambda: _probe("overflow", t_max=-1.0), ConfigError, ["t_max", "-1.0"]),
    ("probe-t-max-subnormal", lambda: _probe("overflow", t_max=5e-324), ConfigError, ["t_max", "5e-324"]),
    ("probe-hidden-overflow", lambda: _probe("overflow", t_max=1e300), ConfigError, ["not finite", "t_max=1e+300"]),
    ("probe-ray-does-not-move", lambda: _probe("attention", t_max=1e-300), ConfigError, ["t_max=1e-300", "too short"]),
    ("probe-tol-nan", lambda: _probe("overflow", tol=math.nan), ConfigError, ["tol", "nan"]),
]


@pytest.mark.parametrize("call,error,names", [c[1:] for c in LIBRARY_CASES], ids=[c[0] for c in LIBRARY_CASES])
def test_hostile_library_call(call, error, names):
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    for name in names:
        assert name.lower() in msg.lower(), f"{name!r} not named in {msg!r}"


SPLINE = "experiments.studies.spline_probe"
CLI_CASES = [
    # (argv, names)
    (["--t-max", "1e300"], ["--t-max", "1e300"]),
    (["--t-max", "1e155"], ["--t-max", "1e155"]),
    (["--t-max", "1.7976931348623157e308"], ["--t-max", "1.7976931348623157e308"]),
    (["--t-max", "1e-300"], ["--t-max", "1e-300"]),
    (["--t-max", "5e-324"], ["--t-max", "5e-324"]),
    (["--t-max", "nan"], ["--t-max", "nan"]),
    (["--t-max", "inf"], ["--t-max", "inf"]),
    (["--t-max=-inf"], ["--t-max", "-inf"]),
    (["--t-max=-1"], ["--t-max", "-1"]),
    (["--t-max", "0"], ["--t-max", "'0'"]),
    (["--t-max", "1e-15"], ["t_max=1e-15", "too short"]),
    (["--t-max", "1e999"], ["--t-max", "1e999"]),
    (["--t-max", "three"], ["--t-max", "three"]),
    (["--tol", "nan"], ["--tol", "nan"]),
    (["--tol", "inf"], ["--tol", "inf"]),
    (["--tol", "1e-300"], ["--tol", "1e-300"]),
    (["--tol", "1"], ["--tol", "'1'"]),
    (["--tol=-1e-9"], ["--tol", "-1e-9"]),
    (["--n", "0"], ["--n", "'0'"]),
    (["--n=-3"], ["--n", "-3"]),
    (["--n", "1000000000000"], ["--n", "1000000000000"]),
    (["--n", "nan"], ["--n", "nan"]),
    (["--n", "1e3"], ["--n", "1e3"]),
    (["--max-degree", "101"], ["--max-degree", "101"]),
    (["--max-degree=-1"], ["--max-degree", "-1"]),
    (["--max-degree", "1e9"], ["--max-degree", "1e9"]),
    (["--seed=-1"], ["--seed", "-1"]),
    (["--seed", str(2 ** 63)], ["--seed", str(2 ** 63)]),
    (["--seed", "inf"], ["--seed", "inf"]),
    (["--layers", "3"], ["--layers"]),
]
CONFIG_CASES = [
    (["--layers", "0"], ["--layers", "'0'"]),
    (["--layers", "1000000000"], ["--layers", "1000000000"]),
    (["--layers", "nan"], ["--layers", "nan"]),
    (["--t-max", "1e200"], ["--t-max", "1e200"]),
    (["--t-max", "nan"], ["--t-max", "nan"]),
    (["--n", "100000"], ["--n", "100000"]),
]


@pytest.mark.parametrize("argv,names", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_hostile_spline_probe_flags_on_attention(tmp_path, argv, names):
    expect_refusal(SPLINE, ["--attention", "relu", "--n", "3", "--json", *argv] if "--n" not in " ".join(argv)
                   else ["--attention", "relu", "--json", *argv], str(tmp_path), names=names)


@pytest.mark.parametrize("argv,names", CONFIG_CASES, ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_hostile_spline_probe_flags_on_a_model(tmp_path, argv, names):
    expect_refusal(SPLINE, ["--config", "tiny", "--json", *argv], str(tmp_path), names=names)


def test_the_hostile_table_is_large():
    assert len(LIBRARY_CASES) + len(CLI_CASES) + len(CONFIG_CASES) >= 60


# --------------------------------------------------------------------- a name is taken once
def _taking(table, name, register):
    """``register()`` tries to take ``name`` of ``table``; whatever it did to the table is undone (on the old code it
    replaced the built-in silently, which must not leak into other tests)."""
    def call():
        had, old = name in table, table.get(name)
        try:
            return register()
        finally:
            if had:
                table[name] = old
            else:
                table.pop(name, None)
    return call


def _registry_cases():
    import energies as E
    import experiments.studies.bench as bench
    from convex.heads import HEADS, register_head
    from convex.losses import LOSSES, register_loss
    from energies.errors import EnergyError
    from energies.rho import RHOS, ExpRho, Rho, register_rho
    from unfold.steps import STEPS, register_step

    class _Other(Rho):
        pass

    class _Step(U.AttentionStep):
        pass

    class _Encoder(U.GuaranteedEncoder):
        pass

    return [
        # (id, call, error, names)
        ("rho-exp", _taking(RHOS, "exp", lambda: register_rho("exp")(_Other)), EnergyError, ["rho registry", "'exp'"]),
        ("rho-cauchy", _taking(RHOS, "cauchy", lambda: register_rho("cauchy")(_Other)), EnergyError,
         ["rho registry", "'cauchy'"]),
        ("rho-renames-a-builtin", _taking(RHOS, "exp2", lambda: register_rho("exp2")(ExpRho)), EnergyError,
         ["rho registry", "'exp'", "'exp2'"]),
        ("rho-name-empty", _taking(RHOS, "", lambda: register_rho("")(_Other)), EnergyError, ["rho registry", "''"]),
        ("rho-name-not-a-string", _taking(RHOS, 3, lambda: register_rho(3)(_Other)), EnergyError, ["rho registry", "3"]),
        ("graph-window", _taking(E.GRAPHS, "window", lambda: E.register_graph("window")(lambda n, **k: None)),
         GraphError, ["graph registry", "'window'"]),
        ("graph-complete-mask-free", _taking(E.GRAPHS, "complete",
                                             lambda: E.register_graph("complete", mask_free=False)(lambda n, **k: None)),
         GraphError, ["graph registry", "'complete'"]),
        ("kernel-edges", _taking(E.KERNELS, "edges", lambda: E.register_kernel("edges")(lambda *a: None)), EnergyError,
         ["kernel registry", "'edges'"]),
        ("kernel-fused", _taking(E.KERNELS, "fused", lambda: E.register_kernel("fused", expansion=True)(lambda *a: None)),
         EnergyError, ["kernel registry", "'fused'"]),
        ("auto-rule-banded", _taking(E.kernels.AUTO_RULES, "banded",       # a rule comes only with its kernel
                                     lambda: E.register_kernel("banded", auto=bool)(lambda *a: None)),
         EnergyError, ["kernel registry", "'banded'"]),
        ("heads-pass-fused", _taking(E.kernels.HEADS_PASSES, "fused",
                                     lambda: E.register_kernel("fused", heads=len)(lambda *a: None)),
         EnergyError, ["kernel registry", "'fused'"]),
        ("encoder-guaranteed", _taking(U.ENCODERS, "guaranteed", lambda: U.register_encoder("guaranteed")(_Encoder)),
         ConfigError, ["encoder registry", "'guaranteed'"]),
        ("step-attention", _taking(STEPS, "attention", lambda: register_step("attention")(_Step)), StepError,
         ["step registry", "'attention'"]),
        ("head-bfno", _taking(HEADS, "bfno", lambda: register_head("bfno")(type("H", (), {}))), ConfigError,
         ["head registry", "'bfno'"]),
        ("loss-squared", _taking(LOSSES, "squared", lambda: register_loss("squared")(type("L", (), {}))), ConfigError,
         ["loss registry", "'squared'"]),
        ("bench-suite-kernels", _taking(bench.SUITES, next(iter(bench.SUITES)),
                                        lambda: bench.suite(next(iter(bench.SUITES)))(lambda q, d: {})), ConfigError,
         ["bench suite registry", repr(next(iter(bench.SUITES)))]),
    ]


REGISTRY_CASES = _registry_cases()


@pytest.mark.parametrize("call,error,names", [c[1:] for c in REGISTRY_CASES], ids=[c[0] for c in REGISTRY_CASES])
def test_a_name_already_registered_is_refused(call, error, names):
    """Every registry refuses a name it holds already, naming the registry and the name, and every table is left as
    it was (a plug-in's ``exp`` cannot reach the trace but not the fused forward, a second ``edges`` cannot end in
    ``TypeError: 'Kernel' object is not callable``)."""
    import energies as E
    from energies.rho import RHOS

    before = {name: dict(table) for name, table in (("rho", RHOS), ("graph", E.GRAPHS), ("kernel", E.KERNELS),
                                                    ("encoder", U.ENCODERS))}
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    for name in names:
        assert name.lower() in msg.lower(), f"{name!r} not named in {msg!r}"
    assert before == {name: dict(table) for name, table in (("rho", RHOS), ("graph", E.GRAPHS), ("kernel", E.KERNELS),
                                                            ("encoder", U.ENCODERS))}
    assert E.get_rho("exp").spec() == "exp" and "complete" in E.graphs.MASK_FREE


def test_a_new_name_registers_and_the_same_object_again_is_a_no_op():
    """The negative control: a fresh name is taken, and registering the very same object under it again changes
    nothing (a second import of one module object); a second, different object under it is refused."""
    import energies as E
    from energies.rho import RHOS, Rho, register_rho

    class Fresh(Rho):
        def value(self, z):
            return -torch.exp(-z)

        def derivative(self, z):
            return torch.exp(-z)

    try:
        assert register_rho("fresh_test")(Fresh) is Fresh and RHOS["fresh_test"] is Fresh
        assert register_rho("fresh_test")(Fresh) is Fresh and Fresh.name == "fresh_test"
        with pytest.raises(E.EnergyError, match="'fresh_test' is already registered"):
            register_rho("fresh_test")(type("Again", (Fresh,), {}))
        assert RHOS["fresh_test"] is Fresh
    finally:
        RHOS.pop("fresh_test", None)


# --------------------------------------------------------------------- one depth rule, one batch rule
def _untied(mode="free", layers=4):
    torch.manual_seed(0)
    return U.UnfoldedTransformer(VOCAB, 2, d=8, heads=2, layers=layers, mode=mode,
                                 graph="complete" if mode == "baseline" else "window:2")


def _trained(mode="guaranteed"):
    from experiments.app.build import build_model
    from experiments.app.config import load_config
    from experiments.data.text import Vocab

    cfg = load_config("tiny", [f"model.mode={mode}", "model.d=8", "model.heads=2", "model.layers=2", "data.max_len=9"])
    torch.manual_seed(0)
    vocab = Vocab(["<pad>", "<unk>", "good", "bad", "film"])
    from experiments.app.bundle import TrainedModel
    return TrainedModel(build_model(cfg, len(vocab.itos), 2), cfg, vocab, ["neg", "pos"])


def _tensors(N=4, labels=None):
    ids = torch.randint(1, VOCAB, (N, 5), generator=torch.Generator().manual_seed(2))
    return ids, torch.ones(N, 5, dtype=torch.bool), torch.tensor([0, 1] * (N // 2)) if labels is None else labels


def _evaluate_at(*args, model=None, **kw):
    from experiments.studies.depth import evaluate_at
    return evaluate_at(_model() if model is None else model, *args, **kw)


_X = torch.rand(2, 5, 8)

DEPTH_CASES = [
    # (id, call, error, names): every depth and batch size refused where the model / library API is entered
    ("free-layers-2", lambda: _untied()(_ids(), layers=2), ConfigError, ["layers=2", "untied"]),
    ("free-layers-4", lambda: _untied()(_ids(), layers=4), ConfigError, ["layers=4", "untied"]),
    ("free-layers-5", lambda: _untied()(_ids(), layers=5), ConfigError, ["layers=5", "untied"]),
    ("baseline-layers-2", lambda: _untied("baseline")(_ids(), layers=2), ConfigError, ["layers=2", "untied"]),
    ("free-encode-layers-1", lambda: _untied().encode(_X, torch.ones(2, 5, dtype=torch.bool), layers=1), ConfigError,
     ["layers=1", "untied"]),
    ("free-encoder-layers-3", lambda: _untied().encoder(_X, layers=3), ConfigError, ["layers=3", "untied"]),
    ("guaranteed-layers-4097", lambda: _model()(_ids(), layers=4097), ConfigError, ["layers", "4096", "4097"]),
    ("guaranteed-layers-0", lambda: _model()(_ids(), layers=0), ConfigError, ["layers", "got 0"]),
    ("guaranteed-layers-negative", lambda: _model()(_ids(), layers=-1), ConfigError, ["layers", "-1"]),
    ("guaranteed-layers-float", lambda: _model()(_ids(), layers=2.5), ConfigError, ["layers", "2.5"]),
    ("guaranteed-layers-bool", lambda: _model()(_ids(), layers=True), ConfigError, ["layers", "True"]),
    ("guaranteed-layers-nan", lambda: _model()(_ids(), layers=math.nan), ConfigError, ["layers", "nan"]),
    ("guaranteed-layers-str", lambda: _model()(_ids(), layers="3"), ConfigError, ["layers", "'3'"]),
    ("guaranteed-encoder-layers-0", lambda: _enc()(_X, layers=0), ConfigError, ["layers", "got 0"]),
    ("guaranteed-encoder-layers-10**6", lambda: _enc()(_X, layers=10 ** 6), ConfigError, ["layers", "1000000"]),
    ("guaranteed-first-layers", lambda: _enc()(_X, first_layers=1), ConfigError, ["first_layers=1", "weight-shared"]),
    ("free-first-layers-5", lambda: _untied().encoder(_X, first_layers=5), ConfigError, ["first_layers=5", "4"]),
    ("free-first-layers-0", lambda: _untied().encoder(_X, first_layers=0), ConfigError, ["first_layers", "got 0"]),
    ("free-first-layers-and-layers", lambda: _untied().encoder(_X, first_layers=1, layers=1), ConfigError,
     ["layers or first_layers"]),
    ("predict-batch-size--1", lambda: _trained().predict(["good film"], batch_size=-1), ConfigError,
     ["batch_size", "-1"]),
    ("predict-batch-size-0", lambda: _trained().predict(["good film"], batch_size=0), ConfigError, ["batch_size", "0"]),
    ("predict-batch-size-2.5", lambda: _trained().predict(["good film"], batch_size=2.5), ConfigError,
     ["batch_size", "2.5"]),
    ("predict-batch-size-true", lambda: _trained().predict(["good film"], batch_size=True), ConfigError,
     ["batch_size", "True"]),
    ("predict-batch-size-huge", lambda: _trained().predict(["good film"], batch_size=2 ** 40), ConfigError,
     ["batch_size", str(2 ** 40)]),
    ("predict-free-layers-2", lambda: _trained("free").predict(["good film"], layers=2), ConfigError,
     ["layers=2", "untied"]),
    ("evaluate-at-batch-size--1", lambda: _evaluate_at(_tensors(), batch_size=-1), ConfigError, ["batch_size", "-1"]),
    ("evaluate-at-batch-size-0", lambda: _evaluate_at(_tensors(), batch_size=0), ConfigError, ["batch_size", "0"]),
    ("evaluate-at-batch-size-2.5", lambda: _evaluate_at(_tensors(), batch_size=2.5), ConfigError, ["batch_size", "2.5"]),
    ("evaluate-at-batch-size-nan", lambda: _evaluate_at(_tensors(), batch_size=math.nan), ConfigError,
     ["batch_size", "nan"]),
    ("evaluate-at-layers-4097", lambda: _evaluate_at(_tensors(), layers=4097), ConfigError, ["layers", "4097"]),
    ("evaluate-at-label-2", lambda: _evaluate_at(_tensors(labels=torch.tensor([0, 1, 2, 1]))), TokenError,
     ["labels", "[0, 2)", "got 2 at 2"]),
    ("evaluate-at-label-negative", lambda: _evaluate_at(_tensors(labels=torch.tensor([0, -1, 1, 1]))), TokenError,
     ["labels", "got -1 at 1"]),
    ("evaluate-at-label-huge", lambda: _evaluate_at(_tensors(labels=torch.tensor([0, 1, 1, 2 ** 40]))), TokenError,
     ["labels", str(2 ** 40)]),
    ("evaluate-at-labels-float", lambda: _evaluate_at(_tensors(labels=torch.tensor([0.0, 1.0, 1.0, 0.0]))), TokenError,
     ["labels", "float32"]),
    ("evaluate-at-labels-short", lambda: _evaluate_at(_tensors(labels=torch.tensor([0, 1]))), TokenError,
     ["labels", "(2,)", "same examples"]),
    ("evaluate-at-no-example", lambda: _evaluate_at((_ids()[:0], torch.ones(0, 5, dtype=torch.bool),
                                                      torch.zeros(0, dtype=torch.long))), TokenError,
     ["no example"]),
    ("evaluate-at-not-a-triple", lambda: _evaluate_at((_ids(), _ids())), TokenError, ["ids, mask, labels"]),
]


@pytest.mark.parametrize("call,error,names", [c[1:] for c in DEPTH_CASES], ids=[c[0] for c in DEPTH_CASES])
def test_hostile_depth_and_batch_size(call, error, names):
    """Each hostile depth or batch size is refused naming what is wrong: ``layers=2`` on an untied 4-layer stack,
    ``layers=4097`` past the cap, ``layers=0`` on the guaranteed model; ``predict(batch_size=-1)``; an
    ``evaluate_at`` over no example; labels outside the classes (never counted as wrong)."""
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    for name in names:
        assert name.lower() in msg.lower(), f"{name!r} not named in {msg!r}"


def test_the_depths_and_batch_sizes_the_rules_accept_still_run():
    """The negative controls: a weight-shared step unrolled to 1, 7 and the trained depth; an untied stack at its
    depth and its explicit first layers (equal to the first layers of the full run); predict and evaluate_at with
    batch size 1 and an integral 2.0 (the framework's integer rule), labels in range."""
    ids, mask = _ids(), torch.ones(2, 5, dtype=torch.bool)
    model = _model().eval()
    for T in (1, 7):
        assert model(ids, mask, layers=T).report().steps == 2 * T
    assert torch.equal(model(ids, mask, layers=2).logits, model(ids, mask).logits)
    free = _untied().eval()
    X = free.embedding(ids)
    full = free.encoder(X, mask, keep_states=True)
    for k in (1, 4):
        assert torch.equal(free.encoder(X, mask, first_layers=k).Y, full.states[k] if k < 4 else full.Y)
    trained = _trained()
    a, b = trained.predict(["good film", "bad"], batch_size=1), trained.predict(["good film", "bad"], batch_size=2.0)
    assert len(a) == len(b) == 2 and all(p.probabilities == pytest.approx(q.probabilities, abs=1e-6)
                                          for p, q in zip(a, b))
    res = _evaluate_at(_tensors(), batch_size=3)
    assert res["examples"] == 4 and res["accuracy"] == _evaluate_at(_tensors(), batch_size=4)["accuracy"]


# --------------------------------------------------------------------- a term's Y against its graph
def _terms():
    import energies as E

    gen = torch.Generator().manual_seed(4)
    W = torch.randn(4, 4, dtype=torch.float64, generator=gen)

    class PlugTerm(E.EnergyTerm):                       # a plug-in term: its methods are checked too
        def value(self, Y, graph):
            return (Y * Y).sum((1, 2))

        def grad(self, Y, graph):
            return 2 * Y

        def curvature(self, Y, graph):
            return 2.0

    return {
        "attention-edges": E.PairwiseAttention("exp", 1.3, kernel="edges"),
        "attention-dense": E.PairwiseAttention("cauchy", 1.3, kernel="dense"),
        "attention-auto-metric": E.PairwiseAttention("exp", 1.3, metric=torch.eye(4, dtype=torch.float64)),
        "residual": E.Residual(torch.randn(2, 5, 4, dtype=torch.float64, generator=gen)),
        "feedforward": E.FeedForward(W + W.T),
        "nonnegativity": E.NonNegativity(),
        "centering": E.Centering(),
        "rescaling": E.Rescaling(),
        "plug-in": PlugTerm(),
    }


_TERM_Y = torch.rand(2, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
_BAD_Y = {
    "other-n": (torch.rand(2, 6, 4, dtype=torch.float64), ["(2, 6, 4)", "(2, 5)"]),
    "other-batch": (torch.rand(3, 5, 4, dtype=torch.float64), ["(3, 5, 4)", "(2, 5)"]),
    "one-example-2d": (torch.rand(5, 4, dtype=torch.float64), ["(5, 4)", "(2, 5)"]),
    "meta": (torch.rand(2, 5, 4, dtype=torch.float64, device="meta"), ["meta", "cpu"]),
    "int": (torch.ones(2, 5, 4, dtype=torch.long), ["floating", "int64"]),
    "not-a-tensor": (np.zeros((2, 5, 4)), ["ndarray"]),
}


def _term_methods(term):
    import energies as E

    methods = ["value", "grad", "pass_value", "forward"]
    if not term.is_indicator:
        methods += ["curvature", "mm", "pass_value_and_curvature"]
    else:
        methods += ["prox"]
    if isinstance(term, E.PairwiseAttention):
        methods += ["neighbour_sums", "messages", "mm_pass", "joint_mm", "joint_pass_values"]
    return methods


TERM_CASES = [(name, method, bad) for name, term in _terms().items() for method in _term_methods(term)
              for bad in _BAD_Y]


def _call(term, method, Y, graph):
    if method.startswith("joint_"):
        return getattr(type(term), method)([term, term], Y, graph)
    return getattr(term, method)(Y, graph)


@pytest.mark.parametrize("name,method,bad", TERM_CASES, ids=["-".join(c) for c in TERM_CASES])
def test_a_term_method_checks_Y_against_its_graph(name, method, bad):
    """Y of another n or batch than the graph, or on another device (``PairwiseAttention(...).value(Y, graph)``
    ...), is refused by every public method of every term with a TokenError naming the shapes or devices (metadata
    only: no host read), never torch's untyped RuntimeError nor a run on the wrong rows."""
    term, graph = _terms()[name], window(5, 2, batch_size=2)
    Y, names = _BAD_Y[bad]
    with pytest.raises(TokenError) as info:
        _call(term, method, Y, graph)
    for what in names:
        assert what in str(info.value), (what, str(info.value))


@pytest.mark.parametrize("name", sorted(_terms()))
def test_a_term_method_takes_Y_that_fits_its_graph(name):
    """The negative control: Y of the graph's shape runs every method; a graph that is not one is a GraphError."""
    term, graph = _terms()[name], window(5, 2, batch_size=2)
    for method in _term_methods(term):
        _call(term, method, _TERM_Y, graph)
    with pytest.raises(GraphError, match="graph must be a TokenGraph"):
        term.value(_TERM_Y, "window:2")
