"""job run --local --recovery in-process through the real az: the job's coordinator starts with it, each node is a
torchrun --standalone world told where the coordinator is and who it is, job show reports the mode, and job
delete leaves no process behind, the coordinator's included.

The workers run a small script of this test's own (the training runtime's in-process loop is tested with it
elsewhere): each asks the coordinator for a quorum under its replica id, as torchft's Manager does at every step,
and prints what it got. With --min-nodes 2 the quorum forms only once both nodes asked: the nodes reached the
coordinator from their environment alone.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import psutil
import pytest

from harness import services as svc
from tests.support.processes import gone, local_cluster, ours

JOB = "inproc"

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    from datetime import timedelta

    from torchft.coordination import LighthouseClient

    env = {k: os.environ.get(k) for k in ("ELASTICTRAIN_RECOVERY", "TORCHFT_LIGHTHOUSE", "ELASTICTRAIN_REPLICA_ID",
                                           "WORLD_SIZE", "ELASTICTRAIN_CHECKPOINT_URL")}
    client = LighthouseClient(env["TORCHFT_LIGHTHOUSE"], connect_timeout=timedelta(seconds=30))
    def beat():  # while it waits for the quorum too, as torchft's manager does: a node unheard for the coordinator's
        beater = LighthouseClient(env["TORCHFT_LIGHTHOUSE"], connect_timeout=timedelta(seconds=30))
        while True:  # heartbeat timeout (local: 500 ms) is not counted in the quorum
            beater.heartbeat(env["ELASTICTRAIN_REPLICA_ID"])
            time.sleep(0.1)
    threading.Thread(target=beat, daemon=True).start()
    quorum = client.quorum(replica_id=env["ELASTICTRAIN_REPLICA_ID"], timeout=timedelta(seconds=120),
                           address="unused", store_address="unused", step=0, world_size=1)
    print("QUORUM " + json.dumps({"env": env, "participants": sorted(m.replica_id for m in quorum.participants)}),
          flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:  # trains until stopped, as a job does
        client.heartbeat(env["ELASTICTRAIN_REPLICA_ID"])
        time.sleep(0.2)
''')


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torchft", reason="in-process jobs run torchft (the train extra)")
    try:
        with local_cluster(tmp_path_factory.mktemp("local-in-process") / "azure-config") as az:
            yield az
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)


def _quorums(az) -> dict[str, dict]:
    lines = az("elastictrain", "job", "logs", "--local", "--name", JOB).stdout.splitlines()
    found = [json.loads(line.split("QUORUM ", 1)[1]) for line in lines if "QUORUM " in line]
    return {q["env"]["ELASTICTRAIN_REPLICA_ID"]: q for q in found}


@pytest.mark.slow  # ~60 s here: a coordinator and two nodes, each importing torch
def test_an_in_process_job_runs_with_its_coordinator_and_delete_leaves_no_process(local, tmp_path):
    import time

    az = local
    script = tmp_path / "quorum.py"
    script.write_text(SCRIPT, encoding="utf-8")
    started = az.json("elastictrain", "job", "run", "--local", "--name", JOB, "--script", str(script),
                      "--min-nodes", "2", "--max-nodes", "2", "--recovery", "in-process", timeout=180)
    assert started["recovery"] == "in-process" and started["rdzvId"] is None
    coordinator = started["coordinator"]
    assert coordinator["alive"] and coordinator["address"].startswith("http://127.0.0.1:")
    agents = [n["pid"] for n in started["nodes"]]
    cmdline = psutil.Process(agents[0]).cmdline()
    assert "--standalone" in cmdline and "--nnodes=1" in cmdline and not any(a.startswith("--rdzv") for a in cmdline)

    deadline = time.monotonic() + 240
    while len(quorums := _quorums(az)) < 2:
        assert time.monotonic() < deadline, az("elastictrain", "job", "logs", "--local", "--name", JOB).stdout
        time.sleep(2)
    names = [f"{JOB}-node-0", f"{JOB}-node-1"]
    for name in names:  # one quorum of both nodes, each known by its node name
        env = quorums[name]["env"]
        assert quorums[name]["participants"] == names
        assert (env["ELASTICTRAIN_RECOVERY"], env["TORCHFT_LIGHTHOUSE"], env["WORLD_SIZE"]) == (
            "in-process", coordinator["address"], "1")
        assert env["ELASTICTRAIN_CHECKPOINT_URL"].endswith(f"/{JOB}")  # everything a node gets, it still gets

    shown = az.json("elastictrain", "job", "show", "--local", "--name", JOB)
    assert shown["recovery"] == "in-process" and shown["coordinator"]["alive"] and shown["state"] == "Running"
    table = az("elastictrain", "job", "list", "--local", "-o", "table").stdout
    assert "Recovery" in table and "in-process" in table

    cluster_plan = az.json("elastictrain", "cluster", "delete", "--local", "--dry-run")
    assert {"component": f"job {JOB} coordinator", "pid": coordinator["pid"]} in cluster_plan["stopped"]
    planned = az.json("elastictrain", "job", "delete", "--local", "--name", JOB, "--dry-run")
    assert {"node": "coordinator", "pid": coordinator["pid"]} in planned["stopped"]
    az.json("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes", timeout=120)
    assert gone([coordinator["pid"], *agents])
    left = [p for p in ours(az.config_dir) if any(k in _environ(p) for k in (
        "ELASTICTRAIN_LOCAL_JOB", "ELASTICTRAIN_LOCAL_COORDINATOR"))]
    assert left == [], [p.cmdline() for p in left]
    assert not Path(planned["removed"]).exists()


def _environ(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except psutil.Error:
        return {}
