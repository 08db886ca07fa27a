"""What every recovery mode's loop is: the interface the Checkpointer delegates ``steps()``/``batches()`` to, and
the parts of the Checkpointer a loop may use.

The facade (runtime/checkpoint.py) checks what every mode checks (the arguments, the sampler in the state, every
world the job's nodes range allows) and hands the rest to the loop its mode chose once (runtime/loops/__init__.py):
the restore, the iteration, the step's hook, the finish. A loop imports neither the facade nor its callers: what
it needs of the Checkpointer is given to it as ``LoopParts``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Iterator

from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime.collectives import Collectives
from azext_elastictrain.runtime.data import ElasticSampler
from azext_elastictrain.runtime.memory import MemoryKeeper
from azext_elastictrain.runtime.reporting import Reporter
from azext_elastictrain.runtime.stepping import Notices, StepPolicy


@dataclass(frozen=True)
class LoopParts:  # pylint: disable=too-many-instance-attributes  # the collaborators and the facade's own steps
    """What a loop uses of its Checkpointer: the collaborators, and the facade's steps it sequences."""

    store: BlobStore
    job_prefix: str
    ranks: Collectives  # this process's rank and world (in the in-process mode: the node's own world)
    local_rank: int
    reporter: Reporter
    notices: Notices
    policy: StepPolicy
    memory: MemoryKeeper | None
    restore: Callable[[dict[str, Any]], int | None]  # Checkpointer.restore
    hook: Callable[..., bool]  # Checkpointer.step: the per-step hook
    save: Callable[..., None]  # Checkpointer.save
    finish: Callable[[int, dict[str, Any], int | None], None]  # the final checkpoint, ``finished``, close
    close: Callable[[], None]  # Checkpointer.close
    stop: Callable[[int, dict[str, Any]], None]  # remember the stop; the state's samplers stop too
    check_running: Callable[[str], None]  # ends the process after a stop (TrainingStopped)
    take_metrics: Callable[[], dict[str, float]]  # the metrics report()ed for the step, taken


class TrainingLoop(ABC):
    """One recovery mode's loop. ``steps``/``batches`` restore the state, and return the iterator the script loops
    over (arguments are checked at the call, not at the first item)."""

    #: Whether each worker watches its peers' beats (runtime/peer_watch.py): only where a vanished peer leaves the
    #: script's own collectives waiting. Read before the loop is made, as the Checkpointer starts.
    watches_peers: ClassVar[bool] = False

    def __init__(self, parts: LoopParts) -> None:
        self.parts = parts

    @property
    def replica_rank(self) -> int | None:
        """This node's rank among the replicas training the current step, in a mode that has replicas."""
        return None

    @abstractmethod
    def node_size(self) -> int:
        """The ranks of one node in the job's world, for the data layout check of every world the job may run at."""

    def check_hook(self) -> None:
        """``Checkpointer.step()``, a loop of the script's own, is about to run: a mode that cannot keep such a loop
        in step refuses it here."""

    @abstractmethod
    def steps(self, state: dict[str, Any], total: int, *, samples: float | None) -> Iterator[int]:
        """``Checkpointer.steps()`` once its arguments are checked."""

    @abstractmethod
    def batches(self, state: dict[str, Any], loader: Iterable[Any], sampler: ElasticSampler, epochs: int, *,
                steps: int | None) -> Iterator[tuple[int, Any]]:
        """``Checkpointer.batches()`` once its arguments are checked: ``epochs`` whole epochs, or the first ``steps``
        global batches of them."""

    def close(self) -> None:
        """The Checkpointer closes: let go of what the loop holds (idempotent)."""
