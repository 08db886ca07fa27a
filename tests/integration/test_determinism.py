"""With the world size fixed, a preemption must not change what training computes.

One run trains straight through; another gets SIGTERM (a preemption notice)
part-way, checkpoints the step the notice arrived at, and is started again.
Both must end after the same number of steps with the same weights: the
checkpoint carries model, optimizer, LR scheduler and every rank's RNG state,
and the batches of a step depend only on the step.
"""
from __future__ import annotations

import signal
import uuid

import pytest
import torch

from azext_elastictrain.core.blobstore import BlobStore
from harness.elastic import JobConfig, Node, dump, events_of, read_events, wait_for

STEPS = 90


def _config(azurite, etcd, container_url, final_path, name):
    return JobConfig(
        name=name,
        checkpoint_url=f"{container_url}/{name}",
        connection_string=azurite.connection_string,
        etcd_endpoint=etcd.endpoint,
        min_nodes=1, max_nodes=1, nproc_per_node=2,
        script_args=["--steps", str(STEPS), "--checkpoint-every", "30", "--step-delay", "0.04",
                     "--log-every", "30", "--save-final", str(final_path)],
        # The blob path is what this proves (its checkpoint carries every rank's RNG state), and the second run
        # is another node: with the memory tier on, a SIGTERM whose step every node holds in memory saves
        # nothing to blob (a re-form resumes from memory), so a restart elsewhere would resume from step 30.
        extra_env={"ELASTICTRAIN_MEMORY_TIER": "off"},
    )


@pytest.mark.slow  # ~45 s: two real 2-node trainings to the end
def test_a_run_interrupted_by_a_notice_ends_with_the_same_weights(azurite, etcd, container_url, tmp_path):
    straight = _config(azurite, etcd, container_url, tmp_path / "straight.pt", f"det-{uuid.uuid4().hex[:6]}")
    node = Node(straight, "node-a", tmp_path / "straight")
    try:
        assert node.wait(timeout=240) == 0, node.log_tail()
    finally:
        node.stop()

    interrupted = _config(azurite, etcd, container_url, tmp_path / "interrupted.pt", f"det-{uuid.uuid4().hex[:6]}")
    store = BlobStore.from_url(interrupted.checkpoint_url, connection_string=azurite.connection_string)
    events = lambda: read_events(store, store.prefix)  # noqa: E731
    first = Node(interrupted, "node-a", tmp_path / "first")
    try:
        # Interrupt between two interval checkpoints, so only the notice saves that step.
        wait_for(lambda: any(35 <= e.get("step", 0) < 55 for e in events_of(events(), "progress")),
                 timeout=120, what="training to pass step 35", on_timeout=lambda: dump(events()) + first.log_tail())
        first.signal_agent(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        first.stop()
    preempted = events_of(events(), "preempted")
    assert preempted, dump(events())
    notice_step = preempted[0]["step"]
    assert notice_step % 30 != 0, "the notice must fall between interval checkpoints to prove anything"

    second = Node(interrupted, "node-b", tmp_path / "second")
    try:
        assert second.wait(timeout=240) == 0, second.log_tail()
    finally:
        second.stop()
    restored = [e for e in events_of(events(), "restored") if e.get("step") is not None]
    assert restored and restored[-1]["step"] == notice_step, dump(events())
    assert events_of(events(), "finished")[-1]["step"] == STEPS
    store.close()

    a = torch.load(tmp_path / "straight.pt")
    b = torch.load(tmp_path / "interrupted.pt")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-6, msg=f"{key} differs")
