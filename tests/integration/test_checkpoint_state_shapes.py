"""Every kind of value a state dict may hold restores bit-identically into fresh objects, or is refused by name.

Real Azurite, single process (DDP and FSDP2 modules: test_checkpoint_resharding.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from torch import nn

from azext_elastictrain.core import catalog
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.checkpoint import CheckpointError, Checkpointer
from azext_elastictrain.runtime.state import TrainingState
from tests.support.states import assert_identical

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

JOB = "job"


@pytest.fixture
def store(blob_store) -> BlobStore:
    return blob_store(JOB)


@pytest.fixture
def checkpointer(store: BlobStore):
    made: list[Checkpointer] = []

    def make() -> Checkpointer:
        made.append(Checkpointer(store, watcher=None, events=False, keep=5))
        return made[-1]

    yield make
    for c in made:
        c.close()


# --------------------------------------------------------------------------- the shapes


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.fc(x))))


def trained(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, steps: int = 3) -> None:
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        loss = model(torch.randn(10, 6, generator=g)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


class Counter:
    """A user object that is neither a module nor an optimizer: state_dict()/load_state_dict() only."""

    def __init__(self, seed: int) -> None:
        self.seen = seed
        self.window = torch.full((4,), float(seed))
        self.name = f"counter-{seed}"

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "window": self.window.clone(), "name": self.name}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.seen, self.window, self.name = sd["seen"], sd["window"].clone(), sd["name"]


def model_and(optimizer_cls: Callable[..., torch.optim.Optimizer], seed: int, train: bool, **kw: Any) -> dict:
    torch.manual_seed(seed)
    model = Net()
    optimizer = optimizer_cls(model.parameters(), **kw)
    if train:
        trained(model, optimizer)
    return {"model": model, "optimizer": optimizer}


def raw_dict(seed: int, train: bool) -> dict:
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    if train:
        trained(model, optimizer, scheduler)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def training_state(seed: int, train: bool) -> dict:
    parts = raw_dict(seed, train)
    return {"train": TrainingState(parts["model"], parts["optimizer"], parts["scheduler"])}


def generator(seed: int, train: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    if train:
        torch.rand(17, generator=g)
    return {"gen": g}


def tensors(seed: int, train: bool) -> dict:
    if not train:  # a fresh state's tensors need not have the saved size or dtype
        return {"t": torch.zeros(0), "ints": torch.zeros(2, dtype=torch.int64), "half": torch.zeros(1),
                "nested": {"list": [torch.zeros(1), torch.zeros(1)]}}
    g = torch.Generator().manual_seed(seed)
    return {"t": torch.randn(3, 5, generator=g, dtype=torch.float64), "ints": torch.arange(7) * 3,
            "half": torch.randn(4, generator=g).to(torch.bfloat16),
            "nested": {"list": [torch.tensor([math.pi]), torch.tensor([True, False])]}}


def plain_values(seed: int, train: bool) -> dict:
    if not train:
        return {"step": 0, "loss": 0.0, "run": "", "flag": False, "none": None,
                "meta": {"seen": [], "pair": (0, 0), "deep": {"x": [[0]]}}}
    return {"step": 7, "loss": 0.1 + 0.2, "run": "run-ü-7", "flag": True, "none": None,
            "meta": {"seen": [3, 1, 4, 1, 5], "pair": (2.5, -1), "deep": {"x": [[1, 2], [3], []]}}}


def stateful_object(seed: int, train: bool) -> dict:
    return {"counter": Counter(41 if train else 0)}


def nested_objects(seed: int, train: bool) -> dict:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if train:
        trained(nn.Sequential(nn.Linear(6, 4), model), optimizer)
    return {"parts": {"net": model, "opt": [optimizer]}}


SHAPES: dict[str, Callable[[int, bool], dict]] = {
    "module_with_buffers": lambda seed, train: {"model": model_and(torch.optim.SGD, seed, train, lr=0.1)["model"]},
    "adamw_moments": lambda seed, train: model_and(torch.optim.AdamW, seed, train, lr=0.01),
    "sgd_momentum": lambda seed, train: model_and(torch.optim.SGD, seed, train, lr=0.1, momentum=0.9),
    "model_optimizer_scheduler_raw_dict": raw_dict,
    "training_state": training_state,
    "generator": generator,
    "tensors": tensors,
    "plain_values": plain_values,
    "stateful_object": stateful_object,
    "modules_and_optimizers_nested_in_dicts_and_lists": nested_objects,
}


def observe(value: Any) -> Any:
    """What a value is, as comparable data (tensors compared bit for bit below)."""
    if isinstance(value, TrainingState):
        return [observe(value.model), observe(value.optimizer), observe(value.scheduler)]
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, (nn.Module, torch.optim.Optimizer)) or hasattr(value, "load_state_dict"):
        return observe(value.state_dict())
    if isinstance(value, dict):
        return {k: observe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(observe(v) for v in value)
    return value


def moment_entries(optimizer: torch.optim.Optimizer) -> int:
    return sum(isinstance(v, torch.Tensor) for s in optimizer.state.values() for v in s.values())


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_state_shape_round_trips_bit_identically_into_fresh_objects(shape: str, checkpointer) -> None:
    saved = SHAPES[shape](0, True)
    expected = observe(saved)
    checkpointer().save(3, saved, blocking=True)

    fresh = SHAPES[shape](1, False)
    assert checkpointer().restore(fresh) == 3
    assert_identical(expected, observe(fresh))


def test_a_fresh_adamw_gets_every_moment_back_from_the_raw_dict(checkpointer) -> None:
    saved = raw_dict(0, True)
    assert moment_entries(saved["optimizer"]) == 18  # 6 parameters x (2 moments + step)
    checkpointer().save(1, saved, blocking=True)
    fresh = raw_dict(1, False)
    assert not fresh["optimizer"].state
    assert checkpointer().restore(fresh) == 1
    assert moment_entries(fresh["optimizer"]) == moment_entries(saved["optimizer"])
    # and the two go on training identically
    trained(saved["model"], saved["optimizer"], saved["scheduler"], steps=2)
    trained(fresh["model"], fresh["optimizer"], fresh["scheduler"], steps=2)
    assert_identical(observe(saved), observe(fresh))


class WithUnusedHead(Net):
    """A head no forward uses (find_unused_parameters in DDP; an expert no batch reached): AdamW never makes a
    state for it, while torch's state-dict API gives a fresh AdamW a state for every parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(8, 3)


@pytest.mark.parametrize("wrapped", [False, True], ids=["dict", "TrainingState"])
def test_a_parameter_that_never_had_a_gradient_restores_without_an_optimizer_state(checkpointer, wrapped) -> None:
    """Before: "the state has keys the checkpoint lacks: optimizer.state.unused.bias.exp_avg, ..." at every
    restart of such a job (restart mode), and every heal from a peer (in-process)."""
    def made(seed: int, train: bool) -> dict:
        torch.manual_seed(seed)
        model = WithUnusedHead()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        if train:
            trained(model, optimizer)
        return {"train": TrainingState(model, optimizer)} if wrapped else {"model": model, "optimizer": optimizer}

    def parts(state: dict) -> tuple[nn.Module, torch.optim.Optimizer]:
        return (state["train"].model, state["train"].optimizer) if wrapped else (state["model"], state["optimizer"])

    saved = made(0, True)
    model, optimizer = parts(saved)
    assert model.unused.weight not in optimizer.state and moment_entries(optimizer) == 18  # 6 of 8 have a state
    checkpointer().save(1, saved, blocking=True)
    fresh = made(1, False)
    assert checkpointer().restore(fresh) == 1
    fresh_model, fresh_optimizer = parts(fresh)
    assert fresh_model.unused.weight not in fresh_optimizer.state and moment_entries(fresh_optimizer) == 18
    trained(model, optimizer, steps=2)
    trained(fresh_model, fresh_optimizer, steps=2)
    assert_identical(observe(saved), observe(fresh))  # the unused head too: AdamW decayed it in neither


@pytest.mark.parametrize("bad, where", [
    (lambda tmp: {"log": open(tmp / "f.txt", "w")}, "state['log']"),  # noqa: SIM115 - closed below
    (lambda tmp: {"meta": {"fn": lambda: 1}}, "state['meta']['fn']"),
    (lambda tmp: {"meta": {"items": [1, object()]}}, "state['meta']['items']['1']"),
    (lambda tmp: {"model": nn.Linear(2, 2), "opt": torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1)},
     "state['opt']"),
])
def test_saving_a_value_no_checkpoint_can_hold_raises_naming_its_key(bad, where, tmp_path, checkpointer,
                                                                     store) -> None:
    state = bad(tmp_path)
    try:
        with pytest.raises(CheckpointError) as raised:
            checkpointer().save(1, state, blocking=True)
    finally:
        if hasattr(state.get("log"), "close"):
            state["log"].close()
    assert where in str(raised.value)
    assert catalog.list_checkpoints(store, JOB) == []  # nothing half-written


def test_restore_into_a_state_missing_a_saved_key_raises_naming_it(checkpointer) -> None:
    checkpointer().save(1, {**raw_dict(0, True), "epoch": 3}, blocking=True)
    with pytest.raises(CheckpointError, match="the checkpoint has keys the state lacks: epoch"):
        checkpointer().restore(raw_dict(1, False))


def test_restore_into_a_state_with_a_key_the_checkpoint_lacks_raises_naming_it(checkpointer) -> None:
    checkpointer().save(1, raw_dict(0, True), blocking=True)
    with pytest.raises(CheckpointError, match="the state has keys the checkpoint lacks: sampler.position"):
        checkpointer().restore({**raw_dict(1, False), "sampler": {"position": 0}})


def test_restore_into_a_model_of_another_architecture_raises(checkpointer) -> None:
    checkpointer().save(1, {"model": nn.Linear(3, 3)}, blocking=True)
    with pytest.raises(CheckpointError, match="model.weight"):
        checkpointer().restore({"model": nn.Sequential(nn.Linear(3, 3))})
