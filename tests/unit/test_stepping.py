"""The step policy alone: what every rank does at a step boundary, driven by fakes of its collaborators.

The collectives are a fake of our own interface (runtime/collectives.py): this rank's values, max-reduced with
the values the test says the other ranks sent. The clock is a fake that the policy's waits advance. Saving, the
memory tier and the event log are recorded, not run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.stepping import Notices, StepPolicy


@dataclass(frozen=True)
class Notice:  # the fields of runtime/preemption.py's PreemptionNotice the policy reads
    source: str
    event_id: str | None = None
    received_at: float = 0.0


class FakeRanks:
    """This rank among ``world_size``; each all-reduce takes the peers' next values from ``peers``."""

    def __init__(self, rank: int = 0, world_size: int = 2, peers: list[list[int]] | None = None):
        self.rank, self.world_size, self.distributed = rank, world_size, True
        self.peers = list(peers or [])
        self.reduced: list[list[int]] = []  # what this rank contributed, per all-reduce

    def all_reduce_max(self, values: list[int]) -> list[int]:
        self.reduced.append(list(values))
        theirs = self.peers.pop(0) if self.peers else [0] * len(values)
        return [max(a, b) for a, b in zip(values, theirs)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeWatcher:
    """The PreemptionWatcher's interface: notices (a SIGTERM may arrive at a given clock time), acknowledge."""

    def __init__(self, clock: FakeClock, notices: list[Notice] | None = None, sigterm_at: float | None = None):
        self.clock, self.listed, self.sigterm_at, self.acknowledged = clock, list(notices or []), sigterm_at, 0

    def notices(self) -> list[Notice]:
        if self.sigterm_at is not None and self.clock.now >= self.sigterm_at:
            self.listed.append(Notice("sigterm", received_at=self.clock.now))
            self.sigterm_at = None
        return list(self.listed)

    def acknowledge(self) -> None:
        self.acknowledged += 1


class FakeEvents:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict]] = []

    def emit(self, kind: str, **fields) -> None:
        self.emitted.append((kind, fields))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.emitted]


@dataclass
class World:
    ranks: FakeRanks
    clock: FakeClock = field(default_factory=FakeClock)
    watcher: FakeWatcher | None = None
    events: FakeEvents = field(default_factory=FakeEvents)
    saves: list[tuple[int, bool]] = field(default_factory=list)
    kept: bool = True
    durable: bool = True
    leaving: bool = False
    last_save: float = 1000.0

    def policy(self, **settings) -> StepPolicy:
        reporter = Reporter(self.events, rank=self.ranks.rank, world_size=self.ranks.world_size,  # type: ignore
                            clock=self.clock)
        return StepPolicy(
            self.ranks, Notices(self.watcher, clock=self.clock, sleep=self.clock.sleep), reporter,  # type: ignore
            save=lambda step, state, blocking=None: self.saves.append((step, bool(blocking))),
            kept_here=lambda step: self.kept, durable=lambda: self.durable,
            last_save_time=lambda: self.last_save, clock=self.clock, leaving=lambda: self.leaving, **settings)


def at(policy: StepPolicy, step: int) -> bool:
    return policy.at_step(step, {}, samples=None, metrics=None)


def test_interval_save_every_n_steps_decided_by_rank_0_and_taken_by_every_rank() -> None:
    leader = World(FakeRanks(rank=0))
    assert [at(leader.policy(interval_steps=3), step) for step in range(1, 7)] == [False] * 6
    assert leader.saves == [(3, False), (6, False)]  # in the background: not blocking
    # rank 1 never decides a save itself; it saves because rank 0's flag comes back from the all-reduce
    follower = World(FakeRanks(rank=1, peers=[[0, 0, 0], [0, 0, 1]]))
    policy = follower.policy(interval_steps=2)
    assert not at(policy, 1) and not at(policy, 3)
    assert follower.ranks.reduced == [[0, 0, 0], [0, 0, 0]]
    assert follower.saves == [(3, False)]


def test_interval_in_seconds_counts_from_the_last_save() -> None:
    world = World(FakeRanks(rank=0))
    policy = world.policy(interval_seconds=30.0)
    world.clock.now = world.last_save + 29.9
    at(policy, 1)
    world.clock.now = world.last_save + 30.0
    at(policy, 2)
    assert world.saves == [(2, False)]


def test_every_step_is_recorded_completed_once_the_ranks_agreed() -> None:
    world = World(FakeRanks(rank=0))
    policy = world.policy()
    at(policy, 7)
    assert policy.reporter.last_step == 7
    assert world.events.emitted[0] == (progress.PROGRESS, {"step": 7, "world_size": 2})  # the first at once


def test_sigterm_with_the_step_in_every_nodes_memory_stops_without_a_blob_save() -> None:
    world = World(FakeRanks(rank=0, peers=[[0, 1, 0], [0]]))
    world.watcher = FakeWatcher(world.clock, [Notice("sigterm")])
    assert at(world.policy(), 5) is True
    assert world.saves == []
    assert world.ranks.reduced == [[0, 1, 0], [0]]  # the agreement, then "every node holds it"
    assert (progress.REFORMING, {"step": 5, "kept_in_memory": True, "world_size": 2}) in world.events.emitted
    assert (progress.PREEMPTED, {"step": 5, "source": "sigterm", "event_id": None}) in world.events.emitted


@pytest.mark.parametrize("missing", ["peer", "here", "leaving", "nothing durable"])
def test_sigterm_saves_to_blob_when_any_node_would_lose_the_step(missing: str) -> None:
    world = World(FakeRanks(rank=0, peers=[[0, 1, 0], [1 if missing == "peer" else 0]]))
    world.watcher = FakeWatcher(world.clock, [Notice("sigterm")])
    world.kept = missing != "here"
    world.leaving = missing == "leaving"
    world.durable = missing != "nothing durable"
    assert at(world.policy(), 5) is True
    assert world.saves == [(5, True)]
    assert world.ranks.reduced[1] == [0 if missing == "peer" else 1]
    assert (progress.REFORMING, {"step": 5, "kept_in_memory": False, "world_size": 2}) in world.events.emitted


def test_a_rank_whose_peer_got_sigterm_waits_for_its_own_then_stops() -> None:
    world = World(FakeRanks(rank=1, peers=[[0, 1, 0], [0]]))
    world.watcher = FakeWatcher(world.clock, sigterm_at=world.clock.now + 1.0)
    assert at(world.policy(sigterm_wait_seconds=5.0), 4) is True
    assert 1.0 <= world.clock.now - 1000.0 < 1.2  # it stopped as soon as its own SIGTERM came
    # ... and recorded it as a rank that had it at the step's end does (a node's first worker signalled last:
    # tests/integration/test_determinism.py once found no preempted event)
    preempted = [fields for kind, fields in world.events.emitted if kind == progress.PREEMPTED]
    assert preempted == [{"step": 4, "source": "sigterm", "event_id": None}]


def test_a_rank_whose_own_sigterm_never_comes_trains_on_after_the_wait() -> None:
    world = World(FakeRanks(rank=1, peers=[[0, 1, 0], [0]]))
    world.watcher = FakeWatcher(world.clock)
    assert at(world.policy(sigterm_wait_seconds=5.0), 4) is False
    assert world.clock.now - 1000.0 == pytest.approx(5.0, abs=0.06)


def test_scheduled_event_saves_acknowledges_and_holds_until_sigterm() -> None:
    world = World(FakeRanks(rank=0))
    world.watcher = FakeWatcher(world.clock, [Notice("scheduled-events", event_id="E1")], sigterm_at=1012.0)
    assert at(world.policy(hold_seconds=60.0), 9) is True
    assert world.saves == [(9, True)] and world.watcher.acknowledged == 1
    assert world.ranks.reduced[0] == [1, 0, 0]
    assert 12.0 <= world.clock.now - 1000.0 < 12.2  # held until the VM went, not the whole hold
    assert (progress.PREEMPTED, {"step": 9, "source": "scheduled-events", "event_id": "E1"}) in world.events.emitted


def test_a_called_off_eviction_trains_on_after_the_hold_and_is_not_acted_on_twice() -> None:
    world = World(FakeRanks(rank=0))
    world.watcher = FakeWatcher(world.clock, [Notice("scheduled-events", event_id="E1")])
    policy = world.policy(hold_seconds=20.0)
    assert at(policy, 9) is False
    assert world.clock.now - 1000.0 == pytest.approx(20.0, abs=0.15)
    assert at(policy, 10) is False  # the event stays listed until the VM goes: handled once
    assert world.saves == [(9, True)] and world.watcher.acknowledged == 1
    assert world.ranks.reduced[1] == [0, 0, 0]


def test_a_notice_on_another_node_makes_this_rank_save_the_same_step_without_holding() -> None:
    world = World(FakeRanks(rank=1, peers=[[1, 0, 0]]))
    world.watcher = FakeWatcher(world.clock)
    assert at(world.policy(hold_seconds=60.0), 3) is False
    assert world.saves == [(3, True)]
    assert world.clock.now == 1000.0  # nothing to acknowledge here: no hold
    assert progress.PREEMPTED not in world.events.kinds()


@pytest.mark.parametrize("own", ["scheduled-events", "sigterm"])
def test_a_departure_records_the_notice_keeps_the_step_then_acknowledges_and_holds(own: str, caplog) -> None:
    """The shape both recovery modes leave by (the in-process loop's ``keep`` leaves the quorum): the notice is
    stamped before the step is kept, acknowledged after, and the node holds until its VM goes."""
    world = World(FakeRanks(rank=0))
    notice = Notice(own, event_id="E1" if own != "sigterm" else None)
    world.watcher = FakeWatcher(world.clock, [notice])
    policy = world.policy(hold_seconds=20.0)
    order: list[str] = []

    def keep() -> None:
        order.append(f"kept after {len(world.events.emitted)} event(s), {world.watcher.acknowledged} ack(s)")

    with caplog.at_level("WARNING", logger="azext_elastictrain.runtime.stepping"):
        stopped = policy.depart(4, [notice], keep=keep, after="ending this worker")
    assert order == ["kept after 1 event(s), 0 ack(s)"]
    assert world.events.emitted == [(progress.PREEMPTED, {"step": 4, "source": own, "event_id": notice.event_id})]
    assert policy.notices.live() == []  # acted on once
    if own == "sigterm":  # nothing to acknowledge: stop at once
        assert stopped is True and world.watcher.acknowledged == 0 and world.clock.now == 1000.0
    else:  # acknowledged; the VM stayed: the caller goes on, and the log says how
        assert stopped is False and world.watcher.acknowledged == 1
        assert world.clock.now - 1000.0 == pytest.approx(20.0, abs=0.15)
        assert "20s of the acknowledgement: ending this worker" in caplog.text
