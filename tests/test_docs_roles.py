"""Docstrings and comments are Markdown, as the documentation site renders them: no Sphinx role (``:class:`X```,
``:func:``, ``:meth:``, ...; mkdocstrings shows them as literal text) in the packages or the pages, and no
development diary in the packages (an issue number, a link to ``../shared`` or ``NOTES.md`` outside the
repository, a "Before: ..." account of what the code did). A cross-reference is ``[`name`][package.name]`` to a
name the API reference renders, plain code otherwise (CONTRIBUTING.md)."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("energies", "unfold", "convex", "experiments")

#: a Sphinx/reST role: ``:name:`` or ``:domain:name:`` followed by a backquote
ROLE = re.compile(r"(?<![\w:`]):(?:[a-z]+:)?[a-z]+:`")
#: what a development diary leaves in code: issue numbers, links outside the repository, and a "Before: <what the
#: code did>" account (a "Before:" anywhere, a "(before:", a "before: " opening a sentence or a comment); a
#: parameter named ``before`` (``f(before: Tensor)``, an Args entry ``before: ...``) is not one
DIARY = re.compile(r"\bissues?\s+#?\d+|\.\./shared\b|\bNOTES\.md\b"
                   r"|(?-i:\bBefore:)|(?<!\w)\(before:|(?:[.!?;]|#)\s+(?-i:before):\s", re.IGNORECASE)

# converted next: application files written before the rule, still holding roles (or issue numbers); each is
# checked again once converted, and an entry that is clean already fails below until it is removed from this list
PENDING: set = set()


def _python_files():
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")


def _pages():
    yield "README.md"
    yield "CONTRIBUTING.md"
    for folder, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")


def _hits(path, pattern):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        return [f"{path}:{number}: {line.strip()[:100]}" for number, line in enumerate(fh, 1) if pattern.search(line)]


def _findings(path):
    return _hits(path, ROLE) + _hits(path, DIARY)


def test_the_patterns_flag_roles_and_diary_and_pass_markdown():
    """Negative control: every kind of role and of diary line is flagged; Markdown references and plain code are
    not."""
    for text in (":class:`TokenGraph`", "see :func:`~energies.get_rho`", ":meth:`Rho.value`", ":mod:`unfold`",
                 ":data:`KERNELS`", ":attr:`offsets`", ":py:func:`solve`", ":math:`x^2`", ":exc:`TokenError`"):
        assert ROLE.search(text), text
    for text in ("(issue 25)", "Issue #41", "issues 3", "../shared/NOTES.md", "see NOTES.md",
                 "Before: a NaN model was written as last.pt.", "refused (before: a RecursionError).",
                 "refused (Before: exit 0).", "refused (BEFORE: exit 0).", "is refused; before: it loaded.",
                 "The folder is refused. before: it loaded.", "# before: the lock was truncated"):
        assert DIARY.search(text), text
    for text in ("[`TokenGraph`][energies.TokenGraph]", "`energies.kernels`", "``{a: 1}``", "name: the spec",
                 "http://x:8080/`y`", "tissue 5", "key::`x`", "saved before the first checkpoint",
                 "refused (before the first checkpoint is written).", "Before the first step, the trace is empty.",
                 "def relative_decrease(before: torch.Tensor, after: torch.Tensor):",
                 "    before: ``(S, T)`` total energy of the layer before it.", "for name in set(table) - before:",
                 "the energy before: E_0, then E_1"):
        assert not ROLE.search(text) and not DIARY.search(text), text


def test_the_library_and_application_hold_no_role_and_no_diary():
    files = list(_python_files())
    assert len(files) > 100 and "unfold/encoders.py" in files and "energies/kernels/dispatch.py" in files
    found = [hit for path in files if path not in PENDING for hit in _findings(path)]
    assert not found, "Sphinx roles or diary lines (write Markdown: [`name`][package.name] or `name`):\n" + \
        "\n".join(found[:40])


def test_the_pending_list_only_names_files_still_to_convert():
    library = [path for path in PENDING if not path.startswith("experiments/")]
    assert not library, f"the library packages are converted; no file of theirs may be pending: {library}"
    stale = [path for path in sorted(PENDING)
             if not os.path.exists(os.path.join(ROOT, path)) or not _findings(path)]
    assert not stale, f"converted (or gone): remove from PENDING in {__file__}: {stale}"


def test_the_pages_hold_no_role():
    pages = list(_pages())
    assert "docs/api/energies.md" in pages and "README.md" in pages
    found = [hit for path in pages for hit in _hits(path, ROLE)]
    assert not found, "\n".join(found)


def test_the_tests_and_pages_hold_no_diary():
    """The tests and the pages state what they check and what the code does, not which issue asked for it; this
    file is left out (its negative control holds diary lines on purpose)."""
    tests = sorted(name for name in os.listdir(os.path.join(ROOT, "tests")) if name.endswith(".py"))
    assert len(tests) > 50 and "test_docs_roles.py" in tests
    found = [hit for name in tests if name != "test_docs_roles.py" for hit in _hits(f"tests/{name}", DIARY)]
    found += [hit for path in _pages() for hit in _hits(path, DIARY)]
    assert not found, "\n".join(found[:40])
