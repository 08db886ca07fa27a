"""az elastictrain checkpoint: the catalog of a job's checkpoints in blob storage.

Thin: parse, call core.catalog, map failures to az error types. The same code
serves Azure storage (Entra ID through the CLI's login) and Azurite (a
connection string).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from azure.cli.core.azclierror import (
    AzureConnectionError,
    AzureResponseError,
    InvalidArgumentValueError,
    ResourceNotFoundError,
)


@contextmanager
def _open_store(cmd, url: str, connection_string: str | None) -> Iterator:
    from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

    from azext_elastictrain.core.blobstore import BlobStore, NotFound, StoreError, parse_location

    connection_string = connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
    try:
        parse_location(url, connection_string)  # bad input fails before any login or request
        credential = None
        if not connection_string:
            from azure.cli.core._profile import Profile

            credential = Profile(cli_ctx=cmd.cli_ctx).get_login_credentials()[0]
        store = BlobStore.from_url(url, connection_string=connection_string, credential=credential,
                                   quick_retries=True)
    except ValueError as ex:
        raise InvalidArgumentValueError(
            str(ex), recommendation="Pass the job's checkpoint URL: https://<account>.blob.core.windows.net/<container>/<job>"
        ) from ex
    try:
        yield store
    except NotFound as ex:
        raise ResourceNotFoundError(str(ex)) from ex
    except ServiceRequestError as ex:
        raise AzureConnectionError(
            f"cannot reach blob storage at {url}: {ex.message}",
            recommendation="Check the URL, and that the storage account (or local Azurite) is running and reachable.",
        ) from ex
    except ClientAuthenticationError as ex:
        raise AzureResponseError(
            f"blob storage refused the credentials: {ex.message}",
            recommendation="Run 'az login', and make sure you hold 'Storage Blob Data Reader' on the container.",
        ) from ex
    except StoreError as ex:
        raise AzureResponseError(str(ex)) from ex
    finally:
        store.close()


def list_checkpoints(cmd, url: str, connection_string: str | None = None) -> list[dict]:
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string) as store:
        return [c.to_dict() for c in catalog.list_checkpoints(store, store.prefix)]


def show_checkpoint(cmd, url: str, step: int, connection_string: str | None = None) -> dict:
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string) as store:
        found = [c for c in catalog.list_checkpoints(store, store.prefix) if c.step == step]
        if not found:
            raise ResourceNotFoundError(
                f"no checkpoint of step {step} under {url}",
                recommendation="List the job's checkpoints with 'az elastictrain checkpoint list'.",
            )
        checkpoint = found[0]
        result = checkpoint.to_dict()
        if checkpoint.manifest is not None:
            result["writer"] = checkpoint.manifest.writer
            result["fileList"] = [f.to_json() for f in checkpoint.manifest.files]
        result["orphanBlobs"] = catalog.orphan_blobs(checkpoint, store.prefix)
        return result


def verify_checkpoints(cmd, url: str, step: int | None = None, connection_string: str | None = None) -> list[dict]:
    """Read back every file of the complete checkpoints (or one step) and check its checksum."""
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string) as store:
        listed = catalog.list_checkpoints(store, store.prefix)
        if step is not None:
            listed = [c for c in listed if c.step == step]
            if not listed:
                raise ResourceNotFoundError(f"no checkpoint of step {step} under {url}")
        return [catalog.verify(store, store.prefix, c).to_dict() for c in listed]
