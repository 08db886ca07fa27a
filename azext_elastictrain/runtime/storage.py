"""torch.distributed.checkpoint (DCP) storage straight onto blob storage.

Built on DCP's public ``FileSystemWriter``/``FileSystemReader`` and their
``fs`` hook (a ``FileSystemBase``): DCP plans and writes the files, this module
gives it a blob-backed file system and replaces the two steps that do not fit:

- DCP commits ``.metadata`` by renaming a temporary file, which on blob would
  be a copy. Here ``finish`` (which DCP calls on the coordinator only after
  every rank has written its files) writes the metadata once and then the
  checkpoint's ``manifest.json`` — our commit.
- DCP reads ``.metadata`` with ``pickle.load``: whoever can write the
  container could run code in every trainer. We write the metadata also as
  JSON (``.metadata.json``, see ``metadata_codec``) and read only that; the
  pickled ``.metadata`` stays for offline tools (``checkpoint download``).

Call order, per save (all ranks):  prepare_local_plan -> [coordinator]
prepare_global_plan -> write_data (every rank, in parallel, to its own files)
-> [coordinator] finish (metadata, then manifest).
"""
from __future__ import annotations

import io
import pickle
from contextlib import contextmanager
from typing import Any, Callable, Generator

from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.storage import WriteResult

from azext_elastictrain.core import layout
from azext_elastictrain.core.blobstore import BlobStore, NotFound
from azext_elastictrain.runtime import metadata_codec

METADATA = ".metadata"
METADATA_JSON = ".metadata.json"


class MemoryReader(io.RawIOBase):
    """A seekable, zero-copy reader over a downloaded buffer (torch.load needs seek)."""

    def __init__(self, view: memoryview):
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        data = self._view[self._pos:end].tobytes()
        self._pos = end
        return data


class BlobFileSystem(FileSystemBase):
    """DCP's file-system hooks over a BlobStore. Paths are blob names."""

    def __init__(self, store: BlobStore, expected: dict[str, layout.FileEntry] | None = None):
        self.store = store
        # Reading a checkpoint: blob name -> manifest entry (size, checksum or ""
        # for size only). Anything the manifest does not name is not read.
        self.expected = expected

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Generator[io.IOBase, None, None]:
        name = str(path)
        if "w" in mode:
            writer = self.store.open_writer(name)
            try:
                yield writer  # type: ignore[misc]  # file-like (write, close), not an io.IOBase: all DCP uses
            except BaseException:
                writer.abort()
                raise
            writer.close()
        else:
            entry = (self.expected or {}).get(name)
            if entry is None:
                raise NotFound(f"{name} is not part of the checkpoint's manifest")
            yield MemoryReader(self.store.download(name, entry.size, entry.sha256 or None))

    def concat_path(self, path: Any, suffix: str) -> str:
        return layout.join(str(path), suffix)

    def init_path(self, path: Any) -> str:
        return str(path).strip("/")

    def rename(self, path: Any, new_path: Any) -> None:
        raise NotImplementedError("blob checkpoints are written once and never renamed")

    def mkdir(self, path: Any) -> None:
        """Blob storage has no folders."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def exists(self, path: Any) -> bool:
        name = str(path)
        return any(e.name == name for e in self.store.list(name))

    def rm_file(self, path: Any) -> None:
        self.store.delete([str(path)])


class BlobCheckpointWriter(FileSystemWriter):  # pylint: disable=too-many-ancestors  # torch's public writer
    """DCP writer for one save attempt of one step, committed by its manifest.

    ``path`` is the attempt's own folder (``<job>/checkpoints/<step>/<writer>``);
    every blob is written with ``If-None-Match: *``. ``commit`` is called on the
    coordinator after ``.metadata`` is written, with the attempt's files.
    """

    # torch types its writer's fs as its own FileSystem, though DCP calls only FileSystemBase's hooks on it
    fs: BlobFileSystem  # type: ignore[assignment]
    path: str  # a blob name prefix

    def __init__(
        self,
        store: BlobStore,
        path: str,
        commit: Callable[[list[layout.FileEntry]], None],
        thread_count: int = 1,
    ):
        super().__init__(path=path, single_file_per_rank=True, sync_files=False, thread_count=thread_count)
        self.fs = BlobFileSystem(store)
        self.path = self.fs.init_path(path)
        self._store = store
        self._commit = commit

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        # Each attempt writes a fresh folder: nothing to create or to find there.
        return plan

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
        metadata.storage_meta = self.storage_meta()
        # JSON is what restore reads; the pickle is for offline DCP tools only.
        self._store.create(layout.join(self.path, METADATA_JSON), metadata_codec.dumps(metadata),
                           content_type="application/json")
        self._store.create(layout.join(self.path, METADATA), pickle.dumps(metadata))
        # Manifest paths are relative to the step folder: "<writer>/<file>".
        step_folder = self.path.rsplit("/", 1)[0] + "/"
        files = [
            layout.FileEntry(path=e.name[len(step_folder):], size=e.size, sha256=e.sha256 or "")
            for e in self._store.list(self.path + "/")
        ]
        unchecked = [f.path for f in files if not f.sha256]
        if unchecked:
            raise RuntimeError(f"blob storage kept no checksum for {unchecked}")
        self._commit(files)


class BlobCheckpointReader(FileSystemReader):
    """DCP reader for one committed checkpoint; every file is checked as it is read.

    Sizes are always checked; checksums too when ``verify`` (the default: the
    bytes are in hand anyway and hashing overlaps the download).
    """

    # torch types its reader's fs as its own FileSystem, though DCP calls only FileSystemBase's hooks on it
    fs: BlobFileSystem  # type: ignore[assignment]
    path: str  # a blob name prefix

    def __init__(self, store: BlobStore, job_prefix: str, manifest: layout.Manifest, verify: bool = True):
        super().__init__(path=layout.writer_prefix(job_prefix, manifest.step, manifest.writer))
        folder = layout.checkpoint_prefix(job_prefix, manifest.step)
        expected = {
            folder + f.path: layout.FileEntry(f.path, f.size, f.sha256 if verify else "")
            for f in manifest.files
        }
        self.fs = BlobFileSystem(store, expected)
        self.path = self.fs.init_path(self.path)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's JSON metadata; DCP's own reader would unpickle ``.metadata``."""
        with self.fs.create_stream(layout.join(self.path, METADATA_JSON), "rb") as stream:
            metadata = metadata_codec.loads(stream.read())
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
