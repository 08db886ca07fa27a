"""The README's runtime loop before `Checkpointer.steps()`, made a whole script as a user copied it: `if
ckpt.step(...): break` on a stop, then `ckpt.done(step, state)`.

At a scale-up torchrun SIGTERMs every worker: step() returned True, the loop broke and done() committed the step
as the final one and wrote `finished`: the job was Succeeded at that step while the re-formed world trained on
(and it restored from blob, not memory). tests/e2e/test_readme.py runs it as a job: Succeeded only at its end.
"""
import torch
import torch.distributed as dist
from torch import nn

from azext_elastictrain.runtime import Checkpointer, collective_timeout

dist.init_process_group("gloo", timeout=collective_timeout())  # under torchrun
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50)
total_steps = 120

ckpt = Checkpointer.from_env()                   # reads the job's environment (below)
state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "epoch": 0}
step = ckpt.restore(state) or 0                  # newest valid checkpoint; every rank loads the same one
while step < total_steps:
    step += 1
    loss = nn.functional.cross_entropy(model(torch.randn(32, 16)), torch.randint(0, 4, (32,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if ckpt.step(step, state, samples=64, metrics={"loss": loss.item()}):
        break                                    # SIGTERM: the checkpoint is durable, exit now
ckpt.done(step, state)                           # final checkpoint, then close
