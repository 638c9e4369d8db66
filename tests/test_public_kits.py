"""What a part may use is public and named: no private name crosses a module boundary in the project's packages.

A name that starts with one underscore (``_sizes``, not ``__all__``) belongs to its module. Another module that
needs it needs a public name with a docstring, in the kit made for its kind of part (`energies.graphs.kit` for a
graph builder, `energies.kernels.kit` for a kernel). [`private_crossings`][] reads every module with `ast` (nothing
is imported) and reports each use of another project module's private name:

* `from M import _name` (absolute or relative; a package's `__init__` importing from its own submodule is a
  boundary too: the package is a module of its own);
* `from P import _mod` where `P._mod` is a module (a private module);
* `M._name` where `M` is a name bound by `import M` / `import M as m` / `from P import M` to a project module.

A module using its own private names is fine. The negative controls plant a module pair in `tmp_path` that
crosses in each of these ways, and a pair that does not.
"""
import ast
import importlib
import inspect
import os
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from layering import PACKAGES, find_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: crossings left in the application files that other work owns, as ``"module:name"``: a list that may only shrink
#: (the library packages have none)
PENDING: set = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name that ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    package = (module if is_package else module.rpartition(".")[0]).split(".")
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _dotted(node: ast.AST) -> Optional[str]:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def module_crossings(module: str, source: str, modules: Dict[str, Tuple[str, bool]],
                     is_package: bool = False) -> List[str]:
    """``"module:line uses other._name"`` for each private name of another project module used by ``module``."""
    tree = ast.parse(source)
    bound: Dict[str, str] = {}            # local name -> project module it is bound to
    found: List[str] = []

    def report(line: int, owner: str, name: str) -> None:
        if owner != module:
            found.append(f"{module}:{line} uses {owner}.{name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    bound[alias.asname or alias.name] = alias.name
                    if alias.asname is None:       # `import a.b.c` binds `a`; the chain is read as dotted text
                        for k in range(1, alias.name.count(".") + 1):
                            head = ".".join(alias.name.split(".")[:k])
                            if head in modules:
                                bound.setdefault(head, head)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    bound[alias.asname or alias.name] = full
                    if _private(alias.name):
                        report(node.lineno, base, alias.name)
                elif base in modules and _private(alias.name):
                    report(node.lineno, base, alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            text = _dotted(node.value)
            if text is None:
                continue
            head, _, rest = text.partition(".")
            if head in bound:
                owner = bound[head] + ("." + rest if rest else "")
                if owner in modules:
                    report(node.lineno, owner, node.attr)
    return sorted(set(found))


def private_crossings(root: str, packages: Sequence[str] = PACKAGES) -> List[str]:
    """Every use of a project module's private name by another module of ``packages`` under ``root``.

    Args:
        root: The folder holding the packages.
        packages: The top-level packages to read.

    Returns:
        One line per use, ``"module:line uses owner._name"``, sorted.
    """
    modules = find_modules(root, packages)
    found: List[str] = []
    for name, (path, is_pkg) in sorted(modules.items()):
        with open(path, encoding="utf-8") as f:
            found += module_crossings(name, f.read(), modules, is_pkg)
    return found


def _pending_key(line: str) -> str:
    module = line.split(":", 1)[0]
    return f"{module}:{line.rsplit('.', 1)[1]}"


def test_no_private_name_crosses_a_module_boundary():
    found = private_crossings(ROOT)
    assert [f for f in found if _pending_key(f) not in PENDING] == []


def test_the_pending_list_only_names_crossings_still_there():
    library = [k for k in PENDING if k.split(".")[0] in ("energies", "unfold", "convex")]
    assert not library, f"the library packages cross no boundary; none of theirs may be pending: {library}"
    keys = {_pending_key(f) for f in private_crossings(ROOT)}
    stale = sorted(PENDING - keys)
    assert not stale, f"fixed (or gone): remove from PENDING in {__file__}: {stale}"


def plant(root, files: dict) -> None:
    for rel, text in files.items():
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
    for pkg in ("energies",):
        for folder, _, names in os.walk(os.path.join(str(root), pkg)):
            if "__init__.py" not in names:
                open(os.path.join(folder, "__init__.py"), "w").close()


OWNER = {"energies/graphs/registry.py": "def _sizes(n):\n    return n\n\ndef sizes(n):\n    return _sizes(n)\n"}


@pytest.mark.parametrize("user, expected", [
    ("from energies.graphs.registry import _sizes\n", "energies.graphs.window:1 uses energies.graphs.registry._sizes"),
    ("from .registry import _sizes as s\n", "energies.graphs.window:1 uses energies.graphs.registry._sizes"),
    ("from ..graphs.registry import _sizes\n", "energies.graphs.window:1 uses energies.graphs.registry._sizes"),
    ("from . import registry\nx = registry._sizes\n", "energies.graphs.window:2 uses energies.graphs.registry._sizes"),
    ("import energies.graphs.registry as r\nx = r._sizes(1)\n",
     "energies.graphs.window:2 uses energies.graphs.registry._sizes"),
    ("import energies.graphs.registry\nx = energies.graphs.registry._sizes(1)\n",
     "energies.graphs.window:2 uses energies.graphs.registry._sizes"),
    ("def f():\n    from energies.graphs.registry import _sizes\n    return _sizes\n",
     "energies.graphs.window:2 uses energies.graphs.registry._sizes"),
])
def test_a_planted_crossing_is_reported(tmp_path, user, expected):
    plant(tmp_path, {**OWNER, "energies/graphs/window.py": user})
    assert private_crossings(str(tmp_path), ("energies",)) == [expected]


def test_a_package_face_importing_a_private_name_is_a_crossing(tmp_path):
    plant(tmp_path, {**OWNER, "energies/graphs/__init__.py": "from .registry import _sizes, sizes\n"})
    assert private_crossings(str(tmp_path), ("energies",)) == [
        "energies.graphs:1 uses energies.graphs.registry._sizes"]


def test_a_private_module_is_a_private_name(tmp_path):
    plant(tmp_path, {"energies/_impl.py": "x = 1\n", "energies/user.py": "from energies import _impl\n"})
    assert private_crossings(str(tmp_path), ("energies",)) == ["energies.user:1 uses energies._impl"]


def test_public_names_own_privates_and_dunders_pass(tmp_path):
    """The clean pair: public names across, privates at home, ``__version__``-style names, a non-project module."""
    plant(tmp_path, {**OWNER, "energies/graphs/window.py": """\
        import os
        from .registry import sizes
        from . import registry
        def _own():
            return sizes(1) + registry.sizes(2)
        x = _own() + len(registry.__name__) + len(os._exit.__name__)
        """})
    assert private_crossings(str(tmp_path), ("energies",)) == []


#: the public modules that say what a part may use: a graph builder (the kit), a kernel (registry, guard, lse)
KITS = ("energies.graphs.kit", "energies.kernels.registry", "energies.kernels.guard", "energies.kernels.lse")


def _top_level_names(source: str) -> List[str]:
    """The names a module's own top-level statements define (functions, classes, assignments), not its imports."""
    names = []
    for st in ast.parse(source).body:
        if isinstance(st, (ast.FunctionDef, ast.ClassDef)):
            names.append(st.name)
        elif isinstance(st, (ast.Assign, ast.AnnAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
    return names


@pytest.mark.parametrize("name", KITS)
def test_each_kit_lists_and_documents_what_it_offers(name):
    """``__all__`` lists every public name the kit defines, and each callable has the Args/Returns the API
    reference renders (`tests/test_api_docstrings.py`'s checker)."""
    from test_api_docstrings import problems
    module = importlib.import_module(name)
    defined = sorted(n for n in _top_level_names(inspect.getsource(module)) if not n.startswith("_"))
    assert sorted(module.__all__) == defined
    bad = {n: problems(getattr(module, n)) for n in module.__all__ if callable(getattr(module, n))}
    assert {n: p for n, p in bad.items() if p} == {}
