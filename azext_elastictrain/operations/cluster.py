"""az elastictrain cluster: create, show, list and delete clusters.

Thin: validate, call the backend, map its errors to az error types.
"""
from __future__ import annotations

from azext_elastictrain.operations._local import local_backend, local_errors


def create_cluster(cmd, local: bool = False, name: str | None = None) -> dict:
    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT, LocalClusterSpec

    backend = local_backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with local_errors(name):
        return backend.create_cluster(LocalClusterSpec(name))


def show_cluster(cmd, local: bool = False, name: str | None = None) -> dict:
    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

    backend = local_backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with local_errors(name):
        return backend.show_cluster(name)


def list_clusters(cmd, local: bool = False) -> list[dict]:
    backend = local_backend(cmd, local)
    with local_errors("*"):
        return backend.list_clusters()


def delete_cluster(cmd, local: bool = False, name: str | None = None, dry_run: bool = False,
                   yes: bool = False) -> dict:
    """Stop the processes this cluster started (by pid, checked) and remove its state."""
    from azure.cli.core.util import user_confirmation

    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

    backend = local_backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with local_errors(name):
        plan = backend.delete_cluster(name, dry_run=True)
        if dry_run:
            return plan
        pids = ", ".join(f"{p['component']} (pid {p['pid']})" for p in plan["stopped"]) or "no running processes"
        user_confirmation(f"Delete local cluster {name!r}: stop {pids} and remove {plan['removed']} "
                          "with its checkpoints?", yes=yes)
        return backend.delete_cluster(name)
