"""What the API server refuses in the Deployments, Services and NetworkPolicies we apply (an in-process job's
coordinator; the cluster's etcd and operator), so FakeKube refuses the same (``problems``).

Two layers, as the real server has them:
- the schema: server-side apply turns the body into a typed object with the kind's OpenAPI schema, and a field
  the schema does not declare fails that ("failed to create typed patch object (...): .spec.foo: field not
  declared in schema", HTTP 500 until kubernetes#139255: kubernetes#122480 shows it); a value of the wrong type is
  refused as Invalid. Checked against the official schema of the newest Kubernetes kubernetes-validate knows.
- validation (kubernetes pkg/apis/apps/validation ValidateDeployment, pkg/apis/core/validation ValidateService,
  validateContainerPorts, pkg/apis/networking/validation ValidateNetworkPolicy), for the fields we send:
  a Deployment needs a non-empty selector that matches its template's labels, restartPolicy Always, replicas
  >= 0, no rollingUpdate with Recreate, and its selector is immutable; a Service that is not headless needs
  ports, several ports need unique names, ports are 1-65535 over TCP/UDP/SCTP, a named targetPort and every
  container port name is an IANA service name (<= 15 characters, lowercase letters, digits and '-', a letter
  at least); a NetworkPolicy's policyTypes are Ingress/Egress.
Not modelled: defaulting, status, quota and admission webhooks.
"""
from __future__ import annotations

import re
from typing import Any

from azext_elastictrain.clients.kube import KubeError

CHECKED = {("apps/v1", "Deployment"), ("v1", "Service"), ("networking.k8s.io/v1", "NetworkPolicy")}
_IANA_SVC_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_PROTOCOLS = ("TCP", "UDP", "SCTP")


def check_schema(obj: dict) -> None:
    """Refuse what server-side apply cannot type: an undeclared field (500) or a wrong type (422)."""
    import kubernetes_validate

    meta = obj.get("metadata") or {}
    try:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as ex:
        where = "." + ".".join(str(p) for p in ex.path)
        gvk = f"{obj['apiVersion']}, Kind={obj['kind']}"
        if ex.validator == "additionalProperties":
            field = re.search(r"'([^']+)' was unexpected", ex.message)
            raise KubeError(f"failed to create typed patch object ({meta.get('namespace')}/{meta.get('name')}; "
                            f"{gvk}): {where}.{field[1] if field else '?'}: field not declared in schema",
                            status=500, reason="InternalError") from ex
        raise KubeError(f'{obj["kind"]} "{meta.get("name")}" is invalid: {where}: {ex.message}', status=422,
                        reason="Invalid") from ex


def problems(obj: dict, current: dict | None) -> list[tuple[str, str]]:
    """(field, message) of each rule of the API server's validation ``obj`` breaks (``current``: the stored one)."""
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    found: list[tuple[str, str]] = []
    if kind == "Deployment":
        found += _deployment(spec, (current or {}).get("spec"))
        for i, container in enumerate(((spec.get("template") or {}).get("spec") or {}).get("containers") or []):
            found += _container_ports(container, f"spec.template.spec.containers[{i}]")
    elif kind == "Service":
        found += _service(spec)
    elif kind == "NetworkPolicy":
        found += [("spec.policyTypes", f'Unsupported value: "{t}": supported values: "Ingress", "Egress"')
                  for t in spec.get("policyTypes") or [] if t not in ("Ingress", "Egress")]
    return found


def _deployment(spec: dict, stored: dict | None) -> list[tuple[str, str]]:
    found = []
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not spec.get("selector"):
        found.append(("spec.selector", "Required value"))
    elif not selector and not (spec.get("selector") or {}).get("matchExpressions"):
        found.append(("spec.selector", "Invalid value: empty selector is invalid for deployment"))
    elif any(labels.get(k) != v for k, v in selector.items()):
        found.append(("spec.template.metadata.labels", "Invalid value: `selector` does not match template `labels`"))
    if (template.get("spec") or {}).get("restartPolicy", "Always") != "Always":
        found.append(("spec.template.spec.restartPolicy", 'Unsupported value: supported values: "Always"'))
    if (spec.get("replicas") or 0) < 0:
        found.append(("spec.replicas", "Invalid value: must be greater than or equal to 0"))
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate" and strategy.get("rollingUpdate") is not None:
        found.append(("spec.strategy.rollingUpdate", "Forbidden: may not be specified when strategy `type` is "
                                                     "'Recreate'"))
    if stored is not None and stored.get("selector") != spec.get("selector"):
        found.append(("spec.selector", "Invalid value: field is immutable"))
    return found


def _service(spec: dict) -> list[tuple[str, str]]:
    found = []
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None" and spec.get("type") != "ExternalName":
        found.append(("spec.ports", "Required value"))
    names = [p.get("name") for p in ports]
    for i, port in enumerate(ports):
        where = f"spec.ports[{i}]"
        if len(ports) > 1 and not port.get("name"):
            found.append((f"{where}.name", "Required value"))
        elif port.get("name") and not _DNS1123_LABEL.fullmatch(port["name"]):
            found.append((f"{where}.name", f'Invalid value: "{port["name"]}": must be a DNS-1123 label'))
        if port.get("name") and names.count(port["name"]) > 1:
            found.append((f"{where}.name", f'Duplicate value: "{port["name"]}"'))
        if not 1 <= (port.get("port") or 0) <= 65535:
            found.append((f"{where}.port", "Invalid value: must be between 1 and 65535, inclusive"))
        if port.get("protocol", "TCP") not in _PROTOCOLS:
            found.append((f"{where}.protocol", 'Unsupported value: supported values: "SCTP", "TCP", "UDP"'))
        found += _port_name_or_number(port.get("targetPort"), f"{where}.targetPort")
    return found


def _container_ports(container: dict, where: str) -> list[tuple[str, str]]:
    found = []
    ports = container.get("ports") or []
    names = [p.get("name") for p in ports if p.get("name")]
    for i, port in enumerate(ports):
        if port.get("name") is not None:
            found += _port_name_or_number(port["name"], f"{where}.ports[{i}].name")
            if names.count(port["name"]) > 1:
                found.append((f"{where}.ports[{i}].name", f'Duplicate value: "{port["name"]}"'))
        if not 1 <= (port.get("containerPort") or 0) <= 65535:
            found.append((f"{where}.ports[{i}].containerPort", "Invalid value: must be between 1 and 65535"))
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        for action in ("tcpSocket", "httpGet"):
            port = ((container.get(probe) or {}).get(action) or {}).get("port")
            found += _port_name_or_number(port, f"{where}.{probe}.{action}.port")
    return found


def _port_name_or_number(value: Any, where: str) -> list[tuple[str, str]]:
    """validation.IsValidPortName (an IANA_SVC_NAME) for a name, 1-65535 for a number."""
    if value is None:
        return []
    if isinstance(value, int):
        return [] if 1 <= value <= 65535 else [(where, "Invalid value: must be between 1 and 65535, inclusive")]
    ok = (len(value) <= 15 and _IANA_SVC_NAME.fullmatch(value) is not None and "--" not in value
          and re.search(r"[a-z]", value) is not None)
    return [] if ok else [(where, f'Invalid value: "{value}": must be an IANA_SVC_NAME (at most 15 characters, '
                                  "matching regex [a-z0-9]([a-z0-9-]*[a-z0-9])*, it must contain at least one letter "
                                  "[a-z], and hyphens cannot be adjacent to other hyphens)")]
