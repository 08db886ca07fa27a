"""The local cluster: real etcd, Azurite and a Scheduled Events endpoint on this machine,
and elastic jobs on it: real ``torchrun`` agents as the job's nodes.

Each component is a background process on a free loopback port that outlives
the ``az`` command which started it. What was started is recorded in
``<state root>/<cluster>/cluster.json`` (pid, process start time, port, log),
so ``show`` can check health and ``delete`` can stop exactly those processes
and no other that happens to reuse a pid.

A job is ``N`` detached ``torchrun`` agents (one per "node") recorded in
``<cluster>/jobs/<job>/job.json`` (pid and start time of each agent, its log
``nodes/<node>.log``); its progress is the event log the training runtime
appends to blob storage (core.events). Stopping a node stops the agent and
every descendant: torchrun's workers start sessions of their own, so a
process-group kill would leave them training.

``create`` is idempotent: healthy components are left alone, dead ones are
started again; if anything fails to come up, what this call started is
stopped and a cluster it created is removed again (nothing half-created).
"""
from __future__ import annotations

import fcntl
import importlib.util
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
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from azext_elastictrain.core import events as job_events
from azext_elastictrain.core.spec import JobSpec, LocalClusterSpec

AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's documented, public development account: not a secret, still never printed.
_AZURITE_AUTH = "AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CHECKPOINT_CONTAINER = "checkpoints"
COMPONENTS = ("etcd", "azurite", "scheduled-events")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# A job's workers get this long after SIGTERM (the runtime checkpoints on it) before SIGKILL.
JOB_STOP_TIMEOUT = 15.0
# Fast recovery without splitting the job: dead nodes are noticed after
# keep_alive_interval x keep_alive_max_attempt, and a round closes last_call
# seconds after min nodes joined (defaults: 5 x 3 s and 30 s). Same as tests/support/elastic.py.
TUNED_RDZV_CONF = "last_call_timeout=3,keep_alive_interval=2,keep_alive_max_attempt=3,join_timeout=300"
MAX_RESTARTS = 100
PROGRESS_SECONDS = 2
# Every process of a local job carries this in its environment (inherited by the
# workers), so orphans of a killed agent can still be found and stopped.
JOB_MARKER_ENV = "ELASTICTRAIN_LOCAL_JOB"
_REPO_ROOT = Path(__file__).resolve().parents[3]


class ClusterError(RuntimeError):
    """The local cluster could not be created or reached; the message says why."""


class ClusterNotFound(LookupError):
    """No local cluster of that name."""


class ToolMissing(ClusterError):
    """A program the local cluster runs is not installed."""


class JobNotFound(LookupError):
    """No job of that name on the cluster."""


class JobConflict(ClusterError):
    """A job of that name is already running."""


class ClusterUnhealthy(ClusterError):
    """The cluster exists but a component is down."""


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


def _read_state(path: Path, what: str) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as ex:
        raise ClusterError(f"the state of {what} is unreadable ({path}): {ex}") from ex


def _write_state(path: Path, state: dict) -> None:
    """Atomically: a reader sees the old state or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


class LocalBackend:
    """Local clusters under ``state_root`` (the az config dir's ``elastictrain/local``)."""

    def __init__(self, state_root: Path):
        self.state_root = Path(state_root)

    # -- state ----------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        return self.state_root / name

    def _load(self, name: str) -> dict | None:
        return _read_state(self._dir(name) / "cluster.json", f"local cluster {name!r}")

    def _save(self, name: str, state: dict) -> None:
        _write_state(self._dir(name) / "cluster.json", state)

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
        jobs = [job for job in (self._load_job(name, j) for j in self._job_names(name)) if job]
        stopping = [
            {"component": f"job {job['name']} {node['name']}", "pid": node["pid"]}
            for job in jobs for node in job["nodes"] if self._alive(node)
        ] + [
            {"component": key, "pid": c["pid"]}
            for key, c in state["components"].items() if self._alive(c)
        ]
        result = {"name": name, "dryRun": dry_run, "stopped": stopping, "removed": str(self._dir(name))}
        if dry_run:
            return result
        for job in jobs:  # first the jobs: their agents would retry a vanished etcd for minutes
            self._stop_job_processes(name, job)
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


    # -- the backend interface: jobs ------------------------------------------------
    def _jobs_dir(self, cluster: str) -> Path:
        return self._dir(cluster) / "jobs"

    def _job_dir(self, cluster: str, job: str) -> Path:
        return self._jobs_dir(cluster) / job

    def _job_names(self, cluster: str) -> list[str]:
        jobs = self._jobs_dir(cluster)
        if not jobs.is_dir():
            return []
        return sorted(p.name for p in jobs.iterdir() if (p / "job.json").is_file())

    def _load_job(self, cluster: str, job: str) -> dict | None:
        return _read_state(self._job_dir(cluster, job) / "job.json", f"job {job!r}")

    def _save_job(self, cluster: str, state: dict) -> None:
        _write_state(self._job_dir(cluster, state["name"]) / "job.json", state)

    def _require_job(self, cluster: str, job: str) -> dict:
        from azext_elastictrain.core.layout import validate_job_name
        from azext_elastictrain.core.spec import SpecError

        LocalClusterSpec(cluster).validate()
        try:
            validate_job_name(job)  # it becomes a path: never '..' or '/'
        except ValueError as ex:
            raise SpecError(str(ex)) from ex
        if self._load(cluster) is None:
            raise ClusterNotFound(f"no local cluster named {cluster!r}")
        state = self._load_job(cluster, job)
        if state is None:
            raise JobNotFound(f"no job named {job!r} on local cluster {cluster!r}")
        return state

    class _Lock:
        """One job-changing command at a time per cluster (two `job run`s of one name must not both start)."""

        def __init__(self, path: Path):
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a")  # noqa: SIM115

        def __enter__(self):
            fcntl.flock(self._file, fcntl.LOCK_EX)
            return self

        def __exit__(self, *exc):
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()

    def _job_lock(self, cluster: str) -> "_Lock":
        return self._Lock(self._jobs_dir(cluster) / ".lock")

    def run_job(self, spec: JobSpec) -> dict:
        """Start ``spec.node_count`` torchrun agents, detached; all or nothing."""
        spec.validate()
        cluster = spec.cluster
        shown = self.show_cluster(cluster)  # ClusterNotFound
        if shown["health"] != "Healthy":
            down = ", ".join(k for k, v in shown["components"].items() if v["state"] != "running")
            raise ClusterUnhealthy(
                f"local cluster {cluster!r} is {shown['health']} ({down} not running); "
                f"heal it with 'az elastictrain cluster create --local --name {cluster}'"
            )
        if importlib.util.find_spec("torch") is None:
            raise ToolMissing(f"torch is not installed in the Python that runs az ({sys.executable}): "
                              "the job's nodes run torchrun from it; install torch there")
        script = str(Path(spec.script).resolve())
        conn = self.connection(cluster)
        with self._job_lock(cluster):
            existing = self._load_job(cluster, spec.name)
            if existing and any(self._alive(n) for n in existing["nodes"]):
                raise JobConflict(
                    f"job {spec.name!r} is already running on local cluster {cluster!r}; "
                    f"pick another --name, or stop it first with "
                    f"'az elastictrain job delete --local --cluster {cluster} --name {spec.name}'"
                )
            job_dir = self._job_dir(cluster, spec.name)
            if existing:  # a finished run of this name: its processes are gone, start afresh
                self._stop_job_processes(cluster, existing)
            shutil.rmtree(job_dir, ignore_errors=True)
            (job_dir / "nodes").mkdir(parents=True)
            state = {
                "name": spec.name,
                "cluster": cluster,
                "created": time.time(),
                "script": script,
                "scriptArgs": list(spec.script_args),
                "minNodes": spec.min_nodes,
                "maxNodes": spec.max_nodes,
                "nodeCount": spec.node_count,
                "nprocPerNode": spec.nproc_per_node,
                "checkpointInterval": spec.checkpoint_interval,
                "keep": spec.keep,
                "checkpointUrl": f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{spec.name}",
                # One rendezvous per run: torch keeps a finished run's rendezvous closed in etcd for
                # hours, and agents that join a closed one exit at once. Nodes that come back later
                # (capacity returning) join this same id.
                "rdzvId": f"{spec.name}-{uuid.uuid4().hex[:8]}",
                "stopRequested": False,
                "nodes": [],
            }
            try:
                self._save_job(cluster, state)
                for node in spec.node_names():  # recorded as each starts: no agent is ever untracked
                    state["nodes"].append(self._start_node(spec, script, node, conn, job_dir, state["rdzvId"]))
                    self._save_job(cluster, state)
            except BaseException:
                self._stop_job_processes(cluster, state)
                shutil.rmtree(job_dir, ignore_errors=True)
                raise
        return self.show_job(cluster, spec.name)

    def _start_node(self, spec: JobSpec, script: str, node: str, conn: dict, job_dir: Path, rdzv_id: str) -> dict:
        import psutil

        nodes_dir = job_dir / "nodes"
        log_path = nodes_dir / f"{node}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICTRAIN_")}
        env.update({
            JOB_MARKER_ENV: str(job_dir),
            "ELASTICTRAIN_CHECKPOINT_URL": f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{spec.name}",
            "AZURE_STORAGE_CONNECTION_STRING": conn["connection_string"],
            "ELASTICTRAIN_SCHEDULED_EVENTS_URL": conn["scheduled_events"],
            "ELASTICTRAIN_VM_NAME": node,
            "ELASTICTRAIN_NODE_NAME": node,
            # A worker restarted on the same node must not act twice on an acknowledged event.
            "ELASTICTRAIN_PREEMPTION_STATE": str(nodes_dir / f"{node}.acked.json"),
            "ELASTICTRAIN_KEEP": str(spec.keep),
            "ELASTICTRAIN_PROGRESS_SECONDS": str(PROGRESS_SECONDS),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # torch 2.13: scale-up hangs without it
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONUNBUFFERED": "1",
            # The runtime (azext_elastictrain.runtime) importable from a script anywhere.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO_ROOT), os.environ.get("PYTHONPATH")])),
        })
        env.setdefault("OMP_NUM_THREADS", "1")
        if spec.checkpoint_interval is not None:
            env["ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS"] = str(spec.checkpoint_interval)
        argv = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={spec.min_nodes}:{spec.max_nodes}",
            f"--nproc-per-node={spec.nproc_per_node}",
            "--rdzv-backend=etcd-v2",
            f"--rdzv-endpoint={conn['etcd']}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={TUNED_RDZV_CONF}",
            "--local-addr=127.0.0.1",
            f"--max-restarts={MAX_RESTARTS}",
            "--monitor-interval=0.5",
            script, *spec.script_args,
        ]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True, close_fds=True)
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error as ex:
            raise ClusterError(f"node {node} (pid {proc.pid}) exited at once; see {log_path}") from ex
        return {"name": node, "pid": proc.pid, "started": started, "log": str(log_path), "status": "started"}

    # -- job processes ----------------------------------------------------------------
    def _job_processes(self, cluster: str, job: dict) -> list:
        """Every live process of the job: each recorded agent (pid + start time checked) with all its
        descendants, and any process carrying the job's marker (workers orphaned by a killed agent)."""
        import psutil

        found: dict[int, Any] = {}
        for node in job.get("nodes", []):
            if not self._alive(node):
                continue
            try:
                root = psutil.Process(node["pid"])
                for proc in [root, *root.children(recursive=True)]:
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        marker = str(self._job_dir(cluster, job["name"]))
        me = os.getpid()
        for proc in psutil.process_iter():
            if proc.pid in found or proc.pid == me:
                continue
            try:
                if proc.environ().get(JOB_MARKER_ENV) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                    found[proc.pid] = proc
            except psutil.Error:
                continue
        return list(found.values())

    def _stop_job_processes(self, cluster: str, job: dict) -> None:
        """SIGTERM the job's processes (the runtime checkpoints on it), then SIGKILL what is left."""
        import psutil

        # Listed again before each round: an agent may start a worker between listing and signalling.
        rounds = ((signal.SIGTERM, JOB_STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT))
        for sig, timeout in rounds:
            procs = self._job_processes(cluster, job)
            if not procs:
                return
            for proc in procs:
                try:
                    proc.send_signal(sig)
                except psutil.Error:
                    pass
            psutil.wait_procs(procs, timeout=timeout)
        left = self._job_processes(cluster, job)
        if left:
            raise ClusterError(f"job {job['name']!r}: processes {sorted(p.pid for p in left)} did not stop")

    # -- show, list ---------------------------------------------------------------------
    def _event_reader(self, cluster: str) -> "_EventReader":
        conn = self.connection(cluster)
        return _EventReader(f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}", conn["connection_string"])

    def _describe(self, cluster: str, job: dict, read: "_EventReader") -> dict:
        nodes = []
        for node in job["nodes"]:
            alive = self._alive(node)
            nodes.append({
                "name": node["name"], "pid": node["pid"], "alive": alive,
                "status": "Running" if alive else ("Evicted" if node.get("status") == "evicted" else "Exited"),
                "log": node["log"],
            })
        any_alive = any(n["alive"] for n in nodes)
        events_error = None
        try:
            evs = job_events.since(read(job["name"]), job["created"])
        except Exception as ex:  # noqa: BLE001 - show what the processes say; tell why events are missing
            evs, events_error = [], f"cannot read the job's events from the cluster's blob storage: {ex}"
        summary = job_events.summarize(evs)
        state = job_events.job_state(summary["finished"], any_alive, job.get("stopRequested", False))
        if events_error and state == job_events.FAILED:
            state = "Unknown"  # the agents are gone; whether training finished is in the unread events
        preempted_nodes = {p["node"] for p in summary["preempted"]}
        # Nodes lost while the job runs on (once every node is gone, an exit is no longer told from
        # a crash or the end), and nodes an eviction marked; each counted once with its notice.
        died = [n for n in nodes if not n["alive"] and n["name"] not in preempted_nodes
                and (n["status"] == "Evicted" or state == job_events.RUNNING)]
        result = {
            "name": job["name"],
            "cluster": cluster,
            "type": "local",
            "state": state,
            "created": _iso(job["created"]),
            "script": job["script"],
            "scriptArgs": job["scriptArgs"],
            "minNodes": job["minNodes"],
            "maxNodes": job["maxNodes"],
            "nodeCount": job["nodeCount"],
            "nprocPerNode": job["nprocPerNode"],
            "checkpointInterval": job["checkpointInterval"],
            "keep": job["keep"],
            "checkpointUrl": f"{self.connection(cluster)['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{job['name']}",
            "rdzvId": job.get("rdzvId"),
            "worldSize": summary["worldSize"],
            "step": summary["step"],
            "samplesPerSecond": summary["samplesPerSecond"],
            "loss": summary["loss"],
            "lastCheckpointStep": summary["lastCheckpointStep"],
            "lastCheckpointTime": _iso(summary["lastCheckpointTime"]) if summary["lastCheckpointTime"] else None,
            "failedCheckpoints": summary["failedCheckpoints"],
            "evictions": len(summary["preempted"]) + len(died),
            "recoveries": summary["recoveries"],
            "nodes": nodes,
            "stateDir": str(self._job_dir(cluster, job["name"])),
        }
        if events_error:
            result["eventsError"] = events_error
        return result

    def show_job(self, cluster: str, job: str) -> dict:
        state = self._require_job(cluster, job)
        read = self._event_reader(cluster)
        try:
            return self._describe(cluster, state, read)
        finally:
            read.close()

    def list_jobs(self, cluster: str) -> list[dict]:
        if self._load(cluster) is None:
            raise ClusterNotFound(f"no local cluster named {cluster!r}")
        read = self._event_reader(cluster)
        try:
            return [self._describe(cluster, state, read)
                    for state in (self._load_job(cluster, j) for j in self._job_names(cluster)) if state]
        finally:
            read.close()

    def job_alive(self, cluster: str, job: str) -> bool:
        state = self._load_job(cluster, job)
        return bool(state) and any(self._alive(n) for n in state["nodes"])

    # -- evictions ---------------------------------------------------------------------
    def evict(self, cluster: str, job: str, **options: Any) -> dict:
        """Spot-evict nodes of a running job (see local_evict); serialized with job starts."""
        from azext_elastictrain.core.backends.local_evict import evict_nodes

        with self._job_lock(cluster):
            return evict_nodes(self, cluster, job, **options)

    def follow_recovery(self, cluster: str, job: str, eviction: dict) -> dict:
        from azext_elastictrain.core.backends.local_evict import follow_recovery

        read = self._event_reader(cluster)
        try:
            return follow_recovery(read, job, eviction)
        finally:
            read.close()

    # -- logs --------------------------------------------------------------------------
    def job_nodes(self, cluster: str, job: str) -> list[dict]:
        """The job's recorded nodes: name, agent pid and start time, log, status."""
        return self._require_job(cluster, job)["nodes"]

    def _log_nodes(self, cluster: str, job: str, node: str | None) -> list[dict]:
        state = self._require_job(cluster, job)
        nodes = state["nodes"]
        if node is not None:
            nodes = [n for n in nodes if n["name"] == node]
            if not nodes:
                names = ", ".join(n["name"] for n in state["nodes"])
                raise JobNotFound(f"job {job!r} has no node {node!r}; its nodes: {names}")
        return nodes

    def job_logs(self, cluster: str, job: str, node: str | None = None, tail: int | None = None,
                 follow: bool = False, poll: float = 0.5, timeout: float | None = None) -> Iterator[tuple[str, str]]:
        """(node, line) pairs of the nodes' logs: the last ``tail`` lines of each (all when None); with
        ``follow``, then new lines as they come until every agent of the job exited (or ``timeout``)."""
        nodes = self._log_nodes(cluster, job, node)
        offsets: dict[str, int] = {}
        partial: dict[str, bytes] = {}
        for n in nodes:
            path = Path(n["log"])
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                data = b""
            offsets[n["name"]] = len(data)
            lines = data.decode(errors="replace").splitlines()
            if follow and data and not data.endswith(b"\n"):
                # hold a half-written last line back until it is complete
                cut = data.rfind(b"\n") + 1
                partial[n["name"]] = data[cut:]
                lines = data[:cut].decode(errors="replace").splitlines()
            if tail is not None:
                lines = lines[-tail:] if tail > 0 else []
            for line in lines:
                yield n["name"], line
        if not follow:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ended = not self.job_alive(cluster, job)  # look before reading: nothing written after is lost
            for n in nodes:
                try:
                    with open(n["log"], "rb") as f:
                        f.seek(offsets[n["name"]])
                        data = f.read()
                except FileNotFoundError:
                    continue
                if not data:
                    continue
                offsets[n["name"]] += len(data)
                data = partial.pop(n["name"], b"") + data
                cut = data.rfind(b"\n") + 1
                if cut < len(data):
                    partial[n["name"]] = data[cut:]
                for line in data[:cut].decode(errors="replace").splitlines():
                    yield n["name"], line
            if ended:
                for name, rest in partial.items():
                    yield name, rest.decode(errors="replace")
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(poll)

    # -- delete ------------------------------------------------------------------------
    def delete_job(self, cluster: str, job: str, dry_run: bool = False, delete_checkpoints: bool = False) -> dict:
        """Stop every node (agent and descendants) and remove the job's state; its checkpoints and
        event log stay unless ``delete_checkpoints``."""
        state = self._require_job(cluster, job)
        procs = self._job_processes(cluster, state)
        agents = {n["pid"]: n["name"] for n in state["nodes"]}
        blobs: list = []
        if delete_checkpoints:
            blobs = self._job_blobs(cluster, job)
        result = {
            "name": job,
            "cluster": cluster,
            "dryRun": dry_run,
            "stopped": [{"node": agents.get(p.pid), "pid": p.pid} for p in sorted(procs, key=lambda p: p.pid)],
            "removed": str(self._job_dir(cluster, job)),
            "checkpoints": "deleted" if delete_checkpoints else "kept",
            "checkpointUrl": f"{self.connection(cluster)['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{job}",
            "blobsDeleted": len(blobs),
            "bytesFreed": sum(b.size for b in blobs),
        }
        if dry_run:
            return result
        with self._job_lock(cluster):
            state["stopRequested"] = True
            self._save_job(cluster, state)
            self._stop_job_processes(cluster, state)
            if delete_checkpoints:
                self._delete_job_blobs(cluster, job)
            shutil.rmtree(self._job_dir(cluster, job), ignore_errors=True)
        return result

    def _job_store(self, cluster: str):
        from azext_elastictrain.core.blobstore import BlobStore

        conn = self.connection(cluster)
        return BlobStore.from_url(f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}",
                                  connection_string=conn["connection_string"], quick_retries=True)

    def _job_blobs(self, cluster: str, job: str) -> list:
        store = self._job_store(cluster)
        try:
            return store.list(job + "/")
        finally:
            store.close()

    def _delete_job_blobs(self, cluster: str, job: str) -> None:
        store = self._job_store(cluster)
        try:
            # manifests first: a reader never sees a half-deleted checkpoint as complete
            names = [b.name for b in store.list(job + "/")]
            manifests = [n for n in names if n.endswith("/manifest.json")]
            store.delete(manifests)
            store.delete([n for n in names if n not in set(manifests)])
        finally:
            store.close()

    def checkpoint_location(self, cluster: str, job: str) -> tuple[str, str]:
        """The job's checkpoint URL and the connection string that reaches it (never to be printed)."""
        from azext_elastictrain.core.layout import validate_job_name
        from azext_elastictrain.core.spec import SpecError

        LocalClusterSpec(cluster).validate()
        try:
            validate_job_name(job)
        except ValueError as ex:
            raise SpecError(str(ex)) from ex
        conn = self.connection(cluster)
        return f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{job}", conn["connection_string"]


def connection_string(port: int) -> str:
    return f"DefaultEndpointsProtocol=http;{_AZURITE_AUTH};BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"


class _EventReader:
    """Job name -> its events, over one client of the cluster's blob storage (opened on first use)."""

    def __init__(self, container_url: str, connection_string: str):
        self._url, self._connection_string = container_url, connection_string
        self._store = None

    def __call__(self, job: str) -> list[dict]:
        if self._store is None:
            from azext_elastictrain.core.blobstore import BlobStore

            self._store = BlobStore.from_url(self._url, connection_string=self._connection_string,
                                             quick_retries=True)
        return job_events.read_events(self._store, job)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))

