import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADLINE = {"energy": {"trace_on_over_off", "reference_over_ours"}, "sparse": {"ours_over_pyg_time"},
            "model": {"ours_over_torch_steps_per_s"}, "attention": {"ours_over_sdpa_time"},
            "scaling": {"complete_time_loglog_slope", "window_time_loglog_slope"},
            # on the CPU through Triton's interpreter (conftest sets TRITON_INTERPRET=1 without a GPU): code and JSON
            "gpu": {"trace_on_over_off_n4096_plus", "ours_over_sdpa_time", "window8_over_complete_tokens_per_s"},
            "speed": {"exp_ours_over_sdpa_max", "other_rho_ours_over_sdpa_max", "trace_on_over_off_max",
                      "layer_over_torch_layer_max"}}


@pytest.mark.parametrize("suite", sorted(HEADLINE))
def test_quick_suite_prints_its_json_schema(suite, tmp_path):
    """Checks the JSON layout of each suite (--quick), not the speed: speed goals are read off the full runs."""
    proc = subprocess.run([sys.executable, "-m", "experiments.studies.bench", suite, "--quick", "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["suite"] == suite and out["quick"] is True
    assert HEADLINE[suite] <= set(out["ratios"]) and set(out["ratios"]) <= set(out["targets"])
    # a ratio of two timings is a finite number > 0; a log-log slope between two quick sizes measured once is a
    # finite number whose sign is noise on a loaded machine, or "nan" where a peak memory above the baseline was
    # not measurable (0) at the small size (the schema is checked here, never the speed)
    import math
    for k, v in out["ratios"].items():
        if "slope" in k:
            assert v == "nan" or (isinstance(v, (int, float)) and math.isfinite(v)), (k, v)
        else:
            assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (k, v)
    if suite == "gpu":     # every variant's row names each graph's ratio to the complete graph's
        from experiments.studies.bench import GPU_VARIANTS
        assert out["figures"]["variants"] and all(isinstance(row[f"{g}_over_complete"], float)
                                                  for row in out["figures"]["variants"] for g in GPU_VARIANTS)
    if suite == "speed":   # every timing beside its error against the float64 form, within float32's reach
        rows = out["figures"]["attention"]
        assert {r["rho"] for r in rows} == {"exp", "cauchy"} and all(r["sdpa"] for r in rows)
        assert all(0 <= r[k] < 1e-4 for r in rows for k in ("deg_rel_err", "agg_rel_err", "energy_rel_err"))
        assert out["figures"]["layer"] and all(t["verdict"] == "descent" for t in out["figures"]["trace"])
    if suite == "energy":  # the two energy evaluations agree
        assert out["figures"]["pair_energy"]["rel_diff"] < 1e-5


def test_unknown_suite_exits_2():
    from clifuzz import run_cli       # in process (the subprocess path of the alias is run by the quick suites)

    code, _, err = run_cli("experiments.studies.bench", ["nope"], ROOT)
    assert code == 2 and "valid: ['attention', 'compile', 'energy', 'gpu', 'model', 'scaling', 'sparse', 'speed']" in err


def test_the_peak_memory_probe_measures_a_fresh_process_above_its_baseline():
    """The memory figures of the full runs (``--quick`` leaves them out): a fresh process per case, its peak resident
    set less that of the same case at n = 8. One attention step on window:4 with n = 65,536 tokens of d = 64 holds
    at least its input and the input's gradient (16 MiB each in float32): it must come out more than 32 MiB above
    its baseline, and a case of n = 16 below that (a probe that measured nothing, or the parent, fails)."""
    import math
    from experiments.studies.bench import _peak_above_base

    base: dict = {}
    small = _peak_above_base("ours", 16, 64, 1, "window:4", base)
    large = _peak_above_base("ours", 65536, 64, 1, "window:4", base)
    assert math.isfinite(small) and math.isfinite(large)
    assert large > 32 > small, (small, large)
