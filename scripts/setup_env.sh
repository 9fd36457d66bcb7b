#!/usr/bin/env bash
# Creates (or reuses) a venv (./.venv unless GPUOPT_VENV), installs torch, then builds gpuopt's wheel once and
# installs it, and copies the installed build's _C into the checkout's gpuopt_ops/ (scripts/place_build.sh).
# Idempotent: a second run rebuilds nothing when the sources are unchanged. Sourced by run_main.sh and
# run_tests.sh. Knobs (environment):
#   GPUOPT_VENV        the venv (default ./.venv)
#   PYTHON             the interpreter that creates it (default python3; Python >= 3.10)
#   GPUOPT_TORCH_SPEC  the torch to install (default torch==2.14.1; with GPUOPT_TORCH_SPEC="torch==2.11.0
#                      triton==3.6.0" it is the GPU machine's stack). A CPU-only torch:
#                      GPUOPT_PIP_INDEX=https://download.pytorch.org/whl/cpu plus GPUOPT_CPU_ONLY=1
#   GPUOPT_PIP_INDEX   an --index-url for torch (optional)
#   GPUOPT_EXTRA_PIP   more packages to install (the scripts' extras)
#   GPUOPT_WHEEL       install this prebuilt wheel instead of building one
#   GPUOPT_DEPS_ONLY=1 stop after the dependencies (prepare a venv ahead of time)
#   GPUOPT_CPU_ONLY=1, TORCH_CUDA_ARCH_LIST, CUDA_HOME, MAX_JOBS (default 2): passed to the build (setup.py)
# The wheel (dist/gpuopt-<version>-cp310-abi3-linux_x86_64.whl) is on the LibTorch stable ABI and Python's limited
# API: the same file installs in every venv with torch >= 2.11 and Python >= 3.10, so a second venv reuses it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPUOPT_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${GPUOPT_TORCH_SPEC:-torch==2.14.1}"
DIST="$ROOT/dist"

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV ($("$PY" --version 2>&1))"
  "$PY" -m venv "$VENV" || { echo "cannot create a venv with $PY: install python3-venv (Debian/Ubuntu) or set PYTHON"; exit 1; }
fi
VPY="$VENV/bin/python"
# Dependencies: installed once per venv and list (a stamp of what was asked for), so a warm run asks pip nothing.
# --no-compile: pip would byte-compile all ~14k Python files of torch and the extras (about a minute of CPU);
# Python compiles the modules a program imports, once, when it first imports them (where the environment sets
# PYTHONDONTWRITEBYTECODE it writes none: the test command then keeps them in build/pycache, scripts/run_tests.sh).
# One stamp per list: run_main.sh and run_tests.sh ask for different extras and both stay satisfied.
DEPS="$TORCH_SPEC numpy ninja setuptools>=77 wheel ${GPUOPT_EXTRA_PIP:-} ${GPUOPT_PIP_INDEX:-}"
DEPS_STAMP="$VENV/.gpuopt_deps_$(echo "$DEPS" | sha256sum | cut -c1-16)"
if [ -f "$DEPS_STAMP" ] && "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "== dependencies installed in $VENV"
else
  rm -f "$DEPS_STAMP"
  if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    echo "== installing $TORCH_SPEC into $VENV"
    "$VPY" -m pip install -q --upgrade pip >/dev/null
    # shellcheck disable=SC2086
    "$VPY" -m pip install -q --no-compile ${GPUOPT_PIP_INDEX:+--index-url "$GPUOPT_PIP_INDEX"} $TORCH_SPEC
  fi
  # shellcheck disable=SC2086
  "$VPY" -m pip install -q --no-compile numpy ninja "setuptools>=77" wheel ${GPUOPT_EXTRA_PIP:-}
  echo "$DEPS" > "$DEPS_STAMP"
fi
if [ "${GPUOPT_DEPS_ONLY:-0}" = "1" ]; then
  echo "== GPUOPT_DEPS_ONLY=1: dependencies only, no gpuopt build"
  exit 0  # also ends run_tests.sh / run_main.sh, which source this file
fi

if [ -n "${GPUOPT_WHEEL:-}" ]; then
  WHEEL="$GPUOPT_WHEEL"
  stamp="prebuilt $(sha256sum "$WHEEL" | cut -d' ' -f1)"
else
  # The wheel holds the compiled _C and the Python packages: rebuild it when any of them or the build settings
  # change (not when torch does: the stable ABI).
  stamp=$( { cd "$ROOT" && find csrc gpuopt_ops triton_kernels setup.py pyproject.toml README.md LICENSE -type f \
               ! -name '*.so' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum;
             echo "${GPUOPT_CPU_ONLY:-} ${TORCH_CUDA_ARCH_LIST:-} ${CUDA_HOME:-}"; } | sha256sum | cut -d' ' -f1)
  WHEEL_STAMP="$DIST/.gpuopt_wheel_stamp"
  WHEEL=$(ls "$DIST"/gpuopt-*-cp310-abi3-*.whl 2>/dev/null | head -n1 || true)
  if [ -n "$WHEEL" ] && [ -f "$WHEEL_STAMP" ] && [ "$(cat "$WHEEL_STAMP")" = "$stamp" ]; then
    echo "== gpuopt wheel up to date: $WHEEL"
  else
    echo "== building the gpuopt wheel (pip wheel --no-build-isolation --no-deps . -w dist/); progress:"
    start=$(date +%s)
    rm -f "$DIST"/gpuopt-*.whl "$WHEEL_STAMP"
    # setuptools copies the packages into build/lib.*; a file deleted from the sources would stay there and ship in
    # the wheel. The compiled objects (build/temp.*) stay, so an unchanged csrc/ only relinks.
    rm -rf "$ROOT"/build/lib.* "$ROOT"/build/bdist.*
    mkdir -p "$DIST"
    # -v shows ninja's "[k/n] <compile>" lines; print those as "[k/n] <source file>", and our own messages.
    set +e
    (cd "$ROOT" && MAX_JOBS="${MAX_JOBS:-2}" "$VPY" -m pip wheel -v --no-build-isolation --no-deps . -w "$DIST" 2>&1) \
      | tee "$DIST/build.log" \
      | grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\]|gpuopt setup|error:|Error' \
      | sed -u -E -e 's#^\s*(\[[0-9]+/[0-9]+\]) .* -c ([^ ]+) .*#  \1 \2#' -e "s#$ROOT/##"
    rc=${PIPESTATUS[0]}
    set -e
    WHEEL=$(ls "$DIST"/gpuopt-*-cp310-abi3-*.whl 2>/dev/null | head -n1 || true)
    if [ "$rc" -ne 0 ] || [ -z "$WHEEL" ]; then
      echo "gpuopt: the wheel build failed (rc $rc); the full log is $DIST/build.log"; exit 1
    fi
    echo "$stamp" > "$WHEEL_STAMP"
    echo "== built $WHEEL in $(( $(date +%s) - start )) s"
  fi
fi

INSTALL_STAMP="$VENV/.gpuopt_install_stamp"
if [ -f "$INSTALL_STAMP" ] && [ "$(cat "$INSTALL_STAMP")" = "$stamp" ] && (cd / && "$VPY" -c "import gpuopt_ops") >/dev/null 2>&1; then
  echo "== gpuopt is installed in $VENV (the current wheel)"
else
  rm -f "$INSTALL_STAMP"
  "$VPY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
  (cd / && "$VPY" -c "import gpuopt_ops") || { echo "gpuopt: the wheel installed but does not import in $VENV"; exit 1; }
  echo "$stamp" > "$INSTALL_STAMP"
  echo "== gpuopt installed in $VENV from $(basename "$WHEEL")"
fi
# The README's commands (`python -m benchmarks.run`, `python -m tools.roofline`, ...) run from the repository root,
# where Python imports gpuopt_ops from the source folder, not the venv's: that folder gets the installed build's
# compiled _C (gitignored), so it imports the same build.
bash "$ROOT/scripts/place_build.sh" "$VPY"
