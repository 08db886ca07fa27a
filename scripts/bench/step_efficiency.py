"""torchft's step efficiency (committed steps / steps tried) under nodes that vanish mid-step: the step in flight
discarded (the default, torchft's behaviour) against salvaged (``ELASTICTRAIN_SALVAGE=on``, runtime/salvage.py),
side by side in one run.

    .venv/bin/python scripts/bench/step_efficiency.py [--nodes 4] [--every 5.5] [--failures 15] [--step-seconds 2] \
        [--repeats 1]

torchft's published figure: one failure per 5.5 steps gave a step efficiency of 0.82, one per 1.4 steps 0.30 (the
step in flight is discarded at every failure). Here each mode runs a job of ``--nodes`` replicas of the tests' loop
(harness/replica_worker.py, steps padded to ``--step-seconds`` of compute before the backward's collective, a
coordinator of its own as runtime/coordinator.py with a local job's settings, AKS's 30 s replica timeout, Azurite
for blob). Once every node trains, a node other than the first is frozen (SIGSTOP: a Spot VM that vanished, its
sockets open) at a random moment every ``--every`` steps' worth of time, killed ``--kill-after`` seconds later, and
a new node started in its place (it joins and heals from a peer). The first node is never failed: its records are
the job's steps, tried and committed (a discarded step is tried again). Per mode: the failures made, the steps
tried and committed in the failure phase, their ratio, and the time per committed step; their medians over the
repeats. JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "bench"))

from azext_elastictrain.core import launch  # noqa: E402
from coordinator_loss import Node, in_azurite, replica_env  # noqa: E402
from harness.restartable_coordinator import RestartableCoordinator  # noqa: E402

MODES = {"discard": "off", "salvage": "on"}


def run(mode: str, args: argparse.Namespace, seed: int, azurite, container: str, logs: Path) -> dict:
    logs.mkdir(parents=True)
    coordinator = RestartableCoordinator(logs)
    env = replica_env(coordinator, azurite, f"{azurite.blob_endpoint}/{container}/{mode}-{uuid.uuid4().hex[:6]}",
                      args.step_seconds, **{launch.ENV_REPLICA_TIMEOUT: f"{launch.AKS.replica_timeout_seconds:g}",
                                            launch.ENV_SALVAGE: MODES[mode]})
    rng = random.Random(seed)
    nodes = [Node(f"node-{i}", env, logs) for i in range(args.nodes)]
    observer = nodes[0]
    made = 0
    try:
        deadline = time.monotonic() + 300
        while min(len(n.committed) for n in nodes) < 3:  # every node trains
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: the nodes never trained together; see {logs}")
            time.sleep(0.2)
        committed, discarded, started = len(observer.committed), observer.discarded, time.time()
        period = args.every * args.step_seconds
        for n in range(args.failures):
            time.sleep(max(0.0, started + (n + rng.random()) * period - time.time()))  # a random moment of each period
            live = [node for node in nodes[1:] if node.proc.poll() is None and len(node.committed) >= 1]
            if not live:
                continue
            victim = rng.choice(live)
            victim.proc.send_signal(signal.SIGSTOP)
            made += 1
            time.sleep(args.kill_after)
            victim.stop()
            nodes.append(Node(f"node-{len(nodes)}", env, logs))
        time.sleep(max(0.0, started + args.failures * period - time.time()))
        window = time.time() - started
        done = len(observer.committed) - committed
        tried = done + observer.discarded - discarded
    finally:
        for node in nodes:
            if node.proc.poll() is None:
                node.stop()
        coordinator.kill()
    return {"mode": mode, "failures": made, "tried": tried, "committed": done,
            "step_efficiency": round(done / tried, 3) if tried else None,
            "seconds_per_committed_step": round(window / done, 3) if done else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--every", type=float, default=5.5, help="steps' worth of time between two failures")
    parser.add_argument("--failures", type=int, default=15)
    parser.add_argument("--step-seconds", type=float, default=2.0, help="each step's compute (torchft's padding)")
    parser.add_argument("--kill-after", type=float, default=3.0, help="seconds a frozen node stays before its kill")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode (the failures' moments and "
                        "victims are the same for both modes of a repeat)")
    parser.add_argument("--logs", type=Path, help="keep the nodes' and coordinator's logs here (default: dropped)")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")

    def each(azurite, container: str, folder: Path) -> list[dict]:
        results = []
        for repeat in range(args.repeats):  # interleaved, rotated: the machine's load falls on both alike
            for mode in modes[repeat % len(modes):] + modes[:repeat % len(modes)]:
                results.append(run(mode, args, repeat, azurite, container, folder / f"{mode}-{repeat}"))
        return results

    results = in_azurite(args.logs, "step-efficiency-", each)
    medians = {mode: {key: statistics.median(r[key] for r in results if r["mode"] == mode and r[key] is not None)
                      for key in ("step_efficiency", "seconds_per_committed_step")} for mode in modes}
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "nodes": args.nodes, "every_steps": args.every,
                      "step_seconds": args.step_seconds, "medians": medians, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
