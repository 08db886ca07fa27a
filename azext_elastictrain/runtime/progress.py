"""The job's event log: JSON lines appended to ``<job>/events.jsonl``.

The CLI reads it to show a job's state, world size, step, checkpoints,
evictions and throughput. Appends go through a background thread so a slow
or unreachable storage account never stalls a training step; an event that
cannot be written is logged and dropped (the log is for monitoring, the
checkpoints are what must be durable).
"""
from __future__ import annotations

import json
import logging
import queue
import socket
import threading
import time
from typing import Any

from azext_elastictrain.core import layout
from azext_elastictrain.core.blobstore import BlobStore

# The event kinds and the reader live in core.eventlog.events, which the CLI imports without torch.
from azext_elastictrain.core.eventlog.events import (
    CHECKPOINT,
    CHECKPOINT_FAILED,
    FINISHED,
    INTERRUPTED,
    PREEMPTED,
    PROGRESS,
    QUORUM,
    REFORMING,
    RESTORED,
    STARTED,
    read_events,
)

__all__ = ["EventLog", "CHECKPOINT", "CHECKPOINT_FAILED", "FINISHED", "INTERRUPTED", "PREEMPTED", "PROGRESS",
           "QUORUM", "REFORMING", "RESTORED", "STARTED", "read_events"]

log = logging.getLogger(__name__)

_STOP = object()


class EventLog:
    """Appends events from one process; thread-safe, non-blocking."""

    def __init__(self, store: BlobStore, job_prefix: str, *, rank: int = 0, node: str | None = None):
        self._store = store
        self._name = layout.events_name(job_prefix)
        self._rank = rank
        self._node = node or socket.gethostname()
        self._queue: queue.Queue[dict[str, Any] | object] = queue.Queue()  # the records, then _STOP
        self._thread = threading.Thread(target=self._drain, name="elastictrain-events", daemon=True)
        self._thread.start()

    def emit(self, kind: str, **fields: Any) -> None:
        record = {"time": round(time.time(), 3), "event": kind, "rank": self._rank, "node": self._node}
        record.update(fields)
        self._queue.put(record)

    def _drain(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:  # coalesce whatever queued up meanwhile into one append
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(r is _STOP for r in batch)
            records = [r for r in batch if r is not _STOP]
            if records:
                data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
                try:
                    self._store.append(self._name, data)
                except Exception as ex:  # pylint: disable=broad-exception-caught  # monitoring must not kill training
                    log.warning("could not append %d event(s) to %s: %s", len(records), self._name, ex)
            for _ in batch:
                self._queue.task_done()
            if stop:
                return

    def flush(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until queued events are written."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
