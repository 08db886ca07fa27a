"""An eviction schedule on the local cluster (``core.chaos``): each eviction is ``evict simulate``'s own (a
Scheduled Events Preempt when it has a notice, then the node's processes go), capacity comes back as a new
node after the schedule's delay, and recovery is read from the job's events as ``core.eventlog.recovery`` does.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Protocol

from azext_elastictrain.backends.views import LocalEvicted, Replacement
from azext_elastictrain.core.chaos import FollowStopped, ScheduledEviction, Skipped, sleeper
from azext_elastictrain.core.eventlog.view import LocalJobShown


class Jobs(Protocol):
    """What the evictor reads of the job (``following.JobFollower``, bound to its cluster)."""

    def show_job(self, job: str) -> LocalJobShown:
        ...

    def follow_recovery(self, job: str, eviction: dict[str, Any], sleep: Callable[[float], None]) -> dict[str, Any]:
        ...

    def follow_world_size(self, job: str, world_size: int, since: float,
                          sleep: Callable[[float], None]) -> dict[str, Any]:
        ...

    def job_events(self, job: str) -> list[dict[str, Any]]:
        ...


class Evictions(Protocol):
    """How it evicts and gives capacity back (``evict.NodeEvictions``, bound to the cluster)."""

    def evict(self, job: str, **options: Any) -> LocalEvicted:
        ...

    def replace_nodes(self, job: str, count: int) -> list[Replacement]:
        ...


class LocalScheduleEvictor:
    """``core.chaos.ScheduleEvictor`` over the local jobs and their evictions, for one job of one cluster."""

    def __init__(self, jobs: Jobs, evictions: Evictions, job: str) -> None:
        self.jobs, self.evictions, self.job = jobs, evictions, job
        self._world_before: dict[str, int] = {}

    def evict(self, item: ScheduledEviction) -> dict[str, Any]:
        shown = self.jobs.show_job(self.job)
        running = [n["name"] for n in shown["nodes"] if n["alive"]]
        least = int(shown.get("minNodes") or 1)
        if len(running) <= least:
            raise Skipped(f"job {self.job!r} runs {len(running)} node(s), its minimum of {least}: evicting one "
                          "would stop it (its capacity has not come back yet)")
        node = item.choose(running)
        world = shown.get("worldSize") or len(running) * int(shown.get("nprocPerNode") or 1)
        result = self.evictions.evict(self.job, node=node, notice_seconds=item.notice_seconds, replace_after=None)
        eviction: dict[str, Any] = {**result["evictions"][0]}
        self._world_before[node] = world
        return eviction

    def recovery(self, eviction: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
        return self.jobs.follow_recovery(self.job, eviction, sleep=sleeper(stop))

    def capacity_back(self, item: ScheduledEviction, eviction: dict[str, Any],
                      stop: threading.Event) -> dict[str, Any] | None:
        """A new node ``replace_after`` s after the eviction; stopped (Ctrl-C): at once, not followed."""
        if item.replace_after is None:
            return None
        stop.wait(max(0.0, eviction["evictedAt"] + item.replace_after - time.time()))
        replacements = self.evictions.replace_nodes(self.job, 1)
        back: dict[str, Any] = {"replacements": replacements}
        if stop.is_set():
            return {**back, "stopped": True}
        since = min(r["startedAt"] for r in replacements)
        try:
            back["fullSize"] = self.jobs.follow_world_size(self.job, self._world_before[eviction["node"]], since,
                                                           sleep=sleeper(stop))
        except FollowStopped:
            back["stopped"] = True
        return back

    def events(self) -> list[dict[str, Any]]:
        return self.jobs.job_events(self.job)
