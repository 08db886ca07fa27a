"""An in-process job on AKS: its coordinator (Deployment, Service, NetworkPolicy on the system pool) rendered
with the job, and workers that are each a torchrun --standalone world told where the coordinator is - for both
engines. A golden file, the official schemas, and torchrun's own parser reading the operator's command line."""
from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from azext_elastictrain.backends.aks.jobs import AksJobs
from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec, SpecError

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = REPO_ROOT / "manifests" / "examples" / "elastic-job-in-process.yaml"
REGENERATE = "ELASTICTRAIN_REGENERATE_GOLDEN"
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="cifar", script="scripts/train_cifar10.py", min_nodes=2, max_nodes=4, nodes=3,
              nproc_per_node=2, script_args=("--steps", "1000"), checkpoint_interval=50, keep=3,
              recovery="in-process")
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
ENGINES = (m.ENGINE_TORCHELASTIC, m.ENGINE_K8S_JOB)


def render(job: JobSpec = JOB, engine: str = m.ENGINE_TORCHELASTIC) -> list[dict]:
    objects = m.render_k8s_job(job, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d", gpus_per_node=2) \
        if engine == m.ENGINE_K8S_JOB else [m.render_elastic_job(job, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d",
                                                                 gpus_per_node=2)]
    guards = [m.render_worker_policy(job, CLUSTER)]  # as backends.aks.jobs.AksJobs.render orders them
    if job.in_process:
        return [*guards, m.render_job_secret(job, CLUSTER), *m.render_coordinator(job, CLUSTER, IMAGE), *objects]
    return [*guards, *objects]


def _one(objects: list[dict], kind: str) -> dict:
    """The one object of ``kind`` (a NetworkPolicy: the coordinator's; the workers' is _workers_policy's)."""
    (found,) = [o for o in objects if o["kind"] == kind
                and not (kind == "NetworkPolicy" and o["metadata"]["name"] == m.worker_policy_name(JOB.name))]
    return found


def _worker_template(objects: list[dict]) -> dict:
    job = objects[-1]
    return job["spec"]["template"] if job["kind"] == "Job" else job["spec"]["replicaSpecs"]["Worker"]["template"]


def _worker(objects: list[dict]) -> dict:
    (container,) = _worker_template(objects)["spec"]["containers"]
    return container


def test_the_rendering_matches_the_golden_file() -> None:
    rendered = yaml.safe_dump_all(render(), sort_keys=False)
    if os.environ.get(REGENERATE):
        GOLDEN.write_text(rendered, encoding="utf-8")
    assert rendered == GOLDEN.read_text(encoding="utf-8"), (
        f"{GOLDEN.relative_to(REPO_ROOT)} differs from what is rendered; if the change is intended, regenerate it "
        f"with {REGENERATE}=1 python -m pytest {Path(__file__).relative_to(REPO_ROOT)} and review the diff")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("engine", ENGINES)
def test_every_object_validates_strictly_against_the_official_schema(version, engine) -> None:
    for obj in render(engine=engine):
        if obj["kind"] == "ElasticJob":
            template = _worker_template([obj])
            obj = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "w"}, "template": template}
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_elastic_job_validates_against_our_crd() -> None:
    crd = next(o for o in m.load_base_objects() if o["kind"] == "CustomResourceDefinition")
    jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).validate(render()[-1])


def test_the_coordinator_comes_first_and_runs_the_runtime_module_with_the_jobs_min_nodes() -> None:
    objects = render()
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Secret", "Deployment", "Service", "NetworkPolicy",
                                            "ElasticJob"], "the workers' guards, then the coordinator, then the job"
    assert {o["metadata"]["name"] for o in objects[2:5]} == {"cifar-coordinator"}
    (container,) = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE and container["command"] == ["python", "-m", launch.COORDINATOR_MODULE]
    assert container["args"] == launch.coordinator_args(launch.AKS, bind=f"0.0.0.0:{launch.COORDINATOR_PORT}",
                                                        min_nodes=2)
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_coordinator_runs_where_etcd_runs_never_on_spot() -> None:
    etcd = next(o for o in m.load_base_objects() if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    pod = _one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == etcd["nodeSelector"] == {"kubernetes.azure.com/mode": "system"}
    assert pod["tolerations"] == etcd["tolerations"]
    assert not any(t.get("key") in ("kubernetes.azure.com/scalesetpriority", "sku") for t in pod["tolerations"])


def test_the_coordinator_pod_is_locked_down_as_the_other_pods() -> None:
    deployment = _one(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    # one pod at a time: two coordinators would form two quorums
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_the_service_selects_the_coordinator_pod_only_and_the_policy_admits_only_the_jobs_workers() -> None:
    objects = render()
    deployment, service, policy = (_one(objects, k) for k in ("Deployment", "Service", "NetworkPolicy"))
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels == service["spec"]["selector"]
    assert labels[m.COMPONENT_LABEL] == "coordinator" and m.ENGINE_LABEL not in labels  # not a worker's Service's
    assert service["spec"]["type"] == "ClusterIP"
    (port,) = service["spec"]["ports"]
    (container_port,) = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port["port"] == container_port["containerPort"] == launch.COORDINATOR_PORT
    assert port["targetPort"] == container_port["name"]
    (rule,) = policy["spec"]["ingress"]
    admitted = rule["from"][0]["podSelector"]["matchLabels"]
    worker_labels = _worker_template(objects)["metadata"]["labels"]
    assert all(worker_labels[k] == v for k, v in admitted.items()) and admitted[m.JOB_LABEL] == "cifar"
    assert policy["spec"]["podSelector"]["matchLabels"] == labels


@pytest.mark.parametrize("engine", ENGINES)
def test_workers_are_standalone_worlds_told_the_coordinators_service_and_their_pod_name(engine) -> None:
    objects = render(engine=engine)
    container = _worker(objects)
    args = container["args"]
    assert args[:4] == ["--standalone", "--nnodes=1", "--nproc-per-node=2", f"--max-restarts={launch.MAX_RESTARTS}"]
    assert not [a for a in args if a.startswith("--rdzv")]
    env = {e["name"]: e for e in container["env"]}
    assert env[launch.ENV_RECOVERY]["value"] == "in-process"
    assert env[launch.ENV_COORDINATOR]["value"] == f"http://cifar-coordinator.elastictrain.svc:{launch.COORDINATOR_PORT}"
    assert env[launch.ENV_REPLICA_ID]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[launch.ENV_REPLICA_HOST]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert objects[-1]["metadata"]["labels"][m.RECOVERY_LABEL] == "in-process"


def _torchrun_launch(monkeypatch, argv: list[str]):
    """The launch config torchrun's own ``run`` makes of ``argv`` (what it would start, started not)."""
    import torch.distributed.run as torchrun

    made = []
    monkeypatch.setattr(torchrun, "elastic_launch", lambda config, entrypoint: made.append(config) or (lambda *a: 0))
    torchrun.run(torchrun.parse_args(argv))
    return made[0]


def test_the_operators_prepended_rendezvous_does_not_survive_standalone(monkeypatch) -> None:
    """The TorchElastic controller puts its etcd rendezvous in front of our args (pytorch/elastic
    kubernetes/controllers/pod.go SetClusterSpecForPod); torchrun itself reads the result: --standalone (applied
    in torchrun's run, after parsing) replaces every --rdzv-* option, and our --nnodes=1 comes last."""
    job = render()[-1]
    prepended = ["--rdzv_backend=etcd", f"--rdzv_endpoint={job['spec']['rdzvEndpoint']}", "--rdzv_id=cifar",
                 f"--nnodes={job['spec']['minReplicas']}:{job['spec']['maxReplicas']}"]
    args = [a for a in _worker(render())["args"] if a not in ("-m", launch.WARM_START_MODULE)]
    config = _torchrun_launch(monkeypatch, prepended + args)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("c10d", "localhost:0") and config.run_id != "cifar"
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 1, 2)
    # the restart mode's own args still win over the operator's as before
    restart = [a for a in _worker(render(JobSpec(**{**JOB.__dict__, "recovery": "restart"})))["args"]
               if a not in ("-m", launch.WARM_START_MODULE)]
    config = _torchrun_launch(monkeypatch, prepended + restart)
    assert (config.rdzv_backend, config.min_nodes, config.max_nodes) == ("etcd-v2", 2, 4)


def test_a_restart_job_has_no_coordinator_and_says_its_mode() -> None:
    objects = render(JobSpec(**{**JOB.__dict__, "recovery": "restart"}))
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "ElasticJob"], "the workers' policy, no Secret"
    env = {e["name"]: e.get("value") for e in _worker(objects)["env"]}
    assert env[launch.ENV_RECOVERY] == "restart" and launch.ENV_COORDINATOR not in env
    assert launch.ENV_JOB_SECRET not in env, "no state server in the restart mode"
    assert m.RECOVERY_LABEL not in objects[-1]["metadata"]["labels"]


def test_a_job_name_too_long_for_the_coordinators_service_is_refused_before_anything_is_sent() -> None:
    name = "a" * 52  # fits the restart mode (<job>-worker-<i>: 61) but not <job>-coordinator (64)
    m.render_elastic_job(JobSpec(name=name, script="t.py", recovery="restart"), CLUSTER, IMAGE)
    with pytest.raises(SpecError, match=r"Service .a+-coordinator. would have 64 characters.*at most 51 characters"):
        m.render_elastic_job(JobSpec(name=name, script="t.py", recovery="in-process"), CLUSTER, IMAGE)


@pytest.mark.parametrize("engine", ENGINES)
def test_job_show_reads_the_mode_and_node_range_back(engine) -> None:
    from azext_elastictrain.backends.aks.describe import describe_job

    job = copy.deepcopy(render(engine=engine)[-1])
    job["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    shown = describe_job(job, [], [], [])
    assert (shown["recovery"], shown["minNodes"], shown["maxNodes"], shown["nprocPerNode"]) == ("in-process", 2, 4, 2)
    assert shown["rdzvId"] is None


def test_the_plan_carries_the_coordinator_before_the_job() -> None:
    from types import SimpleNamespace

    site = SimpleNamespace(spec=SimpleNamespace(namespace="elastictrain", service_account="elastictrain-training",
                                                name="trainer"),
                           gpu_pool={"name": "gpu"}, container_url=CLUSTER.checkpoint_url)
    objects = AksJobs.render(site, JOB, IMAGE, gpus_per_node=2, engine=m.ENGINE_K8S_JOB)
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Secret", "Deployment", "Service", "NetworkPolicy",
                                            "Service", "Job"]


def test_a_submit_that_fails_at_the_job_leaves_no_coordinator_behind() -> None:
    """Nothing later would find a coordinator without its job (job delete looks the job up first)."""
    from azext_elastictrain.backends.aks.plans import AksJob
    from azext_elastictrain.backends.aks.session import AksSession
    from azext_elastictrain.clients.kube import KubeError
    from tests.support.fake_kube import FakeKube
    from tests.unit.test_aks_jobs_backend import GPU, SYSTEM, FakeArm

    kube = FakeKube()
    jobs = AksJobs(AksSession(FakeArm([SYSTEM, GPU]), "rg", "trainer", kube_connect=lambda _: kube))
    objects = AksJobs.render(jobs.session.site(), JOB, IMAGE, gpus_per_node=2)
    kube.fail("apply", "ElasticJob", error=KubeError("apply ElasticJob failed: HTTP 403 Forbidden", status=403))
    with pytest.raises(KubeError, match="403"):
        jobs.submit_job(AksJob(tuple(objects)))
    assert [c[1] for c in kube.calls if c[0] == "apply"] == ["NetworkPolicy", "Secret", "Deployment", "Service",
                                                             "NetworkPolicy"]
    assert [c[1] for c in kube.calls if c[0] == "delete"] == ["NetworkPolicy", "Service", "Deployment", "Secret",
                                                              "NetworkPolicy"]
    assert [o for o in kube.objects if o[1] in ("Deployment", "Service", "NetworkPolicy", "Secret")] == []


def _selects(selector: dict, labels: dict) -> bool:
    """Whether a NetworkPolicy's podSelector matches a pod's labels (matchLabels; anything else: assume it does)."""
    if set(selector) - {"matchLabels"}:
        return True
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


@pytest.mark.parametrize("in_process", (True, False))
@pytest.mark.parametrize("engine", ENGINES)
def test_a_policy_admits_only_the_jobs_own_workers_to_its_workers_on_every_port(engine, in_process) -> None:
    """The workers reach each other on ports picked at start (each node's store, torchft's Manager server, gloo's
    pairs, the state server): the job's policy selects its worker pods and admits the job's workers only, with a
    rule that lists no ports (every port, NetworkPolicy's API reference); every other policy this extension ships
    or renders leaves the worker pods alone; the coordinator's admits the workers on its port."""
    from importlib.resources import files

    job = JOB if in_process else dataclasses.replace(JOB, recovery=launch.RECOVERY_RESTART)
    objects = render(job, engine=engine)
    shipped = [d for path in files("azext_elastictrain").joinpath("manifests").iterdir()
               if path.name.endswith(".yaml") for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    policies = [o for o in [*objects, *shipped] if o.get("kind") == "NetworkPolicy"]
    worker_labels = _worker_template(objects)["metadata"]["labels"]
    workers = next(p for p in policies if p["metadata"]["name"] == m.worker_policy_name(JOB.name))
    assert _selects(workers["spec"]["podSelector"], worker_labels) and workers["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = workers["spec"]["ingress"]
    assert "ports" not in rule and [list(f) for f in rule["from"]] == [["podSelector"]]
    assert rule["from"][0]["podSelector"] == workers["spec"]["podSelector"]
    other_job = {**worker_labels, m.JOB_LABEL: "another"}
    assert not _selects(rule["from"][0]["podSelector"], other_job), "another job's workers are not admitted"
    assert not _selects(rule["from"][0]["podSelector"], {"app.kubernetes.io/part-of": "elastictrain"})
    for policy in policies:
        if policy is not workers:
            assert not _selects(policy["spec"]["podSelector"], worker_labels), policy["metadata"]["name"]
    assert len(policies) == (3 if in_process else 2)  # etcd's, the workers' (and the coordinator's)
    if not in_process:
        return
    coordinator = _one(objects, "NetworkPolicy")
    (rule,) = coordinator["spec"]["ingress"]
    assert _selects(rule["from"][0]["podSelector"], worker_labels)
    assert rule["ports"] == [{"protocol": "TCP", "port": launch.COORDINATOR_PORT}]
    env = {e["name"]: e for e in _worker(objects)["env"]}
    assert env[launch.ENV_COORDINATOR]["value"].endswith(f":{launch.COORDINATOR_PORT}")
    secret = _one(objects, "Secret")
    assert env[launch.ENV_JOB_SECRET]["valueFrom"] == {"secretKeyRef": {
        "name": secret["metadata"]["name"], "key": launch.JOB_SECRET_KEY}}
    assert secret["stringData"] == {launch.JOB_SECRET_KEY: m.SECRET_PLACEHOLDER}, "the plan never holds a secret"
