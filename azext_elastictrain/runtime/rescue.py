"""The memory tier: the state of the last completed step, kept in node-local shared memory.

For a replicated state (DDP: every rank holds the whole model and optimizer)
the state of the last completed step survives on every surviving node when a
peer dies without notice. ``Checkpointer.step`` is called after the optimizer
step, so the state it sees is a completed step; ``MemoryTier.keep`` writes it
then to ``/dev/shm`` (it outlives the worker process, not the node). A worker
killed mid-optimizer-step never reaches ``step()``: its node keeps the previous
step, whole.

A copy is complete and consistent only if all of these hold (``read`` checks
them; any failure means "no copy", and restore falls back to blob):

- *whole*: it is written to a temporary file and renamed into place, so a
  worker killed while writing leaves the previous copy (or none), never half of
  one; the bytes end with a CRC32 of everything before them;
- *ours*: its header names the job prefix and the torchrun run id
  (``TORCHELASTIC_RUN_ID``, new per submission): a copy from another job, or
  from an earlier run of this job, is refused;
- *replicated*: states with sharded tensors (FSDP DTensors) are never kept;
  one node's copy is not the whole state.

The file holds tensors only (plain values as JSON in uint8 tensors), after a
JSON header: nothing in it is unpickled.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import StorageReader

from azext_elastictrain.core import launch

log = logging.getLogger(__name__)

MAGIC = b"ETRESCU1"
FORMAT = 1
DEFAULT_DIR = "/dev/shm/elastictrain"
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


@dataclass
class MemoryCopy:
    """One validated copy: its header and its tensors (views into the bytes read)."""

    step: int
    checksum: int
    world_size: int
    tensors: dict[str, torch.Tensor]
    raw: Any  # the file's bytes (a bytearray or a private mmap), as a peer receives them


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _raw(tensor: torch.Tensor) -> memoryview:
    host = tensor.detach().to("cpu").contiguous()
    return memoryview(host.reshape(-1).view(torch.uint8).numpy()) if host.numel() else memoryview(b"")


def is_replicated(flat: dict[str, Any]) -> bool:
    """True if every tensor is a plain tensor (DTensor / ShardedTensor: one shard per rank)."""
    # exact type on purpose: a tensor subclass (DTensor, ShardedTensor) is not a plain local tensor
    return all(type(v) is torch.Tensor  # pylint: disable=unidiomatic-typecheck
               for v in flat.values() if isinstance(v, torch.Tensor))


class MemoryTier:
    """Writes and reads this node's copy of one job's state."""

    def __init__(self, job_prefix: str, run_id: str | None, directory: str | os.PathLike[str] = DEFAULT_DIR,
                 node: str = ""):
        self.job_prefix = job_prefix
        self.run_id = run_id or ""
        self.directory = Path(directory)
        # The node's name too: the local cluster's "nodes" share one machine's /dev/shm.
        digest = hashlib.sha256(f"{job_prefix}\n{node}".encode()).hexdigest()[:24]
        self.path = self.directory / f"{digest}.state"

    @classmethod
    def from_env(cls, job_prefix: str, environ: Any = None) -> "MemoryTier | None":
        """None unless ``ELASTICTRAIN_MEMORY_RESCUE`` is ``on``: opt-in while the per-step copy is written on
        the training thread (its cost grows with the state: 0.45 s per step at 512 MiB, measured)."""
        env = os.environ if environ is None else environ
        if env.get(launch.ENV_MEMORY_RESCUE, "off").lower() not in ("on", "1", "true"):
            return None
        return cls(job_prefix, env.get("TORCHELASTIC_RUN_ID"), env.get(launch.ENV_MEMORY_DIR) or DEFAULT_DIR,
                   node=env.get(launch.ENV_NODE_NAME, ""))

    # -- write ---------------------------------------------------------------------------
    def keep(self, step: int, world_size: int, tensors: dict[str, torch.Tensor]) -> int:
        """Replace this node's copy with ``tensors`` as the state of ``step``; its checksum."""
        entries, offset, views = [], 0, []
        for key, tensor in tensors.items():
            view = _raw(tensor)
            entries.append({"key": key, "dtype": str(tensor.dtype).removeprefix("torch."),
                            "shape": list(tensor.shape), "offset": offset, "nbytes": view.nbytes})
            views.append(view)
            offset += view.nbytes
        header = json.dumps({
            "format": FORMAT, "job": self.job_prefix, "run": self.run_id, "step": step,
            "world_size": world_size, "replicated": True, "entries": entries,
        }, separators=(",", ":")).encode()
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        crc = 0
        with open(tmp, "wb") as out:
            for chunk in (MAGIC, _LEN.pack(len(header)), header, *views):
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
            out.write(_CRC.pack(crc))
        os.replace(tmp, self.path)  # atomic: readers see the previous copy or this one, whole
        return crc

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    # -- read ----------------------------------------------------------------------------
    def read(self) -> MemoryCopy | None:
        """This node's copy if it is whole, of this job and run, and replicated; else None (and why, logged)."""
        try:
            # Mapped, not read: a private copy-on-write view of the shared-memory pages, no 100s-of-MiB copy.
            with open(self.path, "rb") as file:
                raw: Any = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as ex:  # unreadable (or empty) is as good as absent: blob stands
            log.warning("cannot read the in-memory state at %s: %s", self.path, ex)
            return None
        try:
            return self.parse(raw)
        except (ValueError, KeyError, TypeError) as ex:
            log.warning("ignoring the in-memory state at %s: %s", self.path, ex)
            return None

    def parse(self, raw: Any) -> MemoryCopy:
        """The copy in ``raw`` (a file's bytes, or a peer's); ValueError if it is not whole and ours."""
        if len(raw) < len(MAGIC) + _LEN.size + _CRC.size or raw[:len(MAGIC)] != MAGIC:
            raise ValueError("not a state written by this runtime")
        body = memoryview(raw)[:-_CRC.size]
        (crc,) = _CRC.unpack(raw[-_CRC.size:])
        if zlib.crc32(body) != crc:
            raise ValueError("checksum mismatch (corrupted)")
        (hlen,) = _LEN.unpack_from(raw, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(bytes(body[start:start + hlen]))
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}, expected {FORMAT}")
        if header.get("job") != self.job_prefix:
            raise ValueError("it belongs to another job")
        if header.get("run") != self.run_id:
            raise ValueError(f"it is from another run of this job ({header.get('run')!r}, now {self.run_id!r})")
        if header.get("replicated") is not True:
            raise ValueError("it is not a replicated state")
        data = start + hlen
        tensors: dict[str, torch.Tensor] = {}
        for entry in header["entries"]:
            lo = data + int(entry["offset"])
            hi = lo + int(entry["nbytes"])
            if hi > len(body):
                raise ValueError(f"entry {entry['key']!r} runs past the end")
            flat = torch.frombuffer(raw, dtype=torch.uint8, count=hi - lo, offset=lo) if hi > lo \
                else torch.empty(0, dtype=torch.uint8)
            tensors[entry["key"]] = flat.view(_dtype(entry["dtype"])).reshape(entry["shape"])
        return MemoryCopy(step=int(header["step"]), checksum=crc, world_size=int(header["world_size"]),
                          tensors=tensors, raw=raw)


class MemoryStateReader(StorageReader):
    """A DCP StorageReader over tensors in memory, so a memory restore runs the same
    CheckingLoadPlanner (and its "every key loaded" proof) as a blob restore."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata, Metadata, TensorProperties, TensorStorageMetadata,
        )

        return Metadata(state_dict_metadata={
            key: TensorStorageMetadata(
                properties=TensorProperties(dtype=t.dtype), size=t.size(),
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * t.dim()), sizes=t.size())],
            ) for key, t in self.tensors.items()
        })

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        return plans

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future

        for item in plan.items:
            source = self.tensors[item.storage_index.fqn]
            for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                source = source.narrow(dim, offset, length)
            target = planner.resolve_tensor(item).detach()
            target.copy_(source)
            planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True
