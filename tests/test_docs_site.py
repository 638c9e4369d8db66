"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or an unresolvable
API reference fails the suite), and its API reference lists every public name of ``energies``, ``unfold`` and
``convex`` (their ``__all__``)."""
import importlib
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


def _build(root, site):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(root, "mkdocs.yml"),
                           "-d", str(site)], cwd=root, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    proc = _build(ROOT, site)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return site


@pytest.mark.parametrize("package", ["energies", "unfold", "convex"])
def test_the_api_reference_lists_every_public_name(site, package):
    module = importlib.import_module(package)
    html = (site / "api" / package / "index.html").read_text()
    anchors = set(re.findall(r'id="([\w.]+)"', html))
    missing = [name for name in module.__all__ if f"{package}.{name}" not in anchors]
    assert not missing, missing
    assert len(module.__all__) >= 10


def test_every_page_of_the_nav_is_built(site):
    import yaml

    with open(os.path.join(ROOT, "mkdocs.yml")) as fh:
        config = yaml.safe_load(fh)

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(config["nav"]):
        built = site / (page[:-3] + "/index.html" if not page.endswith("index.md") else page[:-3] + ".html")
        assert built.exists(), page


def test_a_broken_link_fails_the_build(tmp_path):
    """Negative control of --strict: the same site with one link to a page that does not exist is refused."""
    copy = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "docs"), copy / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), copy / "mkdocs.yml")
    for package in ("energies", "unfold", "convex"):     # the API pages read the packages from the copy's root
        os.symlink(os.path.join(ROOT, package), copy / package)
    with open(copy / "docs" / "getting-started.md", "a") as fh:
        fh.write("\nSee [the missing page](no-such-page.md).\n")
    proc = _build(str(copy), tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr


def test_the_built_site_shows_no_sphinx_role(site):
    """mkdocstrings renders Markdown: a Sphinx role left in a docstring would show as ``:class:<code>X</code>``."""
    role = re.compile(r"(?<![\w:]):(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|math|ref):(?:<code>|`)")
    pages = sorted(site.rglob("*.html"))
    assert any(page.parts[-3:] == ("api", "unfold", "index.html") for page in pages)
    found = [f"{page.relative_to(site)}: {hit}" for page in pages for hit in role.findall(page.read_text())]
    assert not found, found[:20]
    assert role.search("see :class:<code>GradientStep</code>")          # negative control of the pattern


def test_the_default_site_folder_is_ignored_by_git():
    """``mkdocs build`` without ``-d`` writes ``site/`` (mkdocs.yml's default ``site_dir``): git ignores it, so a
    built site is never committed by accident; a tracked page is not ignored (the control)."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")

    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0

    assert ignored("site/index.html") and ignored("site/api/unfold/index.html")
    assert not ignored("docs/index.md")
