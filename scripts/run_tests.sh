#!/usr/bin/env bash
# The tests: set up the venv (scripts/setup_env.sh: torch, the test extras, gpuopt's wheel) and run pytest on the
# installed wheel, not on the source tree: pytest runs in build/test-tree, a copy of this repository without the
# package folders (gpuopt_ops/, triton_kernels/), so `import gpuopt_ops` can only find the installed wheel.
# Arguments go to pytest. Exit code 5 (no tests collected) fails. The same knobs as setup_env.sh; e.g. the GPU
# machine's stack (Python 3.12, torch 2.11, triton 3.6) in its own venv, with the same wheel:
#   GPUOPT_VENV=.venv-torch2.11 PYTHON=python3.12 GPUOPT_TORCH_SPEC="torch==2.11.0 triton==3.6.0" \
#   GPUOPT_TORCHVISION=torchvision==0.26.0 bash scripts/run_tests.sh
# Knobs of this script: GPUOPT_TEST_WORKERS (below), GPUOPT_TEST_TREE (the copy pytest runs in, default
# build/test-tree; two runs at once need two), GPUOPT_SETUP_ONLY=1 (stop once the wheel is installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# torchvision (tests/test_fuse.py) must match torch: 0.29.1 <-> torch 2.14.1 (the default), 0.26.0 <-> torch 2.11.0
TV="${GPUOPT_TORCHVISION:-torchvision==0.29.1}"
GPUOPT_EXTRA_PIP="pytest pytest-xdist==3.8.0 hypothesis expecttest scikit-learn tqdm matplotlib nvidia-cuda-cuobjdump liger-kernel==0.6.1 transformers==5.23.0 timm==1.0.31 $TV" \
  source "$ROOT/scripts/setup_env.sh"
if [ "${GPUOPT_SETUP_ONLY:-0}" = "1" ]; then
  echo "== GPUOPT_SETUP_ONLY=1: set up, no tests"
  exit 0
fi
TREE="${GPUOPT_TEST_TREE:-$ROOT/build/test-tree}"
# the emulator's compiled test extensions (tools/cuda_emu/build.py), kept between runs; keyed by torch + Python
export GPUOPT_EMU_BUILD_DIR="${GPUOPT_EMU_BUILD_DIR:-$ROOT/build/cuda-emu}"
# the Triton compile results of the Triton gate and the performance model (tools/triton_resources.py), kept between
# runs; an entry is named by everything its compile reads (kernel source, signature, options, triton's version)
export GPUOPT_TRITON_STORE="${GPUOPT_TRITON_STORE:-$ROOT/build/triton-store}"
# the CUDA build's resource analysis (tools/cuda_resources.py) and the SASS the performance model reads
# (tools/roofline.py), kept between runs; an entry is named by the code's bytes, the arguments, the disassembler and
# the parser, so a rebuilt extension is read afresh
export GPUOPT_TOOL_STORE="${GPUOPT_TOOL_STORE:-$ROOT/build/tool-store}"
# Python's bytecode for every process of the run (pytest's workers, the torchrun ranks, the commands the tests
# start) is kept in one folder, build/pycache, between runs: where the environment sets PYTHONDONTWRITEBYTECODE, each
# process otherwise compiled every module it imported from source (torch and its dependencies, installed without
# bytecode: scripts/setup_env.sh), ~2.3 s of CPU a process, and each pytest worker rewrote every test module again.
# An entry is checked against its source's mtime and size (the tar copy below keeps both). Nothing is written beside
# a source file, in the venv or in the checkout. PYTHONPYCACHEPREFIX in the environment wins.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$ROOT/build/pycache}"
unset PYTHONDONTWRITEBYTECODE
mkdir -p "$TREE"
find "$TREE" -mindepth 1 -maxdepth 1 ! -name .pytest_cache -exec rm -rf {} +
(cd "$ROOT" && tar -cf - --exclude=./gpuopt_ops --exclude=./triton_kernels --exclude=./build --exclude=./dist \
   --exclude='./.venv*' --exclude=./.git --exclude='./*.egg-info' --exclude=./tools/cuda_emu/.build --exclude=./runs --exclude='*/__pycache__' --exclude=./.pytest_cache \
   --exclude=./.hypothesis --exclude=./bench_out --exclude=./gpu_check_out .) | (cd "$TREE" && tar -xf -)
cd "$TREE"
echo "== pytest in $TREE on $("$VPY" -c 'import sys, torch, gpuopt_ops; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, gpuopt from {gpuopt_ops.__file__}")')"
set +e
# One pytest-xdist worker per core (GPUOPT_TEST_WORKERS=N to choose; 1: one process). --dist loadgroup keeps the
# files that share a costly fixture on one worker (tests/conftest.py). A later `-n` among the arguments wins.
WORKERS="${GPUOPT_TEST_WORKERS:-auto}"
XDIST=()
if [ "$WORKERS" != "1" ] && [ "$WORKERS" != "0" ]; then
  XDIST=(-n "$WORKERS" --dist loadgroup)
  # one intra-op thread a worker (a worker per core already fills the cores; tests that vary the thread count set
  # it themselves): with torch's default of a thread per core, the 2-core machine's fast lane took 128.5 s of
  # pytest, with one 113.2 s. OMP_NUM_THREADS in the environment wins.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
"$VPY" -m pytest -q "${XDIST[@]}" "$@"  # no paths given: pyproject.toml's testpaths (tests/)
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing"
fi
exit "$rc"
