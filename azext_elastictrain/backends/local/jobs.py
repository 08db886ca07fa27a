"""Elastic jobs on a local cluster: real ``torchrun`` agents as the job's nodes.

A job is ``N`` detached ``torchrun`` agents (one per "node") recorded in
``<cluster>/jobs/<job>/job.json`` (pid and start time of each agent, its log
``nodes/<node>.log``); its progress is the event log the training runtime
appends to blob storage (core.events). Stopping a node stops the agent and
every descendant: torchrun's workers start sessions of their own, so a
process-group kill would leave them training.

``LocalJobs`` is bound to one cluster: it works on that cluster's ``ClusterHome``
(home.py: its jobs' folders and records, its connection). What a job records: record.py.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from azext_elastictrain.core import events as job_events
from azext_elastictrain.clients.blob import EventReader
from azext_elastictrain.core.errors import JobNotFound
from azext_elastictrain.core.view import build_job_view, iso_time, read_job_events
from azext_elastictrain.backends.local import record
from azext_elastictrain.backends.local.agent import (
    COORDINATOR_MARKER_ENV,
    JOB_MARKER_ENV,
    AgentLaunch,
    CoordinatorLaunch,
    write_job_secret,
)
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.state import (
    STOP_TIMEOUT,
    ClusterError,
    ClusterUnhealthy,
    JobConflict,
    ToolMissing,
    alive,
)
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import JobSpec, check_local_script

if TYPE_CHECKING:
    from azext_elastictrain.core.blobstore import BlobEntry

# A job's workers get this long after SIGTERM (the runtime checkpoints on it) before SIGKILL.
JOB_STOP_TIMEOUT = 15.0
# An in-process job's coordinator imports torch before it listens: seconds on a busy machine.
COORDINATOR_START_TIMEOUT = 60.0


class LocalJobs:
    """The jobs of one local cluster (its ``ClusterHome``): run, show, list, logs, delete (evictions: evict.py)."""

    _alive = staticmethod(alive)

    def __init__(self, home: ClusterHome) -> None:
        self.home = home

    def run_job(self, spec: JobSpec) -> dict[str, Any]:
        """Start ``spec.node_count`` torchrun agents, detached; all or nothing."""
        check_local_script(spec.script)
        cluster = self.home.name
        shown = self.home.clusters.show_cluster(cluster)  # ClusterNotFound
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
        conn = self.home.connection()
        with self.home.lock():
            existing = self.home.load_job(spec.name)
            if existing and any(self._alive(n) for n in existing["nodes"]):
                raise JobConflict(
                    f"job {spec.name!r} is already running on local cluster {cluster!r}; "
                    f"pick another --name, or stop it first with "
                    f"'az elastictrain job delete --local --cluster {cluster} --name {spec.name}'"
                )
            job_dir = self.home.job_dir(spec.name)
            if existing:  # a finished run of this name: its processes are gone, start afresh
                self._stop_job_processes(existing)
            shutil.rmtree(job_dir, ignore_errors=True)
            (job_dir / "nodes").mkdir(parents=True)
            # One rendezvous per run: torch keeps a finished run's rendezvous closed in etcd for hours, and
            # agents that join a closed one exit at once. Nodes that come back later (capacity returning) join
            # this same id.
            state = record.new_record(spec, cluster=cluster, script=script,
                                      rdzv_id=f"{spec.name}-{uuid.uuid4().hex[:8]}")
            try:
                self.home.save_job(state)
                if spec.in_process:  # before the nodes, which find its address in the job's record
                    state["coordinator"] = start_coordinator(job_dir, min_nodes=spec.min_nodes, job=spec.name)
                    self.home.save_job(state)
                for node in spec.node_names():  # recorded as each starts: no agent is ever untracked
                    started = self.start_node(spec, script, node, conn, job_dir=job_dir, rdzv_id=state["rdzvId"],
                                              record=state)
                    state["nodes"].append(started)
                    self.home.save_job(state)
            except BaseException:
                self._stop_job_processes(state)
                shutil.rmtree(job_dir, ignore_errors=True)
                raise
        return self.describe_now(state, conn)

    @staticmethod
    def start_node(spec: JobSpec, script: str, node: str, conn: dict[str, Any], *, job_dir: Path,
                   rdzv_id: str, record: dict[str, Any]) -> dict[str, Any]:
        """Start one node of the job, as its spec says (a node that joins later, an eviction's replacement, is
        started from the job's record: record.spec_of); an in-process node is told where the job's coordinator is,
        from the job's ``record``."""
        import psutil

        log_path = job_dir / "nodes" / f"{node}.log"
        coordinator = (record.get("coordinator") or {}).get("address") if spec.in_process else None
        agent = AgentLaunch(
            node=node, spec=spec, script=script,
            checkpoint_url=ClusterHome.checkpoint_url(spec.name, conn),
            connection_string=conn["connection_string"], etcd_endpoint=conn["etcd"], rdzv_id=rdzv_id,
            job_dir=job_dir, scheduled_events_url=conn["scheduled_events"], coordinator=coordinator)
        if spec.in_process:
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

    @staticmethod
    def _leaving_file(job_dir: Path, node: str) -> Path:
        """Made before the node's processes are stopped (AgentLaunch.leaving_file)."""
        return job_dir / "nodes" / f"{node}.leaving"

    # -- job processes ----------------------------------------------------------------
    def _job_processes(self, job: dict[str, Any]) -> list[Any]:
        """Every live process of the job: each recorded agent (pid + start time checked) with all its
        descendants, and any process carrying the job's marker (workers orphaned by a killed agent)."""
        import psutil

        found: dict[int, Any] = {}
        for node in job.get("nodes", []):
            if not self._alive(node):
                continue
            try:
                root = psutil.Process(node["pid"])
                for proc in [root, *root.children(recursive=True)]:
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        marker = str(self.home.job_dir(job["name"]))
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid in found or proc.pid == me:
                continue
            try:
                if proc.environ().get(JOB_MARKER_ENV) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        return list(found.values())

    def _coordinator_processes(self, job: dict[str, Any]) -> list[Any]:
        """The job's coordinator: the recorded process (pid + start time checked), and any process carrying the
        job's coordinator marker (one whose start this command did not get to record)."""
        import psutil

        marker = str(self.home.job_dir(job["name"]))
        found: dict[int, Any] = {}
        recorded = job.get("coordinator")
        if recorded and self._alive(recorded):
            try:
                found[recorded["pid"]] = psutil.Process(recorded["pid"])
            except psutil.Error:
                pass
        for proc in psutil.process_iter():
            try:
                if proc.pid not in found and proc.environ().get(COORDINATOR_MARKER_ENV) == marker \
                        and proc.status() != psutil.STATUS_ZOMBIE:
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        return list(found.values())

    def _stop_job_processes(self, job: dict[str, Any]) -> None:
        """SIGTERM the job's processes (the runtime checkpoints on it), then SIGKILL what is left; then its
        coordinator, which the nodes may ask for a quorum until they are gone."""
        self._stop_nodes(job)
        self._stop_coordinator(job)

    def _stop_coordinator(self, job: dict[str, Any]) -> None:
        rounds = ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT))
        _signal_until_gone(lambda: self._coordinator_processes(job), rounds, f"job {job['name']!r}: coordinator")

    def _stop_nodes(self, job: dict[str, Any]) -> None:
        job_dir = self.home.job_dir(job["name"])
        for node in job.get("nodes", []):
            leaving = self._leaving_file(job_dir, node["name"])
            if leaving.parent.is_dir():
                leaving.touch()
        rounds = ((signal.SIGTERM, JOB_STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT))
        _signal_until_gone(lambda: self._job_processes(job), rounds, f"job {job['name']!r}: processes")

    # -- show, list ---------------------------------------------------------------------
    def _describe(self, job: dict[str, Any], read: EventReader, conn: dict[str, Any]) -> dict[str, Any]:
        nodes = []
        for node in job["nodes"]:
            node_alive = self._alive(node)
            nodes.append({
                "name": node["name"], "pid": node["pid"], "alive": node_alive,
                "status": "Running" if node_alive else ("Evicted" if node.get("status") == "evicted" else "Exited"),
                "log": node["log"],
            })
        any_alive = any(n["alive"] for n in nodes)
        events, events_error = read_job_events(read, job["name"])

        def state_of(summary: dict[str, Any]) -> str:
            state = job_events.job_state(summary["finished"], any_alive, job.get("stopRequested", False))
            if events_error and state == job_events.FAILED:
                return "Unknown"  # the agents are gone; whether training finished is in the unread events
            return state

        def lost_nodes(state: str) -> list[str]:
            # A node lost while the job runs on (once every node is gone, an exit is no longer told from a
            # crash or the end), or a node an eviction marked.
            return [n["name"] for n in nodes if not n["alive"]
                    and (n["status"] == "Evicted" or state == job_events.RUNNING)]

        view = build_job_view(events, created=job["created"], nodes=nodes, state_of=state_of,
                              lost_nodes=lost_nodes, events_error=events_error)
        identity = {"name": job["name"], "cluster": self.home.name, "type": "local"}
        launched = {"created": iso_time(job["created"]),
                    **record.launched(job, self.home.checkpoint_url(job["name"], conn))}
        if job.get("recovery") == launch.RECOVERY_IN_PROCESS:
            launched["rdzvId"] = None  # its nodes are worlds of their own: no rendezvous
        if job.get("coordinator"):
            launched["coordinator"] = {"address": job["coordinator"].get("address"), "pid": job["coordinator"]["pid"],
                                       "alive": self._alive(job["coordinator"]), "log": job["coordinator"]["log"]}
        return view.describe(identity, launched, {"stateDir": str(self.home.job_dir(job["name"]))})

    def describe_now(self, state: dict[str, Any], conn: dict[str, Any]) -> dict[str, Any]:
        """`job show` of the job recorded as ``state``, its events read through ``conn`` (both in hand)."""
        read = self.home.event_reader(conn)
        try:
            return self._describe(state, read, conn)
        finally:
            read.close()

    def show_job(self, job: str) -> dict[str, Any]:
        return self.describe_now(*self.home.open_job(job))

    def list_jobs(self) -> list[dict[str, Any]]:
        conn = self.home.connection()  # ClusterNotFound
        read = self.home.event_reader(conn)
        try:
            return [self._describe(state, read, conn) for state in self.home.jobs()]
        finally:
            read.close()

    def running_nodes(self) -> list[dict[str, Any]]:
        """The live nodes (and in-process coordinators) of every job of the cluster: what deleting the cluster
        stops first."""
        jobs = self.home.jobs()
        return [{"component": f"job {job['name']} {node['name']}", "pid": node["pid"]}
                for job in jobs for node in job["nodes"] if self._alive(node)] + \
            [{"component": f"job {job['name']} coordinator", "pid": job["coordinator"]["pid"]}
             for job in jobs if job.get("coordinator") and self._alive(job["coordinator"])]

    def stop_all(self) -> None:
        """Stop every job of the cluster (their state stays, for the cluster's folder to go with)."""
        for job in self.home.jobs():
            self._stop_job_processes(job)

    def job_alive(self, job: str) -> bool:
        state = self.home.load_job(job)
        return state is not None and any(self._alive(n) for n in state["nodes"])

    # -- following a job after an eviction (the evictions themselves: evict.py) ------
    def follow_recovery(self, job: str, eviction: dict[str, Any], sleep: Any = time.sleep) -> dict[str, Any]:
        from azext_elastictrain.core.recovery import follow_recovery

        read = self.home.event_reader(self.home.connection())
        try:
            return follow_recovery(read, job, eviction, sleep=sleep)
        finally:
            read.close()

    def follow_world_size(self, job: str, world_size: int, since: float,
                          sleep: Any = time.sleep) -> dict[str, Any]:
        from azext_elastictrain.core.recovery import follow_world_size

        read = self.home.event_reader(self.home.connection())
        try:
            return follow_world_size(read, job, world_size, since, sleep=sleep)
        finally:
            read.close()

    def job_events(self, job: str) -> list[dict[str, Any]]:
        """The events of the job's current run, oldest first (core.events)."""
        state, conn = self.home.open_job(job)
        read = self.home.event_reader(conn)
        try:
            return run_events(read, state)
        finally:
            read.close()

    # -- logs --------------------------------------------------------------------------
    def job_nodes(self, job: str) -> list[dict[str, Any]]:
        """The job's recorded nodes: name, agent pid and start time, log, status."""
        nodes: list[dict[str, Any]] = self.home.require_job(job)["nodes"]
        return nodes

    def _log_nodes(self, job: str, node: str | None) -> list[dict[str, Any]]:
        state = self.home.require_job(job)
        nodes: list[dict[str, Any]] = state["nodes"]
        if node is not None:
            nodes = [n for n in nodes if n["name"] == node]
            if not nodes:
                names = ", ".join(n["name"] for n in state["nodes"])
                raise JobNotFound(f"job {job!r} has no node {node!r}; its nodes: {names}")
        return nodes

    def job_logs(self, job: str, node: str | None = None, *, tail: int | None = None,
                 follow: bool = False, poll: float = 0.5, timeout: float | None = None) -> Iterator[tuple[str, str]]:
        """(node, line) pairs of the nodes' logs: the last ``tail`` lines of each (all when None); with
        ``follow``, then new lines as they come until every agent of the job exited (or ``timeout``)."""
        nodes = self._log_nodes(job, node)
        offsets: dict[str, int] = {}
        partial: dict[str, bytes] = {}
        for n in nodes:
            path = Path(n["log"])
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                data = b""
            offsets[n["name"]] = len(data)
            lines = data.decode(errors="replace").splitlines()
            if follow and data and not data.endswith(b"\n"):
                # hold a half-written last line back until it is complete
                cut = data.rfind(b"\n") + 1
                partial[n["name"]] = data[cut:]
                lines = data[:cut].decode(errors="replace").splitlines()
            if tail is not None:
                lines = lines[-tail:] if tail > 0 else []
            for line in lines:
                yield n["name"], line
        if not follow:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ended = not self.job_alive(job)  # look before reading: nothing written after is lost
            for n in nodes:
                try:
                    with open(n["log"], "rb") as f:
                        f.seek(offsets[n["name"]])
                        data = f.read()
                except FileNotFoundError:
                    continue
                if not data:
                    continue
                offsets[n["name"]] += len(data)
                data = partial.pop(n["name"], b"") + data
                cut = data.rfind(b"\n") + 1
                if cut < len(data):
                    partial[n["name"]] = data[cut:]
                for line in data[:cut].decode(errors="replace").splitlines():
                    yield n["name"], line
            if ended:
                for name, rest in partial.items():
                    yield name, rest.decode(errors="replace")
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(poll)

    # -- delete ------------------------------------------------------------------------
    def delete_job(self, job: str, dry_run: bool = False, delete_checkpoints: bool = False) -> dict[str, Any]:
        """Stop every node (agent and descendants) and remove the job's state; its checkpoints and
        event log stay unless ``delete_checkpoints``."""
        state, conn = self.home.open_job(job)
        procs = self._job_processes(state) + self._coordinator_processes(state)
        agents = {n["pid"]: n["name"] for n in state["nodes"]}
        if state.get("coordinator"):
            agents[state["coordinator"]["pid"]] = "coordinator"
        blobs: list[Any] = []
        if delete_checkpoints:
            blobs = self._job_blobs(job, conn)
        result = {
            "name": job,
            "cluster": self.home.name,
            "dryRun": dry_run,
            "stopped": [{"node": agents.get(p.pid), "pid": p.pid} for p in sorted(procs, key=lambda p: p.pid)],
            "removed": str(self.home.job_dir(job)),
            "checkpoints": "deleted" if delete_checkpoints else "kept",
            "checkpointUrl": self.home.checkpoint_url(job, conn),
            "blobsDeleted": len(blobs),
            "bytesFreed": sum(b.size for b in blobs),
        }
        if dry_run:
            return result
        with self.home.lock():
            state["stopRequested"] = True
            self.home.save_job(state)
            self._stop_job_processes(state)
            if delete_checkpoints:
                self._delete_job_blobs(job, conn)
            shutil.rmtree(self.home.job_dir(job), ignore_errors=True)
        return result

    def _job_blobs(self, job: str, conn: dict[str, Any]) -> list[BlobEntry]:
        store = self.home.job_store(conn)
        try:
            return store.list(job + "/")
        finally:
            store.close()

    def _delete_job_blobs(self, job: str, conn: dict[str, Any]) -> None:
        store = self.home.job_store(conn)
        try:
            # manifests first: a reader never sees a half-deleted checkpoint as complete
            names = [b.name for b in store.list(job + "/")]
            manifests = [n for n in names if n.endswith("/manifest.json")]
            store.delete(manifests)
            store.delete([n for n in names if n not in set(manifests)])
        finally:
            store.close()


def run_events(read: EventReader, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of the run of the job recorded as ``state``, oldest first (core.events)."""
    return job_events.since(read(state["name"]), state["created"])


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


def _signal_until_gone(processes: Callable[[], list[Any]], rounds: tuple[tuple[int, float], ...], what: str) -> None:
    """Each round: send the signal to what ``processes()`` lists now, wait up to its timeout. Listed again before
    each round: an agent may start a worker between listing and signalling. Raises ClusterError if any is left."""
    import psutil

    for sig, timeout in rounds:
        procs = processes()
        if not procs:
            return
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=timeout)
    left = processes()
    if left:
        raise ClusterError(f"{what} {sorted(p.pid for p in left)} did not stop")
