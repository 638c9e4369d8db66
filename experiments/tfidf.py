"""Alias of :mod:`experiments.app.tfidf`, where the code lives.

Kept because the command is documented: ``python -m experiments.tfidf`` runs its ``main``, and an import of
``experiments.tfidf`` gets that module itself (one module object under both names)."""
import sys

from experiments.app import tfidf as _module

if __name__ == "__main__":
    sys.exit(_module.main())
sys.modules[__name__] = _module
