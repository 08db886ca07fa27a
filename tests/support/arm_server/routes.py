"""How the ARM test server reads a request: the resource kind of a path, its provider's api-version, error bodies,
and the official examples and SDK schemas bodies are checked against."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


#: api-version each provider's SDK sends, as azure-cli 2.91 builds its clients (profile 'latest' or the SDK's
#: default where the profile has none). tests/unit/test_api_versions.py checks these against the SDKs.
API_VERSIONS = {
    "Microsoft.Resources": "2024-11-01",
    "Microsoft.Storage": "2025-08-01",
    "Microsoft.ManagedIdentity": "2024-11-30",
    "Microsoft.ContainerService": "2026-06-01",
    "Microsoft.Authorization": "2022-04-01",
    "subscriptions": "2022-12-01",
    "Microsoft.Compute": "2024-11-01",  # virtual_machine_scale_set_vms under azure-cli's compute profile
    "Microsoft.Compute/skus": "2019-04-01",  # resource_skus: the profile pins its own
    "Microsoft.Compute/usages": "2024-11-01",  # usage: the profile's default for compute
    "Microsoft.Features": "2021-07-01",  # features: azure-cli's profile for MGMT_RESOURCE_FEATURES
}


#: InProgress answers before Succeeded, by default. The first poll (after the Retry-After: 1 s of the operation's
#: start) answers Succeeded, as Azure does an operation done by then; the client must still poll once (an operation
#: nobody polls stays Creating). ``ArmServer.lro_polls`` per test: test_cluster_azure.py's create runs with 1, each
#: InProgress answer a second Retry-After: 1 s (at 1 for every test, the contract phase spent ~20% of its time there).
LRO_POLLS = 0


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def _error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _arm_casing(rid: str) -> str:
    """AKS answers ids with ``resourcegroups`` in lower case (AgentPoolsList.json), not as the request had it."""
    return re.sub(r"/resourceGroups/", "/resourcegroups/", rid, flags=re.IGNORECASE)


EXAMPLES = Path(__file__).resolve().parents[2] / "data" / "arm-examples"


def is_query(raw_path: str) -> bool:
    """A Resource Graph query: a POST that reads (a dry run may send it; it changes nothing)."""
    return urlsplit(raw_path).path.rstrip("/").lower() == "/providers/microsoft.resourcegraph/resources"


def _example_body(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())["responses"]["200"]["body"]


#: The SDK model each PUT body must fit (tests.support.sdk_schema): the generated models of the providers whose SDK
#: carries field visibility (azure-mgmt-containerservice, azure-mgmt-storage).
_SCHEMAS = {"cluster": ("azure.mgmt.containerservice.models", "ManagedCluster"),
            "agent_pool": ("azure.mgmt.containerservice.models", "AgentPool"),
            "maintenance_configuration": ("azure.mgmt.containerservice.models", "MaintenanceConfiguration"),
            "storage_account": ("azure.mgmt.storage.models", "StorageAccountCreateParameters"),
            "container": ("azure.mgmt.storage.models", "BlobContainer")}


def _schema_problems(kind: str, body: dict) -> list[str]:
    """Fields the SDK model of ``kind`` lacks or holds read-only: ARM refuses unknown properties (400)."""
    import importlib

    from tests.support.sdk_schema import problems

    if kind not in _SCHEMAS:
        return []
    module, name = _SCHEMAS[kind]
    return problems(body, getattr(importlib.import_module(module), name))


_PATTERNS = [  # (kind, path regex after /subscriptions/{sub})
    ("storage_name", r"/providers/microsoft\.storage/checknameavailability"),
    ("skus", r"/providers/microsoft\.compute/skus"),
    ("usages", r"/providers/microsoft\.compute/locations/[^/]+/usages"),
    ("resource_group", r"/resourcegroups/[^/]+"),
    ("storage_account", r"/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+"),
    ("container", r"/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+/blobservices/default/"
                  r"containers/[^/]+"),
    ("identity", r"/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/[^/]+"),
    ("federated_credential", r"/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/"
                             r"[^/]+/federatedidentitycredentials/[^/]+"),
    ("cluster", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+"),
    ("cluster_list", r"(/resourcegroups/[^/]+)?/providers/microsoft\.containerservice/managedclusters"),
    ("agent_pool", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                   r"agentpools/[^/]+"),
    ("credentials", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                    r"listclusterusercredential"),
    ("maintenance_configuration", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/"
                                  r"[^/]+/maintenanceconfigurations/[^/]+"),
    ("feature", r"/providers/microsoft\.features/providers/[^/]+/features/[^/]+"),
    ("admin_credentials", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                          r"listclusteradmincredential"),
    ("role_assignment", r"/.+/providers/microsoft\.authorization/roleassignments/[^/]+"),
    ("vmss_vm_list", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                     r"virtualmachines"),
    ("vmss_vm", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                r"virtualmachines/\d+"),
    ("vmss_vm_eviction", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                         r"virtualmachines/\d+/simulateeviction"),
]


_PROVIDER = {"resource_group": "Microsoft.Resources", "storage_account": "Microsoft.Storage",
             "storage_name": "Microsoft.Storage",
             "container": "Microsoft.Storage", "identity": "Microsoft.ManagedIdentity",
             "federated_credential": "Microsoft.ManagedIdentity", "cluster": "Microsoft.ContainerService",
             "cluster_list": "Microsoft.ContainerService", "agent_pool": "Microsoft.ContainerService",
             "credentials": "Microsoft.ContainerService", "admin_credentials": "Microsoft.ContainerService",
             "role_assignment": "Microsoft.Authorization",
             "maintenance_configuration": "Microsoft.ContainerService", "feature": "Microsoft.Features",
             "skus": "Microsoft.Compute/skus", "usages": "Microsoft.Compute/usages",
             "vmss_vm_list": "Microsoft.Compute", "vmss_vm": "Microsoft.Compute", "vmss_vm_eviction": "Microsoft.Compute"}


_TYPE = {"resource_group": "Microsoft.Resources/resourceGroups", "storage_account": "Microsoft.Storage/storageAccounts",
         "container": "Microsoft.Storage/storageAccounts/blobServices/containers",
         "identity": "Microsoft.ManagedIdentity/userAssignedIdentities",
         "federated_credential": "Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials",
         "cluster": "Microsoft.ContainerService/ManagedClusters",
         "agent_pool": "Microsoft.ContainerService/managedClusters/agentPools",
         "maintenance_configuration": "Microsoft.ContainerService/managedClusters/maintenanceConfigurations",
         "role_assignment": "Microsoft.Authorization/roleAssignments"}


def _kind(path: str) -> str | None:
    rest = path.lower().rstrip("/").split("/", 3)[3] if path.count("/") >= 3 else ""
    rest = "/" + rest
    for kind, pattern in _PATTERNS:
        if kind == "role_assignment":
            if re.fullmatch(pattern, rest) and "/resourcegroups/" in rest:
                return kind
        elif re.fullmatch(pattern, rest):
            return kind
    return None
