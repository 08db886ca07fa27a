"""Sharded and replicated models restore at another world size with the same full state (DCP resharding).

Real processes (torch.multiprocessing, gloo on loopback, CPU), real Azurite. The state is the plain
``{"model": model, "optimizer": AdamW}`` dict; each run gathers the full model and optimizer state
(``full_state_dict=True``) on rank 0 after its save or restore, and the runs are compared bit for bit.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from harness import services as svc
from tests.support.states import assert_identical

JOB = "job"
TIMEOUT_S = 300


def build(kind: str, world_size: int) -> torch.nn.Module:
    from torch import nn

    model = nn.Sequential(nn.Linear(12, 33), nn.ReLU(), nn.Linear(33, 7))  # 33 rows: uneven shards
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world_size,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}


def worker(rank: int, world_size: int, port: int, kind: str, action: str, url: str, connection_string: str,
           out: str, step: int) -> None:
    import torch.distributed as dist

    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.runtime.checkpoint import Checkpointer

    os.environ.update({"GLOO_SOCKET_IFNAME": "lo", "ELASTICTRAIN_SCHEDULED_EVENTS_URL": "off"})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0 if action == "save" else 999)  # a restore starts from other weights
        model = build(kind, world_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
        state = {"model": model, "optimizer": optimizer}
        store = BlobStore.from_url(url, connection_string=connection_string)
        with Checkpointer(store, watcher=None, events=False) as ckpt:
            if action == "save":
                g = torch.Generator().manual_seed(rank)
                for _ in range(3):
                    loss = model(torch.randn(5, 12, generator=g)).square().mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                ckpt.save(step, state, blocking=True)
            else:
                assert not optimizer.state
                restored = ckpt.restore(state)
                assert restored == step, restored
        full = full_state(model, optimizer)
        if rank == 0:
            torch.save(full, out)
        store.close()
    finally:
        dist.destroy_process_group()


def run(world_size: int, kind: str, action: str, url: str, azurite: svc.AzuriteService, out: Path,
        step: int) -> dict[str, Any]:
    context = mp.start_processes(
        worker, args=(world_size, svc.free_port(), kind, action, url, azurite.connection_string, str(out), step),
        nprocs=world_size, join=False, start_method="spawn")
    for _ in range(TIMEOUT_S):
        if context.join(timeout=1):
            break
    else:
        for p in context.processes:
            p.kill()
        pytest.fail(f"{kind} {action} at world size {world_size} did not finish in {TIMEOUT_S}s")
    return torch.load(out, weights_only=True)  # this test's own file, written above


def moments(full: dict[str, Any]) -> int:
    return sum(isinstance(v, torch.Tensor) for s in full["optim"]["state"].values() for v in s.values())


@pytest.mark.parametrize("kind, save_at, restore_at", [
    ("fsdp2", 2, (1, 2)),
    ("ddp", 1, (3,)),
    ("ddp", 3, (1,)),
])
def test_a_model_and_optimizer_saved_at_one_world_size_restore_whole_at_another(
        kind: str, save_at: int, restore_at: tuple[int, ...], azurite: svc.AzuriteService, container_url: str,
        tmp_path: Path) -> None:
    url = f"{container_url}/{JOB}"
    saved = run(save_at, kind, "save", url, azurite, tmp_path / "saved.pt", step=3)
    assert moments(saved) == 4 * 3  # 4 parameters x (exp_avg, exp_avg_sq, step)
    for world_size in restore_at:
        restored = run(world_size, kind, "restore", url, azurite, tmp_path / f"restored-{world_size}.pt", step=3)
        assert_identical(saved, restored, f"{kind} {save_at}->{world_size}")
