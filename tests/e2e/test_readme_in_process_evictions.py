"""The README's script, unchanged, as a 2-node `job run --local --recovery in-process` through the real az, through
an eviction with notice, one without (the default: the node vanishes) and capacity back after each.

tests/support/readme_harness.py runs it and records each committed step's slice (in-process mode: where the
sampler moves on). Checked: the survivor's worker pid never changes (its workers outlive every re-form), every
epoch trained each sample exactly once in the order of an uninterrupted run, the job is never Succeeded while it
trains and is Succeeded after its last step, and `evict simulate --wait` and `job show` report each re-form's
outage (the quorum events: core/goodput.py), the same figure in both.

Not compared here: the final state with a restart-mode run's. The maths of a step is the same at any world size
(the global batch is), but the sum of the gradients is taken in another order when the world size differs (the
node's DDP average, then the replicas' average), so float results differ in the last bits; the unit and
integration tests compare the replicas' states with each other instead (tests/integration).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from azext_elastictrain.backends.local.cluster import LocalClusters
from azext_elastictrain.backends.local.jobs import LocalJobs
from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT
from tests.e2e.test_readme import BLOCKS, HARNESS, _show, _wait_world
from tests.support import services as svc
from tests.support.processes import local_cluster

JOB = "readme-inproc-evict"


def _evict(az, notice: bool, states: list[str]) -> dict:
    """The newest node goes (a 5 s notice, or none: it vanishes), capacity back 3 s later; then both train."""
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB,
                     "--notice-seconds", "5" if notice else "0", "--replace-after", "3", "--wait", "--yes",
                     timeout=300)
    _wait_world(az, JOB, 2, states)
    return result


def _slices(out: Path) -> list[dict]:
    records = []
    for path in out.glob("slices-*.jsonl"):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                assert number == len(lines) - 1, f"{path.name}:{number + 1} is not JSON"  # a kill mid-write
    return records


def _check_exactly_once(records: list[dict]) -> int:
    """Every epoch's global batches, each trained once: the committed slices of each batch (its position in the
    epoch) join into it, at whatever layout the quorum had then. Returns the steps trained."""
    by_batch: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in records:
        by_batch[(r["epoch"], r["consumed"])].append(r)
    first = records[0]
    size, batch, seed = first["dataset_size"], first["global_batch"], first["seed"]
    epochs: dict[int, list[int]] = defaultdict(list)
    for (epoch, consumed), slices in sorted(by_batch.items()):
        layouts = {s["ranks"] for s in slices}
        assert len(layouts) == 1, f"epoch {epoch} at {consumed}: committed at several layouts {slices}"
        assert sorted(s["rank"] for s in slices) == list(range(slices[0]["ranks"])), (epoch, consumed, slices)
        epochs[epoch].extend(i for s in sorted(slices, key=lambda s: s["rank"]) for i in s["ids"])
    for epoch, ids in epochs.items():
        order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert sorted(ids) == sorted(order[:size - size % batch]), f"epoch {epoch}: not each sample once"
        global_batches = [order[i:i + batch] for i in range(0, size - size % batch, batch)]
        trained = [ids[i:i + batch] for i in range(0, len(ids), batch)]
        assert [sorted(b) for b in trained] == [sorted(b) for b in global_batches], f"epoch {epoch}: out of order"
    assert sorted(epochs) == [0, 1, 2], sorted(epochs)
    return len(by_batch)


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
                   "--min-nodes", "1", "--max-nodes", "2", "--recovery", "in-process", "--checkpoint-interval",
                   "20", "-o", "none", timeout=180)
                _wait_world(az, JOB, 2, states)
                evictions = [_evict(az, notice=notice, states=states) for notice in (True, False)]
                during = _show(az, JOB)
                slow.unlink()  # the rest at full speed
                done = az.json("elastictrain", "job", "wait", "--local", "--name", JOB, "--state", "Succeeded",
                               "--timeout", "300", timeout=360)
                shown = _show(az, JOB)
                events = LocalJobs(LocalClusters(az.config_dir / "elastictrain" / "local")).job_events(
                    LOCAL_CLUSTER_DEFAULT, JOB)
            finally:
                az("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", check=False, timeout=180)
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)

    records = _slices(out)
    # the survivor (node-0: evictions take the newest node) kept its one worker process through all four re-forms
    survivor = [r for r in records if r["node"].endswith("node-0")]
    assert survivor and len({r["pid"] for r in survivor}) == 1, sorted({r["pid"] for r in survivor})
    assert len({r["node"] for r in records}) >= 3, "no replacement node trained"
    total = _check_exactly_once(records)

    # Succeeded only at the end, after its last step, which one finished event records
    assert "Succeeded" not in states and during["state"] == "Running", (states, during)
    assert done["state"] == shown["state"] == "Succeeded" and shown["step"] == total == 3 * 4096 // 64, shown
    (finished,) = [e for e in events if e["event"] == "finished"]
    assert finished["step"] == total

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
