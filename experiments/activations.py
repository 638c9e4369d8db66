"""Alias of :mod:`experiments.studies.activations`, where the code lives.

Kept because the command is documented: ``python -m experiments.activations`` runs its ``main``, and an import of
``experiments.activations`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import activations as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
