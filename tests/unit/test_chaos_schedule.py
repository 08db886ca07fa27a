"""evict simulate --schedule: the schedule planned from rate, duration, notice share and seed; carried out
through a backend's evictor, stopped by Ctrl-C; its values checked before anything happens; its table."""
from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest
from azure.cli.core import azclierror as az
from hypothesis import given, settings
from hypothesis import strategies as st

from azext_elastictrain import _errors
from azext_elastictrain._format import eviction_table
from azext_elastictrain._validators import Target, resolve_schedule
from azext_elastictrain.backends.local.chaos import LocalScheduleEvictor
from azext_elastictrain.core.chaos import (
    FollowStopped,
    ScheduleError,
    ScheduleSpec,
    Skipped,
    plan_schedule,
    run_schedule,
    sleeper,
    stop_on_interrupt,
)

# a spec is checked as it is built: draw its values, keep those of a schedule with 1 to 1000 evictions, then build
specs = st.fixed_dictionaries(dict(
    rate=st.floats(min_value=0.05, max_value=60, allow_nan=False),
    duration=st.floats(min_value=1, max_value=7200, allow_nan=False),
    notice_share=st.floats(min_value=0, max_value=1),
    notice_seconds=st.floats(min_value=0, max_value=120),
    replace_after=st.one_of(st.none(), st.floats(min_value=0, max_value=300)),
    seed=st.integers(min_value=0, max_value=2**31),
)).filter(lambda f: f["duration"] >= 60.0 / f["rate"]
          and math.floor(f["duration"] / (60.0 / f["rate"]) + 1e-9) <= 1000).map(lambda f: ScheduleSpec(**f))


@settings(max_examples=200, deadline=None)
@given(specs)
def test_a_schedule_evicts_once_an_interval_within_the_duration_and_exactly_its_share_with_notice(spec):
    schedule = plan_schedule(spec)
    times = [e.at for e in schedule.evictions]
    assert len(times) == math.floor(spec.duration * spec.rate / 60 + 1e-9) >= 1
    assert times[0] == pytest.approx(spec.interval) and times[-1] <= spec.duration + 1e-6
    assert all(b - a == pytest.approx(spec.interval) for a, b in zip(times, times[1:]))
    noticed = [e for e in schedule.evictions if e.notice_seconds]
    expected = math.floor(spec.notice_share * len(times) + 0.5)
    # a zero-second notice is no notice: every eviction has none, whatever the share
    assert len(noticed) == (expected if spec.notice_seconds else 0)
    assert {e.notice_seconds for e in noticed} <= {spec.notice_seconds}
    assert all(e.replace_after == spec.replace_after and 0 <= e.pick < 1 for e in schedule.evictions)
    assert [e.index for e in schedule.evictions] == list(range(1, len(times) + 1))


@settings(max_examples=50, deadline=None)
@given(specs, st.lists(st.text("abcdef-0123", min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
def test_one_seed_makes_one_schedule_and_picks_the_same_running_node(spec, running):
    first, again = plan_schedule(spec), plan_schedule(spec)
    assert first == again and first.to_dict() == again.to_dict()
    for item in first.evictions:
        assert item.choose(running) in running
        assert item.choose(list(reversed(running))) == item.choose(running)  # by name, not by listing order


def test_without_a_seed_one_is_drawn_and_recorded_so_the_schedule_can_be_made_again():
    drawn = plan_schedule(ScheduleSpec(rate=2, duration=300, seed=None))
    again = plan_schedule(ScheduleSpec(rate=2, duration=300, seed=drawn.seed))
    assert drawn.to_dict()["seed"] == drawn.seed and again.evictions == drawn.evictions


def test_the_seed_decides_which_evictions_get_notice():
    plans = {tuple(bool(e.notice_seconds) for e in plan_schedule(ScheduleSpec(1, 600, seed=s)).evictions)
             for s in range(20)}
    assert len(plans) > 1 and all(sum(p) == 5 for p in plans)  # 10 evictions, always exactly half


@pytest.mark.parametrize("fields, expected", [
    ({"rate": 0}, "--rate 0: give evictions per minute, more than 0"),
    ({"rate": -1}, "--rate -1"),
    ({"rate": float("nan")}, "--rate nan"),
    ({"duration": 0}, "--duration 0"),
    ({"duration": 59}, "--duration 59s is too short for one eviction at --rate 1 a minute"),
    ({"notice_share": 1.5}, "--notice-share 1.5: give the share of evictions that get a notice, from 0"),
    ({"notice_share": -0.1}, "--notice-share -0.1"),
    ({"notice_seconds": -1}, "--notice-seconds -1"),
    ({"replace_after": -5}, "--replace-after -5"),
    ({"rate": 600, "duration": 3600}, "at most 1000 in one schedule"),
    ({"seed": -3}, "--seed -3"),
])
def test_bad_values_are_refused_before_anything_is_planned(fields, expected):
    with pytest.raises(ScheduleError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        ScheduleSpec(**{"rate": 1, "duration": 600, **fields})


# -- the command's checks, as az errors --------------------------------------------------------------------

def _resolve(**given):
    args = {"schedule": True, "job": "cifar", "rate": 1.0, "duration": 600.0, "notice_share": None,
            "notice_seconds": None, "replace_after": None, "seed": None, **given}
    return resolve_schedule(**args)


@pytest.mark.parametrize("given, error, expected", [
    ({"rate": 0.0}, az.InvalidArgumentValueError, "--rate 0"),
    ({"notice_share": 2.0}, az.InvalidArgumentValueError, "--notice-share 2"),
    ({"duration": 10.0}, az.InvalidArgumentValueError, "too short for one eviction"),
    ({"replace_after": -1.0}, az.InvalidArgumentValueError, "--replace-after -1"),
    ({"notice_seconds": -2.0}, az.InvalidArgumentValueError, "--notice-seconds -2"),
    ({"job": None}, az.RequiredArgumentMissingError, "--schedule needs --job"),
    ({"rate": None, "duration": None}, az.RequiredArgumentMissingError, "--rate, --duration"),
    ({"node": "n0"}, az.MutuallyExclusiveArgumentError, "drop --node"),
    ({"wait": True, "count": 2}, az.MutuallyExclusiveArgumentError, "drop --count, --wait"),
    ({"schedule": False}, az.ArgumentUsageError, "--rate, --duration are for an eviction schedule: add --schedule"),
])
def test_the_commands_checks_are_az_errors_that_say_what_to_give(given, error, expected):
    with pytest.raises(error, match=expected.replace("(", r"\(")) as raised:
        with _errors.az_errors(Target("local", "local")):
            _resolve(**given)
    if error is az.InvalidArgumentValueError:
        assert "--dry-run" in raised.value.recommendations[0]


def test_without_schedule_and_its_flags_nothing_is_asked():
    assert resolve_schedule(schedule=False, job="cifar", rate=None, duration=None, notice_share=None,
                            notice_seconds=30.0, replace_after=5.0, seed=None) is None


# -- carrying it out ---------------------------------------------------------------------------------------

class FakeEvictor:
    """A backend's evictor as the runner sees it; records when each step was called."""

    def __init__(self, running=("job-node-0", "job-node-1"), stop_at=None, stop=None, skip=()):
        self.running, self.stop_at, self.stop, self.skip = list(running), stop_at, stop, set(skip)
        self.calls: list[tuple] = []

    def evict(self, item):
        self.calls.append(("evict", item.index, time.time()))
        if item.index in self.skip:
            raise Skipped("job 'job' runs 1 node(s), its minimum of 1")
        if item.index == self.stop_at:
            self.stop.set()  # Ctrl-C while this eviction is under way
        now = time.time()
        return {"node": item.choose(self.running), "startedAt": now, "evictedAt": now, "pid": 4242,
                "acknowledgedAfterSeconds": 0.5 if item.notice_seconds else None}

    def recovery(self, eviction, stop):
        self.calls.append(("recovery", eviction["node"]))
        return {"node": eviction["node"], "outageSeconds": 7.5, "stepsLost": 1, "resumedFromStep": 99,
                "worldSize": 1}

    def capacity_back(self, item, eviction, stop):
        self.calls.append(("back", item.index, stop.is_set()))
        back = {"stopped": True} if stop.is_set() else {
            "fullSize": {"worldSize": 2, "seconds": 3.25, "outageSeconds": 1.5}}
        return {"replacements": [{"node": "job-node-9"}], **back}

    def events(self):
        return [{"time": 100.0, "event": "started"}, {"time": 101.0, "event": "restored", "step": 0, "world_size": 2},
                {"time": 111.0, "event": "progress", "step": 100, "world_size": 2}]


def _quick(**fields) -> ScheduleSpec:
    return ScheduleSpec(**{"rate": 1200.0, "duration": 0.16, "notice_share": 0.5, "notice_seconds": 30.0,
                           "replace_after": 0.0, "seed": 3, **fields})  # one eviction every 50 ms


def test_each_eviction_is_evicted_followed_and_given_back_in_time_and_the_goodput_comes_last():
    lines: list[str] = []
    evictor = FakeEvictor()
    started = time.time()
    result = run_schedule(plan_schedule(_quick()), evictor, say=lines.append)
    evicted = [c for c in evictor.calls if c[0] == "evict"]
    assert [c[1] for c in evicted] == [1, 2, 3]
    assert all(c[2] - started >= 0.05 * c[1] - 0.005 for c in evicted), "an eviction came before its time"
    assert [c[0] for c in evictor.calls] == ["evict", "recovery", "back"] * 3
    assert result["stopped"] is False and result["ranSeconds"] >= 0.16
    first = result["evictions"][0]
    assert first["recovery"]["stepsLost"] == 1 and first["capacityBack"]["fullSize"]["seconds"] == 3.25
    assert "startedAt" not in first and "pid" not in first and first["evictedAt"].endswith("Z")
    # 10 s trained of 11: the start (started -> restored) is lost time too
    assert result["goodput"]["goodput"] == 0.9091 and result["summary"]["evicted"] == 3
    noticed = sum(1 for e in result["evictions"] if e["noticeSeconds"])
    assert noticed == 2 and result["summary"]["withNotice"]["recovered"] == 2  # round(0.5 x 3)
    assert result["summary"]["withoutNotice"]["stepsLost"] == [1]
    assert lines[0].startswith("eviction 1/3 at +0s: job-node-")
    assert "outage 7.5s (last step to first step), world size 1, 1 step(s) lost (resumed from step 99)" in lines[1]
    assert "full size 2 again after 3.25s (outage 1.5s)" in lines[2]
    assert result["summary"]["scaleUpOutageSeconds"] == [1.5, 1.5, 1.5]
    assert lines[-1] == ("goodput 90.9% of the job's node-seconds (0 step(s) retrained; rank-seconds lost: "
                         "starting 2)")


def test_ctrl_c_during_an_eviction_finishes_it_gives_the_capacity_back_at_once_and_reports_so_far():
    stop = threading.Event()
    evictor = FakeEvictor(stop_at=2, stop=stop)
    lines: list[str] = []
    result = run_schedule(plan_schedule(_quick(duration=0.5)), evictor, stop=stop, say=lines.append)
    assert [c[1] for c in evictor.calls if c[0] == "evict"] == [1, 2]  # none after the stop
    assert ("back", 2, True) in evictor.calls and ("recovery", result["evictions"][1]["node"]) not in \
        evictor.calls[3:]
    assert result["stopped"] is True and len(result["evictions"]) == 2
    assert result["evictions"][1]["capacityBack"]["stopped"] is True and "recovery" not in result["evictions"][1]
    assert result["ranSeconds"] < 0.5 and lines[-1].startswith("stopped: goodput")


def test_an_eviction_that_cannot_be_done_now_is_skipped_and_the_schedule_goes_on():
    lines: list[str] = []
    result = run_schedule(plan_schedule(_quick()), FakeEvictor(skip={2}), say=lines.append)
    assert [("skipped" in e) for e in result["evictions"]] == [False, True, False]
    assert result["summary"]["skipped"] == 1 and "skipped, job 'job' runs 1 node(s)" in "\n".join(lines)


def test_a_recovery_not_seen_is_reported_and_the_goodput_of_unreadable_events_says_why():
    class Broken(FakeEvictor):
        def recovery(self, eviction, stop):
            raise TimeoutError("did not train again within 240s")

        def events(self):
            raise OSError("connection refused")

    result = run_schedule(plan_schedule(_quick(duration=0.05)), Broken())
    assert result["evictions"][0]["recovery"] == {"error": "did not train again within 240s"}
    assert result["goodput"] is None and "connection refused" in result["goodputError"]


def test_ctrl_c_sets_the_stop_instead_of_raising_and_the_handler_is_put_back():
    before = signal.getsignal(signal.SIGINT)
    with stop_on_interrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(5)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_stopped_wait_ends_the_poll():
    stop = threading.Event()
    sleep = sleeper(stop)
    sleep(0.001)
    stop.set()
    with pytest.raises(FollowStopped):
        sleep(10)


# -- the local evictor ---------------------------------------------------------------------------------------

class FakeClusters:
    """The local jobs and their evictions as the local evictor uses them (our interfaces), recording what it was
    asked."""

    def __init__(self, alive, min_nodes=1):
        self.alive, self.min_nodes, self.asked = list(alive), min_nodes, []

    def show_job(self, job):
        return {"nodes": [{"name": n, "alive": True} for n in self.alive], "minNodes": self.min_nodes,
                "worldSize": len(self.alive), "nprocPerNode": 1}

    def evict(self, job, **options):
        self.asked.append(("evict", options))
        self.alive.remove(options["node"])
        return {"evictions": [{"node": options["node"], "evictedAt": time.time(), "startedAt": time.time()}]}

    def replace_nodes(self, job, count):
        self.asked.append(("replace", time.time()))
        self.alive.append("job-node-9")
        return [{"node": "job-node-9", "startedAt": time.time()}]

    def follow_world_size(self, job, world_size, since, sleep):
        self.asked.append(("follow", world_size))
        return {"worldSize": world_size, "seconds": 1.0}


def test_the_local_evictor_skips_a_job_at_its_minimum_and_replaces_after_the_delay():
    clusters = FakeClusters(["job-node-0", "job-node-1"])
    evictor = LocalScheduleEvictor(clusters, clusters, "job")
    [item] = plan_schedule(ScheduleSpec(rate=60, duration=1, notice_share=0, replace_after=0.2, seed=1)).evictions
    eviction = evictor.evict(item)
    assert clusters.asked[0] == ("evict", {"node": eviction["node"], "notice_seconds": 0.0, "replace_after": None})
    with pytest.raises(Skipped, match="its minimum of 1"):
        evictor.evict(item)
    back = evictor.capacity_back(item, eviction, threading.Event())
    assert clusters.asked[1][1] - eviction["evictedAt"] >= 0.19
    assert back["fullSize"] == {"worldSize": 2, "seconds": 1.0} and clusters.asked[-1] == ("follow", 2)


def test_the_local_evictor_gives_capacity_back_at_once_when_stopped():
    clusters = FakeClusters(["job-node-0", "job-node-1"])
    evictor = LocalScheduleEvictor(clusters, clusters, "job")
    [item] = plan_schedule(ScheduleSpec(rate=60, duration=1, replace_after=30, seed=1)).evictions
    eviction = evictor.evict(item)
    stop = threading.Event()
    stop.set()
    back = evictor.capacity_back(item, eviction, stop)
    assert back["stopped"] is True and clusters.asked[-1][0] == "replace"
    assert clusters.asked[-1][1] - eviction["evictedAt"] < 5 and len(clusters.alive) == 2


# -- the table ---------------------------------------------------------------------------------------------

def test_the_table_shows_the_plan_then_each_eviction_and_the_goodput():
    plan = {"type": "local", **plan_schedule(ScheduleSpec(rate=1, duration=180, seed=2)).to_dict(), "dryRun": True}
    rows = eviction_table(plan)
    assert [r["AtSeconds"] for r in rows] == [60.0, 120.0, 180.0]
    assert sorted(r["Notice"] for r in rows) == ["30s", "30s", "none"] and rows[0]["CapacityBackAfter"] == "30s"
    result = run_schedule(plan_schedule(_quick(duration=0.1)), FakeEvictor(skip={2}))
    rows = eviction_table({"type": "local", **result})
    assert [r["Eviction"] for r in rows] == [1, 2, "goodput"]
    assert rows[0]["OutageSeconds"] == 7.5 and rows[0]["FullSizeAfterSeconds"] == 3.25
    assert rows[1]["Note"].startswith("job 'job' runs 1 node(s)") and rows[2]["Note"] == "90.9%"
