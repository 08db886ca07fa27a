"""What the AKS cluster commands share: the backend on the logged-in subscription, and its errors as az errors."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from azure.cli.core.azclierror import (
    AzureInternalError,
    AzureResponseError,
    BadRequestError,
    ForbiddenError,
    InvalidArgumentValueError,
    ResourceNotFoundError,
    UnauthorizedError,
)
from knack.log import get_logger

logger = get_logger(__name__)


def aks_backend(cmd):
    from azext_elastictrain.clients.arm import AzureArm
    from azext_elastictrain.backends import get_backend

    return get_backend("aks", AzureArm(cmd.cli_ctx), progress=logger.warning)


@contextmanager
def aks_errors(resource_group: str, name: str | None) -> Iterator[None]:
    from azext_elastictrain.backends.aks.cluster import ArmError, ClusterNotFound, PlanFailed
    from azext_elastictrain.core.spec import SpecError

    rerun = (f"Fix the cause, then run the same 'az elastictrain cluster create -g {resource_group} -n {name}' "
             "again: it keeps what is already right and finishes the rest.")
    try:
        yield
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    except ClusterNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"List them with 'az elastictrain cluster list -g {resource_group}'.") from ex
    except PlanFailed as ex:
        done = ", ".join(ex.done) or "nothing"
        message = f"{ex.step} failed: {ex.error}. Completed before it: {done}."
        status = getattr(ex.error, "status", None)
        raise _by_status(status)(message, recommendation=rerun if ex.step[:6] != "delete" else
                                 "Fix the cause and run the same delete again; what is gone stays gone.") from ex
    except ArmError as ex:
        raise _by_status(ex.status)(str(ex)) from ex


def _by_status(status: int | None):
    if status == 400:
        return BadRequestError
    if status == 401:
        return UnauthorizedError
    if status == 403:
        return ForbiddenError
    if status == 404:
        return ResourceNotFoundError
    if status is not None and status >= 500:
        return AzureInternalError
    return AzureResponseError  # 409 Conflict and the rest


def node_labels(labels: list[str] | None) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in labels or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentValueError(f"invalid label {item!r}: use KEY=VALUE, e.g. team=vision")
        pairs.append((key, value))
    return tuple(pairs)
