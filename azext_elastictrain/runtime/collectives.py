"""The collectives the Checkpointer runs, on CPU process groups of its own.

Two gloo groups: ``control`` for the step-by-step agreement and restore (the training thread), ``io`` for DCP's
collectives in the upload thread; one group each keeps their collectives from interleaving across ranks. Both wait
for a peer at most the job's collective timeout (runtime/timeouts.py): a vanished peer fails them, not hangs them.
Without an initialised process group (one process) every collective is the identity, so the rest of the runtime
never asks whether it runs distributed.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from azext_elastictrain.runtime.timeouts import collective_timeout


class Collectives:
    """This rank's view of the job: rank, world size, and the few collectives the checkpoint code needs."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        timeout = collective_timeout()
        self.control = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self.io = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable values of our own making only: never from storage)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def all_reduce_max(self, values: list[int]) -> list[int]:
        """The element-wise maximum of every rank's ``values`` (one small all-reduce)."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.control)
        return tensor.tolist()

    def broadcast_tensor(self, tensor: torch.Tensor, src: int) -> None:
        """``src``'s ``tensor`` into every rank's (a CPU tensor of the same shape on each), in place."""
        if self.distributed:
            dist.broadcast(tensor, src=src, group=self.control)

    def broadcast_bytes(self, own: "bytes | bytearray | memoryview | None",
                        src: int) -> "bytes | bytearray | memoryview":
        """``src``'s bytes on every rank: its length first, then the bytes.

        ``own``: this rank's bytes if it holds the same ones as ``src`` (sent from, or kept, without a copy).
        """
        if not self.distributed:
            assert own is not None
            return own
        size = torch.tensor([len(own) if self.rank == src and own is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=src, group=self.control)
        if own is not None and len(own) == size.item():
            dist.broadcast(torch.frombuffer(own, dtype=torch.uint8), src=src, group=self.control)
            return own
        raw = bytearray(int(size.item()))
        dist.broadcast(torch.frombuffer(raw, dtype=torch.uint8), src=src, group=self.control)
        return raw
