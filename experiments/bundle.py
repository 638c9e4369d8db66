"""Alias of :mod:`experiments.app.bundle`, where the code lives.

Kept because the module path is documented: an import of ``experiments.bundle`` gets that module itself (one
module object under both names)."""
import sys

from experiments.app import bundle as _module

sys.modules[__name__] = _module
