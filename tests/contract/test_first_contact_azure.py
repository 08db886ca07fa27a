"""First contact with real Azure, through the real az against the local ARM server made as strict as Azure:
versions AKS rewrote after an auto-upgrade, role assignments that already exist or whose principal Entra ID does not
know yet, one storage namespace for the whole cloud, updates that reset what they do not carry, pool fields AKS
cannot change, reserved label prefixes, and blob storage that asks Azure RBAC for a data role.

Each behaviour of the server has its source in a comment there (tests/support/arm_server/, blob_front.py).
"""
from __future__ import annotations

import json
import uuid

import pytest

from azext_elastictrain.core.spec import default_storage_account
from tests.contract.conftest import CLOUD, AzureAz
from tests.support import aks_objects as k
from tests.support.arm_server import (
    AKS_RBAC_CLUSTER_ADMIN,
    LOGIN_OBJECT_ID,
    OTHER_SUBSCRIPTION,
    SPOT_LABEL,
    SPOT_TAINT,
    SUBSCRIPTION,
)


def _create(az, group, name, *args, check=True, env=None):
    return az("elastictrain", "cluster", "create", "-g", group, "-n", name, "-l", "eastus", *args, check=check,
              timeout=300, env=env)


def _puts(arm) -> list[str]:
    return [p.split("?")[0].lower().rstrip("/").split("/")[-2] for m, p in arm.requests if m == "PUT"]


def _cluster_id(group: str, name: str) -> str:
    return f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/{name}"


# ---------------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize("asked, channel", [("1.33", "patch"), ("1.33.2", "patch"), ("1.33", "stable"),
                                            ("1.33.2", "rapid")],
                         ids=["minor-pin", "patch-pin", "minor-pin-stable", "patch-pin-rapid"])
def test_a_rerun_after_an_auto_upgrade_sends_no_put(az, arm, group, asked, channel):
    arm.expect.update(upgrade_channel=channel)
    _create(az, group, "ver1", "--kubernetes-version", asked, "--upgrade-channel", channel)
    arm.auto_upgrade(group, "ver1", "1.33.6")  # AKS answers "1.33.6" in kubernetesVersion from now on
    arm.requests.clear()
    again = json.loads(_create(az, group, "ver1", "--kubernetes-version", asked, "--upgrade-channel", channel,
                               "-o", "json").stdout)
    assert _puts(arm) == [], "Azure runs what was asked (or later): nothing to send"
    assert {c["step"]: c["action"] for c in again["changes"]}["AKS cluster"] == "unchanged"


def test_a_real_drift_after_an_auto_upgrade_sends_azures_version_never_a_lower_one(az, arm, group):
    _create(az, group, "ver2", "--kubernetes-version", "1.33.2")
    arm.auto_upgrade(group, "ver2", "1.33.6")
    arm.find(f"{_cluster_id(group, 'ver2')}/agentpools/gpu")["properties"]["maxCount"] = 9  # someone changed it
    arm.find(_cluster_id(group, "ver2"))["properties"]["autoUpgradeProfile"]["upgradeChannel"] = "stable"
    arm.requests.clear()
    _create(az, group, "ver2", "--kubernetes-version", "1.33.2")  # the server answers 400 to a downgrade
    assert _puts(arm) == ["managedclusters", "agentpools"]
    cluster = arm.find(_cluster_id(group, "ver2"))["properties"]
    pool = arm.find(f"{_cluster_id(group, 'ver2')}/agentpools/gpu")["properties"]
    assert (cluster["currentKubernetesVersion"], pool["currentOrchestratorVersion"], pool["maxCount"]) == (
        "1.33.6", "1.33.6", 3)


def test_a_version_below_what_runs_is_an_upgrade_to_ask_for(az, arm, group):
    _create(az, group, "ver3", "--kubernetes-version", "1.33.2")
    arm.requests.clear()
    result = _create(az, group, "ver3", "--kubernetes-version", "1.33.4")
    assert _puts(arm) == ["managedclusters", "agentpools"], "asked above what runs: an upgrade"
    assert "kubernetesVersion" in result.stderr


# ---------------------------------------------------------------------------------------------- role assignments


def test_a_role_assignment_made_outside_under_another_name_counts_as_done(az, arm, group):
    _create(az, group, "role1")
    cluster_scope = arm.find(_cluster_id(group, "role1"))["id"].replace("/resourcegroups/", "/resourceGroups/")
    ours = next(rid for rid, r in arm.resources.items() if r["type"].endswith("roleAssignments")
                and rid.startswith(cluster_scope.lower() + "/"))
    del arm.resources[ours]  # as if a user had granted it with 'az role assignment create' (a random name)
    arm.assign_role(cluster_scope, LOGIN_OBJECT_ID, AKS_RBAC_CLUSTER_ADMIN)
    arm.requests.clear()
    again = json.loads(_create(az, group, "role1", "-o", "json").stdout)
    assert _puts(arm) == ["roleassignments"], "the PUT is answered 409 RoleAssignmentExists"
    assert {c["step"]: c["action"] for c in again["changes"]}["Kubernetes admin role"] == "already assigned"
    assert ours not in arm.resources, "no second assignment of the same role"


def test_a_principal_entra_id_does_not_know_yet_is_tried_again(az, arm, group):
    arm.principal_unknown[LOGIN_OBJECT_ID] = 2  # replication: the next two PUTs for it get PrincipalNotFound
    result = _create(az, group, "role2")
    assert "Entra ID does not know the principal yet" in result.stderr
    assert arm.principal_unknown[LOGIN_OBJECT_ID] == 0
    assert _puts(arm).count("roleassignments") == 3 + 2


# ---------------------------------------------------------------------------------------------- storage names


def test_a_taken_storage_name_stops_create_before_any_write(az, arm, group):
    arm.taken_storage_names.add("ckpttaken01")  # held by a subscription somewhere else in Azure
    failed = _create(az, group, "sto1", "--storage-account", "ckpttaken01", check=False)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert "'ckpttaken01'" in failed.stderr and "--storage-account" in failed.stderr
    assert arm.writes() == [], "nothing half-created"
    assert arm.find(f"/resourcegroups/{group}") is None


def test_the_default_storage_name_is_salted_with_the_subscription_and_checked(az, arm, group):
    ours = default_storage_account(group, "sto2", SUBSCRIPTION)
    theirs = default_storage_account(group, "sto2", OTHER_SUBSCRIPTION)
    assert ours != theirs and ours != default_storage_account(group, "sto2")
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "sto2", "-l", "eastus", "--dry-run")
    assert f"/storageAccounts/{ours}" in next(r["id"] for r in plan["arm"] if r["step"] == "storage account")
    arm.taken_storage_names.add(ours)  # someone else holds even this one: the preflight says so
    failed = _create(az, group, "sto2", check=False)
    assert failed.returncode != 0 and "--storage-account" in failed.stderr and arm.writes() == []


# ---------------------------------------------------------------------------------------------- GET -> merge -> PUT


def test_a_pool_update_keeps_aks_label_and_taint_and_the_users(az, arm, group):
    _create(az, group, "upd1", "--labels", "team=vision")
    pool = arm.find(f"{_cluster_id(group, 'upd1')}/agentpools/gpu")["properties"]
    # what a user did with 'az aks nodepool update': a label and a taint of their own, and a larger pool
    pool["nodeLabels"]["costcenter"] = "42"
    pool["nodeTaints"].append("dedicated=ml:NoSchedule")
    pool["maxCount"] = 10
    arm.requests.clear()
    _create(az, group, "upd1", "--labels", "team=vision")
    assert _puts(arm) == ["agentpools"]
    pool = arm.find(f"{_cluster_id(group, 'upd1')}/agentpools/gpu")["properties"]
    assert pool["nodeLabels"][SPOT_LABEL[0]] == SPOT_LABEL[1], "AKS's own label, which the workers' affinity needs"
    assert (pool["nodeLabels"]["costcenter"], pool["nodeLabels"]["team"], pool["maxCount"]) == ("42", "vision", 3)
    assert set(pool["nodeTaints"]) == {"sku=gpu:NoSchedule", SPOT_TAINT, "dedicated=ml:NoSchedule"}


def test_a_cluster_update_keeps_settings_made_outside(az, arm, group):
    _create(az, group, "upd2")
    cluster = arm.find(_cluster_id(group, "upd2"))
    cluster["tags"]["owner"] = "alice"  # the portal
    cluster["properties"]["addonProfiles"] = {"azureKeyvaultSecretsProvider": {"enabled": True, "config": {
        "enableSecretRotation": "true"}}}  # 'az aks enable-addons'
    cluster["properties"]["autoUpgradeProfile"]["upgradeChannel"] = "rapid"  # a drift of ours
    arm.requests.clear()
    _create(az, group, "upd2")
    assert _puts(arm) == ["managedclusters"]
    props = arm.find(_cluster_id(group, "upd2"))["properties"]
    assert props["autoUpgradeProfile"]["upgradeChannel"] == "patch"
    assert props["addonProfiles"]["azureKeyvaultSecretsProvider"]["enabled"] is True
    assert arm.find(_cluster_id(group, "upd2"))["tags"]["owner"] == "alice"


# ---------------------------------------------------------------------------------------------- refused before asking


@pytest.mark.parametrize("args, field", [
    (["--gpu-vm-size", "Standard_NC24ads_A100_v4"], "vmSize"),
    (["--eviction-policy", "Deallocate"], "scaleSetEvictionPolicy"),
    (["--max-price", "0.5"], "spotMaxPrice"),
    (["--node-vm-size", "Standard_D4s_v5"], "vmSize"),
], ids=["gpu-size", "eviction-policy", "max-price", "system-size"])
def test_a_pool_field_aks_cannot_change_is_an_error_before_any_write(az, arm, group, args, field):
    _create(az, group, "fix1")
    arm.requests.clear()
    failed = _create(az, group, "fix1", *args, check=False)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert field in failed.stderr and "Nothing was changed" in failed.stderr
    assert arm.writes() == []


@pytest.mark.parametrize("label", ["kubernetes.azure.com/scalesetpriority=regular", "kubernetes.io/role=gpu",
                                   "node-role.kubernetes.io/gpu=true", "example.k8s.io/x=y"])
def test_a_label_under_a_reserved_prefix_is_an_az_error_before_any_request(az, arm, group, label):
    failed = _create(az, group, "lab1", "--labels", label, check=False)
    assert failed.returncode != 0 and "reserved" in failed.stderr and "Traceback" not in failed.stderr
    assert arm.requests == []


def _signed_out_az(arm_server, folder) -> AzureAz:
    az = AzureAz(folder, arm_server)
    url = arm_server.url + "/"
    az("cloud", "register", "--name", CLOUD, "--endpoint-resource-manager", url, "--endpoint-active-directory", url,
       "--endpoint-active-directory-resource-id", url, "--endpoint-active-directory-graph-resource-id", url,
       "--endpoint-management", url, "--suffix-storage-endpoint", "core.windows.net", "--skip-endpoint-discovery")
    az("cloud", "set", "--name", CLOUD)
    return az


def test_a_signed_out_dry_run_shows_an_explicit_encryption_at_host(arm, arm_server, group, tmp_path):
    signed_out = _signed_out_az(arm_server, tmp_path / "az-signed-out")
    plan = signed_out.json("elastictrain", "cluster", "create", "-g", group, "-n", "dry1", "-l", "eastus",
                           "--dry-run", "--encryption-at-host", "true")
    bodies = {r["step"]: r["body"] for r in plan["arm"]}
    assert bodies["GPU Spot pool"]["properties"]["enableEncryptionAtHost"] is True
    assert bodies["AKS cluster"]["properties"]["agentPoolProfiles"][0]["enableEncryptionAtHost"] is True


def test_a_dry_run_whose_token_cannot_be_had_plans_signed_out_and_says_why(az, arm, group):
    # the login's identity endpoint is gone (a stale profile, a network that blocks it): no token can be had
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "dry2", "-l", "eastus", "--dry-run",
                "-o", "json", env={"IDENTITY_ENDPOINT": "https://127.0.0.1:9/msi/token"}, timeout=180)
    plan = json.loads(result.stdout)
    assert "token could not be had" in plan["preflight"]["skipped"]
    assert "token could not be had" in result.stderr and "Traceback" not in result.stderr
    assert [m for m, p in arm.requests if not p.startswith("/msi/")] == [], "signed out: nothing asked of ARM"


# ---------------------------------------------------------------------------------------------- the creator's data role


def _seed_job(arm, container, name: str) -> None:
    from azext_elastictrain.core.aks.manifests import InClusterSpec, render_elastic_job
    from azext_elastictrain.core.spec import JobSpec

    spec = JobSpec(name=name, script="/app/train.py", min_nodes=1, max_nodes=3, nodes=1)
    rendered = render_elastic_job(spec, InClusterSpec(identity_client_id=str(uuid.UUID(int=1)),
                                                      checkpoint_url="https://acct1.blob.core.windows.net/checkpoints"),
                                  "myregistry.azurecr.io/elastictrain:0.1.0", run_id=f"{name}-0001")
    arm.kube.seed(k.node(0))
    arm.kube.seed(k.with_status(rendered, k.running(name), active=1))
    arm.kube.seed(k.worker_pod(name, 0, k.name_of(k.node(0))))
    events = [{"time": k.CREATED_EPOCH + 20, "event": "started", "rank": 0, "world_size": 1, "restart_count": 0},
              {"time": k.CREATED_EPOCH + 60, "event": "progress", "rank": 0, "step": 40, "world_size": 1}]
    container.upload_blob(f"{name}/events.jsonl", "".join(json.dumps(e) + "\n" for e in events), overwrite=True)


def test_the_creator_reads_their_job_and_checkpoints_on_a_fresh_cluster(az, arm, group, azurite, container):
    _create(az, group, "data1")
    name = f"j{uuid.uuid4().hex[:8]}"
    _seed_job(arm, container, name)
    where = ["-g", group, "-c", "data1"]
    shown = az.json("elastictrain", "job", "show", *where, "-n", name)
    assert (shown["state"], shown["step"]) == ("Running", 40), shown
    assert az.json("elastictrain", "checkpoint", "list", *where, "--job", name) == []
    assert not [d for d in arm.blob_front.denied if d[2] == LOGIN_OBJECT_ID and f"/{name}" in d[1]]


def test_a_login_without_the_data_role_gets_the_role_and_the_command_to_grant_it(az, arm, group, azurite, container):
    _create(az, group, "data2")
    name = f"j{uuid.uuid4().hex[:8]}"
    _seed_job(arm, container, name)
    container_scope = next(r["properties"]["scope"] for r in arm.resources.values()
                           if r["type"].endswith("roleAssignments") and f"/resourceGroups/{group}/" in r["id"]
                           and r["properties"]["principalId"] == LOGIN_OBJECT_ID and "/containers/" in r["id"])
    for rid in [rid for rid, r in arm.resources.items() if r["type"].endswith("roleAssignments")
                and r["properties"].get("scope") == container_scope]:
        del arm.resources[rid]  # a cluster made before the creator got the role, or a role removed since
    grant = (f'az role assignment create --assignee {LOGIN_OBJECT_ID} --role "Storage Blob Data Contributor" '
             f"--scope {container_scope}")
    where = ["-g", group, "-c", "data2"]
    for command in (["job", "show", *where, "-n", name], ["job", "list", *where],
                    ["checkpoint", "list", *where, "--job", name]):
        failed = az("elastictrain", *command, check=False)
        assert failed.returncode != 0 and "Traceback" not in failed.stderr, command
        assert "Storage Blob Data Contributor" in failed.stderr and grant in failed.stderr, failed.stderr
    assert [d for d in arm.blob_front.denied if d[2] == LOGIN_OBJECT_ID]
