"""Warm worker starts: a node's training processes fork from one that has already imported torch.

    torchrun ... -m azext_elastictrain.runtime.warm train.py --steps 300

torchrun starts a fresh Python for every worker on every re-form, when a node leaves and when one joins, and
each pays for importing torch and the runtime again (2-3 s of CPU here) while the job does not train. Nothing in
those imports differs from one start to the next, so the node does them once:

- The launcher (this module's ``main``: the process torchrun starts and watches) connects to the node's warm
  server over a Unix socket in a private folder (0700, owner checked; the peer's uid checked both ways: the
  request carries the worker's environment, credentials included), starting the server first if there is none.
- The server imports torch, the runtime and the script's top-level imports of installed packages once, then
  forks a worker per launcher. The worker takes the launcher's argv, environment, working directory and
  standard streams (passed as file descriptors) and runs the script as ``__main__``, as ``python -u`` would.
- The launcher forwards every signal torchrun sends it to the worker and exits as the worker did (the same
  code, or killed by the same signal), so torchrun sees its worker. A worker whose launcher is gone (torchrun's
  SIGKILL) kills itself; the server goes when its torchrun agent does.

What a fork could carry over that a fresh process would not have, and how it does not: the server only imports
(no CUDA, no process group, no Python thread: it refuses to fork with a second one; the native threads of
OpenBLAS's pool are fork-aware, as every forked DataLoader worker relies on), with torchrun's
per-round variables (RANK, WORLD_SIZE, MASTER_PORT...) taken out of its environment so no import reads a stale
round; modules beside the script are not imported early (they may read the environment at import). The
worker reseeds torch's and numpy's global RNGs from the OS as a new process does (Python's ``random``
reseeds itself after a fork).

Anything wrong before the worker is forked (no agent, a folder another user could write, a server that failed
to start, ``ELASTICTRAIN_WARM_START=off``) starts the script cold instead, exactly as torchrun would have:
``python -u script``. Linux only, like torchrun's elastic agent.
"""
from __future__ import annotations

import ast
import fcntl
import gc
import hashlib
import importlib
import importlib.util
import io
import json
import os
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, cast

from azext_elastictrain.core.launch import (
    ENV_WARM_DIR, ENV_WARM_IMPORTS, ENV_WARM_START, SCRIPT_SEPARATOR, TORCHRUN_MODULE, WARM_START_MODULE)


# What every training process of this runtime imports; the script's own top-level imports are added.
BASE_IMPORTS = (
    "torch", "torch.nn", "torch.nn.functional", "torch.optim", "torch.utils.data", "torch.distributed",
    "torch.distributed.checkpoint.state_dict", "torch.nn.parallel",
    "azext_elastictrain.runtime.checkpoint", "azext_elastictrain.runtime.state",
    "azext_elastictrain.runtime.data", "azext_elastictrain.runtime.memory_tier",
    "azext_elastictrain.runtime.preemption", "azext_elastictrain.runtime.progress",
)
# Set by torchrun for one round of one worker: never in the server's environment while it imports.
ROUND_VARIABLES = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE",
)
# Every signal torchrun (or a user) may send a worker; SIGKILL cannot be forwarded (the worker notices).
FORWARDED_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                                      signal.SIGUSR2)
SERVER_START_TIMEOUT = 180.0  # importing torch on a busy node
REQUEST_TIMEOUT = 30.0
AGENT_POLL_SECONDS = 0.5
_HEADER = struct.Struct("!I")
_SOCKET_PATH_MAX = 108  # sun_path on Linux, with its terminating NUL
MODULE = WARM_START_MODULE  # this module's name, also when it runs as __main__


class WarmUnavailable(Exception):
    """The worker cannot start warm; it starts cold (the reason is printed)."""


@dataclass(frozen=True)
class Agent:
    """The torchrun agent a node's server serves: its pid and start time (a reused pid is another agent)."""

    pid: int
    started: str

    @classmethod
    def of(cls, pid: int) -> "Agent | None":
        started = _start_time(pid)
        return cls(pid, started) if started else None

    def alive(self) -> bool:
        return _start_time(self.pid) == self.started

    def __str__(self) -> str:
        return f"{self.pid}:{self.started}"

    @classmethod
    def parse(cls, text: str) -> "Agent":
        pid, started = text.split(":", 1)
        return cls(int(pid), started)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


# -- the launcher: what torchrun runs ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        order = serve(path=args[1], agent=Agent.parse(args[2]), script=args[3],
                      ready_lock=int(args[4]) if len(args) > 4 else None)
        run_worker(order)  # only a forked worker gets here
    if args[:1] == ["--agent"]:
        start_agent(args[1:])
    if args[:1] == [SCRIPT_SEPARATOR]:  # torchrun drops it; a launcher started by hand may pass it
        args = args[1:]
    if not args or args[0].startswith("-"):
        sys.exit(f"usage: python -m {MODULE} SCRIPT [ARGS...]  (as torchrun's entry point: torchrun ... -m "
                 f"{MODULE} SCRIPT [ARGS...])")
    script, script_args = args[0], args[1:]
    if _turned_off():
        _start_cold(script, script_args)
    try:
        conn, pid = _start_warm(script, script_args)
    except WarmUnavailable as ex:
        print(f"elastictrain: warm start unavailable ({ex}); starting {script} cold", file=sys.stderr, flush=True)
        _start_cold(script, script_args)
    _follow(conn, pid)


def start_agent(torchrun_args: list[str]) -> NoReturn:
    """Be the node's torchrun agent, its warm server started first: the server imports while the agent
    joins the rendezvous, so a node's first workers start warm too (a node that joins a running job is
    what the job waits for). torchrun replaces this process (same pid and start time: the server's agent),
    so the server and the workers it forks are the agent's descendants, like plain torchrun's workers."""
    script = _script_in(torchrun_args)
    if script is not None and not _turned_off():
        try:
            _prestart(script)
        except (WarmUnavailable, OSError) as ex:
            print(f"elastictrain: no warm server ({ex}); workers will start cold", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", TORCHRUN_MODULE, *torchrun_args])


def _script_in(torchrun_args: list[str]) -> str | None:
    for i, arg in enumerate(torchrun_args[:-2]):
        if arg == "-m" and torchrun_args[i + 1] == MODULE:
            rest = torchrun_args[i + 2:]
            rest = rest[1:] if rest[:1] == [SCRIPT_SEPARATOR] else rest
            return rest[0] if rest else None
    return None


def _prestart(script: str) -> None:
    agent = Agent.of(os.getpid())
    if agent is None:
        raise WarmUnavailable("this process has no start time")
    path = socket_path(script, agent)
    with open(path.with_suffix(".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by the server until it listens: launchers wait for it
        # pylint: disable-next=consider-using-with  # the server lives as long as the agent this becomes
        subprocess.Popen([sys.executable, "-m", MODULE, "--serve", str(path), str(agent), script, str(lock.fileno())],
                         stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(lock.fileno(),))


def _turned_off() -> bool:
    return os.environ.get(ENV_WARM_START, "on").lower() in ("off", "0", "false", "no")


def _start_cold(script: str, script_args: list[str]) -> NoReturn:
    os.execv(sys.executable, [sys.executable, "-u", script, *script_args])


def socket_path(script: str, agent: Agent) -> Path:
    """The node's server for this script under this agent, in a folder only this user can use."""
    folder = Path(os.environ.get(ENV_WARM_DIR) or Path(tempfile.gettempdir()) / f"elastictrain-warm-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as ex:
        raise WarmUnavailable(f"cannot use {folder}: {ex}") from ex
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise WarmUnavailable(f"{folder} is not a folder of this user's alone (mode {oct(info.st_mode & 0o777)})")
    key = hashlib.sha256(f"{agent}\0{Path(script).resolve()}\0{sys.executable}".encode()).hexdigest()[:20]
    path = folder / f"{key}.sock"
    if len(os.fsencode(path)) >= _SOCKET_PATH_MAX:
        raise WarmUnavailable(f"the socket path {path} is longer than a Unix socket's {_SOCKET_PATH_MAX - 1} bytes "
                              f"(set {ENV_WARM_DIR} to a shorter folder)")
    return path


def _start_warm(script: str, script_args: list[str]) -> tuple[socket.socket, int]:
    agent = Agent.of(os.getppid())
    if agent is None or agent.pid == 1:
        raise WarmUnavailable("no agent to serve: not started by torchrun")
    path = socket_path(script, agent)
    conn = _connect_or_start(path, agent, script)
    try:
        header = json.dumps({"argv": [script, *script_args], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(header))], [0, 1, 2])
        conn.sendall(header)
        reply = _read_line(conn)
    except OSError as ex:
        conn.close()
        raise WarmUnavailable(f"the warm server did not take the request: {ex}") from ex
    if reply is None or "pid" not in reply:
        conn.close()
        raise WarmUnavailable(f"the warm server refused: {(reply or {}).get('error', 'no answer')}")
    conn.settimeout(None)
    return conn, int(reply["pid"])


def _connect_or_start(path: Path, agent: Agent, script: str) -> socket.socket:
    """A connection to the server at ``path``; the first launcher of a node starts it (one at a time: the
    others wait on the lock, then connect)."""
    with open(path.with_suffix(".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _try_connect(path)
        if conn is not None:
            return conn
        path.unlink(missing_ok=True)  # a server that is gone (its agent's pid and start time are in the name)
        # pylint: disable-next=consider-using-with  # the server outlives this launcher: it serves the next ones
        server = subprocess.Popen([sys.executable, "-m", MODULE, "--serve", str(path), str(agent), script],
                                  stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            conn = _try_connect(path)
            if conn is not None:
                return conn
            if server.poll() is not None:
                raise WarmUnavailable(f"the warm server exited with {server.returncode} while starting")
            time.sleep(0.02)
        server.kill()
        raise WarmUnavailable(f"the warm server did not start in {SERVER_START_TIMEOUT:.0f} s")


def _try_connect(path: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    if _peer_uid(conn) != os.getuid():
        conn.close()
        raise WarmUnavailable(f"{path} is served by another user")
    conn.settimeout(REQUEST_TIMEOUT)
    return conn


def _peer_uid(conn: socket.socket) -> int:
    _pid, uid, _gid = cast("tuple[int, int, int]",
                           struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)))
    return uid


def _read_line(conn: socket.socket) -> dict[str, Any] | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    line: dict[str, Any] = json.loads(data)  # one JSON object a line: this module writes both ends
    return line


def _follow(conn: socket.socket, pid: int) -> NoReturn:
    """Be the worker for torchrun: pass on its signals, end as the worker ended."""
    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        result = _read_line(conn)  # a signal's handler runs and the read goes on (PEP 475)
    except OSError:
        result = None
    if result is None:  # the server died under its worker: the worker's end cannot be known
        forward(signal.SIGKILL, None)
        print(f"elastictrain: the warm server went away; worker {pid} killed", file=sys.stderr, flush=True)
        os._exit(1)
    if "signal" in result:
        sig = int(result["signal"])
        if sig in FORWARDED_SIGNALS:  # ours to give back; SIGKILL and the like cannot be caught anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    sys.stdout.flush()
    os._exit(int(result["exit"]))


# -- the server: one per node and script, alive as long as its agent ----------------------------------------
@dataclass
class WorkerOrder:
    """What a forked worker runs (returned only in the worker process)."""

    conn: socket.socket
    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]


class _Server:
    def __init__(self, path: Path, agent: Agent) -> None:
        self.path, self.agent, self.pid = path, agent, os.getpid()
        self.workers: dict[int, socket.socket] = {}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.wake_r, self.wake_w = socket.socketpair()

    def start(self) -> None:
        for sock in (self.wake_r, self.wake_w):
            sock.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through the wakeup fd
        self.listener.bind(str(self.path))
        self.listener.listen(64)
        # Its streams are the first launcher's: a reader of that launcher's output (a pipe) would wait for the
        # server too. Every worker gets its own launcher's streams.
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)

    def loop(self) -> WorkerOrder | None:
        while self.agent.alive():
            readable, _, _ = select.select([self.listener, self.wake_r], [], [], AGENT_POLL_SECONDS)
            if self.wake_r in readable:
                try:
                    self.wake_r.recv(4096)
                except BlockingIOError:
                    pass
            self._reap()
            if self.listener in readable:
                order = self._accept()
                if order is not None:
                    return order  # in the forked worker
        return None

    def stop(self) -> None:
        if os.getpid() == self.pid:
            self.path.unlink(missing_ok=True)
            self.path.with_suffix(".lock").unlink(missing_ok=True)
            self.listener.close()

    def _accept(self) -> WorkerOrder | None:
        conn, _ = self.listener.accept()
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return None
        conn.settimeout(REQUEST_TIMEOUT)
        fds: list[int] = []
        try:
            head, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, 3)
            if len(head) != _HEADER.size or len(fds) != 3:
                raise OSError("a malformed request")
            (size,) = _HEADER.unpack(head)
            body = b""
            while len(body) < size:
                chunk = conn.recv(size - len(body))
                if not chunk:
                    raise OSError("the launcher went away")
                body += chunk
            request = json.loads(body)
            if threading.active_count() != 1:  # a fork would copy the locks another thread holds
                conn.sendall(json.dumps({"error": f"the server runs threads: {_thread_names()}"}).encode() + b"\n")
                raise OSError("not single-threaded")
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # the imported modules' objects: no collection in a worker touches (and copies) their pages
        pid = os.fork()
        if pid == 0:
            return self._become_worker(conn, request, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the launcher is gone: so must its worker be
            os.kill(pid, signal.SIGKILL)
        self.workers[pid] = conn
        return None

    def _become_worker(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> WorkerOrder:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sock in (self.listener, self.wake_r, self.wake_w, *self.workers.values()):
            sock.close()
        conn.settimeout(None)
        return WorkerOrder(conn, request["argv"], request["env"], request["cwd"], fds)

    def _reap(self) -> None:
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            if conn is None:
                continue
            result = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                      else {"exit": os.waitstatus_to_exitcode(status)})
            try:
                conn.sendall(json.dumps(result).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def serve(*, path: str, agent: Agent, script: str, ready_lock: int | None = None) -> WorkerOrder:
    """Import once, then fork a worker per request until the agent is gone. Returns only in a worker.

    ``ready_lock``: a descriptor of the socket's lock file, locked by the agent that started this server;
    closed once the server listens, so launchers that wait for the lock find it serving."""
    for name in ROUND_VARIABLES:
        os.environ.pop(name, None)
    script_dir = str(Path(script).resolve().parent)
    sys.path[0] = script_dir
    for name in warm_imports(script):
        try:
            importlib.import_module(name)
        except Exception:  # pylint: disable=broad-except  # the worker imports it again and fails as it would cold
            pass
    if threading.active_count() != 1:
        sys.exit(f"elastictrain: an import started a Python thread ({_thread_names()}) in the warm server, which "
                 f"cannot fork safely (set {ENV_WARM_IMPORTS} to fewer modules, or {ENV_WARM_START}=off)")
    server = _Server(Path(path), agent)
    server.start()
    if ready_lock is not None:
        os.close(ready_lock)
    order = server.loop()
    if order is None:
        server.stop()
        sys.exit(0)
    return order


def _thread_names() -> str:
    return ", ".join(t.name for t in threading.enumerate())


def warm_imports(script: str) -> list[str]:
    """BASE_IMPORTS, ELASTICTRAIN_WARM_IMPORTS and the script's top-level absolute imports of modules that are
    installed (not beside the script: those may read per-round settings when imported)."""
    names = list(BASE_IMPORTS)
    names += [n.strip() for n in os.environ.get(ENV_WARM_IMPORTS, "").split(",") if n.strip()]
    try:
        tree = ast.parse(Path(script).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return names
    script_dir = Path(script).resolve().parent
    top = list(tree.body)
    for node in tree.body:  # an optional dependency's `try: import x` / `except ImportError` counts as top level
        if isinstance(node, ast.Try):
            top += node.body
    for node in top:
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            found = [node.module]
        else:
            continue
        for name in found:
            if name not in names and _installed(name, script_dir):
                names.append(name)
    return names


def _installed(name: str, script_dir: Path) -> bool:
    try:
        spec = importlib.util.find_spec(name.split(".")[0])
    except (ImportError, ValueError):
        return False
    origin = getattr(spec, "origin", None) if spec else None
    if not origin or origin in ("built-in", "frozen"):
        return spec is not None
    return script_dir not in Path(origin).resolve().parents


def run_worker(order: WorkerOrder) -> NoReturn:
    """In the forked worker: become the process the launcher would have started, then run the script."""
    os.setsid()
    for target, fd in enumerate(order.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(order.cwd)
    os.environ.clear()
    os.environ.update(order.env)
    # `python -u`: unbuffered standard streams, now on the launcher's descriptors.
    # (typeshed declares sys.__stdin__ and the others Final; a forked worker must replace them all the same)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    script = order.argv[0]
    sys.argv = list(order.argv)
    sys.path[0] = str(Path(script).resolve().parent)
    _reseed()
    threading.Thread(target=_die_with_launcher, args=(order.conn,), name="warm-launcher-watch", daemon=True).start()
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as ex:  # pylint: disable=broad-except  # reported as Python reports a script's error
        _report_as_python_would(ex, script)
    sys.exit(0)


def _report_as_python_would(ex: BaseException, script: str) -> NoReturn:
    """The traceback from the script's first frame on (not this module's or runpy's), exit 1; an unhandled
    Ctrl-C ends by SIGINT, as in Python."""
    tb = ex.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    if tb is not None:
        ex.with_traceback(tb)
    sys.excepthook(type(ex), ex, ex.__traceback__)
    sys.stderr.flush()
    if isinstance(ex, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)


def _reseed() -> None:
    import torch

    torch.seed()  # a new process seeds torch from the OS; a fork would repeat the server's seed
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _die_with_launcher(conn: socket.socket) -> None:
    """The launcher never writes after its request: end of stream means torchrun killed it."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
