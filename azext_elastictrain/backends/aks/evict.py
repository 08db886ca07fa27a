"""Spot evictions on AKS, carried out: plan from what the cluster lists, evict through ARM, follow the job.

Call order (each step is the caller's to take, so it can confirm between them):

1. ``plan(kube, ...)`` lists the nodes and the training namespace's pods and chooses the targets
   (``core.aks.eviction.plan_evictions``): nothing is asked of Azure, bad input fails here.
2. ``evict(compute, plan)`` asks ``simulateEviction`` of each target's VMSS instance, one after the other.
   A 404 means the instance is already gone (evicted or scaled in a moment ago; its node can stay listed
   for a while): that target counts as evicted, ``state`` AlreadyGone.
3. ``follow(kube, compute, evictions, read_events)`` (``--wait``): waits until each node is out of the cluster's
   service - gone (a pool with eviction policy Delete), or, with Deallocate, still listed but tainted out of
   service so its pods are deleted - then follows every job that was hit until it trains again (recovery
   seconds, steps lost) from the job's event log. Where the events cannot be read, the result says so in
   ``eventsError`` and keeps what was seen. It says every ``PROGRESS_EVERY`` seconds that it still waits.

``Compute`` is this module's one view of the compute API; the CLI gives it ``AzureArm`` (SDK clients), tests a
fake or the same against the local ARM test server. Kubernetes is a ``clients.kube.KubeClient``.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from azext_elastictrain.backends.aks.describe import follow_recovery_aks
from azext_elastictrain.backends.views import AksEvictionShown
from azext_elastictrain.core.aks.eviction import (
    OUT_OF_SERVICE_TAINT,
    SHUTDOWN_TAINT,
    EvictionPlan,
    VmssInstance,
    plan_evictions,
)
from azext_elastictrain.core.constants import TRAINING_NAMESPACE
from azext_elastictrain.core.ports import Compute, KubeClient
from azext_elastictrain.core.eventlog.view import iso_time, parse_iso

EVICTED = "Evicted"
ALREADY_GONE = "AlreadyGone"
# Azure evicts a VM within 30 minutes of simulateEviction (its docs; a real one took ~3 min), after a >= 30 s
# notice; a deallocated VM's node gets its out-of-service taint up to 10 minutes after the VM stopped (the cloud
# provider's instance cache: kubernetes-sigs/cloud-provider-azure#4521). The wait allows both.
NODE_GONE_TIMEOUT = 2400.0
PROGRESS_EVERY = 30.0  # seconds between "still waiting" lines
# A deallocated VM's node counts as evicted once it has the out-of-service taint: PodGC then deletes its pods and
# the workers' replacements can start (core.aks.eviction: the taints).
DELETED, DEALLOCATED = "Deleted", "Deallocated"
RECOVERY_TIMEOUT = 600.0  # a new Spot node may have to be allocated and the image pulled

ReadEvents = Callable[[str], list[Any]]


class EvictionFailed(Exception):
    """ARM refused an eviction; ``done`` are the evictions that went through before it."""

    def __init__(self, node: str, error: Exception, done: list[dict[str, Any]]) -> None:
        super().__init__(f"the eviction of node {node!r} failed: {error}")
        self.node, self.error, self.done = node, error, done


def plan(kube: KubeClient, *, node: str | None = None, job: str | None = None, rank: int | None = None,
         pool: str | None = None, count: int | None = None, pools: list[str] | None = None,
         namespace: str = TRAINING_NAMESPACE) -> EvictionPlan:
    """The targets, from the cluster's nodes and the training namespace's pods; raises EvictionPlanError."""
    nodes = kube.list("v1", "Node")
    pods = kube.list("v1", "Pod", namespace)
    return plan_evictions(nodes, pods, node=node, job=job, rank=rank, pool=pool, count=count, pools=pools)


def evict(compute: Compute, eviction_plan: EvictionPlan, *, clock: Callable[[], float] = time.time,
          progress: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """simulateEviction for each target, in order; one dict per target (``evictedAt``: when it was asked)."""
    from azext_elastictrain.core.errors import ArmError

    done: list[dict[str, Any]] = []
    for target in eviction_plan.targets:
        asked = clock()
        try:
            compute.simulate_eviction(target.instance)
            state = EVICTED
        except ArmError as ex:
            if ex.status != 404:
                raise EvictionFailed(target.node, ex, done) from ex
            state = ALREADY_GONE
        result = {**target.to_dict(), "state": state, "evictedAt": iso_time(asked, millis=True), "requestedAt": asked}
        progress(f"{target.node} ({target.instance.vmss} instance {target.instance.instance_id}): "
                 + ("eviction asked for" if state == EVICTED else "the instance was already gone"))
        done.append(result)
    return done


def follow(kube: KubeClient, compute: Compute, evictions: list[dict[str, Any]], read_events: ReadEvents | None, *,
           events_error: str | None = None, node_timeout: float = NODE_GONE_TIMEOUT,
           recovery_timeout: float = RECOVERY_TIMEOUT, poll: float = 2.0,
           clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
           progress: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """``--wait``: each eviction gets ``recovery``: when its node left, whether its instance is gone, and for
    the jobs it hit, the recovery their events show. ``read_events`` None: events unreadable (``events_error``
    says why); the node is still followed until it is gone."""
    for eviction in evictions:
        outcome, gone_at = wait_node_evicted(kube, eviction["node"], asked_at=eviction["requestedAt"],
                                             timeout=node_timeout, poll=poll, clock=clock, sleep=sleep,
                                             progress=progress)
        instance = VmssInstance(eviction["subscription"], eviction["resourceGroup"], eviction["vmss"],
                                eviction["instanceId"])
        eviction["recovery"] = {"nodeGoneAt": iso_time(gone_at, millis=True),
                                "nodeGoneSeconds": round(max(0.0, gone_at - eviction["requestedAt"]), 2),
                                "node": outcome, "instanceGone": compute.vmss_instance(instance) is None}
        progress(f"{eviction['node']} " + ("left the cluster" if outcome == DELETED else
                                           "was deallocated and is out of service (still listed)")
                 + f" after {eviction['recovery']['nodeGoneSeconds']:g}s")
    jobs = sorted({p["job"] for e in evictions for p in e["pods"] if p.get("job")})
    if not evictions or not jobs:
        return evictions
    if read_events is None:
        for eviction in evictions:
            if eviction["pods"]:
                eviction["recovery"]["eventsError"] = events_error or "the job's events cannot be read"
        return evictions
    gone_at = max(parse_iso(e["recovery"]["nodeGoneAt"]) or 0.0 for e in evictions)  # each recorded as it went
    asked_at = min(e["requestedAt"] for e in evictions)
    for job in jobs:
        progress(f"following job {job!r} until it trains again")
        try:
            found = follow_recovery_aks(read_events, job, gone_at, requested_at=asked_at, timeout=recovery_timeout,
                                        sleep=sleep)
            recovery = {k: found.get(k) for k in ("outageSeconds", "stepsLost", "resumedFromStep", "worldSize",
                                                  "recoverySeconds", "restoreSeconds")}
        except Exception as ex:  # pylint: disable=broad-exception-caught
            # unreadable events or no recovery in time: say which
            from azext_elastictrain.core.chaos import FollowStopped
            from azext_elastictrain.core.errors import EvictionError

            if isinstance(ex, (EvictionError, FollowStopped)):
                raise
            grant = getattr(ex, "grant", None)  # a 403 from blob: the login lacks the data role, and how to add it
            recovery = {"eventsError": f"cannot read the job's events: {ex}" + (
                f"; your login needs 'Storage Blob Data Contributor' on the container: {grant}" if grant else "")}
        for eviction in evictions:
            if any(p.get("job") == job for p in eviction["pods"]):
                eviction["recovery"].update({"job": job, **recovery})
    return evictions


def wait_node_evicted(kube: Any, node: str, *, asked_at: float, timeout: float = NODE_GONE_TIMEOUT,
                      poll: float = 2.0, clock: Callable[[], float] = time.time,
                      sleep: Callable[[float], None] = time.sleep,
                      progress: Callable[[str], None] = lambda line: None) -> tuple[str, float]:
    """Block until Node ``node`` is out of service: gone (``Deleted``: the cloud node manager removed the node
    of a deleted VM) or tainted out of service (``Deallocated``: the VM stopped, the node stays listed). Returns
    the outcome and when it was seen; says every PROGRESS_EVERY seconds that it still waits."""
    deadline, next_note, shutdown_seen = clock() + timeout, clock() + PROGRESS_EVERY, False
    while True:
        found = kube.get("v1", "Node", node)
        now = clock()
        if found is None:
            return DELETED, now
        taints = {t.get("key") for t in (found.get("spec") or {}).get("taints") or []}
        if OUT_OF_SERVICE_TAINT in taints:
            return DEALLOCATED, now
        if SHUTDOWN_TAINT in taints and not shutdown_seen:
            shutdown_seen = True
            progress(f"{node}: its VM was deallocated (taint {SHUTDOWN_TAINT}); the node stays in the cluster "
                     f"until Azure marks it out of service (up to 10 minutes), then its pods are replaced")
        if now >= deadline:
            raise TimeoutError(f"node {node!r} is still in service {timeout / 60:.0f} minutes after its eviction "
                               "was asked for (Azure evicts within 30 minutes); 'kubectl get node "
                               f"{node} -o yaml' shows its state and taints")
        if now >= next_note:
            next_note += PROGRESS_EVERY
            state = "deallocated, waiting for the out-of-service taint" if shutdown_seen else "still running"
            progress(f"{node}: {state}, {_minutes(now - asked_at)} after the eviction was asked for (Azure "
                     f"evicts within 30 minutes; waiting up to {_minutes(timeout)})")
        sleep(poll)


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(int(max(0.0, seconds)), 60)
    return f"{minutes}m{rest:02d}s"


def report(cluster: str, resource_group: str, eviction_plan: EvictionPlan, evictions: list[dict[str,
           Any]] | None) -> AksEvictionShown:
    """What the command prints: the plan (dry run) or the evictions; epoch times stay inside."""
    result: AksEvictionShown = {"type": "aks", "cluster": cluster, "resourceGroup": resource_group,
                                "by": dict(eviction_plan.by)}
    if evictions is None:
        return {**result, "dryRun": True, "targets": [t.to_dict() for t in eviction_plan.targets]}
    return {**result, "evictions": [{k: v for k, v in e.items() if k != "requestedAt"} for e in evictions]}
