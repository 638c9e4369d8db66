"""Execute the tutorial (``docs/tutorial/tutorial.py``, a jupytext percent script) as a notebook with nbclient and
keep what it made: the executed ``tutorial.ipynb`` and the figures its cells save.

    python scripts/run_tutorial.py                 # into a fresh temporary folder (printed)
    python scripts/run_tutorial.py OUT_DIR         # into OUT_DIR
    python scripts/run_tutorial.py --update-docs   # into docs/tutorial/, over the tracked notebook and figures

Writing into ``docs/tutorial/`` (tracked files) takes ``--update-docs``: an ``OUT_DIR`` that is that folder is
refused (exit 2, nothing written). The data the tutorial writes and trains on (its CSV, its run folders) goes to a
temporary folder of its own, removed when the run ends, failed or not. The test suite runs the same function into a
temporary folder (``tests/test_tutorial.py``), so the tutorial cannot rot."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs", "tutorial")
SOURCE = os.path.join(DOCS, "tutorial.py")


def execute(out_dir: str, timeout: int = 600):
    """Run every cell in a fresh ``python3`` kernel (working folder ``out_dir``, figures saved there through
    ``TUTORIAL_FIGURES``, its data in a temporary folder passed as ``TUTORIAL_WORK`` and removed afterwards); write
    ``out_dir/tutorial.ipynb``; return the executed notebook. A cell that raises stops the run with nbclient's
    ``CellExecutionError`` (the cell and its traceback)."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    os.makedirs(out_dir, exist_ok=True)
    nb = jupytext.read(SOURCE)
    with tempfile.TemporaryDirectory(prefix="unfold-tutorial-data-") as work:
        env = {"TUTORIAL_FIGURES": os.path.abspath(out_dir), "TUTORIAL_WORK": work}
        before = {k: os.environ.get(k) for k in env}
        os.environ.update(env)                      # the kernel inherits this process's environment
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": os.path.abspath(out_dir)}}).execute()
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    nbformat.write(nb, os.path.join(out_dir, "tutorial.ipynb"))
    return nb


def out_folder(out_dir, update_docs: bool) -> str:
    """The folder a command line writes into: ``docs/tutorial`` with ``update_docs``, else ``out_dir`` or a fresh
    temporary folder. Raises ValueError for an ``out_dir`` that is ``docs/tutorial`` without ``update_docs``, or
    for both given."""
    if update_docs:
        if out_dir is not None:
            raise ValueError("give OUT_DIR or --update-docs, not both")
        return DOCS
    if out_dir is None:
        return tempfile.mkdtemp(prefix="unfold-tutorial-")
    if os.path.realpath(out_dir) == os.path.realpath(DOCS):
        raise ValueError(f"{out_dir} is docs/tutorial, whose notebook and figures are tracked: pass --update-docs "
                         "to write over them, or another OUT_DIR")
    return out_dir


def main(argv=None) -> int:
    """The command line (module docstring); exit 0, or 2 with one ``error:`` line and nothing written."""
    p = argparse.ArgumentParser(prog="run_tutorial.py", description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="where to write (default: a fresh temporary folder)")
    p.add_argument("--update-docs", action="store_true",
                   help="write into docs/tutorial/, over the tracked notebook and figures")
    args = p.parse_args(argv)
    try:
        out = out_folder(args.out_dir, args.update_docs)
    except ValueError as exc:
        print(f"run_tutorial.py: error: {exc}", file=sys.stderr)
        return 2
    execute(out)
    print(f"the executed notebook and its figures are in {out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
