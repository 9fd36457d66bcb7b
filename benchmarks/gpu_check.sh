#!/usr/bin/env bash
# The GPU machine's check of gpuopt, in one script (< 8 minutes): build, GPU tests, compute-sanitizer, memory,
# the speed measurement (benchmarks/gpu_measure.py), ncu counters, the torch.compile comparison, plots. Run from the repository root:
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]          # OUT_DIR defaults to $OUT, else ./gpu_check_out
#
# Every step runs under `timeout` against one overall deadline, continues on failure, and writes its log to
# OUT_DIR/<step>.log; OUT_DIR/summary.txt gets one line per step: name, rc, seconds (rc 124 = timed out,
# "skipped" = no time left or a prerequisite failed). The script's exit code is 0 only when every step passed.
#
# Made for the GPU machine: system python3 (no venv, no network) with torch and triton installed, nvcc and
# compute-sanitizer from the CUDA toolkit, an sm_90 GPU. Knobs (environment):
#   GPU_CHECK_PYTHON      python to use (default python3)
#   GPU_CHECK_BUDGET      overall seconds (default 460)
#   GPU_CHECK_WHEEL       a prebuilt gpuopt wheel (dist/gpuopt-*-cp310-abi3-*.whl, built on a CPU machine with
#                         `bash scripts/setup_env.sh` or `pip wheel --no-build-isolation --no-deps . -w dist/` and
#                         carried here): installed into OUT_DIR/site instead of building (no nvcc, no minutes)
#   GPU_CHECK_SKIP_BUILD  1 = use the extension already built in place
#   dist/peers/*.whl      peers' wheels (liger-kernel, quack-kernels and what they need), installed with --no-deps
#                         into OUT_DIR/peers for the benchmarks' liger and quack providers
#   TORCH_CUDA_ARCH_LIST  default 9.0 (H100/H200);  MAX_JOBS  default 16
#   GPU_CHECK_DRY_RUN     1 = print every step's command and time limit, run nothing (works without a GPU)
#   GPU_CHECK_MEASURE_ONLY 1 = only the set-up and speed steps: env, install/build, peers, import, measure, ncu
#   GPU_CHECK_COMMIT      the commit of the measured build, for the measurement file's name (default: git, if the
#                         checkout has its .git, else "unknown")
set -u

OUT_DIR="${1:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
PY="${GPU_CHECK_PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET:-460}"
START=$(date +%s)
DEADLINE=$((START + BUDGET))
SUMMARY="$OUT_DIR/summary.txt"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-16}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
FAILED=0
BUILD_OK=0

: >"$SUMMARY"
echo "gpu_check $(date -Is) repo=$PWD out=$OUT_DIR python=$PY budget=${BUDGET}s arch=$TORCH_CUDA_ARCH_LIST" \
  | tee -a "$SUMMARY"

# step NAME CAP_SECONDS RESERVE_SECONDS -- command...
# Runs the command with timeout min(CAP, time left - RESERVE): RESERVE (scaled by GPU_CHECK_BUDGET / 460) keeps
# time for the later steps. Sets LAST_RC (a number, or "skipped").
step() {
  local name=$1 cap=$2 reserve=$(($3 * BUDGET / 460))
  shift 4
  local now left limit t0 rc
  LAST_RC=skipped
  if [ "${GPU_CHECK_MEASURE_ONLY:-0}" = "1" ]; then
    case $name in
      env | install | build | peers | import | measure | ncu) ;;
      *)
        printf '%-16s rc=skipped (GPU_CHECK_MEASURE_ONLY=1)\n' "$name" | tee -a "$SUMMARY"
        return 0
        ;;
    esac
  fi
  now=$(date +%s)
  left=$((DEADLINE - now - reserve))
  limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 5 ]; then
    printf '%-16s rc=skipped (no time left: %ss)\n' "$name" "$left" | tee -a "$SUMMARY"
    FAILED=1
    return 0
  fi
  if [ "${GPU_CHECK_DRY_RUN:-0}" = "1" ]; then
    printf '%-16s dry run (limit %ss): %s\n' "$name" "$limit" "$*" | tee -a "$SUMMARY"
    LAST_RC=0
    return 0
  fi
  t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*" >>"$OUT_DIR/$name.log"
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >>"$OUT_DIR/$name.log" 2>&1
  rc=$?
  printf '%-16s rc=%-4s %4ss  (log %s.log)\n' "$name" "$rc" "$(($(date +%s) - t0))" "$name" | tee -a "$SUMMARY"
  [ "$rc" -eq 0 ] || FAILED=1
  LAST_RC=$rc
  return 0
}

skip() {
  printf '%-16s rc=skipped (%s)\n' "$1" "$2" | tee -a "$SUMMARY"
  FAILED=1
}

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
    /usr/local/cuda/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# ---------------------------------------------------------------------------------------------- 1. environment
step env 30 400 -- bash -c "
  $PY -c 'import sys, torch; print(\"python\", sys.version.split()[0]); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); print(torch.cuda.get_device_name() if torch.cuda.is_available() else \"no GPU\")'
  $PY -c 'import triton; print(\"triton\", triton.__version__)' || true
  nvidia-smi || true
  (command -v nvcc && nvcc --version) || ls -l /usr/local/cuda/bin/nvcc || true
  nproc; free -g || true
"

# ---------------------------------------------------------------------------------------------- 2. build
if [ -n "${GPU_CHECK_WHEEL:-}" ]; then
  # the prebuilt wheel, in its own folder ahead of the checkout on PYTHONPATH; PYTHONSAFEPATH keeps `python -m`
  # (here and in the tests' subprocesses) from putting the checkout's gpuopt_ops/ (no _C) first
  SITE="$OUT_DIR/site"
  step install 60 190 -- "$PY" -m pip install --no-deps --no-index --upgrade --target "$SITE" "$GPU_CHECK_WHEEL"
  export PYTHONPATH="$SITE:$PYTHONPATH"
  export PYTHONSAFEPATH=1
elif [ "${GPU_CHECK_SKIP_BUILD:-0}" = "1" ]; then
  echo "build            skipped on request (GPU_CHECK_SKIP_BUILD=1)" | tee -a "$SUMMARY"
else
  step build 240 190 -- "$PY" setup.py build_ext --inplace
fi
# peers' wheels carried in dist/peers/ (the machine has no network): the liger and quack providers of the benchmarks
PEERS=$(ls "$PWD"/dist/peers/*.whl 2>/dev/null | tr '\n' ' ')
if [ -n "$PEERS" ]; then
  # shellcheck disable=SC2086
  step peers 60 185 -- "$PY" -m pip install --no-deps --no-index --upgrade --target "$OUT_DIR/peers" $PEERS
  export PYTHONPATH="$PYTHONPATH:$OUT_DIR/peers"
fi
step import 60 180 -- "$PY" -c "
import torch, gpuopt_ops
ok = torch._C._dispatch_has_kernel_for_dispatch_key('gpuopt::layer_norm_dropout_relu', 'CUDA')
print('gpuopt_ops from', gpuopt_ops.__file__, '| CUDA kernels registered:', ok)
raise SystemExit(0 if ok else 1)
"
[ "$LAST_RC" = 0 ] && BUILD_OK=1
if [ "$BUILD_OK" = 1 ]; then
  # registers, stack, shared memory and launch bounds of the kernels as built here (the same gate CI runs)
  step resources 60 170 -- "$PY" -m tools.cuda_resources --json "$OUT_DIR/resources.json"
fi

# ---------------------------------------------------------------------------------------------- 3. GPU tests
if [ "$BUILD_OK" = 1 ]; then
  # the cuda- and triton_gpu-marked tests: the cuda and triton backends of tests/backends.py in every test file
  # (every op of tests/op_table.py, gated_act included, and the files that take backend_params(), e.g.
  # tests/test_gated_mlp.py), selected by marker, so a new op's GPU tests join by themselves
  # several workers where pytest-xdist is installed: most of this step is Triton compiling kernels on the CPUs
  XDIST=""
  if "$PY" -c "import xdist" 2>/dev/null; then XDIST="-n ${GPU_CHECK_TEST_WORKERS:-8} --dist loadgroup"; fi
  # one hung test must not eat the step: pytest-timeout, where installed, fails it after 90 s
  PYTIMEOUT=""
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then PYTIMEOUT="--timeout=90"; fi
  # with a wheel, pytest runs in a copy of the checkout without the package folders: pyproject.toml puts the
  # test root first on sys.path, where the checkout's gpuopt_ops/ (no _C) would shadow the wheel (as in
  # scripts/run_tests.sh)
  TEST_ROOT="$PWD"
  if [ -n "${GPU_CHECK_WHEEL:-}" ] && [ "${GPU_CHECK_DRY_RUN:-0}" != "1" ] && [ "${GPU_CHECK_MEASURE_ONLY:-0}" != 1 ]; then
    TEST_ROOT="$OUT_DIR/test-tree"
    rm -rf "$TEST_ROOT" && mkdir -p "$TEST_ROOT"
    tar -cf - --exclude=./gpuopt_ops --exclude=./triton_kernels --exclude=./build --exclude=./dist \
      --exclude='./.venv*' --exclude=./.git --exclude='*/__pycache__' --exclude=./gpu_check_out . \
      | (cd "$TEST_ROOT" && tar -xf -)
  fi
  # shellcheck disable=SC2086
  step tests 180 150 -- bash -c "cd '$TEST_ROOT' && '$PY' -m pytest -q $XDIST -m 'cuda or triton_gpu' tests \
    -p no:cacheprovider $PYTIMEOUT --junitxml='$OUT_DIR/tests_junit.xml'"
else
  skip tests "extension did not build/import"
fi

# ---------------------------------------------------------------------------------------------- 4. compute-sanitizer
SAN="$(find_sanitizer || true)"
[ "${GPU_CHECK_DRY_RUN:-0}" = "1" ] && SAN="${SAN:-compute-sanitizer}"
for tool in memcheck racecheck initcheck; do
  if [ "$BUILD_OK" != 1 ]; then
    skip "san_$tool" "extension did not build/import"
  elif [ -z "$SAN" ]; then
    skip "san_$tool" "compute-sanitizer not found"
  else
    # no caching allocator: out-of-bounds accesses inside a larger cached block become visible
    step "san_$tool" 45 100 -- env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool "$tool" --error-exitcode 1 \
      --print-limit 50 "$PY" tools/cuda_sanitize.py
  fi
done

# ---------------------------------------------------------------------------------------------- 5. memory
if [ "$BUILD_OK" = 1 ]; then
  step memory 45 80 -- "$PY" -m benchmarks.memory --device cuda --out "$OUT_DIR/memory"
else
  skip memory "extension did not build/import"
fi

# ---------------------------------------------------------------------------------------------- 6. speed
# (a) benchmarks/gpu_measure.py, the prepared measurement (kernel time from the profiler, CUDA-graph replay, eager
# wall and host time of every op x direction x backend x dtype x N, as fractions of a copy in the same run): its
# --budget is this step's limit, it trims itself to it and rewrites its file after every (dtype, N) group, so a
# stop leaves what was measured; the file goes to OUT_DIR/measurements and docs/measurements.
# (b) ncu counters of six kernels (skipped, with the reason in its file, where ncu is missing or fails).
# (c) torch.compile (max-autotune, slow to compile) on a few cases with all providers, for the speed-ups against
# compile (benchmarks.run; --time-budget stops it cleanly, its CSV is written row by row). Its ops are named: the
# gated ops (benchmarks.run's gated, gated_packed) are measured in (a), beside Liger's SwiGLU, and left out here so
# that they do not take this step's budget from the others.
limit_for() {  # limit_for CAP RESERVE: the limit `step` will give, for the scripts' own budgets
  local left=$((DEADLINE - $(date +%s) - $2 * BUDGET / 460))
  echo $(($1 < left ? $1 : left))
}
MEASURE_ARGS=(--out-dir "$OUT_DIR/measurements" --out-dir "$PWD/docs/measurements" --log-dir "$OUT_DIR/measure_logs")
[ -n "${GPU_CHECK_COMMIT:-}" ] && MEASURE_ARGS+=(--commit "$GPU_CHECK_COMMIT")
# time kept after each: for ncu, bench_compile and plots; with GPU_CHECK_MEASURE_ONLY=1 for ncu alone
if [ "${GPU_CHECK_MEASURE_ONLY:-0}" = 1 ]; then MEASURE_RESERVE=90 NCU_RESERVE=0; else MEASURE_RESERVE=140 NCU_RESERVE=110; fi
if [ "$BUILD_OK" = 1 ]; then
  limit=$(limit_for 300 $MEASURE_RESERVE)
  step measure 300 $MEASURE_RESERVE -- "$PY" -m benchmarks.gpu_measure --budget $((limit > 40 ? limit - 10 : 20)) \
    "${MEASURE_ARGS[@]}"
  if [ "${GPU_CHECK_DRY_RUN:-0}" = "1" ]; then  # the plan and its time budget (no GPU needed)
    "$PY" -m benchmarks.gpu_measure --dry-run --budget $((limit > 40 ? limit - 10 : 20)) >"$OUT_DIR/measure_plan.txt" 2>&1
    echo "measure plan: $(grep '^total estimated' "$OUT_DIR/measure_plan.txt" || echo "no plan: see $OUT_DIR/measure_plan.txt")" \
      | tee -a "$SUMMARY"
  fi
  limit=$(limit_for 90 $NCU_RESERVE)
  step ncu 90 $NCU_RESERVE -- "$PY" -m benchmarks.gpu_measure --ncu --budget $((limit > 30 ? limit - 10 : 20)) \
    "${MEASURE_ARGS[@]}"
else
  skip measure "extension did not build/import"
  skip ncu "extension did not build/import"
fi
bench() {  # bench NAME CAP RESERVE args...
  local name=$1 cap=$2 reserve=$3
  shift 3
  local limit
  limit=$(limit_for "$cap" "$reserve")
  step "$name" "$cap" "$reserve" -- "$PY" -m benchmarks.run --device cuda --time-budget $((limit > 40 ? limit - 30 : 10)) "$@"
}
if [ "$BUILD_OK" = 1 ]; then
  bench bench_compile 110 15 --out "$OUT_DIR/bench_compile" --providers cuda,triton,eager,compile,liger,copy \
    --ops ldr,bias_relu,dan_ln,add_rms,ln_drop,bias_gelu --dtypes bf16 --ns 1024,8192 --modes fwd,fwd+bwd --rep-ms 50
else
  skip bench_compile "extension did not build/import"
fi

# ---------------------------------------------------------------------------------------------- 7. plots
csvs=$(ls "$OUT_DIR"/bench_*/bench_cuda.csv 2>/dev/null | tr '\n' ' ')
if [ -n "$csvs" ] || [ "${GPU_CHECK_DRY_RUN:-0}" = "1" ]; then
  # shellcheck disable=SC2086
  step plots 40 0 -- "$PY" -m benchmarks.plot $csvs
else
  skip plots "no benchmark CSV"
fi

total=$(($(date +%s) - START))
echo "total ${total}s, $([ "$FAILED" = 0 ] && echo 'all steps passed' || echo 'some steps failed or were skipped')" \
  | tee -a "$SUMMARY"
exit "$FAILED"
