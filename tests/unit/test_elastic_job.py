"""render_elastic_job: an ElasticJob valid for our CRD, whose workers land on Spot GPUs and reach etcd."""
from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import JobSpec, SpecError

CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="cifar", script="scripts/train_cifar10.py", min_nodes=1, max_nodes=4, nodes=2,
              nproc_per_node=1, script_args=("--steps", "1000"), checkpoint_interval=50, keep=3)
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"


@pytest.fixture(scope="module")
def job() -> dict:
    return m.render_elastic_job(JOB, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d")


def _pod(job: dict) -> dict:
    return job["spec"]["replicaSpecs"]["Worker"]["template"]


def _container(job: dict) -> dict:
    (container,) = _pod(job)["spec"]["containers"]
    return container


def test_the_job_validates_against_our_crd(job) -> None:
    crd = next(o for o in m.load_base_objects() if o["kind"] == "CustomResourceDefinition")
    jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).validate(job)


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_worker_pod_template_validates_against_the_official_schema(job, version) -> None:
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"},
                                  "template": _pod(job)}, version, strict=True)


def test_the_job_rendezvous_through_our_etcd_between_min_and_max(job) -> None:
    assert job["spec"]["rdzvEndpoint"] == "elastictrain-etcd.elastictrain.svc.cluster.local:2379"
    assert (job["spec"]["minReplicas"], job["spec"]["maxReplicas"]) == (1, 4)
    worker = job["spec"]["replicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and worker["restartPolicy"] == "ExitCode"


def test_our_torchrun_options_come_after_the_operators_so_they_win(job) -> None:
    container = _container(job)
    # torchrun behind the warm start's --agent, which execs it with every argument (the operator's first)
    assert container["command"] == ["python", "-m", launch.WARM_START_MODULE, "--agent"]
    args = container["args"]
    assert args[:3] == ["--rdzv-backend=etcd-v2", f"--rdzv-conf={launch.AKS.rdzv_conf}", "--rdzv-id=cifar-1a2b3c4d"]
    # The script and its own arguments last, started warm (runtime/warm.py: torchrun's -m runs the launcher).
    # "--" ends torchrun's options: the script's arguments cannot be taken for torchrun's (core/launch.py).
    assert args[-6:] == ["-m", launch.WARM_START_MODULE, "--", "scripts/train_cifar10.py", "--steps", "1000"]


def test_without_warm_starts_the_script_is_torchruns_own_entry_point() -> None:
    import dataclasses

    cold = m.render_elastic_job(dataclasses.replace(JOB, warm_start=False), CLUSTER, IMAGE, run_id="cifar-1a2b3c4d")
    args = _container(cold)["args"]
    assert args[-4:] == ["--", "scripts/train_cifar10.py", "--steps", "1000"] and launch.WARM_START_MODULE not in args
    assert _container(cold)["command"] == ["python", "-m", "torch.distributed.run"]


def test_workers_need_a_spot_gpu_node(job) -> None:
    spec = _pod(job)["spec"]
    assert {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot",
            "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in spec["tolerations"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.azure.com/scalesetpriority", "operator": "In",
                                         "values": ["spot"]}]
    assert _container(job)["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert spec["terminationGracePeriodSeconds"] >= 30  # Azure's Preempt notice


def test_workers_use_workload_identity_and_may_reach_etcd(job) -> None:
    labels = _pod(job)["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"
    assert _pod(job)["spec"]["serviceAccountName"] == CLUSTER.service_account
    policy = next(o for o in m.render_cluster_objects(CLUSTER) if o["kind"] == "NetworkPolicy")
    admitted = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert admitted.items() <= labels.items()


def test_workers_checkpoint_under_the_job_in_the_clusters_container(job) -> None:
    env = {e["name"]: e for e in _container(job)["env"]}
    source = env["ELASTICTRAIN_CHECKPOINT_CONTAINER_URL"]["valueFrom"]["configMapKeyRef"]
    assert source == {"name": m.CHECKPOINT_CONFIGMAP, "key": m.CHECKPOINT_URL_KEY}
    names = [e["name"] for e in _container(job)["env"]]
    assert names.index("ELASTICTRAIN_CHECKPOINT_CONTAINER_URL") < names.index("ELASTICTRAIN_CHECKPOINT_URL")
    assert env["ELASTICTRAIN_CHECKPOINT_URL"]["value"] == "$(ELASTICTRAIN_CHECKPOINT_CONTAINER_URL)/cifar"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]["value"] == "1"
    assert env["ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS"]["value"] == "50"


@pytest.mark.parametrize("image", ["elastictrain", "elastictrain:latest", "registry:5000/elastictrain", ""])
def test_an_unpinned_image_is_refused(image) -> None:
    with pytest.raises(SpecError, match="not pinned"):
        m.render_elastic_job(JOB, CLUSTER, image)


def test_a_digest_pins_an_image() -> None:
    digest = "myregistry.azurecr.io/elastictrain@sha256:" + "0" * 64
    assert _container(m.render_elastic_job(JOB, CLUSTER, digest))["image"] == digest


def test_a_bad_job_is_refused() -> None:
    with pytest.raises(SpecError):
        m.render_elastic_job(JobSpec(name="Bad_Name", script="train.py"), CLUSTER, IMAGE)
    with pytest.raises(SpecError):
        m.render_elastic_job(JobSpec(name="j", script="train.py", min_nodes=3, max_nodes=2), CLUSTER, IMAGE)


# Every ElasticJob the extension can make, not only the one above: edge counts, many GPUs per node, no
# checkpoint interval or run id, another namespace, service account and GPU taint.
OTHER_CLUSTER = m.InClusterSpec(namespace="team-a", service_account="trainer.sa",
                                gpu_taint="nvidia.com/gpu:NoSchedule",
                                identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                                tenant_id="11111111-2222-4333-8444-555555555555",
                                checkpoint_url="https://ckptstore01.blob.core.windows.net/team-a")
SPECS = [
    (JobSpec(name="a", script="train.py"), CLUSTER, None),
    (JobSpec(name="bert-large", script="bert/pretrain.py", min_nodes=2, max_nodes=8, nodes=2, nproc_per_node=4,
             script_args=("--lr=3e-4", "--data", "/data", "--flag with space"), keep=1), OTHER_CLUSTER, "r-1"),
    (JobSpec(name="x" * 40, script="t.py", min_nodes=3, max_nodes=3, checkpoint_interval=1), OTHER_CLUSTER, None),
]


@pytest.mark.parametrize("spec, cluster, run_id", SPECS, ids=["smallest", "many-gpus", "fixed-size"])
def test_every_job_validates_against_our_crd_and_its_pods_against_kubernetes(spec, cluster, run_id) -> None:
    rendered = m.render_elastic_job(spec, cluster, IMAGE, run_id=run_id)
    crd = next(o for o in m.load_base_objects() if o["kind"] == "CustomResourceDefinition")
    jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).validate(rendered)
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"},
                                  "template": _pod(rendered)}, kubernetes_validate.latest_version(), strict=True)
    assert rendered["metadata"]["namespace"] == cluster.namespace
    assert _container(rendered)["resources"]["limits"] == {"nvidia.com/gpu": spec.nproc_per_node}


def test_gpus_per_worker_may_differ_from_processes_per_worker() -> None:
    rendered = m.render_elastic_job(JOB, CLUSTER, IMAGE, gpus_per_node=4)
    assert _container(rendered)["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert "--nproc-per-node=1" in _container(rendered)["args"]
    with pytest.raises(SpecError, match="--gpus-per-node"):
        m.render_elastic_job(JOB, CLUSTER, IMAGE, gpus_per_node=0)
