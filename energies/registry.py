"""Registries for pluggable parts (graphs, penalties rho, kernels, steps, encoders, heads, losses), torchdeq-style:
one shape for every kind, `Registry` -- a dict of name -> part with ``register(name)``, ``lookup(name)``,
``names()`` and ``check(name)``, and one wording for an unknown name (``unknown KIND 'x'; valid: [...]``).

A name is taken once: registering a name already in a registry (a plug-in's ``exp``, a second ``edges``) is refused
with the registry's typed error naming the registry and the name (`claim`), never a silent replacement -- a
replaced entry would reach some paths and not others (caches keyed by name, parts built before the import). The
same object registered again under its own name is a no-op (a module imported twice under one name).

A name that is an alias of a registered part (``softmax``, the rho registry's other name for ``exp``:
`Registry.add_aliases`) or that the registry's specs cannot reach (``reserved``: a name holding ``:``, which
separates a spec's arguments; a graph name ending in ``.npy``, which names a file) is refused the same way: no
override exists, a plug-in takes a new name."""
from typing import Callable, Dict, List, Mapping, Optional, Type

from .errors import UnfoldError


def claim(table: Dict[str, object], name, obj, registry: str, error: Type[UnfoldError] = UnfoldError) -> bool:
    """Check that ``name`` may be given ``obj`` in ``table`` (the registry called ``registry`` in messages): a
    non-empty string not taken by another object. Returns False where ``table[name]`` already is ``obj`` (nothing to
    do), True where the caller should store it; raises ``error`` naming the registry and the name otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise error(f"{registry}: a name must be a non-empty string, got {name!r}")
    if name in table:
        if table[name] is obj or table[name] == obj:
            return False
        raise error(f"{registry}: the name {name!r} is already registered (to {_what(table[name])}); a part cannot "
                    f"replace another -- register {_what(obj)} under a new name")
    return True


def _what(obj) -> str:
    """``module.qualname`` of a registered object (of a kernel's ``run``), for messages."""
    obj = getattr(obj, "run", obj) if isinstance(obj, tuple) else obj
    name, module = getattr(obj, "__qualname__", None), getattr(obj, "__module__", None)
    return f"{module}.{name}" if name and module else type(obj).__name__


def _reserved_name(name: str, aliases: Mapping[str, str], reserved: Optional[Callable[[str], Optional[str]]]
                   ) -> Optional[str]:
    """Why ``name`` cannot be registered whatever the table holds (an alias, a name holding ``:``, what
    ``reserved(name)`` says), or None."""
    if name in aliases:
        return f"{name!r} is an alias of {aliases[name]!r}, which it must keep naming"
    if ":" in name:
        return f"{name!r} holds ':', which separates a spec's arguments (the name could never be selected)"
    if name != name.strip():
        return f"{name!r} begins or ends with white space"
    return reserved(name) if reserved is not None else None


def registrar(table: Dict[str, object], attr: Optional[str] = None, registry: str = "registry",
              error: Type[UnfoldError] = UnfoldError, aliases: Optional[Mapping[str, str]] = None,
              reserved: Optional[Callable[[str], Optional[str]]] = None) -> Callable[[str], Callable]:
    """A ``register(name)`` decorator storing objects in ``table`` (and their ``name`` on ``attr``). A name already
    taken (`claim`), an alias of ``aliases`` (read when ``register`` is called: a live mapping), a name
    holding ``:`` or one ``reserved(name)`` gives a reason for, or an object already registered under another
    name (its ``attr`` would be renamed), is refused with ``error`` naming ``registry`` and the name."""
    aliases = {} if aliases is None else aliases

    def register(name: str):
        """``@register("name")``: stores the decorated part under ``name`` in this registry (``register_rho``,
        ``register_step``, ``register_encoder``, ``register_head``, ``register_loss``, ... are each one registry's
        ``register``), after which every spec, config and CLI that takes a part of this kind accepts ``name``.

        A name is taken once (`claim`): a second part under a taken name, or one part under a second name,
        is refused; the same part registered again under its own name is a no-op.

        Args:
            name: the part's name, a non-empty string not already taken in this registry.

        Returns:
            The decorator: it stores the part, sets the part's name attribute (``name`` for penalties, ``kind``
            for steps, ...) to ``name`` where the registry has one, and returns the part unchanged.

        Raises:
            UnfoldError: the registry's own typed subclass (``EnergyError``, ``StepError``, ``ConfigError``, ...),
                naming the registry and the name, for an empty or non-string name, a taken name, an alias of
                another part or a name the registry reserves (one holding ``:``), or a part already registered
                under another name.
        """
        claim({}, name, None, registry, error)              # a valid name, checked before the body runs
        why = _reserved_name(name, aliases, reserved)
        if why is not None:
            raise error(f"{registry}: the name {why}; a part cannot take it -- register it under a new name")

        def deco(obj):
            if not claim(table, name, obj, registry, error):
                return obj
            if attr is not None:
                own = vars(obj).get(attr) if hasattr(obj, "__dict__") else None
                if isinstance(own, str) and table.get(own) is obj:
                    raise error(f"{registry}: {_what(obj)} is already registered as {own!r}; registering it again "
                                f"as {name!r} would rename it -- subclass it for a second name")
            table[name] = obj
            if attr is not None:
                setattr(obj, attr, name)
            return obj

        return deco

    return register


class Registry(dict):
    """The registry of one kind of part (``kind``: ``"rho"``, ``"graph"``, ``"pairwise kernel"``, ...): a dict of
    name -> part, in registration order, with the one refusal of every kind.

    Args:
        kind: what the parts are, as messages name them (``unknown {kind} 'x'; valid: [...]``).
        error: the typed error of the kind's layer ([`EnergyError`][energies.EnergyError], ``StepError``, ...).
        attr: the attribute that `register` sets on a registered class to its name (``"name"``, ``"kind"``),
            or None.
        where: the import path of the table, for messages (``"energies.rho.RHOS"``).
        reserved: ``reserved(name)``: why a name cannot be registered (the kind's specs could not select it), or
            None where it can.
    """

    def __init__(self, kind: str, error: Type[UnfoldError] = UnfoldError, attr: Optional[str] = None,
                 where: str = "", reserved: Optional[Callable[[str], Optional[str]]] = None):
        super().__init__()
        self.kind, self.error, self.attr = kind, error, attr
        self.label = f"{kind} registry" + (f" ({where})" if where else "")
        self.aliases: Dict[str, str] = {}
        self.reserved = reserved
        self.register = registrar(self, attr, self.label, error, self.aliases, reserved)

    def __setitem__(self, name, part) -> None:
        """A part stored directly (``REGISTRY[name] = part``, as ``register`` and a kernel's registration do): an
        alias or a reserved name is refused as `register` refuses it (a replaced alias would change what
        ``softmax`` means for every spec)."""
        why = _reserved_name(name, self.aliases, self.reserved) if isinstance(name, str) else None
        if why is not None:
            raise self.error(f"{self.label}: the name {why}; a part cannot take it -- register it under a new name")
        super().__setitem__(name, part)

    def update(self, *args, **kwargs) -> None:
        """``dict.update``, each name checked as `__setitem__` checks it (the dict's own update would skip it)."""
        for name, part in dict(*args, **kwargs).items():
            self[name] = part

    def setdefault(self, name, part=None):
        """``dict.setdefault``, a new name checked as `__setitem__` checks it."""
        if name not in self:
            self[name] = part
        return self[name]

    def add_aliases(self, aliases: Mapping[str, str]) -> Dict[str, str]:
        """Declare other names of registered parts (``{"softmax": "exp"}``): mapped by the kind's spec reader, and
        from then on refused to `register` (no part may take an alias: it would change what the alias
        means).

        Args:
            aliases: ``{alias: registered name}``; an alias already registered as a part is refused.

        Returns:
            This registry's alias table (a live dict: the kind's module exports it).
        """
        for alias, name in aliases.items():
            if not isinstance(alias, str) or not alias or alias in self:
                raise self.error(f"{self.label}: the alias {alias!r} is empty or already a registered part")
            self.aliases[alias] = name
        return self.aliases

    def names(self) -> List[str]:
        """The registered names, in registration order."""
        return list(self)

    def check(self, name, extra: str = "", error: Optional[Type[UnfoldError]] = None) -> str:
        """``name`` if it is registered, else ``error`` (default: the kind's): ``unknown {kind} 'name'; valid:
        [...]`` (sorted), followed by ``extra`` (e.g. what else is accepted)."""
        if not isinstance(name, str) or name not in self:
            raise (error or self.error)(f"unknown {self.kind} {name!r}; valid: {sorted(self)}{extra}")
        return name

    def lookup(self, name):
        """The part registered as ``name``, or `check`'s refusal (``get`` stays the plain dict's)."""
        return self[self.check(name)]
