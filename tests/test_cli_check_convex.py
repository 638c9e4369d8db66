"""The boundaries of ``python -m unfold.check`` and ``python -m experiments.studies.convex_heads``: every
option is checked before any work, and no bad value reaches the user as a traceback.

Table-driven: each row is one bad invocation run through :func:`clifuzz.expect_refusal` (exit 2, one last
``error:`` line naming the flag / value / file, nothing written under the working folder or the data
folder). The convex-heads rows all fail before any data is loaded or any head is fitted.
"""
import argparse
import os

import numpy as np
import pytest
import torch

from clifuzz import expect_refusal
from test_train import CONFIGS

CHECK, CONVEX = "unfold.check", "experiments.studies.convex_heads"
TINY = os.path.join(CONFIGS, "tiny.yaml")
DEFAULT = os.path.join(CONFIGS, "default.yaml")
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A folder of bad (and a few good) input files, outside every case's working folder."""
    d = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    np.save(d / "Y.npy", rng.normal(size=(6, 3)))
    y = rng.normal(size=(6, 3))
    y[2, 1] = np.nan
    np.save(d / "nan.npy", y)
    y[2, 1] = np.inf
    np.save(d / "inf.npy", y)
    np.save(d / "int.npy", np.arange(18).reshape(6, 3))
    np.save(d / "vec.npy", np.ones(6))
    np.save(d / "cube.npy", np.ones((2, 6, 3)))
    np.save(d / "empty.npy", np.ones((0, 3)))
    np.save(d / "huge.npy", np.full((6, 3), 1e300))
    np.save(d / "complex.npy", np.ones((6, 3), dtype=complex))
    np.savez(d / "x.npz", a=np.ones((6, 3)))
    (d / "garbage.npy").write_bytes(b"this is not a numpy file")
    np.save(d / "edges_far.npy", np.array([[0, 1], [1, 99]]))
    np.save(d / "edges_float.npy", np.array([[0.0, 1.0], [1.0, 2.0]]))
    np.save(d / "edges_loop.npy", np.array([[0, 2], [1, 2]]))
    np.save(d / "edges_shape.npy", np.array([0, 1, 2]))
    (d / "folder.npy").mkdir()
    (d / "afile").write_text("a plain file\n")
    (d / "garbage.pt").write_bytes(b"\x00\x01 not a checkpoint")
    torch.save(torch.zeros(3), d / "tensor.pt")
    torch.save({"config": argparse.Namespace(x=1)}, d / "object.pt")
    (d / "bad.yaml").write_text("data: [unclosed\n")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    locked = d / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    yield d
    locked.chmod(0o700)


# ------------------------------------------------------------------------------------------ unfold.check
#: (argv, words the error line must name); {d} is the data folder
CHECK_CASES = [
    (["--layers", "-1"], ["--layers", "-1"]), (["--layers", "0"], ["--layers", "0"]), (["--layers=-9"], ["--layers", "-9"]),
    (["--layers", "x"], ["--layers", "x"]), (["--layers", "1.5"], ["--layers", "1.5"]),
    (["--layers", "1000000000"], ["--layers", "1000000000"]),
    (["--samples", "0"], ["--samples"]), (["--samples", "-3"], ["--samples", "-3"]), (["--samples", "2.5"], ["--samples"]),
    (["--n", "0"], ["--n", "0"]), (["--n", "-5"], ["--n"]), (["--n", "abc"], ["--n", "abc"]),
    (["--d", "0"], ["--d", "0"]), (["--d", "1e3"], ["--d", "1e3"]),
    (["--samples", "100000", "--n", "1000"], ["--samples", "--n", "--d", "limit"]),
    (["--scale", "nan"], ["--scale", "nan"]), (["--scale", "inf"], ["--scale", "inf"]), (["--scale", "0"], ["--scale"]),
    (["--scale", "-1"], ["--scale", "-1"]), (["--scale", "big"], ["--scale", "big"]),
    (["--alpha", "0"], ["--alpha", "0"]), (["--alpha", "1.5"], ["--alpha", "1.5"]), (["--alpha", "nan"], ["--alpha", "nan"]),
    (["--alpha=-inf"], ["--alpha", "-inf"]),
    (["--tau", "0"], ["--tau"]), (["--tau", "-1"], ["--tau", "-1"]), (["--tau", "nan"], ["--tau", "nan"]),
    (["--tau", "inf"], ["--tau", "inf"]),
    (["--tol-factor", "inf"], ["--tol-factor", "inf"]), (["--tol-factor", "nan"], ["--tol-factor", "nan"]),
    (["--tol-factor", "0"], ["--tol-factor"]), (["--tol-factor", "1e9"], ["--tol-factor"]),
    (["--tol-factor", "x"], ["--tol-factor", "x"]),
    (["--seed", "-1"], ["--seed", "-1"]), (["--seed", "99999999999999999999999"], ["--seed", "99999999999999999999999"]),
    (["--seed", "1.5"], ["--seed", "1.5"]),
    (["--device", "foo"], ["--device", "foo"]), (["--device", "meta"], ["--device", "meta"]),
    (["--device", "cpu:3"], ["--device", "cpu:3"]), (["--device", "mps"], ["--device", "mps"]),
    (["--device", ""], ["--device"]), (["--device", "cuda:99"], ["--device", "cuda:99"]),
    (["--dtype", "float16"], ["--dtype", "float16"]), (["--kernel", "flash"], ["--kernel", "flash"]),
    (["--update", "fast"], ["--update", "fast"]), (["--residual", "output"], ["--residual", "output"]),
    (["--update", "printed", "--residual", "input"], ["--update printed", "--residual"]),
    (["--no-such-option"], ["--no-such-option"]),
    (["--graph", "hexagon"], ["hexagon"]), (["--graph", "window:0"], ["window:0"]), (["--graph", "window:-3"], ["window:-3"]),
    (["--graph", "window:2.5"], ["window:2.5"]), (["--graph", "window:1e100"], ["window:1e100"]),
    (["--graph", "dilated:0"], ["dilated:0"]), (["--graph", "dilated:2:0"], ["dilated:2:0", "radius"]),
    (["--graph", "strided:1"], ["strided:1"]), (["--graph", "random:2"], ["random:2"]),
    (["--graph", "random:nan"], ["random:nan"]), (["--graph", "random:x"], ["random:x"]),
    (["--graph", "window:1:2"], ["window:1:2", "takes 1 argument"]), (["--graph", "star:3"], ["star:3"]),
    (["--graph", "dilated:1:2:3"], ["dilated:1:2:3", "1 to 2"]), (["--graph", ""], ["graph spec"]),
    (["--graph", "{d}/missing.npy"], ["missing.npy", "does not exist"]),
    (["--graph", "{d}/garbage.npy"], ["garbage.npy"]), (["--graph", "{d}/edges_float.npy"], ["edges_float.npy", "integers"]),
    (["--graph", "{d}/x.npz"], ["x.npz"]), (["--graph", "{d}/folder.npy"], ["folder.npy", "folder"]),
    (["--graph", "{d}/edges_far.npy", "--n", "6"], ["out of range"]),
    (["--graph", "{d}/edges_loop.npy", "--n", "6"], ["self loop"]),
    (["--graph", "{d}/edges_shape.npy", "--n", "6"], ["edge_index", "shape"]),
    (["--rho", "gauss"], ["gauss"]), (["--rho", "lp:5"], ["lp", "p=5"]), (["--rho", "relu:-1"], ["relu"]),
    (["--rho", "relu:nan"], ["relu"]), (["--rho", "exp:1:2:3"], ["exp"]), (["--rho", "softplus:1:inf"], ["softplus"]),
    (["--input", "{d}/missing.npy"], ["--input", "missing.npy"]), (["--input", "{d}/garbage.npy"], ["--input", "garbage.npy"]),
    (["--input", "{d}/nan.npy"], ["--input", "non-finite", "token 2, feature 1"]),
    (["--input", "{d}/inf.npy"], ["--input", "non-finite"]), (["--input", "{d}/int.npy"], ["--input", "int64"]),
    (["--input", "{d}/complex.npy"], ["--input", "complex"]),
    (["--input", "{d}/vec.npy"], ["--input", "(6,)"]), (["--input", "{d}/cube.npy"], ["--input", "(2, 6, 3)"]),
    (["--input", "{d}/empty.npy"], ["--input", "(0, 3)"]), (["--input", "{d}/x.npz"], ["--input", "npz"]),
    (["--input", "{d}/folder.npy"], ["--input", "folder"]),
    (["--input", "{d}/Y.npy", "--n", "7"], ["--n", "7"]), (["--input", "{d}/Y.npy", "--d", "2"], ["--d", "2"]),
    (["--input", "{d}/huge.npy", "--dtype", "float32"], ["--input", "float32"]),
    (["--plot", "."], ["--plot"]), (["--plot", "{d}"], ["--plot"]), (["--plot", "/nonexistent/dir/e.png"], ["--plot", "e.png"]),
    (["--plot", "{d}/afile/e.png"], ["--plot", "e.png"]), (["--plot", "e.xyz"], ["--plot", "xyz"]), (["--plot", ""], ["--plot"]),
    (["--kernel", "softmax", "--graph", "window:2"], ["softmax"]), (["--kernel", "streamed", "--graph", "star"], ["streamed"]),
    (["--kernel", "fused", "--rho", "cauchy"], ["fused"]),
]

# ------------------------------------------------------------------------------------ experiments.studies.convex_heads
#: every row fails before any data is read (--config tiny: the convex rows never touch a dataset)
CONVEX_CASES = [
    (["--dim", "0"], ["--dim", "0"]), (["--dim", "-1"], ["--dim", "-1"]), (["--dim", "x"], ["--dim", "x"]),
    (["--tokens", "0"], ["--tokens", "0"]), (["--tokens", "-4"], ["--tokens"]), (["--tokens", "2.5"], ["--tokens", "2.5"]),
    (["--train-examples", "0"], ["--train-examples", "0"]), (["--train-examples", "-1"], ["--train-examples"]),
    (["--train-examples", "1.5"], ["--train-examples", "1.5"]),
    (["--max-iter", "0"], ["--max-iter", "0"]), (["--max-iter", "-5"], ["--max-iter"]),
    (["--tol", "nan"], ["--tol", "nan"]), (["--tol", "-1"], ["--tol", "-1"]), (["--tol", "inf"], ["--tol", "inf"]),
    (["--tol", "x"], ["--tol", "x"]),
    (["--beta-frac", "0"], ["--beta-frac", "0"]), (["--beta-frac", "1.5"], ["--beta-frac", "1.5"]),
    (["--beta-frac", "-0.1"], ["--beta-frac"]), (["--beta-frac", "nan"], ["--beta-frac", "nan"]),
    (["--beta-frac", "inf"], ["--beta-frac", "inf"]), (["--beta-frac", "half"], ["--beta-frac", "half"]),
    (["--seed", "-1"], ["--seed", "-1"]), (["--seed", "18446744073709551616"], ["--seed"]),
    (["--method", "adam"], ["--method", "adam"]), (["--method", "Newton"], ["--method", "Newton"]),
    (["--warmup", "-1"], ["--warmup", "-1"]), (["--warmup", "x"], ["--warmup", "x"]), (["--warmup", "1.5"], ["--warmup", "1.5"]),
    (["--cg-iters", "0"], ["--cg-iters", "0"]), (["--cg-iters", "-3"], ["--cg-iters", "-3"]),
    (["--cg-iters", "2.5"], ["--cg-iters", "2.5"]), (["--features", "bert"], ["--features", "bert"]),
    (["--heads", "sa_softmax"], ["sa_softmax"]), (["--heads", "mlp_linear", "nope"], ["nope"]),
    (["--out", "{d}/afile"], ["--out", "afile"]), (["--out", "{d}/afile/sub"], ["--out", "afile"]), (["--out", ""], ["--out"]),
    (["--features", "model", "--checkpoint", "{d}/garbage.pt"], ["--checkpoint", "garbage.pt"]),
    (["--features", "model", "--checkpoint", "{d}/tensor.pt"], ["--checkpoint", "tensor.pt"]),
    (["--features", "model", "--checkpoint", "{d}/object.pt"], ["--checkpoint", "object.pt"]),
    (["--features", "model", "--checkpoint", "{d}/afile"], ["--checkpoint", "afile"]),
    (["--features", "model", "--checkpoint", "{d}/folder.npy"], ["--checkpoint", "folder"]),
    (["--config", "{d}/missing.yaml"], ["missing.yaml"]), (["--config", "{d}/bad.yaml"], ["bad.yaml"]),
    (["--config", "{d}/list.yaml"], ["list.yaml"]), (["--config", "{d}/folder.npy"], ["folder.npy"]),
    (["--set", "bogus.key=1"], ["bogus"]), (["--features", "glove"], ["glove"]),
    (["--quick", "--frobnicate"], ["--frobnicate"]),
]

CASES = [(CHECK, a, n) for a, n in CHECK_CASES] + [(CONVEX, a, n) for a, n in CONVEX_CASES]


def case_id(case):
    module, argv, _ = case
    return f"{module.split('.')[-1]}:{' '.join(argv).replace('{d}/', '')}"


def test_the_table_is_large_and_distinct():
    keys = [(m, tuple(a)) for m, a, _ in CASES]
    assert len(set(keys)) == len(keys) and len(keys) >= 70


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_bad_invocation_is_refused_in_one_line(case, data, tmp_path):
    module, argv, names = case
    argv = [a.replace("{d}", str(data)) for a in argv]
    names = [n.replace("{d}", str(data)) for n in names]
    if module == CHECK:
        flags = {a.split("=")[0] for a in argv}
        argv = argv + (["--samples", "2", "--layers", "2"] if not {"--samples", "--layers"} & flags else [])
    if module == CONVEX and "--config" not in argv:
        # tiny.yaml has data.glove: none, so the default run computes model features only (no data before a refusal)
        argv = ["--config", TINY] + ([] if "--features" in argv else ["--features", "model"]) + argv
    if module == CONVEX and "--out" not in argv:
        argv = argv + ["--out", str(tmp_path / "out")]
    if module == CONVEX and "--checkpoint" not in argv:
        argv = argv + ["--checkpoint", str(tmp_path / "none.pt")]
    expect_refusal(module, argv, str(tmp_path), names, watch=[str(data)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda_is_one_line(data, tmp_path):
    expect_refusal(CHECK, ["--device", "cuda", "--samples", "2", "--layers", "2"], str(tmp_path),
                   ["--device", "cuda", "not available"], watch=[str(data)])


@pytest.mark.skipif(ROOT_USER, reason="root may write anywhere")
def test_plot_into_a_folder_without_write_permission(data, tmp_path):
    expect_refusal(CHECK, ["--plot", str(data / "locked" / "e.png"), "--samples", "2", "--layers", "2"], str(tmp_path),
                   ["--plot", "e.png"], watch=[str(data)])
    expect_refusal(CONVEX, ["--config", TINY, "--features", "model", "--out", str(data / "locked" / "out")],
                   str(tmp_path), ["--out", "locked"], watch=[str(data)])


def test_a_good_plot_is_written_whole_and_alone(tmp_path):
    """The positive control of the --plot rows: a good path gets the PNG and nothing else beside it."""
    from clifuzz import run_cli

    code, out, err = run_cli(CHECK, ["--samples", "2", "--layers", "2", "--n", "6", "--d", "3", "--plot", "e.png"],
                             str(tmp_path))
    assert code == 0, err
    assert os.listdir(tmp_path) == ["e.png"] and (tmp_path / "e.png").stat().st_size > 1000


@pytest.mark.parametrize("spec", ["window:100000000", f"dilated:1:{10 ** 18}", f"strided:{10 ** 18}"])
def test_a_radius_far_beyond_n_runs_as_the_complete_window(spec, tmp_path, capsys):
    """The positive control of the graph rows: a radius far beyond --n is clamped (instant), not refused."""
    import json

    from clifuzz import run_cli

    code, out, err = run_cli(CHECK, ["--graph", spec, "--n", "8", "--d", "2", "--samples", "2", "--layers", "1",
                                     "--json"], str(tmp_path))
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["config"]["edges_per_sample"] == [28, 28]
