"""The one place that talks to blob storage (Azure, or Azurite locally).

A handful of primitives over one container, shaped for checkpoints:

* ``list`` — names, sizes and recorded checksums under a prefix (one listing serves a
  whole catalog);
* ``create`` / ``open_writer`` — conditional writes (``If-None-Match: *``): a
  blob is written once and never overwritten, which is what fences two
  trainings that write the same job. Large files stream as parallel blocks
  that only become visible when the block list is committed, so a writer
  killed mid-way leaves nothing a reader could see;
* ``download`` — parallel ranged reads into one buffer, each range hashed by
  the thread that fetched it, so verification overlaps the transfer;
* ``append`` — lines to an append blob (the job's event log);
* ``delete``.

azure-storage-blob is imported lazily: the CLI loads this module only when a
command runs, and the runtime only inside training processes.
"""
from __future__ import annotations

import base64
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

from azext_elastictrain.core.launch import ENV_CHECKPOINT_URL

BLOCK_SIZE = 8 * 1024 * 1024
CONCURRENCY = 8
# Bytes of blocks staged but not yet uploaded, across all writers of a store:
# bounds memory while keeping every upload thread busy.
MAX_BUFFERED = 2 * CONCURRENCY * BLOCK_SIZE
# Blob metadata key holding the checksum (see ``checksum``); listings return it.
CHECKSUM_METADATA = "sha256blocks"


class StoreError(RuntimeError):
    """Blob storage refused or failed an operation."""


class AccessDenied(StoreError):
    """Blob storage refused the caller (403): on Azure with Entra ID, no data role on the container (Owner and
    Contributor of the subscription have no data actions). ``grant``: the command that gives the missing role, where
    the caller knows it."""

    def __init__(self, message: str, code: str = "", grant: str | None = None) -> None:
        super().__init__(message)
        self.code, self.grant = code, grant


class WriteConflict(StoreError):
    """The blob already exists: someone else wrote it first (fencing)."""


class NotFound(StoreError):
    """The blob does not exist."""


class IntegrityError(StoreError):
    """Bytes read back do not match their recorded size or checksum."""


@dataclass(frozen=True)
class BlobEntry:
    name: str
    size: int
    sha256: str | None  # the checksum its writer recorded in the blob's metadata
    last_modified: float


@dataclass(frozen=True)
class Location:
    """A container plus a prefix inside it, parsed from a URL."""

    account_url: str
    container: str
    prefix: str

    @property
    def url(self) -> str:
        return "/".join(p for p in (self.account_url, self.container, self.prefix) if p)


def parse_location(url: str, connection_string: str | None = None) -> Location:
    """Split ``<account url>/<container>/<prefix...>``.

    Azure URLs name the account in the host; Azurite (and any URL under a
    connection string's BlobEndpoint) names it in the first path segment.
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"not a blob URL: {url!r} "
                         "(expected https://<account>.blob.core.windows.net/<container>/<prefix>)")
    base = f"{parsed.scheme}://{parsed.netloc}"
    path = parsed.path.strip("/")
    endpoint = _connection_string_endpoint(connection_string) if connection_string else None
    if endpoint and (url.rstrip("/") + "/").startswith(endpoint.rstrip("/") + "/"):
        base = endpoint.rstrip("/")
        path = url.rstrip("/")[len(base):].strip("/")
    elif _is_ip_or_localhost(parsed.hostname or ""):
        account, _, path = path.partition("/")
        base = f"{base}/{account}"
    container, _, prefix = path.partition("/")
    if not container:
        raise ValueError(f"blob URL {url!r} names no container")
    return Location(account_url=base, container=container, prefix=prefix.strip("/"))


def account_name(account_url: str) -> str:
    """The storage account of an account URL: the host's first label, or Azurite's first path segment."""
    parsed = urlparse(account_url)
    if _is_ip_or_localhost(parsed.hostname or ""):
        return parsed.path.strip("/").partition("/")[0]
    return (parsed.hostname or "").partition(".")[0]


def foreign_account(url: str, connection_string: str) -> tuple[str, str] | None:
    """(the URL's account, the connection string's) where they differ, else None.

    The SDK opens the connection string's account with the URL's container and prefix, so a URL of another
    account would be read, or pruned, in the wrong place.
    """
    endpoint = _connection_string_endpoint(connection_string)
    if endpoint is None or (url.rstrip("/") + "/").lower().startswith(endpoint.rstrip("/").lower() + "/"):
        return None
    return account_name(parse_location(url).account_url), account_name(endpoint)


def _is_ip_or_localhost(host: str) -> bool:
    return host == "localhost" or host.replace(".", "").isdigit() or ":" in host


def _total_size(content_range: str | None, default: int) -> int:
    """The blob's full size from a ranged response's ``Content-Range: bytes a-b/total``."""
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return default


def _connection_string_endpoint(connection_string: str) -> str | None:
    parts = dict(
        p.split("=", 1) for p in connection_string.split(";") if "=" in p
    )
    if "BlobEndpoint" in parts:
        return parts["BlobEndpoint"]
    if parts.get("UseDevelopmentStorage", "").lower() == "true":  # the SDK's fixed Azurite account
        return "http://127.0.0.1:10000/devstoreaccount1"
    if "AccountName" in parts:
        protocol = parts.get("DefaultEndpointsProtocol", "https")
        suffix = parts.get("EndpointSuffix", "core.windows.net")  # the format's default; other clouds name theirs
        return f"{protocol}://{parts['AccountName']}.blob.{suffix}"
    return None


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def block_digest(data: Any) -> bytes:
    return hashlib.sha256(data).digest()


def combine(digests: list[bytes]) -> str:
    """The file checksum from its blocks' digests: base64 SHA-256 of their concatenation.

    Hashing blocks independently lets the threads that upload or download
    them hash in parallel (hashlib releases the GIL), where one running hash
    over the whole file would be a serial pass.
    """
    return _b64(hashlib.sha256(b"".join(digests)).digest())


def checksum(data: Any) -> str:
    """Checksum of ``data`` cut into BLOCK_SIZE blocks (an empty file is one empty block)."""
    view = memoryview(data).cast("B")
    offsets = range(0, len(view), BLOCK_SIZE) if len(view) else [0]
    return combine([block_digest(view[o:o + BLOCK_SIZE]) for o in offsets])


def _translate(ex: Exception, name: str) -> Exception:
    from azure.core.exceptions import (
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ResourceNotFoundError,
    )

    if isinstance(ex, (ResourceExistsError, ResourceModifiedError)):
        return WriteConflict(f"{name} already exists (written by another writer)")
    if isinstance(ex, ResourceNotFoundError):
        return NotFound(f"{name} does not exist")
    if isinstance(ex, HttpResponseError) and ex.status_code == 403:
        code = str(getattr(ex, "error_code", None) or "")
        return AccessDenied(f"blob storage refused access to {name} (403{' ' + code if code else ''})", code)
    if isinstance(ex, HttpResponseError):
        return StoreError(f"blob storage failed on {name}: {ex.reason or ex.status_code}")
    return ex


class BlobStore:
    """Blob primitives under one container. Thread-safe; share one per process."""

    def __init__(self, container_client: Any, prefix: str = "", concurrency: int = CONCURRENCY):
        self._container = container_client
        self.prefix = prefix
        self.concurrency = concurrency
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="blob")
        self._buffered = threading.BoundedSemaphore(max(1, MAX_BUFFERED // BLOCK_SIZE))

    # -- construction -------------------------------------------------------
    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connection_string: str | None = None,
        credential: Any = None,
        concurrency: int = CONCURRENCY,
        quick_retries: bool = False,
    ) -> "BlobStore":
        """Open the container of ``url``; its path after the container is ``prefix``.

        Authentication: a connection string (Azurite, development) when given,
        else ``credential``, else ``DefaultAzureCredential`` (workload identity
        on AKS). Keys never leave this function.
        """
        from azure.storage.blob import ContainerClient

        location = parse_location(url, connection_string)
        options: dict[str, Any] = {"max_single_put_size": BLOCK_SIZE, "max_block_size": BLOCK_SIZE}
        if quick_retries:
            # An interactive command should fail in seconds, not after the SDK's
            # 15 s-based exponential backoff meant for long-running jobs.
            options.update(retry_total=2, initial_backoff=1, increment_base=2)
        if connection_string:
            client = ContainerClient.from_connection_string(
                connection_string, location.container, **options
            )
        else:
            if urlparse(url).scheme != "https":
                raise ValueError(
                    f"{url} is not HTTPS: Azure storage needs https://<account>.blob.core.windows.net/...; "
                    "a local Azurite URL needs AZURE_STORAGE_CONNECTION_STRING"
                )
            if credential is None:
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential()
            client = ContainerClient(
                location.account_url, location.container, credential=credential, **options
            )
        return cls(client, location.prefix, concurrency)

    @classmethod
    def from_env(cls, url: str | None = None, environ: Mapping[str, str] | None = None) -> "BlobStore":
        env = os.environ if environ is None else environ
        url = url or env.get(ENV_CHECKPOINT_URL)
        if not url:
            raise ValueError("set ELASTICTRAIN_CHECKPOINT_URL to the blob URL of the job")
        return cls.from_url(url, connection_string=env.get("AZURE_STORAGE_CONNECTION_STRING") or None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._container.close()

    # -- reads --------------------------------------------------------------
    def list(self, prefix: str) -> list[BlobEntry]:
        try:
            return [
                BlobEntry(
                    name=b.name,
                    size=int(b.size),
                    sha256=(b.metadata or {}).get(CHECKSUM_METADATA),
                    last_modified=b.last_modified.timestamp() if b.last_modified else 0.0,
                )
                for b in self._container.list_blobs(name_starts_with=prefix, include=["metadata"])
            ]
        except Exception as ex:  # noqa: BLE001 - translated at this boundary
            raise _translate(ex, prefix) from ex

    def read(self, name: str) -> bytes:
        """A small blob, whole (manifests, metadata)."""
        try:
            data: bytes = self._container.download_blob(name).readall()
            return data
        except Exception as ex:  # noqa: BLE001
            raise _translate(ex, name) from ex

    def download(self, name: str, size: int, sha256: str | None = None) -> memoryview:
        """A blob of known ``size`` in parallel ranges; checks its size and, if given, checksum.

        Ranges are the checksum's blocks: each fetching thread hashes its own
        range, so verifying costs a fraction of a pass over the bytes.
        """
        buffer = bytearray(size)
        view = memoryview(buffer)
        ranges = [(o, min(BLOCK_SIZE, size - o)) for o in range(0, size, BLOCK_SIZE)] or [(0, 0)]
        blob = self._container.get_blob_client(name)

        def fetch(offset: int, length: int) -> bytes | None:
            if length == 0:
                stored = blob.get_blob_properties().size
            else:
                downloader = blob.download_blob(offset=offset, length=length)
                got = downloader.readinto(_ViewWriter(view[offset:offset + length]))
                if got != length:
                    raise IntegrityError(f"{name}: short read at {offset} ({got} of {length} bytes)")
                stored = _total_size(downloader.properties.content_range, default=size)
            if stored != size:
                raise IntegrityError(f"{name}: {stored} bytes stored, expected {size}")
            return block_digest(view[offset:offset + length]) if sha256 else None

        try:
            digests = [f.result() for f in [self._pool.submit(fetch, o, n) for o, n in ranges]]
        except IntegrityError:
            raise
        except Exception as ex:  # noqa: BLE001
            raise _translate(ex, name) from ex
        if sha256 and combine(digests) != sha256:  # type: ignore[arg-type]
            raise IntegrityError(f"{name}: checksum mismatch (damaged or replaced)")
        return view

    # -- writes -------------------------------------------------------------
    def create(self, name: str, data: bytes, *, content_type: str | None = None) -> str:
        """Write a small blob once (fails with WriteConflict if it exists). Returns its checksum."""
        from azure.storage.blob import ContentSettings

        digest = checksum(data)
        try:
            self._container.upload_blob(
                name, data, overwrite=False, metadata={CHECKSUM_METADATA: digest},
                content_settings=ContentSettings(content_type=content_type) if content_type else None,
            )
        except Exception as ex:  # noqa: BLE001
            raise _translate(ex, name) from ex
        return digest

    def open_writer(self, name: str) -> "BlobWriter":
        return BlobWriter(self, name)

    def append(self, name: str, data: bytes) -> None:
        """Append to an append blob, creating it on first use."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        blob = self._container.get_blob_client(name)
        try:
            try:
                blob.append_block(data)
            except ResourceNotFoundError:
                try:
                    blob.create_append_blob(if_none_match="*")
                except AzureError as ex:  # created concurrently is fine
                    if not isinstance(_translate(ex, name), WriteConflict):
                        raise
                blob.append_block(data)
        except Exception as ex:  # noqa: BLE001
            raise _translate(ex, name) from ex

    def delete(self, names: Sequence[str]) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        def remove(name: str) -> None:
            try:
                self._container.delete_blob(name)
            except ResourceNotFoundError:
                pass

        for fut in [self._pool.submit(remove, n) for n in names]:
            try:
                fut.result()
            except Exception as ex:  # noqa: BLE001
                raise _translate(ex, "delete") from ex

    # -- used by BlobWriter ---------------------------------------------------
    def submit_block(self, fn: Callable[[], None]) -> Future[Any]:
        self._buffered.acquire()  # pylint: disable=consider-using-with  # released when the block is uploaded
        fut = self._pool.submit(fn)
        fut.add_done_callback(lambda _: self._buffered.release())
        return fut

    def _blob(self, name: str) -> Any:
        return self._container.get_blob_client(name)


class _ViewWriter:
    """A write-only stream into a fixed memoryview (the downloader writes to streams)."""

    def __init__(self, view: memoryview):
        self._view = view
        self._pos = 0

    def write(self, data: Any) -> int:
        chunk = memoryview(data).cast("B")
        end = self._pos + chunk.nbytes
        if end > len(self._view):
            raise IntegrityError("blob is larger than its recorded size")
        self._view[self._pos:end] = chunk
        self._pos = end
        return chunk.nbytes

    def seekable(self) -> bool:
        return False


class BlobWriter:  # pylint: disable=too-many-instance-attributes  # one upload's state
    """A write-once, file-like stream onto one block blob.

    Bytes are cut into blocks that are hashed and uploaded in parallel while
    the caller keeps writing; nothing is visible until ``close`` commits the
    block list with ``If-None-Match: *`` and the checksum in the blob's
    metadata. A writer that is killed or ``abort``-ed leaves no blob behind.
    """

    def __init__(self, store: BlobStore, name: str):
        self._store = store
        self.name = name
        self._blob = store._blob(name)
        # Block ids are per writer: two writers racing on one name must not
        # stage over each other's uncommitted blocks.
        self._token = os.urandom(6).hex()
        self._buffer = bytearray()
        self._size = 0
        self._block_ids: list[str] = []
        self._digests: list[bytes | None] = []
        self._futures: list[Future[Any]] = []
        self.closed = False
        self.sha256: str | None = None

    # file-like surface used by torch.save and DCP
    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        self._size += n
        pos = 0
        if self._buffer:  # top up the partial block first
            pos = min(n, BLOCK_SIZE - len(self._buffer))
            self._buffer += view[:pos]
            if len(self._buffer) == BLOCK_SIZE:
                self._stage(bytes(self._buffer))
                self._buffer = bytearray()
        # Tensors arrive in one large write: cut blocks straight from it (one copy).
        while n - pos >= BLOCK_SIZE:
            self._stage(bytes(view[pos:pos + BLOCK_SIZE]))
            pos += BLOCK_SIZE
        if pos < n:
            self._buffer += view[pos:]
        return n

    def _stage(self, chunk: bytes) -> None:
        index = len(self._block_ids)
        block_id = base64.b64encode(f"{self._token}-{index:08d}".encode()).decode()
        self._block_ids.append(block_id)
        self._digests.append(None)

        def upload() -> None:
            self._digests[index] = block_digest(chunk)
            self._blob.stage_block(block_id, chunk, length=len(chunk))

        self._futures.append(self._store.submit_block(upload))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        from azure.core import MatchConditions
        from azure.storage.blob import BlobBlock

        try:
            if not self._block_ids:
                # Small file: one conditional PUT.
                data = bytes(self._buffer)
                digest = combine([block_digest(data)])
                self._blob.upload_blob(data, overwrite=False, metadata={CHECKSUM_METADATA: digest})
            else:
                if self._buffer:
                    self._stage(bytes(self._buffer))
                for fut in self._futures:
                    fut.result()
                digest = combine(self._digests)  # type: ignore[arg-type]
                self._blob.commit_block_list(
                    [BlobBlock(block_id=b) for b in self._block_ids],
                    metadata={CHECKSUM_METADATA: digest},
                    match_condition=MatchConditions.IfMissing,
                )
        except Exception as ex:  # noqa: BLE001
            raise _translate(ex, self.name) from ex
        finally:
            self._buffer = bytearray()
        self.sha256 = digest

    def abort(self) -> None:
        """Drop what was staged; uncommitted blocks expire on their own."""
        self.closed = True
        for fut in self._futures:
            fut.cancel()
        self._buffer = bytearray()

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def iter_lines(data: bytes) -> Iterator[bytes]:
    for line in data.splitlines():
        if line.strip():
            yield line
