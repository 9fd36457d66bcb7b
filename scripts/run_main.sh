#!/usr/bin/env bash
# The main job: set up ./.venv and run the demo of both fused ops (the training loop replaces it later).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m gpuopt_ops.demo "$@"
