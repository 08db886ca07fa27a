"""az elastictrain checkpoint: the catalog of a job's checkpoints in blob storage.

Thin: parse, call core.catalog, map failures to az error types. The same code
serves Azure storage (Entra ID through the CLI's login) and Azurite (a
connection string). A job is named by its URL (``--url``), on a local cluster
by ``--local [--cluster NAME] --job JOB`` (the URL and the Azurite connection
string then come from the cluster and are never printed), or on AKS by
``-g RG -c CLUSTER --job JOB`` (the URL from the cluster's storage account,
read with the CLI's login).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from azure.cli.core.azclierror import (
    InvalidArgumentValueError,
    MutuallyExclusiveArgumentError,
    ResourceNotFoundError,
)

from azext_elastictrain._errors import az_errors
from azext_elastictrain._validators import LoginCredential, resolve_checkpoints

if TYPE_CHECKING:
    from azext_elastictrain.core.blobstore import BlobStore


@contextmanager
def _open_store(cmd: Any, url: str | None, connection_string: str | None, *, local: bool = False,
                cluster: str | None = None, job: str | None = None,
                resource_group: str | None = None) -> Iterator[tuple[BlobStore, str]]:
    """``(store, url)`` of the job's checkpoints, named by exactly one of --url, --local --job or -g -c --job."""
    from azext_elastictrain.core.blobstore import BlobStore, foreign_account, parse_location

    target = resolve_checkpoints(url=url, connection_string=connection_string, local=local, cluster=cluster,
                                 job=job, resource_group=resource_group)
    hint = grant = None
    if target.kind != "url":
        assert job is not None  # resolve_checkpoints: --local and -g -c name a --job
        with az_errors(target, job=job), target.opened(cmd) as backend:
            location = backend.checkpoint_location(job)
        url, connection_string, hint = location.url, location.connection_string, location.unreachable
        grant = location.grant
    elif not connection_string:
        connection_string = os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or None
    assert url is not None  # the backend's location above, else the --url that named the place (resolve_checkpoints)
    try:
        parse_location(url, connection_string)  # bad input fails before any login or request
        accounts = foreign_account(url, connection_string) if connection_string else None
        if accounts:
            raise MutuallyExclusiveArgumentError(
                f"--url names storage account {accounts[0]!r} but the connection string "
                f"(--connection-string or AZURE_STORAGE_CONNECTION_STRING) is for account {accounts[1]!r}: "
                "nothing was read or deleted",
                recommendation=f"Pass the connection string of {accounts[0]!r}, or unset "
                               "AZURE_STORAGE_CONNECTION_STRING to use your az login (Entra ID).")
        # without a connection string, the login (Entra ID): an AKS cluster's storage has shared keys off
        credential = None if connection_string else LoginCredential(cmd.cli_ctx)
        store = BlobStore.from_url(url, connection_string=connection_string, credential=credential,
                                   quick_retries=True)
    except ValueError as ex:
        raise InvalidArgumentValueError(
            str(ex),
            recommendation="Pass the job's checkpoint URL: https://<account>.blob.core.windows.net/<container>/<job>"
        ) from ex
    try:
        with az_errors(target, job=job, url=url, hint=hint, grant=grant):
            yield store, url
    finally:
        store.close()


def list_checkpoints(cmd: Any, *, url: str | None = None, connection_string: str | None = None, local: bool = False,
                     cluster: str | None = None, job: str | None = None,
                     resource_group_name: str | None = None) -> list[dict[str, Any]]:
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string, local=local, cluster=cluster, job=job,
                     resource_group=resource_group_name) as (store, _):
        return [c.to_dict() for c in catalog.list_checkpoints(store, store.prefix)]


def show_checkpoint(cmd: Any, *, step: int, url: str | None = None, connection_string: str | None = None,
                    local: bool = False, cluster: str | None = None, job: str | None = None,
                    resource_group_name: str | None = None) -> dict[str, Any]:
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string, local=local, cluster=cluster, job=job,
                     resource_group=resource_group_name) as (store, location):
        found = [c for c in catalog.list_checkpoints(store, store.prefix) if c.step == step]
        if not found:
            raise ResourceNotFoundError(
                f"no checkpoint of step {step} under {location}",
                recommendation="List the job's checkpoints with 'az elastictrain checkpoint list'.",
            )
        checkpoint = found[0]
        result = checkpoint.to_dict()
        if checkpoint.manifest is not None:
            result["writer"] = checkpoint.manifest.writer
            result["fileList"] = [f.to_json() for f in checkpoint.manifest.files]
        result["orphanBlobs"] = catalog.orphan_blobs(checkpoint, store.prefix)
        return result


def verify_checkpoints(cmd: Any, *, url: str | None = None, step: int | None = None,
                       connection_string: str | None = None, local: bool = False, cluster: str | None = None,
                       job: str | None = None, resource_group_name: str | None = None) -> list[dict[str, Any]]:
    """Read back every file of the complete checkpoints (or one step) and check its checksum."""
    from azext_elastictrain.core import catalog

    with _open_store(cmd, url, connection_string, local=local, cluster=cluster, job=job,
                     resource_group=resource_group_name) as (store, location):
        listed = catalog.list_checkpoints(store, store.prefix)
        if step is not None:
            listed = [c for c in listed if c.step == step]
            if not listed:
                raise ResourceNotFoundError(f"no checkpoint of step {step} under {location}")
        return [catalog.verify(store, store.prefix, c).to_dict() for c in listed]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '7d', '2w' -> seconds."""
    value, unit = text.strip()[:-1], text.strip()[-1:].lower()
    try:
        seconds = float(value) * _UNITS[unit]
    except (KeyError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise InvalidArgumentValueError(
            f"invalid duration {text!r}", recommendation="Use a number and a unit: 90s, 30m, 12h, 7d or 2w."
        )
    return seconds


def prune_checkpoints(cmd: Any, *, url: str | None = None, keep_last: int | None = None, older_than: str | None = None,
                      incomplete: bool = False, dry_run: bool = False, yes: bool = False,
                      connection_string: str | None = None, local: bool = False, cluster: str | None = None,
                      job: str | None = None, resource_group_name: str | None = None) -> dict[str, Any]:
    """Plan which checkpoints go, show the plan, confirm, then delete (manifest first)."""
    from azure.cli.core.azclierror import RequiredArgumentMissingError
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.core import catalog

    if keep_last is None and older_than is None and not incomplete:
        raise RequiredArgumentMissingError(
            "nothing to prune: say which checkpoints go",
            recommendation="Use --keep-last N, --older-than 7d and/or --incomplete; add --dry-run to preview.",
        )
    if keep_last is not None and keep_last < 1:
        raise InvalidArgumentValueError(
            f"--keep-last {keep_last} would delete every checkpoint",
            recommendation="Keep at least 1: the newest complete checkpoint is never deleted.",
        )
    max_age = parse_duration(older_than) if older_than else None
    with _open_store(cmd, url, connection_string, local=local, cluster=cluster, job=job,
                     resource_group=resource_group_name) as (store, location):
        plan = catalog.plan_prune(catalog.list_checkpoints(store, store.prefix),
                                  keep_last=keep_last, older_than=max_age, incomplete=incomplete)
        result = {
            "dryRun": dry_run,
            "deleted": False,
            "bytesFreed": plan.bytes_freed,
            "delete": [dict(c.to_dict(), reason=plan.reasons[c.step]) for c in plan.delete],
            "keep": [c.step for c in plan.keep],
        }
        if dry_run or not plan.delete:
            return result
        steps = ", ".join(str(c.step) for c in plan.delete)
        freed_mib = plan.bytes_freed / 2**20
        user_confirmation(
            f"Delete {len(plan.delete)} checkpoint(s) of {location} (steps {steps}; {freed_mib:.1f} MiB)?",
            yes=yes,
        )
        catalog.apply_prune(store, store.prefix, plan)
        result["deleted"] = True
        return result


def download_checkpoint(cmd: Any, *, dest: str, step: int | None = None, url: str | None = None,
                        connection_string: str | None = None, local: bool = False, cluster: str | None = None,
                        job: str | None = None, resource_group_name: str | None = None) -> dict[str, Any]:
    """Copy a complete checkpoint (default: the newest) to a local folder, every file verified."""
    from pathlib import Path

    from azure.cli.core.azclierror import AzureResponseError, FileOperationError

    from azext_elastictrain.core import catalog
    from azext_elastictrain.core.blobstore import IntegrityError

    with _open_store(cmd, url, connection_string, local=local, cluster=cluster, job=job,
                     resource_group=resource_group_name) as (store, location):
        listed = catalog.list_checkpoints(store, store.prefix)
        if step is None:
            chosen = catalog.newest_complete(listed)
            if chosen is None:
                raise ResourceNotFoundError(f"no complete checkpoint under {location}",
                                            recommendation="List them with 'az elastictrain checkpoint list'.")
        else:
            chosen = next((c for c in listed if c.step == step), None)
            if chosen is None:
                raise ResourceNotFoundError(f"no checkpoint of step {step} under {location}",
                                            recommendation="List them with 'az elastictrain checkpoint list'.")
            if not chosen.complete:
                raise InvalidArgumentValueError(
                    f"checkpoint of step {step} is {chosen.status}: it cannot be restored",
                    recommendation="Download a complete one; 'az elastictrain checkpoint list' shows which are.")
        try:
            Path(dest).mkdir(parents=True, exist_ok=True)
            return catalog.download(store, store.prefix, chosen, Path(dest))
        except FileExistsError as ex:
            raise FileOperationError(str(ex)) from ex
        except IntegrityError as ex:
            raise AzureResponseError(
                f"checkpoint of step {chosen.step} is damaged: {ex}; nothing was written",
                recommendation="'az elastictrain checkpoint verify' shows which; download an older step.",
            ) from ex
        except OSError as ex:
            raise FileOperationError(f"cannot write to {dest}: {ex}") from ex
