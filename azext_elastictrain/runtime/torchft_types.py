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
    """``torchft.Manager``: the calls runtime/replicas.py makes (torchft/manager.py)."""

    def register_state_dict_fn(self, key: str, load_state_dict: Callable[[T], None],
                               state_dict: Callable[[], T]) -> None: ...

    def load_state_dict(self, state_dict: dict[str, int]) -> None: ...

    def start_quorum(self, allow_heal: bool = True, shrink_only: bool = False,
                     timeout: timedelta | None = None) -> None: ...

    def wait_quorum(self) -> None: ...

    def participating_rank(self) -> int | None: ...

    def num_participants(self) -> int: ...

    def current_step(self) -> int: ...

    def errored(self) -> Exception | None: ...  # torchft's ExceptionWithTraceback

    def report_error(self, e: Exception) -> None: ...

    def should_commit(self, timeout: timedelta | None = None) -> bool: ...

    def shutdown(self, wait: bool = True) -> None: ...
