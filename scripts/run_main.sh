#!/usr/bin/env bash
# The main job: set up ./.venv (torch, gpuopt, the training extras) and run the reference training loop on the
# bundled digits dataset. Extra arguments go to the loop (python -m gpuopt_ops.train --help).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUOPT_EXTRA_PIP="scikit-learn tqdm matplotlib" source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m gpuopt_ops.train "$@"
