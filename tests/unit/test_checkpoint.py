"""The facade's own part: its settings live on the collaborators that use them, read and set through it, and
its per-step hook sequences them. No storage is touched here (no save is due, no event log, no memory tier)."""
from __future__ import annotations

import pytest
import torch

from azext_elastictrain.core import launch
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.core.settings import RuntimeSettings
from azext_elastictrain.runtime import Checkpointer, ElasticSampler

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class NoContainer:
    """A container client that refuses every call but close(): the facade's own part touches no storage."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        raise AssertionError(f"a blob call ({name}) where none was expected")


def _checkpointer(recovery: str = launch.RECOVERY_RESTART) -> Checkpointer:
    return Checkpointer(BlobStore(NoContainer(), prefix="facade-job"), keep=4, interval_steps=5,
                        interval_seconds=None, hold_seconds=7.0, verify=False, watcher=None, events=False,
                        memory_tier=False, sigterm_wait_seconds=2.0, progress_seconds=3.0, thread_count=2,
                        grace_seconds=11.0, settings=RuntimeSettings(recovery=recovery))


@pytest.fixture
def ckpt():
    made = _checkpointer()
    yield made
    made.close()
    made.store.close()


@pytest.fixture
def in_process_ckpt():
    """A Checkpointer of the in-process mode (its loop is chosen as it is made; no replica group until it runs)."""
    made = _checkpointer(launch.RECOVERY_IN_PROCESS)
    yield made
    made.close()
    made.store.close()


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
        Checkpointer(BlobStore(NoContainer(), prefix="x"), keep=0, watcher=None, events=False, memory_tier=False)


def test_a_hand_written_loop_is_refused_in_the_in_process_mode(in_process_ckpt: Checkpointer) -> None:
    """A script's own loop calling step() has no step boundary for the per-step quorum: each node would train
    alone and write the job's checkpoints (seen with scripts/train_cifar10.py). It must fail, never train on."""
    ckpt = in_process_ckpt
    assert ckpt.in_process and ckpt.replica_rank is None
    with pytest.raises(RuntimeError, match=r"ckpt\.batches\(state, loader, epochs=E\)"):
        ckpt.step(1, {})
    assert ckpt.last_step is None


def test_the_mode_is_the_settings_chosen_once(ckpt: Checkpointer) -> None:
    """The recovery mode's loop is chosen as the Checkpointer is made (runtime/loops/): not an attribute to flip."""
    assert not ckpt.in_process and ckpt.replica_rank is None
    with pytest.raises(AttributeError):
        ckpt.in_process = True  # type: ignore[misc]


class _Rows(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("make", [
    lambda data: ElasticSampler(data, global_batch_size=4),
    lambda data: torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0),
    lambda data: torch.utils.data.DataLoader(data, batch_size=4),
], ids=["elastic-sampler", "distributed-sampler", "data-loader"])
def test_steps_refuses_a_state_with_data_in_the_in_process_mode(in_process_ckpt: Checkpointer, make) -> None:
    """Each node is a world of its own in this mode: a sampler or loader the loop does not slice by the step's
    quorum would hand every node the same samples (each trained once per node). Refused before anything runs."""
    ckpt = in_process_ckpt
    found = make(_Rows(16))
    state = {"model": torch.nn.Linear(2, 2), "data": {"nested": [found]}}
    refused = rf"holds data \({type(found).__name__}\).*ckpt\.batches\(state, loader, steps=N\)"
    with pytest.raises(ValueError, match=refused):
        ckpt.steps(state, total=3)
    assert ckpt.last_step is None


@pytest.mark.parametrize("nodes, workers, size, message", [
    ("1:2", "2", 64 + 3, r"final global batch of each epoch has 3 samples .* \(the job may run at 4 ranks\)"),
    ("2:3", "1", 64, r"global batch size 64 is not divisible by the world size 3: .*\(the job may run at 3 ranks\)"),
], ids=["empty-last-slice", "uneven-slices"])
def test_batches_refuses_a_sampler_some_world_of_the_job_cannot_serve(monkeypatch, nodes, workers, size,
                                                                      message) -> None:
    """Checked for every world the job's nodes range allows, before training: the sampler serves the job's first
    world, and a scale-up would hand a rank an empty slice of the epoch's last batch, or an uneven one."""
    monkeypatch.setenv(launch.ENV_NODES, nodes)  # the job's settings are read as the Checkpointer is made
    monkeypatch.setenv("LOCAL_WORLD_SIZE", workers)
    ckpt = Checkpointer(BlobStore(NoContainer(), prefix="x"), watcher=None, events=False, memory_tier=False)
    data = _Rows(size)
    sampler = ElasticSampler(data, global_batch_size=64)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    try:
        with pytest.raises(ValueError, match=message):
            next(iter(ckpt.batches({"data": sampler}, loader, epochs=1)))
        assert ckpt.last_step is None
    finally:
        ckpt.close()
