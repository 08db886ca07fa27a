"""az elastictrain evict simulate -g ... -c ... through the real az against the local ARM server.

The server holds a running AKS cluster (``seed_aks_training``): Spot GPU nodes whose providerIDs point at VMSS
instances in the node resource group, a Regular system node, an ElasticJob with worker pods. Each eviction must
reach ARM as the official VirtualMachineScaleSetVM_SimulateEviction example has it (POST, the path's shape, no
body, 204) at the api-version azure-cli's compute client sends; the ``arm`` fixture fails a test on any request
the server rejected.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.support.arm_server import ACCESS_TOKEN_SECRET, API_VERSIONS, KUBE_TOKEN, SUBSCRIPTION

CLUSTER = "trainer"
SIMULATE_EXAMPLE = (Path(__file__).resolve().parents[1] / "data" / "arm-examples"
                    / "VirtualMachineScaleSetVM_SimulateEviction.json")
# The example's path template (SDK_OPERATION_CONTRACTS.md, VirtualMachineScaleSetVMsOperations.simulate_eviction)
SIMULATE = re.compile(r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/"
                      r"virtualMachineScaleSets/(?P<vmss>[^/]+)/virtualMachines/(?P<id>[^/]+)/simulateEviction")


def _evictions(arm) -> list[tuple[str, str, dict]]:
    """(method, path, query) of every simulateEviction request the server saw."""
    from urllib.parse import parse_qs, urlsplit

    found = []
    for method, raw in arm.requests:
        parts = urlsplit(raw)
        if parts.path.lower().endswith("/simulateeviction"):
            found.append((method, parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}))
    return found


def _evict(az, group, *args, check=True):
    return az("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, *args, check=check, timeout=120)


def _node_gone(arm, node: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while arm.kube.get("v1", "Node", node) is not None:
        assert time.monotonic() < deadline, f"node {node} never left the fake cluster"
        time.sleep(0.1)


def test_evict_a_node_sends_the_official_request_and_the_instance_is_gone(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER)
    node = seeded["gpuNodes"][0]
    result = json.loads(_evict(az, group, "--node", node, "--yes", "-o", "json").stdout)

    [(method, path, query)] = _evictions(arm)
    assert method == "POST"
    # the official example: the same parameters in the path, and 204 is the answer
    example = json.loads(SIMULATE_EXAMPLE.read_text())
    assert set(example["parameters"]) == {"subscriptionId", "resourceGroupName", "vmScaleSetName", "instanceId",
                                          "api-version"}
    assert list(example["responses"]) == ["204"]
    match = SIMULATE.fullmatch(path)
    assert match, path
    # AKS writes the node resource group in lower case in providerIDs; ARM takes it either way
    assert (match["sub"], match["rg"], match["vmss"], match["id"]) == (
        SUBSCRIPTION, seeded["nodeResourceGroup"].lower(), seeded["gpuVmss"], "0")
    assert query == {"api-version": API_VERSIONS["Microsoft.Compute"]}  # the SDK's, not the example's

    [eviction] = result["evictions"]
    assert (eviction["node"], eviction["pool"], eviction["vmss"], eviction["instanceId"], eviction["state"]) == (
        node, "gpu", seeded["gpuVmss"], "0", "Evicted")
    assert eviction["ranks"] == [0] and eviction["pods"][0]["pod"] == "cifar-worker-0"
    assert eviction["resourceGroup"].lower() == seeded["nodeResourceGroup"].lower() and eviction["evictedAt"]

    # gone from the scale set at once, as the real az sees it; the node leaves the cluster a moment later
    listed = az.json("vmss", "list-instances", "-g", seeded["nodeResourceGroup"], "-n", seeded["gpuVmss"])
    assert sorted(vm["instanceId"] for vm in listed) == ["1", "2"]
    _node_gone(arm, node)
    arm.requests.clear()
    again = _evict(az, group, "--node", node, "--yes", check=False)
    assert again.returncode == 3 and f"no node {node!r}" in again.stderr and "Traceback" not in again.stderr
    assert _evictions(arm) == []


def test_a_node_still_listed_after_its_instance_went_is_reported_gone(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER)
    arm.expect["node_gone_after"] = 30  # the cloud node manager has not caught up yet
    node = seeded["gpuNodes"][1]
    _evict(az, group, "--node", node, "--yes", "-o", "none")
    second = az.json("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--node", node, "--yes")
    assert second["evictions"][0]["state"] == "AlreadyGone"
    assert [m for m, _, _ in _evictions(arm)] == ["POST", "POST"]


def test_evict_by_job_rank_and_by_pool_count(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER, gpu_nodes=3, workers=2)
    by_rank = az.json("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--job", "cifar", "--rank",
                      "1", "--yes")
    assert [(e["node"], e["ranks"]) for e in by_rank["evictions"]] == [(seeded["gpuNodes"][1], [1])]
    assert by_rank["by"] == {"job": "cifar", "rank": 1}
    _node_gone(arm, seeded["gpuNodes"][1])

    arm.requests.clear()
    by_pool = az("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--pool", "gpu", "--count", "2",
                 "--yes", "-o", "table", timeout=120).stdout
    assert seeded["gpuNodes"][0] in by_pool and seeded["gpuNodes"][2] in by_pool and "Evicted" in by_pool
    assert sorted(SIMULATE.fullmatch(p)["id"] for _, p, _ in _evictions(arm)) == ["0", "2"]


def test_evict_a_whole_job_and_wait_until_its_nodes_left(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER, workers=2)
    result = az("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--job", "cifar", "--wait",
                "--yes", "-o", "json", timeout=120)
    evictions = json.loads(result.stdout)["evictions"]
    assert [e["node"] for e in evictions] == seeded["gpuNodes"][:2]
    for eviction in evictions:
        recovery = eviction["recovery"]
        assert recovery["instanceGone"] is True and recovery["nodeGoneSeconds"] >= 0
        assert "cannot read the job's events" in recovery["eventsError"]  # this cluster's storage is not served
    assert arm.kube.get("v1", "Node", seeded["gpuNodes"][0]) is None
    assert arm.kube.list("v1", "Pod", "elastictrain") == [], "pods of a lost node are collected"


def test_a_deallocate_eviction_is_followed_until_the_node_is_out_of_service(az, arm, group):
    """Eviction policy Deallocate: the instance stays (stopped, still counted against the Spot quota), the node
    stays listed, NotReady with the shutdown taint, then the out-of-service taint with which PodGC deletes its
    pods; --wait follows it to that end, saying what it waits for, where before it waited for the node to go."""
    seeded = arm.seed_aks_training(group, CLUSTER, eviction_policy="Deallocate")
    arm.expect["node_gone_after"] = 1.0  # stands for the ~3 minutes of a real eviction; out of service ~3 s later
    node = seeded["gpuNodes"][1]
    result = az("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--node", node, "--wait", "--yes",
                "-o", "json", timeout=120)
    (eviction,) = json.loads(result.stdout)["evictions"]
    recovery = eviction["recovery"]
    assert (recovery["node"], recovery["instanceGone"]) == ("Deallocated", False), recovery
    assert recovery["nodeGoneSeconds"] >= 3.0, "followed to the out-of-service taint, not the shutdown taint"
    assert "was deallocated" in result.stderr and "out of service" in result.stderr, result.stderr
    listed = arm.kube.get("v1", "Node", node)
    assert listed is not None and {t["key"] for t in listed["spec"]["taints"]} >= {
        "node.cloudprovider.kubernetes.io/shutdown", "node.kubernetes.io/out-of-service"}
    assert [p["metadata"]["name"] for p in arm.kube.list("v1", "Pod", "elastictrain")] == ["cifar-worker-0"], \
        "PodGC deleted the pod of the node out of service"
    instances = az.json("vmss", "list-instances", "-g", seeded["nodeResourceGroup"], "-n", seeded["gpuVmss"])
    assert sorted(vm["instanceId"] for vm in instances) == ["0", "1", "2"], "a deallocated instance stays"
    arm.requests.clear()
    again = _evict(az, group, "--node", node, "--yes", check=False)
    assert again.returncode == 1 and "is already evicted: its VM was deallocated" in again.stderr, again.stderr
    assert _evictions(arm) == [] and "Traceback" not in again.stderr


def test_wait_reports_recovery_seconds_and_steps_lost_from_the_jobs_events(az, arm, group, container):
    """--wait follows the job to its recovery through the events in the cluster's blob storage, read with
    the login. The survivor's side is played here: once the node is gone, the events a re-formed job writes."""
    import threading

    az("elastictrain", "cluster", "create", "-g", group, "-n", CLUSTER, "-l", "eastus", timeout=300)  # storage
    seeded = arm.seed_aks_training(group, CLUSTER, workers=2)
    victim = seeded["gpuNodes"][1]
    t0 = time.time()

    def event(at: float, kind: str, **fields) -> dict:
        return {"time": at, "event": kind, "rank": 0, "node": seeded["gpuNodes"][0], **fields}

    def write(events: list[dict]) -> None:
        container.upload_blob("cifar/events.jsonl", "".join(json.dumps(e) + "\n" for e in events), overwrite=True)

    before = [event(t0 - 30, "started", world_size=2), event(t0 - 29, "restored", step=0, world_size=2),
              event(t0 - 10, "checkpoint", step=90), event(t0 - 2, "progress", step=100, world_size=2)]
    write(before)

    def survivor() -> None:
        deadline = time.time() + 60
        while arm.kube.get("v1", "Node", victim) is not None and time.time() < deadline:
            time.sleep(0.1)
        at = time.time() + 3  # after az saw the node gone (it looks every 2 s)
        write(before + [event(at, "started", world_size=1), event(at + 0.5, "restored", step=90, world_size=1),
                        event(at + 1, "progress", step=91, world_size=1)])

    thread = threading.Thread(target=survivor, daemon=True)
    thread.start()
    result = az.json("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--job", "cifar", "--rank",
                     "1", "--wait", "--yes", timeout=180)
    thread.join(timeout=60)
    (eviction,) = result["evictions"]
    recovery = eviction["recovery"]
    assert eviction["node"] == victim and recovery["instanceGone"] is True, eviction
    assert "eventsError" not in recovery, recovery
    assert (recovery["resumedFromStep"], recovery["stepsLost"], recovery["worldSize"]) == (90, 10, 1), recovery
    assert 0 < recovery["recoverySeconds"] < 30


def test_dry_run_and_no_confirmation_evict_nothing(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER)
    plan = az.json("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, "--job", "cifar", "--dry-run")
    assert plan["dryRun"] is True and [t["node"] for t in plan["targets"]] == seeded["gpuNodes"][:2]
    assert [t["ranks"] for t in plan["targets"]] == [[0], [1]]
    unconfirmed = _evict(az, group, "--node", seeded["gpuNodes"][0], check=False)
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr
    assert _evictions(arm) == [] and all(m == "GET" or p.startswith("/kube") or p.endswith("Credential?api-version="
                                         + API_VERSIONS["Microsoft.ContainerService"]) for m, p in arm.requests)


@pytest.mark.parametrize("args, code, expected", [
    (["--node", "aks-nosuch-12345678-vmss000009"], 3, "has no node 'aks-nosuch-12345678-vmss000009'"),
    (["--node", "{system}"], 1, "not Spot"),
    (["--job", "nosuch"], 3, "no job 'nosuch'"),
    (["--job", "cifar", "--rank", "5"], 3, "has no rank 5"),
    (["--pool", "gpu2"], 3, "no node pool 'gpu2'"),
    (["--node", "{gpu}", "--job", "cifar"], 1, "exactly one of --node"),
    (["--job", "cifar", "--rank", "-1"], 1, "--rank must be"),
    (["--node", "{gpu}", "--notice-seconds", "5"], 1, "for the local cluster"),
])
def test_bad_input_is_an_az_error_and_evicts_nothing(az, arm, group, args, code, expected):
    seeded = arm.seed_aks_training(group, CLUSTER)
    args = [a.format(system=seeded["systemNode"], gpu=seeded["gpuNodes"][0]) for a in args]
    result = _evict(az, group, *args, "--yes", check=False)
    assert result.returncode == code and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert _evictions(arm) == []


def test_a_cluster_without_the_gpu_pool_is_refused(az, arm, group):
    arm.seed_aks_training(group, CLUSTER, gpu_pool=False)
    result = _evict(az, group, "--pool", "gpu", "--yes", check=False)
    assert result.returncode == 1 and "has no Spot node pool (its pools: system)" in result.stderr
    assert "Traceback" not in result.stderr and _evictions(arm) == []
    missing = az("elastictrain", "evict", "simulate", "-g", group, "-c", "nothere", "--pool", "gpu", "--yes",
                 check=False)
    assert missing.returncode == 3 and "no AKS cluster named 'nothere'" in missing.stderr


def test_neither_local_nor_a_cluster_is_a_usage_error(az, arm):
    result = az("elastictrain", "evict", "simulate", "--node", "x", "--yes", check=False)
    assert result.returncode == 1 and "-g RG -c CLUSTER" in result.stderr and arm.requests == []
    both = az("elastictrain", "evict", "simulate", "--local", "-g", "rg", "--job", "x", "--yes", check=False)
    assert both.returncode == 1 and "--local and -g" in both.stderr and arm.requests == []


def test_no_secret_in_any_output_or_log(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER)
    outputs = []
    for args in (["--job", "cifar", "--dry-run"], ["--node", seeded["gpuNodes"][0], "--wait", "--yes"]):
        result = _evict(az, group, *args, "--debug")
        outputs += [result.stdout, result.stderr]
    logs = [p.read_text(errors="replace") for p in az.config_dir.rglob("*") if p.is_file()
            and p.suffix in (".log", ".txt", "")]
    signature = _token_signature()
    for text in outputs + logs:
        assert KUBE_TOKEN not in text and signature not in text and ACCESS_TOKEN_SECRET not in text
        assert "kubeconfigs" not in text and "certificate-authority-data" not in text


def _token_signature() -> str:
    import base64

    return base64.urlsafe_b64encode(ACCESS_TOKEN_SECRET.encode()).decode().rstrip("=")


def test_an_arm_error_half_way_says_what_was_evicted_and_stops(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER, gpu_nodes=3)
    arm.fail_once("POST", "/virtualMachines/1/simulateEviction", 409, "OperationNotAllowed",
                  "The operation is not allowed while the VM is being updated.")
    result = _evict(az, group, "--pool", "gpu", "--count", "3", "--yes", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "OperationNotAllowed" in result.stderr and f"Evicted before it: {seeded['gpuNodes'][0]}" in result.stderr
    assert [SIMULATE.fullmatch(p)["id"] for _, p, _ in _evictions(arm)] == ["0", "1"], "it stops at the failure"


def _eviction_times(arm, since: int = 0) -> list[tuple[float, str]]:
    """(monotonic time, instance id) of every simulateEviction the server saw from entry ``since`` of its
    timeline (it holds the whole module's requests), in order."""
    from urllib.parse import urlsplit

    return [(at, SIMULATE.fullmatch(urlsplit(raw).path)["id"]) for at, method, raw in arm.timeline[since:]
            if method == "POST" and urlsplit(raw).path.lower().endswith("/simulateeviction")]


@pytest.mark.slow  # ~45 s: a 15 s schedule, each eviction followed out of the cluster
def test_a_schedule_asks_simulate_eviction_at_its_rate_for_the_jobs_nodes_and_reports_each(az, arm, group):
    seeded = arm.seed_aks_training(group, CLUSTER, gpu_nodes=3, workers=3)  # minReplicas 1
    args = ["--job", "cifar", "--schedule", "--rate", "12", "--duration", "15", "--seed", "11"]
    plan = az.json("elastictrain", "evict", "simulate", "-g", group, "-c", CLUSTER, *args, "--dry-run")
    assert [e["atSeconds"] for e in plan["evictions"]] == [5.0, 10.0, 15.0] and plan["seed"] == 11
    assert {e["noticeSeconds"] for e in plan["evictions"]} == {30.0}  # Azure's notice, every time
    assert plan["minNodes"] == 1 and _evictions(arm) == []

    since = len(arm.timeline)
    result = _evict(az, group, *args, "--yes", "-o", "json")
    report = json.loads(result.stdout)
    posts = _eviction_times(arm, since)
    # two of the three workers' nodes go; the third eviction would leave the job under its minimum
    assert len(posts) == 2, posts
    evicted = [e for e in report["evictions"] if "node" in e]
    assert [e["instanceId"] for e in evicted] == [instance for _, instance in posts]
    assert {e["node"] for e in evicted} < set(seeded["gpuNodes"]) and len({e["node"] for e in evicted}) == 2
    assert all(e["vmss"] == seeded["gpuVmss"] and e["state"] == "Evicted" and len(e["ranks"]) == 1 for e in evicted)
    # the second came one interval after the first, as planned (not as soon as the first was followed)
    assert [e["plannedAtSeconds"] for e in report["evictions"]] == [5.0, 10.0, 15.0]
    assert all(e["atSeconds"] >= e["plannedAtSeconds"] for e in report["evictions"]), report
    # never before its time; one that comes late (the one before was still being followed) says so
    gap = posts[1][0] - posts[0][0]
    assert gap >= 5 - 0.3 and abs(gap - (evicted[1]["atSeconds"] - evicted[0]["atSeconds"])) < 1.0, (posts, report)
    assert "its minimum of 1" in report["evictions"][2]["skipped"]
    for eviction in evicted:  # followed out of the cluster; this cluster's storage is not served
        assert eviction["recovery"]["instanceGone"] is True
        assert "cannot read the job's events" in eviction["recovery"]["eventsError"]
    assert report["goodput"] is None and report["goodputError"] and report["stopped"] is False
    lines = result.stderr
    assert "eviction 1/3 at +5s: aks-" in lines and re.search(r"eviction 3/3 at \+\d+s: skipped", lines), lines
    assert "goodput unknown" in lines and "Traceback" not in lines
    listed = az.json("vmss", "list-instances", "-g", seeded["nodeResourceGroup"], "-n", seeded["gpuVmss"])
    assert len(listed) == 1, "the two evicted instances are gone from the scale set"


@pytest.mark.parametrize("args, code, expected", [
    (["--rate", "0", "--duration", "60"], 1, "--rate 0: give evictions per minute"),
    (["--rate", "1", "--duration", "30"], 1, "too short for one eviction"),
    (["--rate", "1", "--duration", "600", "--notice-share", "0.5"], 1, "every simulated eviction gets Azure's"),
    (["--rate", "1", "--duration", "600", "--replace-after", "30"], 1, "autoscaler brings capacity back"),
    (["--rate", "1", "--duration", "600", "--rank", "1"], 1, "drop --rank"),
])
def test_a_bad_schedule_is_an_az_error_and_evicts_nothing(az, arm, group, args, code, expected):
    arm.seed_aks_training(group, CLUSTER)
    result = _evict(az, group, "--job", "cifar", "--schedule", *args, "--yes", check=False)
    assert result.returncode == code and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and _evictions(arm) == []
