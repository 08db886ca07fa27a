"""The loop the README showed before `Checkpointer.batches()`, made a whole script as a user copied it: the data
snippet's nested epoch/batch loop whose `break` leaves only the inner loop, then `ckpt.done(step, state)`.

On a stop (torchrun's SIGTERM at a scale-up) it used to go on into the next epoch (skipping the rest of this
one) and, at the end of its epochs, call done(): the job was reported Succeeded while the re-formed world
trained on. tests/e2e/test_readme.py runs it as a job: it must train each sample once per epoch and be
Succeeded only at its real end.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from azext_elastictrain.runtime import Checkpointer, ElasticSampler, TrainingState, collective_timeout

dist.init_process_group("gloo", timeout=collective_timeout())
torch.manual_seed(0)
dataset = TensorDataset(torch.randn(2048, 16), torch.randint(0, 4, (2048,)))
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ckpt = Checkpointer.from_env()
epochs = 3

sampler = ElasticSampler(dataset, global_batch_size=64, seed=0)  # num_replicas/rank from the process group
loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2)  # batches: this rank's slice of a global batch
state = {"train": TrainingState(model, optimizer), "data": sampler}
step = ckpt.restore(state) or 0                  # the sampler comes back mid-epoch, at any world size
for epoch in range(sampler.epoch, epochs):
    sampler.set_epoch(epoch)                     # the restored epoch keeps its position; a new one starts at 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sampler.advance()                        # this global batch is trained
        step += 1
        if ckpt.step(step, state):
            break
ckpt.done(step, state)                           # final checkpoint, then close
