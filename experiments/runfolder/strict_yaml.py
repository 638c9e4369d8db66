"""The project's one strict YAML reader: `load_yaml`.

Every YAML text the project reads (config files, ``key=value`` override values, the front matter of a
Hugging Face dataset card) goes through `load_yaml`, a strict safe loader: a key repeated in one
mapping (at any level; ``1``, ``1.0`` and ``true`` count as one key, as they would in the dict) is refused
naming the key, its path and both lines, instead of the last one silently winning (``model: {d: 16}`` then
``model: {heads: 3}`` would drop ``d``); nesting deeper than `MAX_YAML_DEPTH` levels (a flood of ``[``,
or aliases chained as deep) and a document that refers to itself through an alias are refused naming the line,
instead of a ``RecursionError``. Each is a `StrictYAMLError` (a ``yaml.YAMLError``), which the readers
turn into one `ConfigError` (or ``DataError``) line naming the file or the override.
"""
from __future__ import annotations

import reprlib

import yaml

from energies.checks import parse_float, parse_int

__all__ = ["load_yaml", "StrictYAMLError", "MAX_YAML_DEPTH", "show"]

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 6, 6, 80, 80, 40


def show(value) -> str:
    """A bounded repr for messages about YAML values and keys (the loader's and the config's).

    Args:
        value: any value read from YAML.

    Returns:
        Its repr, bounded: a YAML alias bomb or a 5,000-digit number prints in a few dozen characters.
    """
    return _REPR.repr(value)


#: deepest nesting of sequences and mappings a YAML text may have (a config is 3 levels deep, a dataset card
#: about 8); far below what would exhaust Python's recursion limit in the loader or in any later step
MAX_YAML_DEPTH = 64


class StrictYAMLError(yaml.YAMLError):
    """A YAML text `load_yaml` refuses: a repeated key, nesting deeper than `MAX_YAML_DEPTH`, a
    document that refers to itself. The message is one line naming the key or the line."""


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown line"


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses repeated keys, deep nesting and self-reference (`load_yaml`)."""

    _depth = 0

    def compose_node(self, parent, index):
        # the composer recurses once per level of text nesting: stop long before Python's recursion limit
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise StrictYAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels at "
                                      f"{_at(self.peek_event().start_mark)}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node):
        """A YAML integer in plain ASCII digits only (`energies.checks.parse_int`): YAML 1.1 also reads
        ``1_000``, ``0x10``, ``0b11`` and ``10:30`` (= 630), other spellings of one number."""
        _plain_number(node, parse_int)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        """A YAML float in plain ASCII (`energies.checks.parse_float`, or YAML's ``.inf``/``.nan``):
        YAML 1.1 also reads ``1_0.5`` and ``1:30.5`` (= 90.5)."""
        if node.value.lower().lstrip("+-") not in (".inf", ".nan"):
            _plain_number(node, parse_float)
        return super().construct_yaml_float(node)

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            self._check_height(node)
            self._check_keys(node)
        return node

    @staticmethod
    def _check_height(root) -> None:
        """Nesting through aliases (``b: &b [*a]``, ...) counts too; a node that holds itself is refused.
        Iterative, each node once (an alias bomb costs its node count, not its expanded size)."""
        height: dict = {}
        on_path: set = set()
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                on_path.discard(id(node))
                h = 1 + max((height[id(c)] for c in _children(node)), default=0)
                if h > MAX_YAML_DEPTH:
                    raise StrictYAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels (through aliases) at "
                                          f"{_at(node.start_mark)}")
                height[id(node)] = h
                continue
            if id(node) in height:
                continue
            if id(node) in on_path:
                raise StrictYAMLError(f"an alias at {_at(node.start_mark)} makes the document hold itself")
            on_path.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node) if id(c) not in height)

    def _check_keys(self, root) -> None:
        """No mapping repeats a key (equal as Python values: ``1``, ``1.0``, ``true`` are one key); merge keys
        (``<<``) are YAML's way to override on purpose and are not counted."""
        seen_nodes: set = set()
        stack = [(root, "")]
        while stack:
            node, path = stack.pop()
            if id(node) in seen_nodes:
                continue
            seen_nodes.add(id(node))
            if isinstance(node, yaml.SequenceNode):
                stack.extend((c, f"{path}[{i}]") for i, c in enumerate(node.value))
                continue
            if not isinstance(node, yaml.MappingNode):
                continue
            first: dict = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    stack.append((value_node, path))
                    continue
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                where = f"{path}.{name}" if path else name
                if isinstance(key_node, yaml.ScalarNode):
                    key = self.construct_object(key_node)
                    try:
                        earlier = first.setdefault(key, key_node)
                    except TypeError:          # unhashable: the constructor reports it
                        earlier = key_node
                    if earlier is not key_node:
                        also = "" if earlier.value == key_node.value else f" (written {show(earlier.value)} there)"
                        raise StrictYAMLError(f"duplicate key {show(where)} at {_at(key_node.start_mark)}, first "
                                              f"at {_at(earlier.start_mark)}{also}: a key may appear once in a "
                                              "mapping (the last one would silently win)")
                stack.append((value_node, where))


def _plain_number(node, parse) -> None:
    try:
        parse(node.value)
    except ValueError:
        raise StrictYAMLError(f"{node.value!r} at {_at(node.start_mark)} is not a number written in plain digits "
                              "(write it as 1000, 0.5 or 1e-3; or quote it for text)") from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def load_yaml(stream):
    """``yaml.safe_load`` of ``stream`` (text or an open file), strict: see the module docstring. Raises
    `StrictYAMLError` (or another ``yaml.YAMLError``) on text it refuses."""
    try:
        return yaml.load(stream, Loader=_StrictLoader)
    except RecursionError:          # a path not guarded above: still one error, never a traceback
        raise StrictYAMLError(f"nested too deeply (more than {MAX_YAML_DEPTH} levels)") from None
