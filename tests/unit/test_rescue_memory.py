"""The memory tier's file: a copy is read back only if it is whole, of this job and this run."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from azext_elastictrain.runtime import rescue
from azext_elastictrain.runtime.state import json_tensor

JOB = "jobs/alpha"


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "model.w": torch.randn(33, 7, generator=g),
        "model.h": torch.randn(5, generator=g).to(torch.bfloat16),
        "optim.state.0.step": torch.tensor(float(step)),
        "meta": json_tensor({"step": step}, "meta"),
        "empty": torch.zeros(0, 3),
    }


def tier(directory: Path, job: str = JOB, run: str = "run-1") -> rescue.MemoryTier:
    return rescue.MemoryTier(job, run, directory)


def test_a_copy_reads_back_bit_for_bit(tmp_path: Path) -> None:
    written = tier(tmp_path).keep(7, 2, state(7))
    copy = tier(tmp_path).read()
    assert copy is not None and copy.step == 7 and copy.world_size == 2 and copy.checksum == written
    expected = state(7)
    assert set(copy.tensors) == set(expected)
    for key, tensor in expected.items():
        assert copy.tensors[key].dtype == tensor.dtype and torch.equal(copy.tensors[key], tensor), key


def test_a_newer_copy_replaces_the_older_one_whole(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    memory.keep(8, 2, state(8))
    copy = memory.read()
    assert copy is not None and copy.step == 8
    assert torch.equal(copy.tensors["model.w"], state(8)["model.w"])
    assert list(tmp_path.iterdir()) == [memory.path]  # no temporary file left behind


@pytest.mark.parametrize("where", [0, 20, -200, -1])
def test_a_corrupted_copy_is_refused(tmp_path: Path, where: int) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    raw = bytearray(memory.path.read_bytes())
    raw[where] ^= 0x40
    memory.path.write_bytes(raw)
    assert memory.read() is None


def test_a_truncated_copy_is_refused(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    memory.path.write_bytes(memory.path.read_bytes()[:-100])
    assert memory.read() is None


def test_a_copy_from_another_job_is_refused(tmp_path: Path) -> None:
    other = tier(tmp_path, job="jobs/beta")
    other.keep(9, 2, state(9))
    mine = tier(tmp_path)
    other.path.rename(mine.path)  # even where this job's copy belongs
    assert mine.read() is None


def test_a_copy_from_an_earlier_run_of_the_same_job_is_refused(tmp_path: Path) -> None:
    tier(tmp_path, run="run-1").keep(9, 2, state(9))
    assert tier(tmp_path, run="run-2").read() is None
    assert tier(tmp_path, run="run-1").read() is not None


def test_a_writer_killed_mid_write_leaves_the_previous_copy(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    half = memory.path.read_bytes()[:1000]
    memory.path.with_name(memory.path.name + ".123.tmp").write_bytes(half)  # what a killed writer leaves
    copy = memory.read()
    assert copy is not None and copy.step == 7


def test_sharded_tensors_are_not_replicated() -> None:
    assert rescue.is_replicated({"a": torch.zeros(2), "b": 3})

    class Shard(torch.Tensor):  # stands for a tensor subclass (DTensor, ShardedTensor): one rank's part
        pass

    assert not rescue.is_replicated({"a": torch.zeros(2).as_subclass(Shard)})


def test_memory_rescue_is_opt_in() -> None:
    assert rescue.MemoryTier.from_env(JOB, {}) is None  # off by default: its per-step copy is synchronous
    assert rescue.MemoryTier.from_env(JOB, {"ELASTICTRAIN_MEMORY_RESCUE": "off"}) is None
    memory = rescue.MemoryTier.from_env(JOB, {"TORCHELASTIC_RUN_ID": "r", "ELASTICTRAIN_MEMORY_DIR": "/x",
                                              "ELASTICTRAIN_MEMORY_RESCUE": "on"})
    assert memory is not None and memory.run_id == "r" and str(memory.path.parent) == "/x"
