"""The README's script, unchanged, as a 2-node `job run --local` (the local default: --recovery in-process) through
the real az, through
an eviction with notice, one without (the default: the node vanishes) and capacity back after each.

tests/support/readme_harness.py runs it and records each committed step's slice (in-process mode: where the
sampler moves on). Checked: the survivor's worker pid never changes (its workers outlive every re-form), every
epoch trained each sample exactly once in the order of an uninterrupted run, the job is never Succeeded while it
trains and is Succeeded after its last step, and `evict simulate --wait` and `job show` report each re-form's
outage (the quorum events: core/eventlog/goodput.py), the same figure in both.

Not compared here: the final state with a restart-mode run's. The maths of a step is the same at any world size
(the global batch is), but the sum of the gradients is taken in another order when the world size differs (the
node's DDP average, then the replicas' average), so float results differ in the last bits; the unit and
integration tests compare the replicas' states with each other instead (tests/integration).
"""
from __future__ import annotations

import pytest

from azext_elastictrain.backends import local_backend
from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT
from tests.e2e.test_readme import BLOCKS, HARNESS, _show, _wait_world
from harness import services as svc
from tests.support.processes import local_cluster
from tests.support.slices import check_exactly_once, read_slices

JOB = "readme-inproc-evict"


def _evict(az, notice: bool, states: list[str]) -> dict:
    """The newest node goes (a 5 s notice, or none: it vanishes), capacity back 3 s later; then both train."""
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB,
                     "--notice-seconds", "5" if notice else "0", "--replace-after", "3", "--wait", "--yes",
                     timeout=300)
    _wait_world(az, JOB, 2, states)
    return result


@pytest.mark.slow  # a coordinator, two nodes, two evictions and two scale-ups, 192 steps
def test_the_readme_script_in_process_through_evictions_and_scale_ups(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torchft", reason="in-process jobs run torchft (the train extra)")
    block = tmp_path / "train.py"
    block.write_text(BLOCKS[0], encoding="utf-8")
    out, slow = tmp_path / "records", tmp_path / "slow"
    slow.touch()
    monkeypatch.setenv("READMETEST_BLOCK", str(block))  # the job's processes inherit az's environment
    monkeypatch.setenv("READMETEST_OUT", str(out))
    monkeypatch.setenv("READMETEST_SLOW", str(slow))
    # slow enough that the evictions and scale-ups come before the end on a loaded 2-core machine (each az call
    # takes seconds): the survivor trains on alone meanwhile; the rest trains at full speed
    monkeypatch.setenv("READMETEST_STEP_DELAY", "0.7")
    states: list[str] = []
    try:
        with local_cluster(tmp_path / "azure-config") as az:
            try:
                az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", str(HARNESS),
                   "--min-nodes", "1", "--max-nodes", "2", "--checkpoint-interval", "20", "-o", "none",
                   timeout=180)  # no --recovery: the README's command, in the local default mode
                _wait_world(az, JOB, 2, states)
                evictions = [_evict(az, notice=notice, states=states) for notice in (True, False)]
                during = _show(az, JOB)
                slow.unlink()  # the rest at full speed
                done = az.json("elastictrain", "job", "wait", "--local", "--name", JOB, "--state", "Succeeded",
                               "--timeout", "300", timeout=360)
                shown = _show(az, JOB)
                checkpoints = az.json("elastictrain", "checkpoint", "list", "--local", "--job", JOB)
                events = local_backend(az.config_dir / "elastictrain" / "local", LOCAL_CLUSTER_DEFAULT).job_events(
                    JOB)
            finally:
                az("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", check=False, timeout=180)
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)

    records = read_slices(out)
    # the survivor (node-0: evictions take the newest node) kept its one worker process through all four re-forms
    survivor = [r for r in records if r["node"].endswith("node-0")]
    assert survivor and len({r["pid"] for r in survivor}) == 1, sorted({r["pid"] for r in survivor})
    assert len({r["node"] for r in records}) >= 3, "no replacement node trained"
    total = check_exactly_once(records, epochs=3)

    # Succeeded only at the end, after its last step, which one finished event records
    assert "Succeeded" not in states and during["state"] == "Running", (states, during)
    assert shown["recovery"] == "in-process", shown  # the local default
    assert done["state"] == shown["state"] == "Succeeded" and shown["step"] == total == 3 * 4096 // 64, shown
    (finished,) = [e for e in events if e["event"] == "finished"]
    assert finished["step"] == total
    assert max(c["step"] for c in checkpoints) == total, checkpoints  # the writer node's final checkpoint

    # each eviction: acknowledged or not, its outage and the capacity back, as evict simulate --wait reports them
    notice, vanish = evictions
    assert notice["evictions"][0]["acknowledged"] and not vanish["evictions"][0]["acknowledged"]
    for result in evictions:
        (recovery,) = result["recovery"]
        assert recovery["outageSeconds"] is not None and recovery["stepsLost"] == 0, recovery
        assert result["capacityBack"]["outageSeconds"] is not None, result["capacityBack"]
    # job show: the same figures, one outage per re-form, in order
    outages = shown["outages"]
    kinds = [o["kind"] for o in outages if o["fromWorldSize"] != o["toWorldSize"]]
    assert kinds[-4:] == ["evictionWithNotice", "scaleUp", "eviction", "scaleUp"], outages
    by_restore = {o["resumedFromStep"]: o["outageSeconds"] for o in outages}
    assert notice["recovery"][0]["outageSeconds"] in by_restore.values(), (notice, outages)
    assert vanish["recovery"][0]["outageSeconds"] in by_restore.values(), (vanish, outages)
    assert shown["evictions"] == 2 and shown["scaleUps"] >= 2, shown
