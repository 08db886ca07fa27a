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

Why ``advance()``: with ``num_workers > 0`` the DataLoader draws index lists from the sampler several
batches ahead of training, so what the sampler has yielded says nothing about what was trained. Only
the loop knows when a step is done (it may also skip a step, or accumulate gradients over several
batches), so it says so, once per trained batch. Misuse is loud: ``advance()`` for a batch that was
never drawn raises, and so do ``state_dict()`` and moving to another epoch after a pass that drew
batches but never advanced (the tell-tale of a loop that forgot it; its checkpoint would replay the epoch).
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sized

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
        self.consumed = 0  # samples of this epoch the whole job has trained
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

    def _slice(self, start: int, size: int) -> tuple[int, int]:
        """This rank's [begin, end) within the global batch of ``size`` samples starting at ``start``."""
        base, extra = divmod(size, self.num_replicas)
        begin = start + self.rank * base + min(self.rank, extra)
        return begin, begin + base + (1 if self.rank < extra else 0)

    # -- iteration ------------------------------------------------------------------------
    def __len__(self) -> int:
        """Global batches left in this epoch (each yields this rank's slice)."""
        return -(-(self.samples_per_epoch - self.consumed) // self.global_batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        self._check_running("a new pass over the data")
        # A new pass starts at the trained position: batches an earlier pass drew ahead (prefetched by
        # DataLoader workers) but that were never trained are drawn again.
        self._pass += 1
        self._drawn = self._advanced = 0
        return self._batches(self._pass, self.epoch, self.consumed)

    def _batches(self, this_pass: int, epoch: int, start: int) -> Iterator[list[int]]:
        order = self.order(epoch)
        end = self.samples_per_epoch
        for position in range(start, end, self.global_batch_size):
            self._check_running("the next batch")
            if this_pass != self._pass:
                raise RuntimeError(
                    "ElasticSampler: this iterator is stale (set_epoch, load_state_dict or a newer iteration "
                    "moved the sampler); create the DataLoader iterator again"
                )
            begin, stop = self._slice(position, min(self.global_batch_size, end - position))
            self._drawn += 1
            yield order[begin:stop]

    def advance(self) -> None:
        """The next drawn global batch is trained: call once per trained batch, on every rank."""
        self._check_running("advance()")
        if self._advanced >= self._drawn:
            raise RuntimeError(
                f"ElasticSampler.advance() called {self._advanced + 1} times in this pass, but only "
                f"{self._drawn} batches were drawn: call it once per trained batch, after iterating the loader"
            )
        self._advanced += 1
        self.consumed = min(self.consumed + self.global_batch_size, self.samples_per_epoch)

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
    def state_dict(self) -> dict[str, int]:
        """Plain ints: the position, and what identifies the epoch's order (checked on load)."""
        self._check_advanced("state_dict")
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "dataset_size": self.dataset_size,
            "seed": self.seed,
            "shuffle": int(self.shuffle),
        }

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue where the saved job stopped; refuses a state whose sample order differs from this one's."""
        saved = {k: int(state_dict[k]) for k in ("epoch", "consumed", "dataset_size", "seed", "shuffle")}
        mine = {"dataset_size": self.dataset_size, "seed": self.seed, "shuffle": int(self.shuffle)}
        changed = {k: (saved[k], v) for k, v in mine.items() if saved[k] != v}
        if changed:
            listed = ", ".join(f"{k} saved {old}, now {new}" for k, (old, new) in changed.items())
            raise ValueError(f"ElasticSampler: the checkpoint's sample order differs from this sampler's ({listed}); "
                             "its position would mean other samples")
        if not 0 <= saved["consumed"] <= self.dataset_size or saved["epoch"] < 0:
            raise ValueError(f"ElasticSampler: invalid position epoch {saved['epoch']}, consumed {saved['consumed']}")
        self.epoch = saved["epoch"]
        # A drop_last change cannot move past the samples this epoch trains.
        self.consumed = min(saved["consumed"], self.samples_per_epoch)
        self._pass += 1
        self._drawn = self._advanced = 0


__all__ = ["ElasticSampler"]
