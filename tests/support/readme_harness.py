"""Runs a Python block of README.md as a job's training script, and records what it trained.

tests/e2e/test_readme.py extracts the block from README.md at test time, writes it to a file and starts a
local job with this file as ``--script``; ``READMETEST_BLOCK`` names the block's file, ``READMETEST_OUT`` the
folder for the records. The block runs unchanged, as ``__main__`` (runpy). Records, one file per process:

- ``argv-<rank>-<pid>.json``: the script's arguments as the job handed them over;
- ``steps-<attempt>-rank<r>.jsonl``: per step the block's loop completed (the runtime's per-step hook is
  called): the attempt (one id per world, rank 0's), rank, world size, time, and for the ElasticSampler of
  the state, its epoch, the global batch size, seed and dataset size, and the ids of the samples this rank's
  batch of that step held (the index lists the sampler handed the DataLoader, in the order drawn: the
  batches a DataLoader yields, and the block trains, in that order).

In the in-process recovery mode (``ELASTICTRAIN_RECOVERY=in-process``) the workers outlive a re-form and the
runtime's per-step hook is not ``Checkpointer.step``: each committed step's slice is recorded where the sampler
moves on (``advance``) in ``slices-<node>-rank<r>-<pid>.jsonl``: node, pid, epoch, the sampler's position after
the step (``consumed``), the step's layout (``ranks``, ``rank``), time and ids. A step that is discarded, or in
which the node took the state from a peer, does not advance the sampler, so it records nothing.

While the file ``READMETEST_SLOW`` exists each step also sleeps ``READMETEST_STEP_DELAY`` seconds, so the
test has time to evict nodes before the job ends; then it trains at full speed.

Only the runtime's public methods are wrapped (``ElasticSampler.__iter__``/``advance``,
``Checkpointer.step``), each calling the original: what the block does is unchanged.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time
import uuid
from pathlib import Path

import torch.distributed as dist

from azext_elastictrain.runtime.checkpoint import Checkpointer
from azext_elastictrain.runtime.data import ElasticSampler

OUT = Path(os.environ["READMETEST_OUT"])
BLOCK = os.environ["READMETEST_BLOCK"]
SLOW = os.environ.get("READMETEST_SLOW")
DELAY = float(os.environ.get("READMETEST_STEP_DELAY", "0.2"))
RANK = os.environ.get("RANK", "0")


def _samplers(value):
    if isinstance(value, ElasticSampler):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _samplers(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _samplers(item)


_iter, _advance, _step = ElasticSampler.__iter__, ElasticSampler.advance, Checkpointer.step


def _iter_recording(self):
    batches = _iter(self)  # the original first: a new pass (or the stop's end of the process) as before
    drawn = self.readmetest_drawn = []

    def recorded():
        for ids in batches:
            drawn.append(list(ids))
            yield ids

    return recorded()


IN_PROCESS = os.environ.get("ELASTICTRAIN_RECOVERY") == "in-process"
NODE = os.environ.get("ELASTICTRAIN_NODE_NAME", "node")


class _Slices:
    out = None


def _advance_recording(self):
    ranks, rank = self.num_replicas, self.rank  # the committed step's layout, before anything reshards it
    _advance(self)
    self.readmetest_trained = self.readmetest_drawn.pop(0)
    if IN_PROCESS:
        if _Slices.out is None:
            _Slices.out = open(OUT / f"slices-{NODE}-rank{RANK}-{os.getpid()}.jsonl", "a", buffering=1,
                               encoding="utf-8")
        _Slices.out.write(json.dumps({"node": NODE, "pid": os.getpid(), "epoch": self.epoch,
                                      "consumed": self.consumed, "ranks": ranks, "rank": rank,
                                      "seed": self.seed, "dataset_size": self.dataset_size,
                                      "global_batch": self.global_batch_size, "time": time.time(),
                                      "ids": self.readmetest_trained}) + "\n")
        if SLOW and os.path.exists(SLOW):
            time.sleep(DELAY)


class _Log:
    attempt: str | None = None
    out = None


def _step_recording(self, step, state, **kwargs):
    if _Log.out is None:  # the first step of this world: one attempt id for all its ranks (a collective)
        box = [uuid.uuid4().hex[:12]]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        _Log.attempt = box[0]
        _Log.out = open(OUT / f"steps-{box[0]}-rank{RANK}.jsonl", "a", buffering=1, encoding="utf-8")
    record = {"attempt": _Log.attempt, "rank": int(RANK), "world": self.world_size, "step": step,
              "time": time.time()}
    for sampler in _samplers(state):
        record.update(epoch=sampler.epoch, global_batch=sampler.global_batch_size, seed=sampler.seed,
                      dataset_size=sampler.dataset_size, ids=getattr(sampler, "readmetest_trained", None))
    _Log.out.write(json.dumps(record) + "\n")
    if SLOW and os.path.exists(SLOW):
        time.sleep(DELAY)
    return _step(self, step, state, **kwargs)


ElasticSampler.__iter__ = _iter_recording
ElasticSampler.advance = _advance_recording
Checkpointer.step = _step_recording

OUT.mkdir(parents=True, exist_ok=True)
(OUT / f"argv-{RANK}-{os.getpid()}.json").write_text(json.dumps(sys.argv[1:]))
sys.argv = [BLOCK, *sys.argv[1:]]
runpy.run_path(BLOCK, run_name="__main__")
