"""Does a rendezvous setting re-form a healthy job for nothing? A soak under CPU load.

    .venv/bin/python scripts/bench/rdzv_soak.py [--seconds 180] [--hogs 2] [--conf RDZV_CONF ...]
        [--collective-timeout SECONDS ...] [--peer-timeout SECONDS ...] [--checkpoint-every STEPS]
        [--in-process-heartbeat-ms MS ...]

Shorter keep-alives notice a dead node sooner (faster recovery) but call a live
node dead when its agent's heartbeat is late: the job then re-forms for
nothing. Per setting, a real 2-node job (two torchrun agents, etcd-v2
rendezvous, Azurite) trains for ``--seconds`` with no eviction while ``--hogs``
busy processes compete for the CPU; every restore after the first is a
needless re-form. The same soak prices a collective timeout (``--collective-timeout``: each value soaked with the
shipped rendezvous settings): too short, and a peer that is slow rather than gone fails a collective and the job
re-forms for nothing; so does the runtime's peer timeout (``--peer-timeout``: each value soaked with the shipped
rendezvous settings and AKS's 60 s collective timeout, so only a peer taken for gone re-forms it: a worker whose
Python stops that long). ``--in-process-heartbeat-ms`` soaks in-process jobs instead: a coordinator that drops a node
unheard of for MS milliseconds, each quorum change after both train a needless one. Everything runs on loopback
and is stopped at the end.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "bench"))

from harness.elastic import TUNED_RDZV_CONF, JobConfig, Node, events_of, read_events, wait_for  # noqa: E402
from harness.services import start_azurite, start_etcd  # noqa: E402

from azext_elastictrain.core import launch  # noqa: E402
from azext_elastictrain.core.blobstore import BlobStore  # noqa: E402


def _hog() -> None:
    while True:
        pass


def train_healthy(job: JobConfig, seconds: float, store: BlobStore, logs: Path, reform: str) -> dict:
    """Two nodes of ``job`` train ``seconds`` with no eviction: every ``reform`` event then is a needless one."""
    nodes = [Node(job, "node-a", logs), Node(job, "node-b", logs)]
    try:
        wait_for(lambda: [e for e in events_of(read_events(store, store.prefix), "progress")
                          if e.get("world_size") == 2], 300, "training at world size 2")
        start = time.time()
        time.sleep(seconds)
        events = [e for e in read_events(store, store.prefix) if e["time"] >= start]
        progress = events_of(events, "progress")
        return {"seconds": seconds, "reforms": len(events_of(events, reform)),
                "steps": progress[-1]["step"] - progress[0]["step"] if progress else 0}
    finally:
        for node in nodes:
            node.stop()


def soak(conf: str, seconds: float, blob, etcd, logs: Path, timeout: float | None = None,
         checkpoint_every: int = 50, peer_timeout: float | None = None) -> dict:
    name = f"soak-{uuid.uuid4().hex[:6]}"
    env = {launch.ENV_COLLECTIVE_TIMEOUT: f"{timeout:g}"} if timeout is not None else {}
    if peer_timeout is not None:
        env[launch.ENV_PEER_TIMEOUT] = f"{peer_timeout:g}"
    job = JobConfig(name=name, checkpoint_url=f"{blob.blob_endpoint}/bench/{name}",
                    connection_string=blob.connection_string, etcd_endpoint=etcd.endpoint, rdzv_conf=conf,
                    extra_env=env,
                    script_args=["--steps", "1000000", "--checkpoint-every", str(checkpoint_every),
                                 "--step-delay", "0.05", "--log-every", "1000"])
    store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
    try:
        return {"conf": conf, **train_healthy(job, seconds, store, logs, "restored")}
    finally:
        store.close()


def soak_in_process(heartbeat_ms: int, seconds: float, blob, logs: Path) -> dict:
    """A healthy 2-node in-process job (goodput.py's config, its coordinator at ``heartbeat_ms``): every quorum
    change after both nodes train is a live node taken for dead (its heartbeats late) and dropped for nothing; the
    quorum's watch (runtime/replica_watch.py) beats at the same timeout, and each step it gave up on a live node is
    a needless discard (counted from the nodes' logs, as is every discarded step); so is each step a node coasted,
    its probe of the live coordinator missed (runtime/replicas.py ``coordinator_answers``)."""
    from goodput import CONFIGS, WORKLOAD, WORKLOAD_ARGS, start_coordinator  # pylint: disable=import-outside-toplevel

    cfg = CONFIGS["in-process"]
    name = f"soak-ip-{uuid.uuid4().hex[:6]}"
    coordinator = start_coordinator(cfg, logs / name, name, heartbeat_ms)
    job = JobConfig(name=name, checkpoint_url=f"{blob.blob_endpoint}/bench/{name}",
                    connection_string=blob.connection_string, etcd_endpoint="unused:0", progress_seconds=0.2,
                    recovery=launch.RECOVERY_IN_PROCESS, coordinator=coordinator.address,
                    extra_env={launch.ENV_CHECKPOINT_INTERVAL_STEPS: str(cfg["every"]),
                               launch.ENV_REPLICA_HEARTBEAT_TIMEOUT: f"{heartbeat_ms / 1000:g}"},
                    script=WORKLOAD, script_args=WORKLOAD_ARGS)
    store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
    try:
        result = train_healthy(job, seconds, store, logs / name, "quorum")
        text = "".join(path.read_text(errors="replace") for path in (logs / name).glob("*.log"))
        return {**result, "given_up": text.count("giving up the step's collective"),
                "discarded": text.count("discarding the step"),
                "coasted": text.count("the coordinator does not answer")}  # a probe missed: a live one taken for gone
    finally:
        coordinator.stop()
        store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--hogs", type=int, default=2, help="busy processes competing for the CPU")
    parser.add_argument("--conf", action="append", help="rendezvous settings to soak (default: the shipped ones)")
    parser.add_argument("--collective-timeout", type=float, action="append", metavar="SECONDS",
                        help="instead: soak these collective timeouts, with the shipped rendezvous settings")
    parser.add_argument("--peer-timeout", type=float, action="append", metavar="SECONDS",
                        help="instead: soak these peer timeouts (the runtime's peer watch), the collective timeout "
                             "at AKS's 60 s")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between blob checkpoints")
    parser.add_argument("--in-process-heartbeat-ms", type=int, action="append", metavar="MS",
                        help="instead: soak in-process jobs whose coordinator drops a node unheard of this long")
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        with tempfile.TemporaryDirectory(prefix="elastictrain-soak-") as tmp:
            work = Path(tmp)
            with start_azurite(work / "azurite") as blob, start_etcd(work / "etcd") as etcd:
                blob.blob_service_client().create_container("bench")
                for heartbeat_ms in args.in_process_heartbeat_ms or []:
                    r = soak_in_process(heartbeat_ms, args.seconds, blob, work / "logs")
                    print(f"{r['reforms']} needless re-form(s) in {r['seconds']:.0f}s ({r['steps']} steps, "
                          f"{args.hogs} CPU hogs): in-process, coordinator heartbeat timeout {heartbeat_ms} ms; "
                          f"the quorum's watch gave up {r['given_up']} collective(s) on a live node, "
                          f"{r['discarded']} step(s) discarded, {r['coasted']} probe(s) of the live coordinator "
                          f"missed", flush=True)
                for peer in [] if args.in_process_heartbeat_ms else args.peer_timeout or []:
                    r = soak(TUNED_RDZV_CONF, args.seconds, blob, etcd, work / "logs",
                             launch.AKS.collective_timeout_seconds, args.checkpoint_every, peer_timeout=peer)
                    print(f"{r['reforms']} needless re-form(s) in {r['seconds']:.0f}s ({r['steps']} steps, "
                          f"{args.hogs} CPU hogs, a checkpoint every {args.checkpoint_every} steps): peer "
                          f"timeout {peer:g}s", flush=True)
                for timeout in [] if args.in_process_heartbeat_ms else args.collective_timeout or []:
                    r = soak(TUNED_RDZV_CONF, args.seconds, blob, etcd, work / "logs", timeout, args.checkpoint_every)
                    print(f"{r['reforms']} needless re-form(s) in {r['seconds']:.0f}s ({r['steps']} steps, "
                          f"{args.hogs} CPU hogs, a checkpoint every {args.checkpoint_every} steps): collective "
                          f"timeout {timeout:g}s", flush=True)
                for conf in [] if args.collective_timeout or args.in_process_heartbeat_ms or args.peer_timeout else \
                        args.conf or [TUNED_RDZV_CONF]:
                    r = soak(conf, args.seconds, blob, etcd, work / "logs", None, args.checkpoint_every)
                    print(f"{r['reforms']} needless re-form(s) in {r['seconds']:.0f}s ({r['steps']} steps, "
                          f"{args.hogs} CPU hogs): {conf}", flush=True)
    finally:
        for hog in hogs:
            hog.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
