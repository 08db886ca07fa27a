#!/usr/bin/env bash
# Build the extension's wheel the way azure-cli-extensions publishes one:
# dist/elastictrain-<VERSION>-py3-none-any.whl, installable with
#
#     az extension add --source dist/elastictrain-<VERSION>-py3-none-any.whl --yes
#
#   bash scripts/build.sh              # into dist/
#   bash scripts/build.sh OUT_DIR      # into OUT_DIR
#
# Uses .venv's setuptools (run scripts/setup.sh first) without build isolation,
# so nothing is downloaded; builds from a clean build folder each time, so a
# module deleted from the tree never lingers in the wheel.  Prints the wheel's path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

OUT="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd -P)"
PY="${ELASTICTRAIN_BUILD_PYTHON:-$ROOT/.venv/bin/python}"  # a Python with setuptools >= 70.1
[ -x "$PY" ] || { echo "build: $PY missing: run bash scripts/setup.sh first" >&2; exit 1; }

VERSION="$("$PY" setup.py --version 2>/dev/null | tail -n 1)"
WHEEL="$OUT/elastictrain-$VERSION-py3-none-any.whl"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

rm -f "$WHEEL"
# bdist_wheel's own build and temp folders live in $WORK, not in the tree's build/ (the dev extension's home).
"$PY" setup.py -q build --build-base "$WORK/build" egg_info --egg-base "$WORK" \
    bdist_wheel --bdist-dir "$WORK/bdist" --dist-dir "$OUT" --python-tag py3 >"$WORK/log" 2>&1 \
    || { cat "$WORK/log" >&2; echo "build: bdist_wheel failed" >&2; exit 1; }
[ -f "$WHEEL" ] || { ls -l "$OUT" >&2; echo "build: expected $WHEEL" >&2; exit 1; }
echo "$WHEEL"
