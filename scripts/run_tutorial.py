"""Execute the tutorial (``docs/tutorial/tutorial.py``, a jupytext percent script) as a notebook with nbclient and
keep what it made: ``python scripts/run_tutorial.py [OUT_DIR]`` (default ``docs/tutorial``) writes the executed
``tutorial.ipynb`` and the figures its cells save. The test suite runs the same function into a temporary folder
(``tests/test_tutorial.py``), so the tutorial cannot rot."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "docs", "tutorial", "tutorial.py")


def execute(out_dir: str, timeout: int = 600):
    """Run every cell in a fresh ``python3`` kernel (working folder ``out_dir``, figures saved there through
    ``TUTORIAL_FIGURES``); write ``out_dir/tutorial.ipynb``; return the executed notebook. A cell that raises
    stops the run with nbclient's ``CellExecutionError`` (the cell and its traceback)."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    os.makedirs(out_dir, exist_ok=True)
    nb = jupytext.read(SOURCE)
    before = os.environ.get("TUTORIAL_FIGURES")
    os.environ["TUTORIAL_FIGURES"] = os.path.abspath(out_dir)      # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": os.path.abspath(out_dir)}}).execute()
    finally:
        if before is None:
            os.environ.pop("TUTORIAL_FIGURES", None)
        else:
            os.environ["TUTORIAL_FIGURES"] = before
    nbformat.write(nb, os.path.join(out_dir, "tutorial.ipynb"))
    return nb


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    execute(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "docs", "tutorial"))
