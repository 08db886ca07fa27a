"""Checkpointer save/restore round trips against a real Azurite (single process, CPU)."""
from __future__ import annotations

import copy
import random
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.checkpoint import Checkpointer
from azext_elastictrain.runtime.state import TrainingState

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

JOB = "job"


@pytest.fixture
def url(container_url: str) -> str:
    return f"{container_url}/{JOB}"


@pytest.fixture
def open_store(blob_store):
    """Each call: a store of the job's with clients of its own, as another process would have."""
    return lambda: blob_store(JOB)


@pytest.fixture
def open_checkpointer(open_store):
    made: list[Checkpointer] = []

    def make(**kwargs) -> Checkpointer:
        kwargs.setdefault("watcher", None)
        made.append(Checkpointer(open_store(), **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


# --------------------------------------------------------------------------- a small model


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 32)
        self.bn1 = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.relu(self.conv2(x)).flatten(1)
        return self.head(torch.relu(self.bn1(self.fc(x))))


def build(seed: int):
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 5, (6,), generator=g)


def train(model, optimizer, scheduler, steps: range) -> None:
    model.train()
    for i in steps:
        x, y = batch(i)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def clone_state(model, optimizer, scheduler) -> dict:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optim": copy.deepcopy(optimizer.state_dict()),
        "sched": copy.deepcopy(scheduler.state_dict()),
    }


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def assert_same_training_state(expected: dict, model, optimizer, scheduler) -> None:
    assert_same_tensors(expected["model"], dict(model.state_dict()))
    got = optimizer.state_dict()
    assert got["state"].keys() == expected["optim"]["state"].keys()
    for idx, param_state in expected["optim"]["state"].items():
        assert param_state.keys() == got["state"][idx].keys(), idx
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, got["state"][idx][name]), (idx, name)
            else:
                assert value == got["state"][idx][name], (idx, name)
    assert got["param_groups"] == expected["optim"]["param_groups"]
    assert scheduler.state_dict() == expected["sched"]


def rng_states() -> dict:
    return {"torch": torch.get_rng_state().clone(), "numpy": np.random.get_state(), "python": random.getstate()}


def assert_rng_equal(a: dict, b: dict) -> None:
    assert torch.equal(a["torch"], b["torch"])
    assert a["python"] == b["python"]
    na, nb = a["numpy"], b["numpy"]
    assert na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])


def make_meta() -> dict:
    return {"epoch": 0, "best_loss": 0.0, "run": "", "seen": [0, 0, 0]}


def fresh_state(seed: int = 12345):
    model, optimizer, scheduler = build(seed)
    state = {"train": TrainingState(model, optimizer, scheduler), "meta": make_meta(), "samples": 0}
    return state, (model, optimizer, scheduler)


def trained_state(steps: int = 4, seed: int = 0):
    model, optimizer, scheduler = build(seed)
    train(model, optimizer, scheduler, range(steps))
    meta = {"epoch": 7, "best_loss": 0.123456789, "run": "run-a", "seen": [3, 1, 4]}
    state = {"train": TrainingState(model, optimizer, scheduler), "meta": meta, "samples": 9001}
    return state, (model, optimizer, scheduler)


def committed_steps(store: BlobStore) -> list[int]:
    return [c.step for c in catalog.list_checkpoints(store, JOB) if c.complete]


# --------------------------------------------------------------------------- tests


def test_restore_brings_back_model_optimizer_scheduler_values_and_rng_bit_identical(open_checkpointer) -> None:
    state, (model, optimizer, scheduler) = trained_state(steps=5)
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    random.random(), np.random.rand(3), torch.rand(3)  # noqa: B018 - move the streams off their seeds
    expected = clone_state(model, optimizer, scheduler)
    expected_rng = rng_states()

    ckpt = open_checkpointer(keep=3)
    ckpt.save(5, state, blocking=True)
    assert ckpt.last_saved_step == 5
    # what the streams produce next, at save time
    next_draws = (random.random(), np.random.rand(4).tolist(), torch.rand(4))

    restored, (model2, optimizer2, scheduler2) = fresh_state(seed=99)
    assert not optimizer2.state  # a fresh optimizer that has never stepped
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # noqa: B018 - anything else
    assert open_checkpointer().restore(restored) == 5

    assert_same_training_state(expected, model2, optimizer2, scheduler2)
    assert restored["meta"] == {"epoch": 7, "best_loss": 0.123456789, "run": "run-a", "seen": [3, 1, 4]}
    assert restored["samples"] == 9001
    assert_rng_equal(rng_states(), expected_rng)
    assert (random.random(), np.random.rand(4).tolist()) == next_draws[:2]
    assert torch.equal(torch.rand(4), next_draws[2])

    # and training goes on exactly as it would have without the interruption
    train(model, optimizer, scheduler, range(5, 7))
    train(model2, optimizer2, scheduler2, range(5, 7))
    assert_same_training_state(clone_state(model, optimizer, scheduler), model2, optimizer2, scheduler2)


def test_restore_from_env_round_trips(open_checkpointer, azurite, url, monkeypatch) -> None:
    monkeypatch.setenv("ELASTICTRAIN_CHECKPOINT_URL", url)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    state, (model, optimizer, scheduler) = trained_state(steps=2)
    expected = clone_state(model, optimizer, scheduler)
    writer = Checkpointer.from_env(keep=2)
    try:
        writer.save(2, state)
        writer.wait()
    finally:
        writer.close()
    restored, parts = fresh_state()
    reader = Checkpointer.from_env()
    try:
        assert reader.restore(restored) == 2
    finally:
        reader.close()
    assert_same_training_state(expected, *parts)


def test_restore_returns_the_newest_complete_step(open_checkpointer, open_store) -> None:
    state, (model, optimizer, scheduler) = trained_state(steps=1)
    ckpt = open_checkpointer(keep=10)
    expected = {}
    for step in (1, 2, 3):
        if step > 1:
            train(model, optimizer, scheduler, range(step - 1, step))
        state["meta"]["epoch"] = step
        ckpt.save(step, state)
        expected[step] = clone_state(model, optimizer, scheduler)
    ckpt.wait()
    assert committed_steps(open_store()) == [1, 2, 3]

    restored, parts = fresh_state()
    assert open_checkpointer().restore(restored) == 3
    assert_same_training_state(expected[3], *parts)
    assert restored["meta"]["epoch"] == 3


def test_retention_keeps_exactly_the_newest_two(open_checkpointer, open_store) -> None:
    state, _ = trained_state(steps=1)
    ckpt = open_checkpointer(keep=2)
    for step in range(1, 7):
        state["meta"]["epoch"] = step
        ckpt.save(step, state)
    ckpt.wait()
    store = open_store()
    listed = catalog.list_checkpoints(store, JOB)
    assert [(c.step, c.status) for c in listed] == [(5, catalog.COMPLETE), (6, catalog.COMPLETE)]
    names = [e.name for e in store.list(layout.checkpoints_prefix(JOB))]
    assert names and all(layout.parse_step(n, JOB) in (5, 6) for n in names)  # no leftovers of 1..4
    restored, _ = fresh_state()
    assert open_checkpointer().restore(restored) == 6
    assert restored["meta"]["epoch"] == 6


def test_async_save_returns_before_the_upload_and_snapshots_the_state(open_checkpointer, open_store) -> None:
    state, (model, optimizer, scheduler) = trained_state(steps=3)
    expected = clone_state(model, optimizer, scheduler)
    expected_meta = copy.deepcopy(state["meta"])

    ckpt = open_checkpointer(keep=3)
    gate = threading.Event()
    upload_started = threading.Event()
    real_open_writer = ckpt.store.open_writer

    def gated_open_writer(name: str):
        upload_started.set()
        if not gate.wait(timeout=60):
            raise TimeoutError("test gate never opened")
        return real_open_writer(name)

    ckpt.store.open_writer = gated_open_writer  # type: ignore[method-assign]
    try:
        ckpt.save(3, state)
        pending = ckpt._pending
        assert pending is not None, "async save should leave an upload in flight"
        assert upload_started.wait(timeout=30)
        assert not pending.done(), "save() waited for the upload"
        assert committed_steps(open_store()) == []  # nothing is visible before the commit

        # training goes on and changes everything in place meanwhile
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
            for b in model.buffers():
                b.add_(1)
        for param_state in optimizer.state.values():
            param_state["exp_avg"].mul_(-3.0)
            param_state["exp_avg_sq"].add_(5.0)
        scheduler.step()
        state["meta"]["epoch"] = 999
        state["meta"]["seen"].append(5)
        state["samples"] = -1
    finally:
        gate.set()
    ckpt.wait()
    assert pending.done() and pending.exception() is None
    assert committed_steps(open_store()) == [3]

    restored, parts = fresh_state()
    assert open_checkpointer().restore(restored) == 3
    assert_same_training_state(expected, *parts)
    assert restored["meta"] == expected_meta
    assert restored["samples"] == 9001


def test_restore_on_an_empty_prefix_returns_none_and_leaves_the_state_untouched(open_checkpointer) -> None:
    state, (model, optimizer, scheduler) = fresh_state(seed=5)
    train(model, optimizer, scheduler, range(2))
    before = clone_state(model, optimizer, scheduler)
    meta_before = copy.deepcopy(state["meta"])
    random.seed(3), np.random.seed(3), torch.manual_seed(3)  # noqa: B018
    rng_before = rng_states()

    assert open_checkpointer().restore(state) is None

    assert_same_training_state(before, model, optimizer, scheduler)
    assert state["meta"] == meta_before and state["samples"] == 0
    assert_rng_equal(rng_states(), rng_before)


def test_training_stopped_early_records_the_last_completed_step_and_a_finished_one_does_not(
        open_checkpointer, open_store) -> None:
    from azext_elastictrain.core.eventlog.events import read_events

    state = {"model": nn.Linear(2, 2)}
    stopped = open_checkpointer(interval_steps=3, async_save=False)
    before = time.time() - 0.001  # the events carry milliseconds
    for step in range(1, 6):
        stopped.step(step, state)
    stopped.close()  # no done(): a crash, a SIGTERM, a failed collective
    events = read_events(open_store(), JOB)
    (told,) = [e for e in events if e["event"] == "interrupted"]
    assert told["step"] == 5 and before <= told["step_time"] <= told["time"]
    (checkpoint,) = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoint["step"] == 3 and before <= checkpoint["step_time"] <= told["step_time"]

    finished = open_checkpointer(async_save=False)
    assert finished.restore(state) == 5  # the last completed step, from this node's memory (blob has step 3)
    finished.step(6, state)
    finished.done(6, state)
    assert [e["event"] for e in read_events(open_store(), JOB)].count("interrupted") == 1
