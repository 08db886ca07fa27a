"""Checkpointer: blob checkpoints that are atomic, verified and asynchronous, and the loop that uses them.

A training script does::

    ckpt = Checkpointer.from_env()                 # after init_process_group
    state = {"model": model, "optimizer": optimizer, "data": sampler}
    for step, batch in ckpt.batches(state, loader, epochs=3):   # or: for step in ckpt.steps(state, total=N)
        ...one training step...

The iterator restores the newest state, checkpoints after each step on the configured interval and at a
notice, ends the process at a stop (runtime/stopping.py: a stop is never the end of training) and records the
job finished only once its last step is trained. The per-step hooks underneath (``restore``, ``step``,
``done``) stay public for loops of another shape; after a stop they too end the process rather than train,
save or finish.

Guarantees:

- *Atomic*: a checkpoint exists only once its ``manifest.json`` is written,
  last, by rank 0, after every rank's files are in blob storage. Files are
  written once (``If-None-Match: *``) under a folder private to the save
  attempt, so two trainings that write the same job cannot corrupt each
  other's committed checkpoints: the second manifest for a step is refused.
- *Verified*: restore checks every file's size and SHA-256 against the manifest as
  it reads it and falls back to the next newest checkpoint on any mismatch.
  Rank 0 chooses, and every rank loads the same step.
- *Asynchronous*: ``save`` blocks only while the state is copied to CPU
  memory; the upload runs in a background thread on a process group of its
  own, at most one at a time.
- *Preemption*: SIGTERM or an Azure Scheduled Events ``Preempt`` notice on any
  node makes every rank save the same step (agreed by one small all-reduce
  per step); then the event is acknowledged so the node goes sooner.
"""
from __future__ import annotations

import atexit
import logging
import os
import warnings
import socket
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from azext_elastictrain.core import catalog, launch, layout
from azext_elastictrain.core.blobstore import BlobStore, WriteConflict
from azext_elastictrain.runtime import progress, rescue
from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.planners import CheckingLoadPlanner, StateMismatch, TensorSavePlanner, names
from azext_elastictrain.runtime.state import (
    SEP,
    Snapshotter,
    StateError,
    StateTree,
    capture_rng,
    json_tensor,
    json_value,
    modules_in,
    restore_rng,
)
from azext_elastictrain.runtime.stopping import TrainingStopped
from azext_elastictrain.runtime.storage import METADATA, METADATA_JSON, BlobCheckpointReader, BlobCheckpointWriter

log = logging.getLogger(__name__)

# DCP warns on every call in a single process; that is a supported mode here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

# Our own entry in every checkpoint: per-rank RNG states and the step.
RESERVED = "_elastictrain"
RNG_PREFIX = f"{RESERVED}{SEP}rng{SEP}"
STEP_KEY = f"{RESERVED}{SEP}step"
RNG_JSON = ("python_extra", "numpy_extra")  # the plain parts of capture_rng's state


# What loading one checkpoint came to on a rank (all-reduced: the worst wins).
LOADED, UNREADABLE, MISMATCH = 0, 1, 2


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or committed."""


class FencedError(CheckpointError):
    """Another training already committed this step of the same job."""


def _env_int(environ: Any, name: str, default: int | None) -> int | None:
    value = environ.get(name)
    return int(value) if value not in (None, "") else default


def _env_float(environ: Any, name: str, default: float | None) -> float | None:
    value = environ.get(name)
    return float(value) if value not in (None, "") else default


def _cause(ex: BaseException, kind: type[BaseException]) -> "BaseException | None":
    """The error of ``kind`` behind a DCP failure (DCP wraps every rank's error), if that is what it was."""
    if isinstance(ex, kind):
        return ex
    for failure in getattr(ex, "failures", {}).values():
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, kind):
            return cause
    return None


def _failure_text(ex: BaseException) -> str:
    """What went wrong, per rank, rather than DCP's "CheckpointException ranks: [0]"."""
    failures = getattr(ex, "failures", None)
    if not failures:
        return str(ex)
    causes = {rank: (f[0] if isinstance(f, tuple) else f) for rank, f in failures.items()}
    return "; ".join(f"rank {rank}: {type(c).__name__}: {c}" for rank, c in sorted(causes.items()))


def _fenced(ex: BaseException) -> "FencedError | None":
    """The FencedError behind a DCP failure, if that is what it was (on any rank)."""
    return _cause(ex, FencedError)  # type: ignore[return-value]


def _tree(state: dict[str, Any]) -> StateTree:
    try:
        return StateTree(state, reserved=RESERVED)
    except StateError as ex:
        raise CheckpointError(str(ex)) from ex


def _rng_items(rank: int, rng: dict[str, Any]) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for name, value in rng.items():
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            items.update({f"{RNG_PREFIX}{rank}{SEP}{name}{SEP}{i}": t for i, t in enumerate(value)})
        else:
            items[f"{RNG_PREFIX}{rank}{SEP}{name}"] = value
    return items


class Checkpointer:  # pylint: disable=too-many-instance-attributes  # restore+save+retention: to split
    def __init__(
        self,
        store: BlobStore,
        job_prefix: str | None = None,
        *,
        keep: int = 3,
        interval_steps: int | None = None,
        interval_seconds: float | None = None,
        async_save: bool = True,
        verify: bool = True,
        watcher: Any = None,
        events: bool = True,
        progress_seconds: float = 10.0,
        thread_count: int = 1,
        grace_seconds: float = catalog.DEFAULT_GRACE_SECONDS,
        hold_seconds: float = 60.0,
        memory_rescue: bool = True,
        sigterm_wait_seconds: float = 5.0,
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.store = store
        self.job_prefix = store.prefix if job_prefix is None else job_prefix
        self.keep = keep
        self.interval_steps = interval_steps
        self.interval_seconds = interval_seconds
        self.async_save = async_save
        self.verify = verify
        self.thread_count = thread_count
        self.grace_seconds = grace_seconds
        self.hold_seconds = hold_seconds
        self.sigterm_wait_seconds = sigterm_wait_seconds
        self.progress_seconds = progress_seconds

        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = os.environ.get(launch.ENV_NODE_NAME) or os.environ.get(launch.ENV_VM_NAME) or socket.gethostname()
        # Two CPU groups of our own: the step-by-step agreement runs on the
        # training thread, DCP's collectives in the upload thread; one group
        # each keeps their collectives from interleaving across ranks.
        self._ctl = dist.new_group(backend="gloo") if self.distributed else None
        self._io = dist.new_group(backend="gloo") if self.distributed else None

        self._snapshotter = Snapshotter()
        self._uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastictrain-save")
        self._pending: Future | None = None
        self._error: BaseException | None = None
        self.last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._handled_notices: set[str] = set()
        self._stopping = False
        # The last step every rank completed (its per-step agreement succeeded), for honest loss accounting.
        self.last_step: int | None = None
        self._last_step_time: float | None = None
        # The last step this rank's own state reached (step() is called after the optimizer step, so its
        # gradients were reduced across every rank): one past last_step when a peer died during the agreement.
        self._reached: tuple[int, float] | None = None
        self._finished = self._interruption_recorded = False
        # The step a stop (step() returned True) happened at; the metrics report()ed for the step being trained.
        self.stopped_at, self._metrics = None, {}  # int | None, dict[str, float]

        # The state of the last completed step in node-local shared memory (runtime/rescue.py): captured on
        # the training thread at step(), committed by a thread of its own, at most one commit in flight.
        self._memory = rescue.MemoryTier.from_env(self.job_prefix) if memory_rescue else None
        self._keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastictrain-memory") \
            if self._memory is not None and self.local_rank == 0 else None
        self._keeping: Future | None = None
        self.memory_step: int | None = None  # the newest step this process committed to memory
        self._newest_blob: int | None = None  # the newest durable checkpoint in blob, as restore found it

        self._watcher = watcher
        if self._watcher is not None:
            self._watcher.start()
        self._events = progress.EventLog(store, self.job_prefix, rank=self.rank, node=self.node) if events else None
        self._progress_samples = 0.0
        self._progress_since = time.monotonic()
        # The first step is reported at once: when a (re-formed) job trains again is what monitoring
        # and recovery measurements want to know, to the step, not to the next report interval.
        self._progress_last_report: float | None = None
        if self.rank == 0:
            self._emit(
                progress.STARTED,
                world_size=self.world_size,
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
            )
        # A worker whose collective failed (a peer died) exits by an exception the script does not catch.
        atexit.register(self._record_interruption)

    # -- construction from the job's environment -------------------------------
    @classmethod
    def from_env(cls, environ: Any = None, **overrides: Any) -> "Checkpointer":
        """Everything from the environment the job sets (docs/runtime.md); keyword overrides win.

        ``ELASTICTRAIN_CHECKPOINT_URL``: blob URL of the job's prefix;
        ``AZURE_STORAGE_CONNECTION_STRING``: Azurite/development auth (else
        DefaultAzureCredential: workload identity on AKS);
        ``ELASTICTRAIN_KEEP``, ``ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS``,
        ``ELASTICTRAIN_CHECKPOINT_INTERVAL_SECONDS``, ``ELASTICTRAIN_PROGRESS_SECONDS``;
        and the preemption watcher's variables (runtime/preemption.py).
        """
        from azext_elastictrain.runtime.preemption import PreemptionWatcher

        env = os.environ if environ is None else environ
        options: dict[str, Any] = {
            "keep": _env_int(env, launch.ENV_KEEP, 3),
            "interval_steps": _env_int(env, launch.ENV_CHECKPOINT_INTERVAL_STEPS, None),
            "interval_seconds": _env_float(env, launch.ENV_CHECKPOINT_INTERVAL_SECONDS, None),
            "progress_seconds": _env_float(env, launch.ENV_PROGRESS_SECONDS, 10.0),
            "hold_seconds": _env_float(env, launch.ENV_PREEMPTION_HOLD_SECONDS, 60.0),
        }
        options.update(overrides)
        if "watcher" not in options:
            watcher_env = dict(env)
            if int(env.get("LOCAL_RANK", "0")) != 0:
                # One Scheduled Events poller per node; the per-step all-reduce tells the rest.
                watcher_env[launch.ENV_SCHEDULED_EVENTS_URL] = "off"
            options["watcher"] = PreemptionWatcher.from_env(watcher_env)
        return cls(BlobStore.from_env(environ=env), **options)

    # -- collectives on the control group ---------------------------------------
    def _all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._ctl)
        return out

    def _broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._ctl)
        return box[0]

    def _all_reduce_max(self, values: list[int]) -> list[int]:
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._ctl)
        return tensor.tolist()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._events is not None:
            self._events.emit(kind, **fields)

    # -- restore -----------------------------------------------------------------
    def restore(self, state: dict[str, Any]) -> int | None:
        """Load the newest valid checkpoint into ``state``; its step, or None if there is none.

        Collective: call it on every rank. Rank 0 lists the complete
        checkpoints and broadcasts them; every rank tries the same one and they
        move on together to the next newest if any rank finds a file damaged.
        """
        self.wait(raise_errors=False)
        started = time.monotonic()
        candidates: list[bytes] = []
        if self.rank == 0:
            listed = catalog.list_checkpoints(self.store, self.job_prefix)
            candidates = [c.manifest.to_bytes() for c in reversed(listed) if c.complete and c.manifest]
            skipped = [c.step for c in listed if c.status == catalog.DAMAGED]
            if skipped:
                log.warning("skipping damaged checkpoints at steps %s", skipped)
        candidates = self._broadcast(candidates)
        newest_blob = layout.Manifest.from_bytes(candidates[0]).step if candidates else None
        self._newest_blob = newest_blob
        rescued = self._restore_from_memory(state, newest_blob, started)
        if rescued is not None:
            return rescued
        fallbacks = 0
        # Only with a checkpoint to load: looking at a fresh optimizer's state initialises it.
        tree = _tree(state) if candidates else None
        for raw in candidates:
            manifest = layout.Manifest.from_bytes(raw)
            try:
                outcome, problem = self._load(manifest, tree), ""  # type: ignore[arg-type]
            except StateMismatch as ex:
                outcome, problem = MISMATCH, str(ex)
            outcome = self._all_reduce_max([outcome])[0]
            if outcome == MISMATCH:
                raise CheckpointError(
                    f"the checkpoint of step {manifest.step} does not fit the state passed to restore: "
                    f"{problem or 'see the log of another rank'}. Pass the same keys the training saved "
                    "(or a new job prefix for a different state)"
                )
            if outcome == LOADED:
                seconds = time.monotonic() - started
                if self.rank == 0:
                    log.info("restored step %d in %.2fs", manifest.step, seconds)
                    self._emit(progress.RESTORED, step=manifest.step, seconds=round(seconds, 3),
                               source="blob", fallbacks=fallbacks, world_size=self.world_size,
                               saved_world_size=manifest.world_size)
                self.last_saved_step = manifest.step
                self._last_save_time = time.monotonic()
                self._completed(manifest.step)
                return manifest.step
            fallbacks += 1
            if self.rank == 0:
                log.warning("checkpoint of step %d is unreadable; falling back", manifest.step)
        if self.rank == 0:
            self._emit(progress.RESTORED, step=None, fallbacks=fallbacks, world_size=self.world_size)
        return None

    def _load(self, manifest: layout.Manifest, tree: StateTree) -> int:
        """LOADED, or UNREADABLE (damaged, refused: try the previous one); StateMismatch if it does not fit."""
        names_in_it = {f.path.rsplit("/", 1)[-1] for f in manifest.files}
        if METADATA_JSON not in names_in_it and METADATA in names_in_it:
            raise CheckpointError(
                f"the checkpoint of step {manifest.step} was written by an earlier elastictrain whose metadata "
                "is pickled, and restore never unpickles what it reads from storage; resume this job with the "
                "version that wrote it, or start it under a new prefix"
            )
        flat = dict(tree.flat)  # DCP copies this; the planner holds the copy it loads
        mine = f"{RNG_PREFIX}{self.rank}{SEP}"
        planner = CheckingLoadPlanner(tree.free, adopt=(mine, STEP_KEY), ignore=(RNG_PREFIX,))
        reader = BlobCheckpointReader(self.store, self.job_prefix, manifest, verify=self.verify)
        try:
            dcp.load(flat, storage_reader=reader, planner=planner, process_group=self._ctl,
                     no_dist=not self.distributed)
        except (Exception, CheckpointException) as ex:  # pylint: disable=broad-exception-caught
            # unreadable: try the previous one
            # (DCP wraps every rank's read error in CheckpointException, a BaseException.)
            mismatch = _cause(ex, StateMismatch)
            if mismatch is not None:
                raise mismatch from ex
            log.warning("cannot load checkpoint of step %d: %s", manifest.step, _failure_text(ex))
            return UNREADABLE
        self._apply(manifest.step, tree, planner, mine)
        return LOADED

    def _apply(self, step: int, tree: StateTree, planner: CheckingLoadPlanner, mine: str) -> None:
        """Prove every key was loaded, decode the plain values, and put it all into the live state."""
        skipped = planner.not_loaded()
        if skipped:
            raise StateMismatch(f"keys not loaded on rank {self.rank}: {names(skipped)}")
        loaded = planner.state_dict  # the flat dict DCP loaded, adopted keys included
        plain = tree.json_keys | {mine + name for name in RNG_JSON} | {STEP_KEY}
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
            torch.manual_seed(step * 100003 + self.rank)

    # -- the memory tier (runtime/rescue.py) ------------------------------------------
    def _restore_from_memory(self, state: dict[str, Any], newest_blob: int | None, started: float) -> int | None:
        """Load the newest whole in-memory copy any rank's node holds, unless blob has a newer step.

        One all-gather of (step, checksum) picks it; its holder broadcasts the bytes, every rank checks
        their checksum and loads them through the same planner and "every key loaded" proof as a blob
        restore. Any failure on any rank: None, and the caller restores from blob.
        """
        if self._memory is None:
            return None
        self.kept_in_memory()
        copy = self._memory.read()
        # Only with a copy to load: looking at a fresh optimizer's state initialises it.
        tree = _tree(state) if copy is not None else None
        if tree is not None and not rescue.is_replicated(tree.flat):
            copy = None  # sharded: one node's copy is not the whole state
        offers = self._all_gather((copy.step, copy.checksum) if copy else (-1, 0))
        best = max(step for step, _ in offers)
        if best < 0 or (newest_blob is not None and best < newest_blob):
            return None  # nothing in memory, or only older than blob's newest
        tree = tree or _tree(state)
        holder = min(rank for rank, (step, _) in enumerate(offers) if step == best)
        wanted = offers[holder]
        try:
            shared = self._share_copy(copy if offers[self.rank] == wanted else None, holder)
            outcome = self._load_memory(shared, tree, wanted)
        except (Exception, CheckpointException) as ex:  # pylint: disable=broad-exception-caught
            # any failure: blob instead
            # (DCP wraps a planner's error, StateMismatch or "keys not loaded" included, in CheckpointException.)
            log.warning("the in-memory state of step %d cannot be loaded here: %s", best, _failure_text(ex))
            shared, outcome = None, UNREADABLE
        if self._all_reduce_max([outcome])[0] != LOADED:
            log.warning("the in-memory state of step %d is not usable on every rank; restoring from blob", best)
            return None
        seconds = time.monotonic() - started
        if self.rank == 0:
            log.info("restored step %d from memory (holder rank %d) in %.2fs", best, holder, seconds)
            self._emit(progress.RESTORED, step=best, seconds=round(seconds, 3),
                       source="memory" if offers[0] == wanted else "peer", holder=holder,
                       ranks_from_peer=sum(1 for offer in offers if offer != wanted), fallbacks=0,
                       world_size=self.world_size, saved_world_size=shared.world_size)
        self._last_save_time = time.monotonic()
        if best == newest_blob:
            self.last_saved_step = best  # blob holds it too: a save of this step would be refused as a second commit
        self._completed(best)  # the step the job resumes from, for honest loss accounting
        return best

    def _share_copy(self, own: "rescue.MemoryCopy | None", holder: int) -> "rescue.MemoryCopy":
        """The holder's copy on every rank: sent as bytes, parsed (checksum checked) where it arrives."""
        if not self.distributed:
            assert own is not None
            return own
        size = torch.tensor([len(own.raw) if self.rank == holder and own else 0], dtype=torch.int64)
        dist.broadcast(size, src=holder, group=self._ctl)
        if own is not None and len(own.raw) == size.item():
            dist.broadcast(torch.frombuffer(own.raw, dtype=torch.uint8), src=holder, group=self._ctl)
            return own  # this node holds the same bytes (its checksum was the one agreed on)
        raw = bytearray(int(size.item()))
        dist.broadcast(torch.frombuffer(raw, dtype=torch.uint8), src=holder, group=self._ctl)
        return self._memory.parse(raw)

    def _load_memory(self, copy: "rescue.MemoryCopy", tree: StateTree, wanted: tuple[int, int]) -> int:
        if not rescue.is_replicated(tree.flat):
            return UNREADABLE
        if (copy.step, copy.checksum) != wanted:
            log.warning("the in-memory state received is not the one agreed on")
            return UNREADABLE
        flat = dict(tree.flat)
        mine = f"{RNG_PREFIX}{self.rank}{SEP}"
        planner = CheckingLoadPlanner(tree.free, adopt=(mine, STEP_KEY), ignore=(RNG_PREFIX,))
        dcp.load(flat, storage_reader=rescue.MemoryStateReader(copy.tensors), planner=planner, no_dist=True)
        self._apply(copy.step, tree, planner, mine)
        return LOADED

    def _keep_in_memory(self, step: int, state: dict[str, Any]) -> None:
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
        self.kept_in_memory()
        try:
            tree = _tree(state)
            if not rescue.is_replicated(tree.flat):
                return
            flat = {k: v if isinstance(v, torch.Tensor) else json_tensor(v, k) for k, v in tree.flat.items()}
            flat[STEP_KEY] = json_tensor(step, STEP_KEY)
            capture = self._memory.capture(step, self.world_size, flat)
        except OSError as ex:  # no room (ENOSPC) or no shared memory: the tier is off for this worker
            log.warning("the in-memory rescue tier is off for this worker: cannot keep step %d in %s: %s",
                        step, self._memory.directory, ex)
            self._keeper.shutdown(wait=False)
            self._keeper = None
            return
        except (ValueError, CheckpointError, StateError) as ex:  # an optimisation; blob stands
            log.warning("could not keep step %d in memory: %s", step, ex)
            return
        self._keeping = self._keeper.submit(self._commit_memory, capture)

    def _commit_memory(self, capture: "rescue.Capture") -> None:
        self._memory.commit(capture)
        self.memory_step = capture.step

    def kept_in_memory(self) -> int | None:
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

    # -- save ----------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], *, blocking: bool | None = None) -> None:
        """Checkpoint ``state`` as ``step``. Collective: call it on every rank.

        Returns once the state is copied to CPU memory; the upload continues in
        the background (``blocking=True``, or ``async_save=False``, waits for
        the commit). A previous save still uploading is finished first.
        """
        self._check_running("save()")
        self.wait(raise_errors=False)
        if step == self.last_saved_step:
            return  # already committed (e.g. an interval save of the step a notice arrived at)
        started = time.monotonic()
        step_time = self._last_step_time if step == self.last_step else time.time()
        self._agree_on_buffers(state)
        tree = _tree(state)
        flat = dict(tree.flat)
        gathered = self._all_gather((uuid.uuid4().hex[:12], capture_rng()))
        writer = gathered[0][0]  # rank 0's token names this attempt's folder on every rank
        for rank, (_, rng) in enumerate(gathered):
            flat.update(_rng_items(rank, rng))
        flat[STEP_KEY] = step
        try:
            flat = {k: v if isinstance(v, torch.Tensor) else json_tensor(v, k) for k, v in flat.items()}
        except StateError as ex:
            raise CheckpointError(str(ex)) from ex
        paths = {**{k: tuple(k.split(SEP)) for k in flat}, **tree.paths}
        snapshot = self._snapshotter.snapshot(flat)
        stall = time.monotonic() - started
        self._last_save_time = time.monotonic()

        def upload() -> None:
            self._upload(step, snapshot, writer, stall=stall, paths=paths, step_time=step_time)

        if blocking or (blocking is None and not self.async_save):
            upload()
            return
        self._pending = self._uploader.submit(upload)

    def _agree_on_buffers(self, state: dict[str, Any]) -> None:
        """Give every rank rank 0's module buffers (BatchNorm statistics) before saving.

        DDP replicates parameters exactly but lets each rank update buffers
        from its own batch, then overwrites them from rank 0 at the next
        forward. DCP saves each replicated tensor from one rank, not
        necessarily rank 0, so without this a resumed run could start from
        another rank's statistics and drift from an uninterrupted one.
        """
        if not self.distributed:
            return
        for module in modules_in(state):
            for buffer in module.buffers():
                host = buffer.detach().cpu() if buffer.is_cuda else buffer.detach()
                dist.broadcast(host, src=0, group=self._ctl)
                if host is not buffer:
                    buffer.copy_(host)

    def _upload(self, step: int, snapshot: dict[str, Any], writer: str, *, stall: float,
                paths: dict[str, tuple[str | int, ...]], step_time: float | None = None) -> None:
        started = time.monotonic()
        committed: list[layout.Manifest] = []

        def commit(files: list[layout.FileEntry]) -> None:
            manifest = layout.Manifest(
                step=step, created=time.time(), world_size=self.world_size, writer=writer,
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
                process_group=self._io,
                no_dist=not self.distributed,
            )
        except (Exception, CheckpointException) as ex:
            fenced = _fenced(ex)
            if self.rank == 0:
                self._emit(progress.CHECKPOINT_FAILED, step=step, error=str(fenced or ex)[:500])
            if fenced is not None:
                raise fenced from ex
            raise CheckpointError(f"checkpoint of step {step} failed: {ex}") from ex
        seconds = time.monotonic() - started
        self.last_saved_step = step
        if self.rank == 0:
            size = committed[0].total_bytes if committed else None
            log.info("checkpoint of step %d committed (%s bytes, %.2fs upload, %.3fs stall)", step, size, seconds,
                     stall)
            self._emit(progress.CHECKPOINT, step=step, bytes=size, seconds=round(seconds, 3),
                       stall_seconds=round(stall, 4), world_size=self.world_size,
                       step_time=None if step_time is None else round(step_time, 3))
            self._retain()

    def _retain(self) -> None:
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
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException as ex:  # pylint: disable=broad-exception-caught  # kept for the caller to raise
                self._error = ex
                log.error("%s", ex)
        error, self._error = self._error, None
        if error is not None and raise_errors:
            raise error

    # -- the per-step hook -----------------------------------------------------------
    def step(self, step: int, state: dict[str, Any], *, samples: float | None = None,
             metrics: dict[str, float] | None = None) -> bool:
        """Call after every training step (collective). True means: stopped, exit now (not: training is over).

        Saves on the configured interval, and at once on a preemption notice
        anywhere in the job (every rank saves this same step). After SIGTERM
        the step is safe when this returns True (in blob, or in every node's
        memory) and the script should exit; any later ``step``, ``save`` or
        ``done`` (and any use of a sampler of the state) ends the process with
        ``TrainingStopped``, so a loop that goes on cannot train past the stop
        or mark the job finished. After a Scheduled Events notice training goes
        on: the node leaves when Azure takes it, and the job resumes from this step.
        """
        self._check_running("step()")
        if self._step(step, state, samples=samples, metrics={**self._metrics, **(metrics or {})}):
            self._stop(step, state)
            return True
        return False

    def _check_running(self, what: str) -> None:
        if self.stopped_at is not None:
            log.warning("%s after the stop at step %d: ending this worker (it resumes from that step)",
                        what, self.stopped_at)
            self.close()
            raise TrainingStopped(self.stopped_at, f"Checkpointer.{what} after the stop")

    def _stop(self, step: int, state: dict[str, Any]) -> None:
        """Remember the stop and tell the state's samplers: from now on nothing trains, saves or draws data."""
        self.stopped_at = step
        for sampler in _samplers_in(state):
            sampler.stop(step)

    def _step(self, step: int, state: dict[str, Any], *, samples: float | None,
              metrics: dict[str, float] | None) -> bool:
        self._metrics = {}
        self._reached = (step, time.time())
        self._keep_in_memory(step, state)  # step() comes after the optimizer step: a completed step
        notices = self._live_notices()
        sigterm = any(n.source == "sigterm" for n in notices)
        due = self.rank == 0 and self._due(step)
        vm_notice_anywhere, sigterm_anywhere, save_due = self._all_reduce_max(
            [1 if notices and not sigterm else 0, 1 if sigterm else 0, 1 if due else 0])
        self._completed(step)  # the agreement returned: every rank finished this step
        self._record_progress(step, samples, metrics)
        if sigterm_anywhere and not vm_notice_anywhere:
            return self._on_sigterm(step, state, notices)
        if vm_notice_anywhere or sigterm_anywhere:
            return self._on_preemption(step, state, notices)
        if save_due:
            self.save(step, state)
        return False

    def _on_sigterm(self, step: int, state: dict[str, Any], notices: list[Any]) -> bool:
        """torchrun stops the workers (a node joined and the world re-forms, or the job stops): every rank
        stops at this step, the same one, which survives in the nodes' memory; blob only when it must.

        The blob save is skipped when every node committed this step to memory, no node is going itself
        (``ENV_NODE_LEAVING_FILE``: a pod's preStop hook, a local node's stop), and blob holds an older
        durable checkpoint: the survivors restore from their own memory and a newcomer from a peer. What
        that gives up: if every node holding the copy is lost at once without a SIGTERM of its own before
        the next interval checkpoint, the job resumes from blob's older one. A rank whose own SIGTERM has not
        come yet waits for it (briefly: its agent polls the same rendezvous), so no rank trains a step its
        peers will not.
        """
        if self.local_rank == 0:  # the node's writer says whether the node holds this step
            kept = self._keeper is not None and self.kept_in_memory() == step
        else:
            kept = self._memory is not None
        if kept and _node_leaving():  # the node goes with its memory: this is no re-form it survives
            log.warning("SIGTERM at step %d and this node is going: its memory copy will not outlive it", step)
            kept = False
        durable = self.last_saved_step is not None or self._newest_blob is not None
        (missing,) = self._all_reduce_max([0 if kept and durable else 1])
        own = any(n.source == "sigterm" for n in notices)
        for notice in notices:
            self._handled_notices.add(notice.event_id or notice.source)
            if self.local_rank == 0:  # one event per node, not one per worker
                self._emit(progress.PREEMPTED, step=step, source=notice.source, event_id=notice.event_id)
        if self.rank == 0:
            self._emit(progress.REFORMING, step=step, kept_in_memory=not missing, world_size=self.world_size)
        if missing:
            log.warning("SIGTERM at step %d: checkpointing it to blob", step)
            self.save(step, state, blocking=True)
        else:
            log.warning("SIGTERM at step %d: it is in every node's memory; exiting without a blob save", step)
        if own:
            return True
        deadline = time.monotonic() + self.sigterm_wait_seconds
        while self._watcher is not None and time.monotonic() < deadline:
            if any(n.source == "sigterm" for n in self._watcher.notices()):
                return True
            time.sleep(0.05)
        log.warning("another rank was stopped at step %d but this one was not: training on", step)
        return False

    def _completed(self, step: int) -> None:
        self.last_step, self._last_step_time = step, time.time()

    def _record_interruption(self, flush_seconds: float = 5.0) -> None:
        """Training stops before ``done``: record the last step the job completed, from every rank (or the
        step this rank completed after it, if a peer died during that step's agreement).

        Any survivor may be the one to tell (rank 0 may be the node that died); the reader takes the
        newest per re-forming, so the copies from several ranks are harmless. Bounded: torchrun kills
        a worker that does not exit after its SIGTERM.
        """
        if self._finished or self._interruption_recorded or self._events is None or self.last_step is None:
            return
        self._interruption_recorded = True
        sigterms = [n.received_at for n in (self._watcher.notices() if self._watcher is not None else [])
                    if n.source == "sigterm"]
        step, step_time = self.last_step, self._last_step_time
        if self._reached is not None and self._reached[0] > step:
            # its optimizer step ran on gradients every rank reduced (its node's memory copy holds it, and a
            # survivor resumes from it): the step the world reached, though a peer died before agreeing on it
            step, step_time = self._reached
        self._emit(progress.INTERRUPTED, step=step, step_time=round(step_time, 3),
                   world_size=self.world_size,
                   **({"sigterm_time": round(min(sigterms), 3)} if sigterms else {}))
        self._events.flush(flush_seconds)

    def _live_notices(self) -> list[Any]:
        """Notices not yet acted on (a handled Scheduled Event stays listed until the VM goes)."""
        if self._watcher is None:
            return []
        return [n for n in self._watcher.notices() if (n.event_id or n.source) not in self._handled_notices]

    def _due(self, step: int) -> bool:
        if self.interval_steps and step % self.interval_steps == 0:
            return True
        return bool(self.interval_seconds) and time.monotonic() - self._last_save_time >= self.interval_seconds

    def _on_preemption(self, step: int, state: dict[str, Any], notices: list[Any]) -> bool:
        for notice in notices:
            if self.local_rank == 0:  # one event per node, not one per worker
                self._emit(progress.PREEMPTED, step=step, source=notice.source, event_id=notice.event_id)
            log.warning("preemption notice (%s) at step %d: checkpointing now", notice.source, step)
        started = time.monotonic()
        self.save(step, state, blocking=True)
        acknowledged = False
        for notice in notices:
            self._handled_notices.add(notice.event_id or notice.source)
            if notice.source != "sigterm":
                self._watcher.acknowledge()
                acknowledged = True
        if notices:
            log.warning("preemption checkpoint of step %d durable after %.2fs", step, time.monotonic() - started)
        if any(n.source == "sigterm" for n in notices):
            return True
        return self._hold(step) if acknowledged else False

    def _hold(self, step: int) -> bool:
        """After acknowledging a Scheduled Events notice, train no further step until the VM goes.

        Once acknowledged, Azure takes the VM within seconds, and the job resumes from the notice's
        checkpoint: every step trained in between would be lost (and counted so). Holding here stalls the
        whole job (the other ranks wait in the next collective), which costs the same wall time and loses
        nothing. Exiting instead is not an option: a node whose workers exit 0 closes the rendezvous for the
        whole job. If the VM is still here after ``hold_seconds`` (the eviction was called off), train on.
        Returns True (stop now) if a SIGTERM comes while holding: the checkpoint of ``step`` is durable.
        """
        deadline = time.monotonic() + self.hold_seconds
        if self.hold_seconds > 0:
            log.warning("holding at step %d until this VM goes (at most %.0fs)", step, self.hold_seconds)
        while time.monotonic() < deadline:
            if any(n.source == "sigterm" for n in self._watcher.notices()):
                return True
            time.sleep(0.1)
        if self.hold_seconds > 0:
            log.warning("the VM was not taken within %.0fs of the acknowledgement: training on", self.hold_seconds)
        return False

    def _record_progress(self, step: int, samples: float | None, metrics: dict[str, float] | None) -> None:
        if self.rank != 0 or self._events is None:
            return
        self._progress_samples += samples or 0
        now = time.monotonic()
        first = self._progress_last_report is None
        if not first and now - self._progress_last_report < self.progress_seconds:
            return
        elapsed = now - self._progress_since
        # no rate from the first step: its time since start includes the restore
        rate = self._progress_samples / elapsed if elapsed > 0 and samples is not None and not first else None
        fields: dict[str, Any] = {"step": step, "world_size": self.world_size}
        if rate is not None:
            fields["samples_per_s"] = round(rate, 2)
        if metrics:
            fields["metrics"] = {k: float(v) for k, v in metrics.items()}
        self._emit(progress.PROGRESS, **fields)
        self._progress_samples, self._progress_since, self._progress_last_report = 0.0, now, now

    # -- end ---------------------------------------------------------------------------
    def report(self, **metrics: float) -> None:
        """Metrics of the step being trained (e.g. ``loss=loss.item()``), sent with its progress event."""
        self._metrics.update({k: float(v) for k, v in metrics.items()})

    def steps(self, state: dict[str, Any], total: int, *, samples: float | None = None) -> Iterator[int]:
        """The steps left to train, ``restored + 1 .. total``: ``for step in ckpt.steps(state, total=N)``.

        Restores ``state`` first (collective: every rank), runs ``step()`` after each step's body (so the
        body is the whole training step: forward, backward, optimizer step), and once step ``total`` is
        trained commits the final checkpoint and records the job finished. On a stop it ends the process
        (``TrainingStopped``: nothing after the loop runs; the job resumes from that step). A ``break``
        out of the loop, or an exception in its body, leaves the job unfinished: it is never reported
        Succeeded. ``samples``: samples per step, for the samples/s the CLI shows.
        """
        if total < 0:
            raise ValueError(f"total must be at least 0, not {total}")
        step = self.restore(state) or 0
        return self._run(state, step, total, _count(step, total), samples=samples)

    def batches(self, state: dict[str, Any], loader: Iterable[Any], epochs: int) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for every batch left in ``epochs`` epochs, one flat loop with no inner one.

        ``loader`` is a DataLoader over an ``ElasticSampler`` (its ``batch_sampler``) that is in ``state``.
        Restores ``state`` (the sampler comes back mid-epoch, at any world size), moves the sampler from
        epoch to epoch, marks each batch trained (``advance()``) after its body, then as ``steps()``: the
        per-step hook, the end of the process at a stop, the job finished after the last batch of the
        last epoch. Step numbers count global batches: the total is ``epochs * sampler.batches_per_epoch``.
        """
        sampler = getattr(loader, "batch_sampler", None)
        if not isinstance(sampler, ElasticSampler):
            raise ValueError("batches() needs a DataLoader over an ElasticSampler: "
                             "DataLoader(dataset, batch_sampler=ElasticSampler(dataset, ...))")
        if not any(found is sampler for found in _samplers_in(state)):
            raise ValueError("the loader's ElasticSampler is not in the state: put it there (e.g. "
                             "state['data'] = sampler) so its position is checkpointed with the model")
        if epochs < 0:
            raise ValueError(f"epochs must be at least 0, not {epochs}")
        step = self.restore(state) or 0
        # The planned work is every batch of every epoch: done when they are exhausted, whatever a script
        # migrated from another loop counted its steps as.
        return self._run(state, step, None, _epoch_batches(loader, sampler, epochs),
                         samples=sampler.global_batch_size, trained=sampler.advance)

    def _run(self, state: dict[str, Any], step: int, total: int | None, items: Iterator[Any], *,
             samples: float | None, trained: Any = None) -> Iterator[Any]:
        """The loop of ``steps()`` and ``batches()``: yield, then the step's hook; finish at ``total``."""
        try:
            for item in items:
                step += 1
                yield step if trained is None else (step, item)
                if trained is not None:
                    trained()
                if self.step(step, state, samples=samples):
                    log.warning("stopped at step %d: ending this worker; the job resumes from here", step)
                    self.close()
                    raise TrainingStopped(step, "a SIGTERM: torchrun re-forms the job or the node goes")
            self._finish(step, state, step if total is None else total)
        finally:
            if not self._finished:
                self.close()  # a break, an exception or a stop: unfinished, the interruption is recorded

    def done(self, step: int, state: dict[str, Any]) -> None:
        """Training finished: commit the final state, record the job finished, and close.

        After a stop (``step()`` returned True) it records nothing and saves nothing: the stop's step is
        already safe and the job is not finished, so it closes and ends the process (``TrainingStopped``).
        """
        self._check_running("done()")
        self._finish(step, state, None)

    def _finish(self, step: int, state: dict[str, Any], total: int | None) -> None:
        try:
            self.save(step, state, blocking=True)
            self.wait()
            self._finished = True
            if self.rank == 0:
                self._emit(progress.FINISHED, step=step, **({"total": total} if total is not None else {}))
            if self._keeper is not None:
                self.kept_in_memory()
                self._memory.discard()  # the job is over: free the node's memory
        finally:
            self.close()

    @property
    def finished(self) -> bool:
        """True once the planned work is trained and recorded (``done()``, or the end of ``steps()``)."""
        return self._finished

    def close(self) -> None:
        """Finish the upload in flight and stop the background work. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self._record_interruption)
        self._record_interruption()  # first: waiting for an upload whose peers died can take long
        try:
            self.kept_in_memory()  # the step kept last is committed before the process goes
            self.wait(raise_errors=False)
        finally:
            self._uploader.shutdown(wait=True)
            if self._keeper is not None:
                self._keeper.shutdown(wait=True)
            if self._watcher is not None:
                self._watcher.stop()
            if self._events is not None:
                self._events.flush()
                self._events.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _count(start: int, total: int) -> Iterator[None]:
    for _ in range(start, total):
        yield None


def _epoch_batches(loader: Iterable[Any], sampler: ElasticSampler, epochs: int) -> Iterator[Any]:
    """The batches left in the (restored) epoch, then those of every later epoch up to ``epochs``."""
    while sampler.epoch < epochs:
        yield from loader
        if sampler.epoch + 1 >= epochs:
            return
        sampler.set_epoch(sampler.epoch + 1)


def _samplers_in(value: Any) -> Iterator[ElasticSampler]:
    """The ElasticSamplers of a state: its values, and those of nested dicts, lists and tuples."""
    if isinstance(value, ElasticSampler):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _samplers_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _samplers_in(item)


def _node_leaving() -> bool:
    """True once this node itself is going (its pod deleted, a local node stopped): launch.ENV_NODE_LEAVING_FILE."""
    path = os.environ.get(launch.ENV_NODE_LEAVING_FILE)
    return bool(path) and os.path.exists(path)
