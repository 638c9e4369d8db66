"""Alias of :mod:`experiments.app.sweep`, where the code lives.

Kept because the command is documented: ``python -m experiments.sweep`` runs its ``main``, and an import of
``experiments.sweep`` gets that module itself (one module object under both names)."""
import sys

from experiments.app import sweep as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
