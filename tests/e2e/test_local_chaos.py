"""az elastictrain evict simulate --schedule --local through the real az: a real 2-node job under a seeded
eviction schedule, each recovery printed as it comes, then Ctrl-C before an eviction's capacity came back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from harness import services as svc
from tests.support.processes import local_cluster

JOB = "chaos"
# one eviction every 15 s for a minute; seed 2: the first with a 10 s notice, the second without
SCHEDULE = ["--schedule", "--rate", "4", "--duration", "60", "--notice-share", "0.5", "--notice-seconds", "10",
            "--replace-after", "3", "--seed", "2"]


def _alive(az) -> list[str]:
    return [n["name"] for n in az.json("elastictrain", "job", "show", "--local", "--name", JOB)["nodes"] if n["alive"]]


@pytest.mark.slow
def test_a_schedule_evicts_reports_each_recovery_and_ctrl_c_gives_the_capacity_back(tmp_path):
    try:
        with local_cluster(tmp_path / "azure-config") as az:
            try:
                az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", "scripts/train_cifar10.py",
                   "--script-args", "--steps 100000 --step-delay 0.05", "--min-nodes", "1", "--max-nodes", "2",
                   "--checkpoint-interval", "25", "--recovery", "restart", "-o", "none")
                az("elastictrain", "job", "wait", "--local", "--name", JOB, "--world-size", "2", "--step", "30",
                   "--timeout", "240", "-o", "none", timeout=300)
                _check_schedule(az)
            finally:
                az("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", check=False, timeout=180)
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)


def _check_schedule(az) -> None:
    before = _alive(az)
    plan = az.json("elastictrain", "evict", "simulate", "--local", "--job", JOB, *SCHEDULE, "--dry-run")
    assert [(e["atSeconds"], e["noticeSeconds"]) for e in plan["evictions"]] == [
        (15.0, 10), (30.0, 0.0), (45.0, 0.0), (60.0, 10)]
    assert plan["seed"] == 2 and sorted(plan["runningNodes"]) == sorted(before) and _alive(az) == before

    proc = subprocess.Popen([az.az_path, "elastictrain", "evict", "simulate", "--local", "--job", JOB, *SCHEDULE,
                             "--yes", "-o", "json"], env=az.env(), cwd=str(svc.REPO_ROOT), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: Ctrl-C goes to it as from a terminal
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("eviction 2/4") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the second node is gone and not replaced yet
        # stdout here, stderr by the reader alone (communicate() would read stderr too, and take lines from it)
        with proc.stdout:
            out = proc.stdout.read()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    proc.stderr.close()
    text = "".join(lines)
    assert proc.returncode == 0 and "Traceback" not in text, text
    report = json.loads(out)
    first, second = report["evictions"]
    assert report["stopped"] is True, report
    # the first: a notice, acknowledged, followed until the job trained again, capacity back at full size
    assert first["noticeSeconds"] == 10 and first["acknowledged"] is True, first
    assert first["recovery"]["worldSize"] == 1 and first["recovery"]["outageSeconds"] > 0, first
    assert first["recovery"]["stepsLost"] == 0, first  # the runtime checkpointed the notice's step
    assert first["capacityBack"]["fullSize"]["worldSize"] == 2, first
    # the second: no notice, so the node vanished until the job trained again without it (its recovery is known
    # when the eviction is printed); Ctrl-C then: its capacity came back at once
    assert second["noticeSeconds"] == 0 and second["acknowledged"] is False, second
    assert second["recovery"]["worldSize"] == 1 and second["recovery"]["outageSeconds"] > 0, second
    assert second["capacityBack"]["stopped"] is True and len(second["capacityBack"]["replacements"]) == 1
    assert "eviction 1/4 at +15s:" in text and "outage " in text and "stopped: goodput" in text, text
    assert 0 < report["goodput"]["goodput"] < 1, report
    # nothing left half-evicted: the two evicted nodes are gone, two nodes run, and the job grows back to 2
    alive = _alive(az)
    assert len(alive) == 2 and first["node"] not in alive and second["node"] not in alive, alive
    az("elastictrain", "job", "wait", "--local", "--name", JOB, "--world-size", "2", "--timeout", "180",
       "-o", "none", timeout=240)
