"""az elastictrain job ... --engine k8s-job through the real az, the local ARM server and its fake Kubernetes,
whose batch/v1 Job controller, PodGC and scheduler (tests/support/fake_jobs.py) the test steps.

The eviction goes through ``evict simulate`` (simulateEviction on the VM; the node leaves; PodGC fails its pod
with DisruptionTarget). Events are the runtime's side, written to the cluster's Azurite container with a key.
"""
from __future__ import annotations

import copy
import json
import time
import uuid

import kubernetes_validate
import pytest

from tests.support import aks_objects as k

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
NAMESPACE = "elastictrain"
JOB = ("batch/v1", "Job")
T0 = 1767225600.0  # 2026-01-01T00:00:00Z: the fake's creationTimestamp of every object


@pytest.fixture(scope="module")
def cluster(azure_login, arm_server, azurite, container):  # noqa: ARG001  (container: exists before reads)
    """A cluster made by 'cluster create' (Kubernetes 1.33) with two Spot GPU nodes; and a 1.30 copy."""
    group = f"rg-{uuid.uuid4().hex[:10]}"
    azure_login("elastictrain", "cluster", "create", "-g", group, "-n", "trainer", "-l", "eastus", timeout=300)
    made = arm_server.find(f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/trainer")
    old = copy.deepcopy(made)
    old["id"], old["name"] = old["id"].rsplit("/", 1)[0] + "/old", "old"
    old["properties"].update(kubernetesVersion="1.30", currentKubernetesVersion="1.30.9")
    arm_server.resources[old["id"].lower()] = old
    return group


@pytest.fixture
def gpu_nodes(arm_server, cluster):
    """Two Ready Spot GPU nodes with their VMSS instances (and no job of an earlier test): a 3-node job's third
    index waits for capacity. The seeded cluster keeps the Kubernetes version 'cluster create' gave it."""
    rid = f"/resourcegroups/{cluster}/providers/microsoft.containerservice/managedclusters/trainer"
    version = arm_server.find(rid)["properties"].get("currentKubernetesVersion")
    for key in [key for key in arm_server.kube.objects if key[1] in ("Job", "Service")]:
        del arm_server.kube.objects[key]
    seeded = arm_server.seed_aks_training(cluster, "trainer", gpu_nodes=2, job="", workers=0)
    arm_server.find(rid)["properties"].update(currentKubernetesVersion=version, kubernetesVersion=version)
    return [arm_server.kube.get("v1", "Node", node) for node in seeded["gpuNodes"]]


def _where(group: str, cluster: str = "trainer") -> list[str]:
    return ["-g", group, "-c", cluster]


def _run(az, group: str, name: str, *extra: str, check: bool = True):
    args = ["elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train_cifar10.py",
            "--min-nodes", "1", "--max-nodes", "3", "--engine", "k8s-job", *_where(group), *extra]
    return az.json(*args) if check else az(*args, check=False)


def _name() -> str:
    return f"k{uuid.uuid4().hex[:8]}"


def _pods(arm, name: str) -> list[dict]:
    return [p for p in arm.kube.list("v1", "Pod", NAMESPACE) if p["metadata"]["labels"].get("job-name") == name]


def test_run_creates_an_indexed_job_and_its_headless_service_valid_on_1_31_and_1_35(az, arm, cluster, gpu_nodes):
    name = _name()
    shown = _run(az, cluster, name)
    job, service = arm.kube.get(*JOB, name, NAMESPACE), arm.kube.get("v1", "Service", name, NAMESPACE)
    assert shown["engine"] == "k8s-job" and shown["name"] == name
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == 3
    assert service["spec"]["clusterIP"] == "None"
    for obj in (job, service):
        clean = {key: value for key, value in obj.items() if key != "status"}
        clean["metadata"] = {key: obj["metadata"][key] for key in ("name", "namespace", "labels")}
        for version in ("1.31.0", "1.35.0"):
            kubernetes_validate.validate(clean, version, strict=True)
    assert not arm.kube.get("elastic.pytorch.org/v1alpha1", "ElasticJob", name, NAMESPACE), "no operator object"


def test_show_lists_indexed_pods_and_an_eviction_is_ignored_until_capacity_returns(az, arm, cluster, gpu_nodes,
                                                                                   container):
    name = _name()
    _run(az, cluster, name)
    arm.kube.jobs.reconcile()  # the controller creates 3 pods; 2 nodes: index 2 stays Pending
    shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert shown["engine"] == "k8s-job"
    assert [(n["rank"], n["status"]) for n in shown["nodes"]] == [(0, "Running"), (1, "Running"), (2, "Pending")]
    assert all(n["pod"].startswith(f"{name}-{n['rank']}-") for n in shown["nodes"])
    assert shown["operator"]["active"] == 3 and shown["operator"]["failed"] == 0

    container.upload_blob(f"{name}/events.jsonl", "".join(json.dumps(e) + "\n" for e in [
        {"time": T0 + 20, "event": "started", "rank": 0, "world_size": 2},
        {"time": T0 + 25, "event": "restored", "rank": 0, "step": 0, "world_size": 2},
        {"time": T0 + 60, "event": "preempted", "rank": 1, "node": k.name_of(gpu_nodes[1]), "step": 100,
         "source": "scheduled_events"},
        {"time": T0 + 70, "event": "restored", "rank": 0, "step": 100, "world_size": 1},
    ]), overwrite=True)
    victim = next(n for n in shown["nodes"] if n["rank"] == 1)
    az.json("elastictrain", "evict", "simulate", *_where(cluster), "--job", name, "--rank", "1", "--yes",
            timeout=120)
    deadline = time.time() + 10
    while arm.kube.get("v1", "Node", victim["node"]) is not None and time.time() < deadline:
        time.sleep(0.1)
    evicted = arm.kube.get("v1", "Pod", victim["pod"], NAMESPACE)
    assert evicted["status"]["phase"] == "Failed"
    assert {"type": "DisruptionTarget", "reason": "DeletionByPodGC"}.items() <= evicted["status"]["conditions"][-1].items()
    during = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert next(n for n in during["nodes"] if n["pod"] == victim["pod"])["reason"] == "DisruptionTarget: DeletionByPodGC"

    arm.kube.jobs.reconcile()  # accounted for: ignored, removed; the replacement waits for a node
    job = arm.kube.get(*JOB, name, NAMESPACE)
    assert job["status"]["failed"] == 0 and not job["status"].get("conditions"), "an eviction is not a failure"
    replacement = [p for p in _pods(arm, name) if p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"] == "1"]
    assert [p["status"]["phase"] for p in replacement] == ["Pending"] and replacement[0]["metadata"]["name"] != \
        victim["pod"]

    arm.kube.seed(k.node(5))  # capacity returns: the autoscaler's new Spot node
    arm.kube.jobs.reconcile()
    after = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert sorted(n["status"] for n in after["nodes"]) == ["Pending", "Running", "Running"]
    assert (after["evictions"], after["recoveries"]) == (1, 1)
    assert after["state"] == "Running"


def test_a_script_error_fails_the_job_by_its_pod_failure_policy(az, arm, cluster, gpu_nodes):
    name = _name()
    _run(az, cluster, name)
    arm.kube.jobs.reconcile()
    pod = next(p for p in _pods(arm, name) if p["status"]["phase"] == "Running")
    index = pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    arm.kube.set_logs(pod["metadata"]["name"], NAMESPACE, "step 7 loss 2.1\nValueError: bad batch\n")
    logs = az("elastictrain", "job", "logs", "-n", name, *_where(cluster), "--rank", index).stdout
    assert "ValueError: bad batch" in logs
    arm.kube.jobs.exit(pod["metadata"]["name"], NAMESPACE, 1)  # torchrun gave up: ChildFailedError
    arm.kube.jobs.reconcile()
    shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert shown["state"] == "Failed"
    failed = [c for c in shown["operator"]["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["reason"] == "PodFailurePolicy"
    assert not [p for p in _pods(arm, name) if p["status"]["phase"] in ("Pending", "Running")]


def test_the_first_node_to_finish_training_completes_the_job(az, arm, cluster, gpu_nodes):
    name = _name()
    _run(az, cluster, name)
    arm.kube.jobs.reconcile()
    pod = next(p for p in _pods(arm, name) if p["status"]["phase"] == "Running")
    arm.kube.jobs.exit(pod["metadata"]["name"], NAMESPACE, 0)
    arm.kube.jobs.reconcile()
    job = arm.kube.get(*JOB, name, NAMESPACE)
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert job["status"]["completedIndexes"] == pod["metadata"]["annotations"][
        "batch.kubernetes.io/job-completion-index"] and job["status"]["succeeded"] == 1
    assert [p["status"]["phase"] for p in _pods(arm, name)] == ["Succeeded"], "the Pending index is removed"


def test_list_finds_both_engines_and_delete_removes_job_service_and_pods_keeps_checkpoints(az, arm, cluster,
                                                                                           gpu_nodes, container):
    name, other = _name(), _name()
    _run(az, cluster, name)
    az.json("elastictrain", "job", "run", "-n", other, "--image", IMAGE, "--script", "/app/t.py", "--min-nodes",
            "1", "--max-nodes", "2", *_where(cluster))
    arm.kube.jobs.reconcile()
    engines = {j["name"]: j["engine"] for j in az.json("elastictrain", "job", "list", *_where(cluster))}
    assert (engines[name], engines[other]) == ("k8s-job", "torchelastic")
    container.upload_blob(f"{name}/events.jsonl", json.dumps({"time": T0 + 1, "event": "started"}) + "\n",
                          overwrite=True)
    planned = az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--dry-run")
    assert planned["object"]["kind"] == "Job" and len(planned["stopped"]) == 3
    deleted = az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--yes")
    assert deleted["deleted"] is True
    assert arm.kube.get(*JOB, name, NAMESPACE) is None and arm.kube.get("v1", "Service", name, NAMESPACE) is None
    assert _pods(arm, name) == []
    assert container.get_blob_client(f"{name}/events.jsonl").exists(), "the job's blobs stay"


@pytest.mark.parametrize("args, image, where, expected", [
    (("--engine", "volcano"), IMAGE, "trainer", "volcano"),
    (("--engine", "k8s-job"), IMAGE, "old", "needs Kubernetes 1.31 or later"),
    (("--engine", "k8s-job"), "myregistry.azurecr.io/elastictrain:latest", "trainer", "not pinned"),
])
def test_bad_input_is_an_az_error_and_creates_nothing(az, arm, cluster, gpu_nodes, args, image, where, expected):
    name = _name()
    result = az("elastictrain", "job", "run", "-n", name, "--image", image, "--script", "/app/t.py",
                "--min-nodes", "1", "--max-nodes", "2", *_where(cluster, where), *args, check=False)
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert arm.kube.get(*JOB, name, NAMESPACE) is None and arm.kube.get("v1", "Service", name, NAMESPACE) is None


@pytest.mark.parametrize("name, engine, expected", [
    ("1cifar", "torchelastic", "the job's Service '1cifar-worker-2' needs a name that starts with a letter"),
    ("1cifar", "k8s-job", "the job's Service '1cifar' needs a name that starts with a letter"),
    ("k" * 62, "k8s-job", "its pod hostname '" + "k" * 62 + "-2' would have 64 characters"),
])
def test_a_job_name_kubernetes_would_refuse_is_an_az_error_before_anything_is_sent(az, arm, cluster, gpu_nodes,
                                                                                   name, engine, expected):
    """A Service's name is a DNS-1035 label (the operator makes <job>-worker-<i>, k8s-job the headless <job>); an
    Indexed Job's last pod hostname <job>-<completions-1> is at most 63 characters. The fake API server refuses
    them as the real one does (422 Invalid); az refuses them first, with what to do."""
    arm.kube.calls.clear()
    result = az("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/t.py",
                "--min-nodes", "1", "--max-nodes", "3", "--engine", engine, *_where(cluster), check=False)
    assert result.returncode == 1 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "HTTP 422" not in result.stderr
    assert [c for c in arm.kube.calls if c[0] == "apply"] == [], "nothing is sent"


def test_the_fake_api_server_rejects_what_the_real_one_does(arm):
    from azext_elastictrain.clients.kube import KubeError
    from azext_elastictrain.core.aks import manifests as m
    from azext_elastictrain.core.spec import JobSpec

    cluster = m.InClusterSpec(identity_client_id=str(uuid.UUID(int=1)),
                              checkpoint_url="https://acct1.blob.core.windows.net/checkpoints")
    _, job = m.render_k8s_job(JobSpec(name="bad", script="t.py", max_nodes=2), cluster, IMAGE)
    for path, value, why in ((("template", "spec", "restartPolicy"), "OnFailure", "restartPolicy is Never"),
                             (("completionMode",), "NonIndexed", "requires completionMode"),
                             (("podReplacementPolicy",), "TerminatingOrFailed", "must be \"Failed\"")):
        broken = copy.deepcopy(job)
        target = broken["spec"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(KubeError, match=why):
            arm.kube.apply(broken)
    assert arm.kube.get(*JOB, "bad", NAMESPACE) is None


def test_a_cluster_created_for_k8s_job_has_no_operator_and_runs_k8s_jobs_by_default(az, arm, azurite, container):
    """cluster create --engine k8s-job applies no operator object; show checks no operator; job run defaults
    to the cluster's engine, and --engine torchelastic there is refused before anything is sent."""
    from azext_elastictrain.core.aks import manifests as m

    group = f"rg-{uuid.uuid4().hex[:10]}"
    created = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "noop", "-l", "eastus",
                      "--engine", "k8s-job", timeout=300)
    applied = [path.split("?")[0] for method, path in arm.requests if method == "PATCH" and "/kube/" in path]
    assert applied and any("/statefulsets/" in p for p in applied), "etcd is installed"
    operator = ("/customresourcedefinitions/", f"/deployments/{m.OPERATOR_DEPLOYMENT}", "/clusterroles/",
                "/clusterrolebindings/")
    assert not [p for p in applied if any(part in p for part in operator)], applied
    assert created["engine"] == "k8s-job"
    rid = f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/noop"
    assert arm.find(rid)["tags"]["elastictrain-engine"] == "k8s-job"

    shown = az.json("elastictrain", "cluster", "show", "-g", group, "-n", "noop")
    assert shown["engine"] == "k8s-job"
    assert set(shown["components"]) == {"etcd", "nvidia-device-plugin"}

    arm.requests.clear()
    plan = az.json("elastictrain", "job", "run", "-n", "plain", "--image", IMAGE, "--script", "/app/t.py",
                   "--min-nodes", "1", "--max-nodes", "2", *_where(group, "noop"), "--dry-run")
    assert plan["engine"] == "k8s-job" and plan["object"]["kind"] == "Job"

    refused = az("elastictrain", "job", "run", "-n", "plain", "--image", IMAGE, "--script", "/app/t.py",
                 "--min-nodes", "1", "--max-nodes", "2", *_where(group, "noop"), "--engine", "torchelastic",
                 check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "created with --engine k8s-job" in refused.stderr and "--engine torchelastic" in refused.stderr
    assert not [path for method, path in arm.requests if method in ("PATCH", "POST", "PUT") and "/kube/" in path]
