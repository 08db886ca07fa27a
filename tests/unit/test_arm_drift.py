"""core.aks.arm_bodies.differences: what AKS really answers is no drift; what a user changed is.

The "actual" bodies are ours as AKS returns them: the Spot taint and label AKS adds, the autoscaler's count,
ids in ARM's casing, read-only fields (AgentPoolsGet.json, AgentPoolsList.json in tests/data/arm-examples).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from azext_elastictrain.core.aks import arm_bodies as arm
from azext_elastictrain.core.spec import ClusterSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "arm-examples"
SPEC = ClusterSpec("spot-train", "ml-rg", "eastus", max_count=4, node_labels=(("team", "vision"),))
SPOT_TAINT = "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"
SPOT_LABEL = ("kubernetes.azure.com/scalesetpriority", "spot")


def as_aks_answers(body: dict, *, count: int = 2) -> dict:
    """Our GPU pool body as AKS answers a GET of it: its own taint and label added, the autoscaler's count,
    the id with ARM's lower-case ``resourcegroups`` (AgentPoolsList.json), read-only fields."""
    listed = json.loads((EXAMPLES / "AgentPoolsList.json").read_text())["responses"]["200"]["body"]["value"][0]
    pool = copy.deepcopy(body)
    props = pool["properties"]
    props["nodeTaints"] = props["nodeTaints"] + [SPOT_TAINT]
    props["nodeLabels"] = {**props["nodeLabels"], SPOT_LABEL[0]: SPOT_LABEL[1]}
    props.update({"count": count, "provisioningState": "Succeeded", "powerState": {"code": "Running"},
                  "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202511.07.0", "currentOrchestratorVersion":
                  "1.33.2", "maxPods": 110, "spotMaxPrice": float(props["spotMaxPrice"]), "scaleSetPriority": "Spot"})
    pool.update({"id": listed["id"].replace("rg1", "ml-rg").replace("clustername1", "spot-train")
                 .replace("agentpool1", "gpu"), "name": "gpu"})
    assert "/resourcegroups/" in pool["id"], "the example shows ARM's lower-case casing"
    return pool


def test_a_spot_pool_as_aks_answers_it_is_no_drift():
    body = arm.gpu_agent_pool(SPEC)
    assert arm.differences(body, as_aks_answers(body)) == []


def test_our_taint_removed_is_drift():
    body = arm.gpu_agent_pool(SPEC)
    actual = as_aks_answers(body)
    actual["properties"]["nodeTaints"] = [SPOT_TAINT]
    assert arm.differences(body, actual) == ["properties.nodeTaints"]


def test_a_taint_or_label_differing_only_in_case_is_another_one():
    body = arm.gpu_agent_pool(SPEC)
    actual = as_aks_answers(body)
    actual["properties"]["nodeTaints"] = ["SKU=GPU:NoSchedule", SPOT_TAINT]
    actual["properties"]["nodeLabels"]["team"] = "Vision"
    assert arm.differences(body, actual) == ["properties.nodeTaints", "properties.nodeLabels.team"]


def test_max_count_changed_by_the_user_is_drift_and_count_is_not_under_autoscale():
    body = arm.gpu_agent_pool(SPEC)
    actual = as_aks_answers(body, count=3)
    actual["properties"]["maxCount"] = 10
    assert arm.differences(body, actual) == ["properties.maxCount"]


def test_count_is_ours_where_autoscale_is_off():
    wanted = {"properties": {"count": 2, "enableAutoScaling": False}}
    assert arm.differences(wanted, {"properties": {"count": 3, "enableAutoScaling": False}}) == ["properties.count"]
    assert arm.differences(wanted, {"properties": {"count": 2, "enableAutoScaling": False}}) == []


def test_autoscale_turned_off_by_the_user_is_drift():
    body = arm.gpu_agent_pool(SPEC)
    actual = as_aks_answers(body)
    actual["properties"]["enableAutoScaling"] = False
    assert arm.differences(body, actual) == ["properties.enableAutoScaling"]


def test_ids_locations_and_enums_compare_without_case_and_pools_match_by_name_without_case():
    wanted = {"location": "eastus", "properties": {"roleDefinitionId": "/subscriptions/s/resourceGroups/g/x",
                                                   "agentPoolProfiles": [{"name": "system", "mode": "System"}]}}
    actual = {"location": "East US", "properties": {"roleDefinitionId": "/subscriptions/s/resourcegroups/G/x",
                                                    "agentPoolProfiles": [{"name": "System", "mode": "system"},
                                                                          {"name": "gpu", "mode": "User"}]}}
    assert arm.differences(wanted, actual) == []


def test_audiences_compare_as_sets():
    wanted = {"properties": {"audiences": ["a", "b"]}}
    assert arm.differences(wanted, {"properties": {"audiences": ["b", "a"]}}) == []
    assert arm.differences(wanted, {"properties": {"audiences": ["a", "b", "c"]}}) == ["properties.audiences"]
    assert arm.differences(wanted, {"properties": {}}) == ["properties.audiences"]
