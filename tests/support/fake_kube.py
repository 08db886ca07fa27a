"""The one fake Kubernetes of the tests: :class:`FakeKube` implements ``clients.kube.KubeClient`` in memory, and
``tests/support/kube_apiserver.py`` serves the same object over HTTP(S) to the real client (alone, or as an AKS
cluster's API server behind tests/support/arm_server/).

It keeps objects by (apiVersion, kind, namespace, name) and answers as an API server does for what the
extension does: server-side apply creates or merges (resourceVersion bumps only on a change, generation
only on a spec change), get returns None for what is missing, list filters by namespace and label selector,
delete reports whether there was something. As strict as the API server where we rely on it:

* kinds are served as discovery says: the built-in ones, and a custom kind once its CustomResourceDefinition is
  there (before, apply is a 404, get None, list empty, as the real client reports them);
* an object sent is typed with its kind's official schema (kubernetes-validate) or its CRD's openAPIV3Schema, as
  server-side apply does: an undeclared field fails (500, see fake_workloads), a wrong type is a 422 ``Invalid``;
  so are the names the API server refuses (``validate_name``) and what its validation refuses in Jobs
  (fake_jobs.validate) and in Deployments, Services and NetworkPolicies (fake_workloads.problems);
* a field another manager owns (``take_fields``) is a 409 conflict unless the apply forces, and an apply that
  names a resourceVersion other than the object's is a 409 (optimistic concurrency).

Tests seed state the cluster would produce itself (nodes, pods, status of workloads) with
:meth:`FakeKube.seed` and :meth:`FakeKube.set_status`, and make calls fail with :meth:`FakeKube.fail`. Every
call is recorded in ``calls``.

    kube = FakeKube()
    kube.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "aks-gpu-0", "labels": {...}}})
    install(kube, spec)
    kube.set_status("apps/v1", "StatefulSet", "elastictrain-etcd", "elastictrain", {"readyReplicas": 1})
"""
from __future__ import annotations

import copy
import itertools
import re
import threading
import time
import uuid
from typing import Any, Iterator

from azext_elastictrain.clients.kube import FIELD_MANAGER, KubeError
from tests.support import fake_workloads
from tests.support.fake_jobs import JOB, JobController, validate
from tests.support.fake_operator import ElasticJobOperator

# Kinds without a namespace; everything else must be given one.
CLUSTER_SCOPED = frozenset({
    "Namespace", "Node", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
    "PersistentVolume", "StorageClass",
})

Key = tuple[str, str, str | None, str]

#: What the API server serves without a CustomResourceDefinition: group/version -> kinds.
BUILT_IN = {
    "v1": ("Namespace", "ServiceAccount", "ConfigMap", "Secret", "Service", "Pod", "Node"),
    "apps/v1": ("StatefulSet", "Deployment", "DaemonSet"),
    "rbac.authorization.k8s.io/v1": ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    "networking.k8s.io/v1": ("NetworkPolicy",),
    "apiextensions.k8s.io/v1": ("CustomResourceDefinition",),
    "batch/v1": ("Job",),
    "scheduling.k8s.io/v1": ("PriorityClass",),
}
#: The Kubernetes version the fake is (what /version answers and the schemas objects are checked against).
VERSION = "1.33.2"
CRD = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


class FakeKube:
    """A ``KubeClient`` backed by a dict; see the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.calls: list[tuple[str, str, str | None, str | None]] = []  # (verb, kind, namespace, name)
        self._versions = itertools.count(1)
        self._failures: dict[tuple[str, str, str | None], KubeError] = {}
        self.logs: dict[tuple[str, str, str | None], str] = {}  # (namespace, pod, container or None) -> its log
        self.owners: dict[Key, dict[str, str]] = {}  # fields of an object other managers own: field -> manager
        self.lock = threading.RLock()  # one request at a time, as the HTTP fronts serve several at once
        self.jobs = JobController(self)  # batch/v1 Jobs: admission here, the controller when a test steps it
        self.operator = ElasticJobOperator(self)  # the TorchElastic controller, when a test steps it

    # -- KubeClient -----------------------------------------------------------
    def apply(self, obj: dict, *, field_manager: str = FIELD_MANAGER, force: bool = False) -> dict:
        meta = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        with self.lock:
            self._record("apply", key)
            if not self.served(obj["apiVersion"], obj["kind"]):
                raise KubeError(f"cannot apply {obj['kind']} {meta['name']}: the cluster does not serve "
                                f"{obj['kind']} in {obj['apiVersion']} (is its CustomResourceDefinition "
                                "installed?)", status=404, reason="NotFound")
            current = self.objects.get(key)
            if current is None:
                validate_name(obj)
            self._validate_schema(obj)
            if key[:2] == JOB:
                validate(obj)
            if key[:2] in fake_workloads.CHECKED:
                causes = [_cause_of(field, message) for field, message in fake_workloads.problems(obj, current)]
                if causes:
                    raise Invalid(obj["kind"], meta["name"], causes)
            self._check_concurrency(key, obj, current, field_manager, force)
            if current is None:
                created = copy.deepcopy(obj)
                created.pop("status", None)  # status is the cluster's to write
                created["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=self._next_version(),
                                           generation=1, creationTimestamp="2026-01-01T00:00:00Z")
                self.objects[key] = created
                return copy.deepcopy(created)
            merged = _merge(current, {k: v for k, v in obj.items() if k != "status"})
            merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if merged != current:
                merged["metadata"]["resourceVersion"] = self._next_version()
                if merged.get("spec") != current.get("spec"):
                    merged["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
                self.objects[key] = merged
            return copy.deepcopy(self.objects[key])

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        key = self._key(api_version, kind, name, namespace)
        with self.lock:
            self._record("get", key)
            found = self.objects.get(key) if self.served(api_version, kind) else None
            return copy.deepcopy(found) if found is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict]:
        self._raise_if_failing("list", kind, None)
        self.calls.append(("list", kind, namespace, None))
        if not self.served(api_version, kind):
            return []
        with self.lock:
            return [copy.deepcopy(o) for (v, k, ns, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                    if v == api_version and k == kind and (namespace is None or ns == namespace or k in CLUSTER_SCOPED)
                    and _matches(o, label_selector)]

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        key = self._key(api_version, kind, name, namespace)
        self._record("delete", key)
        if not self.served(api_version, kind):
            return False
        with self.lock:
            gone = self.objects.pop(key, None)
            self.owners.pop(key, None)
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
        text = self.logs.get((namespace, name, container))
        lines = (self.logs.get((namespace, name, None), "") if text is None else text).splitlines()
        return iter(lines if tail is None else lines[max(0, len(lines) - tail):])

    def watch(self, api_version: str, kind: str, name: str, namespace: str | None = None,
              timeout: float = 60.0) -> Iterator[tuple[str, dict]]:
        """ADDED with the object as it is, then MODIFIED at each new resourceVersion and DELETED when it goes,
        until ``timeout`` seconds passed (0: the first event only, as an API server may end a watch at once)."""
        key = self._key(api_version, kind, name, namespace)
        self._record("watch", key)
        if not self.served(api_version, kind):
            return
        deadline = time.monotonic() + timeout
        seen = self.get(api_version, kind, name, namespace)
        if seen is not None:
            yield "ADDED", seen
        while time.monotonic() < deadline:
            time.sleep(0.02)
            with self.lock:
                now = copy.deepcopy(self.objects.get(key))
            if now is None and seen is not None:
                yield "DELETED", seen
            elif now is not None and (seen is None or now["metadata"]["resourceVersion"] !=
                                      seen["metadata"]["resourceVersion"]):
                yield ("ADDED" if seen is None else "MODIFIED"), now
            seen = now

    # -- discovery -----------------------------------------------------------------
    def kinds(self, api_version: str) -> tuple[str, ...]:
        """The kinds served in ``api_version``: built in, or defined by a CustomResourceDefinition here."""
        return BUILT_IN.get(api_version, ()) + tuple(
            kind for (version, kind), _ in self._custom_kinds().items() if version == api_version)

    def served(self, api_version: str, kind: str) -> bool:
        return kind in self.kinds(api_version)

    def group_versions(self) -> list[str]:
        return list(BUILT_IN) + sorted({version for version, _ in self._custom_kinds()} - set(BUILT_IN))

    def _custom_kinds(self) -> dict[tuple[str, str], dict]:
        """(group/version, kind) -> the schema of each kind a CustomResourceDefinition here defines."""
        found = {}
        for (version, kind, _, _), crd in list(self.objects.items()):
            if (version, kind) != CRD:
                continue
            spec = crd.get("spec") or {}
            for served in spec.get("versions") or []:
                if served.get("served"):
                    found[(f"{spec['group']}/{served['name']}", spec["names"]["kind"])] = (
                        (served.get("schema") or {}).get("openAPIV3Schema") or {})
        return found

    def _validate_schema(self, obj: dict) -> None:
        """Refuse what server-side apply cannot type with the kind's schema (the official one, or its CRD's): a
        field the schema does not declare (500, as fake_workloads.check_schema says why) or a wrong type (422)."""
        custom = self._custom_kinds().get((obj["apiVersion"], obj["kind"]))
        if custom is None:
            fake_workloads.check_schema(obj)  # the kind's official schema
            return
        problem = _custom_problem(obj, custom)
        if problem and problem[2]:
            meta = obj["metadata"]
            raise KubeError(f"failed to create typed patch object ({meta.get('namespace')}/{meta['name']}; "
                            f"{obj['apiVersion']}, Kind={obj['kind']}): .{problem[0]}: field not declared in schema",
                            status=500, reason="InternalError")
        if problem:
            raise Invalid(obj["kind"], obj["metadata"]["name"], [{"reason": "FieldValueInvalid",
                                                                  "message": problem[1], "field": problem[0]}])

    def _check_concurrency(self, key: Key, obj: dict, current: dict | None, manager: str, force: bool) -> None:
        asked = (obj.get("metadata") or {}).get("resourceVersion")
        if current is not None and asked and asked != current["metadata"]["resourceVersion"]:
            raise KubeError(f'Operation cannot be fulfilled on {obj["kind"]} "{key[3]}": the object has been '
                            "modified; please apply your changes to the latest version and try again",
                            status=409, reason="Conflict")
        owned = self.owners.get(key) or {}
        taken = [f for f, owner in owned.items() if owner != manager and _field(obj, f) is not None
                 and _field(obj, f) != _field(current or {}, f)]
        if taken and not force:
            raise KubeError(f"Apply failed with {len(taken)} conflict: " + "; ".join(
                f'conflict with "{owned[f]}": .{f}' for f in taken), status=409, reason="Conflict")
        for f in taken:
            del owned[f]

    # -- what the cluster itself would do ------------------------------------------
    def set_logs(self, pod: str, namespace: str, text: str, container: str | None = None) -> None:
        """What the pod's container (any container: None) printed so far."""
        self.logs[(namespace, pod, container)] = text

    def take_fields(self, api_version: str, kind: str, name: str, namespace: str | None, manager: str,
                    fields: list[str]) -> None:
        """Another field manager (someone's ``kubectl edit``) owns these dotted fields of the object now."""
        self.owners.setdefault(self._key(api_version, kind, name, namespace), {}).update(
            {f: manager for f in fields})

    def seed(self, obj: dict) -> dict:
        """Put an object as it is, status included (nodes, pods, workloads with a status)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = self._next_version()
        self.objects[self._key(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))] = obj
        return copy.deepcopy(obj)

    def with_operator_crd(self) -> "FakeKube":
        """The cluster as ``cluster create`` leaves it for the TorchElastic engine: the product's ElasticJob
        CustomResourceDefinition is there (without it, the API server serves no ElasticJob)."""
        from azext_elastictrain.core.aks import manifests

        crd = next(o for o in manifests.load_base_objects(manifests.ENGINE_TORCHELASTIC)
                   if o["kind"] == "CustomResourceDefinition")
        if self._key(crd["apiVersion"], crd["kind"], crd["metadata"]["name"], None) not in self.objects:
            self.seed(crd)
        return self

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
        self._version = next(self._versions)
        return str(self._version)

    def resource_version(self) -> int:
        """The newest resourceVersion given out (what a list answers with)."""
        return getattr(self, "_version", 0)


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


def _custom_problem(obj: dict, schema: dict) -> tuple[str, str, bool] | None:
    """Against a CRD's structural schema: (field, message, whether the field is undeclared) of the first problem.
    Server-side apply types the body with the schema, so an undeclared field fails as for a built-in kind
    (fake_workloads.check_schema) unless the schema preserves unknown fields there."""
    import jsonschema

    def closed(node: dict) -> dict:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
        node = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
        if "properties" in node:
            node["properties"] = {k: closed(v) for k, v in node["properties"].items()}
            node.setdefault("additionalProperties", False)
        if isinstance(node.get("items"), dict):
            node["items"] = closed(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = closed(node["additionalProperties"])
        return node

    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    props = {k: closed(v) for k, v in (schema.get("properties") or {}).items()
             if k not in ("apiVersion", "kind", "metadata", "status")}
    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(
        {"type": "object", "properties": props, "additionalProperties": False}).iter_errors(body))
    if error is None:
        return None
    undeclared = re.search(r"'([^']+)' was unexpected", error.message) if error.validator == "additionalProperties" \
        else None
    where = ".".join(map(str, error.path))
    if undeclared:
        return ".".join(filter(None, [where, undeclared[1]])), error.message, True
    return where or "<root>", error.message, False


def _field(obj: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


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
