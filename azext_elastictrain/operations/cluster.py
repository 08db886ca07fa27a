"""az elastictrain cluster: create, show, list and delete clusters.

Thin: validate, call the backend, map its errors to az error types.
"""
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


def _backend(cmd, local: bool):
    if not local:
        raise ArgumentUsageError(
            "this version runs clusters on this machine only",
            recommendation="Add --local (real etcd, Azurite and torchrun processes here).",
        )
    from azext_elastictrain.core.backends import get_backend

    return get_backend("local", Path(cmd.cli_ctx.config.config_dir) / "elastictrain" / "local")


@contextmanager
def _errors(name: str) -> Iterator[None]:
    from azext_elastictrain.core.backends.local import ClusterError, ClusterNotFound, ToolMissing
    from azext_elastictrain.core.spec import SpecError

    try:
        yield
    except SpecError as ex:
        raise InvalidArgumentValueError(str(ex)) from ex
    except ClusterNotFound as ex:
        raise ResourceNotFoundError(
            str(ex), recommendation=f"Create it with 'az elastictrain cluster create --local --name {name}', "
                                    "or list them with 'az elastictrain cluster list --local'."
        ) from ex
    except ToolMissing as ex:
        raise ValidationError(str(ex), recommendation="Run 'bash scripts/setup.sh' from the repository.") from ex
    except ClusterError as ex:
        raise CLIInternalError(str(ex)) from ex
    except OSError as ex:
        raise FileOperationError(f"local cluster {name!r}: {ex}") from ex


def create_cluster(cmd, local: bool = False, name: str | None = None) -> dict:
    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT, LocalClusterSpec

    backend = _backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with _errors(name):
        return backend.create_cluster(LocalClusterSpec(name))


def show_cluster(cmd, local: bool = False, name: str | None = None) -> dict:
    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

    backend = _backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with _errors(name):
        return backend.show_cluster(name)


def list_clusters(cmd, local: bool = False) -> list[dict]:
    backend = _backend(cmd, local)
    with _errors("*"):
        return backend.list_clusters()


def delete_cluster(cmd, local: bool = False, name: str | None = None, dry_run: bool = False,
                   yes: bool = False) -> dict:
    """Stop the processes this cluster started (by pid, checked) and remove its state."""
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

    backend = _backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with _errors(name):
        plan = backend.delete_cluster(name, dry_run=True)
        if dry_run:
            return plan
        pids = ", ".join(f"{p['component']} (pid {p['pid']})" for p in plan["stopped"]) or "no running processes"
        user_confirmation(f"Delete local cluster {name!r}: stop {pids} and remove {plan['removed']} "
                          "with its checkpoints?", yes=yes)
        return backend.delete_cluster(name)
