"""Retention planning (``plan_prune``) and applying it (``apply_prune``), without storage."""
from __future__ import annotations

import fnmatch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobEntry, NotFound
from azext_elastictrain.core.catalog import COMPLETE, DAMAGED, INCOMPLETE, Checkpoint

NOW = 1_800_000_000.0
JOB = "job"
STATUSES = (COMPLETE, INCOMPLETE, DAMAGED)


def ckpt(step: int, status: str = COMPLETE, *, created: float = NOW - 3600, last_modified: float | None = None,
         job: str = JOB) -> Checkpoint:
    folder = layout.checkpoint_prefix(job, step)
    blobs = [folder + "w/__0_0.distcp", folder + "w/.metadata"]
    if status != INCOMPLETE:
        blobs.append(layout.manifest_name(job, step))
    return Checkpoint(
        step=step,
        status=status,
        created=created,
        size=100 * (step + 1),
        files=len(blobs),
        world_size=1 if status == COMPLETE else None,
        writer="w" if status == COMPLETE else None,
        blobs=tuple(sorted(blobs)),
        last_modified=created if last_modified is None else last_modified,
    )


@st.composite
def catalogs(draw) -> list[Checkpoint]:
    steps = draw(st.lists(st.integers(0, 10_000), unique=True, max_size=14))
    out = []
    for step in steps:
        status = draw(st.sampled_from(STATUSES))
        age = draw(st.floats(0, 10 * 86400, allow_nan=False))
        touched_age = draw(st.floats(0, age, allow_nan=False))
        out.append(ckpt(step, status, created=NOW - age, last_modified=NOW - touched_age))
    return draw(st.permutations(out))  # plan_prune must not rely on the input order


options = st.fixed_dictionaries(
    {},
    optional={
        "keep_last": st.integers(1, 16),
        "older_than": st.floats(0, 10 * 86400, allow_nan=False),
        "incomplete": st.booleans(),
        "grace": st.floats(0, 86400, allow_nan=False),
    },
)


def _newest_complete(cps: list[Checkpoint]) -> Checkpoint | None:
    complete = sorted((c for c in cps if c.status == COMPLETE), key=lambda c: c.step)
    return complete[-1] if complete else None


def _plan(cps, opts):
    return catalog.plan_prune(cps, now=NOW, **opts)


# --------------------------------------------------------------------------- properties


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_keeps_and_deletes_partition_the_catalog(cps, opts) -> None:
    plan = _plan(cps, opts)
    keep = [c.step for c in plan.keep]
    delete = [c.step for c in plan.delete]
    assert not set(keep) & set(delete)
    assert sorted(keep + delete) == sorted(c.step for c in cps)
    assert len(keep) + len(delete) == len(cps)
    assert set(plan.reasons) == set(delete)
    assert plan.bytes_freed == sum(c.size for c in plan.delete)


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_never_deletes_the_newest_complete_checkpoint(cps, opts) -> None:
    newest = _newest_complete(cps)
    plan = _plan(cps, opts)
    if newest is not None:
        assert newest.step in {c.step for c in plan.keep}


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_never_deletes_anything_newer_than_the_newest_complete(cps, opts) -> None:
    newest = _newest_complete(cps)
    plan = _plan(cps, opts)
    limit = newest.step if newest is not None else -1
    assert all(c.step <= limit for c in plan.delete)
    if newest is None:
        assert plan.delete == ()


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_never_deletes_unfinished_checkpoints_touched_within_grace(cps, opts) -> None:
    plan = _plan(cps, opts)
    grace = opts.get("grace", catalog.DEFAULT_GRACE_SECONDS)
    for c in plan.delete:
        if c.status != COMPLETE:
            assert NOW - c.last_modified > grace, (c.step, c.status, NOW - c.last_modified)


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_deletes_unfinished_checkpoints_only_when_asked(cps, opts) -> None:
    plan = _plan(cps, opts)
    if not opts.get("incomplete"):
        assert all(c.status == COMPLETE for c in plan.delete)


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), n=st.integers(1, 16), incomplete=st.booleans(), grace=st.floats(0, 86400))
def test_plan_with_keep_last_never_deletes_one_of_the_newest_n_complete(cps, n, incomplete, grace) -> None:
    plan = catalog.plan_prune(cps, keep_last=n, incomplete=incomplete, grace=grace, now=NOW)
    newest_n = sorted(c.step for c in cps if c.status == COMPLETE)[-n:]
    assert set(newest_n) <= {c.step for c in plan.keep}
    assert len([c for c in plan.keep if c.status == COMPLETE]) == len(newest_n)


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), opts=options, n=st.integers(1, 16))
def test_plan_with_keep_last_leaves_at_most_n_complete(cps, opts, n) -> None:
    plan = catalog.plan_prune(cps, now=NOW, **dict(opts, keep_last=n))
    assert len([c for c in plan.keep if c.status == COMPLETE]) <= n


@settings(max_examples=400, deadline=None, database=None)
@given(cps=catalogs(), n=st.integers(1, 16))
def test_plan_with_only_keep_last_keeps_exactly_the_newest_n_complete(cps, n) -> None:
    plan = catalog.plan_prune(cps, keep_last=n, now=NOW)
    complete = sorted(c.step for c in cps if c.status == COMPLETE)
    assert sorted(c.step for c in plan.keep if c.status == COMPLETE) == complete[-n:]
    assert sorted(c.step for c in plan.delete) == (complete[:-n] if len(complete) > n else [])
    # everything not complete is left alone
    assert {c.step for c in cps if c.status != COMPLETE} <= {c.step for c in plan.keep}


@settings(max_examples=300, deadline=None, database=None)
@given(cps=catalogs())
def test_plan_without_options_deletes_nothing(cps) -> None:
    plan = catalog.plan_prune(cps, now=NOW)
    assert plan.delete == ()
    assert sorted(c.step for c in plan.keep) == sorted(c.step for c in cps)


@settings(max_examples=300, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_plan_is_ordered_by_step(cps, opts) -> None:
    plan = _plan(cps, opts)
    assert [c.step for c in plan.keep] == sorted(c.step for c in plan.keep)
    assert [c.step for c in plan.delete] == sorted(c.step for c in plan.delete)


@pytest.mark.parametrize("n", [0, -1, -100])
def test_keep_last_below_one_is_refused(n: int) -> None:
    with pytest.raises(ValueError):
        catalog.plan_prune([ckpt(1), ckpt(2)], keep_last=n, now=NOW)
    with pytest.raises(ValueError):
        catalog.plan_prune([], keep_last=n, now=NOW)


# --------------------------------------------------------------------------- examples


def test_older_than_deletes_complete_checkpoints_created_before_the_cutoff() -> None:
    cps = [
        ckpt(1, created=NOW - 10 * 86400),
        ckpt(2, created=NOW - 3 * 86400),
        ckpt(3, created=NOW - 86400 + 1),
        ckpt(4, created=NOW - 60),
    ]
    plan = catalog.plan_prune(cps, older_than=86400, now=NOW)
    assert [c.step for c in plan.delete] == [1, 2]
    assert [c.step for c in plan.keep] == [3, 4]
    assert "older than" in plan.reasons[1]


def test_older_than_never_deletes_the_newest_complete_even_if_old() -> None:
    cps = [ckpt(1, created=NOW - 9 * 86400), ckpt(2, created=NOW - 8 * 86400)]
    plan = catalog.plan_prune(cps, older_than=3600, now=NOW)
    assert [c.step for c in plan.delete] == [1]
    assert [c.step for c in plan.keep] == [2]


def test_older_than_leaves_old_unfinished_checkpoints_alone_unless_asked() -> None:
    cps = [ckpt(1, INCOMPLETE, created=NOW - 9 * 86400), ckpt(2, DAMAGED, created=NOW - 9 * 86400),
           ckpt(3, created=NOW - 9 * 86400), ckpt(4, created=NOW)]
    plan = catalog.plan_prune(cps, older_than=3600, now=NOW)
    assert [c.step for c in plan.delete] == [3]
    plan = catalog.plan_prune(cps, older_than=3600, incomplete=True, now=NOW)
    assert [c.step for c in plan.delete] == [1, 2, 3]
    assert plan.reasons[1] == INCOMPLETE and plan.reasons[2] == DAMAGED


def test_older_than_combined_with_keep_last_deletes_the_union() -> None:
    cps = [ckpt(s, created=NOW - (10 - s) * 86400) for s in range(1, 8)]  # step 7 is 3 days old
    plan = catalog.plan_prune(cps, older_than=5.5 * 86400, keep_last=5, now=NOW)
    # keep_last=5 drops 1, 2; older_than drops 1..4 (created 9..6 days ago)
    assert [c.step for c in plan.delete] == [1, 2, 3, 4]


def test_older_than_zero_keeps_only_the_newest_complete() -> None:
    cps = [ckpt(s, created=NOW - 100 + s) for s in range(1, 5)] + [ckpt(9, INCOMPLETE, created=NOW - 10**6)]
    plan = catalog.plan_prune(cps, older_than=0, now=NOW)
    assert [c.step for c in plan.keep] == [4, 9]


def test_unfinished_checkpoint_newer_than_the_newest_complete_is_kept_however_old() -> None:
    cps = [ckpt(1, created=NOW), ckpt(2, INCOMPLETE, created=NOW - 10**6, last_modified=NOW - 10**6)]
    plan = catalog.plan_prune(cps, incomplete=True, grace=0, now=NOW)
    assert plan.delete == ()


def test_unfinished_checkpoint_within_grace_is_kept_and_after_grace_deleted() -> None:
    cps = [ckpt(1, INCOMPLETE, created=NOW - 10**6, last_modified=NOW - 599), ckpt(2)]
    assert catalog.plan_prune(cps, incomplete=True, grace=600, now=NOW).delete == ()
    plan = catalog.plan_prune(cps, incomplete=True, grace=598, now=NOW)
    assert [c.step for c in plan.delete] == [1]


def test_no_complete_checkpoint_means_nothing_is_deleted() -> None:
    cps = [ckpt(1, INCOMPLETE, last_modified=NOW - 10**6), ckpt(2, DAMAGED, last_modified=NOW - 10**6)]
    plan = catalog.plan_prune(cps, incomplete=True, older_than=0, grace=0, now=NOW)
    assert plan.delete == ()


# --------------------------------------------------------------------------- apply_prune


class FakeStore:
    """The catalog's Store protocol over a dict, recording every call in order."""

    def __init__(self, names: list[str]):
        self.blobs = {n: b"x" for n in names}
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.deleted: list[str] = []  # in the order they went

    def list(self, prefix: str) -> list[BlobEntry]:
        self.calls.append(("list", (prefix,)))
        return [BlobEntry(n, len(d), None, NOW) for n, d in sorted(self.blobs.items()) if n.startswith(prefix)]

    def read(self, name: str) -> bytes:
        self.calls.append(("read", (name,)))
        if name not in self.blobs:
            raise NotFound(name)
        return self.blobs[name]

    def download(self, name: str, size: int, sha256: str | None = None) -> memoryview:
        self.calls.append(("download", (name,)))
        return memoryview(self.read(name))

    def delete(self, names: list[str]) -> None:
        self.calls.append(("delete", tuple(names)))
        for n in names:
            self.blobs.pop(n, None)
            self.deleted.append(n)


def _store_for(cps: list[Checkpoint], extra: list[str] = ()) -> FakeStore:
    return FakeStore([n for c in cps for n in c.blobs] + list(extra))


def test_apply_prune_deletes_each_manifest_before_any_other_file_of_its_checkpoint() -> None:
    cps = [ckpt(s) for s in (1, 2, 3, 4)] + [ckpt(0, DAMAGED, created=0)]
    store = _store_for(cps, extra=[layout.events_name(JOB)])
    plan = catalog.plan_prune(cps, keep_last=1, incomplete=True, grace=0, now=NOW)
    assert [c.step for c in plan.delete] == [0, 1, 2, 3]
    catalog.apply_prune(store, JOB, plan)

    for c in plan.delete:
        manifest = layout.manifest_name(JOB, c.step)
        order = store.deleted
        assert manifest in order
        others = [n for n in c.blobs if n != manifest]
        assert others and all(n in order for n in others)
        assert order.index(manifest) < min(order.index(n) for n in others), (c.step, order)
    # ...and a manifest goes in a call of its own, finished before the rest is asked for
    for c in plan.delete:
        manifest = layout.manifest_name(JOB, c.step)
        first_call_with_manifest = next(i for i, (op, args) in enumerate(store.calls) if manifest in args)
        first_call_with_other = min(
            i for i, (op, args) in enumerate(store.calls) for n in args if n in c.blobs and n != manifest
        )
        assert first_call_with_manifest < first_call_with_other


def test_apply_prune_deletes_exactly_the_planned_checkpoints() -> None:
    keep = [ckpt(5), ckpt(6), ckpt(7, INCOMPLETE, last_modified=NOW)]
    gone = [ckpt(1), ckpt(2), ckpt(3, INCOMPLETE, last_modified=0)]
    store = _store_for(keep + gone, extra=[layout.events_name(JOB)])
    plan = catalog.plan_prune(keep + gone, keep_last=2, incomplete=True, now=NOW)
    assert sorted(c.step for c in plan.delete) == [1, 2, 3]
    catalog.apply_prune(store, JOB, plan)
    assert sorted(store.blobs) == sorted([n for c in keep for n in c.blobs] + [layout.events_name(JOB)])


def test_apply_prune_of_an_incomplete_checkpoint_deletes_its_files() -> None:
    cps = [ckpt(1, INCOMPLETE, last_modified=0), ckpt(2)]
    store = _store_for(cps)
    catalog.apply_prune(store, JOB, catalog.plan_prune(cps, incomplete=True, now=NOW))
    assert not any(fnmatch.fnmatch(n, f"{layout.checkpoint_prefix(JOB, 1)}*") for n in store.blobs)
    assert all(n in store.blobs for n in cps[1].blobs)


def test_apply_prune_of_an_empty_plan_touches_nothing() -> None:
    cps = [ckpt(1), ckpt(2)]
    store = _store_for(cps)
    catalog.apply_prune(store, JOB, catalog.plan_prune(cps, keep_last=5, now=NOW))
    assert [op for op, _ in store.calls if op == "delete"] == []
    assert sorted(store.blobs) == sorted(n for c in cps for n in c.blobs)


@settings(max_examples=200, deadline=None, database=None)
@given(cps=catalogs(), opts=options)
def test_apply_prune_never_deletes_a_kept_blob_and_unmanifests_first(cps, opts) -> None:
    store = _store_for(cps)
    plan = _plan(cps, opts)
    catalog.apply_prune(store, JOB, plan)
    assert set(store.blobs) == {n for c in plan.keep for n in c.blobs}
    for c in plan.delete:
        manifest = layout.manifest_name(JOB, c.step)
        if manifest in c.blobs:
            pos = store.deleted.index(manifest)
            assert all(store.deleted.index(n) > pos for n in c.blobs if n != manifest)
