"""Save: a step's state to blob, atomically, with training stalled only for the in-memory snapshot.

``save`` runs on the training thread: every rank takes rank 0's module buffers, the ranks agree on a token that
names this attempt's folder and exchange their RNG states, and the state is copied to CPU memory. The upload runs
on a thread of its own, at most one at a time, DCP's collectives on the ``io`` group. Each rank writes its files
once (``If-None-Match: *``) under the attempt's folder; rank 0 writes ``manifest.json`` last, the commit, and a
second commit of the same step is refused (``FencedError``). Retention runs after each commit.
"""
from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from azext_elastictrain.core import catalog, layout
from azext_elastictrain.core.blobstore import BlobStore, WriteConflict
from azext_elastictrain.core.settings import DEFAULTS
from azext_elastictrain.runtime import entries, progress
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.errors import CheckpointError, FencedError, fenced
from azext_elastictrain.runtime.planners import TensorSavePlanner
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.state import SEP, Snapshotter, StateError, capture_rng, json_tensor, modules_in
from azext_elastictrain.runtime.storage import BlobCheckpointWriter

log = logging.getLogger(__name__)


class BlobSaver:  # pylint: disable=too-many-instance-attributes  # the settings and the one upload in flight
    """Checkpoints of one job prefix in blob: save, wait for the upload in flight, retention."""

    def __init__(self, store: BlobStore, job_prefix: str, collectives: Collectives, reporter: Reporter, *,
                 keep: int = DEFAULTS.keep, thread_count: int = 1, grace_seconds: float = catalog.DEFAULT_GRACE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.job_prefix = job_prefix
        self.ranks = collectives
        self.reporter = reporter
        self.keep = keep
        self.thread_count = thread_count
        self.grace_seconds = grace_seconds
        self._clock = clock
        self._snapshotter = Snapshotter()
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastictrain-save")
        self.pending: Future[None] | None = None
        self._error: BaseException | None = None
        self.last_saved_step: int | None = None
        self.last_save_time = clock()

    def save(self, step: int, state: dict[str, Any], *, background: bool, step_time: float | None = None) -> None:
        """Checkpoint ``state`` as ``step`` (collective); the upload in the background if ``background``.

        A previous save still uploading is finished first; a step already committed is not saved again.
        ``step_time``: when the ranks completed ``step`` (wall clock; None: now), recorded with the commit.
        """
        self.wait(raise_errors=False)
        if step == self.last_saved_step:
            return  # already committed (e.g. an interval save of the step a notice arrived at)
        started = self._clock()
        step_time = time.time() if step_time is None else step_time
        self._agree_on_buffers(state)
        tree = entries.tree(state, source=True)
        flat = dict(tree.flat)
        gathered = self.ranks.all_gather((uuid.uuid4().hex[:12], capture_rng()))
        writer = gathered[0][0]  # rank 0's token names this attempt's folder on every rank
        for rank, (_, rng) in enumerate(gathered):
            flat.update(entries.rng_items(rank, rng))
        flat[entries.STEP_KEY] = step
        try:
            flat = {k: v if isinstance(v, torch.Tensor) else json_tensor(v, k) for k, v in flat.items()}
        except StateError as ex:
            raise CheckpointError(str(ex)) from ex
        paths = {**{k: tuple(k.split(SEP)) for k in flat}, **tree.paths}
        snapshot = self._snapshotter.snapshot(flat)
        stall = self._clock() - started
        self.last_save_time = self._clock()

        def upload() -> None:
            self._upload(step, snapshot, writer, stall=stall, paths=paths, step_time=step_time)

        if not background:
            upload()
            return
        self.pending = self._uploader.submit(upload)

    def _agree_on_buffers(self, state: dict[str, Any]) -> None:
        """Give every rank rank 0's module buffers (BatchNorm statistics) before saving.

        DDP replicates parameters exactly but lets each rank update buffers
        from its own batch, then overwrites them from rank 0 at the next
        forward. DCP saves each replicated tensor from one rank, not
        necessarily rank 0, so without this a resumed run could start from
        another rank's statistics and drift from an uninterrupted one.
        """
        if not self.ranks.distributed:
            return
        for module in modules_in(state):
            for buffer in module.buffers():
                host = buffer.detach().cpu() if buffer.is_cuda else buffer.detach()
                self.ranks.broadcast_tensor(host, src=0)
                if host is not buffer:
                    buffer.copy_(host)

    def _upload(self, step: int, snapshot: dict[str, Any], writer: str, *, stall: float,
                paths: dict[str, tuple[str | int, ...]], step_time: float | None = None) -> None:
        started = self._clock()
        committed: list[layout.Manifest] = []
        world_size, rank = self.ranks.world_size, self.ranks.rank

        def commit(files: list[layout.FileEntry]) -> None:
            manifest = layout.Manifest(
                step=step, created=time.time(), world_size=world_size, writer=writer,
                files=layout.manifest_files(files),
            )
            try:
                self.store.create(layout.manifest_name(self.job_prefix, step), manifest.to_bytes(),
                                  content_type="application/json")
            except WriteConflict as ex:
                raise FencedError(
                    f"step {step} was already committed by another training of this job; "
                    "this save is discarded"
                ) from ex
            committed.append(manifest)

        path = layout.writer_prefix(self.job_prefix, step, writer).rstrip("/")
        try:
            dcp.save(
                snapshot,
                storage_writer=BlobCheckpointWriter(self.store, path, commit, self.thread_count),
                planner=TensorSavePlanner(paths),
                process_group=self.ranks.io,
                no_dist=not self.ranks.distributed,
            )
        except (Exception, CheckpointException) as ex:
            was_fenced = fenced(ex)
            if rank == 0:
                self.reporter.emit(progress.CHECKPOINT_FAILED, step=step, error=str(was_fenced or ex)[:500])
            if was_fenced is not None:
                raise was_fenced from ex
            raise CheckpointError(f"checkpoint of step {step} failed: {ex}") from ex
        seconds = self._clock() - started
        self.last_saved_step = step
        if rank == 0:
            size = committed[0].total_bytes if committed else None
            log.info("checkpoint of step %d committed (%s bytes, %.2fs upload, %.3fs stall)", step, size, seconds,
                     stall)
            self.reporter.emit(progress.CHECKPOINT, step=step, bytes=size, seconds=round(seconds, 3),
                               stall_seconds=round(stall, 4), world_size=world_size,
                               step_time=None if step_time is None else round(step_time, 3))
            self.retain()

    def retain(self) -> None:
        """Keep the newest ``keep`` complete checkpoints; drop older and abandoned ones."""
        try:
            listed = catalog.list_checkpoints(self.store, self.job_prefix)
            plan = catalog.plan_prune(listed, keep_last=self.keep, incomplete=True, grace=self.grace_seconds)
            if plan.delete:
                catalog.apply_prune(self.store, self.job_prefix, plan)
                log.info("retention removed checkpoints %s", [c.step for c in plan.delete])
        except Exception as ex:  # pylint: disable=broad-exception-caught
            # retention is housekeeping; never fail a save for it
            log.warning("retention failed: %s", ex)

    def wait(self, raise_errors: bool = True) -> None:
        """Wait for the save in flight, if any. Raises its error unless told not to."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException as ex:  # pylint: disable=broad-exception-caught  # kept for the caller to raise
                self._error = ex
                log.error("%s", ex)
        error, self._error = self._error, None
        if error is not None and raise_errors:
            raise error

    def close(self) -> None:
        """The upload in flight finished (its error logged, not raised), the upload thread stopped."""
        try:
            self.wait(raise_errors=False)
        finally:
            self._uploader.shutdown(wait=True)
