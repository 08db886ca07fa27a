"""An eviction schedule on AKS (``core.chaos``): each eviction is simulateEviction of the VMSS instance under one
node of the job's workers (``backends.aks.evict``), so Azure gives it its Spot notice (Scheduled Events
Preempt, >= 30 s) and deletes the VM; the autoscaler brings capacity back when it finds some. Recovery is
followed as ``evict simulate --wait`` does: the node leaves the cluster, then the job's events say when it
trained again and what it lost.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

from azext_elastictrain.backends.aks import evict as aks_evict
from azext_elastictrain.core.chaos import ScheduledEviction, Skipped, sleeper
from azext_elastictrain.core.aks.eviction import EvictionPlanError


class AksScheduleEvictor:
    """``core.chaos.ScheduleEvictor`` over one ``AksSession``, for one job."""

    def __init__(self, session: Any, job: str, min_nodes: int, pools: list[str], *,
                 events: Callable[[], list[dict[str, Any]]], progress: Callable[[str],
                 None] = lambda line: None) -> None:
        self.session, self.job, self.min_nodes, self.pools = session, job, min_nodes, pools
        self._job_events, self._progress = events, progress
        self._reader: dict[str, Any] = {}  # "read": the event reader, or "error": why there is none

    def evict(self, item: ScheduledEviction) -> dict[str, Any]:
        try:
            found = aks_evict.plan(self.session.kube(), job=self.job, pools=self.pools)
        except EvictionPlanError as ex:  # the job has no worker on a node now (all pending, or gone)
            raise Skipped(str(ex)) from ex
        if len(found.targets) <= self.min_nodes:
            raise Skipped(f"job {self.job!r} runs on {len(found.targets)} node(s), its minimum of {self.min_nodes}: "
                          "evicting one would stop it (the autoscaler has not brought capacity back yet)")
        node = item.choose([t.node for t in found.targets])
        one = replace(found, by={"job": self.job, "node": node},
                      targets=tuple(t for t in found.targets if t.node == node))
        return aks_evict.evict(self.session.arm, one, progress=self._progress)[0]

    def recovery(self, eviction: dict[str, Any], stop: threading.Event) -> dict[str, Any]:
        read_events = self._events()
        aks_evict.follow(self.session.kube(), self.session.arm, [eviction], read_events,
                         events_error=self._reader.get("error"), sleep=sleeper(stop), progress=self._progress)
        recovery: dict[str, Any] = eviction["recovery"]
        return recovery

    # pylint: disable-next=useless-return  # the None is the answer (and the type checker wants it said)
    def capacity_back(self, item: ScheduledEviction, eviction: dict[str, Any],
                      stop: threading.Event) -> dict[str, Any] | None:
        """None: the cluster autoscaler brings capacity back, when Azure has Spot capacity."""
        del item, eviction, stop
        return None

    def events(self) -> list[dict[str, Any]]:
        return self._job_events()

    def _events(self) -> Any:
        if not self._reader:
            try:
                self._reader["read"] = self.session.events()
            except Exception as ex:  # pylint: disable=broad-exception-caught  # evictions go on, not measured
                self._reader["error"] = f"the job's events in the cluster's blob storage cannot be read: {ex}"
        return self._reader.get("read")
