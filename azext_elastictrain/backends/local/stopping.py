"""Stopping and deleting local jobs: every process of a job found and signalled until it is gone; its state and,
when asked, its checkpoints and events removed.

Stopping a node stops its agent and every descendant (torchrun's workers start sessions of their own, so a
process-group kill would leave them training) and any process carrying the job's marker (workers a killed agent
left behind); then an in-process job's coordinator. Each recorded process is the job's only while its pid and
start time match (state.py's ``alive``). ``delete_job`` and ``job run``'s restart of a finished run stop a
job's processes here; deleting the cluster stops every job's (``running_nodes``, ``stop_all``).
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain.backends.local.agent import COORDINATOR_MARKER_ENV, JOB_MARKER_ENV
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.state import STOP_TIMEOUT, ClusterError, alive
from azext_elastictrain.backends.views import LocalJobDeleted, StoppedComponent

if TYPE_CHECKING:
    from azext_elastictrain.core.blobstore import BlobEntry

# A job's workers get this long after SIGTERM (the runtime checkpoints on it) before SIGKILL.
JOB_STOP_TIMEOUT = 15.0


class JobStopper:
    """Stopping and deleting the jobs of one local cluster (its ``home``)."""

    def __init__(self, home: ClusterHome) -> None:
        self.home = home

    def delete_job(self, job: str, dry_run: bool = False, delete_checkpoints: bool = False) -> LocalJobDeleted:
        """Stop every node (agent and descendants) and remove the job's state; its checkpoints and
        event log stay unless ``delete_checkpoints``."""
        state, conn = self.home.open_job(job)
        job_dir = self.home.job_dir(job)
        procs = job_processes(state, job_dir) + coordinator_processes(state, job_dir)
        agents = {n["pid"]: n["name"] for n in state["nodes"]}
        if state.get("coordinator"):
            agents[state["coordinator"]["pid"]] = "coordinator"
        blobs: list[Any] = []
        if delete_checkpoints:
            blobs = self._job_blobs(job, conn)
        result: LocalJobDeleted = {
            "name": job,
            "cluster": self.home.name,
            "dryRun": dry_run,
            "stopped": [{"node": agents.get(p.pid), "pid": p.pid} for p in sorted(procs, key=lambda p: p.pid)],
            "removed": str(job_dir),
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
            stop_job_processes(state, job_dir)
            if delete_checkpoints:
                self._delete_job_blobs(job, conn)
            shutil.rmtree(job_dir, ignore_errors=True)
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

    def running_nodes(self) -> list[StoppedComponent]:
        """The live nodes (and in-process coordinators) of every job of the cluster: what deleting the cluster
        stops first."""
        jobs = self.home.jobs()
        return [{"component": f"job {job['name']} {node['name']}", "pid": node["pid"]}
                for job in jobs for node in job["nodes"] if alive(node)] + \
            [{"component": f"job {job['name']} coordinator", "pid": job["coordinator"]["pid"]}
             for job in jobs if job.get("coordinator") and alive(job["coordinator"])]

    def stop_all(self) -> None:
        """Stop every job of the cluster (their state stays, for the cluster's folder to go with)."""
        for job in self.home.jobs():
            stop_job_processes(job, self.home.job_dir(job["name"]))


def job_processes(job: dict[str, Any], job_dir: Path) -> list[Any]:
    """Every live process of the job: each recorded agent (pid + start time checked) with all its
    descendants, and any process carrying the job's marker (workers orphaned by a killed agent)."""
    import psutil

    found: dict[int, Any] = {}
    for node in job.get("nodes", []):
        if not alive(node):
            continue
        try:
            root = psutil.Process(node["pid"])
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    marker = str(job_dir)
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


def coordinator_processes(job: dict[str, Any], job_dir: Path) -> list[Any]:
    """The job's coordinator: the recorded process (pid + start time checked), and any process carrying the
    job's coordinator marker (one whose start this command did not get to record)."""
    import psutil

    marker = str(job_dir)
    found: dict[int, Any] = {}
    recorded = job.get("coordinator")
    if recorded and alive(recorded):
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


def stop_job_processes(job: dict[str, Any], job_dir: Path) -> None:
    """SIGTERM the job's processes (the runtime checkpoints on it), then SIGKILL what is left; then its
    coordinator, which the nodes may ask for a quorum until they are gone."""
    _stop_nodes(job, job_dir)
    _stop_coordinator(job, job_dir)


def _stop_coordinator(job: dict[str, Any], job_dir: Path) -> None:
    rounds = ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT))
    _signal_until_gone(lambda: coordinator_processes(job, job_dir), rounds, f"job {job['name']!r}: coordinator")


def _stop_nodes(job: dict[str, Any], job_dir: Path) -> None:
    for node in job.get("nodes", []):
        leaving = _leaving_file(job_dir, node["name"])
        if leaving.parent.is_dir():
            leaving.touch()
    rounds = ((signal.SIGTERM, JOB_STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT))
    _signal_until_gone(lambda: job_processes(job, job_dir), rounds, f"job {job['name']!r}: processes")


def _leaving_file(job_dir: Path, node: str) -> Path:
    """Made before the node's processes are stopped (AgentLaunch.leaving_file)."""
    return job_dir / "nodes" / f"{node}.leaving"


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
