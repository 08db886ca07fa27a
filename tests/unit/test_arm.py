"""Every ARM body core/aks/arm_bodies.py builds, compared field by field with the official x-ms-examples.

The examples are copied verbatim under tests/data/arm-examples (README there: source paths, api-versions). Three checks:
the security and Spot values are exactly what the issue asks; every field we send is named as in the
official examples or, where the examples do not show it, as in the installed SDK's models (so a typo in a
field name cannot reach Azure, where it would be silently ignored); and the shapes match the examples.
"""
from __future__ import annotations

import functools
import json
import re
import uuid
from pathlib import Path

import pytest

from azext_elastictrain.core.aks import arm_bodies as arm
from azext_elastictrain.core.spec import ClusterSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "arm-examples"
SUB = "00000000-0000-0000-0000-000000000000"
SPEC = ClusterSpec("spot-train", "ml-rg", "eastus", kubernetes_version="1.33", node_labels=(("team", "vision"),))


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def paths(obj, prefix: str = "") -> set[str]:
    """Field paths of a JSON object; list items share '[]', free-form maps (tags, labels) stop at the map."""
    out = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if prefix.rsplit(".", 1)[-1] in ("tags", "nodeLabels", "userAssignedIdentities", "metadata"):
                continue
            path = f"{prefix}.{key}" if prefix else key
            out.add(path)
            out |= paths(value, path)
    elif isinstance(obj, list):
        for item in obj:
            out |= paths(item, prefix + "[]")
    return out


def example_paths(*names: str) -> set[str]:
    found = set()
    for name in names:
        ex = example(name)
        params = ex["parameters"]
        found |= paths(next((v for v in params.values() if isinstance(v, dict)), {}))
        for response in ex["responses"].values():
            body = response.get("body") or {}
            for item in body.get("value", [body]) if isinstance(body, dict) else []:
                found |= paths(item)
    return found


@functools.lru_cache(maxsize=None)
def sdk_field_names(package: str) -> frozenset[str]:
    """Every quoted name in the installed SDK's models: the REST field names it knows."""
    import importlib

    module = importlib.import_module(package)
    folder = Path(module.__file__).parent
    files = [p for p in folder.rglob("*.py") if ("models" in p.name or p.name == "types.py")
             and "/aio/" not in str(p)]
    text = "".join(p.read_text(errors="replace") for p in files)
    # msrest models: {'key': 'properties.issuer'}; typespec models: rest_field(name="x") or the attribute
    # itself, and types.py / docstrings list REST names as ':ivar name:'
    return frozenset(re.findall(r"""["']([A-Za-z][A-Za-z0-9]*)["']""", text)) | frozenset(
        n for key in re.findall(r"""'key': '([A-Za-z0-9.]+)'""", text) for n in key.split(".")) | frozenset(
        re.findall(r":ivar ([A-Za-z][A-Za-z0-9]*):", text))


def assert_named_like_azure(body: dict, examples: tuple[str, ...], sdk: str) -> None:
    known = example_paths(*examples)
    names = sdk_field_names(sdk)
    for path in sorted(paths(body)):
        if path in known:
            continue
        leaf = path.rsplit(".", 1)[-1].rstrip("[]")
        assert leaf in names, f"{path}: neither in the official examples {examples} nor a field of {sdk}"


def test_resource_group_body_is_the_example_shape():
    body = arm.resource_group(SPEC)
    assert body == {"location": "eastus", "tags": {"elastictrain": "spot-train"}}
    assert paths(body) - {"tags"} <= example_paths("CreateResourceGroup.json")


def test_storage_account_is_private_https_tls12_without_shared_keys():
    body = arm.storage_account(SPEC)
    props = body["properties"]
    assert (body["kind"], body["sku"]) == ("StorageV2", {"name": "Standard_LRS"})
    assert (props["supportsHttpsTrafficOnly"], props["minimumTlsVersion"], props["allowBlobPublicAccess"],
            props["allowSharedKeyAccess"]) == (True, "TLS1_2", False, False)
    ex = example("StorageAccountCreate.json")["parameters"]["parameters"]
    assert props["minimumTlsVersion"] == ex["properties"]["minimumTlsVersion"]
    assert props["encryption"]["services"]["blob"] == ex["properties"]["encryption"]["services"]["blob"]
    assert_named_like_azure(body, ("StorageAccountCreate.json", "StorageAccountGetProperties.json"),
                            "azure.mgmt.storage")


def test_container_is_private():
    body = arm.blob_container(SPEC)
    assert body["properties"]["publicAccess"] == "None"
    assert_named_like_azure(body, ("BlobContainersPut.json", "BlobContainersGet.json"), "azure.mgmt.storage")


def test_identity_body_is_the_example_shape():
    body = arm.user_assigned_identity(SPEC)
    ex = example("IdentityCreate.json")["parameters"]["parameters"]
    assert set(body) == set(ex) and body["location"] == "eastus"


def test_managed_cluster_records_what_show_delete_and_job_run_read_back():
    from dataclasses import replace

    assert arm.managed_cluster(SPEC)["tags"] == {
        "elastictrain": SPEC.name, "elastictrain-storage": SPEC.storage_account_name,
        "elastictrain-identity": SPEC.identity_name, "elastictrain-engine": "torchelastic"}
    assert arm.managed_cluster(replace(SPEC, engine="k8s-job"))["tags"]["elastictrain-engine"] == "k8s-job"


def test_managed_cluster_has_an_autoscaled_regular_system_pool_oidc_and_workload_identity():
    body = arm.managed_cluster(SPEC)
    props = body["properties"]
    (system,) = props["agentPoolProfiles"]
    assert (system["mode"], system["enableAutoScaling"], system["minCount"], system["maxCount"]) == (
        "System", True, 1, 3)
    assert "scaleSetPriority" not in system, "the system pool runs etcd and the operator: never Spot"
    assert props["oidcIssuerProfile"] == {"enabled": True}
    assert props["securityProfile"] == {"workloadIdentity": {"enabled": True}}
    assert props["networkProfile"]["networkPolicy"] == "cilium", "etcd's NetworkPolicy needs an engine to enforce it"
    assert props["kubernetesVersion"] == "1.33" and props["enableRBAC"] is True
    ex = example("ManagedClustersCreate_Update.json")["parameters"]["parameters"]
    assert (system["type"], system["osType"]) == (ex["properties"]["agentPoolProfiles"][0]["type"],
                                                  ex["properties"]["agentPoolProfiles"][0]["osType"])
    assert_named_like_azure(body, ("ManagedClustersCreate_Update.json", "ManagedClustersGet.json"),
                            "azure.mgmt.containerservice")


def test_gpu_pool_is_spot_autoscaled_from_zero_and_tainted():
    body = arm.gpu_agent_pool(SPEC)
    props = body["properties"]
    ex = example("AgentPoolsCreate_Spot.json")
    ex_props = ex["parameters"]["parameters"]["properties"]
    assert (props["scaleSetPriority"], props["scaleSetEvictionPolicy"]) == (
        ex_props["scaleSetPriority"], ex_props["scaleSetEvictionPolicy"]) == ("Spot", "Delete")
    assert props["spotMaxPrice"] == ex["responses"]["200"]["body"]["properties"]["spotMaxPrice"] == -1
    assert (props["enableAutoScaling"], props["minCount"], props["maxCount"], props["count"]) == (True, 0, 3, 0)
    assert props["nodeTaints"] == ["sku=gpu:NoSchedule"] and props["mode"] == "User"
    assert props["nodeLabels"]["team"] == "vision" and props["vmSize"] == "Standard_NC4as_T4_v3"
    assert_named_like_azure(body, ("AgentPoolsCreate_Spot.json", "AgentPoolsGet.json", "AgentPoolsList.json"),
                            "azure.mgmt.containerservice")


def test_gpu_pool_carries_a_chosen_price_and_policy():
    props = arm.gpu_agent_pool(ClusterSpec("c", "rg", "eastus", max_price="0.12345", eviction_policy="Deallocate",
                                           min_count=1, max_count=8))["properties"]
    assert (props["spotMaxPrice"], props["scaleSetEvictionPolicy"], props["count"], props["maxCount"]) == (
        0.12345, "Deallocate", 1, 8)


def test_federated_credential_trusts_the_training_service_account():
    body = arm.federated_credential(SPEC, "https://eastus.oic.prod-aks.azure.com/t/i/")
    ex = example("FederatedIdentityCredentialCreate.json")["parameters"]["parameters"]
    assert set(body["properties"]) == set(ex["properties"])
    assert body["properties"]["audiences"] == ex["properties"]["audiences"]
    assert body["properties"]["subject"] == "system:serviceaccount:elastictrain:elastictrain-training"


def test_role_assignment_is_blob_data_contributor_on_the_container_with_a_stable_name():
    body = arm.role_assignment(SUB, "ce2ce14e-85d7-4629-bdbc-454d0519d987")
    ex = example("RoleAssignments_CreateForResource.json")["parameters"]["parameters"]
    assert set(body["properties"]) == set(ex["properties"])
    assert re.fullmatch(r"/subscriptions/[^/]+/providers/Microsoft\.Authorization/roleDefinitions/[0-9a-f-]{36}",
                        ex["properties"]["roleDefinitionId"])
    assert body["properties"]["roleDefinitionId"].endswith("/roleDefinitions/ba92f5b4-2d11-453d-a403-e96b0029c9fe")
    assert body["properties"]["principalType"] == "ServicePrincipal"
    scope = arm.container_id(SUB, SPEC)
    assert scope.endswith(f"/storageAccounts/{SPEC.storage_account_name}/blobServices/default/containers/checkpoints")
    name = arm.role_assignment_name(scope, "p1")
    assert uuid.UUID(name) and name == arm.role_assignment_name(scope.upper(), "P1") != arm.role_assignment_name(
        scope, "p2")


def test_differences_ignore_what_azure_adds_and_name_what_is_wrong():
    wanted = {"location": "eastus", "properties": {"minCount": 0, "agentPoolProfiles": [{"name": "s", "maxCount": 3}],
                                                   "allowSharedKeyAccess": False}}
    actual = {"location": "East US", "id": "x", "properties": {"minCount": 0.0, "provisioningState": "Succeeded",
                                                               "agentPoolProfiles": [{"name": "s", "maxCount": 5}],
                                                               "allowSharedKeyAccess": None}}
    assert arm.differences(wanted, actual) == ["properties.agentPoolProfiles[s].maxCount",
                                               "properties.allowSharedKeyAccess"]


def test_managed_cluster_is_entra_id_only_by_default():
    """As the official example ManagedClustersCreate_UpdateWithEnableAzureRBAC.json (aks/stable/2025-10-01) sends
    it - ``aadProfile: {managed: true, enableAzureRBAC: true}`` - with local accounts off; field names also checked
    against the installed SDK's models (a misspelt one would be ignored by Azure, silently)."""
    from dataclasses import replace

    body = arm.managed_cluster(SPEC)
    props = body["properties"]
    assert props["aadProfile"] == {"managed": True, "enableAzureRBAC": True}
    assert props["disableLocalAccounts"] is True and props["enableRBAC"] is True
    assert_named_like_azure(body, ("ManagedClustersCreate_Update.json", "ManagedClustersGet.json"),
                            "azure.mgmt.containerservice")
    local = arm.managed_cluster(replace(SPEC, local_accounts=True))["properties"]
    assert local["disableLocalAccounts"] is False and "aadProfile" not in local


def test_cluster_admin_role_is_the_aks_rbac_cluster_admin_on_the_cluster_with_a_stable_name():
    scope = arm.cluster_id(SUB, SPEC)
    principal = str(uuid.uuid4())
    body = arm.cluster_admin_assignment(SUB, principal, "User")
    assert body == {"properties": {
        "roleDefinitionId": f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleDefinitions/"
                            "b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b",  # Azure Kubernetes Service RBAC Cluster Admin
        "principalId": principal, "principalType": "User"}}
    assert "principalType" not in arm.cluster_admin_assignment(SUB, principal, None)["properties"]
    name = arm.role_assignment_name(scope, principal, arm.AKS_RBAC_CLUSTER_ADMIN)
    assert name == arm.role_assignment_name(scope.upper(), principal.upper(), arm.AKS_RBAC_CLUSTER_ADMIN)
    assert name != arm.role_assignment_name(scope, principal), "another role on the same scope: another name"
    assert uuid.UUID(name).version == 5
    ex = example("RoleAssignments_CreateForResource.json")["parameters"]["parameters"]
    assert set(body["properties"]) <= set(ex["properties"]) | {"principalType"}
