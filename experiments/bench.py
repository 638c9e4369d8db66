"""Alias of :mod:`experiments.studies.bench`, where the code lives.

Kept because the command is documented: ``python -m experiments.bench`` runs its ``main``, and an import of
``experiments.bench`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import bench as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
