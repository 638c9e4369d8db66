"""The tutorial (docs/tutorial/tutorial.py) runs, as a notebook, in a fresh kernel (nbclient): it trains, plots the
energy per layer, compares two graphs and predicts, and what it prints is what it claims."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("nbclient")
pytest.importorskip("jupytext")


def _runner():
    spec = importlib.util.spec_from_file_location("run_tutorial", os.path.join(ROOT, "scripts", "run_tutorial.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_the_tutorial_runs_and_says_what_it_shows(tmp_path):
    nb = _runner().execute(str(tmp_path))
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    for figure in ("energy_per_layer.png", "two_graphs.png"):
        assert (tmp_path / figure).stat().st_size > 10_000
    assert (tmp_path / "tutorial.ipynb").exists()
    text = _text(nb)
    assert text.count("verdict descent") == 2, text[-3000:]          # both graphs, judged by the checker
    assert '"energy_increases": 0' in text
    import json
    start = text.index("{\n")
    summary = json.loads(text[start:text.index("}", start) + 1])
    assert summary["test_accuracy"] > summary["majority_class_accuracy"] + 0.2     # the tutorial's model learns
    assert "(prior only)" in text                                    # the all-unknown text says so
    assert "unknown 0/" in text


def test_a_failing_cell_fails_the_run(tmp_path, monkeypatch):
    """Negative control: the runner does not swallow a cell's error."""
    from nbclient.exceptions import CellExecutionError

    runner = _runner()
    bad = tmp_path / "bad.py"
    bad.write_text("# %%\nraise ValueError('tutorial cell failed')\n")
    monkeypatch.setattr(runner, "SOURCE", str(bad))
    with pytest.raises(CellExecutionError, match="tutorial cell failed"):
        runner.execute(str(tmp_path / "out"))


#: a stand-in tutorial: writes a data file into its TUTORIAL_WORK and a figure into TUTORIAL_FIGURES, prints where
_FAKE = ("# %%\nimport os\nwork = os.environ['TUTORIAL_WORK']\nopen(os.path.join(work, 'data.csv'), 'w').write('x')\n"
         "open(os.path.join(os.environ['TUTORIAL_FIGURES'], 'fig.png'), 'wb').write(b'png')\nprint('WORK=' + work)\n")


def _snapshot(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_without_an_argument_it_writes_a_fresh_folder_and_removes_its_data(tmp_path, monkeypatch, capsys):
    """No argument: a fresh temporary folder, never docs/tutorial (whose tracked files stay as they are); the data
    folder the tutorial wrote in is gone once the run ends: neither the CSV nor the run folders stay in the
    temporary directory."""
    runner = _runner()
    fake = tmp_path / "fake.py"
    fake.write_text(_FAKE)
    monkeypatch.setattr(runner, "SOURCE", str(fake))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))             # the fresh folders land in tmp_path
    docs = _snapshot(runner.DOCS)
    assert runner.main([]) == 0
    out = capsys.readouterr().out.strip().rsplit(" ", 1)[1]
    assert os.path.dirname(out) == str(tmp_path) and sorted(os.listdir(out)) == ["fig.png", "tutorial.ipynb"]
    assert _snapshot(runner.DOCS) == docs
    work = [t for c in runner.execute(str(tmp_path / "again")).cells for o in c.get("outputs", [])
            for t in o.get("text", "").split() if t.startswith("WORK=")][0][5:]
    assert os.path.dirname(work) == str(tmp_path) and not os.path.exists(work)


def test_docs_tutorial_is_written_only_when_asked(tmp_path, monkeypatch, capsys):
    """OUT_DIR = docs/tutorial without --update-docs is refused (exit 2, nothing written); --update-docs names
    that folder (not run here: it would write over the tracked files)."""
    runner = _runner()
    ran = []
    monkeypatch.setattr(runner, "execute", lambda out: ran.append(out))
    docs = _snapshot(runner.DOCS)
    assert runner.main([runner.DOCS]) == 2 and "--update-docs" in capsys.readouterr().err
    assert runner.main([os.path.join(runner.DOCS, "..", "tutorial")]) == 2
    assert runner.main([str(tmp_path / "out"), "--update-docs"]) == 2
    assert ran == [] and _snapshot(runner.DOCS) == docs
    assert runner.main(["--update-docs"]) == 0 and ran == [runner.DOCS]
    assert runner.main([str(tmp_path / "out")]) == 0 and ran[-1] == str(tmp_path / "out")
