"""Following and describing local jobs: `job show` and `job list`, a job's events, its recovery after an eviction
(core.eventlog.recovery) and its nodes' logs.

A job's progress is the event log its training runtime appends to the cluster's blob storage
(core.eventlog.events); what runs is its record's agents, each alive while its pid and start time match
(state.py). Both are read through the cluster's home (home.py), once per look; the view of them is
core.eventlog.view's, the same on AKS.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from azext_elastictrain.backends.local import record
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.state import alive
from azext_elastictrain.backends.views import JobEvent
from azext_elastictrain.clients.blob import EventReader
from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.errors import JobNotFound
from azext_elastictrain.core.launched import Launched, LaunchedOwn, launched
from azext_elastictrain.core.eventlog.view import (
    JobIdentity,
    LocalJobShown,
    LocalJobNode,
    build_job_view,
    iso_time,
    read_job_events,
)

#: What only a local job's launched part shows (core/launched.py's ``own``): an in-process job's coordinator.
OWN_LAUNCHED = ("coordinator",)


class JobFollower:
    """`job show|list|logs` and the job's events, of the jobs of one local cluster (its ``home``)."""

    def __init__(self, home: ClusterHome) -> None:
        self.home = home

    def show_job(self, job: str) -> LocalJobShown:
        return self.describe_now(*self.home.open_job(job))

    def describe_now(self, state: dict[str, Any], conn: dict[str, Any]) -> LocalJobShown:
        """`job show` of the job recorded as ``state``, its events read through ``conn`` (both in hand)."""
        read = self.home.event_reader(conn)
        try:
            return self._describe(state, read, conn)
        finally:
            read.close()

    def list_jobs(self) -> list[LocalJobShown]:
        conn = self.home.connection()  # ClusterNotFound
        read = self.home.event_reader(conn)
        try:
            return [self._describe(state, read, conn) for state in self.home.jobs()]
        finally:
            read.close()

    def _describe(self, job: dict[str, Any], read: EventReader, conn: dict[str, Any]) -> LocalJobShown:
        nodes: list[LocalJobNode] = []
        for node in job["nodes"]:
            node_alive = alive(node)
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
        identity = JobIdentity(name=job["name"], cluster=self.home.name, type="local")
        shown = launched_of(job, self.home.checkpoint_url(job["name"], conn))
        return view.describe(identity, shown, {"stateDir": str(self.home.job_dir(job["name"]))})

    def job_alive(self, job: str) -> bool:
        state = self.home.load_job(job)
        return state is not None and any(alive(n) for n in state["nodes"])

    # -- following a job after an eviction (the evictions themselves: evict.py) ------
    def follow_recovery(self, job: str, eviction: Mapping[str, Any], sleep: Any = time.sleep) -> dict[str, Any]:
        from azext_elastictrain.core.eventlog.recovery import follow_recovery

        read = self.home.event_reader(self.home.connection())
        try:
            return follow_recovery(read, job, eviction, sleep=sleep)
        finally:
            read.close()

    def follow_world_size(self, job: str, world_size: int, since: float,
                          sleep: Any = time.sleep) -> dict[str, Any]:
        from azext_elastictrain.core.eventlog.recovery import follow_world_size

        read = self.home.event_reader(self.home.connection())
        try:
            return follow_world_size(read, job, world_size, since, sleep=sleep)
        finally:
            read.close()

    def job_events(self, job: str) -> list[JobEvent]:
        """The events of the job's current run, oldest first (core.eventlog.events)."""
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


def launched_of(job: dict[str, Any], checkpoint_url: str) -> Launched:
    """How the job recorded as ``job`` was launched, as `job show` prints it (core/launched.py): the spec its record
    holds, where it checkpoints (the cluster's storage as it is reached now), its rendezvous, and ``OWN_LAUNCHED``."""
    coordinator = job.get("coordinator")
    own = LaunchedOwn(coordinator={"address": coordinator.get("address"), "pid": coordinator["pid"],
                                   "alive": alive(coordinator), "log": coordinator["log"]}) if coordinator else None
    return launched(record.spec_of(job), created=iso_time(job["created"]), checkpoint_url=checkpoint_url,
                    rdzv_id=job.get("rdzvId"), own=own)


def run_events(read: EventReader, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of the run of the job recorded as ``state``, oldest first (core.eventlog.events)."""
    return job_events.since(read(state["name"]), state["created"])
