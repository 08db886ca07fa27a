"""What the runtime calls of torchft, typed: torchft 0.2.0 is annotated but ships no ``py.typed``, so the type
checker reads it as Any (mypy.ini). These Protocols repeat the signatures of the calls the runtime makes, as
torchft declares them, so that what the runtime takes from them is checked; nothing here is used at run time
(imported under ``TYPE_CHECKING`` only, and this module imports neither torch nor torchft).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")


class ReplicaManager(Protocol):
    """``torchft.Manager`` (torchft/manager.py): the calls runtime/replicas.py makes."""

    def register_state_dict_fn(self, key: str, load_state_dict: Callable[[T], None],
                               state_dict: Callable[[], T]) -> None:
        """The state torchft sends a healing peer under ``key``, and how a received one is loaded."""

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """The manager's own state: ``step`` and ``batches_committed``."""

    def start_quorum(self, allow_heal: bool = True, shrink_only: bool = False,
                     timeout: timedelta | None = None) -> None:
        """The step's quorum (synchronous here: a replica behind heals inside it)."""

    def wait_quorum(self) -> None:
        """Until the quorum started by ``start_quorum`` is in."""

    def participating_rank(self) -> int | None:
        """This replica group's rank among the step's participants; None while it heals."""

    def num_participants(self) -> int:
        """The replica groups that take part in the step."""

    def current_step(self) -> int:
        """The job's committed steps (a healing replica: its peers')."""

    def errored(self) -> Exception | None:
        """The step's recorded failure (torchft's ExceptionWithTraceback), if any."""

    def report_error(self, e: Exception) -> None:
        """Record a failure: the step is not committed."""

    def should_commit(self, timeout: timedelta | None = None) -> bool:
        """Whether every participant commits the step (a collective vote)."""

    def shutdown(self, wait: bool = True) -> None:
        """Leave the quorum and stop the manager's server."""
