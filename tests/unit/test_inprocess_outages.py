"""The in-process mode's event log read as the restart mode's is: its ``quorum`` events start the job's worlds.

Each log below is what runtime/loops/in_process.py writes (runtime/membership.py decides the
``quorum`` events): every node's rank 0 writes its own ``started``/``restored`` (a world of the node's workers,
not of the job), the quorum's first replica one ``quorum`` event per change and the first step after it at once.
Before the ``quorum`` event existed none of these figures could be read: the outage, the recovery, trained_again.
"""
from __future__ import annotations

from azext_elastictrain.core.eventlog import events as job_events
from azext_elastictrain.core.eventlog import goodput, recovery
from azext_elastictrain.core.eventlog.timeline import series
from azext_elastictrain.core.eventlog.view import build_job_view
from azext_elastictrain.runtime.membership import Membership


def ev(time: float, event: str, node: str = "n0", **fields) -> dict:
    return {"time": time, "event": event, "rank": 0, "node": node, **fields}


def quorum(time: float, node: str = "n0", **fields) -> dict:
    return ev(time, "quorum", node, **fields)


def start() -> list[dict]:
    """2 nodes of 1 worker each, from t=100, one step a second."""
    return [
        ev(98.0, "started", world_size=1), ev(98.1, "started", "n1", world_size=1),
        ev(99.5, "restored", step=None, world_size=1), ev(99.6, "restored", "n1", step=None, world_size=1),
        quorum(100.0, step=0, world_size=2, replicas=2, from_world_size=None, from_replicas=None,
               last_step=None, last_step_time=None, discarded=0, source="live"),
        ev(101.0, "progress", step=1, world_size=2),
        ev(130.0, "progress", step=30, world_size=2),
    ]


def vanished() -> list[dict]:
    """n1 vanishes after step 37 (137.0); step 38's collective times out at 140.2, it is discarded, and the quorum
    of n0 alone trains step 38 by 141.0."""
    return start() + [
        quorum(140.3, step=37, world_size=1, replicas=1, from_world_size=2, from_replicas=2, last_step=37,
               last_step_time=137.0, discarded=1, source="live"),
        ev(141.0, "progress", step=38, world_size=1),
    ]


def scaled_up() -> list[dict]:
    """After vanished(): n2 starts at 150, takes the state from n0 in step 51 and trains from step 52 (152.5)."""
    return vanished() + [
        ev(150.0, "started", "n2", world_size=1), ev(151.0, "restored", "n2", step=None, world_size=1),
        quorum(152.1, step=51, world_size=2, replicas=2, from_world_size=1, from_replicas=1, last_step=51,
               last_step_time=152.0, discarded=0, source="peer"),
        ev(152.5, "progress", step=52, world_size=2),
    ]


def test_a_vanished_node_is_one_outage_from_the_last_committed_step_to_the_first_of_the_smaller_world():
    (outage,) = goodput.outages(vanished())
    assert (outage["kind"], outage["fromWorldSize"], outage["toWorldSize"]) == ("eviction", 2, 1)
    assert (outage["lastStep"], outage["lastStepAt"], outage["firstStep"], outage["firstStepAt"]) == \
        (37, 137.0, 38, 141.0)
    assert outage["outageSeconds"] == 4.0 and outage["stepsLost"] == 0  # the discarded step is retrained, not lost
    found = recovery.follow_recovery(lambda job: vanished(), "j", {"node": "n1", "evictedAt": 137.2}, timeout=5)
    assert (found["kind"], found["outageSeconds"], found["stepsLost"], found["worldSize"]) == \
        ("eviction", 4.0, 0, 1)


def departed() -> list[dict]:
    """A notice for n1 posted at 134.5: at the boundary after step 35 it leaves the quorum, n0 alone trains step 36
    by 136.4, and n1 acknowledges and is killed at 137.0, after the re-form."""
    return start() + [
        ev(135.1, "preempted", "n1", step=35, source="scheduled-events"),
        quorum(135.3, step=35, world_size=1, replicas=1, from_world_size=2, from_replicas=2, last_step=35,
               last_step_time=135.0, discarded=0, source="live"),
        ev(136.4, "progress", step=36, world_size=1),
    ]


def test_a_notice_is_followed_from_the_notice_the_survivors_re_form_before_the_node_goes():
    """`evict simulate --wait` (and the benchmarks) follow the recovery once the node is gone: the re-form of a
    planned departure happened before it. Before, follow_recovery looked only after the kill and waited out its
    timeout (this test: EvictionError after 1 s)."""
    eviction = {"node": "n1", "startedAt": 134.5, "evictedAt": 137.0}
    found = recovery.follow_recovery(lambda job: departed(), "j", eviction, timeout=1)
    assert (found["kind"], found["outageSeconds"], found["stepsLost"], found["worldSize"]) == \
        ("evictionWithNotice", 1.4, 0, 1)


def test_trained_again_waits_for_the_smaller_quorums_first_step_not_for_a_restore():
    frozen = vanished()[:-2]
    assert not recovery.trained_again(frozen, since=137.2)
    assert not recovery.trained_again(vanished()[:-1], since=137.2)  # the quorum, no step yet
    assert recovery.trained_again(vanished(), since=137.2)


def test_a_newcomers_restore_is_not_a_world_its_admission_is_the_scale_up():
    events = scaled_up()
    first, second = goodput.outages(events)
    assert first["kind"] == "eviction"
    assert (second["kind"], second["outageSeconds"], second["stepsLost"], second["restoreSource"]) == \
        ("scaleUp", 0.5, 0, "peer")
    back = recovery.follow_world_size(lambda job: events, "j", 2, since=150.0, timeout=5)
    assert (back["outageSeconds"], back["stepsLost"], back["restoreSource"]) == (0.5, 0, "peer")
    (up,) = goodput.scale_ups(events)
    assert up["nodeJoined"] == 150.0  # the newcomer's workers started: no rendezvous round to date it by
    summary = job_events.summarize(events)
    assert (summary["recoveries"], summary["scaleUps"], summary["worldSize"], summary["step"]) == (1, 1, 2, 52)


def test_job_show_and_timeline_give_the_same_figures():
    events = scaled_up()
    view = build_job_view(events, created=None, nodes=[], state_of=lambda summary: "Running",
                          lost_nodes=lambda state: [])
    shown = view.describe({}, {})["outages"]
    assert [o["outageSeconds"] for o in shown] == [4.0, 0.5]
    assert [s["outageSeconds"] for s in series(events)["stops"]] == [4.0, 0.5]
    assert [w["worldSize"] for w in series(events)["worlds"]] == [2, 1, 2]


def test_a_notice_is_an_eviction_with_notice():
    events = start() + [
        ev(131.05, "preempted", "n1", step=31, source="Preempt", event_id="e1"),
        quorum(131.3, step=31, world_size=1, replicas=1, from_world_size=2, from_replicas=2, last_step=31,
               last_step_time=131.0, discarded=0, source="live"),
        ev(131.9, "progress", step=32, world_size=1),
    ]
    (outage,) = goodput.outages(events)
    assert (outage["kind"], outage["outageSeconds"], outage["stepsLost"]) == ("evictionWithNotice", 0.9, 0)
    # the node leaves the quorum at the notice and goes once it acknowledged: the re-form came before it went
    eviction = {"node": "n1", "startedAt": 130.9, "evictedAt": 132.5}
    found = recovery.follow_recovery(lambda job: events, "j", eviction, timeout=0.5, sleep=lambda s: None)
    assert (found["kind"], found["outageSeconds"], found["recoverySeconds"]) == ("evictionWithNotice", 0.9, 0.0)


def test_both_modes_give_one_figure_for_the_same_outage():
    """The same vanish in the restart mode: the survivor records step 37, the world of 1 restores it from memory."""
    restart = [
        ev(99.0, "started", world_size=2), ev(100.0, "restored", step=None, world_size=2),
        ev(101.0, "progress", step=1, world_size=2), ev(130.0, "progress", step=30, world_size=2),
        ev(147.4, "interrupted", "n0", step=37, step_time=137.0, world_size=2),
        ev(149.0, "started", world_size=1), ev(150.0, "restored", step=37, world_size=1, source="memory"),
        ev(151.0, "progress", step=38, world_size=1),
    ]
    (by_restart,) = goodput.outages(restart)
    (in_process,) = goodput.outages(vanished())
    keys = ("kind", "fromWorldSize", "toWorldSize", "lastStep", "lastStepAt", "resumedFromStep", "firstStep",
            "stepsLost")
    assert {k: by_restart[k] for k in keys} == {k: in_process[k] for k in keys}
    assert (by_restart["outageSeconds"], in_process["outageSeconds"]) == (14.0, 4.0)
    assert goodput.goodput(vanished())["stepsLost"] == 0


# -- who writes the quorum events (runtime/membership.py) ------------------------------------------------------
def test_the_first_replica_writes_each_change_once_with_the_discarded_steps():
    writer, other = Membership(node_size=2), Membership(node_size=2)
    seen = [m.observe(replicas=2, step=0, rank=r, last_step=None, last_step_time=None)
            for m, r in ((writer, 0), (other, 1))]
    assert seen[1] is None and seen[0]["world_size"] == 4 and seen[0]["from_world_size"] is None
    assert writer.observe(replicas=2, step=1, rank=0, last_step=1, last_step_time=1.0) is None  # no change
    writer.discard()
    change = writer.observe(replicas=1, step=7, rank=0, last_step=7, last_step_time=7.5)
    assert change == {"step": 7, "world_size": 2, "replicas": 1, "from_world_size": 4, "from_replicas": 2,
                      "last_step": 7, "last_step_time": 7.5, "discarded": 1, "source": "live"}


def test_a_newcomer_is_admitted_the_step_after_it_healed_and_writes_nothing_while_it_heals():
    survivor, newcomer = Membership(node_size=1), Membership(node_size=1)
    survivor.observe(replicas=1, step=40, rank=0, last_step=40, last_step_time=40.0)
    # step 50: the newcomer takes the state (no rank yet); the survivor alone participates, no change
    assert newcomer.observe(replicas=1, step=50, rank=None, last_step=None, last_step_time=None) is None
    assert survivor.observe(replicas=1, step=50, rank=0, last_step=50, last_step_time=50.0, served=True) is None
    # step 51: both train; the newcomer may sort first and be the writer, the survivor then writes nothing
    by_newcomer = newcomer.observe(replicas=2, step=51, rank=0, last_step=51, last_step_time=51.0)
    assert survivor.observe(replicas=2, step=51, rank=1, last_step=51, last_step_time=51.0) is None
    assert (by_newcomer["from_world_size"], by_newcomer["world_size"], by_newcomer["source"]) == (1, 2, "peer")


def test_the_survivor_that_served_the_state_writes_the_admission_from_a_peer():
    survivor = Membership(node_size=1)
    survivor.observe(replicas=1, step=40, rank=0, last_step=40, last_step_time=40.0)
    assert survivor.observe(replicas=1, step=50, rank=0, last_step=50, last_step_time=50.0, served=True) is None
    change = survivor.observe(replicas=2, step=51, rank=0, last_step=51, last_step_time=51.0)
    assert (change["from_world_size"], change["world_size"], change["source"]) == (1, 2, "peer")
