"""render_k8s_job: the batch/v1 Indexed Job engine — a golden file, the official schemas, and the fields the
job controller acts on (podFailurePolicy, successPolicy, podReplacementPolicy) set as the docs require."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec, SpecError, check_engine_supported

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN = REPO_ROOT / "manifests" / "examples" / "elastic-job-k8s.yaml"
REGENERATE = "ELASTICTRAIN_REGENERATE_GOLDEN"
# The oldest Kubernetes the engine accepts (K8S_JOB_MIN_KUBERNETES) and the newest we promise.
KUBERNETES_VERSIONS = ("1.31.0", "1.35.0")
CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="cifar", script="scripts/train_cifar10.py", min_nodes=1, max_nodes=4, nodes=2,
              nproc_per_node=1, script_args=("--steps", "1000"), checkpoint_interval=50, keep=3)
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"


def render() -> list[dict]:
    return m.render_k8s_job(JOB, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d")


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render()


def _job(objects: list[dict]) -> dict:
    (job,) = [o for o in objects if o["kind"] == "Job"]
    return job


def _container(objects: list[dict]) -> dict:
    (container,) = _job(objects)["spec"]["template"]["spec"]["containers"]
    return container


def test_the_rendering_matches_the_golden_file() -> None:
    rendered = yaml.safe_dump_all(render(), sort_keys=False)
    if os.environ.get(REGENERATE):
        GOLDEN.write_text(rendered, encoding="utf-8")
    expected = GOLDEN.read_text(encoding="utf-8")
    assert rendered == expected, (f"{GOLDEN.relative_to(REPO_ROOT)} differs from what render_k8s_job renders; "
                                  f"if the change is intended, regenerate it with {REGENERATE}=1 python -m pytest "
                                  f"{Path(__file__).relative_to(REPO_ROOT)} and review the diff")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_version_is_known_to_the_validator(version) -> None:
    assert version in all_versions(), f"kubernetes-validate {kubernetes_validate.__version__} lacks {version}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("nodes", [(1, 1, 1), (1, 2, 4), (2, 8, 16)])
def test_every_rendered_object_validates_strictly(version, nodes) -> None:
    low, count, high = nodes
    spec = JobSpec(name="bert", script="train.py", min_nodes=low, nodes=count, max_nodes=high)
    for obj in m.render_k8s_job(spec, CLUSTER, IMAGE):
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_can_fail(objects) -> None:
    broken = copy.deepcopy(_job(objects))
    broken["spec"]["podFailurePolicy"]["rules"][0]["action"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_the_service_is_headless_and_selects_the_jobs_pods(objects) -> None:
    service, job = objects
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == service["metadata"]["name"] == "cifar"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_one_index_per_node_up_to_max_nodes(objects) -> None:
    spec = _job(objects)["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)


def test_evictions_are_ignored_and_a_script_error_fails_the_job_in_that_order(objects) -> None:
    spec = _job(objects)["spec"]
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": "elasticjob-worker", "operator": "NotIn", "values": [0]}
    # What the API server requires next to a podFailurePolicy.
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["podReplacementPolicy"] == "Failed"


def test_the_job_succeeds_once_any_node_finished_training(objects) -> None:
    assert _job(objects)["spec"]["successPolicy"] == {"rules": [{"succeededCount": 1}]}


def test_torchrun_joins_the_etcd_v2_rendezvous_with_the_aks_settings(objects) -> None:
    args = _container(objects)["args"]
    assert _container(objects)["command"] == ["python", "-m", launch.WARM_START_MODULE, "--agent"]
    assert args[:5] == launch.torchrun_options(rdzv_conf=launch.AKS.rdzv_conf, nproc_per_node=1,
                                               rdzv_id="cifar-1a2b3c4d")
    assert "--rdzv-endpoint=elastictrain-etcd.elastictrain.svc.cluster.local:2379" in args
    assert "--nnodes=1:4" in args
    assert args[-6:] == ["-m", launch.WARM_START_MODULE, "--", "scripts/train_cifar10.py", "--steps", "1000"]


def test_without_a_run_id_the_rendezvous_is_the_jobs_name() -> None:
    (container,) = _job(m.render_k8s_job(JOB, CLUSTER, IMAGE))["spec"]["template"]["spec"]["containers"]
    assert "--rdzv-id=cifar" in container["args"]


def test_the_pod_is_the_elastic_jobs_worker_but_for_what_a_job_needs(objects) -> None:
    """Same placement, GPUs, identity, env and grace period as the ElasticJob's worker template."""
    worker = m.render_elastic_job(JOB, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d")["spec"]["replicaSpecs"]["Worker"]
    ours = copy.deepcopy(_job(objects)["spec"]["template"])
    theirs = copy.deepcopy(worker["template"])
    assert ours["spec"].pop("restartPolicy") == "Never" and ours["spec"].pop("subdomain") == "cifar"
    # the operator's per-worker Service port (kubeflow/common GetPortFromJob): no operator, no port
    assert theirs["spec"]["containers"][0].pop("ports") == [{"name": "elasticjob-port", "containerPort": 10291}]
    for pod in (ours, theirs):
        pod["spec"]["containers"][0].pop("args")
        pod["metadata"]["labels"].pop(m.ENGINE_LABEL)
    assert ours == theirs


def test_the_engine_is_recorded_on_every_object(objects) -> None:
    for obj in [*objects, _job(objects)["spec"]["template"]]:
        assert obj["metadata"]["labels"][m.ENGINE_LABEL] == m.ENGINE_K8S_JOB
    assert m.render_elastic_job(JOB, CLUSTER, IMAGE)["metadata"]["labels"][m.ENGINE_LABEL] == "torchelastic"


def test_bad_input_is_refused_as_for_the_elastic_job() -> None:
    with pytest.raises(SpecError, match="not pinned"):
        m.render_k8s_job(JOB, CLUSTER, "myregistry.azurecr.io/elastictrain:latest")
    with pytest.raises(SpecError, match="--min-nodes"):
        m.render_k8s_job(JobSpec(name="j", script="t.py", min_nodes=3, max_nodes=2), CLUSTER, IMAGE)


@pytest.mark.parametrize("version", ["1.31.2", "v1.33.0", "1.35"])
def test_k8s_job_runs_on_1_31_and_later(version) -> None:
    check_engine_supported(m.ENGINE_K8S_JOB, version)


@pytest.mark.parametrize("version", ["1.30.9", "1.29", "", "unknown"])
def test_k8s_job_is_refused_below_1_31_with_the_reason(version) -> None:
    with pytest.raises(SpecError, match=r"needs Kubernetes 1\.31 or later.*podFailurePolicy.*--engine torchelastic"):
        check_engine_supported(m.ENGINE_K8S_JOB, version)


def test_the_operator_engine_runs_on_any_version_and_an_unknown_engine_is_refused() -> None:
    check_engine_supported(m.ENGINE_TORCHELASTIC, "1.30.0")
    with pytest.raises(SpecError, match="unknown engine 'volcano': use one of torchelastic, k8s-job"):
        check_engine_supported("volcano", "1.33.0")
