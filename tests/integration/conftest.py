"""Fixtures the integration modules share: real Azurite and etcd come from tests/conftest.py; here what they build
on them (a blob store in the test's own container) and the environment a checkpoint test runs in."""
from __future__ import annotations

from typing import Callable, Iterator

import pytest

from azext_elastictrain.core import launch
from azext_elastictrain.core.blobstore import BlobStore
from harness import services as svc


@pytest.fixture
def no_scheduled_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Scheduled Events endpoint: a Checkpointer made in the test would otherwise poll this machine's IMDS
    address for preemption notices (use with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    monkeypatch.setenv(launch.ENV_SCHEDULED_EVENTS_URL, "off")


@pytest.fixture
def blob_store(azurite: svc.AzuriteService, container_url: str) -> Iterator[Callable[[str], BlobStore]]:
    """``blob_store(prefix)``: a BlobStore at ``prefix`` of the test's own fresh container in the session's Azurite,
    each with its own clients (as another process would have); all closed after the test."""
    opened: list[BlobStore] = []

    def make(prefix: str) -> BlobStore:
        opened.append(BlobStore.from_url(f"{container_url}/{prefix}", connection_string=azurite.connection_string))
        return opened[-1]

    yield make
    for store in opened:
        store.close()
