"""A local Azure Instance Metadata Service (IMDS) Scheduled Events server.

Why it exists: Spot evictions on Azure announce themselves through IMDS
Scheduled Events (a ``Preempt`` event with >= 30 s of notice).  Nothing outside
Azure serves that endpoint, so tests and the local cluster run this server to
give the training runtime the same protocol it meets on a real VM:

* ``GET  /metadata/scheduledevents?api-version=...`` with ``Metadata: true``
  returns ``{"DocumentIncarnation": int, "Events": [...]}``;
* ``POST /metadata/scheduledevents?api-version=...`` with
  ``{"StartRequests": [{"EventId": "..."}]}`` acknowledges events.

An admin API (not part of Azure) lets the local cluster and tests schedule and
remove events over HTTP: ``POST /admin/events``, ``GET /admin/events``,
``DELETE /admin/events/{id}``, ``GET /admin/health``.

Like Azure, an event that nobody acknowledges starts by itself once its
NotBefore time has passed (status ``Started``, NotBefore empty); the admin
listing tells the two cases apart through ``AcknowledgedAt``.

Stdlib only on purpose: the local cluster starts it as a background process
(``python -m azext_elastictrain.backends.local.scheduled_events --port 0 --port-file F``)
and it must never pull in torch or the Azure SDKs.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import AF_INET6
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from azext_elastictrain.core.constants import AZURE_NOTICE_SECONDS

EVENTS_PATH = "/metadata/scheduledevents"
API_VERSION = "2020-07-01"
ADMIN_PATH = "/admin"
EVENT_TYPES = frozenset({"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"})
MAX_BODY_BYTES = 64 * 1024


def format_rfc1123(timestamp: float) -> str:
    """Format epoch seconds the way IMDS writes NotBefore ("Mon, 19 Sep 2016 18:29:47 GMT")."""
    return formatdate(timestamp, usegmt=True)


@dataclass
class _Event:  # pylint: disable=too-many-instance-attributes  # fields of an IMDS event
    """One scheduled event; mutable, and only touched under the store's lock."""

    event_id: str
    event_type: str
    resources: tuple[str, ...]
    not_before: float
    description: str
    created_at: float
    started_at: float | None = None
    acknowledged_at: float | None = None

    def azure_view(self) -> dict[str, Any]:
        """The event exactly as IMDS shows it to a VM."""
        started = self.started_at is not None
        return {
            "EventId": self.event_id,
            "EventType": self.event_type,
            "ResourceType": "VirtualMachine",
            "Resources": list(self.resources),
            "EventStatus": "Started" if started else "Scheduled",
            "NotBefore": "" if started else format_rfc1123(self.not_before),
            "Description": self.description,
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }

    def admin_view(self) -> dict[str, Any]:
        """The Azure view plus what only the operator of the fake needs to see."""
        view = self.azure_view()
        view.update(
            NotBeforeEpoch=self.not_before,
            CreatedAt=self.created_at,
            Acknowledged=self.acknowledged_at is not None,
            AcknowledgedAt=self.acknowledged_at,
        )
        return view


class UnknownEventError(KeyError):
    """Raised for an EventId the server does not hold (never posted, or removed)."""


class ScheduledEventStore:
    """Thread-safe event list with Azure's DocumentIncarnation semantics.

    Kept apart from HTTP so the Python API and the HTTP handlers share one
    source of truth and one lock.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._events: dict[str, _Event] = {}
        self._incarnation = 0

    def add(self, resources: list[str], event_type: str, notice_seconds: float,
            description: str) -> str:
        """Schedule an event and return its EventId (upper-case UUID, like Azure)."""
        _validate_event(resources, event_type, notice_seconds, description)
        now = time.time()
        event = _Event(
            event_id=str(uuid.uuid4()).upper(),
            event_type=event_type,
            resources=tuple(resources),
            not_before=now + notice_seconds,
            description=description,
            created_at=now,
        )
        with self._changed:
            self._events[event.event_id] = event
            self._bump()
        return event.event_id

    def start(self, event_ids: list[str]) -> None:
        """Acknowledge events: all or none, so a bad id leaves nothing half-applied."""
        with self._changed:
            missing = [eid for eid in event_ids if eid not in self._events]
            if missing:
                raise UnknownEventError(", ".join(missing))
            now = time.time()
            changed = False
            for event_id in event_ids:
                event = self._events[event_id]
                if event.acknowledged_at is None:
                    event.acknowledged_at = now
                if event.started_at is None:
                    event.started_at = now
                    changed = True
            if changed:
                self._bump()
            self._changed.notify_all()

    def remove(self, event_id: str) -> None:
        """Forget an event, as Azure does once the VM it concerned is gone."""
        with self._changed:
            if self._events.pop(event_id, None) is None:
                raise UnknownEventError(event_id)
            self._bump()

    def document(self) -> dict[str, Any]:
        """The body of a GET on the scheduledevents endpoint."""
        with self._changed:
            self._start_overdue()
            return {
                "DocumentIncarnation": self._incarnation,
                "Events": [event.azure_view() for event in self._events.values()],
            }

    def listing(self) -> list[dict[str, Any]]:
        """Every event with its acknowledgment state, for the admin API."""
        with self._changed:
            self._start_overdue()
            return [event.admin_view() for event in self._events.values()]

    def acknowledged_at(self, event_id: str) -> float | None:
        """When the VM acknowledged the event (time.time()), or None if it has not."""
        with self._changed:
            return self._get(event_id).acknowledged_at

    def wait_acknowledged(self, event_id: str, timeout: float) -> bool:
        """Block until the event is acknowledged; False on timeout or if it was removed."""
        with self._changed:
            self._get(event_id)

            def settled() -> bool:
                event = self._events.get(event_id)
                return event is None or event.acknowledged_at is not None

            self._changed.wait_for(settled, timeout=timeout)
            event = self._events.get(event_id)
            return event is not None and event.acknowledged_at is not None

    def _get(self, event_id: str) -> _Event:
        event = self._events.get(event_id)
        if event is None:
            raise UnknownEventError(event_id)
        return event

    def _start_overdue(self) -> None:
        """Start events whose notice ran out: Azure does not wait for an ack forever."""
        now = time.time()
        overdue = [e for e in self._events.values()
                   if e.started_at is None and e.not_before <= now]
        for event in overdue:
            event.started_at = now
        if overdue:
            self._bump()

    def _bump(self) -> None:
        self._incarnation += 1
        self._changed.notify_all()


def _validate_event(resources: Any, event_type: Any, notice_seconds: Any,
                    description: Any) -> None:
    """Reject what Azure would never send, so tests cannot build impossible documents."""
    if (not isinstance(resources, list) or not resources
            or not all(isinstance(name, str) and name for name in resources)):
        raise ValueError("resources must be a non-empty list of VM names")
    if event_type not in EVENT_TYPES:
        raise ValueError(f"event_type must be one of {sorted(EVENT_TYPES)}")
    if (isinstance(notice_seconds, bool) or not isinstance(notice_seconds, (int, float))
            or notice_seconds < 0):
        raise ValueError("notice_seconds must be a number >= 0")
    if not isinstance(description, str):
        raise ValueError("description must be a string")


class _ImdsHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that carries the store and accepts IPv6 hosts."""

    daemon_threads = True

    def __init__(self, host: str, port: int, store: ScheduledEventStore) -> None:
        if ":" in host:
            self.address_family = AF_INET6
        self.store = store
        super().__init__((host, port), _ImdsRequestHandler)


class _ImdsRequestHandler(BaseHTTPRequestHandler):
    """Speaks the IMDS Scheduled Events protocol plus the admin API."""

    server: _ImdsHTTPServer
    server_version = "LocalIMDS/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Silenced: a poller hits this several times a second."""

    def do_GET(self) -> None:  # noqa: N802
        path, query = self._split()
        if path == EVENTS_PATH:
            if self._imds_request_ok(query):
                self._send_json(HTTPStatus.OK, self.server.store.document())
        elif path == f"{ADMIN_PATH}/health":
            self._send_json(HTTPStatus.OK, {"status": "ok"})
        elif path == f"{ADMIN_PATH}/events":
            self._send_json(HTTPStatus.OK, self.server.store.listing())
        else:
            self._send_error(HTTPStatus.NOT_FOUND, "Not found")

    def do_POST(self) -> None:  # noqa: N802
        path, query = self._split()
        if path == EVENTS_PATH:
            if self._imds_request_ok(query):
                self._start_events()
        elif path == f"{ADMIN_PATH}/events":
            self._create_event()
        else:
            self._send_error(HTTPStatus.NOT_FOUND, "Not found")

    def do_DELETE(self) -> None:  # noqa: N802
        path, _ = self._split()
        prefix = f"{ADMIN_PATH}/events/"
        if not path.startswith(prefix) or len(path) == len(prefix):
            self._send_error(HTTPStatus.NOT_FOUND, "Not found")
            return
        try:
            self.server.store.remove(path[len(prefix):])
        except UnknownEventError:
            self._send_error(HTTPStatus.NOT_FOUND, "Unknown EventId")
            return
        self._send_empty(HTTPStatus.NO_CONTENT)

    def _split(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        return parts.path.rstrip("/") or "/", parse_qs(parts.query)

    def _imds_request_ok(self, query: dict[str, list[str]]) -> bool:
        """Apply IMDS's own request checks, answering 400 like Azure when they fail."""
        if self.headers.get("Metadata", "").strip().lower() != "true":
            self._send_error(HTTPStatus.BAD_REQUEST,
                             "Bad request. Required metadata header not specified")
            return False
        if not query.get("api-version", [""])[0]:
            self._send_error(HTTPStatus.BAD_REQUEST,
                             "Bad request. api-version was not specified in the request")
            return False
        return True

    def _start_events(self) -> None:
        body = self._read_json()
        requests = body.get("StartRequests") if isinstance(body, dict) else None
        if (not isinstance(requests, list) or not all(
                isinstance(r, dict) and isinstance(r.get("EventId"), str) for r in requests)):
            self._send_error(HTTPStatus.BAD_REQUEST,
                             'Bad request. Expected {"StartRequests": [{"EventId": "..."}]}')
            return
        try:
            self.server.store.start([r["EventId"] for r in requests])
        except UnknownEventError as exc:
            self._send_error(HTTPStatus.BAD_REQUEST, f"Bad request. Unknown EventId {exc}")
            return
        self._send_empty(HTTPStatus.OK)

    def _create_event(self) -> None:
        body = self._read_json()
        if not isinstance(body, dict):
            self._send_error(HTTPStatus.BAD_REQUEST, "Expected a JSON object")
            return
        try:
            event_id = self.server.store.add(
                body.get("resources"),  # type: ignore[arg-type]  # the store refuses what is no list of names
                body.get("event_type", "Preempt"),
                body.get("notice_seconds", AZURE_NOTICE_SECONDS),
                body.get("description", ""),
            )
        except ValueError as exc:
            self._send_error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._send_json(HTTPStatus.CREATED, {"EventId": event_id})

    def _read_json(self) -> Any:
        """The request body as JSON, or None when it is missing, too big or malformed."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if length <= 0 or length > MAX_BODY_BYTES:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            return None

    def _send_json(self, status: HTTPStatus, payload: Any) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_empty(self, status: HTTPStatus) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_error(self, status: HTTPStatus, message: str) -> None:
        self._send_json(status, {"error": message})


class ScheduledEventsServer:
    """A Scheduled Events endpoint on loopback, served from a daemon thread.

    Use it as a context manager in tests; the local cluster runs the module's
    ``__main__`` instead and drives it through the admin API.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._store = ScheduledEventStore()
        self._httpd: _ImdsHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "ScheduledEventsServer":
        """Bind and serve; returns self so ``ScheduledEventsServer().start()`` chains."""
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._httpd = _ImdsHTTPServer(self._host, self._port, self._store)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
            name="scheduled-events-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5.0)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> "ScheduledEventsServer":
        return self.start() if self._httpd is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (useful with port=0)."""
        return int(self._running().server_address[1])

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        host = str(self._running().server_address[0])
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """What a client polls: the scheduledevents URL including api-version."""
        return f"{self.base_url}{EVENTS_PATH}?api-version={API_VERSION}"

    @property
    def admin_url(self) -> str:
        """Root of the admin API (``{admin_url}/events``, ``{admin_url}/health``)."""
        return f"{self.base_url}{ADMIN_PATH}"

    def post_event(self, resources: list[str] | str, event_type: str = "Preempt",
                   notice_seconds: float = AZURE_NOTICE_SECONDS, description: str = "") -> str:
        """Schedule an event for the given VM names; returns its EventId."""
        if isinstance(resources, str):
            raise ValueError("resources must be a list of VM names, not a string")
        return self._store.add(list(resources), event_type, notice_seconds, description)

    def acknowledged_at(self, event_id: str) -> float | None:
        """time.time() of the VM's acknowledgment, None if not yet; KeyError if unknown."""
        return self._store.acknowledged_at(event_id)

    def wait_acknowledged(self, event_id: str, timeout: float) -> bool:
        """Wait for the acknowledgment; False on timeout or removal, KeyError if unknown."""
        return self._store.wait_acknowledged(event_id, timeout)

    def remove_event(self, event_id: str) -> None:
        """Drop an event (the VM is gone); KeyError if unknown."""
        self._store.remove(event_id)

    def events(self) -> list[dict[str, Any]]:
        """Every event as the admin API lists it (Azure fields + acknowledgment state)."""
        return self._store.listing()

    def _running(self) -> _ImdsHTTPServer:
        if self._httpd is None:
            raise RuntimeError("server is not running; call start() first")
        return self._httpd


def _write_port_file(path: str, port: int) -> None:
    """Write atomically so a reader polling for the file never sees it half written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".port-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(f"{port}\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m azext_elastictrain.backends.local.scheduled_events",
        description="Serve a local Azure IMDS Scheduled Events endpoint until SIGTERM/SIGINT.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the server in the foreground; the local cluster starts it this way."""
    args = _parse_args(argv)
    stop_requested = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with ScheduledEventsServer(args.host, args.port) as server:
        if args.port_file:
            _write_port_file(args.port_file, server.port)
        print(f"scheduled events: {server.url}", file=sys.stderr, flush=True)
        while not stop_requested.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
