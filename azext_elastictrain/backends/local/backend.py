"""The local cluster behind ``backends.base.Backend``: real etcd, Azurite and torchrun processes here.

Bound to one cluster name; its only client is the state root (the az config dir's ``elastictrain/local``),
where ``LocalClusters`` records what it started. Built as the AKS backend is, by composition: the clusters
(cluster.py), the home of this one (home.py: its jobs' records and storage), and, each given the home, what is
done to its jobs: starting them (starting.py), following and describing them (following.py), stopping and
deleting them (stopping.py) and evicting their nodes (evict.py).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

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
from azext_elastictrain.backends.local.cluster import COMPONENTS, LocalClusters
from azext_elastictrain.backends.local.evict import NodeEvictions
from azext_elastictrain.backends.local.following import JobFollower
from azext_elastictrain.backends.local.home import ClusterHome
from azext_elastictrain.backends.local.starting import run_job
from azext_elastictrain.backends.local.stopping import JobStopper
from azext_elastictrain.backends.local.plans import LocalEviction, LocalJobDeletion, LocalSchedule
from azext_elastictrain.backends.views import (
    ClusterState,
    JobEvent,
    JobPool,
    Kubeconfig,
    LocalCluster,
    LocalClusterDeleted,
    LocalEvicted,
    LocalJobDeleted,
    LocalScheduleRun,
)
from azext_elastictrain.core import launch
from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS
from azext_elastictrain.core.errors import NotSupported, OptionNotHere
from azext_elastictrain.core.spec import JobSpec, LocalClusterSpec, check_local_script
from azext_elastictrain.core.eventlog.view import LocalJobShown, wait_for_job

WAIT_INTERVAL = 1.0  # a look reads local files and one blob
_AKS_JOB = ("--image, --gpus-per-node and --engine are for a job on AKS (-g RG -c CLUSTER)",
            "A local job runs the script of this checkout: drop them.")
_AKS_WORKER = ("--rank and --pod pick a worker of a job on AKS; a local job's are --node",
               "'az elastictrain job show --local' lists its nodes.")
_AKS_EVICTION = ("--rank and --pool are for AKS clusters (-g RG -c CLUSTER)",
                 "On the local cluster name a --node or give a --count.")
#: The options of AKS, refused here (base.refuse_options): the one place that says which, per request.
NOT_HERE: dict[str, NotHere] = {
    "job": {"image": _AKS_JOB, "gpus_per_node": _AKS_JOB, "engine": _AKS_JOB},
    "logs": {"rank": _AKS_WORKER, "pod": _AKS_WORKER},
    "eviction": {"rank": _AKS_EVICTION, "pool": _AKS_EVICTION},
}


class LocalBackend:  # pylint: disable=too-many-public-methods  # the Backend protocol (base.py), method for method
    kind = "local"

    def __init__(self, state_root: Path, cluster: str) -> None:
        self.clusters = LocalClusters(state_root)
        self.home = ClusterHome(self.clusters, cluster)
        self.follower = JobFollower(self.home)
        self.stopper = JobStopper(self.home)
        self.evictions = NodeEvictions(self.home)
        self.cluster = cluster

    def close(self) -> None:
        """Nothing held open: each step opens and closes its own files and blob client."""

    # -- the cluster -------------------------------------------------------------------------------------------
    def plan_cluster(self, spec: LocalClusterSpec) -> Plan[None]:
        return Plan({"dryRun": True, "type": "local", "name": spec.name, "start": list(COMPONENTS)}, None)

    def create_cluster(self, spec: LocalClusterSpec, *, no_wait: bool = False) -> LocalCluster:
        del no_wait  # local processes are up (or refused) when create returns: nothing to wait for
        return self.clusters.create_cluster(spec)

    def merge_kubeconfig(self, spec: LocalClusterSpec) -> Kubeconfig:
        raise NotSupported(f"local cluster {spec.name!r} runs no Kubernetes: it has no credentials to merge",
                           "Drop --merge-kubeconfig.")

    def show_cluster(self) -> LocalCluster:
        return self.clusters.show_cluster(self.cluster)

    def cluster_state(self) -> ClusterState:
        """Up, or refused, when create returns: its health is its state."""
        shown = self.show_cluster()
        return {"name": self.cluster, "provisioningState": "Succeeded" if shown["health"] == "Healthy" else "Failed"}

    def list_clusters(self) -> list[LocalCluster]:
        return self.clusters.list_clusters()

    def plan_cluster_delete(self, *, delete_storage: bool = False,
                            storage_account: str | None = None) -> Plan[None]:
        del delete_storage, storage_account  # Azure's: a local cluster's storage is its folder, always removed
        shown = self.clusters.delete_cluster(self.cluster, self.stopper, dry_run=True)
        pids = ", ".join(f"{p['component']} (pid {p['pid']})" for p in shown["stopped"]) or "no running processes"
        return Plan(shown, None, f"Delete local cluster {self.cluster!r}: stop {pids} and remove {shown['removed']} "
                                 "with its checkpoints?")

    def delete_cluster(self, plan: Plan[None], *, no_wait: bool = False) -> LocalClusterDeleted:
        del plan, no_wait  # its processes are looked up again at delete time; stopping them is quick
        return self.clusters.delete_cluster(self.cluster, self.stopper)

    # -- jobs --------------------------------------------------------------------------------------------------
    def plan_job(self, request: JobRequest) -> Plan[JobSpec]:
        refuse_options(request, NOT_HERE["job"])
        spec = request.spec
        check_local_script(spec.script)
        shown = {"dryRun": True, "type": "local", "name": spec.name, "cluster": self.cluster,
                 "nodes": list(spec.node_names()), "script": str(Path(spec.script).resolve()),
                 "scriptArgs": list(spec.script_args), "recovery": spec.recovery,
                 # what the runtime will read (core/settings.py); not --env, which may hold the script's secrets
                 "settings": spec.runtime_settings(launch.LOCAL).to_env(),
                 **({"coordinator": "a process of the job's own on a free loopback port"}
                    if spec.mode.coordinator else {})}
        return Plan(shown, spec)

    def submit_job(self, plan: Plan[JobSpec]) -> LocalJobShown:
        return run_job(self.home, plan.request)

    def describe_job(self, name: str) -> LocalJobShown:
        return self.follower.show_job(name)

    def list_jobs(self) -> list[LocalJobShown]:
        return self.follower.list_jobs()

    def job_events(self, name: str) -> list[JobEvent]:
        return self.follower.job_events(name)

    def job_pool(self) -> JobPool | None:
        return None  # the nodes are processes here: no VM size, no price (job show --price-as names one)

    def job_logs(self, name: str, request: LogRequest) -> JobLogs:
        refuse_options(request, NOT_HERE["logs"])
        prefixed = request.node is None and len(self.follower.job_nodes(name)) > 1
        lines = self.follower.job_logs(name, node=request.node, tail=request.tail, follow=request.follow,
                                       timeout=request.timeout)
        return JobLogs(lines, prefixed)

    def wait_job(self, name: str, until: WaitFor) -> LocalJobShown:
        return wait_for_job(lambda: self.describe_job(name), name, state=until.state, step=until.step,
                            world_size=until.world_size, timeout=until.timeout, interval=WAIT_INTERVAL,
                            logs_hint=f"az elastictrain job logs --local --cluster {self.cluster} --name {name} "
                                      "--tail 50")

    def plan_job_delete(self, name: str, *, delete_checkpoints: bool = False) -> Plan[LocalJobDeletion]:
        shown = self.stopper.delete_job(name, dry_run=True, delete_checkpoints=delete_checkpoints)
        pids = ", ".join(f"{p['node'] or 'worker'} (pid {p['pid']})" for p in shown["stopped"]) or \
            "no running processes"
        checkpoints = (f"DELETE its {shown['blobsDeleted']} checkpoint and event blobs "
                       f"({shown['bytesFreed'] / 2**20:.1f} MiB)" if delete_checkpoints else "keep its checkpoints")
        return Plan(shown, LocalJobDeletion(name, delete_checkpoints),
                    f"Delete job {name!r} of local cluster {self.cluster!r}: stop {pids}, remove its state and "
                    f"{checkpoints}?")

    def delete_job(self, plan: Plan[LocalJobDeletion]) -> LocalJobDeleted:
        return self.stopper.delete_job(plan.request.name, delete_checkpoints=plan.request.delete_checkpoints)

    # -- evictions ---------------------------------------------------------------------------------------------
    def plan_eviction(self, request: EvictionRequest) -> Plan[LocalEviction]:
        refuse_options(request, NOT_HERE["eviction"])
        if not request.job:
            raise OptionNotHere("--local evicts nodes of a job: give --job JOB")
        eviction = LocalEviction(request.job, request.node, request.count,
                                 AZURE_NOTICE_SECONDS if request.notice_seconds is None else request.notice_seconds,
                                 request.replace_after)
        shown = self.evictions.evict(eviction.job, dry_run=True, **_options(eviction))
        nodes = ", ".join(n["node"] for n in shown["nodes"])
        notice = eviction.notice_seconds
        how = f"after a {notice:g}s Preempt notice" if notice else "without notice"
        return Plan(shown, eviction, f"Evict {nodes} of job {eviction.job!r} {how}?")

    def evict(self, plan: Plan[LocalEviction], *, wait: bool = False) -> LocalEvicted:
        eviction = plan.request
        job = eviction.job
        world_before = self.describe_job(job).get("worldSize")
        result = self.evictions.evict(job, **_options(eviction))
        if wait:
            result["recovery"] = [self.follower.follow_recovery(job, e) for e in result["evictions"]][-1:]
        if eviction.replace_after is not None:
            evicted_at = max(e["evictedAt"] for e in result["evictions"])
            time.sleep(max(0.0, evicted_at + eviction.replace_after - time.time()))
            result["replacements"] = self.evictions.replace_nodes(job, len(result["evictions"]))
            if wait and world_before:
                since = min(r["startedAt"] for r in result["replacements"])
                result["capacityBack"] = self.follower.follow_world_size(job, world_before, since)
        return result

    def plan_schedule(self, request: ScheduleRequest) -> Plan[LocalSchedule]:
        from azext_elastictrain.core.chaos import ScheduleSpec, plan_schedule

        # bad values fail here, before the job is even looked at
        spec = ScheduleSpec.asked(request.rate, request.duration, notice_share=request.notice_share,
                                  notice_seconds=request.notice_seconds, replace_after=request.replace_after,
                                  seed=request.seed)
        schedule = plan_schedule(spec)
        shown = self.describe_job(request.job)
        running = [n["name"] for n in shown["nodes"] if n["alive"]]
        if not running:
            raise NotSupported(f"job {request.job!r} has no running node to evict (state {shown.get('state')})",
                               f"Start it again with 'az elastictrain job run --local --cluster {self.cluster} "
                               f"--name {request.job} ...' (it resumes from its checkpoints), then run the schedule.")
        noticed = sum(1 for e in schedule.evictions if e.notice_seconds)
        prompt = (f"Evict a node of job {request.job!r} every {spec.interval:g}s for {spec.duration:g}s "
                  f"({len(schedule.evictions)} evictions, {noticed} with a {spec.notice_seconds:g}s notice; "
                  f"capacity back {spec.replace_after:g}s after each)?")
        return Plan({"type": "local", "cluster": self.cluster, "job": request.job, "dryRun": True,
                     "runningNodes": running, **schedule.to_dict()}, LocalSchedule(request.job, schedule), prompt)

    def run_schedule(self, plan: Plan[LocalSchedule], *, stop: Any = None,
                     say: Callable[[str], None] | None = None) -> LocalScheduleRun:
        from azext_elastictrain.backends.local.chaos import LocalScheduleEvictor
        from azext_elastictrain.core.chaos import run_schedule

        job = plan.request.job
        result = run_schedule(plan.request.schedule,
                              LocalScheduleEvictor(self.follower, self.evictions, job), stop=stop,
                              say=say or (lambda line: None))
        return {"type": "local", "cluster": self.cluster, "job": job, **result}

    # -- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_location(self, job: str) -> CheckpointLocation:
        url, connection_string = self.home.checkpoint_location(job)
        return CheckpointLocation(url, connection_string,
                                  f"Is local cluster {self.cluster!r} healthy? 'az elastictrain cluster show "
                                  f"--local --name {self.cluster}' tells; 'az elastictrain cluster create --local "
                                  f"--name {self.cluster}' heals it.")


def _options(eviction: LocalEviction) -> dict[str, Any]:
    return {"node": eviction.node, "count": eviction.count, "notice_seconds": eviction.notice_seconds,
            "replace_after": eviction.replace_after}
