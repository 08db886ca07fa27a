"""The in-process mode's gradient average across the nodes, inside ``backward()``, as one DDP run over every rank.

The script's DDP averages the gradients among its node's workers; this communication hook (DDP's public
``register_comm_hook``, as torchft's own DDP does) then averages them across the step's participating nodes before
``backward()`` returns, so what the script does with the gradients afterwards sees the job's average: clipping
(``clip_grad_norm_`` clips the global gradient, as in DDP), logging a norm, accumulating over ``no_sync()``
micro-batches (the hook runs on the backward that syncs).

The cross-node collective must pair the same tensors on every node, and DDP rebuilds its buckets after its first
iteration (a newcomer in its first step and the others in their thousandth can hold other buckets). So each
bucket is averaged within the node as DDP does (``allreduce_hook``), and the last bucket's call makes one
collective of every gradient in the optimizer's parameter order, the same on every node by construction, then
hands each bucket its part back. DDP waits for every bucket's future at the end of ``backward()``.

A model whose forward leaves some parameters out (DDP's ``find_unused_parameters``: an unused head, a mixture of
experts' routing) needs one thing more. DDP writes a gradient to every parameter used on any of its ranks and
leaves the others' alone (``None``: the optimizer skips them), but its ranks here are the node's workers only: an
expert that this node's batch did not route to, and another node's did, would get no gradient here and the
average there, and the replicas would part. So the collective also carries, per parameter, whether any worker of
the node used it (a parameter hook marks it, and a MAX within the node agrees it), and a parameter unused here but
used on another node gets the average here too; one used nowhere keeps no gradient anywhere, as in one DDP run.

No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects
(``bucket: dist.GradBucket``, ``-> torch.futures.Future[torch.Tensor]``).
"""
from datetime import timedelta
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


class CrossReplicaAverage:
    """DDP comm hook (``average``): the node's average (DDP's own), then the nodes' in one collective (see above).

    ``allreduce(flat)`` averages ``flat`` in place over the step's participants (runtime/replicas.py: a node
    that is not participating sends zeros; a failure is recorded and the step discarded). ``order``: the
    parameters in the optimizer's order. ``averaged`` counts the backward passes averaged since ``reset()``.
    """

    def __init__(self, order: List[torch.nn.Parameter], allreduce: Callable[[torch.Tensor], None], *,
                 track_use: bool = False) -> None:
        self.order = order
        self.allreduce = allreduce
        self.averaged = 0
        # ids of the parameters a backward since the last average reached (track_use: a DDP that finds unused ones)
        self._used: set[int] = set()
        self._track_use = track_use
        self._hooks = [p.register_hook(self._marker(id(p)))  # type: ignore[no-untyped-call]  # unannotated
                       for p in order] if track_use else []
        # per bucket: DDP's average within the node, the future handed to DDP, its gradients and parameters
        self._pending: List[Tuple[torch.futures.Future[torch.Tensor], torch.futures.Future[torch.Tensor],
                                  List[torch.Tensor], List[torch.Tensor]]] = []

    def reset(self) -> None:
        self.averaged = 0
        self._used.clear()

    def _marker(self, key: int) -> Callable[[torch.Tensor], None]:
        def mark(_grad: torch.Tensor) -> None:
            self._used.add(key)
        return mark

    def average(self, state: Any, bucket: dist.GradBucket  # pylint: disable=unused-argument  # DDP's signature
                ) -> torch.futures.Future[torch.Tensor]:
        within = allreduce_hook(None, bucket)  # type: ignore[arg-type]  # None: the default group (the node)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._pending.append((within, done, bucket.gradients(), bucket.parameters()))
        if bucket.is_last():
            self._across_nodes()
        return done

    def _across_nodes(self) -> None:
        pending, self._pending = self._pending, []
        try:
            views = {}
            buffers = []
            for within, _done, gradients, parameters in pending:
                buffers.append(within.wait())
                views.update({id(p): g for p, g in zip(parameters, gradients)})
            params = [p for p in self.order if id(p) in views]
            ordered = [views[id(p)] for p in params]
            if ordered:
                used = self._used_on_node(params, ordered[0]) if self._track_use else None
                flat = torch.cat([g.reshape(-1) for g in ordered] + ([used] if used is not None else []))
                self.allreduce(flat)
                offset = 0
                for g in ordered:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()
                if used is not None:
                    self._give_elsewhere_used(params, ordered, used, flat[offset:])
            self._used.clear()
            self.averaged += 1
        except Exception as ex:  # pylint: disable=broad-exception-caught  # every bucket's future carries it
            for _within, done, _g, _p in pending:
                done.set_exception(ex)  # type: ignore[arg-type]  # torch annotates its argument as T, not an exception
            return
        for (_within, done, _g, _p), buffer in zip(pending, buffers):
            done.set_result(buffer)

    def _used_on_node(self, params: List[torch.nn.Parameter], like: torch.Tensor) -> torch.Tensor:
        """1 for each parameter some worker of this node used since the last average, else 0 (DDP's rule within
        the node: its workers agree through a MAX in the node's group)."""
        used = torch.tensor([1.0 if id(p) in self._used else 0.0 for p in params], dtype=like.dtype,
                            device=like.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(used, op=dist.ReduceOp.MAX)
        return used

    @staticmethod
    def _give_elsewhere_used(params: List[torch.nn.Parameter], averaged: List[torch.Tensor], here: torch.Tensor,
                             anywhere: torch.Tensor) -> None:
        """A parameter no worker of this node used, and some node did: DDP leaves its gradient alone here, so it
        takes the average now (one used nowhere keeps none, as in one DDP run)."""
        for p, g, used_here, used_anywhere in zip(params, averaged, here.tolist(), anywhere.tolist()):
            if not used_here and used_anywhere > 0:
                if p.grad is None:
                    p.grad = g.detach().clone()
                else:
                    p.grad.copy_(g)


def the_ddp(state_modules: List[torch.nn.Module], optimizer: torch.optim.Optimizer
            ) -> Optional[torch.nn.parallel.DistributedDataParallel]:
    """The state's DDP that holds every parameter the optimizer trains, if there is one."""
    trained = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
    for module in state_modules:
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            if trained <= {id(p) for p in module.parameters()}:
                return module
    return None


# -- the backend of the cross-node collective, chosen from the parameters' device -------------------------------
# CUDA parameters: NCCL through torchft's ProcessGroupNCCL, which aborts the communicator when a peer is silent
# past the timeout (ncclCommAbort, NCCL >= 2.25: what its own check asks for); with an older NCCL, torchft's
# ProcessGroupBabyNCCL (NCCL in a child process, killed on a timeout: a hung NCCL call cannot hold the worker);
# a torch without NCCL: gloo, which takes CUDA tensors (copied through the host). CPU parameters: gloo. Any other
# device has no backend here.
NCCL_ABORT_VERSION = (2, 25)
BACKENDS = {"nccl": "ProcessGroupNCCL", "baby-nccl": "ProcessGroupBabyNCCL", "gloo": "ProcessGroupGloo"}


def replica_backend(device: torch.device, nccl: Optional[Tuple[int, ...]]) -> str:
    """The cross-node backend (a key of ``BACKENDS``) for parameters on ``device``; ``nccl``: the NCCL version
    this torch has (None without NCCL or CUDA). A device no backend serves: ValueError, saying what to do."""
    if device.type == "cpu":
        return "gloo"
    if device.type == "cuda":
        if nccl is None:
            return "gloo"
        return "nccl" if tuple(nccl) >= NCCL_ABORT_VERSION else "baby-nccl"
    raise ValueError(
        f"in-process recovery averages the gradients across the nodes with NCCL (CUDA parameters) or gloo (CPU "
        f"parameters), and this model's parameters are on {device}: move the model to cuda or cpu before "
        f"training, or run the job with --recovery restart")


def nccl_version() -> Optional[Tuple[int, ...]]:
    """This process's NCCL version, or None where torch has no NCCL or no CUDA device is visible."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    return tuple(torch.cuda.nccl.version())  # type: ignore[no-untyped-call]  # torch leaves it unannotated


def abortable(device: torch.device) -> bool:
    """Whether the cross-node backend for ``device`` aborts a collective in flight (NCCL's communicator), rather than
    gloo's, which cannot be aborted while one waits."""
    return replica_backend(device, nccl_version() if device.type == "cuda" else None) != "gloo"


def replica_process_group(device: torch.device, timeout: timedelta) -> Any:
    """torchft's reconfigurable process group for the cross-node average of tensors on ``device``."""
    import torchft

    backend = replica_backend(device, nccl_version() if device.type == "cuda" else None)
    return getattr(torchft, BACKENDS[backend])(timeout=timeout)
