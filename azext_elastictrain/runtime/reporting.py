"""What the Checkpointer tells the CLI: the job's events, its progress, and the step it got to.

One ``Reporter`` per worker, over the append-blob event log (runtime/progress.py). It keeps the step every rank
completed (and the one this rank's own state reached), so that a worker that stops before ``done`` can record
honestly where the job got to (``interrupted``), and rate-limits ``progress`` events on rank 0.
"""
from __future__ import annotations

import time
from typing import Any, Callable, cast

from azext_elastictrain.core.settings import DEFAULTS
from azext_elastictrain.runtime import progress


class Reporter:  # pylint: disable=too-many-instance-attributes  # the step counters and the progress window
    """Events of one worker; every method is a no-op for the event log when ``events`` is None."""

    def __init__(self, events: "progress.EventLog | None", *, rank: int, world_size: int,
                 progress_seconds: float = DEFAULTS.progress_seconds, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.events = events
        self.rank = rank
        self.world_size = world_size
        self.progress_seconds = progress_seconds
        self._clock, self._wall = clock, wall
        # The last step every rank completed (its per-step agreement succeeded), for honest loss accounting.
        self.last_step: int | None = None
        self.last_step_time: float | None = None
        # The last step this rank's own state reached (step() is called after the optimizer step, so its
        # gradients were reduced across every rank): one past last_step when a peer died during the agreement.
        self.reached_step: tuple[int, float] | None = None
        self.finished = self.interruption_recorded = False
        self._samples = 0.0
        self._since = clock()
        # The first step is reported at once: when a (re-formed) job trains again is what monitoring
        # and recovery measurements want to know, to the step, not to the next report interval.
        self._last_report: float | None = None

    def emit(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)

    def new_world(self, world_size: int) -> None:
        """The job trains at ``world_size`` from here (in-process: the quorum changed): its first step is reported
        at once, and no rate measured at the old size is carried over."""
        self.world_size = world_size
        self._samples, self._since, self._last_report = 0.0, self._clock(), None

    def reached(self, step: int) -> None:
        """This rank's state completed ``step`` (its optimizer step ran), before the ranks agreed on it."""
        self.reached_step = (step, self._wall())

    def completed(self, step: int) -> None:
        """Every rank completed ``step`` (the agreement returned, or a restore resumes from it)."""
        self.last_step, self.last_step_time = step, self._wall()

    def record_progress(self, step: int, samples: float | None, metrics: dict[str, float] | None) -> None:
        """A ``progress`` event from rank 0: at the first step, then at most every ``progress_seconds``."""
        if self.rank != 0 or self.events is None:
            return
        self._samples += samples or 0
        now = self._clock()
        first = self._last_report is None
        if self._last_report is not None and now - self._last_report < self.progress_seconds:
            return
        elapsed = now - self._since
        # no rate from the first step: its time since start includes the restore
        rate = self._samples / elapsed if elapsed > 0 and samples is not None and not first else None
        fields: dict[str, Any] = {"step": step, "world_size": self.world_size}
        if rate is not None:
            fields["samples_per_s"] = round(rate, 2)
        if metrics:
            fields["metrics"] = {k: float(v) for k, v in metrics.items()}
        self.emit(progress.PROGRESS, **fields)
        self._samples, self._since, self._last_report = 0.0, now, now

    def record_interruption(self, sigterm_times: list[float], flush_seconds: float = 5.0) -> None:
        """Training stops before ``done``: record the last step the job completed, from every rank (or the
        step this rank completed after it, if a peer died during that step's agreement).

        Any survivor may be the one to tell (rank 0 may be the node that died); the reader takes the
        newest per re-forming, so the copies from several ranks are harmless. Bounded: torchrun kills
        a worker that does not exit after its SIGTERM. Once per worker, and never after the job finished.
        """
        if self.finished or self.interruption_recorded or self.events is None or self.last_step is None:
            return
        self.interruption_recorded = True
        # completed() sets both at once: a last step has its time
        step, step_time = self.last_step, cast(float, self.last_step_time)
        if self.reached_step is not None and self.reached_step[0] > step:
            # its optimizer step ran on gradients every rank reduced (its node's memory copy holds it, and a
            # survivor resumes from it): the step the world reached, though a peer died before agreeing on it
            step, step_time = self.reached_step
        self.emit(progress.INTERRUPTED, step=step, step_time=round(step_time, 3), world_size=self.world_size,
                  **({"sigterm_time": round(min(sigterm_times), 3)} if sigterm_times else {}))
        self.events.flush(flush_seconds)

    def close(self) -> None:
        if self.events is not None:
            self.events.flush()
            self.events.close()
