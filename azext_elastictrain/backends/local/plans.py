"""What the local backend's plans carry to their send step (``backends.base.Plan[R]``'s ``R``)."""
from __future__ import annotations

from dataclasses import dataclass

from azext_elastictrain.core.chaos import Schedule


@dataclass(frozen=True)
class LocalJobDeletion:
    name: str
    delete_checkpoints: bool


@dataclass(frozen=True)
class LocalEviction:
    """The nodes of ``job`` to evict (the one named, or the newest ``count``), with the notice they get and when
    capacity comes back (None: it does not)."""

    job: str
    node: str | None
    count: int | None
    notice_seconds: float
    replace_after: float | None


@dataclass(frozen=True)
class LocalSchedule:
    job: str
    schedule: Schedule
