"""The runtime's checkpoint errors, and what a DCP failure was behind its wrapper.

DCP wraps every rank's error in one ``CheckpointException`` (a BaseException) whose ``failures`` map ranks to
their errors; these helpers find ours in it and say per rank what went wrong.
"""
from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or committed."""


class FencedError(CheckpointError):
    """Another training already committed this step of the same job."""


def cause(ex: BaseException, kind: type[E]) -> "E | None":
    """The error of ``kind`` behind a DCP failure (DCP wraps every rank's error), if that is what it was."""
    if isinstance(ex, kind):
        return ex
    for failure in getattr(ex, "failures", {}).values():
        found = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(found, kind):
            return found
    return None


def failure_text(ex: BaseException) -> str:
    """What went wrong, per rank, rather than DCP's "CheckpointException ranks: [0]"."""
    failures = getattr(ex, "failures", None)
    if not failures:
        return str(ex)
    causes = {rank: (f[0] if isinstance(f, tuple) else f) for rank, f in failures.items()}
    return "; ".join(f"rank {rank}: {type(c).__name__}: {c}" for rank, c in sorted(causes.items()))


def fenced(ex: BaseException) -> "FencedError | None":
    """The FencedError behind a DCP failure, if that is what it was (on any rank)."""
    return cause(ex, FencedError)
