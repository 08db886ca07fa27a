"""CheckingLoadPlanner: the proof that every key was loaded can fail, and key mismatches name the keys."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.planner import LoadPlan

from azext_elastictrain.runtime.planners import CheckingLoadPlanner, StateMismatch, TensorSavePlanner

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class SkippingReader(FileSystemReader):
    """A storage layer that silently drops the reads of one key."""

    def __init__(self, path, skip: str) -> None:
        super().__init__(path)
        self.skip = skip

    def read_data(self, plan: LoadPlan, planner):
        kept = [item for item in plan.items if item.dest_index.fqn != self.skip]
        return super().read_data(LoadPlan(kept, plan.storage_data, plan.planner_data), planner)


@pytest.fixture
def saved(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"a": torch.ones(3), "b": torch.arange(4)},
                 storage_writer=FileSystemWriter(tmp_path), planner=TensorSavePlanner(), no_dist=True)
    return tmp_path


def test_a_key_the_reader_skipped_is_reported_not_loaded(saved) -> None:
    planner = CheckingLoadPlanner(free=set())
    state = {"a": torch.zeros(3), "b": torch.zeros(4, dtype=torch.int64)}
    dcp.load(state, storage_reader=SkippingReader(saved, skip="b"), planner=planner, no_dist=True)
    assert planner.not_loaded() == {"b"}
    assert torch.equal(state["a"], torch.ones(3))


def test_everything_read_leaves_nothing_not_loaded(saved) -> None:
    planner = CheckingLoadPlanner(free=set())
    state = {"a": torch.zeros(3), "b": torch.zeros(4, dtype=torch.int64)}
    dcp.load(state, storage_reader=FileSystemReader(saved), planner=planner, no_dist=True)
    assert planner.not_loaded() == set()
    assert torch.equal(state["b"], torch.arange(4))


@pytest.mark.parametrize("state, message", [
    ({"a": torch.zeros(3)}, "the checkpoint has keys the state lacks: b"),
    ({"a": torch.zeros(3), "b": torch.zeros(4, dtype=torch.int64), "c": torch.zeros(1)},
     "the state has keys the checkpoint lacks: c"),
])
def test_keys_in_only_one_of_state_and_checkpoint_are_named(saved, state, message) -> None:
    with pytest.raises(CheckpointException) as raised:  # DCP wraps each rank's error
        dcp.load(state, storage_reader=FileSystemReader(saved), planner=CheckingLoadPlanner(free=set()),
                 no_dist=True)
    causes = [f[0] if isinstance(f, tuple) else f for f in raised.value.failures.values()]
    assert any(isinstance(c, StateMismatch) and message in str(c) for c in causes), raised.value
