"""az elastictrain job run --recovery in-process -g RG -c CLUSTER through the real az, the local ARM server and its
fake Kubernetes (as strict as the API server for the coordinator's Deployment, Service and NetworkPolicy:
tests.support.fake_workloads): the coordinator goes in with the job, on the system pool, the workers of both
engines are told where it is, job show reports the mode, and job delete (and its dry run) takes the coordinator
too."""
from __future__ import annotations

import copy
import uuid

import kubernetes_validate
import pytest

from azext_elastictrain.clients.kube import KubeError
from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
NAMESPACE = "elastictrain"
JOBS = {m.ENGINE_TORCHELASTIC: ("elastic.pytorch.org/v1alpha1", "ElasticJob"), m.ENGINE_K8S_JOB: ("batch/v1", "Job")}
COORDINATOR = (("apps/v1", "Deployment"), ("v1", "Service"), ("networking.k8s.io/v1", "NetworkPolicy"))


@pytest.fixture(scope="module")
def cluster(azure_login, arm_server, azurite, container):  # noqa: ARG001  (container: exists before reads)
    group = f"rg-{uuid.uuid4().hex[:10]}"
    azure_login("elastictrain", "cluster", "create", "-g", group, "-n", "trainer", "-l", "eastus", timeout=300)
    rid = f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/trainer"
    version = arm_server.find(rid)["properties"].get("currentKubernetesVersion")
    arm_server.seed_aks_training(group, "trainer", gpu_nodes=2, job="", workers=0)
    # the seeded cluster keeps the version create gave it (k8s-job needs 1.31+)
    arm_server.find(rid)["properties"].update(currentKubernetesVersion=version, kubernetesVersion=version)
    return group


@pytest.fixture(autouse=True)
def _kube_calls(arm_server):
    arm_server.kube.calls.clear()


def _where(group: str) -> list[str]:
    return ["-g", group, "-c", "trainer"]


def _run(az, group: str, name: str, engine: str, *extra: str):
    return az.json("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py",
                   "--min-nodes", "2", "--max-nodes", "3", "--engine", engine, "--recovery", "in-process",
                   *_where(group), *extra)


def _worker_container(job: dict) -> dict:
    template = job["spec"]["template"] if job["kind"] == "Job" else job["spec"]["replicaSpecs"]["Worker"]["template"]
    return template["spec"]["containers"][0]


@pytest.mark.parametrize("engine", sorted(JOBS))
def test_run_applies_the_coordinator_before_the_job_and_points_the_workers_at_it(az, arm, cluster, engine):
    name = f"ip{uuid.uuid4().hex[:8]}"
    shown = _run(az, cluster, name, engine)
    assert (shown["name"], shown["engine"], shown["recovery"]) == (name, engine, "in-process")
    applied = [(kind, obj) for verb, kind, _, obj in arm.kube.calls if verb == "apply"]
    coordinator = f"{name}-coordinator"
    assert applied[:2] == [("NetworkPolicy", f"{name}-workers"), ("Secret", f"{name}-state")]
    assert applied[2:5] == [("Deployment", coordinator), ("Service", coordinator), ("NetworkPolicy", coordinator)]
    assert applied[-1] == (JOBS[engine][1], name)
    deployment = arm.kube.get("apps/v1", "Deployment", coordinator, NAMESPACE)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.azure.com/mode": "system"}
    assert pod["containers"][0]["args"][:2] == [f"--bind=0.0.0.0:{launch.COORDINATOR_PORT}", "--min-replicas=2"]
    for api_version, kind in COORDINATOR:  # what the fake stored validates as the API server's schema says
        kubernetes_validate.validate(_without_server_fields(arm.kube.get(api_version, kind, coordinator, NAMESPACE)),
                                     kubernetes_validate.latest_version(), strict=True)
    job = arm.kube.get(*JOBS[engine], name, NAMESPACE)
    env = {e["name"]: e for e in _worker_container(job)["env"]}
    assert env["TORCHFT_LIGHTHOUSE"]["value"] == f"http://{coordinator}.{NAMESPACE}.svc:{launch.COORDINATOR_PORT}"
    assert env["ELASTICTRAIN_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert _worker_container(job)["args"][:2] == ["--standalone", "--nnodes=1"]

    described = az.json("elastictrain", "job", "show", "-n", name, *_where(cluster))
    assert (described["recovery"], described["minNodes"], described["maxNodes"]) == ("in-process", 2, 3)
    listed = {j["name"]: j["recovery"] for j in az.json("elastictrain", "job", "list", *_where(cluster))}
    assert listed[name] == "in-process"
    table = az("elastictrain", "job", "show", "-n", name, *_where(cluster), "-o", "table").stdout
    assert "Recovery" in table and "in-process" in table


def _without_server_fields(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    for key in ("uid", "resourceVersion", "generation", "creationTimestamp"):
        obj["metadata"].pop(key, None)
    return obj


@pytest.mark.parametrize("engine", sorted(JOBS))
def test_delete_shows_and_removes_the_coordinator_with_the_job(az, arm, cluster, engine):
    name = f"ip{uuid.uuid4().hex[:8]}"
    _run(az, cluster, name, engine)
    planned = az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--dry-run")
    assert {(c["kind"], c["name"]) for c in planned["coordinator"]} == {
        (kind, f"{name}-coordinator") for _, kind in COORDINATOR}
    table = az("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--dry-run", "-o", "table").stdout
    assert "coordinator Deployment" in table and f"{name}-coordinator" in table
    assert arm.kube.get("apps/v1", "Deployment", f"{name}-coordinator", NAMESPACE) is not None  # a dry run
    az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--yes")
    assert arm.kube.get(*JOBS[engine], name, NAMESPACE) is None
    assert [arm.kube.get(v, k, f"{name}-coordinator", NAMESPACE) for v, k in COORDINATOR] == [None, None, None]


def test_a_restart_job_gets_no_coordinator_and_deletes_as_before(az, arm, cluster):
    name = f"rs{uuid.uuid4().hex[:8]}"
    shown = az.json("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py",
                    "--min-nodes", "1", "--max-nodes", "2", *_where(cluster))
    assert shown["recovery"] == "restart"
    assert [k for verb, k, _, _ in arm.kube.calls if verb == "apply"] == ["NetworkPolicy", "ElasticJob"]
    planned = az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--dry-run")
    assert planned["coordinator"] == [] and [g["kind"] for g in planned["guards"]] == ["NetworkPolicy"]


def _selects(selector: dict, labels: dict) -> bool:
    """A NetworkPolicy's podSelector against a pod's labels, as the API reference defines it: matchLabels all
    equal, each matchExpressions term holds (In, NotIn, Exists, DoesNotExist); an empty selector selects all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for term in selector.get("matchExpressions") or []:
        key, op, values = term["key"], term["operator"], term.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) or \
                (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _admitted(policy: dict, pod: dict, namespace: str) -> bool:
    """Whether ``policy``'s ingress admits traffic from ``pod`` (of ``namespace``) on some port."""
    for rule in policy["spec"].get("ingress") or []:
        sources = rule.get("from")
        if not sources:  # a rule without 'from' admits every source
            return True
        for peer in sources:
            if "ipBlock" in peer or "namespaceSelector" in peer and (
                    namespace != policy["metadata"]["namespace"] or peer.get("namespaceSelector")):
                return True  # wider than the job's namespace: would admit pods outside the job
            if "podSelector" in peer and _selects(peer["podSelector"], pod["metadata"].get("labels") or {}):
                return True
    return False


@pytest.mark.parametrize("recovery", ("in-process", "restart"))
@pytest.mark.parametrize("engine", sorted(JOBS))
def test_every_worker_pod_is_reachable_by_the_jobs_own_workers_only(az, arm, cluster, engine, recovery):
    """On the fake API server, after the engine's controller made the pods: every worker pod of the job is selected
    by a NetworkPolicy (Ingress), and the policies that select it admit the job's own workers and no other pod of
    the namespace (another job's workers, its coordinator, etcd, a pod of nothing). Deleting the job takes the
    policy (and an in-process job's Secret) with it."""
    name, other = f"np{uuid.uuid4().hex[:8]}", f"np{uuid.uuid4().hex[:8]}"
    for job in (name, other):
        az.json("elastictrain", "job", "run", "-n", job, "--image", IMAGE, "--script", "/app/train.py",
                "--min-nodes", "2", "--max-nodes", "2", "--engine", engine, "--recovery", recovery, *_where(cluster))
    for _ in range(2):  # the controller creates the workers, the scheduler binds them
        arm.kube.operator.reconcile()
        arm.kube.jobs.reconcile()
    pods = arm.kube.list("v1", "Pod", NAMESPACE)
    outsiders = [{"metadata": {"name": "nobody", "labels": {"run": "curl"}}},
                 {"metadata": {"name": "lookalike", "labels": {**m.WORKER_LABELS, m.JOB_LABEL: "not-" + name}}}]
    policies = [p for p in arm.kube.list("networking.k8s.io/v1", "NetworkPolicy", NAMESPACE)
                if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]

    def workers_of(job: str) -> list[dict]:
        return [p for p in pods if (p["metadata"].get("labels") or {}).get(m.JOB_LABEL) == job
                and (p["metadata"].get("labels") or {}).get(m.COMPONENT_LABEL) == "training-worker"]

    assert len(workers_of(name)) == 2 and len(workers_of(other)) == 2, [p["metadata"]["name"] for p in pods]
    for worker in workers_of(name):
        guarding = [p for p in policies if _selects(p["spec"]["podSelector"], worker["metadata"]["labels"])]
        assert guarding, f"no NetworkPolicy selects {worker['metadata']['name']}"
        for source in [*pods, *outsiders]:
            admitted = any(_admitted(p, source, NAMESPACE) for p in guarding)
            assert admitted == (source in workers_of(name)), (source["metadata"]["name"], admitted)
    secret = arm.kube.get("v1", "Secret", f"{name}-state", NAMESPACE)
    assert (secret is not None) == (recovery == "in-process")
    az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--yes")
    assert arm.kube.get("networking.k8s.io/v1", "NetworkPolicy", f"{name}-workers", NAMESPACE) is None
    assert arm.kube.get("v1", "Secret", f"{name}-state", NAMESPACE) is None
    assert arm.kube.get("networking.k8s.io/v1", "NetworkPolicy", f"{other}-workers", NAMESPACE) is not None
    az.json("elastictrain", "job", "delete", "-n", other, *_where(cluster), "--yes")


def test_the_jobs_secret_is_made_at_run_and_shown_nowhere(az, arm, cluster):
    """The dry run shows a placeholder; the Secret sent has a value of its own, which no output (--debug
    included) and no log file of az holds."""
    name = f"sc{uuid.uuid4().hex[:8]}"
    planned = _run(az, cluster, name, m.ENGINE_K8S_JOB, "--dry-run")
    (shown,) = [o for o in planned["objects"] if o["kind"] == "Secret"]
    assert shown["stringData"] == {launch.JOB_SECRET_KEY: m.SECRET_PLACEHOLDER}
    result = az("elastictrain", "job", "run", "-n", name, "--image", IMAGE, "--script", "/app/train.py",
                "--min-nodes", "2", "--max-nodes", "3", "--engine", m.ENGINE_K8S_JOB, "--recovery", "in-process",
                *_where(cluster), "--debug")
    stored = arm.kube.get("v1", "Secret", f"{name}-state", NAMESPACE)
    value = (stored.get("stringData") or {}).get(launch.JOB_SECRET_KEY) or __import__("base64").b64decode(
        stored["data"][launch.JOB_SECRET_KEY]).decode()
    assert len(value) >= 32 and value != m.SECRET_PLACEHOLDER
    encoded = __import__("base64").b64encode(value.encode()).decode()
    logs = [p.read_text(errors="replace") for p in az.config_dir.rglob("*") if p.is_file()]
    for text in [result.stdout, result.stderr, *logs]:
        assert value not in text and encoded not in text
    az.json("elastictrain", "job", "delete", "-n", name, *_where(cluster), "--yes")


def test_an_unknown_recovery_mode_is_an_az_error(az, arm, cluster):
    result = az("elastictrain", "job", "run", "-n", "badmode", "--image", IMAGE, "--script", "/app/t.py",
                "--min-nodes", "1", "--max-nodes", "2", "--recovery", "inprocess", *_where(cluster), check=False)
    assert result.returncode == 2 and "in-process" in result.stderr and "Traceback" not in result.stderr
    assert [c for c in arm.kube.calls if c[0] == "apply"] == []


def _coordinator(name: str = "strict") -> list[dict]:
    cluster = m.InClusterSpec(identity_client_id=str(uuid.UUID(int=1)),
                              checkpoint_url="https://acct1.blob.core.windows.net/checkpoints")
    return m.render_coordinator(JobSpec(name=name, script="t.py", recovery="in-process"), cluster, IMAGE)


def _broken(obj: dict, change) -> dict:
    obj = copy.deepcopy(obj)
    change(obj)
    return obj


@pytest.mark.parametrize("kind, change, status, why", [
    ("Deployment", lambda d: d["spec"].update(replica=1), 500, r"\.spec\.replica: field not declared in schema"),
    ("Deployment", lambda d: d["spec"]["template"]["metadata"]["labels"].update({m.JOB_LABEL: "other"}), 422,
     "`selector` does not match template `labels`"),
    ("Deployment", lambda d: d["spec"].pop("selector"), 422, "selector"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"].update(restartPolicy="Never"), 422, '"Always"'),
    ("Deployment", lambda d: d["spec"]["strategy"].update(rollingUpdate={"maxSurge": 1}), 422, "Recreate"),
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(
        name="coordinator-port"), 422, "IANA_SVC_NAME"),
    ("Service", lambda s: s["spec"].pop("ports"), 422, r"spec\.ports: Required value"),
    ("Service", lambda s: s["spec"]["ports"][0].update(port=70000), 422, "between 1 and 65535"),
    ("Service", lambda s: s["spec"]["ports"][0].update(targetPort="coordinator-port"), 422, "IANA_SVC_NAME"),
    ("Service", lambda s: s["spec"]["ports"][0].update(targetPorts=1), 500, "field not declared in schema"),
    ("NetworkPolicy", lambda p: p["spec"].update(policyTypes=["ingress"]), 422, "Unsupported value"),
])
def test_the_fake_api_server_rejects_what_the_real_one_does(arm, kind, change, status, why):
    obj = next(o for o in _coordinator() if o["kind"] == kind)
    with pytest.raises(KubeError, match=why) as refused:
        arm.kube.apply(_broken(obj, change))
    assert refused.value.status == status
    assert arm.kube.get(obj["apiVersion"], kind, obj["metadata"]["name"], NAMESPACE) is None


def test_a_deployments_selector_cannot_change_once_it_exists(arm):
    deployment = _coordinator("immutable")[0]
    arm.kube.apply(deployment)
    relabelled = _broken(deployment, lambda d: (d["spec"]["selector"]["matchLabels"].update(extra="x"),
                                                d["spec"]["template"]["metadata"]["labels"].update(extra="x")))
    with pytest.raises(KubeError, match="field is immutable"):
        arm.kube.apply(relabelled)
    arm.kube.delete("apps/v1", "Deployment", "immutable-coordinator", NAMESPACE)
