#!/usr/bin/env bash
# Places the installed wheel's compiled extension (gpuopt_ops/_C*.so) into this checkout's gpuopt_ops/ folder
# (gitignored), so that `import gpuopt_ops` from the repository root, where Python finds
# the source folder before the venv's copy (`python -m benchmarks.run`, `python -m tools.roofline`), loads the same
# build as the installed wheel. Run by setup_env.sh after each install; usage: place_build.sh VENV_PYTHON.
# Copies, not links: `pip install -e .` later writes gpuopt_ops/_C*.so in place, which must not write through a
# link into the venv. Each file is copied to a temporary name and renamed, so two set-ups at once (CI's two
# venvs, same wheel) never leave a half-written library.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="${1:?usage: place_build.sh VENV_PYTHON}"
case "$VPY" in
  /*) ;;
  */*) VPY="$PWD/$VPY" ;;  # asked from / below
  *) VPY="$(command -v "$VPY")" ;;
esac
SRC_PKG="$ROOT/gpuopt_ops"
[ -d "$SRC_PKG" ] || { echo "place_build.sh: no source folder $SRC_PKG"; exit 1; }
# Where the venv imports gpuopt_ops from, asked from / (so that this checkout's folder is not the answer); no import.
INSTALLED=$(cd / && env -u PYTHONPATH "$VPY" -c "
import importlib.util, sys
spec = importlib.util.find_spec('gpuopt_ops')
sys.exit('gpuopt_ops is not installed in this venv') if spec is None else print(spec.submodule_search_locations[0])
")
if [ "$(cd "$INSTALLED" && pwd -P)" = "$(cd "$SRC_PKG" && pwd -P)" ]; then
  exit 0  # an editable install: the venv imports this folder itself
fi
shopt -s nullglob
libs=("$INSTALLED"/_C*.so)
[ "${#libs[@]}" -gt 0 ] || { echo "place_build.sh: no compiled _C*.so in $INSTALLED"; exit 1; }
# A build of another name left here (a per-Python _C.cpython-*.so of an old in-place build) would be imported
# before the abi3 one: only the installed names stay.
for old in "$SRC_PKG"/_C*.so; do
  [ -e "$INSTALLED/$(basename "$old")" ] || rm -f "$old"
done
TMP="$SRC_PKG/.placing.$$"
trap 'rm -f "$TMP"' EXIT
for f in "${libs[@]}"; do
  dst="$SRC_PKG/$(basename "$f")"
  if [ ! -L "$dst" ] && cmp -s "$f" "$dst"; then continue; fi
  cp "$f" "$TMP"
  mv -f "$TMP" "$dst"
done
