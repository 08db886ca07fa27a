"""The memory tier's slots: a copy is read back only if it is committed, whole, of this job and this run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from azext_elastictrain.runtime import memory_tier
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


def tier(directory: Path, job: str = JOB, run: str = "run-1") -> memory_tier.MemoryTier:
    return memory_tier.MemoryTier(job, run, directory)


def at(raw: bytes | bytearray, where: int) -> int:
    """``where`` in a slot's bytes; a negative one from the end of its header (the room after it is no copy's)."""
    return where if where >= 0 else len(bytes(raw).rstrip(b"\0")) + where


def newest(memory: memory_tier.MemoryTier) -> Path:
    path = memory.newest_path()
    assert path is not None
    return path


def test_a_copy_reads_back_bit_for_bit(tmp_path: Path) -> None:
    written = tier(tmp_path).keep(7, 2, state(7))
    copy = tier(tmp_path).read()
    assert copy is not None and copy.step == 7 and copy.world_size == 2 and copy.checksum == written
    expected = state(7)
    assert set(copy.tensors) == set(expected)
    for key, tensor in expected.items():
        assert copy.tensors[key].dtype == tensor.dtype and torch.equal(copy.tensors[key], tensor), key


def test_copies_alternate_between_two_slots_and_the_newest_wins(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    for step in (7, 8, 9):
        memory.keep(step, 2, state(step))
        copy = memory.read()
        assert copy is not None and copy.step == step
        assert torch.equal(copy.tensors["model.w"], state(step)["model.w"])
    assert sorted(tmp_path.iterdir()) == sorted(memory.paths)  # two slots, nothing else left behind
    assert {tier(tmp_path)._read_slot(p).step for p in memory.paths} == {8, 9}  # the previous step stays whole


def test_a_crash_between_the_copy_and_its_commit_leaves_the_previous_step(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    memory.capture(8, 2, state(8))  # the training thread copied step 8; the writer dies before the commit
    copy = tier(tmp_path).read()  # a new process (the restarted worker) reads
    assert copy is not None and copy.step == 7
    assert torch.equal(copy.tensors["model.w"], state(7)["model.w"])


def test_a_crash_after_the_copy_overwrote_an_older_slot_leaves_the_newest(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(6, 2, state(6))
    memory.keep(7, 2, state(7))
    memory.capture(8, 2, state(8))  # overwrites step 6's slot, never commits
    copy = tier(tmp_path).read()
    assert copy is not None and copy.step == 7
    # and the next writer does not take the only whole slot: step 9 goes where step 8 was torn
    fresh = tier(tmp_path)
    fresh.capture(9, 2, state(9))
    assert tier(tmp_path).read().step == 7
    fresh_copy = fresh.read()
    assert fresh_copy is not None and fresh_copy.step == 7


def test_a_copy_from_an_abandoned_history_is_cleared_by_the_next_write(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(20, 2, state(20))  # a history that went on to step 20, then restored from blob at step 10
    fresh = tier(tmp_path)
    fresh.capture(11, 2, state(11))  # killed before its commit
    assert tier(tmp_path).read() is None  # never step 20 of the abandoned history


def clear_commit_word(raw: bytearray, _: int | None) -> None:
    raw[8:16] = bytes(8)  # as a capture clears it first: the data untouched, no copy


def tear_commit_word(raw: bytearray, _: int | None) -> None:
    raw[8] ^= 0x10  # it no longer matches its header's step


def flipper(where: int):  # type: ignore[no-untyped-def]
    def flip(raw: bytearray, chunk: int | None) -> None:
        assert chunk is None or at(raw, -1) > 3 * chunk, "the copy spans several chunks"
        raw[at(raw, where)] ^= 0x40
    flip.__name__ = f"flip_at_{where}"
    return flip


@pytest.mark.parametrize("chunk", [None, 256])  # 256: the copy in several chunks, hashed on several threads
@pytest.mark.parametrize("damage", [clear_commit_word, tear_commit_word,
                                    *(flipper(w) for w in (0, 20, 100, 700, -200, -1))], ids=lambda d: d.__name__)
def test_a_damaged_copy_is_refused(tmp_path: Path, damage, chunk: int | None,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if chunk is not None:
        monkeypatch.setattr(memory_tier, "CHUNK", chunk)
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    assert memory.read() is not None
    path = newest(memory)
    raw = bytearray(path.read_bytes())
    damage(raw, chunk)
    path.write_bytes(raw)
    assert memory.read() is None


def test_a_truncated_copy_is_refused(tmp_path: Path) -> None:
    memory = tier(tmp_path)
    memory.keep(7, 2, state(7))
    path = newest(memory)
    raw = path.read_bytes()
    path.write_bytes(raw[:raw.rindex(b'{"format"') + 10])  # its end within the header
    assert memory.read() is None


def test_a_slot_is_mapped_once_while_its_step_gains_digits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = tier(tmp_path)
    sized: list[int] = []
    fallocate = os.posix_fallocate
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, at, n: (sized.append(n), fallocate(fd, at, n))[1])
    for step in (8, 9, 10, 11, 99, 100, 101, 1000, 1001):
        memory.keep(step, 2, state(8))
    assert len(sized) == 2, "each slot sized (and page-locked for a device) once, not again at 10, 100, 1000"
    copy = memory.read()
    assert copy is not None and copy.step == 1001


def test_a_copy_from_another_job_is_refused(tmp_path: Path) -> None:
    other = tier(tmp_path, job="jobs/beta")
    other.keep(9, 2, state(9))
    mine = tier(tmp_path)
    newest(other).rename(mine.paths[0])  # even where this job's copy belongs
    assert mine.read() is None


def test_a_copy_from_an_earlier_run_of_the_same_job_is_refused(tmp_path: Path) -> None:
    tier(tmp_path, run="run-1").keep(9, 2, state(9))
    assert tier(tmp_path, run="run-2").read() is None
    assert tier(tmp_path, run="run-1").read() is not None


def test_sharded_tensors_are_not_replicated() -> None:
    assert memory_tier.is_replicated({"a": torch.zeros(2), "b": 3})

    class Shard(torch.Tensor):  # stands for a tensor subclass (DTensor, ShardedTensor): one rank's part
        pass

    assert not memory_tier.is_replicated({"a": torch.zeros(2).as_subclass(Shard)})


def test_the_memory_tier_is_on_by_default_and_can_be_turned_off() -> None:
    memory = memory_tier.MemoryTier.from_env(JOB, {"TORCHELASTIC_RUN_ID": "r", "ELASTICTRAIN_MEMORY_DIR": "/x"})
    assert memory is not None and memory.run_id == "r" and all(str(p.parent) == "/x" for p in memory.paths)
    assert memory_tier.MemoryTier.from_env(JOB, {"ELASTICTRAIN_MEMORY_TIER": "on"}) is not None
    for off in ("off", "OFF", "0", "false"):
        assert memory_tier.MemoryTier.from_env(JOB, {"ELASTICTRAIN_MEMORY_TIER": off}) is None
