"""The README's training loop (``ckpt.batches``), sized for benchmarks: the workload both recovery modes run.

    torchrun ... scripts/bench/readme_loop.py [--width 64] [--global-batch 64] [--step-delay 0.05]

The README's script with its numbers as options: a DDP MLP over a random dataset (the same on every rank,
seeded), an ``ElasticSampler`` in the state, ``for step, (x, y) in ckpt.batches(...)``: both modes train this
one, a model small enough that the figures are the recovery's. It does in a step what the scripts of the battery
(tests/support/battery_train.py) do, so that what each pattern costs a recovery mode is in the figures: a
BatchNorm layer (in-process: its buffers go to every node at each step's start), ``clip_grad_norm_`` (the
gradient averaged across nodes inside ``backward()``), an LR schedule, an EMA (``AveragedModel``), a
``torch.Generator`` drawn once a step and a plain counter in the state (in-process: all of them taken back
on a discarded step). ``--step-delay`` sleeps in
each step (the compute of a larger model: the figures are the recovery's) between the forward and the backward,
where a model computes: a node that vanishes then is most likely computing, so its peers find out in the step's
collective (in-process: the cross-node average in ``backward()``, after the replica timeout). Slept after
``optimizer.step()`` it was most likely between steps, where the in-process mode's coordinator drops it after its
heartbeat timeout, sooner: the vanish figure a real model would not see.
``--epochs`` is large enough that the job trains until the benchmark stops it. The DataLoader has no worker
processes (the README's has 2): on a 2-core machine running up to 8 nodes they would only compete for the CPU.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

from azext_elastictrain.runtime import Checkpointer, ElasticSampler, collective_timeout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=100000)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--device", default="cpu", help="cuda: the README's two lines for a GPU (nccl, the model "
                        "and batches on the worker's GPU; docs/runtime.md)")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout())
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 10, (args.samples,)))
    sampler = ElasticSampler(data, global_batch_size=args.global_batch, seed=0)
    loader = DataLoader(data, batch_sampler=sampler, pin_memory=cuda)
    net = nn.Sequential(nn.Linear(32, args.width), nn.BatchNorm1d(args.width), nn.ReLU(),
                        nn.Linear(args.width, 10)).to(args.device)
    model = nn.parallel.DistributedDataParallel(net)
    ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.9)
    strength = torch.Generator().manual_seed(2)  # an augmentation's randomness, drawn once a step
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "ema": ema, "data": sampler,
             "strength": strength, "steps_seen": 0}

    ckpt = Checkpointer.from_env()
    for _step, (x, y) in ckpt.batches(state, loader, epochs=args.epochs):
        x, y = x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)
        scale = 1 + 0.1 * torch.rand((), generator=strength)
        loss = nn.functional.cross_entropy(model(x * scale.to(args.device)), y)
        time.sleep(args.step_delay)  # a larger model's compute: before the step's cross-node average (see above)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        ema.update_parameters(net)
        state["steps_seen"] += 1
        ckpt.report(loss=loss.item())


if __name__ == "__main__":
    main()
