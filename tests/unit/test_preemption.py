"""Preemption notices against a real local Scheduled Events server on loopback.

No mocks: every test talks HTTP to ScheduledEventsServer, so the watcher and
the server are held to the same protocol a Spot VM sees from Azure IMDS.
"""
from __future__ import annotations

import calendar
import http.client
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer
from azext_elastictrain.runtime.preemption import (
    IMDS_EVENTS_URL,
    PreemptionNotice,
    PreemptionWatcher,
    parse_rfc1123,
)

POLL = 0.1
REPO_ROOT = Path(__file__).resolve().parents[2]
RFC1123 = re.compile(r"^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$")
UUID_UPPER = re.compile(r"^[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}$")


def http_call(method: str, url: str, body: Any = None,
              headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP exchange with explicit headers (no proxies, no urllib defaults)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        send_headers = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            send_headers["Content-Type"] = "application/json"
        conn.request(method, target, body=data, headers=send_headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_document(server: ScheduledEventsServer) -> dict[str, Any]:
    status, body = http_call("GET", server.url, headers={"Metadata": "true"})
    assert status == 200
    return json.loads(body)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dead_events_url() -> str:
    return f"http://127.0.0.1:{closed_port()}/metadata/scheduledevents?api-version=2020-07-01"


@pytest.fixture
def server() -> Iterator[ScheduledEventsServer]:
    with ScheduledEventsServer() as srv:
        yield srv


@pytest.fixture
def make_watcher() -> Iterator[Callable[..., PreemptionWatcher]]:
    """Started watchers that are always stopped, so no thread or handler leaks between tests."""
    watchers: list[PreemptionWatcher] = []

    def make(**kwargs: Any) -> PreemptionWatcher:
        kwargs.setdefault("poll_interval", POLL)
        kwargs.setdefault("handle_sigterm", False)
        kwargs.setdefault("vm_name", None)
        kwargs.setdefault("events_url", None)
        watcher = PreemptionWatcher(**kwargs)
        watchers.append(watcher)
        return watcher.start()

    yield make
    for watcher in watchers:
        watcher.stop()


# --- the server speaks the IMDS protocol ---------------------------------------------------


@pytest.mark.unit
def test_get_without_metadata_header_is_400_with_json_error(server: ScheduledEventsServer) -> None:
    status, body = http_call("GET", server.url)
    assert status == 400
    assert "metadata" in json.loads(body)["error"].lower()


@pytest.mark.unit
def test_get_without_api_version_is_400(server: ScheduledEventsServer) -> None:
    status, body = http_call("GET", server.url.split("?")[0], headers={"Metadata": "true"})
    assert status == 400
    assert "api-version" in json.loads(body)["error"]


@pytest.mark.unit
def test_get_returns_events_shaped_like_azure(server: ScheduledEventsServer) -> None:
    assert get_document(server)["Events"] == []
    before = time.time()
    event_id = server.post_event(["vm-a", "vm-b"], "Preempt", notice_seconds=30,
                                 description="Spot eviction")
    [event] = get_document(server)["Events"]
    assert UUID_UPPER.match(event_id)
    assert event == {
        "EventId": event_id,
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm-a", "vm-b"],
        "EventStatus": "Scheduled",
        "NotBefore": event["NotBefore"],
        "Description": "Spot eviction",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    assert RFC1123.match(event["NotBefore"])
    assert before + 29 <= parse_rfc1123(event["NotBefore"]) <= time.time() + 30


@pytest.mark.unit
def test_document_incarnation_increments_on_every_change(server: ScheduledEventsServer) -> None:
    start = get_document(server)["DocumentIncarnation"]
    event_id = server.post_event(["vm-a"])
    assert get_document(server)["DocumentIncarnation"] == start + 1
    assert get_document(server)["DocumentIncarnation"] == start + 1  # reads change nothing
    status, _ = http_call("POST", server.url, {"StartRequests": [{"EventId": event_id}]},
                          {"Metadata": "true"})
    assert status == 200
    assert get_document(server)["DocumentIncarnation"] == start + 2
    server.remove_event(event_id)
    document = get_document(server)
    assert document["DocumentIncarnation"] == start + 3
    assert document["Events"] == []


@pytest.mark.unit
def test_start_request_marks_event_started_and_records_ack_time(
        server: ScheduledEventsServer) -> None:
    event_id = server.post_event(["vm-a"])
    other_id = server.post_event(["vm-b"])
    assert server.acknowledged_at(event_id) is None
    before = time.time()
    status, _ = http_call("POST", server.url, {"StartRequests": [{"EventId": event_id}]},
                          {"Metadata": "true"})
    assert status == 200
    acked_at = server.acknowledged_at(event_id)
    assert acked_at is not None and before <= acked_at <= time.time()
    assert server.acknowledged_at(other_id) is None
    by_id = {e["EventId"]: e for e in get_document(server)["Events"]}
    assert by_id[event_id]["EventStatus"] == "Started"
    assert by_id[event_id]["NotBefore"] == ""
    assert by_id[other_id]["EventStatus"] == "Scheduled"


@pytest.mark.unit
def test_start_request_needs_metadata_header_and_known_event_ids(
        server: ScheduledEventsServer) -> None:
    event_id = server.post_event(["vm-a"])
    body = {"StartRequests": [{"EventId": event_id}]}
    assert http_call("POST", server.url, body)[0] == 400
    unknown = {"StartRequests": [{"EventId": event_id}, {"EventId": "NOT-AN-EVENT"}]}
    assert http_call("POST", server.url, unknown, {"Metadata": "true"})[0] == 400
    assert http_call("POST", server.url, {"Nope": 1}, {"Metadata": "true"})[0] == 400
    # A rejected request must not half-apply.
    assert server.acknowledged_at(event_id) is None
    assert get_document(server)["Events"][0]["EventStatus"] == "Scheduled"


@pytest.mark.unit
def test_unacknowledged_event_starts_by_itself_once_notice_runs_out(
        server: ScheduledEventsServer) -> None:
    event_id = server.post_event(["vm-a"], notice_seconds=0)
    [event] = get_document(server)["Events"]
    assert event["EventStatus"] == "Started"
    assert event["NotBefore"] == ""
    assert server.acknowledged_at(event_id) is None


@pytest.mark.unit
def test_wait_acknowledged_times_out_without_ack(server: ScheduledEventsServer) -> None:
    event_id = server.post_event(["vm-a"])
    started = time.monotonic()
    assert server.wait_acknowledged(event_id, timeout=0.2) is False
    assert time.monotonic() - started < 2.0
    with pytest.raises(KeyError):
        server.acknowledged_at("NOT-AN-EVENT")


@pytest.mark.unit
def test_admin_http_api_posts_lists_and_deletes_events(server: ScheduledEventsServer) -> None:
    assert http_call("GET", f"{server.admin_url}/health")[0] == 200
    status, body = http_call("POST", f"{server.admin_url}/events",
                             {"resources": ["vm-a"], "event_type": "Preempt",
                              "notice_seconds": 30, "description": "from admin"})
    assert status == 201
    event_id = json.loads(body)["EventId"]

    status, body = http_call("GET", f"{server.admin_url}/events")
    assert status == 200
    [listed] = json.loads(body)
    assert listed["EventId"] == event_id
    assert listed["Resources"] == ["vm-a"]
    assert listed["Description"] == "from admin"
    assert listed["Acknowledged"] is False and listed["AcknowledgedAt"] is None
    assert [e["EventId"] for e in get_document(server)["Events"]] == [event_id]

    http_call("POST", server.url, {"StartRequests": [{"EventId": event_id}]}, {"Metadata": "true"})
    [listed] = json.loads(http_call("GET", f"{server.admin_url}/events")[1])
    assert listed["Acknowledged"] is True and listed["AcknowledgedAt"] > 0

    assert http_call("DELETE", f"{server.admin_url}/events/{event_id}")[0] == 204
    assert json.loads(http_call("GET", f"{server.admin_url}/events")[1]) == []
    assert get_document(server)["Events"] == []
    assert http_call("DELETE", f"{server.admin_url}/events/{event_id}")[0] == 404


@pytest.mark.unit
@pytest.mark.parametrize("body", [
    {"resources": [], "event_type": "Preempt"},
    {"event_type": "Preempt"},
    {"resources": ["vm-a"], "event_type": "Explode"},
    {"resources": ["vm-a"], "notice_seconds": -1},
])
def test_admin_api_rejects_impossible_events(server: ScheduledEventsServer,
                                             body: dict[str, Any]) -> None:
    assert http_call("POST", f"{server.admin_url}/events", body)[0] == 400
    assert server.events() == []


@pytest.mark.unit
def test_server_module_runs_as_a_process_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen(
        [sys.executable, "-m", "azext_elastictrain.backends.local.scheduled_events",
         "--port", "0", "--port-file", str(port_file)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_until(port_file.exists, timeout=30), "server never wrote its port file"
        port = int(port_file.read_text().strip())
        base = f"http://127.0.0.1:{port}"
        assert http_call("GET", f"{base}/admin/health")[0] == 200
        status, body = http_call("POST", f"{base}/admin/events", {"resources": ["vm-a"]})
        assert status == 201
        status, body2 = http_call("GET", f"{base}/metadata/scheduledevents?api-version=2020-07-01",
                                  headers={"Metadata": "true"})
        assert status == 200
        assert json.loads(body2)["Events"][0]["EventId"] == json.loads(body)["EventId"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if proc.stderr is not None:
            proc.stderr.close()


# --- the watcher turns events into notices ---------------------------------------------------


@pytest.mark.unit
def test_parse_rfc1123_reads_imds_not_before() -> None:
    expected = calendar.timegm((2016, 9, 19, 18, 29, 47, 0, 0, 0))
    assert parse_rfc1123("Mon, 19 Sep 2016 18:29:47 GMT") == expected
    assert parse_rfc1123("") is None
    assert parse_rfc1123(None) is None
    assert parse_rfc1123("not a date") is None


@pytest.mark.unit
def test_preempt_for_this_vm_becomes_a_notice_within_two_polls(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    watcher = make_watcher(vm_name="vm-a", events_url=server.url)
    time.sleep(2 * POLL)  # let the first polls see an empty document
    assert watcher.notice() is None
    posted_at = time.time()
    event_id = server.post_event(["vm-b", "vm-a"], "Preempt", notice_seconds=30,
                                 description="Spot eviction")
    assert wait_until(lambda: watcher.notice() is not None)
    notice = watcher.notice()
    assert notice is not None
    assert notice.received_at - posted_at <= 2 * POLL + 0.5
    assert notice.source == "scheduled-events"
    assert notice.event_id == event_id
    assert notice.event_type == "Preempt"
    assert notice.description == "Spot eviction"
    [event] = server.events()
    assert notice.not_before == parse_rfc1123(event["NotBefore"])
    assert 28 <= notice.seconds_left() <= 30


@pytest.mark.unit
def test_watcher_ignores_other_vms_and_non_preempting_events(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    server.post_event(["vm-b"], "Preempt")
    server.post_event(["vm-a"], "Freeze")
    server.post_event(["vm-a"], "Reboot")
    watcher = make_watcher(vm_name="VM-A", events_url=server.url)
    time.sleep(6 * POLL)
    assert watcher.notice() is None
    # Proof it was polling all along: its own Terminate is picked up, and only that.
    terminate_id = server.post_event(["vm-a"], "Terminate")
    assert wait_until(lambda: watcher.notice() is not None)
    assert watcher.notice().event_id == terminate_id
    assert watcher.notice().event_type == "Terminate"


@pytest.mark.unit
def test_watcher_without_vm_name_takes_any_preempt(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    server.post_event(["vm-z"], "Freeze")
    event_id = server.post_event(["vm-z"], "Preempt")
    watcher = make_watcher(events_url=server.url)
    assert wait_until(lambda: watcher.notice() is not None)
    assert watcher.notice().event_id == event_id


@pytest.mark.unit
def test_vm_name_is_resolved_lazily_from_imds_compute_name(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    class ComputeName(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            ok = self.headers.get("Metadata") == "true"
            body = b"vm-a" if ok else b"{}"
            self.send_response(200 if ok else 400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    name_server = ThreadingHTTPServer(("127.0.0.1", 0), ComputeName)
    thread = threading.Thread(target=name_server.serve_forever, daemon=True)
    thread.start()
    try:
        server.post_event(["vm-b"], "Preempt")
        watcher = make_watcher(events_url=server.url, vm_name_url=(
            f"http://127.0.0.1:{name_server.server_address[1]}/metadata/instance/compute/name"
            "?api-version=2021-02-01&format=text"))
        assert wait_until(lambda: watcher.vm_name == "vm-a")
        time.sleep(3 * POLL)
        assert watcher.notice() is None
        event_id = server.post_event(["vm-a"], "Preempt")
        assert wait_until(lambda: watcher.notice() is not None)
        assert watcher.notice().event_id == event_id
    finally:
        name_server.shutdown()
        name_server.server_close()


@pytest.mark.unit
def test_unresolvable_vm_name_falls_back_to_any_vm(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    event_id = server.post_event(["someone-else"], "Preempt")
    watcher = make_watcher(events_url=server.url,
                           vm_name_url=f"http://127.0.0.1:{closed_port()}/name")
    assert wait_until(lambda: watcher.notice() is not None)
    assert watcher.notice().event_id == event_id
    assert watcher.vm_name is None


@pytest.mark.unit
def test_acknowledge_starts_the_event_on_the_server(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    other_id = server.post_event(["vm-b"], "Preempt")
    event_id = server.post_event(["vm-a"], "Preempt")
    watcher = make_watcher(vm_name="vm-a", events_url=server.url)
    assert wait_until(lambda: watcher.notice() is not None)
    before = time.time()
    watcher.acknowledge()
    assert server.wait_acknowledged(event_id, timeout=5)
    assert before <= server.acknowledged_at(event_id) <= time.time()
    assert server.acknowledged_at(other_id) is None
    by_id = {e["EventId"]: e for e in get_document(server)["Events"]}
    assert by_id[event_id]["EventStatus"] == "Started"
    assert by_id[other_id]["EventStatus"] == "Scheduled"
    assert watcher.acknowledged_event_ids == {event_id}
    # The VM is still going away: the notice stays.
    assert watcher.notice().event_id == event_id


@pytest.mark.unit
def test_restarted_worker_does_not_see_its_acked_event_as_new(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher],
        tmp_path: Path) -> None:
    state = tmp_path / "node" / "preemption.json"
    event_id = server.post_event(["vm-a"], "Preempt")
    first = make_watcher(vm_name="vm-a", events_url=server.url, acked_state_path=state)
    assert wait_until(lambda: first.notice() is not None)
    first.acknowledge()
    first.stop()
    assert json.loads(state.read_text())["acknowledged_event_ids"] == [event_id]
    assert [p.name for p in state.parent.iterdir()] == ["preemption.json"]  # no temp debris

    second = make_watcher(vm_name="vm-a", events_url=server.url, acked_state_path=str(state))
    time.sleep(5 * POLL)
    assert second.notice() is None
    assert event_id in second.acknowledged_event_ids
    # ...but a genuinely new eviction still gets through, and is persisted alongside.
    new_id = server.post_event(["vm-a"], "Preempt")
    assert wait_until(lambda: second.notice() is not None)
    assert second.notice().event_id == new_id
    second.acknowledge()
    assert sorted(json.loads(state.read_text())["acknowledged_event_ids"]) == sorted(
        [event_id, new_id])


@pytest.mark.unit
def test_sigterm_records_a_notice_keeps_running_and_handler_is_restored() -> None:
    previous_calls: list[int] = []

    def previous_handler(signum: int, frame: Any) -> None:
        previous_calls.append(signum)

    original = signal.signal(signal.SIGTERM, previous_handler)
    try:
        watcher = PreemptionWatcher(vm_name=None, events_url=None, handle_sigterm=True).start()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            assert wait_until(lambda: watcher.notice() is not None, timeout=3)
            notice = watcher.notice()
            assert notice == PreemptionNotice(
                source="sigterm", event_id=None, event_type=None, not_before=None,
                received_at=notice.received_at, description=notice.description)
            assert previous_calls == []  # recorded, not passed on to the old handler
            watcher.acknowledge()  # nothing to acknowledge for a signal: a no-op
        finally:
            watcher.stop()
        assert signal.getsignal(signal.SIGTERM) is previous_handler
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(lambda: previous_calls == [signal.SIGTERM], timeout=3)
    finally:
        signal.signal(signal.SIGTERM, original)


@pytest.mark.unit
def test_scheduled_event_supersedes_sigterm_so_it_can_be_acknowledged(
        server: ScheduledEventsServer) -> None:
    original = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher(vm_name="vm-a", events_url=server.url, poll_interval=POLL)
    try:
        watcher.start()
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_until(lambda: watcher.notice() is not None, timeout=3)
        assert watcher.notice().source == "sigterm"
        event_id = server.post_event(["vm-a"], "Preempt")
        assert wait_until(lambda: watcher.notice().source == "scheduled-events")
        watcher.acknowledge()
        assert server.wait_acknowledged(event_id, timeout=5)
    finally:
        watcher.stop()
        signal.signal(signal.SIGTERM, original)
    assert signal.getsignal(signal.SIGTERM) is original


@pytest.mark.unit
def test_sigterm_is_left_alone_when_started_outside_main_thread() -> None:
    before = signal.getsignal(signal.SIGTERM)
    watcher = PreemptionWatcher(vm_name=None, events_url=None, handle_sigterm=True)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            watcher.start()
            watcher.stop()
        except BaseException as exc:  # surfaced below; a thread would swallow it
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=5)
    assert errors == []
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.unit
def test_dead_endpoint_never_raises_and_gives_no_notice(
        make_watcher: Callable[..., PreemptionWatcher], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="azext_elastictrain.runtime.preemption")
    watcher = make_watcher(vm_name="vm-a", events_url=dead_events_url())
    time.sleep(8 * POLL)
    assert watcher.notice() is None
    failures = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(failures) >= 2  # it kept retrying...
    assert [r.levelno for r in failures].count(logging.INFO) == 1  # ...but said so once
    watcher.acknowledge()
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 1.5  # stop wakes the backoff sleep


@pytest.mark.unit
def test_watcher_keeps_polling_until_a_late_imds_comes_up(
        make_watcher: Callable[..., PreemptionWatcher]) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}/metadata/scheduledevents?api-version=2020-07-01"
    watcher = make_watcher(vm_name="vm-a", events_url=url)
    time.sleep(5 * POLL)
    with ScheduledEventsServer(port=port) as late:
        event_id = late.post_event(["vm-a"], "Preempt")
        assert wait_until(lambda: watcher.notice() is not None, timeout=8)
        assert watcher.notice().event_id == event_id


@pytest.mark.unit
def test_stop_is_prompt_with_a_long_poll_interval(
        server: ScheduledEventsServer, make_watcher: Callable[..., PreemptionWatcher]) -> None:
    watcher = make_watcher(vm_name="vm-a", events_url=server.url, poll_interval=30.0)
    time.sleep(0.2)
    started = time.monotonic()
    watcher.stop()
    assert time.monotonic() - started < 1.0


# --- configuration from the environment ------------------------------------------------------


@pytest.mark.unit
def test_from_env_defaults_to_real_imds() -> None:
    watcher = PreemptionWatcher.from_env({})
    assert watcher.events_url == IMDS_EVENTS_URL
    assert watcher.vm_name is None
    assert watcher.poll_interval == 1.0
    assert watcher.acked_state_path is None


@pytest.mark.unit
def test_from_env_reads_url_vm_poll_and_state(tmp_path: Path) -> None:
    state = str(tmp_path / "acked.json")
    watcher = PreemptionWatcher.from_env({
        "ELASTICTRAIN_SCHEDULED_EVENTS_URL": "http://127.0.0.1:9/metadata/scheduledevents?x=1",
        "ELASTICTRAIN_VM_NAME": "aks-spot-123_4",
        "ELASTICTRAIN_PREEMPTION_POLL_SECONDS": "0.25",
        "ELASTICTRAIN_PREEMPTION_STATE": state,
    })
    assert watcher.events_url == "http://127.0.0.1:9/metadata/scheduledevents?x=1"
    assert watcher.vm_name == "aks-spot-123_4"
    assert watcher.poll_interval == 0.25
    assert watcher.acked_state_path == state


@pytest.mark.unit
def test_from_env_off_disables_polling() -> None:
    watcher = PreemptionWatcher.from_env({"ELASTICTRAIN_SCHEDULED_EVENTS_URL": "off",
                                          "ELASTICTRAIN_VM_NAME": "vm-a"})
    assert watcher.events_url is None
    with watcher:
        assert watcher.notice() is None
        assert not any(t.name == "preemption-watcher" and t.is_alive()
                       for t in threading.enumerate())


@pytest.mark.unit
@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_from_env_rejects_bad_poll_seconds(value: str) -> None:
    with pytest.raises(ValueError, match="ELASTICTRAIN_PREEMPTION_POLL_SECONDS"):
        PreemptionWatcher.from_env({"ELASTICTRAIN_PREEMPTION_POLL_SECONDS": value})
