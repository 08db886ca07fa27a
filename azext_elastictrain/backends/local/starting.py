"""Starting a local job: its nodes, each a detached ``torchrun`` agent of this machine's Python, and, in process,
the job's coordinator (runtime/coordinator.py) on a free loopback port.

A job is ``N`` agents (one per "node") recorded in ``<cluster>/jobs/<job>/job.json`` as each starts (pid and start
time of each agent, its log ``nodes/<node>.log``): no agent is ever untracked, and a job that cannot start all of
them stops those it started (stopping.py). How each node is launched: agent.py; what the record holds: record.py.
A node that joins later (an eviction's replacement, evict.py) is started here too, from the job's record.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from azext_elastictrain.backends.local import record
from azext_elastictrain.backends.local.agent import AgentLaunch, CoordinatorLaunch, write_job_secret
from azext_elastictrain.backends.local.following import JobFollower
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.state import ClusterError, ClusterUnhealthy, JobConflict, ToolMissing, alive
from azext_elastictrain.backends.local.stopping import stop_job_processes
from azext_elastictrain.core import launch
from azext_elastictrain.core.eventlog.view import LocalJobShown
from azext_elastictrain.core.spec import JobSpec, check_local_script

# An in-process job's coordinator imports torch before it listens: seconds on a busy machine.
COORDINATOR_START_TIMEOUT = 60.0


def run_job(home: ClusterHome, spec: JobSpec) -> LocalJobShown:
    """`job run` on the cluster of ``home``: start ``spec.node_count`` torchrun agents, detached; all or nothing."""
    check_local_script(spec.script)
    cluster = home.name
    shown = home.clusters.show_cluster(cluster)  # ClusterNotFound
    if shown["health"] != "Healthy":
        down = ", ".join(k for k, v in shown["components"].items() if v["state"] != "running")
        raise ClusterUnhealthy(
            f"local cluster {cluster!r} is {shown['health']} ({down} not running); "
            f"heal it with 'az elastictrain cluster create --local --name {cluster}'"
        )
    if importlib.util.find_spec("torch") is None:
        raise ToolMissing(f"torch is not installed in the Python that runs az ({sys.executable}): "
                          "the job's nodes run torchrun from it; install torch there")
    script = str(Path(spec.script).resolve())
    conn = home.connection()
    with home.lock():
        existing = home.load_job(spec.name)
        if existing and any(alive(n) for n in existing["nodes"]):
            raise JobConflict(
                f"job {spec.name!r} is already running on local cluster {cluster!r}; "
                f"pick another --name, or stop it first with "
                f"'az elastictrain job delete --local --cluster {cluster} --name {spec.name}'"
            )
        job_dir = home.job_dir(spec.name)
        if existing:  # a finished run of this name: its processes are gone, start afresh
            stop_job_processes(existing, job_dir)
        shutil.rmtree(job_dir, ignore_errors=True)
        (job_dir / "nodes").mkdir(parents=True)
        # One rendezvous per run: torch keeps a finished run's rendezvous closed in etcd for hours, and
        # agents that join a closed one exit at once. Nodes that come back later (capacity returning) join
        # this same id.
        state = record.new_record(spec, cluster=cluster, script=script,
                                  rdzv_id=f"{spec.name}-{uuid.uuid4().hex[:8]}")
        try:
            home.save_job(state)
            if spec.mode.coordinator:  # before the nodes, which find its address in the job's record
                state["coordinator"] = start_coordinator(job_dir, min_nodes=spec.min_nodes, job=spec.name)
                home.save_job(state)
            for node in spec.node_names():  # recorded as each starts: no agent is ever untracked
                started = start_node(spec, script, node, conn, job_dir=job_dir, rdzv_id=state["rdzvId"],
                                     recorded=state)
                state["nodes"].append(started)
                home.save_job(state)
        except BaseException:
            stop_job_processes(state, job_dir)
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
    return JobFollower(home).describe_now(state, conn)


def start_node(spec: JobSpec, script: str, node: str, conn: dict[str, Any], *, job_dir: Path,
               rdzv_id: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """Start one node of the job, as its spec says (a node that joins later, an eviction's replacement, is
    started from the job's record: record.spec_of); an in-process node is told where the job's coordinator is,
    from the job's record (``recorded``, in hand)."""
    import psutil

    log_path = job_dir / "nodes" / f"{node}.log"
    coordinator = (recorded.get("coordinator") or {}).get("address") if spec.mode.coordinator else None
    agent = AgentLaunch(
        node=node, spec=spec, script=script,
        checkpoint_url=ClusterHome.checkpoint_url(spec.name, conn),
        connection_string=conn["connection_string"], etcd_endpoint=conn["etcd"], rdzv_id=rdzv_id,
        job_dir=job_dir, scheduled_events_url=conn["scheduled_events"], coordinator=coordinator)
    if spec.mode.coordinator:
        write_job_secret(job_dir)  # made with the coordinator; a job recorded before it had none
    argv, env = agent.argv(), agent.env(os.environ)
    with open(log_path, "ab") as log:
        # pylint: disable-next=consider-using-with  # a detached agent: outlives this command
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, close_fds=True)
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error as ex:
        raise ClusterError(f"node {node} (pid {proc.pid}) exited at once; see {log_path}") from ex
    return {"name": node, "pid": proc.pid, "started": started, "log": str(log_path), "status": "started"}


def start_coordinator(job_dir: Path, *, min_nodes: int, job: str,
                      heartbeat_timeout_ms: int = launch.LOCAL.coordinator_heartbeat_timeout_ms) -> dict[str, Any]:
    """The coordinator of an in-process job (runtime/coordinator.py) on a free loopback port, detached, as
    ``job run --local`` starts it (the benchmarks start theirs here too); returns its record once it listens
    (name, pid, start time, address, log). Raises ClusterError with its log's end if it does not start."""
    import psutil

    coordinator = CoordinatorLaunch(job_dir, min_nodes=min_nodes, heartbeat_timeout_ms=heartbeat_timeout_ms)
    write_job_secret(job_dir)  # the nodes' state servers ask for it (runtime/peer_transfer.py)
    with open(coordinator.log, "ab") as log:
        # pylint: disable-next=consider-using-with  # a detached process: outlives this command
        proc = subprocess.Popen(coordinator.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=coordinator.env(os.environ),
                                start_new_session=True, close_fds=True)
    started: dict[str, Any] = {"name": "coordinator", "pid": proc.pid, "log": str(coordinator.log)}
    try:
        started["started"] = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        started["started"] = 0.0  # gone already: the wait below says why
    deadline = time.monotonic() + COORDINATOR_START_TIMEOUT
    while not coordinator.address_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            tail = coordinator.log.read_text(encoding="utf-8", errors="replace")[-1500:]
            raise ClusterError(f"the coordinator of job {job!r} did not start (is torchft installed in "
                               f"{sys.executable}? pip install torchft==0.2.0); its log ends:\n{tail}")
        time.sleep(0.1)
    started["address"] = coordinator.address_file.read_text(encoding="utf-8").strip()
    return started
