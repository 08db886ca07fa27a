"""Elastic jobs on AKS, as `job list|show|logs|wait|delete` show them: the ElasticJob's status, its worker pods
(where they run, Spot or not, phase, restarts) and the job's event log in blob (core.eventlog.events).

``describe_job`` is pure over the objects the caller fetched; ``show_job`` and
``list_jobs`` are thin functions over a ``clients.kube.KubeClient``. The result has the keys of the local
backend's job show where they mean the same (so the table formatters and `job wait` work on both), with
``nodes`` one entry per worker pod and ``operator`` the controller's own conditions and replica counts. How the
job was launched is core/launched.py's, as on the local backend, from the spec read back from the job's manifest
(``spec_of``).

The archived operator (kubeflow/common JobStatus) writes conditions Created, Running, Restarting, Succeeded,
Failed; for a job of Worker replicas only it never writes Succeeded (only a Master's exit does), so the job's
``finished`` event is what says training succeeded.
"""
from __future__ import annotations

import time
from dataclasses import fields
from typing import Any, Callable

from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core import launch
from azext_elastictrain.backends.views import AksJobStops
from azext_elastictrain.core.aks.eviction import (
    holds_node,
    is_spot,
    job_workers,
    node_pool,
    object_name,
    pod_job,
    pod_node,
)
from azext_elastictrain.core.constants import TRAINING_NAMESPACE
from azext_elastictrain.core.ports import KubeClient
from azext_elastictrain.core.aks.manifests import (
    ELASTICJOB_API_VERSION,
    ENGINE_LABEL,
    MEMORY_TIER_VOLUME,
    NODES_ANNOTATION,
    RECOVERY_LABEL,
    WORKER_CONTAINER,
    WORKER_LABELS,
)
from azext_elastictrain.core.errors import JobNotFound
from azext_elastictrain.core.launched import Launched, LaunchedOwn, launched
from azext_elastictrain.core.settings import DEFAULTS, RuntimeSettings
from azext_elastictrain.core.spec import ENGINE_K8S_JOB, ENGINE_TORCHELASTIC, MEMORY_TIER_OFF, JobSpec, SpecError
from azext_elastictrain.core.eventlog.view import (
    AksWorker,
    JobIdentity,
    JobOwn,
    AksJobShown,
    build_job_view,
    parse_iso,
    read_job_events,
)

CREATED = "Created"
PENDING = "Pending"
RESTARTING = "Restarting"
UNKNOWN = "Unknown"
# The operator's condition types, strongest first: a terminal condition outranks a transient one.
_CONDITION_ORDER = ("Failed", "Succeeded", "Restarting", "Running", "Created")
NODE_LOST = "NodeLost"  # a pod whose node left the cluster (evicted VM) before the pod was cleaned up
TERMINATING = "Terminating"
_WORKER_REPLICA = "Worker"
_JOB_CONDITIONS = {"Complete": "Succeeded", "SuccessCriteriaMet": "Succeeded", "FailureTarget": "Failed"}
_JOB_COUNTS = ("active", "ready", "succeeded", "failed", "terminating", "completedIndexes", "failedIndexes")

ReadEvents = Callable[[str], list[Any]]
#: What only an AKS job's launched part shows (core/launched.py's ``own``): the image its workers run.
OWN_LAUNCHED = ("image",)
# What the launch writes into a worker's environment besides the job's --env (core/aks/manifests.py's worker env, with
# core/spec.py's job_env): every runtime setting, where the worker's checkpoints, memory tier and peers are.
_LAUNCH_ENV = frozenset({*(item.metadata["env"] for item in fields(RuntimeSettings)), launch.ENV_CHECKPOINT_URL,
                         launch.ENV_CHECKPOINT_CONTAINER_URL, launch.ENV_NODE_NAME, launch.ENV_MEMORY_DIR,
                         launch.ENV_NODE_LEAVING_FILE, launch.ENV_REPLICA_ID, launch.ENV_REPLICA_HOST,
                         launch.ENV_JOB_SECRET, launch.ENV_COORDINATOR})
# ... and what it writes that --env may set too (another value there is the job's --env).
_LAUNCH_DEFAULTS = {**{name: value for name, value in DEFAULTS.to_env().items() if name in launch.ENV_SCRIPT_SETTINGS},
                    **launch.TCP_STORE_WORKAROUND, "PYTHONUNBUFFERED": "1"}


def describe_job(elastic_job: dict[str, Any], pods: list[dict[str, Any]], nodes: list[dict[str, Any]],
                 events: list[dict[str, Any]], *, cluster: str | None = None, events_error: str | None = None,
                 checkpoint_url: str | None = None) -> AksJobShown:
    """`job show` of one ElasticJob from its object, the namespace's pods, the cluster's nodes and its events
    (all of them: those of an earlier job of the same name are dropped here by the job's creation time), and
    where it checkpoints (the blob URL of its prefix)."""
    meta = elastic_job.get("metadata") or {}
    name = object_name(elastic_job)
    shape = _shape(elastic_job)
    node_by_name = {object_name(n): n for n in nodes}
    workers = [_worker(rank, pod, node_by_name) for rank, pod in job_workers(pods, name)]
    status = elastic_job.get("status") or {}
    conditions = [_as_operator_condition(c) for c in status.get("conditions") or []]
    view = build_job_view(
        events, created=parse_iso(meta.get("creationTimestamp")), nodes=workers, events_error=events_error,
        state_of=lambda summary: job_state(conditions, summary["finished"], workers, events_error is not None),
        lost_nodes=lambda _state: [w["node"] for w in workers if w["status"] == NODE_LOST])
    identity = JobIdentity(name=name, cluster=cluster, type="aks", namespace=meta.get("namespace"),
                           engine=shape["engine"])
    shown = launched_of(elastic_job, checkpoint_url=checkpoint_url)
    operator: dict[str, Any] = {
        "conditions": [_condition(c) for c in status.get("conditions") or []],
        "startTime": status.get("startTime"),
        "completionTime": status.get("completionTime"),
    }
    if shape["engine"] == ENGINE_K8S_JOB:  # the job controller's counts; an ignored eviction counts nowhere
        operator.update({key: status.get(key) for key in _JOB_COUNTS})
    else:
        operator["replicaStatuses"] = status.get("replicaStatuses") or {}
    return view.describe(identity, shown, JobOwn(operator=operator), worker_restarts=True)


def launched_of(job: dict[str, Any], *, checkpoint_url: str | None = None) -> Launched:
    """How the job was launched, as `job show` prints it (core/launched.py, as a local job's): the spec read back
    from its manifest (``spec_of``), where it checkpoints, its rendezvous, and ``OWN_LAUNCHED``."""
    meta = job.get("metadata") or {}
    container = _container(_shape(job)["template"])
    rdzv_id = _script_args(container.get("args") or [])["rdzvId"] or object_name(job)
    return launched(spec_of(job), created=meta.get("creationTimestamp"), checkpoint_url=checkpoint_url,
                    rdzv_id=rdzv_id, own=LaunchedOwn(image=container.get("image")))


def spec_of(job: dict[str, Any]) -> JobSpec | dict[str, Any]:
    """The spec the job was launched with, read back from its manifest: torchrun's arguments (the script and its
    arguments, warm or not, the node range, processes per node), the node count, the recovery label, the memory
    tier's volume, the settings its workers' environment holds (core/settings.py's ``RuntimeSettings.from_env``,
    the runtime's own reader) and the rest of that environment (``--env``). A ``JobSpec`` where one can be made of
    it; else (a job made by an older version or by another tool) what could be read, by field name, None for the
    rest (a setting whose variable is missing or that this version cannot read, too)."""
    shape = _shape(job)
    container = _container(shape["template"])
    args = _script_args(container.get("args") or [])
    env = {str(e["name"]): str(e["value"]) for e in container.get("env") or []
           if e.get("name") and e.get("value") is not None}
    try:
        settings: RuntimeSettings | None = RuntimeSettings.from_env(env)
    except ValueError:
        settings = None

    def setting(variable: str, field: str) -> Any:
        return getattr(settings, field) if settings is not None and env.get(variable) else None

    read = {
        "name": object_name(job), "script": args["script"],
        "min_nodes": shape["minNodes"] if shape["minNodes"] is not None else args["minNodes"],
        "max_nodes": shape["maxNodes"] if shape["maxNodes"] is not None else args["maxNodes"],
        "nodes": shape["nodeCount"], "nproc_per_node": args["nprocPerNode"],
        "script_args": tuple(args["scriptArgs"]),
        "checkpoint_interval": setting(launch.ENV_CHECKPOINT_INTERVAL_STEPS, "checkpoint_interval_steps"),
        "checkpoint_interval_seconds": setting(launch.ENV_CHECKPOINT_INTERVAL_SECONDS, "checkpoint_interval_seconds"),
        "keep": setting(launch.ENV_KEEP, "keep"),
        "memory_tier": _memory_tier(shape["template"], setting(launch.ENV_MEMORY_TIER, "memory_tier")),
        "warm_start": args["warmStart"], "recovery": shape["recovery"], "env": _script_env(env),
    }
    try:
        return JobSpec(**read)
    except SpecError:
        return read


def _memory_tier(template: dict[str, Any], on: bool | None) -> str | None:
    """The memory tier's size (its volume's sizeLimit), ``off`` where the workers are told it is off, else None (a
    job from before the tier had a volume of its own)."""
    volumes = (template.get("spec") or {}).get("volumes") or []
    size = next(((v.get("emptyDir") or {}).get("sizeLimit") for v in volumes if v.get("name") == MEMORY_TIER_VOLUME),
                None)
    if size:
        return str(size)
    return MEMORY_TIER_OFF if on is False else None


def _script_env(env: dict[str, str]) -> tuple[str, ...]:
    """The job's ``--env``, back from its workers' environment: every variable the launch does not write, and
    those it writes that ``--env`` may set too where the value is not the launch's own."""
    return tuple(f"{name}={value}" for name, value in env.items()
                 if (value != _LAUNCH_DEFAULTS[name] if name in _LAUNCH_DEFAULTS else name not in _LAUNCH_ENV))


def job_state(conditions: list[dict[str, Any]], finished: bool, workers: list[AksWorker],
              events_unread: bool = False) -> str:
    """Succeeded once training wrote its final event; else the operator's strongest true condition; a job
    the operator has not reconciled yet is Pending (or Running, where a worker already runs).

    The operator's Succeeded alone is not success: its workers exited 0, which a script that returns after a
    stop does too. Without the final event it is Failed (Unknown where the events could not be read)."""
    if finished:
        return job_events.SUCCEEDED
    true = {c.get("type") for c in conditions if str(c.get("status")).lower() == "true"}
    state = next((t for t in _CONDITION_ORDER if t in true), None)
    if state == job_events.SUCCEEDED:
        return UNKNOWN if events_unread else job_events.FAILED
    if state is not None and state != CREATED:
        return state
    if any(w["alive"] for w in workers):
        return job_events.RUNNING
    return state or PENDING


def _worker(rank: int, pod: dict[str, Any], node_by_name: dict[str, dict[str, Any]]) -> AksWorker:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    node_name = pod_node(pod)
    node = node_by_name.get(node_name) if node_name else None
    phase = status.get("phase") or UNKNOWN
    if meta.get("deletionTimestamp"):
        shown = TERMINATING
    elif node_name and node is None and holds_node(pod):
        shown = NODE_LOST
    else:
        shown = phase
    return {
        "pod": meta.get("name"),
        "rank": rank,
        "node": node_name,
        "pool": node_pool(node) if node else None,
        "spot": is_spot(node) if node else None,  # None: the node is not known (gone, or not scheduled yet)
        "phase": phase,
        "status": shown,
        "alive": shown == "Running" and _ready(node),
        "restarts": sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or []),
        "reason": status.get("reason") or _disruption(status) or _waiting_reason(status),
        "started": status.get("startTime"),
    }


def _ready(node: dict[str, Any] | None) -> bool:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _disruption(status: dict[str, Any]) -> str | None:
    """Why Kubernetes took the pod (an evicted node's pod: DisruptionTarget, e.g. DeletionByPodGC)."""
    for c in status.get("conditions") or []:
        if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            return f"DisruptionTarget: {c.get('reason')}"
    return None


def _waiting_reason(status: dict[str, Any]) -> str | None:
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    unschedulable = [c for c in status.get("conditions") or []
                     if c.get("type") == "PodScheduled" and c.get("status") == "False"]
    return unschedulable[0].get("reason") if unschedulable else None


def _condition(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("type", "status", "reason", "message", "lastTransitionTime")
    return {k: c.get(k) for k in keys if c.get(k) is not None}


def _container(template: dict[str, Any]) -> dict[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or [{}]
    return next((c for c in containers if c.get("name") == WORKER_CONTAINER), containers[0])


def _script_args(args: list[str]) -> dict[str, Any]:
    """Our torchrun options come first (manifests._worker_container), then the script and its arguments."""
    options = {}
    for i, arg in enumerate(args):
        if arg == launch.SCRIPT_SEPARATOR or not arg.startswith("--"):
            script, rest, warm = launch.script_of(args[i:])
            break
        key, _, value = arg[2:].partition("=")
        options[key.replace("_", "-")] = value
    else:
        script, rest, warm = None, [], False
    low, _, high = (options.get("nnodes") or "").partition(":")
    return {"script": script, "scriptArgs": rest, "warmStart": warm,
            "nprocPerNode": _int(options.get("nproc-per-node")),
            "rdzvId": options.get("rdzv-id"), "minNodes": _int(low), "maxNodes": _int(high or low)}


def _shape(job: dict[str, Any]) -> dict[str, Any]:
    """Engine, worker pod template and node counts of an ElasticJob or of a k8s-job's batch/v1 Job (whose
    node range is torchrun's --nnodes, read from the args by the caller)."""
    spec, meta = job.get("spec") or {}, job.get("metadata") or {}
    # jobs made before the label: restart, the only mode there was
    recovery = (meta.get("labels") or {}).get(RECOVERY_LABEL) or launch.RECOVERY_RESTART
    if job.get("kind") == "Job":
        # in process, torchrun's --nnodes is 1 (each node a world of its own): the range is in an annotation
        low, _, high = ((meta.get("annotations") or {}).get(NODES_ANNOTATION) or "").partition(":")
        return {"engine": ENGINE_K8S_JOB, "template": spec.get("template") or {}, "minNodes": _int(low),
                "maxNodes": _int(high), "nodeCount": spec.get("parallelism"), "recovery": recovery}
    worker = (spec.get("replicaSpecs") or {}).get(_WORKER_REPLICA) or {}
    return {"engine": ENGINE_TORCHELASTIC, "template": worker.get("template") or {},
            "minNodes": spec.get("minReplicas"), "maxNodes": spec.get("maxReplicas"),
            "nodeCount": worker.get("replicas"), "recovery": recovery}


def min_nodes(job: dict[str, Any]) -> int:
    """The fewest nodes the job trains on: the ElasticJob's minReplicas, else torchrun's --nnodes low end."""
    shape = _shape(job)
    least = shape["minNodes"] if shape["minNodes"] is not None else \
        _script_args(_container(shape["template"]).get("args") or [])["minNodes"]
    return least if least is not None and least > 0 else 1


def _as_operator_condition(c: dict[str, Any]) -> dict[str, Any]:
    """A Job's terminal conditions in the operator's words (Complete is Succeeded), for job_state."""
    kind = c.get("type")
    return {**c, "type": _JOB_CONDITIONS.get(kind, kind) if isinstance(kind, str) else kind}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# -- logs and delete, planned ---------------------------------------------------------------------------------

def plan_logs(elastic_job: dict[str, Any], pods: list[dict[str, Any]], rank: int | None = None) -> list[dict[str, Any]]:
    """Which pod and container hold the logs of the job (every worker, by rank) or of one ``rank``:
    ``[{"pod", "container", "rank", "node", "phase"}]``. A worker not started yet has no logs to read."""
    name = object_name(elastic_job)
    workers = job_workers(pods, name)
    if rank is not None:
        chosen = [(r, p) for r, p in workers if r == rank]
        if not chosen:
            ranks = ", ".join(str(r) for r, _ in workers) or "none yet"
            raise JobNotFound(f"job {name!r} has no rank {rank} (its ranks: {ranks})")
        workers = chosen
    container = _container(_shape(elastic_job)["template"]).get("name") or WORKER_CONTAINER
    plan = [{"pod": (p.get("metadata") or {}).get("name"), "container": container, "rank": r,
             "node": pod_node(p), "phase": (p.get("status") or {}).get("phase") or UNKNOWN} for r, p in workers]
    if rank is not None and plan[0]["phase"] == PENDING and pod_node(workers[0][1]) is None:
        raise SpecError(f"rank {rank} of job {name!r} is not scheduled yet (pod {plan[0]['pod']} is "
                        "Pending): it has no logs; 'az elastictrain job show' says why")
    return plan


def plan_delete(elastic_job: dict[str, Any], pods: list[dict[str, Any]]) -> AksJobStops:
    """What deleting the ElasticJob stops: the operator owns the worker pods, so they go with it (background
    propagation); the checkpoints and events in blob stay for a later job of the same name."""
    meta = elastic_job.get("metadata") or {}
    return {
        "name": meta.get("name"), "namespace": meta.get("namespace"),
        "object": {"apiVersion": elastic_job.get("apiVersion", ELASTICJOB_API_VERSION),
                   "kind": elastic_job.get("kind", "ElasticJob"), "name": meta.get("name"),
                   "namespace": meta.get("namespace")},
        "engine": _shape(elastic_job)["engine"],
        "stopped": [{"pod": (p.get("metadata") or {}).get("name"), "rank": r, "node": pod_node(p)}
                    for r, p in job_workers(pods, object_name(elastic_job))],
        "checkpoints": "kept",
    }


# -- over a KubeClient ---------------------------------------------------------------------------------------

def _worker_selector() -> str:
    return ",".join(f"{k}={v}" for k, v in WORKER_LABELS.items())


def all_jobs(kube: KubeClient, namespace: str) -> list[dict[str, Any]]:
    """The jobs of the namespace whichever engine made them: ElasticJobs, and batch/v1 Jobs of engine k8s-job
    (the label tells ours from any other Job there)."""
    return [*kube.list(ELASTICJOB_API_VERSION, "ElasticJob", namespace),
            *kube.list("batch/v1", "Job", namespace, f"{ENGINE_LABEL}={ENGINE_K8S_JOB}")]


def find_job(kube: KubeClient, name: str, namespace: str) -> dict[str, Any]:
    """Job ``name`` whichever engine made it; raises JobNotFound naming the jobs there are."""
    job = kube.get(ELASTICJOB_API_VERSION, "ElasticJob", name, namespace)
    if job is None:  # a k8s-job: a batch/v1 Job carrying our engine label
        batch = kube.get("batch/v1", "Job", name, namespace)
        if batch is not None and ((batch.get("metadata") or {}).get("labels") or {}).get(ENGINE_LABEL):
            job = {"apiVersion": "batch/v1", "kind": "Job", **batch}
    if job is None:
        known = sorted(object_name(j) for j in all_jobs(kube, namespace))
        raise JobNotFound(f"no job {name!r} in namespace {namespace!r} (its jobs: {', '.join(known) or 'none'}); "
                          "'az elastictrain job list' shows them")
    return job


def show_job(kube: KubeClient, name: str, read_events: ReadEvents, *, namespace: str = TRAINING_NAMESPACE,
             cluster: str | None = None, job_url: Callable[[str], str] | None = None) -> AksJobShown:
    """`job show` for ElasticJob ``name``; raises JobNotFound (naming the jobs there are). ``job_url``: the blob URL
    of a job's checkpoints."""
    job = find_job(kube, name, namespace)
    pods = kube.list("v1", "Pod", namespace, _worker_selector())
    nodes = kube.list("v1", "Node")
    events, error = read_job_events(read_events, name)
    return describe_job(job, pods, nodes, events, cluster=cluster, events_error=error,
                        checkpoint_url=job_url(name) if job_url else None)


def list_jobs(kube: KubeClient, read_events: ReadEvents, *, namespace: str = TRAINING_NAMESPACE,
              cluster: str | None = None, job_url: Callable[[str], str] | None = None) -> list[AksJobShown]:
    """`job list`: every ElasticJob of the namespace, described; one pod and one node list for all."""
    jobs = all_jobs(kube, namespace)
    if not jobs:
        return []
    pods = kube.list("v1", "Pod", namespace, _worker_selector())
    nodes = kube.list("v1", "Node")
    described = []
    for job in sorted(jobs, key=object_name):
        name = object_name(job)
        events, error = read_job_events(read_events, name)
        mine = [p for p in pods if pod_job(p) == name]
        described.append(describe_job(job, mine, nodes, events, cluster=cluster, events_error=error,
                                      checkpoint_url=job_url(name) if job_url else None))
    return described


def follow_recovery_aks(read_events: ReadEvents, job: str, evicted_at: float, *, node: str | None = None,
                        requested_at: float | None = None, timeout: float | None = None,
                        sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """After an eviction: the job's outage (its last step before to its first step after) and the steps it lost,
    and seconds from ``evicted_at`` (the node left, see ``evict.wait_node_evicted``) until it trained again.
    The same reading of the events as on the local cluster (``core.eventlog.recovery.follow_recovery``)."""
    from azext_elastictrain.core.eventlog.recovery import RECOVERY_TIMEOUT, follow_recovery

    eviction = {"node": node, "evictedAt": evicted_at,
                "startedAt": evicted_at if requested_at is None else min(requested_at, evicted_at)}
    return follow_recovery(read_events, job, eviction, RECOVERY_TIMEOUT if timeout is None else timeout, sleep=sleep)
