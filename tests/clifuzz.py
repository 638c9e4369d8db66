"""Harness of the table-driven CLI fuzz tests (``tests/test_cli_*.py``).

:func:`expect_refusal` runs a CLI's ``main(argv)`` in process (a subprocess per case would cost a torch
import each) in a scratch working directory, and asserts the project's error contract
(:mod:`unfold.cli`): exit code 2, no traceback, exactly one line that holds ``error:``, that line is
the last one on stderr and names what is wrong (every string of ``names``), and -- unless the case is
allowed to write -- no file appears or changes anywhere under the scratch folder.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
from typing import Iterable, Optional, Sequence


#: bookkeeping that a refused command may touch: a run folder's lock file (its holder's pid)
IGNORED = (".lock",)


def snapshot(root: str) -> dict:
    """``{relative path: (size, mtime_ns)}`` of every file and folder under ``root`` (but :data:`IGNORED`)."""
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + [f for f in files if f not in IGNORED]:
            path = os.path.join(base, name)
            st = os.lstat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns) if name in files else "dir"
    return out


def run_cli(module: str, argv: Sequence[str], cwd: str) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``module.main(argv)`` run in ``cwd``; argparse's SystemExit is
    read as the exit code; any other exception escapes (that is a traceback a user would see)."""
    main = importlib.import_module(module).main
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def expect_refusal(module: str, argv: Sequence[str], cwd: str, names: Iterable[str] = (),
                   writes: bool = False, watch: Optional[Sequence[str]] = None) -> str:
    """Assert the error contract for one bad invocation (module docstring); returns the error line.
    ``watch``: more folders that must stay untouched (for example a data folder outside ``cwd``)."""
    folders = [cwd, *(watch or ())]
    before = [snapshot(f) for f in folders]
    code, out, err = run_cli(module, argv, cwd)
    lines = [line for line in err.splitlines() if line.strip()]
    where = f"{module} {' '.join(map(str, argv))}\nstderr:\n{err}"
    assert code == 2, f"exit {code}, expected 2: {where}"
    assert "Traceback" not in err and "Traceback" not in out, where
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], f"expected one last 'error:' line: {where}"
    line = errors[0]
    for name in names:
        assert str(name).lower() in line.lower(), f"{name!r} not named in {line!r}"
    if not writes:
        after = [snapshot(f) for f in folders]
        for f, a, b in zip(folders, before, after):
            assert a == b, f"files changed under {f}: {sorted(set(a.items()) ^ set(b.items()))}: {where}"
    return line
