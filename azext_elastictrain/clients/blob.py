"""Blob storage as the CLI reaches it: a job's event log, read over one client per command.

Azurite (the local cluster) is reached with its connection string; Azure storage with the caller's login
(Entra ID), never a key and never a silent ``DefaultAzureCredential``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain.core.eventlog import events as job_events

if TYPE_CHECKING:
    from azext_elastictrain.core.blobstore import BlobStore


class EventReader:
    """Job name -> its events under one container, over one client (opened on first use); close() it."""

    def __init__(self, container_url: str, *, connection_string: str | None = None, credential: Any = None,
                 grant: Callable[[], str] | None = None) -> None:
        self._url, self._connection_string, self._credential = container_url, connection_string, credential
        self._grant = grant  # the command that gives the login the data role it lacks (asked only on a 403)
        self._store: BlobStore | None = None

    def __call__(self, job: str) -> list[dict[str, Any]]:
        from azext_elastictrain.core.blobstore import AccessDenied, BlobStore, StoreError

        if self._store is None:
            if self._connection_string is None and self._credential is None:
                raise StoreError("no credential for the cluster's blob storage was given")
            self._store = BlobStore.from_url(self._url, connection_string=self._connection_string,
                                             credential=self._credential, quick_retries=True)
        try:
            return job_events.read_events(self._store, job)
        except AccessDenied as ex:
            if self._grant is None or ex.grant:
                raise
            raise AccessDenied(str(ex), ex.code, self._grant()) from ex

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
