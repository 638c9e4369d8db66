"""Every measured figure the pages mark comes from its committed JSON (`experiments.studies.figures`): a page and
its JSON never differ, a planted difference is caught and regenerated, the README and getting-started give the
default run's and the suite's figures from the same JSON, and the records name the commit they were measured on."""
import json
import os
import re
import shutil
import sys

import pytest

from energies.errors import ConfigError
from experiments.studies import figures

ROOT = figures.ROOT
MEASURED = ("docs/measured/default_run.json", "docs/measured/suite.json", "docs/measured/pyg_sbm.json",
            "docs/gpu/h200.json")


def test_every_marked_figure_equals_its_json():
    assert figures.check_pages() == [], "run `python -m experiments.studies.figures --write`"
    marked = figures.markers()
    assert {"README.md", "docs/getting-started.md", "docs/index.md", "docs/results.md"} <= set(marked)
    assert sum(len(specs) for specs in marked.values()) > 30


def _copy(tmp_path, *names):
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    return str(tmp_path)


def test_a_planted_difference_is_caught_and_regenerated(tmp_path):
    """Negative control: one digit changed in the page, and one value changed in the JSON, are each reported
    with the page and line; ``--write`` puts the JSON's figure back."""
    root = _copy(tmp_path, "README.md", "docs/measured/default_run.json", "docs/measured/suite.json")
    assert figures.check_pages(root) == []
    page = tmp_path / "README.md"
    text = page.read_text()
    planted = text.replace("-->78.90<!-- /fig -->", "-->78.91<!-- /fig -->", 1)
    assert planted != text
    page.write_text(planted)
    (found,) = figures.check_pages(root)[:1]
    line = planted[:planted.index("78.91")].count("\n") + 1
    assert found.startswith(f"README.md:{line}: written '78.91', the JSON gives '78.90'"), found
    figures.check_pages(root, write=True)
    assert page.read_text() == text and figures.check_pages(root) == []

    suite = tmp_path / "docs/measured/suite.json"
    record = json.loads(suite.read_text())
    record["counts"]["passed"] += 1
    suite.write_text(json.dumps(record))
    report = figures.check_pages(root)
    assert report and all("the JSON gives" in line and "passed" not in line for line in report)
    assert any(f"'{record['counts']['passed']:,d}'" in line for line in report)


def test_a_generated_table_is_checked_line_by_line(tmp_path):
    root = _copy(tmp_path, "docs/results.md", "docs/variants/listops.json", "docs/variants/listops_lra-cpu.json",
                 "docs/variants/rotten_tomatoes-default.json", "docs/measured/depth_tiny.json")
    page = tmp_path / "docs/results.md"
    text = page.read_text()
    page.write_text(text.replace("| star | 28.07 ± 2.72 |", "| star | 28.70 ± 2.72 |"))
    (found,) = figures.check_pages(root)
    assert "'| star | 28.70 ± 2.72 |" in found and "'| star | 28.07 ± 2.72 |" in found


@pytest.mark.parametrize("spec, error", [
    ("docs/measured/suite.json /counts/nothing ,d", "has no 'nothing'"),
    ("docs/measured/suite.json counts/passed ,d", "must start with '/'"),
    ("docs/measured/suite.json /command s", "is not a number"),
    ("docs/measured/suite.json /seconds q", "does not apply"),
    ("docs/measured/suite.json /seconds over /counts/nothing .1f", "has no 'nothing'"),
    ("docs/measured/suite.json /seconds", "'FILE POINTER [over|minus [FILE] POINTER] FORMAT'"),
    ("docs/measured/suite.json /seconds minus docs/measured/default_run.json /command .1f", "not a number"),
    ("docs/measured/suite.json /seconds over /counts/xfailed .1f", "has no 'xfailed'"),
    ("../outside.json /a d", "inside the repository"),
    ("docs/measured/absent.json /a d", "cannot be read"),
])
def test_a_broken_marker_is_refused_naming_the_page_and_line(spec, error):
    with pytest.raises(ConfigError, match=re.escape(error)) as caught:
        figures.regenerate(f"intro\n<!-- fig {spec} -->1<!-- /fig -->\n", "page.md", figures.Sources(ROOT))
    assert str(caught.value).startswith("page.md:2: ")


def test_a_marker_in_code_is_an_example():
    text = "write `<!-- fig docs/measured/NAME.json /a %.2f -->1<!-- /fig -->` to mark a figure"
    assert figures.regenerate(text, "page.md", figures.Sources(ROOT)) == (text, [])


def test_ratios_and_differences_read_one_or_two_files():
    sources = figures.Sources(ROOT)
    suite = sources("docs/measured/suite.json", "x")
    run = sources("docs/measured/default_run.json", "x")
    ratio = figures.figure("docs/measured/suite.json /seconds over /counts/passed .4f", sources, "x")
    assert ratio == format(suite["seconds"] / suite["counts"]["passed"], ".4f")
    difference = figures.figure("docs/measured/suite.json /seconds minus docs/measured/default_run.json "
                                "/wall_seconds ,.1f", sources, "x")
    assert difference == format(suite["seconds"] - run["wall_seconds"], ",.1f")


def test_a_table_reads_the_number_of_files_it_names():
    text = ("<!-- table sweeps docs/sweeps/rotten_tomatoes-default.json docs/sweeps/rotten_tomatoes-tfidf.json -->\n"
            "<!-- /table -->")
    new, (found,) = figures.regenerate(text, "page.md", figures.Sources(ROOT))
    assert "| default | 78.38 ± 0.80 % |" in new and "| tfidf-rotten_tomatoes |" in new and found[0] == 1
    for spec in ("variants docs/variants/listops.json docs/variants/listops.json", "nothing docs/gpu/h200.json",
                 "sweeps"):
        with pytest.raises(ConfigError, match="a table is 'NAME FILE"):
            figures.regenerate(f"<!-- table {spec} -->\n<!-- /table -->", "page.md", figures.Sources(ROOT))


def test_the_depth_table_is_the_studys_two_tables():
    text = "<!-- table depth docs/measured/depth_tiny.json -->\n<!-- /table -->"
    new, _ = figures.regenerate(text, "page.md", figures.Sources(ROOT))
    tables = new.split("\n\n")
    assert len(tables) == 2 and tables[0].split("\n")[1].startswith("| EPS |") and "| 4 (trained) | 1 |" in tables[1]


def test_the_convex_table_has_a_row_per_fit_without_its_seconds():
    record = figures.Sources(ROOT)("docs/measured/convex_heads_quick.json", "x")
    rows = figures.TABLES["convex_heads"](record).splitlines()
    assert len(rows) == 2 + len(record["result"]) and "fit s" not in rows[0]
    increases = record["result"]["glove/bfno"]["objective_increases"]
    assert rows[2].startswith("| glove | bfno | ") and rows[2].endswith(f" | {increases} |")


def test_the_cli_checks_and_refuses_with_exit_2(tmp_path, capsys, monkeypatch):
    assert figures.main([]) == 0
    monkeypatch.setattr(figures, "ROOT", str(tmp_path))
    assert figures.main(["record-suite", str(tmp_path / "none.log"), "--commit", "abc"]) == 2
    assert "--commit must be the 40-hex commit" in capsys.readouterr().err
    (tmp_path / "suite.log").write_text("3 failed, 4254 passed in 900.00s\n")
    assert figures.main(["record-suite", str(tmp_path / "suite.log"), "--commit", "0" * 40]) == 2
    assert "the suite did not pass" in capsys.readouterr().err
    assert not (tmp_path / "docs").exists()
    (tmp_path / "suite.log").write_text("4257 passed, 99 skipped in 877.48s\n")
    assert figures.main(["record-suite", str(tmp_path / "suite.log"), "--commit", "0" * 40]) == 0
    record = json.loads((tmp_path / figures.SUITE_JSON).read_text())
    assert record["counts"] == {"passed": 4257, "skipped": 99} and record["commit"] == "0" * 40


def test_the_readme_and_getting_started_give_the_same_figures_from_one_source():
    marked = figures.markers()
    sources = ("docs/measured/default_run.json", "docs/measured/suite.json")

    def from_sources(page):
        return sorted({spec for spec in marked[page] if spec.split()[0] in sources})
    readme, started = from_sources("README.md"), from_sources("docs/getting-started.md")
    assert readme == started and len(readme) == 8, (readme, started)


#: a number with a unit of what is measured (percent, time, ratio ``1.7x``, memory) or a test count, outside markers
UNMARKED = re.compile(r"(?<![\w.,^-])\d[\d,.]*(?:x\b|\s?(?:%|s\b|ms\b|us\b|µs\b|min\b|MiB\b|MB\b|GB\b|KB\b|k\b|M\b))"
                      r"|\d[\d,]* (?:passed|skipped)")
#: pages generated from the code (their numbers are the schema's defaults and help, checked by their own test)
GENERATED = {"docs/config_reference.md"}
#: pages still holding figures typed by hand (or rates and sizes the pattern cannot tell from them), with how many:
#: a count may only shrink, as their figures move into JSONs the command that measured them wrote; a page not
#: listed holds none
UNBACKED: dict = {}


def _typed(text):
    """The figures `text` types by hand: outside fig, table and set markers, code blocks and inline code."""
    prose = figures.TABLE.sub("", figures.SET.sub("", figures.FIG.sub("", text)))
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    return UNMARKED.findall(re.sub(r"`[^`\n]*`", "", prose))


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as fh:
        return fh.read()


def _unmarked(page):
    return [] if page in GENERATED else _typed(_read(page))


def test_the_pattern_finds_typed_figures_only():
    assert UNMARKED.findall("in 877 s: 4,257 passed, 78.90 % and 1.7x, 44 MiB") == \
        ["877 s", "4,257 passed", "78.90 %", "1.7x", "44 MiB"]
    assert not _typed("<!-- fig a.json /b d -->0<!-- /fig --> runs; eq. 33; 2^-14; d = 64; 1e-12")


def test_set_numbers_code_and_products_are_not_figures_but_a_measured_one_beside_them_is():
    """A default marked as set, inline code and ``16 x 16`` are not counted; a measured figure in the same
    sentence, or one hidden in a set marker beside the number it marks, still is."""
    text = ("masks <!-- set -->15 %<!-- /set --> of the tokens (`--size-mb 200`, 16 x 16 tiles, 2 x m edges) "
            "and reached 78.90 % in 12 s, 1.7x faster")
    assert _typed(text) == ["78.90 %", "12 s", "1.7x"]
    assert _typed("masks <!-- set -->15 % in 12 s<!-- /set -->") == []    # hidden: caught by the next test
    for page in GENERATED:                       # generated from the schema: its rates are the keys' help
        assert "Do not edit by hand" in _read(page) and _typed(_read(page)) and _unmarked(page) == []


def test_a_set_marker_holds_one_number():
    spans = {page: figures.SET.findall(_read(page)) for page in figures.pages()}
    bad = {page: [s for s in found if len(UNMARKED.findall(s)) != 1 or len(s) > 16] for page, found in spans.items()}
    assert not any(bad.values()), bad


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/index.md"])
def test_the_front_pages_hold_no_unmarked_measured_figure(page):
    assert _unmarked(page) == []


def test_typed_figures_only_shrink():
    counts = {page: len(_unmarked(page)) for page in figures.pages()}
    grown = {page: n for page, n in counts.items() if n > UNBACKED.get(page, 0)}
    assert not grown, f"figures typed by hand (mark them: experiments/studies/figures.py): {grown}"
    shrunk = {page: counts[page] for page, n in UNBACKED.items() if counts.get(page, 0) < n}
    assert not shrunk, f"fewer typed figures now: lower UNBACKED in {__file__} to {shrunk}"


@pytest.mark.parametrize("name", MEASURED)
def test_every_record_names_the_commit_it_was_measured_on(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        record = json.load(fh)
    commits = [record["commit"]] if "commit" in record else list(record["commits"].values())
    assert commits and all(re.fullmatch(r"[0-9a-f]{40}", commit) for commit in commits), commits


def test_any_command_printing_a_json_line_is_recorded_with_its_commit(tmp_path, monkeypatch, capsys):
    record = figures.measure_json([sys.executable, "-c", "print('log'); print('{\"acc\": 0.5}')"])
    assert record["result"] == {"acc": 0.5} and record["wall_seconds"] > 0
    assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]) and record["command"].endswith("\"acc\": 0.5}')")
    with pytest.raises(ConfigError, match="without a JSON object on its last line"):
        figures.measure_json([sys.executable, "-c", "print('no json')"])
    monkeypatch.setattr(figures, "ROOT", str(tmp_path))
    assert figures.main(["measure", "../out.json", "--", sys.executable, "-c", "print('{}')"]) == 2
    assert "inside the repository" in capsys.readouterr().err and not os.listdir(tmp_path)


def test_a_pytest_summary_is_recorded_and_a_failing_suite_refused():
    log = "....\n= 4257 passed, 99 skipped, 48 warnings in 877.48s (0:14:37) =\n"
    assert figures.parse_pytest(log) == {"counts": {"passed": 4257, "skipped": 99, "warnings": 48},
                                         "seconds": 877.48}
    with pytest.raises(ConfigError, match="did not pass"):
        figures.parse_pytest("3 failed, 4254 passed in 900.00s\n")
    with pytest.raises(ConfigError, match="no pytest summary"):
        figures.parse_pytest("collected 0 items\n")


def test_a_run_folder_is_recorded_with_its_metrics_and_wall_time(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5, "energy_steps": 8}))
    commit = {"commit": "0" * 40, "dirty": False}
    record = figures.record_run(str(tmp_path), 12.5, commit, figures.RUN_COMMAND)
    assert record["metrics"]["energy_steps"] == 8 and record["wall_seconds"] == 12.5
    assert record["command"] == "unfold-train --config default" and record["commit"] == "0" * 40
    (tmp_path / "metrics.json").write_text(json.dumps({"val_accuracy": 0.5}))
    with pytest.raises(ConfigError, match="no 'test_accuracy'"):
        figures.record_run(str(tmp_path), 12.5, commit, figures.RUN_COMMAND)
