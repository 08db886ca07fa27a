"""catalog.download: a plain DCP folder, verified, and nothing that looks complete when it fails."""
from __future__ import annotations

import pytest

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import IntegrityError, checksum

JOB = "job"


class FakeStore:
    """The catalog's Store over a dict; ``damaged`` names blobs whose read fails verification."""

    def __init__(self, blobs: dict[str, bytes], damaged: set[str] = frozenset()):
        self.blobs, self.damaged = blobs, damaged

    def download(self, name: str, size: int, sha256: str | None = None) -> memoryview:
        if name in self.damaged:
            raise IntegrityError(f"{name}: checksum mismatch (damaged or replaced)")
        data = self.blobs[name]
        assert len(data) == size and (sha256 is None or checksum(data) == sha256)
        return memoryview(data)


def _checkpoint(step: int, files: dict[str, bytes], status: str = catalog.COMPLETE) -> tuple[catalog.Checkpoint, dict]:
    writer = "w1"
    entries = layout.manifest_files(layout.FileEntry(f"{writer}/{p}", len(d), checksum(d)) for p, d in files.items())
    manifest = layout.Manifest(step=step, created=1.0, world_size=2, writer=writer, files=entries)
    folder = layout.checkpoint_prefix(JOB, step)
    blobs = {folder + f"{writer}/{p}": d for p, d in files.items()}
    cp = catalog.Checkpoint(step=step, status=status, created=1.0, size=manifest.total_bytes, files=len(entries),
                            world_size=2, writer=writer, blobs=tuple(blobs), last_modified=1.0, manifest=manifest)
    return cp, blobs


def test_download_drops_the_writer_folder_and_adds_the_manifest(tmp_path):
    cp, blobs = _checkpoint(40, {".metadata": b"meta", "__0_0.distcp": b"a" * 100, "__1_0.distcp": b"b" * 50})
    got = catalog.download(FakeStore(blobs), JOB, cp, tmp_path)
    folder = tmp_path / layout.step_dir(40)
    assert got["path"] == str(folder) and got["verified"] is True
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json"]
    assert (folder / "__1_0.distcp").read_bytes() == b"b" * 50
    assert layout.Manifest.from_bytes((folder / "manifest.json").read_bytes()) == cp.manifest


def test_a_damaged_file_leaves_no_folder_at_all(tmp_path):
    cp, blobs = _checkpoint(40, {".metadata": b"meta", "__0_0.distcp": b"a" * 100})
    damaged = {next(n for n in blobs if n.endswith("__0_0.distcp"))}
    with pytest.raises(IntegrityError):
        catalog.download(FakeStore(blobs, damaged), JOB, cp, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_never_overwrites_and_never_downloads_an_incomplete_checkpoint(tmp_path):
    cp, blobs = _checkpoint(40, {".metadata": b"meta"})
    (tmp_path / layout.step_dir(40)).mkdir()
    with pytest.raises(FileExistsError):
        catalog.download(FakeStore(blobs), JOB, cp, tmp_path)
    incomplete, blobs = _checkpoint(50, {".metadata": b"meta"}, status=catalog.INCOMPLETE)
    with pytest.raises(catalog.StoreError):
        catalog.download(FakeStore(blobs), JOB, incomplete, tmp_path)
    assert not (tmp_path / layout.step_dir(50)).exists()
