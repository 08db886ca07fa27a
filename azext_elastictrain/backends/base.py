"""The contract every backend keeps: where a command runs is chosen once (``_validators.resolve_target``), and
from then on the command only talks to a ``Backend``.

The torchx shape (``torchx/schedulers/api.py``: ``submit_dryrun`` + ``schedule``): planning returns what would
be done and changes nothing (``--dry-run`` prints ``Plan.shown``; a destructive command confirms
``Plan.prompt``); sending takes that plan. A backend is bound to one cluster and gets its clients injected
(the local state root; an ``AksSession`` over ARM, Kubernetes and blob storage), so a test gives it fakes of
OUR interfaces, and one command resolves its clients once.

Call order for a command: ``plan_*`` -> (confirm) -> the matching send (``submit_job``, ``delete_job``,
``delete_cluster``, ``evict``, ``run_schedule``). Describing (``describe_job``, ``list_jobs``, ``wait_job``,
``job_logs``, ``show_cluster``) changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from azext_elastictrain.core.spec import JobSpec


@dataclass(frozen=True)
class Plan:
    """What a command would do: ``shown`` is what ``--dry-run`` prints, ``prompt`` what a destructive command
    asks before doing it (None: nothing to ask), ``request`` what the send step takes."""

    shown: dict
    prompt: str | None = None
    request: Any = None


@dataclass(frozen=True)
class JobRequest:
    """A job to run: the spec both backends share, and the container of an AKS job (local: the checkout)."""

    spec: JobSpec
    image: str | None = None
    gpus_per_node: int | None = None
    engine: str | None = None  # AKS: torchelastic (default) or k8s-job (core.manifests.ENGINES)


@dataclass(frozen=True)
class LogRequest:
    """Whose logs: every node, or one ``node`` (local), ``rank`` or ``pod`` (AKS)."""

    node: str | None = None
    rank: int | None = None
    pod: str | None = None
    follow: bool = False
    tail: int | None = None
    timeout: int | None = None


@dataclass(frozen=True)
class JobLogs:
    """``(source, line)`` pairs; ``prefixed``: several sources, so each line says which it is from."""

    lines: Iterator[tuple[str, str]]
    prefixed: bool


@dataclass(frozen=True)
class WaitFor:
    """A job state and/or a step reached and/or a world size trained at; ``timeout`` seconds at most."""

    state: str | None = None
    step: int | None = None
    world_size: int | None = None
    timeout: int = 600


@dataclass(frozen=True)
class EvictionRequest:
    """Which nodes to evict: a ``node``, the nodes of ``job`` (``rank``: one), or ``count`` of ``pool``; the
    local cluster's notice and capacity coming back are its own (AKS: Azure's notice and autoscaler)."""

    job: str | None = None
    node: str | None = None
    rank: int | None = None
    pool: str | None = None
    count: int | None = None
    notice_seconds: float | None = None
    replace_after: float | None = None


@dataclass(frozen=True)
class ScheduleRequest:
    """Evictions of ``job``'s nodes at ``rate`` a minute for ``duration`` seconds (``core.chaos``); None: the
    backend's default (local: half with Azure's 30 s notice, capacity back after 30 s; AKS: Azure's notice on
    every one, capacity back when the autoscaler finds it)."""

    job: str
    rate: float
    duration: float
    notice_share: float | None = None
    notice_seconds: float | None = None
    replace_after: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class CheckpointLocation:
    """Where a job's checkpoints are: the blob URL of its prefix, and how to open it (a connection string for
    Azurite; else the CLI's login). ``unreachable`` says what to check when the storage cannot be reached."""

    url: str
    connection_string: str | None = None
    unreachable: str | None = None
    grant: str | None = None  # the command that gives the login the data role a 403 says it lacks


class Backend(Protocol):  # pylint: disable=too-many-public-methods  # one per command step, as torchx's
    """One cluster (local, or AKS) as every command sees it."""

    kind: str  # "local" | "aks"
    cluster: str

    # -- the cluster
    def plan_cluster(self, spec: Any) -> Plan:
        ...

    def create_cluster(self, spec: Any, *, no_wait: bool = False) -> dict:
        ...

    def show_cluster(self) -> dict:
        ...

    def list_clusters(self) -> list[dict]:
        ...

    def plan_cluster_delete(self, *, delete_storage: bool = False, storage_account: str | None = None) -> Plan:
        ...

    def delete_cluster(self, plan: Plan, *, no_wait: bool = False) -> dict:
        ...

    # -- jobs
    def plan_job(self, request: JobRequest) -> Plan:
        ...

    def submit_job(self, plan: Plan) -> dict:
        ...

    def describe_job(self, name: str) -> dict:
        ...

    def job_events(self, name: str) -> list[dict]:
        ...  # its current run's, oldest first

    def job_pool(self) -> dict | None:
        ...  # the pool jobs' workers run on: {"vmSize", "priority" (Spot|Regular), "location"}; None: local

    def list_jobs(self) -> list[dict]:
        ...

    def job_logs(self, name: str, request: LogRequest) -> JobLogs:
        ...

    def wait_job(self, name: str, until: WaitFor) -> dict:
        ...

    def plan_job_delete(self, name: str, *, delete_checkpoints: bool = False) -> Plan:
        ...

    def delete_job(self, plan: Plan) -> dict:
        ...

    # -- evictions
    def plan_eviction(self, request: EvictionRequest) -> Plan:
        ...

    def evict(self, plan: Plan, *, wait: bool = False) -> dict:
        ...

    def plan_schedule(self, request: ScheduleRequest) -> Plan:
        ...  # shown: the schedule; request: what run_schedule takes (core.chaos)

    def run_schedule(self, plan: Plan, *, stop: Any = None, say: Any = None) -> dict:
        ...

    # -- checkpoints
    def checkpoint_location(self, job: str) -> CheckpointLocation:
        ...

    def close(self) -> None:
        ...
