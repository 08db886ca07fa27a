"""The Checkpointer's driver of the memory tier (runtime/memory_tier.py): keep each completed step in node memory.

One writer per node (local rank 0) keeps the state of the last completed step in node-local shared memory:
captured on the training thread at ``step()``, committed by a thread of its own, at most one commit in flight.
Every rank reads its node's copy at restore. The tier is an optimisation: whatever goes wrong here is logged and
blob stands.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from azext_elastictrain.runtime import entries, memory_tier
from azext_elastictrain.runtime.errors import CheckpointError
from azext_elastictrain.runtime.state import StateError, json_tensor, modules_in, optimizers_in

log = logging.getLogger(__name__)

# A device state this large has the tier's slots made beside training rather than by its first two captures.
PREPARE_AHEAD_BYTES = 2**30


class MemoryKeeper:  # pylint: disable=too-many-instance-attributes  # the keeper thread, its copies and hooks
    """This worker's side of its node's memory tier: the writer (local rank 0) keeps steps, every rank reads."""

    def __init__(self, tier: memory_tier.MemoryTier, *, writer: bool):
        self.tier = tier
        self._keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastictrain-memory") if writer else None
        self._keeping: Future[None] | None = None
        self.memory_step: int | None = None  # the newest step this process committed to memory
        self._aside: Any = None  # the event after the last capture's copies on the copy stream
        self._preparing: Future[None] | None = None  # the slots being made on the keeper thread
        self._prepared = False  # the slots are made (or the first capture makes them)
        self._hooked: dict[int, Any] = {}  # id(optimizer) -> its step-pre-hook's handle

    @property
    def writer(self) -> bool:
        """True while this worker keeps its node's copy (local rank 0, until the tier turns off for it)."""
        return self._keeper is not None

    def keep(self, step: int, state: dict[str, Any], world_size: int) -> None:
        """This node's copy of the completed ``step`` (one writer per node; replicated states only).

        Here, on the training thread: the copy of the state into shared memory (CUDA: queued device-to-host
        copies), the one part that must precede the next step's in-place updates. The checksum and the
        commit run on the keeper thread; the previous commit is waited for first (at most one in flight).
        """
        if self._keeper is None:
            return
        # Sharded parameters: skip before flattening, which for them may take collectives this rank runs alone.
        if any(type(p.data) is not torch.Tensor  # pylint: disable=unidiomatic-typecheck  # sharded: DTensor
               for m in modules_in(state) for p in m.parameters()):
            return
        self.kept()
        try:
            tree = entries.tree(state, source=True)
            if not memory_tier.is_replicated(tree.flat):
                return
            flat = {k: v if isinstance(v, torch.Tensor) else json_tensor(v, k) for k, v in tree.flat.items()}
            flat[entries.STEP_KEY] = json_tensor(step, entries.STEP_KEY)
            if not self._slots_ready(flat, step):
                return
            capture = self.tier.capture(step, world_size, flat, self._stepped_only(state))
            self._aside = capture.aside
        except OSError as ex:  # no room (ENOSPC) or no shared memory: the tier is off for this worker
            log.warning("the memory tier is off for this worker: cannot keep step %d in %s: %s",
                        step, self.tier.directory, ex)
            self._keeper.shutdown(wait=False)
            self._keeper = None
            return
        except (ValueError, CheckpointError, StateError) as ex:  # an optimisation; blob stands
            log.warning("could not keep step %d in memory: %s", step, ex)
            return
        self._keeping = self._keeper.submit(self._commit, capture)

    def _slots_ready(self, flat: dict[str, torch.Tensor], step: int) -> bool:
        """Whether the tier's slots are made for this state. A device state of PREPARE_AHEAD_BYTES or more has
        them made and page-locked on the keeper thread while training goes on (for 19 GB that is ~20 s, which
        the first two captures paid on the training thread); its steps until then are not kept in memory (blob,
        or a peer, stands). A smaller one's first capture makes its slot, at once."""
        if self._prepared:
            return True
        assert self._keeper is not None
        if self._preparing is None:
            if self.tier.size(flat) < PREPARE_AHEAD_BYTES or not any(map(self.tier.copies.wanted, flat.values())):
                self._prepared = True
                return True
            log.info("the memory tier makes its slots (2 x %.1f GB) beside training, from step %d: until they are "
                     "ready steps are not kept in memory", self.tier.size(flat) / 1e9, step)
            self._preparing = self._keeper.submit(self.tier.prepare, flat)
            return False
        if not self._preparing.done():
            return False
        self._settle_preparing()  # its OSError (no room) turns the tier off, as a capture's would
        self._prepared = True
        return True

    def _settle_preparing(self) -> None:
        preparing, self._preparing = self._preparing, None
        if preparing is not None:
            preparing.result()

    def _stepped_only(self, state: dict[str, Any]) -> Callable[[torch.Tensor], bool] | None:
        """Which CUDA tensors may be copied beside the next step (PinnedCopies' copy stream): the parameters and
        optimizer state of the state's optimizers, which only an optimizer step changes in place, and each
        optimizer's step waits for the copies first (a step-pre-hook, on the device: the host goes on). The
        runtime's own writes into them (a heal from a peer) wait through ``landed``. None (everything on the
        training stream) when the state has no optimizer."""
        optimizers = optimizers_in(state)
        if not optimizers:
            return None
        storages: set[int] = set()
        for optimizer in optimizers:
            if id(optimizer) not in self._hooked:
                self._hooked[id(optimizer)] = optimizer.register_step_pre_hook(self._before_optimizer_step)
            for group in optimizer.param_groups:
                for param in group["params"]:
                    storages.add(param.untyped_storage().data_ptr())
            for value in optimizer.state.values():
                for item in value.values():
                    if isinstance(item, torch.Tensor):
                        storages.add(item.untyped_storage().data_ptr())
        copies = self.tier.copies
        return lambda tensor: copies.wanted(tensor) and tensor.untyped_storage().data_ptr() in storages

    def _before_optimizer_step(self, *_: Any) -> None:
        if self._aside is not None:
            self.tier.copies.wait_aside(self._aside)

    def landed(self) -> None:
        """The host waits until the last capture's copies have left the live tensors: before the runtime writes
        into them outside an optimizer step (a heal)."""
        if self._aside is not None:
            self._aside.synchronize()

    def _commit(self, capture: memory_tier.Capture) -> None:
        self.tier.commit(capture)
        self.memory_step = capture.step

    def kept(self) -> int | None:
        """The newest step this process committed to its node's memory (None: none, or not the writer),
        once the commit in flight, if any, is done."""
        keeping, self._keeping = self._keeping, None
        if keeping is not None:
            try:
                keeping.result()
            # pylint: disable-next=broad-exception-caught  # whatever the keeper thread raised: the memory
            except Exception as ex:  # noqa: BLE001  # tier is an optimisation and blob stands, training goes on
                log.warning("could not keep a step in memory: %s", ex)
        return self.memory_step

    def read(self) -> "memory_tier.MemoryCopy | None":
        """The node's newest whole copy (the commit in flight finished first), or None."""
        self.kept()
        self._quietly_settle()
        return self.tier.read()

    def parse(self, raw: Any) -> memory_tier.MemoryCopy:
        return self.tier.parse(raw)

    def discard(self) -> None:
        """The job is over: free the node's memory (the writer only, after its last commit)."""
        if self._keeper is not None:
            self.kept()
            self._quietly_settle()
            self.tier.discard()

    def _quietly_settle(self) -> None:
        """The slots' making finished (or failed: then there is nothing to read or free beyond what exists)."""
        try:
            self._settle_preparing()
        except OSError as ex:
            log.warning("the memory tier could not make its slots: %s", ex)

    def close(self) -> None:
        self._quietly_settle()
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        if self._keeper is not None:
            self._keeper.shutdown(wait=True)
