"""What ends a training process when its job is stopped (a SIGTERM: torchrun re-forming, a node going).

A stop is never the end of training: the step it happened at is safe (in blob, or in every node's memory),
torchrun starts the workers again and they resume from it. So after a stop nothing may train, save or hand out
data again, and nothing may say the job finished. Rather than trust every loop of a script to end (an inner
``break`` leaves only the inner loop), the runtime ends the process: ``Checkpointer.steps()`` and
``Checkpointer.batches()`` at the stop, and, for a script that goes on after ``ckpt.step()`` returned True,
any further use of the checkpointer (``step``, ``save``, ``done``) or of a stopped ``ElasticSampler``.
"""
from __future__ import annotations

# 128 + SIGTERM, the shell's code for "terminated": not 0, so nothing (torchrun, the k8s Job) reads a stop as
# the training's success; torchrun, which sent the SIGTERM, restarts the workers either way.
STOPPED_EXIT_CODE = 143

# A worker that ended itself because a peer vanished (runtime/peer_watch.py): a failure, so torchrun re-forms.
PEER_GONE_EXIT_CODE = 75


class TrainingStopped(SystemExit):
    """The job was stopped at ``step``; the process ends (exit code 143) and its training resumes from there.

    A ``SystemExit``: ``except Exception`` does not catch it, ``finally`` blocks run, and Python exits with
    its code.
    """

    def __init__(self, step: int | None, what: str = ""):
        super().__init__(STOPPED_EXIT_CODE)
        self.step = step
        self.what = what

    def __str__(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        return (f"training was stopped{at}; the job resumes from that step when its workers start again"
                + (f" ({self.what})" if self.what else ""))


__all__ = ["PEER_GONE_EXIT_CODE", "STOPPED_EXIT_CODE", "TrainingStopped"]
