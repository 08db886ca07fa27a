"""First contact with real Azure, the pure parts: versions by intent, updates merged onto what Azure has, reserved
label prefixes, the salted storage name, and role assignments that exist or whose principal is not known yet."""
from __future__ import annotations

import pytest

from azext_elastictrain.backends.aks import cluster_create as aks_cluster
from azext_elastictrain.core.aks import arm_bodies as arm
from azext_elastictrain.core.errors import ArmError
from azext_elastictrain.core.spec import ClusterSpec, SpecError, default_storage_account, reserved_label

SPOT_LABEL = "kubernetes.azure.com/scalesetpriority"
SPOT_TAINT = "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"


@pytest.mark.parametrize("asked, have, met", [
    ("1.33", "1.33.6", True), ("1.33", "1.33", True), ("1.33", "1.34.1", True), ("1.33", "1.32.9", False),
    ("1.33.2", "1.33.6", True), ("1.33.2", "1.33.2", True), ("1.33.2", "1.33.1", False),
    ("1.33.2", "1.33", False), ("1.33", None, False),
    ("1.33.9", "1.33.10", True), ("1.33.10", "1.33.9", False), ("1.9", "1.10.0", True),  # numbers, not strings
])
def test_a_version_is_met_by_the_same_or_a_later_release_at_the_precision_asked(asked, have, met):
    assert arm.version_met(asked, have) is met


def test_after_an_auto_upgrade_the_cluster_and_pools_are_no_drift_and_keep_azures_version():
    spec = ClusterSpec(name="c", resource_group="g", location="eastus", kubernetes_version="1.33.2")
    body = arm.managed_cluster(spec)
    found = {"properties": {"kubernetesVersion": "1.33.6", "currentKubernetesVersion": "1.33.6",
                            "agentPoolProfiles": [{"name": "system", "orchestratorVersion": "1.33.6",
                                                   "currentOrchestratorVersion": "1.33.6"}]}}
    shaped = arm.as_existing(body, found)
    assert shaped["properties"]["kubernetesVersion"] == "1.33.6", "never send lower than Azure has"
    assert shaped["properties"]["agentPoolProfiles"][0]["orchestratorVersion"] == "1.33.6"
    assert not [d for d in arm.differences(shaped, found) if "Version" in d]
    later = ClusterSpec(name="c", resource_group="g", kubernetes_version="1.34")
    upgrade = arm.as_existing(arm.managed_cluster(later), found)
    assert {d for d in arm.differences(upgrade, found) if "Version" in d} == {
        "properties.kubernetesVersion", "properties.agentPoolProfiles[system].orchestratorVersion"}
    assert upgrade["properties"]["kubernetesVersion"] == "1.34", "asked above what runs: an upgrade is sent"


def test_a_pool_update_is_azures_pool_with_ours_merged_in():
    ours = {"properties": {"nodeLabels": {"team": "vision"}, "nodeTaints": ["sku=gpu:NoSchedule"], "maxCount": 3,
                           "count": 0, "enableAutoScaling": True}}
    found = {"id": "/x", "properties": {"nodeLabels": {SPOT_LABEL: "spot", "costcenter": "42", "team": "old"},
                                        "nodeTaints": [SPOT_TAINT, "sku=gpu:NoSchedule"], "maxCount": 10,
                                        "count": 2, "enableAutoScaling": True, "provisioningState": "Succeeded"}}
    merged = arm.merged_update(ours, found)["properties"]
    assert merged["nodeLabels"] == {SPOT_LABEL: "spot", "costcenter": "42", "team": "vision"}
    assert merged["nodeTaints"] == ["sku=gpu:NoSchedule", SPOT_TAINT]
    assert (merged["maxCount"], merged["count"]) == (3, 2), "ours win; the autoscaler owns the count"


def test_a_cluster_update_sends_only_our_pools_each_merged_and_keeps_the_rest():
    ours = {"tags": {"elastictrain": "c"}, "properties": {"agentPoolProfiles": [{"name": "system", "maxCount": 3}]}}
    found = {"tags": {"owner": "alice"}, "properties": {
        "addonProfiles": {"azurepolicy": {"enabled": True}},
        "agentPoolProfiles": [{"name": "system", "maxCount": 5, "vmSize": "Standard_D4ds_v5"}, {"name": "gpu"}]}}
    merged = arm.merged_update(ours, found)
    assert merged["tags"] == {"owner": "alice", "elastictrain": "c"}
    assert merged["properties"]["addonProfiles"] == {"azurepolicy": {"enabled": True}}
    assert merged["properties"]["agentPoolProfiles"] == [{"name": "system", "maxCount": 3,
                                                          "vmSize": "Standard_D4ds_v5"}]


@pytest.mark.parametrize("key, reserved", [
    ("kubernetes.azure.com/scalesetpriority", True), ("x.kubernetes.azure.com/a", True), ("kubernetes.io/role", True),
    ("node-role.kubernetes.io/gpu", True), ("example.k8s.io/a", True), ("node.kubernetes.io/lifecycle", False),
    ("kubelet.kubernetes.io/a", False), ("kubernetes.io/arch", False), ("elastictrain.azure.com/pool", False),
    ("team", False), ("notkubernetes.io/a", False),
])
def test_label_prefixes_aks_reserves(key, reserved):
    assert reserved_label(key) is reserved
    if reserved:
        with pytest.raises(SpecError, match="reserved"):
            ClusterSpec(name="c", resource_group="g", node_labels=((key, "v"),))
    else:
        assert ClusterSpec(name="c", resource_group="g", node_labels=((key, "v"),)).node_labels == ((key, "v"),)


def test_the_default_storage_name_differs_by_subscription_and_stays_valid():
    one, two = (default_storage_account("rg", "spot-cluster", s) for s in ("sub-a", "sub-b"))
    assert one != two and one.startswith("etspotcluster") and len(one) <= 24
    assert ClusterSpec(name="spot-cluster", resource_group="rg", subscription="sub-a").storage_account_name == one


class _RoleArm:  # pylint: disable=too-few-public-methods
    subscription, tenant, storage_suffix = "sub", "", "core.windows.net"

    def __init__(self, errors):
        self.errors, self.puts = list(errors), 0

    def put(self, kind, ref, body, wait=True):
        self.puts += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"id": "ok"}


def _assign(errors):
    fake = _RoleArm(errors)
    clusters = aks_cluster.ClusterCreation(fake, role_retry_seconds=0)
    step = aks_cluster.Step("role", "role_assignment", {}, lambda c: {})
    return fake, clusters._assign_role(step, {}, {}, "[1/1] role", "created")  # pylint: disable=protected-access


def test_an_existing_equivalent_role_assignment_is_done_and_an_unknown_principal_is_tried_again_bounded():
    exists = ArmError(409, "RoleAssignmentExists", "The role assignment already exists.")
    assert _assign([exists])[1] == (None, "already assigned")
    unknown = ArmError(400, "PrincipalNotFound", "Principal x does not exist in the directory")
    fake, (result, action) = _assign([unknown, unknown])
    assert (fake.puts, result, action) == (3, {"id": "ok"}, "created")
    with pytest.raises(ArmError, match="PrincipalNotFound"):
        _assign([unknown] * aks_cluster.ROLE_TRIES)
    with pytest.raises(ArmError, match="Conflict"):
        _assign([ArmError(409, "Conflict", "another conflict")])
