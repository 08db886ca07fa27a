"""Whether this worker's peers are still there, in the restart mode: each worker's runtime beats in the job's
store, and a worker whose peer went silent ends itself, so the job re-forms without the peer within the peer
timeout, whatever timeout the script's own process group has.

Why: a Spot VM evicted without notice vanishes (its sockets stay open, no FIN), and a worker blocked in a
collective of the script's default group (DDP's all-reduce) waits for the group's timeout: torch's default, 30
minutes for gloo and 10 for NCCL, unless the script passed ``timeout=``. Nothing the runtime runs on the training
thread can end that wait, and torch has no public way to abort another group's collective from outside it, so
the worker ends: torchrun's agent sees it fail and re-forms the job without the vanished node (its rendezvous
keep-alive has lapsed by then), and every worker resumes from the last completed step (memory or blob).

How a peer is judged gone: every worker adds 1 to its counter in the job's TCP store (the one torchrun gives
the workers, ``MASTER_ADDR:MASTER_PORT``, on both backends) every ``timeout / 6`` seconds from a thread of its own,
and reads every rank's counter. A peer whose counter did not move for ``timeout`` seconds is gone; so is the
store when a call to it has not returned for ``timeout`` (the store lives in rank 0's process: a vanished rank 0
never answers, and a TCP store call to a frozen server does not return). A slow peer is not a gone one: its
beat runs on its own thread, which a long step, an upload, a restore or a hold after a notice do not hold up
(they leave Python or let other threads run); only a process whose Python is stopped for ``timeout`` is taken
for gone. A worker that leaves on purpose (close, a stop, exit) marks its counter first, so the others never
take its exit for a vanish; a store that is closed (its process exited) ends the watch without a verdict: the
peer's closed sockets fail the collectives by themselves.

The verdict is this worker's own and every survivor reaches it: each ends itself, so no survivor waits for a
message from another.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

# Added to a counter when its worker leaves on purpose: a counter at or above it is not watched any more.
LEFT = 1 << 40
KEY_PREFIX = "elastictrain/alive/"
BEATS_PER_TIMEOUT = 6  # beats a gone peer misses before it is judged gone
# A peer that never beat (its runtime not started yet: the ranks start their watches after one barrier, then
# each finishes its own set-up) is judged after this many timeouts.
NEVER_BEAT_TIMEOUTS = 5


class StoreClient:
    """The few calls the watch makes, over a TCP store client of its own (so a call that never returns blocks
    only the watch's beat thread, never a collective)."""

    def __init__(self, host: str, port: int, timeout: float, *, store: Any = None):
        if store is None:
            import torch.distributed as dist

            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout),
                                  wait_for_workers=False)
        self._store = store

    @classmethod
    def over(cls, store: Any) -> "StoreClient":
        """The calls over a torch store client made elsewhere (a ``PrefixStore``: the in-process mode's quorum)."""
        return cls("", 0, 0.0, store=store)

    def get(self, key: str) -> bytes | None:
        """``key``'s value, or None where it is not set."""
        return bytes(self._store.get(key)) if self._store.check([key]) else None

    def add(self, key: str, amount: int) -> int:
        return int(self._store.add(key, amount))

    def delete(self, key: str) -> None:
        self._store.delete_key(key)

    def counters(self, keys: Sequence[str]) -> list[int]:
        """Every key's counter (0 for one not created yet)."""
        if self._store.check(list(keys)):
            return [int(value) for value in self._store.multi_get(list(keys))]
        return [int(self._store.add(key, 0)) for key in keys]


class PeerWatch:  # pylint: disable=too-many-instance-attributes  # the beat's state, shared by two threads
    """Beats for this rank and judges the others; calls ``on_gone(reason)`` once, from a thread of its own, when a
    peer (or the store) is gone. ``connect()`` gives the store client (called on the beat thread)."""

    def __init__(self, connect: Callable[[], Any], *, rank: int, world_size: int, timeout: float,
                 on_gone: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 on_beat: Callable[[Any], None] | None = None, watched: Sequence[int] | None = None):
        """``on_beat(client)``: called on the beat thread after each beat, as a timed store call (its hang is the
        store's). ``watched``: the ranks whose beats this one reads (default: every other)."""
        self._connect, self.rank, self.world_size, self.timeout = connect, rank, world_size, timeout
        self._on_gone, self._clock, self._on_beat = on_gone, clock, on_beat
        self.interval = timeout / BEATS_PER_TIMEOUT
        self._keys = [f"{KEY_PREFIX}{r}" for r in range(world_size)]
        self._watched = [r for r in (range(world_size) if watched is None else watched) if r != rank]
        self._client: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call_since: float | None = None  # when the store call in flight began
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its counter, when it last moved)
        self._judged = False
        self._threads = [threading.Thread(target=self._beat, name="elastictrain-peer-beat", daemon=True),
                         threading.Thread(target=self._watch_store, name="elastictrain-peer-watch", daemon=True)]

    def start(self) -> "PeerWatch":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, *, leave: bool = True) -> None:
        """This worker leaves on purpose: no verdict from here on, and the peers stop watching it. Bounded: the
        mark is left to the beat thread, which is skipped if the store does not answer. ``leave=False``: no mark
        (every peer stops its own watch too: the in-process mode's next quorum)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if not leave:
            return
        mark = threading.Thread(target=self._mark_left, name="elastictrain-peer-leave", daemon=True)
        mark.start()
        mark.join(min(self.interval, 1.0))

    def _mark_left(self) -> None:
        try:
            with self._lock:
                if self._client is not None:
                    self._client.add(self._keys[self.rank], LEFT)
        except Exception:  # pylint: disable=broad-except  # the store is gone: nobody is left to watch us
            pass

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            self._call_since = self._clock()
            try:
                return fn(*args)
            finally:
                self._call_since = None

    def _beat(self) -> None:
        try:
            # Not timed as a call: a store that cannot be reached at all is not a vanish (a script whose group
            # is elsewhere); a store that vanished right now is seen by the next call.
            client = self._connect()
        except Exception as exc:  # pylint: disable=broad-except
            log.warning("peer watch off: the job's store could not be reached (%s)", exc)
            return
        with self._lock:
            self._client = client
        try:
            while not self._stop.is_set():
                self._call(self._client.add, self._keys[self.rank], 1)
                counters = self._call(self._client.counters, [self._keys[r] for r in self._watched])
                if self._stop.is_set():
                    return
                self._judge_peers(counters, self._clock())
                if self._on_beat is not None and not self._stop.is_set():
                    self._call(self._on_beat, self._client)
                self._stop.wait(self.interval)
        except Exception as exc:  # pylint: disable=broad-except  # the store failed the call
            if "timed out" in str(exc) or "timeout" in str(exc).lower():
                self._gone(f"the job's store (rank 0's process) did not answer: {exc}")
            elif not self._stop.is_set():
                log.info("peer watch ended: the job's store closed (%s); a peer that exited fails the "
                         "collectives by itself", exc)

    def _judge_peers(self, counters: list[int], now: float) -> None:
        for rank, count in zip(self._watched, counters):
            if count >= LEFT:
                continue
            last = self._seen.get(rank)
            if last is None or last[0] != count:
                self._seen[rank] = (count, now)
            elif now - last[1] > (self.timeout if count else self.timeout * NEVER_BEAT_TIMEOUTS):
                what = "has not beaten" if count else "never beat"
                self._gone(f"rank {rank} {what} for {now - last[1]:.1f} s (peer timeout {self.timeout:g} s)")
                return

    def _watch_store(self) -> None:
        """A store call that does not return: the store's process (rank 0's) is gone."""
        while True:
            asleep = self._clock()
            if self._stop.wait(self.interval):
                return
            if self._clock() - asleep > 2 * self.interval:
                continue  # this process was not scheduled: its own delay, not the store's
            since = self._call_since
            if since is not None and self._clock() - since > self.timeout:
                self._gone(f"the job's store (rank 0's process) has not answered for {self._clock() - since:.1f} s "
                           f"(peer timeout {self.timeout:g} s)")
                return

    def _gone(self, reason: str) -> None:
        if self._stop.is_set() or self._judged:
            return
        self._judged = True
        self._on_gone(reason)


__all__ = ["PeerWatch", "StoreClient", "LEFT"]
