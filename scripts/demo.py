"""The runtime demo: a real 2-node elastic job survives Spot evictions on this machine.

    bash scripts/demo.sh            # sets everything up, then runs this

What happens, all real and on loopback: Azurite (blob storage), etcd (the
rendezvous), a local Azure Scheduled Events endpoint, and two ``torchrun``
agents ("nodes") training ``scripts/train_cifar10.py`` with DDP. Then:

1. node-b gets a Spot ``Preempt`` notice: every rank checkpoints the step the
   notice arrived at, node-b acknowledges, and is killed (evicted);
2. node-a goes on alone from that step (world size 2 -> 1);
3. node-b comes back (Spot capacity returns; world size 1 -> 2);
4. node-a is killed without notice; node-b resumes from the last checkpoint;
5. node-a comes back and the job finishes.

It prints a summary (steps, loss, each recovery in seconds, steps lost), the
checkpoint catalog through the real ``az elastictrain checkpoint list``, and
writes a timeline picture.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from azext_elastictrain.core import catalog  # noqa: E402
from azext_elastictrain.core.blobstore import BlobStore  # noqa: E402
from azext_elastictrain.core.scheduled_events import ScheduledEventsServer  # noqa: E402
from tests.support.elastic import JobConfig, Node, events_of, read_events, wait_for  # noqa: E402
from tests.support.services import start_azurite, start_etcd  # noqa: E402


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Demo:
    def __init__(self, job: JobConfig, store: BlobStore, imds: ScheduledEventsServer, logs: Path):
        self.job, self.store, self.imds, self.logs = job, store, imds, logs
        self.nodes: dict[str, Node] = {}
        self.evictions: list[dict] = []
        self.joins: list[tuple[str, float]] = []

    def events(self) -> list[dict]:
        return read_events(self.store, self.store.prefix)

    def start(self, name: str) -> None:
        self.nodes[name] = Node(self.job, name, self.logs)
        self.joins.append((name, time.time()))

    def world(self) -> int | None:
        sizes = [e["world_size"] for e in self.events() if e.get("event") == "progress"]
        return sizes[-1] if sizes else None

    def wait_world(self, size: int, timeout: float = 180) -> None:
        wait_for(lambda: self.world() == size, timeout, f"world size {size}")

    def evict(self, name: str, notice: bool) -> None:
        seen = len(self.events())
        evicted_at = time.time()
        if notice:
            event_id = self.imds.post_event([name], "Preempt", notice_seconds=30)
            say(f"Spot eviction notice (Preempt, 30 s) for {name}")
            if not self.imds.wait_acknowledged(event_id, timeout=60):
                raise SystemExit(f"{name} never acknowledged the eviction notice")
            say(f"{name} checkpointed and acknowledged after {time.time() - evicted_at:.1f}s; evicting it")
        else:
            say(f"{name} evicted without notice")
        self.nodes.pop(name).kill()
        killed_at = time.time()
        if notice:
            self.imds.remove_event(event_id)  # the VM is gone, and its events with it
        restored = wait_for(
            lambda: [e for e in self.events()[seen:] if e.get("event") == "restored" and e.get("step") is not None],
            timeout=180, what="the job to restore",
        )[0]
        resumed = wait_for(
            lambda: [e for e in self.events()[seen:] if e.get("event") == "progress"
                     and e.get("world_size") == restored["world_size"] and e["time"] > restored["time"]],
            timeout=120, what="training to resume",
        )[0]
        before = [e["step"] for e in self.events()[:seen] if e.get("event") == "progress"]
        preempted = [e["step"] for e in self.events()[seen:] if e.get("event") == "preempted"]
        reached = max(before + preempted) if before or preempted else 0
        record = {
            "node": name, "notice": notice, "time": killed_at,
            "resumed_from": restored["step"], "reached": reached,
            "steps_lost": max(0, (preempted[0] if preempted else reached) - restored["step"]),
            "recovery_s": round(restored["time"] - killed_at, 1),
            "first_step_s": round(resumed["time"] - killed_at, 1),
        }
        self.evictions.append(record)
        say(f"recovered from step {record['resumed_from']} at world size {restored['world_size']}: "
            f"{record['recovery_s']}s to restore, {record['steps_lost']} step(s) lost")

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


def summary(events: list[dict], evictions: list[dict]) -> str:
    progress = [e for e in events if e.get("event") == "progress" and "metrics" in e]
    first, last = progress[0], progress[-1]
    checkpoints = events_of(events, "checkpoint")
    lines = [
        "",
        "Summary",
        f"  steps trained      {events_of(events, 'finished')[-1]['step']}",
        f"  loss               {first['metrics']['loss']:.3f} (step {first['step']}) -> "
        f"{last['metrics']['loss']:.3f} (step {last['step']})",
        f"  checkpoints        {len(checkpoints)} committed, median upload "
        f"{sorted(c['seconds'] for c in checkpoints)[len(checkpoints) // 2]:.2f}s, "
        f"median training stall {1000 * sorted(c['stall_seconds'] for c in checkpoints)[len(checkpoints) // 2]:.0f} ms",
    ]
    for i, ev in enumerate(evictions, 1):
        kind = "with notice   " if ev["notice"] else "without notice"
        lines.append(f"  eviction {i} {kind} {ev['node']}: resumed from step {ev['resumed_from']} "
                     f"in {ev['recovery_s']}s, {ev['steps_lost']} step(s) lost")
    return "\n".join(lines)


def _segments(points: list[tuple[float, int]], gap: float) -> list[list[tuple[float, int]]]:
    """Split a series where reports stop for longer than ``gap`` (the job was down)."""
    segments: list[list[tuple[float, int]]] = []
    for point in points:
        if not segments or point[0] - segments[-1][-1][0] > gap:
            segments.append([])
        segments[-1].append(point)
    return segments


def timeline(events: list[dict], evictions: list[dict], joins: list[tuple[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = events[0]["time"]
    progress = [e for e in events if e.get("event") == "progress"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True, height_ratios=[3, 1])
    for i, seg in enumerate(_segments([(e["time"] - t0, e["step"]) for e in progress], gap=3.0)):
        ax.plot([t for t, _ in seg], [s for _, s in seg], ".-", color="tab:blue", label="step" if i == 0 else None)
    checkpoints = events_of(events, "checkpoint")
    ax.plot([c["time"] - t0 for c in checkpoints], [c["step"] for c in checkpoints], "|", color="tab:green",
            markersize=12, mew=2, label="checkpoint committed")
    top = max(e["step"] for e in progress)
    for ev in evictions:
        ax.axvline(ev["time"] - t0, color="tab:red", lw=2)
        ax.annotate(f" {ev['node']} evicted\n {'with notice' if ev['notice'] else 'no notice'}\n"
                    f" {ev['steps_lost']} step(s) lost", (ev["time"] - t0, top * 0.72), color="tab:red", fontsize=8)
    for name, when in joins[2:]:
        ax.axvline(when - t0, color="tab:gray", lw=1, ls="--")
        ax.annotate(f" {name} back", (when - t0, top * 0.05), color="tab:gray", fontsize=8)
    ax.set_ylabel("step")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Elastic training through Spot evictions")
    ax2.step([e["time"] - t0 for e in progress], [e["world_size"] for e in progress], where="post", color="tab:purple")
    ax2.set_ylabel("world size")
    ax2.set_yticks([0, 1, 2])
    ax2.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the elastic training demo on this machine.")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", default="out", help="folder for the timeline picture and logs")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="elastictrain-demo-"))
    try:
        with start_azurite(work / "azurite") as blob, start_etcd(work / "etcd") as etcd, ScheduledEventsServer() as imds:
            say(f"Azurite on {blob.blob_endpoint}, etcd on {etcd.endpoint}, Scheduled Events on {imds.url}")
            blob.blob_service_client().create_container("checkpoints")
            name = f"cifar-{uuid.uuid4().hex[:6]}"
            job = JobConfig(
                name=name, checkpoint_url=f"{blob.blob_endpoint}/checkpoints/{name}",
                connection_string=blob.connection_string, etcd_endpoint=etcd.endpoint,
                scheduled_events_url=imds.url,
                script_args=["--steps", str(args.steps), "--checkpoint-every", "40", "--step-delay", "0.05",
                             "--log-every", "50"],
            )
            store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
            demo = Demo(job, store, imds, out / "logs")
            try:
                say(f"job {name}: 2 nodes, {args.steps} steps, checkpoint every 40 steps")
                demo.start("node-a")
                demo.start("node-b")
                demo.wait_world(2)
                time.sleep(4)
                demo.evict("node-b", notice=True)
                time.sleep(3)
                say("Spot capacity is back: node-b rejoins")
                demo.start("node-b")
                demo.wait_world(2)
                time.sleep(6)
                demo.evict("node-a", notice=False)
                time.sleep(3)
                say("node-a rejoins")
                demo.start("node-a")
                wait_for(lambda: events_of(demo.events(), "finished"), 600, "the job to finish")
                events = demo.events()
            finally:
                demo.stop()
            print(summary(events, demo.evictions))
            picture = out / "timeline.png"
            timeline(events, demo.evictions, demo.joins, picture)
            print(f"  timeline           {picture}")
            (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
            print("\nCheckpoints, through the real az CLI:", flush=True)
            subprocess.run(["az", "elastictrain", "checkpoint", "list", "--url", job.checkpoint_url, "-o", "table"],
                           env={**os.environ, "AZURE_STORAGE_CONNECTION_STRING": blob.connection_string,
                                "AZURE_CONFIG_DIR": str(work / "azure")}, check=True)
            complete = [c for c in catalog.list_checkpoints(store, store.prefix) if c.complete]
            store.close()
            return 0 if complete else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
