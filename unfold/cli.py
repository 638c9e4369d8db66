"""What every command-line entry point of the project shares: one way to fail.

`run_main` runs a CLI body and turns what can go wrong into one line on stderr and an exit code:

* a framework error ([`UnfoldError`][energies.UnfoldError], bad input) -> ``PROG: error: MESSAGE``, exit 2;
* an operating-system error (missing file, a folder where a file was expected, permission denied, disk full)
  -> ``PROG: error: MESSAGE (PATH)``, exit 2;
* Ctrl-C -> ``PROG: interrupted``, exit 130 (the shell's convention, 128 + SIGINT);
* anything else is a bug: ``PROG: internal error: TYPE: MESSAGE``, exit 1, with the traceback only when
  ``UNFOLD_DEBUG=1`` is set.

argparse ``type=`` converters for the checks every CLI repeats (`positive_int`, `finite_float`,
...) raise `argparse.ArgumentTypeError`, which argparse reports as
``PROG: error: argument --FLAG: ...`` with exit 2. A ``--device`` flag is checked by `unfold.devices.check_device`,
a document file read by `unfold.documents.read_document`.
"""
from __future__ import annotations

import argparse
import errno
import os
import pathlib
import sys
import tempfile
import traceback
from typing import Callable, Optional, Sequence

from energies.checks import NUMBER_RULES, one_line, parse_float, parse_int
from energies.errors import UnfoldError

from .plugins import add_import_arg, load_plugins

__all__ = ["run_main", "add_import_arg", "one_line", "folder_problem", "folder_arg", "output_folder_arg", "positive_int", "nonnegative_int", "seed_int", "finite_float",
           "positive_float", "nonnegative_float", "probability"]

DEBUG_ENV = "UNFOLD_DEBUG"


def _os_message(exc: OSError) -> str:
    reason = exc.strerror or (errno.errorcode.get(exc.errno, "") if exc.errno else "") or str(exc)
    path = exc.filename if exc.filename is not None else ""
    return f"{reason}: {path!s}" if path else one_line(exc)


def run_main(prog: str, body: Callable[[], int], argv: Optional[Sequence[str]] = None) -> int:
    """Run ``body()`` (which returns the exit code) with the project's error contract (module docstring).
    Plug-ins are loaded first, under the same contract (`unfold.plugins`): the entry-point group, then
    every ``--import MODULE`` / ``--import=MODULE`` of ``argv`` (default ``sys.argv[1:]``) before a bare ``--``
    (none for ``--help``)."""
    try:
        load_plugins(sys.argv[1:] if argv is None else argv)
        return body()
    except UnfoldError as exc:
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: {_os_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: one line, the traceback on request
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(f"{prog}: internal error: {type(exc).__name__}: {one_line(exc)} "
              f"(set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
        return 1


def _number(kind: Callable, text: str, ok: Callable, rule: str):
    try:                 # ASCII digits only: int() and float() also read other scripts' digits (energies.checks)
        value = (parse_int if kind is int else parse_float if kind is float else kind)(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
    return value


def any_int(text: str) -> int:
    """An integer written in ASCII digits (its range checked where it is used)."""
    return _number(int, text, lambda v: True, "an integer")


def any_float(text: str) -> float:
    """A number written in ASCII digits (its range checked where it is used)."""
    return _number(float, text, lambda v: True, "a number")


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "an integer >= 1")


def nonnegative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "an integer >= 0")


def seed_int(text: str) -> int:
    """A random seed: an integer in [0, 2**63 - 1] (what ``torch.Generator.manual_seed`` accepts)."""
    return _number(int, text, lambda v: 0 <= v < 2 ** 63, "an integer in [0, 2**63 - 1]")


def _float_rule(rule: str) -> Callable[[str], float]:
    """An argparse converter for a float obeying `energies.checks.NUMBER_RULES` ``[rule]`` (one
    definition of each numeric rule for constructors and command lines)."""
    ok, wording = NUMBER_RULES[rule]
    return lambda text: _number(float, text, ok, wording)


finite_float = _float_rule("finite")
positive_float = _float_rule("positive")
nonnegative_float = _float_rule("nonnegative")
probability = _float_rule("probability")


def folder_problem(path, writable: bool = False):
    """Why ``path`` cannot be used as a folder, or None when it can: it is empty or not a valid path, it
    exists and is not a folder, its nearest existing ancestor is not a folder (so it cannot be created), or
    (``writable``) that folder or ancestor cannot be written -- probed by creating and removing a temporary
    file, which is right for permission bits, read-only mounts and root alike."""
    if str(path) == "":
        return "is an empty path"
    if "\0" in str(path):
        return "is not a usable path (it holds a NUL byte)"
    try:
        p = pathlib.Path(path).expanduser()
        if p.exists() and not p.is_dir():
            return "is a file, not a folder"
        probe = p
        while not probe.exists() and probe.parent != probe:   # the nearest ancestor that exists
            probe = probe.parent
        if not probe.is_dir():
            return f"cannot be created: {probe} is a file, not a folder"
    except (OSError, ValueError, RuntimeError) as e:          # a NUL byte, a name too long, ~nouser ...
        return f"is not a usable path ({e})"
    if writable:
        try:
            with tempfile.TemporaryFile(dir=probe, prefix=".write-probe-"):
                pass
        except OSError as e:
            why = e.strerror or str(e)
            return f"is not writable ({why})" if probe == p else f"cannot be created: {probe} is not writable ({why})"
    return None


def folder_arg(text: str) -> str:
    """argparse ``type=``: a folder that exists or can be created (not a file); see `folder_problem`."""
    why = folder_problem(text)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text


def output_folder_arg(text: str) -> str:
    """argparse ``type=``: a folder that can be written (existing or to be created); see `folder_problem`."""
    why = folder_problem(text, writable=True)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text
