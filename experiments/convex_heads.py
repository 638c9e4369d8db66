"""Alias of :mod:`experiments.studies.convex_heads`, where the code lives.

Kept because the command is documented: ``python -m experiments.convex_heads`` runs its ``main``, and an import of
``experiments.convex_heads`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import convex_heads as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
