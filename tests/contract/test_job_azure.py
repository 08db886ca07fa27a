"""az elastictrain job|checkpoint ... -g RG -c CLUSTER through the real az against the local ARM server.

Kubernetes is the fake behind the server's /kube (reached with the kubeconfig from listClusterUserCredential);
blob storage is a real Azurite over HTTPS that takes bearer tokens (``--oauth basic``): the ARM server gives
the cluster's storage account that Azurite as its ``primaryEndpoints.blob``, and az reads it with its login,
exactly as it reads Azure storage with Entra ID. The test writes events and checkpoints with a key.
"""
from __future__ import annotations

import copy
import json
import re
import uuid

import jsonschema
import kubernetes_validate
import pytest

from azext_elastictrain.core.aks import manifests as m
from tests.support import aks_objects as k
from tests.support.arm_server import ACCESS_TOKEN_SECRET, KUBE_TOKEN

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
NAMESPACE = "elastictrain"
EJ = ("elastic.pytorch.org/v1alpha1", "ElasticJob")
T0 = k.CREATED_EPOCH


@pytest.fixture(scope="module")
def cluster(azure_login, arm_server, azurite, container):  # noqa: ARG001  (container: exists before reads)
    """One AKS cluster made by 'cluster create', its Spot GPU and system nodes; and a copy without a GPU pool."""
    group = f"rg-{uuid.uuid4().hex[:10]}"
    azure_login("elastictrain", "cluster", "create", "-g", group, "-n", "trainer", "-l", "eastus", timeout=300)
    made = arm_server.find(f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/trainer")
    bare = copy.deepcopy(made)
    bare["id"] = bare["id"].rsplit("/", 1)[0] + "/nogpu"
    bare["name"] = "nogpu"
    bare["properties"]["agentPoolProfiles"] = [p for p in bare["properties"]["agentPoolProfiles"]
                                               if p["name"] != "gpu"]
    arm_server.resources[bare["id"].lower()] = bare
    for node in [k.node(i) for i in range(3)] + [k.node(0, pool="system", spot=False)]:
        arm_server.kube.seed(node)
    return group


@pytest.fixture(autouse=True)
def _kube_calls(arm_server):
    """This test's Kubernetes calls only."""
    arm_server.kube.calls.clear()


def _job_name() -> str:
    return f"j{uuid.uuid4().hex[:8]}"


def _where(group: str, cluster: str = "trainer") -> list[str]:
    return ["-g", group, "-c", cluster]


def _run_args(name: str, *extra: str) -> list[str]:
    return ["elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train_cifar10.py",
            "--script-args", "--steps 1000 --lr 0.05", "--min-nodes", "1", "--max-nodes", "3", *extra]


def _crd_schema() -> dict:
    crd = next(o for o in m.load_base_objects() if o["kind"] == "CustomResourceDefinition")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _validate(job: dict) -> None:
    jsonschema.Draft7Validator(_crd_schema()).validate(job)
    template = job["spec"]["replicaSpecs"]["Worker"]["template"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"},
                                  "template": template}, kubernetes_validate.latest_version(), strict=True)


def _applied(arm) -> list:
    return [c for c in arm.kube.calls if c[0] in ("apply", "delete") and c[1] == "ElasticJob"]


def _seed(arm, container, name: str, *, conditions=None, events=(), pods=None) -> None:
    """An ElasticJob as the operator runs it: status, worker pods on Spot nodes, and its event log in blob."""
    from azext_elastictrain.core.aks.manifests import InClusterSpec, render_elastic_job
    from azext_elastictrain.core.spec import JobSpec

    spec = JobSpec(name=name, script="/app/train.py", min_nodes=1, max_nodes=3, nodes=2)
    rendered = render_elastic_job(spec, InClusterSpec(identity_client_id=str(uuid.UUID(int=1)),
                                                      checkpoint_url="https://acct1.blob.core.windows.net/checkpoints"),
                                  IMAGE, run_id=f"{name}-0001")
    arm.kube.seed(k.with_status(rendered, k.running(name) if conditions is None else conditions, active=2))
    nodes = [k.name_of(k.node(i)) for i in range(2)]
    for pod in pods if pods is not None else [k.worker_pod(name, 0, nodes[0]),
                                              k.worker_pod(name, 1, nodes[1], restarts=2)]:
        arm.kube.seed(pod)
    if events:
        container.upload_blob(f"{name}/events.jsonl", "".join(json.dumps(e) + "\n" for e in events),
                              overwrite=True)


def _event(offset: float, event: str, **fields) -> dict:
    return {"time": T0 + offset, "event": event, "rank": 0, "node": k.name_of(k.node(0)), **fields}


PROGRESS = [
    _event(20, "started", world_size=2, restart_count=0),
    _event(25, "restored", step=0, world_size=2),
    _event(60, "progress", step=100, world_size=2, samples_per_s=812.5, metrics={"loss": 1.9}),
    _event(61, "checkpoint", step=100),
    _event(90, "progress", step=150, world_size=2, samples_per_s=830.0, metrics={"loss": 1.7}),
]


# ---------------------------------------------------------------------------------------------- run


def test_run_creates_an_elastic_job_that_validates_against_our_crd_and_kubernetes(az, arm, cluster):
    name = _job_name()
    shown = az.json(*_run_args(name, "--gpus-per-node", "2", "--nproc-per-node", "2", "--checkpoint-interval",
                               "50"), *_where(cluster))
    assert (shown["name"], shown["type"], shown["cluster"], shown["state"]) == (name, "aks", "trainer", "Pending")
    job = arm.kube.get(*EJ, name, NAMESPACE)
    _validate(job)
    spec = job["spec"]
    assert spec["rdzvEndpoint"] == "elastictrain-etcd.elastictrain.svc.cluster.local:2379"
    assert (spec["minReplicas"], spec["maxReplicas"]) == (1, 3)
    worker = spec["replicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (3, "ExitCode")
    pod = worker["template"]["spec"]
    assert pod["serviceAccountName"] == "elastictrain-training" and pod["terminationGracePeriodSeconds"] >= 30
    assert {(t["key"], t.get("value")) for t in pod["tolerations"]} == {
        ("kubernetes.azure.com/scalesetpriority", "spot"), ("sku", "gpu")}
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert "--rdzv-backend=etcd-v2" in container["args"] and "--nproc-per-node=2" in container["args"]
    assert container["args"][-5:] == ["/app/train_cifar10.py", "--steps", "1000", "--lr", "0.05"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ELASTICTRAIN_CHECKPOINT_URL"].endswith(f"/{name}") and env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"

    again = az(*_run_args(name), *_where(cluster), check=False)
    assert again.returncode == 1 and "already exists" in again.stderr and "Traceback" not in again.stderr


def test_dry_run_prints_the_elastic_job_and_creates_nothing(az, arm, cluster):
    name = _job_name()
    planned = az.json(*_run_args(name), *_where(cluster), "--dry-run")
    assert planned["dryRun"] is True and planned["object"]["metadata"]["name"] == name
    _validate(planned["object"])
    assert planned["object"]["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"]["limits"] == {"nvidia.com/gpu": 1}, "one GPU per worker by default"
    assert arm.kube.get(*EJ, name, NAMESPACE) is None and _applied(arm) == []
    assert not any(p.startswith("/kube") for _, p in arm.requests), "a dry run does not touch Kubernetes"
    worker = planned["object"]["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][-2:] == ["azext_elastictrain.runtime.warm", "--agent"], "warm starts by default"
    cold = az.json(*_run_args(name), *_where(cluster), "--dry-run", "--warm-start", "false")
    worker = cold["object"]["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == ["python", "-m", "torch.distributed.run"]
    assert "azext_elastictrain.runtime.warm" not in worker["args"]


def test_an_oomkilled_worker_is_replaced_by_the_operator(az, arm, cluster):
    """The job `job run` made, under the TorchElastic controller's own rule (tests/support/fake_operator.py): a
    worker that ended Failed with 137 (OOMKilled) is re-created, because the controller reads the exit code from
    the container named elasticjob-worker - with any other name it never would be."""
    for key in [key for key in arm.kube.objects if key[1] in ("Pod", "Service", "ElasticJob")]:
        del arm.kube.objects[key]  # the jobs of earlier tests would hold the Spot nodes
    name = _job_name()
    az.json(*_run_args(name), *_where(cluster))
    arm.kube.operator.reconcile()  # the operator creates the workers, the scheduler binds them
    arm.kube.operator.reconcile()
    assert arm.kube.operator.errors == {}
    victim = f"{name}-worker-1"
    before = arm.kube.get("v1", "Pod", victim, NAMESPACE)
    running = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert [(n["pod"], n["phase"]) for n in running["nodes"]] == [
        (f"{name}-worker-{i}", "Running") for i in range(3)]

    arm.kube.jobs.exit(victim, NAMESPACE, 137, "OOMKilled")  # the kernel killed it at its memory limit
    failed = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert next(n for n in failed["nodes"] if n["pod"] == victim)["phase"] == "Failed"
    for _ in range(3):  # deletes the Failed pod, creates it again, counts it running
        arm.kube.operator.reconcile()
    after = arm.kube.get("v1", "Pod", victim, NAMESPACE)
    assert after is not None and after["metadata"]["uid"] != before["metadata"]["uid"], "the worker was replaced"
    shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert [(n["pod"], n["phase"]) for n in shown["nodes"]] == [(f"{name}-worker-{i}", "Running") for i in range(3)]
    assert shown["operator"]["replicaStatuses"] == {"Worker": {"active": 3}}


# ---------------------------------------------------------------------------------------------- show, list


def test_show_renders_the_operator_status_the_pods_and_the_events(az, arm, cluster, container):
    name = _job_name()
    _seed(arm, container, name, events=[_event(-3600, "progress", step=900, world_size=3)] + PROGRESS)
    shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert (shown["state"], shown["step"], shown["worldSize"], shown["lastCheckpointStep"]) == ("Running", 150, 2, 100)
    assert shown["samplesPerSecond"] == 830.0 and "eventsError" not in shown
    assert [(n["pod"], n["rank"], n["node"], n["spot"], n["phase"], n["restarts"]) for n in shown["nodes"]] == [
        (f"{name}-worker-0", 0, k.name_of(k.node(0)), True, "Running", 0),
        (f"{name}-worker-1", 1, k.name_of(k.node(1)), True, "Running", 2)]
    conditions = [(c["type"], c["status"]) for c in shown["operator"]["conditions"]]
    assert conditions == [("Created", "True"), ("Running", "True")]
    assert shown["operator"]["replicaStatuses"] == {"Worker": {"active": 2}}

    table = az("elastictrain", "job", "show", "-n", name, *_where(cluster), "-o", "table").stdout
    assert re.search(rf"{name}\s+Running\s+2/2\s+1-3\s+restart\s+2\s+150\s+830.0\s+100", table), table
    listed = az.json("elastictrain", "job", "list", *_where(cluster))
    mine = next(j for j in listed if j["name"] == name)
    assert (mine["state"], mine["step"]) == ("Running", 150)


def test_a_job_that_lost_a_pending_worker_shows_why(az, arm, cluster, container):
    name = _job_name()
    _seed(arm, container, name, pods=[k.worker_pod(name, 0, k.name_of(k.node(0))),
                                      k.worker_pod(name, 1, None, phase="Pending")], events=PROGRESS[:2])
    shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    pending = shown["nodes"][1]
    assert (pending["phase"], pending["node"], pending["spot"], pending["reason"]) == (
        "Pending", None, None, "Unschedulable")


# ---------------------------------------------------------------------------------------------- logs, wait


def test_logs_by_rank_by_pod_and_of_every_worker(az, arm, cluster, container):
    name = _job_name()
    _seed(arm, container, name)
    arm.kube.set_logs(f"{name}-worker-0", NAMESPACE, "rank0 step 1\nrank0 step 2\n")
    arm.kube.set_logs(f"{name}-worker-1", NAMESPACE, "rank1 step 1\nrank1 step 2\n")
    where = _where(cluster)
    assert az("elastictrain", "job", "logs", "-n", name, *where, "--rank", "1").stdout == \
        "rank1 step 1\nrank1 step 2\n"
    assert az("elastictrain", "job", "logs", "-n", name, *where, "--pod", f"{name}-worker-0", "--tail", "1",
              "--follow").stdout == "rank0 step 2\n"
    every = az("elastictrain", "job", "logs", "-n", name, *where).stdout.splitlines()
    assert every == [f"{name}-worker-0 (rank 0) | rank0 step 1", f"{name}-worker-0 (rank 0) | rank0 step 2",
                     f"{name}-worker-1 (rank 1) | rank1 step 1", f"{name}-worker-1 (rank 1) | rank1 step 2"]
    missing = az("elastictrain", "job", "logs", "-n", name, *where, "--rank", "7", check=False)
    assert missing.returncode == 3 and "no rank 7" in missing.stderr and "Traceback" not in missing.stderr


def test_wait_returns_once_reached_and_fails_on_a_job_that_cannot_get_there(az, arm, cluster, container):
    name, failed = _job_name(), _job_name()
    _seed(arm, container, name, events=PROGRESS)
    reached = az.json("elastictrain", "job", "wait", "-n", name, *_where(cluster), "--step", "150",
                      "--world-size", "2", "--timeout", "30")
    assert (reached["step"], reached["worldSize"]) == (150, 2)
    conditions = k.running(failed) + [{"type": "Failed", "status": "True", "reason": "ElasticJobFailed",
                                       "message": "worker failed", "lastTransitionTime": "2026-01-01T10:09:00Z"}]
    _seed(arm, container, failed, conditions=conditions, events=PROGRESS[:3])
    result = az("elastictrain", "job", "wait", "-n", failed, *_where(cluster), "--timeout", "30", check=False)
    assert result.returncode == 1 and "is Failed at step 100" in result.stderr and "Traceback" not in result.stderr
    assert f"job logs -g {cluster} -c trainer" in result.stderr


def test_wait_on_aks_fetches_the_credentials_and_the_cluster_once_however_often_it_looks(az, arm, cluster,
                                                                                         container):
    name = _job_name()
    _seed(arm, container, name, events=PROGRESS[:3])  # at step 100: a wait for step 150 times out
    result = az("elastictrain", "job", "wait", "-n", name, *_where(cluster), "--step", "150", "--timeout", "21",
                check=False)
    assert result.returncode == 1 and "timed out after 21s" in result.stderr, result.stderr
    looks = [c for c in arm.kube.calls if c[:2] == ("get", "ElasticJob") and c[-1] == name]
    assert len(looks) >= 3, looks  # it looked at 0, 10 and 20 s
    paths = [p.split("?")[0].lower() for method, p in arm.requests if method == "POST"]
    assert sum(p.endswith("/listclusterusercredential") for p in paths) == 1, paths
    cluster_gets = [p for method, p in arm.requests if method == "GET" and
                    p.split("?")[0].lower().endswith("/managedclusters/trainer")]
    assert len(cluster_gets) == 1, cluster_gets


# ---------------------------------------------------------------------------------------------- delete


def test_delete_asks_shows_a_dry_run_and_keeps_the_checkpoints(az, arm, cluster, container):
    name = _job_name()
    _seed(arm, container, name, events=PROGRESS)
    where = _where(cluster)
    unconfirmed = az("elastictrain", "job", "delete", "-n", name, *where, check=False)
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr
    planned = az.json("elastictrain", "job", "delete", "-n", name, *where, "--dry-run")
    assert [p["pod"] for p in planned["stopped"]] == [f"{name}-worker-0", f"{name}-worker-1"]
    assert planned["checkpoints"] == "kept" and arm.kube.get(*EJ, name, NAMESPACE) is not None
    table = az("elastictrain", "job", "delete", "-n", name, *where, "--dry-run", "-o", "table").stdout
    assert "would delete" in table and f"{name}-worker-1" in table

    deleted = az.json("elastictrain", "job", "delete", "-n", name, *where, "--yes")
    assert deleted["deleted"] is True and arm.kube.get(*EJ, name, NAMESPACE) is None
    assert container.get_blob_client(f"{name}/events.jsonl").exists(), "the job's blobs stay"
    gone = az("elastictrain", "job", "show", "-n", name, *where, check=False)
    assert gone.returncode == 3


# ---------------------------------------------------------------------------------------------- checkpoints


def test_checkpoints_of_an_aks_job_through_the_clusters_storage_and_the_login(az, arm, cluster, container):
    import torch

    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.runtime import Checkpointer

    name = _job_name()
    store = BlobStore(container, name)  # the runtime's side; the test's client holds the key
    ckpt = Checkpointer(store, keep=5, watcher=None, events=False)
    state = {"weights": {"w": torch.zeros(1000)}}
    for step in (10, 20):
        state["weights"]["w"] += 1
        ckpt.save(step, state, blocking=True)
    ckpt.close()

    where = [*_where(cluster), "--job", name]
    listed = az.json("elastictrain", "checkpoint", "list", *where)
    assert [(c["step"], c["status"]) for c in listed] == [(10, "complete"), (20, "complete")]
    verified = az.json("elastictrain", "checkpoint", "verify", *where, "--step", "20")
    assert verified[0]["verified"] is True
    planned = az.json("elastictrain", "checkpoint", "prune", *where, "--keep-last", "1", "--dry-run")
    assert [c["step"] for c in planned["delete"]] == [10] and planned["deleted"] is False

    both = az("elastictrain", "checkpoint", "list", *where, "--url", "https://a.blob.core.windows.net/c/j",
              check=False)
    assert both.returncode == 2 or both.returncode == 1
    assert "exactly one of" in both.stderr.lower() and "Traceback" not in both.stderr


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, expected", [
    (["--image", "myregistry.azurecr.io/train:latest"], "is not pinned"),
    (["--image", "myregistry.azurecr.io/train"], "is not pinned"),
    (["--min-nodes", "3", "--max-nodes", "2"], "--min-nodes 3 is more than --max-nodes 2"),
    (["--gpus-per-node", "0"], "--gpus-per-node must be a whole number of at least 1"),
])
def test_bad_input_is_an_az_error_and_creates_nothing(az, arm, cluster, args, expected):
    name = _job_name()
    base = ["elastictrain", "job", "run", "-n", name, "--script", "/app/train.py", "--image", IMAGE,
            "--min-nodes", "1", "--max-nodes", "2"]
    result = az(*base, *args, *_where(cluster), check=False)
    assert result.returncode in (1, 2), result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert arm.kube.get(*EJ, name, NAMESPACE) is None and _applied(arm) == []


def test_a_cluster_without_the_gpu_spot_pool_is_refused(az, arm, cluster):
    name = _job_name()
    result = az(*_run_args(name), *_where(cluster, "nogpu"), check=False)
    assert result.returncode == 1 and "has no GPU Spot pool" in result.stderr and "Traceback" not in result.stderr
    assert "cluster create" in result.stderr and _applied(arm) == []


@pytest.mark.parametrize("command, args, code, expected", [
    ("show", ["-n", "nosuchjob"], 3, "no job 'nosuchjob'"),
    ("show", ["-n", "x", "-c", "nosuchcluster"], 3, "no AKS cluster named 'nosuchcluster'"),
    ("run", ["-n", "x", "--script", "/app/t.py", "--min-nodes", "1", "--max-nodes", "1"], 1, "needs --image"),
    ("show", ["-n", "x", "--local"], 1, "--local and -g/--resource-group"),
])
def test_unknown_names_and_missing_arguments_are_az_errors(az, arm, cluster, command, args, code, expected):
    where = ["-g", cluster] + ([] if "-c" in args else ["-c", "trainer"])
    result = az("elastictrain", "job", command, *args, *where, check=False)
    assert result.returncode == code and expected in result.stderr and "Traceback" not in result.stderr, \
        result.stderr


def test_a_job_command_without_a_cluster_says_how_to_name_one(az, arm):
    result = az("elastictrain", "job", "list", check=False)
    assert result.returncode == 1 and "--local, or -g RG -c CLUSTER" in result.stderr


def test_no_secret_in_any_output_or_log(az, arm, cluster, container, azurite):
    name = _job_name()
    _seed(arm, container, name, events=PROGRESS)
    arm.kube.set_logs(f"{name}-worker-0", NAMESPACE, "hello\n")
    outputs = []
    for args in (["job", "show", "-n", name], ["job", "list"], ["job", "logs", "-n", name, "--rank", "0"],
                 ["job", "run", "-n", _job_name(), "--image", IMAGE, "--script", "/app/t.py", "--min-nodes", "1",
                  "--max-nodes", "1"], ["checkpoint", "list", "--job", name],
                 ["job", "delete", "-n", name, "--yes"]):
        result = az("elastictrain", *args, *_where(cluster), "--debug")
        outputs += [result.stdout, result.stderr]
    logs = [p.read_text(errors="replace") for p in az.config_dir.rglob("*") if p.is_file()
            and p.suffix in (".log", ".txt", "")]
    signature = __import__("base64").urlsafe_b64encode(ACCESS_TOKEN_SECRET.encode()).decode().rstrip("=")
    for text in outputs + logs:
        assert KUBE_TOKEN not in text and ACCESS_TOKEN_SECRET not in text and signature not in text
        assert azurite.account_key not in text and "client-key-data" not in text


def test_show_and_timeline_price_the_node_hours_on_the_gpu_spot_pool(az, arm, cluster, container, tmp_path):
    """The pool's size (T4) and region priced by the Retail Prices front; --price-as another size; unreachable."""
    from azext_elastictrain.clients.prices import CACHE_FILE
    from azext_elastictrain.core.prices import PRICES_URL_ENV
    from tests.support.prices_server import PricesServer

    name = _job_name()
    _seed(arm, container, name, events=PROGRESS)
    (az.config_dir / CACHE_FILE).unlink(missing_ok=True)
    with PricesServer() as front:
        shown = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster), env={PRICES_URL_ENV: front.url})
        # 2 ranks from the restore (25 s) to step 150 (90 s) useful, 5 s starting; one rank a node
        assert shown["rankSeconds"] == {"useful": 130.0, "total": 140.0} and shown["nprocPerNode"] == 1
        cost = shown["cost"]
        hours = 140 / 3600
        assert (cost["vmSize"], cost["location"], cost["nodeHours"], cost["pricedAs"]) == (
            "Standard_NC4as_T4_v3", "eastus", {"Spot": round(hours, 4)}, "pool gpu")
        assert (cost["cost"], cost["onDemandCost"], cost["savedPercent"]) == (
            round(hours * 0.0789, 6), round(hours * 0.526, 6), 85.0)
        assert cost["costPerGoodputHour"] == round(hours * 0.0789 / (130 / 3600), 6)
        other = az.json("elastictrain", "job", "timeline", "-n", name, *_where(cluster), "--price-as",
                        "Standard_NC24ads_A100_v4", "-l", "westus", "--currency", "EUR",
                        env={PRICES_URL_ENV: front.url})["cost"]
        assert (other["vmSize"], other["currency"], other["cost"]) == (
            "Standard_NC24ads_A100_v4", "EUR", round(hours * round(0.7346 * 1.1 * 0.92, 6), 6))
        # the API compares filter values case-sensitively: a size typed in lower case is asked for as Resource
        # SKUs spells it, and costs what the canonical spelling costs (asked anew: not from the day's cache)
        (az.config_dir / CACHE_FILE).unlink()
        lower = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster), "--price-as",
                        "standard_nc24ads_a100_v4", "-l", "westus", "--currency", "EUR",
                        env={PRICES_URL_ENV: front.url})["cost"]
        assert (lower["vmSize"], lower["cost"], lower["onDemandCost"]) == (
            other["vmSize"], other["cost"], other["onDemandCost"])
        assert front.violations == []
    (az.config_dir / CACHE_FILE).unlink(missing_ok=True)
    offline = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster),
                      env={PRICES_URL_ENV: "http://127.0.0.1:9/api/retail/prices"})
    assert offline["state"] == "Running" and offline["cost"]["cost"] == "unknown"
    assert "could not be read" in offline["cost"]["priceError"]
