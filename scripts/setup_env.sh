#!/usr/bin/env bash
# Creates (or reuses) ./.venv, installs torch and gpuopt into it. Idempotent: a second run only rebuilds what
# changed. Sourced by run_main.sh and run_tests.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUOPT_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${GPUOPT_TORCH_SPEC:-torch==2.14.1}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "== installing $TORCH_SPEC"
  "$VPY" -m pip install -q --upgrade pip >/dev/null
  "$VPY" -m pip install -q "$TORCH_SPEC"
fi
"$VPY" -m pip install -q numpy ninja "setuptools>=64" wheel ${GPUOPT_EXTRA_PIP:-}
# pip rebuilds an editable extension from scratch every time (minutes with nvcc), so skip the build when the
# sources, the build settings and torch are unchanged since the last successful build in this venv.
STAMP_FILE="$VENV/.gpuopt_build_stamp"
stamp=$( { cd "$ROOT" && find csrc setup.py pyproject.toml -type f -print0 | sort -z | xargs -0 sha256sum;
           "$VPY" -c "import torch; print(torch.__version__)";
           echo "${GPUOPT_CPU_ONLY:-} ${TORCH_CUDA_ARCH_LIST:-} ${CUDA_HOME:-}"; } | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$stamp" ] && "$VPY" -c "import gpuopt_ops" >/dev/null 2>&1; then
  echo "== gpuopt is up to date in $VENV (sources unchanged since its last build)"
else
  echo "== building gpuopt (pip install --no-build-isolation -e .)"
  start=$(date +%s)
  rm -f "$STAMP_FILE"
  MAX_JOBS="${MAX_JOBS:-2}" "$VPY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT" 2>&1 \
    | grep -E "gpuopt setup|error|Error" || true
  "$VPY" -c "import gpuopt_ops" || { echo "gpuopt failed to build or import; rerun with: $VPY -m pip install -v --no-build-isolation -e $ROOT"; exit 1; }
  echo "$stamp" > "$STAMP_FILE"
  echo "== gpuopt ready in $VENV (build step $(( $(date +%s) - start )) s)"
fi
