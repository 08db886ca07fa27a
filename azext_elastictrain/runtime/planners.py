"""DCP planners for flat state dicts whose every item is a tensor.

DCP's default planners ``torch.save`` every non-tensor item and read it back
with ``torch.load(weights_only=False)``: a full unpickle of bytes from storage.
Here plain values are JSON text in uint8 tensors (``state.json_tensor``), so a
checkpoint holds tensors only; the save planner refuses anything else and the
load planner refuses any bytes item. The load planner also checks that the live
state and the checkpoint hold the same keys, and records every key it loaded so
the caller can prove nothing was skipped.
"""
from __future__ import annotations

import dataclasses
import io
from typing import Any, Iterable

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem, SavePlan, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor

SHOWN = 20  # key names an error lists before "and N more"


class StateMismatch(ValueError):
    """The live state and the checkpoint do not hold the same keys (or kinds of item)."""


class RefusedItem(ValueError):
    """A checkpoint item that is not what this runtime writes (e.g. a pickle where a tensor belongs)."""


def names(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


class TensorSavePlanner(DefaultSavePlanner):
    """Saves a flat dict of tensors; ``paths`` (flat key -> nesting) goes into the metadata's
    planner_data, as DCP's own flattening does, so offline tools rebuild the nesting."""

    def __init__(self, paths: dict[str, tuple[str | int, ...]] | None = None) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.paths = paths

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = super().create_global_plan(all_plans)
        if self.paths is not None:
            metadata = dataclasses.replace(metadata, planner_data=dict(self.paths))
            # DefaultSavePlanner.create_global_plan keeps the global metadata in self.metadata; ours replaces it.
            self.metadata = metadata  # pylint: disable=attribute-defined-outside-init
        return plans, metadata

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:  # noqa: A002 - DCP's name
        if write_item.type == WriteItemType.BYTE_IO:
            raise RefusedItem(f"{write_item.index.fqn!r} is not a tensor; plain values are saved as JSON tensors")
        return object


def placeholder(saved: Any, live: Any) -> torch.Tensor | None:
    """What DCP loads a free item into: a tensor of the checkpoint's size and dtype on the live tensor's device
    (a CUDA tensor whose size changed comes back on its GPU, not on CPU), on CPU where the live value is no tensor;
    None for a bytes item (refused when read)."""
    if not isinstance(saved, TensorStorageMetadata):
        return None
    device = live.device if isinstance(live, torch.Tensor) else torch.device("cpu")
    return torch.empty(saved.size, dtype=saved.properties.dtype, device=device)


class CheckingLoadPlanner(DefaultLoadPlanner):
    """Loads a flat dict and refuses a checkpoint that does not fit it.

    ``free`` keys take their type and size from the checkpoint (a fresh
    placeholder each); others (module and optimizer tensors) load in place.
    Checkpoint keys starting with ``adopt`` are added to the state as free
    keys; those starting with ``ignore`` (and not adopted) are not required.
    """

    def __init__(self, free: set[str], adopt: tuple[str, ...] = (), ignore: tuple[str, ...] = ()):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.free = set(free)
        self.adopt = adopt
        self.ignore = ignore
        self.loaded: set[str] = set()

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        if metadata is None:
            raise StateMismatch("the checkpoint has no metadata")
        saved = metadata.state_dict_metadata
        for fqn in saved:
            if self.adopt and fqn.startswith(self.adopt) and fqn not in state_dict:
                state_dict[fqn] = None
                self.free.add(fqn)
        required = {k for k in saved if not (self.ignore and k.startswith(self.ignore)) or k in state_dict}
        only_saved, only_live = required - set(state_dict), set(state_dict) - set(saved)
        problems = []
        if only_saved:
            problems.append(f"the checkpoint has keys the state lacks: {names(only_saved)}")
        if only_live:
            problems.append(f"the state has keys the checkpoint lacks: {names(only_live)}")
        kinds = [k for k in set(state_dict) & set(saved) - self.free
                 if isinstance(state_dict[k], torch.Tensor) != isinstance(saved[k], TensorStorageMetadata)]
        if kinds:
            problems.append(f"tensor in one, not in the other: {names(kinds)}")
        if problems:
            raise StateMismatch("; ".join(problems))
        for fqn in self.free:
            state_dict[fqn] = placeholder(saved[fqn], state_dict[fqn])
        super().set_up_planner(state_dict, metadata, is_coordinator)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        raise RefusedItem(f"checkpoint item {read_item.dest_index.fqn!r} is a bytes item, which this runtime "
                          "never writes (DCP would unpickle it); refusing to deserialize it")

    def resolve_bytes(self, read_item: ReadItem) -> io.BytesIO:
        """A reader's other way into a bytes item: refused like load_bytes."""
        self.load_bytes(read_item, io.BytesIO())
        raise AssertionError("unreachable: load_bytes refuses every bytes item")

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        super().commit_tensor(read_item, tensor)
        self.loaded.add(read_item.dest_index.fqn)

    def not_loaded(self) -> set[str]:
        """Keys of the state this rank should have loaded and did not (empty shards have nothing to load)."""
        def has_data(value: Any) -> bool:
            if isinstance(value, DTensor):
                return value.to_local().numel() > 0
            return not isinstance(value, torch.Tensor) or value.numel() > 0

        return {k for k, v in self.state_dict.items() if has_data(v)} - self.loaded
