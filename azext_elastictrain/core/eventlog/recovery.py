"""How a job recovered from an eviction, read from its events: the same reading on every backend.

``read_events(job)`` is the backend's event reader (``clients.blob.EventReader``). Pure but for the clock;
``sleep`` is how a caller stops a wait early (``core.chaos.sleeper``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from azext_elastictrain.core.errors import EvictionError
from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.eventlog.goodput import last_completed_step, outages, scale_ups, world_starts

# A local node comes back in seconds; the AKS backend passes its own, longer timeout (a new Spot VM).
RECOVERY_TIMEOUT = 240.0


def trained_again(events: list[dict[str, Any]], since: float) -> bool:
    """Whether a world formed after ``since`` completed a step: it restored (in-process: its quorum formed), then
    reported progress."""
    restored = [e["time"] for e in world_starts(events) if e["time"] > since]
    return bool(restored) and any(e.get("event") == "progress" and e["time"] > restored[0] for e in events)


def finished_since(events: list[dict[str, Any]], since: float) -> int | None:
    """The step the job finished at after ``since`` (its last step: nothing more will train), or None."""
    done = [e.get("step") for e in events if e.get("event") == job_events.FINISHED and e["time"] > since]
    return done[0] if done else None


def follow_recovery(read_events: Any, job: str, eviction: Mapping[str, Any], timeout: float = RECOVERY_TIMEOUT,
                    sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """After an eviction: the job's outage (``core.eventlog.goodput.outages``: from the old world's last completed step
    to the new world's first completed step) and the steps it lost, once the new world completed a step; also
    ``restoreSeconds``/``recoverySeconds``, from the node going to the restore and to that first step. Events
    without the old world's restore (a log that begins mid-run) give no outage (None) and the steps lost from
    the survivors' record, the notice's step or the last progress report."""
    deadline = time.time() + timeout
    evicted_at = eviction["evictedAt"]
    started_at = eviction.get("startedAt", evicted_at)
    while time.time() < deadline:
        events = read_events(job)
        # from the eviction's start: an in-process job re-forms at the notice, before the node goes
        restored = [e for e in world_starts(events) if e.get("step") is not None and e["time"] > started_at]
        # a world that trained on to the job's end before it reported progress recovered too
        resumed = [e for e in events if e.get("event") in (job_events.PROGRESS, job_events.FINISHED) and restored
                   and e["time"] > restored[0]["time"]]
        if resumed:
            found = {"node": eviction["node"], "resumedFromStep": restored[0]["step"],
                     "worldSize": resumed[0].get("world_size", restored[0].get("world_size")),
                     # 0: an in-process job trained on without the node before it went
                     "restoreSeconds": round(max(0.0, restored[0]["time"] - evicted_at), 2),
                     "recoverySeconds": round(max(0.0, resumed[0]["time"] - evicted_at), 2), "outageSeconds": None}
            after = [o for o in outages(events) if o["restoredAt"] > started_at and o["firstStepAt"] is not None]
            if after:
                found.update({k: after[0][k]
                              for k in ("kind", "outageSeconds", "stepsLost", "lastStep", "resumedFromStep")})
                return found
            before = [e["step"] for e in events if e.get("event") == "progress" and e["time"] <= evicted_at]
            notices = [e["step"] for e in events if e.get("event") == "preempted"
                       and started_at <= e["time"] <= evicted_at]
            reached = last_completed_step(events, started_at, restored[0]["time"])
            if reached is None:
                reached = notices[0] if notices else max(before, default=restored[0]["step"])
            found["stepsLost"] = max(0, reached - restored[0]["step"])
            return found
        ended = finished_since(events, started_at)
        if ended is not None:  # the survivors trained to the end without a new world that reported a step
            raise EvictionError(f"job {job!r} finished (step {ended}) before a world formed after the eviction "
                                "trained a step: there was nothing left to recover")
        sleep(0.5)
    raise EvictionError(f"job {job!r} did not train again within {timeout:.0f}s of the eviction")


def follow_world_size(read_events: Any, job: str, world_size: int, since: float,
                      timeout: float = RECOVERY_TIMEOUT, *,
                      sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """After capacity came back: seconds from the replacement's start until the job trains at ``world_size``
    again, and the scale-up as its events measure it (seconds from the node joining to training at full size,
    seconds of no training, steps lost, where the grown world restored from)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        events = read_events(job)
        grown = [e for e in events if e.get("event") == "progress" and e["time"] > since
                 and e.get("world_size") == world_size]
        if grown:
            # the scale-up's own measurements (core/eventlog/goodput.py): from the rendezvous round the node joined
            ups = [up for up in scale_ups(events) if up["toWorldSize"] == world_size
                   and up["nodeJoined"] >= since]
            up = ups[0] if ups else {}
            # the survivors' outage: the smaller world's last step to the grown world's first (core.eventlog.goodput)
            out = [o for o in outages(events) if o["toWorldSize"] == world_size and o["restoredAt"] > since
                   and o["firstStepAt"] is not None]
            return {"worldSize": world_size, "step": grown[0]["step"],
                    "seconds": round(grown[0]["time"] - since, 2),
                    "outageSeconds": out[0]["outageSeconds"] if out else None,
                    "nodeJoinedToFullSizeSeconds": up.get("nodeJoinedToFullSizeSeconds"),
                    "noTrainingSeconds": up.get("noTrainingSeconds"), "stepsLost": up.get("stepsLost"),
                    "restoreSource": up.get("restoreSource"), "ranksFromPeer": up.get("ranksFromPeer")}
        ended = finished_since(events, since)
        if ended is not None:  # the smaller world trained the last step before the replacement was in
            raise EvictionError(f"job {job!r} finished (step {ended}) at a smaller world before it trained at "
                                f"world size {world_size} again: the replacement came after the last step")
        sleep(0.5)
    raise EvictionError(f"job {job!r} did not train at world size {world_size} within {timeout:.0f}s "
                        "of the replacement joining")
