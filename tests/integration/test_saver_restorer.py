"""The blob save path and the restore orchestration alone (runtime/saving.py, runtime/restoring.py), on real
Azurite, in one process (the collectives are the identity there), without the Checkpointer around them."""
from __future__ import annotations

import pytest
import torch

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.errors import CheckpointError, FencedError
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.restoring import Restorer
from azext_elastictrain.runtime.saving import BlobSaver
from tests.support.states import adamw_replica, assert_first_steps_alike

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

JOB = "parts-job"


class FakeEvents:  # runtime/progress.py's EventLog interface
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict]] = []

    def emit(self, kind: str, **fields) -> None:
        self.emitted.append((kind, fields))

    def flush(self, timeout: float = 10.0) -> None:
        pass

    def close(self, timeout: float = 10.0) -> None:
        pass


def make_state(value: float) -> dict:
    return {"model": {"w": torch.full((64, 32), value)}, "meta": {"value": value}}


@pytest.fixture
def store(blob_store) -> BlobStore:
    return blob_store(JOB)


@pytest.fixture
def parts(store: BlobStore):
    events = FakeEvents()
    ranks = Collectives()
    reporter = Reporter(events, rank=0, world_size=1)  # type: ignore[arg-type]
    saver = BlobSaver(store, JOB, ranks, reporter, keep=2)
    restorer = Restorer(store, JOB, ranks, reporter)
    yield saver, restorer, events
    saver.close()


def steps_in(store: BlobStore) -> list[int]:
    return [c.step for c in catalog.list_checkpoints(store, JOB) if c.complete]


def test_a_background_save_commits_and_the_restorer_loads_it(parts, store) -> None:
    saver, restorer, events = parts
    saver.save(4, make_state(4.0), background=True, step_time=123.0)
    saver.wait()
    assert saver.last_saved_step == 4 and steps_in(store) == [4]
    state = make_state(0.0)
    restored = restorer.restore(state)
    assert (restored.step, restored.newest_blob, restored.durable_step) == (4, 4, 4)
    assert torch.equal(state["model"]["w"], torch.full((64, 32), 4.0)) and state["meta"] == {"value": 4.0}
    kinds = [kind for kind, _ in events.emitted]
    assert kinds == [progress.CHECKPOINT, progress.RESTORED]
    assert events.emitted[0][1]["step_time"] == 123.0 and events.emitted[1][1]["source"] == "blob"


def test_retention_keeps_the_newest_and_a_step_already_committed_is_not_saved_again(parts, store) -> None:
    saver, _, events = parts
    for step in (1, 2, 3):
        saver.save(step, make_state(float(step)), background=False)
    saver.save(3, make_state(99.0), background=False)  # the same step again: nothing written
    assert steps_in(store) == [2, 3]
    assert [f["step"] for kind, f in events.emitted if kind == progress.CHECKPOINT] == [1, 2, 3]


def test_the_restorer_passes_over_a_damaged_checkpoint_to_the_previous_one(parts, store) -> None:
    saver, restorer, _ = parts
    saver.save(1, make_state(1.0), background=False)
    saver.save(2, make_state(2.0), background=False)
    (newest,) = [c for c in catalog.list_checkpoints(store, JOB) if c.step == 2]
    data = max(newest.manifest.files, key=lambda f: f.size)  # the tensors' file
    store.delete([layout.checkpoint_prefix(JOB, 2) + data.path])
    state = make_state(0.0)
    restored = restorer.restore(state)
    assert (restored.step, restored.newest_blob) == (1, 1)
    assert state["meta"] == {"value": 1.0} and torch.equal(state["model"]["w"], torch.full((64, 32), 1.0))


def test_a_second_commit_of_a_step_is_fenced(parts, store) -> None:
    saver, _, _ = parts
    other = BlobSaver(store, JOB, Collectives(), Reporter(None, rank=0, world_size=1))
    try:
        other.save(5, make_state(5.0), background=False)
        with pytest.raises(FencedError):
            saver.save(5, make_state(6.0), background=False)
    finally:
        other.close()


def test_a_state_that_does_not_fit_the_checkpoint_is_a_clear_error(parts) -> None:
    saver, restorer, _ = parts
    saver.save(1, make_state(1.0), background=False)
    with pytest.raises(CheckpointError, match="does not fit the state"):
        restorer.restore({"model": {"w": torch.zeros(64, 32), "extra": torch.zeros(2)}, "meta": {"value": 0.0}})


def test_a_save_before_the_first_step_leaves_adamw_unstepped_on_both_sides(parts) -> None:
    """A checkpoint taken before the first optimizer step (a notice at the job's start, a save at step 0): torch's
    state-dict API makes a fresh optimizer's state by a step with zero gradients, so AdamW's first real step counted
    as its second, on the node that saved and on the one that resumed (its bias correction one step off: the first
    update x0.74). Both now take the step an uninterrupted run takes."""
    saver, restorer, _ = parts

    (saved, saved_opt), (resumed, resumed_opt), alone = adamw_replica(), adamw_replica(), adamw_replica()
    saver.save(0, {"model": saved, "optimizer": saved_opt}, background=False)
    assert not saved_opt.state
    restored = restorer.restore({"model": resumed, "optimizer": resumed_opt})
    assert restored.step == 0 and not resumed_opt.state
    assert_first_steps_alike([(saved, saved_opt), (resumed, resumed_opt)], alone)
