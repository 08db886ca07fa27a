"""What the local commands share: choosing the backend and mapping its errors to az error types."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from azure.cli.core.azclierror import (
    ArgumentUsageError,
    CLIInternalError,
    FileOperationError,
    InvalidArgumentValueError,
    ResourceNotFoundError,
    ValidationError,
)


def local_backend(cmd, local: bool):
    if not local:
        raise ArgumentUsageError(
            "this command runs on a local cluster only in this version",
            recommendation="Add --local (real etcd, Azurite and torchrun processes here).",
        )
    from azext_elastictrain.backends import get_backend

    return get_backend("local", Path(cmd.cli_ctx.config.config_dir) / "elastictrain" / "local")


@contextmanager
def local_errors(cluster: str, job: str | None = None) -> Iterator[None]:
    from azext_elastictrain.backends.local.state import (
        ClusterError,
        ClusterNotFound,
        ClusterUnhealthy,
        JobConflict,
        JobNotFound,
        ToolMissing,
    )
    from azext_elastictrain.core.spec import SpecError

    try:
        yield
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    except ClusterNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"Create it with 'az elastictrain cluster create --local --name {cluster}', "
                                    "or list them with 'az elastictrain cluster list --local'."
        ) from ex
    except JobNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"List the jobs with 'az elastictrain job list --local --cluster {cluster}'."
        ) from ex
    except JobConflict as ex:
        raise ValidationError(str(ex)) from ex
    except ClusterUnhealthy as ex:
        raise ValidationError(str(ex)) from ex
    except ToolMissing as ex:
        raise ValidationError(str(ex), recommendation="Run 'bash scripts/setup.sh' from the repository.") from ex
    except ClusterError as ex:
        raise CLIInternalError(str(ex)) from ex
    except OSError as ex:
        raise FileOperationError(f"job {job or '*'!r} of local cluster {cluster!r}: {ex}") from ex


def local_names(cluster: str | None, job: str | None = None) -> str:
    """The cluster's name (default 'local'), after checking both names: they become paths."""
    from azext_elastictrain.core.layout import validate_job_name
    from azext_elastictrain.core.spec import (
        LOCAL_CLUSTER_DEFAULT,
        LocalClusterSpec,
        SpecError,
    )

    cluster = cluster or LOCAL_CLUSTER_DEFAULT
    try:
        LocalClusterSpec(cluster).validate()
        if job is not None:
            validate_job_name(job)
    except (SpecError, ValueError) as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    return cluster
