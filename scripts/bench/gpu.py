#!/usr/bin/env python3
"""Device script (not a test): the runtime's paths for a large CUDA state, in one go, JSON out (issue 33).

    .venv/bin/python scripts/bench/gpu.py --json out/gpu.json            # one GPU, a GPT-2-XL-sized state (~19 GB)
    .venv/bin/python scripts/bench/gpu.py --device cpu --tiny  # what tests/integration/test_gpu_bench.py runs

The state: 1.56 billion fp32 parameters (GPT-2 XL's count, as square bias-free linear layers) and AdamW's two
moments after one step: 18.7 GB, on ``--device``. ``--tiny``: a few MB. Phases, each timed on its own and
each failing alone (its error in the JSON):

* ``snapshot``: the memory tier (runtime/memory_tier.py ``MemoryTier``) keeps the state in node memory: the capture
  on the training thread (device-to-host copies queued on the copy stream, straight into the slot that CUDA
  page-locked, or into pinned buffers where it refuses: the blocking time), then the commit (the copies landed,
  checksummed, committed: the time to a committed copy, and its two parts: the device's copies landed, then the
  slot written and checksummed), and GB/s over both. The first capture makes and page-locks the first slot (or
  allocates the pinned buffers), the second the second slot; ``steady`` is the median of the rest.
* ``overhead``: training steps of the state's model (~1.2 s each on the device) with and without the memory
  tier keeping every step, interleaved: the median step each way and the overhead.
* ``heal``: a fresh process, from its start to its first optimizer step, with the state from this process's
  memory through the peer transfer (runtime/peer_transfer.py, as torchft's quorum drives it): per phase (imports,
  model and optimizer built on the device, the state received into them, loaded, the first step).
* ``readme_sigkill``: the README's script (scripts/bench/readme_loop.py, the two lines for a GPU with
  ``--device cuda``) as a one-node local job (torchrun agent, etcd, Azurite, warm starts); its worker SIGKILLed once it
  trains, restarted by torchrun, resumed from the node's memory: what ``evict simulate --wait`` reports (outage,
  restore and recovery seconds from the kill, steps lost) and where it restored from (memory, peer, blob). Needs etcd
  and Azurite (``bash scripts/setup.sh``).
* ``dcp`` (last: Azurite, one node process writing to local disk, sets its pace): a blob checkpoint (the
  Checkpointer: DCP into a local Azurite, the suite's harness/services.py) and its restore into a fresh state on
  the device: the training thread's stall, the save to committed, the restore, GB/s, and where the restored
  tensors are; first of a quarter of the state, then of the whole state when the quarter's pace says it ends
  before the watchdog. Needs Azurite (``bash scripts/setup.sh``); without it the phase fails alone.

A watchdog ends the script with code 124 after ``--timeout`` seconds (default 330), writing what it has. On a
GPU machine that reaches no package registry: scripts/bench/gpu_offline.py (pack here, run there).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

GPT2_XL_PARAMS = 1_557_611_200
SECRET = "gpu-bench"
KEY = "elastictrain"
# The heal's newcomer runs once per count of connections (runtime/peer_transfer.py CONNECTIONS first): one thread
# reading one socket and copying each chunk on to the GPU took 4.90 s for 18.7 GB on an H100 (3.8 GB/s, run c)
HEAL_CONNECTIONS = (1, 4)


def full_layers(tiny: bool) -> int:
    return 4 if tiny else round(GPT2_XL_PARAMS / 4096**2)


def build(device: str, tiny: bool, seed: int = 0, trained: bool = True, layers: int | None = None) -> dict[str, Any]:
    """Model and AdamW on ``device`` (``layers`` of the full state's); with ``trained``, one step taken (the
    moments exist)."""
    import torch

    torch.manual_seed(seed)
    width = 128 if tiny else 4096
    layers = layers or full_layers(tiny)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False, device=device) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if trained:
        step(model, optimizer, device, width)
    return {"model": model, "optimizer": optimizer}


def step(model: Any, optimizer: Any, device: str, width: int) -> None:
    import torch

    model(torch.randn(8, width, device=device)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def state_bytes(state: dict[str, Any]) -> int:
    from azext_elastictrain.runtime.replicas import state_bytes as of

    return of(state)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def snapshot(state: dict[str, Any], memory_dir: str, repeats: int) -> dict[str, Any]:  # pylint: disable=too-many-locals
    import torch

    from azext_elastictrain.runtime import entries, memory_tier

    flat = {k: v for k, v in entries.tree(state).flat.items() if isinstance(v, torch.Tensor)}
    size = sum(t.numel() * t.element_size() for t in flat.values())
    with tempfile.TemporaryDirectory(dir=memory_dir) as directory:
        tier = memory_tier.MemoryTier("gpu-bench", "run", directory)
        runs = []
        for i in range(repeats):
            # every tensor is a parameter or a moment: copied on the copy stream (runtime/memory.py decides so)
            # pylint: disable-next=cell-var-from-loop
            blocking, capture = timed(lambda: tier.capture(i + 1, 1, flat, aside=lambda t: t.is_cuda))
            # the commit's parts: the device's copies landing (the events the commit waits on first), then
            # the rest (pinned buffers into the slot, header, checksum, commit word)
            landed, _ = timed(lambda: [e.synchronize() for e in capture.events])  # pylint: disable=cell-var-from-loop
            committed, _ = timed(lambda: tier.commit(capture))  # pylint: disable=cell-var-from-loop
            total = blocking + landed + committed
            runs.append({"blocking_s": round(blocking, 6), "to_committed_s": round(total, 6),
                         "gb_per_s": round(size / 1e9 / total, 2), "copies_landed_s": round(blocking + landed, 6),
                         "slot_and_checksum_s": round(committed, 6)})
        copy = tier.read()
        assert copy is not None and copy.step == repeats, "the last step is not the committed copy"
        tier.discard()
    steady = runs[2:] or runs[1:] or runs  # the first capture allocates the pinned buffers, the second its slot
    return {"bytes": size, "first": runs[0], "runs": runs,
            "steady": {k: statistics.median(r[k] for r in steady) for k in runs[0]}}


# pylint: disable-next=too-many-locals
def overhead(state: dict[str, Any], device: str, tiny: bool, memory_dir: str, repeats: int) -> dict[str, Any]:
    """Training steps of the state's model (forward, backward, AdamW), the batch sized for a step of ~1.2 s, with
    and without the memory tier keeping every step (runtime/memory.py MemoryKeeper, as the Checkpointer drives
    it: captured on the training thread, committed by its thread), in interleaved blocks: the step's median
    each way. A step is timed to the training stream's end (its copy stream is not waited for)."""
    import torch

    from azext_elastictrain.runtime import memory_tier
    from azext_elastictrain.runtime.memory import MemoryKeeper

    model, optimizer = state["model"], state["optimizer"]
    width = model[0].in_features
    cuda = device.startswith("cuda")

    def train(rows: int) -> None:
        model(torch.randn(rows, width, device=device)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def settle() -> None:
        if cuda:
            torch.cuda.current_stream().synchronize()

    rows = 64 if tiny else 2048
    train(rows)
    settle()
    probe, _ = timed(lambda: (train(rows), settle()))
    if not tiny:
        rows = max(2048, min(65536, int(rows * 1.2 / probe)))
    times: dict[str, list[float]] = {"plain": [], "kept": []}
    with tempfile.TemporaryDirectory(dir=memory_dir) as directory:
        keeper = MemoryKeeper(memory_tier.MemoryTier("gpu-bench", "overhead", directory), writer=True)
        try:
            step = 0
            # both slots made (beside training, for a large device state: runtime/memory.py) and written once
            made = time.perf_counter()
            written = 0
            while written < 2 and step < 1000:
                step += 1
                train(rows)
                keeper.keep(step, state, 1)
                written += keeper.kept() == step  # kept (once the slots are made), into one slot then the other
            made = time.perf_counter() - made
            keeper.kept()
            for _ in range(repeats):
                for mode in ("plain", "kept"):
                    for _ in range(3):
                        step += 1
                        start = time.perf_counter()
                        train(rows)
                        if mode == "kept":
                            keeper.keep(step, state, 1)
                        settle()
                        times[mode].append(time.perf_counter() - start)
            keeper.kept()
        finally:
            keeper.close()
            keeper.tier.discard()
    plain, kept = statistics.median(times["plain"]), statistics.median(times["kept"])
    return {"rows": rows, "step_s": round(plain, 4), "step_kept_s": round(kept, 4), "slots_made_in_steps": step,
            "slots_made_s": round(made, 2),
            "overhead": round(kept / plain - 1, 4), "steps": {k: [round(t, 4) for t in v] for k, v in times.items()}}


def digest(state: dict[str, Any]) -> float:
    """A sum over the model's weights: equal states, equal digests (float64 on the host)."""
    return float(sum(p.double().sum().item() for p in state["model"].parameters()))


def dcp_sizes(state: dict[str, Any], device: str, tiny: bool, deadline: float,
              done: dict[str, Any]) -> dict[str, Any]:
    """The blob checkpoint of a quarter of the state (its first quarter of layers, trained the same way), then of
    the whole state when the quarter's pace says it ends in the time left (Azurite's pace is no GPU's)."""
    found: dict[str, Any] = {}
    done["dcp"] = found  # what the watchdog writes if the whole state runs out of time
    layers = max(1, full_layers(tiny) // 4)
    quarter = build(device, tiny, layers=layers)
    found["quarter"] = {"layers": layers, **dcp(quarter, device, tiny, layers)}
    del quarter
    pace = found["quarter"]["save_to_committed_s"] + found["quarter"]["restore_s"]
    needed = pace * full_layers(tiny) / layers * 1.3 + 10
    left = deadline - time.monotonic()
    if needed < left:
        found["full"] = {"layers": full_layers(tiny), **dcp(state, device, tiny, None)}
    else:
        found["full"] = {"skipped": f"the quarter's pace needs ~{needed:.0f} s for the whole state, {left:.0f} s "
                                    "left before the watchdog"}
    return found


# pylint: disable-next=too-many-locals
def dcp(state: dict[str, Any], device: str, tiny: bool, layers: int | None) -> dict[str, Any]:
    """A blob checkpoint (the Checkpointer: DCP into a local Azurite) of ``state``, restored into a fresh state on
    the device: the training thread's stall, the save to committed, the restore; where the restored tensors are."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # harness: the suite's Azurite
    from azure.storage.blob import ContainerClient

    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.runtime.checkpoint import Checkpointer
    from harness.services import start_azurite  # pylint: disable=import-error  # the checkout's, on sys.path

    size = state_bytes(state)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp, start_azurite(tmp) as azurite:
        with ContainerClient.from_connection_string(azurite.connection_string, "gpu-bench") as container:
            container.create_container()
        store = BlobStore.from_url(f"{azurite.blob_endpoint}/gpu-bench", connection_string=azurite.connection_string)
        try:
            ckpt = Checkpointer(store, "gpu", keep=1, verify=True, watcher=None, events=False)
            stall, _ = timed(lambda: ckpt.save(1, state))
            waited, _ = timed(ckpt.wait)
            ckpt.close()
            fresh = build(device, tiny, seed=2, trained=False, layers=layers)
            reader = Checkpointer(store, "gpu", keep=1, verify=True, watcher=None, events=False)
            restore_s, step_ = timed(lambda: reader.restore(fresh))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            reader.close()
        finally:
            store.close()
    moments = [t for s in fresh["optimizer"].state.values() for t in s.values() if t.dim() > 0]
    return {"bytes": size, "save_stall_s": round(stall, 4), "save_to_committed_s": round(stall + waited, 4),
            "save_gb_per_s": round(size / 1e9 / (stall + waited), 2), "restore_s": round(restore_s, 4),
            "restore_gb_per_s": round(size / 1e9 / restore_s, 2), "restored_step": step_,
            "restored_on": sorted({str(t.device) for t in [*fresh["model"].parameters(), *moments]}),
            "same_as_saved": abs(digest(fresh) - digest(state)) <= 1e-9 * max(1.0, abs(digest(state)))}


def readme_sigkill(device: str, memory_dir: str, deadline: float) -> dict[str, Any]:  # pylint: disable=too-many-locals
    """The README's script (scripts/bench/readme_loop.py, ``--device``) as a one-node local job (torchrun agent,
    etcd, Azurite, as ``job run --local`` starts a node); its worker SIGKILLed once it trains: torchrun starts
    it again and it resumes from the node's memory. The figures of ``evict simulate --wait``."""
    import psutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from azure.storage.blob import ContainerClient

    from azext_elastictrain.core import launch
    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.core.eventlog.recovery import follow_recovery
    # pylint: disable-next=import-error  # the checkout's harness, on sys.path
    from harness.elastic import JobConfig, Node, events_of, read_events, wait_for
    from harness.services import start_azurite, start_etcd  # pylint: disable=import-error

    script = Path(__file__).resolve().parent / "readme_loop.py"
    with tempfile.TemporaryDirectory(prefix="gpu-readme-") as tmp, start_azurite(tmp) as blob, \
            start_etcd(tmp) as etcd, tempfile.TemporaryDirectory(dir=memory_dir) as memory:
        with ContainerClient.from_connection_string(blob.connection_string, "bench") as container:
            container.create_container()
        job = JobConfig(name="gpu-readme", checkpoint_url=f"{blob.blob_endpoint}/bench/gpu-readme",
                        connection_string=blob.connection_string, etcd_endpoint=etcd.endpoint, min_nodes=1,
                        max_nodes=1, warm_start=True, progress_seconds=0.2, script=script,
                        script_args=["--device", device, "--step-delay", "0.02"],
                        extra_env={launch.ENV_MEMORY_DIR: memory})
        store = BlobStore.from_url(job.checkpoint_url, connection_string=blob.connection_string)
        node = Node(job, "node-a", Path(tmp) / "logs")
        try:
            def events() -> list[dict[str, Any]]:
                return read_events(store, store.prefix)

            wait_for(lambda: [e for e in events_of(events(), "progress") if e["step"] >= 20],
                     max(5.0, deadline - time.monotonic() - 30), "the README's script training")
            # the worker torchrun watches: with warm starts (the local default) its launcher, which the worker
            # forked from the node's warm server follows (runtime/warm.py), not that server
            workers = [p for p in node.tree() if p.pid != node.proc.pid
                       and any(part.endswith("readme_loop.py") for part in p.cmdline())
                       and "--serve" not in p.cmdline() and not any(c.pid != p.pid for c in p.children())]
            if len(workers) != 1:
                raise RuntimeError(f"expected one worker, found {[w.cmdline() for w in workers]}")
            killed = time.time()
            workers[0].kill()
            psutil.wait_procs(workers, timeout=10)
            found = follow_recovery(lambda _job: events(), job.name, {"node": "node-a", "evictedAt": killed},
                                    timeout=max(5.0, deadline - time.monotonic() - 10))
            after = [e for e in events_of(events(), "restored") if e["time"] > killed]
            found["restored_from"] = after[0].get("source") if after else None  # memory, peer or blob
            return found
        except Exception as ex:
            # the node's log (its agent's and workers' output) with the error: the JSON is all that comes back
            tail = node.log_path.read_text(errors="replace")[-4000:] if node.log_path.exists() else ""
            raise RuntimeError(f"{ex}\n--- {node.log_path.name}, its end:\n{tail}") from ex
        finally:
            node.stop()
            store.close()


def heal(state: dict[str, Any], device: str, tiny: bool, deadline: float) -> dict[str, Any]:
    """Serve ``state`` as a peer does; a fresh process takes it and trains its first step."""
    from azext_elastictrain.runtime import entries
    from azext_elastictrain.runtime.peer_transfer import PeerTransport
    from azext_elastictrain.runtime.state import capture_rng

    server = PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=300), secret=SECRET, bind="127.0.0.1")
    try:
        server.send_checkpoint([1], 1, {"user": {KEY: {"flat": entries.tree(state).flat, "rng": capture_rng()}},
                                        "torchft": {"step": 1, "batches_committed": 1}}, timedelta(seconds=300))
        mine = digest(state)
        runs = {}
        for connections in HEAL_CONNECTIONS:  # the transport's default first: the phases reported
            started = time.time()
            argv = [sys.executable, __file__, "--newcomer", server.metadata(), "--device", device, "--started",
                    repr(started), "--connections", str(connections)] + (["--tiny"] if tiny else [])
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=max(5.0, deadline - time.monotonic()), check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the newcomer failed ({done.returncode}): {done.stderr[-2000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["same_as_peer"] = abs(run.pop("digest") - mine) <= 1e-9 * max(1.0, abs(mine))
            runs[connections] = run
    finally:
        server.shutdown()
    result = dict(runs[HEAL_CONNECTIONS[0]])
    result["receive_s_by_connections"] = {str(c): r["phases_s"]["receive"] for c, r in runs.items()}
    result["same_as_peer"] = all(r["same_as_peer"] for r in runs.values())
    return result


def newcomer(url: str, device: str, tiny: bool, started: float,  # pylint: disable=too-many-locals
             connections: int = 1) -> None:
    """The fresh process: its phases, from its start (the parent's clock, same machine) to its first step."""
    phases: dict[str, float] = {}
    mark = started

    def phase(name: str) -> None:
        nonlocal mark
        now = time.time()
        phases[name] = round(now - mark, 4)
        mark = now

    phase("start")  # the interpreter up, this script read
    import torch
    phase("import_torch")

    from azext_elastictrain.runtime import entries
    from azext_elastictrain.runtime.peer_transfer import Destination, PeerTransport
    from azext_elastictrain.runtime.replicas import parameters_device
    phase("import_runtime")
    state = build(device, tiny, seed=1, trained=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    phase("build")
    client = PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=300), secret=SECRET, bind="127.0.0.1",
                           destination=lambda: Destination({"user": {KEY: {"flat": entries.tree(state).flat}}},
                                                           parameters_device(state["optimizer"])),
                           connections=connections)
    payload = client.recv_checkpoint(0, url, 1, timedelta(seconds=300))
    phase("receive")
    entries.tree(state).apply(payload["user"][KEY]["flat"])
    phase("load")
    weights = digest(state)
    width = state["model"][0].in_features
    step(state["model"], state["optimizer"], device, width)
    phase("first_step")
    client.shutdown()
    on = {str(t.device) for t in state["model"].parameters()}
    print(json.dumps({"phases_s": phases, "to_first_step_s": round(time.time() - started, 4),
                      "parameters_on": sorted(on), "digest": weights}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="a few MB of state (the suite's CPU run)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--timeout", type=float, default=330.0, help="seconds before the watchdog ends it (124)")
    parser.add_argument("--memory-dir", default="/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir())
    parser.add_argument("--repeats", type=int, default=4, help="snapshots (the first two make buffers and slots)")
    parser.add_argument("--phases", help="only these, comma-separated (default: every phase)")
    parser.add_argument("--newcomer", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.newcomer:
        newcomer(args.newcomer, args.device, args.tiny, args.started, args.connections)
        return 0
    deadline = time.monotonic() + args.timeout
    result: dict[str, Any] = {"device": args.device, "tiny": args.tiny, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "command": " ".join(["scripts/bench/gpu.py", *sys.argv[1:]]), "phases": {}}

    def emit() -> None:
        text = json.dumps(result, indent=None)
        print(text, flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2))

    def watchdog() -> None:
        result["timed_out_after_s"] = args.timeout
        emit()
        os._exit(124)  # pylint: disable=protected-access  # the documented way to end a process from a thread

    timer = threading.Timer(args.timeout, watchdog)
    timer.daemon = True
    timer.start()
    import torch

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            result["error"] = "no CUDA device"
            emit()
            return 2
        result["card"] = torch.cuda.get_device_name()
        result["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    result["torch"] = torch.__version__
    result["memory_dir_free_gb"] = round(shutil.disk_usage(args.memory_dir).free / 1e9, 1)
    seconds, state = timed(lambda: build(args.device, args.tiny))
    result["state"] = {"bytes": state_bytes(state), "build_s": round(seconds, 2)}
    # The blob checkpoint last: Azurite (one node process, local disk) may take most of what is left.
    phases: dict[str, Callable[[], Any]] = {
        "snapshot": lambda: snapshot(state, args.memory_dir, args.repeats),
        "overhead": lambda: overhead(state, args.device, args.tiny, args.memory_dir, 2),
        "heal": lambda: heal(state, args.device, args.tiny, deadline),
        "readme_sigkill": lambda: readme_sigkill(args.device, args.memory_dir, deadline),
        "dcp": lambda: dcp_sizes(state, args.device, args.tiny, deadline, result["phases"]),
    }
    for name, run in phases.items():
        if args.phases and name not in args.phases.split(","):
            continue
        try:
            result["phases"][name] = run()
        except Exception as ex:  # pylint: disable=broad-exception-caught  # each phase fails alone, in the JSON
            result["phases"][name] = {"error": f"{type(ex).__name__}: {ex}", "trace": traceback.format_exc()[-2000:]}
    timer.cancel()
    emit()
    return 1 if any(isinstance(p, dict) and "error" in p for p in result["phases"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
