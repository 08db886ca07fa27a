"""The in-process mode's step start (runtime/replica_check.py): the first replica's buffers to every other, each
replica's digest, and which replicas differ from the others'. Several replicas are simulated by summing their
vectors, which is what the step-start collective (an allreduce) does."""
from __future__ import annotations

import copy

import pytest
import torch

from azext_elastictrain.runtime.replica_check import StepStart, digest, winner


def _replica(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    ema = torch.optim.swa_utils.AveragedModel(model)
    return {"model": model, "optimizer": optimizer, "ema": ema}


def _reduce(states: list[dict], due: bool = True) -> tuple[list[StepStart], list]:
    starts = [StepStart(s, s["optimizer"]) for s in states]
    total = sum(start.vector(rank, len(states), due) for rank, start in enumerate(starts))
    return starts, [start.apply(total.clone(), len(states)) for start in starts]


def test_a_digest_changes_with_any_bit_and_the_tensors_order() -> None:
    a, b = torch.randn(1000), torch.arange(7, dtype=torch.int64)
    base = digest([a, b])
    assert base == digest([a.clone(), b.clone()])
    flipped = a.clone()
    flipped.view(torch.int32)[123] ^= 1  # the least significant bit of one float
    assert digest([flipped, b]) != base
    assert digest([b, a]) != base
    assert digest([a.to(torch.bfloat16), torch.tensor([True, False])]) > 0
    assert 0 < base < 2**63


def test_equal_replicas_agree_and_take_the_first_ones_buffers() -> None:
    states = [_replica(), _replica()]
    with torch.no_grad():  # BatchNorm's statistics are each node's own after its forward
        states[1]["model"][1].running_mean.add_(1.0)
    first = states[0]["model"][1].running_mean.clone()
    _, seen = _reduce(states)
    assert seen[0] == seen[1] and None not in seen[0] and winner(seen[0]) == (seen[0][0], set())
    for state in states:
        assert torch.equal(state["model"][1].running_mean, first)
        assert state["model"][1].num_batches_tracked.item() == 1


def test_an_ema_of_a_batchnorm_model_agrees_although_each_node_saw_its_own_batch() -> None:
    """``AveragedModel`` copies the model's buffers after each update: BatchNorm's statistics of the node's own
    forward, as each rank's in DDP. Replicas whose trained state is one agree (found in the benchmark's workload:
    the check named a replica every 100 steps, and it healed each time)."""
    states = [_replica(), _replica()]
    for seed, state in enumerate(states):
        state["model"](torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)))  # its own batch
        state["ema"].update_parameters(state["model"])
    assert not torch.equal(states[0]["ema"].module[1].running_mean, states[1]["ema"].module[1].running_mean)
    _, seen = _reduce(states)
    assert winner(seen[0]) == (seen[0][0], set())


@pytest.mark.parametrize("what", ["parameter", "optimizer-moment", "ema", "ema-count"])
def test_a_replica_that_differs_in_what_every_replica_keeps_is_named(what) -> None:
    states = [_replica(), _replica(), _replica()]
    odd = states[1]
    with torch.no_grad():
        if what == "parameter":
            odd["model"][0].weight[0, 0] += 1e-6
        elif what == "optimizer-moment":
            next(iter(odd["optimizer"].state.values()))["exp_avg"].mul_(1.0001)
        elif what == "ema":
            next(odd["ema"].parameters()).add_(1e-6)
        else:
            odd["ema"].n_averaged.add_(1)
    _, seen = _reduce(states)
    assert winner(seen[0]) == (seen[0][0], {1})


def test_no_digest_no_check_and_ties_go_to_the_lowest_rank() -> None:
    _, seen = _reduce([_replica(), _replica(seed=1)], due=False)
    assert seen[0] == [None, None] and winner(seen[0]) == (None, set())
    assert winner([5, 7]) == (5, {1})
    assert winner([None, 7, 5, 5]) == (5, {1})


def test_digests_survive_the_float64_vector_exactly() -> None:
    state = _replica()
    start = StepStart(state, state["optimizer"])
    flat = start.vector(0, 1, True)
    assert start.apply(copy.deepcopy(flat), 1) == [digest(start.replica_tensors())]
