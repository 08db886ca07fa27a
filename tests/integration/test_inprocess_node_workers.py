"""In-process recovery with nodes of several workers (a GPU VM runs one per GPU): the README's script, unchanged,
on 2 nodes of 2 workers each, launched as ``job run --local --recovery in-process --nproc-per-node 2`` launches
them (harness/elastic.py: the product's AgentLaunch and coordinator), through one worker killed (torchrun
restarts its node's workers, which rejoin), a node killed, a newcomer, and the newcomer's SIGTERM (a notice: it
hands over and leaves). A restarted worker generation needs a
fresh torchrun store (the launch's TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): in torch's default the agent's store
outlives the restart, and both torch's own init_process_group and torchft's manager address (a fixed key) find the
dead generation's keys in it (seen: node-1's workers restarting in a loop, every init timing out).

Each node is one replica group: its workers a ``torchrun --standalone`` world whose DDP averages within the node,
the runtime's optimizer hook across the nodes. Checked from the workers' own records (tests/support/readme_harness.py
writes each committed step's slice): the survivor's two worker processes never change, every epoch's samples are
trained exactly once in an uninterrupted run's order whatever the layout (4 ranks, 2, 4, 2 again), and the job is
finished at its last step.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.core.blobstore import BlobStore
from tests.e2e.test_readme import BLOCKS, HARNESS
from harness import services as svc
from harness.elastic import Coordinator, JobConfig, Node, events_of, read_events, wait_for
from tests.support.slices import check_exactly_once, read_slices

pytestmark = [pytest.mark.slow, pytest.mark.timeout(500), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

STEPS = 3 * 4096 // 64  # the README's loop: 3 epochs of 4096 samples, a global batch of 64


def test_nodes_of_two_workers_train_each_sample_once_through_a_worker_restart_a_kill_a_newcomer_and_a_notice(
        azurite: svc.AzuriteService, container_url: str, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("torchft", reason="in-process jobs run torchft (the train extra)")
    block, out, slow = tmp_path / "train.py", tmp_path / "records", tmp_path / "slow"
    block.write_text(BLOCKS[0], encoding="utf-8")
    slow.touch()
    for key, value in (("READMETEST_BLOCK", block), ("READMETEST_OUT", out), ("READMETEST_SLOW", slow),
                       ("READMETEST_STEP_DELAY", "0.3")):  # slow until the newcomer trained, then full speed
        monkeypatch.setenv(key, str(value))
    name = f"workers-{uuid.uuid4().hex[:6]}"
    coordinator = Coordinator(tmp_path / "coordinator", min_nodes=1, job=name)
    job = JobConfig(name=name, checkpoint_url=f"{container_url}/{name}", connection_string=azurite.connection_string,
                    etcd_endpoint="unused:0", nproc_per_node=2, recovery=launch.RECOVERY_IN_PROCESS,
                    coordinator=coordinator.address, script=HARNESS)
    nodes = [Node(job, f"{name}-node-{i}", tmp_path) for i in range(2)]

    def layouts(node: str) -> set[int]:
        return {r["ranks"] for r in read_slices(out) if r["node"] == node} if out.exists() else set()

    def pids(node: str) -> set[int]:
        return {r["pid"] for r in read_slices(out) if r["node"] == node}

    def tails() -> str:
        return "\n".join(f"--- {n.name}\n{n.log_tail(3000)}" for n in nodes)

    store = BlobStore.from_url(job.checkpoint_url, connection_string=azurite.connection_string)
    try:
        wait_for(lambda: 4 in layouts(nodes[0].name) and 4 in layouts(nodes[1].name), 240,
                 "both nodes training, 4 ranks", on_timeout=tails)
        # One worker of node-1 dies: torchrun restarts the node's two workers, whose new managers must find each
        # other (not the dead one's address), take the state from node-0 and train at 4 ranks again.
        (victim,) = {r["pid"] for r in read_slices(out) if r["node"] == nodes[1].name and r["rank"] % 2 == 1}
        first_pids = pids(nodes[1].name)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: [r for r in read_slices(out) if r["node"] == nodes[1].name and r["ranks"] == 4
                          and r["pid"] not in first_pids], 180, "node-1's restarted workers training at 4 ranks",
                 on_timeout=tails)
        killed = time.time()  # node-0 may also have trained alone at the start: only records after the kill count
        nodes[1].kill()
        wait_for(lambda: [r for r in read_slices(out) if r["node"] == nodes[0].name and r["ranks"] == 2
                          and r["time"] > killed], 120, "the survivor training alone, 2 ranks", on_timeout=tails)
        nodes.append(Node(job, f"{name}-node-2", tmp_path))
        wait_for(lambda: 4 in layouts(nodes[2].name), 240, "the newcomer admitted, 4 ranks", on_timeout=tails)
        # The newcomer's pod is deleted (a SIGTERM through its agent to both workers): a notice, on which the node
        # hands over (runtime/handover.py; its two workers decide each step as one) and leaves; node-0 trains on.
        wait_for(lambda: len([r for r in read_slices(out) if r["node"] == nodes[2].name and r["ranks"] == 4]) >= 6,
                 60, "the newcomer's third step", on_timeout=tails)  # it has timed its steps (handover.py)
        terminated = time.time()
        nodes[2].signal_agent(signal.SIGTERM)
        wait_for(lambda: [r for r in read_slices(out) if r["node"] == nodes[0].name and r["ranks"] == 2
                          and r["time"] > terminated], 120, "the survivor alone again, 2 ranks", on_timeout=tails)
        assert nodes[2].wait(timeout=120) != 0, tails()  # a stop, not the job's end
        assert nodes[2].log_tail(10**6).count("handing over: heartbeats stopped") == 2, tails()
        slow.unlink()
        assert nodes[0].wait(timeout=300) == 0, tails()
        events = read_events(store, store.prefix)
    finally:
        for node in nodes:
            node.stop()
        coordinator.stop()
        store.close()

    records = read_slices(out)
    survivor = {(r["rank"] % 2, r["pid"]) for r in records if r["node"] == nodes[0].name}
    assert len(survivor) == 2, f"the survivor's workers restarted: {sorted(survivor)}"  # one pid per worker
    assert check_exactly_once(records, epochs=3) == STEPS
    (finished,) = events_of(events, "finished")
    assert finished["step"] == STEPS
