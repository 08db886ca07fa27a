"""BlobStore against a real Azurite: write-once blobs, streamed block uploads, verified reads."""
from __future__ import annotations

import base64
import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from azext_elastictrain.core import blobstore
from azext_elastictrain.core.blobstore import (
    BLOCK_SIZE,
    BlobStore,
    IntegrityError,
    Location,
    NotFound,
    StoreError,
    WriteConflict,
    parse_location,
)
from harness import services as svc

MiB = 1024 * 1024
AZURE_CS = (
    "DefaultEndpointsProtocol=https;AccountName=myacct;"
    "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;EndpointSuffix=core.windows.net"  # Azurite's public key
)


def sha256_blocks(data: bytes) -> str:
    """The documented checksum, computed independently: SHA-256 over the SHA-256s of 8 MiB blocks."""
    blocks = [data[o:o + 8 * MiB] for o in range(0, len(data), 8 * MiB)] or [b""]
    return base64.b64encode(hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in blocks)).digest()).decode()


@pytest.fixture
def store(blob_store) -> BlobStore:
    return blob_store("job")


def _entry(store: BlobStore, name: str):
    found = [e for e in store.list(name) if e.name == name]
    return found[0] if found else None


# --------------------------------------------------------------------------- parse_location


@pytest.mark.parametrize(
    "url, expected",
    [
        (
            "https://myacct.blob.core.windows.net/ckpts/team/job-1",
            Location("https://myacct.blob.core.windows.net", "ckpts", "team/job-1"),
        ),
        (
            "https://myacct.blob.core.windows.net/ckpts/job/",
            Location("https://myacct.blob.core.windows.net", "ckpts", "job"),
        ),
        ("https://myacct.blob.core.windows.net/ckpts", Location("https://myacct.blob.core.windows.net", "ckpts", "")),
        ("https://myacct.blob.core.windows.net/ckpts/", Location("https://myacct.blob.core.windows.net", "ckpts", "")),
        (
            "https://myacct.blob.core.chinacloudapi.cn/c/a/b/c",
            Location("https://myacct.blob.core.chinacloudapi.cn", "c", "a/b/c"),
        ),
    ],
)
def test_parse_location_of_azure_urls_takes_the_account_from_the_host(url: str, expected: Location) -> None:
    assert parse_location(url) == expected


@pytest.mark.parametrize(
    "url, expected",
    [
        (
            "http://127.0.0.1:10000/devstoreaccount1/ckpts/job",
            Location("http://127.0.0.1:10000/devstoreaccount1", "ckpts", "job"),
        ),
        (
            "http://localhost:10000/devstoreaccount1/ckpts/a/b/",
            Location("http://localhost:10000/devstoreaccount1", "ckpts", "a/b"),
        ),
        (
            "http://127.0.0.1:10000/devstoreaccount1/ckpts",
            Location("http://127.0.0.1:10000/devstoreaccount1", "ckpts", ""),
        ),
        ("http://[::1]:10000/acct/ckpts/job", Location("http://[::1]:10000/acct", "ckpts", "job")),
    ],
)
def test_parse_location_of_azurite_urls_takes_the_account_from_the_path(url: str, expected: Location) -> None:
    assert parse_location(url) == expected


def test_parse_location_under_a_connection_strings_blob_endpoint(azurite: svc.AzuriteService) -> None:
    url = f"{azurite.blob_endpoint}/ckpts/team/job"
    loc = parse_location(url, azurite.connection_string)
    assert loc == Location(azurite.blob_endpoint, "ckpts", "team/job")
    assert loc.url == url
    # the endpoint of a connection string may itself carry a path (a proxy, a custom domain)
    cs = "BlobEndpoint=https://proxy.example.com/storage/acct;SharedAccessSignature=sv=x"
    assert parse_location("https://proxy.example.com/storage/acct/ckpts/job", cs) == Location(
        "https://proxy.example.com/storage/acct", "ckpts", "job"
    )


def test_parse_location_with_an_account_name_connection_string() -> None:
    loc = parse_location("https://myacct.blob.core.windows.net/ckpts/job", AZURE_CS)
    assert loc == Location("https://myacct.blob.core.windows.net", "ckpts", "job")


def test_parse_location_with_and_without_a_connection_string_agree_for_azurite(azurite: svc.AzuriteService) -> None:
    url = f"{azurite.blob_endpoint}/ckpts/job"
    assert parse_location(url) == parse_location(url, azurite.connection_string)


def test_parse_location_matches_the_connection_string_endpoint_on_a_path_boundary() -> None:
    # The connection string is for devstoreaccount1; a URL of devstoreaccount10 is not under it.
    cs = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1"
    loc = parse_location("http://127.0.0.1:10000/devstoreaccount10/ckpts/job", cs)
    assert (loc.container, loc.prefix) == ("ckpts", "job")


@pytest.mark.parametrize(
    "url",
    ["", "ckpts/job", "/ckpts/job", "myacct.blob.core.windows.net/ckpts", "ftp://host/ckpts/job",
     "file://server/share/ckpts", "https:///ckpts/job", "https://"],
)
def test_parse_location_rejects_what_is_not_a_blob_url(url: str) -> None:
    with pytest.raises(ValueError):
        parse_location(url)


@pytest.mark.parametrize(
    "url",
    ["https://myacct.blob.core.windows.net", "https://myacct.blob.core.windows.net/",
     "http://127.0.0.1:10000/devstoreaccount1", "http://127.0.0.1:10000/devstoreaccount1/",
     "http://127.0.0.1:10000/"],
)
def test_parse_location_rejects_a_url_without_a_container(url: str) -> None:
    with pytest.raises(ValueError, match="container"):
        parse_location(url)


def test_parse_location_rejects_a_url_without_a_container_under_a_connection_string(
    azurite: svc.AzuriteService,
) -> None:
    with pytest.raises(ValueError, match="container"):
        parse_location(azurite.blob_endpoint, azurite.connection_string)
    with pytest.raises(ValueError, match="container"):
        parse_location(azurite.blob_endpoint + "/", azurite.connection_string)


def test_from_url_opens_the_named_container_and_prefix(azurite: svc.AzuriteService, container_url: str) -> None:
    s = BlobStore.from_url(container_url + "/team/job-1/", connection_string=azurite.connection_string)
    try:
        assert s.prefix == "team/job-1"
        s.create("team/job-1/hello", b"hi")
    finally:
        s.close()
    container = container_url.rsplit("/", 1)[1]
    client = azurite.blob_service_client()
    try:
        assert [b.name for b in client.get_container_client(container).list_blobs()] == ["team/job-1/hello"]
    finally:
        client.close()


def test_from_env_reads_the_checkpoint_url_and_connection_string(azurite: svc.AzuriteService, container_url: str) -> None:
    env = {"ELASTICTRAIN_CHECKPOINT_URL": container_url + "/job", "AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    s = BlobStore.from_env(environ=env)
    try:
        assert s.prefix == "job"
        s.create("job/x", b"1")
        assert s.read("job/x") == b"1"
    finally:
        s.close()
    with pytest.raises(ValueError):
        BlobStore.from_env(environ={})


# --------------------------------------------------------------------------- create


def test_create_writes_a_small_blob_with_its_checksum(store: BlobStore) -> None:
    data = b'{"hello": "world"}'
    digest = store.create("job/small.json", data, content_type="application/json")
    assert digest == sha256_blocks(data)
    assert store.read("job/small.json") == data
    entry = _entry(store, "job/small.json")
    assert (entry.size, entry.sha256) == (len(data), digest)


def test_create_is_write_once(store: BlobStore) -> None:
    store.create("job/once", b"first")
    with pytest.raises(WriteConflict):
        store.create("job/once", b"second")
    with pytest.raises(WriteConflict):
        store.create("job/once", b"first")  # even the same bytes: a blob is never rewritten
    assert store.read("job/once") == b"first"


def test_read_of_a_missing_blob_raises_not_found(store: BlobStore) -> None:
    with pytest.raises(NotFound):
        store.read("job/nope")


# --------------------------------------------------------------------------- open_writer


def _odd_chunks(data: bytes, rng: random.Random):
    pos = 0
    while pos < len(data):
        n = rng.choice([0, 1, 7, 4093, 65537, rng.randrange(1, 3 * MiB), BLOCK_SIZE - 1, BLOCK_SIZE + 3])
        yield data[pos:pos + n]
        pos += n


def test_writer_streams_a_multi_block_file_that_downloads_intact(store: BlobStore) -> None:
    rng = random.Random(20240601)
    data = rng.randbytes(20 * MiB + 12345)
    writer = store.open_writer("job/big.bin")
    for chunk in _odd_chunks(data, rng):
        # mix bytes, bytearrays and memoryviews, as torch.save and DCP do
        kind = rng.randrange(3)
        assert writer.write(chunk if kind == 0 else bytearray(chunk) if kind == 1 else memoryview(chunk)) == len(chunk)
    assert writer.tell() == len(data)
    assert len(writer._block_ids) >= 2  # it really went the block path
    writer.close()
    assert writer.sha256 == sha256_blocks(data)

    entry = _entry(store, "job/big.bin")
    assert entry.size == len(data)
    assert entry.sha256 == sha256_blocks(data)
    got = store.download("job/big.bin", entry.size, entry.sha256)
    assert bytes(got) == data


def test_writer_of_a_small_file_round_trips(store: BlobStore) -> None:
    data = os.urandom(1000)
    with store.open_writer("job/small.bin") as w:
        w.write(data[:10])
        w.write(data[10:])
    assert w.sha256 == sha256_blocks(data)
    entry = _entry(store, "job/small.bin")
    assert (entry.size, entry.sha256) == (len(data), sha256_blocks(data))
    assert bytes(store.download("job/small.bin", len(data), entry.sha256)) == data


def test_writer_of_an_empty_file_round_trips(store: BlobStore) -> None:
    with store.open_writer("job/empty"):
        pass
    assert _entry(store, "job/empty").size == 0
    assert bytes(store.download("job/empty", 0, sha256_blocks(b""))) == b""


def test_writer_of_exactly_one_block_round_trips(store: BlobStore) -> None:
    data = os.urandom(BLOCK_SIZE)
    with store.open_writer("job/one-block") as w:
        w.write(data)
    entry = _entry(store, "job/one-block")
    assert (entry.size, entry.sha256) == (len(data), sha256_blocks(data))
    assert bytes(store.download("job/one-block", len(data), entry.sha256)) == data


def test_aborted_writer_leaves_no_blob(store: BlobStore) -> None:
    writer = store.open_writer("job/aborted.bin")
    writer.write(os.urandom(20 * MiB))
    for fut in writer._futures:  # blocks are staged on the service...
        fut.result()
    writer.abort()
    assert _entry(store, "job/aborted.bin") is None  # ...but never committed
    with pytest.raises(NotFound):
        store.read("job/aborted.bin")


def test_writer_leaving_a_with_block_by_exception_leaves_no_blob(store: BlobStore) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with store.open_writer("job/failed.bin") as w:
            w.write(os.urandom(9 * MiB))
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        with store.open_writer("job/failed-small.bin") as w:
            w.write(b"x" * 100)
            raise RuntimeError("boom")
    assert store.list("job/") == []


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    from azext_elastictrain.core.blobstore import BlobStore
    store = BlobStore.from_url(os.environ["URL"], connection_string=os.environ["CS"])
    w = store.open_writer("job/killed.bin")
    w.write(os.urandom(20 * 1024 * 1024 + 5))
    for f in w._futures:
        f.result()
    print("staged", len(w._futures), flush=True)
    sys.stdin.read()  # wait to be killed
    w.close()
    """
)


def test_writer_killed_before_close_leaves_no_blob(
    store: BlobStore, azurite: svc.AzuriteService, container_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    env = dict(os.environ, URL=container_url, CS=azurite.connection_string,
               PYTHONPATH=os.pathsep.join([str(svc.REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=str(tmp_path))
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the writer process said nothing within 60s"
        line = proc.stdout.readline().decode()
        assert line.startswith("staged 2"), (line, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()
    blob = store._blob("job/killed.bin")
    committed, uncommitted = blob.get_block_list("all")
    assert committed == [] and len(uncommitted) >= 2  # the blocks did reach the service
    assert _entry(store, "job/killed.bin") is None
    with pytest.raises(NotFound):
        store.read("job/killed.bin")


def test_second_writer_of_the_same_name_conflicts_and_the_first_stays_intact(store: BlobStore) -> None:
    first, second = os.urandom(20 * MiB), os.urandom(20 * MiB)
    with store.open_writer("job/race.bin") as w1:
        w1.write(first)
    w2 = store.open_writer("job/race.bin")
    w2.write(second)
    with pytest.raises(WriteConflict):
        w2.close()
    entry = _entry(store, "job/race.bin")
    assert (entry.size, entry.sha256) == (len(first), sha256_blocks(first))
    assert bytes(store.download("job/race.bin", entry.size, entry.sha256)) == first


def test_concurrent_writers_of_the_same_name_never_mix_their_blocks(store: BlobStore) -> None:
    """Both stage their blocks, then the first commits and the second is refused.

    The committed blob must be exactly the first writer's bytes: the second
    writer's staged blocks must not end up inside it.
    """
    first, second = os.urandom(20 * MiB), os.urandom(20 * MiB)
    w1, w2 = store.open_writer("job/race.bin"), store.open_writer("job/race.bin")
    w1.write(first)
    for f in w1._futures:
        f.result()
    w2.write(second)
    for f in w2._futures:
        f.result()
    w1.close()
    with pytest.raises(WriteConflict):
        w2.close()
    entry = _entry(store, "job/race.bin")
    assert (entry.size, entry.sha256) == (len(first), sha256_blocks(first))
    stored = store._container.download_blob("job/race.bin").readall()
    assert hashlib.md5(stored).hexdigest() == hashlib.md5(first).hexdigest(), "committed blob mixes both writers' blocks"


def test_second_small_writer_of_the_same_name_conflicts(store: BlobStore) -> None:
    with store.open_writer("job/s") as w1:
        w1.write(b"one")
    w2 = store.open_writer("job/s")
    w2.write(b"two")
    with pytest.raises(WriteConflict):
        w2.close()
    assert store.read("job/s") == b"one"


def test_writer_cannot_overwrite_a_created_blob(store: BlobStore) -> None:
    store.create("job/x", b"created")
    w = store.open_writer("job/x")
    w.write(os.urandom(9 * MiB))
    with pytest.raises(WriteConflict):
        w.close()
    assert store.read("job/x") == b"created"


# --------------------------------------------------------------------------- download


@pytest.fixture
def stored(store: BlobStore) -> bytes:
    data = random.Random(7).randbytes(17 * MiB + 3)
    with store.open_writer("job/data.bin") as w:
        w.write(data)
    return data


def test_download_checks_the_checksum(store: BlobStore, stored: bytes) -> None:
    assert bytes(store.download("job/data.bin", len(stored), sha256_blocks(stored))) == stored
    with pytest.raises(IntegrityError):
        store.download("job/data.bin", len(stored), sha256_blocks(stored + b"x"))
    with pytest.raises(IntegrityError):
        store.download("job/data.bin", len(stored), sha256_blocks(b""))


def test_download_without_checksum_returns_the_bytes(store: BlobStore, stored: bytes) -> None:
    assert bytes(store.download("job/data.bin", len(stored))) == stored


@pytest.mark.parametrize("extra", [1, 100, BLOCK_SIZE])
def test_download_of_more_bytes_than_stored_raises(store: BlobStore, stored: bytes, extra: int) -> None:
    with pytest.raises(StoreError):
        store.download("job/data.bin", len(stored) + extra)
    with pytest.raises(StoreError):
        store.download("job/data.bin", len(stored) + extra, sha256_blocks(stored))


def test_download_of_fewer_bytes_than_stored_raises_with_checksum(store: BlobStore, stored: bytes) -> None:
    with pytest.raises(IntegrityError):
        store.download("job/data.bin", len(stored) - 1, sha256_blocks(stored))


@pytest.mark.parametrize("short", [1, BLOCK_SIZE])
def test_download_of_fewer_bytes_than_stored_raises_without_checksum(store: BlobStore, stored: bytes, short: int) -> None:
    """``download`` "checks size": a blob longer than the size asked for is not silently cut."""
    with pytest.raises(IntegrityError):
        store.download("job/data.bin", len(stored) - short)


def test_download_of_a_missing_blob_raises_not_found(store: BlobStore) -> None:
    with pytest.raises(NotFound):
        store.download("job/nope", 10)


# --------------------------------------------------------------------------- append, list, delete


def test_append_creates_an_append_blob_then_appends(store: BlobStore) -> None:
    store.append("job/events.jsonl", b'{"n":1}\n')
    props = store._blob("job/events.jsonl").get_blob_properties()
    assert str(props.blob_type).lower().endswith("appendblob")
    store.append("job/events.jsonl", b'{"n":2}\n')
    store.append("job/events.jsonl", b'{"n":3}\n')
    assert store.read("job/events.jsonl") == b'{"n":1}\n{"n":2}\n{"n":3}\n'
    assert list(blobstore.iter_lines(store.read("job/events.jsonl"))) == [b'{"n":1}', b'{"n":2}', b'{"n":3}']


def test_list_reports_names_sizes_and_checksums_under_a_prefix(store: BlobStore) -> None:
    store.create("job/a/1", b"one")
    store.create("job/a/2", b"two!")
    store.create("job/b/1", b"x")
    listed = {e.name: e for e in store.list("job/a/")}
    assert sorted(listed) == ["job/a/1", "job/a/2"]
    assert (listed["job/a/2"].size, listed["job/a/2"].sha256) == (4, sha256_blocks(b"two!"))
    assert listed["job/a/1"].last_modified > time.time() - 3600
    assert store.list("job/zzz/") == []


def test_delete_of_missing_names_is_fine(store: BlobStore) -> None:
    store.delete([])
    store.delete(["job/never", "job/was/here"])
    store.create("job/gone", b"1")
    store.create("job/stays", b"2")
    store.delete(["job/gone", "job/gone", "job/never"])
    assert [e.name for e in store.list("job/")] == ["job/stays"]
