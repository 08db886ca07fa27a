"""The local cluster: real etcd, Azurite and a Scheduled Events endpoint on this machine.

Each component is a background process on a free loopback port that outlives
the ``az`` command which started it. What was started is recorded in
``<state root>/<cluster>/cluster.json`` (pid, process start time, port, log),
so ``show`` can check health and ``delete`` can stop exactly those processes
and no other that happens to reuse a pid. Where its jobs live: home.py; what
is done to them: starting.py, following.py, stopping.py; evictions: evict.py.

``create`` is idempotent: healthy components are left alone, dead ones are
started again; if anything fails to come up, what this call started is
stopped and a cluster it created is removed again (nothing half-created).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from azext_elastictrain.backends.local.components import azurite_argv, azurite_binary, etcd_argv, etcd_binary, etcd_env
from azext_elastictrain.backends.views import LocalCluster, LocalClusterDeleted, LocalComponent, StoppedComponent
from azext_elastictrain.backends.local.state import (
    AZURITE_ACCOUNT,
    REPO_ROOT,
    STOP_TIMEOUT,
    ClusterError,
    Component,
    alive,
    connection_string,
    free_port,
    http_ok,
    read_state,
    write_state,
)
from azext_elastictrain.core.constants import CHECKPOINT_CONTAINER
from azext_elastictrain.core.errors import ClusterNotFound
from azext_elastictrain.core.spec import LocalClusterSpec
from azext_elastictrain.core.eventlog.view import iso_time

COMPONENTS = ("etcd", "azurite", "scheduled-events")
START_TIMEOUT = 30.0


class ClusterJobs(Protocol):
    """What deleting a cluster needs of its jobs (``stopping.JobStopper``, bound to it): their live nodes, and
    stopping them."""

    def running_nodes(self) -> list[StoppedComponent]:
        ...  # [{"component": "job JOB NODE", "pid"}]

    def stop_all(self) -> None:
        ...


class LocalClusters:
    """Local clusters under ``state_root`` (the az config dir's ``elastictrain/local``): their processes and
    state; where the jobs of one live is its ``home.ClusterHome``, which is given these."""

    def __init__(self, state_root: Path):
        self.state_root = Path(state_root)

    # -- state ----------------------------------------------------------------
    def cluster_dir(self, name: str) -> Path:
        return self.state_root / name

    def load(self, name: str) -> dict[str, Any] | None:
        return read_state(self.cluster_dir(name) / "cluster.json", f"local cluster {name!r}")

    def _save(self, name: str, state: dict[str, Any]) -> None:
        write_state(self.cluster_dir(name) / "cluster.json", state)

    # -- processes ------------------------------------------------------------
    def _spawn(self, name: str, component: str, argv: list[str], port: int,
               env: dict[str, Any] | None = None) -> Component:
        import psutil

        log_path = self.cluster_dir(name) / "logs" / f"{component}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(  # pylint: disable=consider-using-with  # a daemon: outlives this command
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=str(self.cluster_dir(name)), env=env, start_new_session=True, close_fds=True,
            )
        return Component(component, proc.pid, psutil.Process(proc.pid).create_time(), port, str(log_path))

    _alive = staticmethod(alive)

    def _stop(self, component: dict[str, Any] | Component) -> None:
        """Stop a recorded process group — only if it is still the process we started."""
        c = component if isinstance(component, dict) else component.to_json()
        if not self._alive(c):
            return
        # Azurite (node) shuts down on SIGINT in ~1.5 s but ignores SIGTERM for 20 s and more.
        first = signal.SIGINT if c["name"] == "azurite" else signal.SIGTERM
        for sig, wait in ((first, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
            try:
                os.killpg(c["pid"], sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not self._alive(c):
                    return
                time.sleep(0.05)
        raise ClusterError(f"{c['name']} (pid {c['pid']}) did not stop")

    def _wait_ready(self, name: str, component: Component, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if probe():
                return
            if not self._alive(component):
                break
            time.sleep(0.1)
        log = Path(component.log)
        tail = log.read_text(encoding="utf-8", errors="replace")[-1500:] if log.exists() else ""
        raise ClusterError(f"{component.name} of local cluster {name!r} did not come up; its log ends:\n{tail}")

    # -- components -----------------------------------------------------------------
    def _start_etcd(self, name: str) -> Component:
        port, peer = free_port(), free_port()
        client_url = f"http://127.0.0.1:{port}"
        argv = etcd_argv(etcd_binary(), name=name, data_dir=self.cluster_dir(name) / "etcd", client_port=port,
                         peer_port=peer)
        env = etcd_env(os.environ)
        component = self._spawn(name, "etcd", argv, port, env)
        # 200 on the v2 keys API proves torchrun's etcd-v2 rendezvous can use it.
        self._wait_ready(name, component, lambda: http_ok(f"{client_url}/v2/keys/"))
        return component

    def _start_azurite(self, name: str) -> Component:
        port = free_port()
        data = self.cluster_dir(name) / "azurite"
        data.mkdir(parents=True, exist_ok=True)
        argv = azurite_argv(azurite_binary(), port=port, location=data)
        component = self._spawn(name, "azurite", argv, port)
        self._wait_ready(name, component, lambda: http_ok(f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}?comp=list"))
        self._create_container(port)
        return component

    def _create_container(self, port: int) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(connection_string(port)) as service:
            try:
                service.create_container(CHECKPOINT_CONTAINER)
            except ResourceExistsError:
                pass

    def _start_scheduled_events(self, name: str) -> Component:
        port_file = self.cluster_dir(name) / "scheduled-events.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "azext_elastictrain.backends.local.scheduled_events", "--host", "127.0.0.1",
                "--port", "0", "--port-file", str(port_file)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
        component = self._spawn(name, "scheduled-events", argv, 0, env)
        self._wait_ready(name, component, lambda: port_file.exists() and port_file.read_text().strip().isdigit())
        port = int(port_file.read_text().strip())
        component = Component(component.name, component.pid, component.started, port, component.log)
        self._wait_ready(name, component, lambda: http_ok(f"http://127.0.0.1:{port}/admin/health"))
        return component

    # -- the backend interface: clusters ----------------------------------------------
    def create_cluster(self, spec: LocalClusterSpec) -> LocalCluster:
        existing = self.load(spec.name)
        fresh = existing is None
        state = existing or {"name": spec.name, "created": time.time(), "components": {}}
        self.cluster_dir(spec.name).mkdir(parents=True, exist_ok=True)
        started: list[Component] = []
        starters = {"etcd": self._start_etcd, "azurite": self._start_azurite,
                    "scheduled-events": self._start_scheduled_events}
        try:
            for key in COMPONENTS:
                recorded = state["components"].get(key)
                if recorded and self._healthy(key, recorded):
                    continue
                if recorded:
                    self._stop(recorded)
                component = starters[key](spec.name)
                started.append(component)
                state["components"][key] = component.to_json()
        except BaseException:
            for component in started:
                self._stop(component)
            if fresh:
                shutil.rmtree(self.cluster_dir(spec.name), ignore_errors=True)
            raise
        self._save(spec.name, state)
        return self.show_cluster(spec.name)

    def _healthy(self, key: str, component: dict[str, Any]) -> bool:
        if not self._alive(component):
            return False
        port = component["port"]
        probe = {
            "etcd": f"http://127.0.0.1:{port}/v2/keys/",
            "azurite": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}?comp=list",
            "scheduled-events": f"http://127.0.0.1:{port}/admin/health",
        }[key]
        return http_ok(probe)

    def show_cluster(self, name: str) -> LocalCluster:
        state = self.load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        components: dict[str, LocalComponent] = {}
        for key in COMPONENTS:
            c = state["components"].get(key)
            healthy = bool(c) and self._healthy(key, c)
            components[key] = {
                "state": "running" if healthy else ("unhealthy" if c and self._alive(c) else "stopped"),
                "pid": c["pid"] if c else None,
                "endpoint": self._endpoint(key, c["port"]) if c else None,
                "log": c["log"] if c else None,
            }
        health = "Healthy" if all(v["state"] == "running" for v in components.values()) else "Degraded"
        return {
            "name": name,
            "type": "local",
            "health": health,
            "created": iso_time(state["created"]),
            "checkpointContainer": (
                self._endpoint("azurite", state["components"]["azurite"]["port"]) + "/" + CHECKPOINT_CONTAINER
                if state["components"].get("azurite") else None),
            "components": components,
            "stateDir": str(self.cluster_dir(name)),
        }

    @staticmethod
    def _endpoint(key: str, port: int) -> str:
        return {
            "etcd": f"127.0.0.1:{port}",
            "azurite": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
            "scheduled-events": f"http://127.0.0.1:{port}/metadata/scheduledevents?api-version=2020-07-01",
        }[key]

    def list_clusters(self) -> list[LocalCluster]:
        if not self.state_root.is_dir():
            return []
        return [self.show_cluster(p.name) for p in sorted(self.state_root.iterdir()) if (p / "cluster.json").exists()]

    def delete_cluster(self, name: str, jobs: ClusterJobs, dry_run: bool = False) -> LocalClusterDeleted:
        state = self.load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        stopping: list[StoppedComponent] = jobs.running_nodes() + [
            {"component": key, "pid": c["pid"]}
            for key, c in state["components"].items() if self._alive(c)
        ]
        result: LocalClusterDeleted = {"name": name, "dryRun": dry_run, "stopped": stopping,
                                       "removed": str(self.cluster_dir(name))}
        if dry_run:
            return result
        jobs.stop_all()  # first the jobs: their agents would retry a vanished etcd for minutes
        for c in state["components"].values():
            self._stop(c)
        shutil.rmtree(self.cluster_dir(name), ignore_errors=True)
        return result

    def connection(self, name: str) -> dict[str, Any]:
        """What jobs of this cluster are given: endpoints and (Azurite's public) credentials."""
        state = self.load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        components = state["components"]
        return {
            "etcd": self._endpoint("etcd", components["etcd"]["port"]),
            "blob_endpoint": self._endpoint("azurite", components["azurite"]["port"]),
            "connection_string": connection_string(components["azurite"]["port"]),
            "scheduled_events": self._endpoint("scheduled-events", components["scheduled-events"]["port"]),
        }
