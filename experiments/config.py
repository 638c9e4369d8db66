"""Alias of :mod:`experiments.app.config`, where the code lives.

Kept because the module path is documented: an import of ``experiments.config`` gets that module itself (one
module object under both names)."""
import sys

from experiments.app import config as _module

sys.modules[__name__] = _module
