"""The in-process mode's cross-node backend, chosen from the parameters' device (runtime/replica_grads.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch

from azext_elastictrain.runtime import replica_grads
from azext_elastictrain.runtime.replica_grads import BACKENDS, replica_backend, replica_process_group


@pytest.mark.parametrize("device, nccl, expected", [
    ("cpu", None, "gloo"),
    ("cpu", (2, 27, 3), "gloo"),  # CPU parameters on a GPU machine: gloo still
    ("cuda:0", (2, 27, 3), "nccl"),  # aborts its communicator on a timeout
    ("cuda:3", (2, 25, 0), "nccl"),
    ("cuda:1", (2, 21, 5), "baby-nccl"),  # no ncclCommAbort: NCCL in a child process, killed on a timeout
    ("cuda", None, "gloo"),  # a torch without NCCL: gloo takes CUDA tensors
])
def test_the_backend_suits_the_parameters_device(device, nccl, expected) -> None:
    assert replica_backend(torch.device(device), nccl) == expected
    assert expected in BACKENDS


@pytest.mark.parametrize("device", ["meta", "mps", "xpu:0"])
def test_a_device_no_backend_serves_is_refused_with_what_to_do(device) -> None:
    with pytest.raises(ValueError, match=r"NCCL \(CUDA parameters\) or gloo.*--recovery restart"):
        replica_backend(torch.device(device), (2, 27, 3))


def test_the_process_group_is_torchfts_reconfigurable_one_for_the_choice(monkeypatch) -> None:
    torchft = pytest.importorskip("torchft")
    pg = replica_process_group(torch.device("cpu"), timedelta(seconds=3))
    assert isinstance(pg, torchft.ProcessGroupGloo)
    made = []
    monkeypatch.setattr(replica_grads, "nccl_version", lambda: (2, 26, 2))  # our own seam: no GPU here
    monkeypatch.setattr(torchft, "ProcessGroupNCCL", lambda timeout: made.append(("nccl", timeout)) or "pg")
    assert replica_process_group(torch.device("cuda", 1), timedelta(seconds=3)) == "pg"
    assert made == [("nccl", timedelta(seconds=3))]
    monkeypatch.setattr(replica_grads, "nccl_version", lambda: (2, 20, 0))
    monkeypatch.setattr(torchft, "ProcessGroupBabyNCCL", lambda timeout: made.append(("baby", timeout)) or "baby")
    assert replica_process_group(torch.device("cuda", 0), timedelta(seconds=3)) == "baby"


def test_a_replica_group_with_parameters_on_a_device_no_backend_serves_is_refused_before_it_starts() -> None:
    pytest.importorskip("torchft")
    from azext_elastictrain.runtime.replicas import ReplicaGroup

    model = torch.nn.Linear(2, 2, device="meta")
    state = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    with pytest.raises(ValueError, match="parameters are on meta"):
        ReplicaGroup(state, step=0, environ={})


@pytest.mark.parametrize("device, nccl, aborts", [
    ("cpu", None, False),
    ("cuda:0", (2, 27, 3), True),  # ncclCommAbort
    ("cuda:0", (2, 20, 0), True),  # NCCL in a child process, which is killed
    ("cuda:0", None, False),  # gloo with CUDA tensors: it cannot be aborted while it waits
])
def test_a_collective_is_aborted_only_on_a_backend_that_can_abort_it(monkeypatch, device, nccl, aborts) -> None:
    monkeypatch.setattr(replica_grads, "nccl_version", lambda: nccl)  # our own seam: no GPU here
    assert replica_grads.abortable(torch.device(device)) is aborts
