#!/usr/bin/env bash
# Issue 37's GPU measurements in one short window, most valuable first, each under a time
# limit cut to what is left of the budget (a GPU is lent for about 15 minutes at a time):
#
#   source .gpu-site/setup.sh && bash bench/perf/gpu_session.sh OUT [SECONDS] [SCOPE]
#
# 1. bench/perf/gpu_ray.py at T5-base (300 steps; Ray and the plain loop, the two systems
#    issue 37 compares; the worker loop without Ray is the CPU proxy's), compiled with SCOPE
#    (default model). Each system compiles its own graphs (their inputs differ, so the Ray
#    worker's Inductor cache does not serve the plain loop): at ~193 s a cold compile, the
#    plain loop compiles while the Ray run runs (--overlap) and steps after it, so that
#    this step needs about 6 minutes, not 9. Its JSON is written after each system.
# 2. bench/perf/step_overhead.py: the near-zero model through the three systems.
# 3. The CUDA tests (no host-device sync inside a step, pinned batches, bf16; 33 s on an
#    H200), then the bf16 + Inductor GradCache test alone (it compiles two graphs cold:
#    more than 110 s there).
# On one H200 (2026-11-28, budget 555) steps 1 and 2 took 318 and 89 s.
# First, the bytecode of what was carried (see bytecode() below).
# Logs and JSON land in OUT; a step that overruns its limit is cut, the next one runs.
set -uo pipefail
out=${1:?usage: gpu_session.sh OUT [SECONDS] [SCOPE]}
budget=${2:-540}
scope=${3:-model}
mkdir -p "$out"
started=$SECONDS

step() {  # step NAME LIMIT COMMAND...: run under min(LIMIT, what is left), output tee'd
  local name=$1 limit=$2 left
  shift 2
  left=$((budget - (SECONDS - started)))
  if [ "$left" -lt 40 ]; then
    echo "[gpu] $name skipped: ${left} s left"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[gpu] $name (at most $limit s) from $((SECONDS - started)) s"
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  echo "[gpu] $name: exit $rc at $((SECONDS - started)) s"
}

# The packed site (.gpu-site, unpacked onto PYTHONPATH) carries no bytecode, and a process
# that may not write it (PYTHONDONTWRITEBYTECODE, set on this project's machines) compiles
# every module it imports from source, each time: Ray's in every Train worker and actor.
# Compile them once, as pip does at install, so that the start-up measured is a user's
# (on 2 CPU cores, no bytecode at all made a tiny run's start-up 53-62 s instead of 17).
bytecode() {
  local t=$SECONDS dirs=() d
  IFS=: read -ra dirs <<< "${PYTHONPATH:-}"
  for d in "${dirs[@]}" santa ray_jobs bench tests; do
    [ -d "$d" ] && [ "$(cd "$d" && pwd)" != "$PWD" ] && python -m compileall -q -j 0 "$d" >/dev/null 2>&1
  done
  echo "[gpu] bytecode compiled in $((SECONDS - t)) s (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
bytecode
python -c "import torch, transformers, ray; print(torch.__version__, transformers.__version__, ray.__version__)"
step gpu_ray 420 python bench/perf/gpu_ray.py --skip-local --overlap \
  --set "train.compile_scope=$scope" --output "$out/gpu_ray_$scope.json"
# The Ray run's windows (step_host_s, the stall) and its first lines.
run=$(ls -td /tmp/santa-gpu-ray/runs/bench-* 2>/dev/null | head -n 1)
[ -n "$run" ] && cp "$run/metrics.jsonl" "$out/gpu_ray_metrics.jsonl"
step step_overhead 150 python bench/perf/step_overhead.py --profile \
  --output "$out/step_overhead_gpu.json"
step cuda_tests 90 python -m pytest -q -p no:cacheprovider -o addopts= tests/test_gpu.py \
  tests/test_train_step.py -k "not grad_cache"
step cuda_grad_cache 300 python -m pytest -q -p no:cacheprovider -o addopts= tests/test_gpu.py \
  -k grad_cache
echo "[gpu] done in $((SECONDS - started)) s"
