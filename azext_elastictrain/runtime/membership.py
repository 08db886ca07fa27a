"""The in-process mode's record of the job's worlds: one ``quorum`` event per change of the per-step quorum.

The workers outlive a re-form, so no world restores and nothing else tells the CLI that one began (the restart
mode's ``restored``). Every node follows the quorum's members step by step; the quorum's first replica writes the
change (one writer: every node sees the same quorum), with what the outage figure needs (core/eventlog/goodput.py):
the old world's last committed step and its time, the step the new world trains from, the steps discarded in between.

A replica that takes the state from a peer loads it at the step boundary and trains that step as a participant.
Pure: no torch, no I/O; the caller emits what ``observe`` returns.
"""
from __future__ import annotations

from typing import Any


class Membership:
    """The quorum this node saw last, and the steps it discarded since the last change."""

    def __init__(self, node_size: int) -> None:
        self.node_size = node_size
        self.replicas: int | None = None  # participants of the last quorum this node trained in
        self.discarded = 0
        self.healed = False  # a replica took the state from a peer since the last change (this one or another)

    def world_size(self, replicas: int) -> int:
        """The job's ranks when ``replicas`` nodes train (each runs the same number of workers)."""
        return replicas * self.node_size

    def observe(self, *, replicas: int, step: int, rank: int | None, last_step: int | None,
                last_step_time: float | None, served: bool = False) -> dict[str, Any] | None:
        """This step's quorum: the ``quorum`` event's fields if its members changed and this node writes it (its
        replica rank is 0), else None. ``served``: this node sent its state to a replica behind this step, or
        took one from a peer."""
        self.healed = self.healed or served or (rank is None and replicas > 0)
        if rank is None:  # taking the state from a peer: not yet a member of the world that trains, which it joins
            self.replicas = replicas
            return None
        if replicas == self.replicas:
            return None
        before, self.replicas = self.replicas, replicas
        fields: dict[str, Any] = {
            "step": step, "world_size": self.world_size(replicas), "replicas": replicas,
            "from_world_size": self.world_size(before) if before is not None else None, "from_replicas": before,
            "last_step": last_step,
            "last_step_time": round(last_step_time, 3) if last_step_time is not None else None,
            "discarded": self.discarded,
            "source": "peer" if self.healed and before is not None and replicas > before else "live",
        }
        self.discarded, self.healed = 0, False
        return fields if rank == 0 else None

    def discard(self) -> None:
        """The step was discarded (a peer's collective failed): it is trained again."""
        self.discarded += 1
