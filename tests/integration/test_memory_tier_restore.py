"""Restore from survivors' memory: the newest whole copy among the world's nodes, or blob, never a bad copy.

Real processes (torch.multiprocessing, gloo on loopback, CPU), real Azurite. Each rank plays one node:
its own memory directory (``ELASTICTRAIN_MEMORY_DIR``) and ``LOCAL_RANK=0``. A DDP job trains 6 steps
with a blob checkpoint at step 4, keeping every step in memory; after its last ``ckpt.step`` it tears
its parameters (a worker killed mid-optimizer-step) and dies without closing. Each case then lays out
the nodes' memory and restores at world size 2: the expected result is the full state (model and
AdamW moments) of one exact step, compared bit for bit, and the restore event says where it came from.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from azext_elastictrain.core.eventlog import events as core_events
from azext_elastictrain.core.blobstore import BlobStore
from azext_elastictrain.runtime import memory_tier
from harness import services as svc
from tests.support.states import assert_identical

pytestmark = pytest.mark.slow

STEPS, INTERVAL, RUN = 6, 4, "run-1"
PREFIX = ""  # the job prefix of a container URL
TIMEOUT_S = 300


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optim": optim_sd}


def train(ckpt: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, rank: int,
          out: Path, memory: Path) -> None:
    for step in range(1, STEPS + 1):
        g = torch.Generator().manual_seed(100 * step + rank)
        loss = model(torch.randn(5, 12, generator=g)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ckpt.step(step, state)
        assert ckpt.kept_in_memory() == step  # committed by the keeper thread
        shutil.copy(memory_tier.MemoryTier(PREFIX, RUN, memory).newest_path(), out / f"rank{rank}-step{step}.state")
        if rank == 0 and step in (INTERVAL, STEPS):
            torch.save(full_state(model, optimizer), out / f"full-{step}.pt")
    ckpt.wait()
    with torch.no_grad():  # the next optimizer step, half done when the worker dies
        next(iter(model.parameters())).add_(1.0)


def worker(rank: int, port: int, url: str, connection_string: str, dirs: list[str], run_id: str,
           action: str, out: str) -> None:
    import torch.distributed as dist

    from azext_elastictrain.runtime.checkpoint import Checkpointer

    os.environ.pop("ELASTICTRAIN_NODE_NAME", None)
    os.environ.update({"GLOO_SOCKET_IFNAME": "lo", "ELASTICTRAIN_SCHEDULED_EVENTS_URL": "off", "LOCAL_RANK": "0",
                       "ELASTICTRAIN_MEMORY_DIR": dirs[rank], "TORCHELASTIC_RUN_ID": run_id})
    os.environ.pop("ELASTICTRAIN_MEMORY_TIER", None)  # on by default
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(dirs))
    torch.manual_seed(0 if action == "train" else 999)  # a restore starts from other weights
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(nn.Sequential(nn.Linear(12, 33), nn.ReLU(), nn.Linear(33, 7)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    state = {"model": model, "optimizer": optimizer}
    store = BlobStore.from_url(url, connection_string=connection_string)
    ckpt = Checkpointer(store, watcher=None, interval_steps=INTERVAL, async_save=False)
    if action == "train":
        assert ckpt.restore(state) is None
        train(ckpt, model, optimizer, state, rank, Path(out), Path(dirs[rank]))
        ckpt.close()
        os._exit(0)  # killed: no close, no final checkpoint; the memory copies stay
    restored = ckpt.restore(state)
    if rank == 0:
        torch.save({"step": restored, **full_state(model, optimizer)}, Path(out) / "restored.pt")
    ckpt.close()
    dist.destroy_process_group()


def spawn(url: str, azurite: svc.AzuriteService, dirs: list[Path], run_id: str, action: str, out: Path) -> None:
    context = mp.start_processes(
        worker, args=(svc.free_port(), url, azurite.connection_string, [str(d) for d in dirs], run_id, action,
                      str(out)),
        nprocs=len(dirs), join=False, start_method="spawn")
    for _ in range(TIMEOUT_S):
        if context.join(timeout=1):
            return
    for p in context.processes:
        p.kill()
    pytest.fail(f"{action} did not finish in {TIMEOUT_S}s")


@pytest.fixture(scope="module")
def trained(azurite: svc.AzuriteService, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    client = azurite.blob_service_client()
    name = "rescue-" + os.urandom(6).hex()
    client.create_container(name)
    url = f"{azurite.blob_endpoint}/{name}"
    out = tmp_path_factory.mktemp("trained")
    spawn(url, azurite, [out / "node0", out / "node1"], RUN, "train", out)
    return url, out


def node(tmp_path: Path, name: str, copy: Path | None) -> Path:
    """A node's memory directory holding ``copy`` where this job's copy belongs."""
    directory = tmp_path / name
    directory.mkdir()
    if copy is not None:
        shutil.copy(copy, memory_tier.MemoryTier(PREFIX, RUN, directory).paths[0])
    return directory


def restore(trained: tuple[str, Path], azurite: svc.AzuriteService, tmp_path: Path,
            layout: list[str | None], run_id: str = RUN) -> tuple[dict[str, Any], dict]:
    url, out = trained
    dirs = [node(tmp_path, f"n{i}", out / f if f else None) for i, f in enumerate(layout)]
    spawn(url, azurite, dirs, run_id, "restore", tmp_path)
    result = torch.load(tmp_path / "restored.pt", weights_only=True)  # this test's own file
    store = BlobStore.from_url(url, connection_string=azurite.connection_string)
    restores = [e for e in core_events.read_events(store, "") if e.get("event") == core_events.RESTORED]
    store.close()
    return result, restores[-1]


def expect(result: dict[str, Any], trained: tuple[str, Path], step: int) -> None:
    assert result["step"] == step
    full = torch.load(trained[1] / f"full-{step}.pt", weights_only=True)
    assert_identical({"model": result["model"], "optim": result["optim"]}, full)


def test_a_newcomer_takes_the_survivors_last_completed_step_from_it_not_a_torn_one(
        trained, azurite, tmp_path) -> None:
    result, event = restore(trained, azurite, tmp_path, [None, f"rank1-step{STEPS}.state"])
    expect(result, trained, STEPS)  # not blob's step 4, and not the torn parameters
    assert (event["source"], event["holder"], event["ranks_from_peer"]) == ("peer", 1, 1)


def test_a_survivor_restores_from_its_own_memory(trained, azurite, tmp_path) -> None:
    result, event = restore(trained, azurite, tmp_path, [f"rank0-step{STEPS}.state", None])
    expect(result, trained, STEPS)
    assert (event["source"], event["holder"], event["ranks_from_peer"]) == ("memory", 0, 1)


def test_of_two_survivors_one_step_apart_the_newer_wins(trained, azurite, tmp_path) -> None:
    result, event = restore(trained, azurite, tmp_path, [f"rank0-step{STEPS - 1}.state", f"rank1-step{STEPS}.state"])
    expect(result, trained, STEPS)
    assert (event["source"], event["holder"]) == ("peer", 1)


def test_a_copy_from_an_earlier_run_of_the_job_is_not_loaded(trained, azurite, tmp_path) -> None:
    result, event = restore(trained, azurite, tmp_path, [f"rank0-step{STEPS}.state"] * 2, run_id="run-2")
    expect(result, trained, INTERVAL)
    assert event["source"] == "blob"


def test_a_copy_older_than_blobs_newest_is_not_loaded(trained, azurite, tmp_path) -> None:
    result, event = restore(trained, azurite, tmp_path, [f"rank0-step{INTERVAL - 1}.state"] * 2)
    expect(result, trained, INTERVAL)
    assert event["source"] == "blob"


def test_a_corrupted_copy_is_not_loaded(trained, azurite, tmp_path) -> None:
    bad = tmp_path / "bad.state"
    raw = bytearray((trained[1] / f"rank0-step{STEPS}.state").read_bytes())
    raw[len(bytes(raw).rstrip(b"\0")) // 2] ^= 0x01  # within the copy: the slot's room after its header is none
    bad.write_bytes(raw)
    result, event = restore(trained, azurite, tmp_path, [str(bad), None])
    expect(result, trained, INTERVAL)
    assert event["source"] == "blob"


def test_a_copy_from_another_job_is_not_loaded(trained, azurite, tmp_path) -> None:
    url, out = trained
    copy = memory_tier.MemoryTier(PREFIX, RUN, out / "node0").read()
    assert copy is not None
    other = memory_tier.MemoryTier("other-job", RUN, tmp_path / "other")
    other.keep(copy.step, copy.world_size, copy.tensors)
    result, event = restore(trained, azurite, tmp_path, [str(other.newest_path())] * 2)
    expect(result, trained, INTERVAL)
    assert event["source"] == "blob"
