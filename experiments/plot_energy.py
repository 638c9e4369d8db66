"""Alias of :mod:`experiments.app.plot_energy`, where the code lives.

Kept because the command is documented: ``python -m experiments.plot_energy`` runs its ``main``, and an import of
``experiments.plot_energy`` gets that module itself (one module object under both names)."""
import sys

from experiments.app import plot_energy as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
