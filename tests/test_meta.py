"""A forward with no host synchronisation, trace on or off: every encoder, every documented rho, the complete and a
window graph, run on the ``meta`` device, which refuses any host read (``.item()``, ``bool(t)``, ``.tolist()``,
``nonzero``) and any mix of devices. The kernels ``auto`` picks there are those of a GPU: the Triton kernel where
Triton is installed (its custom op's fake implementation), else the torch kernels with the precision guard
decided on the device. A negative control shows a host read does fail on meta."""
from __future__ import annotations

import pytest
import torch

from energies import kernels as P
from energies.kernels import triton as TK
from energies.rho import get_rho
from experiments.app.config import load_config
from experiments.app.build import check_buildable
from unfold.encoders import ENCODERS
from matrix import rho_specs

RHOS = rho_specs("shapes")  # drawn from the registry (tests/matrix.py)


def _run(kind, graph, rho, trace, **kw):
    with torch.device("meta"):
        enc = ENCODERS[kind](d=8, layers=2, graph=graph, rho=rho, **kw)
        X = torch.randn(2, 5, 8)
        mask = torch.ones(2, 5, dtype=torch.bool)
        out = enc(X, mask, trace=trace)
        assert out.Y.device.type == "meta" and out.Y.shape == (2, 5, 8)
        if trace:
            assert all(v.device.type == "meta" and v.shape == (2, 3) for v in out.energies.values())
        else:
            out.Y.sum().backward()              # a training step's backward, too
    return out


@pytest.fixture(params=["triton", "torch"])
def gpu_kernels(request, monkeypatch):
    """'triton': auto picks the Triton kernel on meta (if Triton is installed); 'torch': as without Triton."""
    if request.param == "triton":
        if P.triton_unavailable("meta") is not None:
            pytest.skip("Triton is not installed")
    else:
        monkeypatch.setitem(TK._TRITON, "meta", "disabled for this test")
    return request.param


@pytest.mark.parametrize("trace", [False, True])
@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("graph", ["complete", "window:2"])
@pytest.mark.parametrize("kind", sorted(ENCODERS))
def test_every_encoder_runs_on_meta(kind, graph, rho, trace, gpu_kernels):
    if kind == "baseline" and graph != "complete":
        pytest.skip("the baseline encoder is complete-graph only")
    _run(kind, graph, rho, trace)
    if gpu_kernels == "triton":          # what ran was the GPU's kernel
        g = ENCODERS[kind](d=8, layers=1, graph=graph).graphs(torch.ones(2, 5, dtype=torch.bool, device="meta"))
        expected = "fused" if (graph, rho) == ("complete", "exp") else "triton"   # torch's own fused attention
        assert P.pick_kernel(g, get_rho(rho)) == expected


@pytest.mark.parametrize("kernel", ["softmax", "dense", "streamed", "edges", "fused"])
def test_every_torch_kernel_guards_on_the_device(kernel, monkeypatch):
    monkeypatch.setitem(TK._TRITON, "meta", "disabled for this test")
    graph = "complete" if kernel != "edges" else "window:2"
    _run("guaranteed", graph, "exp", True, kernel=kernel)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("trace", [False, True])
def test_the_fused_kernel_runs_the_cuda_ops_on_meta(trace, dtype, aten_calls):
    """The CUDA fused ops (memory-efficient for float32, flash for bfloat16: their meta kernels) through the
    guaranteed encoder, forward and backward, trace on (the guard's exact side the Triton kernel, where installed)
    and off; bfloat16 features go to the flash op as they are, with the trace on too (its energies come from float32
    energy-only passes, so the step runs unguarded: the ops called are recorded)."""
    import energies.kernels.fused_ops as F
    assert F.fused_ops("meta", torch.float32).name == "cuda-memory-efficient"
    assert F.fused_ops("meta", torch.bfloat16).name == "cuda-flash"
    called = aten_calls
    with torch.device("meta"):
        enc = ENCODERS["guaranteed"](d=16, heads=2, layers=2, graph="complete", rho="exp", kernel="fused").to(dtype)
        out = enc(torch.randn(2, 37, 16, dtype=dtype), torch.ones(2, 37, dtype=torch.bool), trace=trace)
        assert out.Y.shape == (2, 37, 16)
        if trace:
            assert all(v.dtype == torch.float64 for v in out.energies.values())
        out.Y.float().sum().backward()
    op = "flash" if dtype == torch.bfloat16 else "efficient"   # bfloat16 steps unguarded also with the trace on
    assert f"_scaled_dot_product_{op}_attention" in called and f"_scaled_dot_product_{op}_attention_backward" in called


def test_a_host_read_fails_on_meta():
    """The negative control: the same forward with a host read in it (the CPU guard's) stops on meta."""
    with torch.device("meta"):
        x = torch.ones(3)
        with pytest.raises(RuntimeError, match="meta"):
            P.expansion_dtype(x[None, :, None], 1.0)


@pytest.mark.parametrize("rho", RHOS)
def test_the_training_build_check_accepts_every_documented_rho(rho):
    cfg = load_config("tiny", [f"model.rho={rho}"])
    assert check_buildable(cfg) > 0


@pytest.mark.parametrize("graph", ["complete", "window:2"])
def test_the_energy_chosen_depth_runs_on_meta(graph):
    """stop_rel decides on the exact evaluation (explicit differences) at every layer: no host read either."""
    with torch.device("meta"):
        enc = ENCODERS["guaranteed"](d=8, layers=3, graph=graph, stop_rel=1e-4)
        out = enc(torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.bool), trace=True)
        assert out.layers_used.device.type == "meta" and out.Y.shape == (2, 5, 8)
