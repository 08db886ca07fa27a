"""How a replica that is behind gets the live state from a peer: torchft's checkpoint transport, in a safe format.

torchft's own transports unpickle what a peer sends (``HTTPTransport`` loads with ``weights_only=False``,
``PGTransport`` ``pickle.loads`` its metadata), so any process that can reach the port could run code in the
receiver. This one sends what the runtime's state shapes are made of (runtime/state.py: tensors and JSON values,
in dicts and lists) with ``torch.save`` and reads it back with ``torch.load(weights_only=True)``, torch's
restricted unpickler that builds tensors and plain containers only.

The sender serialises the state when the quorum asks for it (``send_checkpoint``, at a step boundary before its
next optimizer step), so the bytes served are that step's state even while it trains on; the receiver polls until
the peer has it or the transfer's timeout passes. That timeout is the transport's own (runtime/replicas.py sizes it
to the state): torchft passes its Manager's, which knows nothing of the state's size.

What it serves is the whole model and optimizer state, so the server listens on the node's own address only (the
pod's IP on AKS, loopback locally) and answers 403 to a request without the job's secret (``Authorization: Bearer
<secret>``, compared in constant time): on AKS the job's Kubernetes Secret, locally a file of the job's
(``job_secret``). The NetworkPolicy of the job's workers keeps other pods away from the port in the first place.
"""
from __future__ import annotations

import hmac
import io
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torchft.checkpointing import CheckpointTransport

from azext_elastictrain.core import launch

PATH = "/elastictrain/state/"


class JobSecretMissing(RuntimeError):
    """The in-process mode's state server needs the job's secret, and the environment gives none."""


def job_secret(env: Mapping[str, str]) -> str:
    """The job's secret: ``launch.ENV_JOB_SECRET`` (AKS: from the job's Secret), else the content of the file
    ``launch.ENV_JOB_SECRET_FILE`` names (local jobs). Without one the state server cannot run guarded: refused."""
    value = env.get(launch.ENV_JOB_SECRET, "").strip()
    path = env.get(launch.ENV_JOB_SECRET_FILE, "")
    if not value and path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as ex:
            raise JobSecretMissing(f"the job's secret file {path} cannot be read: {ex}") from ex
    if not value:
        raise JobSecretMissing(
            f"in-process recovery serves the model to the job's peers only with the job's secret: set "
            f"{launch.ENV_JOB_SECRET} or {launch.ENV_JOB_SECRET_FILE} ('az elastictrain job run' does)")
    return value


class PeerTransport(CheckpointTransport):
    """Serves this replica's state for one step over HTTP; fetches a peer's."""

    def __init__(self, host: str, *, timeout: Callable[[], timedelta], secret: str, bind: str) -> None:
        if not secret:
            raise JobSecretMissing("the state server needs the job's secret")
        self._host = host
        self._timeout = timeout
        self._authorization = f"Bearer {secret}".encode()
        self._payload: tuple[int, bytes] | None = None
        self.sent = 0  # states offered to a replica behind (send_checkpoint calls): what the quorum event reports
        self._lock = threading.Lock()
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not transport.admits(self.headers.get("Authorization", "")):
                    self.send_error(403, "the job's secret is required")
                    return
                payload = transport.served(self.path)
                if payload is None:
                    self.send_error(503, "no state for this step yet")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:  # one line per request on stderr is noise here
                pass

        self._server = ThreadingHTTPServer((bind, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="elastictrain-peer-state", daemon=True).start()

    def admits(self, authorization: str) -> bool:
        """Whether a request's Authorization header carries the job's secret (constant-time comparison)."""
        return hmac.compare_digest(authorization.encode(), self._authorization)

    def served(self, path: str) -> bytes | None:
        """The bytes of the state asked for by ``path`` (its step), if this replica offers that step now."""
        with self._lock:
            if self._payload is None or path != f"{PATH}{self._payload[0]}":
                return None
            return self._payload[1]

    def metadata(self) -> str:
        return f"http://{self._host}:{self._server.server_address[1]}"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        buffer = io.BytesIO()
        torch.save(state_dict, buffer)
        with self._lock:
            self._payload = (step, buffer.getvalue())
            self.sent += 1

    def disallow_checkpoint(self) -> None:
        with self._lock:
            self._payload = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        deadline = time.monotonic() + self._timeout().total_seconds()  # not torchft's timeout: see the docstring
        url = f"{metadata}{PATH}{step}"
        while True:
            try:
                request = urllib.request.Request(url, headers={"Authorization": self._authorization.decode()})
                with urllib.request.urlopen(request, timeout=max(0.1, deadline - time.monotonic())) as response:
                    data = response.read()
                return torch.load(io.BytesIO(data), weights_only=True)
            except urllib.error.HTTPError as ex:
                if ex.code != 503 or time.monotonic() >= deadline:
                    raise
            time.sleep(0.02)

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
