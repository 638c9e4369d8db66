"""Plug-ins selectable by name from configs and every command line (:mod:`unfold.plugins`).

A plug-in module outside the package registers a concave penalty ``myrho`` and a graph ``mygraph``;
``--import myplug`` makes them valid names for the trainer's config and for ``unfold.check``, an
installed entry point of the group ``unfolded_transformers.plugins`` does so with no option, and a
plug-in that is missing or fails on import is one ``error:`` line with exit 2 (the error contract of
:func:`unfold.cli.run_main`), never a traceback.

The success paths run real ``python -m`` subprocesses (the plug-in found in the working folder or on
``PYTHONPATH``); the refusals run in process through :func:`clifuzz.expect_refusal` (exit 2, one last
``error:`` line naming the module, nothing written), with the registries, ``sys.path`` and the loaded
modules restored after each test (:func:`inproc`).
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

import unfold.plugins as plugins
from clifuzz import expect_refusal, run_cli
from energies.graphs import GRAPHS
from energies.rho import RHOS
from test_train import ROOT, synthetic_text_dir
from unfold.cli import run_main

TINY = os.path.join(ROOT, "experiments", "configs", "tiny.yaml")
CLIS = ["experiments.studies.activations", "experiments.studies.bench", "experiments.studies.convex_heads", "experiments.app.data_cli",
        "experiments.studies.depth", "experiments.studies.descent", "experiments.app.plot_energy", "experiments.app.predict",
        "experiments.studies.pyg_sbm", "experiments.studies.spline_probe", "experiments.app.sweep", "experiments.app.tfidf",
        "experiments.app.train", "experiments.studies.variants", "unfold.check", "experiments.studies.stream_memory"]
#: a small, fast unfold.check run
CHECK = ["--samples", "2", "--layers", "3", "--n", "8", "--d", "4", "--json"]

PLUGIN = '''\
"""A plug-in: a scaled exponential penalty and a window graph under new names."""
import torch

from energies.graphs import register_graph, window
from energies.rho import Rho, register_rho


@register_rho("{rho}")
class ScaledExp(Rho):
    """rho(z) = -s exp(-z), rho'(z) = s exp(-z): concave and non-decreasing for s > 0."""

    def __init__(self, s: float = 1.0):
        self.s = float(s)

    def value(self, z):
        return -self.s * torch.exp(-z)

    def derivative(self, z):
        return self.s * torch.exp(-z)

    def spec(self):
        return "{rho}" if self.s == 1.0 else f"{rho}:{{self.s:g}}"


@register_graph("{graph}")
def {graph}(n, k, batch_size=1, mask=None, seed=0):
    return window(n, k, batch_size=batch_size, mask=mask, seed=seed)
'''


def plugin_source(rho: str, graph: str) -> str:
    return PLUGIN.format(rho=rho, graph=graph)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The workspace, built once: ``plug/`` (myplug.py, inplug.py, badplug.py, broken.py), ``site/`` (an
    installed-looking distribution whose entry point names ``epplug``), ``badsite/`` (one whose entry
    point fails) and ``toy/`` (exported toy splits for the trainer)."""
    root = tmp_path_factory.mktemp("plugins")
    plug = root / "plug"
    plug.mkdir()
    (plug / "myplug.py").write_text(plugin_source("myrho", "mygraph"))
    (plug / "inplug.py").write_text(plugin_source("inrho", "ingraph"))
    (plug / "badplug.py").write_text('raise RuntimeError("the plug-in failed on purpose")\n')
    (plug / "broken.py").write_text("def oops(:\n")
    for site, module, source in (("site", "epplug", plugin_source("eprho", "epgraph")),
                                 ("badsite", "epbad", 'raise ValueError("entry point failed on purpose")\n')):
        dist = root / site / f"{module}dist-0.1.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}dist\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nfake = {module}\n")
        (root / site / f"{module}.py").write_text(source)
    synthetic_text_dir(root / "toy", n_train=120, n_eval=40)
    return root


def run(module, args, cwd, path=()):
    """``python -m module args`` in ``cwd`` with the repository (and ``path``) on ``PYTHONPATH``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *map(str, path)]), "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("UNFOLD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=300)


def one_error(proc) -> str:
    """The contract for a refused subprocess: exit 2, no traceback, one last ``error:`` line (returned)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-2000:]
    return errors[0]


@pytest.fixture
def inproc(monkeypatch):
    """In-process plug-in loading, undone afterwards: ``sys.path``, the modules imported, the set of plug-ins
    loaded, the entry-point flag and every name added to the rho and graph registries (no bytecode is written)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)      # no __pycache__ beside the plug-ins
    monkeypatch.setattr(plugins, "_imported", set())
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    modules, rhos, graphs = set(sys.modules), set(RHOS), set(GRAPHS)
    yield
    for name in set(sys.modules) - modules:
        if name in ("inplug", "badplug", "broken", "epbad", "epplug", "myplug") or name.startswith("ending_"):
            del sys.modules[name]
    for table, before in ((RHOS, rhos), (GRAPHS, graphs)):
        for name in set(table) - before:
            del table[name]


# ----------------------------------------------------------------- the trainer, from a config key
@pytest.fixture(scope="module")
def trained(ws):
    """One tiny training run with the plug-in's rho and graph (imported from the working folder)."""
    run_dir = ws / "run"
    proc = run("experiments.app.train", ["--config", TINY, "--import", "myplug", "model.rho=myrho:2",
                                     "model.graph=mygraph:3", f"data.dataset={ws / 'toy'}", "data.glove=none",
                                     "train.progress=false", "model.layers=1", "--run-dir", run_dir], cwd=ws / "plug")
    return proc, run_dir


def test_trainer_takes_a_plugin_rho_and_graph_by_name(trained):
    proc, run_dir = trained
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["model"]["rho"] == "myrho:2" and cfg["model"]["graph"] == "mygraph:3"
    from experiments.app.checkpoint import load_checkpoint

    ck, _ = load_checkpoint(str(run_dir))
    assert ck["config"]["model"]["rho"] == "myrho:2"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # a concave plug-in rho in guaranteed mode keeps the guarantee: no energy increase on the test set
    assert summary["energy_verdict"] == "descent" and metrics["energy_increases"] == 0 and metrics["energy_steps"] > 0


def test_trainer_without_the_plugin_refuses_the_name(ws):
    line = one_error(run("experiments.app.train", ["--config", TINY, "model.rho=myrho", f"data.dataset={ws / 'toy'}",
                                               "--run-dir", ws / "refused"], cwd=ws / "plug"))
    assert "model.rho" in line and "myrho" in line
    assert not (ws / "refused").exists()


@pytest.mark.parametrize("override, names", [
    ("model.rho=nosuchrho", ["model.rho", "nosuchrho"]),      # an unknown name is still refused with the plug-in
    ("model.rho=inrho:-1", ["model.rho"]),                    # the plug-in's rho is validated (s < 0: decreasing)
    ("model.graph=ingraph", ["model.graph", "ingraph"]),      # its graph takes one argument
    ("model.graph=nosuchgraph", ["model.graph", "nosuchgraph"]),
])
def test_config_checks_plugin_names_like_builtin_ones(ws, inproc, tmp_path, override, names):
    expect_refusal("experiments.app.train", ["--import", "inplug", "--config", TINY, override,
                                         f"data.dataset={ws / 'toy'}", "--run-dir", str(tmp_path / "r")],
                   str(ws / "plug"), names=names)


def test_config_accepts_plugin_names_in_process(ws, inproc):
    """``load_config`` reads the registries when it validates: once the plug-in is imported, its names
    (with arguments) are accepted; before its import, they are refused naming the key."""
    from experiments.app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.rho"):
        load_config(TINY, ["model.rho=inrho"])
    os.chdir(ws / "plug")
    try:
        assert plugins.import_plugins(["inplug"]) == ["inplug"]
        assert plugins.import_plugins(["inplug"]) == []          # once per process
    finally:
        os.chdir(ROOT)
    cfg = load_config(TINY, ["model.rho=inrho:2", "model.graph=ingraph:3"])
    assert (cfg["model"]["rho"], cfg["model"]["graph"]) == ("inrho:2", "ingraph:3")
    assert load_config(TINY, ["model.rho=inrho"])["model"]["rho"] == "inrho"


# ----------------------------------------------------------------- the descent checker
def test_check_takes_a_plugin_rho_and_graph(ws):
    proc = run("unfold.check", ["--import", "myplug", "--rho", "myrho:2", "--graph", "mygraph:3", *CHECK],
               cwd=ws, path=[ws / "plug"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "descent" and out["increases"] == 0
    assert out["config"]["rho"] == "myrho:2" and out["config"]["graph"] == "window:3"
    assert "monotone descent" in proc.stdout


def test_check_without_the_plugin_refuses_the_name(ws):
    line = one_error(run("unfold.check", ["--rho", "myrho", *CHECK], cwd=ws, path=[ws / "plug"]))
    assert "myrho" in line


def test_import_in_an_explicit_argv_is_loaded(ws, inproc):
    """``main([...])`` called in process: the ``--import`` option loads the module while parsing (the
    pre-scan of ``run_main`` reads ``sys.argv``, which is pytest's here)."""
    code, out, err = run_cli("unfold.check", ["--import", "inplug", "--rho", "inrho:3", *CHECK], str(ws / "plug"))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["config"]["rho"] == "inrho:3"


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize("module, extra", [("experiments.app.train", ["--config", TINY]), ("unfold.check", CHECK),
                                           ("experiments.studies.descent", ["--quick"]),
                                           ("experiments.app.data_cli", ["export", "--dataset", "x", "--out", "o"])])
@pytest.mark.parametrize("name, names", [
    ("nosuchmod", ["--import nosuchmod", "No module named 'nosuchmod'"]),
    ("badplug", ["--import badplug", "RuntimeError", "failed on purpose"]),
    ("broken", ["--import broken", "SyntaxError", "broken.py"]),
    ("my/plug.py", ["--import", "my/plug.py", "not a Python module name"]),
    ("inplug.py", ["--import inplug.py", "--import inplug"]),
])
def test_a_plugin_that_cannot_be_imported_is_one_error_line(ws, inproc, module, extra, name, names):
    expect_refusal(module, ["--import", name, *extra], str(ws / "plug"), names=names)


TAKEN = {
    "rho-exp": ('from energies.rho import Rho, register_rho\n\n\n@register_rho("exp")\nclass Exp(Rho):\n    pass\n',
                ["rho registry", "'exp'"]),
    "kernel-edges": ('from energies.kernels import register_kernel\n\n\n@register_kernel("edges")\n'
                     'def run(*args, **kwargs):\n    raise AssertionError("never runs")\n', ["kernel registry", "'edges'"]),
    "graph-window": ('from energies.graphs import register_graph\n\n\n@register_graph("window")\n'
                     'def window(n, k, batch_size=1, mask=None, seed=0):\n    raise AssertionError("never runs")\n',
                     ["graph registry", "'window'"]),
    "encoder-free": ('from unfold import GuaranteedEncoder, register_encoder\n\n\n@register_encoder("free")\n'
                     'class Free(GuaranteedEncoder):\n    pass\n', ["encoder registry", "'free'"]),
}


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_a_plugin_taking_a_registered_name_is_refused(inproc, tmp_path, case):
    """A plug-in registering a taken name (``exp``, which would replace the built-in for the trace but not for the
    fused forward; a second ``edges``) is refused at import, naming the registry and the name, and the built-in is
    untouched."""
    from energies.kernels import KERNELS
    from unfold import ENCODERS

    source, names = TAKEN[case]
    module = "taken_" + case.replace("-", "_")
    (tmp_path / f"{module}.py").write_text(source)
    tables = [dict(t) for t in (RHOS, GRAPHS, KERNELS, ENCODERS)]
    expect_refusal("unfold.check", ["--import", module, *CHECK], str(tmp_path), names=[f"--import {module}", *names])
    assert tables == [dict(t) for t in (RHOS, GRAPHS, KERNELS, ENCODERS)]
    code, out, err = run_cli("unfold.check", CHECK, str(tmp_path))          # the built-ins still run
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["verdict"] == "descent", err


#: plug-ins whose import ends the process or interrupts it: (source, what the error line names)
ENDING = {
    "exit0": ("import sys\nsys.exit(0)\n", ["sys.exit(0)", "SystemExit"]),
    "exit3": ("raise SystemExit(3)\n", ["sys.exit(3)", "SystemExit"]),
    "exitnone": ("import sys\nsys.exit()\n", ["sys.exit(None)", "SystemExit"]),
    "exitmessage": ("import sys\nsys.exit('bye\\nnow')\n", ["sys.exit('bye\\nnow')", "SystemExit"]),
    "badstr": ("class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no text')\n\n\n"
               "raise Odd()\n", ["Odd", "cannot be shown"]),
}


@pytest.mark.parametrize("module", CLIS)
@pytest.mark.parametrize("case", sorted(ENDING))
def test_a_plugin_that_exits_on_import_is_refused_by_every_cli(inproc, tmp_path, module, case):
    """``sys.exit(0)`` or ``SystemExit(3)`` in a plug-in (the import runs inside argument parsing) is refused by
    every command: exit 2, one line naming the module, nothing written; never an exit 0 having done nothing or a
    silent exit 3."""
    source, names = ENDING[case]
    (tmp_path / f"ending_{case}.py").write_text(source)
    expect_refusal(module, ["--import", f"ending_{case}"], str(tmp_path), names=[f"--import ending_{case}", *names])


@pytest.mark.parametrize("module", ["experiments.studies.variants", "unfold.check"])
@pytest.mark.parametrize("source, names", [
    ("raise KeyboardInterrupt\n", ["KeyboardInterrupt"]),
    ("import sys\nsys.exit(0)\n", ["sys.exit(0)"]),
    ("raise SystemExit(3)\n", ["sys.exit(3)"]),
])
def test_a_plugin_that_exits_or_interrupts_in_a_subprocess_exits_2(tmp_path, module, source, names):
    """``KeyboardInterrupt`` or sys.exit on a plug-in's import, in a subprocess, exits 2 with one line naming the
    module and what ended it (no traceback, not the plug-in's own exit code), nothing written."""
    (tmp_path / "ending.py").write_text(source)
    before = sorted(p.name for p in tmp_path.iterdir())
    line = one_error(run(module, ["--import", "ending", "--quick"] if module != "unfold.check" else
                         ["--import", "ending", *CHECK], cwd=tmp_path))
    assert "--import ending" in line and all(name in line for name in names), line
    assert sorted(p.name for p in tmp_path.iterdir()) == before          # nothing written


def test_a_failing_plugin_in_a_subprocess_exits_2(ws):
    for name, what in (("nosuchmod", "No module named 'nosuchmod'"), ("badplug", "failed on purpose")):
        line = one_error(run("experiments.app.train", [f"--import={name}", "--config", TINY], cwd=ws / "plug"))
        assert f"--import {name}" in line and what in line, line


def test_data_takes_import_before_and_after_its_subcommand(ws, inproc, tmp_path):
    for k, argv in enumerate((["--import", "inplug", "export"], ["export", "--import", "inplug"])):
        sys.modules.pop("inplug", None)                  # imported afresh: its names freed first (a name is
        plugins._imported.clear()                        # taken once; registering it again is refused)
        RHOS.pop("inrho", None)
        GRAPHS.pop("ingraph", None)
        code, out, err = run_cli("experiments.app.data_cli", [*argv, "--dataset", str(ws / "toy"), "--out",
                                                      str(tmp_path / f"out{k}")], str(ws / "plug"))
        assert code == 0, err
        assert "inplug" in sys.modules and (tmp_path / f"out{k}" / "train.jsonl").exists()
    expect_refusal("experiments.app.data_cli", ["export", "--import", "nosuchmod", "--dataset", "x", "--out", "o"],
                   str(tmp_path), names=["nosuchmod"])


# ----------------------------------------------------------------- run_main's pre-scan
def test_run_main_loads_plugins_before_the_body(ws, inproc, capsys):
    os.chdir(ws / "plug")
    try:
        seen = []
        code = run_main("prog", lambda: seen.append("inrho" in RHOS) or 0,
                        argv=["--x", "1", "--import=inplug", "--", "--import", "nosuchmod"])
        assert code == 0 and seen == [True]              # --import=X read, nothing after a bare --
        code = run_main("prog", lambda: 0, argv=["--import", "nosuchmod"])
    finally:
        os.chdir(ROOT)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["prog: error: --import nosuchmod: No module named 'nosuchmod'"]
    assert plugins.import_args(["a", "--import", "m1", "--import=m2", "--", "--import", "m3"]) == ["m1", "m2"]


# ----------------------------------------------------------------- entry points
def test_an_installed_entry_point_is_loaded_with_no_option(ws):
    proc = run("unfold.check", ["--rho", "eprho:2", "--graph", "epgraph:2", *CHECK], cwd=ws, path=[ws / "site"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["verdict"] == "descent" and out["config"]["rho"] == "eprho:2"


def test_a_failing_entry_point_is_one_error_line_and_help_still_shows(ws, inproc):
    sys.path.insert(0, str(ws / "badsite"))
    line = expect_refusal("unfold.check", CHECK, str(ws), names=["fake", "epbad", "epbaddist",
                                                                 plugins.ENTRY_POINT_GROUP, "failed on purpose"])
    assert "ValueError" in line
    code, out, _ = run_cli("unfold.check", ["--help"], str(ws))
    assert code == 0 and "--import" in out


# ----------------------------------------------------------------- every command line has the option
@pytest.mark.parametrize("module, sub", [(m, None) for m in CLIS] + [("experiments.app.data_cli", "fetch"),
                                                                   ("experiments.app.data_cli", "export")])
def test_every_cli_help_lists_import(tmp_path, module, sub):
    code, out, err = run_cli(module, ([sub] if sub else []) + ["--help"], str(tmp_path))
    assert code == 0, err
    assert "--import MODULE" in out and plugins.ENTRY_POINT_GROUP in " ".join(out.split())


def test_import_plugins_refuses_a_string_and_unhashable_names():
    """Adversarial review: import_plugins("os") imported 'o', 's' letter by letter ('--import o: No module named
    'o''), a list among the names raised TypeError (unhashable) before its refusal, None a TypeError."""
    for bad in ("os", None, 3):
        with pytest.raises(plugins.ConfigError, match="list of module names"):
            plugins.import_plugins(bad)
    with pytest.raises(plugins.ConfigError, match="not a Python module name"):
        plugins.import_plugins([["os"]])
