"""Finding and checking the processes a test's local cluster and jobs started."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterable, Iterator

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


@contextlib.contextmanager
def local_cluster(config_dir: Path) -> Iterator:
    """The real az with an isolated config dir and a healthy local cluster in it; afterwards the
    cluster is deleted and anything still running for that config dir is killed."""
    from harness import services as svc

    svc.check_dev_extension()
    az = svc.AzCli(config_dir)
    try:
        created = az.json("elastictrain", "cluster", "create", "--local", timeout=180)
        assert created["health"] == "Healthy", created
        yield az
    finally:
        az("elastictrain", "cluster", "delete", "--local", "--yes", check=False, timeout=180)
        for proc in ours(az.config_dir):  # never leave a stray process behind, whatever failed
            try:
                proc.kill()
            except psutil.Error:
                pass
