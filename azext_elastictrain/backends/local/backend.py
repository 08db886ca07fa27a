"""The local cluster behind ``backends.base.Backend``: real etcd, Azurite and torchrun processes here.

Bound to one cluster name; its only client is the state root (the az config dir's ``elastictrain/local``),
where ``LocalClusters`` records what it started.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from azext_elastictrain.backends.base import (
    CheckpointLocation,
    EvictionRequest,
    JobLogs,
    JobRequest,
    LogRequest,
    Plan,
    ScheduleRequest,
    WaitFor,
)
from azext_elastictrain.backends.local.cluster import COMPONENTS, LocalClusters
from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS
from azext_elastictrain.core.errors import NotSupported, OptionNotHere
from azext_elastictrain.core.spec import LocalClusterSpec, check_local_script
from azext_elastictrain.core.view import wait_for_job

WAIT_INTERVAL = 1.0  # a look reads local files and one blob


class LocalBackend:  # pylint: disable=too-many-public-methods  # the Backend protocol (base.py), method for method
    kind = "local"

    def __init__(self, state_root: Path, cluster: str) -> None:
        self.clusters = LocalClusters(state_root)
        self.cluster = cluster

    def close(self) -> None:
        """Nothing held open: each step opens and closes its own files and blob client."""

    # -- the cluster -------------------------------------------------------------------------------------------
    def plan_cluster(self, spec: LocalClusterSpec) -> Plan:
        return Plan({"dryRun": True, "type": "local", "name": spec.name, "start": list(COMPONENTS)})

    def create_cluster(self, spec: LocalClusterSpec, *, no_wait: bool = False) -> dict:
        del no_wait  # local processes are up (or refused) when create returns: nothing to wait for
        return self.clusters.create_cluster(spec)

    def show_cluster(self) -> dict:
        return self.clusters.show_cluster(self.cluster)

    def list_clusters(self) -> list[dict]:
        return self.clusters.list_clusters()

    def plan_cluster_delete(self, *, delete_storage: bool = False, storage_account: str | None = None) -> Plan:
        del delete_storage, storage_account  # Azure's: a local cluster's storage is its folder, always removed
        shown = self.clusters.delete_cluster(self.cluster, dry_run=True)
        pids = ", ".join(f"{p['component']} (pid {p['pid']})" for p in shown["stopped"]) or "no running processes"
        return Plan(shown, f"Delete local cluster {self.cluster!r}: stop {pids} and remove {shown['removed']} "
                           "with its checkpoints?")

    def delete_cluster(self, plan: Plan, *, no_wait: bool = False) -> dict:
        del plan, no_wait  # its processes are looked up again at delete time; stopping them is quick
        return self.clusters.delete_cluster(self.cluster)

    # -- jobs --------------------------------------------------------------------------------------------------
    def plan_job(self, request: JobRequest) -> Plan:
        if request.image or request.gpus_per_node is not None or request.engine is not None:
            raise OptionNotHere("--image, --gpus-per-node and --engine are for a job on AKS (-g RG -c CLUSTER)",
                                "A local job runs the script of this checkout: drop them.")
        spec = request.spec
        check_local_script(spec.script)
        shown = {"dryRun": True, "type": "local", "name": spec.name, "cluster": self.cluster,
                 "nodes": list(spec.node_names()), "script": str(Path(spec.script).resolve()),
                 "scriptArgs": list(spec.script_args)}
        return Plan(shown, request=spec)

    def submit_job(self, plan: Plan) -> dict:
        return self.clusters.run_job(self.cluster, plan.request)

    def describe_job(self, name: str) -> dict:
        return self.clusters.show_job(self.cluster, name)

    def list_jobs(self) -> list[dict]:
        return self.clusters.list_jobs(self.cluster)

    def job_events(self, name: str) -> list[dict]:
        return self.clusters.job_events(self.cluster, name)

    def job_pool(self) -> dict | None:
        return None  # the nodes are processes here: no VM size, no price (job show --price-as names one)

    def job_logs(self, name: str, request: LogRequest) -> JobLogs:
        if request.rank is not None or request.pod is not None:
            raise OptionNotHere("--rank and --pod pick a worker of a job on AKS; a local job's are --node",
                                "'az elastictrain job show --local' lists its nodes.")
        prefixed = request.node is None and len(self.clusters.job_nodes(self.cluster, name)) > 1
        lines = self.clusters.job_logs(self.cluster, name, node=request.node, tail=request.tail,
                                       follow=request.follow, timeout=request.timeout)
        return JobLogs(lines, prefixed)

    def wait_job(self, name: str, until: WaitFor) -> dict:
        return wait_for_job(lambda: self.describe_job(name), name, state=until.state, step=until.step,
                            world_size=until.world_size, timeout=until.timeout, interval=WAIT_INTERVAL,
                            logs_hint=f"az elastictrain job logs --local --cluster {self.cluster} --name {name} "
                                      "--tail 50")

    def plan_job_delete(self, name: str, *, delete_checkpoints: bool = False) -> Plan:
        shown = self.clusters.delete_job(self.cluster, name, dry_run=True, delete_checkpoints=delete_checkpoints)
        pids = ", ".join(f"{p['node'] or 'worker'} (pid {p['pid']})" for p in shown["stopped"]) or \
            "no running processes"
        checkpoints = (f"DELETE its {shown['blobsDeleted']} checkpoint and event blobs "
                       f"({shown['bytesFreed'] / 2**20:.1f} MiB)" if delete_checkpoints else "keep its checkpoints")
        return Plan(shown, f"Delete job {name!r} of local cluster {self.cluster!r}: stop {pids}, remove its state "
                           f"and {checkpoints}?", request={"name": name, "delete_checkpoints": delete_checkpoints})

    def delete_job(self, plan: Plan) -> dict:
        return self.clusters.delete_job(self.cluster, plan.request["name"],
                                        delete_checkpoints=plan.request["delete_checkpoints"])

    # -- evictions ---------------------------------------------------------------------------------------------
    def plan_eviction(self, request: EvictionRequest) -> Plan:
        if request.rank is not None or request.pool is not None:
            raise OptionNotHere("--rank and --pool are for AKS clusters (-g RG -c CLUSTER)",
                                "On the local cluster name a --node or give a --count.")
        if not request.job:
            raise OptionNotHere("--local evicts nodes of a job: give --job JOB")
        notice = AZURE_NOTICE_SECONDS if request.notice_seconds is None else request.notice_seconds
        options = {"node": request.node, "count": request.count, "notice_seconds": notice,
                   "replace_after": request.replace_after}
        shown = self.clusters.evict(self.cluster, request.job, dry_run=True, **options)
        nodes = ", ".join(n["node"] for n in shown["nodes"])
        how = f"after a {notice:g}s Preempt notice" if notice else "without notice"
        return Plan(shown, f"Evict {nodes} of job {request.job!r} {how}?", request=(request.job, options))

    def evict(self, plan: Plan, *, wait: bool = False) -> dict:
        job, options = plan.request
        world_before = self.describe_job(job).get("worldSize")
        result = self.clusters.evict(self.cluster, job, **options)
        if wait:
            result["recovery"] = [self.clusters.follow_recovery(self.cluster, job, e)
                                  for e in result["evictions"]][-1:]
        if options["replace_after"] is not None:
            evicted_at = max(e["evictedAt"] for e in result["evictions"])
            time.sleep(max(0.0, evicted_at + options["replace_after"] - time.time()))
            result["replacements"] = self.clusters.replace_nodes(self.cluster, job, len(result["evictions"]))
            if wait and world_before:
                since = min(r["startedAt"] for r in result["replacements"])
                result["capacityBack"] = self.clusters.follow_world_size(self.cluster, job, world_before, since)
        return result

    def plan_schedule(self, request: ScheduleRequest) -> Plan:
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
                     "runningNodes": running, **schedule.to_dict()}, prompt, request=(request.job, schedule))

    def run_schedule(self, plan: Plan, *, stop: Any = None, say: Any = None) -> dict:
        from azext_elastictrain.backends.local.chaos import LocalScheduleEvictor
        from azext_elastictrain.core.chaos import run_schedule

        job, schedule = plan.request
        result = run_schedule(schedule, LocalScheduleEvictor(self.clusters, self.cluster, job), stop=stop,
                              say=say or (lambda line: None))
        return {"type": "local", "cluster": self.cluster, "job": job, **result}

    # -- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_location(self, job: str) -> CheckpointLocation:
        url, connection_string = self.clusters.checkpoint_location(self.cluster, job)
        return CheckpointLocation(url, connection_string,
                                  f"Is local cluster {self.cluster!r} healthy? 'az elastictrain cluster show "
                                  f"--local --name {self.cluster}' tells; 'az elastictrain cluster create --local "
                                  f"--name {self.cluster}' heals it.")
