"""A real 2-node elastic job (torchrun agents, etcd-v2 rendezvous, Azurite) losing a node.

Without notice the survivor resumes from the last step it completed, kept in its
node's memory (with the memory tier off: from the last committed checkpoint);
with an Azure Scheduled Events ``Preempt`` notice every rank checkpoints the
step the notice arrived at, and with a SIGTERM to the node every rank stops at
one step that every node holds in memory: the survivor resumes there, no step
is lost. When the node comes back, the survivor restores from its own memory,
not from blob, and the newcomer from the survivor.
"""
from __future__ import annotations

import signal
import uuid

import pytest

from azext_elastictrain.core import catalog
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.core.eventlog.goodput import goodput, scale_ups
from harness.elastic import JobConfig, Node, dump, events_of, read_events, wait_for

STEPS = 2000  # never reached: each test stops the job once it has shown recovery
CHECKPOINT_EVERY = 25


@pytest.fixture
def job(azurite, etcd, container_url, tmp_path):
    name = f"job-{uuid.uuid4().hex[:8]}"
    config = JobConfig(
        name=name,
        checkpoint_url=f"{container_url}/{name}",
        connection_string=azurite.connection_string,
        etcd_endpoint=etcd.endpoint,
        script_args=["--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY),
                     "--step-delay", "0.05", "--log-every", "50"],
        extra_env={"ELASTICTRAIN_MEMORY_DIR": str(tmp_path / "shm")},  # not the machine's /dev/shm
    )
    store = BlobStore.from_url(config.checkpoint_url, connection_string=azurite.connection_string)
    nodes: list[Node] = []

    def start(node_name: str, **changes) -> Node:
        for key, value in changes.items():
            setattr(config, key, value)
        node = Node(config, node_name, tmp_path / "logs")
        nodes.append(node)
        return node

    yield config, store, start
    for node in nodes:
        node.stop()
    store.close()


def _logs(nodes) -> str:
    return "\n".join(f"--- {n.name} ---\n{n.log_tail(3000)}" for n in nodes)


def _start_two(store, start):
    a, b = start("node-a"), start("node-b")
    events = lambda: read_events(store, store.prefix)  # noqa: E731
    wait_for(lambda: any(e.get("world_size") == 2 for e in events_of(events(), "checkpoint")),
             timeout=120, what="a checkpoint at world size 2",
             on_timeout=lambda: dump(events()) + _logs([a, b]))
    return a, b, events


def _committed_steps(store) -> list[int]:
    return [c.step for c in catalog.list_checkpoints(store, store.prefix) if c.complete]


def _restored_after(events, since: int) -> list[dict]:
    return [e for e in events_of(events, "restored")[since:] if e.get("step") is not None]


def test_survivor_resumes_from_last_committed_step_after_losing_a_node_without_notice(job):
    config, store, start = job
    config.extra_env["ELASTICTRAIN_MEMORY_TIER"] = "off"  # blob is the fallback tested here
    a, b, events = _start_two(store, start)
    restored_before = len(events_of(events(), "restored"))
    committed_at_kill = max(_committed_steps(store))
    b.kill()

    restored = wait_for(lambda: _restored_after(events(), restored_before), timeout=90,
                        what="the survivor to restore", on_timeout=lambda: dump(events()) + _logs([a]))
    step = restored[0]["step"]
    # The newest commit at the moment of the kill, or one that was already uploading then...
    assert step >= committed_at_kill
    # ...and one that really was committed (retention may have pruned it since; the event stays).
    assert any(e["step"] == step for e in events_of(events(), "checkpoint")), dump(events())
    assert restored[0]["world_size"] == 1
    wait_for(lambda: any(e.get("world_size") == 1 and e["step"] > step for e in events_of(events(), "progress")),
             timeout=60, what="training to go on at world size 1", on_timeout=lambda: dump(events()))
    assert a.alive()
    # The survivor's worker saw its collective fail and recorded the last step both ranks completed:
    # at least the last step reported before the kill, and what the loss is counted from.
    told = [e for e in events_of(events(), "interrupted") if e["time"] < restored[0]["time"]]
    assert told and {e["node"] for e in told} == {"node-a"}, dump(events())
    reported = max(e["step"] for e in events_of(events(), "progress") if e["time"] < told[0]["time"])
    assert max(e["step"] for e in told) >= max(reported, step), dump(events())
    assert goodput(events())["stepsLost"] == max(e["step"] for e in told) - step


@pytest.mark.parametrize("notice", ["sigterm", "scheduled-events"])
def test_no_step_is_lost_when_the_node_gets_a_preemption_notice(job, notice):
    config, store, start = job
    from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer

    with ScheduledEventsServer() as imds:
        if notice == "scheduled-events":
            config.scheduled_events_url = imds.url
        a, b, events = _start_two(store, start)
        restored_before = len(events_of(events(), "restored"))
        if notice == "sigterm":
            b.signal_agent(signal.SIGTERM)
            b.wait(timeout=60)  # the agent stops its workers once they saved and exited
        else:
            event_id = imds.post_event(["node-b"], "Preempt", notice_seconds=30)
            assert imds.wait_acknowledged(event_id, timeout=60), dump(events()) + _logs([a, b])
            b.kill()  # the acknowledged eviction happens

        preempted = events_of(events(), "preempted")
        assert preempted, dump(events())
        notice_step = preempted[0]["step"]
        if notice == "sigterm":  # no VM notice: every node holds the step in memory, so no blob save is made
            (stopped,) = events_of(events(), "reforming")
            assert stopped["step"] == notice_step and stopped["kept_in_memory"], dump(events())
        else:
            assert notice_step in _committed_steps(store) or any(
                e["step"] == notice_step for e in events_of(events(), "checkpoint")
            )
        restored = wait_for(lambda: _restored_after(events(), restored_before), timeout=90,
                            what="the survivor to restore", on_timeout=lambda: dump(events()) + _logs([a]))
        assert restored[0]["step"] == notice_step, dump(events())
        assert restored[0]["world_size"] == 1
        if notice == "sigterm":  # only in memory
            assert restored[0]["source"] == "memory", dump(events())
        assert a.alive()
        # measured from the step the survivors last completed: after the notice the job trained no further
        # step (a Scheduled Events notice holds the job until the VM goes; a SIGTERM stops the node)
        assert goodput(events())["stepsLost"] == 0, dump(events())


def test_a_sigterm_to_a_node_that_is_going_saves_its_step_to_blob(job, tmp_path):
    """A pod deleted (its preStop hook made the node's leaving file) or a local node stopped: the node's memory
    goes with it, so the step every rank stops at is saved to blob, not only kept in memory."""
    config, store, start = job
    leaving = tmp_path / "node-b.leaving"
    a = start("node-a")
    config.extra_env = {**config.extra_env, "ELASTICTRAIN_NODE_LEAVING_FILE": str(leaving)}
    b = start("node-b")
    events = lambda: read_events(store, store.prefix)  # noqa: E731
    wait_for(lambda: any(e.get("world_size") == 2 for e in events_of(events(), "checkpoint")),
             timeout=120, what="a checkpoint at world size 2", on_timeout=lambda: dump(events()) + _logs([a, b]))
    leaving.touch()  # what the kubelet's preStop does before the SIGTERM
    b.signal_agent(signal.SIGTERM)
    b.wait(timeout=60)
    (stopped,) = events_of(events(), "reforming")
    assert not stopped["kept_in_memory"], dump(events())
    assert stopped["step"] in _committed_steps(store) or any(
        e["step"] == stopped["step"] for e in events_of(events(), "checkpoint")), dump(events())
    restored = wait_for(lambda: [e for e in events_of(events(), "restored") if e.get("world_size") == 1],
                        timeout=90, what="the survivor to restore", on_timeout=lambda: dump(events()) + _logs([a]))
    assert restored[0]["step"] == stopped["step"], dump(events())


@pytest.mark.slow
def test_without_notice_the_survivor_loses_at_most_one_step_and_a_scale_up_reads_no_blob(job):
    config, store, start = job
    config.extra_env["ELASTICTRAIN_PROGRESS_SECONDS"] = "0"  # rank 0 reports every step it completes
    a, b, events = _start_two(store, start)
    restored_before = len(events_of(events(), "restored"))
    b.kill()
    # Every step rank 0 reported before the kill was completed by the whole world: a step is completed on
    # one rank only after the gradients of every rank were reduced, so the survivor is at most one behind.
    reported = max(e["step"] for e in events_of(events(), "progress") if e.get("world_size") == 2)
    restored = wait_for(lambda: _restored_after(events(), restored_before), timeout=90,
                        what="the survivor to restore", on_timeout=lambda: dump(events()) + _logs([a]))
    first = restored[0]
    assert first["source"] == "memory" and first["world_size"] == 1, dump(events())
    assert first["step"] >= reported - 1, dump(events())
    wait_for(lambda: any(e.get("world_size") == 1 and e["step"] > first["step"]
                         for e in events_of(events(), "progress")),
             timeout=60, what="training to go on at world size 1", on_timeout=lambda: dump(events()))

    scaled_before = len(events_of(events(), "restored"))
    c = start("node-c")  # capacity is back: torchrun stops the survivor's worker to re-form at 2
    grown = wait_for(lambda: [e for e in _restored_after(events(), scaled_before) if e.get("world_size") == 2],
                     timeout=120, what="the job to re-form at world size 2",
                     on_timeout=lambda: dump(events()) + _logs([a, c]))[0]
    # The survivor had the newest state in its own memory; the newcomer took it from the survivor.
    assert grown["source"] in ("memory", "peer") and grown["ranks_from_peer"] == 1, dump(events())
    assert grown["step"] >= max(e["step"] for e in events_of(events(), "preempted")), dump(events())
    # torchrun stopped the survivor for the re-form: it kept the step in memory, saved nothing to blob,
    # and the grown world resumed from exactly that step
    stopped = [e for e in events_of(events(), "reforming") if e["time"] < grown["time"]][-1]
    assert stopped["kept_in_memory"] and grown["step"] == stopped["step"], dump(events())
    assert not [e for e in events_of(events(), "checkpoint") if e["step"] == stopped["step"]], dump(events())
    wait_for(lambda: [e for e in events_of(events(), "progress") if e.get("world_size") == 2
                      and e["time"] >= grown["time"]], timeout=60, what="training at world size 2",
             on_timeout=lambda: dump(events()))
    (up,) = scale_ups(events())
    assert (up["fromWorldSize"], up["toWorldSize"], up["stepsLost"]) == (1, 2, 0), up
    assert up["restoreSource"] == grown["source"] and up["ranksFromPeer"] == 1, up
    assert 0 <= up["noTrainingSeconds"] <= up["nodeJoinedToFullSizeSeconds"], up
    assert a.alive() and c.alive()
