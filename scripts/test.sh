#!/usr/bin/env bash
# Run the test suite the way CI does: bootstrap (scripts/setup.sh, quick when
# nothing changed), then pytest from .venv over tests/.
#
#   bash scripts/test.sh                       # everything (unit, integration, e2e)
#   bash scripts/test.sh -m unit               # extra arguments go to pytest
#   bash scripts/test.sh -m "unit or e2e" -k az_cli
#
# Exits with pytest's status; "no tests collected" (pytest's 5) is a failure too.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

bash scripts/setup.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh

set +e
"$ROOT/.venv/bin/python" -m pytest "$@"
rc=$?
set -e

case "$rc" in
    0) ;;
    5) echo "test: pytest collected no tests (exit 5) for: ${*:-<all>} -- treating that as a failure" >&2 ;;
    *) echo "test: pytest failed (exit $rc)" >&2 ;;
esac
exit "$rc"
