"""A job's runtime settings (core/settings.py): one value, written by both backends and read back by the runtime as
it was written; one precedence rule; a bad value named before anything trains."""
from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from azext_elastictrain.core import launch
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.settings import DEFAULTS, RuntimeSettings
from azext_elastictrain.core.spec import JobSpec, SpecError, job_env

seconds = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=1, max_value=10**9)
node_ranges = st.tuples(st.integers(1, 512), st.integers(0, 512)).map(lambda t: (t[0], t[0] + t[1]))
FIELD_VALUES = dict(
    keep=counts, checkpoint_interval_steps=st.none() | counts, checkpoint_interval_seconds=st.none() | seconds,
    progress_seconds=st.just(0.0) | seconds, hold_seconds=st.just(0.0) | seconds, memory_tier=st.booleans(),
    recovery=st.sampled_from(launch.RECOVERY_MODES), nodes=st.none() | node_ranges,
    collective_timeout_seconds=seconds, peer_timeout_seconds=st.none() | seconds,
    replica_timeout_seconds=st.none() | seconds, replica_heartbeat_timeout_seconds=st.none() | seconds,
    replica_check_steps=st.none() | counts,
    coordinator_coast=st.booleans(), salvage=st.booleans())
settings_values = st.builds(RuntimeSettings, **FIELD_VALUES)


@given(settings_values)
def test_the_runtime_reads_back_every_value_the_launch_writes(settings: RuntimeSettings) -> None:
    env = settings.to_env()
    assert RuntimeSettings.from_env(env) == settings
    assert all(isinstance(value, str) for value in env.values())  # an environment (and a pod's env values)


def test_every_setting_has_a_variable_of_its_own_and_the_strategy_covers_each() -> None:
    names = [f.metadata["env"] for f in fields(RuntimeSettings)]
    assert len(set(names)) == len(names) and all(name.startswith(launch.ENV_PREFIX) for name in names)
    # a field added without a strategy above would be round-tripped at its default only
    assert {f.name for f in fields(RuntimeSettings)} == set(FIELD_VALUES)


def test_an_argument_wins_over_the_environment_which_wins_over_the_default() -> None:
    assert RuntimeSettings.from_env({}).keep == DEFAULTS.keep == 3
    assert RuntimeSettings.from_env({launch.ENV_KEEP: "5"}).keep == 5
    assert RuntimeSettings.from_env({launch.ENV_KEEP: "5"}, keep=7).keep == 7
    assert RuntimeSettings.from_env({launch.ENV_KEEP: "5"}, keep=None).keep == 5  # None: not given
    assert RuntimeSettings.from_env({launch.ENV_KEEP: " "}).keep == 3  # empty: unset
    # torchft's own variable wins over ours (its Manager reads it too); unset, the collective timeout
    both = {"TORCHFT_TIMEOUT_SEC": "4", launch.ENV_REPLICA_TIMEOUT: "2", launch.ENV_COLLECTIVE_TIMEOUT: "9"}
    assert RuntimeSettings.from_env(both).replica_timeout == 4.0
    assert RuntimeSettings.from_env({launch.ENV_COLLECTIVE_TIMEOUT: "9"}).replica_timeout == 9.0


@pytest.mark.parametrize("name, raw, what", [
    (launch.ENV_KEEP, "0", "a whole number, at least 1"),
    (launch.ENV_KEEP, "three", "a whole number, at least 1"),
    (launch.ENV_CHECKPOINT_INTERVAL_SECONDS, "-1", "a number of seconds, more than 0"),
    (launch.ENV_PROGRESS_SECONDS, "nan", "a number of seconds, at least 0"),
    (launch.ENV_COLLECTIVE_TIMEOUT, "inf", "a number of seconds, more than 0"),
    (launch.ENV_PEER_TIMEOUT, "0", "a number of seconds, more than 0, or off"),
    (launch.ENV_MEMORY_TIER, "maybe", "on or off"),
    (launch.ENV_RECOVERY, "restart-ish", "restart or in-process"),
    (launch.ENV_NODES, "4:2", "MIN:MAX nodes"),
    (launch.ENV_REPLICA_CHECK_STEPS, "-3", "a whole number, at least 1, or off"),
    ("TORCHFT_TIMEOUT_SEC", "soon", "a number of seconds"),
])
def test_a_bad_value_is_refused_naming_the_variable_and_what_to_give(name, raw, what) -> None:
    with pytest.raises(ValueError, match=f"^{name}={raw!r}: give {what}"):
        RuntimeSettings.from_env({name: raw})


def test_off_turns_off_only_what_is_on_by_default() -> None:
    off = RuntimeSettings.from_env({launch.ENV_PEER_TIMEOUT: "off", launch.ENV_REPLICA_CHECK_STEPS: "OFF",
                                    launch.ENV_MEMORY_TIER: "off", launch.ENV_COORDINATOR_COAST: "off"})
    assert (off.peer_timeout_seconds, off.replica_check_steps, off.memory_tier, off.coordinator_coast) == \
        (None, None, False, False)
    with pytest.raises(ValueError, match=launch.ENV_CHECKPOINT_INTERVAL_STEPS):
        RuntimeSettings.from_env({launch.ENV_CHECKPOINT_INTERVAL_STEPS: "off"})  # unset is how it is off


@pytest.mark.parametrize("profile", [launch.LOCAL, launch.AKS], ids=lambda p: p.backend)
def test_a_jobs_settings_are_its_options_on_its_backends_figures(profile) -> None:
    spec = JobSpec(name="job", script="/app/train.py", min_nodes=2, max_nodes=4, keep=5, checkpoint_interval=50,
                   checkpoint_interval_seconds=600.0, memory_tier="off", recovery=launch.RECOVERY_IN_PROCESS,
                   env=(f"{launch.ENV_REPLICA_CHECK_STEPS}=off", "NCCL_DEBUG=INFO"))
    assert RuntimeSettings.from_env(job_env(spec, profile)) == RuntimeSettings(
        keep=5, checkpoint_interval_steps=50, checkpoint_interval_seconds=600.0, memory_tier=False,
        recovery=launch.RECOVERY_IN_PROCESS, nodes=(2, 4), progress_seconds=profile.progress_seconds,
        collective_timeout_seconds=profile.collective_timeout_seconds,
        replica_timeout_seconds=profile.replica_timeout_seconds,
        replica_heartbeat_timeout_seconds=profile.coordinator_heartbeat_timeout_ms / 1000, replica_check_steps=None)


def test_a_bad_runtime_setting_in_env_is_refused_as_the_spec_is_made() -> None:
    with pytest.raises(SpecError, match=f"--env {launch.ENV_REPLICA_CHECK_STEPS}='often': give a whole number"):
        JobSpec(name="job", script="/app/train.py", env=(f"{launch.ENV_REPLICA_CHECK_STEPS}=often",))


# -- a new option, end to end: --checkpoint-interval-seconds touched _params.py, the spec and the settings value ----
def test_a_new_option_reaches_the_runtime_on_both_backends(tmp_path) -> None:
    from azext_elastictrain.backends.local.agent import AgentLaunch
    from azext_elastictrain.runtime import Checkpointer

    spec = JobSpec(name="job", script="/app/train.py", checkpoint_interval_seconds=90.0)
    cluster = m.InClusterSpec(identity_client_id="11111111-2222-3333-4444-555555555555",
                              checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
    [container] = m.render_elastic_job(spec, cluster, "reg.io/t:1")["spec"]["replicaSpecs"]["Worker"]["template"][
        "spec"]["containers"]
    pod = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    node = AgentLaunch(node="job-node-0", spec=spec, script=spec.script, checkpoint_url="http://127.0.0.1:1/c/job",
                       connection_string="UseDevelopmentStorage=true", etcd_endpoint="127.0.0.1:2379",
                       rdzv_id="job-1", job_dir=tmp_path).env({})
    assert pod[launch.ENV_CHECKPOINT_INTERVAL_SECONDS] == node[launch.ENV_CHECKPOINT_INTERVAL_SECONDS] == "90"

    ckpt = Checkpointer.from_env(node, watcher=None, events=False, memory_tier=False)
    try:
        assert ckpt.interval_seconds == 90.0 and ckpt.settings.checkpoint_interval_seconds == 90.0
    finally:
        ckpt.close()


def test_a_local_dry_run_shows_the_settings_the_runtime_will_read_and_not_the_scripts_env(tmp_path) -> None:
    from azext_elastictrain.backends.base import JobRequest
    from azext_elastictrain.backends.local.backend import LocalBackend

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    spec = JobSpec(name="job", script=str(script), checkpoint_interval_seconds=600.0, keep=5,
                   env=("WANDB_API_KEY=secret-value",))
    shown = LocalBackend(tmp_path / "state", "local").plan_job(JobRequest(spec=spec)).shown
    assert RuntimeSettings.from_env(shown["settings"]) == spec.runtime_settings(launch.LOCAL)
    assert shown["settings"][launch.ENV_CHECKPOINT_INTERVAL_SECONDS] == "600" and "secret-value" not in str(shown)


def test_the_memory_tiers_former_variable_is_still_read_after_its_name() -> None:
    assert RuntimeSettings.from_env({"ELASTICTRAIN_MEMORY_RESCUE": "off"}).memory_tier is False
    both = {"ELASTICTRAIN_MEMORY_TIER": "on", "ELASTICTRAIN_MEMORY_RESCUE": "off"}
    assert RuntimeSettings.from_env(both).memory_tier is True, "the new name wins"
    assert "ELASTICTRAIN_MEMORY_RESCUE" not in RuntimeSettings(memory_tier=False).to_env(), "written by its name"
