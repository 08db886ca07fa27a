"""Entra ID-only AKS through the real az: planned, created, reached with the login's token for the AKS server
application; a token that expires in the middle of a command recovers once; --local-accounts still works.

The ARM test server's Kubernetes front authenticates as the API server of each cluster: an Entra ID-only one
takes only a bearer JWT of the tenant whose audience is the AKS server application (no client certificate, no
other audience), a local-accounts one its client certificate; ``kube_requests`` records how each request
authenticated. The login is 'az login --identity' against the server's managed-identity endpoint, so the
tokens are those a managed identity gets.
"""
from __future__ import annotations

import base64
import json
import uuid

import pytest
import requests

from azext_elastictrain.core.aks import arm_bodies
from tests.support import aks_objects as k
from tests.support.arm_server import (
    AKS_RBAC_CLUSTER_ADMIN,
    AKS_SERVER_APP,
    API_VERSIONS,
    IDENTITY_HEADER,
    LOGIN_OBJECT_ID,
    STATIC_CREDENTIAL_REFUSED,
    SUBSCRIPTION,
)

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
NAMESPACE = "elastictrain"


def _cluster_requests(arm, name: str) -> list[dict]:
    return [r for r in arm.kube_requests if r["cluster"] == name.lower()]


def _cluster_id(group: str, name: str) -> str:
    return f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.ContainerService/" \
           f"managedClusters/{name}"


@pytest.fixture(scope="module")
def entra_cluster(azure_login, arm_server, azurite, container):  # noqa: ARG001  (container: exists before reads)
    """An Entra ID-only cluster made by 'cluster create', with Spot GPU and system nodes."""
    group = f"rg-{uuid.uuid4().hex[:10]}"
    azure_login("elastictrain", "cluster", "create", "-g", group, "-n", "entra1", "-l", "eastus", timeout=300)
    for node in [k.node(i) for i in range(3)] + [k.node(0, pool="system", spot=False)]:
        arm_server.kube.seed(node)
    return group


def test_the_plan_is_entra_id_only_with_the_creator_as_kubernetes_admin(az, arm, group):
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "plan1", "-l", "eastus", "--dry-run")
    bodies = {r["step"]: r for r in plan["arm"]}
    cluster = bodies["AKS cluster"]["body"]["properties"]
    # the fields of the official example ManagedClustersCreate_UpdateWithEnableAzureRBAC, and local accounts off
    assert cluster["aadProfile"] == {"managed": True, "enableAzureRBAC": True}
    assert cluster["disableLocalAccounts"] is True and cluster["enableRBAC"] is True
    admin = bodies["Kubernetes admin role"]
    scope = _cluster_id(group, "plan1")
    assert admin["id"] == f"{scope}/providers/Microsoft.Authorization/roleAssignments/" + \
        arm_bodies.role_assignment_name(scope, LOGIN_OBJECT_ID, AKS_RBAC_CLUSTER_ADMIN)
    assert admin["body"]["properties"] == {
        "roleDefinitionId": f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/"
                            f"{AKS_RBAC_CLUSTER_ADMIN}",
        "principalId": LOGIN_OBJECT_ID, "principalType": "ServicePrincipal"}  # the login is a managed identity
    assert arm.writes() == [], "a dry run changes nothing"

    other = str(uuid.uuid4())
    chosen = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "plan1", "-l", "eastus", "--dry-run",
                     "--admin-principal", other)
    admin = next(r for r in chosen["arm"] if r["step"] == "Kubernetes admin role")
    assert admin["body"]["properties"]["principalId"] == other and "principalType" not in admin["body"]["properties"]
    assert admin["id"].endswith(arm_bodies.role_assignment_name(scope, other, AKS_RBAC_CLUSTER_ADMIN))


@pytest.mark.parametrize("args, expected", [
    (["--admin-principal", "alice@contoso.com"], "invalid --admin-principal"),
])
def test_bad_access_options_are_az_errors_before_any_request(az, arm, group, args, expected):
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "bad1", "-l", "eastus", *args, check=False)
    assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr
    assert arm.writes() == []


def test_with_local_accounts_admin_principal_names_who_reads_the_checkpoints(az, arm, group):
    """With --local-accounts there is no Kubernetes role to give, but the checkpoint container's data role still
    goes to someone: --admin-principal names them (a login whose token has no object id is told to pass it), and
    no Kubernetes admin role is planned."""
    other = str(uuid.uuid4())
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "local1", "-l", "eastus", "--dry-run",
                   "--local-accounts", "--admin-principal", other)
    steps = {r["step"]: r for r in plan["arm"]}
    assert "Kubernetes admin role" not in steps
    assert steps["your checkpoint access"]["body"]["properties"]["principalId"] == other
    assert arm.writes() == []


def test_an_entra_cluster_is_created_and_reached_only_with_aks_tokens(az, arm, entra_cluster):
    stored = arm.find(f"/resourcegroups/{entra_cluster}/providers/microsoft.containerservice/managedclusters/entra1")
    assert stored["properties"]["aadProfile"]["enableAzureRBAC"] is True
    assert stored["properties"]["disableLocalAccounts"] is True
    scope = _cluster_id(entra_cluster, "entra1")
    name = arm_bodies.role_assignment_name(scope, LOGIN_OBJECT_ID, AKS_RBAC_CLUSTER_ADMIN)
    assigned = arm.find(f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}")
    assert assigned["properties"]["principalId"] == LOGIN_OBJECT_ID

    shown = az.json("elastictrain", "cluster", "show", "-g", entra_cluster, "-n", "entra1")
    assert (shown["entraId"], shown["azureRbac"], shown["localAccounts"]) == (True, True, False)
    seen = _cluster_requests(arm, "entra1")
    assert seen and all(r["auth"] == "token" and r["status"] != 401 for r in seen), seen
    tokens = [p for m, p in arm.requests if p.startswith("/msi/token")]
    assert any(f"resource={AKS_SERVER_APP}" in p for p in tokens), "a token for the AKS server application"


def test_job_run_show_logs_and_wait_on_an_entra_cluster(az, arm, entra_cluster):
    where = ["-g", entra_cluster, "-c", "entra1"]
    name = f"j{uuid.uuid4().hex[:8]}"
    az("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py", "--min-nodes", "1",
       "--max-nodes", "2", *where, timeout=120)
    job = arm.kube.get("elastic.pytorch.org/v1alpha1", "ElasticJob", name, NAMESPACE)
    assert job is not None
    arm.kube.set_status("elastic.pytorch.org/v1alpha1", "ElasticJob", name, NAMESPACE,
                        {"conditions": k.running(name), "replicaStatuses": {"Worker": {"active": 2}}})
    for index in range(2):
        arm.kube.seed(k.worker_pod(name, index, k.name_of(k.node(index))))
    arm.kube.set_logs(f"{name}-worker-1", NAMESPACE, "rank1 step 1\nrank1 step 2\n")
    shown = az.json("elastictrain", "job", "show", "-n", name, *where)
    assert shown["name"] == name and [n["pod"] for n in shown["nodes"]] == [f"{name}-worker-0", f"{name}-worker-1"]
    assert az("elastictrain", "job", "logs", "-n", name, *where, "--rank", "1").stdout.splitlines() == [
        "rank1 step 1", "rank1 step 2"]
    waited = az("elastictrain", "job", "wait", "-n", name, *where, "--step", "10", "--timeout", "12", check=False)
    assert waited.returncode == 1 and "timed out" in waited.stderr and "Traceback" not in waited.stderr
    assert ("ElasticJob", name) in arm.kube_watches, "between two looks, wait watches the job"
    seen = _cluster_requests(arm, "entra1")
    assert any(r["method"] == "PATCH" for r in seen) and any(r["path"].endswith("/log") for r in seen)
    assert all(r["auth"] == "token" and r["status"] != 401 for r in seen), [r for r in seen if r["auth"] != "token"]


def test_a_token_that_expires_mid_command_is_renewed_once_and_the_command_goes_on(az, arm, entra_cluster):
    arm.kube_token_uses = 3  # every Entra ID token expires after three requests: several times in one command
    try:
        name = f"j{uuid.uuid4().hex[:8]}"
        az("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py",
           "--min-nodes", "1", "--max-nodes", "2", "-g", entra_cluster, "-c", "entra1", timeout=120)
        shown = az.json("elastictrain", "job", "show", "-n", name, "-g", entra_cluster, "-c", "entra1")
    finally:
        arm.kube_token_uses = None
    assert shown["name"] == name
    seen = _cluster_requests(arm, "entra1")
    refused = [i for i, r in enumerate(seen) if r["status"] == 401]
    assert refused, "the front refused expired tokens"
    for i in refused:  # each 401 answered by one new token, which the front took
        assert seen[i + 1]["jti"] != seen[i]["jti"] and seen[i + 1]["status"] != 401, seen[i:i + 2]
    assert len({r["jti"] for r in seen}) >= len(refused) + 1


def test_the_front_refuses_a_client_certificate_no_token_and_another_audience(arm, entra_cluster):
    url = f"{arm.url}/kube/{entra_cluster}/entra1/api/v1/namespaces"

    def token(resource: str) -> str:
        answer = requests.get(f"{arm.url}/msi/token", params={"resource": resource, "api-version": "2019-08-01"},
                              headers={"X-IDENTITY-HEADER": IDENTITY_HEADER}, verify=str(arm.cert), timeout=10)
        return answer.json()["access_token"]

    folder = arm.cert.parent
    (folder / "client.pem").write_bytes(arm.client_certificate())
    answers = {
        "none": requests.get(url, verify=str(arm.cert), timeout=10),
        "certificate": requests.get(url, verify=str(arm.cert), cert=str(folder / "client.pem"), timeout=10),
        "arm audience": requests.get(url, verify=str(arm.cert), timeout=10,
                                     headers={"Authorization": f"Bearer {token(arm.url + '/')}"}),
        "aks audience": requests.get(url, verify=str(arm.cert), timeout=10,
                                     headers={"Authorization": f"Bearer {token(AKS_SERVER_APP)}"}),
    }
    assert {what: r.status_code for what, r in answers.items()} == {
        "none": 401, "certificate": 401, "arm audience": 401, "aks audience": 200}
    assert answers["none"].json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": "Unauthorized", "reason": "Unauthorized", "code": 401}


def test_the_admin_credentials_of_an_entra_cluster_are_refused_as_azure_does(az, arm, entra_cluster):
    path = f"{_cluster_id(entra_cluster, 'entra1')}/listClusterAdminCredential"
    result = az("rest", "--method", "post", "--url",
                f"{arm.url}{path}?api-version={API_VERSIONS['Microsoft.ContainerService']}", check=False)
    assert result.returncode != 0 and STATIC_CREDENTIAL_REFUSED in result.stderr
    user = az.json("rest", "--method", "post", "--url",
                   f"{arm.url}{path.replace('Admin', 'User')}?api-version={API_VERSIONS['Microsoft.ContainerService']}")
    kubeconfig = base64.b64decode(user["kubeconfigs"][0]["value"]).decode()
    assert "kubelogin" in kubeconfig and AKS_SERVER_APP in kubeconfig and "client-key-data" not in kubeconfig


def test_local_accounts_keep_the_certificate_path_and_warn(az, arm, group, azurite, container):  # noqa: ARG001
    arm.expect["local_accounts"] = True
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "local1", "-l", "eastus", "--local-accounts",
                "-o", "json", timeout=300)
    assert "--local-accounts" in result.stderr and "unaudited" in result.stderr
    stored = arm.find(f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/local1")
    assert stored["properties"]["disableLocalAccounts"] is False and "aadProfile" not in stored["properties"]
    assert not [rid for rid in arm.resources if "/managedclusters/local1/providers/microsoft.authorization/" in rid]
    for node in [k.node(i) for i in range(2)] + [k.node(0, pool="system", spot=False)]:
        arm.kube.seed(node)
    name = f"j{uuid.uuid4().hex[:8]}"
    az("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py",
       "--min-nodes", "1", "--max-nodes", "2", "-g", group, "-c", "local1", timeout=120)
    assert arm.kube.get("elastic.pytorch.org/v1alpha1", "ElasticJob", name, NAMESPACE) is not None
    seen = _cluster_requests(arm, "local1")
    assert seen and all(r["auth"] == "certificate" and r["status"] != 401 for r in seen), seen
    assert not [p for _, p in arm.requests if f"resource={AKS_SERVER_APP}" in p], "no Entra ID token needed"
    shown = json.loads(result.stdout)
    assert (shown["entraId"], shown["localAccounts"]) == (False, True)
