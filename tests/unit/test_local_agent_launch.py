"""The benchmarks and the torchrun tests start nodes exactly as `job run --local` does: one launch builder
(backends/local/agent.py), never a torchrun command line typed again in tests/support or scripts/bench."""
from __future__ import annotations

import os
import re
from pathlib import Path

from azext_elastictrain.backends.local import agent as local_agent
from azext_elastictrain.backends.local import jobs as local_jobs
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import JobSpec
from tests.support import elastic

REPO = Path(__file__).resolve().parents[2]


class _Started:
    """What subprocess.Popen returns, for a process that is this one (psutil can read its start time)."""

    pid = os.getpid()

    def __init__(self, argv, **kwargs):
        self.argv, self.env = argv, kwargs["env"]
        _Started.last = self


def _product_launch(monkeypatch, tmp_path: Path) -> _Started:
    monkeypatch.setattr(local_jobs.subprocess, "Popen", _Started)
    spec = JobSpec(name="job", script=str(elastic.TRAIN_SCRIPT), min_nodes=1, max_nodes=2,
                   script_args=("--steps", "10"))
    (tmp_path / "job" / "nodes").mkdir(parents=True)
    conn = {"blob_endpoint": "http://127.0.0.1:10000/devstoreaccount1", "connection_string": "UseDevelopment",
            "etcd": "127.0.0.1:2379", "scheduled_events": "http://127.0.0.1:9/metadata/scheduledevents"}
    jobs = local_jobs.LocalJobs(local_jobs.LocalClusters(tmp_path))
    jobs.start_node(spec, str(elastic.TRAIN_SCRIPT), "job-node-0", conn, job_dir=tmp_path / "job", rdzv_id="job-1234")
    return _Started.last


def _bench_launch(monkeypatch, tmp_path: Path) -> _Started:
    monkeypatch.setattr(elastic.subprocess, "Popen", _Started)
    config = elastic.JobConfig(name="job-1234", checkpoint_url="http://127.0.0.1:10000/devstoreaccount1/ckpt/job",
                               connection_string="UseDevelopment", etcd_endpoint="127.0.0.1:2379",
                               script_args=("--steps", "10"),
                               scheduled_events_url="http://127.0.0.1:9/metadata/scheduledevents")
    node = elastic.Node(config, "job-node-0", tmp_path / "bench")
    node._log.close()  # pylint: disable=protected-access  # the fake started nothing
    return _Started.last


def test_a_benchmark_node_runs_the_command_line_job_run_local_runs(monkeypatch, tmp_path):
    product, bench = _product_launch(monkeypatch, tmp_path), _bench_launch(monkeypatch, tmp_path)
    assert bench.argv == product.argv
    assert f"--rdzv-conf={launch.LOCAL_RDZV_CONF}" in product.argv and "--max-restarts=100" in product.argv
    # the same runtime settings, but for where its files go and the test's own progress interval
    differ = {launch.ENV_PREEMPTION_STATE, launch.ENV_NODE_LEAVING_FILE, launch.ENV_PROGRESS_SECONDS,
              local_agent.JOB_MARKER_ENV, launch.ENV_CHECKPOINT_URL, launch.ENV_MEMORY_DIR}
    ours = {k: v for k, v in product.env.items() if k.startswith(launch.ENV_PREFIX) and k not in differ}
    theirs = {k: v for k, v in bench.env.items() if k.startswith(launch.ENV_PREFIX) and k not in differ}
    assert ours == theirs and ours[launch.ENV_KEEP] == "3"
    assert bench.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == product.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_the_callers_elastictrain_settings_do_not_leak_into_a_node(monkeypatch, tmp_path):
    monkeypatch.setenv("ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS", "1")
    product = _product_launch(monkeypatch, tmp_path)
    assert launch.ENV_CHECKPOINT_INTERVAL_STEPS not in product.env


def test_no_torchrun_command_line_is_typed_outside_the_product():
    """tests/support (but the fake ElasticJob operator, which plays the operator's own command) and
    scripts/bench build no torchrun options of their own."""
    options = re.compile(r"--(rdzv-backend|rdzv-conf|nnodes|max-restarts|monitor-interval)=")
    typed = [str(p.relative_to(REPO)) for folder in ("tests/support", "scripts/bench")
             for p in sorted((REPO / folder).glob("*.py"))
             if p.name != "fake_operator.py" and options.search(p.read_text())]
    assert typed == []
