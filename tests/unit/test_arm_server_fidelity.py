"""The ARM test server answers as AKS does, so contract tests see what a real cluster returns.

Requests go to ``ArmServer.handle`` directly (the HTTP layer is the standard library's); the bodies are
the ones core.aks.arm_bodies builds.
"""
from __future__ import annotations

import json

import pytest

from azext_elastictrain.core.aks import arm_bodies as arm
from azext_elastictrain.core.spec import ClusterSpec
from tests.support.arm_server import API_VERSIONS, SPOT_LABEL, SPOT_TAINT, SUBSCRIPTION, ArmServer

SPEC = ClusterSpec("fid", "fid-rg", "eastus")
AUTH = {"authorization": "Bearer t"}
CLUSTER = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/fid-rg/providers/Microsoft.ContainerService/managedClusters/fid"
AKS = API_VERSIONS["Microsoft.ContainerService"]


@pytest.fixture
def server(tmp_path):
    server = ArmServer(tmp_path)
    # bodies built without a region preflight: no OS disk or host encryption fields (AKS's defaults)
    server.expect.update(system_os_disk=None, gpu_os_disk=None, encryption_at_host=None)
    yield server
    server.close()
    assert server.violations == []


def put(server, path: str, body: dict, api: str = AKS):
    return server.handle("PUT", f"{path}?api-version={api}", AUTH, json.dumps(body).encode())


def get(server, path: str, api: str = AKS):
    return server.handle("GET", f"{path}?api-version={api}", AUTH, b"")


def finish(server) -> None:
    for op in list(server.operations):
        while not server.operations[op].get("done"):
            server.handle("GET", f"/operations/{op}", AUTH, b"")


def make_cluster_and_pool(server) -> dict:
    assert put(server, CLUSTER, arm.managed_cluster(SPEC))[0] == 201
    finish(server)
    status, _, pool = put(server, f"{CLUSTER}/agentPools/gpu", arm.gpu_agent_pool(SPEC))
    assert status == 201 and pool["properties"]["provisioningState"] == "Creating"
    finish(server)
    return get(server, f"{CLUSTER}/agentPools/gpu")[2]


def test_a_spot_pool_comes_back_with_akss_taint_and_label_read_only_fields_and_arm_casing(server):
    pool = make_cluster_and_pool(server)
    props = pool["properties"]
    assert props["nodeTaints"] == ["sku=gpu:NoSchedule", SPOT_TAINT]
    assert props["nodeLabels"][SPOT_LABEL[0]] == SPOT_LABEL[1]
    assert props["provisioningState"] == "Succeeded" and props["powerState"] == {"code": "Running"}
    assert props["nodeImageVersion"] and props["currentOrchestratorVersion"] == "1.33.2"
    assert "/resourcegroups/fid-rg/" in pool["id"]
    cluster = get(server, CLUSTER)[2]
    gpu = next(p for p in cluster["properties"]["agentPoolProfiles"] if p["name"] == "gpu")
    assert SPOT_TAINT in gpu["nodeTaints"], "a cluster GET lists the pool as AKS keeps it"
    assert arm.differences(arm.gpu_agent_pool(SPEC), pool) == [], "what AKS answers is no drift"


def test_a_put_on_an_existing_pool_is_updating_and_the_autoscaler_moves_count(server):
    make_cluster_and_pool(server)
    server.autoscale("fid-rg", "fid", "gpu", 2)
    assert get(server, f"{CLUSTER}/agentPools/gpu")[2]["properties"]["count"] == 2
    status, _, pool = put(server, f"{CLUSTER}/agentPools/gpu", arm.gpu_agent_pool(SPEC))
    assert status == 200 and pool["properties"]["provisioningState"] == "Updating"


def test_an_immutable_pool_field_cannot_change(server):
    make_cluster_and_pool(server)
    body = arm.gpu_agent_pool(SPEC)
    body["properties"]["scaleSetEvictionPolicy"] = "Deallocate"
    server.expect["eviction_policy"] = "Deallocate"
    status, _, error = put(server, f"{CLUSTER}/agentPools/gpu", body)
    assert (status, error["error"]["code"]) == (400, "PropertyChangeNotAllowed")


def test_resource_skus_need_a_location_filter_and_usages_list_spot_quota(server):
    base = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute"
    api = API_VERSIONS["Microsoft.Compute/skus"]
    status, _, found = server.handle("GET", f"{base}/skus?api-version={api}&$filter=location%20eq%20%27eastus%27",
                                     AUTH, b"")
    assert status == 200 and "Standard_ND96isr_H200_v5" in {s["name"] for s in found["value"]}
    status, _, usages = get(server, f"{base}/locations/eastus/usages", API_VERSIONS["Microsoft.Compute/usages"])
    assert status == 200 and {"cores", "lowPriorityCores"} == {u["name"]["value"] for u in usages["value"]}
    assert server.handle("GET", f"{base}/skus?api-version={api}", AUTH, b"")[0] == 400
    server.violations.clear()  # the unfiltered list above was refused on purpose
