#!/usr/bin/env bash
# The one-call GPU check: run from the repository root on a machine with one CUDA GPU and PyTorch with
# Triton already installed (nothing is installed here; the repository is put on PYTHONPATH). Two phases, each made
# to fit one call of at most 10 minutes; every figure lands in $OUT (default ./gpu_out) as JSON or text:
#
#   bash scripts/gpu_checks.sh checks    # ~6 min: environment, profile of one layer, the CUDA tests, the speed suite
#   bash scripts/gpu_checks.sh listops   # ~9 min: listops_lra at LRA size on the GPU, checked in float64 at the end
#
# Each step has its own time limit, so a slow one costs its own figures only; a step's exit code is in steps.txt.
set -u
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PY:-python3}"
phase="${1:-checks}"

step() {   # step NAME SECONDS COMMAND...: run with a limit, output to $OUT/NAME.txt, exit code to steps.txt
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0))" | tee -a "$OUT/steps.txt"
}

if [ "$phase" = checks ]; then
  step env 30 bash -c "nvidia-smi -L; $PY -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))'; which ncu"
  step profile 90 $PY -m experiments.studies.profile_layer --n 4096 --batch 4 --json "$OUT/profile.json"
  step tests 200 env UNFOLD_TRITON_AUTOTUNE=0 $PY -m pytest -q -p no:cacheprovider tests/test_fused_cuda.py tests/test_meta.py \
    tests/test_triton.py tests/test_tf32x3.py tests/test_triton_rho.py tests/test_triton_tiles.py \
    tests/test_backends.py tests/test_verdicts.py -k "cuda or fused or triton or meta"
  step speed 240 bash -c "$PY -m experiments.studies.bench speed --device cuda --json > '$OUT/speed.json'"
elif [ "$phase" = listops ]; then
  # the whole LRA-size run; steps.txt has its wall time (data generation and the float64 check included)
  step listops_lra 560 bash -c "rm -rf /tmp/lra; $PY -m experiments.app.train --config listops_lra --run-dir /tmp/lra \
    train.device=cuda train.precision=bfloat16 ${LISTOPS_ARGS:-} && cp /tmp/lra/metrics.json '$OUT/listops_lra_metrics.json'"
else
  echo "usage: bash scripts/gpu_checks.sh checks|listops" >&2
  exit 2
fi
