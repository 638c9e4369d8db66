"""The guide ``docs/guides/own_data.md`` cannot rot: every fenced ``sh`` or ``python`` block marked ``<!-- run -->``
(``<!-- run: exit N -->`` for a refusal shown on purpose) runs, in order, section by section (each ``## `` section
in an empty folder of its own, one test each), with the exit status it is marked with; the refusal shown after it is the one printed; each ``unfold-train`` line is the command
that the ``unfold-data inspect`` before it printed; and every run folder it names holds its ``metrics.json``.

The guide's commands are the console scripts of this installation (``unfold-data``, ``unfold-train``; from the
interpreter's folder, or shims that run ``unfold-data`` / ``experiments.app.train`` where the scripts
are not installed). They use ``--config tiny`` and a dozen lines of data: about 30 s of CPU in all.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guides", "own_data.md")
#: a marked block, and the ``text`` block that may follow it (the output it shows)
BLOCK = re.compile(r"<!-- run(?::\s*exit (\d+))? -->\n```(sh|python)\n(.*?)\n```\n(?:\n```text\n(.*?)\n```\n)?",
                   re.S)


def blocks(text: str) -> list:
    """``[(language, code, expected exit status, shown output or None)]`` of the marked blocks, in order."""
    return [(lang, code, int(rc or 0), shown or None) for rc, lang, code, shown in BLOCK.findall(text)]


def read_guide() -> str:
    with open(GUIDE, encoding="utf-8") as f:
        return f.read()


def sections(text: str) -> dict:
    """``{heading: text}`` of the ``## `` sections of ``text`` that hold a marked block."""
    parts = re.split(r"^## (.+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2) if blocks(parts[i + 1])}


@pytest.fixture(scope="module")
def guide() -> str:
    return read_guide()


SECTIONS = sections(read_guide())


def test_every_kind_of_input_has_a_runnable_example(guide):
    """Not vacuous: CSV, JSON lines, parquet, a folder of splits and a Hugging Face folder each have a marked
    block that inspects and one that trains, each in a section of its own; one refusal is shown with its output;
    python blocks are marked too."""
    assert len(SECTIONS) == 5 and sum(len(blocks(t)) for t in SECTIONS.values()) == len(blocks(guide))
    found = blocks(guide)
    runs = "\n".join(code for _, code, _, _ in found)
    for dataset in ("reviews.csv", "tickets.jsonl", "reviews.parquet", "splits", "hf:my_hf_dataset"):
        assert re.search(rf"^unfold-data inspect {re.escape(dataset)}\b", runs, re.M), dataset
        assert f"data.dataset={dataset} " in runs, dataset
    assert [rc for _, _, rc, _ in found].count(2) == 1 and any(shown for _, _, _, shown in found)
    assert {lang for lang, _, _, _ in found} == {"sh", "python"}
    assert blocks("<!-- run -->\n```sh\necho\n```\n") == [("sh", "echo", 0, None)]      # the parser itself


def _env(tmp_path) -> dict:
    """The environment the blocks run in: this interpreter's scripts first, shims where they are missing."""
    bindir = os.path.dirname(sys.executable)
    shims = tmp_path / ".bin"
    shims.mkdir()
    for script, module in (("unfold-data", "experiments.app.data_cli"), ("unfold-train", "experiments.app.train")):
        if shutil.which(script, path=bindir) is None:
            (shims / script).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
            (shims / script).chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join([str(shims), bindir, os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("UNFOLD_DEBUG", None)
    return env


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_the_guide_runs(heading, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    printed = None                   # the 'train with' command of the last inspect
    for lang, code, rc, shown in blocks(SECTIONS[heading]):
        argv = ["bash", "-e", "-o", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == rc, f"{code}\n--- exit {proc.returncode}, stdout:\n{proc.stdout[-2000:]}\n" \
                                      f"--- stderr:\n{proc.stderr[-3000:]}"
        if shown is not None:
            assert proc.stderr.strip() == shown.strip()
        for line in proc.stdout.splitlines():
            if line.startswith("train with"):
                printed = line[len("train with"):].strip()
        for line in code.splitlines():
            if line.startswith("unfold-train "):
                assert line == printed, "the guide's command is not the one inspect printed"
    runs = re.findall(r"--run-dir (\S+)", "\n".join(code for _, code, _, _ in blocks(SECTIONS[heading])))
    assert len(runs) == 1
    for run in runs:
        assert (work / run / "metrics.json").is_file(), run
