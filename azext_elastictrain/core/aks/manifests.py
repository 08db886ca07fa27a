"""The Kubernetes objects az elastictrain puts in a cluster, rendered for one cluster. Pure: no network.

The objects come from ``azext_elastictrain/manifests/`` (a kustomize base shipped with the extension; the
repository's ``manifests/`` applies the same files by hand). Rendering fills in what differs per cluster —
namespace, the workload identity's client id, the checkpoint URL, the GPU pool's taint — field by field, never
by text substitution, and orders the objects so that whatever others depend on (CRD, namespace) goes first.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

from azext_elastictrain.core import launch
from azext_elastictrain.core.constants import GPU_TAINT, TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT
from azext_elastictrain.core.spec import (
    ENGINE_K8S_JOB,
    ENGINE_TORCHELASTIC,
    ENGINES,
    JobSpec,
    SpecError,
    job_env,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

CHECKPOINT_CONFIGMAP = "elastictrain-checkpoints"
CHECKPOINT_URL_KEY = "checkpoint-url"
ETCD_NAME = "elastictrain-etcd"  # the StatefulSet and its Service
ETCD_CLIENT_PORT = 2379
OPERATOR_DEPLOYMENT = "elastictrain-elastic-job-controller"
DEVICE_PLUGIN_DAEMONSET = "elastictrain-nvidia-device-plugin"
ELASTICJOB_CRD = "elasticjobs.elastic.pytorch.org"
ELASTICJOB_API_VERSION = "elastic.pytorch.org/v1alpha1"
SPOT_TAINT = "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"
CLIENT_ID_ANNOTATION = "azure.workload.identity/client-id"
TENANT_ID_ANNOTATION = "azure.workload.identity/tenant-id"
# Labels a pod needs to reach etcd (the NetworkPolicy admits only these).
WORKER_LABELS = {"app.kubernetes.io/part-of": "elastictrain", "app.kubernetes.io/component": "training-worker"}

_PACKAGE_DIR = "manifests"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_STORAGE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_CONTAINER = re.compile(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]")
_TAINT = re.compile(r"(?P<key>([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
                    r"(=(?P<value>[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?)?"
                    r":(?P<effect>NoSchedule|PreferNoSchedule|NoExecute)")
# Apply order: what other objects need (the CRD's API, the namespace) first; then who runs as whom.
_APPLY_RANK = {"CustomResourceDefinition": 0, "Namespace": 1, "ServiceAccount": 2, "ConfigMap": 3,
               "ClusterRole": 4, "ClusterRoleBinding": 5, "Role": 4, "RoleBinding": 5}
_WORKLOAD_RANK = 6


@dataclass(frozen=True, kw_only=True)
class InClusterSpec:
    """What differs between clusters in the objects az elastictrain installs."""

    namespace: str = TRAINING_NAMESPACE
    service_account: str = TRAINING_SERVICE_ACCOUNT
    identity_client_id: str  # the user-assigned identity's clientId
    tenant_id: str | None = None
    checkpoint_url: str  # https://<account>.blob.core.windows.net/<container>
    gpu_taint: str = GPU_TAINT
    engine: str = ENGINE_TORCHELASTIC  # k8s-job: no operator (CRD, RBAC, controller) is installed

    def __post_init__(self) -> None:
        if not _DNS_LABEL.fullmatch(self.namespace or ""):
            raise SpecError(f"invalid namespace {self.namespace!r}: use 1-63 lowercase letters, digits and '-', "
                            "starting and ending with a letter or digit")
        if not _DNS_SUBDOMAIN.fullmatch(self.service_account or ""):
            raise SpecError(f"invalid service account name {self.service_account!r}: use lowercase letters, "
                            "digits, '-' and '.', starting and ending with a letter or digit")
        for what, value in (("identity client id", self.identity_client_id), ("tenant id", self.tenant_id)):
            if (value is not None or what == "identity client id") and not _GUID.fullmatch(value or ""):
                raise SpecError(f"invalid {what} {value!r}: expected a GUID like "
                                "00000000-0000-0000-0000-000000000000")
        validate_checkpoint_url(self.checkpoint_url)
        parse_taint(self.gpu_taint)
        if self.engine not in ENGINES:
            raise SpecError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")


def validate_checkpoint_url(url: str) -> str:
    """A blob container URL, nothing more: a query (SAS) or user info would put a secret in the cluster."""
    hint = "expected https://<account>.blob.core.windows.net/<container>, without a SAS or trailing path"
    try:
        parts = urlsplit(url or "")
    except ValueError as ex:
        raise SpecError(f"invalid checkpoint URL: {hint}") from ex
    account, container, is_blob_host = _account_and_container(parts)
    if parts.query or parts.fragment or parts.username or parts.password:
        # The URL itself is not echoed: a query string may be a SAS token.
        raise SpecError(f"the checkpoint URL must not carry a query, fragment or credentials: {hint}")
    host_ok = is_blob_host and (parts.port is None or _is_ip(parts.hostname))
    names_ok = bool(_STORAGE_ACCOUNT.fullmatch(account) and _CONTAINER.fullmatch(container))
    if parts.scheme != "https" or not host_ok or not names_ok:
        raise SpecError(f"invalid checkpoint URL {url!r}: {hint}")
    return url


def _account_and_container(parts: SplitResult) -> tuple[str, str, bool]:
    """(account, container, whether the host is a blob endpoint) of a container URL as ARM's
    ``primaryEndpoints.blob`` makes it: <account>.blob.<cloud suffix> or <account>.zNN.blob.storage.azure.net
    name the account in the host; an IP endpoint (Azurite) names it in the path."""
    host = parts.hostname or ""
    path = parts.path[1:] if parts.path.startswith("/") else ""
    if _is_ip(host):
        account, _, container = path.partition("/")
        return account, container, True
    account, _, rest = host.partition(".")
    return account, path, ".blob." in f".{rest}"


def _is_ip(host: str | None) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True


def parse_taint(taint: str) -> dict[str, Any]:
    """``key=value:Effect`` (as ``az aks nodepool add --node-taints`` takes it) -> a toleration for it."""
    match = _TAINT.fullmatch(taint or "")
    if not match:
        raise SpecError(f"invalid taint {taint!r}: expected key=value:Effect with Effect one of NoSchedule, "
                        "PreferNoSchedule, NoExecute (e.g. sku=gpu:NoSchedule)")
    toleration = {"key": match["key"], "operator": "Exists", "effect": match["effect"]}
    if match["value"] is not None:
        toleration.update(operator="Equal", value=match["value"])
    return toleration


#: The files of the kustomize base only the torchelastic engine needs: the operator and its ElasticJob CRD.
OPERATOR_FILES = ("operator-crd.yaml", "operator-rbac.yaml", "operator-deployment.yaml")


def load_base_objects(engine: str = ENGINE_TORCHELASTIC) -> list[dict[str, Any]]:
    """The objects of the shipped kustomize base that ``engine`` needs, in its ``resources`` order."""
    import yaml  # PyYAML: azure-cli ships it (knack needs it)

    base = _base_dir()
    kustomization = yaml.safe_load(base.joinpath("kustomization.yaml").read_text(encoding="utf-8"))
    objects = []
    for name in kustomization["resources"]:
        if engine != ENGINE_TORCHELASTIC and name in OPERATOR_FILES:
            continue
        text = base.joinpath(name).read_text(encoding="utf-8")
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def _base_dir() -> Traversable:
    from importlib.resources import files

    return files("azext_elastictrain").joinpath(_PACKAGE_DIR)


def render_cluster_objects(spec: InClusterSpec) -> list[dict[str, Any]]:
    """Every object to apply for ``spec``, in apply order: CRD and namespace first."""
    objects = [_place(copy.deepcopy(obj), spec) for obj in load_base_objects(spec.engine)]
    return sorted(objects, key=lambda obj: _APPLY_RANK.get(obj["kind"], _WORKLOAD_RANK))  # stable


def _place(obj: dict[str, Any], spec: InClusterSpec) -> dict[str, Any]:
    meta = obj["metadata"]
    if obj["kind"] == "Namespace":
        meta["name"] = spec.namespace
    if "namespace" in meta:
        meta["namespace"] = spec.namespace
    for subject in obj.get("subjects", ()):
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = spec.namespace
    if obj["kind"] == "ServiceAccount" and meta["name"] == TRAINING_SERVICE_ACCOUNT:
        _place_training_account(meta, spec)
    elif obj["kind"] == "ConfigMap" and meta["name"] == CHECKPOINT_CONFIGMAP:
        obj["data"][CHECKPOINT_URL_KEY] = spec.checkpoint_url
    elif obj["kind"] == "DaemonSet" and meta["name"] == DEVICE_PLUGIN_DAEMONSET:
        _tolerate_gpu_taint(obj["spec"]["template"]["spec"], spec.gpu_taint)
    return obj


def _place_training_account(meta: dict[str, Any], spec: InClusterSpec) -> None:
    meta["name"] = spec.service_account
    annotations = meta.setdefault("annotations", {})
    annotations[CLIENT_ID_ANNOTATION] = spec.identity_client_id
    if spec.tenant_id:
        annotations[TENANT_ID_ANNOTATION] = spec.tenant_id


def _tolerate_gpu_taint(pod_spec: dict[str, Any], gpu_taint: str) -> None:
    base = parse_taint(GPU_TAINT)
    tolerations = [t for t in pod_spec.get("tolerations", []) if t != base]
    pod_spec["tolerations"] = tolerations + [parse_taint(gpu_taint)]


def object_key(obj: dict[str, Any]) -> str:
    """``Kind namespace/name`` (or ``Kind name``): how objects are named in progress and errors."""
    meta = obj.get("metadata", {})
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')} {where}{meta.get('name')}"


# -- training jobs -------------------------------------------------------------------------------------------

# Azure gives a Spot VM >= 30 s between the Preempt notice and the eviction; a pod deleted otherwise (scale-in,
# job delete, node drain) gets this long after SIGTERM to finish its preemption checkpoint.
TERMINATION_GRACE_SECONDS = 120
# The TorchElastic controller (kubeflow/common ReconcilePods) reads a failed pod's exit code only from the container
# of this name (pytorch/elastic kubernetes/api/v1alpha1/constants.go DefaultContainerName); any other name leaves the
# code at its 0xbeef placeholder, which IsRetryableExitCode treats as permanent: an OOMKilled (137) or SIGTERMed
# (143) worker would never be re-created. The k8s-job engine's podFailurePolicy names the same container.
WORKER_CONTAINER = "elasticjob-worker"
# kubeflow/common ReconcileServices makes a headless Service per replica (<job>-worker-<index>) whose port is the
# one named so on that container (GetPortFromJob; without it every reconcile fails "failed to find the port"
# before the job's status is written). Nothing listens on it: torchrun rendezvous through etcd.
WORKER_PORT_NAME, WORKER_PORT = "elasticjob-port", 10291
MEMORY_TIER_VOLUME = "memory-tier"
JOB_LABEL = "elastictrain.azure.com/job"
# Which engine made a job: later commands find it by this label whichever engine ran it.
ENGINE_LABEL = "elastictrain.azure.com/engine"
# How the job recovers (core.launch.RECOVERY_MODES), on the job object: job show reads it back.
RECOVERY_LABEL = "elastictrain.azure.com/recovery"
# A k8s-job in-process job's node range: its workers' torchrun is --nnodes=1 (each node a world of its own).
NODES_ANNOTATION = "elastictrain.azure.com/nodes"
COMPONENT_LABEL = "app.kubernetes.io/component"
COORDINATOR_COMPONENT = "coordinator"
COORDINATOR_CONTAINER = "coordinator"
COORDINATOR_PORT_NAME = "coordinator"  # a container port name: an IANA service name, at most 15 characters
# The training image's user: scripts/Dockerfile creates it and runs as it (its useradd --uid and USER;
# tests/unit/test_version_pins.py holds them equal to this).
IMAGE_USER = 10001


def etcd_endpoint(namespace: str) -> str:
    """host:port of the rendezvous server, as pods of any namespace reach it."""
    return f"{ETCD_NAME}.{namespace}.svc.cluster.local:{ETCD_CLIENT_PORT}"


def coordinator_name(job_name: str) -> str:
    """The Deployment, Service and NetworkPolicy of an in-process job's coordinator."""
    return f"{job_name}-coordinator"


def coordinator_url(job_name: str, namespace: str) -> str:
    """Where an in-process job's workers reach its coordinator: its Service (launch.ENV_COORDINATOR)."""
    return f"http://{coordinator_name(job_name)}.{namespace}.svc:{launch.COORDINATOR_PORT}"


def render_coordinator(job: JobSpec, cluster: InClusterSpec, image: str) -> list[dict[str, Any]]:
    """The coordinator of an in-process ``job`` (runtime/coordinator.py in the training image), in apply order:
    a Deployment of one pod where etcd runs (the system pool: never Spot, so an eviction cannot take the
    quorum down with the workers), its ClusterIP Service on launch.COORDINATOR_PORT, and a NetworkPolicy that
    admits only the job's own workers (anything else could join its quorums).

    strategy Recreate: two coordinators at once (a rolling update) would each form quorums of their own. It
    holds no state: a rescheduled one forms the next quorum from the workers' heartbeats."""
    name = coordinator_name(job.name)
    selector = {"app.kubernetes.io/part-of": "elastictrain", JOB_LABEL: job.name,
                COMPONENT_LABEL: COORDINATOR_COMPONENT}
    labels = {**selector, RECOVERY_LABEL: launch.RECOVERY_IN_PROCESS}
    meta = {"name": name, "namespace": cluster.namespace, "labels": labels}
    container = {
        "name": COORDINATOR_CONTAINER, "image": image,
        "command": ["python", "-m", launch.COORDINATOR_MODULE],
        "args": launch.coordinator_args(launch.AKS, bind=f"0.0.0.0:{launch.COORDINATOR_PORT}",
                                        min_nodes=job.min_nodes),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "OMP_NUM_THREADS", "value": "1"},
                {"name": "HOME", "value": "/tmp"}],  # the root filesystem is read-only: anything cached goes there
        "ports": [{"name": COORDINATOR_PORT_NAME, "containerPort": launch.COORDINATOR_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": COORDINATOR_PORT_NAME}, "periodSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": COORDINATOR_PORT_NAME}, "initialDelaySeconds": 30,
                          "periodSeconds": 10, "failureThreshold": 6},
        # It imports torch (torchft does): ~230 MiB resident, measured; one core at most for quorum ticks.
        "resources": {"requests": {"cpu": "100m", "memory": "384Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": 1, "revisionHistoryLimit": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": dict(selector)},
            "template": {"metadata": {"labels": dict(selector)}, "spec": {
                "nodeSelector": {"kubernetes.azure.com/mode": "system"},
                # AKS system pools may carry CriticalAddonsOnly=true:NoSchedule (as etcd tolerates it).
                "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                "automountServiceAccountToken": False, "enableServiceLinks": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": IMAGE_USER, "runAsGroup": IMAGE_USER,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "terminationGracePeriodSeconds": 10,
                "containers": [container],
                "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
            }},
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": copy.deepcopy(meta),
        "spec": {"type": "ClusterIP", "selector": dict(selector),
                 "ports": [{"name": COORDINATOR_PORT_NAME, "port": launch.COORDINATOR_PORT,
                            "targetPort": COORDINATOR_PORT_NAME, "protocol": "TCP"}]},
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": copy.deepcopy(meta),
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {JOB_LABEL: job.name, **WORKER_LABELS}}}],
                              "ports": [{"protocol": "TCP", "port": launch.COORDINATOR_PORT}]}]},
    }
    return [deployment, service, policy]


def worker_policy_name(job_name: str) -> str:
    """The NetworkPolicy that admits only the job's own workers to its worker pods."""
    return f"{job_name}-workers"


def job_secret_name(job_name: str) -> str:
    """The Secret holding an in-process job's state-server secret (launch.ENV_JOB_SECRET)."""
    return f"{job_name}-state"


#: The value a rendered Secret carries until ``job run`` sends it (a dry run never shows a secret).
SECRET_PLACEHOLDER = "<made when the job is created; never shown>"


def render_worker_policy(job: JobSpec, cluster: InClusterSpec) -> dict[str, Any]:
    """A NetworkPolicy selecting every worker pod of ``job`` (either engine, either recovery mode) that admits
    ingress from the job's own worker pods only, on every port.

    Every port: the workers listen on ports picked at start (each node's store, torchft's Manager server, gloo's
    pairs, the state server, NCCL's sockets), so the rule has a ``from`` and no ``ports`` (a rule without ports
    matches all of them: NetworkPolicy's API reference). Nothing else reaches a worker: etcd, the coordinator and
    the CLI (through the API server) are reached by the workers, never the other way round, and egress stays
    open (blob storage, the image registry, IMDS). In a namespace shared with other jobs, a pod of another job,
    even with the worker labels, is not admitted: the selector has the job's label."""
    workers = {JOB_LABEL: job.name, **WORKER_LABELS}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": worker_policy_name(job.name), "namespace": cluster.namespace,
                     "labels": {"app.kubernetes.io/part-of": "elastictrain", JOB_LABEL: job.name}},
        "spec": {"podSelector": {"matchLabels": dict(workers)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": dict(workers)}}]}]},
    }


def render_job_secret(job: JobSpec, cluster: InClusterSpec) -> dict[str, Any]:
    """The Secret of an in-process job's state server; its value is made by ``job run`` (``SECRET_PLACEHOLDER``
    until then) and read by the workers' environment (secretKeyRef), never by the CLI again."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": job_secret_name(job.name), "namespace": cluster.namespace,
                     "labels": {"app.kubernetes.io/part-of": "elastictrain", JOB_LABEL: job.name}},
        "stringData": {launch.JOB_SECRET_KEY: SECRET_PLACEHOLDER},
    }


def render_elastic_job(job: JobSpec, cluster: InClusterSpec, image: str, *, run_id: str | None = None,
                       gpus_per_node: int | None = None) -> dict[str, Any]:
    """The ElasticJob running ``job`` (a core.spec.JobSpec; its script is a path inside ``image``).

    The operator prepends ``--rdzv_backend=etcd --rdzv_endpoint=.. --rdzv_id=<name> --nnodes=min:max`` to the
    container's args; ours come after and torchrun keeps the last value of an option, so the job uses the
    etcd-v2 backend (``etcd`` is torch's legacy one), the tuned rendezvous and, with ``run_id``, a rendezvous
    of its own even when an earlier job of the same name left state in etcd. Each worker asks for
    ``gpus_per_node`` GPUs (default: one per training process).
    """
    gpus = _validate_job_inputs(job, image, gpus_per_node)
    _validate_kubernetes_names(job, [f"{job.name}-worker-{job.node_count - 1}", *_coordinator_names(job)], [])
    # In process, the operator's prepended rendezvous options stay but do nothing: --standalone overrides every
    # --rdzv-* option, and our --nnodes=1 comes after theirs (tests/unit/test_aks_in_process.py parses it).
    world = job.mode.node_world(nproc_per_node=job.nproc_per_node, rendezvous=_torchrun_options(job, run_id))
    args = [*world, *launch.worker_entry(job.script, job.script_args, warm=job.warm_start)]
    return {
        "apiVersion": ELASTICJOB_API_VERSION, "kind": "ElasticJob",
        "metadata": {"name": job.name, "namespace": cluster.namespace,
                     "labels": _job_labels(job, ENGINE_TORCHELASTIC)},
        "spec": {
            "rdzvEndpoint": etcd_endpoint(cluster.namespace),
            "minReplicas": job.min_nodes, "maxReplicas": job.max_nodes,
            "replicaSpecs": {"Worker": {"replicas": job.node_count, "restartPolicy": "ExitCode",
                                        "template": _worker_template(job, cluster, image, args, gpus=gpus,
                                                                     engine=ENGINE_TORCHELASTIC,
                                                                     cluster_namespace=cluster.namespace)}},
        },
    }


def render_k8s_job(job: JobSpec, cluster: InClusterSpec, image: str, *, run_id: str | None = None,
                   gpus_per_node: int | None = None) -> list[dict[str, Any]]:
    """The headless Service and the batch/v1 Indexed Job running ``job`` with no operator, in apply order.

    One pod per index, ``--max-nodes`` indexes; a pod without a Spot node stays Pending and torchrun admits it
    at the next rendezvous round. What the Job controller does for us and why (field semantics per the
    Kubernetes Job docs; podFailurePolicy GA 1.31, successPolicy GA 1.33, podReplacementPolicy GA 1.34, the
    latter two beta and on by default since 1.31 and 1.29, hence K8S_JOB_MIN_KUBERNETES):

    - A pod of an evicted node gets the ``DisruptionTarget`` condition (PodGC: ``DeletionByPodGC``; kubelet
      shutdown: ``TerminationByKubelet``; preemption/eviction API: ``PreemptionByScheduler``/
      ``EvictionByEvictionAPI``). The first rule ignores it, whatever exit code torchrun's SIGTERM/SIGKILL
      left, so an eviction counts against nothing; the rules are evaluated in order.
    - Any other non-zero exit of the worker container fails the Job: torchrun itself restarts failed workers
      in place (``--max-restarts``) and exits non-zero (1, ChildFailedError) only once it gave up, so a
      second try by the Job would repeat a failure torchrun already retried. backoffLimitPerIndex is left
      unset for the same reason: indexes are interchangeable agents, not shards with their own retry budget.
    - podReplacementPolicy Failed: the replacement is created only once the evicted pod is terminal, so two
      agents of one index never race in the same rendezvous (and it is the only value the API server
      accepts alongside a podFailurePolicy).
    - successPolicy ``succeededCount: 1``: elastic torchrun agents all exit 0 once training finished, and
      one exits 0 only then; the Job is done at the first success and the controller removes the lingering
      pods, e.g. an index still Pending for Spot capacity that would otherwise hold the Job open forever.
    """
    gpus = _validate_job_inputs(job, image, gpus_per_node)
    _validate_kubernetes_names(job, [job.name, *_coordinator_names(job)], [f"{job.name}-{job.max_nodes - 1}"])
    labels = _job_labels(job, ENGINE_K8S_JOB)
    world = job.mode.node_world(nproc_per_node=job.nproc_per_node, rendezvous=[
        *_torchrun_options(job, run_id or job.name), f"--rdzv-endpoint={etcd_endpoint(cluster.namespace)}",
        f"--nnodes={job.min_nodes}:{job.max_nodes}"])
    args = [*world, *launch.worker_entry(job.script, job.script_args, warm=job.warm_start)]
    template = _worker_template(job, cluster, image, args, gpus=gpus, engine=ENGINE_K8S_JOB,
                                cluster_namespace=cluster.namespace)
    template["spec"].update(restartPolicy="Never", subdomain=job.name)
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": job.name, "namespace": cluster.namespace, "labels": labels},
        # Headless: pods of the job resolve as <job>-<index>.<job>, also before they are ready.
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {JOB_LABEL: job.name, ENGINE_LABEL: ENGINE_K8S_JOB}},
    }
    batch_job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job.name, "namespace": cluster.namespace, "labels": labels,
                     **({"annotations": {NODES_ANNOTATION: f"{job.min_nodes}:{job.max_nodes}"}}
                        if not job.mode.rendezvous else {})},
        "spec": {
            "completionMode": "Indexed", "completions": job.max_nodes, "parallelism": job.max_nodes,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "FailJob", "onExitCodes": {"containerName": WORKER_CONTAINER, "operator": "NotIn",
                                                      "values": [0]}},
            ]},
            "successPolicy": {"rules": [{"succeededCount": 1}]},
            "template": template,
        },
    }
    return [service, batch_job]


def _validate_job_inputs(job: JobSpec, image: str, gpus_per_node: int | None) -> int:
    """Refuses what no engine can run (the job and the cluster's objects are valid as built); returns the GPUs
    each node asks for (default: one per process)."""
    _validate_image(image)
    gpus = job.nproc_per_node if gpus_per_node is None else gpus_per_node
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise SpecError(f"--gpus-per-node must be a whole number of at least 1, not {gpus!r}")
    return gpus


# The API server's name rules (k8s.io/apimachinery pkg/util/validation): a Service's name is a DNS-1035 label
# (ValidateServiceName), a pod's hostname a DNS-1123 label; both at most 63 characters.
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_MAX = 63


def _validate_kubernetes_names(job: JobSpec, services: list[str], hostnames: list[str]) -> None:
    """Refuse, before anything is sent, a job name whose objects the API server would refuse (or, for the
    operator's per-worker Services, refuse to the operator later, leaving the job without them).

    ``services``: the longest Service names the job gets (the ElasticJob operator: ``<job>-worker-<index>``,
    kubeflow/common GenGeneralName; the k8s-job engine: ``<job>``). ``hostnames``: the longest pod hostname
    (an Indexed Job's ``<job>-<index>``, which the API server checks for the highest index at create)."""
    room = _LABEL_MAX - max(len(n) - len(job.name) for n in services + hostnames)
    if not job.name[:1].isalpha():
        raise SpecError(f"job name {job.name!r} cannot be used on Kubernetes: the job's Service "
                        f"{services[0]!r} needs a name that starts with a letter (a DNS-1035 label); "
                        f"start the name with a letter, e.g. 'job-{job.name}'")
    for name in services + hostnames:
        if len(name) > _LABEL_MAX or not _DNS1035_LABEL.fullmatch(name):
            what = "Service" if name in services else "pod hostname"
            raise SpecError(f"job name {job.name!r} is too long for Kubernetes: its {what} {name!r} would have "
                            f"{len(name)} characters and Kubernetes allows at most {_LABEL_MAX}; use a job name "
                            f"of at most {room} characters")


def _coordinator_names(job: JobSpec) -> list[str]:
    return [coordinator_name(job.name)] if job.mode.coordinator else []


def _torchrun_options(job: JobSpec, run_id: str | None) -> list[str]:
    return launch.torchrun_options(rdzv_conf=launch.AKS.rdzv_conf, nproc_per_node=job.nproc_per_node,
                                   rdzv_id=run_id)


def _validate_image(image: str) -> None:
    name, _, tag = (image or "").rpartition(":")
    if "@sha256:" not in (image or "") and (not name or "/" in tag or tag in ("", "latest")):
        raise SpecError(f"image {image!r} is not pinned: give a version tag (or digest), not :latest, so every "
                        "worker of the job runs the same code")


def _job_labels(job: JobSpec, engine: str) -> dict[str, Any]:
    recovery = {RECOVERY_LABEL: launch.RECOVERY_IN_PROCESS} if job.in_process else {}
    return {"app.kubernetes.io/part-of": "elastictrain", JOB_LABEL: job.name, ENGINE_LABEL: engine, **recovery}


def _worker_template(job: JobSpec, cluster: InClusterSpec, image: str, args: list[str], *, gpus: int, engine: str,
                     cluster_namespace: str) -> dict[str, Any]:
    labels = {**_job_labels(job, engine), **WORKER_LABELS, "azure.workload.identity/use": "true"}
    return {
        "metadata": {"labels": labels},
        "spec": {
            "serviceAccountName": cluster.service_account,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
            "tolerations": [parse_taint(SPOT_TAINT), parse_taint(cluster.gpu_taint)],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "In",
                                       "values": ["spot"]}]}]}}},
            "containers": [_worker_container(job, image, args, gpus, engine, namespace=cluster_namespace)],
            # torch's DataLoader workers and NCCL share tensors through /dev/shm (64 MiB by default).
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, *_memory_tier_volumes(job)],
        },
    }


def _memory_tier_on(job: JobSpec) -> bool:
    return job.memory_tier_on


def _memory_tier_volumes(job: JobSpec) -> list[dict[str, Any]]:
    """The memory tier's own memory-backed emptyDir (runtime/memory_tier.py: two copies of the node's state).

    It outlives a worker process (torchrun restarts them in place), not the pod. Its pages count against the
    pod's memory; the sizeLimit bounds them (the kubelet evicts a pod whose emptyDir outgrows it, so the
    runtime reserves each slot's space up front and turns the tier off where it does not fit)."""
    if not _memory_tier_on(job):
        return []
    return [{"name": MEMORY_TIER_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": job.memory_tier}}]


def _worker_container(job: JobSpec, image: str, args: list[str], gpus: int, engine: str, *,
                      namespace: str) -> dict[str, Any]:
    return {
        "name": WORKER_CONTAINER, "image": image,
        **({"ports": [{"name": WORKER_PORT_NAME, "containerPort": WORKER_PORT}]}
           if engine == ENGINE_TORCHELASTIC else {}),
        # With warm starts the agent is torchrun behind runtime/warm.py's --agent (it execs torchrun with the
        # same arguments, the operator's prepended ones included, after starting the node's warm server).
        "command": ["python", *launch.agent_module(warm=job.warm_start)],
        "args": args,
        "env": _worker_env(job, namespace),
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         *([{"name": MEMORY_TIER_VOLUME, "mountPath": launch.MEMORY_TIER_MOUNT}]
                           if _memory_tier_on(job) else [])],
        # The kubelet runs preStop before it sends SIGTERM, and only when the pod itself goes (deleted, drained,
        # evicted): the runtime then saves the step to blob instead of trusting this pod's memory, which goes
        # with it. torchrun's own SIGTERM of a re-form (a node joined) finds no file: memory is enough there.
        **({"lifecycle": {"preStop": {"exec": {"command": ["touch", launch.NODE_LEAVING_FILE]}}}}
           if _memory_tier_on(job) else {}),
    }


def _worker_env(job: JobSpec, namespace: str) -> list[dict[str, Any]]:
    # The container URL comes from the cluster's ConfigMap; Kubernetes expands $(VAR) of earlier entries.
    env: list[dict[str, Any]] = [
        {"name": launch.ENV_CHECKPOINT_CONTAINER_URL, "valueFrom": {"configMapKeyRef": {
            "name": CHECKPOINT_CONFIGMAP, "key": CHECKPOINT_URL_KEY}}},
        {"name": launch.ENV_CHECKPOINT_URL, "value": f"$({launch.ENV_CHECKPOINT_CONTAINER_URL})/{job.name}"},
        {"name": launch.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    if _memory_tier_on(job):
        env.append({"name": launch.ENV_MEMORY_DIR, "value": launch.MEMORY_TIER_MOUNT})
        env.append({"name": launch.ENV_NODE_LEAVING_FILE, "value": launch.NODE_LEAVING_FILE})
    if job.mode.coordinator:  # each pod is one replica group of the job's quorums, named after itself
        env.append({"name": launch.ENV_REPLICA_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        env.append({"name": launch.ENV_REPLICA_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        env.append({"name": launch.ENV_JOB_SECRET, "valueFrom": {"secretKeyRef": {
            "name": job_secret_name(job.name), "key": launch.JOB_SECRET_KEY}}})
    shared = job_env(job, launch.AKS, coordinator=coordinator_url(job.name, namespace))
    return env + [{"name": name, "value": value} for name, value in shared.items()]
