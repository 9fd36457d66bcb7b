#!/usr/bin/env bash
# The main job: set up ./.venv (scripts/setup_env.sh: torch, the training extras, gpuopt's wheel) and run the
# reference training loop on the bundled digits dataset. Extra arguments go to the loop (gpuopt-train --help).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUOPT_EXTRA_PIP="scikit-learn tqdm matplotlib" source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# the console script of the installed wheel (python -m gpuopt_ops.train here would import the source folder)
exec "$VENV/bin/gpuopt-train" "$@"
