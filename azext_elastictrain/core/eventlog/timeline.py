"""`job timeline`'s series, from a run's events: step and world size over time, checkpoints, notices, stops.

Times are seconds since the run's first event. The step series is each world's recorded step boundaries
(core.eventlog.goodput.segments); the world size is a world's size from its restore to its last completed step,
else 0 (no training). Pure: no clock, no I/O, no matplotlib (the picture is drawn CLI side).
"""
from __future__ import annotations

from typing import Any, Iterable

from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.eventlog import goodput as job_goodput


def series(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``{"start", "worlds", "worldSize", "checkpoints", "notices", "stops", "scaleUps"}`` (see module doc)."""
    ordered = job_goodput.unique(events)
    if not ordered:
        return {"start": None, "worlds": [], "worldSize": [], "checkpoints": [], "notices": [], "stops": [],
                "scaleUps": []}
    t0 = float(ordered[0]["time"])

    def rel(t: float) -> float:
        return round(t - t0, 3)

    worlds = job_goodput.segments(ordered)
    finished = any(e.get("event") == job_events.FINISHED for e in ordered)
    sizes: list[list[float]] = [[0.0, 0]]
    stops, scale_ups = [], []
    measured = iter(job_goodput.scale_ups(ordered))
    outages = job_goodput.outages(ordered)
    for i, seg in enumerate(worlds):
        sizes.append([rel(seg.restored), seg.world_size])
        last = i == len(worlds) - 1
        if not last or finished:
            sizes.append([rel(seg.last_time), 0])
        if not last:
            following = worlds[i + 1]
            outage = outages[i]  # the same figure as job show and evict simulate --wait (core.eventlog.goodput.outages)
            stops.append({"time": rel(seg.last_time), "step": seg.last_step, "kind": outage["kind"],
                          "resumedFromStep": following.first_step, "stepsLost": outage["stepsLost"],
                          "outageSeconds": outage["outageSeconds"]})
            if following.world_size > seg.world_size:
                up = next(measured)
                scale_ups.append({"time": rel(following.started or following.restored),
                                  "worldSize": following.world_size, "nodeJoined": rel(up["nodeJoined"]),
                                  "nodeJoinedToFullSizeSeconds": up["nodeJoinedToFullSizeSeconds"],
                                  "noTrainingSeconds": up["noTrainingSeconds"], "restoreSource": up["restoreSource"]})
    return {
        "start": t0,
        "worlds": [{"worldSize": seg.world_size, "fromStep": seg.first_step,
                    "steps": [[rel(t), s] for s, t in sorted(seg.points)]} for seg in worlds],
        "worldSize": sizes,
        "checkpoints": [[rel(e["time"]), e["step"]] for e in ordered if e.get("event") == job_events.CHECKPOINT],
        "notices": [{"time": rel(e["time"]), "node": e.get("node"), "step": e.get("step"), "source": e.get("source")}
                    for e in ordered if e.get("event") == job_events.PREEMPTED],
        "stops": stops,
        "scaleUps": scale_ups,
    }
