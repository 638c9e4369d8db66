"""Alias of :mod:`experiments.studies.pyg_sbm`, where the code lives.

Kept because the command is documented: ``python -m experiments.pyg_sbm`` runs its ``main``, and an import of
``experiments.pyg_sbm`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import pyg_sbm as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
