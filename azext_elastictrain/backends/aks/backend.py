"""An AKS cluster behind ``backends.base.Backend``: ARM for the cluster, Kubernetes for jobs, blob for events.

Bound to one resource group and cluster; every command reaches them through one ``AksSession`` (clients
resolved once and reused in loops). The cluster's lifecycle is ``creation`` (cluster_create.py), ``views``
(cluster_show.py) and ``deletion`` (cluster_delete.py); ``jobs`` its ElasticJobs, ``evict`` its Spot evictions.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from azext_elastictrain.backends.aks import evict as aks_evict
from azext_elastictrain.backends.aks.cluster_create import ClusterCreation
from azext_elastictrain.backends.aks.cluster_delete import ClusterDeletion
from azext_elastictrain.backends.aks.cluster_show import ClusterViews
from azext_elastictrain.backends.aks.jobs import AksJobs
from azext_elastictrain.backends.aks.plans import AksClusterDeletion, AksJob, AksJobDeletion, AksSchedule
from azext_elastictrain.backends.aks.session import AksSession, gpu_spot_pool
from azext_elastictrain.backends.base import (
    CheckpointLocation,
    EvictionRequest,
    JobLogs,
    JobRequest,
    LogRequest,
    NotHere,
    Plan,
    ScheduleRequest,
    WaitFor,
    refuse_options,
)
from azext_elastictrain.backends.logs import merged_streams
from azext_elastictrain.backends.views import (
    AksCluster,
    AksClusterCreated,
    AksClusterDeleted,
    AksEvictionShown,
    AksJobDeleted,
    ClusterState,
    JobEvent,
    JobPool,
    Kubeconfig,
    AksScheduleRun,
)
from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS
from azext_elastictrain.core.errors import NotSupported, OptionNotHere
from azext_elastictrain.core.ports import Arm
from azext_elastictrain.core.aks.eviction import EvictionPlan, check_selector
from azext_elastictrain.core.spec import ClusterSpec
from azext_elastictrain.core.eventlog.view import AksJobShown, wait_for_job

WAIT_INTERVAL = 10.0  # a look asks Kubernetes and blob storage (ARM and the credentials only once)
_EVICTION = ("--notice-seconds and --replace-after are for the local cluster: on AKS, Azure gives the Spot notice "
             "(>= 30 s) and the autoscaler brings capacity back", None)
_SCHEDULE = ("--notice-share, --notice-seconds and --replace-after are for the local cluster: on AKS every simulated "
             "eviction gets Azure's Spot notice (a Scheduled Events Preempt, >= 30 s) and the cluster autoscaler "
             "brings capacity back when Azure has some",
             "Drop them; run the schedule on the local cluster (--local) to choose notices and delays.")
#: The options of the local cluster, refused here (base.refuse_options): the one place that says which, per request.
NOT_HERE: dict[str, NotHere] = {
    "logs": {"node": ("--node names a node of a local job; on AKS pick a worker with --rank or --pod",
                      "'az elastictrain job show' lists the job's pods and ranks.")},
    "eviction": {"notice_seconds": _EVICTION, "replace_after": _EVICTION},
    "schedule": {"notice_share": _SCHEDULE, "notice_seconds": _SCHEDULE, "replace_after": _SCHEDULE},
}


# pylint: disable-next=too-many-public-methods,too-many-instance-attributes  # base.py's methods; one part per role
class AksBackend:
    kind = "aks"

    def __init__(self, arm: Arm, resource_group: str | None, cluster: str | None, *, credential: Any = None,
                 kube_connect: Callable[[bytes], Any] | None = None,
                 progress: Callable[[str], None] | None = None,
                 spot_market: Callable[[str, str], dict[str, Any]] | None = None) -> None:
        self.resource_group, self.cluster = resource_group, cluster
        self._progress = progress or (lambda message: None)
        self.session = AksSession(arm, resource_group or "", cluster or "", credential=credential,
                                  kube_connect=kube_connect)
        self.creation = ClusterCreation(arm, kube_connect=kube_connect, progress=self._progress,
                                        session=self.session, spot_market=spot_market)
        self.views = ClusterViews(arm, kube_connect=kube_connect, progress=self._progress, session=self.session)
        self.deletion = ClusterDeletion(arm, kube_connect=kube_connect, progress=self._progress,
                                        session=self.session)
        self.jobs = AksJobs(self.session, progress=self._progress)

    @property
    def _name(self) -> str:
        return self.cluster or ""

    @property
    def _group(self) -> str:
        return self.resource_group or ""

    def close(self) -> None:
        self.session.close()

    def _spec(self, **fields: Any) -> ClusterSpec:
        return ClusterSpec(name=self.cluster or "", resource_group=self.resource_group or "", **fields)

    # -- the cluster -------------------------------------------------------------------------------------------
    def plan_cluster(self, spec: ClusterSpec) -> Plan[None]:
        return Plan(self.creation.plan(spec), None)

    def create_cluster(self, spec: ClusterSpec, *, no_wait: bool = False) -> AksClusterCreated:
        return self.creation.create(spec, no_wait=no_wait)

    def merge_kubeconfig(self, spec: ClusterSpec) -> Kubeconfig:
        return self.creation.merge_kubeconfig(spec)

    def show_cluster(self) -> AksCluster:
        return self.views.show(self._spec())

    def cluster_state(self) -> ClusterState:
        return self.views.state(self._spec())

    def list_clusters(self) -> list[AksCluster]:
        return self.views.list(self.resource_group)

    def plan_cluster_delete(self, *, delete_storage: bool = False,
                            storage_account: str | None = None) -> Plan[AksClusterDeletion]:
        plan = self.deletion.delete_plan(self._spec(storage_account=storage_account or ""),
                                         delete_storage=delete_storage)
        shown = {"dryRun": True, **{k: v for k, v in plan.items() if k != "delete"},
                 "delete": [{"step": d["step"], "id": d["id"]} for d in plan["delete"]]}
        what = ", ".join(d["step"] for d in plan["delete"]) or "nothing"
        keep = " Kept: the storage account and its checkpoints." if plan["keep"] else ""
        warn = " THIS DELETES EVERY CHECKPOINT." if delete_storage else ""
        prompt = f"Delete {what} of cluster {self.cluster!r} in resource group {self.resource_group!r}?{keep}{warn}"
        return Plan(shown, AksClusterDeletion(plan), prompt)

    def delete_cluster(self, plan: Plan[AksClusterDeletion], *, no_wait: bool = False) -> AksClusterDeleted:
        return self.deletion.delete(plan.request.steps, no_wait=no_wait)

    # -- jobs --------------------------------------------------------------------------------------------------
    def plan_job(self, request: JobRequest) -> Plan[AksJob]:
        if not request.image:
            raise OptionNotHere("a job on AKS needs --image: the container image with torch and the training script",
                                "Pass a pinned image, e.g. --image myregistry.azurecr.io/train:1.0 "
                                "(see scripts/Dockerfile).")
        gpus = 1 if request.gpus_per_node is None else request.gpus_per_node
        return self.jobs.plan_job(request.spec, request.image, gpus_per_node=gpus, engine=request.engine)

    def submit_job(self, plan: Plan[AksJob]) -> AksJobShown:
        return self.jobs.submit_job(plan.request)

    def describe_job(self, name: str) -> AksJobShown:
        return self.jobs.describe_job(name)

    def list_jobs(self) -> list[AksJobShown]:
        return self.jobs.list_jobs()

    def job_events(self, name: str) -> list[JobEvent]:
        return self.jobs.job_events(name)

    def job_pool(self) -> JobPool | None:
        """The GPU Spot pool the workers are scheduled on (the cluster asked once per command)."""
        found = self.session.managed_cluster()
        pool = gpu_spot_pool(found)
        if pool is None:
            return None
        return {"name": pool.get("name"), "vmSize": pool.get("vmSize"),
                "priority": pool.get("scaleSetPriority") or "Regular", "location": found.get("location")}

    def job_logs(self, name: str, request: LogRequest) -> JobLogs:
        refuse_options(request, NOT_HERE["logs"])
        if request.rank is not None and request.pod is not None:
            raise OptionNotHere("pass --rank or --pod, not both")
        streams = self.jobs.log_streams(name, rank=request.rank, pod=request.pod, follow=request.follow,
                                        tail=request.tail)
        return JobLogs(merged_streams(streams, request.follow, request.timeout), len(streams) > 1)

    def wait_job(self, name: str, until: WaitFor) -> AksJobShown:
        return wait_for_job(lambda: self.describe_job(name), name, state=until.state, step=until.step,
                            world_size=until.world_size, timeout=until.timeout, interval=WAIT_INTERVAL,
                            sleep=lambda seconds: self.jobs.wait_for_change(name, seconds),
                            logs_hint=f"az elastictrain job logs -g {self.resource_group} -c {self.cluster} "
                                      f"--name {name} --tail 50")

    def plan_job_delete(self, name: str, *, delete_checkpoints: bool = False) -> Plan[AksJobDeletion]:
        if delete_checkpoints:
            raise OptionNotHere(
                "--delete-checkpoints is for local jobs: on AKS the checkpoints stay in the cluster's storage",
                f"Prune them with 'az elastictrain checkpoint prune -g {self.resource_group} -c {self.cluster} "
                f"--job {name}'.")
        plan = self.jobs.plan_delete(name)
        pods = ", ".join(p["pod"] for p in plan.shown["stopped"]) or "no pods"
        coordinator = ", ".join(f"{c['kind']} {c['name']}" for c in plan.shown.get("coordinator") or [])
        return Plan(plan.shown, plan.request, f"Delete job {name!r} of AKS cluster {self.cluster!r}: the ElasticJob "
                                              f"and its pods ({pods})"
                                              f"{'; its coordinator (' + coordinator + ')' if coordinator else ''}; "
                                              "its checkpoints stay?")

    def delete_job(self, plan: Plan[AksJobDeletion]) -> AksJobDeleted:
        self.jobs.delete(plan.request)
        shown = plan.shown  # the dry run's (AksJobs.plan_delete), as it was confirmed
        return {"name": shown["name"], "namespace": shown["namespace"], "object": shown["object"],
                "engine": shown["engine"], "stopped": shown["stopped"], "checkpoints": shown["checkpoints"],
                "type": "aks", "cluster": shown["cluster"], "resourceGroup": shown["resourceGroup"], "dryRun": False,
                "checkpointUrl": shown["checkpointUrl"], "coordinator": shown["coordinator"],
                "guards": shown["guards"], "deleted": True}

    # -- evictions ---------------------------------------------------------------------------------------------
    def plan_eviction(self, request: EvictionRequest) -> Plan[EvictionPlan]:
        refuse_options(request, NOT_HERE["eviction"])
        self._spec()  # a bad cluster or group name fails here, before any request
        check_selector(node=request.node, job=request.job, rank=request.rank, pool=request.pool, count=request.count)
        pools = self._spot_pools()  # a missing cluster, or one without Spot, is refused before Kubernetes
        plan = aks_evict.plan(self.session.kube(), node=request.node, job=request.job, rank=request.rank,
                              pool=request.pool, count=request.count, pools=pools)
        return Plan(aks_evict.report(self._name, self._group, plan, None), plan, _evict_prompt(plan, self.cluster))

    def _spot_pools(self) -> list[str]:
        """The cluster's agent pool names; refuses a cluster that has no Spot pool to evict from."""
        profiles = (self.session.managed_cluster().get("properties") or {}).get("agentPoolProfiles") or []
        names = [p.get("name") for p in profiles if p.get("name")]
        if not any((p.get("scaleSetPriority") or "Regular") == "Spot" for p in profiles):
            raise NotSupported(f"cluster {self.cluster!r} has no Spot node pool (its pools: "
                               f"{', '.join(names) or 'none'}): only Spot VMs can be evicted",
                               f"Add the GPU Spot pool: run 'az elastictrain cluster create -g {self.resource_group} "
                               f"-n {self.cluster}' again.")
        return names

    def evict(self, plan: Plan[EvictionPlan], *, wait: bool = False) -> AksEvictionShown:
        arm = self.session.arm
        evictions = aks_evict.evict(arm, plan.request, progress=self._progress)
        if wait:
            try:
                read_events, why = self.session.events(), None
            except Exception as ex:  # pylint: disable=broad-exception-caught
                # the eviction happened; say why its recovery cannot be followed
                read_events, why = None, f"the job's events in the cluster's blob storage cannot be read: {ex}"
            if read_events is None and any(e["pods"] for e in evictions):
                self._progress(f"--wait: {why}; following the nodes until they leave the cluster only")
            aks_evict.follow(self.session.kube(), arm, evictions, read_events, events_error=why,
                             progress=self._progress)
        return aks_evict.report(self._name, self._group, plan.request, evictions)

    def plan_schedule(self, request: ScheduleRequest) -> Plan[AksSchedule]:
        """simulateEviction gives every eviction Azure's own notice and the autoscaler brings capacity back:
        a share without notice, a notice's length or a replacement delay cannot be asked of Azure."""
        from azext_elastictrain.backends.aks.describe import find_job, min_nodes
        from azext_elastictrain.core.chaos import ScheduleSpec, plan_schedule
        from azext_elastictrain.core.constants import TRAINING_NAMESPACE

        # a share of 1 is what Azure does: every eviction with its notice
        refuse_options(replace(request, notice_share=None) if request.notice_share == 1 else request,
                       NOT_HERE["schedule"])
        spec = ScheduleSpec(rate=request.rate, duration=request.duration, notice_share=1.0,
                            notice_seconds=AZURE_NOTICE_SECONDS, replace_after=None, seed=request.seed)
        schedule = plan_schedule(spec)  # bad values fail here, before Azure or Kubernetes is asked
        self._spec()  # a bad cluster or group name fails here, before any request
        pools = self._spot_pools()
        least = min_nodes(find_job(self.session.kube(), request.job, TRAINING_NAMESPACE))
        shown = {"type": "aks", "cluster": self.cluster, "resourceGroup": self.resource_group, "job": request.job,
                 "dryRun": True, "minNodes": least, **schedule.to_dict()}
        prompt = (f"Evict a Spot node of job {request.job!r} on cluster {self.cluster!r} for real (the VM is "
                  f"deleted) every {spec.interval:g}s for {spec.duration:g}s: {len(schedule.evictions)} evictions?")
        return Plan(shown, AksSchedule(request.job, schedule, least, tuple(pools)), prompt)

    def run_schedule(self, plan: Plan[AksSchedule], *, stop: Any = None,
                     say: Callable[[str], None] | None = None) -> AksScheduleRun:
        from azext_elastictrain.backends.aks.chaos import AksScheduleEvictor
        from azext_elastictrain.core.chaos import run_schedule

        job, schedule = plan.request.job, plan.request.schedule
        evictor = AksScheduleEvictor(self.session, job, plan.request.min_nodes, list(plan.request.pools),
                                     events=lambda: self.jobs.job_events(job), progress=self._progress)
        result = run_schedule(schedule, evictor, stop=stop, say=say or (lambda line: None))
        return {"type": "aks", "cluster": self.cluster, "resourceGroup": self.resource_group, "job": job, **result}

    # -- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_location(self, job: str) -> CheckpointLocation:
        return CheckpointLocation(self.jobs.checkpoint_url(job), None,
                                  f"Is the storage account of cluster {self.cluster!r} reachable from here? 'az "
                                  f"elastictrain cluster show -g {self.resource_group} -n {self.cluster}' shows it; "
                                  "its network rules may admit only the cluster.", self.session.grant_command)


def _evict_prompt(plan: EvictionPlan, cluster: str | None) -> str:
    lines = []
    for target in plan.targets:
        hit = ", ".join(f"{p['pod']} (rank {p['rank']})" if p["rank"] is not None else p["pod"] for p in target.pods)
        lines.append(f"  {target.node}: {target.instance.vmss} instance {target.instance.instance_id}"
                     f" - {hit or 'no training pods'}")
    return (f"Evict these Spot nodes of cluster {cluster!r} for real (the VMs are deleted)?\n"
            + "\n".join(lines) + "\n")
