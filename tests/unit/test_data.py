"""ElasticSampler: exactly-once data across evictions, world-size changes and DataLoader prefetching.

The property tests simulate a job's ranks in one process: one sampler and one real DataLoader per
rank, iterated in lockstep (one global step = the ranks' slices joined in rank order). A checkpoint is
a sampler's ``state_dict``; an eviction throws away every loader (and what their workers prefetched)
and the steps trained after the last checkpoint; the next attempt, at a new world size, loads the
checkpoint into fresh samplers and trains those steps again. The final history keeps, for each
global step, its last attempt: the steps that ended in the final model.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings, strategies as st
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from azext_elastictrain.runtime import ElasticSampler


class IndexDataset(Dataset):
    """Sample ``i`` is the number ``i``: what a batch holds is which samples it trained."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


@dataclass(frozen=True)
class Job:
    size: int
    global_batch: int
    epochs: int
    seed: int
    shuffle: bool
    drop_last: bool


@dataclass(frozen=True)
class Attempt:
    world: int  # ranks of this attempt
    steps: int  # steps it trains before it is evicted
    checkpoint_after: int  # steps into the attempt at which it checkpoints (0: none of its own)


class Ranks:
    """One attempt's ranks: a sampler and a DataLoader iterator per rank, stepped together."""

    def __init__(self, job: Job, world: int, num_workers: int, checkpoint: dict | None):
        dataset = IndexDataset(job.size)
        self.samplers = [ElasticSampler(dataset, job.global_batch, world, rank, shuffle=job.shuffle,
                                        seed=job.seed, drop_last=job.drop_last) for rank in range(world)]
        for sampler in self.samplers:
            if checkpoint is not None:
                sampler.load_state_dict(checkpoint)
        self.loaders = [DataLoader(dataset, batch_sampler=s, num_workers=num_workers) for s in self.samplers]
        self.iterators: list | None = None

    @property
    def epoch(self) -> int:
        return self.samplers[0].epoch

    def next_global_batch(self, epochs: int) -> tuple[int, list[int]] | None:
        """(epoch, global batch) of the next step, moving on to the next epoch as each one ends."""
        while self.epoch < epochs:
            if self.iterators is None:
                for sampler in self.samplers:
                    sampler.set_epoch(self.epoch)  # the epoch it is in: keeps the restored position
                self.iterators = [iter(loader) for loader in self.loaders]
            slices = [next(it, None) for it in self.iterators]
            if all(s is None for s in slices):
                self.iterators = None
                for sampler in self.samplers:
                    sampler.set_epoch(sampler.epoch + 1)
                continue
            assert all(s is not None for s in slices), "ranks disagree on where the epoch ends"
            return self.epoch, [i for s in slices for i in s.tolist()]
        return None

    def trained(self) -> None:
        for sampler in self.samplers:
            sampler.advance()

    def checkpoint(self) -> dict:
        states = [s.state_dict() for s in self.samplers]
        assert all(s == states[0] for s in states), "ranks disagree on the position"
        return states[0]


def train(job: Job, attempts: list[Attempt], final_world: int, num_workers: int) -> dict[int, tuple[int, list[int]]]:
    """Run the job through ``attempts`` (each evicted), then to the end at ``final_world``: step -> (epoch, batch)."""
    history: dict[int, tuple[int, list[int]]] = {}
    checkpoint: tuple[int, dict] | None = None  # (step, sampler state) of the newest checkpoint
    for attempt in [*attempts, Attempt(final_world, steps=10**9, checkpoint_after=0)]:
        ranks = Ranks(job, attempt.world, num_workers, checkpoint[1] if checkpoint else None)
        step = checkpoint[0] if checkpoint else 0
        for done in range(1, attempt.steps + 1):
            drawn = ranks.next_global_batch(job.epochs)
            if drawn is None:
                break
            step += 1
            history[step] = drawn  # a retrained step replaces its lost attempt
            ranks.trained()
            if done == attempt.checkpoint_after:
                checkpoint = (step, ranks.checkpoint())
        del ranks  # the eviction: loaders, their workers and what they prefetched are gone
    return history


def assert_exactly_once(job: Job, history: dict[int, tuple[int, list[int]]]) -> None:
    assert sorted(history) == list(range(1, len(history) + 1)), "a step is missing"
    per_epoch: dict[int, list[int]] = {}
    for step in sorted(history):
        epoch, batch = history[step]
        per_epoch.setdefault(epoch, []).extend(batch)
    assert sorted(per_epoch) == list(range(job.epochs))
    trained_per_epoch = job.size - (job.size % job.global_batch if job.drop_last else 0)
    for epoch, samples in per_epoch.items():
        assert len(samples) == len(set(samples)) == trained_per_epoch, f"epoch {epoch}: a sample twice or never"
        assert set(samples) <= set(range(job.size))


@st.composite
def jobs(draw) -> Job:
    global_batch = draw(st.sampled_from([12, 24]))  # divisible by every world size 1..4
    size = draw(st.integers(min_value=24, max_value=90))  # at least one global batch per epoch
    drop_last = draw(st.booleans())
    # With drop_last=False a final global batch smaller than the world size is refused (tested below).
    assume(drop_last or size % global_batch == 0 or size % global_batch >= 4)
    return Job(size=size, global_batch=global_batch, epochs=draw(st.integers(1, 3)),
               seed=draw(st.integers(0, 2**31)), shuffle=draw(st.booleans()), drop_last=drop_last)


@st.composite
def attempts(draw, max_attempts: int) -> list[Attempt]:
    out = []
    for _ in range(draw(st.integers(0, max_attempts))):
        steps = draw(st.integers(0, 12))
        out.append(Attempt(world=draw(st.integers(1, 4)), steps=steps,
                           checkpoint_after=draw(st.integers(0, steps))))
    return out


def _check_elastic_matches_fixed(job: Job, schedule: list[Attempt], final_world: int, fixed_world: int,
                                 num_workers: int) -> None:
    elastic = train(job, schedule, final_world, num_workers)
    fixed = train(job, [], fixed_world, num_workers=0)
    assert_exactly_once(job, fixed)
    assert_exactly_once(job, elastic)
    assert elastic == fixed  # the same global batches, in the same order, at the same steps


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), schedule=attempts(max_attempts=5), final_world=st.integers(1, 4), fixed_world=st.integers(1, 4))
def test_every_sample_is_trained_once_per_epoch_across_evictions_without_workers(job, schedule, final_world,
                                                                                 fixed_world):
    _check_elastic_matches_fixed(job, schedule, final_world, fixed_world, num_workers=0)


# Worker processes take a while to start: few examples, but each one prefetches batches that the
# eviction throws away untrained, which is what the sampler's position must not count.
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=jobs(), schedule=attempts(max_attempts=2), final_world=st.integers(1, 4))
@example(  # mid-epoch evictions at 2 -> 1 -> 3 ranks, steps lost after each checkpoint, across an epoch end
    job=Job(size=60, global_batch=12, epochs=2, seed=7, shuffle=True, drop_last=False),
    schedule=[Attempt(world=2, steps=4, checkpoint_after=2), Attempt(world=1, steps=5, checkpoint_after=4)],
    final_world=3,
)
def test_every_sample_is_trained_once_per_epoch_across_evictions_with_prefetching_workers(job, schedule,
                                                                                          final_world):
    _check_elastic_matches_fixed(job, schedule, final_world, fixed_world=2, num_workers=2)


def test_prefetched_batches_do_not_move_the_position():
    dataset = IndexDataset(96)
    sampler = ElasticSampler(dataset, 12, num_replicas=2, rank=0, seed=5)
    drawn = []

    def counted():  # what the DataLoader takes from the sampler, in the main process
        for rank_slice in sampler:
            drawn.append(rank_slice)
            yield rank_slice

    class Counted:
        def __iter__(self):
            return counted()

        def __len__(self):
            return len(sampler)

    iterator = iter(DataLoader(dataset, batch_sampler=Counted(), num_workers=2, prefetch_factor=2))
    first = next(iterator).tolist()
    sampler.advance()
    assert len(drawn) > 1 and first == drawn[0]  # the workers fetched ahead of training
    assert sampler.state_dict()["consumed"] == 12  # one step trained, however many were prefetched
    del iterator


def test_the_epoch_order_is_distributed_samplers_and_rank_slices_join_into_the_global_batch():
    dataset = IndexDataset(48)
    for epoch in (0, 3):
        torch_order = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=11)
        torch_order.set_epoch(epoch)
        for world in (1, 2, 4):
            samplers = [ElasticSampler(dataset, 8, world, rank, seed=11) for rank in range(world)]
            for s in samplers:
                s.set_epoch(epoch)
            joined = [i for batches in zip(*samplers) for rank_slice in batches for i in rank_slice]
            assert joined == list(torch_order)


def test_a_global_batch_the_world_size_does_not_divide_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"global batch size 64 is not divisible by the world size 3"):
        ElasticSampler(IndexDataset(100), 64, num_replicas=3, rank=0)


def test_the_final_partial_batch_is_split_evenly_or_refused_when_a_rank_would_get_nothing():
    sampler_slices = [list(ElasticSampler(IndexDataset(30), 12, 2, rank, shuffle=False))[-1] for rank in range(2)]
    assert sampler_slices == [[24, 25, 26], [27, 28, 29]]
    uneven = [list(ElasticSampler(IndexDataset(29), 12, 2, rank, shuffle=False))[-1] for rank in range(2)]
    assert uneven == [[24, 25, 26], [27, 28]]
    with pytest.raises(ValueError, match=r"final global batch of each epoch has 1 samples .*world size 2"):
        ElasticSampler(IndexDataset(25), 12, num_replicas=2, rank=0)
    dropped = ElasticSampler(IndexDataset(25), 12, num_replicas=2, rank=0, drop_last=True)
    assert len(dropped) == 2 and dropped.samples_per_epoch == 24


def test_misuse_is_loud():
    dataset = IndexDataset(48)
    sampler = ElasticSampler(dataset, 12, seed=1)
    with pytest.raises(RuntimeError, match="only 0 batches were drawn"):
        sampler.advance()
    iterator = iter(sampler)
    next(iterator)
    with pytest.raises(RuntimeError, match="advance\\(\\) was never called"):
        sampler.state_dict()  # a loop that forgot advance() would checkpoint the epoch's start
    with pytest.raises(RuntimeError, match="advance\\(\\) was never called"):
        sampler.set_epoch(1)
    sampler.advance()
    state = sampler.state_dict()
    sampler.load_state_dict(state)
    with pytest.raises(RuntimeError, match="stale"):
        next(iterator)  # the old pass must not go on from a position that was replaced
    with pytest.raises(ValueError, match="dataset_size saved 48, now 50"):
        ElasticSampler(IndexDataset(50), 12, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed saved 1, now 2"):
        ElasticSampler(dataset, 12, seed=2).load_state_dict(state)


def test_set_epoch_resets_the_position_but_keeps_a_restored_one():
    dataset = IndexDataset(48)
    sampler = ElasticSampler(dataset, 12)
    sampler.load_state_dict({"epoch": 2, "consumed": 24, "dataset_size": 48, "seed": 0, "shuffle": 1})
    sampler.set_epoch(2)
    rest = list(sampler)
    assert len(sampler) == 2 and [i for b in rest for i in b] == sampler.order()[24:]  # the restored epoch's rest
    sampler.advance()
    sampler.advance()
    assert sampler.consumed == 48 and len(sampler) == 0
    sampler.set_epoch(3)
    assert sampler.consumed == 0 and len(list(sampler)) == 4


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # single-process DCP: supported
def test_the_state_round_trips_through_torch_distributed_checkpoint_into_another_world_size(tmp_path):
    import torch.distributed.checkpoint as dcp

    dataset = IndexDataset(96)
    saved = ElasticSampler(dataset, 24, num_replicas=2, rank=1, seed=9)
    saved.set_epoch(4)
    iterator = iter(saved)
    for _ in range(3):
        next(iterator)
        saved.advance()
    dcp.save({"data": saved}, checkpoint_id=str(tmp_path))

    restored = ElasticSampler(dataset, 24, num_replicas=3, rank=2, seed=9)
    dcp.load({"data": restored}, checkpoint_id=str(tmp_path))
    assert (restored.epoch, restored.consumed) == (4, 72)
    assert list(restored) == [restored.order(4)[72 + 16:96]]  # rank 2 of 3: the last third of the last batch


def test_after_a_stop_any_use_that_would_hand_out_or_skip_data_ends_the_process():
    """A stop (Checkpointer.step() returned True) saved the position; a loop that left only its inner loop
    must not start the next epoch (skipping the rest of this one) nor draw or advance another batch."""
    from azext_elastictrain.runtime import TrainingStopped

    dataset = IndexDataset(40)
    sampler = ElasticSampler(dataset, global_batch_size=8, seed=1)
    batches = iter(sampler)
    next(batches)
    sampler.advance()
    sampler.stop(1)
    assert sampler.stopped and sampler.consumed == 8
    for use in (lambda: sampler.set_epoch(1), lambda: sampler.set_epoch(0), sampler.advance,
                lambda: next(batches), lambda: iter(sampler),
                lambda: list(DataLoader(dataset, batch_sampler=sampler))):
        with pytest.raises(TrainingStopped) as stopped:
            use()
        assert stopped.value.code == 143 and stopped.value.step == 1
    assert (sampler.epoch, sampler.consumed) == (0, 8) and sampler.state_dict()["consumed"] == 8
