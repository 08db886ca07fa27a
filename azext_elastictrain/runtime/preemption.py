"""Preemption notices for training workers: SIGTERM and Azure Scheduled Events.

Why: a Spot VM gets >= 30 s of warning through IMDS Scheduled Events (a
``Preempt`` event) before Azure takes it away, and AKS may kill pods without
ever sending SIGTERM.  Workers therefore watch both: a SIGTERM handler that
only *records* the notice (so training can still finish its checkpoint) and a
daemon thread that polls IMDS.  The training loop checks ``notice()`` every
step, agrees with the other ranks to checkpoint, saves, then calls
``acknowledge()`` so Azure releases the VM sooner and the remaining nodes
re-rendezvous earlier.

Stdlib only and no torch: this module is imported by every worker and must
stay cheap and dependency-free.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import timezone
from email.utils import parsedate_to_datetime
from types import FrameType, TracebackType
from typing import Any, Mapping

from azext_elastictrain.core import launch

logger = logging.getLogger(__name__)

IMDS_EVENTS_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
IMDS_VM_NAME_URL = ("http://169.254.169.254/metadata/instance/compute/name"
                    "?api-version=2021-02-01&format=text")
PREEMPTING_EVENT_TYPES = frozenset({"Preempt", "Terminate"})
MAX_BACKOFF_SECONDS = 10.0
VM_NAME_ATTEMPTS = 3

# The launcher sets these (core/launch.py names every variable the runtime reads, for both backends).
ENV_EVENTS_URL = launch.ENV_SCHEDULED_EVENTS_URL
ENV_VM_NAME = launch.ENV_VM_NAME
ENV_POLL_SECONDS = launch.ENV_PREEMPTION_POLL_SECONDS
ENV_STATE = launch.ENV_PREEMPTION_STATE

SOURCE_SIGTERM = "sigterm"
SOURCE_SCHEDULED_EVENTS = "scheduled-events"

# What a failed IMDS exchange can raise; URLError/HTTPError/timeouts are OSError,
# a truncated response is an HTTPException, a garbage body a ValueError.
_REQUEST_ERRORS = (OSError, ValueError, http.client.HTTPException)


def parse_rfc1123(text: str | None) -> float | None:
    """Epoch seconds from an IMDS NotBefore ("Mon, 19 Sep 2016 18:29:47 GMT").

    None for an empty value (IMDS blanks NotBefore once an event has started)
    or anything unparseable: a bad date must never stop the watcher.
    """
    if not text or not text.strip():
        return None
    try:
        parsed = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


@dataclass(frozen=True)
class PreemptionNotice:
    """This worker is about to lose its VM (or was told to stop)."""

    source: str  # SOURCE_SIGTERM or SOURCE_SCHEDULED_EVENTS
    event_id: str | None
    event_type: str | None
    not_before: float | None  # epoch seconds; None when unknown or already started
    received_at: float
    description: str

    def seconds_left(self, now: float | None = None) -> float | None:
        """Time until Azure may act, for deciding whether a checkpoint still fits."""
        if self.not_before is None:
            return None
        return self.not_before - (time.time() if now is None else now)


def _imds_opener() -> urllib.request.OpenerDirector:
    """An opener that ignores HTTP(S)_PROXY: IMDS must never be reached through a proxy."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _imds_request(opener: urllib.request.OpenerDirector, url: str, timeout: float,
                  body: dict[str, Any] | None = None) -> bytes:
    """GET (or POST a JSON body to) an IMDS URL with the mandatory Metadata header."""
    headers = {"Metadata": "true"}
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers,
                                     method="GET" if data is None else "POST")
    with opener.open(request, timeout=timeout) as response:
        payload: bytes = response.read()  # urllib types the response as Any
        return payload


def _concerns(event: dict[str, Any], vm_name: str | None) -> bool:
    """Whether an event preempts this VM (any VM when the name is unknown)."""
    if event.get("EventType") not in PREEMPTING_EVENT_TYPES:
        return False
    if vm_name is None:
        return True
    resources = event.get("Resources") or []
    # Azure VM names are case-insensitive.
    return vm_name.casefold() in {r.casefold() for r in resources if isinstance(r, str)}


def select_notice(document: Any, vm_name: str | None,
                  acknowledged: frozenset[str]) -> PreemptionNotice | None:
    """The most urgent preempting event for this VM in an IMDS document, if any.

    Events we already acknowledged are skipped: the VM stays up a little after
    the ack, and a restarted worker must not mistake it for a new notice.
    """
    events = document.get("Events") if isinstance(document, dict) else None
    if not isinstance(events, list):
        return None
    candidates = [
        e for e in events
        if isinstance(e, dict) and isinstance(e.get("EventId"), str)
        and e["EventId"] not in acknowledged and _concerns(e, vm_name)
    ]
    if not candidates:
        return None
    # A started event (blank NotBefore) is the most urgent of all.
    event = min(candidates, key=lambda e: parse_rfc1123(e.get("NotBefore")) or 0.0)
    return PreemptionNotice(
        source=SOURCE_SCHEDULED_EVENTS,
        event_id=event["EventId"],
        event_type=event.get("EventType"),
        not_before=parse_rfc1123(event.get("NotBefore")),
        received_at=time.time(),
        description=str(event.get("Description") or ""),
    )


def load_acknowledged(path: str | None) -> set[str]:
    """Event ids acknowledged on this VM by earlier workers; empty if none or unreadable."""
    if path is None:
        return set()
    try:
        with open(path, encoding="utf-8") as handle:
            ids = json.load(handle).get("acknowledged_event_ids", [])
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, AttributeError) as exc:
        logger.warning("ignoring unreadable preemption state %s: %s", path, exc)
        return set()
    return {i for i in ids if isinstance(i, str)}


def save_acknowledged(path: str, event_ids: set[str]) -> None:
    """Merge ids into the state file atomically (temp file + os.replace).

    Merging keeps ids that other ranks on the same VM wrote meanwhile; the
    atomic replace means a worker killed mid-write never leaves a torn file.
    """
    merged = sorted(load_acknowledged(path) | event_ids)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".preemption-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"acknowledged_event_ids": merged}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _env_poll_seconds(environ: Mapping[str, str]) -> float:
    """Read the poll interval, failing loudly at start-up rather than mid-training."""
    raw = environ.get(ENV_POLL_SECONDS, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_POLL_SECONDS} must be a number of seconds, got {raw!r}") from None
    if not value > 0:  # pylint: disable=unnecessary-negation  # NaN is refused too
        raise ValueError(f"{ENV_POLL_SECONDS} must be > 0, got {raw!r}")
    return value


class PreemptionWatcher:  # pylint: disable=too-many-instance-attributes  # its state is one watcher's
    """Turns SIGTERM and IMDS Scheduled Events into one cheap ``notice()`` check.

    Call order: ``start()`` once in the worker's main thread, ``notice()`` every
    step, ``acknowledge()`` after the preemption checkpoint is safe, ``stop()``
    at exit (or use it as a context manager).  A scheduled-events notice
    supersedes a SIGTERM one, because only it can be acknowledged.
    """

    def __init__(self, vm_name: str | None, events_url: str | None, *,
                 poll_interval: float = 1.0, handle_sigterm: bool = True,
                 acked_state_path: str | os.PathLike[str] | None = None,
                 request_timeout: float = 2.0, vm_name_url: str | None = None) -> None:
        """``vm_name_url``: where to look the VM name up lazily when vm_name is None
        (from_env sets it to IMDS's compute/name); if that fails, any VM's event counts."""
        if not poll_interval > 0:  # pylint: disable=unnecessary-negation  # NaN is refused too
            raise ValueError("poll_interval must be > 0")
        self._vm_name = vm_name
        self._vm_name_url = vm_name_url if vm_name is None else None
        self._vm_name_attempts = 0
        self._events_url = events_url
        self._poll_interval = float(poll_interval)
        self._handle_sigterm = handle_sigterm
        self._state_path = os.fspath(acked_state_path) if acked_state_path is not None else None
        self._request_timeout = request_timeout
        self._opener = _imds_opener()
        self._lock = threading.Lock()  # guards _acked only; never taken in the signal handler
        self._acked: set[str] = set()
        # Written by one party each (poll thread / signal handler), read lock-free.
        self._scheduled_notice: PreemptionNotice | None = None
        self._sigterm_notice: PreemptionNotice | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_sigterm: Any = None
        self._sigterm_installed = False
        self._unreachable = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "PreemptionWatcher":
        """Configure from ELASTICTRAIN_* variables, so the launcher, not the script, decides."""
        url = environ.get(ENV_EVENTS_URL, "").strip() or IMDS_EVENTS_URL
        events_url = None if url.lower() == "off" else url
        vm_name = environ.get(ENV_VM_NAME, "").strip() or None
        on_azure = events_url == IMDS_EVENTS_URL
        return cls(
            vm_name,
            events_url,
            poll_interval=_env_poll_seconds(environ),
            acked_state_path=environ.get(ENV_STATE, "").strip() or None,
            vm_name_url=IMDS_VM_NAME_URL if vm_name is None and on_azure else None,
        )

    @property
    def vm_name(self) -> str | None:
        """The VM whose events count; None means any VM's (unknown or not yet resolved)."""
        return self._vm_name

    @property
    def events_url(self) -> str | None:
        """The polled Scheduled Events URL; None when polling is off."""
        return self._events_url

    @property
    def poll_interval(self) -> float:
        """Seconds between polls while IMDS answers."""
        return self._poll_interval

    @property
    def acked_state_path(self) -> str | None:
        """Where acknowledged event ids persist across worker restarts, if anywhere."""
        return self._state_path

    @property
    def acknowledged_event_ids(self) -> frozenset[str]:
        """Events acknowledged on this VM (by us or, via the state file, earlier workers)."""
        with self._lock:
            return frozenset(self._acked)

    def start(self) -> "PreemptionWatcher":
        """Install the SIGTERM handler (main thread only) and start polling."""
        if self._thread is not None or self._sigterm_installed:
            raise RuntimeError("PreemptionWatcher already started")
        with self._lock:
            self._acked |= load_acknowledged(self._state_path)
        if self._handle_sigterm:
            self._install_sigterm()
        if self._events_url:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="preemption-watcher",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling promptly and give SIGTERM back to its previous handler."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._request_timeout + 1.0)
        self._restore_sigterm()

    def __enter__(self) -> "PreemptionWatcher":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def notice(self) -> PreemptionNotice | None:
        """The current notice, if any; lock-free so it costs nothing per training step."""
        return self._scheduled_notice or self._sigterm_notice

    def notices(self) -> list[PreemptionNotice]:
        """Every notice received: a Scheduled Events one and a SIGTERM can both arrive,
        and they mean different things (the VM will go vs. this process must stop now)."""
        return [n for n in (self._scheduled_notice, self._sigterm_notice) if n is not None]

    def acknowledge(self) -> None:
        """Tell Azure the VM may go now (after the checkpoint); never raises.

        No-op for a SIGTERM notice or when there is nothing to acknowledge.
        """
        notice = self._scheduled_notice
        if notice is None or notice.event_id is None or not self._events_url:
            return
        event_id = notice.event_id
        if event_id in self.acknowledged_event_ids:
            return
        try:
            _imds_request(self._opener, self._events_url, self._request_timeout,
                          {"StartRequests": [{"EventId": event_id}]})
        except _REQUEST_ERRORS as exc:
            logger.warning("could not acknowledge scheduled event %s: %s", event_id, exc)
            return
        with self._lock:
            self._acked.add(event_id)
            acked = set(self._acked)
        logger.info("acknowledged scheduled event %s", event_id)
        self._persist(acked)

    def _persist(self, acked: set[str]) -> None:
        if self._state_path is None:
            return
        try:
            save_acknowledged(self._state_path, acked)
        except OSError as exc:
            logger.warning("could not persist preemption state to %s: %s", self._state_path, exc)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            logger.info("PreemptionWatcher started outside the main thread; SIGTERM not handled")
            return
        self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._sigterm_installed = True

    def _restore_sigterm(self) -> None:
        if not self._sigterm_installed:
            return
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                previous = self._previous_sigterm
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        except ValueError:
            logger.warning("stop() called outside the main thread; SIGTERM handler left in place")
            return
        self._sigterm_installed = False
        self._previous_sigterm = None

    def _on_sigterm(self, _signum: int, _frame: FrameType | None) -> None:
        """Record and return: raising or exiting here would lose the checkpoint.

        No locks and no logging: the handler interrupts the main thread, which
        may be holding either.
        """
        if self._sigterm_notice is None:
            self._sigterm_notice = PreemptionNotice(
                source=SOURCE_SIGTERM, event_id=None, event_type=None, not_before=None,
                received_at=time.time(), description="SIGTERM received")

    def _run(self) -> None:
        """Poll until a notice arrives or stop(); back off while IMDS is unreachable."""
        delay = self._poll_interval
        ceiling = max(MAX_BACKOFF_SECONDS, self._poll_interval)
        while not self._stopping.is_set() and self._scheduled_notice is None:
            try:
                ok = self._poll_once()
            except Exception:  # pylint: disable=broad-exception-caught  # a watcher bug must never take training down
                logger.exception("preemption watcher poll failed")
                ok = False
            backoff = min(max(delay * 2, self._poll_interval), ceiling)
            delay = self._poll_interval if ok else backoff
            self._stopping.wait(delay)

    def _poll_once(self) -> bool:
        """One GET of the events document; False when IMDS could not be read."""
        url = self._events_url
        if url is None:
            return False
        self._resolve_vm_name()
        try:
            document = json.loads(_imds_request(self._opener, url, self._request_timeout))
        except _REQUEST_ERRORS as exc:
            self._note_unreachable(exc)
            return False
        if self._unreachable:
            logger.info("scheduled events endpoint reachable again")
            self._unreachable = False
        notice = select_notice(document, self._vm_name, self.acknowledged_event_ids)
        if notice is not None:
            self._scheduled_notice = notice
            logger.warning("preemption notice: %s event %s, not before %s",
                           notice.event_type, notice.event_id, notice.not_before)
        return True

    def _note_unreachable(self, exc: BaseException) -> None:
        """Log an outage once: IMDS may come up late, and per-poll noise helps nobody."""
        if not self._unreachable:
            logger.info("scheduled events endpoint %s unreachable (%s); retrying with backoff",
                        self._events_url, exc)
            self._unreachable = True
        else:
            logger.debug("scheduled events endpoint still unreachable: %s", exc)

    def _resolve_vm_name(self) -> None:
        """Look the VM name up from IMDS a few times; after that, match any VM's events."""
        if (self._vm_name is not None or self._vm_name_url is None
                or self._vm_name_attempts >= VM_NAME_ATTEMPTS):
            return
        self._vm_name_attempts += 1
        try:
            name = _imds_request(self._opener, self._vm_name_url,
                                 self._request_timeout).decode("utf-8").strip()
        except _REQUEST_ERRORS as exc:  # UnicodeDecodeError is a ValueError
            name = ""
            logger.debug("VM name lookup failed: %s", exc)
        if name:
            self._vm_name = name
            logger.info("preemption watcher: this VM is %s", name)
        elif self._vm_name_attempts >= VM_NAME_ATTEMPTS:
            logger.info("could not resolve this VM's name; any VM's preemption counts")
