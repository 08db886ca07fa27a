"""az elastictrain evict simulate: Spot evictions, with a notice first as Azure gives one.

``-g RG -c CLUSTER``: real Spot evictions of AKS nodes through the VMSS simulateEviction API.
``--local``: a Scheduled Events Preempt notice, then the node's processes go, on the local cluster.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from azext_elastictrain.operations._local import local_backend, local_errors, local_names

_LOCAL_NOTICE_SECONDS = 30.0


def simulate_eviction(cmd, job: str | None = None, local: bool = False, cluster: str | None = None,
                      node: str | None = None, count: int | None = None, notice_seconds: float | None = None,
                      replace_after: float | None = None, wait: bool = False, dry_run: bool = False,
                      yes: bool = False, resource_group_name: str | None = None, rank: int | None = None,
                      pool: str | None = None) -> dict:
    """Evict nodes of a running job; with --wait follow its recovery; with --replace-after bring
    the capacity back (after the recovery, when following it) and, with --wait, follow the job
    back to its full world size."""
    from azure.cli.core.azclierror import ArgumentUsageError

    if local and resource_group_name:
        raise ArgumentUsageError("--local and -g/--resource-group name two different clusters: give one",
                                 recommendation="-g RG -c CLUSTER for AKS; --local [-c NAME] for the local cluster.")
    if resource_group_name or (cluster and not local):
        return _simulate_aks(cmd, resource_group_name, cluster, node=node, job=job, rank=rank, pool=pool,
                             count=count, notice_seconds=notice_seconds, replace_after=replace_after, wait=wait,
                             dry_run=dry_run, yes=yes)
    if not local:
        raise ArgumentUsageError(
            "say which cluster's nodes to evict",
            recommendation="Use -g RG -c CLUSTER for an AKS cluster, or --local --job JOB for the local cluster.")
    if rank is not None or pool is not None:
        raise ArgumentUsageError("--rank and --pool are for AKS clusters (-g RG -c CLUSTER)",
                                 recommendation="On the local cluster name a --node or give a --count.")
    if not job:
        from azure.cli.core.azclierror import RequiredArgumentMissingError

        raise RequiredArgumentMissingError("--local evicts nodes of a job: give --job JOB")
    return _simulate_local(cmd, job, local, cluster, node, count,
                           _LOCAL_NOTICE_SECONDS if notice_seconds is None else notice_seconds,
                           replace_after, wait, dry_run, yes)


def _simulate_local(cmd, job, local, cluster, node, count, notice_seconds, replace_after, wait, dry_run, yes):
    from azure.cli.core.azclierror import AzureResponseError
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.backends.local.evict import EvictionError

    backend = local_backend(cmd, local)
    cluster = local_names(cluster, job)
    options = dict(node=node, count=count, notice_seconds=notice_seconds, replace_after=replace_after)
    with local_errors(cluster, job):
        plan = backend.evict(cluster, job, dry_run=True, **options)
        if dry_run:
            return plan
        nodes = ", ".join(n["node"] for n in plan["nodes"])
        notice = f"after a {notice_seconds:g}s Preempt notice" if notice_seconds else "without notice"
        user_confirmation(f"Evict {nodes} of job {job!r} {notice}?", yes=yes)
        world_before = backend.show_job(cluster, job).get("worldSize")
        result = backend.evict(cluster, job, **options)
        try:
            if wait:
                result["recovery"] = [backend.follow_recovery(cluster, job, e) for e in result["evictions"]][-1:]
            if replace_after is not None:
                evicted_at = max(e["evictedAt"] for e in result["evictions"])
                time.sleep(max(0.0, evicted_at + replace_after - time.time()))
                result["replacements"] = backend.replace_nodes(cluster, job, len(result["evictions"]))
                if wait and world_before:
                    since = min(r["startedAt"] for r in result["replacements"])
                    result["capacityBack"] = backend.follow_world_size(cluster, job, world_before, since)
        except EvictionError as ex:
            raise AzureResponseError(str(ex), recommendation=f"See 'az elastictrain job logs --local "
                                                             f"--name {job}'.") from ex
        return result


# ------------------------------------------------------------------ AKS

def _simulate_aks(cmd, resource_group: str | None, cluster: str | None, *, node, job, rank, pool, count,
                  notice_seconds, replace_after, wait, dry_run, yes) -> dict:
    from azure.cli.core.azclierror import (
        ArgumentUsageError,
        InvalidArgumentValueError,
        RequiredArgumentMissingError,
    )
    from knack.log import get_logger

    from azext_elastictrain.core.eviction import check_selector
    from azext_elastictrain.core.spec import ClusterSpec, SpecError

    if not resource_group or not cluster:
        raise RequiredArgumentMissingError("an AKS cluster is named by both -g/--resource-group and -c/--cluster",
                                           recommendation="e.g. az elastictrain evict simulate -g ml-rg -c "
                                                          "spot-train --job cifar --rank 1")
    if notice_seconds is not None or replace_after is not None:
        raise ArgumentUsageError("--notice-seconds and --replace-after are for the local cluster: on AKS, Azure "
                                 "gives the Spot notice (>= 30 s) and the autoscaler brings capacity back")
    try:
        ClusterSpec(name=cluster, resource_group=resource_group).validate()
        check_selector(node=node, job=job, rank=rank, pool=pool, count=count)
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex

    from azext_elastictrain.clients.arm import AzureArm
    from azext_elastictrain.backends.aks import evict as aks_evict
    from azext_elastictrain.clients.kube import connect

    progress = get_logger(__name__).warning
    with _aks_evict_errors(resource_group, cluster):
        arm = AzureArm(cmd.cli_ctx)
        pools = _spot_cluster_pools(arm, resource_group, cluster)
        kube = connect(arm.user_kubeconfig(resource_group, cluster))
        plan = aks_evict.plan(kube, node=node, job=job, rank=rank, pool=pool, count=count, pools=pools)
        if dry_run:
            return aks_evict.report(cluster, resource_group, plan, None)
        _confirm(plan, cluster, yes)
        evictions = aks_evict.evict(arm, plan, progress=progress)
        if wait:
            read_events, why = job_events_reader(cmd, arm, resource_group, cluster)
            if read_events is None and any(e["pods"] for e in evictions):
                progress(f"--wait: {why}; following the nodes until they leave the cluster only")
            try:
                aks_evict.follow(kube, arm, evictions, read_events, events_error=why, progress=progress)
            finally:
                if read_events is not None:
                    read_events.close()
        return aks_evict.report(cluster, resource_group, plan, evictions)


def job_events_reader(cmd, arm, resource_group: str, cluster: str):
    """Where ``--wait`` reads the jobs' event logs (``<job>/events.jsonl`` in the cluster's blob storage,
    with the CLI's login): ``(read_events, None)``, or ``(None, why not)`` when storage cannot be reached."""
    from azext_elastictrain.backends.aks.jobs import AksJobs
    from azext_elastictrain.operations._aks_jobs import login_credential

    try:
        return AksJobs(arm, credential=login_credential(cmd)).event_reader(resource_group, cluster), None
    except Exception as ex:  # noqa: BLE001 - the eviction happened; say why its recovery cannot be followed
        return None, f"the job's events in the cluster's blob storage cannot be read: {ex}"


def _spot_cluster_pools(arm, resource_group: str, cluster: str) -> list[str]:
    """The cluster's agent pool names; refuses a cluster that is missing or has no Spot pool to evict from."""
    from azure.cli.core.azclierror import ResourceNotFoundError, ValidationError

    found = arm.get("cluster", {"resource_group": resource_group, "name": cluster})
    if found is None:
        raise ResourceNotFoundError(f"no AKS cluster named {cluster!r} in resource group {resource_group!r}",
                                    recommendation=f"List them with 'az elastictrain cluster list -g "
                                                   f"{resource_group}'.")
    profiles = (found.get("properties") or {}).get("agentPoolProfiles") or []
    names = [p.get("name") for p in profiles if p.get("name")]
    if not any((p.get("scaleSetPriority") or "Regular") == "Spot" for p in profiles):
        raise ValidationError(f"cluster {cluster!r} has no Spot node pool (its pools: {', '.join(names) or 'none'}):"
                              " only Spot VMs can be evicted",
                              recommendation=f"Add the GPU Spot pool: run 'az elastictrain cluster create -g "
                                             f"{resource_group} -n {cluster}' again.")
    return names


def _confirm(plan, cluster: str, yes: bool) -> None:
    from azure.cli.core.util import user_confirmation

    lines = []
    for target in plan.targets:
        hit = ", ".join(f"{p['pod']} (rank {p['rank']})" if p["rank"] is not None else p["pod"] for p in target.pods)
        lines.append(f"  {target.node}: {target.instance.vmss} instance {target.instance.instance_id}"
                     f" - {hit or 'no training pods'}")
    user_confirmation(f"Evict these Spot nodes of cluster {cluster!r} for real (the VMs are deleted)?\n"
                      + "\n".join(lines) + "\n", yes=yes)


@contextmanager
def _aks_evict_errors(resource_group: str, cluster: str) -> Iterator[None]:
    """core errors -> az errors (a target that does not exist: ResourceNotFoundError, exit 3); ARM errors as
    the cluster commands map them (operations._aks.aks_errors)."""
    from azure.cli.core.azclierror import AzureResponseError, InvalidArgumentValueError, ResourceNotFoundError

    from azext_elastictrain.core.errors import ArmError
    from azext_elastictrain.backends.aks.evict import EvictionFailed
    from azext_elastictrain.backends.local.evict import EvictionError
    from azext_elastictrain.core.eviction import EvictionTargetNotFound
    from azext_elastictrain.clients.kube import KubeError
    from azext_elastictrain.core.spec import SpecError
    from azext_elastictrain.operations._aks import aks_errors

    with aks_errors(resource_group, cluster):
        try:
            yield
        except EvictionTargetNotFound as ex:
            raise ResourceNotFoundError(str(ex)) from ex
        except SpecError as ex:
            raise InvalidArgumentValueError(str(ex)) from ex
        except EvictionFailed as ex:
            done = ", ".join(e["node"] for e in ex.done) or "none"
            error = ex.error if isinstance(ex.error, ArmError) else ArmError(0, "", str(ex.error))
            raise ArmError(error.status, error.code, f"the eviction of node {ex.node!r} failed: {error.message}. "
                                                     f"Evicted before it: {done}; nothing after it.") from ex
        except KubeError as ex:
            raise AzureResponseError(f"the cluster's Kubernetes API: {ex}") from ex
        except (TimeoutError, EvictionError) as ex:
            raise AzureResponseError(str(ex), recommendation="'az elastictrain job show' shows the job's "
                                                             "state.") from ex
