#!/usr/bin/env bash
# Run the test suite the way CI does: bootstrap (scripts/setup.sh, quick when
# nothing changed), then pytest from .venv over tests/.
#
#   bash scripts/test.sh                       # everything: in parallel, then the torchrun tests alone
#   bash scripts/test.sh -m unit               # extra arguments go to pytest
#   bash scripts/test.sh -m "unit or e2e" -k az_cli
#
# With no arguments (CI) the type checker runs first, once (mypy.ini: strict on the whole package, the runtime
# against torch's own types; its cache in build/ makes a re-run here take a second or two, a fresh clone's ~15 s).
# Exits with the first failure's status; "no tests collected" (pytest's 5) is a failure too.
#
# Where the time went (with no arguments): build/test-durations/contract.txt, parallel.txt and serial.txt, every
# test's seconds slowest first and each module's total (tests/conftest.py's --durations-file), and phases.txt,
# each phase's wall seconds (setup, mypy, contract, parallel, serial).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

DURATIONS="build/test-durations"
phase_started=$SECONDS
phases=()
phase_done() { phases+=("$(printf '%6d s  %s' $((SECONDS - phase_started)) "$1")"); phase_started=$SECONDS; }

bash scripts/setup.sh
phase_done setup
# shellcheck source=scripts/env.sh
source scripts/env.sh

# With no arguments (CI): the contract tests in parallel with three workers per core and one more, then everything
# else but the torchrun tests in parallel (pytest-xdist, a worker per core and one more), then the torchrun tests
# alone, one at a time: they train with several processes and assert how fast a job recovers, so they get the
# machine to themselves. With arguments, one plain pytest run with them.
pytest=("$ROOT/.venv/bin/python" -m pytest)
if ((!$#)); then
    "$ROOT/.venv/bin/python" -m mypy || { echo "test: the type checker found the above (mypy.ini)" >&2; exit 1; }
    phase_done mypy
    rm -rf "$DURATIONS"
fi
set +e
if (($#)); then
    "${pytest[@]}" "$@"
    rc=$?
else
    # One worker more than cores: many tests wait (az's LRO polls, services starting), not compute; work stealing:
    # each worker starts on a contiguous share (a module's fixtures set up once) and takes from the others at the
    # end. Measured on 2 cores, one run each: 492 s (3 workers, worksteal), 528 s (3, load), 529 s (4, load),
    # 557 s (3, load, one test at a time, slow modules first); 2 workers took 718 s (with two LRO polls then).
    # A fresh clone's CI run with 3 workers, worksteal: 536 s.
    cores=$(nproc 2>/dev/null || echo 2)
    workers=$((cores + 1))
    ((workers < 3)) && workers=3
    # The contract tests mostly wait: on the local ARM server's long-running operations (a poll after its
    # Retry-After: 1 s) and Kubernetes API, each az call a short start. Here (2 cores, loaded by other runs): 160
    # tests, 2,201 s of test time in 420 s with 7 workers, az using about one core; at 3 workers they would hold
    # the phase >= 735 s. The other tests compute (torch, pylint, a crash sweep) or start jobs: 3 workers.
    contract_workers=$((3 * cores + 1))
    "${pytest[@]}" -n "$contract_workers" --dist worksteal -m "contract and not torchrun" \
        --durations-file "$DURATIONS/contract.txt"
    rc=$?
    phase_done "contract (-n $contract_workers -m 'contract and not torchrun')"
    "${pytest[@]}" -n "$workers" --dist worksteal -m "not contract and not torchrun" \
        --durations-file "$DURATIONS/parallel.txt"
    rc2=$?
    phase_done "parallel (-n $workers -m 'not contract and not torchrun')"
    ((rc == 0)) && rc=$rc2
    "${pytest[@]}" -m torchrun --durations=10 --durations-file "$DURATIONS/serial.txt"
    rc2=$?
    phase_done "serial (-m torchrun)"
    ((rc == 0)) && rc=$rc2
    mkdir -p "$DURATIONS"
    printf '%s\n' "${phases[@]}" "$(printf '%6d s  total' "$SECONDS")" | tee "$DURATIONS/phases.txt"
fi
set -e

case "$rc" in
    0) ;;
    5) echo "test: pytest collected no tests (exit 5) for: ${*:-<all>} -- treating that as a failure" >&2 ;;
    *) echo "test: pytest failed (exit $rc)" >&2 ;;
esac
exit "$rc"
