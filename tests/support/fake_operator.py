"""The TorchElastic ElasticJob controller, as strict as the real one for what our jobs rely on. It acts on a
``FakeKube``'s objects when stepped (``reconcile``), so a test decides when the cluster moves.

Sources: pytorch/elastic ``kubernetes/controllers`` (elasticjob_controller.go, job.go UpdateJobStatus, pod.go
SetClusterSpecForPod) and ``kubernetes/api/v1alpha1/constants.go``; the kubeflow/common it pins (go.mod:
v0.0.0-20200313171840-64f943084a05) ``pkg/controller.v1/common/pod.go`` ReconcilePods/createNewPod,
``service.go`` ReconcileServices/GetPortFromJob, ``job.go`` ReconcileJobs and ``pkg/util/train``
IsRetryableExitCode. Modelled:

- one pod per replica index, named ``<job>-worker-<index>`` (GenGeneralName), labelled by GenLabels
  (``group-name``, ``job-name``, ``controller-name``) plus ``replica-type``/``replica-index``, owned by the
  ElasticJob, restartPolicy Never (the replica's ``ExitCode``), the operator's rendezvous arguments prepended;
- a pod that ended Failed is deleted - and so re-created at the next step - only when the replica's
  restartPolicy is ``ExitCode`` and the exit code is retryable (130, 137, 138, 143). The exit code is read
  ONLY from the container named ``elasticjob-worker``; with any other name it stays the 0xbeef placeholder,
  which is permanent: the pod stays Failed and the job short of a worker for good;
- a headless Service per index on the port named ``elasticjob-port`` of that same container; without one,
  GetPortFromJob fails and the step ends before the job's status is written (ReconcileJobs returns the error);
- the status: replicaStatuses (active/succeeded/failed by pod phase) and the conditions UpdateJobStatus writes
  (Running; Restarting while a failed worker waits under ExitCode, Failed under another restart policy).
Not modelled: expectations, gang scheduling, TTL, cleanPodPolicy, the Master replica type.
"""
from __future__ import annotations

import copy
from typing import Any

ELASTIC_JOB = ("elastic.pytorch.org/v1alpha1", "ElasticJob")
# pytorch/elastic kubernetes/api/v1alpha1/constants.go: never our own constant, so a rename of ours shows here
DEFAULT_CONTAINER_NAME = "elasticjob-worker"
DEFAULT_CONTAINER_PORT_NAME = "elasticjob-port"
CONTROLLER_NAME = "elastic-job-controller"
GROUP_NAME = "elastic.pytorch.org"
_PLACEHOLDER_EXIT_CODE = 0xBEEF  # ReconcilePods: "magic number" until the named container's exit code is read
_NOW = "2026-01-01T00:05:00Z"


class ReconcileError(Exception):
    """A step of the controller that failed: it logs it, requeues the job, and writes no status."""


def is_retryable_exit_code(code: int) -> bool:
    """kubeflow/common pkg/util/train IsRetryableExitCode: signals of transient causes (SIGINT 130, SIGKILL 137,
    SIGTERM 143) and the user's SIGUSR1 (138) retry; 1, 2, 126-128, 139 and every other code are permanent."""
    return code in (130, 137, 138, 143)


class ElasticJobOperator:
    """Steps the ElasticJobs of ``kube`` (a FakeKube) forward: ``reconcile()`` after whatever the test changed.
    ``errors`` keeps what the last step of each job failed with (the controller logs it and requeues)."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.errors: dict[str, str] = {}

    def reconcile(self) -> None:
        for key, job in list(self.kube.objects.items()):
            if key[:2] == ELASTIC_JOB:
                try:
                    self._sync(job)
                    self.errors.pop(key[3], None)
                except ReconcileError as ex:
                    self.errors[key[3]] = str(ex)
        self.kube.jobs.schedule()

    def _sync(self, job: dict) -> None:
        spec = job["spec"]
        replica = spec["replicaSpecs"]["Worker"]
        count = int(replica.get("replicas") or 0)
        pods, seen = self._pods(job), []
        for index in range(count):
            mine = [p for p in pods if p["metadata"]["labels"].get("replica-index") == str(index)]
            if not mine:
                self.kube.seed(self._new_pod(job, replica, index))
                continue
            pod = mine[0]
            if replica.get("restartPolicy") == "ExitCode" and pod["status"].get("phase") == "Failed" \
                    and is_retryable_exit_code(_exit_code(pod)):
                self.kube.delete("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
            seen.append(pod)  # counted as it was seen, a pod deleted just now included (updateJobReplicaStatuses)
        self._services(job, replica, count)
        self._update_status(job, replica, seen)

    def _pods(self, job: dict) -> list[dict]:
        labels = {**_gen_labels(job["metadata"]["name"]), "replica-type": "worker"}
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        return [p for p in self.kube.list("v1", "Pod", job["metadata"]["namespace"], selector)]

    def _new_pod(self, job: dict, replica: dict, index: int) -> dict:
        meta = job["metadata"]
        template = copy.deepcopy(replica["template"])
        labels = {**(template.get("metadata") or {}).get("labels", {}), **_gen_labels(meta["name"]),
                  "replica-type": "worker", "replica-index": str(index)}
        pod_spec = template["spec"]
        prepended = ["--rdzv_backend=etcd", f"--rdzv_endpoint={job['spec']['rdzvEndpoint']}",
                     f"--rdzv_id={meta['name']}",
                     f"--nnodes={job['spec'].get('minReplicas')}:{job['spec'].get('maxReplicas')}"]
        for container in pod_spec["containers"]:  # SetClusterSpecForPod: every container
            container["args"] = prepended + list(container.get("args") or [])
        pod_spec["restartPolicy"] = "Never" if replica.get("restartPolicy") == "ExitCode" else \
            replica.get("restartPolicy")
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{meta['name']}-worker-{index}", "namespace": meta["namespace"],
                             "labels": labels, "ownerReferences": [_owner(job)]},
                "spec": pod_spec, "status": {"phase": "Pending"}}

    def _services(self, job: dict, replica: dict, count: int) -> None:
        port = next((p.get("containerPort") for c in replica["template"]["spec"]["containers"]
                     if c.get("name") == DEFAULT_CONTAINER_NAME for p in c.get("ports") or []
                     if p.get("name") == DEFAULT_CONTAINER_PORT_NAME), None)
        if port is None:
            raise ReconcileError("ReconcileServices error failed to find the port")
        meta = job["metadata"]
        for index in range(count):
            name = f"{meta['name']}-worker-{index}"
            if self.kube.get("v1", "Service", name, meta["namespace"]) is None:
                labels = {**_gen_labels(meta["name"]), "replica-type": "worker", "replica-index": str(index)}
                self.kube.apply({"apiVersion": "v1", "kind": "Service",
                                 "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels,
                                              "ownerReferences": [_owner(job)]},
                                 "spec": {"clusterIP": "None", "selector": labels,
                                          "ports": [{"name": DEFAULT_CONTAINER_PORT_NAME, "port": port}]}})

    def _update_status(self, job: dict, replica: dict, pods: list[dict]) -> None:
        """job.go UpdateJobStatus: with failed workers, Restarting (restartPolicy ExitCode) or Failed; then, as it
        does in both cases, Running - which under ExitCode replaces Restarting again in the same update."""
        phases = [p["status"].get("phase") for p in pods]
        worker = {key: n for key, n in (("active", phases.count("Running")), ("succeeded", phases.count("Succeeded")),
                                        ("failed", phases.count("Failed"))) if n}
        name = job["metadata"]["name"]
        status = job.setdefault("status", {})
        status.setdefault("startTime", _NOW)
        status["replicaStatuses"] = {"Worker": worker}
        conditions = status.setdefault("conditions", [])
        if worker.get("failed"):
            if replica.get("restartPolicy") == "ExitCode":
                _set_condition(conditions, "Restarting", "ElasticJobRestarting",
                               f"ElasticJob {name} is restarting because {worker['failed']} Worker replica(s) failed.")
            else:
                _set_condition(conditions, "Failed", "ElasticJobFailed",
                               f"ElasticJob {name} is failed because {worker['failed']} Worker replica(s) failed.")
        _set_condition(conditions, "Running", "ElasticJobRunning", f"ElasticJob {name} is running.")
        self._write(job)

    def _write(self, job: dict) -> None:
        """UpdateJobStatusInApiServer: a plain update (a new resourceVersion)."""
        meta = job["metadata"]
        self.kube.set_status(*ELASTIC_JOB, meta["name"], meta["namespace"], job["status"])


def _gen_labels(job_name: str) -> dict:
    """kubeflow/common JobController.GenLabels."""
    return {"group-name": GROUP_NAME, "job-name": job_name.replace("/", "-"), "controller-name": CONTROLLER_NAME}


def _owner(job: dict) -> dict:
    return {"apiVersion": ELASTIC_JOB[0], "kind": ELASTIC_JOB[1], "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _exit_code(pod: dict) -> int:
    """ReconcilePods: the exit code of the container named DefaultContainerName, else the placeholder."""
    code = _PLACEHOLDER_EXIT_CODE
    for status in pod["status"].get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == DEFAULT_CONTAINER_NAME and terminated is not None:
            code = terminated.get("exitCode")
    return code


def _set_condition(conditions: list[dict], kind: str, reason: str, message: str) -> None:
    """kubeflow/common pkg/util/status.go setCondition, in place: nothing once the job Failed or when the condition
    holds already with that reason; Running and Restarting replace each other; Failed turns Running False."""
    if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return
    current = next((c for c in conditions if c["type"] == kind), None)
    if current is not None and current["status"] == "True" and current.get("reason") == reason:
        return
    fresh = {"type": kind, "status": "True", "reason": reason, "message": message, "lastUpdateTime": _NOW,
             "lastTransitionTime": current["lastTransitionTime"] if current is not None and
             current["status"] == "True" else _NOW}
    replaced = {"Restarting": "Running", "Running": "Restarting"}.get(kind)
    kept = [c for c in conditions if c["type"] not in (kind, replaced)]
    for other in kept:
        if kind == "Failed" and other["type"] == "Running":
            other["status"] = "False"
    conditions[:] = [*kept, fresh]
