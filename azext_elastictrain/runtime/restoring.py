"""Restore: every rank loads the same newest state it can prove complete, from memory, a peer or blob.

Rank 0 lists the complete blob checkpoints and broadcasts them. The newest whole copy in any node's memory
(runtime/memory.py) wins unless blob holds a newer step; otherwise every rank tries the same blob checkpoint and
they move on together to the next newest if any rank finds a file damaged. Whatever the source, DCP loads through
a planner that proves every key of the state was loaded, and nothing read is unpickled.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime import entries, memory_tier, progress
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.errors import CheckpointError, cause, failure_text
from azext_elastictrain.runtime.memory import MemoryKeeper
from azext_elastictrain.runtime.planners import CheckingLoadPlanner, StateMismatch, names
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.state import StateError, StateTree, json_value, restore_rng
from azext_elastictrain.runtime.storage import METADATA, METADATA_JSON, BlobCheckpointReader

log = logging.getLogger(__name__)

# What loading one checkpoint came to on a rank (all-reduced: the worst wins).
LOADED, UNREADABLE, MISMATCH = 0, 1, 2


@dataclass(frozen=True)
class Restored:
    """What a restore came to: the step loaded (None: none), blob's newest, and the step blob is known to hold."""
    step: int | None
    newest_blob: int | None
    durable_step: int | None  # a save of this step would be refused as a second commit


class Restorer:  # pylint: disable=too-few-public-methods  # one job: restore
    """Loads the newest provable state into a live one (collective: every rank, the same calls)."""

    def __init__(self, store: BlobStore, job_prefix: str, collectives: Collectives, reporter: Reporter, *,
                 memory: MemoryKeeper | None = None, verify: bool = True):
        self.store = store
        self.job_prefix = job_prefix
        self.ranks = collectives
        self.reporter = reporter
        self.memory = memory
        self.verify = verify

    def restore(self, state: dict[str, Any]) -> Restored:
        started = time.monotonic()
        rank = self.ranks.rank
        candidates: list[bytes] = []
        if rank == 0:
            listed = catalog.list_checkpoints(self.store, self.job_prefix)
            candidates = [c.manifest.to_bytes() for c in reversed(listed) if c.complete and c.manifest]
            skipped = [c.step for c in listed if c.status == catalog.DAMAGED]
            if skipped:
                log.warning("skipping damaged checkpoints at steps %s", skipped)
        candidates = self.ranks.broadcast(candidates)
        newest_blob = layout.Manifest.from_bytes(candidates[0]).step if candidates else None
        rescued = self._from_memory(state, newest_blob, started)
        if rescued is not None:
            return Restored(rescued, newest_blob, rescued if rescued == newest_blob else None)
        fallbacks = 0
        # Only with a checkpoint to load: looking at a fresh optimizer's state initialises it.
        tree = entries.tree(state) if candidates else None
        for raw in candidates:
            manifest = layout.Manifest.from_bytes(raw)
            try:
                outcome, problem = self._load(manifest, cast(StateTree, tree)), ""  # a candidate: a tree
            except StateMismatch as ex:
                outcome, problem = MISMATCH, str(ex)
            outcome = self.ranks.all_reduce_max([outcome])[0]
            if outcome == MISMATCH:
                raise CheckpointError(
                    f"the checkpoint of step {manifest.step} does not fit the state passed to restore: "
                    f"{problem or 'see the log of another rank'}. Pass the same keys the training saved "
                    "(or a new job prefix for a different state)"
                )
            if outcome == LOADED:
                seconds = time.monotonic() - started
                if rank == 0:
                    log.info("restored step %d in %.2fs", manifest.step, seconds)
                    self.reporter.emit(progress.RESTORED, step=manifest.step, seconds=round(seconds, 3),
                                       source="blob", fallbacks=fallbacks, world_size=self.ranks.world_size,
                                       saved_world_size=manifest.world_size)
                return Restored(manifest.step, newest_blob, manifest.step)
            fallbacks += 1
            if rank == 0:
                log.warning("checkpoint of step %d is unreadable; falling back", manifest.step)
        if rank == 0:
            self.reporter.emit(progress.RESTORED, step=None, fallbacks=fallbacks, world_size=self.ranks.world_size)
        return Restored(None, newest_blob, None)

    def _load(self, manifest: layout.Manifest, tree: StateTree) -> int:
        """LOADED, or UNREADABLE (damaged, refused: try the previous one); StateMismatch if it does not fit."""
        names_in_it = {f.path.rsplit("/", 1)[-1] for f in manifest.files}
        if METADATA_JSON not in names_in_it and METADATA in names_in_it:
            raise CheckpointError(
                f"the checkpoint of step {manifest.step} was written by an earlier elastictrain whose metadata "
                "is pickled, and restore never unpickles what it reads from storage; resume this job with the "
                "version that wrote it, or start it under a new prefix"
            )
        mine = entries.rng_prefix(self.ranks.rank)
        reader = BlobCheckpointReader(self.store, self.job_prefix, manifest, verify=self.verify)
        try:
            forget_absent_optimizer_states(tree, reader)
            flat = dict(tree.flat)  # DCP copies this; the planner holds the copy it loads
            planner = CheckingLoadPlanner(tree.free, adopt=(mine, entries.STEP_KEY), ignore=(entries.RNG_PREFIX,))
            dcp.load(flat, storage_reader=reader, planner=planner, process_group=self.ranks.control,
                     no_dist=not self.ranks.distributed)
        except (Exception, CheckpointException) as ex:  # pylint: disable=broad-exception-caught
            # unreadable: try the previous one
            # (DCP wraps every rank's read error in CheckpointException, a BaseException.)
            mismatch = cause(ex, StateMismatch)
            if mismatch is not None:
                raise mismatch from ex
            log.warning("cannot load checkpoint of step %d: %s", manifest.step, failure_text(ex))
            return UNREADABLE
        self._apply(manifest.step, tree, planner, mine)
        return LOADED

    def _apply(self, step: int, tree: StateTree, planner: CheckingLoadPlanner, mine: str) -> None:
        """Prove every key was loaded, decode the plain values, and put it all into the live state."""
        skipped = planner.not_loaded()
        if skipped:
            raise StateMismatch(f"keys not loaded on rank {self.ranks.rank}: {names(skipped)}")
        loaded = planner.state_dict  # the flat dict DCP loaded, adopted keys included
        plain = tree.json_keys | {mine + name for name in entries.RNG_JSON} | {entries.STEP_KEY}
        try:
            for key in plain & set(loaded):
                loaded[key] = json_value(loaded[key], key)
        except StateError as ex:
            raise StateMismatch(str(ex)) from ex
        tree.apply({key: loaded[key] for key in tree.flat})
        rng = {k[len(mine):]: v for k, v in loaded.items() if k.startswith(mine)}
        if rng:
            restore_rng(rng)
        else:
            # The world grew: a new rank has no saved stream. Derive one from
            # (step, rank) so reruns stay reproducible.
            torch.manual_seed(step * 100003 + self.ranks.rank)

    # -- the memory tier ---------------------------------------------------------------
    def _from_memory(self, state: dict[str, Any], newest_blob: int | None, started: float) -> int | None:
        """Load the newest whole in-memory copy any rank's node holds, unless blob has a newer step.

        One all-gather of (step, checksum) picks it; its holder broadcasts the bytes, every rank checks
        their checksum and loads them through the same planner and "every key loaded" proof as a blob
        restore. Any failure on any rank: None, and the caller restores from blob.
        """
        if self.memory is None:
            return None
        copy = self.memory.read()
        # Only with a copy to load: looking at a fresh optimizer's state initialises it.
        tree = entries.tree(state) if copy is not None else None
        if tree is not None and not memory_tier.is_replicated(tree.flat):
            copy = None  # sharded: one node's copy is not the whole state
        offers: list[tuple[int, int]] = self.ranks.all_gather((copy.step, copy.checksum) if copy else (-1, 0))
        best = max(step for step, _ in offers)
        if best < 0 or (newest_blob is not None and best < newest_blob):
            return None  # nothing in memory, or only older than blob's newest
        tree = tree or entries.tree(state)
        holder = min(rank for rank, (step, _) in enumerate(offers) if step == best)
        wanted = offers[holder]
        try:
            shared = self._share(copy if offers[self.ranks.rank] == wanted else None, holder)
            outcome = self._load_memory(shared, tree, wanted)
        except (Exception, CheckpointException) as ex:  # pylint: disable=broad-exception-caught
            # any failure: blob instead
            # (DCP wraps a planner's error, StateMismatch or "keys not loaded" included, in CheckpointException.)
            log.warning("the in-memory state of step %d cannot be loaded here: %s", best, failure_text(ex))
            shared, outcome = None, UNREADABLE
        if self.ranks.all_reduce_max([outcome])[0] != LOADED:
            log.warning("the in-memory state of step %d is not usable on every rank; restoring from blob", best)
            return None
        shared = cast(memory_tier.MemoryCopy, shared)  # every rank loaded it: this one's share did not fail
        seconds = time.monotonic() - started
        if self.ranks.rank == 0:
            log.info("restored step %d from memory (holder rank %d) in %.2fs", best, holder, seconds)
            self.reporter.emit(progress.RESTORED, step=best, seconds=round(seconds, 3),
                               source="memory" if offers[0] == wanted else "peer", holder=holder,
                               ranks_from_peer=sum(1 for offer in offers if offer != wanted), fallbacks=0,
                               world_size=self.ranks.world_size, saved_world_size=shared.world_size)
        return best

    def _share(self, own: "memory_tier.MemoryCopy | None", holder: int) -> memory_tier.MemoryCopy:
        """The holder's copy on every rank: sent as bytes, parsed (checksum checked) where it arrives."""
        raw = self.ranks.broadcast_bytes(own.raw if own is not None else None, holder)
        if own is not None and raw is own.raw:
            return own  # this node holds the same bytes (its checksum was the one agreed on)
        return cast(MemoryKeeper, self.memory).parse(raw)  # _from_memory shares only with a memory tier

    def _load_memory(self, copy: memory_tier.MemoryCopy, tree: StateTree, wanted: tuple[int, int]) -> int:
        if not memory_tier.is_replicated(tree.flat):
            return UNREADABLE
        if (copy.step, copy.checksum) != wanted:
            log.warning("the in-memory state received is not the one agreed on")
            return UNREADABLE
        reader = memory_tier.MemoryStateReader(copy.tensors)
        forget_absent_optimizer_states(tree, reader)
        flat = dict(tree.flat)
        mine = entries.rng_prefix(self.ranks.rank)
        planner = CheckingLoadPlanner(tree.free, adopt=(mine, entries.STEP_KEY), ignore=(entries.RNG_PREFIX,))
        dcp.load(flat, storage_reader=reader, planner=planner, no_dist=True)
        self._apply(copy.step, tree, planner, mine)
        return LOADED


def forget_absent_optimizer_states(tree: StateTree, reader: Any) -> None:
    """Parameters the source's optimizer has no state for (it never had a gradient: an unused head) get none here
    either, though torch gave the fresh optimizer a state for every parameter to load into (StateTree)."""
    tree.forget(tree.absent_groups(reader.read_metadata().state_dict_metadata))
