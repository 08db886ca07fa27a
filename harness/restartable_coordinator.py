"""An in-process job's coordinator as a process of its own (runtime/coordinator.py with a local job's settings, on a
port of its own), which a test or a benchmark kills and starts again on the same address."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from azext_elastictrain.core import launch
from harness.services import free_port

REPO = Path(__file__).resolve().parents[1]


class RestartableCoordinator:
    """``start()`` (also on creation) and ``kill()``, any number of times; ``address`` stays the same."""

    def __init__(self, log_dir: Path, start_timeout: float = 30.0, min_nodes: int = 1,
                 profile: launch.LaunchProfile = launch.LOCAL):
        self.port, self.log_dir, self.proc = free_port(), log_dir, None
        self.address = f"http://127.0.0.1:{self.port}"
        self.start_timeout, self.min_nodes, self.profile = start_timeout, min_nodes, profile
        self.start()

    def start(self) -> None:
        with open(self.log_dir / "coordinator.log", "ab") as log:
            self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, "-m", launch.COORDINATOR_MODULE,
                 *launch.coordinator_args(self.profile, bind=f"127.0.0.1:{self.port}", min_nodes=self.min_nodes)],
                cwd=REPO, stdout=log, stderr=log)
        deadline = time.monotonic() + self.start_timeout
        while not self._listening():
            if time.monotonic() > deadline:
                raise AssertionError(f"the coordinator did not listen on port {self.port} in {self.start_timeout:g} s")
            time.sleep(0.05)

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
