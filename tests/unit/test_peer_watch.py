"""The restart mode's peer watch (runtime/peer_watch.py) over a store of our interface: a peer whose beat stops is
gone after the peer timeout, a peer that left on purpose never is, a store that stops answering is gone, and a
store that closed ends the watch without a verdict. Real threads, a real clock, timeouts of a fraction of a second.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from azext_elastictrain.backends.local.evict import VANISH_CAP_SECONDS, vanish_cap
from azext_elastictrain.core import launch
from azext_elastictrain.core.spec import SpecError
from azext_elastictrain.runtime.peer_watch import PeerWatch
from azext_elastictrain.runtime.timeouts import peer_timeout

TIMEOUT = 1.0


class Store:
    """The job's store as the watch sees it: counters by key, shared by every rank's watch."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.hang = threading.Event()  # set: calls never return (the store's process is frozen)
        self.closed = False

    def add(self, key: str, amount: int) -> int:
        if self.closed:
            raise RuntimeError("Connection reset by peer")
        while self.hang.is_set():
            time.sleep(0.05)
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + amount
            return self.counts[key]

    def counters(self, keys):
        return [self.add(key, 0) for key in keys]


def watch(store: Store, rank: int, verdicts: list[str]) -> PeerWatch:
    return PeerWatch(lambda: store, rank=rank, world_size=2, timeout=TIMEOUT, on_gone=verdicts.append).start()


def wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.02)
    return predicate()


def test_a_peer_whose_beat_stops_is_gone_after_the_peer_timeout_and_not_before():
    store, verdicts, peer_verdicts = Store(), [], []
    me, peer = watch(store, 0, verdicts), watch(store, 1, peer_verdicts)
    try:
        time.sleep(3 * TIMEOUT)
        assert not verdicts and not peer_verdicts  # both beat: nobody is gone
        peer._stop.set()  # pylint: disable=protected-access  # its Python stops: frozen, no leaving mark
        stopped = time.monotonic()
        assert wait(lambda: verdicts, 10 * TIMEOUT), "the silent peer was never judged gone"
        # not before: its last beat seen may precede the stop by a beat or two
        assert time.monotonic() - stopped >= TIMEOUT / 2 and verdicts[0].startswith("rank 1 has not beaten"), verdicts
        assert len(verdicts) == 1
    finally:
        me.stop()


def test_a_peer_that_leaves_on_purpose_is_never_taken_for_gone():
    store, verdicts = Store(), []
    me, peer = watch(store, 0, verdicts), watch(store, 1, [])
    try:
        time.sleep(2 * TIMEOUT)
        peer.stop()  # close(), a stop, an exit
        time.sleep(4 * TIMEOUT)
        assert not verdicts
    finally:
        me.stop()


def test_a_store_that_stops_answering_is_gone_and_one_that_closed_is_no_verdict():
    store, verdicts = Store(), []
    me, peer = watch(store, 1, verdicts), watch(store, 0, [])
    try:
        time.sleep(2 * TIMEOUT)
        store.hang.set()  # rank 0's process, which holds the store, vanished: calls do not return
        assert wait(lambda: verdicts, 10 * TIMEOUT) and "store" in verdicts[0], verdicts
    finally:
        store.hang.clear()
        me.stop()
        peer.stop()
    closed, quiet = Store(), []
    me = watch(closed, 1, quiet)
    try:
        time.sleep(2 * TIMEOUT)
        closed.closed = True  # rank 0 exited: its sockets closed, the collectives fail by themselves
        time.sleep(4 * TIMEOUT)
        assert not quiet
    finally:
        me.stop()


def test_the_peer_timeout_and_the_local_vanish_cap_are_settings_with_an_off():
    assert peer_timeout({}) == timedelta(seconds=launch.PEER_TIMEOUT_SECONDS)
    assert peer_timeout({launch.ENV_PEER_TIMEOUT: "2.5"}) == timedelta(seconds=2.5)
    assert peer_timeout({launch.ENV_PEER_TIMEOUT: "off"}) is None
    with pytest.raises(ValueError, match=launch.ENV_PEER_TIMEOUT):
        peer_timeout({launch.ENV_PEER_TIMEOUT: "0"})
    assert vanish_cap({}) == VANISH_CAP_SECONDS
    assert vanish_cap({"ELASTICTRAIN_LOCAL_VANISH_CAP": "off"}) == float("inf")
    assert vanish_cap({"ELASTICTRAIN_LOCAL_VANISH_CAP": "30"}) == 30
    with pytest.raises(SpecError):
        vanish_cap({"ELASTICTRAIN_LOCAL_VANISH_CAP": "never"})
