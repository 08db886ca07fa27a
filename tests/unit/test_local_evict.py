"""A local node that vanishes as an Azure Spot VM evicted without notice does: frozen (its sockets stay open, no
FIN reaches a peer), then killed (backends/local/evict.py's vanish_processes); an eviction without notice does it
by default, until the survivors trained again without the node; on real processes."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from azext_elastictrain.backends.local.evict import evict_nodes, vanish_processes

# A child that holds a connection to us open and echoes a byte every 50 ms while it runs.
_ECHO = ("import socket, sys, time\n"
         "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
         "while True:\n    s.sendall(b'x'); time.sleep(0.05)\n")


def test_a_vanished_node_is_frozen_with_its_socket_open_then_killed():
    server = socket.create_server(("127.0.0.1", 0))
    child = subprocess.Popen([sys.executable, "-c", _ECHO, str(server.getsockname()[1])])  # noqa: S603
    conn, _ = server.accept()
    try:
        conn.settimeout(5)
        assert conn.recv(1) == b"x"  # it talks while it runs
        proc = psutil.Process(child.pid)
        frozen: list[float] = []
        vanishing = threading.Thread(target=lambda: frozen.append(vanish_processes([proc], 1.5)))
        vanishing.start()
        time.sleep(0.5)
        assert proc.status() == psutil.STATUS_STOPPED
        conn.settimeout(0.3)
        while True:  # drain what it sent before it froze
            try:
                data = conn.recv(4096)
            except socket.timeout:
                break
            assert data, "the connection closed while the node was frozen: a peer would know at once"
        vanishing.join(10)
        assert not proc.is_running() and frozen and time.time() - frozen[0] >= 1.5  # reaped by vanish_processes
        conn.settimeout(5)
        assert conn.recv(4096) == b""  # killed: only now does the socket close
    finally:
        if child.poll() is None:
            child.kill()
        conn.close()
        server.close()


def _sleeper() -> tuple[subprocess.Popen, dict]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # noqa: S603
    return child, {"pid": child.pid, "started": psutil.Process(child.pid).create_time()}


class _Home:
    """What evict_nodes asks of the cluster's home (home.ClusterHome), over real processes as nodes; the job's
    events are the test's: it says when the survivors trained again."""

    def __init__(self, tmp_path, nodes: list[dict]):
        self.job = {"name": "job", "created": 0.0, "nodes": nodes}
        self.tmp_path = tmp_path
        self.events: list[dict] = []
        self.asked = 0

    def lock(self):
        return contextlib.nullcontext()

    def open_job(self, _name):
        return self.job, {}

    def job_dir(self, _name):
        return self.tmp_path

    def save_job(self, job):
        self.job = job

    def event_reader(self, _conn):
        return self

    def __call__(self, _name):  # the event reader
        self.asked += 1
        return list(self.events)

    def close(self):
        pass


def test_an_eviction_without_notice_freezes_the_node_until_the_survivors_trained_again_then_kills_it(tmp_path):
    (survivor, a), (target, b) = _sleeper(), _sleeper()
    backend = _Home(tmp_path, [{"name": "node-a", **a}, {"name": "node-b", **b}])
    result: list[dict] = []
    evicting = threading.Thread(target=lambda: result.append(
        evict_nodes(backend, "job", node="node-b", notice_seconds=0)))
    try:
        evicting.start()
        proc = psutil.Process(target.pid)
        deadline = time.time() + 10
        while proc.status() != psutil.STATUS_STOPPED and time.time() < deadline:
            time.sleep(0.05)
        assert proc.status() == psutil.STATUS_STOPPED  # vanished: frozen, not killed
        time.sleep(1.5)  # the survivors have not trained again: it stays frozen
        assert proc.status() == psutil.STATUS_STOPPED and evicting.is_alive() and backend.asked >= 2
        now = time.time()
        backend.events = [{"event": "restored", "time": now, "step": 10},
                          {"event": "progress", "time": now + 0.1, "step": 11}]
        evicting.join(10)
        assert not evicting.is_alive() and target.wait(5) is not None  # killed once they did
        eviction = result[0]["evictions"][0]
        assert eviction["node"] == "node-b" and eviction["evictedAt"] < now - 1  # the figure counts from the freeze
        assert psutil.Process(survivor.pid).status() != psutil.STATUS_STOPPED and survivor.poll() is None
    finally:
        for child in (survivor, target):
            if child.poll() is None:
                child.kill()
                child.wait()


def test_without_another_node_or_when_asked_an_eviction_without_notice_kills_at_once(tmp_path):
    for nodes, vanish in ((1, True), (2, False)):
        children = [_sleeper() for _ in range(nodes)]
        backend = _Home(tmp_path, [{"name": f"node-{i}", **node} for i, (_, node) in enumerate(children)])
        try:
            evict_nodes(backend, "job", node=f"node-{nodes - 1}", notice_seconds=0, vanish=vanish)
            assert children[-1][0].wait(5) is not None and backend.asked == 0  # never waited for a re-form
        finally:
            for child, _ in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()


def test_a_vanished_node_is_killed_even_when_asking_whether_to_fails():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # noqa: S603

    def unreadable(_frozen_at: float) -> bool:
        raise OSError("the job's events cannot be read")

    try:
        with pytest.raises(OSError):
            vanish_processes([psutil.Process(child.pid)], 60, until=unreadable)
        assert child.wait(5) is not None  # not left frozen for good
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
