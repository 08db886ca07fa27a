"""The hardened options of 'az elastictrain cluster create -g' through the real az against the ARM test server.

The server checks each body against the SDK models (unknown or read-only fields are violations), refuses what AKS
and Storage refuse (an ephemeral OS disk a size cannot hold, host encryption without the subscription's feature),
and answers as Azure does (AKS's defaults for what a PUT left out, a state on each storage network rule, the
maintenance window's start date), so a re-run that sends no PUT shows the comparison holds against Azure's answers.
"""
from __future__ import annotations

import pytest

from tests.support.arm_server import SUBSCRIPTION

SUBNET = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/"
          "train-vnet/subnets/nodes")
PLAN = ["resourcegroups", "storageaccounts", "containers", "userassignedidentities", "managedclusters", "agentpools",
        "maintenanceconfigurations", "maintenanceconfigurations", "federatedidentitycredentials", "roleassignments",
        "roleassignments", "roleassignments"]  # the last two, for the creator: Azure Kubernetes Service RBAC Cluster
# Admin on the cluster, Storage Blob Data Contributor on the checkpoint container


def _puts(arm) -> list[str]:
    return [path.split("?")[0].lower().rstrip("/").split("/")[-2] for method, path in arm.requests if method == "PUT"]


def _create(az, group, name, *args, check=True):
    return az("elastictrain", "cluster", "create", "-g", group, "-n", name, "-l", "eastus", *args, check=check,
              timeout=300)


def _found(arm, group, suffix):
    return arm.find(f"/resourcegroups/{group}/providers/{suffix}")


def test_hardened_create_sends_each_field_and_a_rerun_sends_no_put(az, arm, group):
    arm.expect.update(upgrade_channel="stable", storage_sku="Standard_ZRS", storage_default_action="Deny")
    options = ("--upgrade-channel", "stable", "--maintenance-window", "sunday 2:00 5h", "--storage-sku",
               "Standard_ZRS", "--vnet-subnet-id", SUBNET, "--storage-allow", "198.51.100.7", "203.0.113.0/24",
               "--api-server-authorized-ips", "198.51.100.0/24", "-o", "json")
    _create(az, group, "hard1", *options)
    assert _puts(arm) == PLAN

    cluster = _found(arm, group, "microsoft.containerservice/managedclusters/hard1")["properties"]
    assert cluster["autoUpgradeProfile"] == {"upgradeChannel": "stable", "nodeOSUpgradeChannel": "NodeImage"}
    assert cluster["apiServerAccessProfile"] == {"authorizedIPRanges": ["198.51.100.0/24"]}
    pools = {p["name"]: p for p in cluster["agentPoolProfiles"]}
    # D4ds_v5: 150 GiB temp disk; T4: 176 GiB: both hold a 128 GiB ephemeral OS disk, both support host encryption
    for name in ("system", "gpu"):
        assert (pools[name]["osDiskType"], pools[name]["osDiskSizeGB"], pools[name]["enableEncryptionAtHost"],
                pools[name]["maxPods"], pools[name]["vnetSubnetID"]) == ("Ephemeral", 128, True, 110, SUBNET), name
    account = next(r for k, r in arm.resources.items() if k.startswith(f"/subscriptions/{SUBSCRIPTION}/resourcegroups/"
                   f"{group.lower()}/") and r["type"] == "Microsoft.Storage/storageAccounts")
    acls = account["properties"]["networkAcls"]
    assert account["sku"]["name"] == "Standard_ZRS"
    assert (acls["defaultAction"], acls["bypass"]) == ("Deny", "AzureServices")
    assert [r["id"] for r in acls["virtualNetworkRules"]] == [SUBNET], "the nodes' subnet may reach checkpoints"
    assert [r["value"] for r in acls["ipRules"]] == ["198.51.100.7", "203.0.113.0/24"]
    for name in ("aksmanagednodeosupgradeschedule", "aksmanagedautoupgradeschedule"):  # node images, Kubernetes
        window = _found(arm, group, f"microsoft.containerservice/managedclusters/hard1/maintenanceconfigurations/"
                                    f"{name}")["properties"]["maintenanceWindow"]
        assert (window["schedule"], window["durationHours"], window["startTime"], window["utcOffset"]) == (
            {"weekly": {"intervalWeeks": 1, "dayOfWeek": "Sunday"}}, 5, "02:00", "+00:00"), name

    arm.requests.clear()
    again = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "hard1", "-l", "eastus", *options[:-2],
                    timeout=300)
    assert _puts(arm) == [], "Azure's answers (rule states, start date, pool defaults) are no drift"
    assert {c["action"] for c in again["changes"]} == {"unchanged"}
    assert again["upgrades"] == {"upgradeChannel": "stable", "nodeOSUpgradeChannel": "NodeImage"}
    assert again["apiServerAuthorizedIpRanges"] == ["198.51.100.0/24"]
    assert again["storage"]["networkDefaultAction"] == "Deny"
    assert {(p["name"], p["osDiskType"], p["encryptionAtHost"]) for p in again["pools"]} == {
        ("system", "Ephemeral", True), ("gpu", "Ephemeral", True)}


def test_what_a_size_lacks_is_left_to_aks_and_a_missing_feature_is_a_warning(az, arm, group):
    caps = arm.sku("eastus", "Standard_NC4as_T4_v3")["capabilities"]
    next(c for c in caps if c["name"] == "EphemeralOSDiskSupported")["value"] = "False"
    arm.features["microsoft.compute/encryptionathost"] = "NotRegistered"
    arm.expect.update(gpu_os_disk="Managed", encryption_at_host=None)
    result = _create(az, group, "hard2")
    assert "Encryption at host stays off: the subscription has not registered Microsoft.Compute/EncryptionAtHost" \
        in result.stderr and "az feature register --namespace Microsoft.Compute --name EncryptionAtHost" \
        in result.stderr
    pools = {p["name"]: p for p in _found(arm, group, "microsoft.containerservice/managedclusters/hard2")[
        "properties"]["agentPoolProfiles"]}
    assert (pools["gpu"]["osDiskType"], pools["gpu"]["enableEncryptionAtHost"]) == ("Managed", False)
    assert pools["system"]["osDiskType"] == "Ephemeral"


def test_encryption_at_host_asked_for_without_the_feature_is_refused_before_any_put(az, arm, group):
    arm.features["microsoft.compute/encryptionathost"] = "Pending"
    failed = _create(az, group, "hard3", "--encryption-at-host", "true", check=False)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert "has not registered the feature Microsoft.Compute/EncryptionAtHost" in failed.stderr
    assert "az feature register" in failed.stderr
    assert _puts(arm) == []


def test_pools_made_before_these_defaults_keep_their_disks_and_are_no_drift(az, arm, group):
    _create(az, group, "hard4")
    cluster = _found(arm, group, "microsoft.containerservice/managedclusters/hard4")["properties"]
    pool = _found(arm, group, "microsoft.containerservice/managedclusters/hard4/agentpools/gpu")["properties"]
    for props in [pool, *cluster["agentPoolProfiles"]]:  # as an earlier version made them (AKS's defaults)
        props.update(osDiskType="Managed", osDiskSizeGB=128, enableEncryptionAtHost=False)
    arm.requests.clear()
    _create(az, group, "hard4")
    assert _puts(arm) == [], "fields fixed at a pool's creation are not put again (AKS would refuse the change)"

    pool["maxCount"] = 9  # a real drift: the PUT carries the pool's own disk settings, which AKS takes
    arm.expect.update(gpu_os_disk="Managed", encryption_at_host=False)
    arm.requests.clear()
    _create(az, group, "hard4")
    assert _puts(arm) == ["agentpools"]
    pool = _found(arm, group, "microsoft.containerservice/managedclusters/hard4/agentpools/gpu")["properties"]
    assert (pool["osDiskType"], pool["enableEncryptionAtHost"], pool["maxCount"]) == ("Managed", False, 3)


@pytest.mark.parametrize("args, expected", [
    (("--maintenance-window", "Sun 02:00 4"), "is not 'DAY HH:MM HOURS'"),
    (("--maintenance-window", "Sunday 02:00 2"), "AKS takes 4 to 24"),
    (("--storage-allow", "198.51.100.7"), "without --vnet-subnet-id"),
    (("--vnet-subnet-id", SUBNET, "--storage-allow", "10.1.2.3"), "is a private or local range"),
    (("--api-server-authorized-ips", "fd00::/8"), "is not an IPv4 address or range"),
    (("--vnet-subnet-id", "/subscriptions/x/vnets/v"), "is not a subnet resource id"),
], ids=["window-form", "window-short", "allow-without-subnet", "allow-private", "api-ipv6", "subnet-form"])
def test_bad_hardening_options_are_clear_errors_before_any_request(az, arm, group, args, expected):
    failed = _create(az, group, "hard5", *args, check=False)
    assert failed.returncode != 0 and expected in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr
    assert arm.requests == [], "bad input fails before any request"
