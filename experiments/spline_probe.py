"""Alias of :mod:`experiments.studies.spline_probe`, where the code lives.

Kept because the command is documented: ``python -m experiments.spline_probe`` runs its ``main``, and an import of
``experiments.spline_probe`` gets that module itself (one module object under both names)."""
import sys

from experiments.studies import spline_probe as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
