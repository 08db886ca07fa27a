"""One local node's torchrun agent: its command line and environment, built in one place.

``job run --local`` starts each node from ``AgentLaunch`` (backends/local/starting.py), and so do the benchmarks
(``scripts/bench``, through harness/elastic.py's thin wrapper), so a benchmark's figures are the
product's. Pure: it builds, the caller starts the process.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from azext_elastictrain.backends.local.state import REPO_ROOT
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import JobSpec, job_env

# Every process of a local job carries this in its environment (inherited by the
# workers), so orphans of a killed agent can still be found and stopped.
JOB_MARKER_ENV = "ELASTICTRAIN_LOCAL_JOB"
# The coordinator of an in-process job carries this instead: it is found as surely, and stopped only once the
# nodes are (they may still ask it for a quorum while they stop).
COORDINATOR_MARKER_ENV = "ELASTICTRAIN_LOCAL_COORDINATOR"


@dataclass(frozen=True)
class AgentLaunch:  # pylint: disable=too-many-instance-attributes  # one field per launch setting
    """What one node of a local job runs: ``argv()`` and ``env(inherited)``, from the job's spec and the local
    backend's launch profile (core/launch.py): the spec's options reach the node through ``spec.job_env``
    alone, as they reach an AKS pod; the fields here are the node's own."""

    node: str
    spec: JobSpec
    script: str  # the spec's script, as this machine finds it
    checkpoint_url: str
    connection_string: str
    etcd_endpoint: str
    rdzv_id: str
    job_dir: Path  # the node's state files (acknowledged events, the leaving marker) go in its nodes/ folder
    scheduled_events_url: str = "off"
    profile: launch.LaunchProfile = launch.LOCAL  # a benchmark may compare another rendezvous setting
    coordinator: str | None = None  # in-process: the job's coordinator, http://127.0.0.1:PORT
    progress_seconds: float | None = None  # a test's or benchmark's: the profile's figure otherwise
    extra_env: Mapping[str, str] = field(default_factory=dict)  # last: a benchmark's own settings

    def __post_init__(self) -> None:
        if self.spec.mode.coordinator and not self.coordinator:
            raise ValueError("a node of an in-process job needs its coordinator's address")

    @property
    def leaving_file(self) -> Path:
        """Made before the node's processes are stopped: its runtime saves to blob, not only to the node's
        memory, which does not outlive a stopped node (launch.ENV_NODE_LEAVING_FILE)."""
        return self.job_dir / "nodes" / f"{self.node}.leaving"

    def argv(self) -> list[str]:
        spec = self.spec
        world = spec.mode.node_world(nproc_per_node=spec.nproc_per_node, rendezvous=[
            *launch.torchrun_options(rdzv_conf=self.profile.rdzv_conf, nproc_per_node=spec.nproc_per_node,
                                     rdzv_id=self.rdzv_id),
            f"--nnodes={spec.min_nodes}:{spec.max_nodes}", f"--rdzv-endpoint={self.etcd_endpoint}"])
        return [
            sys.executable, *launch.agent_module(warm=spec.warm_start),
            *world,
            "--local-addr=127.0.0.1",
            "--monitor-interval=0.5",
            *launch.worker_entry(self.script, spec.script_args, warm=spec.warm_start),
        ]

    def env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The node's environment: ``inherited`` (the caller's) without its ELASTICTRAIN_* settings, then the
        job's (``spec.job_env``), then the node's own, then ``extra_env``."""
        nodes_dir = self.job_dir / "nodes"
        env = {k: v for k, v in inherited.items() if not k.startswith(launch.ENV_PREFIX)}
        profile = self.profile if self.progress_seconds is None else \
            replace(self.profile, progress_seconds=self.progress_seconds)
        env.update(job_env(self.spec, profile, coordinator=self.coordinator))
        env.update({
            JOB_MARKER_ENV: str(self.job_dir),
            launch.ENV_CHECKPOINT_URL: self.checkpoint_url,
            "AZURE_STORAGE_CONNECTION_STRING": self.connection_string,
            launch.ENV_SCHEDULED_EVENTS_URL: self.scheduled_events_url,
            launch.ENV_VM_NAME: self.node,
            launch.ENV_NODE_NAME: self.node,
            # A worker restarted on the same node must not act twice on an acknowledged event.
            launch.ENV_PREEMPTION_STATE: str(nodes_dir / f"{self.node}.acked.json"),
            launch.ENV_NODE_LEAVING_FILE: str(self.leaving_file),
            "GLOO_SOCKET_IFNAME": "lo",
            # The runtime (azext_elastictrain.runtime) importable from a script anywhere.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), inherited.get("PYTHONPATH")])),
        })
        if self.spec.mode.coordinator:  # its part of the quorums (an AKS pod: its name, IP and the job's Secret)
            env.update({launch.ENV_REPLICA_ID: self.node,
                        launch.ENV_REPLICA_HOST: "127.0.0.1",  # as --local-addr: every node is on loopback
                        launch.ENV_JOB_SECRET_FILE: str(job_secret_file(self.job_dir))})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(self.extra_env)
        return env


def job_secret_file(job_dir: Path) -> Path:
    """Where a local in-process job's secret is (launch.ENV_JOB_SECRET_FILE): its state server asks for it."""
    return job_dir / "state.secret"


def write_job_secret(job_dir: Path) -> Path:
    """Make the job's secret file once (mode 0600 from its creation: no moment another user could read it); a
    second call keeps the first secret, so nodes started later share it."""
    import secrets

    path = job_secret_file(job_dir)
    if path.exists():
        return path
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(secrets.token_urlsafe(32))
    try:
        os.link(temporary, path)  # atomic, and never replaces a secret another command made first
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
    return path


@dataclass(frozen=True)
class CoordinatorLaunch:
    """What the coordinator of a local in-process job runs (runtime/coordinator.py): on a free loopback port,
    writing its address to ``address_file`` once it listens."""

    job_dir: Path
    min_nodes: int = 1
    profile: launch.LaunchProfile = launch.LOCAL
    heartbeat_timeout_ms: int | None = None  # the benchmarks compare others: the profile's otherwise

    @property
    def address_file(self) -> Path:
        return self.job_dir / "coordinator.address"

    @property
    def log(self) -> Path:
        return self.job_dir / "coordinator.log"

    def argv(self) -> list[str]:
        profile = self.profile if self.heartbeat_timeout_ms is None else \
            replace(self.profile, coordinator_heartbeat_timeout_ms=self.heartbeat_timeout_ms)
        return [sys.executable, "-m", launch.COORDINATOR_MODULE,
                *launch.coordinator_args(profile, bind="127.0.0.1:0", min_nodes=self.min_nodes),
                f"--address-file={self.address_file}"]

    def env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in inherited.items() if not k.startswith(launch.ENV_PREFIX)}
        env.update({COORDINATOR_MARKER_ENV: str(self.job_dir), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), inherited.get("PYTHONPATH")]))})
        return env
