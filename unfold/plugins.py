"""Plug-ins: modules that register parts by name (rho, energy terms, graphs, kernels, encoders) before a
command line reads its options or its config.

A plug-in is an ordinary Python module whose import registers its parts with the library's registries
(``@energies.rho.register_rho("myrho")``, ``@energies.graphs.register_graph("mygraph")``, ...). Two ways load one:

* ``--import MODULE`` on any command line (`add_import_arg`; repeatable), or `import_plugins`
  from Python. The current folder is importable, as under ``python -m``: ``--import myplug`` finds
  ``./myplug.py``.
* an installed package that declares a module in the entry-point group `ENTRY_POINT_GROUP`
  (`load_entry_points`): every command line loads those with no option, unless the environment variable
  `NO_PLUGINS_ENV` (``UNFOLD_NO_PLUGINS``) is ``1`` (also ``true``/``yes``; ``0``, ``false``, ``no`` or
  empty: loaded; any other value is refused, so that a typo never loads them silently). ``--import`` still
  imports what it names.

A plug-in's output never reaches standard output: while a plug-in module is imported, ``sys.stdout`` is standard
error (`plugin_output`), and the commands whose standard output is a result (``unfold-predict``,
``python -m unfold.check``) run the plug-in's code (a penalty, a graph builder) under the same redirection and
write their result to the standard output they saved first -- so ``--json`` output is the program's JSON only.
(A plug-in is code: one that writes to file descriptor 1 itself is not stopped.)

`unfold.cli.run_main` loads both before a command's body runs, and the ``--import`` option itself
imports its module while the arguments are parsed, so a command called in process with an explicit argument
list (``main([...])``) loads it too. A plug-in that cannot be found or fails on import -- any exception, and also
``SystemExit`` (``sys.exit(...)`` in the module) or ``KeyboardInterrupt`` raised by its import -- is a
[`ConfigError`][energies.ConfigError]: one line naming the module and the reason (exit 2 on a command line, before
the command writes anything).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import os
import re
import sys
from typing import Iterable, List, Set

from energies.checks import one_line
from energies.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "IMPORT_HELP", "NO_PLUGINS_ENV", "load_entry_points", "import_plugins",
           "add_import_arg", "import_args", "load_plugins", "entry_points_disabled", "plugin_output"]

#: the entry-point group an installed package declares its plug-in modules in
ENTRY_POINT_GROUP = "unfolded_transformers.plugins"
#: the environment variable that, set to 1, keeps the entry-point group's plug-ins from loading
NO_PLUGINS_ENV = "UNFOLD_NO_PLUGINS"

IMPORT_HELP = ("import MODULE first (repeatable): a plug-in that registers rho, energy terms, graphs, kernels or "
               f"encoders by name; modules of the entry-point group {ENTRY_POINT_GROUP} are loaded too (not with "
               f"{NO_PLUGINS_ENV}=1)")

_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

_entry_points_loaded = False
_imported: Set[str] = set()


def _reason(exc: BaseException) -> str:
    """Why an import failed, in one line: a missing module's own message, else the type and message (a
    ``sys.exit`` or an interrupt raised by the module's own code named as such)."""
    if isinstance(exc, SystemExit):
        return (f"the module called sys.exit({_text(repr, exc.code)}) on import (SystemExit); a plug-in only "
                "registers parts, it must not end the command")
    if isinstance(exc, KeyboardInterrupt):
        return "KeyboardInterrupt raised on import"
    if isinstance(exc, ModuleNotFoundError):
        return _text(one_line, exc)
    if isinstance(exc, SyntaxError):
        where = f" ({os.path.basename(exc.filename or '?')}, line {exc.lineno})" if exc.lineno else ""
        return f"SyntaxError: {exc.msg}{where}"
    return f"{type(exc).__name__}: {_text(one_line, exc)}"


def _text(show, value) -> str:
    """``show(value)`` in one line of at most 500 characters; a value whose ``str``/``repr`` raises is named by its
    type (the plug-in's exception must not turn the refusal into an internal error)."""
    try:
        return one_line(show(value), 500)
    except BaseException:   # noqa: B036 (anything the plug-in's __str__ raises)
        return f"<{type(value).__name__} that cannot be shown>"


def plugin_output():
    """Where a plug-in's prints go: standard error. A context manager (``contextlib.redirect_stdout(sys.stderr)``)
    under which plug-ins are imported, and under which a command whose standard output is its result runs the
    plug-ins' code, writing the result to the standard output it saved before entering.

    Returns:
        The context manager; ``sys.stdout`` is standard error inside it and restored on leaving.
    """
    return contextlib.redirect_stdout(sys.stderr)


def entry_points_disabled() -> bool:
    """Whether `NO_PLUGINS_ENV` keeps the entry-point group from loading.

    Returns:
        True for ``1``, ``true`` or ``yes`` (any case, spaces ignored), False when unset, empty, ``0``, ``false``
        or ``no``.

    Raises:
        ConfigError: any other value, named (a typo must not load the plug-ins it meant to keep out).
    """
    value = os.environ.get(NO_PLUGINS_ENV)
    text = (value or "").strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"environment variable {NO_PLUGINS_ENV}={value!r}: use 1 to keep the entry-point plug-ins "
                      f"({ENTRY_POINT_GROUP}) from loading, or 0 (or leave it unset) to load them")


def load_entry_points() -> List[str]:
    """Import every module of the entry-point group `ENTRY_POINT_GROUP` (once per process; none where
    `entry_points_disabled`), their prints sent to standard error (`plugin_output`); returns the names
    of the entry points loaded. One that fails raises a [`ConfigError`][energies.ConfigError] naming it and why."""
    global _entry_points_loaded
    if _entry_points_loaded or entry_points_disabled():
        return []
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = f" of {dist.name} {dist.version}" if dist is not None else ""
        try:
            with plugin_output():
                ep.load()
        except BaseException as exc:    # a plug-in's import may raise anything, sys.exit and interrupts included:
            # one line naming it, exit 2, never a traceback nor an exit code chosen by the plug-in
            raise ConfigError(f"plug-in entry point {ep.name!r} = {ep.value!r}{origin} (group {ENTRY_POINT_GROUP}) "
                              f"failed to load: {_reason(exc)}") from None
        loaded.append(ep.name)
    _entry_points_loaded = True
    return loaded


def import_plugins(names: Iterable[str]) -> List[str]:
    """Import each module of ``names`` (dotted module names, each once per process) with the current folder
    importable, their prints sent to standard error (`plugin_output`); returns the names imported now. A
    name that is not a module name, or a module that is not found or raises on import, is a
    [`ConfigError`][energies.ConfigError] naming it and why (``--import NAME: REASON``)."""
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):   # a str would be imported letter by letter
        raise ConfigError(f"import_plugins needs a list of module names, got {names!r}")
    done = []
    for name in names:
        if isinstance(name, str) and name in _imported:
            continue
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ConfigError(f"--import {name!r}: not a Python module name (a dotted name such as myplugin or "
                              "mypackage.plugins, without a path or .py)")
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            with plugin_output():
                importlib.import_module(name)
        except BaseException as exc:    # ImportError, SyntaxError, whatever the module raises, sys.exit(...) and
            # KeyboardInterrupt included: the refusal naming the module, never the plug-in's own exit code
            hint = f" (give the module's name, not its file: --import {name[:-3]})" if name.endswith(".py") else ""
            raise ConfigError(f"--import {name}: {_reason(exc)}{hint}") from None
        _imported.add(name)
        done.append(name)
    return done


class _ImportAction(argparse.Action):
    """``--import MODULE``: appended to ``plugins`` (argparse's ``append``) and imported at once (entry points
    first), so that a ``main(argv)`` called in process loads it before its body reads a registry. A failure
    exits 2 with one ``PROG: error: ...`` line, like `unfold.cli.run_main`."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), values])
        try:
            load_entry_points()
            import_plugins([values])
        except ConfigError as exc:
            parser.exit(2, f"{parser.prog}: error: {one_line(exc)}\n")


def add_import_arg(parser: argparse.ArgumentParser, subcommand: bool = False) -> argparse.ArgumentParser:
    """Add ``--import MODULE`` (dest ``plugins``, a list) to ``parser``; returns the parser. ``subcommand``:
    the parser of a subcommand whose parent has the option too (its default then leaves the parent's list;
    modules named after the subcommand replace it in ``plugins``, and every one is imported either way)."""
    parser.add_argument("--import", dest="plugins", action=_ImportAction, metavar="MODULE",
                        default=argparse.SUPPRESS if subcommand else [], help=IMPORT_HELP)
    return parser


def import_args(argv: Iterable) -> List[str]:
    """The modules named by ``--import X`` / ``--import=X`` in an argument list, up to a bare ``--``."""
    argv = [a if isinstance(a, str) else None for a in argv]
    names = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--import" and i + 1 < len(argv) and argv[i + 1] is not None:
            names.append(argv[i + 1])
        elif arg is not None and arg.startswith("--import="):
            names.append(arg[len("--import="):])
    return names


def load_plugins(argv: Iterable) -> List[str]:
    """What `unfold.cli.run_main` does first: load the entry-point group, then import every
    ``--import`` module of ``argv`` (`import_args`); returns the modules imported now. Nothing is
    loaded for ``-h`` / ``--help``, so that help shows even while an installed plug-in is broken."""
    argv = list(argv)
    options = argv[:argv.index("--")] if "--" in argv else argv
    if "-h" in options or "--help" in options:
        return []
    load_entry_points()
    return import_plugins(import_args(argv))
