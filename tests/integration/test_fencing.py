"""Fencing: two trainings that (wrongly) write the same job never corrupt each other.

Two Checkpointers on one job prefix stand for a split job: each writes its files in
a folder of its own, and the manifest (written once, ``If-None-Match: *``) decides
which save of a step is the checkpoint.
"""
from __future__ import annotations

import threading

import pytest
import torch

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.runtime.checkpoint import CheckpointError, Checkpointer, FencedError

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

JOB = "split-job"


def make_state(who: str, step: int) -> dict:
    seed = {"a": 1, "b": 2}[who] * 100_000 + step
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(256, 512, generator=g), "n": torch.full((7,), float(seed))},
            "meta": {"who": who, "step": step}}


def template() -> dict:
    return {"model": {"w": torch.zeros(256, 512), "n": torch.zeros(7)}, "meta": {"who": "", "step": -1}}


def assert_state(state: dict, who: str, step: int) -> None:
    expected = make_state(who, step)
    assert state["meta"] == {"who": who, "step": step}
    assert torch.equal(state["model"]["w"], expected["model"]["w"])
    assert torch.equal(state["model"]["n"], expected["model"]["n"])


@pytest.fixture
def open_checkpointer(blob_store):
    """Each call: a Checkpointer with a BlobStore of its own, as another training would have."""
    made: list[Checkpointer] = []

    def make(**kwargs) -> Checkpointer:
        store = blob_store(JOB)
        kwargs.setdefault("watcher", None)
        kwargs.setdefault("events", False)
        made.append(Checkpointer(store, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def restore(open_checkpointer) -> tuple[int | None, dict]:
    state = template()
    return open_checkpointer().restore(state), state


def listed(ckpt: Checkpointer) -> dict[int, catalog.Checkpoint]:
    return {c.step: c for c in catalog.list_checkpoints(ckpt.store, JOB)}


def is_fenced(ex: BaseException) -> bool:
    """Whether an error (or anything in its chain) says the step was fenced off."""
    seen = set()
    while ex is not None and id(ex) not in seen:
        seen.add(id(ex))
        if isinstance(ex, FencedError) or "already committed" in str(ex):
            return True
        ex = ex.__cause__ or ex.__context__
    return False


def gate_manifest(ckpt: Checkpointer, barrier: threading.Barrier) -> threading.Event:
    """Hold this writer's next manifest commit at ``barrier`` (once); returns an event set when it arrives."""
    arrived = threading.Event()
    real_create = ckpt.store.create

    def create(name: str, data: bytes, **kwargs):
        if name.endswith("/" + layout.MANIFEST) and not arrived.is_set():
            arrived.set()
            barrier.wait(timeout=60)
        return real_create(name, data, **kwargs)

    ckpt.store.create = create  # type: ignore[method-assign]
    return arrived


def assert_only_winner_in_manifest(c: catalog.Checkpoint) -> None:
    """The manifest names only its writer's folder; the loser's files are orphans beside it."""
    assert c.status == catalog.COMPLETE, c.problems
    assert c.manifest is not None
    assert all(f.path.startswith(c.manifest.writer + "/") for f in c.manifest.files)
    orphans = catalog.orphan_blobs(c, JOB)
    assert orphans, "the losing writer's files should be there, uncommitted"
    folder = layout.checkpoint_prefix(JOB, c.step)
    covered = {folder + f.path for f in c.manifest.files}
    assert not covered & set(orphans)
    assert all(not o.startswith(folder + c.manifest.writer + "/") for o in orphans)


# --------------------------------------------------------------------------- same step


def test_second_writer_of_a_committed_step_is_fenced_and_the_first_is_untouched(open_checkpointer) -> None:
    a, b = open_checkpointer(keep=3), open_checkpointer(keep=3)
    a.save(5, make_state("a", 5), blocking=True)
    with pytest.raises(FencedError):  # the specific error, not just any failure
        b.save(5, make_state("b", 5), blocking=True)

    c = listed(a)[5]
    assert_only_winner_in_manifest(c)
    step, state = restore(open_checkpointer)
    assert step == 5
    assert_state(state, "a", 5)


def test_concurrent_saves_of_one_step_commit_exactly_one(open_checkpointer) -> None:
    a, b = open_checkpointer(keep=3), open_checkpointer(keep=3)
    barrier = threading.Barrier(2)
    arrived = {"a": gate_manifest(a, barrier), "b": gate_manifest(b, barrier)}
    a.save(5, make_state("a", 5))
    b.save(5, make_state("b", 5))
    # both have written all their files and now race for the manifest
    assert arrived["a"].wait(60) and arrived["b"].wait(60)

    errors: dict[str, BaseException | None] = {}
    for who, ckpt in (("a", a), ("b", b)):
        try:
            ckpt.wait()
            errors[who] = None
        except CheckpointError as ex:
            errors[who] = ex
    winners = [w for w, e in errors.items() if e is None]
    assert len(winners) == 1, errors
    winner, loser = winners[0], ({"a", "b"} - set(winners)).pop()
    assert is_fenced(errors[loser]), errors[loser]

    c = listed(a)[5]
    assert_only_winner_in_manifest(c)
    assert catalog.verify(a.store, JOB, c).verified is True
    step, state = restore(open_checkpointer)
    assert step == 5
    assert_state(state, winner, 5)

    # the loser goes on normally with the next step
    loser_ckpt = {"a": a, "b": b}[loser]
    loser_ckpt.save(6, make_state(loser, 6), blocking=True)
    now = listed(a)
    assert now[5].status == catalog.COMPLETE and now[6].status == catalog.COMPLETE
    step, state = restore(open_checkpointer)
    assert step == 6
    assert_state(state, loser, 6)
    assert loser_ckpt.last_saved_step == 6


def test_fenced_writer_saves_the_next_step_normally(open_checkpointer) -> None:
    a, b = open_checkpointer(keep=3), open_checkpointer(keep=3)
    a.save(5, make_state("a", 5), blocking=True)
    b.save(5, make_state("b", 5))  # async: the error comes from wait()
    with pytest.raises(FencedError):
        b.wait()
    b.save(6, make_state("b", 6), blocking=True)

    now = listed(a)
    assert (now[5].status, now[6].status) == (catalog.COMPLETE, catalog.COMPLETE)
    assert now[5].writer != now[6].writer
    step, state = restore(open_checkpointer)
    assert step == 6
    assert_state(state, "b", 6)
    # and step 5 is still the winner's
    assert catalog.verify(a.store, JOB, now[5]).verified is True


# --------------------------------------------------------------------------- retention


def test_retention_of_a_writer_behind_never_deletes_the_newest_checkpoint_of_the_other(open_checkpointer) -> None:
    ahead, behind = open_checkpointer(keep=1), open_checkpointer(keep=1)
    ahead.save(8, make_state("a", 8), blocking=True)
    behind.save(3, make_state("b", 3), blocking=True)
    behind.save(4, make_state("b", 4), blocking=True)

    now = listed(ahead)
    assert 8 in now and now[8].status == catalog.COMPLETE
    assert catalog.newest_complete(now.values()).step == 8
    step, state = restore(open_checkpointer)
    assert step == 8
    assert_state(state, "a", 8)


def test_retention_never_deletes_the_other_writers_upload_in_flight(open_checkpointer) -> None:
    a, b = open_checkpointer(keep=1), open_checkpointer(keep=1)
    a.save(1, make_state("a", 1), blocking=True)
    # b's save of step 2 has written its files and waits to commit...
    barrier = threading.Barrier(2)
    arrived = gate_manifest(b, barrier)
    b.save(2, make_state("b", 2))
    try:
        assert arrived.wait(60)
        in_flight = sorted(e.name for e in b.store.list(layout.checkpoint_prefix(JOB, 2)))
        assert in_flight
        # ...while a commits step 3 and prunes with keep=1
        a.save(3, make_state("a", 3), blocking=True)
        assert sorted(e.name for e in a.store.list(layout.checkpoint_prefix(JOB, 2))) == in_flight
    finally:
        barrier.wait(timeout=60)
    b.wait()  # b's commit of step 2 is whole and succeeds

    step, state = restore(open_checkpointer)
    assert step == 3
    assert_state(state, "a", 3)
    assert [c.step for c in listed(a).values() if c.status == catalog.DAMAGED] == []


def test_retention_by_both_writers_keeps_the_job_newest_complete(open_checkpointer) -> None:
    a, b = open_checkpointer(keep=2), open_checkpointer(keep=2)
    for step in range(1, 9):
        who, ckpt = (("a", a), ("b", b))[step % 2]
        ckpt.save(step, make_state(who, step), blocking=True)
        complete = sorted(c.step for c in listed(a).values() if c.status == catalog.COMPLETE)
        assert complete == list(range(max(1, step - 1), step + 1)), (step, complete)
    step, state = restore(open_checkpointer)
    assert step == 8
    assert_state(state, "a", 8)
