"""The restart recovery mode's loop: torchrun restarts every worker at a change of the job's members.

Each worker trains the steps left after its restore (memory, a peer or blob: runtime/restoring.py). After each
body the per-step hook (``Checkpointer.step``, runtime/stepping.py) saves on the interval and agrees on notices; at
a stop the loop ends the process (``TrainingStopped``) and torchrun starts the workers again, which resume from that
step. Once the planned work is trained it commits the final checkpoint and records the job finished. A loop of the
script's own may call the same hooks in this mode; a peer that vanishes is found by the peer watch.
"""
from __future__ import annotations

import logging
import os
from itertools import islice
from typing import Any, Callable, Iterable, Iterator

from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.loop import count, epoch_batches
from azext_elastictrain.runtime.loops.base import TrainingLoop
from azext_elastictrain.runtime.stopping import TrainingStopped

log = logging.getLogger(__name__)


class RestartLoop(TrainingLoop):
    """The loop of a worker that a change of members restarts (see the module's docstring)."""

    watches_peers = True

    def node_size(self) -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def steps(self, state: dict[str, Any], total: int, *, samples: float | None) -> Iterator[int]:
        step = self.parts.restore(state) or 0
        return self._run(state, step, total, count(step, total), samples=samples)

    def batches(self, state: dict[str, Any], loader: Iterable[Any], sampler: ElasticSampler, epochs: int, *,
                steps: int | None) -> Iterator[tuple[int, Any]]:
        step = self.parts.restore(state) or 0
        # The planned work is every batch of every epoch (done when they are exhausted, whatever a script
        # migrated from another loop counted its steps as), or the first ``steps`` of them.
        items = epoch_batches(loader, sampler, epochs)
        if steps is not None:
            items = islice(items, max(0, steps - step))
        return self._run(state, step, steps, items, samples=sampler.global_batch_size, trained=sampler.advance)

    def _run(self, state: dict[str, Any], step: int, total: int | None, items: Iterator[Any], *,
             samples: float | None, trained: Callable[[], None] | None = None) -> Iterator[Any]:
        """The loop of ``steps()`` and ``batches()``: yield, then the step's hook; finish at ``total``."""
        parts = self.parts
        try:
            for item in items:
                step += 1
                yield step if trained is None else (step, item)
                if trained is not None:
                    trained()
                if parts.hook(step, state, samples=samples):
                    log.warning("stopped at step %d: ending this worker; the job resumes from here", step)
                    parts.close()
                    raise TrainingStopped(step, "a SIGTERM: torchrun re-forms the job or the node goes")
            parts.finish(step, state, step if total is None else total)
        finally:
            if not parts.reporter.finished:
                parts.close()  # a break, an exception or a stop: unfinished, the interruption is recorded
