"""Damaged checkpoints are detected and skipped: restore falls back to the newest intact one."""
from __future__ import annotations

import base64
import hashlib
import json

import pytest
import torch

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.checkpoint import Checkpointer

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
              pytest.mark.usefixtures("no_scheduled_events")]

JOB = "job"
DATA = "__0_0.distcp"
METADATA = ".metadata.json"  # what restore reads (the pickled .metadata is for offline tools)


def make_state(step: int) -> dict:
    g = torch.Generator().manual_seed(7919 * step)
    return {
        "model": {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(333, generator=g)},
        "meta": {"step": step},
    }


def template() -> dict:
    return {"model": {"w": torch.zeros(512, 1024), "b": torch.zeros(333)}, "meta": {"step": -1}}


def assert_state_of_step(state: dict, step: int) -> None:
    expected = make_state(step)
    assert torch.equal(state["model"]["w"], expected["model"]["w"])
    assert torch.equal(state["model"]["b"], expected["model"]["b"])
    assert state["meta"] == {"step": step}


def sha256_blocks(data: bytes) -> str:
    """The documented checksum, computed independently: SHA-256 over the SHA-256s of 8 MiB blocks."""
    size = 8 * 1024 * 1024
    blocks = [data[o:o + size] for o in range(0, len(data), size)] or [b""]
    return base64.b64encode(hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).digest()).decode()


@pytest.fixture
def store(blob_store):
    s = blob_store(JOB)
    writer = Checkpointer(s, keep=10, watcher=None, events=False)
    try:
        for step in (1, 2, 3):
            writer.save(step, make_state(step), blocking=True)
        writer.close()
        assert [(c.step, c.status) for c in catalog.list_checkpoints(s, JOB)] == [
            (1, catalog.COMPLETE), (2, catalog.COMPLETE), (3, catalog.COMPLETE)
        ]
        yield s
    finally:
        writer.close()


@pytest.fixture
def restore(store: BlobStore):
    readers: list[Checkpointer] = []

    def run(**kwargs) -> tuple[int | None, dict]:
        readers.append(Checkpointer(store, watcher=None, events=False, **kwargs))
        state = template()
        return readers[-1].restore(state), state

    yield run
    for r in readers:
        r.close()


def checkpoint(store: BlobStore, step: int) -> catalog.Checkpoint:
    return next(c for c in catalog.list_checkpoints(store, JOB) if c.step == step)


def blob_of(store: BlobStore, step: int, basename: str) -> str:
    """The full blob name of one file of a committed checkpoint, from its manifest."""
    c = checkpoint(store, step)
    (entry,) = [f for f in c.manifest.files if f.path.rsplit("/", 1)[-1] == basename]
    return layout.checkpoint_prefix(JOB, step) + entry.path


def replace_blob(store: BlobStore, name: str, data: bytes, *, claimed_sha256: str | None = None) -> None:
    """Delete and re-upload a blob behind the store's back (a bit flip, an operator's mistake)."""
    store._container.delete_blob(name)
    metadata = {"sha256blocks": claimed_sha256} if claimed_sha256 else None
    store._container.upload_blob(name, data, metadata=metadata)  # claims the original checksum
    if claimed_sha256:
        assert next(e for e in store.list(name) if e.name == name).sha256 == claimed_sha256


def flip_bytes(data: bytes) -> bytes:
    buf = bytearray(data)
    for i in range(len(buf) // 2, len(buf) // 2 + 64):
        buf[i] ^= 0xFF
    return bytes(buf)


# --------------------------------------------------------------------------- (a) replaced bytes


def test_restore_skips_a_checkpoint_whose_data_file_was_replaced(store, restore) -> None:
    name = blob_of(store, 3, DATA)
    original = store.read(name)
    replace_blob(store, name, flip_bytes(original))
    assert len(store.read(name)) == len(original)

    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


def test_restore_skips_a_replaced_data_file_even_when_its_listed_checksum_is_forged(store, restore) -> None:
    """The listing cannot tell (size and recorded checksum match the manifest): only reading back can."""
    name = blob_of(store, 3, DATA)
    original = store.read(name)
    replace_blob(store, name, flip_bytes(original), claimed_sha256=sha256_blocks(original))
    assert checkpoint(store, 3).status == catalog.COMPLETE  # looks fine from the listing

    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


def test_restore_skips_a_checkpoint_whose_metadata_was_replaced(store, restore) -> None:
    name = blob_of(store, 3, METADATA)
    original = store.read(name)
    replace_blob(store, name, flip_bytes(original), claimed_sha256=sha256_blocks(original))
    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


# --------------------------------------------------------------------------- (b) deleted files


@pytest.mark.parametrize("basename", [DATA, METADATA])
def test_restore_skips_a_checkpoint_with_a_deleted_file(store, restore, basename: str) -> None:
    store.delete([blob_of(store, 3, basename)])
    c = checkpoint(store, 3)
    assert c.status == catalog.DAMAGED
    assert any("missing" in p for p in c.problems)

    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


# --------------------------------------------------------------------------- (c) resized files


@pytest.mark.parametrize("resize", ["truncated", "half", "empty", "extended"])
def test_restore_skips_a_checkpoint_with_a_resized_file(store, restore, resize: str) -> None:
    name = blob_of(store, 3, DATA)
    original = store.read(name)
    data = {
        "truncated": original[:-1],
        "half": original[: len(original) // 2],
        "empty": b"",
        "extended": original + b"\0" * 4096,
    }[resize]
    replace_blob(store, name, data)

    c = checkpoint(store, 3)
    assert c.status == catalog.DAMAGED
    assert any("bytes, manifest says" in p for p in c.problems), c.problems
    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


# --------------------------------------------------------------------------- (d) broken manifests


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xffgarbage",
        b"",
        b"{}",
        b'{"format": "torch-dcp"',
        b"[]",
    ],
    ids=["binary", "empty", "empty-object", "truncated-json", "json-array"],
)
def test_restore_skips_a_checkpoint_with_a_garbage_manifest(store, restore, garbage: bytes) -> None:
    manifest = layout.manifest_name(JOB, 3)
    replace_blob(store, manifest, garbage)
    c = checkpoint(store, 3)
    assert c.status == catalog.DAMAGED and c.manifest is None

    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


def test_restore_skips_a_checkpoint_whose_manifest_was_cut_short(store, restore) -> None:
    manifest = layout.manifest_name(JOB, 3)
    raw = store.read(manifest)
    replace_blob(store, manifest, raw[: len(raw) // 2])
    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


def test_restore_skips_a_manifest_copied_from_another_step(store, restore) -> None:
    replace_blob(store, layout.manifest_name(JOB, 3), store.read(layout.manifest_name(JOB, 2)))
    c = checkpoint(store, 3)
    assert c.status == catalog.DAMAGED
    assert any("manifest is for step 2" in p for p in c.problems)
    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


def test_restore_skips_a_manifest_whose_checksums_do_not_match_the_files(store, restore) -> None:
    manifest = layout.manifest_name(JOB, 3)
    doc = json.loads(store.read(manifest))
    for f in doc["files"]:
        f["sha256"] = sha256_blocks(b"something else")
    replace_blob(store, manifest, json.dumps(doc).encode())
    assert checkpoint(store, 3).status == catalog.DAMAGED
    step, state = restore()
    assert step == 2
    assert_state_of_step(state, 2)


# --------------------------------------------------------------------------- (e) verify


def test_verify_reports_a_replaced_file_as_damaged(store) -> None:
    name = blob_of(store, 3, DATA)
    original = store.read(name)
    replace_blob(store, name, flip_bytes(original), claimed_sha256=sha256_blocks(original))

    listed = checkpoint(store, 3)
    assert listed.status == catalog.COMPLETE and listed.verified is None
    checked = catalog.verify(store, JOB, listed)
    assert checked.status == catalog.DAMAGED
    assert checked.verified is False
    assert checked.problems and any("checksum" in p for p in checked.problems)
    assert not checked.complete

    intact = catalog.verify(store, JOB, checkpoint(store, 2))
    assert (intact.status, intact.verified, intact.problems) == (catalog.COMPLETE, True, ())


def test_verify_reports_a_plainly_replaced_file_as_damaged(store) -> None:
    name = blob_of(store, 3, DATA)
    replace_blob(store, name, flip_bytes(store.read(name)))
    checked = catalog.verify(store, JOB, checkpoint(store, 3))
    assert checked.status == catalog.DAMAGED
    assert not checked.complete
    assert catalog.newest_complete([checkpoint(store, s) for s in (1, 2)] + [checked]).step == 2


# --------------------------------------------------------------------------- fall back further


def test_restore_falls_back_past_several_damaged_checkpoints(store, restore) -> None:
    for step in (2, 3):
        name = blob_of(store, step, DATA)
        original = store.read(name)
        replace_blob(store, name, flip_bytes(original), claimed_sha256=sha256_blocks(original))
    step, state = restore()
    assert step == 1
    assert_state_of_step(state, 1)


def test_restore_with_every_checkpoint_damaged_returns_none_and_leaves_the_state_untouched(store, restore) -> None:
    for step in (1, 2, 3):
        name = blob_of(store, step, DATA)
        original = store.read(name)
        replace_blob(store, name, flip_bytes(original), claimed_sha256=sha256_blocks(original))
    step, state = restore()
    assert step is None
    untouched = template()
    assert torch.equal(state["model"]["w"], untouched["model"]["w"])
    assert torch.equal(state["model"]["b"], untouched["model"]["b"])
    assert state["meta"] == {"step": -1}


def test_restore_without_verification_still_skips_a_checkpoint_damaged_in_the_listing(store, restore) -> None:
    store.delete([blob_of(store, 3, DATA)])
    step, state = restore(verify=False)
    assert step == 2
    assert_state_of_step(state, 2)
