#!/usr/bin/env bash
# The tests: set up ./.venv with the test extras and run pytest. Exit code 5 (no tests collected) fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUOPT_EXTRA_PIP="pytest hypothesis expecttest scikit-learn tqdm matplotlib nvidia-cuda-cuobjdump" source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest -q tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing"
fi
exit "$rc"
