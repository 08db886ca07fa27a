"""The memory tier: the state of the last completed step, kept in node-local shared memory.

For a replicated state (DDP: every rank holds the whole model and optimizer)
the state of the last completed step survives on every surviving node when a
peer dies without notice. ``Checkpointer.step`` is called after the optimizer
step, so the state it sees is a completed step; it is kept then in
``/dev/shm`` (it outlives the worker process, not the node). A worker killed
mid-optimizer-step never reaches ``step()``: its node keeps the previous step,
whole.

Two slots, and a commit word written last. Each node keeps two slot files; a
copy is written into the slot that does not hold the newest committed copy, in
two parts:

1. ``capture`` (the training thread, at ``step()``): clear the slot's commit
   word, then copy the tensors into the slot (CPU tensors straight into the
   shared memory; CUDA tensors device-to-host, without waiting: straight into
   the slot, which is page-locked for the device, or where CUDA refuses that,
   into pinned buffers). This is the one part that must happen before the next
   step changes the parameters in place.
2. ``commit`` (a background thread): wait for the device copies (and move
   those in pinned buffers into the slot), write the header (job, run, step,
   layout) after the data and an xxh3-64 checksum of data and header (over its
   64 MiB chunks' own, hashed on several threads), then the commit word, last.

A killed writer leaves, at every point: before 1, the slot's previous copy
(older) and the other slot's newest; during 1 or 2, a slot whose commit word
is 0, which no reader takes, and the other slot's newest; after 2, the new
copy. The commit word is one aligned 8-byte store. While a commit runs, the
next capture waits for it (the slot it would write is the one being committed
or the only whole one), so at most one copy is in flight. A slot whose step is
not older than the one being captured is cleared too: a copy from a history
that a blob restore abandoned is never taken over the one being written.

A copy is complete and consistent only if all of these hold (``read`` checks
them; any failure means "no copy", and restore falls back to blob):

- *committed*: its commit word is set (written after everything else);
- *whole*: an xxh3-64 checksum of its data and header matches the one committed with it (checked on
  every read: a restore from memory is bounded by it, and xxh3 reads ~3x faster than zlib's CRC32);
- *ours*: its header names the job prefix and the torchrun run id
  (``TORCHELASTIC_RUN_ID``, new per submission): a copy from another job, or
  from an earlier run of this job, is refused;
- *replicated*: states with sharded tensors (FSDP DTensors) are never kept;
  one node's copy is not the whole state.

The file holds tensors only (plain values as JSON in uint8 tensors), and a
JSON header: nothing in it is unpickled.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypedDict

import torch
import xxhash
from torch.distributed.checkpoint import StorageReader

from azext_elastictrain.core import launch
from azext_elastictrain.core.settings import RuntimeSettings

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner

log = logging.getLogger(__name__)

MAGIC = b"ETRESCU4"
FORMAT = 4  # 4: the checksum is over the chunks' checksums (CHUNK)
CHUNK = 64 * 2**20
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
DEFAULT_DIR = "/dev/shm/elastictrain"
SLOTS = 2
# The slot's preamble: magic, commit word (0: no copy), header offset, header length, checksum of data + header.
_PREAMBLE = struct.Struct("<8sQQQQ")
_COMMIT_AT = 8
DATA_START = 64
_ALIGN = 64
HEADROOM = 64 * 2**10  # a slot's room for its header to grow
RESERVE = 2**20  # slots are sized in MiBs


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _reserved(n: int) -> int:
    """A slot's size for ``n`` bytes of data and header: room for the header to grow (its step gains a digit at
    10, 100, ...) without a new mapping, which for a large state means a new page-locking of every page."""
    return (n + HEADROOM + RESERVE - 1) // RESERVE * RESERVE


@dataclass
class MemoryCopy:
    """One validated copy: its header and its tensors (views into the bytes read)."""

    step: int
    checksum: int
    world_size: int
    tensors: dict[str, torch.Tensor]
    raw: Any  # the slot's bytes (a bytearray or a private mmap), as a peer receives them
    path: Path | None = None


@dataclass
class Capture:  # pylint: disable=too-many-instance-attributes  # a record: where the copy is, and its events
    """A copy whose data is in its slot (or on its way from the device) but not yet committed."""

    slot: int
    step: int
    world_size: int
    header: bytes
    end: int  # where the data ends (the header goes there)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (slot view, pinned buffer)
    events: list[Any] = field(default_factory=list)  # CUDA events after the device-to-host copies, per stream
    aside: Any = None  # the event after the copies on the copy stream (PinnedCopies.wait_aside), if any


class Entry(TypedDict):
    """One tensor in a copy's header: its key, dtype name (``float32``), shape and bytes at ``offset``."""

    key: str
    dtype: str
    shape: list[int]
    offset: int
    nbytes: int


class PinnedCopies:
    """The device-to-host half of a capture, queued without waiting: each device tensor copied straight into the
    slot, page-locked for the device once per mapping (``register``), or where CUDA refuses that, into a pinned
    buffer kept for its key (reused while its shape and dtype hold: no page faults of a fresh allocation each
    step). The one place the tier touches CUDA, so the rest of the capture and commit runs the same with a fake
    of it on CPU.

    Two streams. A tensor the caller names *aside* (a parameter or optimizer state that only an optimizer step,
    which waits for them, changes in place: runtime/memory.py) is copied on a stream of its own, after the work
    queued so far on the current one, so the next step's forward and backward run on the training stream while
    its copy crosses to the host; ``wait_aside`` makes the current stream wait for those copies (no host wait),
    which the optimizer's step-pre-hook calls. Any other tensor (a BatchNorm's statistics, which the next forward
    changes) is copied on the current stream, ahead of whatever the next step queues there. ``recorded`` marks
    where each stream's copies end, which the commit waits for."""

    def __init__(self) -> None:
        self._pinned: dict[str, torch.Tensor] = {}
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def wanted(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` goes through a pinned buffer (a device's) rather than straight into the slot."""
        return tensor.is_cuda

    def register(self, mapped: mmap.mmap, device: torch.device) -> bool:
        """Page-lock a slot's mapping for ``device`` (``cudaHostRegister``): its copies then go straight into
        the slot, without a pinned buffer and its copy into the slot (half the host memory, a commit without
        a copy). False where CUDA refuses (the pinned buffers then). Made with ``device`` current, from
        whichever thread: on another thread the current device would be the first GPU, not the worker's."""
        if not torch.cuda.is_available():
            return False
        address = torch.frombuffer(mapped, dtype=torch.uint8).data_ptr()
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]  # torch leaves cudart() unannotated
        with torch.cuda.device(device):
            code = cudart.cudaHostRegister(address, len(mapped), 0)
        if int(code) != 0:
            log.warning("the memory tier's slot could not be page-locked for the device (%s): the copies go "
                        "through pinned buffers", code)
            return False
        return True

    def unregister(self, mapped: mmap.mmap, device: torch.device) -> None:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]  # torch leaves cudart() unannotated
        with torch.cuda.device(device):
            cudart.cudaHostUnregister(torch.frombuffer(mapped, dtype=torch.uint8).data_ptr())

    def queue(self, key: str, source: torch.Tensor, aside: bool = False) -> torch.Tensor:
        """``source`` queued for copying into ``key``'s pinned buffer, which is returned (not yet written)."""
        pinned = self._pinned.get(key)
        if pinned is None or pinned.shape != source.shape or pinned.dtype != source.dtype:
            pinned = self._pinned[key] = self.allocate(source)
        self.copy(pinned, source, aside)
        return pinned

    def allocate(self, source: torch.Tensor) -> torch.Tensor:
        """A host buffer for ``source``: page-locked, so the copy from the device runs without waiting."""
        return torch.empty(source.shape, dtype=source.dtype, pin_memory=True)

    def side(self, device: torch.device) -> torch.cuda.Stream:
        """The copy stream of ``device`` (one per device, kept)."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        return stream

    def start_aside(self, device: torch.device) -> None:
        """The copy stream waits for what the current stream queued so far (the step's optimizer update)."""
        self.side(device).wait_stream(torch.cuda.current_stream(device))

    def copy(self, pinned: torch.Tensor, source: torch.Tensor, aside: bool = False) -> None:
        """The copy queued on the copy stream (``aside``) or on the current one."""
        if not aside:
            pinned.copy_(source, non_blocking=True)
            return
        stream = self.side(source.device)
        with torch.cuda.stream(stream):
            pinned.copy_(source, non_blocking=True)
        source.record_stream(stream)  # the allocator keeps its memory until the copy ran

    def recorded(self, device: torch.device | None = None) -> torch.cuda.Event:
        """An event after every copy queued so far on the current stream, or on ``device``'s copy stream
        (``synchronize()``: they have landed)."""
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves Event.__init__ unannotated
        event.record(self.side(device) if device is not None else None)
        return event

    def wait_aside(self, event: torch.cuda.Event) -> None:
        """The current stream waits (on the device; the host goes on) for the copies before ``event``."""
        torch.cuda.current_stream().wait_event(event)


def _threads() -> ThreadPoolExecutor:
    """The threads that copy a commit's pieces and checksum its chunks (xxhash and copy_ leave the GIL)."""
    global _POOL  # pylint: disable=global-statement  # one pool per process, made at its first use
    with _POOL_LOCK:  # the keeper thread and a reader may both be first
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)),
                                       thread_name_prefix="elastictrain-memory-io")
    return _POOL


def _digest(chunk: memoryview) -> int:
    hasher = xxhash.xxh3_64()
    hasher.update(chunk)  # update(), not the one-shot function: it leaves the GIL for large inputs
    return hasher.intdigest()


def _checksum(data: memoryview) -> int:
    """xxh3-64 over the xxh3-64s of ``data``'s CHUNK-byte chunks, the chunks hashed on several threads: a 19 GB
    state is checksummed at the memory's pace, not one core's."""
    chunks = [data[lo:lo + CHUNK] for lo in range(0, len(data), CHUNK)]
    digests = list(_threads().map(_digest, chunks)) if len(chunks) > 1 else [_digest(data)]
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(digests)}Q", *digests))


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _step_or(step: int | None, default: int) -> int:
    """A slot's step, or ``default`` where it holds none."""
    return default if step is None else step


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def is_replicated(flat: dict[str, Any]) -> bool:
    """True if every tensor is a plain tensor (DTensor / ShardedTensor: one shard per rank)."""
    # exact type on purpose: a tensor subclass (DTensor, ShardedTensor) is not a plain local tensor
    return all(type(v) is torch.Tensor  # pylint: disable=unidiomatic-typecheck
               for v in flat.values() if isinstance(v, torch.Tensor))


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The memory tier is on unless ``ELASTICTRAIN_MEMORY_TIER`` says off."""
    return RuntimeSettings.from_env(os.environ if environ is None else environ).memory_tier


class MemoryTier:
    """Writes and reads this node's copy of one job's state (one writer per node: local rank 0)."""

    def __init__(self, job_prefix: str, run_id: str | None, directory: str | os.PathLike[str] = DEFAULT_DIR,
                 node: str = ""):
        self.job_prefix = job_prefix
        self.run_id = run_id or ""
        self.directory = Path(directory)
        # The node's name too: the local cluster's "nodes" share one machine's /dev/shm.
        digest = hashlib.sha256(f"{job_prefix}\n{node}".encode()).hexdigest()[:24]
        self.paths = [self.directory / f"{digest}.{slot}.state" for slot in range(SLOTS)]
        self._maps: dict[int, mmap.mmap] = {}
        self._locked: dict[int, torch.device | None] = {}  # slot -> the device its mapping is page-locked for
        self.copies = PinnedCopies()  # a device's tensors on their way to the slot

    @classmethod
    def from_env(cls, job_prefix: str, environ: Mapping[str, str] | None = None) -> "MemoryTier | None":
        """The node's tier, or None if ``ELASTICTRAIN_MEMORY_TIER`` is off (it is on by default)."""
        env = os.environ if environ is None else environ
        if not enabled(env):
            return None
        return cls(job_prefix, env.get("TORCHELASTIC_RUN_ID"), env.get(launch.ENV_MEMORY_DIR) or DEFAULT_DIR,
                   node=env.get(launch.ENV_NODE_NAME, ""))

    # -- write ---------------------------------------------------------------------------
    def keep(self, step: int, world_size: int, tensors: dict[str, torch.Tensor]) -> int:
        """Replace this node's copy with ``tensors`` as the state of ``step``, at once; its checksum."""
        return self.commit(self.capture(step, world_size, tensors))

    def _layout(self, step: int, world_size: int, tensors: dict[str, torch.Tensor]) -> tuple[list[Entry], bytes, int]:
        """Where each tensor goes in a slot, the header that says so, and where the data ends."""
        entries: list[Entry] = []
        offset = DATA_START
        for key, tensor in tensors.items():
            nbytes = _nbytes(tensor)
            entries.append({"key": key, "dtype": str(tensor.dtype).removeprefix("torch."),
                            "shape": list(tensor.shape), "offset": offset, "nbytes": nbytes})
            offset = _aligned(offset + nbytes)
        header = json.dumps({
            "format": FORMAT, "job": self.job_prefix, "run": self.run_id, "step": step,
            "world_size": world_size, "replicated": True, "entries": entries,
        }, separators=(",", ":")).encode()
        return entries, header, offset

    def size(self, tensors: dict[str, torch.Tensor]) -> int:
        """The bytes a slot holds for ``tensors``."""
        _, header, end = self._layout(0, 0, tensors)
        return _reserved(end + len(header))

    def prepare(self, tensors: dict[str, torch.Tensor]) -> None:
        """Both slots made for ``tensors`` and, where they go through the device, page-locked for it: what the
        first capture into each slot does otherwise, on the training thread (for 19 GB: ~3 s to make a slot,
        ~6-10 s to page-lock it). No copy is written."""
        size = self.size(tensors)
        device = next((t.device for t in tensors.values() if self.copies.wanted(t)), None)
        for slot in range(SLOTS):
            mapped = self._map(slot, size)
            if device is not None:
                self._registered(slot, mapped, device)

    def capture(self, step: int, world_size: int, tensors: dict[str, torch.Tensor],
                aside: Callable[[torch.Tensor], bool] | None = None) -> Capture:
        """The training thread's part: the slot's commit word cleared, then the tensors copied into it.

        After this returns the live tensors may change (CUDA: the copies are queued on the current
        stream, ahead of anything the next step queues), except those ``aside`` names: they are copied on
        the copy stream, and must not change before ``Capture.aside`` (``PinnedCopies.wait_aside``).
        Call ``commit`` before the next ``capture``.
        """
        entries, header, offset = self._layout(step, world_size, tensors)
        slot = self._target(step)
        mapped = self._map(slot, _reserved(offset + len(header)))
        mapped[_COMMIT_AT:_COMMIT_AT + 8] = bytes(8)  # from here on this slot is no copy, until its commit
        capture = Capture(slot=slot, step=step, world_size=world_size, header=header, end=offset)
        started: set[torch.device] = set()  # the devices whose copy stream waits for the current one
        direct: bool | None = None  # the slot page-locked for the device: its copies straight into it
        for entry, tensor in zip(entries, tensors.values()):
            if not entry["nbytes"]:
                continue
            source = tensor.detach()
            target = torch.frombuffer(mapped, dtype=torch.uint8, count=entry["nbytes"], offset=entry["offset"])
            if self.copies.wanted(source):
                beside = aside is not None and aside(tensor)
                if beside and source.device not in started:
                    self.copies.start_aside(source.device)
                    started.add(source.device)
                if direct is None:
                    direct = self._registered(slot, mapped, source.device)
                if direct:
                    self.copies.copy(target.view(source.dtype).view(source.shape), source, beside)
                else:
                    capture.pending.append((target, self.copies.queue(entry["key"], source, beside)))
            else:
                target.view(source.dtype).view(source.shape).copy_(source)
        if direct is not None:  # device tensors were copied
            capture.events.append(self.copies.recorded())
            for device in started:  # one device in practice: a worker trains on its own GPU
                capture.aside = self.copies.recorded(device)
                capture.events.append(capture.aside)
        return capture

    def commit(self, capture: Capture) -> int:
        """The background part: device copies landed, header and checksum written, then the commit word;
        the checksum."""
        mapped = self._maps[capture.slot]
        for event in capture.events:
            event.synchronize()
        # The pinned buffers into the slot, in pieces across threads (each copy_ leaves the GIL).
        pieces = [(target[lo:lo + CHUNK], flat[lo:lo + CHUNK]) for target, pinned in capture.pending
                  for flat in [pinned.reshape(-1).view(torch.uint8)] for lo in range(0, flat.numel(), CHUNK)]
        list(_threads().map(lambda piece: piece[0].copy_(piece[1]), pieces))
        del pieces
        capture.pending.clear()  # drop the views into the mapping
        header = capture.header
        mapped[capture.end:capture.end + len(header)] = header
        crc = _checksum(memoryview(mapped)[DATA_START:capture.end + len(header)])
        preamble = _PREAMBLE.pack(MAGIC, 0, capture.end, len(header), crc)
        mapped[:len(preamble)] = preamble
        # Last, one aligned 8-byte store: the copy exists from here on (steps count from 0, hence + 1).
        mapped[_COMMIT_AT:_COMMIT_AT + 8] = struct.pack("<Q", capture.step + 1)
        return crc

    def _registered(self, slot: int, mapped: mmap.mmap, device: torch.device) -> bool:
        """Whether ``slot``'s mapping is page-locked for ``device``; tried once per mapping."""
        if slot not in self._locked:
            self._locked[slot] = device if self.copies.register(mapped, device) else None
        return self._locked[slot] is not None

    def _release(self, slot: int, mapped: mmap.mmap) -> None:
        """``slot``'s old mapping unlocked (the device no longer copies into it) and closed."""
        device = self._locked.pop(slot, None)
        if device is not None:
            self.copies.unregister(mapped, device)
        try:
            mapped.close()
        except BufferError:  # a tensor still views it; it is unmapped when that goes
            pass

    def _target(self, step: int) -> int:
        """The slot to write: not the one holding the newest committed copy. A slot at ``step`` or past it
        (a history a restore abandoned) is cleared: it must never win over the copy being written."""
        found = {slot: self._peek(slot) for slot in range(SLOTS)}
        newest = max(found, key=lambda s: _step_or(found[s], -1))
        target = (newest + 1) % SLOTS if found[newest] is not None else 0
        for slot, held in found.items():
            if slot != target and held is not None and held >= step:
                self._map(slot, DATA_START)[_COMMIT_AT:_COMMIT_AT + 8] = bytes(8)
        return target

    def _peek(self, slot: int) -> int | None:
        """The step a slot's commit word says it holds (unchecked: only to choose where to write)."""
        try:
            with open(self.paths[slot], "rb") as file:
                head = file.read(_PREAMBLE.size)
        except OSError:
            return None
        if len(head) < _PREAMBLE.size:
            return None
        magic, commit, *_ = _PREAMBLE.unpack(head)
        return commit - 1 if magic == MAGIC and commit else None

    def _map(self, slot: int, size: int) -> mmap.mmap:
        """The slot's file mapped shared, at least ``size`` bytes long."""
        mapped = self._maps.get(slot)
        if mapped is not None and len(mapped) >= size and os.path.exists(self.paths[slot]):
            return mapped
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.paths[slot], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            length = max(os.fstat(fd).st_size, size)
            # Reserve the pages now: a write through the mapping to a full tmpfs (a pod's sizeLimit, a small
            # /dev/shm) would kill the worker with SIGBUS; here it is an OSError (ENOSPC) the caller handles.
            os.posix_fallocate(fd, 0, length)
            mapped = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        old = self._maps.pop(slot, None)
        if old is not None:
            self._release(slot, old)
        self._maps[slot] = mapped
        return mapped

    def discard(self) -> None:
        for slot in list(self._maps):
            self._release(slot, self._maps.pop(slot))
        for path in self.paths:
            path.unlink(missing_ok=True)

    # -- read ----------------------------------------------------------------------------
    def read(self) -> MemoryCopy | None:
        """This node's newest copy that is committed, whole, of this job and run, and replicated; else None
        (and why, logged)."""
        # Newest commit word first: the older slot is checked (a checksum over the whole state) only if it fails.
        peeked = {slot: self._peek(slot) for slot in range(SLOTS)}
        for slot in sorted((s for s in peeked if peeked[s] is not None), key=lambda s: -_step_or(peeked[s], -1)):
            copy = self._read_slot(self.paths[slot])
            if copy is not None:
                return copy
        return None

    def newest_path(self) -> Path | None:
        """The slot file holding the newest copy ``read`` would return."""
        copy = self.read()
        return copy.path if copy else None

    def _read_slot(self, path: Path) -> MemoryCopy | None:
        try:
            # Mapped, not read: a private copy-on-write view of the shared-memory pages, no 100s-of-MiB copy.
            with open(path, "rb") as file:
                raw: Any = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as ex:  # unreadable (or empty) is as good as absent: blob stands
            log.warning("cannot read the in-memory state at %s: %s", path, ex)
            return None
        try:
            copy = self.parse(raw)
        except ValueError as ex:
            if str(ex) != "not committed":
                log.warning("ignoring the in-memory state at %s: %s", path, ex)
            return None
        copy.path = path
        return copy

    def parse(self, raw: Any) -> MemoryCopy:
        """The copy in ``raw`` (a slot's bytes, or a peer's); ValueError if it is not committed, whole and ours."""
        try:
            return self._parse(raw)
        except (KeyError, TypeError, struct.error) as ex:
            raise ValueError(f"malformed: {ex}") from ex

    def _parse(self, raw: Any) -> MemoryCopy:
        if len(raw) < DATA_START or bytes(raw[:len(MAGIC)]) != MAGIC:
            raise ValueError("not a state written by this runtime")
        _, commit, header_at, header_len, crc = _PREAMBLE.unpack_from(raw, 0)
        if not commit:
            raise ValueError("not committed")
        end = header_at + header_len
        if header_at < DATA_START or end > len(raw):
            raise ValueError("its header runs past the end")
        if _checksum(memoryview(raw)[DATA_START:end]) != crc:
            raise ValueError("checksum mismatch (corrupted)")
        header = json.loads(bytes(raw[header_at:end]))
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}, expected {FORMAT}")
        if header.get("job") != self.job_prefix:
            raise ValueError("it belongs to another job")
        if header.get("run") != self.run_id:
            raise ValueError(f"it is from another run of this job ({header.get('run')!r}, now {self.run_id!r})")
        if header.get("replicated") is not True:
            raise ValueError("it is not a replicated state")
        if int(header["step"]) + 1 != commit:
            raise ValueError("its commit word is not its header's step")
        tensors: dict[str, torch.Tensor] = {}
        for entry in header["entries"]:
            lo = int(entry["offset"])
            hi = lo + int(entry["nbytes"])
            if lo < DATA_START or hi > header_at:
                raise ValueError(f"entry {entry['key']!r} lies outside the data")
            flat = torch.frombuffer(raw, dtype=torch.uint8, count=hi - lo, offset=lo) if hi > lo \
                else torch.empty(0, dtype=torch.uint8)
            tensors[entry["key"]] = flat.view(_dtype(entry["dtype"])).reshape(entry["shape"])
        return MemoryCopy(step=int(header["step"]), checksum=crc, world_size=int(header["world_size"]),
                          tensors=tensors, raw=raw)


class MemoryStateReader(StorageReader):
    """A DCP StorageReader over tensors in memory, so a memory restore runs the same
    CheckingLoadPlanner (and its "every key loaded" proof) as a blob restore."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint.metadata import (
            ChunkStorageMetadata, Metadata, TensorProperties, TensorStorageMetadata,
        )

        return Metadata(state_dict_metadata={
            key: TensorStorageMetadata(
                properties=TensorProperties(dtype=t.dtype), size=t.size(),
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * t.dim()), sizes=t.size())],
            ) for key, t in self.tensors.items()
        })

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        from torch.futures import Future

        for item in plan.items:
            source = self.tensors[item.storage_index.fqn]
            for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                source = source.narrow(dim, offset, length)
            target = planner.resolve_tensor(item).detach()
            target.copy_(source)
            planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True
