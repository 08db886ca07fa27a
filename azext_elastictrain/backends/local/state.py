"""What a local cluster records and its parts share: errors, background processes
recorded by pid and start time, state files written atomically, the Azurite account.

A recorded process is ours only while its pid AND its start time match: a pid
reused by another program after ours exited is never signalled.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's documented, public development account: not a secret, still never printed.
_AZURITE_AUTH = ("AccountName=devstoreaccount1;"
                 "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
STOP_TIMEOUT = 10.0
REPO_ROOT = Path(__file__).resolve().parents[3]


class ClusterError(RuntimeError):
    """The local cluster could not be created or reached; the message says why."""


class ToolMissing(ClusterError):
    """A program the local cluster runs is not installed."""


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether something answers HTTP at ``url`` (any status; 5xx excepted)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as ex:
        return ex.code < 500
    except (urllib.error.URLError, OSError):
        return False


def which_tool(env_var: str, candidates: list[Path], name: str, install: str) -> str:
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


def read_state(path: Path, what: str) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        return state
    except FileNotFoundError:
        return None
    except ValueError as ex:
        raise ClusterError(f"the state of {what} is unreadable ({path}): {ex}") from ex


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a reader sees the old state or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def alive(component: dict[str, Any] | Component) -> bool:
    """Whether the recorded process still runs and is still the one we started."""
    import psutil

    c = component if isinstance(component, dict) else component.to_json()
    try:
        proc = psutil.Process(c["pid"])
        return bool(abs(proc.create_time() - c["started"]) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def node_processes(agent_pid: int, environment: dict[str, str]) -> list[Any]:
    """Every process of a local node: its agent with all descendants (workers start sessions of their own),
    and any process whose environment holds all of ``environment`` (a warm server a first launcher started,
    and the workers forked from it, live outside the agent's tree: runtime/warm.py)."""
    import psutil

    try:
        root = psutil.Process(agent_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if proc not in procs and all(env.get(k) == v for k, v in environment.items()):
            procs.append(proc)
    return procs


class FileLock:
    """An exclusive lock on a file, across processes (one job-changing command at a time per cluster)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # held open for the lock's lifetime (flock needs the descriptor); closed by __exit__
        self._file = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

    def __enter__(self) -> "FileLock":
        import fcntl

        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        import fcntl

        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def connection_string(port: int) -> str:
    return f"DefaultEndpointsProtocol=http;{_AZURITE_AUTH};BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
