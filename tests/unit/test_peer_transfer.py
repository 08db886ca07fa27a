"""The peer transfer's stream (runtime/peer_transfer.py): a heal lands in the receiver's own tensors, on its
device, chunk by chunk, and never holds the state twice; what a peer sends is checked, never unpickled."""
from __future__ import annotations

import io
import struct
import time
from datetime import timedelta

import pytest
import torch

pytest.importorskip("torchft")

# pylint: disable=wrong-import-position  # after the skip: torchft is the train extra's
from azext_elastictrain.runtime import peer_transfer  # noqa: E402
from azext_elastictrain.runtime.peer_transfer import (  # noqa: E402
    COMPLETE, Destination, Offer, PeerStateError, PeerTransport, encode, landing_device, read_state, read_tensor,
    write_offer, write_tensor)

SECRET = "the-jobs-secret"


def stream_of(tree, *, intact: bool = True) -> bytes:
    header, tensors = encode(tree)
    out = io.BytesIO()
    write_offer(out, Offer(1, header, tensors, 0), lambda: intact)
    return out.getvalue()


def with_header(raw: bytes, old: bytes, new: bytes) -> bytes:
    """``raw`` with its header edited (its length prefix kept right)."""
    start = len(peer_transfer.MAGIC)
    (size,) = struct.unpack("<Q", raw[start:start + 8])
    header = raw[start + 8:start + 8 + size].replace(old, new)
    return raw[:start] + struct.pack("<Q", len(header)) + header + raw[start + 8 + size:]


def receive(raw: bytes, destination: Destination, **kwargs):
    return read_state(io.BytesIO(raw), len(raw), destination, time.monotonic() + 10, **kwargs)


def sample_state() -> dict:
    return {"flat": {"model.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                     "model.half": torch.ones(3, dtype=torch.bfloat16),
                     "optim.state.step": torch.tensor(4.0), "optim.param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}],
                     "data.epoch": 2, "flags": torch.tensor([True, False]), "empty": torch.zeros(0)},
            "rng": {"torch": torch.get_rng_state(), "python_extra": [3, None]}}


def test_a_received_state_lands_in_the_receivers_own_tensors_allocating_nothing_for_them() -> None:
    sent = sample_state()
    local = {"flat": {"model.weight": torch.zeros(2, 3), "model.half": torch.zeros(3, dtype=torch.bfloat16),
                      "optim.state.step": torch.tensor(0.0)}}
    mine = dict(local["flat"])
    got = receive(stream_of(sent), Destination(local, torch.device("cpu")))
    for key, tensor in mine.items():
        assert got["flat"][key] is tensor, f"{key}: received into the receiver's own tensor"
        assert torch.equal(tensor, sent["flat"][key])
    assert torch.equal(got["flat"]["flags"], sent["flat"]["flags"]) and got["flat"]["empty"].shape == (0,)
    assert got["flat"]["optim.param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.99)}], "tuples stay tuples"
    assert got["flat"]["data.epoch"] == 2 and got["rng"]["python_extra"] == [3, None]
    assert torch.equal(got["rng"]["torch"], sent["rng"]["torch"])


def test_a_tensor_whose_local_counterpart_differs_is_allocated_and_the_local_one_left_alone() -> None:
    sent = {"w": torch.ones(4), "b": torch.ones(2, dtype=torch.float64)}
    local = {"w": torch.zeros(5), "b": torch.zeros(2)}  # another shape; another dtype
    got = receive(stream_of(sent), Destination(local, torch.device("cpu")))
    assert got["w"] is not local["w"] and torch.equal(got["w"], torch.ones(4))
    assert got["b"].dtype == torch.float64 and torch.equal(local["b"], torch.zeros(2))


def test_tensors_land_on_the_receivers_device_as_map_location_would_put_them() -> None:
    """Where a tensor sent from some device lands: its local counterpart's device first; else a CPU tensor stays
    on CPU (RNG states, step counts) and an accelerator's goes to the receiving process's device, whatever
    device index the sender had it on."""
    cuda0, cuda3, cpu = torch.device("cuda", 0), torch.device("cuda", 3), torch.device("cpu")
    assert landing_device("cuda:1", None, cuda3) == cuda3
    assert landing_device("cuda:0", None, cpu) == cpu, "a receiver without a GPU takes a GPU peer's state on CPU"
    assert landing_device("cpu", None, cuda0) == cpu
    assert landing_device("cuda:1", torch.empty(0, device="meta"), cuda0) == torch.device("meta")
    # on the wire: a header that says cuda:1, received by a CPU process without a counterpart
    raw = with_header(stream_of({"w": torch.ones(3)}), b'"device":"cpu"', b'"device":"cuda:1"')
    assert receive(raw, Destination(None, cpu))["w"].device == cpu


def test_the_receiving_device_is_the_parameters_then_the_current_cuda_device(monkeypatch) -> None:
    from azext_elastictrain.runtime.replicas import parameters_device

    model = torch.nn.Linear(2, 2, device="meta")
    assert parameters_device(torch.optim.SGD(model.parameters(), lr=0.1)) == torch.device("meta")
    monkeypatch.setattr(peer_transfer, "current_cuda_index", lambda: 2)  # our seam: a process on its third GPU
    assert peer_transfer.default_device() == torch.device("cuda", 2)
    assert Destination().device == torch.device("cuda", 2)
    monkeypatch.setattr(peer_transfer, "current_cuda_index", lambda: None)
    assert Destination().device == torch.device("cpu")


@pytest.mark.parametrize("size", [0, 1, 7, 64, 100])
def test_a_staged_copy_moves_a_tensor_one_chunk_at_a_time(size) -> None:
    """The device path (a CUDA tensor through a pinned chunk) on CPU: a 16-byte chunk, tensors of 0 to 100
    floats; the bytes are the tensor's, both ways, and nothing larger than the chunk is allocated."""
    tensor = torch.randn(size)
    out = io.BytesIO()
    write_tensor(out, tensor, torch.empty(16, dtype=torch.uint8))
    assert out.getvalue() == tensor.numpy().tobytes()
    target = torch.empty(size)
    reader = peer_transfer._Reader(io.BytesIO(out.getvalue()), time.monotonic() + 5)  # pylint: disable=protected-access
    read_tensor(reader, target, torch.empty(16, dtype=torch.uint8))
    assert torch.equal(target, tensor)


def test_a_non_contiguous_tensor_is_sent_as_its_values() -> None:
    sent = {"t": torch.arange(12.0).reshape(3, 4).t()}
    got = receive(stream_of(sent), Destination(None, torch.device("cpu")))
    assert torch.equal(got["t"], sent["t"])


def test_a_state_that_changed_while_sent_fails_the_heal_and_marks_the_written_tensors_torn() -> None:
    raw = stream_of({"w": torch.ones(3)}, intact=False)
    local = {"w": torch.zeros(3)}
    writes = []
    with pytest.raises(PeerStateError, match="changed while it was sent"):
        receive(raw, Destination(local, torch.device("cpu")), on_write=lambda: writes.append(1))
    assert writes == [1], "the receiver knows its own tensors were written"


@pytest.mark.parametrize("damage", ["truncated", "magic", "dtype", "length", "index", "header"])
def test_a_malformed_stream_is_refused(damage) -> None:
    raw = stream_of({"w": torch.ones(3), "n": 1})
    bad = {
        "truncated": raw[:-len(COMPLETE) - 4],
        "magic": b"X" + raw[1:],
        "dtype": raw.replace(b'"dtype":"float32"', b'"dtype":"object!"'),
        "length": raw.replace(b'"shape":[3]', b'"shape":[4]'),
        "index": raw.replace(b'{"t":0}', b'{"t":7}'),
        "header": raw.replace(b'"tree"', b'"tr\xffe"'),
    }[damage]
    assert bad != raw
    with pytest.raises(PeerStateError):
        receive(bad, Destination(None, torch.device("cpu")))


def test_only_tensors_and_json_values_are_sent() -> None:
    with pytest.raises(TypeError, match="string keys"):
        encode({1: torch.ones(1)})
    with pytest.raises(TypeError, match="meta"):
        encode({"w": torch.empty(2, device="meta")})
    with pytest.raises(TypeError, match="object cannot be sent"):
        encode({"w": object()})


def make_pair(**kwargs):
    return (PeerTransport("127.0.0.1", timeout=lambda: timedelta(seconds=5), secret=SECRET, bind="127.0.0.1",
                          **kwargs) for _ in range(2))


def test_the_transport_heals_into_the_local_tensors_and_a_withdrawn_offer_is_not_served() -> None:
    local = {"user": {"s": {"flat": {"w": torch.zeros(1000)}}}}
    sender, receiver = make_pair(destination=lambda: Destination(local, torch.device("cpu")))
    try:
        live = torch.arange(1000.0)
        sender.send_checkpoint([1], 3, {"user": {"s": {"flat": {"w": live}}}, "torchft": {"step": 3}}, timedelta(1))
        got = receiver.recv_checkpoint(0, sender.metadata(), 3, timedelta(seconds=1))
        assert got["user"]["s"]["flat"]["w"] is local["user"]["s"]["flat"]["w"] and got["torchft"] == {"step": 3}
        assert torch.equal(local["user"]["s"]["flat"]["w"], live) and not receiver.torn
        sender.disallow_checkpoint()  # the sender's body may now change ``live``
        assert sender.served(f"{peer_transfer.PATH}3") is None
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_a_heal_cut_short_after_writing_leaves_the_receiver_torn_until_one_completes(monkeypatch) -> None:
    local = {"w": torch.zeros(4 * 2**20)}  # 16 MiB: the server is still writing when the offer is withdrawn
    sender, receiver = make_pair(destination=lambda: Destination(local, torch.device("cpu")))
    try:
        header, tensors = encode({"w": torch.ones(4 * 2**20)})

        def torn_offer(out, offer, _intact, *part):  # the sender's body started while the bytes were on their way
            write_offer(out, offer, lambda: False, *part)

        with monkeypatch.context() as patch:
            patch.setattr(peer_transfer, "write_offer", torn_offer)
            sender.send_checkpoint([1], 5, {"w": tensors[0]}, timedelta(seconds=1))
            with pytest.raises(PeerStateError):
                receiver.recv_checkpoint(0, sender.metadata(), 5, timedelta(seconds=1))
        assert receiver.torn and header
        sender.send_checkpoint([1], 6, {"w": tensors[0]}, timedelta(seconds=1))
        receiver.recv_checkpoint(0, sender.metadata(), 6, timedelta(seconds=1))
        assert not receiver.torn and torch.equal(local["w"], tensors[0])
    finally:
        sender.shutdown()
        receiver.shutdown()


# -- several connections at once (CONNECTIONS parts) -----------------------------------------------------------------
@pytest.mark.parametrize("sizes, parts", [([10, 10, 10, 10], 2), ([100, 1, 1, 1], 4), ([1, 1, 100], 4), ([], 3),
                                          ([5], 4), ([7, 0, 3, 9, 2, 8, 4], 3)])
def test_the_parts_are_consecutive_runs_of_every_tensor_once_of_about_equal_bytes(sizes, parts) -> None:
    runs = peer_transfer.split(sizes, parts)
    assert len(runs) == parts and [i for run in runs for i in run] == list(range(len(sizes)))
    biggest = max(sizes, default=0)
    for run in runs:  # no run exceeds its share by more than one tensor
        assert sum(sizes[i] for i in run) <= sum(sizes) / parts + biggest


@pytest.mark.parametrize("connections", [1, 3, 4])
def test_a_heal_over_several_connections_lands_the_same_state_in_the_local_tensors(connections) -> None:
    sent = {f"layer{i}": torch.randn(1000 + 37 * i) for i in range(9)} | {"step": 4, "empty": torch.zeros(0)}
    local = {key: torch.zeros_like(value) for key, value in sent.items() if isinstance(value, torch.Tensor)}
    mine = dict(local)
    sender, receiver = make_pair(destination=lambda: Destination(local, torch.device("cpu")),
                                 connections=connections)
    try:
        sender.send_checkpoint([1], 2, sent, timedelta(seconds=1))
        got = receiver.recv_checkpoint(0, sender.metadata(), 2, timedelta(seconds=1))
        assert got["step"] == 4 and not receiver.torn
        for key, tensor in mine.items():
            assert got[key] is tensor and torch.equal(tensor, sent[key]), key
    finally:
        sender.shutdown()
        receiver.shutdown()


@pytest.mark.parametrize("query", ["part=4&of=4", "part=0&of=65", "part=-1&of=2", "part=x&of=2", "part=0",
                                   "part=0&of=2&extra=1"])
def test_a_part_that_is_not_one_is_refused(query) -> None:
    import urllib.error
    import urllib.request

    sender, receiver = make_pair()
    try:
        sender.send_checkpoint([1], 1, {"w": torch.ones(4)}, timedelta(seconds=1))
        request = urllib.request.Request(f"{sender.metadata()}{peer_transfer.PATH}1?{query}",
                                         headers={"Authorization": f"Bearer {SECRET}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)  # pylint: disable=consider-using-with
        assert refused.value.code == 400
        refused.value.close()
    finally:
        sender.shutdown()
        receiver.shutdown()


def test_parts_of_different_states_are_refused() -> None:
    reader = peer_transfer.PartsReader(2, Destination(), time.monotonic() + 10, lambda: None)
    one, other = stream_of({"w": torch.ones(4)}), stream_of({"w": torch.ones(5)})
    reader.read(0, io.BytesIO(one), None)
    with pytest.raises(PeerStateError, match="different states"):
        reader.read(1, io.BytesIO(other), None)
