"""az elastictrain evict simulate --local through the real az: a real 2-node job loses nodes and recovers."""
from __future__ import annotations

import time

import pytest

from tests.support.processes import gone, running

JOB = "spot"
INTERVAL = 25


@pytest.fixture(scope="module")
def job(local_az):
    """A local cluster running a 2-node job that would train for minutes: the tests evict its nodes."""
    az = local_az
    try:
        az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", "scripts/train_cifar10.py",
           "--script-args", "--steps 5000 --step-delay 0.05", "--min-nodes", "1", "--max-nodes", "2",
           "--checkpoint-interval", str(INTERVAL), "--recovery", "restart", "-o", "none")
        az("elastictrain", "job", "wait", "--local", "--name", JOB, "--step", "50", "--timeout", "240",
           "-o", "none", timeout=300)
        yield az
    finally:
        az("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", check=False, timeout=180)


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


BAD_EVICTIONS = [
    (["--node", "nosuchnode"], "has no node 'nosuchnode'"),
    (["--count", "5"], "--count 5"),
    (["--notice-seconds", "-1"], "--notice-seconds -1"),
    (["--node", f"{JOB}-node-0", "--count", "1"], "not both"),
]


def test_bad_evictions_are_refused_and_kill_nothing(job):
    """Each bad request in turn (one test: each az call costs seconds on a busy machine), then the job's nodes."""
    before = _running_nodes(job)
    for args, expected in BAD_EVICTIONS:
        result = job("elastictrain", "evict", "simulate", "--local", "--job", JOB, "--yes", *args, check=False)
        assert result.returncode != 0 and expected in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr, (args, result.stderr)
    unknown = job("elastictrain", "evict", "simulate", "--local", "--job", "nosuchjob", "--yes", check=False)
    assert unknown.returncode == 3 and "no job named 'nosuchjob'" in unknown.stderr
    assert _running_nodes(job) == before


def test_an_evicted_node_is_gone_and_shown_as_evicted(job):
    """The whole story (notice, no notice, capacity back, recovery seconds, steps lost) is
    tests/e2e/test_demo.py; here: what one eviction leaves behind."""
    az = job
    _wait_world(az, 2)
    victim = next(n for n in _nodes(az) if n["alive"] and n["name"].endswith("-node-1"))
    result = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB, "--node", victim["name"],
                     "--notice-seconds", "0", "--yes")
    (eviction,) = result["evictions"]
    assert eviction["node"] == victim["name"] and not eviction["acknowledged"]
    assert "recovery" not in result and result["replacements"] == []  # no --wait, no --replace-after
    assert gone([victim["pid"]])
    shown = az.json("elastictrain", "job", "show", "--local", "--name", JOB)
    assert next(n for n in shown["nodes"] if n["name"] == victim["name"])["status"] == "Evicted"
    assert shown["state"] == "Running" and shown["evictions"] == 1
    assert all(running(n["pid"]) for n in shown["nodes"] if n["alive"])


def test_show_and_timeline_account_for_the_eviction(job, tmp_path):
    """After the eviction above: the survivor trains on alone; `job show` gives goodput and the time lost by
    cause, `job timeline` the world that stopped (with its steps lost) and draws it."""
    az = job
    _wait_world(az, 1)
    timeline = az.json("elastictrain", "job", "timeline", "--local", "--name", JOB)
    stop = timeline["stops"][-1]  # the eviction: the world of 2 stopped, the survivor's world of 1 trains
    assert stop["step"] >= stop["resumedFromStep"] and timeline["worlds"][-1]["worldSize"] == 1, timeline
    assert [t for t, size in timeline["worldSize"]][1:] == sorted(t for t, _ in timeline["worldSize"][1:])
    shown = az.json("elastictrain", "job", "show", "--local", "--name", JOB)
    assert 0 < shown["goodput"] < 1 and shown["stepsLost"] >= stop["stepsLost"], shown
    assert shown["timeLost"]["reforming"] > 0 and shown["timeLost"]["restoring"] > 0, shown
    # one outage figure: job show's last outage is the timeline's stop (last step before to first step after)
    outage = shown["outages"][-1]
    assert outage["kind"] == "eviction" and outage["outageSeconds"] == stop["outageSeconds"] > 0, shown
    assert outage["stepsLost"] == stop["stepsLost"] and outage["toWorldSize"] == 1, shown
    table = az("elastictrain", "job", "timeline", "--local", "--name", JOB, "-o", "table").stdout
    assert "WorldSize" in table and "StepsLost" in table and "OutageSeconds" in table, table
    picture = tmp_path / "timeline.png"
    drawn = az.json("elastictrain", "job", "timeline", "--local", "--name", JOB, "--output-file", str(picture))
    assert drawn["outputFile"] == str(picture) and picture.read_bytes()[:4] == b"\x89PNG"
    bad = az("elastictrain", "job", "timeline", "--local", "--name", JOB, "--output-file",
             str(tmp_path / "no-such-folder" / "t.png"), check=False)
    assert bad.returncode != 0 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
    unknown = az("elastictrain", "job", "timeline", "--local", "--name", "nosuchjob", check=False)
    assert unknown.returncode == 3 and "no job named 'nosuchjob'" in unknown.stderr
