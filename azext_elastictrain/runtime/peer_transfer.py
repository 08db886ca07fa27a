"""How a replica that is behind gets the live state from a peer: torchft's checkpoint transport, in a safe format,
streamed tensor by tensor so that neither side ever holds the state twice.

torchft's own transports unpickle what a peer sends (``HTTPTransport`` loads with ``weights_only=False``,
``PGTransport`` ``pickle.loads`` its metadata), so any process that can reach the port could run code in the
receiver. This one sends what the runtime's state shapes are made of (runtime/state.py: tensors and JSON values,
in dicts, lists and tuples) in a format of its own: a JSON header (the tree, with each tensor's dtype, shape and
device in its place; dtypes from an allow-list) and then each tensor's raw bytes. Nothing is unpickled.

**Memory.** The sender serves its live tensors (the step's state, as torchft hands it to ``send_checkpoint``)
straight from their memory: no serialised copy (before, ``torch.save`` into a buffer held the state twice, and
three times while the buffer was copied out). The receiver reads each tensor's bytes straight into the tensor of
its own state at the same place (``Destination``), where dtype and shape match, so a heal allocates nothing for
them; a tensor without one is allocated where it lands. A CUDA tensor goes through a pinned staging chunk of
``CHUNK_BYTES`` on either side.

**Device.** A received tensor lands on the device of the local tensor it replaces; one without a local
counterpart lands where ``torch.load``'s ``map_location`` would put it: a CPU tensor (an RNG state, a step count)
on CPU, an accelerator's tensor on the receiving process's device (``Destination.device``: the local parameters'
device, else the current CUDA device), whatever device index the sender had it on.

**Consistency.** The served tensors are the live ones: they must not change while a peer reads them. The sender
offers them at the step boundary (torchft's quorum) and waits at the step's start for every participant, the
newcomer included once it holds the state (runtime/replicas.py ``_start_together``); only then does its body
change anything, and it withdraws the offer first (``disallow_checkpoint``). A transfer still running then (the
start timed out) ends with a trailer that says so, and the receiver fails the heal. A heal that fails after it
began writing into the receiver's tensors leaves them part one state, part the other: ``torn`` says so until a
heal completes (runtime/replicas.py restarts the worker if the next quorum does not heal it).

**Connections.** The receiver may fetch the state over several connections at once (``connections``), each
carrying a part: the header and a run of the tensors (the runs split the bytes about evenly, computed by both
sides from the header). One connection's copy is bound by one thread reading the socket and copying each chunk
on (3.8 GB/s into an H100 over loopback, docs/benchmarks.md); several overlap their reads and copies. The default
stays one (``CONNECTIONS``) until a GPU measures the difference.

The sender serves the state when the quorum asks for it; the receiver polls until the peer has it or the
transfer's timeout passes. That timeout is the transport's own (runtime/replicas.py sizes it to the state):
torchft passes its Manager's, which knows nothing of the state's size.

What it serves is the whole model and optimizer state, so the server listens on the node's own address only (the
pod's IP on AKS, loopback locally) and answers 403 to a request without the job's secret (``Authorization: Bearer
<secret>``, compared in constant time): on AKS the job's Kubernetes Secret, locally a file of the job's
(``job_secret``). The NetworkPolicy of the job's workers keeps other pods away from the port in the first place.
"""
from __future__ import annotations

import hmac
import json
import math
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, cast

import torch
from torchft.checkpointing import CheckpointTransport

from azext_elastictrain.core import launch
from azext_elastictrain.runtime.metadata_codec import DTYPES

PATH = "/elastictrain/state/"
MAGIC = b"elastictrain-peer-state/1\n"
COMPLETE, TORN = b"COMPLETE", b"TORN\0\0\0\0"  # the trailer: whether the sender's state stayed as it was offered
CHUNK_BYTES = 16 * 2**20  # a socket read or write, and the pinned staging buffer of a CUDA tensor
MAX_HEADER_BYTES = 64 * 2**20
# Parts of a state fetched at once. 1 until measured where it should pay: on this 2-core machine 300 MiB over
# loopback took the same over 1 and 4 (0.08-0.16 s, heal_memory.py --connections, five runs each: a memory copy
# either way); on a GPU one thread also copies each chunk to the device between its socket reads (gpu.py's heal
# runs 1 and 4 side by side).
CONNECTIONS = 1
MAX_PARTS = 64
JSON_SCALARS = (bool, int, float, str, type(None))


class Writable(Protocol):  # pylint: disable=too-few-public-methods  # a type: what the sender writes to
    """Where a state is written (the HTTP handler's ``wfile``, a file, ``io.BytesIO``)."""

    def write(self, data: bytes | memoryview, /) -> object:
        """``data`` onto the stream."""


class Readable(Protocol):  # pylint: disable=too-few-public-methods  # a type: what the receiver reads from
    """Where a state is read from (an HTTP response, a file, ``io.BytesIO``): exact reads into a buffer."""

    def readinto(self, buffer: memoryview, /) -> int | None:
        """Read up to ``len(buffer)`` bytes into it; how many (0 or None: none)."""


class JobSecretMissing(RuntimeError):
    """The in-process mode's state server needs the job's secret, and the environment gives none."""


class PeerStateError(ValueError):
    """What a peer sent is not a state in this format, or is incomplete, or changed while it was sent."""


def job_secret(env: Mapping[str, str]) -> str:
    """The job's secret: ``launch.ENV_JOB_SECRET`` (AKS: from the job's Secret), else the content of the file
    ``launch.ENV_JOB_SECRET_FILE`` names (local jobs). Without one the state server cannot run guarded: refused."""
    value = env.get(launch.ENV_JOB_SECRET, "").strip()
    path = env.get(launch.ENV_JOB_SECRET_FILE, "")
    if not value and path:
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as ex:
            raise JobSecretMissing(f"the job's secret file {path} cannot be read: {ex}") from ex
    if not value:
        raise JobSecretMissing(
            f"in-process recovery serves the model to the job's peers only with the job's secret: set "
            f"{launch.ENV_JOB_SECRET} or {launch.ENV_JOB_SECRET_FILE} ('az elastictrain job run' does)")
    return value


def current_cuda_index() -> int | None:
    """This thread's current CUDA device, or None without one."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def default_device() -> torch.device:
    """Where an accelerator's tensor lands without a local counterpart or a device given: the current CUDA
    device, else CPU."""
    index = current_cuda_index()
    return torch.device("cpu") if index is None else torch.device("cuda", index)


@dataclass
class Destination:
    """Where a received state lands: ``tree`` is the receiver's own state in the shape the sender sends (its
    tensors are received into where dtype and shape match), ``device`` the receiving process's device."""

    tree: Any = None
    device: torch.device = field(default_factory=default_device)


def landing_device(sent: str, local: torch.Tensor | None, device: torch.device) -> torch.device:
    """Where a tensor sent from device ``sent`` lands: on its local counterpart's device; else a CPU tensor on CPU
    and an accelerator's on ``device`` (``torch.load``'s ``map_location`` onto the receiving process's device)."""
    if local is not None:
        return local.device
    if torch.device(sent).type == "cpu":
        return torch.device("cpu")
    return device


# --------------------------------------------------------------------------- the sender's side


@dataclass(frozen=True)
class Offer:
    """One step's state as offered: the header (encoded at the offer) and the live tensors, in their order."""

    step: int
    header: bytes
    tensors: list[torch.Tensor]
    generation: int

    def length(self, part: int = 0, parts: int = 1) -> int:
        """The bytes of part ``part`` of ``parts`` (the header, its run of the tensors, the trailer)."""
        run = split([_nbytes(t) for t in self.tensors], parts)[part]
        return len(MAGIC) + 8 + len(self.header) + sum(_nbytes(self.tensors[i]) for i in run) + len(COMPLETE)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def split(sizes: list[int], parts: int) -> list[range]:
    """The tensors (by their bytes, in wire order) in ``parts`` consecutive runs of about equal bytes; both sides
    compute it, the sender from its tensors and the receiver from the header. A run may be empty."""
    total, cuts, done = sum(sizes), [0], 0
    for index, size in enumerate(sizes):
        done += size
        while len(cuts) < parts and done * parts >= total * len(cuts) and index + 1 > cuts[-1]:
            cuts.append(index + 1)
    cuts += [len(sizes)] * (parts + 1 - len(cuts))
    return [range(cuts[i], cuts[i + 1]) for i in range(parts)]


def _plain_tensor(value: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The tensor whose bytes go on the wire (a DTensor's local shard, a Parameter's data), and whether it is a
    shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local().detach(), True
    return value.detach(), False


def encode(tree: Any) -> tuple[bytes, list[torch.Tensor]]:
    """``tree``'s header (JSON) and its tensors in wire order; a value that is no tensor, JSON scalar, dict with
    string keys, list or tuple: TypeError (nothing is pickled)."""
    tensors: list[torch.Tensor] = []
    metas: list[dict[str, Any]] = []

    def node(value: Any) -> dict[str, Any]:
        if isinstance(value, torch.Tensor):
            tensor, sharded = _plain_tensor(value)
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in DTYPES or tensor.device.type == "meta":
                raise TypeError(f"a {tensor.dtype} tensor on {tensor.device} cannot be sent to a peer")
            metas.append({"dtype": dtype, "shape": list(tensor.shape), "device": str(tensor.device),
                          "sharded": sharded})
            tensors.append(tensor)
            return {"t": len(tensors) - 1}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TypeError(f"a state sent to a peer has string keys only, not {list(value)[:3]!r}")
            return {"d": {k: node(v) for k, v in value.items()}}
        if isinstance(value, tuple):
            return {"u": [node(v) for v in value]}
        if isinstance(value, list):
            return {"l": [node(v) for v in value]}
        if isinstance(value, JSON_SCALARS):
            return {"v": value}
        raise TypeError(f"a {type(value).__name__} cannot be sent to a peer (tensors and JSON values only)")

    skeleton = node(tree)
    header = json.dumps({"tree": skeleton, "tensors": metas}, separators=(",", ":")).encode()
    return header, tensors


def _staging(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """A pinned chunk for the device<->host copies, if any tensor is on an accelerator."""
    if all(t.device.type == "cpu" for t in tensors):
        return None
    return torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def _memory(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's memory as a memoryview (through numpy: no copy)."""
    return memoryview(tensor.numpy())  # type: ignore[arg-type]  # numpy declares __buffer__ for Python >= 3.12 only


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s memory as a flat uint8 tensor (a view: writing it writes the tensor)."""
    return tensor.reshape(-1).view(torch.uint8)


def write_tensor(out: Writable, tensor: torch.Tensor, staging: torch.Tensor | None) -> None:
    """``tensor``'s bytes to ``out``: from its own memory (a CPU tensor, ``staging`` None), or through
    ``staging`` one chunk at a time (a device's: a copy of one chunk at a time, never of the tensor)."""
    flat = _bytes_of(tensor.resolve_conj().resolve_neg().contiguous())
    if staging is None:  # on CPU
        view = _memory(flat)
        for start in range(0, len(view), CHUNK_BYTES):
            out.write(view[start:start + CHUNK_BYTES])
        return
    for start in range(0, flat.numel(), staging.numel()):
        part = staging[:min(staging.numel(), flat.numel() - start)]
        part.copy_(flat[start:start + part.numel()])  # synchronous: the chunk is on the host before it is sent
        out.write(_memory(part))


def write_offer(out: Writable, offer: Offer, intact: Callable[[], bool], part: int = 0, parts: int = 1) -> None:
    """The stream of part ``part`` of ``parts`` of ``offer`` (the whole state by default); the trailer says whether
    ``intact()`` still holds once every byte is out."""
    out.write(MAGIC)
    out.write(struct.pack("<Q", len(offer.header)))
    out.write(offer.header)
    run = [offer.tensors[i] for i in split([_nbytes(t) for t in offer.tensors], parts)[part]]
    staging = _staging(run)
    for tensor in run:
        write_tensor(out, tensor, None if tensor.device.type == "cpu" else staging)
    out.write(COMPLETE if intact() else TORN)


# --------------------------------------------------------------------------- the receiver's side


class _Reader:  # pylint: disable=too-few-public-methods  # exact reads against a deadline
    def __init__(self, stream: Readable, deadline: float) -> None:
        self.stream = stream
        self.deadline = deadline

    def into(self, view: memoryview) -> None:
        """Fill ``view`` from the stream; a stream that ends first or a deadline passed: an error."""
        done = 0
        while done < len(view):
            if time.monotonic() > self.deadline:
                raise TimeoutError("the peer's state did not arrive within the transfer's timeout")
            got = self.stream.readinto(view[done:done + CHUNK_BYTES])
            if not got:
                raise PeerStateError("the peer's state ended early (the peer gone?)")
            done += got

    def exactly(self, size: int) -> bytes:
        buffer = bytearray(size)
        self.into(memoryview(buffer))
        return bytes(buffer)


def read_tensor(reader: _Reader, target: torch.Tensor, staging: torch.Tensor | None) -> None:
    """The next tensor's bytes into ``target`` (contiguous): straight into its memory (a CPU tensor, ``staging``
    None), or through ``staging`` one chunk at a time (a device's)."""
    flat = _bytes_of(target)
    if staging is None:  # on CPU
        reader.into(_memory(flat))
        return
    for start in range(0, flat.numel(), staging.numel()):
        part = staging[:min(staging.numel(), flat.numel() - start)]
        reader.into(_memory(part))
        flat[start:start + part.numel()].copy_(part)  # synchronous: the chunk is reused for the next read


def _shape(meta: dict[str, Any]) -> tuple[torch.dtype, torch.Size, int]:
    dtype = DTYPES.get(meta.get("dtype", ""))
    shape = meta.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise PeerStateError(f"a tensor the peer sent is not one this receiver takes: {meta!r:.120}")
    size = torch.Size(shape)
    return dtype, size, math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _local_tensor(local: Any) -> torch.Tensor | None:
    """The tensor of the receiver's own state to receive into, if ``local`` is one (a DTensor: its shard)."""
    if not isinstance(local, torch.Tensor):
        return None
    return _plain_tensor(local)[0]


class Decoder:  # pylint: disable=too-few-public-methods  # a header's tree and where each tensor goes
    """The tree of a header, its tensors received into the destination's where they fit (``read``)."""

    def __init__(self, header: dict[str, Any], destination: Destination) -> None:
        metas = header.get("tensors")
        if not isinstance(metas, list):
            raise PeerStateError("the peer's header lists no tensors")
        self.metas: list[Any] = metas  # each a dict (the peer's JSON: _shape reads it)
        self.destination = destination
        self.slots: list[tuple[torch.Tensor, bool] | None] = [None] * len(self.metas)  # (where to, into local)
        self.tree = self._build(header.get("tree"), destination.tree)
        if any(slot is None for slot in self.slots):
            raise PeerStateError("the peer's header lists a tensor its tree does not hold")

    def data_bytes(self) -> int:
        return sum(_shape(meta)[2] for meta in self.metas)

    def _build(self, node: Any, local: Any) -> Any:  # pylint: disable=too-many-return-statements  # one per kind
        if not isinstance(node, dict) or len(node) != 1:
            raise PeerStateError(f"malformed state header near {node!r:.80}")
        kind, value = next(iter(node.items()))
        if kind == "v" and isinstance(value, JSON_SCALARS):
            return value
        if kind == "d" and isinstance(value, dict):
            return {k: self._build(v, local.get(k) if isinstance(local, dict) else None) for k, v in value.items()}
        if kind in ("l", "u") and isinstance(value, list):
            around = local if isinstance(local, (list, tuple)) else ()
            items = [self._build(v, around[i] if i < len(around) else None) for i, v in enumerate(value)]
            return items if kind == "l" else tuple(items)
        if kind == "t" and isinstance(value, int) and 0 <= value < len(self.metas) and self.slots[value] is None:
            return self._slot(value, local)
        raise PeerStateError(f"malformed state header near {node!r:.80}")

    def _slot(self, index: int, local: Any) -> torch.Tensor:
        meta = self.metas[index]
        dtype, shape, _ = _shape(meta)
        mine = _local_tensor(local)
        if mine is not None and mine.dtype == dtype and mine.shape == shape and mine.is_contiguous():
            self.slots[index] = (mine, True)
            return cast(torch.Tensor, local)  # the receiver's own tensor (a DTensor whole): loading it back is a no-op
        if meta.get("sharded"):
            raise PeerStateError(f"the peer sent a shard of {shape} {dtype} that this replica holds no "
                                 "matching shard for (another sharding?)")
        device = landing_device(str(meta.get("device", "cpu")), mine, self.destination.device)
        tensor = torch.empty(shape, dtype=dtype, device=device)
        self.slots[index] = (tensor, False)
        return tensor


def read_header(reader: _Reader, length: int | None) -> bytes:
    """The header of a part (its raw JSON), after checking the stream's format."""
    if reader.exactly(len(MAGIC)) != MAGIC:
        raise PeerStateError("the peer's answer is not a state in elastictrain's format")
    (size,) = struct.unpack("<Q", reader.exactly(8))
    if size > MAX_HEADER_BYTES or (length is not None and size > length):
        raise PeerStateError(f"the peer's state header claims {size} bytes")
    return reader.exactly(size)


def decode_header(raw: bytes, destination: Destination) -> Decoder:
    try:
        header = json.loads(raw)
    except ValueError as ex:
        raise PeerStateError(f"the peer's state header is no JSON: {ex}") from ex
    if not isinstance(header, dict):
        raise PeerStateError("the peer's state header is no JSON object")
    return Decoder(header, destination)


def read_part(reader: _Reader, decoder: Decoder, run: range, on_write: Callable[[], None]) -> None:
    """Part ``run`` of the tensors into the decoder's slots, then the trailer. ``on_write`` is called before the
    first byte goes into one of the destination's own tensors."""
    targets = [slot for slot in (decoder.slots[i] for i in run) if slot is not None]
    staging = _staging([t for t, _ in targets])
    written = False
    for target, into_local in targets:
        if into_local and not written:
            on_write()
            written = True
        read_tensor(reader, target, None if target.device.type == "cpu" else staging)
    trailer = reader.exactly(len(COMPLETE))
    if trailer != COMPLETE:
        raise PeerStateError("the peer's state changed while it was sent (its step went on without this replica)")


def part_length(raw_header: bytes, decoder: Decoder, run: range) -> int:
    return len(MAGIC) + 8 + len(raw_header) + sum(_shape(decoder.metas[i])[2] for i in run) + len(COMPLETE)


def read_state(stream: Readable, length: int | None, destination: Destination, deadline: float,
               on_write: Callable[[], None] = lambda: None) -> Any:
    """A state from ``stream`` (``write_offer``'s format, one part), its tensors received into ``destination``'s.
    ``on_write`` is called before the first byte goes into one of the destination's own tensors."""
    reader = _Reader(stream, deadline)
    raw = read_header(reader, length)
    decoder = decode_header(raw, destination)
    run = range(len(decoder.metas))
    if length is not None and length != part_length(raw, decoder, run):
        raise PeerStateError("the peer's answer is not as long as its header says")
    read_part(reader, decoder, run, on_write)
    return decoder.tree


class PartsReader:  # pylint: disable=too-few-public-methods  # one state over several connections
    """A state from ``parts`` streams of one offer, read at once on threads of their own: the first header read
    builds the decoder (every part's header must be the same), each part reads its run into it."""

    def __init__(self, parts: int, destination: Destination, deadline: float, on_write: Callable[[], None]):
        self.parts, self.destination, self.deadline, self._on_write = parts, destination, deadline, on_write
        self._lock = threading.Lock()
        self._decoded_from: tuple[bytes, Decoder] | None = None  # the first header read, and its decoder
        self._written = False

    def _decoded(self, raw: bytes) -> Decoder:
        with self._lock:
            if self._decoded_from is None:
                self._decoded_from = raw, decode_header(raw, self.destination)
            elif raw != self._decoded_from[0]:
                raise PeerStateError("the peer sent parts of different states")
            return self._decoded_from[1]

    def on_write(self) -> None:
        with self._lock:
            if not self._written:
                self._written = True
                self._on_write()

    def read(self, part: int, stream: Readable, length: int | None) -> None:
        reader = _Reader(stream, self.deadline)
        raw = read_header(reader, length)
        decoder = self._decoded(raw)
        run = split([_shape(meta)[2] for meta in decoder.metas], self.parts)[part]
        if length is not None and length != part_length(raw, decoder, run):
            raise PeerStateError("the peer's answer is not as long as its header says")
        read_part(reader, decoder, run, self.on_write)

    @property
    def tree(self) -> Any:
        assert self._decoded_from is not None
        return self._decoded_from[1].tree


# --------------------------------------------------------------------------- the transport


def parse_part(query: str) -> tuple[int, int] | None:
    """``part=I&of=N`` (0 <= I < N <= MAX_PARTS) as (I, N); no query: the whole state, (0, 1); else None."""
    if not query:
        return 0, 1
    fields = urllib.parse.parse_qs(query, strict_parsing=False)
    try:
        (part,), (parts,) = fields.pop("part"), fields.pop("of")
        found = int(part), int(parts)
    except (KeyError, ValueError):
        return None
    return found if not fields and 0 <= found[0] < found[1] <= MAX_PARTS else None


# torchft ships no types (no py.typed): its CheckpointTransport reads as Any
class PeerTransport(CheckpointTransport):  # type: ignore[misc]  # pylint: disable=too-many-instance-attributes
    """Serves this replica's state for one step over HTTP; fetches a peer's into this replica's tensors."""

    def __init__(self, host: str, *, timeout: Callable[[], timedelta], secret: str, bind: str,
                 destination: Callable[[], Destination] = Destination, connections: int = CONNECTIONS) -> None:
        if not secret:
            raise JobSecretMissing("the state server needs the job's secret")
        if not 1 <= connections <= MAX_PARTS:
            raise ValueError(f"connections must be 1 to {MAX_PARTS}, not {connections}")
        self._host = host
        self.connections = connections
        self._timeout = timeout
        self._destination = destination
        self._authorization = f"Bearer {secret}".encode()
        self._offer: Offer | None = None
        self._generation = 0
        self.sent = 0  # states offered to a replica behind (send_checkpoint calls): what the quorum event reports
        self.torn = False  # a heal failed after writing into this replica's tensors, and none completed since
        self._lock = threading.Lock()
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if not transport.admits(self.headers.get("Authorization", "")):
                    self.send_error(403, "the job's secret is required")
                    return
                path, _, query = self.path.partition("?")
                part = parse_part(query)
                if part is None:
                    self.send_error(400, f"a part is ?part=I&of=N with 0 <= I < N <= {MAX_PARTS}")
                    return
                offer = transport.served(path)
                if offer is None:
                    self.send_error(503, "no state for this step yet")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(offer.length(*part)))
                self.end_headers()
                write_offer(self.wfile, offer, lambda: transport.still_offered(offer), *part)

            def log_message(self, *args: Any) -> None:  # one line per request on stderr is noise here
                pass

        self._server = ThreadingHTTPServer((bind, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="elastictrain-peer-state", daemon=True).start()

    def admits(self, authorization: str) -> bool:
        """Whether a request's Authorization header carries the job's secret (constant-time comparison)."""
        return hmac.compare_digest(authorization.encode(), self._authorization)

    def served(self, path: str) -> Offer | None:
        """The state asked for by ``path`` (its step), if this replica offers that step now."""
        with self._lock:
            if self._offer is None or path != f"{PATH}{self._offer.step}":
                return None
            return self._offer

    def still_offered(self, offer: Offer) -> bool:
        """Whether ``offer``'s tensors have not been withdrawn (nothing changed them) since it was made."""
        with self._lock:
            return self._generation == offer.generation

    def metadata(self) -> str:
        return f"http://{self._host}:{self._server.server_address[1]}"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        header, tensors = encode(state_dict)  # the plain values now; the tensors as they are when served
        with self._lock:
            self._generation += 1
            self._offer = Offer(step, header, tensors, self._generation)
            self.sent += 1

    def disallow_checkpoint(self) -> None:
        """The offered tensors may change from now on: not served any more, a transfer still running ends torn."""
        with self._lock:
            self._generation += 1
            self._offer = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        deadline = time.monotonic() + self._timeout().total_seconds()  # not torchft's timeout: see the docstring
        url = f"{metadata}{PATH}{step}"
        writing = False

        def on_write() -> None:
            nonlocal writing
            writing = True

        try:
            tree = self._fetch(url, deadline, on_write)
        except BaseException:
            if writing:
                self.torn = True
            raise
        self.torn = False
        return tree

    def _fetch(self, url: str, deadline: float, on_write: Callable[[], None]) -> Any:
        """The state at ``url``, over one connection or ``connections`` parts at once."""
        if self.connections == 1:
            return self._get(url, deadline, lambda response, length: read_state(
                response, length, self._destination(), deadline, on_write))
        parts = PartsReader(self.connections, self._destination(), deadline, on_write)

        def read(part: int) -> Callable[[Readable, int | None], None]:
            return lambda response, length: parts.read(part, response, length)

        with ThreadPoolExecutor(self.connections, thread_name_prefix="elastictrain-heal") as pool:
            reads = [pool.submit(self._get, f"{url}?part={i}&of={self.connections}", deadline, read(i))
                     for i in range(self.connections)]
            for pending in reads:
                pending.result()  # the first failure raises (the others end with their streams)
        return parts.tree

    def _get(self, url: str, deadline: float, handle: Callable[[Readable, int | None], Any]) -> Any:
        """``handle(response, length)`` of ``url``'s answer, asked again while the peer does not have the state yet
        (503) until ``deadline``."""
        while True:
            try:
                request = urllib.request.Request(url, headers={"Authorization": self._authorization.decode()})
                with urllib.request.urlopen(request, timeout=max(0.1, deadline - time.monotonic())) as response:
                    length = response.headers.get("Content-Length")
                    return handle(response, None if length is None else int(length))
            except urllib.error.HTTPError as ex:
                if ex.code != 503 or time.monotonic() >= deadline:
                    raise
            time.sleep(0.02)

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()
