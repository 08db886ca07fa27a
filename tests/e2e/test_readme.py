"""README.md's Python blocks are tested code: each runs, as the README says it at test time, as a real 2-node
local job through the real az, through an eviction with notice, one without and a scale-up after each.

Every block is a whole training script a user copies. tests/support/readme_harness.py runs it unchanged and
records, per rank and per step the loop completed, the sample ids the step trained. Checked: the script got
its arguments untouched (torchrun-like ones too), every epoch trained each sample exactly once in the order
of an uninterrupted run over the history that ended in the final model, the job was never Succeeded while it
trained and is Succeeded after its last step, and each scale-up restored from memory (the newcomer from a peer).

The loops the README showed before (tests/support/legacy_*.py) run the same way through one eviction and the
scale-up after it, whose SIGTERM they used to take for the end of training: both at once, as two jobs of one
cluster (what each test checks is its own job's records; the jobs mostly wait, so together they take the time of
one). The module's jobs share one local cluster; each has its own name, records (``--env``) and checkpoints.
"""
from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from azext_elastictrain.backends import local_backend
from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
HARNESS = REPO / "tests" / "support" / "readme_harness.py"
# torchrun's own options and abbreviations of them, a value with spaces: they reach the script as given.
SCRIPT_ARGS = ["--n", "4096", "--nnodes", "3", "-m", "x", "--max-restarts", "2", "a b"]
SCRIPT_ARGS_TEXT = "--n 4096 --nnodes 3 -m x --max-restarts 2 'a b'"


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, as written."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


BLOCKS = python_blocks(README.read_text())


def test_the_readme_has_its_training_script() -> None:
    assert BLOCKS and all("Checkpointer" in block for block in BLOCKS), "README.md lost its training loop"


def _show(az, job: str) -> dict:
    return az.json("elastictrain", "job", "show", "--local", "--name", job)


def _wait_world(az, job: str, size: int, states: list[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = _show(az, job)
        states.append(shown["state"])
        if shown["state"] == "Running" and shown["worldSize"] == size and \
                sum(n["alive"] for n in shown["nodes"]) == size:
            return
        assert shown["state"] in ("Running", "Pending"), f"job {job} ended before the test was done: {shown}"
        time.sleep(1)
    raise AssertionError(f"job {job} never trained at world size {size}: {shown}")


def _evict(az, job: str, notice: bool, states: list[str]) -> dict:
    # No --node: the newest node goes (node-1 first, then its replacement); capacity is back 3 s later.
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", job,
                     "--notice-seconds", "30" if notice else "0", "--replace-after", "3", "--wait", "--yes",
                     timeout=300)
    _wait_world(az, job, 2, states)
    return result


def _history(out: Path) -> dict[int, list[dict]]:
    """step -> the records of the attempt that trained it last (the one in the final model), one per rank."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for path in out.glob("steps-*.jsonl"):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                assert number == len(lines) - 1, f"{path.name}:{number + 1} is not JSON"  # a kill mid-write
                continue
            by_step[record["step"]].append(record)
    history = {}
    for step, records in by_step.items():
        newest = max(records, key=lambda r: r["time"])["attempt"]
        chosen = sorted((r for r in records if r["attempt"] == newest), key=lambda r: r["rank"])
        assert [r["rank"] for r in chosen] == list(range(chosen[0]["world"])), (step, chosen)
        history[step] = chosen
    return history


def _check_exactly_once(history: dict[int, list[dict]], total: int) -> None:
    assert sorted(history) == list(range(1, total + 1))
    first = history[1][0]
    size, batch, seed = first["dataset_size"], first["global_batch"], first["seed"]
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for step in range(1, total + 1):
        chosen = history[step]
        per_epoch[chosen[0]["epoch"]].extend(i for r in chosen for i in r["ids"])
    assert sorted(per_epoch) == list(range(len(per_epoch))) and len(per_epoch) >= 2, sorted(per_epoch)
    for epoch, ids in per_epoch.items():
        # the epoch's order is a function of (seed, epoch) only: an uninterrupted run's global batches
        order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert len(ids) in (size, size - size % batch), f"epoch {epoch}: {len(ids)} samples of {size}"
        assert ids == order[:len(ids)], f"epoch {epoch}: not each sample once in the uninterrupted order"


def _train(az, out: Path, job: str, notices: list[bool]) -> dict:
    """A started job through one eviction per entry of ``notices`` (with a 30 s notice, or none), capacity back
    3 s after each; then trained to its end. What the test checks, gathered."""
    states: list[str] = []
    _wait_world(az, job, 2, states)
    evictions = [_evict(az, job, notice=notice, states=states) for notice in notices]
    during = _show(az, job)
    (out / "slow").unlink()  # train the rest at full speed
    done = az.json("elastictrain", "job", "wait", "--local", "--name", job, "--state", "Succeeded",
                   "--timeout", "600", timeout=660)
    shown = _show(az, job)
    events = local_backend(az.config_dir / "elastictrain" / "local", LOCAL_CLUSTER_DEFAULT).job_events(job)
    records = out / "records"
    return {"states": states, "evictions": evictions, "during": during, "done": done, "shown": shown,
            "events": events, "history": _history(records),
            "argv": [json.loads(p.read_text()) for p in records.glob("argv-*")]}


def _run_jobs(az, tmp_path: Path, runs: list[tuple[Path, str, list[bool], str]]) -> list[dict]:
    """Each (script, job, notices, script args) as a 2-node local job in the module's cluster (``local_az``,
    tests/e2e/conftest.py), all at once, each through its evictions and then trained to its end (``_train``);
    then deleted."""
    started = []
    try:
        for script, job, _, script_args in runs:
            out = tmp_path / job
            out.mkdir()
            (out / "slow").touch()
            started.append(job)
            # The job's own environment (--env: every node of it, replacements too): its block, its records,
            # and while the file "slow" exists each step sleeps 1 s, slow enough for the evictions and scale-ups
            # on a loaded 2-core machine (each az call takes seconds); the rest trains at full speed. The restart
            # mode: the legacy loops call ckpt.step(), which the in-process mode refuses; the README's script in the
            # local default mode (in-process) is test_readme_in_process_evictions.py's.
            az("elastictrain", "job", "run", "--local", "--name", job, "--script", str(HARNESS),
               "--script-args", script_args, "--min-nodes", "1", "--max-nodes", "2",
               "--checkpoint-interval", "20", "--recovery", "restart",
               "--env", f"READMETEST_BLOCK={script}", f"READMETEST_OUT={out / 'records'}",
               f"READMETEST_SLOW={out / 'slow'}", "READMETEST_STEP_DELAY=1.0", "-o", "none")
        with ThreadPoolExecutor(len(runs)) as pool:
            futures = [pool.submit(_train, az, tmp_path / job, job, notices) for _, job, notices, _ in runs]
            return [future.result() for future in futures]
    finally:
        for job in started:
            az("elastictrain", "job", "delete", "--local", "--name", job, "--yes", check=False, timeout=180)


def _check_succeeded_only_at_the_end(run: dict) -> int:
    """Never Succeeded while it trained; Succeeded after the last step, which one `finished` event records."""
    assert "Succeeded" not in run["states"] and run["during"]["state"] == "Running", (run["states"], run["during"])
    history, shown = run["history"], run["shown"]
    total = max(history)
    assert run["done"]["state"] == shown["state"] == "Succeeded" and shown["step"] == total, shown
    (finished,) = [e for e in run["events"] if e["event"] == "finished"]  # once: the last world, at its end
    assert finished["step"] == total and finished["time"] >= max(r["time"] for r in history[total])
    return total


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_a_readme_block_trains_exactly_once_through_evictions_and_scale_ups_and_succeeds_at_its_end(
        number, local_az, tmp_path) -> None:
    block = tmp_path / f"readme_block_{number}.py"
    block.write_text(BLOCKS[number])
    (run,) = _run_jobs(local_az, tmp_path, [(block, f"readme{number}", [True, False], SCRIPT_ARGS_TEXT)])

    notice, no_notice = run["evictions"]
    assert notice["evictions"][0]["acknowledged"] and not no_notice["evictions"][0]["acknowledged"]
    assert run["argv"] and all(argv == SCRIPT_ARGS for argv in run["argv"]), run["argv"]
    total = _check_succeeded_only_at_the_end(run)
    _check_exactly_once(run["history"], total)
    shown = run["shown"]
    assert shown["evictions"] == 2 and shown["scaleUps"] >= 2, shown
    ups = shown["scaleUpTimes"]
    assert len(ups) >= 2 and all(u["restoreSource"] in ("memory", "peer") and u["ranksFromPeer"] == 1
                                 for u in ups), ups


def test_the_old_readme_loops_are_right_through_a_scale_up(local_az, tmp_path) -> None:
    """tests/support/legacy_*.py: the loops the README showed before, as users copied them, as two jobs at once.
    At the scale-up torchrun SIGTERMs every worker: the steps loop broke and its done() marked the job Succeeded
    while the re-formed world trained on; the data loop's `break` left only the inner loop and the rest of the
    epoch was never trained."""
    support = REPO / "tests" / "support"
    data_loop, steps_loop = _run_jobs(local_az, tmp_path, [
        (support / "legacy_loop.py", "legacy-data", [False], ""),
        (support / "legacy_steps_loop.py", "legacy-steps", [False], "")])
    for run in (data_loop, steps_loop):
        total = _check_succeeded_only_at_the_end(run)
        if run is data_loop:
            _check_exactly_once(run["history"], total)
        else:
            assert sorted(run["history"]) == list(range(1, total + 1))
        ups = run["shown"]["scaleUpTimes"]
        assert ups and all(u["restoreSource"] in ("memory", "peer") for u in ups), ups
