"""The data of the in-process mode's loop: each step's slice follows the quorum, exactly once across changes.

The global position (samples the job trained in the epoch) is the same on every replica; each step takes slice
``replica rank x node workers + local rank`` of ``participants x node workers`` of the next global batch. When the
quorum changes, or a step is discarded, the batches the DataLoader fetched ahead for the old world are dropped and
its iterator is created again at the global position (``ElasticSampler.reshard``). The global batch stays the
same, so a step means the same maths at any world size.
"""
from __future__ import annotations

from typing import Any, Iterable

from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.replicas import Quorum


def layout(quorum: Quorum, node_rank: int, node_size: int) -> tuple[int, int]:
    """(ranks, rank) of this worker's slice for ``quorum`` (a replica not in it trains nothing it keeps: rank 0's
    slice, its gradients zeroed in the collective)."""
    return quorum.participants * node_size, (quorum.rank or 0) * node_size + node_rank


class ReplicaBatches:
    """The batch of each step in the in-process loop (see the module's docstring)."""

    def __init__(self, loader: Iterable[Any], sampler: ElasticSampler, epochs: int, *, node_rank: int,
                 node_size: int):
        self.loader, self.sampler, self.epochs = loader, sampler, epochs
        self.node_rank, self.node_size = node_rank, node_size
        self._iterator: Any = None
        self._layout: tuple[int, int] | None = None

    def finished(self) -> bool:
        """Every batch of every epoch is trained."""
        sampler = self.sampler
        if sampler.epoch >= self.epochs:
            return True
        return sampler.consumed >= sampler.samples_per_epoch and not sampler.owed and sampler.epoch + 1 >= self.epochs

    def next(self, quorum: Quorum) -> Any:
        """This worker's slice of the next global batch under ``quorum``."""
        if self.sampler.consumed >= self.sampler.samples_per_epoch and not self.sampler.owed:
            self.sampler.set_epoch(self.sampler.epoch + 1)
            self._iterator = None
        wanted = layout(quorum, self.node_rank, self.node_size)
        if self._iterator is None or wanted != self._layout:
            self.sampler.reshard(*wanted)
            self._iterator, self._layout = iter(self.loader), wanted
        return next(self._iterator)

    def healed(self) -> None:
        """The peer's position at this step's start was loaded, before the step's batch is drawn: the loader's
        iterator is stale, and the next batch is the peer's (the epoch moves on in ``next`` as on the peer)."""
        self._iterator = None

    def salvageable(self) -> bool:
        """Whether the coming step's batch may be committed without a vanished node's slice, owed to the next batch
        (runtime/salvage.py): not the epoch's last batch, which has no next one in its epoch."""
        sampler = self.sampler
        if sampler.consumed >= sampler.samples_per_epoch:  # the next epoch's first batch, unless samples are owed
            return not sampler.owed and sampler.global_batch_size < sampler.samples_per_epoch
        return sampler.consumed + sampler.global_batch_size < sampler.samples_per_epoch

    def trained(self, lost: Iterable[int] = ()) -> None:
        """The step is committed: the position moves on by one global batch. ``lost``: replica ranks whose slices
        it did not train (a salvaged step): they lead the next global batch."""
        missing = [r * self.node_size + i for r in lost for i in range(self.node_size)]
        if not missing:
            self.sampler.advance()  # as a loop of the script's own calls it (a sampler's subclass may not take more)
            return
        self.sampler.advance(missing=missing)
        self._iterator = None  # a new pass: the next batch holds the owed samples

    def discarded(self) -> None:
        """The step is discarded: its global batch is trained again at the next step (at that step's layout)."""
        if self._layout is not None:
            self.sampler.reshard(*self._layout)
        self._iterator = None
