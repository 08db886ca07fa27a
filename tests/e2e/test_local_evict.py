"""az elastictrain evict simulate --local through the real az: a real 2-node job loses nodes and recovers."""
from __future__ import annotations

import time

import pytest

from tests.support import services as svc
from tests.support.processes import gone, local_cluster, running

JOB = "spot"
INTERVAL = 25


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory):
    """A local cluster running a 2-node job that would train for minutes: the tests evict its nodes."""
    try:
        with local_cluster(tmp_path_factory.mktemp("local-evict") / "azure-config") as az:
            try:
                az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", "scripts/train_cifar10.py",
                   "--script-args", "--steps 5000 --step-delay 0.05", "--min-nodes", "1", "--max-nodes", "2",
                   "--checkpoint-interval", str(INTERVAL), "-o", "none")
                az("elastictrain", "job", "wait", "--local", "--name", JOB, "--step", "50", "--timeout", "240",
                   "-o", "none", timeout=300)
                yield az
            finally:
                az("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", check=False, timeout=180)
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)


def _nodes(az) -> list[dict]:
    return az.json("elastictrain", "job", "show", "--local", "--name", JOB)["nodes"]


def _running_nodes(az) -> list[str]:
    return [n["name"] for n in _nodes(az) if n["alive"]]


def _wait_world(az, size: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if az.json("elastictrain", "job", "show", "--local", "--name", JOB).get("worldSize") == size:
            return
        time.sleep(1)
    raise AssertionError(f"the job never reached world size {size}")


@pytest.mark.parametrize("args, expected", [
    (["--node", "nosuchnode"], "has no node 'nosuchnode'"),
    (["--count", "5"], "--count 5"),
    (["--notice-seconds", "-1"], "--notice-seconds -1"),
    (["--node", f"{JOB}-node-0", "--count", "1"], "not both"),
])
def test_bad_evictions_are_refused_and_kill_nothing(job, args, expected):
    before = _running_nodes(job)
    result = job("elastictrain", "evict", "simulate", "--local", "--job", JOB, "--yes", *args, check=False)
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert _running_nodes(job) == before
    unknown = job("elastictrain", "evict", "simulate", "--local", "--job", "nosuchjob", "--yes", check=False)
    assert unknown.returncode == 3 and "no job named 'nosuchjob'" in unknown.stderr


def test_an_eviction_with_notice_loses_no_step_and_capacity_coming_back_restores_the_world(job):
    az = job
    _wait_world(az, 2)
    victim = next(n for n in _nodes(az) if n["alive"] and n["name"].endswith("-node-1"))
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB, "--node", victim["name"],
                     "--notice-seconds", "30", "--replace-after", "2", "--wait", "--yes", timeout=360)
    (eviction,) = result["evictions"]
    assert eviction["acknowledged"], "the runtime must acknowledge once its checkpoint is durable"
    (recovery,) = result["recovery"]
    assert recovery["stepsLost"] == 0
    assert gone([victim["pid"]])
    assert next(n for n in _nodes(az) if n["name"] == victim["name"])["status"] == "Evicted"
    (replacement,) = result["replacements"]
    _wait_world(az, 2)  # Spot capacity came back: the replacement joined

    # Without notice: at most one checkpoint interval is lost.
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB, "--count", "1",
                     "--notice-seconds", "0", "--wait", "--yes", timeout=360)
    assert result["evictions"][0]["node"] == replacement["node"]  # the newest goes first
    assert not result["evictions"][0]["acknowledged"]
    assert 0 <= result["recovery"][0]["stepsLost"] <= INTERVAL and result["recovery"][0]["worldSize"] == 1
    shown = az.json("elastictrain", "job", "show", "--local", "--name", JOB)
    assert shown["state"] == "Running" and shown["evictions"] >= 2
    assert all(running(n["pid"]) for n in shown["nodes"] if n["alive"])
