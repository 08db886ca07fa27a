"""The in-process recovery mode's replica group: this node in the job's per-step quorum (torchft's Manager).

Each node is one replica group; its workers are a world of their own (torchrun --standalone). At every step
boundary the group asks the coordinator (torchft's Lighthouse) for the step's quorum: which replicas train it,
this one's rank among them, and whether this one is behind and takes the state from a live peer. The gradients
are averaged across the participants and the step is committed only if every participant finished it.

How the user's script is adapted, public APIs only, nothing in the script changes:

- the script's DDP gets a communication hook (runtime/replica_grads.py) that averages the gradients across the
  replicas inside ``backward()``, after DDP's own average within the node, so clipping and everything the script
  does with the gradients sees the job's average, as in one DDP run. A model that is no DDP (one worker per
  node) is averaged in the optimizer's step pre-hook instead, before the step. The pre-hook then asks
  ``should_commit()``; a step that must be discarded leaves every gradient ``None``, and torch's optimizers skip
  parameters without one (the step is a no-op).
- the state a newcomer needs (model, optimizer, sampler position, RNG: runtime/state.py's flat items) goes through
  torchft's state callbacks and runtime/peer_transfer.py. It is loaded at the step boundary, before the step's
  body (torchft's synchronous quorum), so every body the loop yields runs on the committed state of the step
  before: the newcomer's first body trains the same step as its peers, from the same state, with the same
  generators. The peers' state is taken at the same boundary (the quorum's ``send_checkpoint``). Then every
  participant meets in a one-number collective that waits as long as a transfer may take (``_start_together``):
  no replica can see with torchft's public calls that another heals in the step, and the step's own collective
  waits only the replica timeout.
- the job's first quorum makes the replicas one (torchft's ``init_sync``): at step 0 every replica but one takes
  that one's state, so an unseeded model starts from one set of weights everywhere.
- a discarded step takes back everything in ``state`` (``StepUndo``): what the body changed besides the
  optimizer's update, which ``discard_step`` prevents.
"""
from __future__ import annotations

import copy
import http.client
import logging
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from azext_elastictrain.core import launch
from azext_elastictrain.core.settings import RuntimeSettings
from azext_elastictrain.runtime import entries
from azext_elastictrain.runtime.greeter import Greeter, replica_id_of_node
from azext_elastictrain.runtime.handover import Handover
from azext_elastictrain.runtime.loop import samplers_in
from azext_elastictrain.runtime.salvage import Salvage
from azext_elastictrain.runtime.state import capture_rng, modules_in, restore_rng
from azext_elastictrain.runtime.stopping import TrainingStopped

if TYPE_CHECKING:
    from azext_elastictrain.runtime.torchft_types import ReplicaManager

log = logging.getLogger(__name__)

# How long the cross-node collective waits for a peer: the backend's replica timeout (runtime/timeouts.py,
# core/launch.py: local 2 s, AKS 30 s), torchft's TORCHFT_TIMEOUT_SEC overriding it. A peer that is there but does
# not come fails it, and the step is discarded; a peer gone (unheard for the heartbeat timeout) makes every
# participant give the collective up at once (runtime/replica_watch.py). Except in a step where a
# replica heals: it joins the collective only once it has the state, so there the others wait as long as the state
# takes to send (transfer_timeout). With the replica timeout there, a state slower to send than it was never
# admitted: the others discarded the step, trained on without the newcomer, and it was behind again.
TRANSFER_FLOOR_BYTES_PER_SECOND = 50 * 2**20  # the slowest peer-to-peer copy we allow for (~20x below loopback)
# What torchft's Manager waits for on its own node (its server's commit vote, the state lock) and for a peer's
# metadata call: no vanished node is found by these, so they need not be short.
CONTROL_TIMEOUT = timedelta(seconds=30)
QUORUM_TIMEOUT = timedelta(seconds=60)  # no quorum this long (the coordinator gone): back to the restart path
CONNECT_TIMEOUT = timedelta(seconds=10)
# A quorum request that fails (the coordinator restarting) is tried again this many times before the worker takes
# the restart path; torchft's TORCHFT_QUORUM_RETRIES overrides it. torchft's manager sleeps the quorum timeout over
# the retries + 1 between tries (at least 0.1 s): with 30, 1.9 s, which a request in flight at a coordinator's
# restart waited on top of its down time; now 0.1 s (the quorum timeout still bounds the whole request).
QUORUM_RETRY_SECONDS = 0.1
QUORUM_RETRIES = round(QUORUM_TIMEOUT.total_seconds() / QUORUM_RETRY_SECONDS)
# Before each step's quorum request, the coordinator is asked for its index page, waiting this long: a coordinator
# that does not answer (restarting) lets the last quorum train on (ReplicaGroup._coast). A refused port answers at
# once; a killed one whose process is being torn down, once its sockets close (~30 ms).
COORDINATOR_PROBE_TIMEOUT = 0.2
# Coasting ends at the step after one at which every node's probe reached the coordinator, or after this many in a
# row at which some node's did (one that cannot reach it does not keep the others from it for good).
COAST_END_STEPS = 5
STATE_KEY = "elastictrain"  # the state's name among torchft's state callbacks
START_TRIES = 3  # quorums a step's start is tried with when a node goes during it (ReplicaGroup.begin_step)


def in_process(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this job runs in the in-process recovery mode (launch.ENV_RECOVERY)."""
    return RuntimeSettings.from_env(os.environ if environ is None else environ).in_process


@dataclass(frozen=True)
class Quorum:
    """One step's quorum as this replica group sees it."""

    step: int  # the job's committed steps (a healing replica: its peers')
    participants: int  # replica groups that train this step
    rank: int | None  # this group's rank among them; None while it takes the state from a peer


class ReplicaGroup:  # pylint: disable=too-many-instance-attributes  # the manager's handles and the step's verdict
    """This node's membership in the job, step by step; see the module's docstring."""

    def __init__(self, state: dict[str, Any], *, step: int, environ: Mapping[str, str] | None = None,
                 node_max: Callable[[list[int]], list[int]] | None = None) -> None:
        from torchft import Manager

        from azext_elastictrain.runtime.peer_transfer import PeerTransport, job_secret
        from azext_elastictrain.runtime.replica_grads import abortable, replica_backend, replica_process_group
        from azext_elastictrain.runtime.replica_watch import WatchedGroup

        env = os.environ if environ is None else environ
        settings = RuntimeSettings.from_env(env)
        self.state = state
        self.optimizer = the_optimizer(state)
        self.node_rank = dist.get_rank() if dist.is_initialized() else 0
        self.node_size = dist.get_world_size() if dist.is_initialized() else 1
        # the element-wise maximum over the node's workers (runtime/collectives.py ``all_reduce_max``): what they
        # decide as one in a handover (runtime/handover.py)
        self._node_max = node_max or (lambda values: values)
        self.committed: bool | None = None  # the current step's verdict, once asked
        self.healed = False  # this step loaded the state from a peer
        # Called before a heal writes into the live tensors: the memory tier's copies of them must have left
        # (runtime/memory.py MemoryKeeper.landed; the loop sets it where the node keeps its memory copy).
        self.before_write: Callable[[], None] = lambda: None
        self.rank: int | None = None  # this group's rank in the current step's quorum
        self._store = None
        host = env.get(launch.ENV_REPLICA_HOST) or socket.gethostname()
        if dist.is_initialized():
            # Peers reach this node's store (the quorum's primary hands its address out) at the node's own address:
            # torchrun --standalone's MASTER_ADDR may be a name only this machine resolves; the store listens on all.
            store_addr = env.get(launch.ENV_REPLICA_HOST) or env["MASTER_ADDR"]
            store_port = int(env["MASTER_PORT"])
        else:  # one process without a process group: a store of its own for the Manager
            self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            store_addr, store_port = "127.0.0.1", self._store.port
        self.timeout = timedelta(seconds=settings.replica_timeout)
        self.device = parameters_device(self.optimizer)  # where the gradients are, so where their average runs
        replica_backend(self.device, None)  # a device no backend serves is refused before anything starts
        # The state server on the node's own address only (the pod's IP, loopback locally), guarded by the secret.
        self._transport = PeerTransport(host, timeout=self.transfer_timeout, secret=job_secret(env),
                                        bind=env.get(launch.ENV_REPLICA_HOST) or "0.0.0.0",
                                        destination=self._destination)
        self._served = 0
        # torchft's group for the device, watched: a participant gone gives the step's collective up on every
        # participant at once (runtime/replica_watch.py), not at the replica timeout
        self._pg = WatchedGroup(lambda: replica_process_group(self.device, self.timeout),
                                heartbeat_timeout=settings.replica_heartbeat_timeout, abortable=abortable(self.device))
        # Synchronous quorum: a replica behind loads the peer's state inside start_quorum, before its body (with
        # torchft's asynchronous one it loads in should_commit, after a body run on its own stale state and batch).
        self.manager: ReplicaManager = Manager(
            pg=self._pg, load_state_dict=None, state_dict=None,
            min_replica_size=1, use_async_quorum=False, init_sync=True,
            timeout=max(self.timeout, CONTROL_TIMEOUT), quorum_timeout=QUORUM_TIMEOUT, connect_timeout=CONNECT_TIMEOUT,
            rank=self.node_rank, world_size=self.node_size, store_addr=store_addr, store_port=store_port,
            lighthouse_addr=env.get(launch.ENV_COORDINATOR), hostname=host,
            replica_id=env.get(launch.ENV_REPLICA_ID) or socket.gethostname(),
            checkpoint_transport=self._transport, quorum_retries=QUORUM_RETRIES)
        self.manager.register_state_dict_fn(STATE_KEY, self._load, self._state_dict)
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        self._in_hook = False
        # The hook acts on the training thread only: torch's optimizer state dict steps a stateless optimizer (plain
        # SGD) to initialise it, and torchft takes the state on its quorum thread, which must not enter the step's
        # collective (it waited on the quorum it was computing: a node that never finished its quorum).
        self._training_thread = threading.get_ident()
        self._hook = self.optimizer.register_step_pre_hook(self._before_optimizer_step)
        self._in_backward = self._average_in_backward(state)
        self.undo = StepUndo(state, self.optimizer)
        from azext_elastictrain.runtime.replica_check import StepStart

        self._step_start = StepStart(state, self.optimizer)  # buffers made one, replicas checked (replica_check.py)
        self._check_every = settings.replica_check_steps
        # the members and transfers sent at the last step: a change makes a check due
        self._checked: tuple[int | None, int] = (None, 0)
        self._participants = 0  # the step's participants that train it (a diverged replica does not)
        # the coordinator this node trains on without while it does not answer (coast "off": it waits for it)
        self._coordinator = env.get(launch.ENV_COORDINATOR) if settings.coordinator_coast else None
        self._coasting = 0  # steps trained with the last quorum while the coordinator did not answer
        # while coasting: this step's probe reached the coordinator; the last step-start collective's count of the
        # nodes whose probe did, and of the coasting steps in a row at which one did
        self._reached, self._reached_by, self._reaching, self._greeter = False, 0, 0, Greeter(
            env.get(launch.ENV_COORDINATOR) or "", partial(replica_id_of_node, store_addr, store_port))
        self.left = self.excluded = False  # this group left; this replica diverged from the others: it sits the
        # step out and heals after it
        self.salvage = Salvage(enabled=settings.salvage and self.node_size == 1)
        self._start_given_up = False  # this try's start collective was given up on a node gone (begin_step)
        self.handover = Handover(settings.replica_heartbeat_timeout if env.get(launch.ENV_COORDINATOR) else None)

    def _average_in_backward(self, state: dict[str, Any]) -> Any:
        """The comm hook on the state's DDP (runtime/replica_grads.py), or None: averaged in the step pre-hook."""
        from azext_elastictrain.runtime.replica_grads import CrossReplicaAverage, the_ddp

        ddp = the_ddp(modules_in(state), self.optimizer)
        if ddp is None:
            return None
        order = [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]
        hook = CrossReplicaAverage(order, self._allreduce,
                                   track_use=bool(getattr(ddp, "find_unused_parameters", False)))
        try:
            ddp.register_comm_hook(state=None, hook=hook.average)
        except RuntimeError as ex:  # a hook of the script's own: one per DDP
            raise ValueError(f"in-process recovery averages the gradients across the nodes in a DDP communication "
                             f"hook, and this model has one already ({ex}); remove it, or use --recovery restart"
                             ) from ex
        return hook

    # -- the step ---------------------------------------------------------------------------
    def begin_step(self, last_step: int, *, salvageable: bool = False) -> Quorum:
        """At a step boundary, before the batch is fetched: this step's quorum (a newcomer has the state after it).
        ``salvageable``: the loop's data can owe this step's slice of a node that vanishes mid-step
        (runtime/salvage.py).

        A node gone during the step's start collective (every participant gives it up alike: runtime/replica_watch.py)
        costs no step: the quorum is asked again at once, before any body runs, up to START_TRIES times (then the
        step is discarded, as one whose collective failed). If no quorum can be had (the coordinator gone past the
        timeout, this group's manager failed), the worker stops (TrainingStopped): torchrun restarts it and it
        resumes from its node's memory, a peer or blob.
        """
        healed = False
        for _ in range(START_TRIES):
            quorum = self._begin(last_step, salvageable)
            healed = self.healed = healed or self.healed  # a heal in an earlier try: the loop's data must know
            if not self._start_given_up or self.handover.done:  # done: a departing node leaves instead
                break
            log.warning("the step's start was given up on a node gone: a new quorum at once, before its body")
        return quorum

    def _begin(self, last_step: int, salvageable: bool) -> Quorum:
        self.committed, self.healed, self._start_given_up = None, False, False
        self.salvage.begin(salvageable)
        self.handover.begin(time.monotonic())
        ready = self._node_agrees(self.handover.leaving and self.handover.ready_now(time.monotonic(), self._heard))
        self._pg.next_step()
        if self._in_backward is not None:
            self._in_backward.reset()
        self.undo.keep()  # before a healing load: a failed heal discards the step back to this state
        torn = self._transport.torn  # a heal that failed midway last step: this one must heal, or no state is left
        if self._coast(torn):  # the coordinator is down and nothing failed: the last quorum trains on
            rank, participants = self.manager.participating_rank(), self.manager.num_participants()
        else:
            try:
                self.manager.start_quorum()  # the quorum; a replica behind loads a peer's state here (self._load)
                rank = self.manager.participating_rank()
                participants = self.manager.num_participants()
            except Exception as ex:  # pylint: disable=broad-exception-caught  # any failure: the restart path
                log.error("no quorum for the step after %d: %s; restarting this worker", last_step, ex)
                self.close()
                raise TrainingStopped(last_step, f"in-process recovery: no quorum ({ex})") from ex
            if self._coasting:
                log.warning("the coordinator answers again: %d steps trained without it", self._coasting)
                self._coasting, self._reached, self._reached_by, self._reaching = 0, False, 0, 0
                self._greeter.stop()  # on until the torchft server's own heartbeats are back (runtime/greeter.py)
        if torn and self._transport.torn:
            self.close()
            raise TrainingStopped(last_step, "in-process recovery: a heal failed midway through this replica's "
                                             "tensors and no peer healed it since; restarting from its checkpoints")
        if self.healed:
            self.undo.keep()  # the state this step starts from is the peer's
        step = self.current_step()
        diverged = self._start_together(step, rank, participants, ready)
        self._transport.disallow_checkpoint()  # the body changes the tensors served from here on (peer_transfer.py)
        self.excluded = rank in diverged
        healthy = [r for r in range(participants) if r not in diverged]
        self.rank = healthy.index(rank) if rank is not None and not self.excluded else None
        self._participants = len(healthy)
        return Quorum(step, self._participants, self.rank)

    def _coast(self, torn: bool) -> bool:
        """Whether this step trains with the last quorum, without asking the coordinator: it does not answer (its
        port refuses, or its index page does not come in COORDINATOR_PROBE_TIMEOUT: coordinator_answers), and
        nothing failed since the last quorum (no error, no torn heal, this replica in the quorum). The step-start
        collective still finds out whether every member of that quorum is there: if one is gone it fails, the step
        is discarded, and the next step asks the coordinator (waiting for it up to the quorum timeout, as before).
        So while no node leaves or joins, a coordinator that restarts (a Deployment's pod, the local supervisor)
        costs no training.

        The nodes end coasting together: each coasting step's probe goes into the step-start collective, and the
        step after one in which every node reached the coordinator (or some node did, COAST_END_STEPS in a row),
        every node asks it for a quorum (one asking a step before the others got a quorum alone, and the others a
        failed step and a heal). A node whose probe reaches it heartbeats it at once (runtime/greeter.py): a
        coordinator that restarted knows no node, and formed a quorum of the first to ask."""
        if self.handover.hold and not self.manager.errored():  # a node hands over: no quorum until it is dropped
            return True
        if self._coordinator is None or self.rank is None or torn or self.manager.errored():
            return False
        if self._coasting:
            if self._reached_by >= self._participants or self._reaching >= COAST_END_STEPS:
                return False
            self._reached = coordinator_answers(self._coordinator, COORDINATOR_PROBE_TIMEOUT)
            if self._reached and self.node_rank == 0:
                self._greeter.start()
            self._coasting += 1
            return True
        if coordinator_answers(self._coordinator, COORDINATOR_PROBE_TIMEOUT):
            return False
        log.warning("the coordinator does not answer (%s): training on with the last quorum (%d nodes) while no "
                    "node leaves or joins", self._coordinator, self._participants)
        self._reached, self._reached_by, self._reaching, self._coasting = False, 0, 0, 1
        return True

    def _start_together(self, step: int, rank: int | None, participants: int, ready: bool) -> set[int]:
        """Every participant holds the step's state before the step's collective counts time: a collective that
        waits as long as a transfer may take. A newcomer loads the state inside start_quorum and comes here after
        it; the others cannot see it heal, so without this their step's collective, which waits the replica
        timeout, gave up on it (a failure there discards the step). It carries the first replica's buffers to the
        others and, when a check is due, each replica's digest (runtime/replica_check.py): returns the ranks
        whose replica differs from the others'."""
        from azext_elastictrain.runtime.replica_check import winner
        from azext_elastictrain.runtime.replica_watch import PeerGone

        manager = self.manager
        if manager.errored():
            return set()
        members = (participants, self._transport.sent)
        due = self.healed or members != self._checked or (
            self._check_every is not None and step % self._check_every == 0)
        self._checked = members
        eligible = self.salvage.eligible(healed=self.healed, coasting=bool(self._coasting) or self.handover.active,
                                         participating=rank is not None)
        flat = torch.cat([self._step_start.vector(rank, participants, due),  # and whether a coasting node
                          torch.tensor([1.0 if self._coasting and self._reached else 0.0,  # reached it; whether it
                                        *self.handover.flags(ready),  # departs and is ready to; whether it can
                                        1.0 if eligible else 0.0], dtype=torch.float64)])  # salvage
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]  # torch's stub: the option takes the RedOpType
        options.timeout = self.transfer_timeout()
        try:
            on_device = flat.to(self.device)
            self._pg.wait(self._pg.allreduce([on_device], options))
            flat = on_device.cpu()  # the host waits here (a GPU collective's wait() orders the stream only)
            self._pg.agree()  # every participant completed it, or gives it up with this one
        except PeerGone as ex:  # on every participant: begin_step asks for a new quorum at once
            log.warning("the step's start was given up: %s", ex)
            self._start_given_up = True
            manager.report_error(ex)
            self.handover.failed()
            return set()
        except Exception as ex:  # pylint: disable=broad-exception-caught  # the step's verdict carries it
            log.warning("the step's start failed: %s; discarding the step", ex)
            manager.report_error(ex)
            self.handover.failed()
            return set()
        self._reached_by = round(flat[-4].item())  # nodes that reached the coordinator this step (_coast)
        self._reaching = self._reaching + 1 if self._reached_by else 0
        digests = self._step_start.apply(flat[:-4], participants)
        _, diverged = winner(digests)
        self._hand_over(departing=round(flat[-3].item()), ready=round(flat[-2].item()), diverged=bool(diverged),
                        participants=participants)
        self.salvage.armed = int(flat[-1].item()) == participants and not diverged
        if diverged:
            log.error("the replicas differ at step %d (digests by replica rank: %s): replica rank(s) %s sit the step "
                      "out and take the others' state at the next one%s", step, digests, sorted(diverged),
                      " (this one)" if rank in diverged else "")
        return diverged

    def end_step(self) -> bool:
        """After the step's body: whether it is committed (asks the quorum if the optimizer hook did not)."""
        if self.committed is None:
            self.committed = self._should_commit()
        self.handover.ended(committed=self.committed)
        return self.committed

    def current_step(self) -> int:
        """The steps committed: the manager's count, and those committed after this node's heartbeats stopped."""
        return self.manager.current_step() + self.handover.held

    # -- a handover (runtime/handover.py) ----------------------------------------------------------------------
    def can_hand_over(self, seconds_left: float | None) -> bool:
        """Whether this node, told to leave, can hand over rather than leave at once: it trains in a quorum of
        others, the coordinator answers (no coasting), nothing failed, and the handover fits (runtime/handover.py)."""
        return (self.rank is not None and self._participants > 1 and not self._coasting and not self.left
                and self.manager.errored() is None and self.handover.possible(seconds_left, time.monotonic()))

    def _hand_over(self, *, departing: int, ready: int, diverged: bool, participants: int) -> None:
        """The sums of the step's start collective; a departing node that every participant now knows of stops
        its heartbeats (torchft's Manager.shutdown: its server, and with it the heartbeat to the coordinator)."""
        self.handover.started(departing, ready, diverged=diverged, participants=participants)
        if self.handover.leaving and self.handover.stopped_at is None:
            log.warning("handing over: heartbeats stopped, training on with the others until the coordinator "
                        "has dropped this node")
            self._greeter.close()  # no beat of its own for the coordinator either
            self._shutdown_manager()
            self.handover.stopped_at = time.monotonic()

    def _heard(self) -> bool | None:
        """(A departing node's first worker.) Whether the coordinator still counts this node (coordinator_hears)."""
        if self.node_rank != 0 or not self._greeter.coordinator:
            return None
        try:
            replica_id = self._greeter.replica_id()
        except Exception as ex:  # pylint: disable=broad-exception-caught  # cannot say: the timer alone decides
            log.debug("this node's replica id: %s", ex)
            return None
        heard = coordinator_hears(self._greeter.coordinator, replica_id, COORDINATOR_PROBE_TIMEOUT)
        if heard:
            log.warning("handing over: the coordinator still counts this node; it trains one more step")
        return heard

    def _node_agrees(self, mine: bool) -> bool:
        """The node's first worker's ``mine``, on every worker of the node."""
        if not self.handover.leaving:  # every worker of a departing node asks; no other node does
            return False
        return bool(self._node_max([1 if mine and self.node_rank == 0 else 0])[0])

    def _held_verdict(self) -> bool:
        """A departing node's commit after its heartbeats stopped (its server, which counted its workers' votes,
        is gone): the step's collectives agreed on every participant, and no worker of the node failed."""
        self._agree()
        failed = self._node_max([1 if self.manager.errored() is not None else 0])[0] if self.handover.leaving else 0
        if failed:
            return False
        self.handover.held += 1
        return True

    def _should_commit(self) -> bool:
        if self.excluded and not self.manager.errored():  # behind after this step: it heals at the next quorum
            self.manager.report_error(RuntimeError("this replica differs from the others'"))
        if self.handover.stopped_at is not None:
            return self._held_verdict()
        self._agree()
        try:
            return bool(self.manager.should_commit())
        except Exception as ex:  # pylint: disable=broad-exception-caught
            log.error("the step's commit could not be agreed: %s; restarting this worker", ex)
            self.close()
            raise TrainingStopped(self.current_step(), f"in-process recovery: no commit ({ex})") from ex

    def _agree(self) -> None:
        """The step's collectives completed on every participant, or the step is discarded on each: a step that
        one gave up on a participant it took for gone (runtime/replica_watch.py) is not committed elsewhere."""
        from azext_elastictrain.runtime.replica_watch import PeerGone

        if self.manager.errored():  # discarded here for a reason of this node's own: it heals at the next quorum
            self._pg.forget()
            return
        try:
            self._agree_now()
        except PeerGone as ex:
            log.warning("the step's collective was given up: %s; discarding the step", ex)
            self.manager.report_error(ex)

    def _before_optimizer_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        """Average the gradients across the replicas, then step only if the quorum commits the step."""
        if self._in_hook or self.committed is not None:  # a re-entry (a healing load), or a second step()
            return None
        if threading.get_ident() != self._training_thread:  # torch initialising a stateless optimizer's state
            return None
        self._in_hook = True
        try:
            if self._in_backward is None or not self._in_backward.averaged:  # no DDP, or no backward through it
                params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
                average_across_replicas(params, self._allreduce)
            self.committed = self._should_commit()
            if not self.committed:
                discard_step(optimizer)
        finally:
            self._in_hook = False
        return None

    def _allreduce(self, flat: torch.Tensor) -> None:
        """``flat`` averaged over the step's participants: torchft's ``Manager.allreduce`` (public calls only), with
        this step's timeout. A healing replica sends zeros; an error is reported to the manager and fails the
        commit (the step is discarded)."""
        manager = self.manager
        if manager.errored():  # an earlier failure this step (its quorum, a transfer): the step is discarded
            return
        manager.wait_quorum()
        participants = self._participants
        if self.rank is None:  # healing, or diverged: its gradient does not count
            flat.zero_()
        from azext_elastictrain.runtime.replica_watch import PeerGone

        kept = flat.clone() if self.salvage.armed else None  # the collective writes into flat as it goes
        try:
            self._sum(flat)
            if kept is not None:  # the verdict now, inside the call: every participant salvages, or none does
                self._agree_now()
        except PeerGone as ex:
            if kept is not None:
                self._salvage_step(kept, flat, ex)
            else:
                log.warning("the step's collective was given up: %s; discarding the step", ex)
                manager.report_error(ex)
            return
        except Exception as ex:  # pylint: disable=broad-exception-caught  # the step's verdict carries it
            log.warning("the step's collective failed: %s; discarding the step", ex)
            manager.report_error(ex)
            return
        flat /= max(participants, 1)

    def _sum(self, flat: torch.Tensor) -> None:
        """``flat`` summed in place over the quorum, waiting the replica timeout (or the watch's verdict)."""
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]  # torch's stub: the option takes the RedOpType
        options.timeout = self.timeout  # every participant holds the state already (_start_together)
        self._pg.wait(self._pg.allreduce([flat], options))

    def _agree_now(self) -> None:
        """The claims of this step's collectives that completed here (PeerGone: another participant gave one up)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the collectives done (torchft syncs here too)
        self._pg.agree()

    def _salvage_step(self, kept: torch.Tensor, flat: torch.Tensor, reason: Exception) -> None:
        """The step's collective was given up on a participant gone: the survivors' average in ``flat`` from what
        each kept, over a quorum of the survivors (runtime/salvage.py), or, if that cannot be had, the step
        discarded as without salvage."""
        manager = self.manager
        old_rank, old_participants = self.rank, self._participants
        log.warning("the step's collective was given up (%s): salvaging the step with the others' gradients", reason)
        try:
            manager.start_quorum(allow_heal=False, shrink_only=True)  # the step's participants that are left
            rank, participants = manager.participating_rank(), manager.num_participants()
            if manager.errored() is not None or rank is None or old_rank is None:
                raise RuntimeError(f"no quorum of the survivors ({manager.errored()})")
            if participants >= old_participants:  # a participant taken for gone wrongly: the same group, whose
                raise RuntimeError("no participant left the quorum")  # given-up collective may still run
            self._pg.next_step()  # the second collective's claim is a key of its own
            present = torch.zeros(old_participants, dtype=kept.dtype, device=kept.device)
            present[old_rank] = 1
            summed = torch.cat([kept, present])
            self._sum(summed)
            self._agree_now()
        except Exception as ex:  # pylint: disable=broad-exception-caught  # discarded, as without salvage
            log.warning("the salvage of the step failed: %s; discarding the step", ex)
            manager.report_error(ex)
            return
        counts = summed[kept.numel():].tolist()
        self.salvage.lost = [r for r, count in enumerate(counts) if count < 0.5]
        flat.copy_(summed[:kept.numel()] / participants)
        self.rank, self._participants = rank, participants
        log.warning("the step is salvaged by %d of %d nodes; the slices of replica rank(s) %s are trained at the "
                    "next step", participants, old_participants, self.salvage.lost)

    def transfer_timeout(self) -> timedelta:
        return transfer_timeout(self.state, self.timeout)

    # -- state transfer (runtime/peer_transfer.py) ---------------------------------------------
    def _state_dict(self) -> dict[str, Any]:
        return {"flat": served_state(self.state), "rng": capture_rng()}

    def _destination(self) -> Any:
        """Where a peer's state lands (peer_transfer.py; on torchft's quorum thread while the training thread
        waits in start_quorum): into this replica's own tensors, in the shape torchft sends (its "user" states),
        on the parameters' device."""
        from azext_elastictrain.runtime.peer_transfer import Destination

        self.before_write()
        with self._without_grads():
            flat = entries.tree(self.state).flat  # a fresh optimizer's moments are made here, to receive into
        return Destination({"user": {STATE_KEY: {"flat": flat}}}, device=parameters_device(self.optimizer))

    @contextmanager
    def _without_grads(self) -> Iterator[None]:
        """A fresh optimizer's state is initialised only without gradients (torch's distributed state-dict API)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            yield
        finally:
            for p, g in zip(params, grads):
                p.grad = g

    def _load(self, payload: dict[str, Any]) -> None:
        """A live peer's state into this replica's, at the step boundary (inside ``start_quorum``)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grads = [p.grad for p in params]
        for p in params:  # a fresh optimizer's state is initialised without gradients (runtime/state.py)
            p.grad = None
        for sampler in samplers_in(self.state):  # batches drawn ahead are dropped, the peer's position comes
            sampler.reshard(sampler.num_replicas, sampler.rank)
        self._in_hook = True
        try:
            tree = entries.tree(self.state)
            tree.forget(tree.absent_groups(payload["flat"]))  # the peer's optimizer has no state for these
            missing = set(tree.flat) - set(payload["flat"])
            if missing:
                raise RuntimeError(f"the peer's state lacks {sorted(missing)[:5]}: the replicas run other scripts")
            tree.apply({key: payload["flat"][key] for key in tree.flat})
            restore_rng(payload["rng"])  # begin_step then keeps this state as the step's start (StepUndo)
        finally:
            self._in_hook = False
            for p, g in zip(params, grads):
                p.grad = g
        self.healed = True

    def served(self) -> bool:
        """Whether this group sent its state to a replica behind since the last call."""
        before, self._served = self._served, self._transport.sent
        return self._served > before

    # -- leaving -------------------------------------------------------------------------------
    def is_writer(self) -> bool:
        """This group writes the job's blob checkpoints: the lowest rank of the quorum."""
        return self.rank == 0

    def participants(self) -> int:
        return self.manager.num_participants()

    def close(self) -> None:
        """Leave the quorum (the coordinator drops this group once its heartbeats stop). Idempotent."""
        if self.left:
            return
        self.left = True
        self._greeter.close()
        self._hook.remove()
        self._pg.stop_watch(leave=True)
        if self.handover.stopped_at is None:
            self._shutdown_manager()

    def _shutdown_manager(self) -> None:
        try:
            self.manager.shutdown(wait=False)
        except Exception as ex:  # pylint: disable=broad-exception-caught  # leaving must not fail the exit
            log.warning("leaving the quorum: %s", ex)


def parameters_device(optimizer: torch.optim.Optimizer) -> torch.device:
    """The device of the parameters an optimizer trains (where a peer's state lands): its first parameter's, else
    the current CUDA device, else CPU."""
    from azext_elastictrain.runtime.peer_transfer import default_device

    for group in optimizer.param_groups:
        params: list[torch.Tensor] = group["params"]
        for p in params:
            return p.device
    return default_device()


def served_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s flat items as a peer receives them at a heal: its source view (an optimizer that has not stepped
    yet is sent without per-parameter state and stays unstepped, StateTree). The receiver drops the groups the
    state lacks (``StateTree.forget``), so its optimizer has not stepped either."""
    return entries.tree(state, source=True).flat


def coordinator_answers(url: str, timeout: float) -> bool:
    """Whether the coordinator at ``url`` (http://HOST:PORT) serves a request within ``timeout`` seconds: its index
    page, which only the process's own threads can answer. A TCP connect is the kernel's answer: a coordinator
    killed (SIGKILL) went on accepting connections for ~30 ms while its process was torn down, so a node took it
    for up and asked it for a quorum that never came (in flight until a new one was up), while another node
    coasted. No proxy is consulted (the coordinator is in the cluster)."""
    return _coordinator_page(url, "/", timeout) is not None


# torchft's Lighthouse lists every replica it heard in its status page, one item each, marked "old" once its last
# heartbeat is older than the heartbeat timeout: exactly the replicas its quorums no longer count.
_HEARD = re.compile(r'<li class="heartbeat\s*(old)?\s*">\s*(\S+): seen ')


def coordinator_hears(url: str, replica_id: str, timeout: float) -> bool | None:
    """Whether the coordinator still counts ``replica_id`` as heartbeating (its status page: torchft's own view,
    not a guess from the time this node stopped its heartbeats); None when the page does not come or is not the
    status page of torchft's Lighthouse as we know it."""
    page = _coordinator_page(url, "/status", timeout)
    if page is None or "<h2>Heartbeats</h2>" not in page:
        return None
    listed: dict[str, bool] = {name: old == "" for old, name in _HEARD.findall(page)}
    return listed.get(replica_id, False)


def _coordinator_page(url: str, path: str, timeout: float) -> str | None:
    """The coordinator's page at ``path`` if it serves it (200) within ``timeout`` seconds, else None."""
    parsed = urlsplit(url if "//" in url else f"http://{url}")
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return body.decode("utf-8", errors="replace") if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def transfer_timeout(state: dict[str, Any], replica: timedelta) -> timedelta:
    """How long sending ``state`` to a peer may take: the replica timeout plus its tensors' bytes at the floor rate.
    Every replica computes it from its own state (the same script: the same shapes; a newcomer's optimizer may not
    have its moments yet, which the floor's margin covers)."""
    return replica + timedelta(seconds=state_bytes(state) / TRANSFER_FLOOR_BYTES_PER_SECOND)


def state_bytes(value: Any) -> int:
    """The bytes of the tensors a state holds: modules' parameters and buffers, optimizers' state, plain tensors.
    Read from the live objects, without a state_dict (torch's optimizer state dict initialises a fresh optimizer
    by stepping it, which would re-enter this mode's step hook): safe on torchft's quorum thread."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, torch.nn.Module):
        return sum(state_bytes(t) for t in (*value.parameters(), *value.buffers()))
    if isinstance(value, torch.optim.Optimizer):
        return sum(state_bytes(t) for per_param in list(value.state.values()) for t in list(per_param.values()))
    if isinstance(value, dict):
        return sum(state_bytes(item) for item in list(value.values()))
    if isinstance(value, (list, tuple)):
        return sum(state_bytes(item) for item in value)
    return 0


def average_across_replicas(params: list[torch.Tensor], allreduce: Callable[[torch.Tensor], None]) -> None:
    """Every parameter's gradient averaged across the replicas in one collective, in the optimizer's order.

    A parameter without a gradient counts as zeros, so every replica sends the same layout, and the collective
    also carries whether each replica had a gradient: after it a parameter that had one on any replica has the
    average, and one that had none anywhere keeps none (the optimizer skips it, as after one DDP run's backward:
    AdamW would otherwise decay an unused head on zeros). ``allreduce`` averages its tensor in place, over the
    participants (``ReplicaGroup._allreduce``: a healing replica sends zeros; an error is recorded and fails the
    commit).
    """
    if not params:
        return
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    had = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=grads[0].dtype,
                       device=grads[0].device)
    flat = torch.cat([*grads, had])
    allreduce(flat)
    offset = 0
    for p in params:
        size = p.numel()
        p.grad = flat[offset:offset + size].view_as(p).clone()
        offset += size
    for p, anywhere in zip(params, flat[offset:].tolist()):
        if anywhere <= 0:
            p.grad = None


def discard_step(optimizer: torch.optim.Optimizer) -> None:
    """Make the optimizer's coming step a no-op: torch's optimizers skip every parameter whose grad is None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = None


class StepUndo:
    """Everything a discarded step changed in ``state`` besides the optimizer's update (which ``discard_step``
    prevents), taken back: the step is trained again, so it must start from what the step before committed, as a
    restart from that step would. Kept at each step boundary, restored on a discard:

    - the modules the optimizer trains: their buffers (BatchNorm's statistics move in the forward); their
      parameters and the optimizer's state are untouched by a discarded step;
    - every other module (an EMA's ``AveragedModel``): its parameters and buffers;
    - LR schedulers and the hyperparameters they set in the optimizer's groups (learning rate, momentum);
    - ``torch.Generator``s, tensors, plain values (a counter), any object with ``state_dict()``;
    - this process's global RNGs (torch, Python, NumPy).

    An ``ElasticSampler``'s position moves only for a committed step (runtime/replica_data.py). Anything outside
    ``state`` is the script's: a discarded step does not take it back (a restart would not restore it either). The
    cost: a copy of the buffers, of the other modules (an EMA: one model's parameters) and of the other tensors and
    small items, each step, into copies kept from the step before (no allocation once the shapes are known)."""

    def __init__(self, state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
        self.state = state
        self.optimizer = optimizer
        self._trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self._kept: tuple[Any, dict[str, Any], list[dict[str, Any]]] | None = None
        self._copies: dict[tuple[int, int], torch.Tensor] = {}  # (tensor's id, position) -> its copy, reused

    def keep(self) -> None:
        """At the step boundary, before the step's body runs."""
        groups = [copy.deepcopy({k: v for k, v in group.items() if k != "params"})
                  for group in self.optimizer.param_groups]
        self._kept = (self._snapshot(self.state), capture_rng(), groups)

    def undo(self) -> None:
        """The step was discarded: ``state`` (and the global RNGs) as they were at its boundary."""
        if self._kept is None:
            return
        kept, rng, groups = self._kept
        self._restore(self.state, kept)
        restore_rng(rng)
        for group, kept_group in zip(self.optimizer.param_groups, groups):
            group.update(copy.deepcopy(kept_group))

    def _snapshot(self, value: Any) -> Any:  # pylint: disable=too-many-return-statements  # one per kind
        from azext_elastictrain.runtime.data import ElasticSampler

        if isinstance(value, (torch.optim.Optimizer, ElasticSampler)):
            return None  # protected by discard_step / moved only when committed
        if isinstance(value, torch.nn.Module):
            return [self._copy(t, i) for i, t in enumerate(self._changeable(value))]
        if _bundles_optimizer(value):  # TrainingState(model, optimizer, scheduler): its parts
            return {"model": self._snapshot(value.model), "scheduler": self._snapshot(value.scheduler)}
        if isinstance(value, torch.Generator):
            return value.get_state()
        if isinstance(value, torch.Tensor):
            return self._copy(value, 0)
        if isinstance(value, dict):
            return {key: self._snapshot(item) for key, item in value.items()}
        if isinstance(value, list) and not _plain(value):
            return [self._snapshot(item) for item in value]
        if isinstance(value, tuple) and not _plain(value):
            return tuple(self._snapshot(item) for item in value)
        if hasattr(value, "state_dict") and hasattr(value, "load_state_dict"):
            return copy.deepcopy(value.state_dict())  # schedulers, a disabled GradScaler, user objects
        return copy.deepcopy(value)  # plain values

    def _copy(self, tensor: torch.Tensor, position: int) -> torch.Tensor:
        """``tensor``'s value now, in the copy kept for it at the last boundary (the step it was kept for is over)."""
        key = (id(tensor), position)
        copy_ = self._copies.get(key)
        if copy_ is None or copy_.shape != tensor.shape or copy_.dtype != tensor.dtype:
            copy_ = self._copies[key] = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        with torch.no_grad():
            copy_.copy_(tensor.detach())
        return copy_

    def _changeable(self, module: torch.nn.Module) -> list[torch.Tensor]:
        """What a discarded step may have changed in ``module``: its buffers if the optimizer trains it, else
        its parameters too (an EMA's are updated by the script)."""
        if any(id(p) in self._trained for p in module.parameters()):
            return list(module.buffers())
        return [*module.parameters(), *module.buffers()]

    def _restore(self, live: Any, kept: Any) -> Any:  # pylint: disable=too-many-return-statements  # one per kind
        """``live`` as ``kept`` says; returns what its container must hold (a plain value is rebound there)."""
        from azext_elastictrain.runtime.data import ElasticSampler

        if kept is None and isinstance(live, (torch.optim.Optimizer, ElasticSampler)):
            return live
        if isinstance(live, torch.nn.Module):
            with torch.no_grad():
                for tensor, saved in zip(self._changeable(live), kept):
                    tensor.copy_(saved)
            return live
        if _bundles_optimizer(live):
            self._restore(live.model, kept["model"])
            if live.scheduler is not None:
                live.scheduler = self._restore(live.scheduler, kept["scheduler"])
            return live
        if isinstance(live, torch.Generator):
            live.set_state(kept)
            return live
        if isinstance(live, torch.Tensor) and isinstance(kept, torch.Tensor) and live.shape == kept.shape:
            with torch.no_grad():
                live.copy_(kept)
            return live
        if isinstance(live, dict) and isinstance(kept, dict):
            for key in list(live):
                if key in kept:
                    live[key] = self._restore(live[key], kept[key])
            return live
        if isinstance(live, list) and isinstance(kept, list) and len(live) == len(kept):
            live[:] = [self._restore(item, saved) for item, saved in zip(live, kept)]
            return live
        if isinstance(live, tuple) and isinstance(kept, tuple) and len(live) == len(kept):
            return tuple(self._restore(item, saved) for item, saved in zip(live, kept))
        if hasattr(live, "load_state_dict") and isinstance(kept, dict):
            live.load_state_dict(copy.deepcopy(kept))
            return live
        return copy.deepcopy(kept)


def _plain(value: Any) -> bool:
    """A value made of JSON-like items only (kept by a deep copy, restored by rebinding)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def _bundles_optimizer(value: Any) -> bool:
    """An object whose state_dict() holds an optimizer's (runtime/state.py's TrainingState): its parts are kept
    one by one instead (an optimizer's state dict steps a stateless optimizer; it is untouched anyway)."""
    return isinstance(getattr(value, "optimizer", None), torch.optim.Optimizer) and hasattr(value, "model")


def scalers_in(value: Any) -> list[torch.amp.GradScaler]:
    """The AMP gradient scalers of a state (its values, nested dicts, lists and tuples)."""
    if isinstance(value, torch.amp.GradScaler):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in scalers_in(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in scalers_in(item)]
    return []


def the_optimizer(state: dict[str, Any]) -> torch.optim.Optimizer:
    """The state's one optimizer, with its model a DDP: what the in-process mode adapts (see the docstring)."""
    found: list[torch.optim.Optimizer] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.optim.Optimizer):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif hasattr(value, "optimizer") and isinstance(getattr(value, "optimizer"), torch.optim.Optimizer):
            found.append(value.optimizer)

    walk(state)
    found = list({id(o): o for o in found}.values())  # a scheduler in the state names its optimizer again
    if len(found) != 1:
        raise ValueError(
            f"in-process recovery needs exactly one optimizer in the state, found {len(found)}: its step is where "
            "the replicas average gradients and commit; put the optimizer in the state, or use --recovery restart")
    if any(scaler.is_enabled() for scaler in scalers_in(state)):  # a disabled one just steps the optimizer
        from azext_elastictrain.runtime.replica_grads import the_ddp

        # GradScaler.step() checks the gradients for inf/NaN and skips optimizer.step() on its own. With a DDP the
        # nodes' average is in backward(), so every node checks the same gradients and skips the same steps, as
        # the ranks of one DDP run do; without one the nodes average in the optimizer's step, after each scaler
        # decided on its own node's gradients (one node skipping while the others wait for it).
        if the_ddp(modules_in(state), found[0]) is None:
            raise ValueError(
                "in-process recovery takes a torch.amp.GradScaler only with a DistributedDataParallel model: the "
                "scaler skips a step on the gradients it sees, and only a DDP's are averaged across the nodes "
                "before it looks. Wrap the model (torch.nn.parallel.DistributedDataParallel), train in bfloat16 "
                "autocast (no scaler needed), or run the job with --recovery restart")
    modules = [m for m in modules_in(state) if any(p.requires_grad for p in m.parameters())]
    plain = [m for m in modules if not isinstance(m, torch.nn.parallel.DistributedDataParallel)]
    if plain and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(
            f"in-process recovery: the model ({type(plain[0]).__name__}) is not a DistributedDataParallel, so the "
            "workers of a node would train unsynchronised copies; wrap it: "
            "model = torch.nn.parallel.DistributedDataParallel(model)")
    return found[0]
