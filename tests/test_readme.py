"""The README's "Use it in your own model" block runs as written and prints what it says."""
import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def section_code(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    body = text[start:text.index("\n## ", start + 1)]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_use_it_in_your_own_model_block_runs_verbatim_and_reports_descent():
    code = section_code("Use it in your own model")
    claimed = re.search(r"# (descent \d+ increases in \d+ layer-steps)", code).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    printed = out.getvalue().strip().splitlines()[-1]
    assert printed == claimed                       # the comment in the README is what it prints
    assert printed.startswith("descent 0 increases")
