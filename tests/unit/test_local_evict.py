"""A local node that vanishes as an Azure Spot VM evicted without notice does: frozen (its sockets stay open, no
FIN reaches a peer), then killed (backends/local/evict.py's vanish_processes), on real processes."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import psutil

from azext_elastictrain.backends.local.evict import vanish_processes

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
