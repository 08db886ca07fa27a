#!/usr/bin/env python3
"""Benchmark (not a test): how long `az elastictrain --help` takes next to
`az vmss --help`, a built-in group of similar size, through the real az.

    .venv/bin/python scripts/bench/az_help.py            # table
    .venv/bin/python scripts/bench/az_help.py --json     # JSON on stdout, table on stderr
    .venv/bin/python scripts/bench/az_help.py -n 11

Both commands run interleaved (alternating which goes first in each round)
after one warm-up each, with an isolated AZURE_CONFIG_DIR (its command index
is built by the warm-up) and this checkout as a dev extension.  The ratio
ours/vmss is what to watch: near 1 means the extension adds no noticeable
start-up cost.  Needs `bash scripts/setup.sh` first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from harness.services import AzCli, check_dev_extension  # noqa: E402

COMMANDS = {
    "ours": ("elastictrain", "--help"),
    "vmss": ("vmss", "--help"),
}
MIN_RUNS = 5


def _runs(value: str) -> int:
    n = int(value)
    if n < MIN_RUNS:
        raise argparse.ArgumentTypeError(f"need at least {MIN_RUNS} runs per command")
    return n


def measure(runs: int, warmup: int = 1) -> dict:
    check_dev_extension()
    with tempfile.TemporaryDirectory(prefix="az-help-bench-") as config_dir:
        az = AzCli(config_dir)
        for _ in range(warmup):
            for args in COMMANDS.values():
                az(*args)
        samples: dict[str, list[float]] = {key: [] for key in COMMANDS}
        for i in range(runs):
            order = list(COMMANDS) if i % 2 == 0 else list(reversed(COMMANDS))
            for key in order:
                t0 = time.perf_counter()
                az(*COMMANDS[key])
                samples[key].append(time.perf_counter() - t0)
        az_path = az.az_path
    result = {
        "benchmark": "az_help",
        "runs": runs,
        "warmup": warmup,
        "az": os.path.relpath(az_path, REPO_ROOT) if az_path.startswith(str(REPO_ROOT)) else az_path,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "commands": {},
    }
    for key, values in samples.items():
        result["commands"][key] = {
            "argv": ["az", *COMMANDS[key]],
            "median_s": round(statistics.median(values), 4),
            "min_s": round(min(values), 4),
            "max_s": round(max(values), 4),
            "samples_s": [round(v, 4) for v in values],
        }
    ours, vmss = (result["commands"][k]["median_s"] for k in ("ours", "vmss"))
    result["ratio_median_ours_over_vmss"] = round(ours / vmss, 3)
    return result


def table(result: dict) -> str:
    rows = [("command", "median s", "min s", "max s", "n")]
    for stats in result["commands"].values():
        rows.append(
            (
                " ".join(stats["argv"]),
                f"{stats['median_s']:.3f}",
                f"{stats['min_s']:.3f}",
                f"{stats['max_s']:.3f}",
                str(len(stats["samples_s"])),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"ratio ours/vmss (medians): {result['ratio_median_ours_over_vmss']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--runs", type=_runs, default=7, help=f"runs per command (>= {MIN_RUNS}; default 7)")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout (the table goes to stderr)")
    args = parser.parse_args(argv)
    result = measure(args.runs)
    if args.json:
        print(table(result), file=sys.stderr)
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
