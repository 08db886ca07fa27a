"""Real local services for tests, scripts and benchmarks.

Everything listens on loopback on free ports and is always stopped: the
context managers stop their process on exit (SIGTERM to its process group,
SIGKILL after a bounded wait), an ``atexit`` hook stops whatever is still
running when the interpreter exits, and on Linux each child gets
``PR_SET_PDEATHSIG`` so it dies even if the parent is killed outright.

* :func:`start_azurite` -- Azurite's blob service with an on-disk data folder.
* :func:`start_etcd`    -- a one-member etcd with the v2 API enabled.
* :class:`AzCli`         -- the real ``az`` from ``.venv`` with an isolated
  ``AZURE_CONFIG_DIR`` and this checkout as a dev extension.

Scripts can reuse them with the repo root on ``sys.path``::

    from harness.services import start_azurite, start_etcd

    with tempfile.TemporaryDirectory() as tmp, start_azurite(tmp) as blob:
        print(blob.connection_string)

Binaries come from ``bash scripts/setup.sh``; ``AZURITE_BIN`` and ``ETCD_BIN``
override them. The programs, command lines and etcd's environment are the local
cluster's own (backends/local/components.py): a test runs what users run.
``ELASTICTRAIN_SERVICE_START_TIMEOUT`` (seconds, default 30) bounds each start-up.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from azext_elastictrain.backends.local import components

REPO_ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"

#: Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT_NAME = "devstoreaccount1"
AZURITE_ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

START_TIMEOUT_S = float(os.environ.get("ELASTICTRAIN_SERVICE_START_TIMEOUT", "30"))
STOP_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3  # a free port can be taken by someone else before we bind it
_PORT_TAKEN_MARKERS = ("EADDRINUSE", "address already in use")
_LOG_TAIL_CHARS = 4000


class ServiceError(RuntimeError):
    """A service could not be started or did not become ready."""


class ServiceNotFound(ServiceError):
    """The service's program is not installed (run ``bash scripts/setup.sh``)."""


class _PortTaken(ServiceError):
    pass


# --------------------------------------------------------------------------- ports


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct free TCP ports (all held open while choosing)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_request(
    method: str,
    url: str,
    body: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP request that ignores proxy settings: (status, headers, body)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"only http:// URLs are supported: {url}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- processes

_LIVE: dict[int, "ManagedProcess"] = {}
_LIVE_LOCK = threading.Lock()


def _load_prctl() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def _die_with_parent() -> None:  # runs in the child between fork and exec
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return _die_with_parent


_DIE_WITH_PARENT = _load_prctl()


class ManagedProcess:
    """A child process in its own process group, logging to a file, always stoppable."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: os.PathLike | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: os.PathLike | str | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=str(cwd) if cwd is not None else None,
                start_new_session=True,  # own process group: stop() reaches its children
                preexec_fn=_DIE_WITH_PARENT,
                close_fds=True,
            )
        except BaseException:
            self._log.close()
            raise
        with _LIVE_LOCK:
            _LIVE[self.proc.pid] = self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        try:
            self._log.flush()
        except (OSError, ValueError):
            pass
        try:
            data = self.log_path.read_bytes()
        except OSError as exc:
            return f"<cannot read {self.log_path}: {exc}>"
        text = data[-chars:].decode("utf-8", "replace")
        return text if text.strip() else "<empty log>"

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid}): {shlex.join(self.argv)}"

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s; idempotent."""
        try:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.proc.wait(timeout=timeout)
            # leftovers of the group (the leader may have exited first)
            self._signal_group(signal.SIGKILL)
            return self.proc.returncode
        finally:
            with _LIVE_LOCK:
                _LIVE.pop(self.proc.pid, None)
            try:
                self._log.close()
            except OSError:
                pass

    def __enter__(self) -> "ManagedProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def stop_all() -> None:
    """Stop every process started here that is still running."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for proc in procs:
        try:
            proc.stop(timeout=5)
        except Exception:  # noqa: BLE001  best effort at exit
            pass


def _wait_ready(
    proc: ManagedProcess,
    probe: Callable[[], bool],
    timeout: float,
    what: str,
) -> None:
    """Poll ``probe`` until it returns True; fail fast if the process dies."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last_error: str = "no answer yet"
    while True:
        if not proc.alive():
            tail = proc.log_tail()
            if any(m.lower() in tail.lower() for m in _PORT_TAKEN_MARKERS):
                raise _PortTaken(f"{what}: port taken")
            raise ServiceError(
                f"{what} exited with code {proc.proc.returncode} during start-up.\n"
                f"command: {proc.describe()}\nlog ({proc.log_path}):\n{tail}"
            )
        try:
            if probe():
                return
        except ServiceError:
            raise
        except Exception as exc:  # noqa: BLE001  not up yet
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"{what} did not become ready within {timeout:.0f}s (last probe: {last_error}).\n"
                f"command: {proc.describe()}\nlog ({proc.log_path}):\n{proc.log_tail()}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _start_with_retries(start_once: Callable[[int], tuple[ManagedProcess, Any]]):
    last: Exception | None = None
    for attempt in range(_START_ATTEMPTS):
        try:
            return start_once(attempt)
        except _PortTaken as exc:
            last = exc
    raise ServiceError(f"gave up after {_START_ATTEMPTS} attempts: {last}")


def _product_binary(find: Callable[[], str]) -> str:
    """A program as the local cluster finds it; missing, a ServiceNotFound (the tests that need it skip)."""
    from azext_elastictrain.backends.local.state import ToolMissing

    try:
        return find()
    except ToolMissing as exc:
        raise ServiceNotFound(f"{exc}; `bash scripts/setup.sh` installs it") from None


# --------------------------------------------------------------------------- Azurite


@dataclasses.dataclass(frozen=True)
class AzuriteService:
    blob_endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1
    account_name: str
    account_key: str
    connection_string: str
    port: int
    pid: int
    location: str = ""  # Azurite's data folder (on disk)
    log_path: str = ""

    def blob_service_client(self):
        """A ``BlobServiceClient`` for this Azurite (imports azure-storage-blob)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)


def azurite_binary() -> str:
    """The Azurite the local cluster runs (``AZURITE_BIN``, the checkout's .tools, PATH)."""
    return _product_binary(components.azurite_binary)


def _azurite_probe(port: int, cert: str | None = None) -> Callable[[], bool]:
    url = f"http://{LOOPBACK}:{port}/{AZURITE_ACCOUNT_NAME}?comp=list"

    def https_headers() -> dict[str, str]:
        import http.client
        import ssl

        conn = http.client.HTTPSConnection(LOOPBACK, port, timeout=2,
                                           context=ssl.create_default_context(cafile=cert))
        try:
            conn.request("GET", f"/{AZURITE_ACCOUNT_NAME}?comp=list")
            return {k.lower(): v for k, v in conn.getresponse().getheaders()}
        finally:
            conn.close()

    def probe() -> bool:
        # Unauthenticated, so a 403 is expected; any answer from Azurite means it is up.
        headers = https_headers() if cert else http_request("GET", url, timeout=2)[1]
        server = headers.get("server", "")
        if "azurite" not in server.lower():
            raise _PortTaken(f"port {port} answered, but not as Azurite (server {server!r})")
        return True

    return probe


@contextlib.contextmanager
def start_azurite(tmpdir: os.PathLike | str, *, timeout: float = START_TIMEOUT_S, cert: os.PathLike | str | None = None,
                  key: os.PathLike | str | None = None, oauth: bool = False) -> Iterator[AzuriteService]:
    """Run Azurite's blob service with its data in ``tmpdir``; yield an :class:`AzuriteService`.

    With ``cert``/``key`` (PEM files) it serves HTTPS; ``oauth`` also admits bearer tokens (Azurite's basic
    check: issuer, audience, lifetime; Azurite needs HTTPS for it), as Azure storage does with Entra ID.
    """
    binary = azurite_binary()
    workdir = Path(tmpdir)
    location = workdir / "azurite-data"
    location.mkdir(parents=True, exist_ok=True)

    def start_once(attempt: int) -> tuple[ManagedProcess, AzuriteService]:
        port = free_port()
        argv = components.azurite_argv(binary, port=port, location=location, cert=str(cert) if cert else None,
                                       key=str(key) if key else None, oauth=oauth)
        proc = ManagedProcess("azurite", argv, workdir / f"azurite-{attempt}.log", cwd=location)
        try:
            _wait_ready(proc, _azurite_probe(port, str(cert) if cert else None), timeout,
                        f"Azurite on {LOOPBACK}:{port}")
        except BaseException:
            proc.stop()
            raise
        scheme = "https" if cert else "http"
        endpoint = f"{scheme}://{LOOPBACK}:{port}/{AZURITE_ACCOUNT_NAME}"
        service = AzuriteService(
            blob_endpoint=endpoint,
            account_name=AZURITE_ACCOUNT_NAME,
            account_key=AZURITE_ACCOUNT_KEY,
            connection_string=(
                f"DefaultEndpointsProtocol={scheme};"
                f"AccountName={AZURITE_ACCOUNT_NAME};"
                "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;"  # == AZURITE_ACCOUNT_KEY
                f"BlobEndpoint={endpoint};"
            ),
            port=port,
            pid=proc.pid,
            location=str(location),
            log_path=str(proc.log_path),
        )
        return proc, service

    proc, service = _start_with_retries(start_once)
    try:
        yield service
    finally:
        proc.stop()


# --------------------------------------------------------------------------- etcd


@dataclasses.dataclass(frozen=True)
class EtcdService:
    endpoint: str  # 127.0.0.1:PORT (what torchrun's etcd rendezvous wants)
    client_url: str  # http://127.0.0.1:PORT
    pid: int
    peer_url: str = ""
    data_dir: str = ""
    log_path: str = ""

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])


def etcd_binary() -> str:
    """The etcd the local cluster runs (``ETCD_BIN``, PATH)."""
    return _product_binary(components.etcd_binary)


def _etcd_probe(client_url: str) -> Callable[[], bool]:
    def probe() -> bool:
        status, _, body = http_request("GET", f"{client_url}/v2/keys/", timeout=2)
        if status == 200:
            return True
        if status == 404:
            raise ServiceError(
                f"etcd at {client_url} answers but GET /v2/keys/ is 404: the v2 API is off. "
                "The tests need etcd 3.4/3.5 started with --enable-v2 (etcd 3.6 dropped v2)."
            )
        raise RuntimeError(f"GET /v2/keys/ -> {status} {body[:200]!r}")

    return probe


@contextlib.contextmanager
def start_etcd(
    tmpdir: os.PathLike | str, *, name: str = "test", timeout: float = START_TIMEOUT_S
) -> Iterator[EtcdService]:
    """Run a one-member etcd (v2 API on) with its data in ``tmpdir``; yield an :class:`EtcdService`."""
    binary = etcd_binary()
    workdir = Path(tmpdir)
    workdir.mkdir(parents=True, exist_ok=True)

    def start_once(attempt: int) -> tuple[ManagedProcess, EtcdService]:
        client_port, peer_port = free_ports(2)
        client_url = f"http://{LOOPBACK}:{client_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        data_dir = workdir / f"etcd-data-{attempt}"
        argv = components.etcd_argv(binary, name=name, data_dir=data_dir, client_port=client_port,
                                    peer_port=peer_port)
        proc = ManagedProcess("etcd", argv, workdir / f"etcd-{attempt}.log", env=components.etcd_env(os.environ),
                              cwd=workdir)
        try:
            _wait_ready(proc, _etcd_probe(client_url), timeout, f"etcd on {LOOPBACK}:{client_port}")
        except BaseException:
            proc.stop()
            raise
        service = EtcdService(
            endpoint=f"{LOOPBACK}:{client_port}",
            client_url=client_url,
            pid=proc.pid,
            peer_url=peer_url,
            data_dir=str(data_dir),
            log_path=str(proc.log_path),
        )
        return proc, service

    proc, service = _start_with_retries(start_once)
    try:
        yield service
    finally:
        proc.stop()


# --------------------------------------------------------------------------- az


DEV_EXTENSION_SOURCES = REPO_ROOT / "build" / "azext-dev"
EXTENSION_NAME = "elastictrain"


class AzCommandError(AssertionError):
    """An ``az`` command exited non-zero (raised when ``check=True``)."""

    def __init__(self, result: subprocess.CompletedProcess) -> None:
        self.result = result
        super().__init__(
            f"az exited {result.returncode}: {shlex.join(str(a) for a in result.args)}\n"
            f"--- stderr (tail) ---\n{(result.stderr or '')[-_LOG_TAIL_CHARS:]}\n"
            f"--- stdout (tail) ---\n{(result.stdout or '')[-_LOG_TAIL_CHARS:]}"
        )


def az_binary() -> str:
    """The real az: .venv/bin/az, else the one next to this Python, else PATH."""
    for cand in (REPO_ROOT / ".venv" / "bin" / "az", Path(sys.executable).parent / "az"):
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    found = shutil.which("az")
    if found:
        return found
    raise ServiceNotFound("az not found (run `bash scripts/setup.sh`)")


def az_env(config_dir: os.PathLike | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for an isolated az that loads this checkout as a dev extension.

    Every inherited ``AZURE_*`` variable is dropped (each one can change az's
    configuration); pass what a command needs in ``extra``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env.update(
        AZURE_CONFIG_DIR=str(config_dir),
        AZURE_EXTENSION_DEV_SOURCES=str(DEV_EXTENSION_SOURCES),
        AZURE_CORE_COLLECT_TELEMETRY="false",
        AZURE_CORE_NO_COLOR="true",
        AZURE_CORE_SURVEY_MESSAGE="false",
    )
    if extra:
        env.update(extra)
    return env


def check_dev_extension() -> None:
    """Fail clearly when scripts/setup.sh has not linked the dev extension."""
    ext_dir = DEV_EXTENSION_SOURCES / EXTENSION_NAME
    if not any(ext_dir.glob("*.egg-info")) or not (ext_dir / "azext_elastictrain").is_dir():
        raise ServiceNotFound(
            f"{ext_dir.relative_to(REPO_ROOT)} is missing or incomplete (run `bash scripts/setup.sh`)"
        )


class AzCli:
    """Runs the real az with an isolated config dir: ``az("elastictrain", "--help")``."""

    def __init__(self, config_dir: os.PathLike | str, az_path: str | None = None) -> None:
        self.config_dir = Path(config_dir)
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.az_path = az_path or az_binary()

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return az_env(self.config_dir, extra)

    def __call__(
        self,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [self.az_path, *[str(a) for a in args]],
            env=self.env(env),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(REPO_ROOT),
        )
        if check and result.returncode != 0:
            raise AzCommandError(result)
        return result

    def json(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> Any:
        """Run ``az ... -o json`` (must succeed) and parse its stdout."""
        result = self(*args, "-o", "json", check=True, env=env, timeout=timeout)
        try:
            return json.loads(result.stdout) if result.stdout.strip() else None
        except json.JSONDecodeError as exc:
            raise AssertionError(f"az {' '.join(args)} -o json printed non-JSON: {exc}\n{result.stdout[-2000:]}") from exc
