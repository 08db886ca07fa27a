"""Install and check what az elastictrain runs inside an AKS cluster, through a :class:`KubeClient`.

``install`` applies the rendered objects in order (server-side apply, so a re-run changes nothing that is
already right); ``health`` reports each component as ok, degraded or missing, with why.
"""
from __future__ import annotations

from typing import Any, Callable

from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.ports import KubeClient
from azext_elastictrain.core.spec import ENGINE_TORCHELASTIC

OK, DEGRADED, MISSING = "ok", "degraded", "missing"


def install(client: KubeClient, spec: m.InClusterSpec,
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Apply every in-cluster object for ``spec``; one summary per object: kind, name, namespace, action.

    ``action`` is created, configured (something changed) or unchanged (same resourceVersion as before).
    """
    summary = []
    for obj in m.render_cluster_objects(spec):
        meta = obj["metadata"]
        before = client.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        after = client.apply(obj)
        action = _action(before, after)
        if progress:
            progress(f"{m.object_key(obj)}: {action}")
        summary.append({"kind": obj["kind"], "name": meta["name"], "namespace": meta.get("namespace"),
                        "action": action})
    return summary


def _action(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    if before is None:
        return "created"
    version = (before.get("metadata") or {}).get("resourceVersion")
    return "unchanged" if version == (after.get("metadata") or {}).get("resourceVersion") else "configured"


def health(client: KubeClient, spec: m.InClusterSpec) -> dict[str, Any]:
    """Each component's state (ok/degraded/missing) and reason, and ``state``: the worst of them."""
    ns = spec.namespace
    operator = spec.engine == ENGINE_TORCHELASTIC  # k8s-job's jobs need no operator: none installed or checked
    components = {}
    if operator:
        components["elasticjob-crd"] = _crd(client.get("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                                       m.ELASTICJOB_CRD))
    components["etcd"] = _statefulset(client.get("apps/v1", "StatefulSet", m.ETCD_NAME, ns))
    if operator:
        components["operator"] = _deployment(client.get("apps/v1", "Deployment", m.OPERATOR_DEPLOYMENT, ns))
    components["nvidia-device-plugin"] = _daemonset(client.get("apps/v1", "DaemonSet", m.DEVICE_PLUGIN_DAEMONSET,
                                                               ns))
    states = [c["state"] for c in components.values()]
    worst = MISSING if MISSING in states else DEGRADED if DEGRADED in states else OK
    return {"state": worst, "components": components}


def _state(state: str, reason: str) -> dict[str, Any]:
    return {"state": state, "reason": reason}


def _crd(crd: dict[str, Any] | None) -> dict[str, Any]:
    if crd is None:
        return _state(MISSING, f"CustomResourceDefinition {m.ELASTICJOB_CRD} is not installed")
    conditions = _conditions(crd)
    if conditions.get("Established", {}).get("status") == "True":
        return _state(OK, "established")
    names = conditions.get("NamesAccepted", {})
    if names.get("status") == "False":
        return _state(DEGRADED, f"names not accepted: {names.get('message') or names.get('reason')}")
    return _state(DEGRADED, "not established yet")


def _statefulset(sts: dict[str, Any] | None) -> dict[str, Any]:
    if sts is None:
        return _state(MISSING, f"StatefulSet {m.ETCD_NAME} is not installed")
    want = (sts.get("spec") or {}).get("replicas", 1)
    ready = (sts.get("status") or {}).get("readyReplicas", 0)
    return _state(OK if ready >= want else DEGRADED, f"{ready}/{want} replicas ready")


def _deployment(deployment: dict[str, Any] | None) -> dict[str, Any]:
    if deployment is None:
        return _state(MISSING, f"Deployment {m.OPERATOR_DEPLOYMENT} is not installed")
    available = _conditions(deployment).get("Available", {})
    if available.get("status") == "True":
        return _state(OK, "available")
    why = available.get("message") or available.get("reason") or "no available replica yet"
    return _state(DEGRADED, f"not available: {why}")


def _daemonset(daemonset: dict[str, Any] | None) -> dict[str, Any]:
    if daemonset is None:
        return _state(MISSING, f"DaemonSet {m.DEVICE_PLUGIN_DAEMONSET} is not installed")
    status = daemonset.get("status") or {}
    desired, ready = status.get("desiredNumberScheduled", 0), status.get("numberReady", 0)
    if desired == 0:
        # The Spot GPU pool scales to zero between jobs: no GPU node, nothing to run on, nothing wrong.
        return _state(OK, "no GPU nodes right now (0/0 ready)")
    return _state(OK if ready >= desired else DEGRADED, f"{ready}/{desired} GPU nodes ready")


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}
