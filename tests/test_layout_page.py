"""The layout page (``docs/layout.md``) tells the tree as it is: every file a package's bullet names lies in that
package, and the packages listed in `COMPLETE` have every module named in their bullet."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "layout.md")
#: packages whose bullet names every module file they hold
COMPLETE = ("convex/", "experiments/runfolder/", "experiments/data/", "experiments/studies/")
BULLET = re.compile(r"^\* `([\w/]+/)`(.*?)(?=^\* |\Z)", re.M | re.S)
FILE = re.compile(r"`([\w/]*\w\.py)`")


def _modules(folder):
    for here, dirs, files in os.walk(os.path.join(ROOT, folder)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(here, name), ROOT).replace(os.sep, "/")


def misplaced(text):
    """Files a bullet names that are not in its package (a name with a package path is looked up from the root)."""
    found = []
    for folder, body in BULLET.findall(text):
        if not os.path.isdir(os.path.join(ROOT, folder)):
            continue
        modules = list(_modules(folder))
        for name in FILE.findall(body):
            if "/" in name and os.path.exists(os.path.join(ROOT, name)):
                continue
            if not any(path.endswith("/" + name) for path in modules):
                found.append(f"{name} is not in {folder}")
    return found


def unnamed(text):
    """Modules of the `COMPLETE` packages that their bullet does not name."""
    bullets = dict(BULLET.findall(text))
    missing = []
    for folder in COMPLETE:
        names = set(FILE.findall(bullets.get(folder, "")))
        missing += [path for path in _modules(folder) if os.path.basename(path) not in ("__init__.py", "__main__.py")
                    and os.path.basename(path) not in names and path[len(folder):] not in names]
    return missing


def _page():
    with open(PAGE, encoding="utf-8") as fh:
        return fh.read()


def test_every_file_the_layout_page_names_is_where_it_says():
    text = _page()
    assert {"energies/", "unfold/", "experiments/app/", "experiments/runfolder/"} <= set(dict(BULLET.findall(text)))
    assert misplaced(text) == []


def test_the_complete_packages_name_every_module():
    assert unnamed(_page()) == []


def test_a_misplaced_or_missing_file_is_caught():
    """Negative control: the run-folder files placed under the application, and a module left out."""
    planted = ("* `experiments/app/` (the application): config (`config.py`; `strict_yaml.py`), run logs "
               "(`runlog.py`).\n* `experiments/runfolder/` (run folders): `atomic.py`.\n")
    assert misplaced(planted) == ["strict_yaml.py is not in experiments/app/", "runlog.py is not in experiments/app/"]
    assert "experiments/runfolder/runlock.py" in unnamed(planted)
