"""Spot evictions on AKS, planned: which nodes go, and which VMSS instance each one is. Pure: no network.

A node names its VM in ``spec.providerID``; for a node of a VirtualMachineScaleSets pool that is
``azure:///subscriptions/<sub>/resourceGroups/<node RG>/providers/Microsoft.Compute/
virtualMachineScaleSets/<vmss>/virtualMachines/<instance id>``. ``plan_evictions`` chooses the targets from
the nodes and pods the caller listed (by node, by a job's workers or one rank of it, by pool) and refuses
anything that is not a Spot scale-set instance before a single eviction is asked for. The caller then runs
each target through ``virtual_machine_scale_set_vms.simulate_eviction(resource_group, vmss, instance_id)``
(204; the instance later disappears from the scale set, see ``instance_listed``).

A worker's *rank* here is its replica index in the ElasticJob: the operator names worker pods
``<job>-worker-<index>`` and labels them with the index. torchrun's own node rank is agreed at each
rendezvous and may differ; the replica index is the stable name a user can point at.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Iterable

from azext_elastictrain.core.spec import SpecError

SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"
AGENTPOOL_LABELS = ("kubernetes.azure.com/agentpool", "agentpool")  # the second: older AKS node images
JOB_LABELS = ("elastictrain.azure.com/job",  # ours, on every worker pod (manifests._job_labels)
              "job-name", "training.kubeflow.org/job-name")  # the operator's (kubeflow/common, old and new)
REPLICA_INDEX_LABELS = ("replica-index", "training.kubeflow.org/replica-index",
                        "batch.kubernetes.io/job-completion-index")  # an Indexed Job's pods (k8s-job)
REPLICA_TYPE_LABELS = ("replica-type", "training.kubeflow.org/replica-type")
WORKER_REPLICA_TYPE = "worker"
# What a stopped (deallocated) Spot VM's node carries while it stays listed (cloud-provider-azure, Kubernetes
# non-graceful node shutdown): the shutdown taint at once, the out-of-service taint up to 10 minutes later.
SHUTDOWN_TAINT = "node.cloudprovider.kubernetes.io/shutdown"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# Pods in these phases no longer hold their node: an eviction does not hit them.
_DONE_PHASES = ("Succeeded", "Failed")
_LISTED_AT_MOST = 12

_PROVIDER_ID = re.compile(
    r"azure://(?P<path>/subscriptions/(?P<subscription>[^/]+)/resourcegroups/(?P<resource_group>[^/]+)"
    r"/providers/microsoft\.compute/(?P<rest>.*))", re.IGNORECASE)
_VMSS_INSTANCE = re.compile(r"virtualmachinescalesets/(?P<vmss>[^/]+)/virtualmachines/(?P<instance_id>\d+)",
                            re.IGNORECASE)
_STANDALONE_VM = re.compile(r"virtualmachines/[^/]+", re.IGNORECASE)
_SEGMENT = re.compile(r"[^/\s]+")


class EvictionPlanError(SpecError):
    """Nothing can be evicted as asked; the message says what was wrong and how to ask instead."""


class EvictionTargetNotFound(EvictionPlanError):
    """The node, job, rank or pool named does not exist (the CLI answers ResourceNotFoundError)."""


class ProviderIdError(EvictionPlanError):
    """A node's providerID that is not a VMSS instance: it cannot be evicted through simulateEviction."""


@dataclass(frozen=True)
class VmssInstance:
    """One VM of a scale set, as ARM addresses it."""

    subscription: str
    resource_group: str  # the cluster's node resource group (MC_<rg>_<cluster>_<location> by default)
    vmss: str
    instance_id: str

    @property
    def resource_id(self) -> str:
        return (f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.Compute/virtualMachineScaleSets/{self.vmss}/virtualMachines/{self.instance_id}")


def parse_provider_id(provider_id: object, node: str | None = None) -> VmssInstance:
    """The VMSS instance behind an AKS node's ``spec.providerID``; ``node`` only names it in errors."""
    who = f"node {node!r}" if node else "the node"
    text = provider_id if isinstance(provider_id, str) else ""
    if not text:
        raise ProviderIdError(f"{who} has no providerID: it is not (yet) backed by an Azure VM; wait until it "
                              "is Ready or pick another node")
    scheme = text.split("://", 1)[0] if "://" in text else None
    if scheme is None:
        raise ProviderIdError(f"{who} has a providerID without a scheme ({text!r}): expected azure:///subscriptions"
                              "/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/"
                              "<vmss>/virtualMachines/<instance id>")
    if scheme.lower() != "azure":
        raise ProviderIdError(f"{who} is not an Azure VM (providerID {text!r}): only AKS nodes backed by a "
                              "Spot virtual machine scale set can be evicted")
    match = _PROVIDER_ID.fullmatch(text)
    instance = _VMSS_INSTANCE.fullmatch(match["rest"]) if match else None
    if match and instance and all(_SEGMENT.fullmatch(match[k]) for k in ("subscription", "resource_group")):
        if _SEGMENT.fullmatch(instance["vmss"]):
            return VmssInstance(match["subscription"], match["resource_group"], instance["vmss"],
                                instance["instance_id"])
    if match and _STANDALONE_VM.fullmatch(match["rest"]):
        raise ProviderIdError(f"{who} is a standalone VM (availability set or VirtualMachines pool), not a scale "
                              f"set instance (providerID {text!r}): simulateEviction works on Spot scale set "
                              "instances; use a Spot pool of type VirtualMachineScaleSets")
    raise ProviderIdError(f"{who} has a providerID az elastictrain does not understand: {text!r}; expected "
                          "azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/"
                          "virtualMachineScaleSets/<vmss>/virtualMachines/<instance id>")


def scheduled_events_name(instance: VmssInstance) -> str:
    """The name Scheduled Events gives the instance in an event's ``Resources``: ``<vmss>_<instance id>``."""
    return f"{instance.vmss}_{instance.instance_id}"


def instance_listed(vms: Iterable[Any], instance_id: str) -> bool:
    """Whether a scale set's VM list (SDK models or REST dicts) still holds ``instance_id``.

    After simulateEviction the instance is deleted (Spot eviction policy Delete): the list drops it and a
    ``get`` answers 404. Both mean the eviction is done, not that something went wrong.
    """
    for vm in vms:
        listed = vm.get("instanceId") if isinstance(vm, dict) else getattr(vm, "instance_id", None)
        if str(listed) == str(instance_id):
            return True
    return False


# -- what nodes and pods say ---------------------------------------------------------------------------------

def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    return _meta(obj).get("labels") or {}


def _first(mapping: dict[str, Any], keys: Iterable[str]) -> str | None:
    value = next((mapping[k] for k in keys if mapping.get(k) not in (None, "")), None)
    return None if value is None else str(value)


def object_name(obj: dict[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def is_spot(node: dict[str, Any]) -> bool:
    """AKS labels the nodes of a Spot pool ``kubernetes.azure.com/scalesetpriority: spot``."""
    return str(_labels(node).get(SPOT_LABEL, "")).lower() == "spot"


def node_priority(node: dict[str, Any]) -> str:
    """``Spot`` or ``Regular`` (AKS puts the label on Spot nodes only)."""
    value = str(_labels(node).get(SPOT_LABEL) or "regular")
    return value[:1].upper() + value[1:].lower()


def node_pool(node: dict[str, Any]) -> str | None:
    return _first(_labels(node), AGENTPOOL_LABELS)


def pod_job(pod: dict[str, Any]) -> str | None:
    """The ElasticJob a pod works for: our label, else the operator's."""
    return _first(_labels(pod), JOB_LABELS)


def worker_rank(pod: dict[str, Any]) -> int | None:
    """The pod's replica index among the job's workers (None: not a worker pod)."""
    labels = _labels(pod)
    replica_type = _first(labels, REPLICA_TYPE_LABELS)
    if replica_type is not None and str(replica_type).lower() != WORKER_REPLICA_TYPE:
        return None
    index = _first(labels, REPLICA_INDEX_LABELS)
    if index is not None and str(index).isdigit():
        return int(index)
    job, name = pod_job(pod), str(_meta(pod).get("name") or "")
    match = re.fullmatch(r"(?P<job>.+)-worker-(?P<index>\d+)", name)
    if match and (job is None or match["job"] == job):
        return int(match["index"])
    return None


def pod_node(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def holds_node(pod: dict[str, Any]) -> bool:
    """A pod bound to a node and not finished: evicting the node stops it."""
    return pod_node(pod) is not None and (pod.get("status") or {}).get("phase") not in _DONE_PHASES


def job_workers(pods: Iterable[dict[str, Any]], job: str) -> list[tuple[int, dict[str, Any]]]:
    """``(rank, pod)`` of the job's worker pods, by rank."""
    found = [(worker_rank(p), p) for p in pods if pod_job(p) == job]
    return sorted(((r, p) for r, p in found if r is not None), key=lambda rp: (rp[0], _meta(rp[1]).get("name")))


def _names(names: Iterable[Any]) -> str:
    names = [str(n) for n in names]
    if not names:
        return "none"
    more = f" and {len(names) - _LISTED_AT_MOST} more" if len(names) > _LISTED_AT_MOST else ""
    return ", ".join(names[:_LISTED_AT_MOST]) + more


# -- the plan ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvictionTarget:
    """A node to evict, the instance behind it, and the training it hits."""

    node: str
    pool: str | None
    instance: VmssInstance
    pods: tuple[dict[str, Any], ...]  # {"pod", "job", "rank"} of the training pods on the node

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(p["rank"] for p in self.pods if p["rank"] is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "pool": self.pool,
            "subscription": self.instance.subscription, "resourceGroup": self.instance.resource_group,
            "vmss": self.instance.vmss, "instanceId": self.instance.instance_id,
            "scheduledEventsName": scheduled_events_name(self.instance),
            "pods": [dict(p) for p in self.pods], "ranks": list(self.ranks),
        }


@dataclass(frozen=True)
class EvictionPlan:
    """The nodes to evict, chosen ``by`` {"node"|"job"(+"rank")|"pool"(+"count"): ...}."""

    by: dict[str, Any]
    targets: tuple[EvictionTarget, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"by": dict(self.by), "targets": [t.to_dict() for t in self.targets]}


def plan_evictions(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], *, node: str | None = None,
                   job: str | None = None,
                   rank: int | None = None, pool: str | None = None, count: int | None = None,
                   pools: Iterable[str] | None = None, rng: random.Random | None = None) -> EvictionPlan:
    """Which nodes to evict: ``node``; the nodes of ``job``'s workers (or of its ``rank``); or ``count``
    (default 1) Spot nodes of ``pool``, the first by name or, given ``rng``, chosen at random.

    ``nodes`` and ``pods`` are what the cluster lists (Node objects; the training namespace's pods);
    ``pools`` the cluster's agent pool names where the caller knows them (ARM), so that a pool scaled to
    zero nodes is told from one that does not exist. Raises EvictionPlanError; nothing is half-planned.
    """
    by = _check_selector(node=node, job=job, rank=rank, pool=pool, count=count)
    by_name = {object_name(n): n for n in nodes}
    if node is not None:
        chosen = [_known_node(by_name, node)]
    elif job is not None:
        chosen = _job_nodes(by_name, pods, job, rank)
    else:
        chosen = _pool_nodes(nodes, pool or "", count if count is not None else 1, pools, rng)
    for target in chosen:
        _refuse_unless_spot(target)
    return EvictionPlan(by, tuple(_target(n, pods) for n in chosen))


def check_selector(*, node: str | None = None, job: str | None = None, rank: int | None = None,
                   pool: str | None = None, count: int | None = None) -> dict[str, Any]:
    """The selector alone, checked before anything is listed or asked (``by`` of the plan it makes)."""
    return _check_selector(node=node, job=job, rank=rank, pool=pool, count=count)


def _check_selector(**given: Any) -> dict[str, Any]:
    named = [k for k in ("node", "job", "pool") if given[k] is not None]
    if len(named) != 1:
        raise EvictionPlanError("name what to evict: exactly one of --node NAME, --job JOB [--rank R] or "
                                f"--pool POOL [--count K] (got {', '.join('--' + k for k in named) or 'none'})")
    if given["rank"] is not None and given["job"] is None:
        raise EvictionPlanError("--rank picks a worker of a job: give --job JOB with it")
    if given["count"] is not None and given["pool"] is None:
        raise EvictionPlanError("--count picks nodes of a pool: give --pool POOL with it")
    for flag in ("rank", "count"):
        value = given[flag]
        least = 0 if flag == "rank" else 1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise EvictionPlanError(f"--{flag} must be a whole number of at least {least}, not {value!r}")
    return {k: v for k, v in given.items() if v is not None}


def _known_node(by_name: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    if name not in by_name:
        raise EvictionTargetNotFound(f"the cluster has no node {name!r} (its nodes: {_names(sorted(by_name))}); "
                                     "'kubectl get nodes' lists them")
    return by_name[name]


def _job_nodes(by_name: dict[str, dict[str, Any]], pods: list[dict[str, Any]], job: str,
               rank: int | None) -> list[dict[str, Any]]:
    workers = job_workers(pods, job)
    if not workers:
        jobs = sorted({j for j in map(pod_job, pods) if j})
        raise EvictionTargetNotFound(f"no job {job!r} has worker pods in the cluster (jobs with workers: "
                                     f"{_names(jobs)}); 'az elastictrain job list' shows the jobs")
    if rank is not None:
        workers = [(r, p) for r, p in workers if r == rank]
        if not workers:
            ranks = sorted({r for r, _ in job_workers(pods, job)})
            raise EvictionTargetNotFound(f"job {job!r} has no rank {rank} (its ranks: {_names(ranks)})")
    placed = [(r, p) for r, p in workers if holds_node(p)]
    if not placed:
        what = f"rank {rank} of job {job!r} is not" if rank is not None else f"no worker of job {job!r} is"
        phases = ", ".join(f"{_meta(p).get('name')}: {(p.get('status') or {}).get('phase') or 'Unknown'}"
                           for _, p in workers)
        raise EvictionPlanError(f"{what} on a node now ({phases}): nothing to evict; wait until the job's "
                                "workers are scheduled ('az elastictrain job show')")
    names = list(dict.fromkeys(pod_node(p) for _, p in placed))  # a node once, in rank order
    # A node evicted a moment ago may still be some pods' nodeName: the whole job asks for what is left.
    left = [by_name[n] for n in names if n in by_name]
    if not left or rank is not None and len(left) < len(names):
        gone = [n for n in names if n not in by_name]
        raise EvictionTargetNotFound(f"node(s) {_names(gone)} of job {job!r} are gone from the cluster (evicted "
                                     "or scaled in already): nothing to evict there")
    return left


def _pool_nodes(nodes: list[dict[str, Any]], pool: str, count: int, pools: Iterable[str] | None,
                rng: random.Random | None) -> list[dict[str, Any]]:
    in_pool = sorted((n for n in nodes if node_pool(n) == pool), key=object_name)
    known = sorted(set(pools) if pools is not None else {p for p in map(node_pool, nodes) if p})
    if not in_pool:
        if pool not in known:
            raise EvictionTargetNotFound(f"the cluster has no node pool {pool!r} (its pools: {_names(known)}); "
                                         "the GPU Spot pool is created with the cluster")
        raise EvictionPlanError(f"pool {pool!r} has no nodes now (a Spot pool autoscales to zero without work, "
                                "or its capacity was evicted): start a job first, or wait for capacity")
    spot = [n for n in in_pool if is_spot(n) and not is_stopped(n)]
    if not spot and any(map(is_stopped, in_pool)):
        raise EvictionPlanError(f"pool {pool!r} has no running Spot node: its VMs were deallocated (evicted with "
                                "eviction policy Deallocate); nothing to evict until capacity comes back")
    if not spot:
        raise EvictionPlanError(f"pool {pool!r} has no Spot nodes (its nodes are {node_priority(in_pool[0])}): "
                                "only Spot VMs can be evicted; name the GPU Spot pool")
    if count > len(spot):
        raise EvictionPlanError(f"--count {count}: pool {pool!r} has {len(spot)} Spot node(s) "
                                f"({_names(_meta(n).get('name') for n in spot)}); ask for at most {len(spot)}")
    return rng.sample(spot, count) if rng is not None else spot[:count]


def _refuse_unless_spot(node: dict[str, Any]) -> None:
    name = _meta(node).get("name")
    if not is_spot(node):
        raise EvictionPlanError(f"node {name!r} is a {node_priority(node)} (not Spot) node of pool "
                                f"{node_pool(node)!r}: only Spot VMs can be evicted, and evicting this one "
                                "would take down what the cluster itself runs on; pick a node of the Spot pool")
    if is_stopped(node):
        raise EvictionPlanError(f"node {name!r} is already evicted: its VM was deallocated (taint "
                                f"{SHUTDOWN_TAINT}) and the node stays listed until the instance is deleted; "
                                "pick a running node")
    parse_provider_id((node.get("spec") or {}).get("providerID"), name)


def is_stopped(node: dict[str, Any]) -> bool:
    """The node's VM is stopped (deallocated): it runs nothing and has nothing left to evict."""
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    return bool(taints & {SHUTDOWN_TAINT, OUT_OF_SERVICE_TAINT})


def _target(node: dict[str, Any], pods: list[dict[str, Any]]) -> EvictionTarget:
    name = object_name(node)
    hit = sorted(({"pod": _meta(p).get("name"), "job": pod_job(p), "rank": worker_rank(p)}
                  for p in pods if pod_node(p) == name and holds_node(p) and pod_job(p)),
                 key=lambda p: (p["job"], p["rank"] if p["rank"] is not None else -1, p["pod"]))
    return EvictionTarget(name, node_pool(node), parse_provider_id(node["spec"]["providerID"], name), tuple(hit))
