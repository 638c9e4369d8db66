"""The project's import graph, read from the source with :mod:`ast` (nothing is imported), and its rules.

:func:`import_graph` maps every module of the project packages under a root folder to the project modules it
imports, with the line of each import. Every ``import`` statement counts, wherever it stands: at module level,
inside a function or method (a lazy import is still a dependency: it runs the first time the function does), in
a ``try`` block; only imports under ``if TYPE_CHECKING:`` are left out (they never run). Names given as strings
(``importlib.import_module(name)``, ``python -m NAME`` in a subprocess) are not imports and are not read.

An import names the deepest project module it reaches: ``from energies.graphs import window`` is an edge to
``energies.graphs``; ``from experiments import train`` to ``experiments.app.train`` (a module), ``from energies import
TokenGraph`` to ``energies`` (the package's ``__init__``). The parent packages that Python initialises on the
way are not edges of their own: a package's ``__init__`` re-exporting its submodules is the package, not a
dependency of every module that imports one of them.

:func:`layer_violations` checks the layers (:data:`RULES`); :func:`cycles` lists every import circle (strongly
connected component of more than one module; a module importing itself is not a circle).
"""
from __future__ import annotations

import ast
import os
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

#: the project's packages: what the graph is made of
PACKAGES = ("energies", "unfold", "convex", "experiments")

#: the application (what a user runs) and the studies (paper reproductions and measurements)
RUNFOLDER = ("experiments.runfolder",)
DATA = ("experiments.data",)
APP = ("experiments.app", "experiments.data")
STUDIES = ("experiments.studies",)

Edge = Tuple[str, int]            # (imported module, line)


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def find_modules(root: str, packages: Sequence[str] = PACKAGES) -> Dict[str, Tuple[str, bool]]:
    """``{module name: (file, is_package)}`` for every ``.py`` file of ``packages`` under ``root``."""
    found: Dict[str, Tuple[str, bool]] = {}
    for pkg in packages:
        top = os.path.join(root, pkg)
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            rel = os.path.relpath(folder, root).split(os.sep)
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                path = os.path.join(folder, f)
                if f == "__init__.py":
                    found[".".join(rel)] = (path, True)
                else:
                    found[".".join(rel + [f[:-3]])] = (path, False)
    return found


def _type_checking_lines(tree: ast.AST) -> Set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:`` (they never run)."""
    lines: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for sub in node.body:
                    for inner in ast.walk(sub):
                        if isinstance(inner, (ast.Import, ast.ImportFrom)):
                            lines.add(inner.lineno)
    return lines


def _deepest(name: str, modules: Dict[str, Tuple[str, bool]]) -> Optional[str]:
    """The deepest project module that the dotted ``name`` reaches (None: not the project's)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in modules:
            return candidate
    return None


def module_imports(module: str, source: str, modules: Dict[str, Tuple[str, bool]],
                   is_package: bool = False) -> List[Edge]:
    """The project modules imported by ``module`` (whose text is ``source``), each with its line."""
    tree = ast.parse(source)
    skip = _type_checking_lines(tree)
    package = module if is_package else module.rpartition(".")[0]
    edges: List[Edge] = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _deepest(alias.name, modules)
                if target:
                    edges.append((target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            for alias in node.names:
                target = _deepest(f"{base_name}.{alias.name}", modules) if alias.name != "*" else None
                target = target or _deepest(base_name, modules)
                if target:
                    edges.append((target, node.lineno))
    return edges


def import_graph(root: str, packages: Sequence[str] = PACKAGES) -> Dict[str, List[Edge]]:
    """``{module: [(imported project module, line), ...]}`` for every module of ``packages`` under ``root``."""
    modules = find_modules(root, packages)
    graph: Dict[str, List[Edge]] = {}
    for name, (path, is_pkg) in modules.items():
        with open(path, encoding="utf-8") as f:
            graph[name] = module_imports(name, f.read(), modules, is_pkg)
    return graph


#: (who, what it may import of the project, why); the first rule whose ``who`` matches a module applies
RULES: List[Tuple[Tuple[str, ...], Tuple[str, ...], str]] = [
    (("energies",), ("energies",), "energies imports nothing of the project"),
    (("unfold",), ("energies", "unfold"), "unfold imports only energies"),
    (("convex",), ("energies", "unfold", "convex"), "convex imports only energies and unfold"),
    (RUNFOLDER, ("energies", "unfold") + RUNFOLDER, "the run-folder safety modules import only the library"),
    (DATA, ("energies", "unfold", "convex") + RUNFOLDER + DATA, "the data package never imports the application"),
    (APP, ("energies", "unfold", "convex") + RUNFOLDER + APP, "the application never imports the studies"),
    (STUDIES, ("energies", "unfold", "convex") + RUNFOLDER + APP + STUDIES, "a study imports the library, the "
                                                                            "application and other studies"),
]


def layer_violations(graph: Dict[str, List[Edge]], rules=RULES) -> List[str]:
    """One line per import that breaks a rule: ``module:line imports target (rule)``."""
    bad = []
    for module, edges in sorted(graph.items()):
        for who, allowed, why in rules:
            if _within(module, who):
                for target, line in edges:
                    if not _within(target, allowed):
                        bad.append(f"{module}:{line} imports {target} ({why})")
                break
    return bad


def cycles(graph: Dict[str, List[Edge]]) -> List[List[str]]:
    """Every import circle: the strongly connected components of more than one module (Tarjan), sorted."""
    adj = {m: sorted({t for t, _ in edges if t != m and t in graph}) for m, edges in graph.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:                 # recursive: the graph is a few hundred modules deep at most
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return sorted(found)
