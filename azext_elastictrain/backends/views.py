"""What the backends' describing and sending steps return (backends/base.py's ``Backend``): the objects ``az``
prints, key for key, as both backends build them.

They are ``TypedDict``s, so still the plain dicts that ``az`` prints as JSON: the type checker holds each backend to
its keys (a misspelled one is an error where it is written and where it is read), and the output does not change.
Where the backends differ, each has its own (``type`` tells them apart: ``"local"`` or ``"aks"``) and the protocol
returns either. A key only some results have is ``NotRequired``.

`job show`, `list` and `wait`: core/eventlog/view.py's ``JobShown``, where both backends build it.

What a value holds as another module declares it (a job's events, an eviction's recovery, the goodput of a
schedule) keeps that module's type: the event log is JSON the training runtime writes (core/eventlog/events.py).
"""
from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from azext_elastictrain.core.chaos import ScheduleReport

#: One record of a job's event log, as the runtime wrote it (core/eventlog/events.py): read back from JSON.
JobEvent = dict[str, Any]


# -- clusters ---------------------------------------------------------------------------------------------------

class LocalComponent(TypedDict):
    """A process of a local cluster (etcd, azurite, scheduled-events)."""

    state: str  # running | unhealthy | stopped
    pid: int | None
    endpoint: str | None
    log: str | None


class LocalCluster(TypedDict):
    """`cluster show|list|create --local`."""

    name: str
    type: Literal["local"]
    health: str  # Healthy | Degraded
    created: str | None
    checkpointContainer: str | None
    components: dict[str, LocalComponent]
    stateDir: str


class AksPool(TypedDict):
    """An agent pool of an AKS cluster, from its ARM profile."""

    name: str | None
    mode: str | None
    vmSize: str | None
    priority: str  # Spot | Regular
    evictionPolicy: str | None
    spotMaxPrice: float | None
    count: int | None
    minCount: int | None
    maxCount: int | None
    autoscale: bool | None
    taints: list[str]
    labels: dict[str, str]
    provisioningState: str | None
    osDiskType: str | None
    encryptionAtHost: bool | None


class AksStorage(TypedDict):
    """The cluster's storage account; its properties where the account was read (show, create)."""

    account: str
    container: str
    checkpointUrl: str
    provisioningState: NotRequired[str | None]
    minimumTlsVersion: NotRequired[str | None]
    supportsHttpsTrafficOnly: NotRequired[bool | None]
    allowBlobPublicAccess: NotRequired[bool | None]
    allowSharedKeyAccess: NotRequired[bool | None]
    sku: NotRequired[str | None]
    networkDefaultAction: NotRequired[str | None]


class AksIdentity(TypedDict):
    """The jobs' managed identity; its ids where it was read (show, create)."""

    name: str
    clientId: NotRequired[str | None]
    principalId: NotRequired[str | None]


class ComponentHealth(TypedDict):
    """A Kubernetes component of an AKS cluster (backends/aks/incluster.py)."""

    state: str  # ok | degraded | missing | unknown
    reason: str


class AksCluster(TypedDict):
    """`cluster show|list` on AKS: the Azure resources; `show` adds the health of what runs in the cluster."""

    name: str
    type: Literal["aks"]
    resourceGroup: str
    location: str | None
    provisioningState: str | None
    kubernetesVersion: str | None
    fqdn: str | None
    oidcIssuerUrl: str | None
    workloadIdentity: bool | None
    upgrades: dict[str, Any]  # the cluster's ARM autoUpgradeProfile, as Azure returns it
    apiServerAuthorizedIpRanges: list[str]
    entraId: bool
    azureRbac: bool
    localAccounts: bool
    pools: list[AksPool]
    storage: AksStorage
    identity: AksIdentity
    engine: str
    health: NotRequired[str]  # show: Healthy | Degraded | Missing | Unknown
    components: NotRequired[dict[str, ComponentHealth]]


class Kubeconfig(TypedDict):
    """`cluster create --merge-kubeconfig`: where the cluster's credentials were merged."""

    path: str
    context: str


class CreateFollowUp(TypedDict, total=False):
    """What `cluster create` on AKS ends with: with --no-wait the steps left and the command that finishes them;
    with --merge-kubeconfig (added by the command) where the credentials went."""

    pending: list[str]
    next: str
    kubeconfig: Kubeconfig


class AksClusterCreated(AksCluster, CreateFollowUp):
    """`cluster create` on AKS: the cluster as `show` has it (no health), what each step changed, then its
    ``CreateFollowUp``."""

    changes: list[dict[str, Any]]  # one per ARM step and the Kubernetes components (cluster_create.py)


ClusterShown = LocalCluster | AksCluster
ClusterCreated = LocalCluster | AksClusterCreated


class ClusterState(TypedDict):
    """What `cluster wait` polls."""

    name: str
    resourceGroup: NotRequired[str]  # AKS
    provisioningState: str


class StoppedComponent(TypedDict):
    """A process a local cluster's deletion stops: one of its own, or a job's node or coordinator."""

    component: str
    pid: int


class LocalClusterDeleted(TypedDict):
    name: str
    dryRun: bool
    stopped: list[StoppedComponent]
    removed: str  # the cluster's folder


class DeletedResource(TypedDict):
    step: str
    id: str


class KeptResource(TypedDict):
    what: str
    id: str


class AksClusterDeleted(TypedDict):
    name: str
    resourceGroup: str
    deleted: list[DeletedResource]
    kept: list[KeptResource]


ClusterDeleted = LocalClusterDeleted | AksClusterDeleted


# -- jobs -------------------------------------------------------------------------------------------------------

class JobPool(TypedDict):
    """The AKS pool a job's workers run on, what its cost is priced as."""

    name: str | None
    vmSize: str | None
    priority: str  # Spot | Regular
    location: str | None


class StoppedNode(TypedDict):
    """A process of a local job its deletion stops."""

    node: str | None  # the node's or "coordinator"; None: a worker of a node
    pid: int


class LocalJobDeleted(TypedDict):
    name: str
    cluster: str
    dryRun: bool
    stopped: list[StoppedNode]
    removed: str
    checkpoints: Literal["deleted", "kept"]
    checkpointUrl: str
    blobsDeleted: int
    bytesFreed: int


class KubeObject(TypedDict):
    apiVersion: str
    kind: str
    name: str


class JobObject(TypedDict):
    """A job's Kubernetes object (ElasticJob, or k8s-job's batch/v1 Job), named from its metadata."""

    apiVersion: str
    kind: str
    name: str | None
    namespace: str | None


class StoppedPod(TypedDict):
    pod: str | None
    rank: int
    node: str | None


class AksJobStops(TypedDict):
    """What deleting an AKS job stops (backends/aks/describe.py ``plan_delete``)."""

    name: str | None
    namespace: str | None
    object: JobObject
    engine: str
    stopped: list[StoppedPod]
    checkpoints: Literal["kept"]


class AksJobDeletionShown(AksJobStops):
    """`job delete --dry-run` on AKS: what goes, in which cluster, and what stays."""

    type: Literal["aks"]
    cluster: str
    resourceGroup: str
    dryRun: bool
    checkpointUrl: str
    coordinator: list[KubeObject]
    guards: list[KubeObject]


class AksJobDeleted(AksJobDeletionShown):
    """`job delete` on AKS: the dry run's object, done."""

    deleted: bool


JobDeleted = LocalJobDeleted | AksJobDeleted


# -- evictions --------------------------------------------------------------------------------------------------

class EvictedNode(TypedDict):
    node: str
    pid: int


class LocalNodeEviction(TypedDict):
    """One node a local eviction stopped (backends/local/evict.py); times in epoch seconds."""

    node: str
    pid: int
    noticeSeconds: float
    acknowledged: bool
    acknowledgedAfterSeconds: float | None
    evictedAt: float
    startedAt: float


class Replacement(TypedDict):
    node: str
    pid: int
    startedAt: float


class LocalEvicted(TypedDict):
    """`simulate-eviction --local` (dry run: no evictions yet)."""

    job: str
    dryRun: bool
    noticeSeconds: float
    nodes: list[EvictedNode]
    evictions: list[LocalNodeEviction]
    replaceAfterSeconds: float | None
    replacements: list[Replacement]
    recovery: NotRequired[list[dict[str, Any]]]  # --wait: core.eventlog.recovery.follow_recovery of the last
    capacityBack: NotRequired[dict[str, Any]]  # --wait --replace-after: core.eventlog.recovery.follow_world_size


class AksEvictionShown(TypedDict):
    """`simulate-eviction` on AKS: the nodes chosen ``by`` what was asked; the plan's ``targets`` (dry run) or
    the ``evictions`` done (backends/aks/evict.py, with --wait their recovery)."""

    type: Literal["aks"]
    cluster: str
    resourceGroup: str
    by: dict[str, Any]  # {"node"|"job"(+"rank")|"pool"(+"count"): the value asked}
    dryRun: NotRequired[bool]
    targets: NotRequired[list[dict[str, Any]]]  # core.aks.eviction.EvictionTarget.to_dict
    evictions: NotRequired[list[dict[str, Any]]]


Evicted = LocalEvicted | AksEvictionShown


class LocalScheduleRun(ScheduleReport):
    """`simulate-eviction --schedule --local`: which cluster and job, then core.chaos.run_schedule's report."""

    type: Literal["local"]
    cluster: str
    job: str


class AksScheduleRun(ScheduleReport):
    """`simulate-eviction --schedule` on AKS: which cluster and job, then core.chaos.run_schedule's report."""

    type: Literal["aks"]
    cluster: str | None
    resourceGroup: str | None
    job: str


ScheduleRun = LocalScheduleRun | AksScheduleRun
