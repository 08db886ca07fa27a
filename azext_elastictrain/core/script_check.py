"""What ``job run`` can see in a training script before it runs: pure, stdlib only (``ast``; the script is never
imported or run).

A restart-mode job does not wait for torch's default timeout when a node vanishes once the script created its
``Checkpointer`` (the runtime's peer watch ends the survivors' workers: runtime/peer_watch.py). Before that, the
script's own process group is all there is: a node that vanishes during ``init_process_group``'s rendezvous or
DDP's first broadcast leaves the others waiting for the timeout the script gave ``init_process_group``, torch's
default (30 minutes for gloo, 10 for NCCL) unless it passed one.

An in-process job needs the runtime's loop (``ckpt.batches()`` or ``ckpt.steps()``), whose step boundary is where
the nodes agree on each step's quorum; a loop of the script's own calling ``ckpt.step()`` (restart mode's hook) is
refused at its first step, in every worker, so ``job run`` looks for it before anything starts.
"""
from __future__ import annotations

import ast

# init_process_group(backend, init_method, timeout, ...): the timeout is its third positional parameter.
_TIMEOUT_POSITION = 2


def init_without_timeout(source: str) -> list[int]:
    """The lines where ``source`` calls ``init_process_group`` without a timeout (no ``timeout=``, no third
    positional argument, no ``**options`` that could hold one). [] for a script that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name != "init_process_group":
            continue
        if len(node.args) > _TIMEOUT_POSITION or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        if any(k.arg in ("timeout", None) for k in node.keywords):  # None: **options
            continue
        lines.append(node.lineno)
    return sorted(lines)


def hand_written_loop(source: str) -> int | None:
    """The line where ``source`` itself calls ``step(...)`` on the name it bound a ``Checkpointer`` to (``ckpt =
    Checkpointer.from_env()`` ... ``ckpt.step(step, state)``: a loop of its own), unless it also calls
    ``.batches(`` or ``.steps(``; None otherwise, and for a script that does not parse. Only what the script
    itself does: a loop in a module it imports is not looked at, so a valid script is never taken for one."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _makes_checkpointer(node.value):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    steps: list[int] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in ("batches", "steps"):
            return None
        if node.func.attr == "step" and isinstance(node.func.value, ast.Name) and node.func.value.id in bound:
            steps.append(node.lineno)
    return min(steps) if steps else None


def _makes_checkpointer(call: ast.Call) -> bool:
    func = call.func
    return _names(func) == "Checkpointer" or (isinstance(func, ast.Attribute) and func.attr == "from_env"
                                              and _names(func.value) == "Checkpointer")


def _names(node: ast.expr) -> str | None:
    """What an expression names: ``X`` for ``X`` and ``a.b.X``."""
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


__all__ = ["hand_written_loop", "init_without_timeout"]
