"""az elastictrain cluster create|show|list|wait|delete -g ... through the real az against the local ARM server.

The server checks each request (method, path, api-version, body); the ``arm`` fixture fails a test that
sent anything it rejected. Kubernetes is the fake behind the server's /kube, reached with the kubeconfig
from listClusterUserCredential.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.support.arm_server import (
    ACCESS_TOKEN_SECRET,
    KUBE_TOKEN,
    OTHER_SUBSCRIPTION,
    SPOT_LABEL,
    SPOT_TAINT,
    SUBSCRIPTION,
    is_query,
)

PLAN = [  # (method, what) in the order the issue asks for
    ("PUT", "resourcegroups"), ("PUT", "storageaccounts"), ("PUT", "containers"),
    ("PUT", "userassignedidentities"), ("PUT", "managedclusters"), ("PUT", "agentpools"),
    ("PUT", "federatedidentitycredentials"), ("PUT", "roleassignments"),
    ("PUT", "roleassignments"),  # Azure Kubernetes Service RBAC Cluster Admin on the cluster, for the creator
    ("PUT", "roleassignments"),  # Storage Blob Data Contributor on the checkpoint container, for the creator
]


def _what(path: str) -> str:
    return path.lower().rstrip("/").split("/")[-2]


def _writes(arm) -> list[tuple[str, str]]:
    return [(method, _what(path)) for method, path in arm.writes()]


def _create(az, group, name="spot1", *args, check=True, timeout=300):
    return az("elastictrain", "cluster", "create", "-g", group, "-n", name, "-l", "eastus", *args,
              check=check, timeout=timeout)


def test_create_runs_the_plan_in_order_and_a_rerun_changes_nothing(az, arm, group):
    arm.expect.update(max_count=4, spot_max_price=0.35, eviction_policy="Deallocate")
    arm.lro_polls = 1  # each long-running operation InProgress at its first poll, as a slower Azure answers
    started = set(arm.operations)
    result = _create(az, group, "spot1", "--max-count", "4", "--max-price", "0.35", "--eviction-policy",
                     "Deallocate", "--labels", "team=vision", "-o", "json")
    polls = [op["polls"] for name, op in arm.operations.items() if name not in started]
    assert polls and all(n == 2 for n in polls), f"each operation polled past its InProgress answer: {polls}"
    assert _writes(arm) == PLAN
    assert "[5/11] AKS cluster: creating" in result.stderr  # progress on the long steps
    in_group = f"/resourcegroups/{group}/providers"  # the session's server also holds other tests' clusters
    pool = arm.find(f"{in_group}/microsoft.containerservice/managedclusters/spot1/agentpools/gpu")
    assert pool["properties"]["nodeLabels"]["team"] == "vision" and pool["properties"]["count"] == 0
    assert arm.kube.get("v1", "Namespace", "elastictrain") is not None
    account = arm.find(f"{in_group}/microsoft.managedidentity/userassignedidentities/spot1-training")["properties"]
    sa = arm.kube.get("v1", "ServiceAccount", "elastictrain-training", "elastictrain")
    assert sa["metadata"]["annotations"]["azure.workload.identity/client-id"] == account["clientId"]

    # as a real cluster answers a while later: AKS's own Spot taint and label on the pool, the autoscaler's counts
    assert pool["properties"]["nodeTaints"] == ["sku=gpu:NoSchedule", SPOT_TAINT]
    assert pool["properties"]["nodeLabels"][SPOT_LABEL[0]] == SPOT_LABEL[1]
    assert "/resourcegroups/" in pool["id"], "ids in ARM's casing, not the request's"
    arm.autoscale(group, "spot1", "gpu", 3)
    arm.autoscale(group, "spot1", "system", 2)
    arm.requests.clear()
    again = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "spot1", "--max-count", "4",
                    "--max-price", "0.35", "--eviction-policy", "Deallocate", "--labels", "team=vision",
                    timeout=300)
    assert [m for m, _ in arm.requests if m == "PUT"] == [], "a re-run of a finished create must send no PUT"
    assert _writes(arm) == [], "a re-run of a finished create must change nothing in Azure"
    assert {c["step"]: c["action"] for c in again["changes"]} == {
        "resource group": "unchanged", "storage account": "unchanged", "checkpoint container": "unchanged",
        "managed identity": "unchanged", "AKS cluster": "unchanged", "GPU Spot pool": "unchanged",
        "federated credential": "unchanged", "role assignment": "unchanged",
        "Kubernetes admin role": "unchanged", "your checkpoint access": "unchanged",
        "Kubernetes components": "unchanged"}
    gpu = next(p for p in again["pools"] if p["name"] == "gpu")
    assert (gpu["priority"], gpu["evictionPolicy"], gpu["spotMaxPrice"], gpu["minCount"], gpu["maxCount"]) == (
        "Spot", "Deallocate", 0.35, 0, 4)


@pytest.mark.parametrize("drift, field", [
    (lambda props: props.update(maxCount=10), "maxCount"),
    (lambda props: props.update(nodeTaints=[SPOT_TAINT]), "nodeTaints"),
], ids=["max-count-changed", "our-taint-removed"])
def test_a_real_drift_of_the_spot_pool_is_fixed_by_one_put(az, arm, group, drift, field):
    _create(az, group, "drift1")
    pool_suffix = f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/drift1/agentpools/gpu"
    drift(arm.find(pool_suffix)["properties"])  # what a user did with 'az aks nodepool update'
    arm.requests.clear()
    result = _create(az, group, "drift1", "-o", "json")
    assert _writes(arm) == [("PUT", "agentpools")]
    assert f"GPU Spot pool: updating (properties.{field})" in result.stderr
    props = arm.find(pool_suffix)["properties"]
    assert (props["maxCount"], props["nodeTaints"]) == (3, ["sku=gpu:NoSchedule", SPOT_TAINT])


def test_show_list_and_tables(az, arm, group):
    _create(az, group, "spot2")
    arm.kube.set_status("apps/v1", "StatefulSet", "elastictrain-etcd", "elastictrain", {"readyReplicas": 1})
    arm.kube.set_status("apps/v1", "Deployment", "elastictrain-elastic-job-controller", "elastictrain",
                        {"conditions": [{"type": "Available", "status": "True"}]})
    arm.kube.set_status("apiextensions.k8s.io/v1", "CustomResourceDefinition", "elasticjobs.elastic.pytorch.org",
                        None, {"conditions": [{"type": "Established", "status": "True"}]})
    shown = az.json("elastictrain", "cluster", "show", "-g", group, "-n", "spot2")
    assert shown["health"] == "Healthy", shown["components"]
    assert set(shown["components"]) >= {"etcd", "operator", "nvidia-device-plugin"}
    gpu = next(p for p in shown["pools"] if p["name"] == "gpu")
    assert (gpu["priority"], gpu["evictionPolicy"], gpu["spotMaxPrice"], gpu["taints"]) == (
        "Spot", "Delete", -1, ["sku=gpu:NoSchedule", SPOT_TAINT])  # AKS's own taint too, as Azure shows it
    system = next(p for p in shown["pools"] if p["name"] == "system")
    assert (system["priority"], system["minCount"], system["maxCount"]) == ("Regular", 1, 3)
    assert shown["storage"]["allowSharedKeyAccess"] is False and shown["storage"]["minimumTlsVersion"] == "TLS1_2"
    assert shown["identity"]["clientId"]

    table = az("elastictrain", "cluster", "show", "-g", group, "-n", "spot2", "-o", "table").stdout
    assert "Spot" in table and "Standard_NC4as_T4_v3" in table and "Healthy" in table
    listed = az.json("elastictrain", "cluster", "list", "-g", group)
    assert [c["name"] for c in listed] == ["spot2"]
    assert "spot2" in az("elastictrain", "cluster", "list", "-o", "table").stdout

    missing = az("elastictrain", "cluster", "show", "-g", group, "-n", "nothere", check=False)
    assert missing.returncode == 3 and "nothere" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.parametrize("suffix, status, code, failed_step", [
    ("/agentpools/gpu", 400, "InvalidParameter", "GPU Spot pool"),
    ("/federatedidentitycredentials/spot3-elastictrain-training", 409, "Conflict", "federated credential"),
])
def test_an_arm_error_half_way_is_clear_and_a_rerun_finishes_the_plan(az, arm, group, suffix, status, code,
                                                                      failed_step):
    arm.fail_once("PUT", suffix, status, code, "Spot quota exceeded for this test")
    failed = _create(az, group, "spot3", check=False)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"{failed_step} failed: {code}: Spot quota exceeded for this test" in failed.stderr
    assert "Completed before it: resource group, storage account" in failed.stderr
    assert "run the same 'az elastictrain cluster create" in failed.stderr
    done = _writes(arm)
    assert done == PLAN[:len(done)] and done[-1] == ("PUT", _what(suffix)), "it stops at the failed step"
    arm.requests.clear()
    _create(az, group, "spot3")
    rest = _writes(arm)
    assert rest == PLAN[len(done) - 1:], "the re-run must do exactly what the failed run did not"


def test_conflict_on_the_storage_account_name_is_an_az_error_with_advice(az, arm, group):
    arm.fail_once("PUT", "/storageaccounts/mytakenname", 409, "StorageAccountAlreadyTaken",
                  "The storage account named mytakenname is already taken.")
    failed = _create(az, group, "spot4", "--storage-account", "mytakenname", check=False)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "StorageAccountAlreadyTaken" in failed.stderr and "Completed before it: resource group." in failed.stderr


def test_no_wait_returns_after_starting_the_cluster_and_wait_then_a_rerun_finishes(az, arm, group):
    started = _create(az, group, "spot5", "--no-wait")
    assert started.stdout.strip() == ""
    assert _writes(arm) == PLAN[:5]
    assert "az elastictrain cluster wait" in started.stderr
    az("elastictrain", "cluster", "wait", "-g", group, "-n", "spot5", "--created", "--interval", "1",
       "--timeout", "60")
    arm.requests.clear()
    _create(az, group, "spot5")
    assert _writes(arm) == PLAN[5:]


def test_dry_run_prints_every_request_and_calls_nothing(az, arm, group):
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "spot6", "-l", "eastus", "--dry-run")
    assert arm.writes() == [], "a dry run changes nothing"
    asked = [(m, p.split("?")[0].lower()) for m, p in arm.requests
             if not p.startswith("/msi/token") and not is_query(p)]  # the Resource Graph query reads too
    reads = ("/providers/microsoft.compute/", f"/resourcegroups/{group}/providers/microsoft.containerservice/",
             f"/resourcegroups/{group}/providers/microsoft.storage/storageaccounts/")
    assert asked and all(m == "GET" and any(r in p for r in reads) or (m, p.rsplit("/", 1)[1]) == (
        "POST", "checknameavailability") for m, p in asked), asked  # the preflight's reads, and nothing else
    assert [r["step"] for r in plan["arm"]] == [
        "resource group", "storage account", "checkpoint container", "managed identity", "AKS cluster",
        "GPU Spot pool", "federated credential", "role assignment", "Kubernetes admin role",
        "your checkpoint access"]
    bodies = {r["step"]: r["body"] for r in plan["arm"]}
    assert bodies["GPU Spot pool"]["properties"]["scaleSetPriority"] == "Spot"
    assert bodies["storage account"]["properties"]["allowSharedKeyAccess"] is False
    assert all(r["id"].startswith(f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}") for r in plan["arm"])
    assert {o["kind"] for o in plan["kubernetes"]} >= {"Namespace", "ServiceAccount", "StatefulSet", "Deployment",
                                                       "DaemonSet", "ConfigMap", "CustomResourceDefinition"}


def test_subscription_argument_places_the_plan_and_every_request_in_that_subscription(az, arm, group):
    other = f"/subscriptions/{OTHER_SUBSCRIPTION}/"
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "spot9", "-l", "eastus", "--dry-run",
                   "--subscription", OTHER_SUBSCRIPTION)
    assert all(r["id"].startswith(f"{other}resourceGroups/{group}") for r in plan["arm"]), \
        [r["id"] for r in plan["arm"]]
    role = next(r for r in plan["arm"] if r["step"] == "role assignment")
    assert role["body"]["properties"]["roleDefinitionId"].startswith(other)

    _create(az, group, "spot9", "--subscription", OTHER_SUBSCRIPTION)
    assert _writes(arm) == PLAN
    sent = [path for _, path in arm.requests if path.startswith("/subscriptions/")]
    assert sent and all(path.startswith(other) for path in sent), sent  # reads too, not only the writes
    assignments = [rid for rid in arm.resources if "/roleassignments/" in rid and f"/resourcegroups/{group}/" in rid
                   and "/containers/" in rid]
    assert len(assignments) == 2, assignments  # the workload identity's and the creator's
    for assignment in assignments:
        assert assignment.startswith(other.lower()), assignment  # the scope: the container in that subscription
        assert arm.resources[assignment]["properties"]["roleDefinitionId"].startswith(other)


def test_a_sovereign_cloud_blob_endpoint_flows_from_arm_to_the_configmap_unchanged(az, arm, group, monkeypatch):
    from azext_elastictrain.core.aks.manifests import CHECKPOINT_CONFIGMAP, CHECKPOINT_URL_KEY
    from azext_elastictrain.core.spec import CHECKPOINT_CONTAINER

    monkeypatch.setattr(arm, "blob_endpoint", "https://ckptcn01.blob.core.chinacloudapi.cn/")  # ARM's answer
    shown = json.loads(_create(az, group, "spot10", "-o", "json").stdout)
    want = f"https://ckptcn01.blob.core.chinacloudapi.cn/{CHECKPOINT_CONTAINER}"
    configmap = arm.kube.get("v1", "ConfigMap", CHECKPOINT_CONFIGMAP, "elastictrain")
    assert configmap["data"][CHECKPOINT_URL_KEY] == want
    assert shown["storage"]["checkpointUrl"] == want
    assert "core.windows.net" not in json.dumps(shown)


def test_delete_asks_and_keeps_storage_unless_asked(az, arm, group):
    _create(az, group, "spot7")
    account = next(rid for rid in arm.resources if f"/resourcegroups/{group}/providers/microsoft.storage/" in rid
                   and rid.count("/") == 8)
    unconfirmed = az("elastictrain", "cluster", "delete", "-g", group, "-n", "spot7", check=False)
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr
    assert arm.find("/managedclusters/spot7") is not None, "nothing goes before confirmation"

    plan = az.json("elastictrain", "cluster", "delete", "-g", group, "-n", "spot7", "--dry-run")
    assert [d["step"] for d in plan["delete"]] == ["role assignment", "federated credential", "AKS cluster",
                                                   "managed identity"]
    assert plan["keep"][0]["what"] == "storage account and its checkpoints"
    arm.requests.clear()
    deleted = az.json("elastictrain", "cluster", "delete", "-g", group, "-n", "spot7", "--yes", timeout=300)
    assert [m for m, _ in arm.writes()] == ["DELETE"] * 4
    assert arm.find("/managedclusters/spot7") is None and arm.find("/userassignedidentities/spot7-training") is None
    assert account in arm.resources and deleted["kept"], "checkpoints are kept by default"
    az("elastictrain", "cluster", "wait", "-g", group, "-n", "spot7", "--deleted", "--interval", "1",
       "--timeout", "10")  # a missing cluster is a 404 to 'wait', so --deleted returns at once

    az("elastictrain", "cluster", "delete", "-g", group, "-n", "spot7", "--delete-storage", "--yes")
    assert account not in arm.resources
    gone = az("elastictrain", "cluster", "delete", "-g", group, "-n", "spot7", "--yes", check=False)
    assert gone.returncode == 3 and "spot7" in gone.stderr


@pytest.mark.parametrize("args, expected", [
    (["-n", "bad name!"], "invalid cluster name"),
    (["-n", "x" * 64], "invalid cluster name"),
    (["-n", "ok", "--storage-account", "Has_Upper"], "invalid storage account name"),
    (["-n", "ok", "--storage-account", "ab"], "invalid storage account name"),
    (["-n", "ok", "--gpu-vm-size", "NC6"], "invalid GPU VM size"),
    (["-n", "ok", "--min-count", "5", "--max-count", "2"], "--min-count 5 is more than --max-count 2"),
    (["-n", "ok", "--max-price", "0.123456"], "more than 5 decimals"),
    (["-n", "ok", "--max-price", "0"], "must be -1"),
    (["-n", "ok", "--max-price", "-2"], "must be -1"),
    (["-n", "ok", "--labels", "novalue"], "invalid label"),
])
def test_bad_input_fails_before_any_request(az, arm, group, args, expected):
    result = az("elastictrain", "cluster", "create", "-g", group, "-l", "eastus", *args, check=False)
    assert result.returncode == 2 or result.returncode == 1
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert arm.requests == [], f"bad input reached Azure: {arm.requests}"


def test_no_secret_in_any_output_or_log(az, arm, group):
    outputs = []
    for args in (["create", "-g", group, "-n", "spot8", "-l", "eastus", "--debug"],
                 ["show", "-g", group, "-n", "spot8", "--debug"],
                 ["create", "-g", group, "-n", "spot8", "--dry-run", "--debug"],
                 ["delete", "-g", group, "-n", "spot8", "--yes", "--debug"]):
        result = az("elastictrain", "cluster", *args, timeout=300)
        outputs += [result.stdout, result.stderr]
    logs = [p.read_text(errors="replace") for p in az.config_dir.rglob("*") if p.is_file()
            and p.suffix in (".log", ".txt", "")]
    token_signature = re.escape(arm_token_signature())
    for text in outputs + logs:
        assert KUBE_TOKEN not in text
        assert ACCESS_TOKEN_SECRET not in text and not re.search(token_signature, text)
        assert "client-key-data" not in text and "kubeconfigs" not in text


def arm_token_signature() -> str:
    import base64

    return base64.urlsafe_b64encode(ACCESS_TOKEN_SECRET.encode()).decode().rstrip("=")


def test_credentials_reach_a_kubeconfig_only_when_asked(az, arm, group, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    env = {"KUBECONFIG": str(kubeconfig)}
    _create(az, group, "spot9")
    az("elastictrain", "cluster", "show", "-g", group, "-n", "spot9", env=env)
    assert not kubeconfig.exists() and not (az.config_dir / ".kube").exists(), "credentials stay in memory"
    result = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "spot9", "--merge-kubeconfig", env=env)
    assert result["kubeconfig"] == {"path": str(kubeconfig), "context": "spot9"}
    written = kubeconfig.read_text()  # an Entra ID-only cluster's: kubelogin for kubectl, no secret in it
    assert "kubelogin" in written and "6dae42f8-4368-4678-94ff-3960e28e3630" in written
    assert "client-key-data" not in written and oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
    assert "kubelogin" not in json_text(result)


def json_text(value) -> str:
    import json

    return json.dumps(value)
