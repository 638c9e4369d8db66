"""The README's and the documentation's library examples run as written and print what they say."""
import contextlib
import io
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LIBRARY = ROOT / "docs" / "library.md"


def section_code(path: pathlib.Path, heading: str) -> str:
    """The first python block after the heading ``heading`` (any level) of ``path``."""
    text = path.read_text(encoding="utf-8")
    start = re.search(rf"^#+ {re.escape(heading)}\n", text, re.M).end()
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def _run(code: str, where: str) -> list:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), {"__name__": "docs"})
    return out.getvalue().strip().splitlines()


def test_use_it_in_your_own_model_block_runs_verbatim_and_reports_descent():
    code = section_code(LIBRARY, "Use it in your own model")
    claimed = re.search(r"# (descent \d+ increases in \d+ layer-steps)", code).group(1)
    printed = _run(code, str(LIBRARY))[-1]
    assert printed == claimed                       # the comment in the page is what it prints
    assert printed.startswith("descent 0 increases")


def test_the_readme_library_block_runs_verbatim_and_prints_its_claim():
    code = section_code(README, "The library in ten lines")
    claimed = re.search(r"# (0 increases in \d+ layer-steps)", code).group(1)
    lines = _run(code, str(README))
    assert lines[0] == claimed
    assert len(lines) == 2 and lines[1].startswith("{")


def test_the_readme_is_short():
    """The README is the two commands, a tour and links (at most 300 lines); the rest is in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


#: a block of docs/library.md marked to run, and the ``text`` block after it: what it prints
RUN_BLOCK = re.compile(r"<!-- run -->\n```python\n(.*?)```\n\n```text\n(.*?)\n```\n", re.S)


def test_the_library_page_marked_blocks_print_what_the_page_shows():
    """Every ``<!-- run -->`` python block of docs/library.md (the energy trace read by term and by layer) runs as
    written and prints, line for line, the ``text`` block shown after it."""
    found = RUN_BLOCK.findall(LIBRARY.read_text(encoding="utf-8"))
    assert found, "no marked block"
    for code, shown in found:
        assert _run(code, str(LIBRARY)) == shown.splitlines()
