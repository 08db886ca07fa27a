"""The in-process recovery mode's loop: workers outlive a change of the job's members.

Each node is a world of its own (torchrun --standalone) and one replica group of the job (runtime/replicas.py,
torchft's Manager). At every step boundary, before the batch is fetched, the node joins the step's quorum: a lost
node is dropped and a newcomer admitted (it takes the state from a live peer) without a restart. Each step's batch
is the node's slice of the global batch under that quorum (runtime/replica_data.py); a step a peer did not finish
is discarded and trained again; only committed steps count. A change of members is one ``quorum`` event
(runtime/membership.py). A notice or a SIGTERM on this node takes it out of the quorum (StepPolicy.depart) while
the others train on. The quorum's writer group saves on the interval and the final checkpoint, which the other
nodes wait for before they end.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from azext_elastictrain.core import catalog
from azext_elastictrain.runtime import progress
from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.errors import CheckpointError
from azext_elastictrain.runtime.loop import data_in
from azext_elastictrain.runtime.loops.base import TrainingLoop
from azext_elastictrain.runtime.stopping import TrainingStopped

if TYPE_CHECKING:
    from azext_elastictrain.runtime.membership import Membership
    from azext_elastictrain.runtime.replica_data import ReplicaBatches
    from azext_elastictrain.runtime.replicas import Quorum, ReplicaGroup

#: How long a node that does not write the final checkpoint waits for the writing node's commit before it ends (an
#: upload of a large state to blob takes minutes), and how often it looks.
FINAL_COMMIT_TIMEOUT_SECONDS = 1800.0
FINAL_COMMIT_POLL_SECONDS = 0.5

LEFT = "this node leaves the job (a notice or a SIGTERM)"

log = logging.getLogger(__name__)


class InProcessLoop(TrainingLoop):
    """The loop of a node that stays alive through changes of the job's members (see the module's docstring)."""

    replicas: ReplicaGroup | None = None  # the node's replica group, while the loop runs

    @property
    def replica_rank(self) -> int | None:
        return self.replicas.rank if self.replicas is not None else None

    def node_size(self) -> int:
        return self.parts.ranks.world_size  # the node's workers are the node's own world

    def check_hook(self) -> None:
        # A loop of the script's own has no step boundary for the quorum: each node would train alone on its own
        # slice and every node would write the job's checkpoints. Never silently: refuse it.
        raise RuntimeError(
            "Checkpointer.step() is the hook of a hand-written loop, which the in-process recovery mode "
            "(job run --recovery in-process) cannot keep in step across nodes: loop with "
            "`for step, batch in ckpt.batches(state, loader, epochs=E)` or `for step in ckpt.steps(state, "
            "total=N)` (docs/runtime.md), or run the job with --recovery restart")

    def steps(self, state: dict[str, Any], total: int, *, samples: float | None) -> Iterator[int]:
        found = next(data_in(state), None)
        if found is not None:
            # steps() hands out no batches: each node's own loader would draw its node's slice of the same global
            # batch as every other node's (an ElasticSampler), or its node's share of the data as if the node were
            # the job (torchrun --standalone's world: a DistributedSampler), so the job would train each sample once
            # per node. batches() slices each step's global batch by the step's quorum.
            raise ValueError(
                f"in-process recovery: the state holds data ({type(found).__name__}), and with ckpt.steps() every "
                "node would draw the same samples from it (each node is a world of its own in this mode); loop with "
                "`for step, batch in ckpt.batches(state, loader, steps=N)` over a DataLoader whose batch_sampler "
                "is an ElasticSampler, which slices each global batch across the nodes, or run with "
                "--recovery restart")
        step = self.parts.restore(state) or 0
        return self._run(state, step, total=total, samples=samples)

    def batches(self, state: dict[str, Any], loader: Iterable[Any], sampler: ElasticSampler, epochs: int, *,
                steps: int | None) -> Iterator[tuple[int, Any]]:
        from azext_elastictrain.runtime.replica_data import ReplicaBatches

        step = self.parts.restore(state) or 0
        ranks = self.parts.ranks
        data = ReplicaBatches(loader, sampler, epochs, node_rank=ranks.rank, node_size=ranks.world_size)
        return self._run(state, step, total=steps, data=data, samples=sampler.global_batch_size)

    def _run(self, state: dict[str, Any], step: int, *, total: int | None = None,
             data: ReplicaBatches | None = None, samples: float | None = None) -> Iterator[Any]:
        """The loop of ``steps()`` and ``batches()`` when workers outlive a re-form: a quorum at each step
        boundary before the batch is fetched; a discarded step is trained again; only committed steps count."""
        from azext_elastictrain.runtime.membership import Membership
        from azext_elastictrain.runtime.replicas import ReplicaGroup

        parts = self.parts
        replicas = self.replicas = ReplicaGroup(state, step=step, node_max=parts.ranks.all_reduce_max)
        if parts.memory is not None:
            replicas.before_write = parts.memory.landed
        members = Membership(parts.ranks.world_size)
        try:
            while not (step >= total if total is not None else data is None or data.finished()):
                quorum = replicas.begin_step(step, salvageable=data is not None and data.salvageable())
                if replicas.handover.done:  # this node hands over, and the step's start failed: it leaves now
                    self._leave(step, state, replicas)
                self._record_quorum(members, quorum, replicas.served() or replicas.healed)
                if replicas.healed and data is not None:
                    data.healed()
                item = data.next(quorum) if data is not None else None
                yield (quorum.step + 1, item) if data is not None else quorum.step + 1
                if not replicas.end_step():
                    replicas.undo.undo()
                    members.discard()
                    if data is not None:
                        data.discarded()
                    if replicas.handover.done:
                        self._leave(step, state, replicas)
                    continue
                step = quorum.step + 1
                if data is not None:
                    data.trained(replicas.salvage.lost)
                if self._replica_step(step, state, replicas, samples):
                    raise TrainingStopped(step, LEFT)
            if replicas.is_writer() or replicas.participants() == 0:
                parts.finish(step, state, step if total is None else total)
            else:  # the writer group saves the final step and records the job finished; the others end after it
                self._await_final_commit(step)
                parts.reporter.finished = True
        finally:
            if not parts.reporter.finished:
                parts.close()
            replicas.close()

    def _await_final_commit(self, step: int) -> None:
        """A node that does not write the final checkpoint ends only once the writing node committed it (its
        manifest in blob): k8s-job's Job succeeds at the first pod that exits 0 and then stops the others, so a node
        ending first would have the writing node's pod stopped mid-upload. No commit within
        ``FINAL_COMMIT_TIMEOUT_SECONDS`` (the writing node gone with the final step): CheckpointError, so the job
        is not taken for Succeeded without its final checkpoint."""
        if self.parts.ranks.rank != 0:  # the node's rank 0 waits; torchrun ends the node once all its workers ended
            return
        deadline = time.monotonic() + FINAL_COMMIT_TIMEOUT_SECONDS
        while True:
            committed = [c.step for c in catalog.list_checkpoints(self.parts.store, self.parts.job_prefix)
                         if c.complete]
            if committed and max(committed) >= step:
                return
            if time.monotonic() >= deadline:
                raise CheckpointError(f"the final checkpoint (step {step}) was not committed by the writing node "
                                      f"within {FINAL_COMMIT_TIMEOUT_SECONDS:g} s")
            time.sleep(FINAL_COMMIT_POLL_SECONDS)

    def _record_quorum(self, members: Membership, quorum: Quorum, served: bool) -> None:
        """A change of the quorum's members: the job's world size from here, and its ``quorum`` event (written by
        the quorum's first replica; runtime/membership.py)."""
        reporter = self.parts.reporter
        before = members.replicas
        change = members.observe(replicas=quorum.participants, step=quorum.step, rank=quorum.rank,
                                 last_step=reporter.last_step, last_step_time=reporter.last_step_time,
                                 served=served)
        if members.replicas != before and members.replicas:
            reporter.new_world(members.world_size(members.replicas))
        if change is not None and self.parts.local_rank == 0:
            reporter.emit(progress.QUORUM, **change)

    def _replica_step(self, step: int, state: dict[str, Any], replicas: ReplicaGroup, samples: float | None) -> bool:
        """After a committed step: keep it in memory, save on the interval (the writer group only), and on a
        notice or a SIGTERM on this node leave the quorum (the others train on). True: this node left."""
        parts = self.parts
        parts.check_running("step()")
        metrics = parts.take_metrics()
        parts.reporter.reached(step)
        if parts.memory is not None:
            parts.memory.keep(step, state, parts.ranks.world_size)
        notices = parts.notices.live()
        from azext_elastictrain.runtime.handover import time_left

        first = parts.ranks.rank == 0  # what the node's first worker sees, the node decides
        leaving, due, handover = parts.ranks.all_reduce_max(
            [1 if notices else 0, 1 if first and parts.policy.due(step) else 0,
             1 if first and replicas.can_hand_over(time_left(notices)) else 0])
        parts.reporter.completed(step)
        writer = replicas.is_writer()
        if writer:
            parts.reporter.record_progress(step, samples, metrics)
        if replicas.handover.done or (leaving and not handover and not replicas.handover.leaving):
            self._depart(step, state, notices, replicas)
            return True
        if leaving and not replicas.handover.leaving:  # the others go on without this node's heartbeat timeout
            log.warning("a notice at step %d: handing over to the other nodes before leaving", step)
            replicas.handover.leaving = True
        if due and writer:
            parts.save(step, state)
        return False

    def _leave(self, step: int, state: dict[str, Any], replicas: ReplicaGroup) -> None:
        """A departing node's handover ended with a step it did not commit: it leaves at ``step``."""
        self._depart(step, state, self.parts.notices.live(), replicas)
        raise TrainingStopped(step, LEFT)

    def _depart(self, step: int, state: dict[str, Any], notices: list[Any], replicas: ReplicaGroup) -> None:
        """A planned departure (runtime/stepping.py ``depart``): the notices stamped first (the survivors' next
        quorum, the re-form, is this notice's), out of the quorum (it goes on without this node), the step durable
        (the peers that committed it hold it; else blob: runtime/handover.py ``saves_on_departure``), the notice
        acknowledged, then hold until the node goes."""
        from azext_elastictrain.runtime.handover import saves_on_departure

        participants, handover = replicas.participants(), replicas.handover
        saves = saves_on_departure(participants=participants, writer=replicas.is_writer(),
                                   handed_over=handover.stopped_at is not None, everyone=handover.everyone)
        why = ("every node leaves: the quorum's writer saves it" if handover.everyone else
               "saving it: no peer holds it" if participants <= 1 else
               "saving it: the others may be leaving too" if saves else "its peers hold it")

        def leave() -> None:
            replicas.close()
            log.warning("leaving the job at step %d (%s)", step, why)
            if saves:
                self.parts.save(step, state, blocking=True)
            self.parts.stop(step, state)

        self.parts.policy.depart(step, notices, keep=leave, after="ending this worker")

    def close(self) -> None:
        if self.replicas is not None:
            self.replicas.close()  # out of the quorum at once: the others go on without this node
