"""Coordination at scale: how long a membership change takes to reach every node, for 64, 128 and 256 nodes, on
loopback, with the product's coordinator and light simulated nodes (no torch in the nodes, no training).

    .venv/bin/python scripts/bench/coordination_scale.py [--nodes 64,128,256] [--events 15] [--step-seconds 0.5]
                                                         [--heartbeat-timeout-ms 1000] [--processes 4]

The coordinator is the product's (``python -m azext_elastictrain.runtime.coordinator``, torchft's Lighthouse) with
a job's settings (core/launch.py: join timeout, quorum tick; the heartbeat timeout AKS's by default). Each node is
a thread of one of ``--processes`` client processes: it asks the coordinator for a quorum at every step boundary,
as torchft's Manager does (``torchft.coordination.LighthouseClient.quorum``), "trains" until the next multiple of
``--step-seconds`` (a step's collective ends together on every member, so their next requests come together), and
is heard every 100 ms (``heartbeat``, as the Manager beats). Once every node trains, ``--events`` times each, one
at a time and ``--gap`` seconds apart: a node vanishes (its thread and its beats stop) and a newcomer joins.

Per event, from the nodes' own records (every process on this machine reads the same monotonic clock):
- ``settle``: from the event to the moment the last node of the new membership holds a quorum with exactly that
  membership (a vanish: its beats stop; a join: the newcomer's first request). A vanish's includes the heartbeat
  timeout (the coordinator's only way to learn of a node gone without a word); a join's, up to one step (the
  others ask at their next step boundary).
- ``round``: the coordinator's own part of that change: from the last request of the round that carries it to
  the last node's answer. Steady rounds (no change) are measured the same way, for comparison.
Medians and p95 per node count, JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from azext_elastictrain.core import launch  # noqa: E402

BEAT_SECONDS = 0.1  # torchft's Manager beats every 100 ms


# -- a client process: nodes as threads -------------------------------------------------------------------------
class Nodes:
    """This process's simulated nodes: each asks for a quorum at every step boundary and is heard every 100 ms."""

    def __init__(self, address: str, step_seconds: float) -> None:
        from torchft.coordination import LighthouseClient

        self._client = lambda: LighthouseClient(address, connect_timeout=timedelta(seconds=30))
        self.step_seconds = step_seconds
        self.alive: dict[str, threading.Event] = {}
        self.records: list[tuple[str, float, float, int, str]] = []  # node, asked, answered, members, key
        self._lock = threading.Lock()
        self._beats = self._client()
        threading.Thread(target=self._beat, daemon=True).start()

    def start(self, node: str) -> None:
        stop = threading.Event()
        self.alive[node] = stop
        threading.Thread(target=self._run, args=(node, stop), daemon=True).start()

    def vanish(self, node: str) -> None:
        self.alive.pop(node).set()

    def _beat(self) -> None:
        while True:
            for node in list(self.alive):
                try:
                    self._beats.heartbeat(node)
                except Exception:  # pylint: disable=broad-exception-caught  # a late beat, not this bench's concern
                    pass
            time.sleep(BEAT_SECONDS)

    def _run(self, node: str, stop: threading.Event) -> None:
        client = self._client()
        step = 0
        while not stop.is_set():
            asked = time.monotonic()
            try:
                quorum = client.quorum(node, timedelta(seconds=60), step=step)
            except Exception as ex:  # pylint: disable=broad-exception-caught
                print(f"{node}: no quorum: {ex}", file=sys.stderr, flush=True)
                continue
            answered = time.monotonic()
            members = sorted(p.replica_id for p in quorum.participants)
            with self._lock:
                self.records.append((node, asked, answered, len(members), "|".join(members)))
            step += 1
            # the step's collective ends at about the same moment on every member, so their next requests come
            # together: each node's step ends at the next multiple of the step time (one clock on this machine)
            stop.wait(self.step_seconds - time.monotonic() % self.step_seconds)


def client_main(address: str, step_seconds: float) -> None:
    """A client process: commands on stdin ("start NODE", "ready", "vanish NODE", "dump PATH"), one per line."""
    nodes = Nodes(address, step_seconds)
    for line in sys.stdin:
        command, _, node = line.strip().partition(" ")
        if command == "start":
            nodes.start(node)
        elif command == "ready":  # every node of this process holds a quorum
            while {record[0] for record in list(nodes.records)} < set(nodes.alive):
                time.sleep(0.05)
            print("ready", flush=True)
        elif command == "vanish":
            nodes.vanish(node)
            print(f"vanished {node} {time.monotonic()!r}", flush=True)
        elif command == "dump":
            with open(node, "w", encoding="utf-8") as out:
                json.dump(nodes.records, out)
            print("dumped", flush=True)
            return


# -- the driver ------------------------------------------------------------------------------------------------
def _coordinator(folder: Path, heartbeat_ms: int, join_ms: int) -> tuple[subprocess.Popen[bytes], str]:
    address_file = folder / "coordinator.address"
    profile = replace(launch.AKS, coordinator_heartbeat_timeout_ms=heartbeat_ms, coordinator_join_timeout_ms=join_ms)
    proc = subprocess.Popen(  # pylint: disable=consider-using-with  # stopped in run()
        [sys.executable, "-m", launch.COORDINATOR_MODULE,
         *launch.coordinator_args(profile, bind="127.0.0.1:0", min_nodes=1), f"--address-file={address_file}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(folder / "coordinator.log", "wb"))
    deadline = time.monotonic() + 60
    while not address_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the coordinator did not start: {folder / 'coordinator.log'}")
        time.sleep(0.05)
    return proc, address_file.read_text(encoding="utf-8").strip()


def run(count: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    coordinator, address = _coordinator(folder, args.heartbeat_timeout_ms, args.join_timeout_ms)
    clients = [subprocess.Popen(  # pylint: disable=consider-using-with  # stopped below
        [sys.executable, __file__, "--client", address, "--step-seconds", str(args.step_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(args.processes)]
    where: dict[str, subprocess.Popen[str]] = {}
    serial = 0

    def send(client: subprocess.Popen[str], line: str) -> None:
        assert client.stdin is not None
        client.stdin.write(line + "\n")
        client.stdin.flush()

    def start(client: subprocess.Popen[str]) -> tuple[str, float]:
        nonlocal serial
        node = f"node-{serial:04d}"
        serial += 1
        where[node] = client
        at = time.monotonic()
        send(client, f"start {node}")
        return node, at

    rng = random.Random(args.seed)
    events: list[dict[str, Any]] = []
    begun = time.monotonic()
    try:
        for i in range(count):
            start(clients[i % len(clients)])
        for client in clients:  # every node trains before the first event
            send(client, "ready")
            assert client.stdout is not None
            while client.stdout.readline().strip() != "ready":
                pass
        started = time.monotonic()
        time.sleep(args.warmup)
        for _ in range(args.events):
            gone = rng.choice(sorted(where))
            client = where.pop(gone)
            send(client, f"vanish {gone}")
            assert client.stdout is not None
            reply = client.stdout.readline().split()
            events.append({"kind": "vanish", "node": gone, "at": float(reply[2]), "members": sorted(where)})
            time.sleep(args.gap)
            node, at = start(client)
            events.append({"kind": "join", "node": node, "at": at, "members": sorted(where)})
            time.sleep(args.gap)
        records: list[tuple[str, float, float, int, str]] = []
        for index, client in enumerate(clients):
            path = folder / f"records-{index}.json"
            send(client, f"dump {path}")
            assert client.stdout is not None
            while client.stdout.readline().strip() != "dumped":
                pass
            records += [tuple(r) for r in json.loads(path.read_text(encoding="utf-8"))]  # type: ignore[misc]
    finally:
        for client in clients:
            client.kill()
        coordinator.terminate()
        coordinator.wait(timeout=30)
    return {**measure(count, events, records, args), "start_seconds": round(started - begun, 2)}


def measure(count: int, events: list[dict[str, Any]], records: list[tuple[str, float, float, int, str]],
            args: argparse.Namespace) -> dict[str, Any]:
    """Each event's settle and round times (see the module's docstring), and the steady rounds'."""
    by_members: dict[str, list[tuple[str, float, float, int, str]]] = {}
    for record in records:
        by_members.setdefault(record[4], []).append(record)
    out: dict[str, list[float]] = {"vanish_settle": [], "join_settle": [], "vanish_round": [], "join_round": []}
    unsettled = 0
    for event in events:
        key = "|".join(event["members"])
        first: dict[str, tuple[str, float, float, int, str]] = {}
        for record in sorted(by_members.get(key, []), key=lambda r: r[2]):
            if record[2] >= event["at"] and record[0] not in first:
                first[record[0]] = record
        if len(first) < len(event["members"]):
            unsettled += 1
            continue
        out[f"{event['kind']}_settle"].append(max(r[2] for r in first.values()) - event["at"])
        out[f"{event['kind']}_round"].append(max(r[2] for r in first.values()) - max(r[1] for r in first.values()))
    steady = _steady_rounds(records, events)
    result: dict[str, Any] = {"nodes": count, "events": len(events), "unsettled": unsettled,
                              "heartbeat_timeout_ms": args.heartbeat_timeout_ms,
                              "join_timeout_ms": args.join_timeout_ms, "step_seconds": args.step_seconds}
    for name, values in {**out, "steady_round": steady}.items():
        result[name] = _summary(values)
    return result


def _steady_rounds(records: list[tuple[str, float, float, int, str]], events: list[dict[str, Any]]) -> list[float]:
    """Rounds with no change near them: each node's requests grouped by the answer's time (a round's answers come
    together), the last request to the last answer."""
    quiet = [(e["at"] - 1.0, e["at"] + 5.0) for e in events]
    answered = sorted(records, key=lambda r: r[2])
    rounds: list[list[tuple[str, float, float, int, str]]] = []
    for record in answered:
        if rounds and record[2] - rounds[-1][-1][2] < 0.02 and record[4] == rounds[-1][-1][4]:
            rounds[-1].append(record)
        else:
            rounds.append([record])
    return [max(r[2] for r in group) - max(r[1] for r in group) for group in rounds
            if len(group) == group[0][3] and not any(lo <= group[0][2] <= hi for lo, hi in quiet)]


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median": round(statistics.median(ordered), 4),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 4), "max": round(ordered[-1], 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="64,128,256", help="node counts, comma-separated")
    parser.add_argument("--events", type=int, default=15, help="vanishes and joins each, per node count")
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=launch.AKS_COORDINATOR_HEARTBEAT_TIMEOUT_MS)
    parser.add_argument("--join-timeout-ms", type=int, default=launch.AKS_COORDINATOR_JOIN_TIMEOUT_MS)
    parser.add_argument("--processes", type=int, default=4, help="client processes the nodes are spread over")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between two events")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client, args.step_seconds)
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="coordination-scale-") as tmp:
        for count in (int(n) for n in args.nodes.split(",")):
            folder = Path(tmp) / str(count)
            folder.mkdir()
            results.append(run(count, args, folder))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"machine": f"{os.cpu_count()} cores", "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
