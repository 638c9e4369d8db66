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
import configparser
import importlib
import os
import textwrap

import pytest

from layering import PACKAGES, cycles, find_modules, import_graph, layer_violations

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def alias_problems(root: str, graph) -> list:
    """The alias modules directly in ``experiments`` (every ``.py`` there but ``__init__``) that do not import exactly
    their namesake in ``experiments.app`` or ``experiments.studies``, or that hold more than the alias."""
    bad = []
    for module, edges in sorted(graph.items()):
        parts = module.split(".")
        if len(parts) != 2 or parts[0] != "experiments" or module in ("experiments.app", "experiments.data",
                                                                       "experiments.studies"):
            continue
        targets = sorted({t for t, _ in edges})
        if targets not in ([f"experiments.app.{parts[1]}"], [f"experiments.studies.{parts[1]}"]):
            bad.append(f"{module} imports {targets}, not its one namesake in experiments.app or experiments.studies")
            continue
        with open(os.path.join(root, "experiments", parts[1] + ".py"), encoding="utf-8") as f:
            code = [line for line in f.read().split('"""')[-1].splitlines() if line.strip()]
        if len(code) > 6:
            bad.append(f"{module} holds {len(code)} lines of code: an alias holds the import and the forwarding only")
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
    assert ("experiments.app.bundle", "experiments.app.build") in edges         # inside load_model (lazy)
    assert ("energies.kernels.banded", "energies.kernels.registry") in edges
    assert ("energies.kernels.triton.pairwise", "energies.kernels.triton.rho") in edges
    assert ("experiments.studies.activations", "experiments.studies.spline_probe") in edges
    assert ("experiments.train", "experiments.app.train") in edges              # an alias


def test_each_layer_imports_only_what_it_may(graph):
    assert layer_violations(graph) == []


def test_the_aliases_hold_no_code(graph):
    assert alias_problems(ROOT, graph) == []


def test_no_import_circle(graph):
    assert cycles(graph) == []


def test_every_console_command_and_alias_resolves():
    """Each console script of setup.cfg names a module and a ``main`` that import; each alias is its home."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    scripts = [line.split("=", 1) for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines()]
    assert len(scripts) == 6
    for name, target in scripts:
        module, _, func = target.strip().partition(":")
        assert callable(getattr(importlib.import_module(module), func)), name
    for f in sorted(os.listdir(os.path.join(ROOT, "experiments"))):
        if f.endswith(".py") and f != "__init__.py":
            alias = importlib.import_module(f"experiments.{f[:-3]}")
            assert alias.__name__ in (f"experiments.app.{f[:-3]}", f"experiments.studies.{f[:-3]}"), f


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
    "unfold/steps.py": "from energies.graph import TokenGraph\n",
    "convex/__init__.py": "",
    "convex/heads.py": "from unfold import steps\nfrom energies import TokenGraph\n",
    "experiments/__init__.py": "",
    "experiments/train.py": "import sys\nfrom experiments.app import train as _module\nsys.modules[__name__] = _module\n",
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
    assert layer_violations(g) == [] and cycles(g) == [] and alias_problems(str(tmp_path), g) == []
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
    ("experiments/app/sweep.py", "from experiments import train\n", "experiments.app.sweep:1 imports experiments.train"),
    ("experiments/studies/depth.py", "from .. import train\n", "experiments.studies.depth:1 imports experiments.train"),
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


def test_a_type_checking_import_is_no_edge_and_an_alias_with_code_is_reported(tmp_path):
    plant(tmp_path, {**CLEAN, "experiments/app/build.py": """\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .train import Trainer
        """})
    g = import_graph(str(tmp_path))
    assert g["experiments.app.build"] == [] and cycles(g) == []
    plant(tmp_path, {"experiments/train.py": "import sys\nfrom experiments.app import build\n"})
    assert alias_problems(str(tmp_path), import_graph(str(tmp_path))) == [
        "experiments.train imports ['experiments.app.build'], not its one namesake in experiments.app or "
        "experiments.studies"]
    plant(tmp_path, {"experiments/train.py": "import sys\nfrom experiments.app import train as _m\n"
                                             + "".join(f"x{i} = {i}\n" for i in range(8))})
    assert alias_problems(str(tmp_path), import_graph(str(tmp_path)))[0].startswith("experiments.train holds 10 lines")
