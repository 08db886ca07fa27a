"""Recovery after a Spot eviction: seconds to train again and steps lost, side by side.

    .venv/bin/python scripts/bench/recovery.py [--repeats 3] [--json out.json]

A real 2-node job (two torchrun agents, etcd-v2 rendezvous, Azurite, DDP on
``scripts/train_cifar10.py``) loses one node, three ways, interleaved:

  notice     ours, the node gets an Azure Scheduled Events Preempt first
  no-notice  ours, the node is killed at once (its peers told by the closed sockets)
  baseline   plain torchrun: default rendezvous settings, no notice handling,
             a checkpoint once per epoch (as in the AKS TorchElastic lab)
  no-notice-vanish  ours, the node vanishes as `evict simulate --local` does it
             without notice (frozen, sockets open, no FIN: killed once the
             survivor trained again, which it notices by its collective timeout)
  no-notice-vanish-30min  (with --vanish SECONDS) the same freeze with every
             process group at torch's 30-minute default timeout, killed SECONDS
             later: what every job did before the launch set a timeout

outage = the old world's last completed step -> the new world's first
completed step (core.eventlog.goodput.outages, what `evict simulate --wait`, `job show`
and `job timeline` report); recovery = eviction (the node killed) -> that
first step; restore = eviction -> the survivor loaded its checkpoint; steps
lost = the old world's last completed step - the step it resumed from. Medians of the repetitions; the ratio baseline / notice is the
headline. Everything runs on loopback and is stopped at the end.

    .venv/bin/python scripts/bench/recovery.py --state-mib 64 512 [--repeats 3]

instead measures one survivor's restore of a state of that size (a model and
its AdamW moments, fp32, in one process): from its node's memory copy vs from
the blob checkpoint of the same step, interleaved; medians and their ratio.
Also what keeping the memory copy costs per training step (a real AdamW step
between hooks), side by side: tier off, everything on the training thread
(sync: the opt-in tier's placement), and the default (async): the time in
``Checkpointer.step`` and the whole iteration's time over the tier-off one.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from azext_elastictrain.core.blobstore import BlobStore  # noqa: E402
from azext_elastictrain.backends.local.scheduled_events import ScheduledEventsServer  # noqa: E402
from azext_elastictrain.backends.local.evict import vanish_cap  # noqa: E402
from azext_elastictrain.core import launch  # noqa: E402
from azext_elastictrain.core.eventlog.recovery import follow_recovery, trained_again  # noqa: E402
from harness.elastic import TUNED_RDZV_CONF, JobConfig, Node, events_of, read_events, wait_for  # noqa: E402
from harness.services import start_azurite, start_etcd  # noqa: E402

DIGITS_STEPS_PER_EPOCH = 1797 // 64
# torchrun's own defaults, spelled out (keep-alive 5 s x 3, last call 30 s).
DEFAULT_RDZV_CONF = "last_call_timeout=30,keep_alive_interval=5,keep_alive_max_attempt=3,join_timeout=600"
CASES = {
    "notice": {"notice": True, "rdzv": TUNED_RDZV_CONF, "every": 25, "warm": True},
    "no-notice": {"notice": False, "rdzv": TUNED_RDZV_CONF, "every": 25, "warm": True},
    "baseline": {"notice": False, "rdzv": DEFAULT_RDZV_CONF, "every": DIGITS_STEPS_PER_EPOCH, "warm": False},
    # "until trained again": frozen until the survivor's new world completed a step (capped), as the product does
    "no-notice-vanish": {"notice": False, "rdzv": TUNED_RDZV_CONF, "every": 25, "warm": True,
                         "vanish": "until trained again"},
}
TORCH_DEFAULT_TIMEOUT_SECONDS = 1800  # torch.distributed's default for gloo groups


def run_case(case: str, blob, etcd, imds: ScheduledEventsServer, logs: Path) -> dict:
    cfg = CASES[case]
    name = f"rec-{case.replace('*', '-candidate')}-{uuid.uuid4().hex[:6]}"
    job = JobConfig(
        name=name, checkpoint_url=f"{blob.blob_endpoint}/bench/{name}", connection_string=blob.connection_string,
        etcd_endpoint=etcd.endpoint, scheduled_events_url=imds.url if cfg["notice"] else "off",
        rdzv_conf=cfg["rdzv"], progress_seconds=0.2, warm_start=cfg["warm"],
        extra_env={launch.ENV_COLLECTIVE_TIMEOUT: str(cfg["timeout"])} if "timeout" in cfg else {},
        script_args=["--steps", "100000", "--checkpoint-every", str(cfg["every"]), "--step-delay", "0.05",
                     "--log-every", "100"],
    )
    store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
    events = lambda: read_events(store, store.prefix)  # noqa: E731
    a, b = Node(job, "node-a", logs / case), Node(job, "node-b", logs / case)
    try:
        wait_for(lambda: [e for e in events_of(events(), "progress") if e.get("world_size") == 2 and e["step"] > 60],
                 300, f"{case}: training at world size 2")
        if cfg["notice"]:
            event_id = imds.post_event(["node-b"], "Preempt", notice_seconds=30)
            if not imds.wait_acknowledged(event_id, timeout=60):
                raise RuntimeError("the notice was never acknowledged")
        if cfg.get("vanish") == "until trained again":  # frozen (no FIN reaches node-a), as evict simulate does
            evicted = b.vanish(vanish_cap(), until=lambda frozen_at: trained_again(events(), frozen_at))
        elif cfg.get("vanish") is not None:  # frozen, killed cfg["vanish"] s later
            evicted = b.vanish(cfg["vanish"])
        else:
            b.kill()
            evicted = time.time()
        if cfg["notice"]:
            imds.remove_event(event_id)
        # what `evict simulate --wait` reports (core.eventlog.recovery): the outage from the last step before to the
        # first step after, the steps lost from the survivors' own record; also seconds from the kill
        found = follow_recovery(lambda _job: events(), name, {"node": "node-b", "evictedAt": evicted},
                                timeout=300)
        return {
            "case": case,
            "outage_s": found["outageSeconds"],
            "recovery_s": found["recoverySeconds"],
            "restore_s": found["restoreSeconds"],
            "steps_lost": found["stepsLost"],
            "resumed_from": found["resumedFromStep"],
        }
    finally:
        a.stop()
        b.stop()
        store.close()


def state_of(mib: int):
    """A Linear model and AdamW whose parameters and moments come to ``mib`` MiB, one step taken; and a
    function that takes one more training step."""
    import torch

    features = max(8, int((mib * 2**20 / 4 / 3) ** 0.5))  # weights + 2 moments, fp32
    model = torch.nn.Linear(features, features, bias=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step() -> None:
        optimizer.zero_grad()
        model(torch.randn(2, features)).sum().backward()
        optimizer.step()

    train_step()
    return {"model": model, "optimizer": optimizer}, train_step


@contextlib.contextmanager
def _env(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def memory_vs_blob(mib: int, repeats: int, steps: int = 6) -> dict:
    """A survivor's restore of the same step from its node's memory vs from blob; and what keeping the memory
    copy costs a training step, three ways side by side: ``off`` (no memory tier), ``sync`` (the copy, its
    checksum and commit all on the training thread: how the tier ran when it was opt-in) and ``async`` (the
    default: the training thread copies, a thread of its own checksums and commits)."""
    from azext_elastictrain.runtime.checkpoint import Checkpointer
    from azext_elastictrain.runtime.memory_tier import MemoryTier

    samples: dict[str, list[float]] = {"memory": [], "blob": []}
    for case in ("off", "sync", "async"):
        samples[f"hook_{case}"], samples[f"iteration_{case}"] = [], []
    with tempfile.TemporaryDirectory(prefix="elastictrain-memory-tier-") as tmp:
        work = Path(tmp)
        memory_dir = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
        memory_dir = Path(tempfile.mkdtemp(prefix="elastictrain-bench-", dir=memory_dir))
        env = {launch.ENV_MEMORY_DIR: str(memory_dir), "TORCHELASTIC_RUN_ID": uuid.uuid4().hex}
        try:
            with start_azurite(work / "azurite") as blob:
                blob.blob_service_client().create_container("bench")
                url = f"{blob.blob_endpoint}/bench/memory-tier"
                store = BlobStore.from_url(url, connection_string=blob.connection_string)
                state, train_step = state_of(mib)
                tier = MemoryTier.from_env(store.prefix, env)
                with Checkpointer(store, watcher=None, events=False, memory_tier=False) as ckpt:
                    ckpt.save(1, state, blocking=True)
                for rep in range(repeats):
                    cases = ["off", "sync", "async"]
                    cases = cases[rep % 3:] + cases[:rep % 3]  # rotate: spread drift
                    for case in cases:
                        with _env(env), Checkpointer(store, watcher=None, events=False,
                                                     memory_tier=case != "off") as ckpt:
                            for i in range(steps):
                                started = time.perf_counter()
                                train_step()
                                hooked = time.perf_counter()
                                ckpt.step(10 + i, state)
                                if case == "sync":
                                    ckpt.kept_in_memory()  # the commit waited for on the training thread
                                done = time.perf_counter()
                                if i >= 2:  # the first steps map and fault in the slots
                                    samples[f"hook_{case}"].append(done - hooked)
                                    samples[f"iteration_{case}"].append(done - started)
                    for source in ("memory", "blob"):
                        with _env(env), Checkpointer(store, watcher=None, events=False,
                                                     memory_tier=source == "memory") as ckpt:
                            if source == "memory":  # the step's hook keeps the copy; no blob save is due
                                ckpt.step(1, state)
                                assert ckpt.kept_in_memory() == 1
                            started = time.perf_counter()
                            assert ckpt.restore(state) == 1
                            samples[source].append(time.perf_counter() - started)
                store.close()
                size = tier.newest_path().stat().st_size
        finally:
            shutil.rmtree(memory_dir, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"state {size / 2**20:.0f} MiB, {repeats} repeats (medians): restore from memory {medians['memory']:.3f}s, "
          f"from blob {medians['blob']:.3f}s, ratio {medians['blob'] / medians['memory']:.1f}x (goal >= 10x)")
    print(f"{'per step':10s} {'step() s':>9s} {'iteration s':>12s} {'cost vs off s':>14s}")
    for case in ("off", "sync", "async"):
        print(f"{case:22s} {medians[f'hook_{case}']:9.3f} {medians[f'iteration_{case}']:12.3f} "
              f"{medians[f'iteration_{case}'] - medians['iteration_off']:14.3f}")
    return {"samples": samples, "medians": medians, "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write every sample here")
    parser.add_argument("--candidate", metavar="RDZV_CONF",
                        help="also measure these rendezvous settings (cases notice* and no-notice*), "
                             "side by side with the shipped ones")
    parser.add_argument("--cold", action="store_true",
                        help="also measure notice and no-notice with every worker started cold (cases notice-cold "
                             "and no-notice-cold: plain torchrun worker starts, no warm server)")
    parser.add_argument("--vanish", type=float, metavar="SECONDS",
                        help="also measure no-notice-vanish-30min: the node frozen (SIGSTOP, sockets open, as an "
                             "Azure VM that vanished) with torch's 30-minute collective timeout, killed SECONDS "
                             "later (what every job did before the launch set a timeout)")
    parser.add_argument("--cases", help="only these cases, comma-separated (default: all)")
    parser.add_argument("--state-mib", type=int, nargs="+",
                        help="instead: a survivor's restore of a state this size (or sizes), from memory vs from "
                             "blob, and the per-step cost of keeping it in memory")
    args = parser.parse_args()
    if args.state_mib:
        result = {mib: memory_vs_blob(mib, args.repeats) for mib in args.state_mib}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    if args.candidate:
        CASES["notice*"] = dict(CASES["notice"], rdzv=args.candidate)
        CASES["no-notice*"] = dict(CASES["no-notice"], rdzv=args.candidate)
    if args.cold:
        CASES["notice-cold"] = dict(CASES["notice"], warm=False)
        CASES["no-notice-cold"] = dict(CASES["no-notice"], warm=False)
    if args.vanish is not None:
        CASES["no-notice-vanish-30min"] = dict(CASES["no-notice"], vanish=args.vanish,
                                               timeout=TORCH_DEFAULT_TIMEOUT_SECONDS)
    if args.cases:
        for case in set(CASES) - set(args.cases.split(",")):
            del CASES[case]
    samples: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="elastictrain-recovery-") as tmp:
        work = Path(tmp)
        with start_azurite(work / "azurite") as blob, start_etcd(work / "etcd") as etcd, ScheduledEventsServer() as imds:
            blob.blob_service_client().create_container("bench")
            for rep in range(args.repeats):
                order = list(CASES)[rep % len(CASES):] + list(CASES)[:rep % len(CASES)]  # rotate: spread drift
                for case in order:
                    sample = run_case(case, blob, etcd, imds, work / "logs")
                    samples.append(sample)
                    print(f"  rep {rep + 1} {case:22s} outage {sample['outage_s']:6.2f}s  "
                          f"recovery {sample['recovery_s']:6.2f}s  restore {sample['restore_s']:6.2f}s  "
                          f"steps lost {sample['steps_lost']}", flush=True)
    print(f"\n{'case':22s} {'n':>2s} {'outage s':>9s} {'recovery s':>11s} {'restore s':>10s} {'steps lost':>11s}")
    medians = {}
    for case in CASES:
        rows = [s for s in samples if s["case"] == case]
        medians[case] = {k: statistics.median(r[k] for r in rows)
                         for k in ("outage_s", "recovery_s", "restore_s", "steps_lost")}
        m = medians[case]
        print(f"{case:22s} {len(rows):2d} {m['outage_s']:9.2f} {m['recovery_s']:11.2f} {m['restore_s']:10.2f} "
              f"{m['steps_lost']:11.1f}")
    ratio = None
    if "baseline" in medians and "notice" in medians:
        ratio = medians["baseline"]["outage_s"] / medians["notice"]["outage_s"]
        print(f"\nbaseline / notice outage: {ratio:.2f}x   (goal for notice: <= 10 s and 0 steps lost)")
    for slower, faster in (("no-notice-vanish", "no-notice"), ("no-notice-vanish-30min", "no-notice-vanish")):
        if slower in medians and faster in medians:
            print(f"{slower} / {faster} outage: "
                  f"{medians[slower]['outage_s'] / medians[faster]['outage_s']:.2f}x")
    if args.candidate:
        print(f"candidate {args.candidate}: notice* / notice outage "
              f"{medians['notice*']['outage_s'] / medians['notice']['outage_s']:.2f}")
    if args.cold:
        for case in ("notice", "no-notice"):
            print(f"{case}-cold / {case} outage (warm start's gain): "
                  f"{medians[f'{case}-cold']['outage_s'] / medians[case]['outage_s']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "medians": medians, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
