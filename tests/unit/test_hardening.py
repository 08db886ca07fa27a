"""The hardened defaults: what the region's Resource SKUs decide for the pools, the new body fields against the
official examples and the installed SDK's models, their validation, and how a re-run compares them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from azext_elastictrain.core.aks import arm_bodies as arm
from azext_elastictrain.core.aks import preflight
from azext_elastictrain.core.aks.preflight import PoolHardware, PreflightError, VmSize
from azext_elastictrain.core.spec import ClusterSpec, SpecError
from tests.support.sdk_schema import problems
from tests.unit.test_arm import assert_named_like_azure, example, example_paths, paths

SUB = "00000000-1111-2222-3333-444444444444"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes"
HARDENED = ClusterSpec("c", "rg", "eastus", upgrade_channel="stable", maintenance_window="Saturday 22:30 6",
                       vnet_subnet=SUBNET, storage_allow=("198.51.100.7", "203.0.113.0/24"),
                       api_server_authorized_ips=("198.51.100.0/24",), storage_sku="Standard_ZRS")
ON_HOST = arm.NodeHardware(PoolHardware("Ephemeral", 128, True), PoolHardware("Ephemeral", 128, True))


def size(name="Standard_X", *, ephemeral=True, cache=0.0, temp=0.0, host_encryption=True) -> VmSize:
    return VmSize(name, 4, 1, True, ephemeral_os_disk=ephemeral, cache_gib=cache, temp_disk_gib=temp,
                  encryption_at_host=host_encryption)


# -- what the sizes allow ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vm, expected", [
    (size(temp=176), ("Ephemeral", 128)),          # NC4as_T4_v3: a 176 GiB temp disk holds the usual 128 GiB
    (size(cache=86, temp=16), ("Ephemeral", 86)),   # sized to fit the host cache
    (size(temp=64), ("Ephemeral", 64)),
    (size(temp=63.9), ("Managed", None)),           # below 64 GiB: no room for CUDA images
    (size(ephemeral=False, temp=1000), ("Managed", None)),
    (None, (None, None)),                           # unknown (no login): AKS decides
])
def test_the_os_disk_is_ephemeral_where_the_size_has_room_for_it(vm, expected):
    assert preflight.os_disk(vm) == expected


def test_resource_skus_capabilities_are_read_in_their_units():
    sku = {"resourceType": "virtualMachines", "name": "Standard_D4ds_v5", "locations": ["eastus"],
           "capabilities": [{"name": "MaxResourceVolumeMB", "value": "153600"},
                            {"name": "CachedDiskBytes", "value": "107374182400"},
                            {"name": "EphemeralOSDiskSupported", "value": "True"},
                            {"name": "EncryptionAtHostSupported", "value": "True"}]}
    found = preflight.vm_sizes([sku], "eastus")["standard_d4ds_v5"]
    assert (found.temp_disk_gib, found.cache_gib, found.ephemeral_os_disk, found.encryption_at_host) == (
        150, 100, True, True)
    example_sku = preflight.vm_sizes(example("ListAvailableResourceSkusForARegion.json")["responses"]["200"][
        "body"]["value"], "westus")["standard_a1"]
    assert (example_sku.temp_disk_gib, example_sku.ephemeral_os_disk) == (70, False)  # the official entry


@pytest.mark.parametrize("asked, supported, registered, expected", [
    (None, True, True, True), (None, True, False, None), (None, False, True, None),
    (False, True, True, None), (True, True, True, True),
])
def test_host_encryption_is_on_where_size_and_subscription_allow_unless_asked_otherwise(asked, supported, registered,
                                                                                        expected):
    assert preflight.pool_hardware(size(host_encryption=supported), asked, registered).encryption_at_host is expected


def test_host_encryption_asked_for_is_refused_where_a_size_or_the_subscription_lacks_it():
    with pytest.raises(PreflightError, match="do not support encryption at host"):
        preflight.check_encryption_at_host(True, [size("Standard_A", host_encryption=False)], True)
    with pytest.raises(PreflightError, match="has not registered the feature") as refused:
        preflight.check_encryption_at_host(True, [size()], False)
    assert "az feature register --namespace Microsoft.Compute --name EncryptionAtHost" in refused.value.recommendation
    warned = preflight.check_encryption_at_host(None, [size()], False)
    assert len(warned) == 1 and "stays off" in warned[0]
    assert preflight.check_encryption_at_host(False, [size()], False) == []


class _Region:
    def __init__(self, state: str) -> None:
        self.state, self.asked = state, []

    def get(self, kind, ref):
        return {"location": "eastus"}

    def resource_skus(self, location):
        sku = json.loads((Path(__file__).resolve().parents[1] / "data" / "arm-examples" /
                          "ListAvailableResourceSkusForARegion.json").read_text())["responses"]["200"]["body"]["value"]
        gpu = {**sku[1], "name": "Standard_NC4as_T4_v3", "locations": [location], "restrictions": [],
               "capabilities": sku[1]["capabilities"] + [{"name": "GPUs", "value": "1"},
                                                         {"name": "EncryptionAtHostSupported", "value": "True"}]}
        return [gpu]

    def usages(self, location):
        return []

    def feature_state(self, namespace, feature):
        self.asked.append((namespace, feature))
        return self.state


def test_the_preflight_reads_the_feature_only_where_host_encryption_may_be_on():
    region = _Region("Registered")
    result = preflight.run(region, "Standard_NC4as_T4_v3", 2, "eastus", "rg")
    assert region.asked == [("Microsoft.Compute", "EncryptionAtHost")] and result.encryption_at_host_registered
    off = _Region("Registered")
    assert preflight.run(off, "Standard_NC4as_T4_v3", 2, "eastus", "rg", encryption_at_host=False) is not None
    assert off.asked == []


# -- the bodies ---------------------------------------------------------------------------------------------


def test_cluster_upgrades_itself_and_fixes_what_pools_are_made_with():
    props = arm.managed_cluster(HARDENED, ON_HOST)["properties"]
    assert props["autoUpgradeProfile"] == {"upgradeChannel": "stable", "nodeOSUpgradeChannel": "NodeImage"}
    assert props["apiServerAccessProfile"] == {"authorizedIPRanges": ["198.51.100.0/24"]}
    (system,) = props["agentPoolProfiles"]
    assert (system["osDiskType"], system["osDiskSizeGB"], system["enableEncryptionAtHost"], system["maxPods"],
            system["vnetSubnetID"]) == ("Ephemeral", 128, True, 110, SUBNET)
    defaults = arm.managed_cluster(ClusterSpec("c", "rg", "eastus"))["properties"]
    assert defaults["autoUpgradeProfile"]["upgradeChannel"] == "patch"
    assert "apiServerAccessProfile" not in defaults
    assert {"osDiskType", "osDiskSizeGB", "enableEncryptionAtHost", "vnetSubnetID"}.isdisjoint(
        defaults["agentPoolProfiles"][0]), "without the region's word, AKS's defaults"


def test_new_fields_are_named_as_in_the_official_examples_and_fit_the_sdk_models():
    from azure.mgmt.containerservice import models as aks
    from azure.mgmt.storage import models as storage

    pool = arm.gpu_agent_pool(HARDENED, ON_HOST)
    assert {"properties.osDiskType", "properties.osDiskSizeGB"} <= example_paths("AgentPoolsCreate_Ephemeral.json")
    assert "properties.enableEncryptionAtHost" in example_paths("AgentPoolsCreate_EnableEncryptionAtHost.json")
    assert_named_like_azure(pool, ("AgentPoolsCreate_Spot.json", "AgentPoolsCreate_Ephemeral.json",
                                   "AgentPoolsCreate_EnableEncryptionAtHost.json"), "azure.mgmt.containerservice")
    window = arm.maintenance_window(HARDENED)
    ex = example("MaintenanceConfigurationsCreate_Update_MaintenanceWindow.json")
    assert paths(window) <= example_paths("MaintenanceConfigurationsCreate_Update_MaintenanceWindow.json")
    assert set(window["properties"]["maintenanceWindow"]["schedule"]) == set(
        ex["responses"]["200"]["body"]["properties"]["maintenanceWindow"]["schedule"]) == {"weekly"}
    assert window["properties"]["maintenanceWindow"] == {
        "schedule": {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Saturday"}}, "durationHours": 6,
        "utcOffset": "+00:00", "startTime": "22:30"}
    for body, model in ((arm.managed_cluster(HARDENED, ON_HOST), aks.ManagedCluster), (pool, aks.AgentPool),
                        (window, aks.MaintenanceConfiguration),
                        (arm.storage_account(HARDENED), storage.StorageAccountCreateParameters)):
        assert problems(body, model) == [], model.__name__


def test_storage_network_is_open_by_default_and_closed_to_the_listed_with_the_nodes_subnet_first():
    assert arm.storage_account(ClusterSpec("c", "rg", "eastus"))["properties"]["networkAcls"] == {
        "bypass": "AzureServices", "defaultAction": "Allow"}
    acls = arm.storage_account(HARDENED)["properties"]["networkAcls"]
    assert acls == {"bypass": "AzureServices", "defaultAction": "Deny",
                    "virtualNetworkRules": [{"id": SUBNET, "action": "Allow"}],
                    "ipRules": [{"value": "198.51.100.7", "action": "Allow"},
                                {"value": "203.0.113.0/24", "action": "Allow"}]}
    single = ClusterSpec("c", "rg", vnet_subnet=SUBNET, storage_allow=("198.51.100.7/32",)).storage_allowed_ips
    assert single == ["198.51.100.7"], "Azure Storage refuses /31 and /32 ranges: their addresses instead"
    pair = ClusterSpec("c", "rg", vnet_subnet=SUBNET, storage_allow=("198.51.100.8/31",)).storage_allowed_ips
    assert pair == ["198.51.100.8", "198.51.100.9"]


def test_the_schema_check_names_unknown_and_read_only_fields():
    from azure.mgmt.containerservice import models as aks

    body = arm.managed_cluster(HARDENED, ON_HOST)
    body["properties"]["agentPoolProfiles"][0]["osDiskKind"] = "Ephemeral"
    body["properties"]["autoUpgradeProfile"]["nodeOsUpgradeChannel"] = "NodeImage"
    body["properties"]["provisioningState"] = "Succeeded"
    assert problems(body, aks.ManagedCluster) == [
        "properties.agentPoolProfiles[0].osDiskKind: not a field of ManagedClusterAgentPoolProfile",
        "properties.autoUpgradeProfile.nodeOsUpgradeChannel: not a field of ManagedClusterAutoUpgradeProfile",
        "properties.provisioningState: read-only in ManagedClusterProperties"]


# -- validation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, message", [
    ({"upgrade_channel": "node-image"}, "unknown upgrade channel"),
    ({"maintenance_window": "Sunday 24:00 4"}, "is not 'DAY HH:MM HOURS'"),
    ({"maintenance_window": "Sunday 02:00 25"}, "AKS takes 4 to 24"),
    ({"storage_allow": ("198.51.100.7",)}, "without --vnet-subnet-id"),
    ({"vnet_subnet": SUBNET, "storage_allow": ("192.168.1.0/24",)}, "private or local range"),
    ({"vnet_subnet": SUBNET, "storage_allow": ("/subscriptions/x/subnets/y",)}, "is not a subnet resource id"),
    ({"api_server_authorized_ips": ("not-an-ip",)}, "is not an IPv4 address or range"),
    ({"api_server_authorized_ips": ("127.0.0.1",)}, "private or local range"),
    ({"vnet_subnet": "subnet-1"}, "is not a subnet resource id"),
])
def test_bad_hardening_input_is_a_spec_error(changes, message):
    with pytest.raises(SpecError, match=message):
        ClusterSpec("c", "rg", **changes)


def test_a_window_reads_case_and_hours_as_people_write_them():
    window = ClusterSpec("c", "rg", maintenance_window="  friday 7:05 4h ").maintenance()
    assert (window.day, window.start, window.hours) == ("Friday", "07:05", 4)


# -- a re-run ----------------------------------------------------------------------------------------------


def test_a_re_run_keeps_what_existing_pools_were_made_with():
    wanted = arm.gpu_agent_pool(HARDENED, ON_HOST)
    made_before = {"properties": {**wanted["properties"], "osDiskType": "Managed", "osDiskSizeGB": 128,
                                  "enableEncryptionAtHost": False, "maxPods": 30}}
    made_before["properties"].pop("vnetSubnetID")
    kept = arm.as_existing(wanted, made_before)
    assert arm.differences(kept, made_before) == []
    assert (kept["properties"]["osDiskType"], kept["properties"]["maxPods"]) == ("Managed", 30)
    assert "vnetSubnetID" not in kept["properties"], "what the pool lacks is not sent to an existing pool"
    assert arm.as_existing(wanted, None) is wanted, "a new pool gets what the region allows"
    cluster = arm.managed_cluster(HARDENED, ON_HOST)
    there = {"properties": {"agentPoolProfiles": [{"name": "SYSTEM", "osDiskType": "Managed", "maxPods": 110}]}}
    assert arm.as_existing(cluster, there)["properties"]["agentPoolProfiles"][0]["osDiskType"] == "Managed"


def test_network_rules_azure_answers_with_a_state_are_no_drift_but_a_missing_rule_is():
    wanted = arm.storage_account(HARDENED)
    answered = json.loads(json.dumps(wanted))
    acls = answered["properties"]["networkAcls"]
    acls["virtualNetworkRules"][0].update(state="Succeeded", id=SUBNET.lower())
    acls["ipv6Rules"] = []
    assert arm.differences(wanted, answered) == []
    acls["ipRules"].pop()
    assert arm.differences(wanted, answered) == ["properties.networkAcls.ipRules"]


def test_the_window_covers_kubernetes_upgrades_too_unless_none_upgrades_kubernetes():
    from azext_elastictrain.backends.aks.cluster_create import plan_steps

    def windows(spec):
        return [s.ref["name"] for s in plan_steps(spec, SUB) if s.kind == "maintenance_configuration"]

    assert windows(HARDENED) == ["aksManagedNodeOSUpgradeSchedule", "aksManagedAutoUpgradeSchedule"]
    assert windows(ClusterSpec("c", "rg", maintenance_window="Sunday 02:00 4", upgrade_channel="none")) == [
        "aksManagedNodeOSUpgradeSchedule"]
    assert windows(ClusterSpec("c", "rg")) == [], "no window asked: AKS picks the time"
