"""Alias of :mod:`experiments.app.checkpoint`, where the code lives.

Kept because the module path is documented: an import of ``experiments.checkpoint`` gets that module itself (one
module object under both names)."""
import sys

from experiments.app import checkpoint as _module

sys.modules[__name__] = _module
