"""The parts of torch.distributed.checkpoint (DCP) the runtime builds on, pinned: a torch upgrade that
changes one of them fails here, loudly, instead of silently writing elsewhere or reading differently.

runtime/storage.py subclasses the public FileSystemWriter/FileSystemReader and swaps their ``fs``
(a FileSystemBase); runtime/planners.py extends DefaultSavePlanner/DefaultLoadPlanner;
runtime/metadata_codec.py writes DCP's Metadata as JSON.
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from azext_elastictrain.runtime import metadata_codec

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


ABSTRACT = {
    StorageWriter: {
        "reset": ["self", "checkpoint_id"],
        "set_up_storage_writer": ["self", "is_coordinator", "args", "kwargs"],
        "prepare_local_plan": ["self", "plan"],
        "prepare_global_plan": ["self", "plans"],
        "write_data": ["self", "plan", "planner"],
        "finish": ["self", "metadata", "results"],
        "validate_checkpoint_id": ["checkpoint_id"],
    },
    StorageReader: {
        "reset": ["self", "checkpoint_id"],
        "read_metadata": ["self", "args", "kwargs"],
        "set_up_storage_reader": ["self", "metadata", "is_coordinator", "args", "kwargs"],
        "prepare_local_plan": ["self", "plan"],
        "prepare_global_plan": ["self", "plans"],
        "read_data": ["self", "plan", "planner"],
        "validate_checkpoint_id": ["checkpoint_id"],
    },
    FileSystemBase: {
        "create_stream": ["self", "path", "mode"],
        "concat_path": ["self", "path", "suffix"],
        "init_path": ["self", "path"],
        "rename": ["self", "path", "new_path"],
        "mkdir": ["self", "path"],
        "exists": ["self", "path"],
        "rm_file": ["self", "path"],
        "validate_checkpoint_id": ["checkpoint_id"],
    },
}


@pytest.mark.parametrize("interface", list(ABSTRACT), ids=lambda c: c.__name__)
def test_the_abstract_storage_interfaces_are_the_ones_we_implement(interface: type) -> None:
    expected = ABSTRACT[interface]
    assert set(interface.__abstractmethods__) == set(expected)
    for name, names in expected.items():
        assert params(getattr(interface, name)) == names, name


def test_the_constructor_arguments_and_planner_hooks_we_call_keep_their_names() -> None:
    assert params(FileSystemWriter.__init__)[:5] == ["self", "path", "single_file_per_rank", "sync_files",
                                                     "thread_count"]
    assert params(FileSystemReader.__init__)[:2] == ["self", "path"]
    assert params(DefaultSavePlanner.__init__)[:3] == ["self", "flatten_state_dict", "flatten_sharded_tensors"]
    assert params(DefaultLoadPlanner.__init__)[:3] == ["self", "flatten_state_dict", "flatten_sharded_tensors"]
    assert params(DefaultSavePlanner.transform_object) == ["self", "write_item", "object"]
    assert params(DefaultLoadPlanner.set_up_planner) == ["self", "state_dict", "metadata", "is_coordinator"]
    assert params(DefaultLoadPlanner.load_bytes) == ["self", "read_item", "value"]
    assert params(DefaultLoadPlanner.commit_tensor) == ["self", "read_item", "tensor"]
    assert [f.name for f in dataclasses.fields(Metadata)] == [
        "state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"]
    assert [f.name for f in dataclasses.fields(TensorProperties)] == [
        "dtype", "layout", "requires_grad", "memory_format", "pin_memory"]


class MemoryFileSystem(FileSystemBase):
    """Files in a dict: proves that every read and write of DCP's file-system classes goes through ``fs``."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
        if "w" in mode:
            files, name = self.files, str(path)

            class Kept(io.BytesIO):  # DCP closes the stream it writes
                def close(self) -> None:
                    if not self.closed:
                        files[name] = self.getvalue()
                    super().close()

            with Kept() as buf:
                yield buf
        else:
            yield io.BytesIO(self.files[str(path)])

    def concat_path(self, path: Any, suffix: str) -> str:
        return f"{path}/{suffix}"

    def init_path(self, path: Any) -> str:
        return str(path)

    def rename(self, path: Any, new_path: Any) -> None:
        self.files[str(new_path)] = self.files.pop(str(path))

    def mkdir(self, path: Any) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def exists(self, path: Any) -> bool:
        return str(path) in self.files

    def rm_file(self, path: Any) -> None:
        del self.files[str(path)]


def test_file_system_writer_and_reader_do_all_their_io_through_their_fs_hook(tmp_path) -> None:
    fs = MemoryFileSystem()
    nowhere = tmp_path / "must-not-be-created"
    writer = FileSystemWriter(nowhere, sync_files=False)
    writer.fs, writer.path = fs, "ckpt"
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": 5}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=writer, no_dist=True)
    assert not nowhere.exists()
    assert "ckpt/.metadata" in fs.files and any(name.endswith(".distcp") for name in fs.files)

    reader = FileSystemReader(nowhere)
    reader.fs, reader.path = fs, "ckpt"
    loaded = {"w": torch.zeros(2, 3), "n": 0}
    dcp.load(loaded, storage_reader=reader, planner=DefaultLoadPlanner(), no_dist=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["n"] == 5

    # what metadata_codec reads from each item's storage info, by attribute
    metadata = reader.read_metadata()
    for info in metadata.storage_data.values():
        assert all(hasattr(info, a) for a in ("relative_path", "offset", "length", "transform_descriptors"))


def test_metadata_round_trips_through_json_exactly() -> None:
    props = TensorProperties(dtype=torch.bfloat16, requires_grad=True, memory_format=torch.channels_last)
    chunks = [ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([2, 3])),
              ChunkStorageMetadata(offsets=torch.Size([2, 0]), sizes=torch.Size([1, 3]))]
    info = metadata_codec.StorageInfo("__0_0.distcp", 10, 99, None)
    original = Metadata(
        state_dict_metadata={"w": TensorStorageMetadata(props, torch.Size([3, 3]), chunks),
                             "n": dcp.metadata.BytesStorageMetadata()},
        storage_data={MetadataIndex("w", [2, 0], 1): info, MetadataIndex("n"): info},
        storage_meta=StorageMeta(checkpoint_id="job/x", save_id="s1"),
        version="1.0.0",
    )
    decoded = metadata_codec.loads(metadata_codec.dumps(original))
    assert decoded.state_dict_metadata == original.state_dict_metadata
    assert decoded.storage_data == original.storage_data
    assert [k.index for k in decoded.storage_data] == [1, None]
    assert decoded.version == "1.0.0" and decoded.storage_meta.save_id == "s1"


@pytest.mark.parametrize("raw", [
    b"\x80\x04\x95garbage",  # a pickle
    b'{"format": "something-else"}',
    b'{"format": "elastictrain-dcp-metadata/1", "items": {"w": {"dtype": "object", "requires_grad": false,'
    b' "memory_format": "contiguous", "size": [1], "chunks": []}}, "storage": []}',
    b'{"format": "elastictrain-dcp-metadata/1", "items": {}, "storage": [{"index": {}}]}',
])
def test_metadata_that_is_not_ours_is_refused(raw: bytes) -> None:
    with pytest.raises(metadata_codec.MetadataFormatError):
        metadata_codec.loads(raw)
