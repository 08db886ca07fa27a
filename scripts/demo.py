"""The main job: a real 2-node elastic training job survives Spot evictions, driven through the real az.

    bash scripts/demo.sh                 # sets everything up, then runs this
    bash scripts/demo.sh --keep-cluster  # leave the cluster running to look around afterwards

Every step is an ``az elastictrain`` command (printed before it runs), against a
local cluster on this machine: real etcd (rendezvous), real Azurite (blob
storage), a local Azure Scheduled Events endpoint, and real ``torchrun`` agents
as the job's nodes, training ``scripts/train_cifar10.py``, in the local default recovery mode: workers
that outlive a re-form (``--recovery in-process``: a per-step quorum through the job's coordinator):

1. ``cluster create --local`` and ``job run``: 2 nodes, checkpoint every 40 steps;
2. ``evict simulate`` with Azure's 30 s Preempt notice: the node leaves the quorum at the next step
   boundary (the survivor holds that step), acknowledges and goes; the survivor trains on without
   stopping (world size 2 -> 1), then capacity comes back (-> 2) and the newcomer takes the state from
   the live survivor;
3. ``evict simulate --notice-seconds 0``: a node vanishes as an Azure VM evicted
   without notice does (frozen, no peer told); the survivor finds out by the coordinator's heartbeat
   timeout, or in the step's collective by the replica timeout, and trains on from the last committed
   step; capacity comes back again;
4. ``job wait`` until every step is trained, ``checkpoint list`` and ``prune``;
5. ``job show --price-as``: what the job's node-hours would have cost as Azure Spot nodes of a size
   (default Standard_NC4as_T4_v3 in eastus), against the same node-hours on demand. Prices come from
   Azure's public Retail Prices API; offline they are "unknown" (never a made-up figure). ``--prices-url``
   points at another price source of the same shape, e.g. the test front
   (``python -m tests.support.prices_server``, whose figures are the tests' own, not Azure's).

It prints a summary (steps, the recovery mode, loss at start and end, each recovery in seconds,
steps lost, goodput, cost and savings), writes ``<out>/summary.json`` and a timeline picture
``<out>/timeline.png``, and deletes the cluster (unless ``--keep-cluster``).
az runs with its own config dir (``<out>/azure-config``): your ~/.azure is untouched.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLUSTER, JOB, INTERVAL = "demo", "cifar", 40


def say(text: str) -> None:
    print(f"\n[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Az:
    """The real az CLI with this demo's own config dir; each command is printed before it runs."""

    def __init__(self, config_dir: Path):
        self.path = shutil.which("az", path=f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
        if not self.path:
            raise SystemExit("az not found: run `bash scripts/setup.sh` first (or `bash scripts/demo.sh`)")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
        self.env.update(AZURE_CONFIG_DIR=str(config_dir), AZURE_CORE_COLLECT_TELEMETRY="false",
                        AZURE_CORE_SURVEY_MESSAGE="false", AZURE_CORE_ONLY_SHOW_ERRORS="true",
                        AZURE_EXTENSION_DEV_SOURCES=str(REPO / "build" / "azext-dev"))

    def _run(self, args: list[str], capture: bool, timeout: float) -> subprocess.CompletedProcess:
        print("$ az " + " ".join(shlex.quote(a) for a in args), flush=True)
        result = subprocess.run([self.path, *args], env=self.env, cwd=REPO, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if capture else None)
        if result.returncode != 0:
            raise SystemExit(f"az {args[0]} {args[1]} {args[2]} failed (exit {result.returncode}); see above")
        return result

    def show(self, *args: str, timeout: float = 600) -> None:
        """Run it and let its table through to the terminal."""
        self._run([*args, "-o", "table"], capture=False, timeout=timeout)

    def json(self, *args: str, timeout: float = 600):
        return json.loads(self._run([*args, "-o", "json"], capture=True, timeout=timeout).stdout or "null")


def evict(az: Az, notice: bool, node: str | None) -> dict:
    target = ["--node", node] if node else ["--count", "1"]
    result = az.json("elastictrain", "evict", "simulate", "--local", "--cluster", CLUSTER, "--job", JOB, *target,
                     "--notice-seconds", "30" if notice else "0", "--replace-after", "3", "--wait", "--yes")
    (eviction,), (recovery,) = result["evictions"], result["recovery"]
    back = result.get("capacityBack") or {}
    acked = (f"kept its step and acknowledged the notice after {eviction['acknowledgedAfterSeconds']}s, then went"
             if eviction["acknowledged"] else "vanished without notice (frozen until the job trained without it)")
    print(f"  {eviction['node']} {acked}\n"
          f"  outage {recovery['outageSeconds']}s (last step before to first step after) at world size "
          f"{recovery['worldSize']}, from step {recovery['resumedFromStep']}: {recovery['stepsLost']} step(s) lost\n"
          f"  Spot capacity came back: {', '.join(r['node'] for r in result['replacements'])} joined; "
          f"world size {back.get('worldSize')} again after {back.get('seconds')}s "
          f"({back.get('nodeJoinedToFullSizeSeconds')}s from the node joining, outage {back.get('outageSeconds')}s, "
          f"restored from {back.get('restoreSource')})", flush=True)
    return {"node": eviction["node"], "notice": notice, "evictedAt": eviction["evictedAt"],
            "acknowledged": eviction["acknowledged"], **recovery,
            "replacement": result["replacements"][0], "capacityBack": back}


def world_sizes(events: list[dict]) -> list[int]:
    """The world sizes the job trained at, in order, each run of equal sizes once."""
    sizes: list[int] = []
    for e in events:
        if e.get("event") == "progress" and e.get("world_size") and (not sizes or sizes[-1] != e["world_size"]):
            sizes.append(e["world_size"])
    return sizes


def summarize(events: list[dict], evictions: list[dict], shown: dict, steps: int) -> dict:
    progress = [e for e in events if e.get("event") == "progress" and (e.get("metrics") or {}).get("loss") is not None]
    checkpoints = [e for e in events if e.get("event") == "checkpoint"]
    median = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    return {
        "state": shown["state"], "recovery": shown.get("recovery"), "steps": steps, "step": shown["step"],
        "worldSizes": world_sizes(events),
        "lossStart": {"step": progress[0]["step"], "loss": progress[0]["metrics"]["loss"]},
        "lossEnd": {"step": progress[-1]["step"], "loss": progress[-1]["metrics"]["loss"]},
        "checkpoints": len(checkpoints), "checkpointInterval": INTERVAL,
        "medianUploadSeconds": median([c["seconds"] for c in checkpoints]),
        "medianStallSeconds": median([c["stall_seconds"] for c in checkpoints]),
        "evictions": evictions,
        "goodput": shown.get("goodput"), "timeLost": shown.get("timeLost"), "cost": shown.get("cost"),
    }


def print_summary(s: dict, picture: Path) -> None:
    lines = [
        "Summary",
        f"  job                {s['state']}: {s['step']} of {s['steps']} steps trained; world sizes "
        + " -> ".join(map(str, s["worldSizes"])),
        f"  recovery           --recovery {s['recovery']}",
        f"  loss               {s['lossStart']['loss']:.3f} (step {s['lossStart']['step']}) -> "
        f"{s['lossEnd']['loss']:.3f} (step {s['lossEnd']['step']})",
        f"  checkpoints        {s['checkpoints']} committed, median upload {s['medianUploadSeconds']:.2f}s, "
        f"median training stall {1000 * s['medianStallSeconds']:.0f} ms",
    ]
    for i, ev in enumerate(s["evictions"], 1):
        kind = "with notice   " if ev["notice"] else "without notice"
        lines.append(f"  eviction {i} {kind} {ev['node']}: outage {ev['outageSeconds']}s "
                     f"from step {ev['resumedFromStep']}, {ev['stepsLost']} step(s) lost; full size again "
                     f"{ev['capacityBack'].get('seconds')}s after capacity returned (outage "
                     f"{ev['capacityBack'].get('outageSeconds')}s)")
    if s.get("goodput") is not None:
        lost = ", ".join(f"{cause} {seconds:.1f}" for cause, seconds in s["timeLost"].items() if seconds)
        lines.append(f"  goodput            {s['goodput']:.1%} of rank-seconds; lost (rank-s): {lost or 'none'}")
    if "cost" in s:
        from azext_elastictrain.core.prices import cost_line

        lines.append(f"  cost               {cost_line(s['cost']).removeprefix('cost: ')}")
    lines.append(f"  timeline           {picture}")
    print("\n" + "\n".join(lines), flush=True)


def job_events(config_dir: Path) -> list[dict]:
    """The job's event log, read from the cluster's blob storage (what `job show` summarizes)."""
    from azext_elastictrain.backends import local_backend

    return local_backend(config_dir / "elastictrain" / "local", CLUSTER).job_events(JOB)


def run(az: Az, args: argparse.Namespace, out: Path) -> dict:
    say("A local cluster: etcd, Azurite and a Scheduled Events endpoint, as background processes")
    az.show("elastictrain", "cluster", "create", "--local", "--name", CLUSTER)
    say(f"A 2-node elastic job (1..2 nodes), {args.steps} steps, a checkpoint every {INTERVAL} steps; its workers "
        "outlive a re-form (the local default, --recovery in-process)")
    az.show("elastictrain", "job", "run", "--local", "--cluster", CLUSTER, "--name", JOB,
            "--script", "scripts/train_cifar10.py",
            "--script-args", f"--steps {args.steps} --step-delay 0.05 --log-every 100",
            "--min-nodes", "1", "--max-nodes", "2", "--checkpoint-interval", str(INTERVAL))
    az.json("elastictrain", "job", "wait", "--local", "--cluster", CLUSTER, "--name", JOB,
            "--world-size", "2", "--step", "60", "--timeout", "300")
    evictions = []
    say("Spot eviction WITH notice: Azure's Preempt event, 30 s before the VM goes")
    evictions.append(evict(az, notice=True, node=f"{JOB}-node-1"))
    time.sleep(3)
    say("Spot eviction WITHOUT notice: the node vanishes (frozen, no peer told) until the job trains without it")
    evictions.append(evict(az, notice=False, node=None))
    say("Training to the end")
    az.json("elastictrain", "job", "wait", "--local", "--cluster", CLUSTER, "--name", JOB,
            "--state", "Succeeded", "--timeout", "900")
    az.show("elastictrain", "job", "show", "--local", "--cluster", CLUSTER, "--name", JOB)
    priced = ("--price-as", args.price_as, "-l", args.location)
    say(f"What it would have cost on Azure Spot: {args.price_as} in {args.location}")
    shown = az.json("elastictrain", "job", "show", "--local", "--cluster", CLUSTER, "--name", JOB, *priced)
    print(json.dumps(shown.get("cost"), indent=1), flush=True)
    say("The checkpoint catalog, then retention: keep the newest 2")
    where = ("--local", "--cluster", CLUSTER, "--job", JOB)
    az.show("elastictrain", "checkpoint", "list", *where)
    az.show("elastictrain", "checkpoint", "prune", *where, "--keep-last", "2", "--yes")
    kept = az.json("elastictrain", "checkpoint", "list", *where)
    az.show("elastictrain", "checkpoint", "list", *where)
    events = job_events(args.config_dir)
    summary = summarize(events, evictions, shown, args.steps)
    summary["checkpointsKept"] = [c["step"] for c in kept if c["status"] == "complete"]
    picture = out / "timeline.png"
    az.json("elastictrain", "job", "timeline", "--local", "--cluster", CLUSTER, "--name", JOB,
            "--output-file", str(picture), *priced)
    (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print_summary(summary, picture)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the elastic training demo on this machine, through az.")
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
    parser.add_argument("--out", default="out", help="folder for the summary, timeline picture and events")
    parser.add_argument("--config-dir", type=Path, help="az config dir (default: <out>/azure-config)")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the local cluster running afterwards")
    parser.add_argument("--price-as", default="Standard_NC4as_T4_v3",
                        help="price the job as Spot nodes of this Azure VM size (default Standard_NC4as_T4_v3)")
    parser.add_argument("--location", default="eastus", help="the region whose prices to use (default eastus)")
    parser.add_argument("--prices-url", help="a Retail Prices API of the same shape to ask instead of Azure's "
                                             "(e.g. the test front); its figures are then that source's")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.config_dir = (args.config_dir or out / "azure-config").resolve()
    az = Az(args.config_dir)
    if args.prices_url:
        from azext_elastictrain.core.prices import PRICES_URL_ENV

        az.env[PRICES_URL_ENV] = args.prices_url
    delete_cluster = [az.path, "elastictrain", "cluster", "delete", "--local", "--name", CLUSTER, "--yes", "-o", "none"]
    # A cluster left by an earlier run (--keep-cluster) would hold that run's checkpoints: start clean.
    subprocess.run(delete_cluster, env=az.env, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    try:
        summary = run(az, args, out)
    finally:
        if not args.keep_cluster:
            say("Cleaning up: the cluster's processes stop, its state goes")
            subprocess.run(delete_cluster, env=az.env, cwd=REPO, stdin=subprocess.DEVNULL, timeout=300)
    if args.keep_cluster:
        print(f"\nThe cluster runs on. Look around with:\n  export AZURE_CONFIG_DIR={args.config_dir}\n"
              f"  az elastictrain job show --local --cluster {CLUSTER} --name {JOB} -o table\n"
              f"  az elastictrain cluster delete --local --name {CLUSTER} --yes   # when done")
    return 0 if summary["state"] == "Succeeded" and summary["step"] == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
