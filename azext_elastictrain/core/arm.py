"""Every ARM request the AKS backend sends, built from a ClusterSpec. Pure: no network, no SDK.

Bodies are the REST wire format (camelCase, as in the official x-ms-examples), so a unit test compares
them field by field with the examples and the test server checks the same fields on the wire.
"""
from __future__ import annotations

import uuid

from azext_elastictrain.core.spec import GPU_TAINT, SYSTEM_POOL, ClusterSpec

#: Built-in role: read, write and delete blobs and containers (no keys, no account management).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
#: The audience Entra ID expects in a Kubernetes service account token exchanged by workload identity.
TOKEN_EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
#: Marks the resources this extension made, so list and delete find only those.
TAG = "elastictrain"
SYSTEM_POOL_MIN, SYSTEM_POOL_MAX = 1, 3


def tags(spec: ClusterSpec) -> dict[str, str]:
    return {TAG: spec.name}


def blob_endpoint(storage_account: dict | None, spec: ClusterSpec, storage_suffix: str) -> str:
    """The account's blob endpoint, no trailing slash: ARM's ``primaryEndpoints.blob`` (sovereign clouds and
    DNS-zone accounts have other hosts); before the account exists (a dry run), the cloud's usual host for it."""
    endpoint = (((storage_account or {}).get("properties") or {}).get("primaryEndpoints") or {}).get("blob")
    return (endpoint or f"https://{spec.storage_account_name}.blob.{storage_suffix}").rstrip("/")


# --------------------------------------------------------------------------- resource ids


def resource_group_id(subscription: str, spec: ClusterSpec) -> str:
    return f"/subscriptions/{subscription}/resourceGroups/{spec.resource_group}"


def storage_account_id(subscription: str, spec: ClusterSpec) -> str:
    return (f"{resource_group_id(subscription, spec)}/providers/Microsoft.Storage/storageAccounts/"
            f"{spec.storage_account_name}")


def container_id(subscription: str, spec: ClusterSpec) -> str:
    return f"{storage_account_id(subscription, spec)}/blobServices/default/containers/{spec.container}"


def identity_id(subscription: str, spec: ClusterSpec) -> str:
    return (f"{resource_group_id(subscription, spec)}/providers/Microsoft.ManagedIdentity/"
            f"userAssignedIdentities/{spec.identity_name}")


def cluster_id(subscription: str, spec: ClusterSpec) -> str:
    return (f"{resource_group_id(subscription, spec)}/providers/Microsoft.ContainerService/managedClusters/"
            f"{spec.name}")


def role_definition_id(subscription: str) -> str:
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/" \
           f"{STORAGE_BLOB_DATA_CONTRIBUTOR}"


def role_assignment_name(scope: str, principal_id: str, role: str = STORAGE_BLOB_DATA_CONTRIBUTOR) -> str:
    """A stable name, so a re-run finds the assignment it made instead of adding another."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scope.lower()}|{principal_id.lower()}|{role.lower()}"))


def federated_credential_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-{spec.service_account}"[:120]


def service_account_subject(spec: ClusterSpec) -> str:
    return f"system:serviceaccount:{spec.namespace}:{spec.service_account}"


# --------------------------------------------------------------------------- request bodies


def resource_group(spec: ClusterSpec) -> dict:
    return {"location": spec.location, "tags": tags(spec)}


def storage_account(spec: ClusterSpec) -> dict:
    """StorageV2, HTTPS only, TLS 1.2, no anonymous blob access, no shared keys: Entra ID only."""
    return {
        "sku": {"name": spec.storage_sku},
        "kind": "StorageV2",
        "location": spec.location,
        "tags": tags(spec),
        "properties": {
            "supportsHttpsTrafficOnly": True,
            "minimumTlsVersion": "TLS1_2",
            "allowBlobPublicAccess": False,
            "allowSharedKeyAccess": False,
            "defaultToOAuthAuthentication": True,
            "accessTier": "Hot",
            "encryption": {
                "keySource": "Microsoft.Storage",
                "services": {"blob": {"enabled": True, "keyType": "Account"}},
            },
        },
    }


def blob_container(spec: ClusterSpec) -> dict:
    return {"properties": {"publicAccess": "None", "metadata": {TAG: spec.name}}}


def user_assigned_identity(spec: ClusterSpec) -> dict:
    return {"location": spec.location, "tags": tags(spec)}


def system_pool_profile(spec: ClusterSpec) -> dict:
    """The CPU pool: runs etcd and the operator, so it is never Spot (they must survive evictions)."""
    profile = {
        "name": SYSTEM_POOL,
        "mode": "System",
        "type": "VirtualMachineScaleSets",
        "osType": "Linux",
        "vmSize": spec.system_vm_size,
        "count": SYSTEM_POOL_MIN,
        "enableAutoScaling": True,
        "minCount": SYSTEM_POOL_MIN,
        "maxCount": SYSTEM_POOL_MAX,
    }
    if spec.kubernetes_version:
        profile["orchestratorVersion"] = spec.kubernetes_version
    return profile


def managed_cluster(spec: ClusterSpec) -> dict:
    """The AKS cluster with its system pool; OIDC issuer and workload identity on for keyless storage."""
    properties = {
        "dnsPrefix": spec.dns_prefix,
        "enableRBAC": True,
        "agentPoolProfiles": [system_pool_profile(spec)],
        "oidcIssuerProfile": {"enabled": True},
        "securityProfile": {"workloadIdentity": {"enabled": True}},
        # A network policy engine, so the NetworkPolicy that admits only training workers to etcd is
        # enforced (without one Kubernetes stores it and enforces nothing). Azure CNI overlay with the
        # Cilium dataplane is AKS's current default recommendation; it is fixed at creation.
        "networkProfile": {"networkPlugin": "azure", "networkPluginMode": "overlay",
                           "networkDataplane": "cilium", "networkPolicy": "cilium"},
    }
    if spec.kubernetes_version:
        properties["kubernetesVersion"] = spec.kubernetes_version
    return {
        "location": spec.location,
        # the names of the cluster's storage account and identity, for show and delete to find them
        "tags": {**tags(spec), TAG + "-storage": spec.storage_account_name, TAG + "-identity": spec.identity_name},
        "identity": {"type": "SystemAssigned"},
        "sku": {"name": "Base", "tier": "Free"},
        "properties": properties,
    }


def gpu_agent_pool(spec: ClusterSpec) -> dict:
    """The GPU Spot pool: autoscaled from --min-count (0: no cost while idle) to --max-count.

    Only pods that tolerate ``sku=gpu:NoSchedule`` (the training workers, the device plugin) land here;
    AKS adds its own ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule`` taint on top.
    """
    properties = {
        "mode": "User",
        "type": "VirtualMachineScaleSets",
        "osType": "Linux",
        "vmSize": spec.gpu_vm_size,
        "count": spec.min_count,
        "enableAutoScaling": True,
        "minCount": spec.min_count,
        "maxCount": spec.max_count,
        "scaleSetPriority": "Spot",
        "scaleSetEvictionPolicy": spec.eviction_policy,
        "spotMaxPrice": spec.spot_max_price,
        "nodeTaints": [GPU_TAINT],
        "nodeLabels": spec.gpu_labels(),
        "tags": tags(spec),
    }
    if spec.kubernetes_version:
        properties["orchestratorVersion"] = spec.kubernetes_version
    return {"properties": properties}


def federated_credential(spec: ClusterSpec, issuer: str) -> dict:
    """Trust tokens of the training service account, issued by this cluster's OIDC issuer."""
    return {"properties": {"issuer": issuer, "subject": service_account_subject(spec),
                           "audiences": [TOKEN_EXCHANGE_AUDIENCE]}}


def role_assignment(subscription: str, principal_id: str) -> dict:
    return {"properties": {"roleDefinitionId": role_definition_id(subscription), "principalId": principal_id,
                           "principalType": "ServicePrincipal"}}


# --------------------------------------------------------------------------- is what is there right?


def differences(wanted: dict, actual: dict, path: str = "") -> list[str]:
    """Fields of ``wanted`` that ``actual`` lacks or has otherwise (``actual`` may have more fields).

    Lists of dicts are matched by their ``name``; other lists must be equal. Strings compare
    case-insensitively where ARM normalises case (locations, enum values).
    """
    found = []
    for key, value in wanted.items():
        where = f"{path}.{key}" if path else key
        have = actual.get(key) if isinstance(actual, dict) else None
        if isinstance(value, dict):
            found += differences(value, have if isinstance(have, dict) else {}, where)
        elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
            named = {v.get("name"): v for v in have or [] if isinstance(v, dict)}
            for item in value:
                found += differences(item, named.get(item["name"], {}), f"{where}[{item['name']}]")
        elif not _same(value, have):
            found.append(where)
    return found


def _same(wanted, actual) -> bool:
    if isinstance(wanted, str) and isinstance(actual, str):
        return wanted.replace(" ", "").lower() == actual.replace(" ", "").lower()
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return wanted is actual
    if isinstance(wanted, (int, float)) and isinstance(actual, (int, float)):
        return float(wanted) == float(actual)
    return wanted == actual
