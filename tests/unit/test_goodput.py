"""Loss accounting and goodput from synthetic event logs: the arithmetic of core/eventlog/goodput.py and
core/eventlog/recovery.py."""
from __future__ import annotations

import pytest

from azext_elastictrain.core.eventlog import goodput, recovery
from azext_elastictrain.core.eventlog.view import build_job_view


def ev(time: float, event: str, rank: int = 0, **fields) -> dict:
    return {"time": time, "event": event, "rank": rank, "node": f"n{rank}", **fields}


def evicted_job(*, survivor_rank: int = 1) -> list[dict]:
    """2 ranks from t=100; one step a second from step 0; a checkpoint of step 25; progress reported at
    steps 1 and 30; the node of the other rank dies after step 37 (t=137.0), without notice. The survivor
    records step 37; the world of 1 starts at 140, restores step 25 at 142 and trains to step 60 at 177."""
    return [
        ev(98.0, "started", world_size=2),
        ev(100.0, "restored", step=None, world_size=2),
        ev(101.0, "progress", step=1, world_size=2),
        ev(126.5, "checkpoint", step=25, step_time=125.0, world_size=2),
        ev(130.0, "progress", step=30, world_size=2),
        ev(137.4, "interrupted", rank=survivor_rank, step=37, step_time=137.0, world_size=2),
        ev(140.0, "started", world_size=1),
        ev(142.0, "restored", step=25, world_size=1),
        ev(143.0, "progress", step=26, world_size=1),
        ev(177.0, "finished", step=60),
    ]


def test_steps_lost_is_the_last_completed_step_not_the_last_progress_report():
    events = evicted_job()
    eviction = {"node": "n0", "evictedAt": 137.2, "startedAt": 137.1}
    found = recovery.follow_recovery(lambda job: events, "j", eviction, timeout=5)
    # the old accounting took step 30 (the last progress report) and said 5; the survivor says 37
    assert found["stepsLost"] == 12 and found["resumedFromStep"] == 25 and found["worldSize"] == 1


def test_rank_0_dying_duplicated_lines_and_every_survivor_writing_change_nothing():
    events = evicted_job(survivor_rank=1)
    # rank 0's node died: only ranks 1 and 2 tell, one of them twice (a retried append), one a step behind
    events.insert(6, ev(137.5, "interrupted", rank=2, step=36, step_time=136.0, world_size=2))
    events.insert(6, dict(events[5]))
    eviction = {"node": "n0", "evictedAt": 137.2, "startedAt": 137.1}
    assert recovery.follow_recovery(lambda job: events, "j", eviction, timeout=5)["stepsLost"] == 12
    assert goodput.goodput(events) == goodput.goodput(evicted_job())


def test_goodput_arithmetic():
    found = goodput.goodput(evicted_job())
    # useful: 2 ranks x (125 - 100) in the first world (steps 1-25), 1 rank x (177 - 142) in the second
    # lost: steps 26-37 on 2 ranks (137 - 125 = 12 s); re-forming 137 -> 140 and restoring 140 -> 142 on 1 rank;
    # starting 98 -> 100 on 2 ranks
    assert found["usefulRankSeconds"] == 85.0
    assert found["lostRankSeconds"] == {"reforming": 3.0, "restoring": 2.0, "stepsLost": 24.0,
                                        "scaleUps": 0.0, "starting": 4.0}
    assert found["stepsLost"] == 12
    assert found["goodput"] == round(85 / (85 + 33), 4)


def test_a_scale_up_is_its_own_cause_and_loses_no_step_after_a_sigterm_checkpoint():
    events = [
        ev(0.0, "started", world_size=1), ev(0.0, "restored", step=None, world_size=1),
        ev(10.0, "progress", step=10, world_size=1),
        ev(20.5, "checkpoint", step=20, step_time=20.0, world_size=1),   # torchrun's SIGTERM: save, exit
        ev(20.6, "interrupted", step=20, step_time=20.0, world_size=1),
        ev(24.0, "started", world_size=2), ev(25.0, "restored", step=20, world_size=2),
        ev(35.0, "finished", step=30),
    ]
    found = goodput.goodput(events)
    assert found["stepsLost"] == 0 and found["lostRankSeconds"]["stepsLost"] == 0
    assert found["lostRankSeconds"]["scaleUps"] == 2 * 5.0   # 20 -> 25 on the 2 ranks of the new world
    assert found["usefulRankSeconds"] == 20.0 + 2 * 10.0


def scale_up_from_memory() -> list[dict]:
    """A world of 1 trains to step 20; a node joins and torchrun SIGTERMs the survivor at 20.2 (it stops at step
    20, kept in memory, no blob save); the world of 2 starts at 21.0, restores step 20 from the survivor's memory
    (the newcomer from it) at 21.5 and reports its first step at 22.0."""
    return [
        ev(0.0, "started", world_size=1), ev(0.0, "restored", step=None, world_size=1),
        ev(10.0, "progress", step=10, world_size=1),
        ev(20.3, "preempted", step=20, source="sigterm"),
        ev(20.3, "reforming", step=20, kept_in_memory=True, world_size=1),
        ev(20.4, "interrupted", step=20, step_time=20.0, world_size=1, sigterm_time=20.2),
        ev(21.0, "started", world_size=2),
        ev(21.5, "restored", step=20, world_size=2, source="memory", holder=0, ranks_from_peer=1),
        ev(22.0, "progress", step=21, world_size=2),
        ev(30.0, "finished", step=29),
    ]


def test_a_scale_up_is_measured_from_the_node_joining_to_training_at_full_size():
    (up,) = goodput.scale_ups(scale_up_from_memory())
    assert up == {"nodeJoined": 20.2, "fromWorldSize": 1, "toWorldSize": 2,
                  "nodeJoinedToFullSizeSeconds": 1.8,   # SIGTERM 20.2 -> first progress at size 2, 22.0
                  "noTrainingSeconds": 1.5,             # last step of the world of 1, 20.0 -> restored 21.5
                  "stepsLost": 0, "restoreSource": "memory", "ranksFromPeer": 1}
    assert goodput.goodput(scale_up_from_memory())["lostRankSeconds"]["scaleUps"] == 2 * 1.5


def test_without_a_sigterm_time_the_scale_up_counts_from_the_reforming_event_or_the_last_step():
    events = [e for e in scale_up_from_memory() if e["event"] != "interrupted"]
    assert goodput.scale_ups(events)[0]["nodeJoined"] == 20.3
    events = [e for e in events if e["event"] != "reforming"]
    assert goodput.scale_ups(events)[0]["nodeJoined"] == 10.0  # the last step the world of 1 recorded


def test_a_shrink_is_no_scale_up():
    assert goodput.scale_ups(evicted_job()) == []


def test_show_timeline_and_replace_after_report_the_scale_up():
    events = scale_up_from_memory()
    view = build_job_view(events, created=None, nodes=[], state_of=lambda summary: "Running",
                          lost_nodes=lambda state: [])
    (shown,) = view.describe({}, {})["scaleUpTimes"]
    assert shown["nodeJoinedToFullSizeSeconds"] == 1.8 and shown["nodeJoined"].startswith("1970-01-01T00:00:20.")
    from azext_elastictrain.core.eventlog.timeline import series

    (drawn,) = series(events)["scaleUps"]
    assert (drawn["nodeJoined"], drawn["noTrainingSeconds"], drawn["restoreSource"]) == (20.2, 1.5, "memory")
    back = recovery.follow_world_size(lambda job: events, "j", 2, since=20.0, timeout=5)
    assert (back["nodeJoinedToFullSizeSeconds"], back["noTrainingSeconds"], back["ranksFromPeer"]) == (1.8, 1.5, 1)


def test_steps_between_two_recorded_boundaries_are_evenly_spaced():
    events = [ev(0.0, "restored", step=0, world_size=1), ev(10.0, "progress", step=10),
              ev(30.0, "interrupted", step=30, step_time=30.0),
              ev(31.0, "restored", step=20, world_size=1), ev(41.0, "finished", step=30)]
    found = goodput.goodput(events)
    assert found["usefulRankSeconds"] == 20.0 + 10.0   # step 20 ended at t=20, between 10@10 and 30@30
    assert found["lostRankSeconds"]["stepsLost"] == 10.0 and found["stepsLost"] == 10


def test_a_survivor_line_written_after_the_next_restore_counts_for_the_world_it_ended():
    events = evicted_job()
    late = events.pop(5)
    events.append({**late, "time": 150.0})  # appended late; its step_time still says when step 37 ended
    assert goodput.goodput(events) == goodput.goodput(evicted_job())


def test_an_earlier_run_of_the_same_name_is_not_counted():
    earlier = [{**e, "time": e["time"] - 1000, **({"step_time": e["step_time"] - 1000} if "step_time" in e else {})}
               for e in evicted_job()]
    view = build_job_view(earlier + evicted_job(), created=90.0, nodes=[], state_of=lambda s: "Succeeded",
                          lost_nodes=lambda state: [])
    shown = view.describe({"name": "j"}, {})
    assert shown["goodput"] == goodput.goodput(evicted_job())["goodput"]
    assert shown["stepsLost"] == 12 and shown["timeLost"]["reforming"] == 3.0


def test_a_job_that_has_not_trained_has_no_goodput():
    assert goodput.goodput([ev(0.0, "started", world_size=2)]) is None
    shown = build_job_view([], created=None, nodes=[], state_of=lambda s: "Running",
                           lost_nodes=lambda state: []).describe({}, {})
    assert shown["goodput"] is None and shown["timeLost"] is None


@pytest.mark.parametrize("reports", [[], [ev(130.0, "progress", step=30)]])
def test_without_a_survivor_line_the_old_reading_remains(reports):
    events = [e for e in evicted_job() if e["event"] != "interrupted"]
    eviction = {"node": "n0", "evictedAt": 137.2, "startedAt": 137.1}
    assert recovery.follow_recovery(lambda job: events + reports, "j", eviction, timeout=5)["stepsLost"] == 5


def test_timeline_series_marks_the_stop_the_loss_and_no_training_between_worlds():
    from azext_elastictrain.core.eventlog.timeline import series

    shown = series(evicted_job() + [dict(evicted_job()[5])])
    assert shown["start"] == 98.0
    assert [w["worldSize"] for w in shown["worlds"]] == [2, 1]
    assert shown["worlds"][0]["steps"][-1] == [39.0, 37]   # step 37 ended at t=137, 39 s after the start
    assert shown["worldSize"] == [[0.0, 0], [2.0, 2], [39.0, 0], [44.0, 1], [79.0, 0]]
    assert shown["stops"] == [{"time": 39.0, "step": 37, "kind": "eviction", "resumedFromStep": 25,
                               "stepsLost": 12, "outageSeconds": 6.0}]
    assert shown["checkpoints"] == [[28.5, 25]] and shown["scaleUps"] == []


def test_timeline_picture_is_drawn(tmp_path):
    from azext_elastictrain.core.eventlog.timeline import series
    from azext_elastictrain.timeline_picture import draw

    out = tmp_path / "timeline.png"
    draw(series(evicted_job()), "job j", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_drawing_without_matplotlib_is_an_az_error_saying_how_to_get_it(monkeypatch):
    import importlib.util

    from azure.cli.core.azclierror import ValidationError

    from azext_elastictrain.operations import job

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ValidationError, match="needs matplotlib") as raised:
        job._require_matplotlib()
    assert "pip install matplotlib" in raised.value.recommendations[0]


def test_timeline_table_has_a_row_per_world():
    from azext_elastictrain._format import job_timeline_table
    from azext_elastictrain.core.eventlog.timeline import series

    rows = job_timeline_table(series(evicted_job()))
    assert [list(r.values()) for r in rows] == [[1, 2, 0, 37, 2.0, 39.0, 12, 6.0],
                                                [2, 1, 25, 60, 44.0, 79.0, "", ""]]
    assert job_timeline_table(series([])) == []


# -- the outage of each re-form: the old world's last completed step to the new world's first ------------------

def evicted_with_notice() -> list[dict]:
    """2 ranks train a step every 0.5 s; a Scheduled Events Preempt comes during step 30: every rank saves step 30
    (ended at 115.0) and the world holds there; the node goes at 118.0 and the survivor records step 30; the world
    of 1 starts at 119.5, restores step 30 from blob at 120.2 and completes step 31 at 120.9."""
    return [
        ev(99.0, "started", world_size=2), ev(100.0, "restored", step=None, world_size=2),
        ev(100.5, "progress", step=1, world_size=2),
        ev(115.1, "preempted", step=30, source="scheduled-events", event_id="e1"),
        ev(115.6, "checkpoint", step=30, step_time=115.0, world_size=2),
        ev(118.3, "interrupted", rank=1, step=30, step_time=115.0, world_size=2),
        ev(119.5, "started", world_size=1),
        ev(120.2, "restored", step=30, world_size=1, source="blob"),
        ev(120.9, "progress", step=31, world_size=1),
    ]


def test_the_outage_with_notice_runs_from_the_last_step_before_the_notice_not_from_the_kill():
    events = evicted_with_notice()
    (outage,) = goodput.outages(events)
    assert outage["kind"] == "evictionWithNotice" and outage["stepsLost"] == 0
    assert (outage["lastStep"], outage["lastStepAt"], outage["firstStep"], outage["firstStepAt"]) == \
        (30, 115.0, 31, 120.9)
    assert outage["outageSeconds"] == 5.9  # 115.0 -> 120.9; from the kill (118.0) it would say 2.9
    found = recovery.follow_recovery(lambda job: events, "j", {"node": "n0", "evictedAt": 118.0}, timeout=5)
    assert (found["outageSeconds"], found["recoverySeconds"], found["stepsLost"]) == (5.9, 2.9, 0)
    assert found["kind"] == "evictionWithNotice" and found["worldSize"] == 1 and found["resumedFromStep"] == 30


def test_the_outage_without_notice_runs_from_the_last_step_the_survivors_completed():
    (outage,) = goodput.outages(evicted_job())
    # step 37 ended at 137.0 (the survivor's record); the world of 1 completed step 26 at 143.0
    assert (outage["kind"], outage["outageSeconds"], outage["stepsLost"]) == ("eviction", 6.0, 12)
    found = recovery.follow_recovery(lambda job: evicted_job(), "j", {"node": "n0", "evictedAt": 137.2}, timeout=5)
    assert (found["outageSeconds"], found["recoverySeconds"], found["stepsLost"]) == (6.0, 5.8, 12)


def test_the_outage_of_a_scale_up_runs_from_the_smaller_worlds_last_step_to_the_larger_worlds_first():
    events = scale_up_from_memory()
    (outage,) = goodput.outages(events)
    # last step of the world of 1 at 20.0 (not the SIGTERM at 20.2); the world of 2 completed step 21 at 22.0
    assert (outage["kind"], outage["outageSeconds"], outage["stepsLost"]) == ("scaleUp", 2.0, 0)
    back = recovery.follow_world_size(lambda job: events, "j", 2, since=20.0, timeout=5)
    assert back["outageSeconds"] == 2.0 and back["noTrainingSeconds"] == 1.5
    # the same figure in job show and job timeline
    view = build_job_view(events, created=None, nodes=[], state_of=lambda summary: "Running",
                          lost_nodes=lambda state: [])
    (shown,) = view.describe({}, {})["outages"]
    assert shown["outageSeconds"] == 2.0 and shown["lastStepAt"] == "1970-01-01T00:00:20.000Z"
    from azext_elastictrain.core.eventlog.timeline import series

    assert series(events)["stops"][0]["outageSeconds"] == 2.0


def test_a_new_world_that_has_not_completed_a_step_has_no_outage_yet_and_recovery_waits_for_it():
    events = evicted_with_notice()[:-1]  # restored, no step yet
    (outage,) = goodput.outages(events)
    assert outage["outageSeconds"] is None and outage["firstStepAt"] is None
    from azext_elastictrain.core.errors import EvictionError

    with pytest.raises(EvictionError, match="did not train again"):
        recovery.follow_recovery(lambda job: events, "j", {"node": "n0", "evictedAt": 118.0}, timeout=0.2,
                                 sleep=lambda s: None)


def test_a_job_that_finished_before_its_replacement_trained_ends_the_wait_with_why():
    """`evict simulate --wait --replace-after`: a job whose smaller world trained its last step before the
    replacement joined will never train at full size again; the wait says so at once instead of running out."""
    from azext_elastictrain.core.errors import EvictionError

    waits = []
    events = [e for e in scale_up_from_memory() if e["time"] < 20.3] + [ev(25.0, "finished", step=28)]
    with pytest.raises(EvictionError, match=r"finished \(step 28\) at a smaller world .* world size 2"):
        recovery.follow_world_size(lambda job: events, "j", 2, since=20.0, timeout=5, sleep=waits.append)
    assert waits == []
    # a job that finished before the replacement's start (since) is not this wait's business
    with pytest.raises(EvictionError, match="within 0s"):
        recovery.follow_world_size(lambda job: events, "j", 2, since=26.0, timeout=0.1, sleep=lambda s: None)
    notice = evicted_with_notice()[:-3] + [ev(117.0, "finished", step=40)]  # trained to the end before it went
    with pytest.raises(EvictionError, match=r"finished \(step 40\) before a world formed after the eviction"):
        recovery.follow_recovery(lambda job: notice, "j", {"node": "n1", "evictedAt": 118.0, "startedAt": 115.0},
                                 timeout=5, sleep=waits.append)
    assert waits == []
    # a new world that trained on to the end before it reported progress did recover
    ended = evicted_with_notice()[:-1] + [ev(121.5, "finished", step=33)]
    found = recovery.follow_recovery(lambda job: ended, "j", {"node": "n1", "evictedAt": 118.0}, timeout=5,
                                     sleep=waits.append)
    assert found["resumedFromStep"] == 30 and found["stepsLost"] == 0 and waits == []
    assert found["worldSize"] == 1  # the new world's, from its restore: a finished event carries no world size


def test_a_same_size_re_form_after_a_sigterm_alone_is_a_restart():
    events = [ev(0.0, "restored", step=None, world_size=2), ev(10.0, "progress", step=10, world_size=2),
              ev(10.2, "preempted", step=10, source="sigterm"),
              ev(10.3, "interrupted", step=10, step_time=10.0, world_size=2),
              ev(12.0, "restored", step=10, world_size=2, source="memory"), ev(12.5, "progress", step=11, world_size=2)]
    (outage,) = goodput.outages(events)
    assert (outage["kind"], outage["outageSeconds"], outage["stepsLost"]) == ("restart", 2.5, 0)


def test_a_world_that_re_formed_before_its_first_step_does_not_shorten_the_outage():
    """Two re-forms seconds apart: the world of B restores and is stopped before it trains; the outage the user
    lives through runs from A's last step to C's first, and it is an eviction (2 -> 1), not a restart."""
    events = [ev(0.0, "restored", step=None, world_size=2), ev(10.0, "progress", step=10, world_size=2),
              ev(10.3, "interrupted", rank=1, step=10, step_time=10.0, world_size=2),
              ev(12.0, "restored", step=10, world_size=1, source="memory"),  # B: stopped before a step
              ev(15.0, "restored", step=10, world_size=1, source="memory"),  # C
              ev(16.0, "progress", step=11, world_size=1)]
    first, second = goodput.outages(events)
    assert first["outageSeconds"] is None
    assert (second["kind"], second["lastStep"], second["lastStepAt"], second["fromWorldSize"]) == \
        ("eviction", 10, 10.0, 2)
    assert (second["outageSeconds"], second["stepsLost"]) == (6.0, 0)
    found = recovery.follow_recovery(lambda job: events, "j", {"node": "n1", "evictedAt": 10.2}, timeout=5)
    assert found["outageSeconds"] == 6.0


def test_a_notice_called_off_earlier_does_not_make_a_later_re_form_one_with_notice():
    events = [ev(0.0, "restored", step=None, world_size=2),
              ev(5.0, "preempted", step=5, source="scheduled-events", event_id="e1"),  # held, then trained on
              ev(10.0, "progress", step=10, world_size=2),
              ev(10.3, "interrupted", rank=1, step=10, step_time=10.0, world_size=2),
              ev(12.0, "restored", step=10, world_size=1, source="memory"), ev(12.5, "progress", step=11, world_size=1)]
    (outage,) = goodput.outages(events)
    assert outage["kind"] == "eviction"
    assert goodput.outages(evicted_with_notice())[0]["kind"] == "evictionWithNotice"  # the notice it stopped at
