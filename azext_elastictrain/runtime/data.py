"""ElasticSampler: every sample of every epoch trained exactly once, across evictions and world sizes.

A training script does::

    sampler = ElasticSampler(dataset, global_batch_size=256, seed=0)   # after init_process_group
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=4)
    state = {"model": model, "optimizer": optimizer, "data": sampler}
    for step, batch in ckpt.batches(state, loader, epochs=3):   # restores: the sampler comes back mid-epoch
        ...one training step...                                 # batches() calls set_epoch() and advance()

A loop of its own calls ``sampler.set_epoch(epoch)`` at each epoch's start (the restored epoch keeps its
position) and ``sampler.advance()`` after each trained batch. After a stop (``stop()``, which the
Checkpointer calls) any further use ends the process: a nested loop whose ``break`` leaves only the inner
loop cannot start the next epoch and skip the rest of this one.

The epoch's order is a function of (seed, epoch) only: ``randperm(len(dataset))`` from a generator
seeded ``seed + epoch``, the order torch's ``DistributedSampler`` draws. Global batch ``i`` of the epoch
is ``order[i*B:(i+1)*B]``; rank ``r`` of ``W`` takes the contiguous slice ``r*B/W:(r+1)*B/W`` of it, so
the ranks' slices joined in rank order are the global batch at every world size. The position is
the number of samples the whole job has trained in the epoch, which is the same on every rank and
means the same at any world size: a resume at another world size continues with the next global batch.

A step trained without some ranks' slices (the in-process mode's salvage of a step a node vanished from,
``advance(missing=...)``) leaves those samples owed: the next global batch is the owed samples followed by the
global batch that comes next anyway, so each sample is still trained once in the epoch, one step trains a larger
batch, and every later batch is the one an uninterrupted run trains.

Why ``advance()``: with ``num_workers > 0`` the DataLoader draws index lists from the sampler several
batches ahead of training, so what the sampler has yielded says nothing about what was trained. Only
the loop knows when a step is done (it may also skip a step, or accumulate gradients over several
batches), so it says so, once per trained batch. Misuse is loud: ``advance()`` for a batch that was
never drawn raises, and so do ``state_dict()`` and moving to another epoch after a pass that drew
batches but never advanced (the tell-tale of a loop that forgot it; its checkpoint would replay the epoch).
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Sized

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Sampler

from azext_elastictrain.runtime.stopping import TrainingStopped


class ElasticSampler(Sampler[list[int]], Stateful):  # pylint: disable=too-many-instance-attributes  # its position
    """A batch sampler over a map-style dataset with a fixed global batch size and a checkpointed position.

    ``global_batch_size`` must be divisible by the world size: each rank takes an equal slice (a
    ValueError names both numbers otherwise). ``drop_last=True`` drops the epoch's final partial
    global batch (``len(dataset) % global_batch_size`` samples, not trained that epoch);
    ``drop_last=False`` (the default, as in torch) trains it, split among the ranks as evenly as
    possible (slice sizes differ by at most one; weight the loss by slice size if that matters), and
    refuses a world size larger than that final batch, since a rank would get no sample at all.
    """

    def __init__(self, dataset: Sized, global_batch_size: int, num_replicas: int | None = None,
                 rank: int | None = None, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        distributed = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas}) (num_replicas {num_replicas})")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be at least 1, not {global_batch_size}")
        self.dataset_size = len(dataset)
        self.global_batch_size = global_batch_size
        self.drop_last = drop_last
        problem = self.world_problem(num_replicas)
        if problem:
            raise ValueError(problem)
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.consumed = 0  # samples of this epoch the whole job has trained, from the epoch's start on
        self.owed: list[int] = []  # positions before ``consumed`` not trained yet: they lead the next global batch
        self._pass = 0  # which __iter__ is current; an older one stops with an error
        self._drawn = 0  # global batches the current pass has yielded
        self._advanced = 0  # ...and of those, how many were trained
        self._stopped_at: int | None = None  # the step the job was stopped at (stop())

    # -- the epoch's layout -------------------------------------------------------------
    @property
    def samples_per_epoch(self) -> int:
        """Samples the epoch trains: all of them, or all but the final partial global batch."""
        if self.drop_last:
            return self.dataset_size - self.dataset_size % self.global_batch_size
        return self.dataset_size

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.samples_per_epoch // self.global_batch_size)

    def world_problem(self, num_replicas: int) -> str | None:
        """Why this sampler cannot serve a world of ``num_replicas`` ranks, or None: every rank takes an equal slice
        of each global batch, and, with ``drop_last=False``, at least one sample of the epoch's final one."""
        if self.global_batch_size % num_replicas:
            return (f"global batch size {self.global_batch_size} is not divisible by the world size {num_replicas}: "
                    "every rank takes an equal slice of each global batch; choose a global batch size that every "
                    "world size the job may run at divides (e.g. 12 or 24 for 1 to 4 ranks)")
        tail = self.dataset_size % self.global_batch_size
        if not self.drop_last and 0 < tail < num_replicas:
            return (f"the final global batch of each epoch has {tail} samples ({self.dataset_size} % "
                    f"{self.global_batch_size}), fewer than the world size {num_replicas}: a rank would get none; "
                    "use drop_last=True, or a global batch size that leaves a larger or no remainder")
        return None

    def check_worlds(self, worlds: Iterable[int]) -> None:
        """Refuse, before training, a job that may run at a world size this sampler cannot serve (a ValueError
        naming the first): the job's nodes range times each node's workers (``Checkpointer.batches()``), so a
        scale-up mid-job cannot end in a rank without data or an uneven slice."""
        for world in worlds:
            problem = self.world_problem(world)
            if problem:
                raise ValueError(f"{problem} (the job may run at {world} ranks)")

    def order(self, epoch: int | None = None) -> list[int]:
        """The global sample order of ``epoch`` (default: the current one); independent of the world size."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def _slice(self, start: int, size: int, rank: int | None = None) -> tuple[int, int]:
        """This rank's (or ``rank``'s) [begin, end) within the global batch of ``size`` samples at ``start``."""
        rank = self.rank if rank is None else rank
        base, extra = divmod(size, self.num_replicas)
        begin = start + rank * base + min(rank, extra)
        return begin, begin + base + (1 if rank < extra else 0)

    # -- iteration ------------------------------------------------------------------------
    def __len__(self) -> int:
        """Global batches left in this epoch (each yields this rank's slice)."""
        return -(-(self.samples_per_epoch - self.consumed) // self.global_batch_size) or (1 if self.owed else 0)

    def __iter__(self) -> Iterator[list[int]]:
        self._check_running("a new pass over the data")
        # A new pass starts at the trained position: batches an earlier pass drew ahead (prefetched by
        # DataLoader workers) but that were never trained are drawn again.
        self._pass += 1
        self._drawn = self._advanced = 0
        return self._batches(self._pass, self.epoch, self.consumed)

    def _batches(self, this_pass: int, epoch: int, start: int) -> Iterator[list[int]]:
        order = self.order(epoch)
        owed = list(self.owed)
        position = start
        while position < self.samples_per_epoch or owed:
            self._check_running("the next batch")
            if this_pass != self._pass:
                raise RuntimeError(
                    "ElasticSampler: this iterator is stale (set_epoch, load_state_dict or a newer iteration "
                    "moved the sampler); create the DataLoader iterator again"
                )
            positions = self._positions(position, owed)
            begin, stop = self._slice(0, len(positions))
            self._drawn += 1
            owed = []
            position += self.global_batch_size
            yield [order[i] for i in positions[begin:stop]]

    def _positions(self, start: int, owed: list[int]) -> list[int]:
        """The positions (in the epoch's order) of the global batch at ``start``, led by the ``owed`` ones."""
        return owed + list(range(start, min(start + self.global_batch_size, self.samples_per_epoch)))

    def advance(self, missing: Iterable[int] = ()) -> None:
        """The next drawn global batch is trained: call once per trained batch, on every rank.

        ``missing``: ranks (of this world) whose slices of it were not trained (a node that vanished mid-step,
        the step committed without it): those samples lead the next global batch. The loader's iterator must then
        be created again (a new pass, as after ``reshard``), since batches drawn ahead do not hold them."""
        self._check_running("advance()")
        if self._advanced >= self._drawn:
            raise RuntimeError(
                f"ElasticSampler.advance() called {self._advanced + 1} times in this pass, but only "
                f"{self._drawn} batches were drawn: call it once per trained batch, after iterating the loader"
            )
        missing = sorted(set(missing))
        if any(not 0 <= rank < self.num_replicas for rank in missing):
            raise ValueError(f"ElasticSampler.advance(): missing ranks {missing} are not all in a world of "
                             f"{self.num_replicas}")
        self._advanced += 1
        positions = self._positions(self.consumed, self.owed)  # the batch trained (only a pass's first has owed)
        owed: list[int] = []
        for rank in missing:
            begin, stop = self._slice(0, len(positions), rank)
            owed.extend(positions[begin:stop])
        self.owed = owed
        self.consumed = min(self.consumed + self.global_batch_size, self.samples_per_epoch)
        if owed:
            self._pass += 1
            self._drawn = self._advanced = 0

    def reshard(self, num_replicas: int, rank: int) -> None:
        """From the trained position on, take slice ``rank`` of ``num_replicas`` of each global batch.

        For a world that changes size while the process lives (the in-process recovery mode): batches drawn
        ahead for the old world are dropped (a new pass starts at the trained position, so the loader's
        iterator must be created again), and the global position is untouched, so no sample is skipped or
        trained twice.
        """
        self._check_running("reshard()")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas}) (num_replicas {num_replicas})")
        problem = self.world_problem(num_replicas)
        if problem:
            raise ValueError(problem)
        self.num_replicas, self.rank = num_replicas, rank
        self._pass += 1
        self._drawn = self._advanced = 0

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of ``epoch``; setting the epoch the sampler is in keeps its (restored) position."""
        self._check_running(f"set_epoch({epoch})")
        if epoch == self.epoch:
            return
        self._check_advanced("set_epoch")
        if self.owed:
            raise RuntimeError(f"ElasticSampler.set_epoch({epoch}): {len(self.owed)} samples of epoch {self.epoch} "
                               "are owed (a step trained without a vanished node's slice); train the epoch's last "
                               "batch, which holds them, first")
        self.epoch, self.consumed = epoch, 0
        self._pass += 1
        self._drawn = self._advanced = 0

    def stop(self, step: int | None = None) -> None:
        """The job was stopped (at ``step``): its position is saved. From now on any use that would hand out or
        move past data (a new pass, the next batch, ``advance()``, ``set_epoch()``) ends the process with
        ``TrainingStopped``: a loop that left only its inner loop on the stop cannot go on into the next epoch
        and skip the rest of this one. ``Checkpointer`` calls this for every sampler in the state at a stop."""
        self._stopped_at = -1 if step is None else step

    @property
    def stopped(self) -> bool:
        return self._stopped_at is not None

    def _check_running(self, what: str) -> None:
        if self._stopped_at is not None:
            step = None if self._stopped_at < 0 else self._stopped_at
            raise TrainingStopped(step, f"ElasticSampler: {what} after the stop")

    def _check_advanced(self, what: str) -> None:
        if self._drawn and not self._advanced:
            raise RuntimeError(
                f"ElasticSampler.{what}(): {self._drawn} batches were drawn in this pass but advance() was "
                "never called; call sampler.advance() after each trained step, or a resume repeats the epoch"
            )

    # -- checkpointed state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain ints: the position, and what identifies the epoch's order (checked on load). The position is
        ``consumed``; while samples are owed (a step trained without a vanished node's slice, until the next step
        trains them) it is the list ``[consumed, *owed]``, under the same key, so that a checkpoint holds the same
        keys whether a step was salvaged or not (a restore refuses a checkpoint whose keys differ from the state's).
        """
        self._check_advanced("state_dict")
        return {
            "epoch": self.epoch,
            "consumed": [self.consumed, *self.owed] if self.owed else self.consumed,
            "dataset_size": self.dataset_size,
            "seed": self.seed,
            "shuffle": int(self.shuffle),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue where the saved job stopped; refuses a state whose sample order differs from this one's."""
        position = state_dict["consumed"]
        consumed, *owed = position if isinstance(position, list) and position else [position]
        saved = {k: int(state_dict[k]) for k in ("epoch", "dataset_size", "seed", "shuffle")}
        saved["consumed"] = int(consumed)
        mine = {"dataset_size": self.dataset_size, "seed": self.seed, "shuffle": int(self.shuffle)}
        changed = {k: (saved[k], v) for k, v in mine.items() if saved[k] != v}
        if changed:
            listed = ", ".join(f"{k} saved {old}, now {new}" for k, (old, new) in changed.items())
            raise ValueError(f"ElasticSampler: the checkpoint's sample order differs from this sampler's ({listed}); "
                             "its position would mean other samples")
        if not 0 <= saved["consumed"] <= self.dataset_size or saved["epoch"] < 0:
            raise ValueError(f"ElasticSampler: invalid position epoch {saved['epoch']}, consumed {saved['consumed']}")
        if not all(isinstance(p, int) and 0 <= p < saved["consumed"] for p in owed) or len(set(owed)) < len(owed):
            raise ValueError(f"ElasticSampler: invalid owed positions {owed!r:.80} (before consumed "
                             f"{saved['consumed']})")
        self.epoch = saved["epoch"]
        # A drop_last change cannot move past the samples this epoch trains.
        self.consumed = min(saved["consumed"], self.samples_per_epoch)
        self.owed = [int(p) for p in owed]
        self._pass += 1
        self._drawn = self._advanced = 0


__all__ = ["ElasticSampler"]
