"""Comparing training states bit for bit, for checkpoint tests."""
from __future__ import annotations

from typing import Any

import torch


def assert_identical(a: Any, b: Any, where: str = "state") -> None:
    """Same nesting, same container types, tensors equal in dtype, shape and every bit."""
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def adamw_replica() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same seeded model and a fresh AdamW, each call: replicas of one job."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def assert_first_steps_alike(replicas: list[tuple[torch.nn.Module, torch.optim.Optimizer]],
                             alone: tuple[torch.nn.Module, torch.optim.Optimizer]) -> None:
    """One step of the same batch on each replica and on ``alone`` (an uninterrupted run's): the same parameters
    after it (AdamW's bias correction counts its steps: a step that counted twice moves them otherwise)."""
    x = torch.randn(6, 8)
    for model, optimizer in (*replicas, alone):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    for model, _ in replicas:
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), alone[0].parameters()))
