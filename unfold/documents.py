"""Reading a document file (YAML, JSON): one refusal for everything that can be wrong with it.

`read_document` is the one reader of the project's document files -- configs, run files, bundles' JSON and YAML:
a missing file, a folder, text that is not UTF-8, a document nested beyond the parser's recursion limit or one the
parser refuses all become the caller's typed error naming the file, never a traceback.
"""
from __future__ import annotations

import os
from typing import Callable

from energies.checks import one_line

__all__ = ["read_document"]


def read_document(path: str, parse: Callable, error: type, label: str, fmt: str, parse_errors: tuple = (ValueError,)):
    """``parse(open file)`` of the UTF-8 text file ``path``, every problem one ``error`` naming the file and why.

    YAML and JSON parsers recurse per level, so a document nested 5,000 deep (``[[[[...``) exhausts Python's
    recursion limit: it is refused like any other invalid document.

    Args:
        path: the file.
        parse: the parser, called with the open text file (``json.load``, a YAML loader).
        error: the typed error raised (``ConfigError``, ``CheckpointError``, ...).
        label: how the error names the file (e.g. "config file 'x.yaml'").
        fmt: the format's name in the error (``YAML``, ``JSON``).
        parse_errors: the exceptions of ``parse`` that mean an invalid document.

    Returns:
        What ``parse`` returns.

    Raises:
        UnfoldError: (the given ``error``) a missing file or a folder, text that is not UTF-8, a document nested too
            deeply, or a ``parse_errors`` exception.
    """
    if not os.path.isfile(path):
        raise error(f"{label} is missing" + (" (it is a folder)" if os.path.isdir(path) else " (no such file)"))
    try:
        with open(path, encoding="utf-8") as fh:
            return parse(fh)
    except UnicodeDecodeError as exc:
        raise error(f"{label} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise error(f"{label} is not valid {fmt} (nested too deeply: it exhausts the parser's recursion "
                    "limit)") from None
    except parse_errors as exc:
        raise error(f"{label} is not valid {fmt} ({one_line(exc, 200)})") from None
