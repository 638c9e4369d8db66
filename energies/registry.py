"""Registries for pluggable parts (graphs, penalties rho, steps), torchdeq-style."""
from typing import Callable, Dict, Optional


def registrar(table: Dict[str, object], attr: Optional[str] = None) -> Callable[[str], Callable]:
    """A ``register(name)`` decorator storing objects in ``table`` (and their ``name`` on ``attr``)."""

    def register(name: str):
        def deco(obj):
            table[name] = obj
            if attr is not None:
                setattr(obj, attr, name)
            return obj

        return deco

    return register
