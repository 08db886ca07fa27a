"""The service fixtures work: real Azurite and etcd, always stopped."""
from __future__ import annotations

import json
import os
import urllib.parse
import uuid
from pathlib import Path

from harness import services as svc


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # still there: only acceptable if it is a zombie we do not own
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True


def test_azurite_blob_round_trip(azurite: svc.AzuriteService, container_url: str) -> None:
    from azure.core.credentials import AzureNamedKeyCredential
    from azure.storage.blob import ContainerClient

    assert container_url.startswith(f"http://127.0.0.1:{azurite.port}/devstoreaccount1/")
    assert azurite.connection_string.startswith("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;")
    cred = AzureNamedKeyCredential(azurite.account_name, azurite.account_key)
    payload = os.urandom(64 * 1024) + b"elastictrain"
    with ContainerClient.from_container_url(container_url, credential=cred) as container:
        container.upload_blob("ckpt/step-1/shard-0.bin", payload)
        assert container.download_blob("ckpt/step-1/shard-0.bin").readall() == payload
        assert [b.name for b in container.list_blobs(name_starts_with="ckpt/")] == ["ckpt/step-1/shard-0.bin"]
    # data is persisted on disk, not in memory
    assert any(Path(azurite.location).iterdir())


def test_etcd_v2_set_get(etcd: svc.EtcdService) -> None:
    assert etcd.client_url == f"http://{etcd.endpoint}"
    key = f"/v2/keys/elastictrain-test/{uuid.uuid4().hex}"
    status, _, _ = svc.http_request(
        "PUT",
        etcd.client_url + key,
        body=urllib.parse.urlencode({"value": "hello"}),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status in (200, 201)
    status, _, body = svc.http_request("GET", etcd.client_url + key)
    assert status == 200
    assert json.loads(body)["node"]["value"] == "hello"


def test_private_instances_are_stopped(tmp_path: Path) -> None:
    with svc.start_azurite(tmp_path / "azurite") as blob, svc.start_etcd(tmp_path / "etcd") as kv:
        pids = {"azurite": blob.pid, "etcd": kv.pid}
        ports = {"azurite": blob.port, "etcd": kv.port}
        assert blob.pid != kv.pid
        for name, pid in pids.items():
            assert not _pid_gone(pid), f"{name} should be running"
            assert svc.port_is_open(ports[name]), f"{name} should listen on {ports[name]}"
    for name, pid in pids.items():
        assert _pid_gone(pid), f"{name} (pid {pid}) is still running after stop"
        assert not svc.port_is_open(ports[name]), f"{name} still listens on {ports[name]}"
        assert pid not in svc._LIVE, f"stopped {name} must leave the atexit registry"
