"""Worker pods of both engines carry the memory tier: a memory-backed emptyDir with a sizeLimit, mounted where
the runtime keeps its copies (ELASTICTRAIN_MEMORY_DIR); 'off' renders no volume and turns the runtime's tier off.
Every variant validates against the official Kubernetes schema."""
from __future__ import annotations

from dataclasses import replace

import kubernetes_validate
import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import DEFAULT_MEMORY_TIER, JobSpec, SpecError

CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="cifar", script="/app/train_cifar10.py", min_nodes=1, max_nodes=2, checkpoint_interval=50)
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
KUBERNETES_VERSION = "1.31.0"


def pod_template(job: JobSpec, engine: str) -> dict:
    if engine == m.ENGINE_K8S_JOB:
        (batch_job,) = [o for o in m.render_k8s_job(job, CLUSTER, IMAGE, run_id="r1") if o["kind"] == "Job"]
        return batch_job["spec"]["template"]
    return m.render_elastic_job(job, CLUSTER, IMAGE, run_id="r1")["spec"]["replicaSpecs"]["Worker"]["template"]


def env_of(template: dict) -> dict:
    (container,) = template["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def validate(template: dict) -> None:
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "w"},
                                  "template": template}, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("engine", m.ENGINES)
def test_the_memory_tier_is_a_memory_backed_emptydir_with_a_size_limit_where_the_runtime_looks(engine) -> None:
    template = pod_template(replace(JOB, memory_tier="12Gi"), engine)
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes[m.MEMORY_TIER_VOLUME]["emptyDir"] == {"medium": "Memory", "sizeLimit": "12Gi"}
    (container,) = template["spec"]["containers"]
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    env = env_of(template)
    assert mounts[m.MEMORY_TIER_VOLUME] == env[launch.ENV_MEMORY_DIR] == launch.MEMORY_TIER_MOUNT
    assert env[launch.ENV_MEMORY_TIER] == "on"
    validate(template)


@pytest.mark.parametrize("engine", m.ENGINES)
def test_a_pod_that_goes_marks_itself_leaving_in_its_memory_volume_before_its_sigterm(engine) -> None:
    """The kubelet runs preStop before SIGTERM and only when the pod itself goes: the runtime then saves to blob
    (the pod's memory goes with it); torchrun's SIGTERM of a re-form finds no mark."""
    template = pod_template(JOB, engine)
    (container,) = template["spec"]["containers"]
    leaving = env_of(template)[launch.ENV_NODE_LEAVING_FILE]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["touch", leaving]
    assert leaving.startswith(launch.MEMORY_TIER_MOUNT + "/")  # a new pod's fresh emptyDir has no mark
    off = pod_template(replace(JOB, memory_tier="off"), engine)
    (plain,) = off["spec"]["containers"]
    assert "lifecycle" not in plain and launch.ENV_NODE_LEAVING_FILE not in env_of(off)


@pytest.mark.parametrize("engine", m.ENGINES)
def test_the_default_size_is_rendered(engine) -> None:
    volumes = {v["name"]: v for v in pod_template(JOB, engine)["spec"]["volumes"]}
    assert volumes[m.MEMORY_TIER_VOLUME]["emptyDir"]["sizeLimit"] == DEFAULT_MEMORY_TIER


@pytest.mark.parametrize("engine", m.ENGINES)
def test_off_renders_no_volume_and_turns_the_runtime_tier_off(engine) -> None:
    template = pod_template(replace(JOB, memory_tier="off"), engine)
    assert m.MEMORY_TIER_VOLUME not in {v["name"] for v in template["spec"]["volumes"]}
    env = env_of(template)
    assert env[launch.ENV_MEMORY_TIER] == "off" and launch.ENV_MEMORY_DIR not in env
    validate(template)


@pytest.mark.parametrize("bad", ["", "lots", "-1Gi", "0", "8GB", "8 Gi", "on"])
def test_a_memory_tier_that_is_no_size_is_refused_with_how_to_fix_it(bad) -> None:
    with pytest.raises(SpecError, match=r"--memory-tier .*e\.g\. 8Gi"):
        replace(JOB, memory_tier=bad)


@pytest.mark.parametrize("good", ["8Gi", "512Mi", "1.5Gi", "off", "4000M"])
def test_sizes_and_off_are_accepted(good) -> None:
    assert replace(JOB, memory_tier=good).memory_tier == good
