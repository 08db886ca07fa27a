"""The runtime's CUDA-aware paths, run on CPU where their logic needs no device: the memory tier's
device-to-host copies through a fake of the copy stream (``memory_tier.PinnedCopies``, our own seam), and a free
tensor restored onto its own device (DCP's placeholders). The peer transfer's device mapping is in
test_peer_transfer.py, the cross-node backend's choice in test_replica_backend.py."""
from __future__ import annotations

import io
import threading
import time
from typing import Any, Callable

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, TensorProperties,
                                                   TensorStorageMetadata)

from azext_elastictrain.runtime import memory, memory_tier
from azext_elastictrain.runtime.memory import MemoryKeeper
from azext_elastictrain.runtime.planners import CheckingLoadPlanner, placeholder
from azext_elastictrain.runtime.state import cuda_rng_states


class FakeStream:
    """A device stream: work queued runs only when an event after it is waited for."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], Any]] = []
        self.ran = 0
        self._lock = threading.RLock()  # the commit thread and the training thread both wait on it

    def enqueue(self, work: Callable[[], Any]) -> None:
        self.queued.append(work)

    def run_until(self, position: int) -> None:
        with self._lock:
            while self.ran < position:
                self.queued[self.ran]()
                self.ran += 1


class FakeEvent:  # pylint: disable=too-few-public-methods  # torch.cuda.Event's one call the tier makes
    def __init__(self, stream: FakeStream, gate: threading.Event | None = None) -> None:
        self.stream, self.position, self.waited = stream, len(stream.queued), False
        self.gate = gate  # a host wait (the commit's) returns only once it is open

    def synchronize(self) -> None:
        if self.gate is not None:
            assert self.gate.wait(30)
        self.waited = True
        self.stream.run_until(self.position)


class StreamCopies(memory_tier.PinnedCopies):
    """Every tensor treated as a device's; copies queued on a FakeStream (the training stream) or on a second
    one (the copy stream, ``aside``); plain host buffers, counted. Work the test does at once on the host stands
    for work queued after everything so far: ``wait_aside`` runs the copy stream up to the event at once."""

    def __init__(self, stream: FakeStream) -> None:
        super().__init__()
        self.stream = stream
        self.side_stream = FakeStream()
        self.allocated = 0
        self.events: list[FakeEvent] = []
        self.gate = threading.Event()  # the host's waits (the commit thread's) proceed while it is set
        self.gate.set()

    def wanted(self, tensor: torch.Tensor) -> bool:
        return True

    def allocate(self, source: torch.Tensor) -> torch.Tensor:
        self.allocated += 1
        return torch.full(source.shape, -1, dtype=source.dtype)  # what a copy that has not landed leaves

    def start_aside(self, device: torch.device) -> None:
        position = len(self.stream.queued)  # the copy stream waits for the training stream's work so far
        self.side_stream.enqueue(lambda: self.stream.run_until(position))

    def copy(self, pinned: torch.Tensor, source: torch.Tensor, aside: bool = False) -> None:
        (self.side_stream if aside else self.stream).enqueue(lambda: pinned.copy_(source))

    def recorded(self, device: torch.device | None = None) -> FakeEvent:  # type: ignore[override]
        self.events.append(FakeEvent(self.side_stream if device is not None else self.stream, self.gate))
        return self.events[-1]

    def wait_aside(self, event: Any) -> None:
        event.stream.run_until(event.position)


class LockedCopies(StreamCopies):
    """The slot page-locked for the device: copies queued straight into it."""

    def __init__(self, stream: FakeStream) -> None:
        super().__init__(stream)
        self.locked: list[int] = []  # ids of the mappings page-locked now
        self.locking_threads: list[str] = []

    def register(self, mapped: Any, device: torch.device) -> bool:
        assert device == torch.device("cpu"), "the device of the tensors the slot receives (here CPU's stand-in)"
        self.locked.append(id(mapped))
        self.locking_threads.append(threading.current_thread().name)
        return True

    def unregister(self, mapped: Any, device: torch.device) -> None:
        self.locked.remove(id(mapped))


def test_a_locked_slot_takes_the_copies_straight_in_without_pinned_buffers(tmp_path) -> None:
    tier = memory_tier.MemoryTier("job", "run", tmp_path, node="n0")
    stream = FakeStream()
    tier.copies = copies = LockedCopies(stream)
    live = {"w": torch.arange(8, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    for step in (1, 2, 3):
        live["w"].add_(1)
        before = live["w"].clone()
        capture = tier.capture(step, 1, live)
        assert not capture.pending and stream.ran < len(stream.queued), "queued into the slot, not landed"
        stream.enqueue(lambda: live["w"].add_(100))  # the next step's in-place update, after the copies
        tier.commit(capture)
        copy = tier.read()
        assert copy is not None and copy.step == step and torch.equal(copy.tensors["w"], before)
        stream.run_until(len(stream.queued))  # the next step's update ran
        live["w"].sub_(100)
    assert copies.allocated == 0, "no pinned buffer"
    assert len(copies.locked) == 2, "each slot's mapping locked once"
    tier.discard()
    assert not copies.locked, "unlocked before the mappings go"


def test_a_large_device_state_has_its_slots_made_beside_training_and_is_kept_once_they_are(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "PREPARE_AHEAD_BYTES", 1)  # every device state is large here
    tier = memory_tier.MemoryTier("job", "run", tmp_path, node="n0")
    stream = FakeStream()
    tier.copies = copies = LockedCopies(stream)
    state = kept_state()
    keeper = MemoryKeeper(tier, writer=True)
    try:
        keeper.keep(1, state, 1)  # the slots are being made: step 1 is not kept
        assert not stream.queued and not copies.side_stream.queued, "no copy queued while the slots are made"
        deadline = time.monotonic() + 30
        while len(copies.locked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(copies.locked) == 2 and all(t.startswith("elastictrain-memory") for t in copies.locking_threads), \
            "both slots made and page-locked on the keeper thread, not the training thread"
        step = 1
        while keeper.kept() is None and step < 1000:  # kept from the first step after the making ended
            step += 1
            keeper.keep(step, state, 1)
        assert keeper.kept() == step and len(copies.locked) == 2, "the captures used the slots made ahead"
    finally:
        keeper.close()
    copy = tier.read()
    assert copy is not None and copy.step == step


def make_tier(tmp_path) -> tuple[memory_tier.MemoryTier, FakeStream, StreamCopies]:
    tier = memory_tier.MemoryTier("job", "run", tmp_path, node="n0")
    stream = FakeStream()
    tier.copies = copies = StreamCopies(stream)
    return tier, stream, copies


def test_a_device_capture_queues_its_copies_and_the_commit_waits_for_them_not_for_the_next_step(tmp_path) -> None:
    tier, stream, copies = make_tier(tmp_path)
    live = {"w": torch.arange(8, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    capture = tier.capture(1, 1, live)
    assert stream.ran == 0 and len(stream.queued) == 2, "the training thread does not wait for the copies"
    stream.enqueue(lambda: live["w"].add_(100))  # the next step's in-place update, queued after the copies
    tier.commit(capture)
    assert copies.events[0].waited and stream.ran == 2, "the commit waited for the copies, and only for them"
    copy = tier.read()
    assert copy is not None and copy.step == 1
    assert torch.equal(copy.tensors["w"], torch.arange(8, dtype=torch.float32)), "the step's values, not the next's"
    assert torch.equal(copy.tensors["b"], torch.ones(3, dtype=torch.bfloat16))


def test_the_pinned_buffers_are_kept_from_one_capture_to_the_next_until_a_shape_changes(tmp_path) -> None:
    tier, stream, copies = make_tier(tmp_path)
    live = {"w": torch.zeros(4), "b": torch.zeros(2)}
    for step in (1, 2):
        live["w"].fill_(step)
        tier.commit(tier.capture(step, 1, live))
    assert copies.allocated == 2, "one buffer per tensor, reused by the second capture"
    live["w"] = torch.full((6,), 3.0)
    tier.commit(tier.capture(3, 1, live))
    assert copies.allocated == 3 and stream.ran == len(stream.queued)
    copy = tier.read()
    assert copy is not None and copy.step == 3 and torch.equal(copy.tensors["w"], torch.full((6,), 3.0))


def test_a_commit_without_device_tensors_waits_for_nothing(tmp_path) -> None:
    tier = memory_tier.MemoryTier("job", "run", tmp_path, node="n0")
    capture = tier.capture(1, 1, {"w": torch.ones(2)})
    assert not capture.events and capture.aside is None and not capture.pending
    tier.commit(capture)
    copy = tier.read()
    assert copy is not None and torch.equal(copy.tensors["w"], torch.ones(2))


def kept_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).square().mean().backward()
    optimizer.step()  # the moments exist
    model(torch.randn(8, 4)).square().mean().backward()  # the next step's gradients
    return {"model": model, "optimizer": optimizer}


def test_parameters_and_moments_cross_beside_the_next_forward_and_the_optimizer_step_waits_for_them(
        tmp_path) -> None:
    tier, stream, copies = make_tier(tmp_path)
    state = kept_state()
    model, optimizer = state["model"], state["optimizer"]
    stepped = [p.detach().clone() for p in model.parameters()]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]
    statistics = model[1].running_mean.clone()
    keeper = MemoryKeeper(tier, writer=True)
    copies.gate.clear()  # the commit thread waits: what runs the copies here is the optimizer step alone
    try:
        keeper.keep(1, state, 1)
        on_the_side = len(copies.side_stream.queued)
        assert on_the_side == 1 + 4 * len(stepped), "its start; each parameter, its two moments and its step count"
        # the next step's forward on the training stream changes the BatchNorm statistics: not waiting for the copies
        stream.enqueue(lambda: model[1].running_mean.add_(100))
        assert copies.side_stream.ran == 0
        optimizer.step()  # its step-pre-hook: the training stream waits for the copy stream first
        assert copies.side_stream.ran == on_the_side
        assert not torch.equal(next(model.parameters()), stepped[0]), "the update ran after the copies"
        copies.gate.set()
        assert keeper.kept() == 1
    finally:
        copies.gate.set()
        keeper.close()
    copy = tier.read()
    assert copy is not None
    assert torch.equal(copy.tensors["model.0.weight"], stepped[0]), "the step's values, not the next's"
    assert torch.equal(copy.tensors["optimizer.state.0.weight.exp_avg"], moments[0])
    assert torch.equal(copy.tensors["model.1.running_mean"], statistics), \
        "a buffer is copied on the training stream, before the next forward changes it"


def test_a_heal_waits_for_the_copies_and_a_state_without_optimizer_copies_all_on_the_training_stream(
        tmp_path) -> None:
    tier, _, copies = make_tier(tmp_path)
    state = kept_state()
    keeper = MemoryKeeper(tier, writer=True)
    copies.gate.clear()
    try:
        keeper.keep(1, state, 1)
        assert copies.side_stream.ran == 0
        copies.gate.set()
        keeper.landed()  # before a heal writes into the parameters
        assert copies.side_stream.ran == len(copies.side_stream.queued) > 0
        keeper.keep(2, {"model": state["model"]}, 1)
        assert len(copies.side_stream.queued) == copies.side_stream.ran, "no optimizer: nothing beside the step"
        assert keeper.kept() == 2
        keeper.keep(3, state, 1)  # copies aside again, when the keeper closes
        assert keeper.kept() == 3
    finally:
        copies.gate.set()
        keeper.close()

    def no_wait(event: Any) -> None:
        raise AssertionError("a closed keeper's hook still made the optimizer step wait")

    copies.wait_aside = no_wait  # type: ignore[method-assign]
    state["model"](torch.randn(8, 4)).square().mean().backward()
    state["optimizer"].step()  # closing removed its step-pre-hook


def test_a_free_tensor_is_restored_onto_its_own_device_not_onto_cpu() -> None:
    """DCP loads the state's free tensors (their size comes from the checkpoint) into placeholders the planner
    makes: on the live tensor's device, so a CUDA tensor whose size changed comes back on its GPU (here: meta, a
    device that is not CPU), and on CPU where the live value was no tensor."""
    saved = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([3]),
                                  [ChunkStorageMetadata(torch.Size([0]), torch.Size([3]))])
    made = placeholder(saved, torch.empty(2, device="meta"))
    assert made is not None and made.device == torch.device("meta") and made.shape == (3,)
    assert made.dtype == torch.bfloat16
    on_cpu = placeholder(saved, 7)
    assert on_cpu is not None and on_cpu.device == torch.device("cpu")
    assert placeholder(BytesStorageMetadata(), torch.zeros(1)) is None


def test_a_free_tensor_still_restores_through_dcp(tmp_path) -> None:
    dcp.save({"ema": torch.ones(3)}, storage_writer=FileSystemWriter(tmp_path), no_dist=True)
    planner = CheckingLoadPlanner(free={"ema"})
    dcp.load({"ema": torch.zeros(2)}, storage_reader=FileSystemReader(tmp_path), planner=planner, no_dist=True)
    assert torch.equal(planner.state_dict["ema"], torch.ones(3))


def test_the_cuda_generators_come_back_from_capture_rngs_own_dict_not_only_from_a_checkpoints_flat_items() -> None:
    """A heal and a discarded step restore ``capture_rng()``'s dict, whose CUDA states are a list under "cuda";
    only the checkpoint's flat "cuda.N" items were read, so on a GPU the newcomer's CUDA generator (dropout) was
    not its peer's and a discarded step's was not taken back."""
    a, b, c = (torch.full((4,), i, dtype=torch.uint8) for i in range(3))
    assert cuda_rng_states({"torch": a, "cuda": [a, b]}) == [a, b]
    assert cuda_rng_states({"cuda.10": c, "cuda.2": b, "cuda.0": a}) == [a, b, c], "by device index, not by name"
    assert not cuda_rng_states({"torch": a})
    pytest.importorskip("torchft")
    from azext_elastictrain.runtime.peer_transfer import Destination, encode, read_state

    header, tensors = encode({"rng": {"cuda": [a, b]}})  # what the peer transfer carries
    got = read_state(io.BytesIO(stream(header, tensors)), None, Destination(None, torch.device("cpu")),
                     time.monotonic() + 5)
    assert [t.tolist() for t in cuda_rng_states(got["rng"])] == [a.tolist(), b.tolist()]


def stream(header: bytes, tensors: list) -> bytes:
    from azext_elastictrain.runtime.peer_transfer import Offer, write_offer

    out = io.BytesIO()
    write_offer(out, Offer(1, header, tensors, 0), lambda: True)
    return out.getvalue()
