"""The user's loop against a real Azurite, in one process: a stop (a real SIGTERM, as torchrun sends it to
re-form the job) is never the end of training, whatever shape the loop has.

``Checkpointer.steps()`` / ``batches()``: the loop restores, trains to its total and then records the job
finished; a stop ends the process (``TrainingStopped``, exit code 143) and the next start resumes from the
stop's step. The loop of the older README (``if ckpt.step(...): break`` then ``ckpt.done(...)``, and the data
snippet whose ``break`` leaves only the inner loop) may not train, save or finish after the stop either.
"""
from __future__ import annotations

import os
import signal
import uuid

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.core.eventlog.events import read_events
from azext_elastictrain.runtime import Checkpointer, ElasticSampler, TrainingStopped
from azext_elastictrain.runtime.preemption import PreemptionWatcher

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

SIZE, BATCH = 40, 8  # 5 global batches per epoch


class IndexDataset(Dataset):
    """Sample ``i`` is the number ``i``: a batch says which samples it holds."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> int:
        return index


@pytest.fixture
def store(blob_store) -> BlobStore:
    # A job name of its own: the memory tier's copies (one folder for the session) are per job.
    return blob_store(f"loop-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def open_checkpointer(store: BlobStore):
    """A Checkpointer whose watcher takes this process's SIGTERM, as a worker's does."""
    made: list[Checkpointer] = []
    previous = signal.getsignal(signal.SIGTERM)

    def make(**kwargs) -> Checkpointer:
        watcher = PreemptionWatcher(vm_name=None, events_url=None, handle_sigterm=True)
        made.append(Checkpointer(store, watcher=watcher, async_save=False, **kwargs))
        return made[-1]

    yield make
    for ckpt in made:
        ckpt.close()
    signal.signal(signal.SIGTERM, previous)


def _sigterm() -> None:
    """What torchrun does to every worker when a node joins: a real SIGTERM to this process."""
    os.kill(os.getpid(), signal.SIGTERM)


def _state() -> dict:
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "count": 0}


def _train(state: dict) -> None:
    loss = state["model"](torch.ones(4, 2)).pow(2).mean()
    state["optimizer"].zero_grad()
    loss.backward()
    state["optimizer"].step()
    state["count"] += 1


def _kinds(store: BlobStore, kind: str) -> list[dict]:
    return [e for e in read_events(store, store.prefix) if e["event"] == kind]


def test_steps_trains_to_its_total_then_finishes_and_a_rerun_trains_nothing(open_checkpointer, store) -> None:
    state = _state()
    ckpt = open_checkpointer(interval_steps=2)
    trained = []
    for step in ckpt.steps(state, total=5, samples=4):
        _train(state)
        ckpt.report(loss=1.5)
        trained.append(step)
    assert trained == [1, 2, 3, 4, 5] and ckpt.finished and state["count"] == 5
    (finished,) = _kinds(store, "finished")
    assert (finished["step"], finished["total"]) == (5, 5)
    assert _kinds(store, "progress")[0]["metrics"] == {"loss": 1.5}

    again = _state()
    rerun = open_checkpointer()
    assert list(rerun.steps(again, total=5)) == [] and rerun.finished and again["count"] == 5


def test_a_stop_ends_the_steps_loop_and_the_process_and_the_next_start_resumes_there(
        open_checkpointer, store) -> None:
    state = _state()
    ckpt = open_checkpointer(interval_steps=100)
    trained, after_loop = [], []
    with pytest.raises(TrainingStopped) as stopped:
        for step in ckpt.steps(state, total=10):
            _train(state)
            trained.append(step)
            if step == 3:
                _sigterm()
        after_loop.append("ran")  # what a script does after the loop: never after a stop
    assert stopped.value.code == 143 and stopped.value.step == 3 and not ckpt.finished
    assert trained == [1, 2, 3] and after_loop == []
    assert _kinds(store, "finished") == [] and _kinds(store, "interrupted")[-1]["step"] == 3

    resumed = _state()
    ckpt = open_checkpointer()
    steps = []
    for step in ckpt.steps(resumed, total=10):
        _train(resumed)
        steps.append(step)
    assert steps == list(range(4, 11)) and resumed["count"] == 10 and ckpt.finished
    assert [e["step"] for e in _kinds(store, "finished")] == [10]


def test_the_old_loop_calling_done_after_a_stop_neither_saves_nor_finishes(open_checkpointer, store) -> None:
    """`if ckpt.step(...): break` then `ckpt.done(step, state)`, the README's loop before: done() after the stop
    ends the process instead of committing the step as the final one and recording the job finished."""
    state = _state()
    ckpt = open_checkpointer(interval_steps=100)
    step = ckpt.restore(state) or 0
    with pytest.raises(TrainingStopped):
        while step < 10:
            step += 1
            _train(state)
            if step == 4:
                _sigterm()
            if ckpt.step(step, state):
                break
        ckpt.done(step, state)
    checkpoints = [e["step"] for e in _kinds(store, "checkpoint")]
    assert checkpoints == [4]  # the stop's own checkpoint (nothing older in blob), no final one after it
    assert _kinds(store, "finished") == [] and not ckpt.finished
    with pytest.raises(TrainingStopped):
        ckpt.step(5, state)  # a loop that ignores the stop cannot train on either


def _loader(workers: int = 0) -> tuple[DataLoader, ElasticSampler]:
    dataset = IndexDataset()
    sampler = ElasticSampler(dataset, global_batch_size=BATCH, seed=3)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=workers), sampler


def test_the_old_data_loop_whose_break_leaves_only_the_inner_loop_cannot_skip_the_epochs_rest(
        open_checkpointer, store) -> None:
    """The README's data snippet before: on a stop its `break` left the inner loop only and the next epoch
    began, skipping the rest of this one. Now the sampler ends the process at the next epoch's start."""
    loader, sampler = _loader(workers=2)
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer(interval_steps=100)
    step = ckpt.restore(state) or 0
    with pytest.raises(TrainingStopped):
        for epoch in range(sampler.epoch, 3):
            sampler.set_epoch(epoch)
            for _batch in loader:
                _train(state)
                sampler.advance()
                step += 1
                if step == 2:
                    _sigterm()
                if ckpt.step(step, state):
                    break
        ckpt.done(step, state)
    assert (sampler.epoch, sampler.consumed) == (0, 2 * BATCH) and step == 2

    loader, sampler = _loader()
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer()
    assert ckpt.restore(state) == 2 and (sampler.epoch, sampler.consumed) == (0, 2 * BATCH)


def test_batches_is_one_flat_loop_over_the_epochs_that_resumes_mid_epoch_exactly_once(
        open_checkpointer, store) -> None:
    loader, sampler = _loader(workers=2)
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer(interval_steps=100)
    seen: list[tuple[int, int, list[int]]] = []
    with pytest.raises(TrainingStopped):
        for step, batch in ckpt.batches(state, loader, epochs=2):
            _train(state)
            seen.append((step, sampler.epoch, batch.tolist()))
            if step == 7:  # the third batch of epoch 1
                _sigterm()
    assert [s for s, _, _ in seen] == list(range(1, 8))

    loader, sampler = _loader(workers=2)
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer()
    for step, batch in ckpt.batches(state, loader, epochs=2):
        _train(state)
        seen.append((step, sampler.epoch, batch.tolist()))
    assert [s for s, _, _ in seen] == list(range(1, 11)) and ckpt.finished
    for epoch in (0, 1):
        ids = [i for _, e, batch in seen if e == epoch for i in batch]
        order = sampler.order(epoch)
        assert ids == order  # every sample once, in the epoch's order, across the stop
    assert [(e["step"], e["total"]) for e in _kinds(store, "finished")] == [(10, 10)]


def test_batches_refuses_a_sampler_missing_from_the_state_and_a_plain_loader(open_checkpointer) -> None:
    loader, _sampler = _loader()
    ckpt = open_checkpointer()
    with pytest.raises(ValueError, match="not in the state"):
        ckpt.batches(_state(), loader, epochs=1)
    with pytest.raises(ValueError, match="ElasticSampler"):
        ckpt.batches(_state(), DataLoader(IndexDataset(), batch_size=4), epochs=1)


def test_batches_with_steps_trains_that_many_global_batches_across_epochs_and_a_stop(open_checkpointer, store) -> None:
    """steps=N: the first N global batches (5 an epoch here: 7 reach into the second epoch), resumed mid-way."""
    loader, sampler = _loader()
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer(interval_steps=100)
    seen: list[tuple[int, int, list[int]]] = []
    with pytest.raises(TrainingStopped):
        for step, batch in ckpt.batches(state, loader, steps=7):
            _train(state)
            seen.append((step, sampler.epoch, batch.tolist()))
            if step == 3:
                _sigterm()
    loader, sampler = _loader()
    state = {**_state(), "data": sampler}
    ckpt = open_checkpointer()
    for step, batch in ckpt.batches(state, loader, steps=7):
        _train(state)
        seen.append((step, sampler.epoch, batch.tolist()))
    assert [s for s, _, _ in seen] == list(range(1, 8)) and ckpt.finished
    assert [i for _, e, b in seen if e == 0 for i in b] == sampler.order(0)
    assert [i for _, e, b in seen if e == 1 for i in b] == sampler.order(1)[:2 * BATCH]
    assert (sampler.epoch, sampler.consumed) == (1, 2 * BATCH)
    assert [(e["step"], e["total"]) for e in _kinds(store, "finished")] == [(7, 7)]


def test_batches_wants_epochs_or_steps_one_of_the_two(open_checkpointer) -> None:
    loader, sampler = _loader()
    ckpt = open_checkpointer()
    for kwargs in ({}, {"epochs": 1, "steps": 3}):
        with pytest.raises(ValueError, match="epochs=E .* or steps=N"):
            ckpt.batches({**_state(), "data": sampler}, loader, **kwargs)
    with pytest.raises(ValueError, match="steps must be at least 0"):
        ckpt.batches({**_state(), "data": sampler}, loader, steps=-1)


def test_steps_over_an_elastic_sampler_is_refused_in_process(open_checkpointer, monkeypatch) -> None:
    """In-process mode, each node's loader would draw the same global batch's node slice: trained once per node."""
    loader, sampler = _loader()
    monkeypatch.setenv("ELASTICTRAIN_RECOVERY", "in-process")
    ckpt = open_checkpointer()
    with pytest.raises(ValueError, match=r"holds data \(ElasticSampler\).*would draw the same samples.*ckpt\.batches"):
        ckpt.steps({**_state(), "data": sampler}, total=3)
