"""Spot evictions on the local cluster, as Azure does them: a notice, then the node goes; or no notice, and
the node vanishes.

With a notice, a ``Preempt`` event for the node is posted on the cluster's Scheduled Events endpoint; the
node's agent and all its workers are killed once the runtime acknowledged the event (its checkpoint is durable)
or the notice ran out. Without one, the node vanishes (``vanish_processes``): frozen, its sockets open, until
the job's survivors noticed by a timeout of their own (the runtime's peer timeout) and trained again without it,
then killed. Then
Spot capacity may come back: ``replace_nodes`` starts nodes that join the job's rendezvous. How the job
recovered is read from its events: ``core.eventlog.recovery``.
"""
from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from typing import Any, Callable

from azext_elastictrain.backends.local import record
from azext_elastictrain.backends.local.following import run_events
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.starting import start_node
from azext_elastictrain.backends.local.state import alive, node_processes
from azext_elastictrain.backends.views import LocalEvicted, LocalNodeEviction, Replacement
from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS
from azext_elastictrain.core.eventlog.recovery import trained_again
from azext_elastictrain.core.spec import SpecError

# A vanished node is killed once the survivors trained again without it, or after this long: a last resort for a
# job that cannot notice it (a minimum of nodes the survivors lack, the runtime's peer watch turned off), which is
# then told by the kill, which Azure would not do, rather than stalled for good. Well above the peer and
# collective timeouts (core/launch.py) plus a re-form. ``ELASTICTRAIN_LOCAL_VANISH_CAP=off`` in the caller's
# environment (benchmarks, tests) turns it off, so what is measured is what Azure gives: the node stays frozen
# until the job trained again without it.
VANISH_CAP_SECONDS = 120.0
ENV_VANISH_CAP = "ELASTICTRAIN_LOCAL_VANISH_CAP"


def vanish_cap(environ: Any = None) -> float:
    """How long a local vanish lasts at most: VANISH_CAP_SECONDS, or for ever (``ELASTICTRAIN_LOCAL_VANISH_CAP``
    ``off``); a number there is the cap in seconds."""
    raw = str((os.environ if environ is None else environ).get(ENV_VANISH_CAP, "")).strip().lower()
    if raw == "off":
        return math.inf
    if not raw:
        return VANISH_CAP_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise SpecError(f"{ENV_VANISH_CAP}={raw!r}: give seconds above 0, or off")
    return seconds


def _admin(conn: dict[str, Any]) -> str:
    return str(conn["scheduled_events"]).split("/metadata/", 1)[0] + "/admin/events"


def _request(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def _node_processes(node: dict[str, Any], marker: str) -> list[Any]:
    """Every process of the node (known by the node's name and the job's marker where they are not the
    agent's descendants)."""
    from azext_elastictrain.backends.local.agent import JOB_MARKER_ENV
    from azext_elastictrain.core.launch import ENV_NODE_NAME

    return node_processes(node["pid"], {ENV_NODE_NAME: node["name"], JOB_MARKER_ENV: marker})


def kill_processes(procs: list[Any]) -> None:
    """SIGKILL them all at once, and reap them."""
    import psutil

    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def vanish_processes(procs: list[Any], seconds: float, *, until: Callable[[float], bool] | None = None,
                     poll: float = 0.5) -> float:
    """A VM that vanished: every process frozen at once (SIGSTOP; a frozen process keeps its sockets open and
    sends nothing, so no FIN or RST reaches a peer, which finds out only by a timeout of its own, as when an
    Azure Spot VM is evicted without notice), then killed once ``until(frozen_at)`` is true, or ``seconds``
    after the freeze at the latest (the local kernel would close their sockets at once: a kill alone tells every
    peer at once, which Azure never does). Returns when they froze."""
    import psutil

    for proc in procs:
        try:
            proc.suspend()
        except psutil.Error:
            pass
    frozen_at = time.time()
    deadline = frozen_at + seconds
    try:
        while (left := deadline - time.time()) > 0:
            if until is not None and until(frozen_at):
                break
            time.sleep(min(poll, left))
    finally:  # whatever ``until`` raised (or a Ctrl-C), a frozen node never stays behind
        kill_processes(procs)
    return frozen_at


def choose_nodes(job: dict[str, Any], running: list[dict[str, Any]], node: str | None,
                 count: int | None) -> list[dict[str, Any]]:
    """Which live nodes go: the one named, or the newest ``count``. Pure; raises SpecError."""
    if node is not None and count is not None:
        raise SpecError("name a --node or give a --count, not both")
    if node is not None:
        named = [n for n in job["nodes"] if n["name"] == node]
        if not named:
            known = ", ".join(n["name"] for n in job["nodes"])
            raise SpecError(f"job {job['name']!r} has no node {node!r} (its nodes: {known})")
        if named[0] not in running:
            raise SpecError(f"node {node!r} of job {job['name']!r} is not running")
        return named
    count = 1 if count is None else count
    if count < 1 or count > len(running):
        raise SpecError(f"--count {count}: job {job['name']!r} has {len(running)} running node(s)")
    return running[-count:]


def evict_nodes(home: ClusterHome, job_name: str, *, node: str | None = None, count: int | None = None,
                notice_seconds: float = AZURE_NOTICE_SECONDS, replace_after: float | None = None,
                dry_run: bool = False, vanish: bool = True) -> LocalEvicted:
    """Evict the chosen nodes, one after the other. Replacements are the caller's next step
    (``replace_nodes``), so it can follow the recovery at the smaller world size first. One job-changing command
    at a time: job starts wait.

    Without notice the node vanishes, as Azure does it (``vanish_processes``): frozen until the job's other
    nodes trained again without it (they notice by the runtime's peer timeout, core/launch.py), then killed (or
    after ``vanish_cap()``, a last resort);
    killed at once when no other node runs (nobody is there to notice). ``vanish=False``: killed at once, which
    tells its peers at once through their closed sockets (a detection Azure never gives; for tests that
    need the old behaviour)."""
    if notice_seconds < 0:
        raise SpecError(f"--notice-seconds {notice_seconds:g}: use 0 (no notice) or more")
    if replace_after is not None and replace_after < 0:
        raise SpecError(f"--replace-after {replace_after:g}: use 0 or more seconds")
    with home.lock():
        job, conn = home.open_job(job_name)
        running = [n for n in job["nodes"] if alive(n)]
        targets = choose_nodes(job, running, node, count=count)
        evictions: list[LocalNodeEviction] = []
        plan: LocalEvicted = {"job": job_name, "dryRun": dry_run, "noticeSeconds": notice_seconds,
                              "nodes": [{"node": n["name"], "pid": n["pid"]} for n in targets],
                              "evictions": evictions, "replaceAfterSeconds": replace_after, "replacements": []}
        if dry_run:
            return plan
        for target in targets:
            evictions.append(_evict_one(home, job, target, conn=conn, notice_seconds=notice_seconds, vanish=vanish))
        return plan


def replace_nodes(home: ClusterHome, job_name: str, count: int) -> list[Replacement]:
    """Spot capacity is back: ``count`` new nodes join the job's rendezvous."""
    with home.lock():
        job, conn = home.open_job(job_name)
        return [_replace(home, job, conn) for _ in range(count)]


def _evict_one(home: ClusterHome, job: dict[str, Any], target: dict[str, Any], *, conn: dict[str, Any],
               notice_seconds: float, vanish: bool = True) -> LocalNodeEviction:
    started = time.time()
    acked_after = None
    event_id = None
    if notice_seconds > 0:
        event_id = _request("POST", _admin(conn), {"resources": [target["name"]], "event_type": "Preempt",
                                                   "notice_seconds": notice_seconds})["EventId"]
        deadline = started + notice_seconds
        while time.time() < deadline:
            events = {e["EventId"]: e for e in _request("GET", _admin(conn))}
            if events.get(event_id, {}).get("AcknowledgedAt"):
                acked_after = round(events[event_id]["AcknowledgedAt"] - started, 2)
                break
            time.sleep(0.2)
    procs = _node_processes(target, str(home.job_dir(job["name"])))
    survivors = [n for n in job["nodes"] if n is not target and alive(n)]
    if notice_seconds == 0 and vanish and survivors:
        read = home.event_reader(conn)  # one reader for every look: the job's record and connection are in hand

        def reformed(frozen_at: float) -> bool:
            return trained_again(run_events(read, job), frozen_at)

        try:
            evicted_at = vanish_processes(procs, vanish_cap(), until=reformed)
        finally:
            read.close()
    else:
        kill_processes(procs)
        evicted_at = time.time()
    if event_id is not None:
        _request("DELETE", f"{_admin(conn)}/{event_id}")  # the VM is gone, and its events with it
    target["status"] = "evicted"
    target["evictedAt"] = evicted_at
    home.save_job(job)
    return {"node": target["name"], "pid": target["pid"], "noticeSeconds": notice_seconds,
            "acknowledged": acked_after is not None, "acknowledgedAfterSeconds": acked_after,
            "evictedAt": evicted_at, "startedAt": started}


def _replace(home: ClusterHome, job: dict[str, Any], conn: dict[str, Any]) -> Replacement:
    """Spot capacity is back: a new node joins the job's rendezvous, started as the job's first nodes were."""
    name = f"{job['name']}-node-{len(job['nodes'])}"
    node = start_node(record.spec_of(job), job["script"], name, conn, job_dir=home.job_dir(job["name"]),
                      rdzv_id=job["rdzvId"], recorded=job)
    job["nodes"].append(node)
    home.save_job(job)
    return {"node": name, "pid": node["pid"], "startedAt": node["started"]}


class NodeEvictions:
    """Evictions and replacements of the jobs of one cluster (its ``home``), as an object (what an eviction
    schedule calls)."""

    def __init__(self, home: ClusterHome) -> None:
        self.home = home

    def evict(self, job: str, **options: Any) -> LocalEvicted:
        return evict_nodes(self.home, job, **options)

    def replace_nodes(self, job: str, count: int) -> list[Replacement]:
        return replace_nodes(self.home, job, count)
