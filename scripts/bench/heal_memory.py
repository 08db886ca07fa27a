#!/usr/bin/env python3
"""Benchmark (not a test): the peak memory of a heal, on each side of the peer transfer (runtime/peer_transfer.py).

    .venv/bin/python scripts/bench/heal_memory.py                 # a ~300 MiB state (model + AdamW moments)
    .venv/bin/python scripts/bench/heal_memory.py --mib 100 --json out.json
    .venv/bin/python scripts/bench/heal_memory.py --connections 1   # the state over one connection (default: 4)

Two processes on loopback, each with the same model and AdamW (moments made by one step: a newcomer restores
from memory or blob before it heals; ``--fresh``: the receiver's optimizer without moments, which a heal makes,
with torch's state-dict API's temporary zero gradients).
The sender offers its state as torchft does (``send_checkpoint``
with ``{"user": {key: state}, "torchft": ...}``) and serves it; the receiver fetches it (``recv_checkpoint``)
and loads it as runtime/replicas.py does (the state tree's ``apply``), into the receiver's own tensors where
the transport takes a ``Destination``. Each side reports its resident set's peak over the heal, less its
resident set before it (Linux: the peak is reset through /proc/self/clear_refs, read as VmHWM). Run it against
another checkout (``PYTHONPATH=<checkout>``) to compare: an older transport without ``Destination`` is driven
the old way. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

SECRET = "heal-memory-bench"
KEY = "elastictrain"


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5", encoding="ascii")  # VmHWM := VmRSS
    return rss_kib("VmRSS")


def build(mib: int, trained: bool) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    width = 1024
    layers = max(1, round(mib * 2**20 / 3 / (width * width * 4)))  # weights + two moments = mib
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if trained:
        model(torch.randn(4, width)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"model": model, "optimizer": optimizer, "epoch": 3}


def transport(**kwargs: Any) -> Any:
    from azext_elastictrain.runtime.peer_transfer import PeerTransport

    accepted = inspect.signature(PeerTransport).parameters
    return PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=300), secret=SECRET, bind="127.0.0.1",
                         **{k: v for k, v in kwargs.items() if k in accepted})


def sender(mib: int) -> None:
    from azext_elastictrain.runtime import entries
    from azext_elastictrain.runtime.state import capture_rng

    state = build(mib, trained=True)
    base = reset_peak()
    server = transport()
    server.send_checkpoint([1], 1, {"user": {KEY: {"flat": entries.tree(state).flat, "rng": capture_rng()}},
                                    "torchft": {"step": 1, "batches_committed": 1}}, timedelta(seconds=300))
    print(json.dumps({"url": server.metadata()}), flush=True)
    sys.stdin.readline()  # the receiver has the state
    print(json.dumps({"peak_mib": (rss_kib("VmHWM") - base) / 1024}), flush=True)


def receiver(mib: int, url: str, fresh: bool, connections: int | None = None) -> dict[str, Any]:
    import torch

    from azext_elastictrain.runtime import entries

    state = build(mib, trained=not fresh)
    state_mib = sum(p.numel() * 4 for p in state["model"].parameters()) * 3 / 2**20
    base = reset_peak()

    def destination() -> Any:
        from azext_elastictrain.runtime.peer_transfer import Destination

        return Destination({"user": {KEY: {"flat": entries.tree(state).flat}}}, torch.device("cpu"))

    client = transport(destination=destination, **({} if connections is None else {"connections": connections}))
    start = time.monotonic()
    payload = client.recv_checkpoint(0, url, 1, timedelta(seconds=300))
    received = time.monotonic() - start
    entries.tree(state).apply(payload["user"][KEY]["flat"])  # what ReplicaGroup._load does
    del payload
    return {"state_mib": round(state_mib, 1), "receiver_optimizer": "fresh" if fresh else "restored",
            "receiver_peak_mib": round((rss_kib("VmHWM") - base) / 1024, 1), "receive_s": round(received, 3),
            "streams_into_local": "destination" in inspect.signature(type(client)).parameters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=300, help="the state's size: weights and two AdamW moments")
    parser.add_argument("--fresh", action="store_true",
                        help="the receiver's optimizer without moments (a newcomer that restored nothing first)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--connections", type=int, help="the receiver's connections (default: the transport's)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the sender's process
    args = parser.parse_args()
    if args.serve:
        sender(args.mib)
        return
    proc = subprocess.Popen(  # pylint: disable=consider-using-with  # killed in the finally below
        [sys.executable, __file__, "--serve", "--mib", str(args.mib)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = json.loads(proc.stdout.readline())["url"]
        result = receiver(args.mib, url, args.fresh, args.connections)
        result["connections"] = getattr(args, "connections", None) or "default"
        proc.stdin.write("done\n")
        proc.stdin.flush()
        result["sender_peak_mib"] = round(json.loads(proc.stdout.readline())["peak_mib"], 1)
    finally:
        proc.kill()
        proc.wait()
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
