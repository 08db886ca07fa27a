"""az elastictrain job run|list|show|logs|wait|delete --local and checkpoint ... --local --job, through the real az.

One local cluster (real etcd, Azurite, Scheduled Events) for the module, in an
isolated az config dir; it is always deleted, and anything left that carries
the config dir (on its command line or in its environment) is killed.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from azext_elastictrain.core.prices import PRICES_URL_ENV
from harness import services as svc
from tests.support.processes import gone as _gone
from tests.support.processes import ours as _ours
from tests.support.processes import running as _running
from tests.support.prices_server import PricesServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/train_cifar10.py"
STEPS = 150
JOB = "cifar"
SECRET_MARKERS = ("AccountKey", "DefaultEndpointsProtocol", "Eby8vdM02xNOcqFl")


def _job_pids(config_dir: Path) -> set[int]:
    """Our processes that belong to a job (everything but the cluster's own components)."""
    return {p.pid for p in _ours(config_dir) if _environ(p).get("ELASTICTRAIN_LOCAL_JOB")}


def _environ(proc: psutil.Process) -> dict:
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def _job_dir(az: svc.AzCli, job: str) -> Path:
    return Path(az.config_dir) / "elastictrain" / "local" / "local" / "jobs" / job


def _no_secret(text: str) -> None:
    assert not any(m in text for m in SECRET_MARKERS), "a connection string or key was printed"


def _error(result, *expected: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


@pytest.mark.slow  # ~40 s: a real 2-node job trained to its last step
def test_a_two_node_job_trains_to_the_end_and_delete_leaves_nothing(local_az):
    az = local_az
    run = az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", SCRIPT,
             "--script-args", f"--steps {STEPS} --step-delay 0.05", "--min-nodes", "1", "--max-nodes", "2",
             "--checkpoint-interval", "25", "--recovery", "restart", "-o", "json")
    _no_secret(run.stdout)
    started = json.loads(run.stdout)
    assert started["state"] == "Running" and started["nodeCount"] == 2 and started["cluster"] == "local"
    assert [n["name"] for n in started["nodes"]] == [f"{JOB}-node-0", f"{JOB}-node-1"]
    agents = [n["pid"] for n in started["nodes"]]
    assert all(n["alive"] for n in started["nodes"]) and all(_running(p) for p in agents)
    recorded = json.loads((_job_dir(az, JOB) / "job.json").read_text())
    assert [n["pid"] for n in recorded["nodes"]] == agents and all(n["started"] for n in recorded["nodes"])
    cmdline = psutil.Process(agents[0]).cmdline()
    assert "torch.distributed.run" in cmdline and "--nnodes=1:2" in cmdline and "--rdzv-backend=etcd-v2" in cmdline

    # the same name again while it runs: refused, nothing new started, the job untouched
    again = az("elastictrain", "job", "run", "--local", "--name", JOB, "--script", SCRIPT,
               "--min-nodes", "1", "--max-nodes", "2", check=False)
    _error(again, "already running")
    assert json.loads((_job_dir(az, JOB) / "job.json").read_text())["nodes"] == recorded["nodes"]
    agents_now = [p for p in _ours(az.config_dir) if "torch.distributed.run" in p.cmdline()]
    assert sorted(p.pid for p in agents_now) == sorted(agents)

    # waiting for what cannot come in time is a clear error
    _error(az("elastictrain", "job", "wait", "--local", "--name", JOB, "--step", "100000", "--timeout", "2",
              check=False), "timed out after 2s", "--timeout")

    done = az.json("elastictrain", "job", "wait", "--local", "--name", JOB, "--state", "Succeeded",
                   "--timeout", "300", timeout=330)
    assert done["state"] == "Succeeded"
    shown = az.json("elastictrain", "job", "show", "--local", "--name", JOB)
    assert shown["state"] == "Succeeded" and shown["step"] == STEPS and shown["worldSize"] == 2, shown
    assert shown["lastCheckpointStep"] == STEPS and shown["lastCheckpointTime"]
    assert shown["samplesPerSecond"] > 0 and shown["evictions"] == 0 and shown["recoveries"] == 0
    assert shown["warmStart"] is True  # workers forked from each node's warm server (runtime/warm.py)

    # what the job would have cost on Azure Spot nodes: priced only when asked, from the Retail Prices front
    assert "cost" not in shown, "a local job's nodes are processes: priced only with --price-as"
    _error(az("elastictrain", "job", "show", "--local", "--name", JOB, "--price-as", "Standard_NC4as_T4_v3",
              check=False), "--price-as needs the region", "-l REGION")
    with PricesServer() as front:
        priced = az.json("elastictrain", "job", "show", "--local", "--name", JOB, "--price-as",
                         "Standard_NC4as_T4_v3", "-l", "eastus", env={PRICES_URL_ENV: front.url})
        hours = priced["rankSeconds"]["total"] / 3600  # one rank a node
        cost = priced["cost"]
        assert cost["nodeHours"] == {"Spot": round(hours, 4)} and cost["pricedAs"] == "asked (--price-as)"
        assert (cost["cost"], cost["onDemandCost"], cost["savedPercent"]) == (
            round(hours * 0.0789, 6), round(hours * 0.526, 6), 85.0)
        no_price = az.json("elastictrain", "job", "show", "--local", "--name", JOB, "--price-as",
                           "Standard_NoSuch_v9", "-l", "eastus", env={PRICES_URL_ENV: front.url})["cost"]
        assert no_price["cost"] == no_price["onDemandCost"] == no_price["saved"] == "unknown"
        assert front.violations == []
    _error(az("elastictrain", "job", "wait", "--local", "--name", JOB, "--state", "Failed", "--timeout", "5",
              check=False), "is Succeeded", "will not reach state Failed")

    table = az("elastictrain", "job", "list", "--local", "-o", "table").stdout
    assert "Name" in table and JOB in table and "Succeeded" in table and str(STEPS) in table
    listed = az.json("elastictrain", "job", "list", "--local")
    assert [j["name"] for j in listed] == [JOB]

    # the catalog of the job's checkpoints, through the local cluster (no URL, no key printed)
    checkpoints = az("elastictrain", "checkpoint", "list", "--local", "--job", JOB, "-o", "json")
    _no_secret(checkpoints.stdout)
    steps = [(c["step"], c["status"], c["worldSize"]) for c in json.loads(checkpoints.stdout)]
    assert steps == [(100, "complete", 2), (125, "complete", 2), (150, "complete", 2)]  # keep 3
    verified = az.json("elastictrain", "checkpoint", "verify", "--local", "--job", JOB, "--step", "150")
    assert [(c["step"], c["verified"]) for c in verified] == [(150, True)]

    logs = az("elastictrain", "job", "logs", "--local", "--name", JOB).stdout
    assert f"step {STEPS} loss" in logs and f"finished {STEPS} steps" in logs and f"{JOB}-node-" in logs
    last = az("elastictrain", "job", "logs", "--local", "--name", JOB, "--node", f"{JOB}-node-0", "--tail", "1")
    assert len(last.stdout.splitlines()) <= 1
    followed = az("elastictrain", "job", "logs", "--local", "--name", JOB, "--follow", "--tail", "3", timeout=30)
    assert followed.returncode == 0  # the job ended: --follow returns
    _error(az("elastictrain", "job", "logs", "--local", "--name", JOB, "--node", "nope", check=False),
           "has no node 'nope'")

    plan = az.json("elastictrain", "job", "delete", "--local", "--name", JOB, "--dry-run")
    assert plan["dryRun"] and plan["checkpoints"] == "kept"
    _error(az("elastictrain", "job", "delete", "--local", "--name", JOB, check=False), "--yes")
    assert (_job_dir(az, JOB) / "job.json").exists(), "nothing is removed before confirmation"

    deleted = az.json("elastictrain", "job", "delete", "--local", "--name", JOB, "--yes")
    assert not deleted["dryRun"] and deleted["checkpoints"] == "kept"
    assert _gone(agents) and not _job_pids(az.config_dir), "the job left processes running"
    assert not _job_dir(az, JOB).exists()
    _error(az("elastictrain", "job", "show", "--local", "--name", JOB, check=False), f"no job named '{JOB}'")
    kept = az.json("elastictrain", "checkpoint", "list", "--local", "--job", JOB)
    assert [c["step"] for c in kept] == [100, 125, 150], "checkpoints are kept by default"


def test_a_lost_node_shows_as_an_eviction_and_a_recovery_and_delete_stops_the_rest(local_az):
    az = local_az
    started = az.json("elastictrain", "job", "run", "--local", "--name", "longer", "--script", SCRIPT,
                      "--script-args", "--steps 100000 --step-delay 0.05", "--min-nodes", "1",
                      "--max-nodes", "2", "--checkpoint-interval", "10", "--recovery", "restart")
    assert started["nodeCount"] == 2
    shown = az.json("elastictrain", "job", "wait", "--local", "--name", "longer", "--step", "12",
                    "--timeout", "120", timeout=150)
    assert shown["worldSize"] == 2 and shown["lastCheckpointStep"] is not None

    lost = psutil.Process(started["nodes"][1]["pid"])  # the node is gone: agent and workers at once
    tree = [lost, *lost.children(recursive=True)]
    for proc in tree:
        proc.kill()
    psutil.wait_procs(tree, timeout=10)

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        shown = az.json("elastictrain", "job", "show", "--local", "--name", "longer")
        if shown["recoveries"] >= 1 and shown["worldSize"] == 1:
            break
        time.sleep(1)
    assert shown["state"] == "Running" and shown["recoveries"] >= 1 and shown["worldSize"] == 1, shown
    assert shown["evictions"] == 1 and [n["alive"] for n in shown["nodes"]] == [True, False]

    pids = _job_pids(az.config_dir)
    assert len(pids) >= 2, "the survivor's agent and its worker"
    az("elastictrain", "job", "delete", "--local", "--name", "longer", "--yes", "--delete-checkpoints", timeout=90)
    assert _gone(pids) and not _job_pids(az.config_dir)
    assert az.json("elastictrain", "checkpoint", "list", "--local", "--job", "longer") == []


BAD_RUNS = [
    (["--min-nodes", "3", "--max-nodes", "2"], "--min-nodes 3 is more than --max-nodes 2"),
    (["--min-nodes", "2", "--max-nodes", "3", "--nodes", "4"], "--nodes 4 is outside"),
    (["--min-nodes", "2", "--max-nodes", "3", "--nodes", "1"], "--nodes 1 is outside"),
    (["--min-nodes", "0", "--max-nodes", "2"], "--min-nodes must be a whole number of at least 1"),
    (["--nproc-per-node", "0"], "--nproc-per-node must be"),
    (["--checkpoint-interval", "0"], "--checkpoint-interval must be"),
    (["--script", "scripts/no_such_script.py"], "is not a file"),
    (["--name", "Bad_Name"], "invalid job name"),
    (["--cluster", "nothere"], "no local cluster named 'nothere'"),
    (["--script-args", "'unbalanced"], "does not parse"),
    (["--min-nodes", "two"], "invalid int value"),
]


@pytest.mark.parametrize("args, expected", BAD_RUNS, ids=[e for _, e in BAD_RUNS])
def test_bad_input_is_a_clear_error_and_starts_nothing(local_az, args, expected):
    az = local_az
    defaults = {"--name": "bad", "--script": SCRIPT, "--min-nodes": "1", "--max-nodes": "2"}
    for i in range(0, len(args) - 1, 2):
        defaults.pop(args[i], None)
    argv = [a for kv in defaults.items() for a in kv] + args
    before = _job_pids(az.config_dir)
    result = az("elastictrain", "job", "run", "--local", *argv, check=False)
    _error(result, expected)
    assert _job_pids(az.config_dir) - before == set(), "a refused job started processes"
    jobs = Path(az.config_dir) / "elastictrain" / "local" / "local" / "jobs"
    assert not any((jobs / name).exists() for name in ("bad", "Bad_Name")), "a refused job left state"


@pytest.mark.parametrize("args, expected", [
    (["--url", "http://127.0.0.1:1/devstoreaccount1/checkpoints/x", "--local", "--job", "x"], "not both"),
    (["--local"], "--local needs --job"),
    (["--job", "x"], "add --local"),
    ([], "--url, --local --job, or -g -c --job"),
    (["--local", "--job", "Bad_Name"], "invalid job name"),
    (["--local", "--job", "x", "--connection-string", "UseDevelopmentStorage=true"], "--connection-string goes with --url"),
])
def test_checkpoint_commands_take_exactly_one_of_url_local_job_or_aks_job(local_az, args, expected):
    _error(local_az("elastictrain", "checkpoint", "list", *args, check=False), expected)


@pytest.mark.parametrize("args, expected", [
    (["--price-as", "Standard_NC4as_T4_v3"], "--price-as needs the region"),
    (["-l", "eastus"], "a local job is priced only as the size --price-as names"),
    (["--price-as", "Standard_NC4as_T4_v3", "-l", "eastus", "--currency", "XYZ"], "currency 'XYZ' is not one"),
])
def test_bad_cost_options_are_az_errors_before_anything_is_read(local_az, args, expected):
    for command in ("show", "timeline"):
        _error(local_az("elastictrain", "job", command, "--local", "--name", "nosuchjob", *args, check=False), expected)


def test_unknown_cluster_or_job_is_not_found(local_az):
    missing = local_az("elastictrain", "checkpoint", "list", "--local", "--cluster", "nothere", "--job", "x",
                       check=False)
    assert missing.returncode == 3 and "no local cluster named 'nothere'" in missing.stderr
    job = local_az("elastictrain", "job", "show", "--local", "--name", "nosuchjob", check=False)
    assert job.returncode == 3 and "no job named 'nosuchjob'" in job.stderr and "Traceback" not in job.stderr
    _error(local_az("elastictrain", "job", "list", check=False), "--local")


def test_a_node_that_fails_to_start_takes_the_started_ones_down(tmp_path, monkeypatch):
    """All or nothing, in-process: the second node cannot start, so the first is stopped and no state stays."""
    import os
    import subprocess
    import sys

    from azext_elastictrain.backends.local import starting
    from azext_elastictrain.backends.local.cluster import LocalClusters
    from azext_elastictrain.backends.local.home import ClusterHome
    from azext_elastictrain.core.spec import JobSpec

    clusters = LocalClusters(tmp_path)
    home = ClusterHome(clusters, "c")
    monkeypatch.setattr(clusters, "show_cluster", lambda name: {"health": "Healthy", "components": {}})
    monkeypatch.setattr(clusters, "connection", lambda name: {
        "etcd": "127.0.0.1:1", "blob_endpoint": "http://127.0.0.1:1/devstoreaccount1",
        "connection_string": "", "scheduled_events": "off"})
    started: list[subprocess.Popen] = []

    def start_node(spec, script, node, conn, *, job_dir, rdzv_id, recorded):
        if node.endswith("-1"):
            raise OSError("Resource temporarily unavailable")
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                env=dict(os.environ, ELASTICTRAIN_LOCAL_JOB=str(job_dir)), start_new_session=True)
        started.append(proc)
        return {"name": node, "pid": proc.pid, "started": psutil.Process(proc.pid).create_time(),
                "log": str(job_dir / "nodes" / f"{node}.log"), "status": "started"}

    monkeypatch.setattr(starting, "start_node", start_node)
    spec = JobSpec(name="half", script=str(REPO_ROOT / SCRIPT), min_nodes=1, max_nodes=3)
    with pytest.raises(OSError, match="temporarily unavailable"):
        starting.run_job(home, spec)
    assert len(started) == 1 and started[0].wait(timeout=20) is not None, "the started node was left running"
    assert not (tmp_path / "c" / "jobs" / "half").exists(), "a half-started job left its state"
