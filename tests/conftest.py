import os
import sys

# Small tensors: one thread avoids oversubscription stalls on a busy 2-core machine (this process
# and the subprocesses the tests start).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors (energies.kernels.triton.pairwise reads this
# when it is first imported); with one they run compiled on CUDA.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

torch.set_num_threads(1)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        params = [pytest.param("cpu")]
        params.append(pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                     reason="no CUDA device")))
        metafunc.parametrize("device", params)


@pytest.fixture
def faulty(monkeypatch):
    """A planted fault for the descent checks' negative controls: every layer adds 0.5 to the first example's
    tokens after its step, a real energy increase the monitor and the trace must catch."""
    from unfold.prox import ProxMMStep

    original = ProxMMStep.step_with_trace

    def bumped(self, Y, graph, values=True):
        out, vals, curv = original(self, Y, graph, values)
        bump = torch.zeros_like(out)
        bump[0] = 0.5
        return out + bump, vals, curv

    monkeypatch.setattr(ProxMMStep, "step_with_trace", bumped)


@pytest.fixture
def aten_calls(monkeypatch):
    """The names of the private aten ops :mod:`energies.kernels.fused_ops` calls during the test, in order (its one door to them,
    ``_aten``, replaced by a recording spy): which fused op ran, read off the meta kernels too."""
    import energies.kernels.fused_ops as F
    called = []

    class Spy:
        def __getattr__(self, name):
            called.append(name)
            return getattr(torch.ops.aten, name)
    monkeypatch.setattr(F, "_aten", Spy)
    return called
