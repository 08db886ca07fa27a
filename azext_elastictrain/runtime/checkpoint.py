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

How it is built: ``Checkpointer`` is the facade a script uses; each job below is a module of its own, which a
newcomer can read (and test) alone. None imports this module or another's caller:

- runtime/collectives.py  the CPU process groups and the few collectives (identity in one process);
- runtime/stepping.py     what to do at a step boundary: interval save, notice, SIGTERM/re-form, hold;
- runtime/saving.py       the blob save: snapshot on the training thread, upload and commit in the background,
                          retention;
- runtime/restoring.py    restore: the newest provable state from memory, a peer or blob, on every rank;
- runtime/memory.py       the node's memory tier (runtime/memory_tier.py) kept at each step;
- runtime/reporting.py    the event log's events, progress and the step the job got to (runtime/progress.py);
- runtime/loops/          the recovery mode's loop of ``steps()``/``batches()``, chosen once as the Checkpointer is
                          made: restart.py (torchrun restarts the workers), in_process.py (a per-step quorum);
- runtime/entries.py, errors.py, loop.py  our reserved checkpoint entries, the errors, the loop's iterators.
"""
from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import warnings
from typing import Any, Generic, Iterable, Iterator, Mapping, TypeVar, cast, overload

from azext_elastictrain.core import catalog, launch
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.core.settings import DEFAULTS, RuntimeSettings
from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.errors import CheckpointError, FencedError
from azext_elastictrain.runtime.loop import samplers_in
from azext_elastictrain.runtime.loops import LoopParts, TrainingLoop, for_mode
from azext_elastictrain.runtime.memory import MemoryKeeper
from azext_elastictrain.runtime.memory_tier import MemoryTier
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.restoring import Restorer
from azext_elastictrain.runtime.saving import BlobSaver
from azext_elastictrain.runtime.stepping import Notices, StepPolicy
from azext_elastictrain.runtime.stopping import PEER_GONE_EXIT_CODE, TrainingStopped
from azext_elastictrain.runtime.timeouts import peer_timeout

__all__ = ["Checkpointer", "CheckpointError", "FencedError"]

log = logging.getLogger(__name__)

# DCP warns on every call in a single process; that is a supported mode here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


S = TypeVar("S")


class _Setting(Generic[S]):
    """A constructor setting that lives on the collaborator that uses it, read and set through the facade."""

    def __init__(self, owner: str):
        self.owner = owner
        self.name = ""

    def __set_name__(self, cls: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, cls: type | None = None) -> _Setting[S]:
        """On the class: the descriptor."""

    @overload
    def __get__(self, obj: object, cls: type | None = None) -> S:
        """On a Checkpointer: the collaborator's value."""

    def __get__(self, obj: object | None, cls: type | None = None) -> _Setting[S] | S:
        return self if obj is None else cast(S, getattr(getattr(obj, self.owner), self.name))

    def __set__(self, obj: object, value: S) -> None:
        setattr(getattr(obj, self.owner), self.name, value)


class Checkpointer:  # pylint: disable=too-many-instance-attributes  # the facade: settings and collaborators
    """Restore, checkpoint at each step as the job needs, finish: see the module's docstring and docs/runtime.md."""

    keep: _Setting[int] = _Setting("_saver")
    thread_count: _Setting[int] = _Setting("_saver")
    grace_seconds: _Setting[float] = _Setting("_saver")
    verify: _Setting[bool] = _Setting("_restorer")
    interval_steps: _Setting[int | None] = _Setting("_policy")
    interval_seconds: _Setting[float | None] = _Setting("_policy")
    hold_seconds: _Setting[float] = _Setting("_policy")
    sigterm_wait_seconds: _Setting[float] = _Setting("_policy")
    progress_seconds: _Setting[float] = _Setting("_reporter")

    def __init__(  # pylint: disable=too-many-locals  # every setting a script may pass
        self,
        store: BlobStore,
        job_prefix: str | None = None,
        *,
        keep: int = DEFAULTS.keep,
        interval_steps: int | None = DEFAULTS.checkpoint_interval_steps,
        interval_seconds: float | None = DEFAULTS.checkpoint_interval_seconds,
        async_save: bool = True,
        verify: bool = True,
        watcher: Any = None,
        events: bool = True,
        progress_seconds: float = DEFAULTS.progress_seconds,
        thread_count: int = 1,
        grace_seconds: float = catalog.DEFAULT_GRACE_SECONDS,
        hold_seconds: float = DEFAULTS.hold_seconds,
        memory_tier: bool = True,
        memory_rescue: bool | None = None,  # memory_tier's former name, still taken
        sigterm_wait_seconds: float = 5.0,
        settings: RuntimeSettings | None = None,
    ):
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.store = store
        self.job_prefix = store.prefix if job_prefix is None else job_prefix
        self.async_save = async_save
        self._ranks = Collectives()
        self.distributed, self.rank, self.world_size = \
            self._ranks.distributed, self._ranks.rank, self._ranks.world_size
        # the job's settings (core/settings.py; by default from this process's environment): the mode, the nodes
        # range and what the collaborators read themselves; those above are the arguments
        self.settings = RuntimeSettings.from_env(os.environ) if settings is None else settings
        mode = for_mode(self.settings.recovery)  # the loop of steps()/batches(), chosen once (runtime/loops/)
        self._stopping = False
        # Started first, right after the groups' barrier: every rank's watch begins at about the same time.
        self._peers = self._watch_peers() if mode.watches_peers else None
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node = os.environ.get(launch.ENV_NODE_NAME) or os.environ.get(launch.ENV_VM_NAME) or socket.gethostname()
        # The step a stop (step() returned True) happened at; the metrics report()ed for the step being trained.
        self.stopped_at: int | None = None
        self._metrics: dict[str, float] = {}
        self._newest_blob: int | None = None  # the newest durable checkpoint in blob, as restore found it

        event_log = progress.EventLog(store, self.job_prefix, rank=self.rank, node=self.node) if events else None
        self._reporter = Reporter(event_log, rank=self.rank, world_size=self.world_size,
                                  progress_seconds=progress_seconds)
        self._saver = BlobSaver(store, self.job_prefix, self._ranks, self._reporter, keep=keep,
                                thread_count=thread_count, grace_seconds=grace_seconds)
        keeps = memory_tier if memory_rescue is None else memory_rescue
        tier = MemoryTier.from_env(self.job_prefix) if keeps else None
        self._memory = MemoryKeeper(tier, writer=self.local_rank == 0) if tier is not None else None
        self._restorer = Restorer(store, self.job_prefix, self._ranks, self._reporter, memory=self._memory,
                                  verify=verify)
        self._notices = Notices(watcher)
        self._notices.start()
        self._policy = StepPolicy(
            self._ranks, self._notices, self._reporter, save=self.save, kept_here=self._kept_here,
            durable=self._durable, last_save_time=lambda: self._saver.last_save_time, local_rank=self.local_rank,
            interval_steps=interval_steps, interval_seconds=interval_seconds, hold_seconds=hold_seconds,
            sigterm_wait_seconds=sigterm_wait_seconds)
        self._loop: TrainingLoop = mode(LoopParts(
            store, self.job_prefix, self._ranks, self.local_rank, self._reporter, self._notices, self._policy,
            self._memory, restore=self.restore, hook=self.step, save=self.save, finish=self._finish,
            close=self.close, stop=self._stop, check_running=self._check_running, take_metrics=self._take_metrics))
        if self.rank == 0:
            self._reporter.emit(
                progress.STARTED,
                world_size=self.world_size,
                restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
            )
        # A worker whose collective failed (a peer died) exits by an exception the script does not catch.
        atexit.register(self._record_interruption)

    def _watch_peers(self) -> Any:
        """In a mode whose loop watches peers (restart), distributed: a thread that ends this worker when a peer
        vanished (runtime/peer_watch.py); None otherwise. In the in-process mode the node's own world has no remote
        peer: the cross-node collectives are the runtime's, bounded by the replica timeout."""
        seconds = peer_timeout()
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not self.distributed or seconds is None or not host or not port:
            return None
        from azext_elastictrain.runtime.peer_watch import PeerWatch, StoreClient

        timeout = seconds.total_seconds()
        watch = PeerWatch(lambda: StoreClient(host, int(port), timeout), rank=self.rank,
                          world_size=self.world_size, timeout=timeout, on_gone=self._peer_gone).start()
        atexit.register(watch.stop)  # an exit of any kind is not a vanish
        return watch

    def _peer_gone(self, reason: str) -> None:
        """A peer vanished: end this worker now (its training thread may wait in a collective of the script's
        group for torch's default timeout), keeping what a stop keeps: the step committed to memory and the
        ``interrupted`` event. torchrun re-forms the job without the peer; it resumes from the last step."""
        if self._stopping or getattr(getattr(self, "_reporter", None), "finished", False):
            return  # on its way out already
        log.error("a peer is gone: %s; ending this worker so that the job re-forms without it (exit code %d)",
                  reason, PEER_GONE_EXIT_CODE)
        try:
            self.kept_in_memory()  # the copy being committed, if any, is whole before the process goes
            self._record_interruption()
        except Exception:  # pylint: disable=broad-except  # nothing may keep this worker from ending
            log.exception("while ending this worker for a gone peer")
        finally:
            logging.shutdown()
            os._exit(PEER_GONE_EXIT_CODE)

    # -- construction from the job's environment -------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Checkpointer":
        """Everything from the environment the job sets (docs/runtime.md); keyword overrides win over it, as
        everywhere (core/settings.py).

        ``ELASTICTRAIN_CHECKPOINT_URL``: blob URL of the job's prefix;
        ``AZURE_STORAGE_CONNECTION_STRING``: Azurite/development auth (else
        DefaultAzureCredential: workload identity on AKS);
        the job's settings (core/settings.py ``RuntimeSettings``: kept checkpoints, the intervals, progress, hold);
        and the preemption watcher's variables (runtime/preemption.py).
        """
        from azext_elastictrain.runtime.preemption import PreemptionWatcher

        env = os.environ if environ is None else environ
        settings = RuntimeSettings.from_env(env)
        options: dict[str, Any] = {
            "keep": settings.keep,
            "interval_steps": settings.checkpoint_interval_steps,
            "interval_seconds": settings.checkpoint_interval_seconds,
            "progress_seconds": settings.progress_seconds,
            "hold_seconds": settings.hold_seconds,
        }
        options.update(overrides)
        options.setdefault("settings", settings)
        if "watcher" not in options:
            watcher_env = dict(env)
            if int(env.get("LOCAL_RANK", "0")) != 0:
                # One Scheduled Events poller per node; the per-step all-reduce tells the rest.
                watcher_env[launch.ENV_SCHEDULED_EVENTS_URL] = "off"
            options["watcher"] = PreemptionWatcher.from_env(watcher_env)
        return cls(BlobStore.from_env(environ=env), **options)

    # -- what the collaborators know, as the facade's attributes ---------------------
    @property
    def last_saved_step(self) -> int | None:
        """The newest step this training committed to blob (or restored from it)."""
        return self._saver.last_saved_step

    @last_saved_step.setter
    def last_saved_step(self, step: int | None) -> None:
        self._saver.last_saved_step = step

    @property
    def last_step(self) -> int | None:
        """The last step every rank completed (its per-step agreement succeeded, or a restore resumed from it)."""
        return self._reporter.last_step

    @property
    def in_process(self) -> bool:
        """Whether workers outlive a re-form (the in-process recovery mode: runtime/loops/in_process.py)."""
        return self.settings.in_process

    @property
    def replica_rank(self) -> int | None:
        """In-process recovery: this node's rank among the replicas training the current step; None while it takes
        the state from a peer (its batch is not trained), or outside that mode."""
        return self._loop.replica_rank

    @property
    def memory_step(self) -> int | None:
        """The newest step this process committed to its node's memory (None: none, or not the node's writer)."""
        return self._memory.memory_step if self._memory is not None else None

    @property
    def _pending(self) -> Any:  # the upload in flight (a Future), for tests that hold it back
        return self._saver.pending

    # -- restore -----------------------------------------------------------------
    def restore(self, state: dict[str, Any]) -> int | None:
        """Load the newest valid checkpoint into ``state``; its step, or None if there is none.

        Collective: call it on every rank. Rank 0 lists the complete
        checkpoints and broadcasts them; every rank tries the same one and they
        move on together to the next newest if any rank finds a file damaged.
        A newer whole copy in a node's memory wins (runtime/restoring.py).
        """
        self.wait(raise_errors=False)
        restored = self._restorer.restore(state)
        self._newest_blob = restored.newest_blob
        if restored.step is not None:
            if restored.durable_step is not None:
                # blob holds it: a save of this step would be refused as a second commit
                self._saver.last_saved_step = restored.durable_step
            self._saver.last_save_time = time.monotonic()
            self._reporter.completed(restored.step)  # the step the job resumes from, for honest loss accounting
        return restored.step

    # -- the memory tier (runtime/memory.py) ------------------------------------------
    def kept_in_memory(self) -> int | None:
        """The newest step this process committed to its node's memory (None: none, or not the writer),
        once the commit in flight, if any, is done."""
        return self._memory.kept() if self._memory is not None else None

    def _kept_here(self, step: int) -> bool:
        """Whether this node's memory holds ``step``: its writer (local rank 0) knows; the others defer to it."""
        if self._memory is None:
            return False
        return self._memory.writer and self._memory.kept() == step if self.local_rank == 0 else True

    def _durable(self) -> bool:
        """Blob holds some complete checkpoint of this job (saved by this training, or found by restore)."""
        return self.last_saved_step is not None or self._newest_blob is not None

    # -- save (runtime/saving.py) ----------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], *, blocking: bool | None = None) -> None:
        """Checkpoint ``state`` as ``step``. Collective: call it on every rank.

        Returns once the state is copied to CPU memory; the upload continues in
        the background (``blocking=True``, or ``async_save=False``, waits for
        the commit). A previous save still uploading is finished first.
        """
        self._check_running("save()")
        step_time = self._reporter.last_step_time if step == self._reporter.last_step else None
        self._saver.save(step, state, background=not (blocking or (blocking is None and not self.async_save)),
                         step_time=step_time)

    def wait(self, raise_errors: bool = True) -> None:
        """Wait for the save in flight, if any. Raises its error unless told not to."""
        self._saver.wait(raise_errors)

    # -- the per-step hook (runtime/stepping.py) ---------------------------------------------
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
        self._loop.check_hook()  # a mode that needs the step boundary of steps()/batches() refuses the hook
        self._check_running("step()")
        metrics = {**self._take_metrics(), **(metrics or {})}
        self._reporter.reached(step)
        if self._memory is not None:
            self._memory.keep(step, state, self.world_size)  # step() comes after the optimizer step: completed
        if self._policy.at_step(step, state, samples=samples, metrics=metrics):
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
        for sampler in samplers_in(state):
            sampler.stop(step)

    def _take_metrics(self) -> dict[str, float]:
        """The metrics ``report()``ed for the step being trained, taken: the next step starts with none."""
        metrics, self._metrics = self._metrics, {}
        return metrics

    def _record_interruption(self, flush_seconds: float = 5.0) -> None:
        """Training stops before ``done``: record the last step the job completed (runtime/reporting.py)."""
        self._reporter.record_interruption(self._notices.sigterm_times(), flush_seconds)

    # -- the loop ------------------------------------------------------------------------
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
        return self._loop.steps(state, total, samples=samples)

    def batches(self, state: dict[str, Any], loader: Iterable[Any], epochs: int | None = None, *,
                steps: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for every batch left in ``epochs`` epochs, one flat loop with no inner one; or,
        with ``steps=N`` instead, for the first N global batches, across as many epochs as they take.

        ``loader`` is a DataLoader over an ``ElasticSampler`` (its ``batch_sampler``) that is in ``state``.
        Restores ``state`` (the sampler comes back mid-epoch, at any world size), moves the sampler from
        epoch to epoch, marks each batch trained (``advance()``) after its body, then as ``steps()``: the
        per-step hook, the end of the process at a stop, the job finished after the last batch. Step
        numbers count global batches: the total is ``epochs * sampler.batches_per_epoch``, or ``steps``.
        """
        if (epochs is None) == (steps is None):
            raise ValueError("give batches() how long to train: epochs=E (whole epochs) or steps=N (global "
                             "batches), one of the two")
        for name, value in (("epochs", epochs), ("steps", steps)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be at least 0, not {value}")
        sampler = getattr(loader, "batch_sampler", None)
        if not isinstance(sampler, ElasticSampler):
            raise ValueError("batches() needs a DataLoader over an ElasticSampler: "
                             "DataLoader(dataset, batch_sampler=ElasticSampler(dataset, ...))")
        if not any(found is sampler for found in samplers_in(state)):
            raise ValueError("the loader's ElasticSampler is not in the state: put it there (e.g. "
                             "state['data'] = sampler) so its position is checkpointed with the model")
        nodes = self.settings.nodes
        if nodes is not None:  # every world the job may run at, before training rather than at a scale-up
            node_size = self._loop.node_size()
            sampler.check_worlds(n * node_size for n in range(nodes[0], nodes[1] + 1))
        if steps is not None:  # the epochs the steps reach into; the loop ends at the step
            epochs = -(-steps // sampler.batches_per_epoch) if sampler.batches_per_epoch else 0
        assert epochs is not None
        return self._loop.batches(state, loader, sampler, epochs, steps=steps)

    # -- end ---------------------------------------------------------------------------
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
            self._reporter.finished = True
            if self.rank == 0:
                self._reporter.emit(progress.FINISHED, step=step, **({"total": total} if total is not None else {}))
            if self._memory is not None:
                self._memory.discard()  # the job is over: free the node's memory
        finally:
            self.close()

    @property
    def finished(self) -> bool:
        """True once the planned work is trained and recorded (``done()``, or the end of ``steps()``)."""
        return self._reporter.finished

    def close(self) -> None:
        """Finish the upload in flight and stop the background work. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        atexit.unregister(self._record_interruption)
        if self._peers is not None:
            self._peers.stop()  # leaving on purpose: not a vanish for the peers
        self._record_interruption()  # first: waiting for an upload whose peers died can take long
        self._loop.close()  # in-process: out of the quorum at once, the others go on without this node
        try:
            self.kept_in_memory()  # the step kept last is committed before the process goes
            self.wait(raise_errors=False)
        finally:
            self._saver.close()
            if self._memory is not None:
                self._memory.close()
            self._notices.stop()
            self._reporter.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
