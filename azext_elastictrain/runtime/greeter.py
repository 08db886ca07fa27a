"""A node's own heartbeats to a coordinator that has come back, while its torchft server's are not there yet.

A coordinator that restarts (the local supervisor, the AKS Deployment) knows no node: torchft's Lighthouse forms a
quorum of the nodes it has heard of, so the first node to ask got a quorum of itself alone, the others a quorum of
their own a moment later, and the job trained a step split and healed a node after it. Each node's torchft server
heartbeats it again only once its reconnect's backoff (up to its connect timeout, seconds) lets it. So while the
nodes coast (runtime/replicas.py ``ReplicaGroup._coast``), a node whose probe reaches the coordinator beats for itself
at once, through torchft's public ``LighthouseClient``, every ``interval``; the nodes ask for a quorum together only
after a step at which every one of them reached it, so the coordinator has heard of all of them when the first asks,
and waits for the rest (torchft's rule: no quorum of half or less of the nodes heard). The beats go on ``linger``
seconds after the nodes' quorum, long enough for the torchft server's own to resume.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Callable

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 0.1  # torchft's heartbeat interval
LINGER_SECONDS = 10.0  # the longest backoff of a torchft server's reconnect (its connect timeout: replicas.py)
CALL_TIMEOUT = timedelta(seconds=0.5)


class Greeter:  # pylint: disable=too-many-instance-attributes  # its settings, and the beat's thread
    """Heartbeats for ``replica_id()`` (read once, on the first beat) to ``coordinator`` from ``start()`` until
    ``linger`` seconds after ``stop()``; ``close()`` ends them at once."""

    def __init__(self, coordinator: str, replica_id: Callable[[], str], *, interval: float = INTERVAL_SECONDS,
                 linger: float = LINGER_SECONDS) -> None:
        self.coordinator, self._replica_id = coordinator, replica_id
        self.interval, self.linger = interval, linger
        self.beats = 0  # heartbeats the coordinator took
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._until: float | None = None  # monotonic time the beats end (None: while started)
        self._closed = threading.Event()
        self._id: str | None = None

    def start(self) -> None:
        """Beat from now on (again, if a linger was running or over)."""
        with self._lock:
            self._until = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="elastictrain-greeter", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Beat ``linger`` seconds more, then end."""
        with self._lock:
            if self._thread is not None and self._until is None:
                self._until = time.monotonic() + self.linger

    def close(self) -> None:
        self._closed.set()

    def replica_id(self) -> str:
        """This node's replica id (read once)."""
        if self._id is None:
            self._id = self._replica_id()
        return self._id

    @property
    def beating(self) -> bool:
        with self._lock:
            return self._thread is not None

    def _run(self) -> None:
        from torchft.coordination import LighthouseClient

        client = None
        while True:
            with self._lock:  # start() sees the thread gone, or the thread sees start()'s new time
                if self._closed.is_set() or (self._until is not None and time.monotonic() >= self._until):
                    self._thread = None
                    return
            try:
                client = client or LighthouseClient(self.coordinator, connect_timeout=CALL_TIMEOUT)
                client.heartbeat(self.replica_id(), timeout=CALL_TIMEOUT)
                self.beats += 1
            except Exception as ex:  # pylint: disable=broad-exception-caught  # gone again: the next beat retries
                log.debug("a heartbeat to the coordinator failed: %s", ex)
                client = None
            self._closed.wait(self.interval)


def replica_id_of_node(store_addr: str, store_port: int) -> str:
    """The replica id torchft's Manager gave this node (its name and a uuid), from the node's store."""
    import torch.distributed as dist
    from torchft.manager import REPLICA_ID_KEY

    store = dist.TCPStore(store_addr, store_port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    return bytes(store.get(REPLICA_ID_KEY)).decode("utf-8")


__all__ = ["Greeter", "replica_id_of_node"]
