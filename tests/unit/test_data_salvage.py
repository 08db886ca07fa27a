"""ElasticSampler's owed samples: a step committed without a vanished rank's slice (the in-process mode's salvage)
leaves that slice owed, the next global batch trains it first, and each sample of the epoch is still trained
exactly once; every batch after that one is the one an uninterrupted run trains. Ranks are simulated in one
process (a sampler per rank), as in test_data.py."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import assume, given, settings, strategies as st

from azext_elastictrain.runtime import ElasticSampler


def samplers(size: int, batch: int, world: int, state: dict | None = None) -> list[ElasticSampler]:
    made = [ElasticSampler(range(size), global_batch_size=batch, num_replicas=world, rank=r, seed=3)
            for r in range(world)]
    for s in made:
        if state is not None:
            s.load_state_dict(json.loads(json.dumps(state)))  # what a checkpoint keeps: JSON
    return made


def global_batch(ranks: list[ElasticSampler]) -> list[list[int]]:
    """Each rank's slice of the next global batch (a new pass each time, as the in-process loop's reshard)."""
    return [next(iter(s)) for s in ranks]


def test_the_vanished_slice_leads_the_next_batch_and_later_batches_are_the_uninterrupted_runs():
    size, batch = 48, 12
    plain = samplers(size, batch, 1)[0]
    uninterrupted = []
    for _ in range(4):
        uninterrupted.append(next(iter(plain)))
        plain.advance()

    ranks = samplers(size, batch, 3)
    first = global_batch(ranks)
    assert sum(first, []) == uninterrupted[0]
    for s in ranks[:2]:  # rank 2 vanished mid-step; the others commit the step without its slice
        s.advance(missing=[2])
    assert ranks[0].owed == ranks[1].owed and len(ranks[0].owed) == batch // 3

    survivors = ranks[:2]
    for r, s in enumerate(survivors):
        s.reshard(2, r)
    second = global_batch(survivors)
    assert sum(second, []) == first[2] + uninterrupted[1]  # the owed slice first, then the batch due anyway
    assert [len(x) for x in second] == [8, 8]
    for s in survivors:
        s.advance()
    assert survivors[0].owed == []
    assert sum(global_batch(survivors), []) == uninterrupted[2]


def test_a_position_with_owed_samples_survives_a_checkpoint_and_a_peer_at_another_world_size():
    ranks = samplers(40, 8, 4)
    global_batch(ranks)
    for s in ranks:
        s.advance(missing=[1, 3])
    state = ranks[0].state_dict()
    assert state["consumed"][0] == 8 and len(state["consumed"]) == 1 + 4  # [position, *owed]: the same keys
    assert set(state) == set(samplers(40, 8, 1)[0].state_dict())
    resumed = samplers(40, 8, 2, state)
    assert resumed[0].owed == ranks[0].owed
    assert [len(x) for x in global_batch(resumed)] == [6, 6]
    # a checkpoint written before owed samples existed (an int position) reads as before
    old = samplers(40, 8, 2, {"epoch": 0, "consumed": 16, "dataset_size": 40, "seed": 3, "shuffle": 1})
    assert old[0].consumed == 16 and old[0].owed == []


@pytest.mark.parametrize("owed", [[9], [0, 0], [-1], ["1"]])
def test_owed_positions_that_cannot_be_are_refused(owed):
    with pytest.raises(ValueError, match="owed"):
        samplers(40, 8, 1, {"epoch": 0, "consumed": [8, *owed], "dataset_size": 40, "seed": 3, "shuffle": 1})


def test_a_later_batch_of_a_pass_trained_in_part_and_owed_samples_that_hold_the_epoch():
    ranks = samplers(16, 4, 2)
    iterator = iter(ranks[0])
    _, second = next(iterator), next(iterator)  # the loader drew ahead
    ranks[0].advance()
    ranks[0].advance(missing=[1])
    order = ranks[0].order()
    assert [order[i] for i in ranks[0].owed] == [order[6], order[7]] and second == [order[4], order[5]]
    with pytest.raises(RuntimeError, match="stale"):
        next(iterator)  # drawn without the owed samples: a new pass
    next(iter(ranks[1]))
    with pytest.raises(ValueError, match="not all in a world of 2"):
        ranks[1].advance(missing=[2])
    ranks[1].advance()  # the refused call changed nothing
    last = samplers(16, 4, 2, {"epoch": 0, "consumed": 12, "dataset_size": 16, "seed": 3, "shuffle": 1})[0]
    next(iter(last))
    last.advance(missing=[1])
    assert last.consumed == 16 and len(last) == 1  # the owed slice is the epoch's last batch
    with pytest.raises(RuntimeError, match="owed"):
        last.set_epoch(1)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(30, 90))
def test_every_sample_of_every_epoch_is_trained_once_whatever_vanishes_when(seed, size):
    """Nodes vanish mid-step at random (the step committed without them) and newcomers join; the union of what
    each epoch's committed steps trained is the epoch, each sample once."""
    assume(size % 12 == 0 or size % 12 >= 4)  # every world of 1 to 4 ranks gets a sample of the final batch
    rng = random.Random(seed)
    batch, epochs = 12, 2
    world = 4
    ranks = samplers(size, batch, world)
    trained: dict[int, list[int]] = {0: [], 1: []}
    steps = 0
    while True:
        lead = ranks[0]
        if lead.consumed >= lead.samples_per_epoch and not lead.owed:
            if lead.epoch + 1 >= epochs:
                break
            following = lead.epoch + 1
            for s in ranks:
                s.set_epoch(following)
        epoch = lead.epoch
        slices = global_batch(ranks)
        last = lead.consumed + batch >= lead.samples_per_epoch
        lost = None
        if world > 1 and not last and rng.random() < 0.3:  # a vanish mid-step: salvaged (never the epoch's last)
            lost = rng.randrange(world)
            for r, s in enumerate(ranks):
                if r != lost:
                    trained[epoch].extend(slices[r])
                    s.advance(missing=[lost])
            world -= 1
        else:
            for r, s in enumerate(ranks):
                trained[epoch].extend(slices[r])
                s.advance()
            if world < 4 and rng.random() < 0.3:
                world += 1  # a newcomer: it takes a peer's position
        state = ranks[1 if lost == 0 else 0].state_dict()  # a survivor's: a newcomer takes it from a peer
        ranks = samplers(size, batch, world, state)
        steps += 1
        assert steps < 100
    for epoch, samples in trained.items():
        assert sorted(samples) == list(range(size)), epoch
