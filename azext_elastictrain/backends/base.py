"""The contract every backend keeps: where a command runs is chosen once (``_validators.resolve_target``), and
from then on the command only talks to a ``Backend``.

The torchx shape (``torchx/schedulers/api.py``: ``submit_dryrun`` returns an ``AppDryRunInfo[T]`` that
``schedule`` takes): planning returns a ``Plan[R]`` and changes nothing (``--dry-run`` prints ``Plan.shown``; a
destructive command confirms ``Plan.prompt``); sending takes that plan and uses its ``request``, of the
backend's own type (``backends/local/plans.py``, ``backends/aks/plans.py``), never what was printed. A backend is
bound to one cluster and gets its clients injected (the local state root; an ``AksSession`` over the ports of
``core.ports``), so a test gives it fakes of OUR interfaces, and one command resolves its clients once.

Call order for a command: ``plan_*`` -> (confirm) -> the matching send (``submit_job``, ``delete_job``,
``delete_cluster``, ``evict``, ``run_schedule``). Describing (``describe_job``, ``list_jobs``, ``wait_job``,
``job_logs``, ``show_cluster``, ``cluster_state``) changes nothing.

Which options a backend takes is declared once, in its ``NOT_HERE`` table (``refuse_options``): an option of
the other backend is refused before anything is asked, saying where it belongs.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Generic, Iterator, Mapping, Protocol, Sequence, TypeVar

from azext_elastictrain.backends.views import (
    ClusterCreated,
    ClusterDeleted,
    ClusterShown,
    ClusterState,
    Evicted,
    JobDeleted,
    JobEvent,
    JobPool,
    Kubeconfig,
    ScheduleRun,
)
from azext_elastictrain.core.errors import OptionNotHere
from azext_elastictrain.core.eventlog.view import AksJobShown, LocalJobShown
from azext_elastictrain.core.spec import JobSpec

R = TypeVar("R")


@dataclass(frozen=True)
class Plan(Generic[R]):
    """What a command would do: ``shown`` is what ``--dry-run`` prints, ``request`` what the send step takes (the
    backend's own type), ``prompt`` what a destructive command asks before doing it (None: nothing to ask)."""

    shown: Mapping[str, Any]  # the dry run's own object, as each backend builds it
    request: R
    prompt: str | None = None


@dataclass(frozen=True)
class JobRequest:
    """A job to run: the spec both backends share, and the container of an AKS job (local: the checkout)."""

    spec: JobSpec
    image: str | None = None
    gpus_per_node: int | None = None
    engine: str | None = None  # AKS: torchelastic (default) or k8s-job (core.aks.manifests.ENGINES)


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
    # the command that gives the login the data role a 403 says it lacks; a callable is asked only on a 403 (it
    # reads the login's token for the object id)
    grant: "str | Callable[[], str] | None" = None


#: A request field -> (why it is not an option here, how to fix it): the options a backend does not take.
NotHere = Mapping[str, "tuple[str, str | None]"]


def refuse_options(request: object, not_here: NotHere) -> None:
    """Raises ``OptionNotHere`` for the first option of ``request`` given (not None, not False) that ``not_here``
    names. ``request``: one of this module's request dataclasses, or a command's own options as a dict."""
    given = dict(request) if isinstance(request, Mapping) else \
        {f.name: getattr(request, f.name) for f in fields(request)}  # type: ignore[arg-type]
    for name, (why, fix) in not_here.items():
        value = given.get(name)
        if value is not None and value is not False:  # --rank 0 is given
            raise OptionNotHere(why, fix)


#: `job show|list|wait` of either backend (core/eventlog/view.py): each has its own nodes.
JobShown = LocalJobShown | AksJobShown

ClusterSpecT_contra = TypeVar("ClusterSpecT_contra", contravariant=True)
ClusterDeletionT = TypeVar("ClusterDeletionT")
JobT = TypeVar("JobT")
JobDeletionT = TypeVar("JobDeletionT")
EvictionT = TypeVar("EvictionT")
ScheduleT = TypeVar("ScheduleT")


class Backend(Protocol[ClusterSpecT_contra, ClusterDeletionT, JobT, JobDeletionT, EvictionT, ScheduleT]):
    # pylint: disable=too-many-public-methods  # one per command step, as torchx's
    """One cluster (local, or AKS) as every command sees it. The type parameters are the backend's own: the spec
    its clusters are made from, and what each plan carries to its send step."""

    kind: str  # "local" | "aks"

    @property
    def cluster(self) -> str | None:
        ...  # the cluster's name (AKS: None for a list of the subscription's clusters)

    # -- the cluster
    def plan_cluster(self, spec: ClusterSpecT_contra) -> Plan[None]:
        ...

    def create_cluster(self, spec: ClusterSpecT_contra, *, no_wait: bool = False) -> ClusterCreated:
        ...

    def merge_kubeconfig(self, spec: ClusterSpecT_contra) -> Kubeconfig:
        ...  # the cluster's credentials into the user's kubeconfig (AKS); a local cluster has none

    def show_cluster(self) -> ClusterShown:
        ...

    def cluster_state(self) -> ClusterState:
        ...  # `cluster wait`'s getter: the provisioning state (AKS); a local cluster is up when create returns

    def list_clusters(self) -> Sequence[ClusterShown]:
        ...

    def plan_cluster_delete(self, *, delete_storage: bool = False,
                            storage_account: str | None = None) -> Plan[ClusterDeletionT]:
        ...

    def delete_cluster(self, plan: Plan[ClusterDeletionT], *, no_wait: bool = False) -> ClusterDeleted:
        ...

    # -- jobs
    def plan_job(self, request: JobRequest) -> Plan[JobT]:
        ...

    def submit_job(self, plan: Plan[JobT]) -> JobShown:
        ...

    def describe_job(self, name: str) -> JobShown:
        ...

    def job_events(self, name: str) -> list[JobEvent]:
        ...  # its current run's, oldest first

    def job_pool(self) -> JobPool | None:
        ...  # the pool jobs' workers run on: {"vmSize", "priority" (Spot|Regular), "location"}; None: local

    def list_jobs(self) -> Sequence[JobShown]:
        ...

    def job_logs(self, name: str, request: LogRequest) -> JobLogs:
        ...

    def wait_job(self, name: str, until: WaitFor) -> JobShown:
        ...

    def plan_job_delete(self, name: str, *, delete_checkpoints: bool = False) -> Plan[JobDeletionT]:
        ...

    def delete_job(self, plan: Plan[JobDeletionT]) -> JobDeleted:
        ...

    # -- evictions
    def plan_eviction(self, request: EvictionRequest) -> Plan[EvictionT]:
        ...

    def evict(self, plan: Plan[EvictionT], *, wait: bool = False) -> Evicted:
        ...

    def plan_schedule(self, request: ScheduleRequest) -> Plan[ScheduleT]:
        ...  # shown: the schedule (core.chaos)

    def run_schedule(self, plan: Plan[ScheduleT], *, stop: Any = None,
                     say: Callable[[str], None] | None = None) -> ScheduleRun:
        ...

    # -- checkpoints
    def checkpoint_location(self, job: str) -> CheckpointLocation:
        ...

    def close(self) -> None:
        ...


#: A backend of either place, as the commands hold it (they never look inside a plan's request).
AnyBackend = Backend[Any, Any, Any, Any, Any, Any]
