"""The in-process recovery mode with real processes on loopback: a coordinator (torchft's Lighthouse) in the test,
replica processes running the README's loop (harness/replica_worker.py), real Azurite for the blob tier.

What every test checks on the survivors' own records: their pids never change, the committed steps go on without a
gap, and each epoch's samples are trained exactly once (the committed slices of each step join into its global
batch, whatever the world was at that step).
"""
from __future__ import annotations

import json
import math
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from azext_elastictrain.core import launch
from harness import replica_worker
from harness import services as svc
from harness.restartable_coordinator import RestartableCoordinator as Coordinator

# Cases whose timing three parallel workers on two cores would skew are marked torchrun: scripts/test.sh runs them
# alone, after the rest (both the mid-transfer kill and a newcomer's admission once failed in the parallel phase).
pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

REPO = Path(__file__).resolve().parents[2]
SIZE, BATCH = 240, 12  # 20 global batches an epoch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """One node (a single worker) of the job and the JSON lines it printed, read as they come."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path):
        self.name = name
        self.records: list[dict] = []
        self.final: dict | None = None
        self.perturbed: int | None = None  # the step after which it changed a parameter (REPLICA_PERTURB_FILE)
        self.unmatched: list[dict] = []  # verdicts that follow no record of their step (the worker's bug)
        self._log = open(log_dir / f"{name}.log", "ab")  # pylint: disable=consider-using-with
        self.proc = replica_worker.start(name, env, self._log)
        self.pid = self.proc.pid
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for record in replica_worker.records(self.proc.stdout):
            if "final" in record:
                self.final = record
            elif "perturbed" in record:
                self.perturbed = record["perturbed"]
            elif "verdict" in record:  # the step's commit, printed after its optimizer step
                mine = self.records[-1] if self.records else {}
                if mine.get("step") == record["verdict"]:
                    mine["committed"] = record["committed"]
                    mine["params"] = record.get("params")  # after the step's optimizer step
                else:  # read by assert_exactly_once: an assertion here would only end this thread
                    self.unmatched.append(record)
            else:
                self.records.append(record)

    def last_step(self) -> int:
        return max((r["step"] for r in self.records), default=0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self._log.close()


def training_together(replicas: list[Replica]) -> bool:
    """Every replica's last record is a participant's slice in a world of them all, past step 5: a replica that is
    still taking the state from a peer (or was never admitted) is not a member whose loss the test is about."""
    return all(r.records and r.records[-1]["ranks"] == len(replicas) and r.records[-1]["replica_rank"] is not None
               and r.last_step() >= 5 for r in replicas)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def job(azurite: svc.AzuriteService, container_url: str, tmp_path: Path):
    """Starts replicas of one job against a coordinator of its own; stops everything afterwards."""
    coordinator = Coordinator(tmp_path)
    started: list[Replica] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("ELASTICTRAIN_")}
    env = {**base, "ELASTICTRAIN_RECOVERY": "in-process", "TORCHFT_LIGHTHOUSE": coordinator.address,
           "ELASTICTRAIN_REPLICA_HOST": "127.0.0.1", "ELASTICTRAIN_SCHEDULED_EVENTS_URL": "off",
           launch.ENV_JOB_SECRET: uuid.uuid4().hex,  # the state server's guard, as job run gives it
           "ELASTICTRAIN_MEMORY_TIER": "off", "ELASTICTRAIN_WARM_START": "off",
           launch.ENV_REPLICA_TIMEOUT: f"{launch.LOCAL.replica_timeout_seconds:g}",  # what a local job's nodes get
           "ELASTICTRAIN_CHECKPOINT_URL": f"{container_url}/job-{uuid.uuid4().hex[:6]}",
           "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}

    class Job:
        prefix = env["ELASTICTRAIN_CHECKPOINT_URL"].rsplit("/", 1)[1]
        url = env["ELASTICTRAIN_CHECKPOINT_URL"]

        def __init__(self) -> None:
            self.coordinator = coordinator
            self.log_dir = tmp_path

        def start(self, name: str, **extra: str) -> Replica:
            replica = Replica(name, {**env, **extra}, tmp_path)
            started.append(replica)
            return replica

    try:
        yield Job()
    finally:
        for replica in started:
            replica.stop()
        coordinator.kill()


def order(epoch: int) -> list[int]:
    return torch.randperm(SIZE, generator=torch.Generator().manual_seed(epoch)).tolist()


def trained(replica: Replica, step: int) -> dict | None:
    """The replica's record of the last time it trained ``step`` as a participant (None: it did not, it only took
    the state from a peer, or that try was discarded)."""
    mine = [r for r in replica.records if r["step"] == step]
    if not mine or mine[-1]["replica_rank"] is None or mine[-1].get("committed") is False:
        return None
    return mine[-1]


def committed_slices(replicas: list[Replica], survivors: list[Replica]) -> dict[int, list[dict]]:
    """Per step the survivors ended at, the records of the slices trained in it: each replica's last try of the
    step, by its own verdict. A replica killed before it printed its verdict (None) counts if the step was
    committed at its layout by the others: the step's collective needs every participant (all of them or none)."""
    steps: dict[int, list[dict]] = {}
    for step in range(1, min(s.last_step() for s in survivors) + 1):
        tries = {r.name: rec for r in replicas if (rec := trained(r, step)) is not None}
        done = {name: rec["ranks"] for name, rec in tries.items() if rec.get("committed")}
        assert done, f"step {step}: no replica shows it committed: {tries}"
        assert len(set(done.values())) == 1, f"step {step}: committed at several layouts {done}"
        ranks = next(iter(done.values()))
        steps[step] = [rec for rec in tries.values() if rec["ranks"] == ranks]
    return steps


def assert_exactly_once(replicas: list[Replica], survivors: list[Replica]) -> None:
    assert not [r.unmatched for r in replicas if r.unmatched], "verdicts without their step's record"
    for step, records in committed_slices(replicas, survivors).items():
        epoch, index = divmod(step - 1, SIZE // BATCH)
        expected = order(epoch)[index * BATCH:(index + 1) * BATCH]
        trained = sorted(i for rec in records for i in rec["ids"])
        assert trained == sorted(expected), f"step {step}: trained {trained}, the global batch is {sorted(expected)}"
        assert sorted(rec["rank"] for rec in records) == list(range(records[0]["ranks"])), (step, records)
        # the worker's LR scheduler, stepped after every try: a discarded try is taken back (runtime StepUndo)
        lr = replica_worker.LR * replica_worker.GAMMA ** (step - 1)
        assert all(math.isclose(rec["lr"], lr, rel_tol=1e-9) for rec in records), (step, lr, records)


def assert_same_pids(survivors: list[Replica]) -> None:
    for s in survivors:
        assert {r["pid"] for r in s.records} == {s.pid}, f"{s.name} restarted its worker"


def test_replicas_train_every_sample_once_and_end_identical(job) -> None:
    replicas = [job.start(f"node-{i}") for i in range(2)]
    for r in replicas:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(replicas)
    assert_exactly_once(replicas, replicas)
    assert replicas[0].final["final"] == replicas[1].final["final"]
    assert replicas[0].final["step"] == replicas[1].final["step"] == 2 * SIZE // BATCH
    # The same global batches at one node: the same maths (a mean of equal slices' means is the batch's mean),
    # equal up to the order floats are summed in.
    alone = job.start("alone", ELASTICTRAIN_CHECKPOINT_URL=job.url + "-alone")
    assert alone.proc.wait(timeout=240) == 0
    assert torch.allclose(torch.tensor(alone.final["final"]), torch.tensor(replicas[0].final["final"]), atol=1e-5), \
        first_difference(alone, replicas)
    assert {r["ranks"] for r in alone.records} == {1}


def first_difference(alone: Replica, replicas: list[Replica]) -> str:
    """Where the replicas' committed steps first left the lone run's: that step's records on each side."""
    def committed(replica: Replica) -> dict[int, dict]:
        return {r["step"]: r for r in replica.records if r.get("committed")}

    mine, theirs = committed(alone), [committed(r) for r in replicas]
    for step in sorted(mine):
        others = [t[step] for t in theirs if step in t]
        if others and not all(torch.allclose(torch.tensor(mine[step]["params"]), torch.tensor(o["params"]), atol=1e-5)
                              for o in others):
            keys = ("step", "ids", "lr", "epoch", "consumed", "rank", "replica_rank", "params")
            return (f"the replicas first differ from the lone run after step {step}: alone "
                    f"{ {k: mine[step].get(k) for k in keys} }, replicas "
                    f"{[{k: o.get(k) for k in keys} for o in others]}, the step before: alone "
                    f"{mine.get(step - 1, {}).get('params')}, replicas "
                    f"{[t.get(step - 1, {}).get('params') for t in theirs]}")
    return f"no committed step differs: alone committed {sorted(mine)}, replicas {[sorted(t) for t in theirs]}"


def test_no_replica_ends_before_the_final_checkpoint_is_committed(job, azurite, container_url) -> None:
    """k8s-job's Job succeeds at the first pod that exits 0 and then stops the others (successPolicy
    succeededCount 1): a replica that does not write the final checkpoint ends only after the writing one committed
    it, so the job's success never cuts the final upload short. A 64 MB state makes that upload take a while."""
    settings = {"REPLICA_PAD_MB": "64", "REPLICA_EPOCHS": "1", launch.ENV_CHECKPOINT_INTERVAL_STEPS: "100000"}
    replicas = [job.start(f"node-{i}", **settings) for i in range(2)]
    final = SIZE // BATCH
    first = wait_for(lambda: next((r for r in replicas if r.final is not None), None), 240,
                     "a replica to end its loop")
    committed = durable_steps(azurite, container_url, job.prefix)
    assert final in committed, f"{first.name} ended its loop before step {final} was committed: {committed}"
    for replica in replicas:
        assert replica.proc.wait(timeout=120) == 0, f"{replica.name} failed: see its log"
    assert [r.final["step"] for r in replicas] == [final, final]


def durable_steps(azurite: svc.AzuriteService, container_url: str, prefix: str) -> list[int]:
    """The steps whose checkpoint is committed in blob (its manifest.json written)."""
    client = azurite.blob_service_client().get_container_client(container_url.rsplit("/", 1)[1])
    try:
        return sorted(int(b.name.split("/")[2]) for b in client.list_blobs(name_starts_with=f"{prefix}/checkpoints/")
                      if b.name.endswith("/manifest.json"))
    finally:
        client.close()


def job_events(azurite: svc.AzuriteService, container_url: str, prefix: str) -> list[dict]:
    """The job's event log as the CLI reads it."""
    from azext_elastictrain.core.eventlog.events import parse_events

    client = azurite.blob_service_client().get_container_client(container_url.rsplit("/", 1)[1])
    try:
        return parse_events(client.download_blob(f"{prefix}/events.jsonl").readall())
    finally:
        client.close()


@pytest.mark.torchrun  # a newcomer admitted before the survivors finish
def test_killed_replica_survivors_go_on_and_newcomer_heals(job, azurite, container_url) -> None:
    """The newcomer restores blob's older checkpoint first (a stale copy), then heals from a live peer."""
    every = {"REPLICA_EPOCHS": "12", "ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS": "10"}
    replicas = [job.start(f"node-{i}", **every) for i in range(3)]
    wait_for(lambda: training_together(replicas), 120, f"{len(replicas)} replicas training together")
    victim, survivors = replicas[-1], replicas[:-1]
    victim.proc.send_signal(signal.SIGKILL)
    killed_at = max(r.last_step() for r in survivors)
    wait_for(lambda: all(r.last_step() >= killed_at + 5 for r in survivors), 120, "the survivors 5 steps on")
    wait_for(lambda: durable_steps(azurite, container_url, job.prefix), 60, "an interval checkpoint in blob")
    newcomer = job.start("node-new", **every)
    wait_for(lambda: newcomer.records and newcomer.records[-1]["ranks"] == 3, 120, "the newcomer admitted")
    everyone = survivors + [newcomer]
    for r in everyone:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(everyone)
    assert_exactly_once(replicas + [newcomer], survivors)
    finals = {json.dumps(r.final["final"]) for r in everyone}
    assert len(finals) == 1, "the replicas ended with different models"
    assert newcomer.records[0]["step"] > killed_at, "the newcomer started from its peers' step, not from 0"
    durable = durable_steps(azurite, container_url, job.prefix)
    assert durable[-1] == newcomer.final["step"], durable  # the writer group's final checkpoint
    assert all(step % 10 == 0 for step in durable[:-1]), durable  # one writer: the interval's steps, once each


def test_every_node_trains_each_step_before_and_after_a_join(job) -> None:
    """Three nodes whose steps (0.5 s) outlast a wait the coordinator once had for late nodes (200 ms): a quorum
    formed the moment a majority had asked, the third node sat the step out, and the job trained every step as
    2 of its 3 nodes (core/launch.py's join timeout). Every quorum holds them all, and again once one is lost and
    a newcomer is admitted."""
    slow = {"REPLICA_EPOCHS": "1000", "REPLICA_STEP_SECONDS": "0.5"}
    replicas = [job.start(f"node-{i}", **slow) for i in range(3)]
    wait_for(lambda: training_together(replicas), 120, "3 replicas training together")

    def all_train(members: list[Replica], steps: int = 10) -> None:
        start = max(r.last_step() for r in members)
        wait_for(lambda: all(r.last_step() >= start + steps for r in members), 60, f"{steps} steps more")
        for r in members:
            sizes = [rec["ranks"] for rec in r.records if start < rec["step"] <= start + steps]
            # a needless drop under load (a late heartbeat) may cost a step: not the half of them the split cost
            assert sizes.count(len(members)) >= 0.8 * len(sizes), f"{r.name}: participants by step {sizes}"

    all_train(replicas)
    replicas[0].proc.send_signal(signal.SIGKILL)
    survivors = replicas[1:]
    newcomer = job.start("node-new", **slow)
    wait_for(lambda: training_together(survivors + [newcomer]), 120, "the newcomer admitted beside the survivors")
    all_train(survivors + [newcomer])
    assert_same_pids(survivors + [newcomer])


def test_a_replica_that_differs_from_the_others_is_named_and_takes_their_state(job, tmp_path) -> None:
    """node-0 drifts after a committed step (as a node whose commit the others did not make). The check at the next
    4th step's start names it; it sits that step out (the others train its slice) and at the next quorum it is one
    step behind and takes a peer's state, in process. The job ends with the replicas one."""
    every = {"REPLICA_EPOCHS": "3", "ELASTICTRAIN_REPLICA_CHECK_STEPS": "4"}
    drift = tmp_path / "drift"
    replicas = [job.start("node-0", REPLICA_PERTURB_FILE=str(drift), **every),
                *(job.start(f"node-{i}", **every) for i in (1, 2))]
    wait_for(lambda: training_together(replicas), 120, f"{len(replicas)} replicas training together")
    drift.touch()
    for r in replicas:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(replicas)
    assert_exactly_once(replicas, replicas)
    assert len({json.dumps(r.final["final"]) for r in replicas}) == 1, "the replicas ended with different models"
    checked = replicas[0].perturbed + (-replicas[0].perturbed) % 4  # the committed steps at the check's start
    logs = {r.name: (job.log_dir / f"{r.name}.log").read_text(encoding="utf-8") for r in replicas}
    assert all(f"the replicas differ at step {checked}" in text for text in logs.values()), logs["node-1"][-3000:]
    assert "(this one)" in logs["node-0"] and "(this one)" not in logs["node-1"] + logs["node-2"]
    sat_out = [rec for rec in replicas[0].records if rec["step"] == checked + 1]
    assert sat_out[0]["replica_rank"] is None and sat_out[-1].get("committed") is False, sat_out
    assert {rec["ranks"] for rec in replicas[1].records if rec["step"] == checked + 1} == {2}  # its slice: theirs


def test_two_replicas_lost_at_once(job) -> None:
    replicas = [job.start(f"node-{i}", REPLICA_EPOCHS="6") for i in range(4)]
    wait_for(lambda: training_together(replicas), 120, f"{len(replicas)} replicas training together")
    survivors = replicas[:2]
    for victim in replicas[2:]:
        victim.proc.send_signal(signal.SIGKILL)
    for r in survivors:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(survivors)
    assert_exactly_once(replicas, survivors)
    assert survivors[0].final["final"] == survivors[1].final["final"]
    assert survivors[0].records[-1]["ranks"] == 2


@pytest.mark.torchrun  # "no step trained twice": a 2 s timeout under load would discard one
def test_notice_is_a_planned_departure_the_others_do_not_stop(job) -> None:
    """A Scheduled Events Preempt on one node: it leaves the quorum at a step boundary, acknowledges the event and
    ends (exit 143, as a stop); the others train on, and no committed step of theirs is discarded."""
    from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer

    with ScheduledEventsServer() as imds:
        leaving = {"ELASTICTRAIN_SCHEDULED_EVENTS_URL": imds.url, "ELASTICTRAIN_VM_NAME": "vm-2",
                   "ELASTICTRAIN_PREEMPTION_POLL_SECONDS": "0.2", "ELASTICTRAIN_PREEMPTION_HOLD_SECONDS": "1"}
        replicas = [job.start(f"node-{i}", REPLICA_EPOCHS="8") for i in range(2)]
        replicas.append(job.start("node-2", REPLICA_EPOCHS="8", **leaving))
        # two steps of 3 on every node: a node hands over only once it has timed a step (runtime/handover.py), and
        # the leaving node may have joined a step before the others' first record of 3
        wait_for(lambda: all(sum(rec.get("ranks") == 3 for rec in r.records) >= 2 for r in replicas), 120, "3 replicas")
        event = imds.post_event(["vm-2"], "Preempt", notice_seconds=30)
        assert imds.wait_acknowledged(event, timeout=60), "the leaving node never acknowledged the notice"
        victim, survivors = replicas[-1], replicas[:-1]
        assert victim.proc.wait(timeout=60) == 143
        left_at = victim.last_step()
        for r in survivors:
            assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(survivors)
    assert_exactly_once(replicas, survivors)
    for r in survivors:  # a planned departure discards no step: each step was trained once
        steps = [rec["step"] for rec in r.records]
        assert steps == sorted(set(steps)), f"{r.name} trained a step twice around the departure"
    assert survivors[0].records[-1]["ranks"] == 2 and left_at < survivors[0].final["step"]
    # It handed over (runtime/handover.py): it trained on without heartbeats until the coordinator had dropped it,
    # so the survivors never asked for their quorum while the coordinator still heard it (torchft's Lighthouse logs
    # each request's view: "[asked/heard participants healthy][heard heartbeating]").
    log = (job.log_dir / "coordinator.log").read_text().split("Detected quorum change")
    assert len(log) >= 3, "no re-form after the departure"
    after = log[-2].rsplit("[3/3 participants healthy]", 1)[-1]  # after the quorums the departing node was in
    waited = [line for line in after.splitlines() if "[2/2 participants healthy][3 heartbeating]" in line]
    assert not waited, f"the survivors waited for the departing node's heartbeat to age out: {waited[:2]}"


@pytest.mark.torchrun  # the heartbeat timeout tells a frozen node from a slow one
def test_frozen_replica_is_dropped_and_the_others_go_on(job, azurite, container_url) -> None:
    """A node frozen (a Spot VM that vanished: sockets open, no FIN) with AKS's 30 s replica timeout: the survivors
    give the step's collective up once its beats stop (runtime/replica_watch.py), in seconds, not at the timeout."""
    aks = {launch.ENV_REPLICA_TIMEOUT: f"{launch.AKS.replica_timeout_seconds:g}"}
    assert launch.AKS.replica_timeout_seconds >= 30
    replicas = [job.start(f"node-{i}", REPLICA_EPOCHS="8", **aks) for i in range(3)]
    wait_for(lambda: training_together(replicas), 120, f"{len(replicas)} replicas training together")
    # a few steps of the world of 3 first: a node that started late heals into it a step before the freeze, and
    # the world of 3 then has no step of its own reported for the outage to start from
    together = max(r.last_step() for r in replicas)
    wait_for(lambda: all(r.last_step() >= together + 3 and r.records[-1]["ranks"] == 3 for r in replicas), 120,
             "the world of 3 three steps on")
    victim, survivors = replicas[-1], replicas[:-1]
    victim.proc.send_signal(signal.SIGSTOP)
    frozen_at = max(r.last_step() for r in survivors)
    wait_for(lambda: all(r.last_step() >= frozen_at + 5 and r.records[-1]["ranks"] == 2 for r in survivors), 120,
             "the survivors 5 steps on without the frozen one")
    victim.proc.send_signal(signal.SIGKILL)
    for r in survivors:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(survivors)
    assert_exactly_once(replicas, survivors)
    assert survivors[0].final["final"] == survivors[1].final["final"]
    # the CLI's reading: one quorum event per change (one writer), and the vanish is one outage, no step lost
    from azext_elastictrain.core.eventlog import goodput

    events = job_events(azurite, container_url, job.prefix)
    changes = [e for e in events if e.get("event") == "quorum"]
    assert [(e["from_world_size"], e["world_size"]) for e in changes][-1] == (3, 2), changes
    assert len({(e["from_world_size"], e["world_size"], e["step"]) for e in changes}) == len(changes), changes
    # the re-form without the frozen node; its outage runs from the last world that trained a step (the world of 3
    # may have formed just before the freeze and trained none)
    (outage,) = [o for o in goodput.outages(events) if o["restoredAt"] == changes[-1]["time"]]
    # at most the step in flight is tried again (none when the node went during the step's start: a new quorum at
    # once, before the body)
    assert outage["stepsLost"] == 0 and outage["outageSeconds"] > 0 and changes[-1]["discarded"] <= 1, outage
    assert outage["lastStep"] >= frozen_at - 1 and outage["firstStep"] == outage["lastStep"] + 1, outage
    # given up on the frozen node's silence (0.5 s here), not at the 30 s timeout; every survivor says why
    assert outage["outageSeconds"] < launch.AKS.replica_timeout_seconds / 3, outage
    for r in survivors:
        assert "a participant of the quorum is gone" in (job.log_dir / f"{r.name}.log").read_text(encoding="utf-8")


@pytest.mark.torchrun  # the replicas must still train when it is back
def _coasted(job, replicas: list[Replica]) -> list[int]:
    """How many times each replica began training on without the coordinator (its log's warnings)."""
    return [(job.log_dir / f"{r.name}.log").read_text(encoding="utf-8").count("the coordinator does not answer")
            for r in replicas]


def test_coordinator_restart_costs_no_training_while_no_node_leaves_or_joins(job, tmp_path) -> None:
    """The coordinator is killed and comes back on the same address 5 s later: the replicas train on with their
    last quorum while it is gone (no node left or joined: the step-start collective finds every member), then ask
    the new one; every committed step trained exactly once, the same model on both. (The new coordinator counts
    quorums from 1 again: the new group meets on an earlier group's store prefix, whose leftover keys it no longer
    reads: runtime/replica_watch.py.) A kill that lands while the nodes' quorum request is in flight cannot be
    trained through (torchft's manager retries that request until the coordinator answers): then the kill is tried
    again.
    The job's --min-nodes is 2: with 1, a new coordinator that hears one node's request more than its join timeout
    before the other's forms a quorum of each (seen under load), and the replica check heals one a step later."""
    (tmp_path / "min-2").mkdir()
    coordinator = Coordinator(tmp_path / "min-2", min_nodes=2)
    slow = {"REPLICA_EPOCHS": "3", "REPLICA_STEP_SECONDS": "0.3",  # a step's quorum request: a small share of it
            "TORCHFT_LIGHTHOUSE": coordinator.address}
    replicas = [job.start(f"node-{i}", **slow) for i in range(2)]
    try:
        wait_for(lambda: all(r.records and r.records[-1]["ranks"] == 2 for r in replicas), 120, "2 replicas")
        for _ in range(4):
            before = _coasted(job, replicas)
            started = max(r.last_step() for r in replicas)  # kill just after a step's quorum, in its compute: a
            wait_for(lambda: all(r.last_step() > started for r in replicas), 30, "the next step")  # kill mid-request
            coordinator.kill()  # lets the nodes' retries reach the new coordinator apart
            gone = time.time()
            time.sleep(5)
            back = time.time()
            coordinator.start()
            if all(now > then for now, then in zip(_coasted(job, replicas), before)):
                break
            resumed = max(r.last_step() for r in replicas)  # the request was in flight: again once they train
            wait_for(lambda: all(r.last_step() > resumed + 3 for r in replicas), 120, "training after the restart")
        codes = [r.proc.wait(timeout=240) for r in replicas]
    finally:
        coordinator.kill()
    assert codes == [0, 0], codes
    assert_same_pids(replicas)
    assert_exactly_once(replicas, replicas)
    assert replicas[0].final["final"] == replicas[1].final["final"]
    for r in replicas:  # steps committed while the coordinator was gone, at both nodes' layout
        during = [rec for rec in r.records if gone < rec["time"] < back and rec.get("committed")]
        assert len(during) >= 3 and {rec["ranks"] for rec in during} == {2}, (r.name, during)
        assert "the coordinator answers again" in (job.log_dir / f"{r.name}.log").read_text(encoding="utf-8")


def test_a_node_lost_with_the_coordinator_gone_stops_with_the_retryable_code(job) -> None:
    """The coordinator gone, then a node: the survivor's step-start collective finds its peer missing (or its
    quorum request was in flight at the kill), and no new quorum can be had past the quorum timeout and its retries
    (torchft's TORCHFT_QUORUM_TIMEOUT_SEC, _RETRIES): it does not train on alone from a state it cannot agree; it
    stops with TrainingStopped's code, which torchrun restarts."""
    bounded = {"TORCHFT_QUORUM_TIMEOUT_SEC": "3", "TORCHFT_QUORUM_RETRIES": "1"}
    replicas = [job.start(f"node-{i}", REPLICA_EPOCHS="12", **bounded) for i in range(2)]
    wait_for(lambda: all(r.records and r.records[-1]["ranks"] == 2 for r in replicas), 120, "2 replicas")
    job.coordinator.kill()
    gone = time.time()
    survivor, victim = replicas
    time.sleep(1)  # coasting, or waiting on a request that was in flight
    victim.proc.send_signal(signal.SIGKILL)
    stopped = survivor.last_step()
    assert survivor.proc.wait(timeout=120) == 143
    assert_same_pids([survivor])
    assert survivor.last_step() <= stopped + 1, "trained on without a quorum"
    assert {rec["ranks"] for rec in survivor.records if rec["time"] > gone and rec.get("committed")} <= {2}, \
        "committed a step alone"


@pytest.mark.torchrun  # step 30 at 3 replicas, then at 2
def test_communicator_error_mid_collective_discards_the_step_and_trains_it_again(job) -> None:
    """A peer gone in the middle of a step (after it drew its batch, before the backward's gradient collective): the
    survivors' collective fails, the step is discarded (no optimizer update from a partial average) and trained
    again by the new world, its global batch whole."""
    replicas = [job.start(f"node-{i}", REPLICA_EPOCHS="6") for i in range(2)]
    replicas.append(job.start("node-2", REPLICA_EPOCHS="6", REPLICA_DIE_AT_STEP="30"))
    assert replicas[-1].proc.wait(timeout=180) == 9
    survivors = replicas[:2]
    for r in survivors:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    for r in survivors:
        at_30 = [rec["ranks"] for rec in r.records if rec["step"] == 30]
        assert at_30[0] == 3 and at_30[-1] == 2 and len(at_30) >= 2, f"{r.name} at step 30: {at_30}"
    assert_same_pids(survivors)
    assert_exactly_once(replicas, survivors)
    assert survivors[0].final["final"] == survivors[1].final["final"]


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_with_salvage_a_step_a_node_left_mid_step_is_committed_and_its_slice_trained_next(job, how) -> None:
    """ELASTICTRAIN_SALVAGE=on (runtime/salvage.py): a node gone mid-step, after it drew its batch and before the
    gradient collective (killed: its sockets close; frozen: a Spot VM vanished, AKS's 30 s replica timeout), and the
    survivors commit that step with their own gradients at its first try, train the gone node's slice at the next
    step, and each epoch's samples are still trained exactly once."""
    salvage = {launch.ENV_SALVAGE: "on", launch.ENV_REPLICA_TIMEOUT: f"{launch.AKS.replica_timeout_seconds:g}",
               "REPLICA_EPOCHS": "3"}
    replicas = [job.start(f"node-{i}", **salvage) for i in range(2)]
    if how == "killed":
        replicas.append(job.start("node-2", REPLICA_DIE_AT_STEP="30", **salvage))
        assert replicas[-1].proc.wait(timeout=180) == 9
        gone_at = 30
    else:  # frozen inside a step's compute (1 s), after its record: the survivors are past the step's start
        replicas.append(job.start("node-2", REPLICA_STEP_SECONDS="1", **salvage))
        wait_for(lambda: training_together(replicas), 120, "3 replicas training together")
        gone_at = replicas[-1].last_step() + 1
        wait_for(lambda: replicas[-1].last_step() >= gone_at, 60, "the next step's record")
        replicas[-1].proc.send_signal(signal.SIGSTOP)
    survivors = replicas[:2]
    for r in survivors:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    replicas[-1].stop()
    assert_same_pids(survivors)
    for r in survivors:
        tries = [rec for rec in r.records if rec["step"] == gone_at]
        assert [(t["ranks"], t.get("committed")) for t in tries] == [(3, True)], f"{r.name}: {tries}"
        after = [rec for rec in r.records if rec["step"] == gone_at + 1]
        assert len(after[-1]["ids"]) == (BATCH + BATCH // 3) // 2, after  # the owed slice leads that batch
        assert "the step is salvaged by 2 of 3 nodes" in (job.log_dir / f"{r.name}.log").read_text("utf-8")
    # exactly once, by epoch, over the slices whose step committed (the gone node's slice of its last step: never)
    by_epoch: dict[int, list[int]] = {}
    for r in replicas:
        for rec in r.records:
            if rec.get("committed") and rec["replica_rank"] is not None:
                by_epoch.setdefault(rec["epoch"], []).extend(rec["ids"])
    assert sorted(by_epoch) == [0, 1, 2]
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(SIZE)), f"epoch {epoch}: not each sample once"
    assert survivors[0].final["final"] == survivors[1].final["final"]
    assert survivors[0].final["step"] == 3 * SIZE // BATCH


@pytest.mark.torchrun  # the kill must land within a transfer
def test_peer_dies_mid_state_transfer_the_newcomer_heals_from_another(job, tmp_path) -> None:
    """The peer a newcomer fetches the state from is killed while it serves it (a 256 MiB state): the newcomer's
    step is discarded and it heals at a later quorum from the other live peer, to the same model.

    The kill follows the newcomer's log line naming its source, and may land after a fast transfer: then the
    scenario is tried again with the two live replicas and another newcomer (each try kills the serving peer)."""
    # 400 steps: a try's newcomer starts in about 50 of them here and the survivors wait out its kill, so three
    # tries fit twice over (every step copies the state: 40 epochs spent a minute more after the heal)
    big = {"REPLICA_EPOCHS": "20", "REPLICA_PAD_MB": "256"}
    everyone = [job.start(f"node-{i}", **big) for i in range(2)]
    live = list(everyone)
    wait_for(lambda: all(r.records and r.records[-1]["ranks"] == 2 for r in live), 120, "2 replicas")

    def source(log: Path) -> str | None:
        for line in log.read_text(errors="replace").splitlines():
            if "healing is required" in line and "recover_src_replica_rank=" in line:
                return line.split("recover_src_replica_rank=")[1].split()[0].strip(",")
        return None

    for attempt in range(3):
        newcomer = job.start(f"node-new{attempt}", **big)
        everyone.append(newcomer)
        log = tmp_path / f"{newcomer.name}.log"
        rank = int(wait_for(lambda: source(log), 120, "the newcomer fetching the state"))
        # the rank indexes the quorum's members sorted by replica id (torchft's manager.rs), the newcomer included
        victim = sorted(live + [newcomer], key=lambda r: r.name)[rank]
        assert victim is not newcomer
        victim.proc.send_signal(signal.SIGKILL)
        live = [r for r in live if r is not victim]
        wait_for(lambda: newcomer.records and newcomer.records[-1]["ranks"] == 2
                 and newcomer.records[-1]["replica_rank"] is not None, 180, "the newcomer admitted")
        live.append(newcomer)
        if "got exception in recovery" in log.read_text(errors="replace"):
            break  # the kill landed while the state was on its way
    else:
        pytest.fail("three newcomers each had the whole state before their source was killed")
    for r in live:
        assert r.proc.wait(timeout=400) == 0, f"{r.name} failed: see its log"
    assert_same_pids(live)
    assert_exactly_once(everyone, live)
    assert live[0].final["final"] == live[1].final["final"]


@pytest.mark.torchrun  # a 0.5 s replica timeout, and a 384 MiB state copied at every step boundary (StepUndo)
def test_newcomer_whose_state_takes_longer_than_the_replica_timeout_is_admitted(job, tmp_path) -> None:
    """A 3-node job's newcomer with a 384 MiB state (more than a second to send here) and a 0.5 s replica timeout:
    the two others wait for the transfer in its first step, and it trains with them from the next. Before, their
    collective gave up after the replica timeout, they trained on without it and it was behind again: never
    admitted, each try a discarded step for everyone."""
    # 160 steps: the newcomer is admitted at about step 30 here (every step copies the state: 30 epochs spent a
    # minute more after the admission)
    big = {"REPLICA_EPOCHS": "8", "REPLICA_PAD_MB": "384", launch.ENV_REPLICA_TIMEOUT: "0.5"}
    survivors = [job.start(f"node-{i}", **big) for i in range(2)]
    wait_for(lambda: training_together(survivors), 120, "2 replicas training together")
    newcomer = job.start("node-new", **big)
    wait_for(lambda: newcomer.records and newcomer.records[-1]["ranks"] == 3
             and newcomer.records[-1]["replica_rank"] is not None, 120, "the newcomer admitted")
    # one transfer, or a few: a newcomer late for the step boundary after its heal may be behind again once
    # (before, it took the state at every quorum: 100 transfers in 120 s here, the others discarding 198 steps)
    heals = (tmp_path / "node-new.log").read_text(errors="replace").count("healing is required")
    assert 1 <= heals <= 3, f"the newcomer took the state {heals} times"
    for r in survivors + [newcomer]:
        assert r.proc.wait(timeout=240) == 0, f"{r.name} failed: see its log"
    assert_same_pids(survivors + [newcomer])
    assert_exactly_once(survivors + [newcomer], survivors)
    assert len({json.dumps(r.final["final"]) for r in survivors + [newcomer]}) == 1


def test_steps_loop_alone_in_this_process(azurite, container_url, monkeypatch, tmp_path) -> None:
    """``ckpt.steps()`` in the in-process mode, one replica without a process group (the runtime makes the store
    torchft needs): every step trained once, committed, the job finished and its final checkpoint written."""
    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.runtime import Checkpointer

    coordinator = Coordinator(tmp_path)
    monkeypatch.setenv("ELASTICTRAIN_RECOVERY", "in-process")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", coordinator.address)
    monkeypatch.setenv("ELASTICTRAIN_REPLICA_HOST", "127.0.0.1")
    monkeypatch.setenv(launch.ENV_JOB_SECRET, uuid.uuid4().hex)
    monkeypatch.setenv("ELASTICTRAIN_MEMORY_TIER", "off")
    store = BlobStore.from_url(f"{container_url}/steps-{uuid.uuid4().hex[:6]}",
                               connection_string=azurite.connection_string)
    try:
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = {"model": model, "optimizer": optimizer}
        ckpt = Checkpointer(store, watcher=None, memory_tier=False)
        seen = []
        for step in ckpt.steps(state, total=5):
            seen.append(step)
            optimizer.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
        assert seen == [1, 2, 3, 4, 5]
        assert ckpt.finished and ckpt.last_saved_step == 5
    finally:
        store.close()
        coordinator.kill()


def test_notice_on_the_last_node_saves_its_step_to_blob_before_it_goes(job, azurite, container_url) -> None:
    """No peer holds the step: the leaving node saves it durably before it acknowledges the notice."""
    from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer

    with ScheduledEventsServer() as imds:
        only = job.start("node-0", REPLICA_EPOCHS="12", ELASTICTRAIN_SCHEDULED_EVENTS_URL=imds.url,
                         ELASTICTRAIN_VM_NAME="vm-0", ELASTICTRAIN_PREEMPTION_POLL_SECONDS="0.2",
                         ELASTICTRAIN_PREEMPTION_HOLD_SECONDS="1")
        wait_for(lambda: only.last_step() >= 5, 120, "step 5")
        event = imds.post_event(["vm-0"], "Preempt", notice_seconds=30)
        assert imds.wait_acknowledged(event, timeout=60), "the node never acknowledged the notice"
        acknowledged = time.time()
        assert only.proc.wait(timeout=60) == 143
    durable = durable_steps(azurite, container_url, job.prefix)
    assert durable and durable[-1] == only.last_step(), (durable, only.last_step())
    assert all(r["time"] < acknowledged for r in only.records), "trained after acknowledging"


@pytest.mark.torchrun
def test_a_notice_on_every_node_at_once_saves_the_step_to_blob_before_they_go(job, azurite, container_url) -> None:
    """Spot capacity reclaimed from the whole job: both nodes depart together (runtime/handover.py: the second's
    notice comes while the first hands over), so no peer is left to hold the step, and the quorum's writer saves it
    to blob before they acknowledge (before the handover, each left trusting the other to hold it)."""
    from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer

    with ScheduledEventsServer() as imds:
        nodes = [job.start(f"node-{i}", REPLICA_EPOCHS="12", ELASTICTRAIN_SCHEDULED_EVENTS_URL=imds.url,
                           ELASTICTRAIN_VM_NAME=f"vm-{i}", ELASTICTRAIN_PREEMPTION_POLL_SECONDS="0.2",
                           ELASTICTRAIN_PREEMPTION_HOLD_SECONDS="1") for i in range(2)]
        wait_for(lambda: all(r.records and r.records[-1]["ranks"] == 2 and r.last_step() >= 5 for r in nodes), 120,
                 "both nodes training together")
        events = [imds.post_event([f"vm-{i}"], "Preempt", notice_seconds=30) for i in range(2)]
        for event in events:
            assert imds.wait_acknowledged(event, timeout=60), "a node never acknowledged its notice"
        for r in nodes:
            assert r.proc.wait(timeout=60) == 143
    durable = durable_steps(azurite, container_url, job.prefix)
    last = max(r.last_step() for r in nodes)
    assert durable and durable[-1] == last, (durable, [r.last_step() for r in nodes])
    logs = "".join((job.log_dir / f"{r.name}.log").read_text(errors="replace") for r in nodes)
    assert "every node leaves: the quorum's writer saves it" in logs


@pytest.mark.torchrun
def test_a_writer_that_leaves_without_a_handover_saves_its_step_to_blob(job, azurite, container_url) -> None:
    """A Scheduled Event that has started already (IMDS blanks its NotBefore) leaves no time to hand over: the node
    leaves at once, and as the quorum's writer (node-0: the first replica id) it cannot know whether the others go
    too, so it saves its step to blob first (runtime/handover.py ``saves_on_departure``). No interval save comes
    near: the step is durable only through that save."""
    from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer

    with ScheduledEventsServer() as imds:
        settings = {"REPLICA_EPOCHS": "12", "ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS": "100000",
                    "ELASTICTRAIN_PREEMPTION_POLL_SECONDS": "0.2", "ELASTICTRAIN_PREEMPTION_HOLD_SECONDS": "1"}
        writer = job.start("node-0", ELASTICTRAIN_SCHEDULED_EVENTS_URL=imds.url, ELASTICTRAIN_VM_NAME="vm-0",
                           **settings)
        other = job.start("node-1", **settings)
        wait_for(lambda: all(r.records and r.records[-1]["ranks"] == 2 and r.last_step() >= 5
                             for r in (writer, other)), 120, "both nodes training together")
        event = imds.post_event(["vm-0"], "Preempt", notice_seconds=0)
        assert imds.wait_acknowledged(event, timeout=60), "the node never acknowledged its notice"
        assert writer.proc.wait(timeout=60) == 143
    log = (job.log_dir / "node-0.log").read_text(errors="replace")
    assert "handing over" not in log and "saving it: the others may be leaving too" in log, log[-2000:]
    assert writer.last_step() in durable_steps(azurite, container_url, job.prefix)
