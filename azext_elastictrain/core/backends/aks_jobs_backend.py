"""Elastic jobs on an AKS cluster: run, list, show, logs and delete, and where the job's blobs are.

A companion of ``aks.AksBackend`` (which owns the cluster's lifecycle), so that each module has one reason to
change. It reads the cluster through the same ``Arm`` (GETs and the user credentials, kept in memory), talks
to Kubernetes through ``core.kube`` and describes jobs with ``core.aks_jobs``.

Blob storage (the job's events and checkpoints) is found the way Azure says, not by building a host name: the
storage account's ``primaryEndpoints.blob`` from ARM, plus the cluster's checkpoint container. That is right
for every cloud and DNS endpoint type, and it is also where a test points the reads at a local Azurite. The
reads are authenticated by the ``credential`` the caller gives (the CLI's login: Entra ID, never a key).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

from azext_elastictrain.core import aks_jobs
from azext_elastictrain.core import events as job_events
from azext_elastictrain.core.arm import blob_endpoint
from azext_elastictrain.core.backends.aks import Arm, ClusterNotFound, spec_from_tags
from azext_elastictrain.core.manifests import ELASTICJOB_API_VERSION, GPU_TAINT, SPOT_TAINT, WORKER_LABELS
from azext_elastictrain.core.spec import ClusterSpec, JobSpec, SpecError, is_gpu_size_name

# Any GUID: the ElasticJob does not carry the identity (its pods run as the cluster's service account),
# but the cluster spec it is rendered with must be complete.
_NO_IDENTITY = "00000000-0000-0000-0000-000000000000"
_WORKERS = ",".join(f"{key}={value}" for key, value in WORKER_LABELS.items())


class GpuPoolMissing(SpecError):
    """The cluster has no GPU Spot pool for the workers to run on."""


class JobExists(SpecError):
    """An ElasticJob of that name is already in the cluster."""


@dataclass(frozen=True)
class ClusterSite:
    """What jobs need of a cluster: its names, where its blobs are, and its GPU Spot pool (None: none)."""

    spec: ClusterSpec
    container_url: str  # <primaryEndpoints.blob><container>, no trailing slash
    gpu_pool: dict | None

    def job_url(self, job: str) -> str:
        return f"{self.container_url}/{job}"


def gpu_spot_pool(cluster: dict) -> dict | None:
    """The pool the workers need: Spot priority, and GPUs (a GPU size, or the GPU taint create puts on it)."""
    for pool in (cluster.get("properties") or {}).get("agentPoolProfiles") or []:
        spot = pool.get("scaleSetPriority") == "Spot"
        gpu = is_gpu_size_name(pool.get("vmSize")) or GPU_TAINT in (pool.get("nodeTaints") or [])
        if spot and gpu:
            return pool
    return None


class AksJobs:
    """Jobs of AKS clusters made by ``az elastictrain cluster create``."""

    def __init__(self, arm_client: Arm, *, kube_connect: Callable[[bytes], Any] | None = None,
                 credential: Any = None, progress: Callable[[str], None] | None = None) -> None:
        self.arm = arm_client
        self._kube_connect = kube_connect
        self._credential = credential
        self._progress = progress or (lambda message: None)

    # ------------------------------------------------------------------ the cluster

    def site(self, resource_group: str, cluster: str) -> ClusterSite:
        """The cluster as jobs see it; ClusterNotFound where there is none."""
        spec = ClusterSpec(name=cluster, resource_group=resource_group)
        found = self.arm.get("cluster", {"resource_group": resource_group, "name": cluster})
        if found is None:
            raise ClusterNotFound(f"no AKS cluster named {cluster!r} in resource group {resource_group!r}")
        spec = spec_from_tags(spec, found)
        account = self.arm.get("storage_account", {"resource_group": resource_group,
                                                   "name": spec.storage_account_name})
        container_url = spec.checkpoint_url(blob_endpoint(account, spec, self.arm.storage_suffix))
        return ClusterSite(spec, container_url, gpu_spot_pool(found))

    def _kube(self, spec: ClusterSpec):
        kubeconfig = self.arm.user_kubeconfig(spec.resource_group, spec.name)
        connect = self._kube_connect
        if connect is None:
            from azext_elastictrain.core.kube import connect
        return connect(kubeconfig)

    # ------------------------------------------------------------------ run

    def render(self, site: ClusterSite, job: JobSpec, image: str, *, gpus_per_node: int,
               run_id: str | None = None) -> dict:
        """The ElasticJob for ``job`` on ``site``; refuses a cluster without a GPU Spot pool."""
        from azext_elastictrain.core.manifests import InClusterSpec, render_elastic_job

        job.validate(script_in_image=True)
        if site.gpu_pool is None:
            raise GpuPoolMissing(
                f"cluster {site.spec.name!r} has no GPU Spot pool: the workers need a node pool of Spot "
                f"priority with GPUs (taints {SPOT_TAINT} and {GPU_TAINT})")
        cluster = InClusterSpec(namespace=site.spec.namespace, service_account=site.spec.service_account,
                                identity_client_id=_NO_IDENTITY, checkpoint_url=site.container_url)
        return render_elastic_job(job, cluster, image, run_id=run_id, gpus_per_node=gpus_per_node)

    def run_job(self, resource_group: str, cluster: str, job: JobSpec, image: str, *, gpus_per_node: int,
                dry_run: bool = False) -> dict:
        site = self.site(resource_group, cluster)
        # A rendezvous of its own: an earlier job of the same name may have left its state in etcd.
        obj = self.render(site, job, image, gpus_per_node=gpus_per_node,
                          run_id=f"{job.name}-{uuid.uuid4().hex[:8]}")
        if dry_run:
            return {"dryRun": True, "name": job.name, "cluster": cluster, "resourceGroup": resource_group,
                    "checkpointUrl": site.job_url(job.name), "object": obj}
        kube = self._kube(site.spec)
        if kube.get(ELASTICJOB_API_VERSION, "ElasticJob", job.name, site.spec.namespace) is not None:
            raise JobExists(f"job {job.name!r} already exists in cluster {cluster!r}: delete it first "
                            "(its checkpoints stay, so a new job of the same name resumes from them)")
        kube.apply(obj)
        self._progress(f"Created ElasticJob {site.spec.namespace}/{job.name}; the autoscaler adds GPU Spot nodes "
                       "as its workers need them (minutes)")
        return self._show(kube, site, job.name)

    # ------------------------------------------------------------------ show, list

    def event_reader(self, resource_group: str, cluster: str) -> "_EventReader":
        """Job name -> its events in the cluster's blob storage, read with the caller's login; close() it."""
        return _EventReader(self.site(resource_group, cluster).container_url, self._credential)

    def _show(self, kube, site: ClusterSite, name: str) -> dict:
        read = _EventReader(site.container_url, self._credential)
        try:
            return aks_jobs.show_job(kube, name, read, namespace=site.spec.namespace, cluster=site.spec.name)
        finally:
            read.close()

    def show_job(self, resource_group: str, cluster: str, name: str) -> dict:
        site = self.site(resource_group, cluster)
        return self._show(self._kube(site.spec), site, name)

    def list_jobs(self, resource_group: str, cluster: str) -> list[dict]:
        site = self.site(resource_group, cluster)
        read = _EventReader(site.container_url, self._credential)
        try:
            return aks_jobs.list_jobs(self._kube(site.spec), read, namespace=site.spec.namespace,
                                      cluster=site.spec.name)
        finally:
            read.close()

    # ------------------------------------------------------------------ logs

    def log_streams(self, resource_group: str, cluster: str, name: str, *, rank: int | None = None,
                    pod: str | None = None, follow: bool = False, tail: int | None = None) -> list[tuple[str, Any]]:
        """``[(label, lines)]``: one iterator of log lines per worker pod (of ``rank``, or ``pod``)."""
        site = self.site(resource_group, cluster)
        kube = self._kube(site.spec)
        namespace = site.spec.namespace
        obj = self._elastic_job(kube, name, namespace)
        plan = aks_jobs.plan_logs(obj, kube.list("v1", "Pod", namespace, _WORKERS), rank)
        if pod is not None:
            plan = [p for p in plan if p["pod"] == pod]
            if not plan:
                raise aks_jobs.JobNotFound(f"job {name!r} has no pod {pod!r}; 'az elastictrain job show' lists "
                                           "its pods")
        started = [p for p in plan if p["node"] is not None]
        if not started:
            raise SpecError(f"no worker of job {name!r} is scheduled yet: there are no logs; "
                            "'az elastictrain job show' says why")
        return [(f"{p['pod']} (rank {p['rank']})", kube.pod_logs(p["pod"], namespace, p["container"], follow, tail))
                for p in started]

    def _elastic_job(self, kube, name: str, namespace: str) -> dict:
        obj = kube.get(ELASTICJOB_API_VERSION, "ElasticJob", name, namespace)
        if obj is None:
            known = sorted((j.get("metadata") or {}).get("name") for j in
                           kube.list(ELASTICJOB_API_VERSION, "ElasticJob", namespace))
            raise aks_jobs.JobNotFound(f"no job {name!r} in namespace {namespace!r} (its jobs: "
                                       f"{', '.join(known) or 'none'})")
        return obj

    # ------------------------------------------------------------------ delete

    def delete_job(self, resource_group: str, cluster: str, name: str, *, dry_run: bool = False,
                   confirm: Callable[[dict], None] | None = None) -> dict:
        """Delete the ElasticJob (the operator's pods go with it); the job's blobs stay. ``confirm(plan)``
        runs between planning and deleting (it raises to stop)."""
        site = self.site(resource_group, cluster)
        kube = self._kube(site.spec)
        namespace = site.spec.namespace
        obj = self._elastic_job(kube, name, namespace)
        plan = aks_jobs.plan_delete(obj, kube.list("v1", "Pod", namespace, _WORKERS))
        plan.update(type="aks", cluster=cluster, resourceGroup=resource_group, dryRun=dry_run,
                    checkpointUrl=site.job_url(name))
        if dry_run:
            return plan
        if confirm is not None:
            confirm(plan)
        kube.delete(ELASTICJOB_API_VERSION, "ElasticJob", name, namespace)
        return {**plan, "deleted": True}

    # ------------------------------------------------------------------ storage

    def checkpoint_url(self, resource_group: str, cluster: str, job: str) -> str:
        """The blob URL of ``job``'s prefix in the cluster's checkpoint container."""
        return self.site(resource_group, cluster).job_url(job)


class _EventReader:
    """Job name -> its events, over one client of the cluster's blob storage (opened on first use)."""

    def __init__(self, container_url: str, credential: Any) -> None:
        self._url, self._credential = container_url, credential
        self._store = None

    def __call__(self, job: str) -> list[dict]:
        if self._store is None:
            from azext_elastictrain.core.blobstore import BlobStore, StoreError

            if self._credential is None:  # never a silent DefaultAzureCredential: the caller's login or nothing
                raise StoreError("no credential for the cluster's blob storage was given")
            self._store = BlobStore.from_url(self._url, credential=self._credential, quick_retries=True)
        return job_events.read_events(self._store, job)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
