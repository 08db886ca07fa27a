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


def aks_backend(cmd, *, signed_out: bool = False):
    """The AKS backend on the command's subscription; ``signed_out``: on no account at all (a dry run)."""
    from azext_elastictrain._client_factory import AzureArm, SignedOutArm
    from azext_elastictrain.core.backends import get_backend

    arm = SignedOutArm(cmd.cli_ctx) if signed_out else AzureArm(cmd.cli_ctx)
    return get_backend("aks", arm, progress=logger.warning)


@contextmanager
def aks_errors(resource_group: str, name: str | None) -> Iterator[None]:
    from azext_elastictrain.core.backends.aks import ArmError, ClusterNotFound, PlanFailed
    from azext_elastictrain.core.preflight import PreflightError
    from azext_elastictrain.core.spec import SpecError

    rerun = (f"Fix the cause, then run the same 'az elastictrain cluster create -g {resource_group} -n {name}' "
             "again: it keeps what is already right and finishes the rest.")
    try:
        yield
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    except PreflightError as ex:  # the region cannot run the GPU Spot pool: nothing was created
        raise InvalidArgumentValueError(str(ex), recommendation=ex.recommendation) from ex
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
