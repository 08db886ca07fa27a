#!/usr/bin/env bash
# The main job: set everything up (quick when already done), then run the demo:
# a real 2-node elastic training job on this machine surviving Spot evictions.
#
#   bash scripts/demo.sh              # extra arguments go to scripts/demo.py
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

ELASTICTRAIN_SETUP_TEST_TOOLS=0 bash scripts/setup.sh  # the demo needs no test tools (checkov, linters)
# shellcheck source=scripts/env.sh
source scripts/env.sh
exec "$ROOT/.venv/bin/python" scripts/demo.py "$@"
