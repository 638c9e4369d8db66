"""Alias of :mod:`experiments.studies.variants`, where the code lives.

Kept because the command is documented: ``python -m experiments.variants`` runs its ``main``, and an import of
``experiments.variants`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import variants as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
