"""A job's event log (``<job>/events.jsonl``): its event kinds, reading it, and what it says.

The training runtime appends the events (runtime/progress.py); the CLI reads
them here to show a job's state. No torch, no CLI: both sides import this.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from azext_elastictrain.core import layout

STARTED = "started"
RESTORED = "restored"
CHECKPOINT = "checkpoint"
CHECKPOINT_FAILED = "checkpoint_failed"
PREEMPTED = "preempted"
PROGRESS = "progress"
# Written by rank 0 once the planned work is trained (``step``; ``total``: the steps planned, where the loop
# knew them). Only the last world's counts: a training event after it means a later world trains on.
FINISHED = "finished"
# Written by every rank whose training stops before it finished: the last step every rank completed
# (``step``) and when (``step_time``).
INTERRUPTED = "interrupted"
# Written by rank 0 when torchrun stopped the workers (SIGTERM on any rank, no VM notice): a node joined and
# the world re-forms, or the job stops. ``step``: the step every rank stopped at; ``kept_in_memory``: it was
# in every node's memory, so no blob save was made.
REFORMING = "reforming"
# In-process recovery mode (the workers outlive a re-form): written once per change of the job's per-step quorum,
# by the node that is its first replica (local rank 0), when the quorum's members change: the world that trains
# from ``step`` on has ``world_size`` ranks (``replicas`` nodes), after ``from_world_size`` (None: this node just
# joined or started); ``last_step``/``last_step_time``: the old world's last committed step and when;
# ``discarded``: its steps discarded since the previous change; ``source``: "live" (the members kept their own
# state) or "peer" (a node took it from a peer). It starts a world as ``restored`` does in the restart mode, so
# every reading of the log (core/eventlog/goodput.py) measures both modes alike.
QUORUM = "quorum"

# Job states, as `job show` reports them.
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
STOPPED = "Stopped"
STATES = (RUNNING, SUCCEEDED, FAILED, STOPPED)


def read_events(store: Any, job_prefix: str) -> list[dict[str, Any]]:
    """All events of a job, in append order; unreadable lines are skipped."""
    from azext_elastictrain.core.blobstore import NotFound

    try:
        data = store.read(layout.events_name(job_prefix))
    except NotFound:
        return []
    return parse_events(data)


def parse_events(data: bytes) -> list[dict[str, Any]]:
    events = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events


def since(events: Iterable[dict[str, Any]], start_time: float) -> list[dict[str, Any]]:
    """The events of a run that began at ``start_time``: a job name used again keeps its old log
    (next to the checkpoints it resumes from). One clock: the local cluster's machine."""
    return [e for e in events if isinstance(e.get("time"), (int, float)) and e["time"] >= start_time]


# How summarize reads an in-process job's events: a quorum change begins a world, as ``restored`` does in the
# restart mode; a joining node's own start and restore are not the job's.
_IN_PROCESS_READING: dict[str, str | None] = {QUORUM: RESTORED, RESTORED: None, STARTED: None}


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the events say about a run: step, world size, throughput, checkpoints, notices, recoveries.

    ``step`` follows the training: the last progress or final step, or the step
    a re-formed job restored (which may be lower). Every restore after the
    first is the job re-forming: a ``scaleUp`` when it restored at a larger
    world size than it trained at before (capacity came back), else a
    ``recovery`` (it lost a node, or a worker failed).
    """
    step = world_size = samples_per_s = loss = None
    last_checkpoint = None
    finished = None  # the finished event, while no world trained after it
    preempted: list[dict[str, Any]] = []
    restores = recoveries = scale_ups = 0
    trained_at = None  # the world size of the last start, restore or progress before this event
    restarts = 0
    failed_checkpoints = 0
    in_process = any(e.get("event") == QUORUM for e in events)
    for e in events:
        kind: str | None = e.get("event")
        if in_process and kind in _IN_PROCESS_READING:  # its worlds begin at quorum changes, not a node's restore
            kind = _IN_PROCESS_READING[kind]
        if kind in (STARTED, RESTORED, PROGRESS, CHECKPOINT, REFORMING):
            finished = None  # a world trains after the finished event (an old runtime's done() after a stop)
        if kind == RESTORED and restores >= 1:
            if None not in (e.get("world_size"), trained_at) and e["world_size"] > trained_at:
                scale_ups += 1
            else:
                recoveries += 1
        if e.get("world_size") is not None and kind in (STARTED, RESTORED, PROGRESS):
            world_size = e["world_size"]
            if kind != STARTED:
                trained_at = world_size
        if kind == PROGRESS:
            step = e.get("step", step)
            samples_per_s = e.get("samples_per_s", samples_per_s)
            loss = (e.get("metrics") or {}).get("loss", loss)
        elif kind == FINISHED:
            finished = e if _completes(e) else None
            step = e.get("step", step)
        elif kind == RESTORED:
            restores += 1
            samples_per_s = None  # a rate measured at the old world size says nothing about the new one
            if e.get("step") is not None:
                step = e["step"]
        elif kind == CHECKPOINT:
            last_checkpoint = e
        elif kind == CHECKPOINT_FAILED:
            failed_checkpoints += 1
        elif kind == PREEMPTED:
            preempted.append(e)
        elif e.get("event") == STARTED:
            restarts = max(restarts, int(e.get("restart_count") or 0))
    return {
        "started": any(e.get("event") == STARTED for e in events),
        "finished": finished is not None,
        "step": step,
        "worldSize": world_size,
        "samplesPerSecond": samples_per_s,
        "loss": loss,
        "lastCheckpointStep": last_checkpoint.get("step") if last_checkpoint else None,
        "lastCheckpointTime": last_checkpoint.get("time") if last_checkpoint else None,
        "failedCheckpoints": failed_checkpoints,
        "preempted": [{"node": e.get("node"), "step": e.get("step"), "source": e.get("source")} for e in preempted],
        "recoveries": recoveries,
        "scaleUps": scale_ups,
        "workerRestarts": restarts,
    }


def _completes(finished: dict[str, Any]) -> bool:
    """A finished event says the planned work is done: its step reached its total, where it names one."""
    step, total = finished.get("step"), finished.get("total")
    return not (isinstance(step, int) and isinstance(total, int) and step < total)


def job_state(finished: bool, any_alive: bool, stop_requested: bool = False) -> str:
    """Running while an agent lives; then Succeeded if training finished, else Stopped (asked) or Failed."""
    if finished:
        return SUCCEEDED
    if any_alive:
        return RUNNING
    return STOPPED if stop_requested else FAILED
