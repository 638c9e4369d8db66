"""Commands that never compile or plot import none of the heavy packages: ``unfold-data inspect`` and
``unfold-train --print-config`` (their modules, and the library they import) leave ``torch._dynamo`` (with
``sympy`` and ``triton`` behind it: seconds), matplotlib, tokenizers, pyarrow and tensorboard unimported until a
command uses them. ``torch.compiler.disable`` or ``assume_constant_result`` applied at import time in
``energies`` would pull in ``torch._dynamo``, about 10 s of a 450-row ``inspect`` under load."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ["torch._dynamo", "sympy", "triton", "matplotlib", "tokenizers", "pyarrow", "tensorboard"]


def _loaded(modules) -> list:
    code = textwrap.dedent(f"""
        import sys
        for m in {modules!r}:
            __import__(m)
        print(" ".join(m for m in {HEAVY!r} if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_inspect_and_print_config_import_no_heavy_package():
    assert _loaded(["experiments.app.data_cli", "experiments.app.inspect_data", "experiments.app.train",
                    "energies", "unfold"]) == []
    assert "torch._dynamo" in _loaded(["energies", "torch._dynamo"])       # the control: the probe sees an import


def test_the_lazy_constant_mark_is_the_one_torch_sets():
    """`constant_for_compile` sets, without importing torch._dynamo, the mark that
    ``torch.compiler.assume_constant_result`` sets (checked on the torch installed), and once dynamo is imported
    it is that decorator."""
    import torch
    from energies.kernels.fused_ops import constant_for_compile, fused_available

    def a():
        return 1

    def b():
        return 1

    marked = torch.compiler.assume_constant_result(a)
    assert marked is a and vars(a) == {"_dynamo_marked_constant": True}
    assert constant_for_compile(b) is b and vars(b) == vars(a)
    assert getattr(fused_available, "_dynamo_marked_constant", False) is True
