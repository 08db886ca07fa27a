"""The items ``Checkpointer.steps()`` and ``batches()`` iterate over, and the samplers found in a state."""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from azext_elastictrain.runtime.data import ElasticSampler


def count(start: int, total: int) -> Iterator[None]:
    """One item per step left: ``start + 1 .. total``."""
    for _ in range(start, total):
        yield None


def epoch_batches(loader: Iterable[Any], sampler: ElasticSampler, epochs: int) -> Iterator[Any]:
    """The batches left in the (restored) epoch, then those of every later epoch up to ``epochs``."""
    while sampler.epoch < epochs:
        yield from loader
        if sampler.epoch + 1 >= epochs:
            return
        sampler.set_epoch(sampler.epoch + 1)


def samplers_in(value: Any) -> Iterator[ElasticSampler]:
    """The ElasticSamplers of a state: its values, and those of nested dicts, lists and tuples."""
    for found in data_in(value):
        if isinstance(found, ElasticSampler):
            yield found


def data_in(value: Any) -> Iterator[Any]:
    """The samplers (any torch ``Sampler``) and DataLoaders of a state: its values, and those of nested dicts,
    lists and tuples."""
    from torch.utils.data import DataLoader, Sampler

    if isinstance(value, (Sampler, DataLoader)):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from data_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from data_in(item)
