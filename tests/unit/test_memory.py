"""The memory tier's driver alone, over the real tier (runtime/memory_tier.py) in a temporary directory."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from azext_elastictrain.runtime import entries, memory_tier
from azext_elastictrain.runtime.memory import MemoryKeeper


def state(value: float) -> dict:
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return {"model": model, "meta": {"epoch": 2}}


def tier(directory: Path) -> memory_tier.MemoryTier:
    return memory_tier.MemoryTier("job-a", "run-1", directory, node="node-0")


def test_the_writer_keeps_each_completed_step_and_the_node_reads_the_newest(tmp_path: Path) -> None:
    keeper = MemoryKeeper(tier(tmp_path), writer=True)
    try:
        keeper.keep(1, state(1.0), world_size=2)
        keeper.keep(2, state(2.0), world_size=2)  # waits for step 1's commit first: at most one in flight
        assert keeper.kept() == 2 and keeper.memory_step == 2
        copy = MemoryKeeper(tier(tmp_path), writer=False).read()  # another worker of the node
        assert copy is not None and (copy.step, copy.world_size) == (2, 2)
        assert torch.equal(copy.tensors["model.weight"], torch.full((3, 4), 2.0))
        assert entries.STEP_KEY in copy.tensors
    finally:
        keeper.close()


def test_a_worker_that_is_not_the_nodes_writer_keeps_nothing(tmp_path: Path) -> None:
    keeper = MemoryKeeper(tier(tmp_path), writer=False)
    keeper.keep(1, state(1.0), world_size=1)
    assert not keeper.writer and keeper.kept() is None and keeper.read() is None


def test_no_room_turns_the_tier_off_for_this_worker_and_training_goes_on(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the tier's directory should be")
    keeper = MemoryKeeper(tier(blocked), writer=True)
    keeper.keep(1, state(1.0), world_size=1)  # OSError inside: logged, not raised
    assert not keeper.writer and keeper.kept() is None
    keeper.keep(2, state(2.0), world_size=1)
    assert keeper.kept() is None


def test_a_state_it_cannot_flatten_is_skipped_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keeper = MemoryKeeper(tier(tmp_path), writer=True)
    try:
        keeper.keep(1, {"model": state(1.0)["model"], "bad": object()}, world_size=1)
        assert keeper.kept() is None and keeper.writer
        assert "could not keep step 1 in memory" in caplog.text
    finally:
        keeper.close()


def test_discard_frees_the_nodes_copy(tmp_path: Path) -> None:
    keeper = MemoryKeeper(tier(tmp_path), writer=True)
    try:
        keeper.keep(3, state(3.0), world_size=1)
        keeper.discard()
        assert keeper.read() is None
    finally:
        keeper.close()
