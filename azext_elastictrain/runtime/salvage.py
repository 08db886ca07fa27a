"""The salvage of a step a node vanished from mid-step (in-process mode, opt-in: ``ELASTICTRAIN_SALVAGE=on``).

Without it, as in torchft, the step in flight is discarded at every vanish and its global batch trained again: at
one failure per 5.5 steps torchft's published run kept 82 % of the steps it tried. With it, when the quorum's watch
gives the step's gradient collective up on a participant gone, or the collective fails and is given up on every
participant (a killed node's socket closed: runtime/replica_watch.py), every survivor, inside the collective's call:

1. asks the coordinator for a new quorum at once, among the step's participants only (torchft's ``shrink_only``:
   a newcomer waits for the next step); the coordinator has dropped the gone node by then (its heartbeat timeout
   is the watch's);
2. averages again the gradients it kept before the collective (gloo's ring writes into the buffer as it goes, so
   after a collective given up the buffer is no longer this node's own), with a one-hot of its old rank beside
   them: the sum says whose slices were trained;
3. returns that average as the collective's, so the script's step goes on with it as with any average (clipping,
   the scaler, the scheduler), and the step is committed;
4. the sampler keeps the slices of the ranks missing from the sum owed, and the next global batch trains them
   first (runtime/data.py ``advance(missing=...)``): each sample of the epoch is still trained once.

Every participant must decide alike, or the survivors would meet in different collectives (one salvaging, one
starting the next step). So a step can be salvaged only if every participant said so in the step's start
collective (``eligible``: the setting on, one worker per node, the loop's data able to owe a slice, no heal and no
coasting in the step), and the collective's verdict (its claim) is read right after it, inside the call: a
participant where it completed learns there that another gave it up, and salvages too. A participant taken for
gone wrongly also salvages, and then the second collective is a whole one: nothing is owed.

What it changes, hence opt-in: the salvaged step trains a batch short of the vanished slice and the next one a
batch longer by it, so the model is not the one an uninterrupted run trains (the default mode's contract). It costs
a copy of the gradients and a host sync after the collective at every step; a vanish in the epoch's last batch,
one in a step that also heals a newcomer, or a second vanish during a salvage discards the step as before.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Salvage:
    """Whether this node may salvage the current step, and what the salvaged step left untrained."""

    enabled: bool  # the setting, on a node of one worker (a node of several would have to decide as one)
    wanted: bool = False  # this step: the loop's data can owe a slice (runtime/replica_data.py ``salvageable``)
    armed: bool = False  # this step: every participant can salvage it (the step's start collective said so)
    lost: list[int] = field(default_factory=list)  # the salvaged step: replica ranks whose slices were not trained

    def begin(self, wanted: bool) -> None:
        self.wanted, self.armed, self.lost = wanted, False, []

    def eligible(self, *, healed: bool, coasting: bool, participating: bool) -> bool:
        """This node's part of the step's start collective: it can salvage the step."""
        return self.enabled and self.wanted and participating and not healed and not coasting
