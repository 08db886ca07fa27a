"""The in-process mode's step start: the replicas made one and checked to be one, in the step's first collective.

Every participant meets at each step's start in one collective (runtime/replicas.py ``_start_together``). It
carries two things besides the meeting:

- **the buffers** of the modules the optimizer trains (BatchNorm's running statistics), from the quorum's first
  replica to every other, as DDP broadcasts its rank 0's buffers at each forward: every node starts the step
  from the same statistics, so the job's buffers are what one DDP run over every rank keeps (rank 0's), whoever
  writes the checkpoint, and a newcomer's are not its own lineage;
- **a digest of each replica** (its trained parameters, the optimizer's state and every other module's parameters
  and counts, such as an EMA's: the state every replica must hold bit for bit; not the statistics each rank
  gathers from its own batches, which DDP leaves apart too), when a check is due: every ``every`` steps, at a
  change of the quorum's members and after a transfer. A replica whose digest differs from the one most replicas
  hold (a tie: the lowest rank's) is a loud error, and it takes no part in the step (its slice goes to the others,
  its gradient is zeros, it discards the step), so at the next quorum it is one step behind and torchft's quorum
  has it take the state of a replica that committed: the same path as a node whose commit failed where the others'
  succeeded.

A digest is the sum of each tensor's bits read as integers, mixed in the tensors' order: any bit that differs
changes it. It is one 63-bit integer, sent as three 21-bit parts in the collective's float64 vector (exact).
Pure but for torch: no process group here (the caller runs the collective).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

from azext_elastictrain.runtime.state import modules_in

_MASK = (1 << 63) - 1
_PART_BITS = 21
_PARTS = 3
_INTEGER_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def digest(tensors: Iterable[torch.Tensor]) -> int:
    """A 63-bit digest of the tensors' bits, in order (never 0: 0 means "not computed" in the collective)."""
    sums = []
    for tensor in tensors:
        flat = tensor.detach()
        if flat.is_complex():
            flat = torch.view_as_real(flat)
        flat = flat.contiguous().reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        sums.append(flat.view(_INTEGER_OF_SIZE[flat.element_size()]).sum(dtype=torch.int64))
    value = 0
    if sums:
        for item in torch.stack([s.cpu() for s in sums]).tolist():
            value = (value * 1_000_003 + item) & _MASK
    return value or 1


def winner(digests: list[int | None]) -> tuple[int | None, set[int]]:
    """(the digest most replicas hold, the ranks holding another); ranks without a digest (None: not computed this
    step) are neither. A tie goes to the digest of the lowest rank among the tied."""
    held: dict[int, list[int]] = {}
    for rank, value in enumerate(digests):
        if value is not None:
            held.setdefault(value, []).append(rank)
    if not held:
        return None, set()
    best = max(held, key=lambda value: (len(held[value]), -held[value][0]))
    return best, {rank for value, ranks in held.items() if value != best for rank in ranks}


class StepStart:
    """The step-start collective's vector for one replica, and what it says once reduced (see the docstring)."""

    def __init__(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        modules = modules_in(state)
        trained_modules = [m for m in modules if any(id(p) in trained for p in m.parameters())]
        self.buffers = _unique(b for m in trained_modules for b in m.buffers())
        params = [p for group in optimizer.param_groups for p in group["params"]]
        others = [m for m in modules if not any(id(p) in trained for p in m.parameters())]
        self._optimizer = optimizer
        self._replica = (params, others)
        self._buffer_size = sum(b.numel() for b in self.buffers)

    def replica_tensors(self) -> list[torch.Tensor]:
        """What every replica holds bit for bit: the trained parameters, the optimizer's state (read from the live
        object: its state_dict would step a stateless optimizer), every other module's parameters and its buffers
        of counts (an EMA's ``n_averaged``). Not floating-point buffers: they are statistics of each rank's own
        batches, in DDP as here (an ``AveragedModel`` copies the model's BatchNorm statistics after the node's
        own forward); the trained modules' are made one at each step's start, above."""
        params, others = self._replica
        state = [t for p in params for _, t in sorted(self._optimizer.state.get(p, {}).items())
                 if isinstance(t, torch.Tensor)]
        counts = (b for m in others for b in m.buffers() if not (b.is_floating_point() or b.is_complex()))
        return _unique([*params, *state, *(p for m in others for p in m.parameters()), *counts])

    def vector(self, rank: int | None, participants: int, due: bool) -> torch.Tensor:
        """This replica's part: the buffers if it is the quorum's first, its digest in its slot if a check is due
        (zeros where it has nothing to give)."""
        flat = torch.zeros(self._buffer_size + _PARTS * participants, dtype=torch.float64)
        if rank == 0 and self.buffers:
            flat[:self._buffer_size] = torch.cat([b.detach().reshape(-1).to("cpu", torch.float64)
                                                  for b in self.buffers])
        if rank is not None and due:
            value = digest(self.replica_tensors())
            slot = self._buffer_size + _PARTS * rank
            for i in range(_PARTS):
                flat[slot + i] = float((value >> (_PART_BITS * i)) & ((1 << _PART_BITS) - 1))
        return flat

    def apply(self, flat: torch.Tensor, participants: int) -> list[int | None]:
        """The reduced vector: the first replica's buffers into this one's, and every replica's digest (None
        where none was computed)."""
        offset = 0
        with torch.no_grad():
            for buffer in self.buffers:
                size = buffer.numel()
                buffer.copy_(flat[offset:offset + size].view(buffer.shape).to(buffer.dtype))
                offset += size
        digests: list[int | None] = []
        for rank in range(participants):
            parts = flat[self._buffer_size + _PARTS * rank:self._buffer_size + _PARTS * (rank + 1)].tolist()
            value = sum(int(part) << (_PART_BITS * i) for i, part in enumerate(parts))
            digests.append(value or None)
        return digests


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    found = []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            found.append(tensor)
    return found
