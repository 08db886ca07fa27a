"""DCP checkpoint metadata as JSON, so that reading a checkpoint unpickles nothing.

DCP's ``Metadata`` says which keys a checkpoint holds (tensor dtype, size and
chunks, or a bytes item) and where each item lies (file, offset, length). DCP
pickles it; ``dumps``/``loads`` write and read the same information as JSON,
building only DCP's metadata dataclasses, ``torch.Size`` and allow-listed
dtypes from what they read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

FORMAT = "elastictrain-dcp-metadata/1"

# Every dtype a checkpoint may name, by its torch name ("float32", ...).
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
    )
}
MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
                  "preserve": torch.preserve_format}


class MetadataFormatError(ValueError):
    """The metadata is not what this module writes."""


@dataclass
class StorageInfo:
    """Where one item lies: the attributes DCP's FileSystemReader reads from its storage info."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: Sequence[str] | None = None


def _index(index: MetadataIndex) -> dict[str, Any]:
    return {"fqn": index.fqn, "offset": None if index.offset is None else list(index.offset),
            "index": index.index}


def _item(md: Any) -> dict[str, Any]:
    if isinstance(md, BytesStorageMetadata):
        return {"bytes": True}
    props = md.properties
    memory_format = next(k for k, v in MEMORY_FORMATS.items() if v == props.memory_format)
    return {
        "dtype": str(props.dtype).removeprefix("torch."),
        "requires_grad": props.requires_grad,
        "memory_format": memory_format,
        "size": list(md.size),
        "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md.chunks],
    }


def dumps(metadata: Metadata) -> bytes:
    doc = {
        "format": FORMAT,
        "version": metadata.version,
        "items": {fqn: _item(md) for fqn, md in metadata.state_dict_metadata.items()},
        "storage": [
            {"index": _index(index), "path": info.relative_path, "offset": info.offset, "length": info.length,
             "transforms": list(info.transform_descriptors or [])}
            for index, info in (metadata.storage_data or {}).items()
        ],
        "storage_meta": None if metadata.storage_meta is None else {
            "checkpoint_id": str(metadata.storage_meta.checkpoint_id),
            "save_id": metadata.storage_meta.save_id,
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is no index


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise MetadataFormatError(f"expected a list of integers, got {value!r:.80}")
    return value


def _load_item(doc: dict[str, Any]) -> Any:
    if doc.get("bytes") is True:
        return BytesStorageMetadata()
    dtype = DTYPES.get(doc["dtype"])
    if dtype is None:
        raise MetadataFormatError(f"unknown dtype {doc['dtype']!r:.40}")
    props = TensorProperties(dtype=dtype, requires_grad=bool(doc["requires_grad"]),
                             memory_format=MEMORY_FORMATS[doc["memory_format"]])
    chunks = [ChunkStorageMetadata(offsets=torch.Size(_ints(c["offsets"])), sizes=torch.Size(_ints(c["sizes"])))
              for c in doc["chunks"]]
    return TensorStorageMetadata(properties=props, size=torch.Size(_ints(doc["size"])), chunks=chunks)


def _load_storage(doc: dict[str, Any]) -> tuple[MetadataIndex, StorageInfo]:
    index = doc["index"]
    offset = index["offset"]
    key = MetadataIndex(fqn=str(index["fqn"]), offset=None if offset is None else _ints(offset),
                        index=index["index"] if _is_int(index["index"]) else None)
    transforms = [str(t) for t in doc["transforms"]] or None
    info = StorageInfo(relative_path=str(doc["path"]), offset=int(doc["offset"]), length=int(doc["length"]),
                       transform_descriptors=transforms)
    return key, info


def loads(raw: bytes) -> Metadata:
    """The Metadata in ``raw``; MetadataFormatError if it is not ours."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise MetadataFormatError("not elastictrain checkpoint metadata")
        items = {str(fqn): _load_item(md) for fqn, md in doc["items"].items()}
        storage = dict(_load_storage(s) for s in doc["storage"])
        meta = doc.get("storage_meta")
        storage_meta = None if meta is None else StorageMeta(
            checkpoint_id=meta.get("checkpoint_id"), save_id=meta.get("save_id"))
    except MetadataFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as ex:
        raise MetadataFormatError(f"malformed checkpoint metadata: {ex}") from ex
    return Metadata(state_dict_metadata=items, storage_data=storage, storage_meta=storage_meta,
                    version=doc.get("version"))
