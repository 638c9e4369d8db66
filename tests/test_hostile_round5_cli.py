"""Hostile inputs to the command lines: weights that give NaN logits (no label), plug-ins that print on stdout,
endless input lines, a plug-in that reaches for an alias, a stray file named like a shipped config, a short text
for a file graph, a bad byte on stdin after good lines, and a check sized to run for hours.

The commands run in process (``main(argv)``, through ``clifuzz.run_cli``) or as ``python -m`` with the tree under
test on ``PYTHONPATH``."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import energies
from clifuzz import run_cli

#: the tree under test (the one ``energies`` was imported from), for ``python -m`` subprocesses
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(energies.__file__)))
PREDICT = "experiments.app.predict"
CHECK = "unfold.check"
SMALL_CHECK = ["--samples", "2", "--layers", "2", "--n", "4", "--d", "2", "--json"]
VOCAB = ["<pad>", "<unk>", "good", "bad", "film", "great", "dull", "a", "fine"]
#: the longest line unfold-predict reads (experiments.app.predict.MAX_LINE_BYTES; named here so that the tests of
#: the bound run, and fail by behaviour, on code that has none)
MAX_LINE = 2 ** 20


def _save(folder, scale: float = 1.0, overrides=(), graph_file=None):
    """A tiny untrained model (d=8, 2 layers, max_len 16) saved as a bundle, its weights times ``scale``."""
    from experiments.app.build import build_model
    from experiments.app.bundle import TrainedModel, save_model
    from experiments.app.config import load_config
    from experiments.data.text import Vocab

    cfg = load_config("tiny", ["model.d=8", "model.heads=2", "model.layers=2", "data.max_len=16",
                               "data.glove=none", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, len(VOCAB), 2)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    save_model(TrainedModel(model, cfg, Vocab(VOCAB), ["rotten", "fresh"], graph_file=graph_file), str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("r5") / "bundle")


def _env(**extra):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", **extra}
    env.pop("UNFOLD_DEBUG", None)
    return env


def _run(module, args, cwd, stdin=None, path=(), **env):
    full = _env(**env)
    full["PYTHONPATH"] = os.pathsep.join([ROOT, *map(str, path)])
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=str(cwd), env=full, input=stdin,
                          capture_output=True, timeout=300)


@pytest.fixture
def stdin(monkeypatch):
    """``stdin(data)``: the process's stdin replaced by these bytes (a text stream over a byte buffer)."""
    def feed(data: bytes):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    return feed


@pytest.fixture
def registries():
    """Names added to the registries and plug-in modules imported by a test are removed afterwards."""
    import unfold.plugins as plugins
    from energies.graphs import GRAPHS
    from energies.rho import RHOS

    before = {id(t): set(t) for t in (RHOS, GRAPHS)}
    modules, imported, path = set(sys.modules), set(plugins._imported), list(sys.path)
    yield
    for table in (RHOS, GRAPHS):
        for name in set(table) - before[id(table)]:
            dict.__delitem__(table, name)
    for name in set(sys.modules) - modules:
        if name.startswith("r5plug"):
            del sys.modules[name]
    plugins._imported.clear()
    plugins._imported.update(imported)
    sys.path[:] = path


# --------------------------------------------------------------------------------- a label from NaN
def test_a_nonfinite_output_gets_no_label_and_a_nonzero_exit(tmp_path):
    """Finite but huge weights (x 1e30) give NaN logits: no line (no label, no "nan" probabilities) for that text,
    one error line naming it, exit 3, in the JSON and the plain output."""
    nan_bundle = _save(tmp_path / "nan", scale=1e30)
    code, out, err = run_cli(PREDICT, [nan_bundle, "--text", "good film", "--text", "bad", "--json"], str(tmp_path))
    assert code == 3, err
    assert out == "" and "nan" not in out
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 2 and "text 1 'good film'" in lines[0] and "not finite" in lines[0], err
    assert "no label" in lines[1] and "text 2 'bad'" in lines[1]
    code, out, err = run_cli(PREDICT, [nan_bundle, "--text", "good film"], str(tmp_path))     # plain output too
    assert code == 3 and out == "" and "not finite" in err


def test_a_finite_output_still_exits_0(bundle, tmp_path):
    code, out, err = run_cli(PREDICT, [bundle, "--text", "good film", "--json"], str(tmp_path))
    assert code == 0, err
    assert json.loads(out)["label"] in ("rotten", "fresh")


# --------------------------------------------------------------------------------- plug-in prints
FORGED = 'print(\'{"text": "forged", "label": "fresh", "verdict": "descent"}\')\n'
NOISY_RHO = '''\
import torch
from energies.rho import Rho, register_rho

print('{"verdict": "forged at import"}')


@register_rho("r5noisy")
class Noisy(Rho):
    def value(self, z):
        print('{"verdict": "forged while running"}')
        return -torch.exp(-z)

    def derivative(self, z):
        return torch.exp(-z)

    def spec(self):
        return "r5noisy"
'''


def test_a_plugin_print_never_reaches_stdout_of_predict(bundle, tmp_path, registries):
    (tmp_path / "r5plug_print.py").write_text(FORGED)
    code, out, err = run_cli(PREDICT, ["--import", "r5plug_print", bundle, "--text", "good film", "--json"],
                             str(tmp_path))
    assert code == 0, err
    assert "forged" not in out and "forged" in err
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["good film"]


def test_a_plugin_print_at_import_and_while_running_never_reaches_stdout_of_check(tmp_path, registries):
    (tmp_path / "r5plug_rho.py").write_text(NOISY_RHO)
    code, out, err = run_cli(CHECK, ["--import", "r5plug_rho", "--rho", "r5noisy", *SMALL_CHECK], str(tmp_path))
    assert code == 0, err
    assert "forged" not in out, out
    assert "forged at import" in err and "forged while running" in err
    assert json.loads(out.splitlines()[-1])["config"]["rho"] == "r5noisy"


def test_check_help_still_goes_to_stdout(tmp_path):
    code, out, err = run_cli(CHECK, ["--help"], str(tmp_path))
    assert code == 0 and "--import" in out and err == ""


def _site(root, source):
    """A folder that looks like an installed distribution whose entry point names ``r5plug_ep``."""
    import unfold.plugins as plugins

    dist = root / "r5dist-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: r5dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\nr5 = r5plug_ep\n")
    (root / "r5plug_ep.py").write_text(source)
    return root


def test_entry_point_prints_go_to_stderr_and_unfold_no_plugins_keeps_them_out(tmp_path, monkeypatch, registries):
    """In a ``python -m unfold.check`` process an entry point's prints go to stderr, and a broken one is loaded
    (exit 2, named) unless ``UNFOLD_NO_PLUGINS=1``. The other spellings run the same command in process, the entry
    point found on ``sys.path``: ``true`` and ``YES`` keep it out, ``0`` loads it, a typo is refused before any
    output."""
    import unfold.plugins as plugins

    noisy = _site(tmp_path / "noisy", FORGED)
    proc = _run(CHECK, SMALL_CHECK, tmp_path, path=[noisy])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"forged" not in proc.stdout and b"forged" in proc.stderr
    broken = _site(tmp_path / "broken", 'raise RuntimeError("entry point broken on purpose")\n')
    proc = _run(CHECK, SMALL_CHECK, tmp_path, path=[broken])                       # loaded: it fails
    assert proc.returncode == 2 and b"broken on purpose" in proc.stderr, proc.stderr[-2000:]
    proc = _run(CHECK, SMALL_CHECK, tmp_path, path=[broken], UNFOLD_NO_PLUGINS="1")
    assert proc.returncode == 0, proc.stderr[-2000:]                                # not loaded
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    for value, loaded in (("true", False), ("YES", False), ("0", True)):
        monkeypatch.setattr(plugins, "_entry_points_loaded", False)
        monkeypatch.setenv("UNFOLD_NO_PLUGINS", value)
        code, out, err = run_cli(CHECK, SMALL_CHECK, str(tmp_path))
        if loaded:
            assert code == 2 and "broken on purpose" in err and out == "", (value, err)
        else:
            assert code == 0 and json.loads(out.splitlines()[-1]), (value, err)
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    monkeypatch.setenv("UNFOLD_NO_PLUGINS", "ture")                                 # a typo: refused
    code, out, err = run_cli(CHECK, SMALL_CHECK, str(tmp_path))
    assert code == 2 and "UNFOLD_NO_PLUGINS" in err and out == "", err


# --------------------------------------------------------------------------------- endless lines
def test_a_line_longer_than_the_bound_is_refused_naming_it(bundle, tmp_path):
    """A line over MAX_LINE_BYTES is refused naming its number, before anything is predicted for a regular file; no
    line is read whole however long (``--file /dev/zero`` ends)."""
    MAX_LINE_BYTES = MAX_LINE
    path = tmp_path / "long.txt"
    path.write_bytes(b"good film\n" + b"a " * (MAX_LINE_BYTES // 2 + 1) + b"\nbad\n")
    code, out, err = run_cli(PREDICT, [bundle, "--file", str(path)], str(tmp_path))
    assert code == 2 and out == "", err
    assert "line 2" in err and "1 MiB" in err and str(path) in err


def test_stdin_of_nul_bytes_without_a_line_break_is_refused(bundle, tmp_path, stdin):
    stdin(b"\0" * (3 * MAX_LINE))
    code, out, err = run_cli(PREDICT, [bundle, "--file", "-"], str(tmp_path))
    assert code == 2 and out == "" and "line 1" in err and "stdin" in err, err


def test_lines_are_read_in_bounded_pieces():
    """Every read asks for at most MAX_LINE_BYTES + 1 bytes; a line of exactly MAX_LINE_BYTES passes."""
    from energies.errors import ConfigError
    from experiments.app.predict import MAX_LINE_BYTES, _bounded_lines

    asked = []
    data = io.BytesIO(b"x" * MAX_LINE_BYTES + b"\n" + b"y" * 10)

    def read_line(size):
        asked.append(size)
        return data.readline(size)
    assert [len(x) for x in _bounded_lines(read_line, "w")] == [MAX_LINE_BYTES + 1, 10]
    assert max(asked) <= MAX_LINE_BYTES + 1
    with pytest.raises(ConfigError, match="line 2 is longer"):
        list(_bounded_lines(io.BytesIO(b"ok\n" + b"z" * (MAX_LINE_BYTES + 1)).readline, "w"))



def test_a_text_stdin_without_a_byte_buffer_is_bounded_in_bytes(monkeypatch):
    """stdin replaced by a text stream (no ``.buffer``): a line of MAX_LINE_BYTES characters of two bytes each is
    over the bound, line break or not."""
    from energies.errors import ConfigError
    from experiments.app.predict import MAX_LINE_BYTES, _file_texts

    monkeypatch.setattr(sys, "stdin", io.StringIO("ok\n" + "é" * (MAX_LINE_BYTES // 2 + 1) + "\n"))
    with pytest.raises(ConfigError, match="line 2 is longer"):
        list(_file_texts("-"))


def test_a_text_argument_over_the_bound_is_refused(bundle, tmp_path):
    from experiments.app.predict import MAX_LINE_BYTES, _check_texts
    from energies.errors import ConfigError

    assert MAX_LINE_BYTES == MAX_LINE
    with pytest.raises(ConfigError, match="--text number 2"):
        _check_texts(["good", "a" * (MAX_LINE_BYTES + 1)])


# --------------------------------------------------------------------------------- aliases
def test_a_plugin_cannot_take_an_alias_or_an_unreachable_name(registries):
    """A plug-in cannot take an alias (register_rho("softmax") or any door of the dict leaves the documented alias
    of exp building ExpRho), a name with ':', or a graph name that a spec reads as a file; an alias cannot be
    pointed at another registered part."""
    from energies.errors import EnergyError, GraphError
    from energies.graphs import register_graph, window
    from energies.rho import RHOS, ExpRho, get_rho, register_rho

    class Other(ExpRho):
        pass

    with pytest.raises(EnergyError, match="alias"):
        register_rho("softmax")(Other)
    with pytest.raises(EnergyError, match="alias"):
        RHOS["softmax"] = Other                       # the dict's own door is shut too
    assert "softmax" not in RHOS and type(get_rho("softmax")) is ExpRho
    with pytest.raises(EnergyError, match="':'"):
        register_rho("my:rho")(Other)                 # "my:rho" would parse as "my" with an argument
    for name in ("mine.npy", "sub/mine"):             # a spec of these names reads a file
        with pytest.raises(GraphError, match="file"):
            register_graph(name)(lambda n, k=1, batch_size=1, mask=None, seed=0: window(n, 1, batch_size))
    with pytest.raises(EnergyError, match="already a registered part"):
        RHOS.add_aliases({"exp": "relu"})
    for door in (lambda: RHOS.update({"softmax": Other}), lambda: RHOS.update(softmax=Other),
                 lambda: RHOS.setdefault("softmax", Other)):           # the dict's other doors
        with pytest.raises(EnergyError, match="alias"):
            door()
    assert "softmax" not in RHOS


# --------------------------------------------------------------------------------- a stray file shadows a config
def test_a_stray_file_does_not_shadow_a_shipped_config(tmp_path, monkeypatch):
    """An extension-less file ``tiny`` beside a config does not replace the shipped ``tiny`` for ``extends: tiny``
    (nor does ``--print-config`` name it "config tiny"): a bare name is the shipped config; ``./tiny`` names the
    file, and the sources name the file actually read."""
    from experiments.app.config import CONFIG_DIR, load_config, load_config_sources

    shipped = load_config("tiny")
    (tmp_path / "tiny").write_text("model: {d: 4}\n")
    (tmp_path / "child.yaml").write_text("extends: tiny\n")
    (tmp_path / "explicit.yaml").write_text("extends: ./tiny\n")
    monkeypatch.chdir(tmp_path)
    cfg, sources = load_config_sources("child.yaml")
    assert cfg["model"]["d"] == shipped["model"]["d"] != 4
    assert sources["model.heads"] == f"config {CONFIG_DIR / 'tiny.yaml'}"
    cfg, sources = load_config_sources("explicit.yaml")
    assert cfg["model"]["d"] == 4 and sources["model.d"] == f"config {tmp_path / 'tiny'}"
    assert load_config("tiny")["model"]["d"] == shipped["model"]["d"]          # --config tiny: the shipped one
    assert load_config("./tiny")["model"]["d"] == 4


def test_an_extensionless_name_that_is_not_shipped_is_refused_with_a_hint(tmp_path):
    from experiments.app.config import ConfigError, load_config

    (tmp_path / "mybase").write_text("model: {d: 4}\n")
    (tmp_path / "child.yaml").write_text("extends: mybase\n")
    with pytest.raises(ConfigError, match=r"\./mybase"):
        load_config(str(tmp_path / "child.yaml"))
    (tmp_path / "base.yml").write_text("model: {d: 4}\n")                      # .yml is a user's file
    (tmp_path / "child.yaml").write_text("extends: base.yml\n")
    assert load_config(str(tmp_path / "child.yaml"))["model"]["d"] == 4


# --------------------------------------------------------------------------------- file graphs and short texts
@pytest.fixture(scope="module")
def graph_bundle(tmp_path_factory):
    """A model whose graph is a .npy edge list over all 16 slots (a ring: (i, i+1) and (0, 15))."""
    root = tmp_path_factory.mktemp("r5graph")
    edges = np.array([list(range(16)), [(i + 1) % 16 for i in range(16)]], dtype=np.int64)
    path = root / "ring.npy"
    np.save(path, edges)
    return _save(root / "bundle", overrides=[f"model.graph={path}"], graph_file=path.read_bytes())


def test_a_file_graph_model_predicts_a_short_text(graph_bundle, tmp_path):
    """``unfold-predict RUN --text "a fine film"`` on a file graph wider than the text predicts (no "edge 3 =
    (1, 3) is out of range"): a short text reads as it would padded to the graph's width, its prediction alone
    equal to its prediction in a batch with a full-length text."""
    code, out, err = run_cli(PREDICT, [graph_bundle, "--text", "a fine film", "--json"], str(tmp_path))
    assert code == 0, err
    alone = json.loads(out)
    long_text = " ".join(["good film"] * 10)
    code, out, err = run_cli(PREDICT, [graph_bundle, "--text", "a fine film", "--text", long_text, "--json"],
                             str(tmp_path))
    assert code == 0, err
    together = json.loads(out.splitlines()[0])
    assert together["tokens"] == alone["tokens"] == 3
    for k, p in alone["probabilities"].items():
        assert p == pytest.approx(together["probabilities"][k], rel=1e-5, abs=1e-7)
    assert alone["energies"] == pytest.approx(together["energies"], rel=1e-6)


def test_within_keeps_only_the_edges_among_the_slots_held():
    from experiments.app.graph_pin import within

    edges = np.array([[0, 1, 2, -1], [1, 5, 3, 0]])
    assert within(edges, 4).tolist() == [[0, 2, -1], [1, 3, 0]]      # a negative id is kept (and refused later)
    assert within(edges, 6) is edges


# --------------------------------------------------------------------------------- stdin: nothing lost before a bad line
def test_the_lines_before_a_bad_byte_on_stdin_are_answered(bundle, tmp_path, stdin):
    """A bad byte on line 2 loses no answer of the lines before it, even in one batch: line 1 is answered (and
    flushed), then line 2 refused by number."""
    stdin(b"good film\n\xff bad\ngreat\n")
    code, out, err = run_cli(PREDICT, [bundle, "--file", "-", "--json"], str(tmp_path))
    assert code == 2
    assert [json.loads(line)["text"] for line in out.splitlines()] == ["good film"], err
    assert "line 2" in err and "1 text(s) before it were answered" in err


# --------------------------------------------------------------------------------- check: a bound instead of hours
def test_check_refuses_a_run_of_hours_before_any_work(tmp_path, monkeypatch):
    """``--n 100000`` (16 samples of the complete graph on 100,000 tokens, hours of work) is refused before any
    token is drawn (the trace is never reached), and so is a window graph sized past the bound."""
    import unfold.check as check

    def never(*args, **kwargs):
        raise AssertionError("the check ran")
    monkeypatch.setattr(check, "trace_descent", never)
    code, out, err = run_cli(CHECK, ["--n", "100000"], str(tmp_path))
    assert code == 2 and out == "", err
    assert "too large" in err and "--n" in err and f"{check.MAX_WORK:,}" in err
    code, out, err = run_cli(CHECK, ["--graph", "window:2", "--n", "30000", "--samples", "4", "--d", "2",
                                     "--layers", "100000"], str(tmp_path))
    assert code == 2 and "too large" in err, err
