"""A training job whose peer vanishes mid-step: the survivor's worker fails within the collective timeout (it
does not wait for the peer), never as a success, and the step that did not complete is neither checkpointed nor
recorded completed. Two real ranks (gloo on loopback, DDP, the README's loop), real Azurite; rank 1 freezes
itself (SIGSTOP: its sockets stay open, as an Azure VM evicted without notice) at the start of a step."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from azext_elastictrain.core import catalog, launch
from azext_elastictrain.core.eventlog import events as core_events
from azext_elastictrain.core.blobstore import BlobStore
from harness import services as svc

pytestmark = pytest.mark.slow

FREEZE_AT = 3  # rank 1 vanishes as this step begins: steps 1 and 2 complete, step 3 never does
BOUND_SECONDS = 120  # far below torch's 30-minute default, far above start-up plus the 2 s timeout

RANK_SCRIPT = textwrap.dedent(f"""
    import os, signal, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from azext_elastictrain.core.blobstore import BlobStore
    from azext_elastictrain.runtime import Checkpointer, collective_timeout

    dist.init_process_group("gloo", timeout=collective_timeout())
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {{"model": model, "optimizer": optimizer}}
    store = BlobStore.from_url(sys.argv[1], connection_string=sys.argv[2])
    ckpt = Checkpointer(store, watcher=None, interval_steps=1, async_save=False, memory_tier=False)
    for step in ckpt.steps(state, total=10):
        if rank == 1 and step == {FREEZE_AT}:
            os.kill(os.getpid(), signal.SIGSTOP)  # vanished: frozen with its sockets open
        loss = model(torch.randn(4, 8)).square().sum()
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce: the survivor waits here for the frozen peer
        optimizer.step()
        print(f"TRAINED {{step}}", flush=True)
""")


def test_a_vanished_peer_fails_the_survivors_worker_and_its_step_is_not_completed(container_url, azurite):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(svc.free_port()), "WORLD_SIZE": "2",
           "GLOO_SOCKET_IFNAME": "lo", launch.ENV_COLLECTIVE_TIMEOUT: "2", "LOCAL_RANK": "0"}
    env.pop(launch.ENV_NODE_NAME, None)
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, container_url, azurite.connection_string],  # noqa: S603
                              env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(2)]
    survivor, peer = procs
    try:
        try:
            out, _ = survivor.communicate(timeout=BOUND_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the survivor still waited for the vanished peer after {BOUND_SECONDS}s")
        assert survivor.returncode not in (0, None), out  # a failed worker: torchrun re-forms, never a success
        trained = [int(line.split()[1]) for line in out.splitlines() if line.startswith("TRAINED ")]
        assert trained == list(range(1, FREEZE_AT)), out
        store = BlobStore.from_url(container_url, connection_string=azurite.connection_string)
        try:
            committed = [c.step for c in catalog.list_checkpoints(store, store.prefix) if c.complete]
            events = core_events.read_events(store, store.prefix)
        finally:
            store.close()
        assert committed == list(range(1, FREEZE_AT))  # the step that did not complete is not checkpointed
        assert not [e for e in events if e.get("event") == "finished"]
        interrupted = [e for e in events if e.get("event") == "interrupted"]
        assert interrupted and {e["step"] for e in interrupted} == {FREEZE_AT - 1}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
