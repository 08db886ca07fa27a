"""Real torchrun agents acting as nodes of one elastic job, for tests and benchmarks.

Each ``Node`` is a ``torchrun`` agent launched by the product's own builder
(backends/local/agent.py, what ``job run --local`` uses) running
``scripts/train_cifar10.py``. Losing a node
means killing the agent AND every descendant: workers start sessions of their
own, so a process-group kill would leave them training.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import psutil

# The rendezvous settings local jobs run with: one place decides them.
from azext_elastictrain.backends.local.agent import AgentLaunch, write_job_secret
from azext_elastictrain.backends.local.evict import kill_processes, vanish_processes
from azext_elastictrain.backends.local.starting import start_coordinator
from azext_elastictrain.backends.local.state import node_processes
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import DEFAULT_MEMORY_TIER, MEMORY_TIER_OFF, JobSpec

TUNED_RDZV_CONF = launch.LOCAL.rdzv_conf

REPO_ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = REPO_ROOT / "scripts" / "train_cifar10.py"


@dataclass
class JobConfig:
    name: str
    checkpoint_url: str
    connection_string: str
    etcd_endpoint: str
    min_nodes: int = 1
    max_nodes: int = 2
    nproc_per_node: int = 1
    script_args: Sequence[str] = ()
    scheduled_events_url: str = "off"
    rdzv_conf: str = TUNED_RDZV_CONF
    extra_env: dict = field(default_factory=dict)
    warm_start: bool = True  # workers fork from the node's warm server (runtime/warm.py); False: plain torchrun
    memory_tier: bool = True  # False: interrupted workers keep no step in the node's memory (blob only)
    progress_seconds: float = 1  # how often rank 0 reports progress (the product's default: PROGRESS_SECONDS)
    script: Path = TRAIN_SCRIPT
    recovery: str = launch.RECOVERY_RESTART  # in-process: each node asks ``coordinator`` (a Coordinator's address)
    coordinator: str | None = None


class Node:
    """A node started as `job run --local` starts one (backends/local/agent.py's AgentLaunch), with the test's
    or benchmark's own settings on top (``JobConfig.rdzv_conf``, ``extra_env``)."""

    def __init__(self, job: JobConfig, name: str, log_dir: Path):
        self.job = job
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        (log_dir / "nodes").mkdir(parents=True, exist_ok=True)
        if job.recovery == launch.RECOVERY_IN_PROCESS:
            write_job_secret(log_dir)  # the job's nodes share it, as a local job's do
        spec = JobSpec(name=job.name, script=str(job.script), min_nodes=job.min_nodes, max_nodes=job.max_nodes,
                       nproc_per_node=job.nproc_per_node, script_args=tuple(job.script_args),
                       memory_tier=DEFAULT_MEMORY_TIER if job.memory_tier else MEMORY_TIER_OFF,
                       warm_start=job.warm_start, recovery=job.recovery)
        agent = AgentLaunch(
            node=name, spec=spec, script=str(job.script),
            checkpoint_url=job.checkpoint_url, connection_string=job.connection_string,
            etcd_endpoint=job.etcd_endpoint, rdzv_id=job.name, job_dir=log_dir,
            scheduled_events_url=job.scheduled_events_url, profile=replace(launch.LOCAL, rdzv_conf=job.rdzv_conf),
            progress_seconds=job.progress_seconds, coordinator=job.coordinator,
            # the session's memory-tier folder (tests/conftest.py), which the product's launch does not pass on
            extra_env={**{k: os.environ[k] for k in (launch.ENV_MEMORY_DIR,) if k in os.environ},
                       **job.extra_env})
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(agent.argv(), stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=agent.env(os.environ), start_new_session=True)

    def tree(self) -> list[psutil.Process]:
        """Every process of the node, as the local backend finds them (backends/local/state.py)."""
        return node_processes(self.proc.pid, {launch.ENV_NODE_NAME: self.name,
                                              launch.ENV_CHECKPOINT_URL: self.job.checkpoint_url})

    def signal_agent(self, sig: int) -> None:
        """What the kubelet does on eviction: signal the agent, which signals its workers."""
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """The node is gone: SIGKILL the agent and every descendant at once."""
        procs = self.tree()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.proc.wait(timeout=10)
        self._log.close()

    def vanish(self, seconds: float, until: Callable[[float], bool] | None = None) -> float:
        """The VM vanishes as a Spot VM evicted without notice does: every process of the node frozen at once
        (SIGSTOP: its sockets stay open, no FIN reaches a peer), then killed once ``until(frozen_at)`` or
        ``seconds`` later (backends/local/evict.py's vanish_processes). Returns when it froze them."""
        return vanish_processes(self.tree(), seconds, until=until)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.alive() or self.tree():
            self.kill()
        self._log.close()


class Coordinator:
    """The coordinator of an in-process job, started as ``job run --local`` starts it
    (backends/local/starting.py's start_coordinator: runtime/coordinator.py, the product's settings)."""

    def __init__(self, job_dir: Path, min_nodes: int, job: str,
                 heartbeat_timeout_ms: int = launch.LOCAL.coordinator_heartbeat_timeout_ms):
        job_dir.mkdir(parents=True, exist_ok=True)
        self.record = start_coordinator(job_dir, min_nodes=min_nodes, job=job,
                                        heartbeat_timeout_ms=heartbeat_timeout_ms)
        self.address: str = self.record["address"]

    def stop(self) -> None:
        """SIGTERM (it exits 0 on it), then SIGKILL whatever is left."""
        try:
            proc = psutil.Process(self.record["pid"])
            proc.terminate()
            proc.wait(timeout=10)
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            kill_processes([proc])


def read_events(store, job_prefix: str) -> list[dict]:
    from azext_elastictrain.runtime.progress import read_events as _read

    return _read(store, job_prefix)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.25,
             on_timeout: Callable[[], str] = lambda: "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{on_timeout()}")


def events_of(events: list[dict], kind: str, **match) -> list[dict]:
    return [e for e in events if e.get("event") == kind and all(e.get(k) == v for k, v in match.items())]


def dump(events: list[dict]) -> str:
    return "\n".join(json.dumps(e) for e in events[-40:])


__all__ = ["JobConfig", "Node", "Coordinator", "read_events", "wait_for", "events_of", "dump", "signal"]
