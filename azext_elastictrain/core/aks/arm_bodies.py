"""Every ARM request the AKS backend sends, built from a ClusterSpec. Pure: no network, no SDK.

Bodies are the REST wire format (camelCase, as in the official x-ms-examples), so a unit test compares
them field by field with the examples and the test server checks the same fields on the wire.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from azext_elastictrain.core.constants import GPU_TAINT
from azext_elastictrain.core.aks.preflight import PoolHardware
from azext_elastictrain.core.spec import ENGINE_TORCHELASTIC, NODE_OS_UPGRADE_CHANNEL, SYSTEM_POOL, ClusterSpec

#: Built-in role: read, write and delete blobs and containers (no keys, no account management).
STORAGE_BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
#: Built-in role: every Kubernetes action in the whole cluster, through Azure RBAC (the Entra ID clusters' admin).
AKS_RBAC_CLUSTER_ADMIN = "b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b"
#: The data role the cluster's creator gets on the checkpoint container: the CLI reads events and checkpoints with the
#: user's own login (job show/list/wait, evict --wait, checkpoint list/show/verify/download) and deletes them on
#: `checkpoint prune` and `job delete --delete-checkpoints`, and Owner or Contributor of the subscription hold no
#: data actions. Reader would leave prune failing with 403; the creator can grant themselves any role on their own
#: account anyway, so Contributor on this one container is no new power, only the one the commands use.
CREATOR_DATA_ROLE = STORAGE_BLOB_DATA_CONTRIBUTOR
CREATOR_DATA_ROLE_NAME = "Storage Blob Data Contributor"
#: The audience Entra ID expects in a Kubernetes service account token exchanged by workload identity.
TOKEN_EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"
#: Marks the resources this extension made, so list and delete find only those.
TAG = "elastictrain"
# What the create records on the cluster (cluster_body writes them, spec_from_tags reads them back).
STORAGE_TAG, IDENTITY_TAG, ENGINE_TAG = TAG + "-storage", TAG + "-identity", TAG + "-engine"
SYSTEM_POOL_MIN, SYSTEM_POOL_MAX = 1, 3
#: Pods per node: Kubernetes' own default, sent so it is fixed at creation rather than the network plugin's (AKS
#: takes 10-250; a GPU node runs a few training pods and the daemon sets).
MAX_PODS = 110
#: The maintenance configurations AKS reads (reserved names): node image upgrades (nodeOSUpgradeChannel) and
#: Kubernetes upgrades (upgradeChannel). --maintenance-window sets both, so no upgrade drains nodes outside it.
NODE_OS_MAINTENANCE = "aksManagedNodeOSUpgradeSchedule"
AUTO_UPGRADE_MAINTENANCE = "aksManagedAutoUpgradeSchedule"


@dataclass(frozen=True)
class NodeHardware:
    """What the region's Resource SKUs say each pool's size allows (core.aks.preflight.pool_hardware); unknown (a dry
    run without login): nothing sent, AKS's defaults."""

    system: PoolHardware = field(default_factory=PoolHardware)
    gpu: PoolHardware = field(default_factory=PoolHardware)


def tags(spec: ClusterSpec) -> dict[str, str]:
    return {TAG: spec.name}


def blob_endpoint(account: dict[str, Any] | None, spec: ClusterSpec, storage_suffix: str) -> str:
    """The account's blob endpoint, no trailing slash: ARM's ``primaryEndpoints.blob`` (sovereign clouds and
    DNS-zone accounts have other hosts); before the account exists (a dry run), the cloud's usual host for it."""
    endpoint = (((account or {}).get("properties") or {}).get("primaryEndpoints") or {}).get("blob")
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


def role_definition_id(subscription: str, role: str = STORAGE_BLOB_DATA_CONTRIBUTOR) -> str:
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role}"


def role_assignment_name(scope: str, principal_id: str, role: str = STORAGE_BLOB_DATA_CONTRIBUTOR) -> str:
    """A stable name, so a re-run finds the assignment it made instead of adding another."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scope.lower()}|{principal_id.lower()}|{role.lower()}"))


def federated_credential_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-{spec.service_account}"[:120]


def service_account_subject(spec: ClusterSpec) -> str:
    return f"system:serviceaccount:{spec.namespace}:{spec.service_account}"


# --------------------------------------------------------------------------- request bodies


def resource_group(spec: ClusterSpec) -> dict[str, Any]:
    return {"location": spec.location, "tags": tags(spec)}


def storage_account(spec: ClusterSpec) -> dict[str, Any]:
    """StorageV2, HTTPS only, TLS 1.2, no anonymous blob access, no shared keys: Entra ID only.

    The network: open (Entra ID still decides who reads and writes) unless ``--storage-allow`` lists who may reach
    it, the nodes' subnet first; trusted Azure services pass either way (``bypass``; AKS's own are not among them).
    """
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
            "networkAcls": storage_network_rules(spec),
            "encryption": {
                "keySource": "Microsoft.Storage",
                "services": {"blob": {"enabled": True, "keyType": "Account"}},
            },
        },
    }


def storage_network_rules(spec: ClusterSpec) -> dict[str, Any]:
    rules: dict[str, Any] = {"bypass": "AzureServices", "defaultAction": "Deny" if spec.storage_allow else "Allow"}
    if spec.storage_allow:
        rules["virtualNetworkRules"] = [{"id": subnet, "action": "Allow"} for subnet in spec.storage_allowed_subnets]
        rules["ipRules"] = [{"value": ip, "action": "Allow"} for ip in spec.storage_allowed_ips]
    return rules


def blob_container(spec: ClusterSpec) -> dict[str, Any]:
    return {"properties": {"publicAccess": "None", "metadata": {TAG: spec.name}}}


def user_assigned_identity(spec: ClusterSpec) -> dict[str, Any]:
    return {"location": spec.location, "tags": tags(spec)}


def _pool_hardening(spec: ClusterSpec, hardware: PoolHardware) -> dict[str, Any]:
    """Fixed at a pool's creation (CREATION_ONLY_POOL_FIELDS): pods per node, the subnet, the OS disk (ephemeral:
    on the host, no remote disk to attach, re-image and boot faster), host encryption (temp disks and caches)."""
    fields: dict[str, Any] = {"maxPods": MAX_PODS}
    if spec.vnet_subnet:
        fields["vnetSubnetID"] = spec.vnet_subnet
    if hardware.os_disk_type:
        fields["osDiskType"] = hardware.os_disk_type
    if hardware.os_disk_gib:
        fields["osDiskSizeGB"] = hardware.os_disk_gib
    if hardware.encryption_at_host:
        fields["enableEncryptionAtHost"] = True
    return fields


def system_pool_profile(spec: ClusterSpec, hardware: PoolHardware | None = None) -> dict[str, Any]:
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
        **_pool_hardening(spec, hardware or PoolHardware()),
    }
    if spec.kubernetes_version:
        profile["orchestratorVersion"] = spec.kubernetes_version
    return profile


def managed_cluster(spec: ClusterSpec, hardware: NodeHardware | None = None) -> dict[str, Any]:
    """The AKS cluster with its system pool; OIDC issuer and workload identity on for keyless storage.

    Upgrades come by themselves: the node image weekly (security fixes, ``nodeOSUpgradeChannel``, in the maintenance
    window where one is given) and Kubernetes by ``--upgrade-channel`` (patch releases by default). An upgrade drains
    nodes, which an elastic job survives as it survives an eviction (it restarts from its last checkpoint).
    """
    hardware = hardware or NodeHardware()
    properties = {
        "dnsPrefix": spec.dns_prefix,
        "enableRBAC": True,
        "agentPoolProfiles": [system_pool_profile(spec, hardware.system)],
        "autoUpgradeProfile": {"upgradeChannel": spec.upgrade_channel, "nodeOSUpgradeChannel": NODE_OS_UPGRADE_CHANNEL},
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
    if spec.api_server_authorized_ips:
        properties["apiServerAccessProfile"] = {"authorizedIPRanges": list(spec.api_server_authorized_ips)}
    properties.update(access_profile(spec))
    return {
        "location": spec.location,
        # the names of the cluster's storage account and identity, for show and delete to find them; the engine
        # its jobs run on by default (`job run` reads it)
        "tags": {**tags(spec), STORAGE_TAG: spec.storage_account_name, IDENTITY_TAG: spec.identity_name,
                 ENGINE_TAG: spec.engine},
        "identity": {"type": "SystemAssigned"},
        "sku": {"name": "Base", "tier": "Free"},
        "properties": properties,
    }


def access_profile(spec: ClusterSpec) -> dict[str, Any]:
    """Who may reach the Kubernetes API. Default: Entra ID only - AKS-managed Entra ID with Azure RBAC deciding
    what each identity may do, and local accounts (the static client-certificate credentials, an unaudited
    admin back door) off. ``--local-accounts``: Kubernetes RBAC with local accounts, as without Entra ID.
    Field names as in the official example ManagedClustersCreate_UpdateWithEnableAzureRBAC (2025-10-01)."""
    if spec.local_accounts:
        return {"disableLocalAccounts": False}
    return {"aadProfile": {"managed": True, "enableAzureRBAC": True}, "disableLocalAccounts": True}


def gpu_agent_pool(spec: ClusterSpec, hardware: NodeHardware | None = None) -> dict[str, Any]:
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
        **_pool_hardening(spec, (hardware or NodeHardware()).gpu),
    }
    if spec.kubernetes_version:
        properties["orchestratorVersion"] = spec.kubernetes_version
    return {"properties": properties}


def maintenance_window(spec: ClusterSpec) -> dict[str, Any]:
    """The weekly window for AKS's upgrades (MaintenanceConfigurations_CreateOrUpdate), in UTC: the same body for
    node image upgrades and Kubernetes upgrades."""
    window = spec.maintenance()
    assert window is not None, "only planned with --maintenance-window"
    return {"properties": {"maintenanceWindow": {
        "schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": window.day}},
        "durationHours": window.hours, "utcOffset": "+00:00", "startTime": window.start}}}


def federated_credential(spec: ClusterSpec, issuer: str) -> dict[str, Any]:
    """Trust tokens of the training service account, issued by this cluster's OIDC issuer."""
    return {"properties": {"issuer": issuer, "subject": service_account_subject(spec),
                           "audiences": [TOKEN_EXCHANGE_AUDIENCE]}}


def role_assignment(subscription: str, principal_id: str) -> dict[str, Any]:
    return {"properties": {"roleDefinitionId": role_definition_id(subscription), "principalId": principal_id,
                           "principalType": "ServicePrincipal"}}


def cluster_admin_assignment(subscription: str, principal_id: str, principal_type: str | None) -> dict[str, Any]:
    """'Azure Kubernetes Service RBAC Cluster Admin' on the cluster for its creator (or --admin-principal).
    ``principal_type`` (User, ServicePrincipal) where known: it spares Azure a directory lookup that fails for a
    principal created moments ago; left out for an --admin-principal of unknown type."""
    properties = {"roleDefinitionId": role_definition_id(subscription, AKS_RBAC_CLUSTER_ADMIN),
                  "principalId": principal_id}
    if principal_type:
        properties["principalType"] = principal_type
    return {"properties": properties}


def checkpoint_access_assignment(subscription: str, principal_id: str, principal_type: str | None) -> dict[str, Any]:
    """``CREATOR_DATA_ROLE`` on the checkpoint container for the creator (the principal of the Kubernetes admin role,
    or --admin-principal): the role every blob read and delete of the CLI needs."""
    properties = {"roleDefinitionId": role_definition_id(subscription, CREATOR_DATA_ROLE), "principalId": principal_id}
    if principal_type:
        properties["principalType"] = principal_type
    return {"properties": properties}


def role_assignment_command(principal_id: str, scope: str, role: str = CREATOR_DATA_ROLE_NAME) -> str:
    """The az command that grants ``role`` at ``scope`` to a principal (what a 403 from blob tells the user)."""
    return f'az role assignment create --assignee {principal_id} --role "{role}" --scope {scope}'


# --------------------------------------------------------------------------- is what is there right?


#: Pool fields AKS takes only when it creates a pool: a PUT on an existing pool must carry what is there, so a pool
#: made before a default changed (or by hand) keeps them and is no drift for them.
CREATION_ONLY_POOL_FIELDS = ("osDiskType", "osDiskSizeGB", "enableEncryptionAtHost", "maxPods", "vnetSubnetID")


def as_existing(body: dict[str, Any], found: dict[str, Any] | None) -> dict[str, Any]:
    """``body`` for a resource that ``found`` is: the creation-only fields of its pools as they are there, and
    the Kubernetes versions as Azure has them where they already meet what was asked (``version_met``)."""
    if not found:
        return body
    import copy

    body = copy.deepcopy(body)
    props, there = body.get("properties") or {}, found.get("properties") or {}
    _keep_version(props, there, "kubernetesVersion")
    pools = [(props, there)] if "vmSize" in props else []  # an agent pool resource
    existing = {str(p.get("name", "")).lower(): p for p in there.get("agentPoolProfiles") or []}
    pools += [(p, existing[p["name"].lower()]) for p in props.get("agentPoolProfiles") or []
              if p.get("name", "").lower() in existing]
    for wanted, have in pools:
        for key in CREATION_ONLY_POOL_FIELDS:
            wanted.pop(key, None)
            if have.get(key) is not None:
                wanted[key] = have[key]
        _keep_version(wanted, have, "orchestratorVersion")
    return body


# --------------------------------------------------------------------------- Kubernetes versions, by intent

#: Version fields and the read-only field holding the version running now. AKS answers the asked field with the
#: patch it resolved or auto-upgraded to ("1.33" asked, "1.33.6" answered: Azure/AKS#3573,
#: Azure/terraform-azurerm-aks#335), so a string compare sees drift that is none.
VERSION_FIELDS = {"kubernetesVersion": "currentKubernetesVersion", "orchestratorVersion": "currentOrchestratorVersion"}


def parse_version(text: object) -> tuple[int, ...] | None:
    """'1.33' -> (1, 33); 'v1.33.6' -> (1, 33, 6); anything else None."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or "").strip())
    return tuple(int(part) for part in match.groups() if part is not None) if match else None


def azure_version(resource: dict[str, Any], key: str) -> str | None:
    """The higher of what ``resource`` says for ``key`` and the version it runs now (the current* field)."""
    values = [v for v in (resource.get(key), resource.get(VERSION_FIELDS[key])) if parse_version(v)]
    return str(max(values, key=lambda v: parse_version(v) or ())) if values else resource.get(key)


def version_met(asked: str, have: str | None) -> bool:
    """Whether Azure's ``have`` is what ``asked`` meant: the same or a later release at the precision asked.

    A minor pin ("1.33") is met by every 1.33 patch; a patch pin ("1.33.2") by 1.33.2 and the patches the
    upgrade channel brought after it; with channel stable or rapid, by the later minors AKS moved to. A lower
    version is not met (an upgrade to ask for); nothing is ever met by asking for less than Azure has: AKS
    refuses a downgrade.
    """
    wanted, actual = parse_version(asked), parse_version(have)
    if wanted is None or actual is None:
        return asked == have
    return actual[:len(wanted)] >= wanted


def _keep_version(wanted: dict[str, Any], have: dict[str, Any], key: str) -> None:
    """Send Azure's own version where it meets ours: never a lower one (a downgrade AKS refuses), no change."""
    actual = azure_version(have, key)
    if wanted.get(key) and actual and version_met(wanted[key], actual):
        wanted[key] = have.get(key) or actual


#: Lists where the service adds entries of its own: ours must be among Azure's, extra ones are not drift.
#: AKS adds ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule`` to the taints of every Spot pool.
SERVICE_EXTENDED_LISTS = frozenset({"nodeTaints"})
#: Values that are data, not ARM names: compared exactly (a label value or taint differing in case is another
#: one to Kubernetes; tags, the token subject and issuer are matched byte for byte by their consumers).
CASE_SENSITIVE = frozenset({"nodeTaints", "nodeLabels", "tags", "metadata", "subject", "issuer", "audiences"})


def differences(wanted: dict[str, Any], actual: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``wanted`` (what we PUT) that ``actual`` (what ARM answers) lacks or has otherwise.

    What each kind of field means, and so how it compares:

    * **Objects** (e.g. ``nodeLabels``, ``tags``, ``properties``): ours must be in Azure's; Azure adds read-only
      fields (provisioningState, powerState, nodeImageVersion, ...) and labels of its own (AKS's
      ``kubernetes.azure.com/scalesetpriority: spot``), which are not drift.
    * **Lists of objects with a name** (``agentPoolProfiles``): matched by name; a pool Azure has and we do
      not ask for (the GPU pool in a cluster GET) is not drift.
    * **Taints** (``SERVICE_EXTENDED_LISTS``): ours must be among Azure's: AKS adds the Spot taint. Our taint
      removed by someone is drift. Other lists (``audiences``) must be equal as sets: order carries no meaning.
    * **``count`` under autoscale**: the cluster autoscaler owns it between minCount and maxCount, so it is
      no drift where ``enableAutoScaling`` is on; min and max are ours and are compared.
    * **Strings**: ARM names, ids, locations and enum values are case-insensitive and come back in ARM's
      casing (``/resourcegroups/``, ``East US`` vs ``eastus``, ``spot``), so they compare without case and
      spaces; values in ``CASE_SENSITIVE`` fields are data and compare exactly.
    * **Numbers** compare by value (``-1`` and ``-1.0`` are one price); booleans only with booleans.
    * **Objects in lists** (storage network rules) compare as objects: Azure adds a ``state`` to each rule.
    * **Kubernetes versions** compare by intent (``version_met``): "1.33" is met by 1.33.6 after an auto-upgrade.
    """
    return _differences(wanted, actual, path, exact=False)


def _differences(wanted: dict[str, Any], actual: dict[str, Any], path: str, exact: bool) -> list[str]:
    found = []
    autoscaled = wanted.get("enableAutoScaling") is True
    for key, value in wanted.items():
        if key == "count" and autoscaled:
            continue  # the autoscaler's, not ours
        where = f"{path}.{key}" if path else key
        have = actual.get(key) if isinstance(actual, dict) else None
        key_exact = exact or key in CASE_SENSITIVE
        if key in VERSION_FIELDS and isinstance(value, str) and isinstance(actual, dict):
            if not version_met(value, azure_version(actual, key)):
                found.append(where)
        elif isinstance(value, dict):
            found += _differences(value, have if isinstance(have, dict) else {}, where, key_exact)
        elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
            named = {str(v.get("name")).lower(): v for v in have or [] if isinstance(v, dict)}
            for item in value:
                found += _differences(item, named.get(str(item["name"]).lower(), {}),
                                      f"{where}[{item['name']}]", key_exact)
        elif isinstance(value, list):
            if not _same_list(value, have, subset=key in SERVICE_EXTENDED_LISTS, exact=key_exact):
                found.append(where)
        elif not _same(value, have, exact=key_exact):
            found.append(where)
    return found


def _same_list(wanted: list[Any], actual: Any, *, subset: bool, exact: bool) -> bool:
    if not isinstance(actual, list):
        return not wanted and actual is None  # an empty list we want and ARM leaves out
    ours = [next((a for a in actual if _same(w, a, exact=exact)), None) for w in wanted]
    if any(match is None for match in ours):
        return False
    return subset or len(actual) == len(wanted)


def same_value(wanted: Any, actual: Any) -> bool:
    """One value as ``differences`` compares it: ARM names without case, numbers by value."""
    return _same(wanted, actual)


def _same(wanted: Any, actual: Any, *, exact: bool = False) -> bool:
    if isinstance(wanted, dict) and isinstance(actual, dict):  # a list entry: ours in Azure's (it adds read-only
        return not _differences(wanted, actual, "", exact)    # fields, e.g. a network rule's state)
    if isinstance(wanted, str) and isinstance(actual, str):
        if exact:
            return wanted == actual
        return wanted.replace(" ", "").lower() == actual.replace(" ", "").lower()
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return wanted is actual
    if isinstance(wanted, (int, float)) and isinstance(actual, (int, float)):
        return float(wanted) == float(actual)
    return bool(wanted == actual)


# --------------------------------------------------------------------------- updates: GET -> merge ours -> PUT

#: Kinds whose PUT replaces the whole resource: a field left out is reset (a cluster's add-ons, a pool's labels).
#: AKS has dropped its own ``kubernetes.azure.com/scalesetpriority`` label on a pool PUT that did not carry it
#: (Azure/AKS#3152), and then no worker's required node affinity matched.
MERGED_KINDS = frozenset({"cluster", "agent_pool"})


def merged_update(body: dict[str, Any], found: dict[str, Any] | None) -> dict[str, Any]:
    """What to PUT on a resource that exists: Azure's resource with ours merged in, as ``az aks update`` builds its
    PUT from a GET. What the user or AKS set outside this tool stays (other add-ons, tags, labels, AKS's Spot label
    and taint); what we ask for wins.

    * objects merge key by key, ours over Azure's (``nodeLabels``: Azure's labels plus ours);
    * ``nodeTaints``: ours, then Azure's others (AKS's Spot taint, a user's);
    * named lists (``agentPoolProfiles``): only our entries are sent, each merged with Azure's of that name;
    * ``count`` of an autoscaled pool: Azure's (the autoscaler owns it);
    * other lists and values: ours.

    Read-only fields of ``found`` stay in the result: the ARM client drops them by the SDK model, as the SDK does
    for ``az aks update``.
    """
    if not found:
        return body
    return _merge(body, found)


def _merge(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    import copy

    merged = copy.deepcopy(theirs)
    autoscaled = ours.get("enableAutoScaling") is True and theirs.get("enableAutoScaling") is True
    for key, value in ours.items():
        have = theirs.get(key)
        if key == "count" and autoscaled and have is not None:
            continue
        if isinstance(value, dict) and isinstance(have, dict):
            merged[key] = _merge(value, have)
        elif key in SERVICE_EXTENDED_LISTS and isinstance(value, list) and isinstance(have, list):
            merged[key] = list(value) + [v for v in have if v not in value]
        elif isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value) \
                and isinstance(have, list):
            named = {str(v.get("name")).lower(): v for v in have if isinstance(v, dict)}
            merged[key] = [_merge(item, named[str(item["name"]).lower()]) if str(item["name"]).lower() in named
                           else copy.deepcopy(item) for item in value]
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def spec_from_tags(spec: ClusterSpec, cluster: dict[str, Any]) -> ClusterSpec:
    """What the create recorded on the cluster (storage account, identity, engine), for show, delete and jobs.
    A cluster made before the engine was recorded runs the operator: torchelastic."""
    recorded = cluster.get("tags") or {}
    return replace(spec, storage_account=recorded.get(STORAGE_TAG) or spec.storage_account,
                   identity=recorded.get(IDENTITY_TAG) or spec.identity,
                   engine=recorded.get(ENGINE_TAG) or ENGINE_TORCHELASTIC)
