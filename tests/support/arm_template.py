"""The planned ARM requests of ``cluster create --dry-run`` as an ARM deployment template, for checkov.

checkov's ARM runner scans templates (``$schema`` ``.../deploymentTemplate.json#`` with ``resources``), not
request bodies, so each planned PUT becomes the template resource that would deploy the same body: its
``type`` and ``name`` come from the resource id (``Microsoft.Storage/storageAccounts/blobServices/containers``
and ``account/default/container``), its ``apiVersion`` is the one the SDK sends (the test server's table), an
extension resource (the role assignment) gets its ``scope``. The resource group itself is where the template
is deployed, so it is no resource of it.
"""
from __future__ import annotations

from tests.support.arm_server import API_VERSIONS

SCHEMA = "https://schema.management.azure.com/schemas/2019-04-01/deploymentTemplate.json#"


def template(plan: dict) -> dict:
    """An ARM template of the plan's ``arm`` requests (the dry run's output)."""
    resources = []
    for request in plan["arm"]:
        type_, name, scope = _type_and_name(request["id"])
        if type_ is None:
            continue  # the resource group
        resource = {"type": type_, "apiVersion": API_VERSIONS[type_.split("/")[0]], "name": name,
                    **request["body"]}
        if scope:
            resource["scope"] = scope
        resources.append(resource)
    return {"$schema": SCHEMA, "contentVersion": "1.0.0.0", "resources": resources}


def _type_and_name(resource_id: str) -> tuple[str | None, str, str]:
    """(type, name, scope) of a resource id; type None for a resource group."""
    head, sep, tail = resource_id.rpartition("/providers/")
    if not sep:
        return None, "", ""
    parts = tail.split("/")
    namespace, rest = parts[0], parts[1:]
    types, names = rest[0::2], rest[1::2]
    # an extension resource sits on another resource: its scope is that resource's id
    scope = head if "/providers/" in head else ""
    return "/".join([namespace, *types]), "/".join(names), scope
