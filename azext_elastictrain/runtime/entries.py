"""Our own entries in every checkpoint and memory copy: each rank's RNG states and the step.

They live under one reserved key of the flat state, so no key of the user's state can collide with them.
"""
from __future__ import annotations

from typing import Any

import torch

from azext_elastictrain.runtime.errors import CheckpointError
from azext_elastictrain.runtime.state import SEP, StateError, StateTree

RESERVED = "_elastictrain"
RNG_PREFIX = f"{RESERVED}{SEP}rng{SEP}"
STEP_KEY = f"{RESERVED}{SEP}step"
RNG_JSON = ("python_extra", "numpy_extra")  # the plain parts of capture_rng's state


def rng_prefix(rank: int) -> str:
    """The keys of ``rank``'s own RNG streams."""
    return f"{RNG_PREFIX}{rank}{SEP}"


def tree(state: dict[str, Any], *, source: bool = False) -> StateTree:
    """The flat view of a training state, our reserved key kept free; a state it cannot take: CheckpointError.
    ``source``: the view that is saved or sent, not loaded into (StateTree)."""
    try:
        return StateTree(state, reserved=RESERVED, source=source)
    except StateError as ex:
        raise CheckpointError(str(ex)) from ex


def rng_items(rank: int, rng: dict[str, Any]) -> dict[str, Any]:
    """``rank``'s RNG state (capture_rng's) as flat checkpoint entries: tensor lists one entry per tensor."""
    items: dict[str, Any] = {}
    for name, value in rng.items():
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            items.update({f"{rng_prefix(rank)}{name}{SEP}{i}": t for i, t in enumerate(value)})
        else:
            items[f"{rng_prefix(rank)}{name}"] = value
    return items
