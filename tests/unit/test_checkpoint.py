"""The facade's own part: its settings live on the collaborators that use them, read and set through it, and
its per-step hook sequences them. No storage is touched here (no save is due, no event log, no memory tier)."""
from __future__ import annotations

import pytest

from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime import Checkpointer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class NoContainer:
    """A container client that refuses every call but close(): the facade's own part touches no storage."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        raise AssertionError(f"a blob call ({name}) where none was expected")


@pytest.fixture
def ckpt():
    store = BlobStore(NoContainer(), prefix="facade-job")
    made = Checkpointer(store, keep=4, interval_steps=5, interval_seconds=None, hold_seconds=7.0, verify=False,
                        watcher=None, events=False, memory_rescue=False, sigterm_wait_seconds=2.0,
                        progress_seconds=3.0, thread_count=2, grace_seconds=11.0)
    yield made
    made.close()
    store.close()


def test_settings_are_read_and_set_through_the_facade(ckpt: Checkpointer) -> None:
    assert (ckpt.keep, ckpt.interval_steps, ckpt.interval_seconds, ckpt.hold_seconds, ckpt.verify,
            ckpt.sigterm_wait_seconds, ckpt.progress_seconds, ckpt.thread_count, ckpt.grace_seconds) == \
        (4, 5, None, 7.0, False, 2.0, 3.0, 2, 11.0)
    assert (ckpt.job_prefix, ckpt.rank, ckpt.world_size, ckpt.distributed) == ("facade-job", 0, 1, False)
    ckpt.interval_steps = 2
    assert ckpt._policy.due(4) and not ckpt._policy.due(3)  # pylint: disable=protected-access
    ckpt.keep = 9
    assert ckpt._saver.keep == 9  # pylint: disable=protected-access


def test_the_step_hook_records_the_step_and_trains_on(ckpt: Checkpointer) -> None:
    ckpt.interval_steps = None
    assert ckpt.step(3, {}) is False
    assert ckpt.last_step == 3 and ckpt.stopped_at is None
    assert ckpt.kept_in_memory() is None and ckpt.memory_step is None and ckpt.last_saved_step is None
    assert not ckpt.finished


def test_a_keep_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="keep must be at least 1"):
        Checkpointer(BlobStore(NoContainer(), prefix="x"), keep=0, watcher=None, events=False, memory_rescue=False)


def test_a_hand_written_loop_is_refused_in_the_in_process_mode(ckpt: Checkpointer) -> None:
    """A script's own loop calling step() has no step boundary for the per-step quorum: each node would train
    alone and write the job's checkpoints (seen with scripts/train_cifar10.py). It must fail, never train on."""
    ckpt.in_process = True
    with pytest.raises(RuntimeError, match=r"ckpt\.batches\(state, loader, epochs=E\)"):
        ckpt.step(1, {})
    assert ckpt.last_step is None
