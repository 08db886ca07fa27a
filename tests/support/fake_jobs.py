"""The batch/v1 Job controller, PodGC and the scheduler, as strict as the real ones for what the k8s-job engine
relies on (Kubernetes docs: "Jobs" — Indexed completion mode, pod failure policy, success policy, pod
replacement policy; "Pod disruption conditions"). It acts on a ``FakeKube``'s objects when stepped
(``reconcile``), so a test decides when the cluster moves.

Modelled:
- admission (``validate``, called by FakeKube.apply): what the API server rejects for the fields we use —
  podFailurePolicy needs restartPolicy Never; successPolicy and backoffLimitPerIndex need Indexed;
  podReplacementPolicy must be Failed with a podFailurePolicy; succeededCount <= completions; FailJob
  onExitCodes NotIn/In with values, 0 not allowed for In; parallelism/completions >= 0.
- Indexed pods ``<job>-<index>-<suffix>`` with the ``batch.kubernetes.io/job-completion-index`` annotation and
  label, ``job-name``/``batch.kubernetes.io/job-name`` labels, hostname ``<job>-<index>`` and the subdomain.
- a pod whose node left (``node_gone``): PodGC marks it Failed with ``DisruptionTarget`` (reason
  ``DeletionByPodGC``); the Job's tracking finalizer holds it until the controller accounted for it.
- pod failure policy rules in order: Ignore (not counted in ``status.failed``, no condition), FailJob
  (``FailureTarget`` then ``Failed``, reason ``PodFailurePolicy``, active pods deleted), else counted
  against backoffLimit.
- podReplacementPolicy Failed: an index gets a new pod only once its old pod is terminal (Failed/Succeeded).
- successPolicy succeededCount/succeededIndexes: ``SuccessCriteriaMet`` then ``Complete``, lingering pods
  removed; without one, Complete once every index succeeded.
- the scheduler binds a Pending pod to a Ready Spot GPU node no running pod holds (one GPU pod per node).
Not modelled: backoffLimitPerIndex accounting, Job suspension, TTL, pod deletion cost, exit-code ranges.
"""
from __future__ import annotations

import uuid
from typing import Any

from azext_elastictrain.clients.kube import KubeError

JOB = ("batch/v1", "Job")
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
_NOW = "2026-01-01T00:05:00Z"
_TERMINAL = ("Failed", "Succeeded")


def validate(job: dict) -> None:
    """Refuse a Job as the API server's validation does (HTTP 422 Invalid), for the fields we use."""
    spec = job.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    indexed = spec.get("completionMode") == "Indexed"
    problems = []
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        problems.append('spec.template.spec.restartPolicy: Unsupported value: only "OnFailure", "Never"')
    if spec.get("podFailurePolicy") is not None:
        if pod_spec.get("restartPolicy") != "Never":
            problems.append("spec.podFailurePolicy: Invalid value: only allowed when restartPolicy is Never")
        if spec.get("podReplacementPolicy", "Failed") != "Failed":
            problems.append('spec.podReplacementPolicy: Unsupported value: must be "Failed" when podFailurePolicy '
                            "is specified")
        problems += _rule_problems(spec["podFailurePolicy"].get("rules") or [])
    if spec.get("successPolicy") is not None:
        if not indexed:
            problems.append('spec.successPolicy: Invalid value: requires completionMode "Indexed"')
        for rule in spec["successPolicy"].get("rules") or []:
            if rule.get("succeededCount") is None and rule.get("succeededIndexes") is None:
                problems.append("spec.successPolicy.rules: needs succeededIndexes or succeededCount")
            if (rule.get("succeededCount") or 0) > (spec.get("completions") or 0):
                problems.append("spec.successPolicy.rules.succeededCount: must be <= completions")
    if spec.get("backoffLimitPerIndex") is not None and not indexed:
        problems.append('spec.backoffLimitPerIndex: requires completionMode "Indexed"')
    if any((spec.get(f) or 0) < 0 for f in ("parallelism", "completions")):
        problems.append("spec.parallelism/completions: must be >= 0")
    if problems:
        name = (job.get("metadata") or {}).get("name")
        raise KubeError(f'Job.batch "{name}" is invalid: {"; ".join(problems)}', status=422, reason="Invalid")


def _rule_problems(rules: list[dict]) -> list[str]:
    problems = []
    for rule in rules:
        if rule.get("action") not in ("Ignore", "FailJob", "Count", "FailIndex"):
            problems.append(f"podFailurePolicy.rules.action: Unsupported value {rule.get('action')!r}")
        exits = rule.get("onExitCodes")
        if (exits is None) == (rule.get("onPodConditions") is None):
            problems.append("podFailurePolicy.rules: exactly one of onExitCodes and onPodConditions")
        if exits is not None and (exits.get("operator") not in ("In", "NotIn") or not exits.get("values")
                                  or (exits["operator"] == "In" and 0 in exits["values"])):
            problems.append("podFailurePolicy.rules.onExitCodes: operator In/NotIn with values (0 not In)")
    return problems


class JobController:
    """Steps the Jobs of ``kube`` (a FakeKube) forward: ``reconcile()`` after whatever the test changed."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube

    # -- the cluster's other actors ---------------------------------------------------------------------------
    def node_gone(self, node: str) -> list[str]:
        """PodGC for a deleted node: its pods fail with DisruptionTarget; tracked ones wait for the controller."""
        marked = []
        for key, pod in list(self.kube.objects.items()):
            if key[1] != "Pod" or (pod.get("spec") or {}).get("nodeName") != node:
                continue
            if TRACKING_FINALIZER not in ((pod["metadata"].get("finalizers")) or []):
                del self.kube.objects[key]  # an untracked pod simply goes (as before)
                continue
            _fail(pod, None, {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                              "message": "PodGC: node no longer exists"})
            pod["metadata"]["deletionTimestamp"] = _NOW
            marked.append(key[3])
        return marked

    def exit(self, pod_name: str, namespace: str, code: int, reason: str = "Error") -> None:
        """The pod's worker container exited with ``code`` (restartPolicy Never: the pod is terminal); ``reason``
        as the kubelet writes it (``OOMKilled`` for a container the kernel killed at its memory limit)."""
        pod = self.kube.objects[("v1", "Pod", namespace, pod_name)]
        if code == 0:
            pod["status"] = {**pod.get("status", {}), "phase": "Succeeded",
                             "containerStatuses": [_terminated(container_name(pod), 0, "Completed")]}
        else:
            _fail(pod, code, None, reason)

    # -- the Job controller -----------------------------------------------------------------------------------
    def reconcile(self) -> None:
        for key, job in list(self.kube.objects.items()):
            if key[:2] == JOB and not _finished(job):
                self._sync(job)
        self.schedule()

    def _sync(self, job: dict) -> None:
        spec, status = job["spec"], job.setdefault("status", {})
        status.setdefault("startTime", _NOW)
        pods = self._pods(job)
        counted_failed = status.get("failed", 0)
        for pod in [p for p in pods if p["status"].get("phase") == "Failed" and _tracked(p)]:
            action = _failure_action(spec, pod)
            if action == "FailJob":
                self._terminate(job, pods, "Failed", "PodFailurePolicy",
                                f"Container {container_name(pod)} for pod {pod['metadata']['name']} failed with "
                                f"exit code {_exit_code(pod)} matching FailJob rule at index 1")
            if action != "Ignore":
                counted_failed += 1
            self._untrack(pod)
        status["failed"] = counted_failed
        if _finished(job):
            return
        succeeded = sorted({_index(p) for p in pods if p["status"].get("phase") == "Succeeded"})
        status["succeeded"], status["completedIndexes"] = len(succeeded), _intervals(succeeded)
        if _success_met(spec, succeeded):
            self._terminate(job, pods, "Complete", "CompletionsReached" if len(succeeded) == spec["completions"]
                            else "SuccessPolicy", "Reached expected number of succeeded pods")
            return
        if counted_failed > spec.get("backoffLimit", 6):
            self._terminate(job, pods, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff "
                                                                         "limit")
            return
        self._create_missing(job, [p for p in self._pods(job)], succeeded)
        live = [p for p in self._pods(job) if p["status"].get("phase") not in _TERMINAL]
        status["active"] = len(live)
        status["ready"] = sum(1 for p in live if p["status"].get("phase") == "Running")
        status["terminating"] = sum(1 for p in live if p["metadata"].get("deletionTimestamp"))

    def _create_missing(self, job: dict, pods: list[dict], succeeded: list[int]) -> None:
        """podReplacementPolicy Failed: an index whose pod is still terminating gets nothing yet."""
        spec = job["spec"]
        busy = {_index(p) for p in pods if p["status"].get("phase") not in _TERMINAL}
        for index in range(min(spec["parallelism"], spec["completions"])):
            if index not in busy and index not in succeeded:
                self.kube.seed(_pod_for(job, index))

    def _terminate(self, job: dict, pods: list[dict], condition: str, reason: str, message: str) -> None:
        interim = "FailureTarget" if condition == "Failed" else "SuccessCriteriaMet"
        job["status"]["conditions"] = [*job["status"].get("conditions", []),
                                       *({"type": t, "status": "True", "reason": reason, "message": message,
                                          "lastTransitionTime": _NOW} for t in (interim, condition))]
        job["status"]["completionTime" if condition == "Complete" else "failedTime"] = _NOW
        for pod in pods:
            if pod["status"].get("phase") not in _TERMINAL:  # lingering pods are removed
                del self.kube.objects[("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])]
        job["status"].update(active=0, ready=0, terminating=0)

    def _untrack(self, pod: dict) -> None:
        """Accounted for: the finalizer goes; a pod PodGC marked for deletion is then deleted."""
        pod["metadata"]["finalizers"] = [f for f in pod["metadata"]["finalizers"] if f != TRACKING_FINALIZER]
        if pod["metadata"].get("deletionTimestamp"):
            del self.kube.objects[("v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])]

    def _pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [p for k, p in self.kube.objects.items() if k[1] == "Pod" and
                any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])]

    def schedule(self) -> None:
        """The scheduler: a Pending pod without a node gets a Ready Spot GPU node no running pod holds."""
        nodes = [o for k, o in self.kube.objects.items() if k[1] == "Node" and _schedulable(o)]
        pods = [o for k, o in self.kube.objects.items() if k[1] == "Pod"]
        held = {p["spec"].get("nodeName") for p in pods if p["status"].get("phase") not in _TERMINAL}
        for pod in [p for p in pods if p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName")]:
            free = next((n for n in nodes if n["metadata"]["name"] not in held), None)
            if free is None:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]
                continue
            held.add(free["metadata"]["name"])
            pod["spec"]["nodeName"] = free["metadata"]["name"]
            pod["status"] = {"phase": "Running", "startTime": _NOW, "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": container_name(pod), "ready": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": _NOW}}}]}


def _pod_for(job: dict, index: int) -> dict:
    meta, template = job["metadata"], job["spec"]["template"]
    labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": meta["name"],
              "batch.kubernetes.io/job-name": meta["name"], INDEX_KEY: str(index),
              "controller-uid": meta["uid"], "batch.kubernetes.io/controller-uid": meta["uid"]}
    spec = {**template["spec"], "hostname": f"{meta['name']}-{index}"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}", "namespace": meta["namespace"],
                     "labels": labels, "annotations": {INDEX_KEY: str(index)}, "finalizers": [TRACKING_FINALIZER],
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _failure_action(spec: dict, pod: dict) -> str | None:
    """The first matching podFailurePolicy rule's action (the docs: rules are evaluated in order)."""
    conditions = {(c.get("type"), c.get("status")) for c in pod["status"].get("conditions") or []}
    code = _exit_code(pod)
    for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
        if any((c["type"], c.get("status", "True")) in conditions for c in rule.get("onPodConditions") or []):
            return rule["action"]
        exits = rule.get("onExitCodes")
        if exits and exits.get("containerName") not in (None, _failed_container(pod)):
            continue  # the docs: containerName restricts the rule to that container's exit code
        if exits and code is not None and code != 0 and \
                (code in exits["values"]) == (exits["operator"] == "In"):
            return rule["action"]
    return None


def container_name(pod: dict) -> str:
    """The kubelet reports each container's state under the name the pod spec gives it."""
    return pod["spec"]["containers"][0]["name"]


def _fail(pod: dict, code: int | None, condition: dict | None, reason: str = "Error") -> None:
    status = pod.setdefault("status", {})
    status["phase"] = "Failed"
    if code is not None:
        status["containerStatuses"] = [_terminated(container_name(pod), code, reason)]
    if condition is not None:
        status["conditions"] = [*status.get("conditions", []), {**condition, "lastTransitionTime": _NOW}]


def _terminated(name: str, code: int, reason: str) -> dict:
    return {"name": name, "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _NOW}}}


def _failed_container(pod: dict) -> str | None:
    for container in pod["status"].get("containerStatuses") or []:
        if (container.get("state") or {}).get("terminated") is not None:
            return container.get("name")
    return None


def _exit_code(pod: dict) -> int | None:
    for container in pod["status"].get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated is not None:
            return terminated.get("exitCode")
    return None


def _success_met(spec: dict, succeeded: list[int]) -> bool:
    rules = (spec.get("successPolicy") or {}).get("rules")
    if not rules:
        return len(succeeded) >= spec["completions"]
    for rule in rules:
        among = set(succeeded) & _parse_intervals(rule["succeededIndexes"]) if rule.get("succeededIndexes") \
            else set(succeeded)
        if rule.get("succeededIndexes") and rule.get("succeededCount") is None:
            if _parse_intervals(rule["succeededIndexes"]) <= set(succeeded):
                return True
        elif len(among) >= rule["succeededCount"]:
            return True
    return False


def _parse_intervals(text: str) -> set[int]:
    found = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        found |= set(range(int(low), int(high or low) + 1))
    return found


def _intervals(indexes: list[int]) -> str:
    """status.completedIndexes as the controller writes it: sorted, runs as ranges ("0,2-4")."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"][INDEX_KEY])


def _tracked(pod: dict) -> bool:
    return TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or [])


def _finished(job: dict) -> bool:
    return any(c["type"] in ("Complete", "Failed") for c in (job.get("status") or {}).get("conditions") or [])


def _schedulable(node: dict) -> bool:
    labels = node["metadata"].get("labels") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    return ready and labels.get("kubernetes.azure.com/scalesetpriority") == "spot" and \
        labels.get("kubernetes.azure.com/agentpool") == "gpu"
