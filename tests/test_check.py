import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import energies as E
import unfold as U
from reference import complete_edges, e1_numpy, undirected_edges
from unfold.check import main

REQUIRED = {"steps", "increases", "max_rel_increase", "energy_first", "energy_last", "energies", "terms", "tol_rule"}


def run_json(capsys, argv):
    rc = main(argv + ["--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1])


@pytest.mark.parametrize("rho", ["exp", "relu:1.5", "cauchy", "lp:1"])
@pytest.mark.parametrize("graph", ["complete", "window:2", "star"])
def test_input_energy_is_exactly_that_matrix(tmp_path, capsys, rho, graph):
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(11, 5))
    path = tmp_path / "Y.npy"
    np.save(path, Y)
    rc, out = run_json(capsys, ["--input", str(path), "--graph", graph, "--rho", rho, "--tau", "1.7",
                                "--layers", "3"])
    assert rc == 0
    assert REQUIRED <= set(out)
    edges = [tuple(e) for e in E.graph_from_spec(graph, 11).edges().T.tolist()]
    if graph == "complete":
        assert sorted(edges) == complete_edges(11)
    ref = e1_numpy(Y, edges, rho, 1.7)
    assert out["energy_first"][0] == pytest.approx(ref, rel=1e-10, abs=1e-10)
    assert out["energies"][0][0] == out["energy_first"][0]
    assert len(out["energies"][0]) == 4 and out["steps"] == 3
    term_sum = out["terms"]["attention"]["first"][0] + out["terms"]["residual"]["first"][0]
    assert term_sum == pytest.approx(out["energy_first"][0], rel=1e-12)


def test_input_npy_graph_file_any_orientation(tmp_path, capsys):
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(6, 3))
    np.save(tmp_path / "Y.npy", Y)
    both = np.array([[0, 1, 2, 3, 1, 5], [1, 0, 3, 2, 4, 0]])  # {0,1} and {2,3} twice, {1,4}, {0,5} once
    np.save(tmp_path / "g.npy", both)
    rc, out = run_json(capsys, ["--input", str(tmp_path / "Y.npy"), "--graph", str(tmp_path / "g.npy"),
                                "--tau", "1", "--layers", "1"])
    ref = e1_numpy(Y, undirected_edges(both, 6), "exp", 1.0)
    assert rc == 0 and out["energy_first"][0] == pytest.approx(ref, rel=1e-10)
    assert out["config"]["edges_per_sample"] == [4]


def test_checker_reports_exact_descent_and_printed_increases(capsys):
    rc, ok = run_json(capsys, ["--graph", "random:0.3", "--n", "32", "--d", "4", "--scale", "0.5",
                               "--samples", "64", "--layers", "10"])
    assert rc == 0 and ok["increases"] == 0 and ok["steps"] == 640 and ok["guaranteed"] is True
    assert all(last < first for first, last in zip(ok["energy_first"], ok["energy_last"]))
    rc, bad = run_json(capsys, ["--graph", "random:0.3", "--n", "32", "--d", "4", "--scale", "0.5",
                                "--samples", "64", "--layers", "10", "--update", "printed"])
    assert rc == 0  # increases are reported, not an error
    assert bad["increases"] > 0 and bad["max_rel_increase"] > 1e-8 and bad["guaranteed"] is False
    v = bad["violations"][0]
    assert {"sample", "layer", "before", "after", "terms_up", "tol"} <= set(v)
    assert v["after"] > v["before"] + v["tol"]
    assert bad["energies"][v["sample"]][v["layer"] + 1] == pytest.approx(v["after"], rel=1e-15)


def test_terms_are_reported_separately(capsys):
    rc, out = run_json(capsys, ["--graph", "window:1", "--residual", "input", "--layers", "4", "--samples", "3"])
    assert set(out["terms"]) == {"attention", "residual"}
    # with the initial residual B = Y_0 the residual term starts at 0 and must go up while the total goes down
    assert out["terms"]["residual"]["first"] == [0.0, 0.0, 0.0]
    assert out["terms"]["residual"]["increases"] > 0 and out["increases"] == 0
    rc, out = run_json(capsys, ["--graph", "complete", "--relu", "--alpha", "0.5", "--layers", "3", "--samples", "2"])
    assert set(out["terms"]) == {"attention", "residual", "relu"}


@pytest.mark.parametrize("argv, msg", [
    (["--alpha", "0"], "--alpha must lie in (0, 1]"),
    (["--alpha", "1.5"], "--alpha must lie in (0, 1]"),
    (["--tau", "-1"], "--tau must be > 0"),
    (["--graph", "hexagon"], "unknown graph 'hexagon'"),
    (["--graph", "window:0"], "positive integer"),
    (["--rho", "gauss"], "unknown rho 'gauss'"),
    (["--rho", "lp:5"], "0 < p <= 2"),
    (["--layers", "0"], "--layers must be >= 1"),
    (["--input", "/nonexistent/Y.npy"], "does not exist"),
    (["--graph", "/nonexistent/g.npy"], "does not exist"),
    (["--update", "printed", "--residual", "input"], "no initial residual"),
])
def test_bad_options_exit_2_with_a_message(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_bad_files_exit_2(tmp_path, capsys):
    (tmp_path / "junk.npy").write_bytes(b"not a numpy file")
    assert main(["--input", str(tmp_path / "junk.npy")]) == 2
    assert "could not be read" in capsys.readouterr().err
    np.save(tmp_path / "nan.npy", np.array([[0.0, np.nan], [1.0, 2.0]]))
    assert main(["--input", str(tmp_path / "nan.npy")]) == 2
    assert "non-finite value at token 0, feature 1" in capsys.readouterr().err
    np.save(tmp_path / "int.npy", np.array([[0, 1], [1, 2]]))
    assert main(["--input", str(tmp_path / "int.npy")]) == 2
    assert "floating-point" in capsys.readouterr().err
    np.save(tmp_path / "Y.npy", np.zeros((4, 2)))
    np.save(tmp_path / "g.npy", np.array([[0, 1], [1, 7]]))
    assert main(["--input", str(tmp_path / "Y.npy"), "--graph", str(tmp_path / "g.npy")]) == 2
    assert "out of range" in capsys.readouterr().err
    np.save(tmp_path / "loop.npy", np.array([[0, 2], [1, 2]]))
    assert main(["--input", str(tmp_path / "Y.npy"), "--graph", str(tmp_path / "loop.npy")]) == 2
    assert "self loop" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-option"])
    assert exc.value.code == 2


def test_module_entry_point_and_plot(tmp_path):
    png = tmp_path / "descent.png"
    proc = subprocess.run([sys.executable, "-m", "unfold.check", "--graph", "strided:4", "--rho", "cauchy",
                           "--samples", "4", "--layers", "5", "--plot", str(png), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["increases"] == 0 and "monotone descent" in proc.stdout
    assert png.stat().st_size > 10_000


def test_float32_checker(capsys):
    rc, out = run_json(capsys, ["--dtype", "float32", "--graph", "window:3", "--samples", "8", "--layers", "12"])
    assert rc == 0 and out["increases"] == 0
    assert "eps(float32)" in out["tol_rule"]


def test_trace_flags_an_injected_increase_and_names_it():
    """Negative control for the trace itself: a step that raises one term is flagged at that layer."""

    class Kick(U.Step):
        def __init__(self, base, at):
            super().__init__()
            self.base, self.at, self.calls = base, at, 0
            self.energy = base.energy

        def update(self, Y, graph):
            self.calls += 1
            out = self.base.update(Y, graph)
            return out + 3.0 if self.calls == self.at else out

    g = E.window(10, 2, 3)
    Y = torch.randn(3, 10, 4, dtype=torch.float64)
    step = Kick(U.AttentionStep("exp", 2.0, 1.0), at=3)
    _, rep = U.trace_descent(step, Y, g, layers=5)
    assert rep.increases[:, 2].all() and rep.num_increases == 3
    v = rep.violations[0]
    assert v["layer"] == 2 and "residual" in v["terms_up"]


def test_tolerance_scales_with_dtype_and_energy():
    vals = {"a": torch.tensor([100.0, -1.0], dtype=torch.float64), "b": torch.tensor([0.0, 3.0], dtype=torch.float64)}
    t64 = U.tolerance(vals, torch.float64)
    t32 = U.tolerance(vals, torch.float32)
    assert torch.allclose(t64, 64 * torch.finfo(torch.float64).eps * torch.tensor([100.0, 4.0], dtype=torch.float64))
    assert (t32 / t64).allclose(torch.tensor(torch.finfo(torch.float32).eps / torch.finfo(torch.float64).eps,
                                             dtype=torch.float64))


def test_untied_steps_are_traced_with_their_own_energies():
    g = E.complete(6, 2)
    Y = torch.randn(2, 6, 3, dtype=torch.float64)
    steps = [U.AttentionStep("exp", 1.0, 1.0), U.AttentionStep("cauchy", 2.0, 0.5), U.layernorm_step()]
    out, rep = U.trace_descent(steps, Y, g)
    assert rep.steps == 6 and rep.num_increases == 0
    assert rep.guaranteed == [True, True, True]
    assert set(rep.terms) == {"attention", "residual", "center", "rescale"}
    assert math.isnan(rep.terms["center"][0, 0])  # not part of layer 0's energy


def test_descent_experiment_quick(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.studies.descent", "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    totals = json.loads(proc.stdout.strip().splitlines()[-1])
    assert totals["exact_increases"] == 0 and totals["exact_steps"] > 0
    assert totals["negative_control"]["printed_increases"] > 0
    assert totals["negative_control"]["exact_increases"] == 0
    for f in ("summary.json", "summary.md", "descent.png", "negative_control.png"):
        assert (tmp_path / f).stat().st_size > 0


def test_unroll_is_an_iterator_over_layers_matching_the_trace():
    g = E.star(9, 2)
    Y = torch.randn(2, 9, 3, dtype=torch.float64)
    step = U.AttentionStep("relu:2", 1.5, 0.9)
    states = list(U.unroll(step, Y, g, layers=4))
    assert [t for t, _ in states] == [0, 1, 2, 3, 4]
    Y_T, rep = U.trace_descent(step, Y, g, layers=4)
    assert torch.equal(states[-1][1], Y_T)
    energies = torch.stack([step.energy.value(Yt, g) for _, Yt in states], dim=1)
    assert torch.allclose(energies, rep.totals, rtol=0, atol=0)


def test_overflowing_input_prints_the_failed_verdict_without_a_warning(tmp_path):
    """Adversarial review: an input whose energy overflows float64 printed numpy's RuntimeWarning ('invalid value
    encountered in subtract', inf - inf in the per-layer table) on stderr beside the NON-FINITE verdict."""
    np.save(tmp_path / "huge.npy", np.full((4, 3), 1e300))
    proc = subprocess.run([sys.executable, "-W", "default", "-m", "unfold.check", "--input", str(tmp_path / "huge.npy"),
                           "--layers", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "NON-FINITE ENERGY (a failed check)" in proc.stdout
    assert "monotone descent" not in proc.stdout
    assert proc.stderr == "", proc.stderr
