"""A node of an in-process recovery job for the tests and scripts/bench: the README's loop over a dataset whose samples are their ids.

Run as ``python -m harness.replica_worker`` with the job's environment (ELASTICTRAIN_RECOVERY=in-process,
TORCHFT_LIGHTHOUSE, ELASTICTRAIN_REPLICA_ID, the checkpoint URL, MASTER_ADDR/PORT, RANK/WORLD_SIZE of the node).
Each step prints one JSON line before its backward (whose collective averages the nodes' gradients): the step, the sample ids of this worker's slice,
its layout (ranks, rank), the sampler's position, the learning rate its LR scheduler set and the pid; after the
optimizer step, a second line with the step's verdict (``committed``: the runtime discards a step by leaving every
gradient ``None``, runtime/replicas.py). The test reads them to check exactly-once data from ground truth: a step
trained, then discarded and healed from a peer, is followed by later records although this replica never committed
it. After the loop it prints the final parameters. ``REPLICA_STEP_SECONDS``: compute slept per step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from azext_elastictrain.runtime import Checkpointer, ElasticSampler

SIZE, BATCH = int(os.environ.get("REPLICA_SAMPLES", "240")), 12
LR, GAMMA = 1e-2, 0.995


class Ids(Dataset):
    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.randn(8, generator=generator), index


def start(name: str, env: dict[str, str], stderr: Any, repo: Path = Path(__file__).resolve().parents[1]
          ) -> subprocess.Popen:
    """This module as node ``name`` of an in-process job: a one-worker world of its own on a free port, its JSON
    lines on the returned process's stdout. ``env``: the job's environment (coordinator, checkpoint URL, ...)."""
    from harness.services import free_port

    return subprocess.Popen(  # pylint: disable=consider-using-with  # the caller stops it
        [sys.executable, "-m", "harness.replica_worker"], cwd=repo, stdout=subprocess.PIPE, stderr=stderr,
        env={**env, "ELASTICTRAIN_REPLICA_ID": name, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
             "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})


def records(stream: Any) -> Iterator[dict]:
    """The JSON lines a node of this module prints (its stdout), parsed, as they come; other lines are skipped."""
    for line in stream:
        try:
            yield json.loads(line)
        except ValueError:
            continue


def join_own_world(attempts: int = 5) -> None:
    """This node's one-worker world. Its store's port was free when ``start`` chose it; a process of a parallel test
    may have taken it since (EADDRINUSE: a node that never started, once in CI). Nobody else connects to this
    store, so another free port does."""
    from harness.services import free_port

    for attempt in range(attempts):
        try:
            dist.init_process_group("gloo")
            return
        except dist.DistNetworkError:
            if attempt == attempts - 1:
                raise
            os.environ["MASTER_PORT"] = str(free_port())


def main() -> int:
    join_own_world()
    torch.manual_seed(0)
    data = Ids()
    sampler = ElasticSampler(data, global_batch_size=BATCH, seed=0)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=int(os.environ.get("REPLICA_LOADER_WORKERS", "0")))
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)  # step s: LR x GAMMA^(s-1)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": sampler}
    pause = float(os.environ.get("REPLICA_STEP_SECONDS", "0.05"))
    die_at = int(os.environ.get("REPLICA_DIE_AT_STEP", "0"))  # gone mid-step: its peers' collective fails
    perturb = os.environ.get("REPLICA_PERTURB_FILE")  # once it exists: change a parameter after a committed step
    if os.environ.get("REPLICA_PAD_MB"):  # a large state, so that a transfer to a newcomer takes a while
        state["pad"] = torch.zeros(int(os.environ["REPLICA_PAD_MB"]) * 2**18)
    ckpt = Checkpointer.from_env()
    for step, (x, ids) in ckpt.batches(state, loader, epochs=int(os.environ.get("REPLICA_EPOCHS", "2"))):
        # the slice's record before the backward, whose collective (the nodes' average) may commit the step
        # with this slice in it even if this process dies right after
        print(json.dumps({"step": step, "ids": ids.tolist(), "ranks": sampler.num_replicas, "rank": sampler.rank,
                          "replica_rank": ckpt.replica_rank, "lr": optimizer.param_groups[0]["lr"],
                          "epoch": sampler.epoch, "consumed": sampler.consumed, "pid": os.getpid(),
                          "time": time.time()}), flush=True)
        if step == die_at:
            os._exit(9)  # gone before the step's collective: its peers' fails
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        time.sleep(pause)  # the step's compute, before the backward's collective
        loss.backward()
        optimizer.step()
        scheduler.step()  # whatever the verdict, as scripts do
        committed = all(p.grad is not None for p in model.parameters())
        if perturb is not None and committed and os.path.exists(perturb):  # this replica drifts from the others
            with torch.no_grad():  # (as after a commit they did not make)
                next(model.parameters()).add_(1e-3)
            os.remove(perturb)
            print(json.dumps({"perturbed": step}), flush=True)
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])  # (a comparison's first difference)
        print(json.dumps({"verdict": step, "committed": committed, "params": after.tolist()}), flush=True)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(json.dumps({"final": params.tolist(), "step": ckpt.last_step, "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
