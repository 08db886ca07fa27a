"""What goes into a checkpoint: stateful wrappers and the in-memory snapshot.

``TrainingState`` wraps model + optimizer (+ LR scheduler) the way DCP wants
them: ``get_state_dict`` strips DDP's ``module.`` prefixes and gives the
optimizer state keyed by parameter names, so a checkpoint loads into a fresh
optimizer (even one that has not stepped yet) and into a different world size.

``snapshot`` copies a state dict into CPU memory so that training can go on
while the copy uploads; buffers are reused between saves (at most one save is
in flight), which spares the page faults of a fresh 100s-of-MiB allocation.
"""
from __future__ import annotations

import copy
import io
import pickle
import random
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful


class TrainingState(Stateful):
    """Model, optimizer and optional LR scheduler as one DCP stateful object."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 scheduler: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            state: dict[str, Any] = {"model": get_model_state_dict(self.model)}
        else:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            state = {"model": model_sd, "optim": optim_sd}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state_dict["model"])
        else:
            set_state_dict(
                self.model, self.optimizer,
                model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"],
            )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])


def capture_rng() -> bytes:
    """This process's random generators: Python, NumPy (if loaded), torch CPU and CUDA."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with the train extra
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return pickle.dumps(state)


def restore_rng(blob: bytes) -> None:
    state = pickle.loads(blob)  # noqa: S301 - our own checkpoint, read after its checksum
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Snapshotter:
    """Copies state dicts to CPU, reusing its buffers from one save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def snapshot(self, state: Any) -> Any:
        used: set[str] = set()
        copied = self._copy(state, "", used)
        for stale in set(self._buffers) - used:
            del self._buffers[stale]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking device->host copies must land
        return copied

    def _copy(self, value: Any, path: str, used: set[str]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value, path, used)
        if isinstance(value, dict):
            return {k: self._copy(v, f"{path}/{k}", used) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [self._copy(v, f"{path}/{i}", used) for i, v in enumerate(value)]
            return type(value)(items) if isinstance(value, list) else tuple(items)
        if isinstance(value, io.BytesIO):
            return io.BytesIO(value.getvalue())
        return copy.deepcopy(value)

    def _copy_tensor(self, tensor: torch.Tensor, path: str, used: set[str]) -> torch.Tensor:
        tensor = tensor.detach()
        if type(tensor) is not torch.Tensor:  # DTensor / ShardedTensor: let them copy themselves
            return tensor.to("cpu", copy=True)
        buf = self._buffers.get(path)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            pin = tensor.is_cuda
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buf
        used.add(path)
        buf.copy_(tensor, non_blocking=tensor.is_cuda)
        return buf
