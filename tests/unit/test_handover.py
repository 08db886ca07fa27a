"""A departing node's handover (runtime/handover.py): when each participant holds, and when the departing one leaves.

Every participant runs the same ``Handover`` on the same sums of each step's start collective and the same verdict,
so these follow a departing node and a survivor side by side through the steps of a handover.
"""
from __future__ import annotations

import pytest

from azext_elastictrain.runtime.handover import (HEARD_WAIT, MARGIN_SECONDS, MAX_STEP_SECONDS, NOTICE_STEPS,
                                                 Handover, saves_on_departure, time_left)
from azext_elastictrain.runtime.preemption import SOURCE_SCHEDULED_EVENTS, SOURCE_SIGTERM, PreemptionNotice

HEARTBEAT = 0.5


def timed(step_seconds: float) -> Handover:
    """A handover that has seen one step of ``step_seconds``."""
    handover = Handover(HEARTBEAT)
    handover.begin(100.0)
    handover.begin(100.0 + step_seconds)
    return handover


def step(nodes: list[Handover], now: float, *, committed: bool = True, diverged: bool = False) -> None:
    """One step on every node: the start collective's sums (each node's flags, summed), then the verdict. A node
    that departs stops its heartbeats once the sums are in (ReplicaGroup._hand_over)."""
    flags = [n.flags(n.leaving and n.ready_now(now)) for n in nodes]
    departing, ready = (round(sum(f[i] for f in flags)) for i in (0, 1))
    for node in nodes:
        node.started(departing, ready, diverged=diverged, participants=len(nodes))
        if node.leaving and node.stopped_at is None:
            node.stopped_at = now
    for node in nodes:
        node.ended(committed=committed)


def test_a_departing_node_trains_until_its_heartbeat_is_old_enough_then_leaves_and_the_others_ask() -> None:
    leaver, survivor = timed(0.1), timed(0.1)
    leaver.leaving = True
    now = 200.0
    step([leaver, survivor], now)  # it says it departs; its heartbeats stop
    assert leaver.stopped_at == now and survivor.hold and leaver.hold and not leaver.done
    steps = 1
    while not leaver.done:
        now += 0.1
        step([leaver, survivor], now)
        steps += 1
        assert survivor.hold == (not leaver.done), "the others hold exactly as long as the departing node trains"
    # its last step is the first at whose start its last heartbeat is the timeout old
    assert now - leaver.stopped_at >= HEARTBEAT + MARGIN_SECONDS
    assert not leaver.ready_now(now - 0.1), "it trained a step longer than needed"
    assert not survivor.hold and not survivor.done and steps >= 2


def test_a_departing_node_the_coordinator_still_hears_is_not_ready_until_it_is_dropped_or_waited_long_enough() -> None:
    """The timer is the floor; the coordinator's own view decides past it (a heartbeat that left late under load
    made the others' quorum wait for the node). Asked only once the timer is up; past HEARD_WAIT heartbeat timeouts
    the node leaves whatever it says."""
    leaver = timed(0.1)
    leaver.leaving, leaver.stopped_at = True, 200.0
    asked: list[float] = []

    def hears(answer: bool | None):
        def heard() -> bool | None:
            asked.append(answer)
            return answer
        return heard

    assert not leaver.ready_now(200.0 + HEARTBEAT, hears(True)) and not asked  # not yet: not asked
    up = 200.0 + HEARTBEAT + MARGIN_SECONDS + 0.01
    assert not leaver.ready_now(up, hears(True)) and asked == [True]
    assert leaver.ready_now(up, hears(False)) and leaver.ready_now(up, hears(None))
    assert leaver.ready_now(up, None)
    assert leaver.ready_now(200.0 + HEARD_WAIT * HEARTBEAT + MARGIN_SECONDS + 0.01, hears(True))


def test_a_step_as_long_as_the_heartbeat_timeout_hands_over_in_the_step_after_the_node_says_it_departs() -> None:
    """Ready only once its last heartbeat is the timeout old, never on a guess of the step's length: a step that
    ran shorter than the one before let the others ask while the coordinator still heard the node."""
    seconds = HEARTBEAT + MARGIN_SECONDS + 0.01
    leaver, survivor = timed(seconds), timed(seconds)
    leaver.leaving = True
    step([leaver, survivor], 200.0)
    assert not leaver.done and survivor.hold
    step([leaver, survivor], 200.0 + seconds)
    assert leaver.done and not survivor.hold


@pytest.mark.parametrize("how", ["discarded", "diverged"])
def test_a_step_that_fails_during_the_handover_ends_it_on_every_participant(how: str) -> None:
    leaver, survivor = timed(0.05), timed(0.05)
    leaver.leaving = True
    step([leaver, survivor], 200.0)
    assert survivor.hold
    step([leaver, survivor], 200.05, committed=how != "discarded", diverged=how == "diverged")
    assert leaver.done and not survivor.hold, "the others ask the coordinator; the departing node leaves"


def test_a_start_collective_that_fails_ends_a_handover_under_way_but_not_one_not_yet_said() -> None:
    leaver = timed(0.05)
    leaver.leaving = True
    leaver.failed()  # its announcing step's start failed: nobody heard it, it still beats
    assert not leaver.done and leaver.stopped_at is None
    step([leaver], 200.0)
    leaver.failed()
    assert leaver.done and not leaver.hold


def test_two_departing_nodes_leave_together_once_both_are_ready() -> None:
    first, second, survivor = timed(0.1), timed(0.1), timed(0.1)
    first.leaving = True
    now = 200.0
    step([first, second, survivor], now)
    second.leaving = True  # its notice a step later
    now += 0.1
    step([first, second, survivor], now)
    while not first.done:
        assert not second.done
        now += 0.1
        step([first, second, survivor], now)
    assert second.done and not survivor.hold
    assert now - second.stopped_at >= HEARTBEAT + MARGIN_SECONDS, "the later one waited its own heartbeat out"


def test_no_handover_where_it_would_take_long_or_no_coordinator_drops_the_node() -> None:
    assert timed(0.2).possible(None)
    assert not Handover(HEARTBEAT).possible(None, now=100.0), "no step begun yet"
    first = Handover(HEARTBEAT)
    first.begin(100.0)  # a notice as the node's first step ends: that step's time counts
    assert first.possible(None, now=100.2) and not first.possible(None, now=100.0 + MAX_STEP_SECONDS + 0.1)
    needed = HEARTBEAT + MARGIN_SECONDS + NOTICE_STEPS * 0.2
    assert first.possible(needed + 0.01, now=100.2) and not first.possible(needed - 0.01, now=100.2)
    assert not Handover(None).possible(None), "no coordinator"
    assert not timed(MAX_STEP_SECONDS + 0.1).possible(None)
    needed = HEARTBEAT + MARGIN_SECONDS + NOTICE_STEPS * 0.2
    assert timed(0.2).possible(needed + 0.01) and not timed(0.2).possible(needed - 0.01), "the notice expires first"


def test_a_node_that_does_not_depart_says_nothing() -> None:
    survivor = timed(0.1)
    assert survivor.flags(True) == [0.0, 0.0] and not survivor.active
    step([survivor], 200.0)
    assert not survivor.hold and not survivor.done and survivor.stopped_at is None


def test_when_every_node_departs_nobody_holds_and_all_leave_at_once() -> None:
    """Spot capacity reclaimed from the whole job: nobody stays to hand over to (the quorum's writer saves the step,
    runtime/loops/in_process.py)."""
    first, second = timed(0.1), timed(0.1)
    first.leaving = second.leaving = True
    step([first, second], 200.0)
    assert first.everyone and second.everyone and first.done and second.done and not first.hold


@pytest.mark.parametrize("participants, writer, handed_over, everyone, saves", [
    (1, True, False, False, True),  # alone: nobody else holds it
    (3, True, True, False, False),  # handed over, the others stay: they hold it
    (3, False, True, True, False),  # every node departs: the writer saves, not this one
    (3, True, True, True, True),  # ... this one is the writer
    (3, True, False, False, True),  # left without a handover: the others may be leaving too
    (3, False, False, False, False),  # ... and then the writer saves, if it leaves too
])
def test_a_departing_node_saves_its_step_where_no_peer_may_be_left_to_hold_it(
        participants, writer, handed_over, everyone, saves) -> None:
    assert saves_on_departure(participants=participants, writer=writer, handed_over=handed_over,
                              everyone=everyone) == saves


def notice(source: str, not_before: float | None) -> PreemptionNotice:
    return PreemptionNotice(source=source, event_id="e" if source == SOURCE_SCHEDULED_EVENTS else None,
                            event_type="Preempt" if source == SOURCE_SCHEDULED_EVENTS else None,
                            not_before=not_before, received_at=0.0, description="")


def test_the_time_a_notice_leaves_for_a_handover() -> None:
    """A Scheduled Event until its NotBefore; one whose NotBefore IMDS blanked has started: no time, the node
    leaves at once; a SIGTERM does not say."""
    assert time_left([notice(SOURCE_SCHEDULED_EVENTS, 130.0)], now=100.0) == 30.0
    assert time_left([notice(SOURCE_SCHEDULED_EVENTS, None)], now=100.0) == 0.0
    assert time_left([notice(SOURCE_SIGTERM, None)], now=100.0) is None
    assert time_left([notice(SOURCE_SIGTERM, None), notice(SOURCE_SCHEDULED_EVENTS, 105.0)], now=100.0) == 5.0
    assert not timed(0.05).possible(time_left([notice(SOURCE_SCHEDULED_EVENTS, None)], now=100.0))
