"""A training script as users write them, for the battery (tests/e2e/test_battery.py): the README's loop with
what real scripts keep in ``state`` and do in a step, each pattern a place where a recovery mode can go wrong.

    --variant plain   a seeded model, plain SGD (torch's default: momentum 0, no optimizer state),
                      gradient accumulation over two micro-batches (DDP's no_sync on the first), an AMP gradient
                      scaler (GradScaler: unscale_, clip, step, update; rank 0's gradients overflow at a few
                      steps, so every rank must skip those), clip_grad_norm_, an LR schedule, an EMA
                      (AveragedModel), a torch.Generator drawn once per step (an augmentation strength) and a
                      plain counter in the state, drop_last=False with a final partial batch
    --variant bn      the same with an unseeded model (DDP makes the ranks one), BatchNorm, AdamW, a head the
                      forward never uses and an "expert" layer that a rank's batch uses or not (a mixture of
                      experts' routing): DDP with find_unused_parameters, where a parameter used on any rank
                      gets the average on every rank and one used on none keeps no gradient (AdamW leaves it be)

Its own log is what the battery compares with one uninterrupted run: one JSON line per loop body, per rank, in
``$BATTERY_OUT/records-<node>-<pid>.jsonl``: the step, the world size and rank of the step's data-parallel layout
(the sampler's: in the in-process mode each node is a torchrun world of its own), the sample ids of this rank's
batch, the learning rate the step used, the generator's state, the counter and the gradient scaler's scale after
the body, AdamW's step count (bn), the gradient norm ``clip_grad_norm_`` saw (the total norm before clipping), a
digest of the replica (parameters, optimizer state, EMA), and in the bn variant a digest of the head no batch uses
(it must never move).
While the file ``$BATTERY_SLOW`` exists each step also sleeps ``$BATTERY_STEP_DELAY`` seconds (in the step's
compute, before backward), so the test can evict nodes before the job ends, and a step of the last epoch waits up
to ``HOLD_SECONDS`` more for the file to go: on a machine slow to start the replacements, the job still cannot
train its last step (and end at a smaller world) while the test is evicting its nodes.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from azext_elastictrain.runtime import Checkpointer, ElasticSampler, collective_timeout

GLOBAL_BATCH = 64
OVERFLOW_STEPS = (6, 23, 41)  # the plain variant: rank 0's loss is inf there (an fp16 overflow), the step skipped
SAMPLES = 16 * GLOBAL_BATCH + 34  # a final partial batch of 34: 17 per rank at 2 ranks, the same maths at 1
EPOCHS = 4
STEPS_PER_EPOCH = -(-SAMPLES // GLOBAL_BATCH)
HOLD_SECONDS = 10.0


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Routed(nn.Module):
    """The bn variant's model: BatchNorm, an expert some batches use (the rank's own slice decides) and a head no
    batch uses."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.expert = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        self.unused = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(x)
        if x[:, 0].mean() > 0:  # this slice's routing: the expert's gradient comes from some ranks only
            hidden = hidden + self.expert(hidden)
        return self.head(hidden)


def replica_digest(net: nn.Module, optimizer: torch.optim.Optimizer, ema: AveragedModel) -> dict[str, str]:
    """What a replica keeps, by part: equal parts on every rank make the replicas one. Not the BatchNorm buffers
    (the model's, and the EMA's copy of them): in DDP each rank updates them from its own slice in the forward and
    the next forward broadcasts rank 0's, so they differ between the ranks of one uninterrupted run too."""
    moments = [t for p in net.parameters() for t in optimizer.state.get(p, {}).values()
               if isinstance(t, torch.Tensor)]
    return {"parameters": digest(*net.parameters()), "optimizer": digest(*moments),
            "ema": digest(*ema.parameters(), ema.n_averaged)}


def adam_steps(net: nn.Module, optimizer: torch.optim.Optimizer) -> float | None:
    """The step count AdamW keeps for a parameter every batch trains (its bias correction), or None (SGD keeps
    none)."""
    first = next(net.parameters())
    count = optimizer.state.get(first, {}).get("step")
    return None if count is None else float(count)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=("plain", "bn"), required=True)
    args = parser.parse_args()
    bn = args.variant == "bn"

    dist.init_process_group("gloo", timeout=collective_timeout())
    data_rng = torch.Generator().manual_seed(1)  # the data set is the same in every process and run
    data = TensorDataset(torch.randn(SAMPLES, 16, generator=data_rng),
                         torch.randint(0, 4, (SAMPLES,), generator=data_rng), torch.arange(SAMPLES))
    sampler = ElasticSampler(data, global_batch_size=GLOBAL_BATCH, seed=0, drop_last=False)
    loader = DataLoader(data, batch_sampler=sampler)
    if not bn:
        torch.manual_seed(0)  # the bn variant leaves its model unseeded: each process draws other weights
    net = Routed() if bn else nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model = nn.parallel.DistributedDataParallel(net, find_unused_parameters=bn)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-2) if bn
                 else torch.optim.SGD(model.parameters(), lr=0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    strength = torch.Generator().manual_seed(2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=5, enabled=not bn)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "ema": ema, "data": sampler,
             "strength": strength, "counter": 0, "scaler": scaler}

    out = os.environ["BATTERY_OUT"]
    os.makedirs(out, exist_ok=True)
    node = os.environ.get("ELASTICTRAIN_NODE_NAME", "node")
    log = open(os.path.join(out, f"records-{node}-{os.getpid()}.jsonl"), "a", buffering=1, encoding="utf-8")
    slow, delay = os.environ.get("BATTERY_SLOW"), float(os.environ.get("BATTERY_STEP_DELAY", "0.5"))

    ckpt = Checkpointer.from_env()
    for step, (x, y, ids) in ckpt.batches(state, loader, epochs=EPOCHS):
        world, rank = sampler.num_replicas, sampler.rank  # the step's data-parallel layout, in either mode
        scale = 1 + 0.1 * torch.rand((), generator=strength)  # one draw a step, whatever the world size
        if slow and os.path.exists(slow):
            time.sleep(delay)
            hold = time.monotonic() + (HOLD_SECONDS if step > (EPOCHS - 1) * STEPS_PER_EPOCH else 0.0)
            while os.path.exists(slow) and time.monotonic() < hold:
                time.sleep(0.2)
        optimizer.zero_grad()
        # plain: the slice in two micro-batches, gradients accumulated locally over the first (DDP's no_sync) and
        # averaged with the second's; bn: one backward (BatchNorm's statistics would change with the split)
        parts = list(zip(x.chunk(1 if bn else 2), y.chunk(1 if bn else 2)))
        loss = torch.zeros(())
        overflow = not bn and step in OVERFLOW_STEPS and rank == 0
        for i, (xs, ys) in enumerate(parts):
            with model.no_sync() if i < len(parts) - 1 else contextlib.nullcontext():
                part = nn.functional.cross_entropy(model(xs * scale), ys) * (len(xs) / len(x))
                scaler.scale(part * (float("inf") if overflow else 1.0)).backward()
            loss += part.detach()
        scaler.unscale_(optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        lr = optimizer.param_groups[0]["lr"]
        scaler.step(optimizer)  # skips optimizer.step() where any rank's gradients overflowed
        scaler.update()
        scheduler.step()
        ema.update_parameters(net)
        state["counter"] += 1
        log.write(json.dumps({
            "step": step, "world": world, "rank": rank, "node": node,
            "ids": ids.tolist(), "lr": lr, "strength": digest(strength.get_state()), "counter": state["counter"],
            "scale": scaler.get_scale() if not bn else None, "norm": float(norm), "adam": adam_steps(net, optimizer),
            "replica": replica_digest(net, optimizer, ema), "time": time.time(),
            **({"unused": digest(*net.unused.parameters())} if bn else {})}) + "\n")
        ckpt.report(loss=loss.item())


if __name__ == "__main__":
    main()
