"""Goodput of a 2-node job under an eviction schedule, in-process, restart and plain torchrun side by side.

    .venv/bin/python scripts/bench/goodput.py [--duration 600] [--repeats 3] [--json out.json]

A real 2-node job (two torchrun agents, etcd-v2 rendezvous, Azurite, DDP on
``scripts/bench/readme_loop.py``: the README's loop, which both recovery modes
run) trains under the schedule of ``evict simulate
--schedule`` (``core.chaos``: one eviction per ``60/--rate`` s, ``--notice-share``
of them with a ``--notice-seconds`` Scheduled Events Preempt first, capacity back
``--replace-after`` s after each, one ``--seed`` for every config), several ways,
interleaved per repetition:

  in-process  ours with workers that outlive a re-form (job run --recovery
              in-process: each node a torchrun --standalone world, the job's
              coordinator started as job run --local starts it)
  ours        our runtime, tuned rendezvous, checkpoint every 25 steps,
              memory tier on (ELASTICTRAIN_MEMORY_TIER=on)
  tier-off  the same with ELASTICTRAIN_MEMORY_TIER=off (blob only)
  cold        (only with --configs) ours with workers started cold, not
              forked from the node's warm server (runtime/warm.py)
  baseline    plain torchrun: default rendezvous settings, a checkpoint once
              per epoch, no notice handling (recovery.py's baseline: a notice
              is not heeded, the node goes when it runs out)

Measured from each job's event log, as ``job show`` and ``evict simulate``
read it: goodput (core.eventlog.goodput: share of node-seconds on steps the final model
kept, the job's start included; ``goodput_running`` leaves the start out),
steps lost per eviction without notice (core.eventlog.recovery), and the outage of each
eviction with notice, without, and each scale-up (core.eventlog.goodput.outages: the
old world's last completed step to the new world's first completed step, the
figure `evict simulate --wait`, `job show` and `job timeline` report). Medians
over the repetitions. Everything runs on loopback and
is stopped at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "bench"))

from azext_elastictrain.backends.local.evict import vanish_cap  # noqa: E402
from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer  # noqa: E402
from azext_elastictrain.core import launch  # noqa: E402
from azext_elastictrain.core.blobstore import BlobStore  # noqa: E402
from azext_elastictrain.core.chaos import (  # noqa: E402
    FollowStopped, ScheduleSpec, Skipped, plan_schedule, run_schedule, sleeper)
from azext_elastictrain.core.eventlog.goodput import outages  # noqa: E402
from azext_elastictrain.core.eventlog.recovery import follow_recovery, follow_world_size, trained_again  # noqa: E402
from recovery import DEFAULT_RDZV_CONF  # noqa: E402
from harness.elastic import (  # noqa: E402
    TUNED_RDZV_CONF, Coordinator, JobConfig, Node, events_of, read_events, wait_for)
from harness.services import start_azurite, start_etcd  # noqa: E402

# The workload of every config: the README's loop (ckpt.batches), which both recovery modes run
# (a small MLP, so that the figures are the recovery's, not a model's compute).
WORKLOAD = REPO / "scripts" / "bench" / "readme_loop.py"
WORKLOAD_ARGS = ["--step-delay", "0.05"]
STEPS_PER_EPOCH = 4096 // 64  # readme_loop.py's defaults: samples // global batch
CONFIGS = {
    "ours": {"notice": True, "rdzv": TUNED_RDZV_CONF, "every": 25, "memory_tier": True, "warm": True},
    "tier-off": {"notice": True, "rdzv": TUNED_RDZV_CONF, "every": 25, "memory_tier": False, "warm": True},
    "baseline": {"notice": False, "rdzv": DEFAULT_RDZV_CONF, "every": STEPS_PER_EPOCH, "memory_tier": False,
                 "warm": False},
}
# Not run by default (--configs ours,cold,...): ours with every worker started cold, as plain torchrun starts them.
CONFIGS["cold"] = dict(CONFIGS["ours"], warm=False)
# Workers that outlive a re-form (job run --recovery in-process): each node a torchrun --standalone world, a
# coordinator per job (started as job run --local starts it); the same checkpoints, memory tier and notice.
CONFIGS["in-process"] = dict(CONFIGS["ours"], recovery=launch.RECOVERY_IN_PROCESS)
DEFAULT_CONFIGS = ("in-process", "ours", "tier-off", "baseline")
# The ratio of every figure is to this config's in the same run: today's restart mode.
REFERENCE = "ours"
FULL_SIZE = 2


class BenchEvictor:
    """``core.chaos.ScheduleEvictor`` over ``harness.elastic`` nodes: the local cluster's eviction (a
    Preempt on the Scheduled Events endpoint, then every process of the node killed once the runtime
    acknowledged or the notice ran out; without notice the node vanishes, backends/local/evict.py) and its
    capacity coming back as a new node."""

    def __init__(self, job: JobConfig, imds: ScheduledEventsServer, events, logs: Path,
                 full_size: int = FULL_SIZE) -> None:
        self.job, self.imds, self._events, self.logs, self.full_size = job, imds, events, logs, full_size
        self.nodes: list[Node] = []
        self._lock = threading.Lock()

    def start(self, count: int) -> list[Node]:
        with self._lock:
            started = [Node(self.job, f"{self.job.name}-n{len(self.nodes) + i}", self.logs) for i in range(count)]
            self.nodes.extend(started)
        return started

    def evict(self, item) -> dict:
        running = {n.name: n for n in self.nodes if n.alive()}
        if len(running) <= self.job.min_nodes:
            raise Skipped(f"{len(running)} node(s) running, the job's minimum")
        node = running[item.choose(list(running))]
        started, acked = time.time(), None
        event_id = None
        if item.notice_seconds:
            event_id = self.imds.post_event([node.name], "Preempt", notice_seconds=item.notice_seconds)
            if self.imds.wait_acknowledged(event_id, timeout=item.notice_seconds):
                acked = round(time.time() - started, 2)
        if item.notice_seconds:
            node.kill()
            evicted = time.time()
        else:  # vanished, as evict simulate --local does it: frozen until the survivors trained again
            evicted = node.vanish(vanish_cap(), until=lambda frozen_at: trained_again(self._events(), frozen_at))
        if event_id is not None:
            self.imds.remove_event(event_id)
        return {"node": node.name, "startedAt": started, "evictedAt": evicted, "acknowledgedAfterSeconds": acked}

    def recovery(self, eviction: dict, stop) -> dict:
        return follow_recovery(lambda _job: self._events(), self.job.name, eviction, sleep=sleeper(stop))

    def capacity_back(self, item, eviction: dict, stop) -> dict:
        stop.wait(max(0.0, eviction["evictedAt"] + item.replace_after - time.time()))
        since = time.time()
        [node] = self.start(1)
        back = {"replacements": [{"node": node.name}]}
        try:
            back["fullSize"] = follow_world_size(lambda _job: self._events(), self.job.name, self.full_size, since,
                                                 sleep=sleeper(stop))
        except FollowStopped:
            back["stopped"] = True
        return back

    def events(self) -> list[dict]:
        return self._events()

    def stop_all(self) -> None:
        for node in self.nodes:
            node.stop()


def outage_seconds(events: list[dict], kind: str) -> list[float]:
    """The outages of one kind of re-form (core.eventlog.goodput.outages: last step of the old world to first step of
    the new one), the figure `evict simulate --wait`, `job show` and `job timeline` report."""
    return [o["outageSeconds"] for o in outages(events) if o["kind"] == kind and o["outageSeconds"] is not None]


def bench_job(name: str, cfg: dict, blob, etcd, imds: ScheduledEventsServer, script_args: list[str],
              coordinator: Coordinator | None, max_nodes: int = FULL_SIZE) -> JobConfig:
    """A job of one config; an in-process config's nodes ask ``coordinator``."""
    return JobConfig(
        name=name, checkpoint_url=f"{blob.blob_endpoint}/bench/{name}", connection_string=blob.connection_string,
        etcd_endpoint=etcd.endpoint, scheduled_events_url=imds.url if cfg["notice"] else "off",
        rdzv_conf=cfg["rdzv"], max_nodes=max_nodes, progress_seconds=0.2, memory_tier=cfg["memory_tier"],
        extra_env={launch.ENV_CHECKPOINT_INTERVAL_STEPS: str(cfg["every"]), **cfg.get("env", {})},
        warm_start=cfg["warm"], recovery=cfg.get("recovery", launch.RECOVERY_RESTART), script=WORKLOAD,
        coordinator=coordinator.address if coordinator else None,
        script_args=script_args,
    )


def start_coordinator(cfg: dict, logs: Path, name: str,
                      heartbeat_timeout_ms: int = launch.LOCAL.coordinator_heartbeat_timeout_ms) -> Coordinator | None:
    """An in-process config's coordinator, as ``job run --local`` starts one (min nodes 1, the job's; another
    heartbeat timeout than the product's only where a benchmark compares them)."""
    if cfg.get("recovery") != launch.RECOVERY_IN_PROCESS:
        return None
    return Coordinator(logs / "coordinator", min_nodes=1, job=name, heartbeat_timeout_ms=heartbeat_timeout_ms)


def run_config(config: str, spec: ScheduleSpec, blob, etcd, imds: ScheduledEventsServer, logs: Path) -> dict:
    cfg = CONFIGS[config]
    name = f"gp-{config}-{uuid.uuid4().hex[:6]}"
    coordinator = start_coordinator(cfg, logs / name, name)
    job = bench_job(name, cfg, blob, etcd, imds, WORKLOAD_ARGS, coordinator)
    store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
    evictor = BenchEvictor(job, imds, lambda: read_events(store, store.prefix), logs / name)
    try:
        evictor.start(FULL_SIZE)
        wait_for(lambda: [e for e in events_of(evictor.events(), "progress") if e.get("world_size") == FULL_SIZE],
                 300, f"{config}: training at world size {FULL_SIZE}")
        lines: list[str] = []
        result = run_schedule(plan_schedule(spec), evictor, say=lines.append)
        events = evictor.events()
    finally:
        evictor.stop_all()
        if coordinator is not None:
            coordinator.stop()
        store.close()
    found = result["goodput"] or {}
    lost = found.get("lostRankSeconds") or {}
    total = found.get("usefulRankSeconds", 0) + sum(lost.values())
    running = total - lost.get("starting", 0)
    done = [e for e in result["evictions"] if "node" in e]
    return {
        "config": config, "job": name,
        "goodput": found.get("goodput"),
        "goodput_running": round(found["usefulRankSeconds"] / running, 4) if found and running > 0 else None,
        "lost_rank_seconds": lost, "steps_retrained": found.get("stepsLost"),
        "no_notice_steps_lost": [e["recovery"].get("stepsLost") for e in done
                                 if not e["noticeSeconds"] and "outageSeconds" in (e.get("recovery") or {})],
        "notice_steps_lost": [o["stepsLost"] for o in outages(events) if o["kind"] == "evictionWithNotice"],
        "notice_outage_s": outage_seconds(events, "evictionWithNotice"),
        "no_notice_outage_s": outage_seconds(events, "eviction"),
        "scale_up_outage_s": outage_seconds(events, "scaleUp"),
        "evictions": len(done), "skipped": len(result["evictions"]) - len(done),
        "not_measured": [e.get("recovery") for e in done if "outageSeconds" not in (e.get("recovery") or {})],
        "lines": lines,
    }


def _median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def _ratio(value, reference):
    return round(value / reference, 2) if value is not None and reference else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of the schedule per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0, help="evictions per minute")
    parser.add_argument("--notice-share", type=float, default=0.5)
    parser.add_argument("--notice-seconds", type=float, default=30.0)
    parser.add_argument("--replace-after", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="which of " + ", ".join(CONFIGS))
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--logs", help="keep every node's and coordinator's logs here (default: removed at the end)")
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    spec = ScheduleSpec(rate=args.rate, duration=args.duration, notice_share=args.notice_share,
                        notice_seconds=args.notice_seconds, replace_after=args.replace_after, seed=args.seed)
    schedule = plan_schedule(spec)
    print(f"schedule (seed {args.seed}): " + ", ".join(
        f"+{e.at:g}s {'notice ' + format(e.notice_seconds, 'g') + 's' if e.notice_seconds else 'no notice'}"
        for e in schedule.evictions) + f"; capacity back {args.replace_after:g}s after each", flush=True)
    samples: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="elastictrain-goodput-") as tmp:
        work = Path(tmp)
        logs = Path(args.logs) if args.logs else work / "logs"
        with start_azurite(work / "azurite") as blob, start_etcd(work / "etcd") as etcd, \
                ScheduledEventsServer() as imds:
            blob.blob_service_client().create_container("bench")
            for rep in range(args.repeats):
                order = configs[rep % len(configs):] + configs[:rep % len(configs)]  # rotate: spread drift
                for config in order:
                    started = time.time()
                    sample = run_config(config, spec, blob, etcd, imds, logs)
                    sample["rep"] = rep + 1
                    samples.append(sample)
                    print(f"  rep {rep + 1} {config:10s} goodput {sample['goodput']}  running "
                          f"{sample['goodput_running']}  no-notice lost {sample['no_notice_steps_lost']}  notice "
                          f"lost {sample['notice_steps_lost']}  "
                          f"outages: notice {sample['notice_outage_s']}  without {sample['no_notice_outage_s']}  "
                          f"scale-up {sample['scale_up_outage_s']}"
                          f"  ({time.time() - started:.0f}s)", flush=True)
                    for line in sample["lines"]:
                        print(f"      {line}", flush=True)
    print(f"\n{'config':10s} {'n':>2s} {'goodput':>8s} {'running':>8s} {'no-notice lost':>15s} "
          f"{'notice lost':>11s} {'notice out s':>12s} {'no-notice out s':>15s} {'scale-up out s':>14s}")
    medians = {}
    for config in configs:
        rows = [s for s in samples if s["config"] == config]
        medians[config] = {
            "goodput": _median(r["goodput"] for r in rows),
            "goodput_running": _median(r["goodput_running"] for r in rows),
            "no_notice_steps_lost": _median(x for r in rows for x in r["no_notice_steps_lost"]),
            "notice_steps_lost": _median(x for r in rows for x in r["notice_steps_lost"]),
            "notice_outage_s": _median(x for r in rows for x in r["notice_outage_s"]),
            "no_notice_outage_s": _median(x for r in rows for x in r["no_notice_outage_s"]),
            "scale_up_outage_s": _median(x for r in rows for x in r["scale_up_outage_s"]),
        }
        m = medians[config]
        print(f"{config:10s} {len(rows):2d} {m['goodput']!s:>8s} {m['goodput_running']!s:>8s} "
              f"{m['no_notice_steps_lost']!s:>15s} {m['notice_steps_lost']!s:>11s} {m['notice_outage_s']!s:>12s} "
              f"{m['no_notice_outage_s']!s:>15s} {m['scale_up_outage_s']!s:>14s}")
    if REFERENCE in medians:
        ref = medians[REFERENCE]
        print(f"\nratio to {REFERENCE} (today's restart mode) of the same run:")
        for config in configs:
            if config != REFERENCE:
                print(f"{config:10s}    " + " ".join(f"{_ratio(medians[config][k], ref[k])!s:>{w}s}" for k, w in (
                    ("goodput", 8), ("goodput_running", 8), ("no_notice_steps_lost", 15), ("notice_steps_lost", 11),
                    ("notice_outage_s", 12),
                    ("no_notice_outage_s", 15), ("scale_up_outage_s", 14))))
    print("\ngoals for in-process (issue 22): goodput >= 0.95; notice outage <= 1.0 s and 0 steps lost; no-notice "
          "(vanish) <= 3 s and <= 1 lost; survivors' scale-up outage <= 0.5 s (outage: last step before to first "
          "step after)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "schedule": schedule.to_dict(),
                                               "samples": samples, "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
