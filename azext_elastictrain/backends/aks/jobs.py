"""Elastic jobs on an AKS cluster: plan and submit, describe, list, logs and delete.

Everything goes through one ``AksSession`` (ARM, Kubernetes and blob storage resolved once per command), so a
command that looks many times (`job wait`) asks ARM and fetches the cluster's credentials once. The cluster's
lifecycle is cluster_create.py's, cluster_show.py's and cluster_delete.py's; jobs are described by ``describe``
(pure over the objects fetched here).
"""
from __future__ import annotations

import uuid
from typing import Any, Callable

from azext_elastictrain.backends.aks import describe
from azext_elastictrain.backends.aks.plans import AksJob, AksJobDeletion
from azext_elastictrain.backends.aks.session import AksSession, ClusterSite
from azext_elastictrain.backends.base import Plan
from azext_elastictrain.backends.views import AksJobDeletionShown, JobEvent
from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.constants import GPU_TAINT
from azext_elastictrain.core.errors import JobNotFound
from azext_elastictrain.core.ports import KubeClient
from azext_elastictrain.core.aks.manifests import (
    ELASTICJOB_API_VERSION,
    SPOT_TAINT,
    WORKER_LABELS,
    coordinator_name,
    job_secret_name,
    worker_policy_name,
)
from azext_elastictrain.core.spec import (
    ENGINE_K8S_JOB,
    ENGINE_TORCHELASTIC,
    JobSpec,
    SpecError,
    check_engine_supported,
    check_script_in_image,
)
from azext_elastictrain.core.eventlog.view import AksJobShown, parse_iso

# Any GUID: the ElasticJob does not carry the identity (its pods run as the cluster's service account),
# but the cluster spec it is rendered with must be complete.
_NO_IDENTITY = "00000000-0000-0000-0000-000000000000"
_WORKERS = ",".join(f"{key}={value}" for key, value in WORKER_LABELS.items())
# What core.aks.manifests.render_coordinator makes, all named coordinator_name(job).
COORDINATOR_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("networking.k8s.io/v1", "NetworkPolicy"))
# What guards a job's workers (core.aks.manifests.render_worker_policy, render_job_secret), by name.
GUARD_KINDS = (("networking.k8s.io/v1", "NetworkPolicy", worker_policy_name), ("v1", "Secret", job_secret_name))


class GpuPoolMissing(SpecError):
    """The cluster has no GPU Spot pool for the workers to run on."""


class EngineNotInstalled(SpecError):
    """The engine asked for needs what the cluster was created without (the operator)."""

    def __init__(self, message: str, cluster_engine: str) -> None:
        super().__init__(message)
        self.cluster_engine = cluster_engine


class JobExists(SpecError):
    """An ElasticJob of that name is already in the cluster."""


class AksJobs:
    """Jobs of the AKS cluster of ``session`` (made by ``az elastictrain cluster create``)."""

    def __init__(self, session: AksSession, *, progress: Callable[[str], None] | None = None) -> None:
        self.session = session
        self._progress = progress or (lambda message: None)

    # ------------------------------------------------------------------ run: plan, then submit

    @staticmethod
    def render(site: ClusterSite, job: JobSpec, image: str, *, gpus_per_node: int,
               run_id: str | None = None, engine: str = ENGINE_TORCHELASTIC) -> list[dict[str, Any]]:
        """The objects running ``job`` on ``site`` with ``engine``, in apply order (the job itself last);
        refuses a cluster without a GPU Spot pool."""
        from azext_elastictrain.core.aks.manifests import (
            InClusterSpec,
            render_coordinator,
            render_elastic_job,
            render_job_secret,
            render_k8s_job,
            render_worker_policy,
        )

        check_script_in_image(job.script)
        if site.gpu_pool is None:
            raise GpuPoolMissing(
                f"cluster {site.spec.name!r} has no GPU Spot pool: the workers need a node pool of Spot "
                f"priority with GPUs (taints {SPOT_TAINT} and {GPU_TAINT})")
        cluster = InClusterSpec(namespace=site.spec.namespace, service_account=site.spec.service_account,
                                identity_client_id=_NO_IDENTITY, checkpoint_url=site.container_url)
        if engine == ENGINE_K8S_JOB:
            objects = render_k8s_job(job, cluster, image, run_id=run_id, gpus_per_node=gpus_per_node)
        else:
            objects = [render_elastic_job(job, cluster, image, run_id=run_id, gpus_per_node=gpus_per_node)]
        # The workers' NetworkPolicy first: no worker pod runs unguarded. In process, the state server's Secret
        # and the coordinator next: the workers read the one and ask the other for a quorum from their first step.
        guards = [render_worker_policy(job, cluster)]
        if job.mode.coordinator:
            return [*guards, render_job_secret(job, cluster), *render_coordinator(job, cluster, image), *objects]
        return [*guards, *objects]

    def plan_job(self, job: JobSpec, image: str, *, gpus_per_node: int, engine: str | None = None) -> Plan[AksJob]:
        """What `job run` would send (the dry run): the job's objects, and where its checkpoints go. Sends
        nothing. ``engine`` defaults to the cluster's (`cluster create --engine`); refuses one the cluster's
        Kubernetes cannot run, and torchelastic on a cluster created without the operator."""
        site = self.session.site()
        engine = engine or site.spec.engine
        if engine == ENGINE_TORCHELASTIC and site.spec.engine != ENGINE_TORCHELASTIC:
            raise EngineNotInstalled(
                f"cluster {site.spec.name!r} was created with --engine {site.spec.engine}: the TorchElastic "
                "operator that --engine torchelastic needs is not installed there", site.spec.engine)
        properties = self.session.managed_cluster().get("properties") or {}
        check_engine_supported(engine, properties.get("currentKubernetesVersion")
                               or properties.get("kubernetesVersion") or "")
        # A rendezvous of its own: an earlier job of the same name may have left its state in etcd.
        *others, obj = self.render(site, job, image, gpus_per_node=gpus_per_node,
                                   run_id=f"{job.name}-{uuid.uuid4().hex[:8]}", engine=engine)
        shown = {"dryRun": True, "name": job.name, "engine": engine, "recovery": job.recovery,
                 "cluster": site.spec.name, "resourceGroup": site.spec.resource_group,
                 "checkpointUrl": site.job_url(job.name), "object": obj,
                 **({"objects": [*others, obj]} if others else {})}
        return Plan(shown, AksJob((*others, obj)))

    def submit_job(self, job: AksJob) -> AksJobShown:
        """Create the planned objects (the job last); refuses a name any job of either engine has."""
        site, kube, obj = self.session.site(), self.session.kube(), job.job_object
        name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if kube.get(ELASTICJOB_API_VERSION, "ElasticJob", name, namespace) is not None or \
                kube.get("batch/v1", "Job", name, namespace) is not None:
            raise JobExists(f"job {name!r} already exists in cluster {site.spec.name!r}: delete it first "
                            "(its checkpoints stay, so a new job of the same name resumes from them)")
        applied: list[dict[str, Any]] = []
        try:
            for each in map(_with_secret_made, job.objects):
                kube.apply(each)
                applied.append(each)
        except Exception:
            # all or nothing: a coordinator left without its job would be found by no later command
            self._remove(kube, applied)
            raise
        self._progress(f"Created {obj['kind']} {namespace}/{name}; the autoscaler adds GPU Spot nodes "
                       "as its workers need them (minutes)")
        return self.describe_job(name)

    @staticmethod
    def _remove(kube: KubeClient, objects: list[dict[str, Any]]) -> None:
        """Delete what a failed submit created, newest first; what cannot be deleted stays as it is."""
        from azext_elastictrain.clients.kube import KubeError

        for each in reversed(objects):
            meta = each["metadata"]
            try:
                kube.delete(each["apiVersion"], each["kind"], meta["name"], meta.get("namespace"))
            except KubeError:
                pass

    # ------------------------------------------------------------------ show, list

    def describe_job(self, name: str) -> AksJobShown:
        site = self.session.site()
        return describe.show_job(self.session.kube(), name, self.session.events(), namespace=site.spec.namespace,
                                 cluster=site.spec.name, job_url=site.job_url)

    def job_events(self, name: str) -> list[JobEvent]:
        """The events of the job's current run (since its ElasticJob was created), from the cluster's storage."""
        created = parse_iso((self._elastic_job(name).get("metadata") or {}).get("creationTimestamp"))
        events = list(self.session.events()(name))
        return job_events.since(events, created) if created is not None else events

    def list_jobs(self) -> list[AksJobShown]:
        site = self.session.site()
        return describe.list_jobs(self.session.kube(), self.session.events(), namespace=site.spec.namespace,
                                  cluster=site.spec.name, job_url=site.job_url)

    # ------------------------------------------------------------------ logs

    def log_streams(self, name: str, *, rank: int | None = None, pod: str | None = None, follow: bool = False,
                    tail: int | None = None) -> list[tuple[str, Any]]:
        """``[(label, lines)]``: one iterator of log lines per worker pod (of ``rank``, or ``pod``)."""
        kube, namespace = self.session.kube(), self.session.site().spec.namespace
        obj = self._elastic_job(name)
        plan = describe.plan_logs(obj, kube.list("v1", "Pod", namespace, _WORKERS), rank)
        if pod is not None:
            plan = [p for p in plan if p["pod"] == pod]
            if not plan:
                raise JobNotFound(f"job {name!r} has no pod {pod!r}; 'az elastictrain job show' lists its pods")
        started = [p for p in plan if p["node"] is not None]
        if not started:
            raise SpecError(f"no worker of job {name!r} is scheduled yet: there are no logs; "
                            "'az elastictrain job show' says why")
        return [(f"{p['pod']} (rank {p['rank']})", kube.pod_logs(p["pod"], namespace, p["container"], follow, tail))
                for p in started]

    def wait_for_change(self, name: str, seconds: float) -> None:
        """Sleep up to ``seconds`` between two looks of ``job wait``, woken as soon as the job's Kubernetes object
        changes (a watch on it, with the API server's timeout): a job that fails or finishes is seen at once,
        not at the next look. Where the cluster cannot be watched, a plain sleep."""
        import time

        started = time.monotonic()
        kube, namespace = self.session.kube(), self.session.site().spec.namespace
        watch = getattr(kube, "watch", None)
        if watch is not None and seconds >= 1:
            from azext_elastictrain.clients.kube import KubeError

            try:
                obj = self._elastic_job(name)
                for kind, _ in watch(obj["apiVersion"], obj["kind"], name, namespace, timeout=seconds):
                    if kind != "ADDED":  # ADDED: the object as it is when the watch starts
                        return
            except KubeError:
                pass  # the next look asks again (and renews a token the server stopped taking)
        left = seconds - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)

    def _elastic_job(self, name: str) -> dict[str, Any]:
        """The job object (ElasticJob or k8s-job's batch/v1 Job) of ``name``."""
        return describe.find_job(self.session.kube(), name, self.session.site().spec.namespace)

    # ------------------------------------------------------------------ delete: plan, then delete

    def plan_delete(self, name: str) -> Plan[AksJobDeletion]:
        """What deleting the job stops (its pods go with the job object, a k8s-job's Service with it); its
        blobs stay."""
        site, kube = self.session.site(), self.session.kube()
        obj = self._elastic_job(name)
        stops = describe.plan_delete(obj, kube.list("v1", "Pod", site.spec.namespace, _WORKERS))
        shown: AksJobDeletionShown = {
            **stops, "type": "aks", "cluster": site.spec.name, "resourceGroup": site.spec.resource_group,
            "dryRun": True, "checkpointUrl": site.job_url(name),
            # an in-process job's coordinator, looked up by name whatever the job says: none is left behind
            "coordinator": [{"apiVersion": v, "kind": k, "name": found["metadata"]["name"]}
                            for v, k in COORDINATOR_KINDS
                            if (found := kube.get(v, k, coordinator_name(name), site.spec.namespace))],
            # the workers' NetworkPolicy and an in-process job's Secret, deleted last
            "guards": [{"apiVersion": v, "kind": k, "name": found["metadata"]["name"]}
                       for v, k, named in GUARD_KINDS
                       if (found := kube.get(v, k, named(name), site.spec.namespace))]}
        target = shown["object"]  # found by name in the namespace: its metadata names it so
        return Plan(shown, AksJobDeletion(
            target["apiVersion"], target["kind"], target["name"] or name, target["namespace"] or site.spec.namespace,
            with_service=shown.get("engine") == ENGINE_K8S_JOB,
            coordinator=tuple((c["apiVersion"], c["kind"], c["name"]) for c in shown["coordinator"]),
            guards=tuple((g["apiVersion"], g["kind"], g["name"]) for g in shown["guards"])))

    def delete(self, job: AksJobDeletion) -> None:
        kube = self.session.kube()
        kube.delete(job.api_version, job.kind, job.name, job.namespace)
        if job.with_service:  # k8s-job's headless Service has the job's name
            kube.delete("v1", "Service", job.name, job.namespace)
        for api_version, kind, name in job.coordinator:  # after the workers' job: they may ask it until they stop
            kube.delete(api_version, kind, name, job.namespace)
        for api_version, kind, name in job.guards:
            kube.delete(api_version, kind, name, job.namespace)

    # ------------------------------------------------------------------ storage

    def checkpoint_url(self, job: str) -> str:
        """The blob URL of ``job``'s prefix in the cluster's checkpoint container."""
        return self.session.site().job_url(job)


def _with_secret_made(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj``, a Secret with its placeholder replaced by a value made now (what the plan showed had none)."""
    import copy
    import secrets

    from azext_elastictrain.core.aks.manifests import SECRET_PLACEHOLDER

    if obj.get("kind") != "Secret" or SECRET_PLACEHOLDER not in (obj.get("stringData") or {}).values():
        return obj
    made = copy.deepcopy(obj)
    made["stringData"] = {k: secrets.token_urlsafe(32) if v == SECRET_PLACEHOLDER else v
                          for k, v in made["stringData"].items()}
    return made
