"""`job show` in one place: ``JobView`` from a job's events and what its backend knows (processes, pods).

Both backends build it here, so a job reads the same on a laptop and on AKS: state, world size, step,
throughput, checkpoints, evictions, recoveries, nodes, and goodput with the time lost by cause (how each is
obtained: core/eventlog/goodput.py). Also the one time formatter of `job` and `evict` output.

Pure: no knack, no azure.cli, no SDK.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Generic, Iterable, Literal, Mapping, NotRequired, TypedDict, TypeVar

from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.eventlog import goodput as job_goodput
from azext_elastictrain.core.launched import Launched


def iso_time(epoch: float | None, *, millis: bool = False) -> str | None:
    """UTC ISO 8601 (``Z``), to the second, or the millisecond where recovery times are measured."""
    if epoch is None:
        return None
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))
    return f"{text}.{int(epoch % 1 * 1000):03d}Z" if millis else text + "Z"


def parse_iso(timestamp: str | None) -> float | None:
    """Seconds since the epoch of an ISO 8601 time (Kubernetes' and ours); None where there is none."""
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class LocalJobNode(TypedDict):
    """A node of a local job: its torchrun agent."""

    name: str
    pid: int
    alive: bool
    status: str  # Running | Evicted | Exited
    log: str


class AksWorker(TypedDict):
    """A worker pod of a job on AKS, and the node it runs on (None: gone, or not scheduled yet)."""

    pod: str | None
    rank: int
    node: str | None
    pool: str | None
    spot: bool | None
    phase: str
    status: str
    alive: bool
    restarts: int
    reason: str | None
    started: str | None


#: A job's nodes, as its backend shows them: a local job's agents, or an AKS job's worker pods.
Node = TypeVar("Node", LocalJobNode, AksWorker)


class JobIdentity(TypedDict):
    """Who a job is: the first keys of `job show`."""

    name: str
    cluster: str | None
    type: Literal["local", "aks"]
    namespace: NotRequired[str | None]  # AKS
    engine: NotRequired[str]  # AKS


class JobOwn(TypedDict, total=False):
    """What only some `job show`s end with: a local job's folder; the AKS controller's status; what the job cost,
    where the command prices it (operations/job.py, last)."""

    stateDir: str
    operator: dict[str, Any]  # the ElasticJob's (or batch/v1 Job's) conditions and counts (backends/aks/describe.py)
    cost: dict[str, Any]  # core.prices.job_cost


class _WorkerRestarts(TypedDict, total=False):
    workerRestarts: int


class _EventsError(TypedDict, total=False):
    eventsError: str


class JobShown(JobIdentity, Launched, _WorkerRestarts, JobOwn, _EventsError, Generic[Node]):
    """`job show|list|wait` on either backend: who the job is (``JobIdentity``), its state, how it was launched
    (core/launched.py), its progress and goodput, its nodes, then its backend's own keys."""

    state: str
    worldSize: int | None
    step: int | None
    samplesPerSecond: float | None
    loss: float | None
    lastCheckpointStep: int | None
    lastCheckpointTime: str | None
    failedCheckpoints: int
    evictions: int
    recoveries: int
    scaleUps: int
    goodput: float | None
    stepsLost: int | None
    timeLost: dict[str, float] | None  # rank-seconds lost, by cause
    rankSeconds: dict[str, Any] | None
    scaleUpTimes: list[dict[str, Any]]
    outages: list[dict[str, Any]]
    nodes: list[Node]


LocalJobShown = JobShown[LocalJobNode]
AksJobShown = JobShown[AksWorker]


@dataclass(frozen=True)
class JobView(Generic[Node]):  # pylint: disable=too-many-instance-attributes  # the `job show` fields
    """What a job is doing, as `job show|list|wait` report it."""

    state: str
    world_size: int | None
    step: int | None
    samples_per_second: float | None
    loss: float | None
    last_checkpoint_step: int | None
    last_checkpoint_time: float | None
    failed_checkpoints: int
    evictions: int
    recoveries: int
    scale_ups: int
    worker_restarts: int
    nodes: list[Node] = field(default_factory=list)
    events_error: str | None = None
    goodput: dict[str, Any] | None = None  # core.eventlog.goodput.goodput of the run; None before it trained
    scale_up_times: list[Any] = field(default_factory=list)  # core.eventlog.goodput.scale_ups of the run
    outages: list[Any] = field(default_factory=list)  # core.eventlog.goodput.outages of the run

    def describe(self, identity: JobIdentity, launch: Launched, extra: JobOwn | None = None,
                 worker_restarts: bool = False) -> JobShown[Node]:
        """The `job show` object: who the job is, its state, how it was launched, its progress, its nodes,
        then whatever else its backend shows (``extra``)."""
        restarts = _WorkerRestarts(workerRestarts=self.worker_restarts) if worker_restarts else _WorkerRestarts()
        error = _EventsError(eventsError=self.events_error) if self.events_error else _EventsError()
        goodput = self.goodput  # core.eventlog.goodput.goodput: None before the job trained, else every key
        return {**identity, "state": self.state, **launch,
                "worldSize": self.world_size, "step": self.step, "samplesPerSecond": self.samples_per_second,
                "loss": self.loss, "lastCheckpointStep": self.last_checkpoint_step,
                "lastCheckpointTime": iso_time(self.last_checkpoint_time),
                "failedCheckpoints": self.failed_checkpoints, "evictions": self.evictions,
                "recoveries": self.recoveries, "scaleUps": self.scale_ups,
                "goodput": goodput["goodput"] if goodput else None,
                "stepsLost": goodput["stepsLost"] if goodput else None,
                "timeLost": goodput["lostRankSeconds"] if goodput else None,
                "rankSeconds": rank_seconds(goodput) if goodput else None,
                "scaleUpTimes": [{**up, "nodeJoined": iso_time(up["nodeJoined"], millis=True)}
                                 for up in self.scale_up_times],
                "outages": [shown_outage(o) for o in self.outages],
                **restarts, "nodes": self.nodes, **(extra or JobOwn()), **error}


def shown_outage(outage: dict[str, Any]) -> dict[str, Any]:
    """An outage (core.eventlog.goodput.outages) as `job show` reports it: its times as ISO 8601."""
    return {**outage, **{k: iso_time(outage[k], millis=True) for k in ("lastStepAt", "restoredAt", "firstStepAt")
                         if outage.get(k) is not None}}


def rank_seconds(goodput: dict[str, Any]) -> dict[str, Any]:
    """The run's rank-seconds: ``useful`` (steps in the final model) and ``total`` (useful + every cause lost),
    what a job's node-hours and cost are counted from (core.prices.job_cost)."""
    useful = goodput["usefulRankSeconds"]
    return {"useful": useful, "total": round(useful + sum(goodput["lostRankSeconds"].values()), 2)}


def build_job_view(events: Iterable[dict[str, Any]], *, created: float | None, nodes: list[Node],
                   state_of: Callable[[dict[str, Any]], str], lost_nodes: Callable[[str], Iterable[Any]],
                   events_error: str | None = None) -> JobView[Node]:
    """The view of the run that began at ``created`` (an earlier run of the same name kept its log).

    ``state_of(summary)``: the backend's state from the events' summary and what it sees running.
    ``lost_nodes(state)``: nodes that went without a Scheduled Events notice; an eviction is a notice, or such
    a node, each node counted once. A SIGTERM notice alone is not one: torchrun sends it to restart the
    workers when capacity comes back.
    """
    runs = job_events.since(events, created) if created is not None else list(events)
    summary = job_events.summarize(runs)
    state = state_of(summary)
    notices = [p for p in summary["preempted"] if p["source"] != "sigterm"]
    noticed = {p["node"] for p in notices}
    lost = {node for node in lost_nodes(state) if node not in noticed}
    return JobView(state=state, world_size=summary["worldSize"], step=summary["step"],
                   samples_per_second=summary["samplesPerSecond"], loss=summary["loss"],
                   last_checkpoint_step=summary["lastCheckpointStep"],
                   last_checkpoint_time=summary["lastCheckpointTime"],
                   failed_checkpoints=summary["failedCheckpoints"], evictions=len(notices) + len(lost),
                   recoveries=summary["recoveries"], scale_ups=summary["scaleUps"],
                   worker_restarts=summary["workerRestarts"], nodes=nodes, events_error=events_error,
                   goodput=job_goodput.goodput(runs), scale_up_times=job_goodput.scale_ups(runs),
                   outages=job_goodput.outages(runs))


def read_job_events(read: Callable[[str], Iterable[dict[str, Any]]],
                    job: str) -> tuple[list[dict[str, Any]], str | None]:
    """``(events, None)``, or ``([], why not)``: a job is still shown when its events cannot be read."""
    from azext_elastictrain.core.blobstore import AccessDenied

    try:
        return list(read(job)), None
    except AccessDenied:
        raise  # not a job to show as Unknown: the login lacks a data role, and the user can fix that
    except Exception as ex:  # pylint: disable=broad-exception-caught
        # show what the backend sees; tell why the events are missing
        return [], f"cannot read the job's events from the cluster's blob storage: {ex}"


Shown = TypeVar("Shown", bound=Mapping[str, Any])


def wait_for_job(describe: Callable[[], Shown], name: str, *, state: str | None, step: int | None,
                 world_size: int | None, timeout: float, interval: float, logs_hint: str,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float],
                 None] = time.sleep) -> Shown:
    """Describe the job every ``interval`` seconds until it is in ``state`` (default Succeeded), reached
    ``step`` and/or trains at ``world_size``; ``NotReached`` when it ends without getting there or time runs out.
    ``logs_hint`` is the command that shows its logs."""
    from azext_elastictrain.core.errors import NotReached

    if state is None and step is None and world_size is None:
        state = job_events.SUCCEEDED
    want = " and ".join(what for what, asked in ((f"state {state}", state), (f"step {step}", step is not None),
                                                 (f"world size {world_size}", world_size is not None)) if asked)
    deadline = clock() + timeout
    while True:
        shown = describe()
        now, at = shown["state"], shown.get("step")
        reached = (step is None or (at is not None and at >= step)) and \
            (world_size is None or (now == job_events.RUNNING and shown.get("worldSize") == world_size))
        if (state is None or now == state) and reached:
            return shown
        where = f"at step {at}" if at is not None else "before its first step"
        terminal = now in (job_events.SUCCEEDED, job_events.FAILED, job_events.STOPPED)
        if terminal and (state is None or now != state or not reached):
            raise NotReached(f"job {name!r} is {now} {where}: it will not reach {want}",
                             f"See what happened with '{logs_hint}'." if now != job_events.SUCCEEDED else
                             "Wait for a state or step it can still reach.")
        if clock() >= deadline:
            size = f", world size {shown['worldSize']}" if shown.get("worldSize") else ""
            raise NotReached(f"timed out after {timeout:g}s waiting for job {name!r} to reach {want}: "
                             f"it is {now} {where}{size}",
                             f"Wait longer with --timeout, or look at its progress with '{logs_hint}'.")
        sleep(interval)
