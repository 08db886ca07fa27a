"""Where a job's time went, from its events: goodput, and the time lost by cause.

A run is a chain of *segments*, one per world the job formed: each begins with rank 0's ``restored``
event (the step it resumed from, its world size) and ends at the last step the world completed: the
newest of its ``progress``, ``checkpoint`` (``step_time``), ``interrupted`` (``step_time``, from any
survivor) and ``finished`` events. The steps a segment trained past the step the next one resumed
from were lost: retrained, so they are not in the final model.

Rank-seconds (world size x seconds), per segment and per gap between segments:

- useful: from the restore to the boundary of the last step the final model kept;
- stepsLost: from there to the segment's last completed step;
- reforming: from that step to the new world's ``started`` event (the survivors wait for rendezvous);
- restoring: from ``started`` to ``restored`` (loading the checkpoint);
- scaleUps: reforming + restoring of a world larger than the one before (capacity came back);
- starting: from the first ``started`` to the first ``restored``.

A gap is charged at the size of the world that forms after it: those ranks waited through it. Step
boundary times come from the ranks' own events; between two of them steps are taken to be evenly
spaced. ``goodput`` = useful / all of them. Pure: no clock, no I/O.

Each scale-up (``scale_ups``), measured from events, not inferred:

- nodeJoined: when the rendezvous round that grew the world began: the earliest SIGTERM a worker of the
  smaller world received (``interrupted``'s ``sigterm_time``; torchrun stops the workers because a node is
  waiting), else rank 0's ``reforming`` event, else the smaller world's last step;
- nodeJoinedToFullSizeSeconds: from nodeJoined to the larger world's first ``progress`` event (rank 0
  reports its first step at once): training at full size;
- noTrainingSeconds: from the smaller world's last completed step to the larger world's ``restored``
  (from there it trains);
- restoreSource: where the larger world restored from (memory, peer, blob; "peer" when rank 0 is a
  newcomer), and ranksFromPeer: how many ranks took the state from a peer (the rest: their own memory).

Each re-form (``outages``), the one figure every command and benchmark reports for it: ``outageSeconds``,
from the old world's last completed step to the new world's first completed step (rank 0 reports its first
step at once), whatever the cause: an eviction with a notice (the survivors stop at the notice's step, before
the VM goes), one without, a scale-up (the survivors stop when the node joins) or a restart. Not from the kill
or the node joining: a user's training stopped at the last step, and only the first step of the new world
trains again. ``stepsLost``: the old world's last completed step minus the step the new one resumed from.

The in-process recovery mode (the workers outlive a re-form) writes no ``restored`` per world: its worlds begin
at its ``quorum`` events (core/eventlog/events.py), which carry the old world's last committed step and its time,
and its first committed step after a change is reported at once. A log with ``quorum`` events is read by them
(``world_starts``), so both modes give the same figures; a node's own ``restored`` there is not a world's.
"""
from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterable

from azext_elastictrain.core.eventlog import events as job_events

CAUSES = ("reforming", "restoring", "stepsLost", "scaleUps", "starting")


def unique(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events in time order, each once: an append retried after a lost reply writes a line twice."""
    seen, out = set(), []
    for e in events:
        key = json.dumps(e, sort_keys=True, default=str)
        if key not in seen and isinstance(e.get("time"), (int, float)):
            seen.add(key)
            out.append(e)
    return sorted(out, key=lambda e: e["time"])


@dataclass
class Segment:
    """One world of the job: from its restore to the last step it completed."""

    started: float | None
    restored: float
    world_size: int
    first_step: int
    points: list[tuple[int, float]] = field(default_factory=list)  # (step, wall time of its boundary)
    source: str | None = None  # where it restored from
    ranks_from_peer: int | None = None  # memory restores: the ranks that took the state from a peer

    @property
    def last_step(self) -> int:
        return max(self.points)[0]

    @property
    def last_time(self) -> float:
        return max(self.points)[1]

    def time_of(self, step: int) -> float:
        """Wall time of a step boundary: known, or between the two known boundaries around it."""
        points = sorted(dict(sorted(self.points)).items())
        steps = [s for s, _ in points]
        at = bisect_left(steps, step)
        if at < len(steps) and steps[at] == step:
            return points[at][1]
        if at == 0:
            return points[0][1]
        if at == len(steps):
            return points[-1][1]
        (s0, t0), (s1, t1) = points[at - 1], points[at]
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)


def world_starts(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that begin a world of the job, in time order: its ``quorum`` changes (in-process recovery
    mode), else rank 0's ``restored`` events."""
    ordered = unique(events)
    kind = _world_start_kind(ordered)
    return [e for e in ordered if e.get("event") == kind]


def _world_start_kind(events: list[dict[str, Any]]) -> str:
    return job_events.QUORUM if any(e.get("event") == job_events.QUORUM for e in events) else job_events.RESTORED


def _step_point(e: dict[str, Any]) -> tuple[int, float] | None:
    kind, step = e.get("event"), e.get("step")
    if kind == job_events.QUORUM:  # the old world's last committed step, as the new world's first replica saw it
        last, at = e.get("last_step"), e.get("last_step_time")
        return (last, at) if isinstance(last, int) and isinstance(at, (int, float)) else None
    if not isinstance(step, int):
        return None
    if kind in (job_events.PROGRESS, job_events.FINISHED):
        return step, e["time"]
    if kind in (job_events.CHECKPOINT, job_events.INTERRUPTED) and isinstance(e.get("step_time"), (int, float)):
        return step, e["step_time"]
    return None


def segments(events: Iterable[dict[str, Any]]) -> list[Segment]:
    """The worlds of a run, in order (events of one run: see ``core.eventlog.events.since``)."""
    found: list[Segment] = []
    last_started: float | None = None
    ordered = unique(events)
    begins = _world_start_kind(ordered)
    for e in ordered:
        kind = e.get("event")
        if kind == job_events.STARTED:
            # in-process: a node's start is the job's only before its first world (the others live on)
            last_started = e["time"] if begins == job_events.RESTORED or not found else last_started
        elif kind == begins:
            step = e["step"] if isinstance(e.get("step"), int) else 0
            found.append(Segment(started=last_started, restored=e["time"],
                                 world_size=int(e.get("world_size") or 1), first_step=step,
                                 points=[(step, e["time"])], source=e.get("source"),
                                 ranks_from_peer=e.get("ranks_from_peer")))
            last_started = None
    starts = [seg.restored for seg in found]
    for e in ordered:
        point = _step_point(e)
        # by the step's own time, not the line's: a survivor may write after the next world restored
        at = bisect_left(starts, point[1]) if point is not None else 0
        if point is not None and at > 0 and (at == len(starts) or starts[at] != point[1]):
            found[at - 1].points.append(point)
    return found


def _kept_steps(worlds: list[Segment]) -> list[int]:
    """Per segment, the last step of it the final model kept: no later world resumed from before it."""
    kept, floor = [], None
    for seg in reversed(worlds):
        end = seg.last_step if floor is None else min(seg.last_step, floor)
        kept.append(max(end, seg.first_step))
        floor = seg.first_step if floor is None else min(floor, seg.first_step)
    return kept[::-1]


def goodput(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """``{"goodput", "usefulRankSeconds", "lostRankSeconds": {cause: s}, "stepsLost"}``; None before training."""
    worlds = segments(events)
    if not worlds:
        return None
    useful, steps_lost = 0.0, 0
    lost = dict.fromkeys(CAUSES, 0.0)
    for i, (seg, kept) in enumerate(zip(worlds, _kept_steps(worlds))):
        kept_at = seg.time_of(kept)
        useful += seg.world_size * (kept_at - seg.restored)
        lost["stepsLost"] += seg.world_size * (seg.last_time - kept_at)
        steps_lost += seg.last_step - kept
        started = seg.started if seg.started is not None else seg.restored
        if i == 0:
            lost["starting"] += seg.world_size * max(0.0, seg.restored - started)
            continue
        before = worlds[i - 1]
        reform = max(0.0, started - before.last_time)
        restore = max(0.0, seg.restored - max(started, before.last_time))
        if seg.world_size > before.world_size:
            lost["scaleUps"] += seg.world_size * (reform + restore)
        else:
            lost["reforming"] += seg.world_size * reform
            lost["restoring"] += seg.world_size * restore
    total = useful + sum(lost.values())
    return {"goodput": round(useful / total, 4) if total > 0 else None,
            "usefulRankSeconds": round(useful, 2),
            "lostRankSeconds": {k: round(v, 2) for k, v in lost.items()},
            "stepsLost": steps_lost}


def scale_ups(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per world that formed larger than the one before: when the node joined, the seconds to training at
    full size and of no training, the steps lost and where it restored from (module doc)."""
    ordered = unique(events)
    worlds = segments(ordered)
    in_process = _world_start_kind(ordered) == job_events.QUORUM
    out = []
    for before, seg in zip(worlds, worlds[1:]):
        if seg.world_size <= before.world_size:
            continue
        window = [e for e in ordered if before.restored < e["time"] <= seg.restored]
        signals = [e["sigterm_time"] for e in window if e.get("event") == job_events.INTERRUPTED
                   and isinstance(e.get("sigterm_time"), (int, float))]
        reforming = [e["time"] for e in window if e.get("event") == job_events.REFORMING]
        if in_process:  # no rendezvous round: the node joined when its workers started
            reforming = [e["time"] for e in window if e.get("event") == job_events.STARTED]
        joined = min(signals) if signals else (reforming[0] if reforming else before.last_time)
        full = [e["time"] for e in ordered if e.get("event") == job_events.PROGRESS and e["time"] >= seg.restored
                and e.get("world_size") == seg.world_size]
        out.append({
            "nodeJoined": joined,
            "fromWorldSize": before.world_size, "toWorldSize": seg.world_size,
            "nodeJoinedToFullSizeSeconds": round(full[0] - joined, 2) if full else None,
            "noTrainingSeconds": round(max(0.0, seg.restored - before.last_time), 2),
            "stepsLost": max(0, before.last_step - seg.first_step),
            "restoreSource": seg.source, "ranksFromPeer": seg.ranks_from_peer,
        })
    return out


def _first_completed(seg: Segment) -> tuple[int, float] | None:
    """The first step a world completed after its restore: (step, wall time), None while it has not."""
    done = [(t, s) for s, t in seg.points if s > seg.first_step and t >= seg.restored]
    return (min(done)[1], min(done)[0]) if done else None


def _outage_kind(before: Segment, seg: Segment, window: list[dict[str, Any]]) -> str:
    if seg.world_size > before.world_size:
        return "scaleUp"
    # A notice the old world stopped at: every rank saves the step the notice came at and trains no further one.
    # A notice called off earlier (the hold ran out, training went on) has an older step and is not this re-form's.
    notice = any(e.get("event") == job_events.PREEMPTED and e.get("source") not in (None, "sigterm")
                 and (not isinstance(e.get("step"), int) or e["step"] >= before.last_step) for e in window)
    if notice:
        return "evictionWithNotice"
    return "eviction" if seg.world_size < before.world_size else "restart"


def outages(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per re-form, in order: its kind (scaleUp, evictionWithNotice, eviction, restart), the old world's last
    completed step and its time, where the new world resumed, its first completed step and its time,
    ``outageSeconds`` between the two (None while the new world has not completed a step) and ``stepsLost``
    (module doc)."""
    ordered = unique(events)
    worlds = segments(ordered)
    out: list[dict[str, Any]] = []
    if not worlds:
        return out
    trained = worlds[0]  # the newest world that completed a step: training stopped there
    for seg in worlds[1:]:
        # A world that re-formed again before its first step never trained: the outage runs on from the last
        # world that did (two re-forms seconds apart are one outage for the user), one entry per re-form still.
        before = trained
        window = [e for e in ordered if before.restored < e["time"] <= seg.restored]
        first = _first_completed(seg)
        if first is not None:
            trained = seg
        out.append({
            "kind": _outage_kind(before, seg, window),
            "fromWorldSize": before.world_size, "toWorldSize": seg.world_size,
            "lastStep": before.last_step, "lastStepAt": before.last_time,
            "restoredAt": seg.restored, "resumedFromStep": seg.first_step,
            "firstStep": first[0] if first else None, "firstStepAt": first[1] if first else None,
            "outageSeconds": round(first[1] - before.last_time, 2) if first else None,
            "stepsLost": max(0, before.last_step - seg.first_step),
            "restoreSource": seg.source,
        })
    return out


def last_completed_step(events: Iterable[dict[str, Any]], after: float, before: float) -> int | None:
    """The newest step a world completed, as its survivors recorded it when it broke in ``(after, before]``."""
    steps = [e["step"] for e in unique(events) if e.get("event") == job_events.INTERRUPTED
             and isinstance(e.get("step"), int) and after < e["time"] <= before]
    return max(steps, default=None)
