"""What to do at a step boundary: train on, save on the interval, or act on a notice anywhere in the job.

``StepPolicy.at_step`` runs after every training step, on every rank. One small all-reduce agrees on three
facts (a Scheduled Events notice somewhere, a SIGTERM somewhere, an interval save due on rank 0), so every rank
takes the same branch at the same step:

- a SIGTERM and no notice: torchrun re-forms the world (or the job stops): stop at this step, which survives in
  every node's memory, or in blob when it must (``_on_sigterm``);
- a notice (or a SIGTERM with one): save this step to blob, acknowledge the event, and hold until the VM goes
  (``_on_preemption``: the shape of a planned departure, ``depart``);
- else the interval save, if due.

``depart`` is that shape for every recovery mode: record the notices, keep the step (how is the mode's own), then
acknowledge the Scheduled Events notice and hold until the VM goes. The in-process loop (runtime/loops/in_process.py)
leaves its quorum through it.

The policy decides and sequences; the saving, the memory tier and the event log are the callables and objects
it is given, so a test drives it with fakes of those and of the clock.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping

from azext_elastictrain.core import launch
from azext_elastictrain.core.settings import DEFAULTS
from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.reporting import Reporter

log = logging.getLogger(__name__)

SIGTERM = "sigterm"  # a notice's source when the process got SIGTERM (runtime/preemption.py)


def node_leaving(environ: Mapping[str, str] | None = None) -> bool:
    """True once this node itself is going (its pod deleted, a local node stopped): launch.ENV_NODE_LEAVING_FILE."""
    path = (os.environ if environ is None else environ).get(launch.ENV_NODE_LEAVING_FILE)
    return bool(path and os.path.exists(path))


class Notices:
    """The preemption watcher's notices, less those already acted on; the hold and the wait for a SIGTERM."""

    def __init__(self, watcher: Any, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.watcher = watcher
        self._handled: set[str] = set()
        self._clock, self._sleep = clock, sleep

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def live(self) -> list[Any]:
        """Notices not yet acted on (a handled Scheduled Event stays listed until the VM goes)."""
        if self.watcher is None:
            return []
        return [n for n in self.watcher.notices() if (n.event_id or n.source) not in self._handled]

    def handled(self, notice: Any) -> None:
        self._handled.add(notice.event_id or notice.source)

    def sigterm_times(self) -> list[float]:
        """When this process got SIGTERM (every such notice, handled or not)."""
        if self.watcher is None:
            return []
        return [n.received_at for n in self.watcher.notices() if n.source == SIGTERM]

    def sigterm(self) -> bool:
        return self.watcher is not None and any(n.source == SIGTERM for n in self.watcher.notices())

    def acknowledge(self) -> None:
        self.watcher.acknowledge()

    def wait_for_sigterm(self, seconds: float, poll: float) -> bool:
        """True as soon as this process gets SIGTERM; False after ``seconds`` without one."""
        deadline = self._clock() + seconds
        while self.watcher is not None and self._clock() < deadline:
            if self.sigterm():
                return True
            self._sleep(poll)
        return False


class StepPolicy:  # pylint: disable=too-many-instance-attributes  # the settings and the collaborators it sequences
    """The per-step decision and what follows from it; ``at_step`` returns True for: stopped, exit now."""

    def __init__(self, ranks: Collectives, notices: Notices, reporter: Reporter, *,
                 save: Callable[..., None], kept_here: Callable[[int], bool], durable: Callable[[], bool],
                 last_save_time: Callable[[], float], local_rank: int = 0,
                 interval_steps: int | None = DEFAULTS.checkpoint_interval_steps,
                 interval_seconds: float | None = DEFAULTS.checkpoint_interval_seconds,
                 hold_seconds: float = DEFAULTS.hold_seconds, sigterm_wait_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, leaving: Callable[[], bool] = node_leaving):
        self.ranks, self.notices, self.reporter = ranks, notices, reporter
        self._save, self._kept_here, self._durable, self._last_save_time = save, kept_here, durable, last_save_time
        self.local_rank = local_rank
        self.interval_steps = interval_steps
        self.interval_seconds = interval_seconds
        self.hold_seconds = hold_seconds
        self.sigterm_wait_seconds = sigterm_wait_seconds
        self._clock, self._leaving = clock, leaving

    def due(self, step: int) -> bool:
        """An interval save is due at ``step`` (every ``interval_steps``, or ``interval_seconds`` since the last)."""
        if self.interval_steps and step % self.interval_steps == 0:
            return True
        if not self.interval_seconds:
            return False
        return self._clock() - self._last_save_time() >= self.interval_seconds

    def at_step(self, step: int, state: dict[str, Any], *, samples: float | None,
                metrics: dict[str, float] | None) -> bool:
        """After ``step`` was trained on this rank (collective): agree, record, then act."""
        notices = self.notices.live()
        sigterm = any(n.source == SIGTERM for n in notices)
        due = self.ranks.rank == 0 and self.due(step)
        vm_notice_anywhere, sigterm_anywhere, save_due = self.ranks.all_reduce_max(
            [1 if notices and not sigterm else 0, 1 if sigterm else 0, 1 if due else 0])
        self.reporter.completed(step)  # the agreement returned: every rank finished this step
        self.reporter.record_progress(step, samples, metrics)
        if sigterm_anywhere and not vm_notice_anywhere:
            return self._on_sigterm(step, state, notices)
        if vm_notice_anywhere or sigterm_anywhere:
            return self._on_preemption(step, state, notices)
        if save_due:
            self._save(step, state)
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
        kept = self._kept_here(step)  # local rank 0, the node's writer, says whether the node holds this step
        if kept and self._leaving():  # the node goes with its memory: this is no re-form it survives
            log.warning("SIGTERM at step %d and this node is going: its memory copy will not outlive it", step)
            kept = False
        (missing,) = self.ranks.all_reduce_max([0 if kept and self._durable() else 1])
        own = any(n.source == SIGTERM for n in notices)
        self._record(step, notices)
        if self.ranks.rank == 0:
            self.reporter.emit(progress.REFORMING, step=step, kept_in_memory=not missing,
                               world_size=self.ranks.world_size)
        if missing:
            log.warning("SIGTERM at step %d: checkpointing it to blob", step)
            self._save(step, state, blocking=True)
        else:
            log.warning("SIGTERM at step %d: it is in every node's memory; exiting without a blob save", step)
        if own:
            return True
        if self.notices.wait_for_sigterm(self.sigterm_wait_seconds, poll=0.05):
            # its own SIGTERM came after the step's agreement (ms after a peer's): recorded as if it had been first,
            # or a node whose first worker was signalled last would leave no ``preempted`` event
            self._record(step, self.notices.live())
            return True
        log.warning("another rank was stopped at step %d but this one was not: training on", step)
        return False

    def _on_preemption(self, step: int, state: dict[str, Any], notices: list[Any]) -> bool:
        """A notice anywhere in the job: every rank saves this step to blob, then departs (``depart``)."""
        def save() -> None:
            for notice in notices:
                log.warning("preemption notice (%s) at step %d: checkpointing now", notice.source, step)
            started = time.monotonic()
            self._save(step, state, blocking=True)
            if notices:
                log.warning("preemption checkpoint of step %d durable after %.2fs", step, time.monotonic() - started)

        return self.depart(step, notices, keep=save)

    def depart(self, step: int, notices: list[Any], *, keep: Callable[[], None], after: str = "training on") -> bool:
        """A planned departure at ``step``, in any recovery mode: record this rank's notices (each acted on once, one
        ``preempted`` event per node), keep the step (``keep``: the mode's way to make it outlive this node), then
        acknowledge the Scheduled Events notice (the VM goes sooner) and hold until the VM goes (``_hold``; ``after``:
        what the caller does if the VM is still here then, for the log).

        True: stop now (a SIGTERM came, before or during the hold). False: train on (no notice of this rank's own
        to hold for, or the VM was still here after the hold).
        """
        self._record(step, notices)
        keep()
        acknowledged = False
        for notice in notices:
            if notice.source != SIGTERM:
                self.notices.acknowledge()
                acknowledged = True
        if any(n.source == SIGTERM for n in notices):
            return True
        return self._hold(step, after) if acknowledged else False

    def _record(self, step: int, notices: list[Any]) -> None:
        """The notices acted on at ``step``: not acted on again, and one ``preempted`` event per node each."""
        for notice in notices:
            self.notices.handled(notice)
            if self.local_rank == 0:  # one event per node, not one per worker
                self.reporter.emit(progress.PREEMPTED, step=step, source=notice.source, event_id=notice.event_id)

    def _hold(self, step: int, after: str = "training on") -> bool:
        """After acknowledging a Scheduled Events notice, train no further step until the VM goes.

        Once acknowledged, Azure takes the VM within seconds, and the job resumes from the notice's
        checkpoint: every step trained in between would be lost (and counted so). Holding here stalls the
        whole job (the other ranks wait in the next collective), which costs the same wall time and loses
        nothing. Exiting instead is not an option: a node whose workers exit 0 closes the rendezvous for the
        whole job. If the VM is still here after ``hold_seconds`` (the eviction was called off), False: the caller
        goes on (``after``; at a step boundary: train on). True (stop now) if a SIGTERM comes while holding: the
        checkpoint of ``step`` is durable.
        """
        if self.hold_seconds > 0:
            log.warning("holding at step %d until this VM goes (at most %.0fs)", step, self.hold_seconds)
        if self.notices.wait_for_sigterm(self.hold_seconds, poll=0.1):
            return True
        if self.hold_seconds > 0:
            log.warning("the VM was not taken within %.0fs of the acknowledgement: %s", self.hold_seconds, after)
        return False
