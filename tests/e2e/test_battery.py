"""The battery: scripts as users write them (tests/support/battery_train.py), each a real 2-node local job through
the real az in the local default recovery mode, through an eviction with notice, one without and a scale-up after
each, compared with the same script as one uninterrupted 2-node run in the restart mode.

A mode is the local default only while it passes this (core/launch.py DEFAULT_RECOVERY): the test runs whatever
the default is, in-process (``BATTERY_RECOVERY=restart`` runs it on another mode, to see where that one stands),
and the restart mode's bn variant, AKS's default, kept passing. The reference run stays the restart mode's,
uninterrupted. Checked at every step the job kept (for each step, the records of the newest world that trained
it: a step trained again after a re-form replaces the earlier try):

- the global batch (this step's slices, joined in rank order), the learning rate the step used, the generator's
  state, the plain counter and AdamW's step count (its bias correction) after it: equal to the uninterrupted run's;
- the replicas are one: every rank's digest of parameters, optimizer state and EMA is the same after the step
  (in the bn variant with an expert that each rank's slice uses or not: its average must reach every rank);
- a parameter no forward uses never moves (bn variant: DDP leaves it without a gradient, so AdamW skips it);
- the gradient norm the script saw (``clip_grad_norm_``: the average over every rank, as DDP gives it) equals the
  uninterrupted run's within float error, at every world size: the global batch is fixed and its final partial
  batch splits evenly at 1 and 2 ranks, so the maths is one DDP run's. Not in the bn variant: its model is
  unseeded, so the two runs start from other weights (and with BatchNorm each rank normalises with its own
  slice's statistics in DDP too, so a world of another size computes another function anyway).
- the job is Succeeded after the last step of its last epoch, and each eviction really shrank the job;
- in the in-process mode, which checks the replicas (every 2 steps here), no check named a replica.
"""
from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from azext_elastictrain.core import launch
from tests.support.slices import read_records

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "support" / "battery_train.py"
# In the in-process mode the replicas are compared every 2 steps (runtime/replica_check.py), not every 100: a
# check that names a replica of a correct job (a false alarm, and a heal) fails the battery; restart ignores it.
REPLICA_CHECK_STEPS = "ELASTICTRAIN_REPLICA_CHECK_STEPS"
STEPS = 4 * 17  # battery_train.py: 4 epochs of 16 full global batches and one of 34 samples


def _records(out: Path) -> list[dict]:
    return read_records(out, "records-*.jsonl")


def kept_steps(records: list[dict]) -> dict[int, list[dict]]:
    """step -> the records of the newest world that trained it, one per rank in rank order: a step trained again
    after a re-form (or a discarded try) is replaced by the later one."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        by_step[record["step"]].append(record)
    kept = {}
    for step, tries in by_step.items():
        world = max(tries, key=lambda r: r["time"])["world"]
        newest: dict[int, dict] = {}
        for r in sorted((r for r in tries if r["world"] == world), key=lambda r: r["time"]):
            newest[r["rank"]] = r
        assert sorted(newest) == list(range(world)), f"step {step}: ranks {sorted(newest)} of a world of {world}"
        kept[step] = [newest[rank] for rank in range(world)]
    return kept


def compare_with_uninterrupted(run: dict[int, list[dict]], reference: dict[int, list[dict]], *,
                               same_weights: bool) -> None:
    assert sorted(run) == sorted(reference) == list(range(1, STEPS + 1)), (sorted(run), sorted(reference))
    for step in sorted(reference):
        got, want = run[step], reference[step]
        where = f"step {step} (world {len(got)}, uninterrupted {len(want)})"
        assert [i for r in got for i in r["ids"]] == [i for r in want for i in r["ids"]], f"{where}: global batch"
        for key in ("lr", "strength", "counter", "scale", "adam"):
            assert {r[key] for r in got} == {want[0][key]}, (where, key, [r[key] for r in got], want[0][key])
        assert all(r["replica"] == got[0]["replica"] for r in got), f"{where}: the replicas differ {got}"
        if same_weights:
            assert all(_same_norm(r["norm"], want[0]["norm"]) for r in got), (
                where, "gradient norm", [r["norm"] for r in got], want[0]["norm"])
    assert any(len(run[s]) == 1 for s in run), "no step was trained at world size 1: the evictions did not shrink it"
    unused = {r["unused"] for step in run.values() for r in step if "unused" in r}
    assert len(unused) <= 1, f"a parameter no forward uses moved (AdamW stepped it on a zero gradient): {unused}"


def _same_norm(got: float, want: float) -> bool:
    """Equal within float error; NaN on both sides at a step whose gradients overflowed (the scaler skipped it)."""
    return math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-6) or (math.isnan(got) and math.isnan(want))


def _start(az, name: str, variant: str, out: Path, *, recovery: str, evict: bool, slow: Path | None = None) -> None:
    # slow steps until the evictions are done: 68 of them must outlast two evictions and their scale-ups (at 0.5 s
    # an in-process job, which trains on at world size 1, once ran out of steps before the second scale-up; at 1 s
    # too, in CI, where a replacement took 30 s to start): the last epoch's steps wait up to 10 s more each
    env = [f"BATTERY_OUT={out}", *([f"BATTERY_SLOW={slow}", "BATTERY_STEP_DELAY=1.0"] if slow else []),
           f"{REPLICA_CHECK_STEPS}=2"]
    az("elastictrain", "job", "run", "--local", "--name", name, "--script", str(SCRIPT),
       "--script-args", f"--variant {variant}", "--min-nodes", "1" if evict else "2", "--max-nodes", "2",
       "--checkpoint-interval", "10", "--recovery", recovery, "--env", *env, "-o", "none",
       timeout=180)


def _evict_twice(az, name: str, slow: Path) -> None:
    """An eviction with notice, one without, each followed by the capacity back; then the rest at full speed."""
    _wait_world(az, name, 2)
    for notice in ("30", "0"):
        az.json("elastictrain", "evict", "simulate", "--local", "--job", name, "--notice-seconds", notice,
                "--replace-after", "3", "--wait", "--yes", timeout=300)
        _wait_world(az, name, 2)
    slow.unlink()


def _wait_succeeded(az, name: str) -> dict:
    return az.json("elastictrain", "job", "wait", "--local", "--name", name, "--state", "Succeeded",
                   "--timeout", "420", timeout=480)


def _wait_world(az, name: str, size: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = az.json("elastictrain", "job", "show", "--local", "--name", name)
        if shown["state"] == "Running" and shown.get("worldSize") == size:
            return
        assert shown["state"] in ("Running", "Pending"), f"{name} ended before the evictions: {shown}"
        time.sleep(1)
    raise AssertionError(f"{name} never trained at world size {size}")


CASES = [
    ("plain", None), ("bn", None),  # the local default mode (or BATTERY_RECOVERY's)
    # the other mode, AKS's default, kept passing: bn, whose unused head a restart's restore once refused
    ("bn", launch.RECOVERY_RESTART),
]


def _mode(mode: str | None) -> str:
    return mode or os.environ.get("BATTERY_RECOVERY") or launch.DEFAULT_RECOVERY["local"]


def _run_evicted(az, variant: str, mode: str, folder: Path) -> Path:
    """One evicted job of the battery, from its start to its end: its records' folder once it passed."""
    folder.mkdir(parents=True)
    slow = folder / "slow"
    slow.touch()  # the evicted job's steps are slow until its evictions are done (battery_train.py)
    name = f"evicted-{variant}-{mode}"
    try:
        _start(az, name, variant, folder / "out", recovery=mode, evict=True, slow=slow)
        _evict_twice(az, name, slow)
        done = _wait_succeeded(az, name)
        assert done["state"] == "Succeeded" and done["step"] == STEPS, done
        logs = az("elastictrain", "job", "logs", "--local", "--name", name).stdout
        assert "the replicas differ" not in logs, [line for line in logs.splitlines() if "differ" in line][:3]
        if mode == launch.RECOVERY_IN_PROCESS:  # the eviction with notice went through the handover
            assert "handing over: heartbeats stopped" in logs, "the node with the notice left without handing over"
    finally:
        az("elastictrain", "job", "delete", "--local", "--name", name, "--yes", check=False, timeout=180)
    return folder / "out"


def _run_uninterrupted(az, variant: str, folder: Path) -> Path:
    name = f"uninterrupted-{variant}"
    try:
        _start(az, name, variant, folder, recovery=launch.RECOVERY_RESTART, evict=False)
        done = _wait_succeeded(az, name)
        assert done["state"] == "Succeeded" and done["step"] == STEPS, done
    finally:
        az("elastictrain", "job", "delete", "--local", "--name", name, "--yes", check=False, timeout=180)
    return folder


@pytest.fixture(scope="module")
def battery(request: pytest.FixtureRequest, local_az,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Future[Path]]]:
    """Every selected case's evicted job and each variant's uninterrupted run, all at once on the module's one
    local cluster (e2e/conftest.py's ``local_az``: jobs do not disturb each other; the battery asserts no timing,
    and the evicted jobs' slow steps are sleeps): ("uninterrupted", variant) or (variant, mode) -> the records'
    folder, once that job passed. Each test waits for its own case."""
    selected = {(item.callspec.params["variant"], _mode(item.callspec.params["mode"]))
                for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    folder = tmp_path_factory.mktemp("battery")
    with ThreadPoolExecutor(max_workers=2 * len(selected)) as pool:
        runs = {("uninterrupted", variant): pool.submit(_run_uninterrupted, local_az, variant,
                                                        folder / f"uninterrupted-{variant}")
                for variant in sorted({variant for variant, _ in selected})}
        runs.update({(variant, mode): pool.submit(_run_evicted, local_az, variant, mode,
                                                  folder / f"evicted-{variant}-{mode}")
                     for variant, mode in sorted(selected)})
        yield runs


@pytest.mark.parametrize("variant,mode", CASES)
def test_the_default_mode_trains_what_one_uninterrupted_run_trains(variant, mode, battery) -> None:
    """The case's evicted job against its variant's uninterrupted run (both run in the module's fixture, beside
    the other cases')."""
    evicted = battery[(variant, _mode(mode))].result(timeout=900)
    reference = battery[("uninterrupted", variant)].result(timeout=900)
    kept = kept_steps(_records(reference))
    assert all(len(kept[s]) == 2 for s in kept), "the uninterrupted run was not 2 nodes throughout"
    compare_with_uninterrupted(kept_steps(_records(evicted)), kept, same_weights=variant != "bn")
