"""The committed slices tests/support/readme_harness.py records in the in-process mode, and the exactly-once check
over them: every epoch's global batches, each trained once, in an uninterrupted run's order."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch


def read_slices(out: Path) -> list[dict]:
    return read_records(out, "slices-*.jsonl")


def read_records(out: Path, pattern: str) -> list[dict]:
    """The JSON lines of the files ``pattern`` names in ``out`` (a process killed mid-write leaves a last line cut
    short: skipped)."""
    records = []
    for path in out.glob(pattern):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                assert number == len(lines) - 1, f"{path.name}:{number + 1} is not JSON"  # a kill mid-write
    return records


def check_exactly_once(records: list[dict], epochs: int) -> int:
    """Every epoch's global batches, each trained once: the committed slices of each batch (its position in the
    epoch) join into it, at whatever layout the quorum had then. Returns the steps trained."""
    by_batch: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in records:
        by_batch[(r["epoch"], r["consumed"])].append(r)
    first = records[0]
    size, batch, seed = first["dataset_size"], first["global_batch"], first["seed"]
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for (epoch, consumed), slices in sorted(by_batch.items()):
        layouts = {s["ranks"] for s in slices}
        assert len(layouts) == 1, f"epoch {epoch} at {consumed}: committed at several layouts {slices}"
        assert sorted(s["rank"] for s in slices) == list(range(slices[0]["ranks"])), (epoch, consumed, slices)
        by_epoch[epoch].extend(i for s in sorted(slices, key=lambda s: s["rank"]) for i in s["ids"])
    for epoch, ids in by_epoch.items():
        order = torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        assert sorted(ids) == sorted(order[:size - size % batch]), f"epoch {epoch}: not each sample once"
        global_batches = [order[i:i + batch] for i in range(0, size - size % batch, batch)]
        trained = [ids[i:i + batch] for i in range(0, len(ids), batch)]
        assert [sorted(b) for b in trained] == [sorted(b) for b in global_batches], f"epoch {epoch}: out of order"
    assert sorted(by_epoch) == list(range(epochs)), sorted(by_epoch)
    return len(by_batch)
