"""The in-process mode's cross-node collectives, given up at once when a participant is gone rather than after their
timeout, and given up by every participant or by none.

A Spot VM evicted without notice vanishes: its sockets stay open and no FIN comes, so a survivor waiting for it in
the step's collective learned only at the replica timeout (AKS: 30 s, long so that a slow peer is not taken for a
dead one). Now each participant of a quorum beats in the quorum's store (the one torchft's process group meets in,
on the quorum's first node) from a thread of its own, and watches the next one's beats, in a ring
(runtime/peer_watch.py): a peer unheard for the heartbeat timeout (the coordinator's own: core/launch.py, so the
next quorum, which waits for the coordinator to drop the node, is ready as the step is given up), or a store whose
calls stop returning (the first node gone), is gone. A slow peer is not: its beat has a thread of its own, so a
long step, an upload or a GIL-bound stretch of Python does not stop it; only a process that is not scheduled at
all for the timeout is taken for gone.

Giving up must be the same on every participant: if one node discarded the step while another committed it, the
replicas would part. So each collective has a claim in the quorum's store (``compare_set`` on a key of its own,
first writer wins): a participant whose collective completed claims it done, one that gives up claims it given up,
and each then follows the claim it reads back. A node that gives up on a collective another completed waits for it
after all (it completes: the other got its part); a node whose collective completed after another gave up on it
discards the step with the others. Every participant watches its collective's claim from its beat thread, so a
peer taken for gone wrongly (its process starved for the timeout) learns at its next beat and discards too: a
needless verdict costs one step, never a re-form.

How a collective is given up, by backend: NCCL's communicator is aborted (``ncclCommAbort``, torchft's
ProcessGroupNCCL), which fails the kernels waiting on the GPU. gloo cannot be aborted while a collective waits
(torch 2.13: ``abort()`` returns only when the collective has timed out), so the host stops waiting for it: the
collective is left to time out on its own group, which is aborted on a thread of its own, and the next quorum
(the step's failure makes torchft's coordinator give it a new id) meets on a new group. The tensor the collective
was given is never read again (each collective averages a buffer of its own).
"""
from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
from torchft.process_group import ProcessGroup, create_store_client

from azext_elastictrain.runtime.peer_watch import PeerWatch, StoreClient

log = logging.getLogger(__name__)
T = TypeVar("T")

CLAIM_PREFIX = "elastictrain/claim/"
SPACE_KEY = "elastictrain/space"  # the name of the current group's own keys (WatchedGroup.configure)
# Where c10d's gloo group keeps a participant's addresses while it forms: under its device's index, then its rank
# (torch 2.13; tests/unit/test_replica_watch.py holds it). NCCL's group keeps its id elsewhere: not forgotten here.
RENDEZVOUS_KEY = "0/{rank}"
DONE, GIVEN_UP = b"done", b"given-up"
# The watch's store calls fail after this many heartbeat timeouts, at least this many seconds (the watch has called
# the store gone after one by then). A claim, made on the training thread, fails after one heartbeat timeout (at
# least the floor): a store that slow has its node taken for gone anyway, and the step is discarded.
STORE_CALL_TIMEOUTS, STORE_CALL_FLOOR_SECONDS, CLAIM_FLOOR_SECONDS = 4, 2.0, 0.5


class PeerGone(RuntimeError):
    """A participant of the step's quorum is gone: the step's collective was given up on every participant."""


# pylint: disable-next=too-many-instance-attributes,abstract-method  # the Manager and the runtime run allreduce only
class WatchedGroup(ProcessGroup):  # type: ignore[misc]  # torchft ships no py.typed
    """torchft's reconfigurable process group (``make()``: a ProcessGroupGloo or ProcessGroupNCCL, ``inner``) for the
    Manager, which calls ``configure``, ``allreduce`` and ``errored``; with a watch of the quorum's participants at
    each configure, and ``wait``/``agree`` for each collective (see the module's docstring). ``heartbeat_timeout``:
    seconds a participant may go unheard (None: no watch, every collective waits its own timeout). ``abortable``:
    the backend aborts a collective in flight (NCCL's communicator; gloo's cannot be, even with CUDA tensors)."""

    def __init__(self, make: Callable[[], ProcessGroup], *, heartbeat_timeout: float | None,
                 abortable: bool = False) -> None:
        super().__init__(0, 1)
        self._make = make
        self.abortable = abortable
        self.inner: Any = make()
        self.heartbeat_timeout = heartbeat_timeout
        self.gone: str | None = None  # the verdict of this quorum's watch: who is gone
        self._watch: PeerWatch | None = None
        self._claims: Any = None  # the quorum's store, for the claims made on the training thread
        self._claim_timeout = CLAIM_FLOOR_SECONDS
        self._wake = threading.Event()  # a collective's end, or a verdict, while the training thread waits
        self._lock = threading.Lock()
        self._key: str | None = None  # the claim of the collective in flight
        self._pending: list[str] = []  # this step's collectives that completed here, claimed done by agree()
        self._attempt = self._op = 0
        # claims no participant reads any more, deleted by the first participant's beat thread (a claim a collective,
        # two or three a step: a store that kept them grew by ~100 MB a day of 0.5 s steps): the last attempt's,
        # once this attempt's first collective completed (every participant is past the last attempt then)
        self._retiring: list[str] = []
        self._spent: list[str] = []
        self._sweeps = False
        self._rendezvous: tuple[Any, str] | None = None  # this participant's gloo record, until the group has met
        self._met = False  # a collective of the current group completed here
        self._abandoned = False  # a collective of the current group was given up while it waited (gloo)

    # -- torchft's calls -----------------------------------------------------------------------------------------
    # pylint: disable-next=too-many-arguments,too-many-positional-arguments  # torchft's signature
    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                  quorum_id: int | None = None, group_rank: int | None = None, group_world_size: int | None = None,
                  global_ranks: list[int] | None = None) -> None:
        self.stop_watch()
        if self._abandoned:  # its abort would wait for the collective left waiting: a new group instead
            old, self.inner = self.inner, self._make()
            threading.Thread(target=_abort, args=(old,), name="elastictrain-abort", daemon=True).start()
            self._abandoned = False
        with self._lock:
            self.gone, self._key, self._attempt, self._op = None, None, 0, 0
            self._retiring, self._spent, self._sweeps = [], [], rank == 0
        self._pending = []
        self._claim_timeout = max(CLAIM_FLOOR_SECONDS, self.heartbeat_timeout or 0.0)
        group_store = create_store_client(store_addr, timeout=timedelta(seconds=self._claim_timeout))
        before = self._bounded(lambda: _value(group_store, SPACE_KEY))  # read before the group forms (below)
        self.inner.configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                             global_ranks)
        self._rendezvous, self._met = (group_store, RENDEZVOUS_KEY.format(rank=rank)), False  # see agree()
        if self.heartbeat_timeout is None or world_size < 2:
            self._claims = None
            return
        # This group's own keys (claims, beats) under a name every participant agrees on, new for each group: the
        # store prefix is the coordinator's quorum id, which a coordinator that restarted counts from 1 again, so
        # a new group met on an earlier one's keys (its claims, a peer's "left" mark: a vanish taken for a step
        # discarded, or never seen). The group's forming is the barrier: every participant read the name before
        # it, and proposes its own after it; the first proposal wins.
        space = self._bounded(lambda: bytes(group_store.compare_set(SPACE_KEY, before, uuid.uuid4().hex[:12])))
        scoped = f"{store_addr}/{space.decode('ascii')}"
        call_timeout = timedelta(seconds=max(STORE_CALL_FLOOR_SECONDS, STORE_CALL_TIMEOUTS * self.heartbeat_timeout))
        self._claims = create_store_client(scoped, timeout=timedelta(seconds=self._claim_timeout))
        # a ring: each participant reads its successor's beat only (a store call per beat, not one per participant:
        # 256 nodes would read 65,536 counters a beat); a gone one's predecessor gives the collective up, and the
        # others read its claim at their next beat
        self._watch = PeerWatch(lambda: StoreClient.over(create_store_client(scoped, timeout=call_timeout)),
                                rank=rank, world_size=world_size, timeout=self.heartbeat_timeout,
                                on_gone=self._on_gone, on_beat=self._read_claim,
                                watched=[(rank + 1) % world_size]).start()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        return self.inner.allreduce(tensors, opts)

    def errored(self) -> Exception | None:
        error: Exception | None = self.inner.errored()
        return error

    def abort(self) -> None:
        self.inner.abort()

    def shutdown(self) -> None:
        self.stop_watch()
        self.inner.shutdown()

    def size(self) -> int:
        return int(self.inner.size())

    def getBackendName(self) -> str:  # pylint: disable=invalid-name  # torch's name
        return str(self.inner.getBackendName())

    # -- the training thread's calls, one pair per collective ------------------------------------------------------
    def next_step(self) -> None:
        """A step begins: its collectives' claims are new keys (a step tried again after a discard, in the same
        quorum, claims afresh)."""
        with self._lock:
            self._retiring += [f"{CLAIM_PREFIX}{self._attempt}/{op}" for op in range(1, self._op + 1)]
            self._attempt += 1
            self._op = 0
            self._key = None
        self._pending = []

    def wait(self, work: Any) -> None:
        """Until ``work`` (a collective of this group) is done here, or given up on every participant (PeerGone).
        The collective's own failure (its timeout, a peer's socket closed) is given up on every participant too
        (PeerGone) where this participant's claim is the first; where another's claim says done, it raises as it
        came. A CUDA collective's wait orders the stream only. Its claim is made by ``agree()``, once the host has
        synced."""
        with self._lock:
            self._op += 1
            self._key = f"{CLAIM_PREFIX}{self._attempt}/{self._op}" if self._claims is not None else None
            self._wake.clear()
            gone = self.gone
        if self._key is None:
            work.wait()
            self._met = True
            return
        self._pending.append(self._key)  # claimed by agree(), once the host has synced
        future = work.get_future()
        wake = self._wake  # the callback runs on the backend's own thread: it must not hold this group, or the
        future.add_done_callback(lambda _f: wake.set())  # group's last reference, dropped there, joined that thread
        while not future.done():
            if gone is not None:
                if self._give_up(gone):
                    raise PeerGone(gone)
                break  # a participant completed it: so will this one
            self._wake.wait()
            with self._lock:
                gone = self.gone
        try:
            work.wait()  # its own failure raises here; a CUDA one's wait() orders the stream
            self._met = True  # a collective of the group completed: every participant formed it
        except Exception as ex:
            if self._give_up("the collective failed") and self._key is not None:
                raise PeerGone(f"the collective failed: {ex}") from ex  # given up on every participant
            raise

    def forget(self) -> None:
        """The step is discarded here anyway (this node's own failure): its collectives are not claimed."""
        self._pending = []
        with self._lock:
            self._key = None

    def agree(self) -> None:
        """After the step's collectives completed here and the host synced with them: each claimed done, or
        PeerGone if another participant gave one up first."""
        pending, self._pending = self._pending, []
        with self._lock:
            self._key = None
        for key in pending:
            try:
                claim = self._claim(key, DONE)
            except Exception as ex:  # the quorum's store is gone with its node: its verdict is the watch's
                raise PeerGone(f"the quorum's store did not answer the claim of a collective ({ex})") from ex
            if claim != DONE:
                raise PeerGone(f"another participant gave the step's collective up ({self.gone or 'a peer gone'})")
        if self._rendezvous is not None and self._met:  # every participant is past forming the group now
            self._forget_rendezvous()
        if pending:
            with self._lock:  # every participant took part in this attempt's collectives: none reads the last's
                if self._sweeps:
                    self._spent += self._retiring
                self._retiring = []

    def _forget_rendezvous(self) -> None:
        """This participant's gloo record of its addresses, deleted: every participant has taken part in a
        collective of the group since it formed, so none reads it any more, and a later group on the same store
        prefix cannot read it for its own and wait on a peer that is not there (gloo's connect timeout: seen after a
        coordinator restarted). Not before: a peer may return from forming before another has read its record."""
        store, key = self._rendezvous or (None, "")
        self._rendezvous = None
        try:
            self._bounded(lambda: _forget(store, key))
        except Exception as ex:  # pylint: disable=broad-exception-caught  # its node is gone: nobody reads it
            log.info("the group's rendezvous record was not deleted: %s", ex)

    # -- the watch's thread -----------------------------------------------------------------------------------------
    def _on_gone(self, reason: str) -> None:
        log.warning("a participant of the quorum is gone: %s; giving up the step's collective", reason)
        with self._lock:
            self.gone = reason
        if self._key is not None and self.abortable:
            self._give_up(reason)  # NCCL: abort the communicator the kernels wait on, once the claim is ours
        self._wake.set()

    def _read_claim(self, client: StoreClient) -> None:
        """On each beat: a collective in flight that another participant gave up is given up here too; and the
        first participant deletes the claims nobody reads any more."""
        key = self._key
        if key is not None and client.get(key) == GIVEN_UP and self.gone is None:
            self._on_gone("another participant gave up the step's collective")
        with self._lock:
            spent, self._spent = self._spent, []
        for old in spent:
            client.delete(old)

    def _give_up(self, reason: str) -> bool:
        """Claim the collective in flight given up; True if the claim is ours (or the store is gone too), False if
        a participant had claimed it done. A claim of ours on a CUDA group aborts its communicator."""
        key = self._key
        if key is None:
            return True
        try:
            mine = self._claim(key, GIVEN_UP) == GIVEN_UP
        except Exception:  # pylint: disable=broad-exception-caught  # the store's node is gone: nobody completes it
            mine = True
        if not mine:
            return False
        self._abandoned = True  # the next quorum meets on a new group
        if self.abortable:
            log.warning("aborting the cross-node communicator: %s", reason)
            threading.Thread(target=_abort, args=(self.inner,), name="elastictrain-abort", daemon=True).start()
        return True

    def _claim(self, key: str, value: bytes) -> bytes:
        """The claim of ``key`` (``value`` unless another participant's came first), waited for at most the claim
        timeout."""
        claims = self._claims
        return self._bounded(lambda: bytes(claims.compare_set(key, "", value)))

    def _bounded(self, call: Callable[[], T]) -> T:
        """``call()``'s result (a call to the quorum's store), waited for at most the claim timeout. torch's TCP
        store client bounds its connects and waits, not a call to a server that does not answer: a call to the store
        of a node that vanished (SIGSTOP, a VM gone) never returned. So the call runs on a thread of its own, left
        there if it hangs (a daemon: it cannot hold the process's exit)."""
        answer: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                answer.append(call())
            except Exception as ex:  # pylint: disable=broad-exception-caught  # handed to the caller
                answer.append(ex)
            finally:
                done.set()

        threading.Thread(target=run, name="elastictrain-store-call", daemon=True).start()
        if not done.wait(self._claim_timeout):
            raise TimeoutError(f"the quorum's store has not answered for {self._claim_timeout:g} s")
        if isinstance(answer[0], Exception):
            raise answer[0]
        result: T = answer[0]
        return result

    def stop_watch(self, *, leave: bool = False) -> None:
        """No more beats or verdicts for this quorum (``leave``: this node leaves the job on purpose, so the others
        do not take it for gone)."""
        if self._watch is not None:
            self._watch.stop(leave=leave)
            self._watch = None


def _value(store: Any, key: str) -> bytes:
    """``key``'s value in ``store``, or b"" where it is not set."""
    return bytes(store.get(key)) if store.check([key]) else b""


def _forget(store: Any, key: str) -> None:
    if store.check([key]):
        store.delete_key(key)


def _abort(group: Any) -> None:
    try:
        group.abort()
    except Exception as ex:  # pylint: disable=broad-exception-caught  # a group being dropped
        log.info("aborting a given-up process group: %s", ex)


__all__ = ["PeerGone", "WatchedGroup"]
