"""The local cluster: real etcd, Azurite and a Scheduled Events endpoint on this machine.

Each component is a background process on a free loopback port that outlives
the ``az`` command which started it. What was started is recorded in
``<state root>/<cluster>/cluster.json`` (pid, process start time, port, log),
so ``show`` can check health and ``delete`` can stop exactly those processes
and no other that happens to reuse a pid.

``create`` is idempotent: healthy components are left alone, dead ones are
started again; if anything fails to come up, what this call started is
stopped and a cluster it created is removed again (nothing half-created).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from azext_elastictrain.core.spec import LocalClusterSpec

AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's documented, public development account: not a secret, still never printed.
_AZURITE_AUTH = "AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CHECKPOINT_CONTAINER = "checkpoints"
COMPONENTS = ("etcd", "azurite", "scheduled-events")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_REPO_ROOT = Path(__file__).resolve().parents[3]


class ClusterError(RuntimeError):
    """The local cluster could not be created or reached; the message says why."""


class ClusterNotFound(LookupError):
    """No local cluster of that name."""


class ToolMissing(ClusterError):
    """A program the local cluster runs is not installed."""


@dataclass(frozen=True)
class Component:
    """A recorded background process."""

    name: str
    pid: int
    started: float  # psutil create_time: tells our process from one that reused its pid
    port: int
    log: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "started": self.started, "port": self.port, "log": self.log}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether something answers HTTP at ``url`` (any status; 5xx excepted)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status < 500
    except urllib.error.HTTPError as ex:
        return ex.code < 500
    except (urllib.error.URLError, OSError):
        return False


def _which(env_var: str, candidates: list[Path], name: str, install: str) -> str:
    explicit = os.environ.get(env_var)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ToolMissing(f"{env_var}={explicit} is not an executable file")
        return explicit
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise ToolMissing(f"{name} is not installed: {install} (or set {env_var})")


class LocalBackend:
    """Local clusters under ``state_root`` (the az config dir's ``elastictrain/local``)."""

    def __init__(self, state_root: Path):
        self.state_root = Path(state_root)

    # -- state ----------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        return self.state_root / name

    def _load(self, name: str) -> dict | None:
        path = self._dir(name) / "cluster.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as ex:
            raise ClusterError(f"the state of local cluster {name!r} is unreadable ({path}): {ex}") from ex

    def _save(self, name: str, state: dict) -> None:
        path = self._dir(name) / "cluster.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path)

    # -- processes ------------------------------------------------------------
    def _spawn(self, name: str, component: str, argv: list[str], port: int,
               env: dict | None = None) -> Component:
        import psutil

        log_path = self._dir(name) / "logs" / f"{component}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=str(self._dir(name)), env=env, start_new_session=True, close_fds=True,
            )
        return Component(component, proc.pid, psutil.Process(proc.pid).create_time(), port, str(log_path))

    @staticmethod
    def _alive(component: dict | Component) -> bool:
        import psutil

        c = component if isinstance(component, dict) else component.to_json()
        try:
            proc = psutil.Process(c["pid"])
            return abs(proc.create_time() - c["started"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _stop(self, component: dict | Component) -> None:
        """Stop a recorded process group — only if it is still the process we started."""
        c = component if isinstance(component, dict) else component.to_json()
        if not self._alive(c):
            return
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
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
        tail = Path(component.log).read_text(errors="replace")[-1500:] if Path(component.log).exists() else ""
        raise ClusterError(f"{component.name} of local cluster {name!r} did not come up; its log ends:\n{tail}")

    # -- components -----------------------------------------------------------------
    def _start_etcd(self, name: str) -> Component:
        etcd = _which("ETCD_BIN", [], "etcd", "apt-get install etcd-server (etcd 3.4/3.5: 3.6 has no v2 API)")
        port, peer = _free_port(), _free_port()
        client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        argv = [etcd, "--name", name, "--data-dir", str(self._dir(name) / "etcd"), "--enable-v2",
                "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"{name}={peer_url}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        component = self._spawn(name, "etcd", argv, port, env)
        # 200 on the v2 keys API proves torchrun's etcd-v2 rendezvous can use it.
        self._wait_ready(name, component, lambda: _http_ok(f"{client_url}/v2/keys/"))
        return component

    def _start_azurite(self, name: str) -> Component:
        azurite = _which("AZURITE_BIN", [_REPO_ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"],
                         "azurite-blob", "npm install -g azurite@3.37.0")
        port = _free_port()
        data = self._dir(name) / "azurite"
        data.mkdir(parents=True, exist_ok=True)
        argv = [azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data),
                "--skipApiVersionCheck", "--loose", "--silent"]
        component = self._spawn(name, "azurite", argv, port)
        self._wait_ready(name, component, lambda: _http_ok(f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}?comp=list"))
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
        port_file = self._dir(name) / "scheduled-events.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "azext_elastictrain.core.scheduled_events", "--host", "127.0.0.1",
                "--port", "0", "--port-file", str(port_file)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")])))
        component = self._spawn(name, "scheduled-events", argv, 0, env)
        self._wait_ready(name, component, lambda: port_file.exists() and port_file.read_text().strip().isdigit())
        port = int(port_file.read_text().strip())
        component = Component(component.name, component.pid, component.started, port, component.log)
        self._wait_ready(name, component, lambda: _http_ok(f"http://127.0.0.1:{port}/admin/health"))
        return component

    # -- the backend interface: clusters ----------------------------------------------
    def create_cluster(self, spec: LocalClusterSpec) -> dict:
        spec.validate()
        existing = self._load(spec.name)
        fresh = existing is None
        state = existing or {"name": spec.name, "created": time.time(), "components": {}}
        self._dir(spec.name).mkdir(parents=True, exist_ok=True)
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
                shutil.rmtree(self._dir(spec.name), ignore_errors=True)
            raise
        self._save(spec.name, state)
        return self.show_cluster(spec.name)

    def _healthy(self, key: str, component: dict) -> bool:
        if not self._alive(component):
            return False
        port = component["port"]
        probe = {
            "etcd": f"http://127.0.0.1:{port}/v2/keys/",
            "azurite": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}?comp=list",
            "scheduled-events": f"http://127.0.0.1:{port}/admin/health",
        }[key]
        return _http_ok(probe)

    def show_cluster(self, name: str) -> dict:
        state = self._load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        components = {}
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
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state["created"])),
            "checkpointContainer": self._endpoint("azurite", state["components"]["azurite"]["port"]) + "/" + CHECKPOINT_CONTAINER
            if state["components"].get("azurite") else None,
            "components": components,
            "stateDir": str(self._dir(name)),
        }

    @staticmethod
    def _endpoint(key: str, port: int) -> str:
        return {
            "etcd": f"127.0.0.1:{port}",
            "azurite": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
            "scheduled-events": f"http://127.0.0.1:{port}/metadata/scheduledevents?api-version=2020-07-01",
        }[key]

    def list_clusters(self) -> list[dict]:
        if not self.state_root.is_dir():
            return []
        return [self.show_cluster(p.name) for p in sorted(self.state_root.iterdir()) if (p / "cluster.json").exists()]

    def delete_cluster(self, name: str, dry_run: bool = False) -> dict:
        state = self._load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        stopping = [
            {"component": key, "pid": c["pid"]}
            for key, c in state["components"].items() if self._alive(c)
        ]
        result = {"name": name, "dryRun": dry_run, "stopped": stopping, "removed": str(self._dir(name))}
        if dry_run:
            return result
        for c in state["components"].values():
            self._stop(c)
        shutil.rmtree(self._dir(name), ignore_errors=True)
        return result

    def connection(self, name: str) -> dict:
        """What jobs of this cluster are given: endpoints and (Azurite's public) credentials."""
        state = self._load(name)
        if state is None:
            raise ClusterNotFound(f"no local cluster named {name!r}")
        components = state["components"]
        return {
            "etcd": self._endpoint("etcd", components["etcd"]["port"]),
            "blob_endpoint": self._endpoint("azurite", components["azurite"]["port"]),
            "connection_string": connection_string(components["azurite"]["port"]),
            "scheduled_events": self._endpoint("scheduled-events", components["scheduled-events"]["port"]),
        }


def connection_string(port: int) -> str:
    return f"DefaultEndpointsProtocol=http;{_AZURITE_AUTH};BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
