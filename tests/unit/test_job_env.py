"""job run --env KEY=VALUE: checked as the spec is made, and in the environment of every node on both backends
(core/spec.py's job_env is what a local agent and an AKS worker pod both get)."""
from __future__ import annotations

import os

import pytest

from azext_elastictrain.backends.local import starting as local_starting
from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec, SpecError
from harness import elastic

ENV = ("NCCL_DEBUG=INFO", "WANDB_MODE=offline", "EMPTY=", "WITH_EQUALS=a=b")
CLUSTER = m.InClusterSpec(identity_client_id="11111111-2222-3333-4444-555555555555",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")


def test_the_scripts_environment_reaches_an_aks_worker_pod() -> None:
    job = m.render_elastic_job(JobSpec(name="cifar", script="/app/train.py", env=ENV), CLUSTER, "reg.io/t:1")
    [container] = job["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env[k] for k in ("NCCL_DEBUG", "WANDB_MODE", "EMPTY", "WITH_EQUALS")} == \
        {"NCCL_DEBUG": "INFO", "WANDB_MODE": "offline", "EMPTY": "", "WITH_EQUALS": "a=b"}


def test_the_scripts_environment_reaches_a_local_node(monkeypatch, tmp_path) -> None:
    started = {}

    class Started:  # the node's process, not started (this test's pid stands in): its environment is checked
        pid = os.getpid()

        def __init__(self, argv, **kwargs):
            started["env"] = kwargs["env"]

    monkeypatch.setattr(local_starting.subprocess, "Popen", Started)
    (tmp_path / "job" / "nodes").mkdir(parents=True)
    conn = {"blob_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "connection_string": "UseDevelopment",
            "etcd": "127.0.0.1:2379", "scheduled_events": "http://127.0.0.1:9/metadata/scheduledevents"}
    spec = JobSpec(name="job", script=str(elastic.TRAIN_SCRIPT), env=(*ENV, f"{launch.ENV_REPLICA_CHECK_STEPS}=5"))
    local_starting.start_node(spec, str(elastic.TRAIN_SCRIPT), "job-node-0", conn, job_dir=tmp_path / "job",
                              rdzv_id="job-1", recorded={})
    assert started["env"]["NCCL_DEBUG"] == "INFO" and started["env"]["WITH_EQUALS"] == "a=b"
    assert started["env"][launch.ENV_KEEP] == "3"  # the job's own settings are still there
    assert started["env"][launch.ENV_REPLICA_CHECK_STEPS] == "5"  # a runtime setting no option sets


@pytest.mark.parametrize("env, message", [
    (("NCCL_DEBUG",), "is not KEY=VALUE"),
    (("1X=a",), "is not KEY=VALUE"),
    (("A-B=1",), "is not KEY=VALUE"),
    (("ELASTICTRAIN_KEEP=9",), "are the job's own settings"),
    (("ELASTICTRAIN_COORDINATOR=x",), "may give only ELASTICTRAIN_REPLICA_CHECK_STEPS and"),
    (("A=1", "A=2"), "given twice"),
])
def test_a_bad_variable_is_refused_as_the_spec_is_made(env, message) -> None:
    with pytest.raises(SpecError, match=message):
        JobSpec(name="cifar", script="/app/train.py", env=env)


@pytest.mark.parametrize("profile", [launch.LOCAL, launch.AKS], ids=lambda p: p.backend)
@pytest.mark.parametrize("recovery", launch.RECOVERY_MODES)
def test_the_runtime_reads_back_what_the_launch_writes(profile, recovery) -> None:
    """spec.job_env is the one writer of a job's settings on both backends; the runtime's readers get back the
    spec's options and the backend profile's figures."""
    from datetime import timedelta

    from azext_elastictrain.core.settings import RuntimeSettings
    from azext_elastictrain.core.spec import job_env
    from azext_elastictrain.runtime.replicas import in_process
    from azext_elastictrain.runtime.timeouts import collective_timeout, replica_timeout

    spec = JobSpec(name="job", script="/app/train.py", min_nodes=2, max_nodes=5, recovery=recovery)
    env = job_env(spec, profile, coordinator="http://coordinator:29510")
    assert RuntimeSettings.from_env(env).nodes == (2, 5) and in_process(env) == spec.in_process
    assert collective_timeout(env) == timedelta(seconds=profile.collective_timeout_seconds)
    if spec.in_process:
        assert replica_timeout(env) == timedelta(seconds=profile.replica_timeout_seconds)
        assert env[launch.ENV_COORDINATOR] == "http://coordinator:29510"
    else:
        assert launch.ENV_COORDINATOR not in env and launch.ENV_REPLICA_TIMEOUT not in env
    assert launch.PROFILES[profile.backend] is profile
