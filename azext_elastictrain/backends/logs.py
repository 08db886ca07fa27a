"""Log lines of several sources (an AKS job's worker pods) as one stream of ``(source, line)``."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Iterable, Iterator


def merged_streams(streams: list[tuple[str, Iterable[str]]], follow: bool,
                   timeout: int | None) -> Iterator[tuple[str, str]]:
    """``(label, line)`` from every stream: one after the other, or, followed, as the lines come (until every
    stream ended or ``timeout`` seconds passed)."""
    if not follow:
        for label, lines in streams:
            for line in lines:
                yield label, line
        return
    arrived: queue.Queue[Any] = queue.Queue()
    done = object()

    def pump(label: str, lines: Iterable[str]) -> None:
        try:
            for line in lines:
                arrived.put((label, line))
        except Exception as ex:  # pylint: disable=broad-exception-caught
            # one pod's broken stream must not end the others
            arrived.put((label, f"<log stream ended: {ex}>"))
        finally:
            arrived.put(done)

    for label, lines in streams:
        threading.Thread(target=pump, args=(label, lines), daemon=True, name=f"log-{label}").start()
    deadline = None if timeout is None else time.monotonic() + timeout
    open_streams = len(streams)
    while open_streams:
        try:
            item = arrived.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return  # --timeout passed
        if item is done:
            open_streams -= 1
        else:
            yield item
