"""Training lost per coordinator loss in the in-process mode: the nodes training on with their last quorum while
the coordinator is gone (the default) against waiting for it at every step (``ELASTICTRAIN_COORDINATOR_COAST=off``,
torchft's own behaviour), side by side in one run.

    .venv/bin/python scripts/bench/coordinator_loss.py [--nodes 2] [--kills 5] [--down 3] [--modes coast,wait] [--aks]
    .venv/bin/python scripts/bench/coordinator_loss.py --every 60 --modes undisturbed,coast --aks   # goodput

Each mode runs a job of ``--nodes`` replicas of the tests' loop (harness/replica_worker.py, ``--step-seconds``
of compute a step, 0.5 s by default, a coordinator of its own as runtime/coordinator.py with a local job's
settings, Azurite for blob). Once every node trains, the coordinator is killed ``--kills`` times, each time down
``--down`` seconds, then started again on the same address, 10 s apart. Per kill, from the nodes' own records:
the training lost, i.e. the window from the kill to 10 s after the restart minus the committed steps in it at the
undisturbed step time (the median interval of the 5 s before the kill), and the steps discarded in it. Medians
per mode, JSON on stdout. With ``--every`` the kills come that many seconds apart, and the ``undisturbed`` mode
runs the same job and schedule without a kill: each mode's committed steps per second over the schedule, against
that one's, is its goodput.

A kill that lands while the nodes' quorum request is in flight cannot be trained through: torchft's manager
retries that request until the coordinator answers (a failed request leaves it unusable), so such a kill costs
the down time. The request's share of a step is what the nodes' skew at the step boundary makes it: large for a
0.05 s step (most kills land in it), small for a step of a second.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from azext_elastictrain.core import launch  # noqa: E402
from harness import replica_worker  # noqa: E402
from harness.restartable_coordinator import RestartableCoordinator  # noqa: E402
from harness.services import start_azurite  # noqa: E402

SETTLE = 10.0  # seconds after the restart that count in a kill's window
UNDISTURBED = "undisturbed"  # a mode: the same job and schedule, the coordinator never killed


class Node:
    """A replica process and its committed steps' times, read from its JSON lines as they come."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        self.committed: list[tuple[int, float]] = []  # (step, time of its record)
        self.discarded = 0
        self._last: dict = {}
        self._log = open(logs / f"{name}.log", "ab")  # pylint: disable=consider-using-with
        self.proc = replica_worker.start(name, env, self._log)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for record in replica_worker.records(self.proc.stdout):
            if "verdict" in record:
                if record["committed"] and self._last.get("step") == record["verdict"]:
                    self.committed.append((self._last["step"], self._last["time"]))
                elif not record["committed"]:
                    self.discarded += 1
            elif "step" in record:
                self._last = record

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._log.close()


def replica_env(coordinator: RestartableCoordinator, azurite, url: str, step_seconds: float,
                **settings: str) -> dict[str, str]:
    """The environment of a node of the tests' loop in an in-process job of ``coordinator`` checkpointing to
    ``url`` (a container of ``azurite``), a local job's settings but for ``settings``; endless, no interval save."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ELASTICTRAIN_")},
            "ELASTICTRAIN_RECOVERY": "in-process", "TORCHFT_LIGHTHOUSE": coordinator.address,
            "ELASTICTRAIN_REPLICA_HOST": "127.0.0.1", "ELASTICTRAIN_SCHEDULED_EVENTS_URL": "off",
            launch.ENV_JOB_SECRET: uuid.uuid4().hex, "ELASTICTRAIN_MEMORY_TIER": "off",
            "ELASTICTRAIN_WARM_START": "off", launch.ENV_REPLICA_TIMEOUT: f"{launch.LOCAL.replica_timeout_seconds:g}",
            "ELASTICTRAIN_CHECKPOINT_URL": url, "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string,
            "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "REPLICA_EPOCHS": "1000", "REPLICA_SAMPLES": "240",
            "ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS": "100000", "REPLICA_STEP_SECONDS": f"{step_seconds:g}",
            **settings}


def in_azurite(logs: Path | None, prefix: str, each: Callable[[Any, str, Path], list[dict]]) -> list[dict]:
    """``each(azurite, container, folder)``'s results, with an Azurite of its own (and its container) in ``logs`` or
    a temporary folder, stopped after."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp) if logs is None else logs
        with start_azurite(folder / "azurite") as azurite:
            container = "bench"
            azurite.blob_service_client().create_container(container)
            return each(azurite, container, folder)


def run(mode: str, args: argparse.Namespace, azurite, container: str, logs: Path) -> dict:
    logs.mkdir(parents=True)
    coordinator = RestartableCoordinator(logs, profile=launch.AKS if args.aks else launch.LOCAL)
    aks = {launch.ENV_REPLICA_TIMEOUT: f"{launch.AKS.replica_timeout_seconds:g}",
           launch.ENV_REPLICA_HEARTBEAT_TIMEOUT: f"{launch.AKS.coordinator_heartbeat_timeout_ms / 1000:g}"}
    env = replica_env(coordinator, azurite, f"{azurite.blob_endpoint}/{container}/{mode}-{uuid.uuid4().hex[:6]}",
                      args.step_seconds, ELASTICTRAIN_COORDINATOR_COAST="on" if mode == "coast" else "off",
                      **(aks if args.aks else {}))
    nodes = [Node(f"node-{i}", env, logs) for i in range(args.nodes)]
    kills = []
    try:
        deadline = time.monotonic() + 180
        while min(len(n.committed) for n in nodes) < 20:  # every node trains (and some warm-up)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: the nodes never trained together; see {logs}")
            time.sleep(0.2)
        began = time.time()
        for _ in range(args.kills):
            time.sleep(max(5.0, args.every - args.down - SETTLE))
            node = nodes[0]
            before = [t for _, t in node.committed if t > time.time() - 5]
            interval = statistics.median(b - a for a, b in zip(before, before[1:]))
            discarded = node.discarded
            killed = time.time()
            if mode != UNDISTURBED:
                coordinator.kill()
            time.sleep(args.down)
            if mode != UNDISTURBED:
                coordinator.start()
            time.sleep(SETTLE)
            window = time.time() - killed
            steps = sum(1 for _, t in node.committed if killed <= t)
            kills.append({"lost_s": round(window - steps * interval, 3), "step_s": round(interval, 4),
                          "discarded": node.discarded - discarded})
        span = time.time() - began
        committed = sum(1 for _, t in nodes[0].committed if began <= t)
    finally:
        for node in nodes:
            node.stop()
        coordinator.kill()
    return {"mode": mode, "kills": kills, "median_lost_s": statistics.median(k["lost_s"] for k in kills),
            "median_discarded": statistics.median(k["discarded"] for k in kills),
            "span_s": round(span, 1), "committed": committed, "steps_per_s": round(committed / span, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--down", type=float, default=3.0, help="seconds the coordinator stays down each time")
    parser.add_argument("--step-seconds", type=float, default=0.5,
                        help="each step's compute (the quorum request's share of a step shrinks as it grows)")
    parser.add_argument("--modes", default="coast,wait",
                        help=f"of coast, wait and {UNDISTURBED} (the same schedule without a kill: the goodput's base)")
    parser.add_argument("--every", type=float, default=0.0,
                        help="seconds from one kill to the next (at least down + 15 s; default: that least)")
    parser.add_argument("--aks", action="store_true",
                        help="AKS's timeouts (the coordinator's, the replica timeout of 30 s, the watch's) for the "
                             "local job's")
    parser.add_argument("--logs", type=Path, help="keep the nodes' and coordinator's logs here (default: dropped)")
    args = parser.parse_args(argv)
    results = in_azurite(args.logs, "coordinator-loss-", lambda azurite, container, folder: [
        run(mode, args, azurite, container, folder / mode) for mode in args.modes.split(",")])
    base = next((r["steps_per_s"] for r in results if r["mode"] == UNDISTURBED), None)
    for result in results:  # committed steps per second against the undisturbed job's, over the same schedule
        result["goodput_vs_undisturbed"] = round(result["steps_per_s"] / base, 4) if base else None
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "nodes": args.nodes, "down_s": args.down, "aks": args.aks,
                      "every_s": args.every, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
