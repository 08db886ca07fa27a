"""The in-process mode's watched collectives (runtime/replica_watch.py) over real gloo groups of torchft and a real
TCP store on loopback, two participants as two threads of this process: a participant that goes silent mid-
collective is given up in about the heartbeat timeout although the collective's own timeout is 30 s; a slow one that
beats is waited for; a collective one participant gave up is discarded by the other even where it completed there;
and the next quorum meets on a new group at once (gloo's abort would wait for the collective left waiting).
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torchft.process_group import ProcessGroupGloo, create_store_client

from azext_elastictrain.runtime.replica_watch import PeerGone, WatchedGroup

HEARTBEAT = 0.3
TIMEOUT = timedelta(seconds=30)  # AKS's replica timeout: nothing here may wait for it

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server


def pair(store, quorum: int, size: int = 2) -> list[WatchedGroup]:
    """``size`` participants of quorum ``quorum``, configured as torchft's Manager does (each in its own thread)."""
    groups = [WatchedGroup(lambda: ProcessGroupGloo(timeout=TIMEOUT), heartbeat_timeout=HEARTBEAT)
              for _ in range(size)]
    configure(store, groups, quorum)
    return groups


def configure(store, groups: list[WatchedGroup], quorum: int) -> None:
    threads = [threading.Thread(target=g.configure, args=(f"127.0.0.1:{store.port}/torchft/{quorum}/0", f"r{i}", i,
                                                          len(groups), quorum))
               for i, g in enumerate(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)


def average(group: WatchedGroup, value: float, outcome: dict, *, agree: bool = True) -> None:
    """One step's collective on ``group``, its outcome (the sum, or the error's type) in ``outcome``."""
    group.next_step()
    tensor = torch.tensor([value])
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    started = time.monotonic()
    try:
        group.wait(group.allreduce([tensor], options))
        if agree:
            group.agree()
        outcome["sum"] = tensor.item()
    except PeerGone as ex:
        outcome["gone"] = str(ex)
    outcome["seconds"] = time.monotonic() - started


def frozen(group: WatchedGroup) -> None:
    """A participant whose process stops: its beats end (after a few, so that it is not one that never beat)."""
    time.sleep(2 * HEARTBEAT)
    group.stop_watch()


def thaw(group: WatchedGroup) -> None:
    """The frozen participant's collective, at last: it pairs with the one the other left waiting, which ends (a
    collective left waiting when the process ends takes the process down with it)."""
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    group.allreduce([torch.zeros(1)], options).wait()


def close(groups: list[WatchedGroup]) -> None:
    for g in groups:
        g.stop_watch()


def test_a_participant_silent_mid_collective_is_given_up_in_the_heartbeat_timeout_not_the_collectives(store):
    groups = pair(store, 1)
    try:
        frozen(groups[1])  # no beat, and it never enters the collective
        outcome: dict = {}
        average(groups[0], 1.0, outcome)
        assert "has not beaten" in outcome["gone"], outcome
        assert outcome["seconds"] < 10 * HEARTBEAT < TIMEOUT.total_seconds(), outcome
        thaw(groups[1])
    finally:
        close(groups)


def test_in_a_ring_of_three_the_node_that_does_not_watch_the_gone_one_gives_up_too(store):
    """Each participant reads its successor's beats only: rank 1 finds rank 2 gone; rank 0, which watches rank 1,
    learns from the claim rank 1 made, at its next beat."""
    groups = pair(store, 6, size=3)
    try:
        frozen(groups[2])
        outcomes: list[dict] = [{}, {}]
        threads = [threading.Thread(target=average, args=(groups[i], 1.0, outcomes[i])) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert "rank 2 has not beaten" in outcomes[1]["gone"], outcomes
        assert "another participant gave up" in outcomes[0]["gone"], outcomes
        assert max(o["seconds"] for o in outcomes) < 10 * HEARTBEAT, outcomes
        thaw(groups[2])
    finally:
        close(groups)


@pytest.fixture
def remote_store():
    """A store in a process of its own (the quorum's first node), which a test may stop (SIGSTOP) and resume."""
    import subprocess
    import sys

    server = subprocess.Popen(  # pylint: disable=consider-using-with  # killed below
        [sys.executable, "-c", "import time, torch.distributed as d; "
         "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False); print(s.port, flush=True); "
         "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        server.port = int(server.stdout.readline())
        yield server
    finally:
        server.kill()
        server.wait(timeout=30)
        server.stdout.close()


def freeze(process) -> None:
    """SIGSTOP ``process`` and wait until each of its threads has stopped: a thread stops itself when it next runs,
    so on a loaded machine the store could still answer a call sent just after the signal."""
    import signal
    from pathlib import Path

    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while True:
        states = [stat.read_text().rsplit(")", 1)[1].split()[0]
                  for stat in Path(f"/proc/{process.pid}/task").glob("*/stat")]
        if states and all(s in "tT" for s in states):
            return
        assert time.monotonic() < deadline, f"the store's process did not stop: {states}"
        time.sleep(0.01)


def test_a_store_whose_node_vanished_is_given_up_on_and_no_claim_hangs(remote_store):
    """The quorum's store lives on its first node: when that node vanishes (its process stopped, sockets open), a
    call to the store never returns (torch's client bounds connects and waits, not calls). The others give the
    collective up on the store's silence, and their claims, bounded, do not hold the training thread."""
    import signal

    groups = pair(remote_store, 9)
    try:
        frozen(groups[1])  # the first node's participant: no beat, never in the collective
        freeze(remote_store)  # and its store with it
        outcome: dict = {}
        average(groups[0], 1.0, outcome)
        assert "gone" in outcome and outcome["seconds"] < 10 * HEARTBEAT, outcome
        remote_store.send_signal(signal.SIGCONT)
        thaw(groups[1])
    finally:
        close(groups)


def test_a_claim_on_a_store_that_stopped_answering_fails_the_step_in_bounded_time(remote_store):
    """A collective completed everywhere, then the store's node vanished before the claims: each participant's
    claim gives up after the claim timeout and the step is discarded (its collective counted for nothing)."""
    import signal

    groups = pair(remote_store, 10)
    try:
        outcomes: list[dict] = [{}, {}]
        threads = [threading.Thread(target=average, args=(g, 1.0, o), kwargs={"agree": False})
                   for g, o in zip(groups, outcomes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [o.get("sum") for o in outcomes] == [2.0, 2.0], outcomes
        freeze(remote_store)
        started = time.monotonic()
        with pytest.raises(PeerGone, match="did not answer"):
            groups[0].agree()
        assert time.monotonic() - started < 10 * HEARTBEAT
        remote_store.send_signal(signal.SIGCONT)
    finally:
        close(groups)


def test_a_slow_participant_that_beats_is_waited_for(store):
    groups = pair(store, 2)
    try:
        outcomes: list[dict] = [{}, {}]
        first = threading.Thread(target=average, args=(groups[0], 1.0, outcomes[0]))
        first.start()
        time.sleep(4 * HEARTBEAT)  # a long step on the other node: it still beats
        average(groups[1], 2.0, outcomes[1])
        first.join(30)
        assert [o.get("sum") for o in outcomes] == [3.0, 3.0], outcomes
    finally:
        close(groups)


def test_a_collective_one_participant_gave_up_is_discarded_by_every_participant(store):
    """A participant taken for gone wrongly (its process starved past the heartbeat timeout): the other gave the
    collective up, so this one, whose collective then completed (it pairs with the one left waiting), must not
    commit the step either."""
    groups = pair(store, 3)
    try:
        outcomes: list[dict] = [{}, {}]
        first = threading.Thread(target=average, args=(groups[0], 1.0, outcomes[0]))
        first.start()
        time.sleep(HEARTBEAT)
        groups[0]._on_gone("rank 1 has not beaten (a test's verdict)")  # pylint: disable=protected-access
        first.join(30)
        assert "rank 1" in outcomes[0]["gone"], outcomes
        average(groups[1], 2.0, outcomes[1])
        # read from the claim after its collective completed, or at its beat while it waited (a loaded machine)
        assert "another participant gave" in outcomes[1]["gone"], outcomes
    finally:
        close(groups)


def test_the_next_quorum_meets_on_a_new_group_without_waiting_for_the_one_given_up(store):
    groups = pair(store, 4)
    try:
        frozen(groups[1])
        given_up: dict = {}
        average(groups[0], 1.0, given_up)
        assert "gone" in given_up, given_up
        started = time.monotonic()
        configure(store, groups[:1], 5)  # the survivor alone (gloo's abort of the old group: the 30 s timeout)
        outcome: dict = {}
        average(groups[0], 1.0, outcome)
        assert outcome.get("sum") == 1.0 and time.monotonic() - started < 10, outcome
        thaw(groups[1])
    finally:
        close(groups)


def both_average(groups: list[WatchedGroup]) -> list[dict]:
    outcomes: list[dict] = [{} for _ in groups]
    threads = [threading.Thread(target=average, args=(g, 1.0 + i, outcomes[i])) for i, g in enumerate(groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


def test_a_group_on_the_store_prefix_of_an_earlier_one_forms_without_its_leftovers(store):
    """A coordinator that restarts numbers its quorums from 1 again, so a new group meets under the store prefix of
    an earlier one of the job. Its gloo records are gone once it formed, so the new group's rank 1, there first,
    waits for rank 0's own rather than connecting to the old rank 0 (gloo's connect timeout: the step lost, 30 s on
    AKS); and the new group's claims and beats are its own, so a claim the old group left does not decide the new
    group's step."""
    old = pair(store, 1)
    assert [o.get("sum") for o in both_average(old)] == [3.0, 3.0]
    leftovers = create_store_client(f"127.0.0.1:{store.port}/torchft/1/0", timeout=timedelta(seconds=5))
    assert not leftovers.check(["0/0"]) and not leftovers.check(["0/1"])  # gloo's records, read and gone
    old_space = bytes(leftovers.get("elastictrain/space")).decode()
    for key in (f"{old_space}/elastictrain/claim/1/1", "elastictrain/claim/1/1"):
        leftovers.set(key, "given-up")  # the old group's first collective, given up
    close(old)
    for group in old:
        group.inner.shutdown()
    new = [WatchedGroup(lambda: ProcessGroupGloo(timeout=TIMEOUT), heartbeat_timeout=HEARTBEAT) for _ in range(2)]
    started = time.monotonic()
    address = f"127.0.0.1:{store.port}/torchft/1/0"
    threads = [threading.Thread(target=new[i].configure, args=(address, f"r{i}", i, 2, 1)) for i in (1, 0)]
    threads[0].start()
    time.sleep(1.0)  # rank 1 alone: it would have read the old rank 0's record by now
    threads[1].start()
    for t in threads:
        t.join(20)
    try:
        assert not any(t.is_alive() for t in threads) and time.monotonic() - started < 10
        assert [o.get("sum") for o in both_average(new)] == [3.0, 3.0]  # not PeerGone from the old claim
        assert bytes(leftovers.get("elastictrain/space")).decode() != old_space
    finally:
        close(new)


def test_the_claims_of_steps_every_participant_is_past_are_deleted(store):
    """A claim a collective, never read again once every participant is in a later step: the quorum's store (a
    node's) must not keep them all (two or three a step: ~100 MB a day of 0.5 s steps)."""
    groups = pair(store, 1)
    try:
        baseline = store.num_keys()
        for _ in range(40):
            assert [o.get("sum") for o in both_average(groups)] == [3.0, 3.0]
        time.sleep(3 * HEARTBEAT)  # the first participant's beat deletes them
        assert store.num_keys() - baseline <= 3, store.num_keys() - baseline  # the last steps' own, and no more
    finally:
        close(groups)


# -- NCCL: the communicator is aborted, and only once the claim is this participant's (fakes: no GPU here) -----------
class PendingWork:
    """A collective on the GPU that a gone peer holds up: its future ends only when its communicator is aborted."""

    def __init__(self) -> None:
        self.future: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.future

    def wait(self) -> bool:
        self.future.wait()
        return True


class FakeProcessGroupNCCL(ProcessGroupGloo):
    """torchft's ProcessGroupNCCL as the watch sees it (an abortable backend): configured on the real store, its
    collectives pending until ``abort()``, which fails them as ncclCommAbort does."""

    def __init__(self) -> None:
        super().__init__(timeout=TIMEOUT)
        self.pending: list[PendingWork] = []
        self.aborted = threading.Event()

    def configure(self, *args, **kwargs) -> None:
        super().configure(*args, **kwargs)  # torchft's configure aborts the group it replaces: not a give-up
        self.aborted.clear()

    def allreduce(self, tensors, opts):
        self.pending.append(PendingWork())
        return self.pending[-1]

    def abort(self, errored: bool = True) -> None:
        self.aborted.set()
        for work in self.pending:
            if not work.future.done():
                work.future.set_exception(RuntimeError("NCCL communicator was aborted"))


def nccl_pair(store, quorum: int) -> list[WatchedGroup]:
    groups = [WatchedGroup(FakeProcessGroupNCCL, heartbeat_timeout=HEARTBEAT, abortable=True) for _ in range(2)]
    configure(store, groups, quorum)
    return groups


def test_a_cuda_collective_held_by_a_gone_peer_has_its_communicator_aborted(store):
    groups = nccl_pair(store, 7)
    try:
        frozen(groups[1])
        outcome: dict = {}
        started = time.monotonic()
        with pytest.raises(RuntimeError):  # PeerGone, or the aborted communicator's error if it landed first
            groups[0].next_step()
            groups[0].wait(groups[0].allreduce([torch.zeros(1)], None))
        assert time.monotonic() - started < 10 * HEARTBEAT, outcome
        assert groups[0].inner.aborted.wait(5)  # on a thread of its own
    finally:
        close(groups)


def test_a_cuda_collective_another_participant_completed_is_not_aborted(store):
    """The verdict comes after the other participant claimed the collective done: this one's completes too (the
    other got its part), so aborting the communicator would lose a step the other commits."""
    groups = nccl_pair(store, 8)
    try:
        for g in groups:
            g.next_step()
        works = [g.allreduce([torch.zeros(1)], None) for g in groups]
        waiter = threading.Thread(target=groups[0].wait, args=(works[0],))
        waiter.start()
        works[1].future.set_result(None)
        groups[1].wait(works[1])
        groups[1].agree()  # claimed done
        groups[0]._on_gone("rank 1 has not beaten (a test's verdict)")  # pylint: disable=protected-access
        time.sleep(2 * HEARTBEAT)
        assert not groups[0].inner.aborted.is_set()
        works[0].future.set_result(None)  # it completes after all
        waiter.join(10)
        assert not waiter.is_alive()
        groups[0].agree()  # and agrees: done
    finally:
        close(groups)
