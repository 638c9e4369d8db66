"""The API reference is generated from the public API's docstrings (``mkdocs.yml``: mkdocstrings, Google style), so
each public name of ``energies``, ``unfold`` and ``convex`` must carry sections the reference can render:

* a callable that takes arguments has ``Args:`` naming exactly its parameters (a class: those of its constructor;
  ``*args``/``**kwargs`` by their names), each with a description;
* a function that returns a value has ``Returns:``;
* a dataclass or named tuple (a record, built by the library and read by the user) has ``Attributes:`` naming its
  fields instead.

The docstrings are parsed by griffe, the parser the site itself uses, so what passes here is what renders.
The negative controls at the end feed the checker docstrings with each defect and show it is named.
"""
import ast
import dataclasses
import importlib
import inspect
import logging
import textwrap

import pytest
import torch

griffe = pytest.importorskip("griffe")

PACKAGES = ("energies", "unfold", "convex")


def _public():
    for pkg in PACKAGES:
        module = importlib.import_module(pkg)
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj):
                yield f"{pkg}.{name}", obj


def _is_record(obj) -> bool:
    return inspect.isclass(obj) and (dataclasses.is_dataclass(obj) or
                                     (issubclass(obj, tuple) and hasattr(obj, "_fields")))


def _fields(obj):
    return ([f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else list(obj._fields))


def _inherited_constructor(cls) -> bool:
    """Whether ``cls`` takes its constructor unchanged from outside the project (``torch.nn.Module``'s, which
    refuses arguments): nothing of the project's to document."""
    for base in cls.__mro__:
        if "__init__" in vars(base) or "__new__" in vars(base):
            return base.__module__.split(".")[0] not in PACKAGES
    return True


def _parameters(obj):
    """The parameter names a caller passes (``self``/``cls`` excluded), or None where there is no signature."""
    if inspect.isclass(obj) and _inherited_constructor(obj):
        return []
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters if p not in ("self", "cls")]


def _returns_value(func) -> bool:
    """True where the function's own body has ``return <value>`` or ``yield`` (nested functions not counted)."""
    if inspect.signature(func).return_annotation is None:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError):
        return False
    top = tree.body[0]

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, (ast.Yield, ast.YieldFrom)):
                return True
            if isinstance(child, ast.Return) and child.value is not None and not (
                    isinstance(child.value, ast.Constant) and child.value.value is None):
                return True
            if walk(child):
                return True
        return False
    return walk(top)


def _sections(doc: str):
    """griffe's Google-style sections of ``doc``, and the warnings it logged while parsing."""
    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Keep()
    log = logging.getLogger("griffe")
    log.addHandler(handler)
    try:
        sections = griffe.Docstring(doc).parse(griffe.Parser.google, warn_missing_types=False)
    finally:
        log.removeHandler(handler)
    return sections, records


def _named(sections, kind):
    names = []
    for s in sections:
        if s.kind.value == kind:
            names += [(item.name.lstrip("*"), (item.description or "").strip()) for item in s.value]
    return names


def problems(obj) -> list:
    """What the API reference would lack for ``obj``: each missing or surplus section entry, in words."""
    out = []
    doc = inspect.getdoc(obj) or ""
    if not doc.strip():
        return ["no docstring"]
    sections, warnings = _sections(doc)
    out += [f"griffe: {w}" for w in warnings]
    if _is_record(obj):
        documented = _named(sections, "attributes")
        names = [n for n, _ in documented]
        out += [f"field {f!r} not under Attributes:" for f in _fields(obj) if f not in names]
        out += [f"Attributes: names {n!r}, which is not a field" for n in names if n not in _fields(obj)]
        out += [f"Attributes: {n!r} has no description" for n, d in documented if not d]
        return out
    params = _parameters(obj)
    if params is not None:
        documented = _named(sections, "parameters")
        names = [n for n, _ in documented]
        out += [f"parameter {p!r} not under Args:" for p in params if p not in names]
        out += [f"Args: names {n!r}, which is not a parameter" for n in names if n not in params]
        out += [f"Args: {n!r} has no description" for n, d in documented if not d]
    if inspect.isfunction(obj) and _returns_value(obj) and not any(
            s.kind.value in ("returns", "yields") for s in sections):
        out.append("returns a value but has no Returns:")
    return out


@pytest.mark.parametrize("name,obj", list(_public()), ids=[n for n, _ in _public()])
def test_public_name_has_the_sections_the_reference_renders(name, obj):
    assert problems(obj) == [], f"{name}: " + "; ".join(problems(obj))


# --- negative controls: each defect is named ------------------------------------------------------------------

def _f_missing(x, y):
    """Adds.

    Args:
        x: the first.

    Returns:
        the sum.
    """
    return x + y


def _f_surplus(x):
    """Adds.

    Args:
        x: the first.
        z: not a parameter.

    Returns:
        the sum.
    """
    return x


def _f_no_returns(x):
    """Adds.

    Args:
        x: the first.
    """
    return x + 1


def _f_empty_description(x):
    """Adds.

    Args:
        x:

    Returns:
        x.
    """
    return x


def _f_good(x, *rest, **kw):
    """Adds.

    Args:
        x: the first.
        *rest: more.
        **kw: options.

    Returns:
        the sum.
    """
    return x


def _f_none(x) -> None:
    """Logs.

    Args:
        x: the value.
    """
    print(x)


class _Module(torch.nn.Module):
    """A module with torch's constructor: no arguments of its own to document.

    Args:
        *args: none (a surplus entry).
    """


@dataclasses.dataclass
class _Record:
    """A record.

    Attributes:
        a: one.
    """
    a: int
    b: int


def test_the_checker_names_each_defect():
    assert problems(_f_missing) == ["parameter 'y' not under Args:"]
    assert problems(_f_surplus) == ["Args: names 'z', which is not a parameter"]
    assert problems(_f_no_returns) == ["returns a value but has no Returns:"]
    assert "Args: 'x' has no description" in problems(_f_empty_description)
    assert problems(_Record) == ["field 'b' not under Attributes:"]
    assert problems(lambda q: q) == ["no docstring"]
    assert problems(_Module) == ["Args: names 'args', which is not a parameter"]


def test_the_checker_passes_complete_docstrings():
    assert problems(_f_good) == []
    assert problems(_f_none) == []
