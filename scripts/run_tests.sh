#!/usr/bin/env bash
# The tests: set up ./.venv with the test extras and run pytest. Exit code 5 (no tests collected) fails.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# torchvision (tests/test_fuse.py) 0.29.1 requires torch==2.14.1, setup_env.sh's default: change the two together
GPUOPT_EXTRA_PIP="pytest hypothesis expecttest scikit-learn tqdm matplotlib nvidia-cuda-cuobjdump torchvision==0.29.1" source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
set +e
"$VENV/bin/python" -m pytest -q tests "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing"
fi
exit "$rc"
