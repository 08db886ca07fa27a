"""In-process recovery with torchft: how long survivors stop when a replica dies, vanishes or joins.

    .venv/bin/python -m pip install torchft==0.2.0 torch==2.13.0   # not a dependency of the extension
    .venv/bin/python scripts/bench/inprocess.py [--replicas 3] [--repeats 3] [--json out.json]

A spike for the in-process recovery mode (workers that outlive a re-form): ``--replicas`` processes on loopback,
each a torchft replica group of one (gloo on CPU, a small Linear model wrapped in ``torchft.DistributedDataParallel``,
a per-step quorum through a ``torchft.coordination.LighthouseServer`` run by this script, the state fetched from a
live peer when a replica joins). Every process stays alive; three events per repetition:

  kill      one replica SIGKILLed (its sockets close: the peers learn at once)
  vanish    one replica SIGSTOPped (sockets open, no FIN: as an Azure VM evicted without notice), killed after
  join      a new replica starts and is admitted once it has the state from a live peer

Each event's outage is the figure of core.goodput.outages: from the old world's last committed step to the
new world's first committed step, read from the survivors' own per-step records (wall time, step, participants);
for ``join`` also the newcomer's seconds from its start to its first committed step. Steps lost: committed steps
of the old world the new one does not continue from (torchft discards a failed step's gradients; the step
counter goes on only on commit). Medians over the repetitions. Everything runs on loopback and is stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

STEP_SECONDS = 0.05  # the compute of a step, slept: the figures are the coordination's, not the model's
PG_TIMEOUT = timedelta(seconds=5)  # gloo: how long a collective waits for a silent peer


# -- a replica (run as: inprocess.py --replica ID --lighthouse ADDR) -------------------------------------------

def replica(replica_id: str, lighthouse: str) -> None:
    import torch
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this replica group's own store
    manager = Manager(
        pg=ProcessGroupGloo(timeout=PG_TIMEOUT), min_replica_size=1,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), optimizer.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
        replica_id=replica_id, rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
        lighthouse_addr=lighthouse, hostname="127.0.0.1",
        timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=10), connect_timeout=timedelta(seconds=10))
    ddp = DistributedDataParallel(manager, model)
    while True:
        manager.start_quorum()
        optimizer.zero_grad()
        ddp(torch.randn(8, 64)).sum().backward()
        time.sleep(STEP_SECONDS)
        if manager.should_commit():
            optimizer.step()
            print(json.dumps({"time": round(time.time(), 3), "step": manager.current_step(),
                              "participants": manager.num_participants()}), flush=True)


# -- the harness ---------------------------------------------------------------------------------------------

class Replica:
    """One replica process and the steps it committed (time, step, participants), read as they come."""

    def __init__(self, name: str, lighthouse: str, log_dir: Path):
        self.name, self.started = name, time.time()
        self.steps: list[dict] = []
        self._log = open(log_dir / f"{name}.log", "ab")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, __file__, "--replica", name, "--lighthouse", lighthouse],
            stdout=subprocess.PIPE, stderr=self._log, env={**os.environ, "OMP_NUM_THREADS": "1"})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.steps.append(json.loads(line))
            except ValueError:
                pass

    def signal(self, sig: int) -> float:
        self.proc.send_signal(sig)
        return time.time()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def outage(survivors: list[Replica], since: float, size_before: int, size_after: int, timeout: float = 120) -> dict:
    """From the old world's last committed step (before ``since``, at ``size_before`` participants) to the first
    step the new world (``size_after``) committed, over the survivors' records; steps lost: the old world's last
    step minus the step before the new world's first (0 when the counter goes on)."""
    def first_after() -> list[dict]:
        return sorted((s for r in survivors for s in r.steps if s["time"] > since and s["participants"] == size_after),
                      key=lambda s: s["time"])

    first = wait_for(first_after, timeout, f"a step at {size_after} participants")[0]
    old = [s for r in survivors for s in r.steps if s["participants"] == size_before and s["time"] < first["time"]]
    last = max(old, key=lambda s: s["time"])
    return {"outage_s": round(first["time"] - last["time"], 3),
            "steps_lost": max(0, last["step"] - (first["step"] - 1)),
            "last_step": last["step"], "first_step": first["step"]}


def steady(replicas: list[Replica], size: int, after: float, steps: int = 20) -> None:
    wait_for(lambda: all(sum(1 for s in r.steps if s["time"] > after and s["participants"] == size) >= steps
                         for r in replicas), 180, f"{steps} steps at {size} participants on every replica")


def run_once(count: int, lighthouse: str, log_dir: Path, rep: int) -> dict:
    replicas = [Replica(f"r{rep}-{i}", lighthouse, log_dir) for i in range(count)]
    try:
        steady(replicas, count, 0)
        out: dict = {}
        # kill: the peers' sockets close at once
        victim, survivors = replicas[-1], replicas[:-1]
        out["kill"] = outage(survivors, victim.signal(signal.SIGKILL), count, count - 1)
        victim.stop()
        # join: a newcomer takes the state from a live peer while the others train
        steady(survivors, count - 1, time.time())
        newcomer = Replica(f"r{rep}-{count}", lighthouse, log_dir)
        out["join"] = outage(survivors, newcomer.started, count - 1, count)
        first_own = wait_for(lambda: [s for s in newcomer.steps if s["participants"] == count], 60, "newcomer's step")
        out["join"]["newcomer_first_step_s"] = round(first_own[0]["time"] - newcomer.started, 3)
        replicas = survivors + [newcomer]
        # vanish: frozen, no FIN; the peers find out by a timeout of their own
        steady(replicas, count, time.time())
        victim, survivors = replicas[-1], replicas[:-1]
        out["vanish"] = outage(survivors, victim.signal(signal.SIGSTOP), count, count - 1)
        victim.signal(signal.SIGKILL)
        return out
    finally:
        for r in replicas:
            r.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--replica", help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=1000,
                        help="the Lighthouse drops a replica it has not heard from this long")
    args = parser.parse_args()
    if args.replica:
        replica(args.replica, args.lighthouse)
        return 0
    import tempfile

    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, quorum_tick_ms=50,
                              heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    samples = []
    try:
        with tempfile.TemporaryDirectory(prefix="elastictrain-inprocess-") as tmp:
            for rep in range(args.repeats):
                sample = run_once(args.replicas, server.address(), Path(tmp), rep)
                samples.append(sample)
                print(f"  rep {rep + 1}: " + "  ".join(f"{k} {v['outage_s']:.2f}s ({v['steps_lost']} lost)"
                                                       for k, v in sample.items())
                      + f"  newcomer's first step after {sample['join']['newcomer_first_step_s']:.2f}s", flush=True)
            if not samples:
                return 1
    finally:
        server.shutdown()
    print(f"\n{'event':8s} {'n':>2s} {'outage s':>9s} {'steps lost':>11s}")
    medians = {}
    for event in ("kill", "vanish", "join"):
        rows = [s[event] for s in samples]
        medians[event] = {"outage_s": round(statistics.median(r["outage_s"] for r in rows), 3),
                          "steps_lost": statistics.median(r["steps_lost"] for r in rows)}
        print(f"{event:8s} {len(rows):2d} {medians[event]['outage_s']:9.3f} {medians[event]['steps_lost']:11.1f}")
    print(f"newcomer: first step {statistics.median(s['join']['newcomer_first_step_s'] for s in samples):.2f}s "
          "after its start (median; includes importing torch)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "samples": samples, "medians": medians}, indent=1),
                                   encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
