"""The test matrices are drawn from the registry (`tests/matrix.py`): every registered rho's examples are specs of
that rho, every matrix runs every registered rho, and a rho registered as a plug-in is picked up by every matrix
and by every test module that runs one, with no list to edit."""
import json
import os
import subprocess
import sys

import pytest

import energies as E
from matrix import MATRICES, rho_examples, rho_specs

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

#: the modules whose ``RHOS`` is a matrix: the test files and the scripts run by hand
READERS = ("sweep", "test_backends", "test_steps", "test_energy", "test_banded", "test_meta", "test_hostile_library",
           "test_pyg", "triton_check_matrix")
REGIMES = {"typical", "steep", "linear", "wide"}


@pytest.mark.parametrize("name", list(E.RHOS))
def test_each_registered_rho_declares_examples_of_itself(name):
    examples = rho_examples(name)
    assert examples["typical"] and set(examples) <= REGIMES
    for spec in examples.values():
        rho = E.get_rho(spec)
        assert type(rho) is E.RHOS[name] and E.get_rho(rho.spec()).spec() == rho.spec()


@pytest.mark.parametrize("matrix", list(MATRICES))
def test_every_matrix_runs_every_registered_rho(matrix):
    specs = rho_specs(matrix)
    assert len(specs) == len(set(specs)) >= len(E.RHOS)
    assert {type(E.get_rho(s)) for s in specs} == set(E.RHOS.values())


def test_a_matrix_takes_the_declared_regimes_else_the_typical_example():
    linear = {rho_examples(n)["linear"] for n in E.RHOS if "linear" in rho_examples(n)}
    assert linear and set(rho_specs("energy")) == set(rho_specs("kernels")) | linear
    wide = [rho_examples(n).get("wide", rho_examples(n)["typical"]) for n in E.RHOS]
    assert rho_specs("banded") == wide and wide != rho_specs("families")


PLUGIN = '''
import torch
from energies.rho import Rho, register_rho


@register_rho("newpen")
class NewPenalty(Rho):
    """rho(z) = c log(1 + z / c): concave, non-decreasing."""

    examples = {"typical": "newpen:2", "wide": "newpen:5"}

    def __init__(self, c: float = 1.0):
        super().__init__()
        self.c = float(c)

    def value(self, z):
        return self.c * torch.log1p(z / self.c)

    def derivative(self, z):
        return 1.0 / (1.0 + z / self.c)

    def spec(self):
        return f"newpen:{self.c:g}"


@register_rho("bare")
class Bare(Rho):
    """rho(z) = log(1 + z), declaring no example: it runs its bare name."""

    def value(self, z):
        return torch.log1p(z)

    def derivative(self, z):
        return 1.0 / (1.0 + z)
'''

PROBE = '''
import importlib, json, sys
sys.path[:0] = [{tests!r}, {root!r}, {plugins!r}]
import newpen_plugin  # noqa: F401  (registers newpen and bare)
from matrix import MATRICES, rho_specs
out = {{"matrices": {{m: rho_specs(m) for m in MATRICES}}}}
for name in {readers!r}:
    out[name] = list(importlib.import_module(name).RHOS)
print(json.dumps(out))
'''


def test_a_rho_registered_as_a_plug_in_is_in_every_matrix(tmp_path):
    """In a fresh interpreter (the registry is left as it was here): a plug-in registers two penalties; every
    matrix and every module reading one runs them, ``newpen`` by its declared regimes, ``bare`` by its name."""
    (tmp_path / "newpen_plugin.py").write_text(PLUGIN)
    code = PROBE.format(tests=TESTS, root=ROOT, plugins=str(tmp_path), readers=READERS)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    for matrix, specs in seen.pop("matrices").items():
        assert specs[-2:] == (["newpen:5"] if matrix == "banded" else ["newpen:2"]) + ["bare"], matrix
    for module in READERS:
        assert "bare" in seen[module] and ("newpen:2" in seen[module] or "newpen:5" in seen[module]), module
    assert "newpen" not in E.RHOS and "bare" not in E.RHOS
