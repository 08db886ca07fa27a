"""Finding and checking the processes a test's local cluster and jobs started."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

import psutil


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def gone(pids: Iterable[int], timeout: float = 15.0) -> bool:
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def ours(config_dir: Path | str) -> list[psutil.Process]:
    """Live processes started for this az config dir: cluster components name it on their command
    line, job processes (agents and workers) carry it in their environment."""
    marker = str(config_dir)
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in a for a in proc.info["cmdline"] or []) or \
                    any(marker in v for v in proc.environ().values()):
                found.append(proc)
        except psutil.Error:
            continue
    return found
