"""Nodes, pods and ElasticJobs shaped like an AKS cluster running the TorchElastic operator has them.

Nodes: AKS node names (``<vmss>`` + 6 base-36 digits of the instance id), the agentpool and Spot labels
and taint AKS puts on them, providerIDs in the shape the Azure cloud provider writes. Worker pods: what the
operator (kubeflow/common) makes of our ElasticJob template: named ``<job>-worker-<index>``, labelled
``job-name``/``replica-type``/``replica-index`` on top of the template's labels, owned by the ElasticJob.
ElasticJob status: kubeflow/common JobStatus (conditions, replicaStatuses by replica type, times).
"""
from __future__ import annotations

import copy

from azext_elastictrain.core.aks.manifests import WORKER_CONTAINER

SUBSCRIPTION = "8f3a2c1e-4b5d-4e6f-9a7b-0c1d2e3f4a5b"
NODE_RG = "MC_ml-rg_trainer_eastus"
GPU_VMSS = "aks-gpu-31415926-vmss"
SYSTEM_VMSS = "aks-system-27182818-vmss"
CREATED = "2026-01-01T10:00:00Z"
CREATED_EPOCH = 1767261600.0  # CREATED as seconds since the epoch


def provider_id(vmss: str, instance: int, rg: str = NODE_RG) -> str:
    return (f"azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/{rg}/providers/Microsoft.Compute/"
            f"virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, rest = divmod(number, 36)
        out = digits[rest] + out
        if not number:
            return out.rjust(6, "0")


def node(instance: int, *, pool: str = "gpu", spot: bool = True, ready: bool = True,
         vmss: str | None = None, provider: str | None = None) -> dict:
    vmss = vmss or (GPU_VMSS if pool == "gpu" else SYSTEM_VMSS)
    name = f"{vmss}{_base36(instance)}"
    labels = {"agentpool": pool, "kubernetes.azure.com/agentpool": pool, "kubernetes.io/hostname": name,
              "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type":
                  "Standard_NC4as_T4_v3" if pool == "gpu" else "Standard_D4s_v5"}
    taints = []
    if spot:
        labels["kubernetes.azure.com/scalesetpriority"] = "spot"
        taints.append({"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"})
    if pool == "gpu":
        taints.append({"key": "sku", "value": "gpu", "effect": "NoSchedule"})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": provider if provider is not None else provider_id(vmss, instance),
                 "taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                   "reason": "KubeletReady" if ready else "NodeStatusUnknown"}]},
    }


def name_of(obj: dict) -> str:
    return obj["metadata"]["name"]


def worker_pod(job: str, index: int, node_name: str | None, *, phase: str = "Running", restarts: int = 0,
               ready: bool = True, waiting: str | None = None) -> dict:
    labels = {"app.kubernetes.io/part-of": "elastictrain", "app.kubernetes.io/component": "training-worker",
              "elastictrain.azure.com/job": job, "azure.workload.identity/use": "true",
              # kubeflow/common GenLabels + SetReplicaType/SetReplicaIndex
              "group-name": "elastic.pytorch.org", "job-name": job, "controller-name": "elastic-job-controller",
              "replica-type": "worker", "replica-index": str(index)}
    running = {"running": {"startedAt": CREATED}} if phase == "Running" else {}
    state = {"waiting": {"reason": waiting}} if waiting else running
    status = {"phase": phase}
    if phase != "Pending" or waiting:
        status["containerStatuses"] = [{"name": WORKER_CONTAINER, "ready": ready and phase == "Running",
                                        "restartCount": restarts, "state": state}]
        status["startTime"] = CREATED
    if phase == "Pending" and node_name is None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]
    spec = {"containers": [{"name": WORKER_CONTAINER, "image": "myregistry.azurecr.io/elastictrain:0.1.0"}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job}-worker-{index}", "namespace": "elastictrain", "labels": labels,
                     "ownerReferences": [{"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
                                          "name": job, "controller": True, "blockOwnerDeletion": True,
                                          "uid": "5b1c2d3e-0000-4000-8000-000000000001"}]},
        "spec": spec,
        "status": status,
    }


def running(job: str, message: str | None = None) -> list[dict]:
    return [
        {"type": "Created", "status": "True", "reason": "ElasticJobCreated",
         "message": f"ElasticJob {job} is created.", "lastUpdateTime": CREATED, "lastTransitionTime": CREATED},
        {"type": "Running", "status": "True", "reason": "ElasticJobRunning",
         "message": message or f"ElasticJob {job} is running.",
         "lastUpdateTime": "2026-01-01T10:01:00Z", "lastTransitionTime": "2026-01-01T10:01:00Z"},
    ]


def restarting(job: str, failed: int = 1) -> list[dict]:
    conditions = running(job)
    conditions[1]["status"] = "False"  # kubeflow/common flips Running off when Restarting comes on
    return conditions + [{"type": "Restarting", "status": "True", "reason": "ElasticJobRestarting",
                          "message": f"ElasticJob {job} is restarting because {failed} Worker replica(s) failed.",
                          "lastUpdateTime": "2026-01-01T10:05:00Z", "lastTransitionTime": "2026-01-01T10:05:00Z"}]


def with_status(elastic_job: dict, conditions: list[dict] | None, active: int = 0, failed: int = 0) -> dict:
    """The ElasticJob as the operator left it: JobStatus written by a plain update."""
    job = copy.deepcopy(elastic_job)
    job["metadata"].setdefault("creationTimestamp", CREATED)
    if conditions is not None:
        worker = {"active": active} if active else {}
        if failed:
            worker["failed"] = failed
        job["status"] = {"conditions": conditions, "replicaStatuses": {"Worker": worker},
                         "startTime": CREATED, "lastReconcileTime": "2026-01-01T10:06:00Z"}
    return job
