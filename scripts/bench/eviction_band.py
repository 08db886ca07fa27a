"""Goodput and cost per committed step at an eviction rate, from the per-event costs a run of outage.py measured.

    .venv/bin/python scripts/bench/eviction_band.py --outages out.json [--rate 0.2 --rate 30] [--nodes 2 4 8 16]
        [--step-seconds 1.0] [--price 1.396]

Computed, not run: a job of N nodes at a rate of R evictions per node-hour loses N x R evictions an hour, each
without notice (Azure's worst case: the VM vanishes) and each followed by its capacity coming back. One eviction
costs the whole job the vanish's outage (no node trains) and the scale-up's (the survivors' pause while the
newcomer is admitted), plus the steps it lost. The smaller world between the two trains at its own size: the
node-hours the evicted VM no longer bills are not counted as lost. Goodput = 1 - N x R x (vanish + scale-up + lost
x step) / 3600, over node-time; cost per committed step = N x price / (3600 / step x goodput).

The outages are the medians of each mode of outage.py's ``--json`` (its in-process/aks and in-process/aks-unwatched
modes: AKS's timeouts, with and without the quorum's watch), at the node count they were measured at, used for
every N given (the in-process outages do not grow with the world: docs/benchmarks.md). 0.2 evictions per
node-hour is the rate issue 31 names for Azure's worst published band; 30 is the stress rate of goodput.py (one
eviction a minute on 2 nodes). ``--price``: the Spot price of one node an hour (USD; e.g. the price front's
Standard_NC40ads_H100_v5 in eastus, 1.396, tests/support/prices_server.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def per_event(samples: list[dict], mode: str) -> dict[str, float]:
    """The median vanish and scale-up outages (seconds) and steps lost per vanish of ``mode``'s samples."""
    rows = [s for s in samples if s["mode"] == mode]
    vanish = [x for r in rows for x in r["vanish_outage_s"] if x is not None]
    scale_up = [x for r in rows for x in r["scale-up_outage_s"] if x is not None]
    lost = [x for r in rows for x in r["vanish_lost"] if x is not None]
    if not vanish or not scale_up:
        raise SystemExit(f"{mode}: no vanish or scale-up measured in the file")
    return {"vanish": statistics.median(vanish), "scale_up": statistics.median(scale_up),
            "lost": statistics.median(lost) if lost else 0.0, "events": len(vanish)}


def goodput(nodes: int, rate: float, cost: dict[str, float], step_seconds: float) -> float:
    seconds_per_eviction = cost["vanish"] + cost["scale_up"] + cost["lost"] * step_seconds
    return max(0.0, 1.0 - nodes * rate * seconds_per_eviction / 3600.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--outages", required=True, help="outage.py's --json file")
    parser.add_argument("--rate", type=float, action="append", help="evictions per node-hour (default: 0.2 and 30)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--step-seconds", type=float, default=1.0, help="one training step (default 1 s)")
    parser.add_argument("--price", type=float, help="one node's Spot price an hour, USD")
    args = parser.parse_args()
    samples = json.loads(Path(args.outages).read_text(encoding="utf-8"))["samples"]
    modes = sorted({s["mode"] for s in samples})
    costs = {mode: per_event(samples, mode) for mode in modes}
    for mode, cost in costs.items():
        print(f"{mode}: vanish {cost['vanish']:.2f} s, scale-up {cost['scale_up']:.2f} s, {cost['lost']:g} steps "
              f"lost (medians of {cost['events']} events)")
    print(f"\n{'rate /node-h':>12s} {'nodes':>5s} " + " ".join(f"{m:>26s}" for m in modes)
          + ("  undisturbed" if args.price is not None else ""))
    for rate in args.rate or [0.2, 30.0]:
        for nodes in args.nodes:
            cells = []
            for mode in modes:
                kept = goodput(nodes, rate, costs[mode], args.step_seconds)
                cell = f"{kept:.5f}"
                if args.price is not None and kept > 0:
                    per_step = nodes * args.price / (3600.0 / args.step_seconds * kept)
                    cell += f" ${per_step:.6f}/step"
                cells.append(f"{cell:>26s}")
            undisturbed = f"  ${nodes * args.price * args.step_seconds / 3600.0:.6f}/step" if args.price else ""
            print(f"{rate:12g} {nodes:5d} " + " ".join(cells) + undisturbed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
