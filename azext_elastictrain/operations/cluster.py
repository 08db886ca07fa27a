"""az elastictrain cluster: create, show, list, wait and delete clusters, local (--local) or on Azure (-g).

Thin: choose the backend, build the spec, call the backend, map its errors to az error types.
"""
from __future__ import annotations

from azure.cli.core.azclierror import ArgumentUsageError, MutuallyExclusiveArgumentError, RequiredArgumentMissingError

from azext_elastictrain.operations._local import local_backend, local_errors


def _on_azure(local: bool, resource_group_name: str | None, name: str | None = None, *,
              needs_name: bool = True) -> bool:
    """True for a cluster on Azure (-g), False for a local one (--local); else a usage error."""
    if local and resource_group_name:
        raise MutuallyExclusiveArgumentError(
            "--local and --resource-group name two different places",
            recommendation="Use --local for a cluster on this machine, or -g/--resource-group for one on Azure.")
    if local:
        return False
    if not resource_group_name:
        raise ArgumentUsageError(
            "say where the cluster is: --local (this machine) or -g/--resource-group (Azure)",
            recommendation="Add --local (real etcd, Azurite and torchrun processes here), "
                           "or -g RESOURCE_GROUP -n NAME for an AKS cluster.")
    if needs_name and not name:
        raise RequiredArgumentMissingError("a cluster on Azure needs its name: -n/--name",
                                           recommendation="List them with 'az elastictrain cluster list'.")
    return True


def create_cluster(cmd, local: bool = False, name: str | None = None, resource_group_name: str | None = None,
                   location: str | None = None, storage_account: str | None = None,
                   storage_sku: str | None = None, kubernetes_version: str | None = None,
                   node_vm_size: str | None = None, gpu_vm_size: str | None = None, min_count: int | None = None,
                   max_count: int | None = None, max_price: str | None = None, eviction_policy: str | None = None,
                   labels: list[str] | None = None, merge_kubeconfig: bool = False, dry_run: bool = False,
                   no_wait: bool = False):
    if _on_azure(local, resource_group_name, name):
        from dataclasses import fields

        from azext_elastictrain.core.spec import ClusterSpec
        from azext_elastictrain.operations._aks import aks_backend, aks_errors, logger, node_labels

        asked = {"location": location, "storage_account": storage_account, "storage_sku": storage_sku,
                 "kubernetes_version": kubernetes_version, "system_vm_size": node_vm_size,
                 "gpu_vm_size": gpu_vm_size, "min_count": min_count, "max_count": max_count,
                 "max_price": max_price, "eviction_policy": eviction_policy, "node_labels": node_labels(labels)}
        known = {f.name for f in fields(ClusterSpec)}
        spec = ClusterSpec(name=name, resource_group=resource_group_name,
                           **{k: v for k, v in asked.items() if v not in (None, ()) and k in known})
        with aks_errors(resource_group_name, name):
            spec.validate()  # bad input fails before any request, login included
            if dry_run:
                from azext_elastictrain._client_factory import logged_in

                signed_in = logged_in(cmd.cli_ctx)
                if not signed_in:
                    logger.warning("Not logged in: the region preflight is skipped ('az login' to have it).")
                return aks_backend(cmd, signed_out=not signed_in).plan(spec, live_checks=signed_in)
            backend = aks_backend(cmd)
            result = backend.create(spec, no_wait=no_wait)
            if merge_kubeconfig and not result.get("pending"):
                try:
                    result["kubeconfig"] = backend.merge_kubeconfig(spec)
                except (ValueError, OSError) as ex:
                    from azure.cli.core.azclierror import FileOperationError

                    raise FileOperationError(f"the cluster is ready, but its credentials were not merged: {ex}",
                                             recommendation="Fix the kubeconfig file, then run the same create "
                                                            "with --merge-kubeconfig again.") from ex
            return result

    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT, LocalClusterSpec

    backend = local_backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with local_errors(name):
        return backend.create_cluster(LocalClusterSpec(name))


def show_cluster(cmd, local: bool = False, name: str | None = None, resource_group_name: str | None = None) -> dict:
    if _on_azure(local, resource_group_name, name):
        from azext_elastictrain.core.spec import ClusterSpec
        from azext_elastictrain.operations._aks import aks_backend, aks_errors

        with aks_errors(resource_group_name, name):
            return aks_backend(cmd).show(ClusterSpec(name=name, resource_group=resource_group_name))

    from azext_elastictrain.core.spec import LOCAL_CLUSTER_DEFAULT

    backend = local_backend(cmd, local)
    name = name or LOCAL_CLUSTER_DEFAULT
    with local_errors(name):
        return backend.show_cluster(name)


def cluster_state(cmd, name: str, resource_group_name: str) -> dict:
    """The getter of 'cluster wait': the AKS provisioning state (a missing cluster is a 404, as wait expects)."""
    from azure.core.exceptions import ResourceNotFoundError as SdkNotFound

    from azext_elastictrain.core.backends.aks import ClusterNotFound
    from azext_elastictrain.core.spec import ClusterSpec
    from azext_elastictrain.operations._aks import aks_backend, aks_errors

    try:
        with aks_errors(resource_group_name, name):
            return aks_backend(cmd).state(ClusterSpec(name=name, resource_group=resource_group_name))
    except Exception as ex:  # noqa: BLE001
        if isinstance(ex.__cause__, ClusterNotFound):
            error = SdkNotFound(str(ex.__cause__))
            error.status_code = 404
            raise error from ex
        raise


def list_clusters(cmd, local: bool = False, resource_group_name: str | None = None) -> list[dict]:
    if not local:
        from azext_elastictrain.operations._aks import aks_backend, aks_errors

        with aks_errors(resource_group_name or "", None):
            return aks_backend(cmd).list(resource_group_name)
    if resource_group_name:
        _on_azure(local, resource_group_name)
    backend = local_backend(cmd, local)
    with local_errors("*"):
        return backend.list_clusters()


def delete_cluster(cmd, local: bool = False, name: str | None = None, resource_group_name: str | None = None,
                   delete_storage: bool = False, storage_account: str | None = None, dry_run: bool = False,
                   yes: bool = False, no_wait: bool = False):
    """Local: stop the processes this cluster started (by pid, checked) and remove its state.
    Azure: delete the AKS cluster, its identity, credential and role assignment; keep the storage account
    (and every checkpoint) unless --delete-storage."""
    from azure.cli.core.util import user_confirmation

    if _on_azure(local, resource_group_name, name):
        from azext_elastictrain.core.spec import ClusterSpec
        from azext_elastictrain.operations._aks import aks_backend, aks_errors

        with aks_errors(resource_group_name, name):
            backend = aks_backend(cmd)
            plan = backend.delete_plan(ClusterSpec(name=name, resource_group=resource_group_name,
                                                   storage_account=storage_account or ""),
                                       delete_storage=delete_storage)
            if dry_run:
                return {"dryRun": True, **{k: v for k, v in plan.items() if k != "delete"},
                        "delete": [{"step": d["step"], "id": d["id"]} for d in plan["delete"]]}
            what = ", ".join(d["step"] for d in plan["delete"]) or "nothing"
            keep = " Kept: the storage account and its checkpoints." if plan["keep"] else ""
            warn = " THIS DELETES EVERY CHECKPOINT." if delete_storage else ""
            user_confirmation(f"Delete {what} of cluster {name!r} in resource group {resource_group_name!r}?"
                              f"{keep}{warn}", yes=yes)
            return backend.delete(plan, no_wait=no_wait)

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
