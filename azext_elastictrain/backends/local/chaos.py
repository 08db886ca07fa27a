"""An eviction schedule on the local cluster (``core.chaos``): each eviction is ``evict simulate``'s own (a
Scheduled Events Preempt when it has a notice, then the node's processes go), capacity comes back as a new
node after the schedule's delay, and recovery is read from the job's events as ``core.recovery`` does.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from azext_elastictrain.core.chaos import FollowStopped, ScheduledEviction, Skipped, sleeper


class LocalScheduleEvictor:
    """``core.chaos.ScheduleEvictor`` over ``LocalClusters``, for one job of one cluster."""

    def __init__(self, clusters: Any, cluster: str, job: str) -> None:
        self.clusters, self.cluster, self.job = clusters, cluster, job
        self._world_before: dict[str, int] = {}

    def evict(self, item: ScheduledEviction) -> dict:
        shown = self.clusters.show_job(self.cluster, self.job)
        running = [n["name"] for n in shown["nodes"] if n["alive"]]
        least = int(shown.get("minNodes") or 1)
        if len(running) <= least:
            raise Skipped(f"job {self.job!r} runs {len(running)} node(s), its minimum of {least}: evicting one "
                          "would stop it (its capacity has not come back yet)")
        node = item.choose(running)
        world = shown.get("worldSize") or len(running) * int(shown.get("nprocPerNode") or 1)
        result = self.clusters.evict(self.cluster, self.job, node=node, notice_seconds=item.notice_seconds,
                                     replace_after=None)
        eviction = result["evictions"][0]
        self._world_before[node] = world
        return eviction

    def recovery(self, eviction: dict, stop: threading.Event) -> dict:
        return self.clusters.follow_recovery(self.cluster, self.job, eviction, sleep=sleeper(stop))

    def capacity_back(self, item: ScheduledEviction, eviction: dict, stop: threading.Event) -> dict | None:
        """A new node ``replace_after`` s after the eviction; stopped (Ctrl-C): at once, not followed."""
        if item.replace_after is None:
            return None
        stop.wait(max(0.0, eviction["evictedAt"] + item.replace_after - time.time()))
        replacements = self.clusters.replace_nodes(self.cluster, self.job, 1)
        back: dict = {"replacements": replacements}
        if stop.is_set():
            return {**back, "stopped": True}
        since = min(r["startedAt"] for r in replacements)
        try:
            back["fullSize"] = self.clusters.follow_world_size(self.cluster, self.job,
                                                               self._world_before[eviction["node"]], since,
                                                               sleep=sleeper(stop))
        except FollowStopped:
            back["stopped"] = True
        return back

    def events(self) -> list[dict]:
        return self.clusters.job_events(self.cluster, self.job)
