"""A planned departure that costs the others no wait (in-process mode): the leaving node hands over.

torchft's coordinator has no call by which a node leaves. It drops a node once the node's last heartbeat is older
than its heartbeat timeout (core/launch.py: local 0.5 s, AKS 1 s), and a quorum asked before then waits for the
node (it is heard, and has not asked). So a node that left at its notice cost every survivor that wait at the next
step (1.07 s with AKS's figures: docs/benchmarks.md).

A notice leaves the node time (Azure's Scheduled Events: at least 30 s; a pod's SIGTERM: its grace period), so the
node spends the wait training instead:

1. At the step after its notice, the node asks for the quorum as always and says in the step's start collective
   that it departs. Right after that collective it stops its heartbeats (torchft's ``Manager.shutdown``: its
   server goes, with the heartbeat to the coordinator and the commit vote of the node's workers).
2. From the next step on, every participant trains with the last quorum without asking the coordinator (as when
   the coordinator does not answer: ``ReplicaGroup._coast``), the departing node too. It is a whole replica still:
   its gradients count, and it commits the steps the others commit (its workers vote among themselves).
3. Each step's start collective also says whether the departing node is ready: its last heartbeat is the
   heartbeat timeout old already, and the coordinator's status page no longer counts it. At the first step where
   every departing node is ready, that step is their last: they leave after it (the notice acknowledged, then the
   hold: runtime/loops/in_process.py), and at the next step the others ask the coordinator, which has dropped them
   already and forms the quorum as soon as the last of the others asks.

The survivors' outage is then that quorum and a new process group, not the heartbeat timeout. Every participant
decides alike: each decision comes from the sums of a start collective that every participant took part in, and
from the step's verdict (the same on every participant: runtime/replica_watch.py). So they hold together or ask
together. A step that fails during the handover ends it: the departing nodes leave at once, and the others ask the
coordinator, which waits for the rest of the heartbeat timeout at most. Where every participant departs (Spot
capacity reclaimed from the whole job at once), nobody is left to hold the step: they leave at once, and the
quorum's writer saves the step to blob first, as a node alone does (``saves_on_departure``). A node leaves at
once, as before, where handing over would take long or could not work: a step longer than ``MAX_STEP_SECONDS``, a
notice that expires first (``time_left``: a Scheduled Event that has started leaves none), no other participant,
the coordinator not answering.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from azext_elastictrain.runtime.preemption import SOURCE_SIGTERM

# A node whose steps take longer leaves at once: its handover (the heartbeat timeout plus up to two steps) would
# take a large part of Azure's 30 s notice, and the others' wait it saves (the heartbeat timeout) is small beside
# such steps.
MAX_STEP_SECONDS = 5.0
# Past the heartbeat timeout, before a departing node counts as dropped: a heartbeat in flight as its server stopped,
# and the coordinator's quorum tick (core/launch.py COORDINATOR_QUORUM_TICK_MS).
MARGIN_SECONDS = 0.1
# A notice must leave at least this many steps beyond the heartbeat timeout for a handover.
NOTICE_STEPS = 3
# A departing node that the coordinator still hears is ready anyway this many heartbeat timeouts after it stopped
# its heartbeats (the others' quorum then waits for its heartbeat to age out, as without a handover).
HEARD_WAIT = 3


@dataclass
class Handover:  # pylint: disable=too-many-instance-attributes  # the step's sums, this node's part, the timing
    """This node's part in a handover (see the module's docstring), and what the current step's start collective
    said of every participant's."""

    heartbeat_timeout: float | None  # the coordinator's (None: no coordinator, no handover)
    leaving: bool = False  # this node departs: it says so from the next step's start collective on
    stopped_at: float | None = None  # when this node stopped its heartbeats (time.monotonic())
    departing: int = 0  # the current step's start collective: participants that depart
    ready: int = 0  # ... and those of them that leave after this step
    diverged: bool = False  # ... and replicas that differ (they heal at a quorum: no step holds)
    everyone: bool = False  # ... and every participant departs: nobody stays to hold the step (the writer saves it)
    hold: bool = False  # the next step trains with the current quorum, the coordinator not asked
    done: bool = False  # this node's handover is over: it leaves now
    step_seconds: float | None = None  # the last step's duration, from one start to the next
    began: float | None = None  # when the current step started
    held: int = 0  # steps this node committed after its heartbeats stopped (its manager counts no more)

    def begin(self, now: float) -> None:
        """A step starts (each try of it)."""
        if self.began is not None:
            self.step_seconds = now - self.began
        self.began = now

    def possible(self, seconds_left: float | None, now: float | None = None) -> bool:
        """Whether this node can hand over rather than leave at once (``seconds_left``: until its notice expires,
        None if the notice does not say), asked at ``now``, as a step ends. At the end of a node's first step no
        step is timed from one start to the next yet: the step that is ending, ``now`` less its start, counts (a
        first step runs longer than the rest, if anything: a warm-up, a heal)."""
        step = self.step_seconds
        if step is None and self.began is not None and now is not None:
            step = now - self.began
        if self.heartbeat_timeout is None or step is None or step > MAX_STEP_SECONDS:
            return False
        needed = self.heartbeat_timeout + MARGIN_SECONDS + NOTICE_STEPS * step
        return seconds_left is None or seconds_left > needed

    def ready_now(self, now: float, heard: Callable[[], bool | None] | None = None) -> bool:
        """(A departing node, at a step's start.) Its last heartbeat is the heartbeat timeout old already, so this
        step can be its last: the others' next quorum request comes after this step, whatever it lasts (a guess
        of the step's length let them ask early when a step ran shorter than the one before).

        ``heard``: whether the coordinator still counts this node (None: it cannot say), asked once that time is
        up. A node it still hears is not ready: a heartbeat that left late (the machine loaded, the torchft
        server's shutdown not done) would make the others' quorum wait for it. Past ``HEARD_WAIT`` heartbeat
        timeouts the node is ready whatever the coordinator says, so a handover always ends."""
        if self.stopped_at is None:
            return False
        waited, timeout = now - self.stopped_at, self.heartbeat_timeout or 0.0
        if waited < timeout + MARGIN_SECONDS:
            return False
        return heard is None or waited >= HEARD_WAIT * timeout + MARGIN_SECONDS or heard() is not True

    def flags(self, ready: bool) -> list[float]:
        """This node's part of the step's start collective: it departs; it is ready."""
        return [1.0 if self.leaving else 0.0, 1.0 if self.leaving and ready else 0.0]

    def started(self, departing: int, ready: int, *, diverged: bool, participants: int) -> None:
        """What the step's start collective said."""
        self.departing, self.ready, self.diverged = departing, ready, diverged
        self.everyone = 0 < participants <= departing

    def failed(self) -> None:
        """The step's start collective failed: no handover goes on through it."""
        self.started(0, 0, diverged=False, participants=0)
        self.ended(committed=False)

    def ended(self, *, committed: bool) -> None:
        """After the step's verdict: whether the next step holds, and whether this node's handover is over."""
        self.hold = (self.departing > 0 and self.ready < self.departing and committed and not self.diverged
                     and not self.everyone)  # every node going: nobody to hand over to, all leave at once
        if self.stopped_at is not None and not self.hold:
            self.done = True

    @property
    def active(self) -> bool:
        """A handover is under way: this node departs, or the next step holds for another."""
        return self.leaving or self.hold


def time_left(notices: list[Any], now: float | None = None) -> float | None:
    """The least time the notices leave this node, in seconds: a Scheduled Event's until its NotBefore; one without
    a NotBefore has started (IMDS blanks it then) and leaves none; a SIGTERM does not say (its pod's grace period:
    None, unless another notice says)."""
    left = [0.0 if n.not_before is None else n.seconds_left(now) for n in notices if n.source != SOURCE_SIGTERM]
    return min(left, default=None)


def saves_on_departure(*, participants: int, writer: bool, handed_over: bool, everyone: bool) -> bool:
    """Whether a departing node saves its step to blob before it goes (no peer may be left to hold it). A node
    alone must. Where every node departs in a handover, the quorum's writer does. A writer that leaves without
    handing over (steps too long for it, no step timed yet) cannot know whether the others leave too (the notices
    of Spot capacity reclaimed from a whole job come together), so it saves: on its own notice's time, not the
    others' (it has left the quorum). The others' steps then hold the step in any case."""
    if participants <= 1:
        return True
    return writer and (everyone or not handed_over)
