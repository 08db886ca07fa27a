"""The training loops of the recovery modes, one module each, behind one interface (runtime/loops/base.py).

- runtime/loops/restart.py     "restart": torchrun restarts every worker at a change of members; they resume from
                               memory, a peer or blob;
- runtime/loops/in_process.py  "in-process": workers stay alive; a per-step quorum drops a lost node and admits a
                               newcomer.

The Checkpointer chooses its mode's loop once, as it is made (``for_mode``); a mode is a module here and a line in
``LOOPS``.
"""
from __future__ import annotations

from azext_elastictrain.core import launch
from azext_elastictrain.runtime.loops.base import LoopParts, TrainingLoop
from azext_elastictrain.runtime.loops.in_process import InProcessLoop
from azext_elastictrain.runtime.loops.restart import RestartLoop

__all__ = ["LOOPS", "LoopParts", "TrainingLoop", "for_mode"]

#: Each recovery mode (core/settings.py ``RuntimeSettings.recovery``) and its loop.
LOOPS: dict[str, type[TrainingLoop]] = {
    launch.RECOVERY_RESTART: RestartLoop,
    launch.RECOVERY_IN_PROCESS: InProcessLoop,
}


def for_mode(recovery: str) -> type[TrainingLoop]:
    """The loop of the recovery mode ``recovery``."""
    loop = LOOPS.get(recovery)
    if loop is None:
        raise ValueError(f"no training loop for the recovery mode {recovery!r}: one of {', '.join(LOOPS)}")
    return loop
