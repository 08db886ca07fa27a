"""An in-memory Kubernetes for tests: :class:`FakeKube` implements ``clients.kube.KubeClient``.

It keeps objects by (apiVersion, kind, namespace, name) and answers like an API server would for what the
extension does: server-side apply creates or merges (resourceVersion bumps only on a change, generation
only on a spec change), get returns None for what is missing, list filters by namespace and label selector,
delete reports whether there was something. Tests seed state the cluster would produce itself (nodes,
pods, status of workloads) with :meth:`FakeKube.seed` and :meth:`FakeKube.set_status`, and make calls fail
with :meth:`FakeKube.fail`. Every call is recorded in ``calls``.

    kube = FakeKube()
    kube.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "aks-gpu-0", "labels": {...}}})
    install(kube, spec)
    kube.set_status("apps/v1", "StatefulSet", "elastictrain-etcd", "elastictrain", {"readyReplicas": 1})
"""
from __future__ import annotations

import copy
import itertools
import re
import uuid
from typing import Any, Iterator

from azext_elastictrain.clients.kube import KubeError
from tests.support import fake_workloads
from tests.support.fake_jobs import JOB, JobController, validate
from tests.support.fake_operator import ElasticJobOperator

# Kinds without a namespace; everything else must be given one.
CLUSTER_SCOPED = frozenset({
    "Namespace", "Node", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
    "PersistentVolume", "StorageClass",
})

Key = tuple[str, str, str | None, str]


class FakeKube:
    """A ``KubeClient`` backed by a dict; see the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.calls: list[tuple[str, str, str | None, str | None]] = []  # (verb, kind, namespace, name)
        self._versions = itertools.count(1)
        self._failures: dict[tuple[str, str, str | None], KubeError] = {}
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> what its worker container printed
        self.jobs = JobController(self)  # batch/v1 Jobs: admission here, the controller when a test steps it
        self.operator = ElasticJobOperator(self)  # the TorchElastic controller, when a test steps it

    # -- KubeClient -----------------------------------------------------------
    def apply(self, obj: dict) -> dict:
        meta = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        self._record("apply", key)
        current = self.objects.get(key)
        if current is None:
            validate_name(obj)
        if key[:2] == JOB:
            validate(obj)
        if key[:2] in fake_workloads.CHECKED:
            fake_workloads.check_schema(obj)
            causes = [_cause_of(field, message) for field, message in fake_workloads.problems(obj, current)]
            if causes:
                raise Invalid(obj["kind"], meta["name"], causes)
        if current is None:
            created = copy.deepcopy(obj)
            created.pop("status", None)  # status is the cluster's to write
            created["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=self._next_version(), generation=1,
                                       creationTimestamp="2026-01-01T00:00:00Z")
            self.objects[key] = created
            return copy.deepcopy(created)
        merged = _merge(current, {k: v for k, v in obj.items() if k != "status"})
        if merged != current:
            merged["metadata"]["resourceVersion"] = self._next_version()
            if merged.get("spec") != current.get("spec"):
                merged["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            self.objects[key] = merged
        return copy.deepcopy(self.objects[key])

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        key = self._key(api_version, kind, name, namespace)
        self._record("get", key)
        found = self.objects.get(key)
        return copy.deepcopy(found) if found is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        self._raise_if_failing("list", kind, None)
        self.calls.append(("list", kind, namespace, None))
        return [copy.deepcopy(o) for (v, k, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                if v == api_version and k == kind and (namespace is None or ns == namespace or k in CLUSTER_SCOPED)
                and _matches(o, label_selector)]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        key = self._key(api_version, kind, name, namespace)
        self._record("delete", key)
        gone = self.objects.pop(key, None)
        if gone is not None and key[:2] == JOB:  # propagationPolicy Background: the garbage collector's part
            uid = gone["metadata"]["uid"]
            for owned in [k for k, o in self.objects.items() if k[1] == "Pod" and
                          any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]:
                del self.objects[owned]
        return gone is not None

    def pod_logs(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
                 tail: int | None = None) -> Iterator[str]:
        """The stored log of a pod that exists (``set_logs``); followed, it ends as if the container exited."""
        key = self._key("v1", "Pod", name, namespace)
        self._record("logs", key)
        if key not in self.objects:
            raise KubeError(f"read the log of Pod {namespace}/{name} failed: HTTP 404 NotFound: "
                            f'pods "{name}" not found', status=404, reason="NotFound")
        lines = self.logs.get((namespace, name), "").splitlines()
        return iter(lines if tail is None else lines[max(0, len(lines) - tail):])

    # -- what the cluster itself would do ------------------------------------------
    def set_logs(self, pod: str, namespace: str, text: str) -> None:
        """What the pod's container printed so far."""
        self.logs[(namespace, pod)] = text

    def seed(self, obj: dict) -> dict:
        """Put an object as it is, status included (nodes, pods, workloads with a status)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_version()
        self.objects[self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))] = obj
        return copy.deepcopy(obj)

    def set_status(self, api_version: str, kind: str, name: str, namespace: str | None, status: dict) -> None:
        """Replace an existing object's status, as its controller would."""
        obj = self.objects[self._key(api_version, kind, name, namespace)]
        obj["status"] = copy.deepcopy(status)
        obj["metadata"]["resourceVersion"] = self._next_version()

    def fail(self, verb: str, kind: str, name: str | None = None, error: KubeError | None = None) -> None:
        """Make ``verb`` (apply/get/list/delete) on ``kind`` (``name``, or any) raise ``error`` from now on."""
        self._failures[(verb, kind, name)] = error or KubeError(f"{verb} {kind} failed: HTTP 500", status=500)

    # -- helpers -------------------------------------------------------------------
    def _key(self, api_version: str, kind: str, name: str, namespace: str | None) -> Key:
        if kind in CLUSTER_SCOPED:
            return (api_version, kind, None, name)
        if not namespace:
            raise ValueError(f"{kind} {name!r} is namespaced: give its namespace")
        return (api_version, kind, namespace, name)

    def _record(self, verb: str, key: Key) -> None:
        self._raise_if_failing(verb, key[1], key[3])
        self.calls.append((verb, key[1], key[2], key[3]))

    def _raise_if_failing(self, verb: str, kind: str, name: str | None) -> None:
        error = self._failures.get((verb, kind, name)) or self._failures.get((verb, kind, None))
        if error is not None:
            raise error

    def _next_version(self) -> str:
        return str(next(self._versions))


# k8s.io/apimachinery pkg/util/validation: the regexes and messages the API server answers with.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1035_MESSAGE = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
                    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")


class Invalid(KubeError):
    """HTTP 422 ``Invalid``, with the ``details`` (kind, name, causes) of the API server's Status body."""

    def __init__(self, kind: str, name: str, causes: list[dict]) -> None:
        group = {"Job": "Job.batch"}.get(kind, kind)
        text = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        super().__init__(f'{group} "{name}" is invalid: {text}', status=422, reason="Invalid")
        self.details = {"name": name, **({"group": "batch"} if kind == "Job" else {}), "kind": kind,
                        "causes": causes}


def validate_name(obj: dict) -> None:
    """Refuse a name as the API server's create does, for the kinds our jobs make (source: kubernetes
    pkg/apis/core/validation ValidateService - metadata.name is a DNS-1035 label, ValidateServiceName - and
    pkg/apis/batch/validation ValidateJob: the job-name label of its pods is at most 63 characters and, for an
    Indexed Job, the hostname of its highest index, ``<name>-<completions-1>``, is a DNS-1123 label)."""
    kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name") or ""
    causes = []
    if kind == "Service":
        if len(name) > 63:
            causes.append(_cause("metadata.name", name, "must be no more than 63 characters"))
        if not _DNS1035_LABEL.fullmatch(name):
            causes.append(_cause("metadata.name", name, _DNS1035_MESSAGE))
    elif kind == "Job":
        spec = obj.get("spec") or {}
        if len(name) > 63:
            causes.append(_cause("spec.template.labels", name, "must be no more than 63 characters"))
        if spec.get("completionMode") == "Indexed" and (spec.get("completions") or 0) > 0:
            hostname = f"{name}-{spec['completions'] - 1}"
            if len(hostname) > 63 or not _DNS1123_LABEL.fullmatch(hostname):
                causes.append(_cause("metadata.name", name, "will not able to create pod with invalid DNS label: "
                                     + hostname))
    if causes:
        raise Invalid(kind, name, causes)


def _cause_of(field: str, message: str) -> dict:
    return {"reason": "FieldValueInvalid", "message": message, "field": field}


def _cause(field: str, value: str, message: str) -> dict:
    return {"reason": "FieldValueInvalid", "message": f'Invalid value: "{value}": {message}', "field": field}


def _merge(current: dict, applied: dict) -> dict:
    """Server-side apply, roughly: applied fields win, maps merge, lists are replaced."""
    merged = copy.deepcopy(current)
    for key, value in applied.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _matches(obj: dict, selector: str | None) -> bool:
    """Equality-based selectors: ``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, comma-separated."""
    labels: dict[str, Any] = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            ok = labels.get(key.strip()) != value.strip()
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            ok = labels.get(key.strip()) == value.strip()
        elif term.startswith("!"):
            ok = term[1:] not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True
