"""The reporter alone: progress events rate-limited on a fake clock, and the honest ``interrupted`` record."""
from __future__ import annotations

import pytest

from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.reporting import Reporter


class FakeEvents:  # runtime/progress.py's EventLog interface: emit, flush, close
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict]] = []
        self.flushed = 0

    def emit(self, kind: str, **fields) -> None:
        self.emitted.append((kind, fields))

    def flush(self, timeout: float = 10.0) -> None:
        self.flushed += 1

    def close(self, timeout: float = 10.0) -> None:
        pass


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reporter(rank: int = 0, **kwargs) -> tuple[Reporter, FakeEvents, Clock, Clock]:
    events, clock, wall = FakeEvents(), Clock(50.0), Clock(1_700_000_000.0)
    return Reporter(events, rank=rank, world_size=4, clock=clock, wall=wall, **kwargs), events, clock, wall  # type: ignore


def test_first_step_is_reported_at_once_then_at_most_every_progress_seconds_with_the_rate() -> None:
    rep, events, clock, _ = reporter(progress_seconds=10.0)
    clock.now += 3.0
    rep.record_progress(1, 64, {"loss": 2})
    assert events.emitted == [(progress.PROGRESS, {"step": 1, "world_size": 4, "metrics": {"loss": 2.0}})]
    for step in range(2, 6):  # 4 steps of 64 samples over 8 s: under the interval, nothing sent
        clock.now += 2.0
        rep.record_progress(step, 64, None)
    assert len(events.emitted) == 1
    clock.now += 2.0
    rep.record_progress(6, 64, None)  # 10 s after the first report: 5 steps * 64 samples / 10 s
    assert events.emitted[1] == (progress.PROGRESS, {"step": 6, "world_size": 4, "samples_per_s": 32.0})


def test_only_rank_0_reports_progress() -> None:
    rep, events, _, _ = reporter(rank=1)
    rep.record_progress(1, 64, None)
    assert events.emitted == []


def test_interruption_records_the_last_agreed_step_once_and_flushes() -> None:
    rep, events, _, wall = reporter()
    rep.completed(7)
    wall.now += 1.0
    rep.record_interruption([wall.now + 0.4, wall.now + 0.2])
    rep.record_interruption([])
    assert events.emitted == [(progress.INTERRUPTED, {"step": 7, "step_time": 1_700_000_000.0, "world_size": 4,
                                                      "sigterm_time": pytest.approx(1_700_000_001.2)})]
    assert events.flushed == 1


def test_interruption_records_the_step_this_rank_reached_when_a_peer_died_during_its_agreement() -> None:
    rep, events, _, wall = reporter(rank=2)
    rep.completed(7)
    wall.now += 0.5
    rep.reached(8)  # the optimizer step of 8 ran; the all-reduce that agrees on it failed
    rep.record_interruption([])
    assert events.emitted == [(progress.INTERRUPTED, {"step": 8, "step_time": 1_700_000_000.5, "world_size": 4})]


@pytest.mark.parametrize("case", ["finished", "no step", "no event log"])
def test_nothing_is_recorded_after_the_end_before_any_step_or_without_an_event_log(case: str) -> None:
    rep, events, _, _ = reporter()
    if case != "no step":
        rep.completed(3)
    rep.finished = case == "finished"
    if case == "no event log":
        rep.events = None
    rep.record_interruption([])
    assert events.emitted == [] and events.flushed == 0


def test_a_new_world_reports_its_first_step_at_once_at_its_size_without_the_old_rate() -> None:
    """In-process: the workers outlive a re-form, so the reporter is told of the new world; its first step is the
    end of the outage (core/eventlog/goodput.py), which a report 10 s later would stretch."""
    rep, events, clock, _ = reporter(progress_seconds=10.0)
    rep.record_progress(1, samples=64, metrics=None)
    clock.now += 1.0
    rep.record_progress(2, samples=64, metrics=None)  # rate-limited
    rep.new_world(2)
    clock.now += 1.0
    rep.record_progress(3, samples=64, metrics=None)
    assert [(kind, fields) for kind, fields in events.emitted][-1] == (progress.PROGRESS, {"step": 3, "world_size": 2})
