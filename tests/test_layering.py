"""The layering of the project, read from the source (:mod:`layering`: every ``.py`` file parsed with :mod:`ast`).

Rules (:data:`layering.RULES`):

* :mod:`energies` imports nothing of the project outside itself; :mod:`unfold` only :mod:`energies`; :mod:`convex`
  only :mod:`energies` and :mod:`unfold`;
* the application (:mod:`experiments.app`, :mod:`experiments.data`) never imports a study
  (:mod:`experiments.studies`), nor the alias modules directly in :mod:`experiments`; a study imports the library,
  the application and other studies, not the aliases;
* each alias module directly in :mod:`experiments` imports exactly one project module: its namesake in
  :mod:`experiments.app` or :mod:`experiments.studies` (it holds no code);
* no import circle among the project's modules. **Lazy imports count**: an import inside a function is a
  dependency all the same (it runs the first time the function does), so a circle closed by one is a circle; only
  imports under ``if TYPE_CHECKING:`` are left out (they never run). Imports named by strings
  (``importlib.import_module``, ``python -m`` in a subprocess) are not read. An import is an edge to the deepest
  project module it names; the parent packages Python initialises on the way are not edges of their own.

Each rule has its negative control: the same checker, run on a small package tree planted in ``tmp_path`` (an
upward import in each layer, an application module importing a study, an alias with code, a circle closed by a
lazy import), reports every one of them, and leaves out a ``TYPE_CHECKING`` import.
"""
import ast
import configparser
import importlib
import os
import textwrap

import pytest

from layering import PACKAGES, cycles, find_modules, import_graph, layer_violations

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _no_code(statement) -> bool:
    """A top-level statement that holds no code of its own: a docstring, an import, ``__all__ = ...`` or
    ``sys.modules[...] = ...`` (an alias replacing itself)."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return True
    if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return all((isinstance(t, ast.Name) and t.id == "__all__")
                   or (isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules") for t in targets)
    return False


def rooms_without_code(root: str) -> list:
    """Modules (not a package's ``__init__``, which is its face) that define nothing: aliases of another module, or
    re-exports of names whose home is elsewhere. Each name has one home, imported from there."""
    bad = []
    for module, (path, is_pkg) in sorted(find_modules(root).items()):
        if is_pkg:
            continue
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
        if body and all(_no_code(st) for st in body):
            bad.append(f"{module} holds no code: an alias or a re-export; import from the names' home")
    return bad


def private_exports(root: str) -> list:
    """``__all__`` entries that start with ``_``: a private name is never part of what a module offers."""
    bad = []
    for module, (path, _) in sorted(find_modules(root).items()):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for st in tree.body:
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in st.targets):
                names = [e.value for e in getattr(st.value, "elts", []) if isinstance(e, ast.Constant)]
                bad += [f"{module} exports the private name {n!r}" for n in names if str(n).startswith("_")]
    return bad


def kernels_outside(root: str) -> list:
    """Modules of :mod:`energies` outside :mod:`energies.kernels` that register a pairwise kernel: every kernel's
    code lives under ``energies/kernels/``."""
    bad = []
    for module, (path, _) in sorted(find_modules(root).items()):
        if not module.startswith("energies.") or module.startswith("energies.kernels"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("register_kernel")]
        if calls:
            bad.append(f"{module}:{calls[0].lineno} registers a kernel outside energies/kernels/")
    return bad


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_import_graph_is_read_whole(graph):
    """Not vacuous: every module of the packages is in the graph, with the edges we know of (a lazy one included)."""
    modules = find_modules(ROOT)
    assert set(graph) == set(modules) and len(graph) > 100
    assert {p for p in PACKAGES} <= set(graph)
    edges = {(m, t) for m, es in graph.items() for t, _ in es}
    assert ("experiments.app.train", "experiments.app.build") in edges          # module level
    assert ("experiments.app.bundle.read", "experiments.app.build") in edges    # inside read_bundle (lazy)
    assert ("energies.kernels.banded", "energies.kernels.registry") in edges
    assert ("energies.kernels.triton.pairwise", "energies.kernels.triton.rho") in edges
    assert ("experiments.studies.activations", "experiments.studies.spline_probe") in edges


def test_each_layer_imports_only_what_it_may(graph):
    assert layer_violations(graph) == []


def test_no_room_without_code_no_private_export_and_every_kernel_at_home():
    assert rooms_without_code(ROOT) == []
    assert private_exports(ROOT) == []
    assert kernels_outside(ROOT) == []


def test_no_import_circle(graph):
    assert cycles(graph) == []


def test_every_console_command_resolves_and_experiments_holds_no_alias():
    """Each console script of setup.cfg names a module and a ``main`` that import; ``experiments/`` holds its
    sub-packages only (commands run from their homes: the console scripts, ``python -m experiments.studies.X``)."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    scripts = [line.split("=", 1) for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines()]
    assert len(scripts) == 6
    for name, target in scripts:
        module, _, func = target.strip().partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name
    assert [f for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".py")] == ["__init__.py"]


# ------------------------------------------------------------------------------------------- negative controls
def plant(root, files: dict) -> None:
    """Write ``{relative path: source}`` under ``root`` (``__init__.py`` files included as given)."""
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))


CLEAN = {
    "energies/__init__.py": "from .graph import TokenGraph\n",
    "energies/graph.py": "import torch\nfrom .errors import GraphError\n",
    "energies/errors.py": "",
    "unfold/__init__.py": "",
    "unfold/steps.py": "from energies.graphs import TokenGraph\n",
    "convex/__init__.py": "",
    "convex/heads.py": "from unfold import steps\nfrom energies import TokenGraph\n",
    "experiments/__init__.py": "",
    "experiments/app/__init__.py": "",
    "experiments/app/train.py": "from .build import build_model\nfrom ..data import load\n",
    "experiments/app/build.py": "from unfold.steps import x\n",
    "experiments/data/__init__.py": "def load():\n    pass\n",
    "experiments/studies/__init__.py": "",
    "experiments/studies/probe.py": "from ..app.train import train\nfrom . import other\n",
    "experiments/studies/other.py": "def f():\n    from experiments.app import build\n",
}


def test_the_clean_planted_tree_passes(tmp_path):
    plant(tmp_path, CLEAN)
    g = import_graph(str(tmp_path))
    assert layer_violations(g) == [] and cycles(g) == []
    assert private_exports(str(tmp_path)) == [] and kernels_outside(str(tmp_path)) == []
    assert ("experiments.app.build", 2) in g["experiments.studies.other"]           # the lazy import read


@pytest.mark.parametrize("path, source, expected", [
    ("energies/terms.py", "from unfold.steps import x\n", "energies.terms:1 imports unfold.steps"),
    ("energies/terms.py", "def f():\n    import experiments.app.train\n", "energies.terms:2 imports experiments.app.train"),
    ("unfold/mm.py", "from convex import heads\n", "unfold.mm:1 imports convex.heads"),
    ("unfold/mm.py", "from experiments.app.build import build_model\n", "unfold.mm:1 imports experiments.app.build"),
    ("convex/solver.py", "import experiments.data\n", "convex.solver:1 imports experiments.data"),
    ("experiments/app/sweep.py", "def run():\n    from ..studies.probe import probe\n",
     "experiments.app.sweep:2 imports experiments.studies.probe"),
    ("experiments/app/sweep.py", "from experiments.studies import probe\n",
     "experiments.app.sweep:1 imports experiments.studies.probe"),
    ("experiments/data/hf.py", "from experiments.studies.other import f\n",
     "experiments.data.hf:1 imports experiments.studies.other"),
])
def test_a_planted_upward_import_is_reported(tmp_path, path, source, expected):
    plant(tmp_path, {**CLEAN, path: source})
    found = layer_violations(import_graph(str(tmp_path)))
    assert len(found) == 1 and found[0].startswith(expected), found


@pytest.mark.parametrize("files, circle", [
    ({"experiments/app/build.py": "from .train import evaluate\n"},                      # module level
     ["experiments.app.build", "experiments.app.train"]),
    ({"experiments/app/build.py": "def f():\n    from experiments.app.train import x\n"},   # lazy: counts
     ["experiments.app.build", "experiments.app.train"]),
    ({"energies/errors.py": "from . import TokenGraph\n"},                               # through a package __init__
     ["energies", "energies.errors", "energies.graph"]),
    ({"unfold/a.py": "from .b import x\n", "unfold/b.py": "from .c import y\n", "unfold/c.py": "import unfold.a\n"},
     ["unfold.a", "unfold.b", "unfold.c"]),
])
def test_a_planted_circle_is_reported(tmp_path, files, circle):
    plant(tmp_path, {**CLEAN, **files})
    assert cycles(import_graph(str(tmp_path))) == [circle]


def test_a_type_checking_import_is_no_edge(tmp_path):
    plant(tmp_path, {**CLEAN, "experiments/app/build.py": """\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .train import Trainer
        """})
    g = import_graph(str(tmp_path))
    assert g["experiments.app.build"] == [] and cycles(g) == []


@pytest.mark.parametrize("files, check, expected", [
    ({"experiments/train.py": "import sys\nfrom experiments.app import train as _m\nsys.modules[__name__] = _m\n"},
     rooms_without_code, "experiments.train holds no code"),
    ({"energies/pairwise.py": '"""Re-exports."""\nfrom .kernels import x, y\n__all__ = ["x", "y"]\n'},
     rooms_without_code, "energies.pairwise holds no code"),
    ({"energies/graph.py": 'from .errors import GraphError\n__all__ = ["GraphError", "_check"]\n'},
     private_exports, "energies.graph exports the private name '_check'"),
    ({"energies/banded.py": '@register_kernel("banded")\ndef run():\n    pass\n'},
     kernels_outside, "energies.banded:1 registers a kernel outside energies/kernels/"),
])
def test_a_planted_alias_private_export_or_stray_kernel_is_reported(tmp_path, files, check, expected):
    """Negative controls of the three house rules: what the planted file adds to the clean tree's report
    (the planted tree's own modules are one-line stand-ins, import-only by design)."""
    plant(tmp_path / "clean", CLEAN)
    plant(tmp_path / "planted", {**CLEAN, **files})
    found = sorted(set(check(str(tmp_path / "planted"))) - set(check(str(tmp_path / "clean"))))
    assert len(found) == 1 and found[0].startswith(expected), found
