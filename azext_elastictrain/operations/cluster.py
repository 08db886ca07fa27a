"""az elastictrain cluster: create, show, list, wait and delete clusters, local (--local) or on Azure (-g).

One function per command: build the spec, resolve where the cluster is (``_validators``), call that
``Backend``; its errors leave through ``_errors``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from azext_elastictrain._errors import az_errors
from azext_elastictrain._validators import resolve_cluster

if TYPE_CHECKING:
    from azext_elastictrain._validators import Target
    from azext_elastictrain.backends.base import AnyBackend
    from azext_elastictrain.backends.views import ClusterCreated, ClusterDeleted, ClusterShown, ClusterState, Kubeconfig
    from azext_elastictrain.core.spec import ClusterSpec, LocalClusterSpec


# pylint: disable-next=too-many-locals  # one parameter per option of the command
def create_cluster(cmd: Any, *, local: bool = False, name: str | None = None, resource_group_name: str | None = None,
                   location: str | None = None, storage_account: str | None = None,
                   storage_sku: str | None = None, kubernetes_version: str | None = None,
                   node_vm_size: str | None = None, gpu_vm_size: str | None = None, min_count: int | None = None,
                   max_count: int | None = None, max_price: str | None = None, eviction_policy: str | None = None,
                   labels: list[str] | None = None, engine: str | None = None, upgrade_channel: str | None = None,
                   maintenance_window: str | None = None, storage_allow: list[str] | None = None,
                   vnet_subnet: str | None = None, api_server_authorized_ips: list[str] | None = None,
                   encryption_at_host: bool | None = None, merge_kubeconfig: bool = False,
                   local_accounts: bool = False, admin_principal: str | None = None, dry_run: bool = False,
                   no_wait: bool = False) -> Mapping[str, Any] | ClusterCreated:
    target = resolve_cluster(local=local, resource_group=resource_group_name, name=name)
    azure_only = {"--location": location, "--storage-account": storage_account, "--storage-sku": storage_sku,
                  "--kubernetes-version": kubernetes_version, "--node-vm-size": node_vm_size,
                  "--gpu-vm-size": gpu_vm_size, "--min-count": min_count, "--max-count": max_count,
                  "--max-price": max_price, "--eviction-policy": eviction_policy, "--labels": labels,
                  "--engine": engine, "--upgrade-channel": upgrade_channel, "--maintenance-window": maintenance_window,
                  "--storage-allow": storage_allow, "--vnet-subnet-id": vnet_subnet,
                  "--api-server-authorized-ips": api_server_authorized_ips, "--encryption-at-host": encryption_at_host,
                  "--merge-kubeconfig": merge_kubeconfig or None, "--no-wait": no_wait or None,
                  "--local-accounts": local_accounts or None, "--admin-principal": admin_principal}
    spec: LocalClusterSpec | ClusterSpec
    with az_errors(target):  # a spec is checked as it is built: bad input fails before any request or login
        if target.kind == "local":
            from azext_elastictrain.core.spec import LocalClusterSpec

            _refuse_azure_options(azure_only)
            assert target.cluster is not None  # resolve_cluster names a local cluster, 'local' by default
            spec = LocalClusterSpec(target.cluster)
        else:
            spec = _cluster_spec(target, location=location, storage_account=storage_account,
                                 storage_sku=storage_sku, kubernetes_version=kubernetes_version,
                                 system_vm_size=node_vm_size, gpu_vm_size=gpu_vm_size, min_count=min_count,
                                 max_count=max_count, max_price=max_price, eviction_policy=eviction_policy,
                                 node_labels=_node_labels(labels), engine=engine,
                                 upgrade_channel=upgrade_channel, maintenance_window=maintenance_window,
                                 storage_allow=tuple(storage_allow or ()), vnet_subnet=vnet_subnet,
                                 api_server_authorized_ips=tuple(api_server_authorized_ips or ()),
                                 encryption_at_host=encryption_at_host, local_accounts=bool(local_accounts),
                                 admin_principal=admin_principal)
        if eviction_policy == "Deallocate" and target.kind == "aks":
            from knack.log import get_logger

            from azext_elastictrain.core.spec import DEALLOCATE_WARNING

            get_logger(__name__).warning(DEALLOCATE_WARNING)
        if local_accounts and target.kind == "aks":
            from knack.log import get_logger

            get_logger(__name__).warning(
                "--local-accounts: the cluster keeps local accounts and no Entra ID: its credentials are client "
                "certificates that anyone holding them can use, unaudited, and that cannot be revoked one by one. "
                "Leave it out for an Entra ID-only cluster (Azure RBAC, audited, revocable).")
        with target.opened(cmd, signed_out=_dry_run_signed_out(cmd, target, dry_run)) as backend:
            if dry_run:
                return backend.plan_cluster(spec).shown
            result = backend.create_cluster(spec, no_wait=no_wait)
            if merge_kubeconfig and result["type"] == "aks" and not result.get("pending"):
                result["kubeconfig"] = _merge_kubeconfig(backend, spec)
            return result


def _refuse_azure_options(asked: Mapping[str, object]) -> None:
    """A local cluster has no pools, storage account or engine to choose: an option for Azure is a mistake to
    say, not to drop (the user may have forgotten -g)."""
    given = [flag for flag, value in asked.items() if value is not None]
    if given:
        from azure.cli.core.azclierror import ArgumentUsageError

        raise ArgumentUsageError(f"{', '.join(given)}: only for a cluster on Azure, not a local one",
                                 recommendation="Drop them, or create the cluster on AKS with -g RESOURCE_GROUP.")


def _dry_run_signed_out(cmd: Any, target: Target, dry_run: bool) -> "bool | str":
    """A dry run on AKS needs no login: without one it plans on no account, and the region preflight is skipped.
    A login whose token cannot be had (expired, its identity endpoint unreachable) is planned the same way, with
    the reason (a text) instead of a raw network error."""
    if not dry_run or target.kind != "aks":
        return False
    from knack.log import get_logger

    from azext_elastictrain.clients.arm import logged_in, token_problem

    if logged_in(cmd.cli_ctx):
        problem = token_problem(cmd.cli_ctx)
        if problem is None:
            return False
        get_logger(__name__).warning("The login's token could not be had (%s): planning signed out, the region "
                                     "preflight is skipped ('az login' again to have it).", problem)
        return problem
    get_logger(__name__).warning("Not logged in: the region preflight is skipped ('az login' to have it).")
    return True


def _cluster_spec(target: Target, **asked: Any) -> ClusterSpec:
    from dataclasses import fields

    from azext_elastictrain.core.spec import ClusterSpec

    known = {f.name for f in fields(ClusterSpec)}
    assert target.cluster is not None and target.resource_group is not None  # resolve_cluster: -g RG -n NAME
    return ClusterSpec(name=target.cluster, resource_group=target.resource_group,
                       **{k: v for k, v in asked.items() if v not in (None, ()) and k in known})


def _node_labels(labels: list[str] | None) -> tuple[tuple[str, str], ...]:
    from azure.cli.core.azclierror import InvalidArgumentValueError

    pairs = []
    for item in labels or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgumentValueError(f"invalid label {item!r}: use KEY=VALUE, e.g. team=vision")
        pairs.append((key, value))
    return tuple(pairs)


def _merge_kubeconfig(backend: AnyBackend, spec: LocalClusterSpec | ClusterSpec) -> Kubeconfig:
    try:
        return backend.merge_kubeconfig(spec)
    except (ValueError, OSError) as ex:
        from azure.cli.core.azclierror import FileOperationError

        raise FileOperationError(f"the cluster is ready, but its credentials were not merged: {ex}",
                                 recommendation="Fix the kubeconfig file, then run the same create with "
                                                "--merge-kubeconfig again.") from ex


def show_cluster(cmd: Any, local: bool = False, name: str | None = None,
                 resource_group_name: str | None = None) -> ClusterShown:
    target = resolve_cluster(local=local, resource_group=resource_group_name, name=name)
    with az_errors(target), target.opened(cmd) as backend:
        return backend.show_cluster()


def cluster_state(cmd: Any, name: str, resource_group_name: str) -> ClusterState:
    """The getter of 'cluster wait': the AKS provisioning state (a missing cluster is a 404, as wait expects)."""
    from azure.core.exceptions import ResourceNotFoundError as SdkNotFound

    from azext_elastictrain.core.errors import ClusterNotFound

    target = resolve_cluster(resource_group=resource_group_name, name=name)
    try:
        with az_errors(target), target.opened(cmd) as backend:
            return backend.cluster_state()
    except Exception as ex:  # noqa: BLE001
        if isinstance(ex.__cause__, ClusterNotFound):
            error = SdkNotFound(str(ex.__cause__))
            error.status_code = 404
            raise error from ex
        raise


def list_clusters(cmd: Any, local: bool = False, resource_group_name: str | None = None) -> Sequence[ClusterShown]:
    target = resolve_cluster(local=local, resource_group=resource_group_name, needs_name=False)
    with az_errors(target), target.opened(cmd) as backend:
        return backend.list_clusters()


def delete_cluster(cmd: Any, *, local: bool = False, name: str | None = None, resource_group_name: str | None = None,
                   delete_storage: bool = False, storage_account: str | None = None, dry_run: bool = False,
                   yes: bool = False, no_wait: bool = False) -> Mapping[str, Any] | ClusterDeleted:
    """Local: stop the processes this cluster started (by pid, checked) and remove its state.
    Azure: delete the AKS cluster, its identity, credential and role assignment; keep the storage account
    (and every checkpoint) unless --delete-storage."""
    from azure.cli.core.util import user_confirmation

    target = resolve_cluster(local=local, resource_group=resource_group_name, name=name)
    with az_errors(target), target.opened(cmd) as backend:
        plan = backend.plan_cluster_delete(delete_storage=delete_storage, storage_account=storage_account)
        if dry_run:
            return plan.shown
        user_confirmation(plan.prompt, yes=yes)
        return backend.delete_cluster(plan, no_wait=no_wait)
