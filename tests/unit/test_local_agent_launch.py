"""The benchmarks and the torchrun tests start nodes exactly as `job run --local` does: one launch builder
(backends/local/agent.py), never a torchrun command line typed again in harness/, tests/support or scripts/bench;
and their etcd and Azurite exactly as `cluster create --local` does (backends/local/components.py)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from azext_elastictrain.backends.local import agent as local_agent
from azext_elastictrain.backends.local import cluster as local_cluster
from azext_elastictrain.backends.local import starting as local_starting
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import JobSpec
from harness import elastic, services

REPO = Path(__file__).resolve().parents[2]


class _Started:
    """What subprocess.Popen returns, for a process that is this one (psutil can read its start time)."""

    pid = os.getpid()

    def __init__(self, argv, **kwargs):
        self.argv, self.env = argv, kwargs["env"]
        _Started.last = self


def _product_launch(monkeypatch, tmp_path: Path, record: dict | None = None) -> _Started:
    monkeypatch.setattr(local_starting.subprocess, "Popen", _Started)
    spec = JobSpec(name="job", script=str(elastic.TRAIN_SCRIPT), min_nodes=1, max_nodes=2,
                   script_args=("--steps", "10"), **({"recovery": record["recovery"]} if record else {}))
    (tmp_path / "job" / "nodes").mkdir(parents=True)
    # the job's record (``record``): how a node of this job recovers, where its coordinator is
    conn = {"blob_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "connection_string": "UseDevelopment",
            "etcd": "127.0.0.1:2379", "scheduled_events": "http://127.0.0.1:9/metadata/scheduledevents"}
    local_starting.start_node(spec, str(elastic.TRAIN_SCRIPT), "job-node-0", conn, job_dir=tmp_path / "job",
                              rdzv_id="job-1234", recorded=record or {})
    return _Started.last


def _bench_launch(monkeypatch, tmp_path: Path, **settings) -> _Started:
    monkeypatch.setattr(elastic.subprocess, "Popen", _Started)
    config = elastic.JobConfig(name="job-1234", checkpoint_url="http://127.0.0.1:10000/devstoreaccount1/ckpt/job",
                               connection_string="UseDevelopment", etcd_endpoint="127.0.0.1:2379",
                               script_args=("--steps", "10"),
                               scheduled_events_url="http://127.0.0.1:9/metadata/scheduledevents", **settings)
    node = elastic.Node(config, "job-node-0", tmp_path / "bench")
    node._log.close()  # pylint: disable=protected-access  # the fake started nothing
    return _Started.last


def test_a_benchmark_node_runs_the_command_line_job_run_local_runs(monkeypatch, tmp_path):
    product, bench = _product_launch(monkeypatch, tmp_path), _bench_launch(monkeypatch, tmp_path)
    assert bench.argv == product.argv
    assert f"--rdzv-conf={launch.LOCAL.rdzv_conf}" in product.argv and "--max-restarts=100" in product.argv
    # the same runtime settings, but for where its files go and the test's own progress interval
    differ = {launch.ENV_PREEMPTION_STATE, launch.ENV_NODE_LEAVING_FILE, launch.ENV_PROGRESS_SECONDS,
              local_agent.JOB_MARKER_ENV, launch.ENV_CHECKPOINT_URL, launch.ENV_MEMORY_DIR}
    ours = {k: v for k, v in product.env.items() if k.startswith(launch.ENV_PREFIX) and k not in differ}
    theirs = {k: v for k, v in bench.env.items() if k.startswith(launch.ENV_PREFIX) and k not in differ}
    assert ours == theirs and ours[launch.ENV_KEEP] == "3"
    assert bench.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == product.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_a_benchmark_in_process_node_runs_what_job_run_local_runs(monkeypatch, tmp_path):
    """goodput.py's and outage.py's in-process config: a torchrun --standalone world told the coordinator and
    its replica id as a node of `job run --local --recovery in-process` is, not a restart-mode node."""
    address = "http://127.0.0.1:29999"
    product = _product_launch(monkeypatch, tmp_path, record={"recovery": launch.RECOVERY_IN_PROCESS,
                                                             "coordinator": {"address": address}})
    bench = _bench_launch(monkeypatch, tmp_path, recovery=launch.RECOVERY_IN_PROCESS, coordinator=address)
    assert bench.argv == product.argv and "--standalone" in product.argv
    for name in (launch.ENV_RECOVERY, launch.ENV_COORDINATOR, launch.ENV_REPLICA_ID, launch.ENV_REPLICA_TIMEOUT):
        assert bench.env[name] == product.env[name]
    assert bench.env[launch.ENV_RECOVERY] == launch.RECOVERY_IN_PROCESS and bench.env[launch.ENV_COORDINATOR] == address


def test_the_callers_elastictrain_settings_do_not_leak_into_a_node(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS", "1")
    product = _product_launch(monkeypatch, tmp_path)
    assert launch.ENV_CHECKPOINT_INTERVAL_STEPS not in product.env


def test_no_torchrun_command_line_is_typed_outside_the_product():
    """harness/, tests/support (but the fake ElasticJob operator, which plays the operator's own command) and
    scripts/bench build no torchrun options of their own."""
    options = re.compile(r"--(rdzv-backend|rdzv-conf|nnodes|max-restarts|monitor-interval)=")
    typed = [str(p.relative_to(REPO)) for folder in ("harness", "tests/support", "scripts/bench")
             for p in sorted((REPO / folder).glob("*.py"))
             if p.name != "fake_operator.py" and options.search(p.read_text())]
    assert typed == []


def test_no_etcd_or_azurite_command_line_is_typed_outside_the_product():
    """The flags only a command line of etcd or Azurite carries, as a string in harness/, tests/support or scripts."""
    options = re.compile(r"""["']--(enable-v2|initial-cluster|listen-client-urls|advertise-client-urls|"""
                         r"""listen-peer-urls|blobHost|blobPort|skipApiVersionCheck|disableTelemetry|oauth)\b""")
    typed = [str(p.relative_to(REPO)) for folder in ("harness", "tests/support", "scripts/bench", "scripts")
             for p in sorted((REPO / folder).glob("*.py")) if options.search(p.read_text())]
    assert typed == []


class _Spawned:
    """What the tests' ManagedProcess is, for a process that was never started."""

    pid = os.getpid()

    def __init__(self, name, argv, log_path, *, env=None, cwd=None):
        self.argv, self.env, self.log_path = [str(a) for a in argv], env, log_path
        _Spawned.last = self

    def stop(self):
        return 0


def _product_component(monkeypatch, tmp_path: Path, component: str) -> tuple[list[str], dict | None]:
    spawned = {}

    def spawn(self, name, which, argv, port, env=None):
        spawned.update(argv=argv, env=env)
        return local_cluster.Component(which, os.getpid(), 0.0, port, str(tmp_path / "log"))

    monkeypatch.setattr(local_cluster.LocalClusters, "_spawn", spawn)
    monkeypatch.setattr(local_cluster.LocalClusters, "_wait_ready", lambda *a: None)
    monkeypatch.setattr(local_cluster.LocalClusters, "_create_container", lambda *a: None)
    ports = iter([2379, 2380])
    monkeypatch.setattr(local_cluster, "free_port", lambda: next(ports))
    clusters = local_cluster.LocalClusters(tmp_path / "product")
    # pylint: disable-next=protected-access  # the one start of each component, without the process
    {"etcd": clusters._start_etcd, "azurite": clusters._start_azurite}[component]("test")
    return spawned["argv"], spawned["env"]


def _test_service(monkeypatch, tmp_path: Path, component: str) -> tuple[list[str], dict | None]:
    monkeypatch.setattr(services, "ManagedProcess", _Spawned)
    monkeypatch.setattr(services, "_wait_ready", lambda *a: None)
    monkeypatch.setattr(services, "free_ports", lambda count, host=None: [2379, 2380][:count])
    start = {"etcd": services.start_etcd, "azurite": services.start_azurite}[component]
    with start(tmp_path / "tests"):
        pass
    return _Spawned.last.argv, _Spawned.last.env


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` with the value after ``flag`` left out (where each puts its data)."""
    at = argv.index(flag)
    return argv[:at + 1] + argv[at + 2:]


def test_the_tests_etcd_runs_the_command_line_and_environment_of_the_local_clusters(monkeypatch, tmp_path):
    monkeypatch.setenv("ETCD_DEBUG", "true")  # the caller's etcd flags reach neither
    product, product_env = _product_component(monkeypatch, tmp_path, "etcd")
    ours, our_env = _test_service(monkeypatch, tmp_path, "etcd")
    assert _without(ours, "--data-dir") == _without(product, "--data-dir")
    assert "--enable-v2" in product and "ETCD_DEBUG" not in product_env and our_env == product_env


def test_the_tests_azurite_runs_the_command_line_of_the_local_clusters(monkeypatch, tmp_path):
    product, _ = _product_component(monkeypatch, tmp_path, "azurite")
    ours, _ = _test_service(monkeypatch, tmp_path, "azurite")
    assert _without(ours, "--location") == _without(product, "--location")
    assert "--disableTelemetry" in product


def _in_process_launch(tmp_path: Path, recovery: str = launch.RECOVERY_IN_PROCESS,
                       **changes) -> local_agent.AgentLaunch:
    spec = JobSpec(name="job", script=str(elastic.TRAIN_SCRIPT), min_nodes=1, max_nodes=3, nproc_per_node=2,
                   script_args=("--steps", "10"), recovery=recovery)
    fields = dict(node="job-node-1", spec=spec, script=str(elastic.TRAIN_SCRIPT),
                  checkpoint_url="http://127.0.0.1:1/x/job", connection_string="UseDevelopment",
                  etcd_endpoint="127.0.0.1:2379", rdzv_id="job-1234", job_dir=tmp_path,
                  coordinator="http://127.0.0.1:40001")
    fields.update(changes)
    return local_agent.AgentLaunch(**fields)


def test_an_in_process_node_is_a_standalone_torchrun_world_that_knows_its_coordinator(tmp_path):
    agent = _in_process_launch(tmp_path)
    argv = agent.argv()
    options = argv[argv.index("--standalone"):argv.index(launch.SCRIPT_SEPARATOR)]
    assert options[:4] == ["--standalone", "--nnodes=1", "--nproc-per-node=2", f"--max-restarts={launch.MAX_RESTARTS}"]
    assert not [a for a in argv if a.startswith(("--rdzv", "--nnodes=1:"))]  # no etcd rendezvous at all
    assert argv[-3:] == [str(elastic.TRAIN_SCRIPT), "--steps", "10"]
    env = agent.env({"ELASTICTRAIN_RECOVERY": "restart", "PATH": "/bin"})
    assert env[launch.ENV_RECOVERY] == "in-process" and env[launch.ENV_COORDINATOR] == "http://127.0.0.1:40001"
    assert env[launch.ENV_REPLICA_ID] == "job-node-1" and env[launch.ENV_NODE_NAME] == "job-node-1"
    assert env[launch.ENV_REPLICA_HOST] == "127.0.0.1" and "--local-addr=127.0.0.1" in argv
    # everything a node gets in the restart mode, it gets here too
    restart = _in_process_launch(tmp_path, recovery=launch.RECOVERY_RESTART, coordinator=None).env({})
    assert set(restart) - {launch.ENV_RECOVERY} <= set(env)
    assert restart[launch.ENV_RECOVERY] == "restart" and launch.ENV_COORDINATOR not in restart
    # the cross-node timeout of the in-process mode only: a restart job's collectives keep the collective timeout
    assert env[launch.ENV_REPLICA_TIMEOUT] == f"{launch.LOCAL.replica_timeout_seconds:g}"
    assert launch.ENV_REPLICA_TIMEOUT not in restart


def test_an_in_process_node_without_a_coordinator_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="coordinator"):
        _in_process_launch(tmp_path, coordinator=None)


def test_a_node_that_joins_later_is_launched_as_the_jobs_record_says(monkeypatch, tmp_path):
    """An eviction's replacement is started from the job's record (backends/local/record.py: every option of
    the spec is in it), so it recovers as the job does; its coordinator's address is the record's too."""
    from azext_elastictrain.backends.local import record

    recorded = record.new_record(JobSpec(name="job", script=str(elastic.TRAIN_SCRIPT), min_nodes=1, max_nodes=2,
                                         recovery="in-process"),
                                 cluster="local", script=str(elastic.TRAIN_SCRIPT), rdzv_id="job-1234")
    recorded["coordinator"] = {"address": "http://127.0.0.1:40002"}
    (tmp_path / "job" / "nodes").mkdir(parents=True)
    monkeypatch.setattr(local_starting.subprocess, "Popen", _Started)
    conn = {"blob_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "connection_string": "UseDevelopment",
            "etcd": "127.0.0.1:2379", "scheduled_events": "http://127.0.0.1:9/metadata/scheduledevents"}
    local_starting.start_node(record.spec_of(recorded), str(elastic.TRAIN_SCRIPT), "job-node-2", conn,
                              job_dir=tmp_path / "job", rdzv_id="job-1234", recorded=recorded)
    started = _Started.last
    assert "--standalone" in started.argv and started.env[launch.ENV_COORDINATOR] == "http://127.0.0.1:40002"
    assert started.env[launch.ENV_REPLICA_ID] == "job-node-2"


def test_the_local_coordinator_listens_on_loopback_with_the_jobs_min_nodes(tmp_path):
    coordinator = local_agent.CoordinatorLaunch(tmp_path, min_nodes=2)
    argv = coordinator.argv()
    assert argv[1:3] == ["-m", launch.COORDINATOR_MODULE]
    assert "--bind=127.0.0.1:0" in argv and "--min-replicas=2" in argv
    assert f"--address-file={tmp_path / 'coordinator.address'}" in argv
    env = coordinator.env({"ELASTICTRAIN_KEEP": "9"})
    assert env[local_agent.COORDINATOR_MARKER_ENV] == str(tmp_path) and local_agent.JOB_MARKER_ENV not in env
    assert "ELASTICTRAIN_KEEP" not in env
