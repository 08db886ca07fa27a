"""Every error a backend, client or core module raises, as the az error a user sees: ONE table.

``az_errors(target)`` wraps a command's work; the first row whose type matches the error builds the az error
(what went wrong, and how to fix it where we know), chained with ``raise ... from``. Types are named by module
path and imported only when an error happens, so this costs nothing at load time.
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from azure.cli.core import azclierror as az

if TYPE_CHECKING:
    from azext_elastictrain._validators import Target
    from azext_elastictrain.backends.aks.cluster import PlanFailed
    from azext_elastictrain.backends.aks.evict import EvictionFailed
    from azext_elastictrain.clients.kube import KubeError
    from azext_elastictrain.core.blobstore import AccessDenied


class _Where:  # pylint: disable=too-few-public-methods,too-many-instance-attributes  # names for format strings
    """What a row's message may name: the target's fields, the job, and for storage its URL and a hint."""

    def __init__(self, target: Target, job: str | None, url: str | None, hint: str | None,
                 grant: "str | Callable[[], str] | None" = None) -> None:
        self.kind, self.cluster = target.kind, target.cluster
        self.resource_group, self.where = target.resource_group, target.where if target.kind != "url" else ""
        self.job, self.url, self.hint, self.grant = job, url or target.url, hint, grant


# A row: the error type's path, and what builds its az error from the place and the error. The error is of the type
# the path names, which is imported only when an error happens: a type checker cannot see it (Any).
_Row = tuple[str, Callable[[_Where, Any], az.AzCLIError]]


def _by_status(status: int | None) -> type[az.AzCLIError]:
    error: type[az.AzCLIError] = az.AzureResponseError  # 409 Conflict and the rest
    if status == 400:
        error = az.BadRequestError
    elif status == 401:
        error = az.UnauthorizedError
    elif status == 403:
        error = az.ForbiddenError
    elif status == 404:
        error = az.ResourceNotFoundError
    elif status is not None and status >= 500:
        error = az.AzureInternalError
    return error


def _cluster_not_found(t: _Where, ex: Exception) -> az.AzCLIError:
    if t.kind == "local":
        return az.ResourceNotFoundError(str(ex), recommendation=(
            f"Create it with 'az elastictrain cluster create --local --name {t.cluster}', or list them with "
            "'az elastictrain cluster list --local'."))
    return az.ResourceNotFoundError(str(ex), recommendation=(
        f"List them with 'az elastictrain cluster list -g {t.resource_group}'."))


def _plan_failed(t: _Where, ex: PlanFailed) -> az.AzCLIError:
    done = ", ".join(ex.done) or "nothing"
    rerun = (f"Fix the cause, then run the same 'az elastictrain cluster create -g {t.resource_group} -n "
             f"{t.cluster}' again: it keeps what is already right and finishes the rest."
             if ex.step[:6] != "delete" else "Fix the cause and run the same delete again; what is gone stays gone.")
    error_type = _by_status(getattr(ex.error, "status", None))
    return error_type(f"{ex.step} failed: {ex.error}. Completed before it: {done}.", recommendation=rerun)


def _eviction_failed(_target: _Where, ex: EvictionFailed) -> az.AzCLIError:
    done = ", ".join(e["node"] for e in ex.done) or "none"
    status, code, message = (getattr(ex.error, "status", 0), getattr(ex.error, "code", ""),
                             getattr(ex.error, "message", str(ex.error)))
    text = f"the eviction of node {ex.node!r} failed: {message}. Evicted before it: {done}; nothing after it."
    return _by_status(status)(f"{code}: {text}" if code else text)


def _kube_error(t: _Where, ex: KubeError) -> az.AzCLIError:
    if ex.status is None:
        return az.AzureConnectionError(str(ex), recommendation=(
            f"'az elastictrain cluster show -g {t.resource_group} -n {t.cluster}' tells whether the cluster is up."))
    return {401: az.UnauthorizedError, 403: az.ForbiddenError, 404: az.ResourceNotFoundError}.get(
        ex.status, az.AzureResponseError)(str(ex))


def _command_error(error: type[az.AzCLIError]) -> Callable[[_Where, Exception], az.AzCLIError]:
    return lambda t, ex: error(str(ex), recommendation=getattr(ex, "recommendation", None))


def _store_unreachable(t: _Where, ex: Any) -> az.AzCLIError:  # ex: azure.core's ServiceRequestError (not read)
    return az.AzureConnectionError(
        f"cannot reach blob storage at {t.url}: {ex.message}",
        recommendation=t.hint or "Check the URL, and that the storage account (or local Azurite) is running and "
                                 "reachable.")


def _access_denied(t: _Where, ex: AccessDenied) -> az.AzCLIError:
    """A 403 from blob: the login lacks a data role on the container (Owner and Contributor have no data actions)."""
    grant = getattr(ex, "grant", None) or t.grant
    if callable(grant):  # built only now, on a 403: it reads the login's token
        try:
            grant = grant()
        except Exception:  # noqa: BLE001  # pylint: disable=broad-exception-caught  # the generic hint below
            grant = None
    grant = grant or (
        'az role assignment create --assignee "$(az ad signed-in-user show --query id -o tsv)" --role "Storage Blob '
        'Data Contributor" --scope <the checkpoint container\'s resource id>')
    return az.ForbiddenError(
        f"{ex}: your login holds no data role on the checkpoint container. The CLI reads the job's events and "
        "checkpoints with your own Entra ID login, which needs 'Storage Blob Data Contributor' there ('Storage Blob "
        "Data Reader' to read only); Owner and Contributor of the subscription have no data actions.",
        recommendation=f"Grant it, then wait a minute or two for Azure to apply it: {grant}")


def _os_error(t: _Where, ex: OSError) -> az.AzCLIError:
    if t.kind == "local":
        return az.FileOperationError(f"job {t.job or '*'!r} of local cluster {t.cluster!r}: {ex}")
    return az.FileOperationError(str(ex))


_CORE, _AKS, _LOCAL = "azext_elastictrain.core", "azext_elastictrain.backends.aks", "azext_elastictrain.backends.local"

# First match wins: a subclass comes before its base class.
TABLE: list[_Row] = [
    (f"{_CORE}.errors:OptionNotHere", _command_error(az.ArgumentUsageError)),
    (f"{_CORE}.errors:NotReached", _command_error(az.UnclassifiedUserFault)),
    (f"{_CORE}.errors:NotSupported", _command_error(az.ValidationError)),
    (f"{_CORE}.errors:ClusterNotFound", _cluster_not_found),
    (f"{_CORE}.errors:JobNotFound", lambda t, ex: az.ResourceNotFoundError(
        str(ex), recommendation=f"List the jobs with 'az elastictrain job list {t.where}'.")),
    (f"{_CORE}.aks.eviction:EvictionTargetNotFound", lambda t, ex: az.ResourceNotFoundError(str(ex))),
    (f"{_AKS}.jobs:GpuPoolMissing", lambda t, ex: az.ValidationError(str(ex), recommendation=(
        f"Run 'az elastictrain cluster create -g {t.resource_group} -n {t.cluster}' again: it adds what is "
        "missing, the GPU Spot pool included."))),
    (f"{_AKS}.jobs:EngineNotInstalled", lambda t, ex: az.ValidationError(str(ex), recommendation=(
        f"Run the job with --engine {ex.cluster_engine} (the cluster's default), or install the operator: "
        f"'az elastictrain cluster create -g {t.resource_group} -n {t.cluster} --engine torchelastic'."))),
    (f"{_AKS}.jobs:JobExists", lambda t, ex: az.ValidationError(
        str(ex), recommendation=f"'az elastictrain job delete {t.where} -n NAME', or pick another name.")),
    (f"{_CORE}.chaos:ScheduleError", lambda t, ex: az.InvalidArgumentValueError(str(ex), recommendation=(
        "Add --dry-run to print the schedule those values make, and evict nothing."))),
    (f"{_CORE}.spec:SpecError", lambda t, ex: az.InvalidArgumentValueError(str(ex))),
    # the region cannot run the GPU Spot pool (raised before anything is created)
    (f"{_CORE}.aks.preflight:PreflightError", lambda t, ex: az.InvalidArgumentValueError(
        str(ex), recommendation=ex.recommendation)),
    (f"{_AKS}.cluster:PlanFailed", _plan_failed),
    (f"{_AKS}.evict:EvictionFailed", _eviction_failed),
    (f"{_CORE}.errors:ArmError", lambda t, ex: _by_status(ex.status)(str(ex))),
    ("azext_elastictrain.clients.kube:KubeError", _kube_error),
    (f"{_CORE}.errors:EvictionError", lambda t, ex: az.AzureResponseError(str(ex), recommendation=(
        f"See 'az elastictrain job logs {t.where} --name {t.job}'." if t.kind == "local" and t.job else
        "'az elastictrain job show' shows the job's state."))),
    ("builtins:TimeoutError", lambda t, ex: az.AzureResponseError(
        str(ex), recommendation="'az elastictrain job show' shows the job's state.")),
    (f"{_LOCAL}.state:JobConflict", lambda t, ex: az.ValidationError(str(ex))),
    (f"{_LOCAL}.state:ClusterUnhealthy", lambda t, ex: az.ValidationError(str(ex))),
    (f"{_LOCAL}.state:ToolMissing", lambda t, ex: az.ValidationError(
        str(ex), recommendation="Run 'bash scripts/setup.sh' from the repository.")),
    (f"{_LOCAL}.state:ClusterError", lambda t, ex: az.CLIInternalError(str(ex))),
    # blob storage (checkpoint commands, a job's events)
    (f"{_CORE}.blobstore:NotFound", lambda t, ex: az.ResourceNotFoundError(str(ex))),
    (f"{_CORE}.blobstore:AccessDenied", _access_denied),
    ("azure.core.exceptions:ServiceRequestError", _store_unreachable),
    ("azure.core.exceptions:ClientAuthenticationError", lambda t, ex: az.AzureResponseError(
        f"blob storage refused the credentials: {ex.message}",
        recommendation="Run 'az login', and make sure you hold 'Storage Blob Data Reader' on the container.")),
    (f"{_CORE}.blobstore:StoreError", lambda t, ex: az.AzureResponseError(str(ex))),
    ("builtins:OSError", _os_error),
]


def _loaded(path: str) -> type | None:
    module, _, name = path.partition(":")
    try:
        loaded: type = getattr(importlib.import_module(module), name)
        return loaded
    except ImportError:  # an optional SDK that is not installed cannot have raised its error
        return None


@contextmanager
def az_errors(target: Target, *, job: str | None = None, url: str | None = None,
              hint: str | None = None, grant: "str | Callable[[], str] | None" = None) -> Iterator[None]:
    """Run a command's work; any error of the table leaves as its az error (az errors pass unchanged)."""
    try:
        yield
    except az.AzCLIError:
        raise
    except Exception as ex:  # noqa: BLE001 - matched against the table, else re-raised as is
        for path, build in TABLE:
            error_type = _loaded(path)
            if error_type is not None and isinstance(ex, error_type):
                raise build(_Where(target, job, url, hint, grant), ex) from ex
        raise
