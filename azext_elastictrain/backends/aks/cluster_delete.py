"""Deleting a cluster on Azure: what would go and what stays (looked up with GETs only), then deleting it in
that order: the identity's role assignment and federated credential, the cluster, the identity, and the storage
account only when asked (it holds every checkpoint). What it shares with create and show: cluster.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from azext_elastictrain.backends.aks.cluster import ClusterClients, PlanFailed, _resource_id
from azext_elastictrain.backends.views import AksClusterDeleted, DeletedResource
from azext_elastictrain.core.aks import arm_bodies
from azext_elastictrain.core.errors import ArmError, ClusterNotFound
from azext_elastictrain.core.spec import ClusterSpec


class ClusterDeletion(ClusterClients):
    """Delete an elastic-training cluster on AKS, as planned."""

    def delete_plan(self, spec: ClusterSpec, *, delete_storage: bool = False) -> dict[str, Any]:
        """What delete would remove and keep, looked up with GETs only."""
        spec = replace(spec, subscription=spec.subscription or self.arm.subscription)
        rg = spec.resource_group
        cluster = self.arm.get("cluster", {"resource_group": rg, "name": spec.name})
        if cluster is not None:
            spec = arm_bodies.spec_from_tags(spec, cluster)
        container_scope = arm_bodies.container_id(self.arm.subscription, spec)
        identity = self.arm.get("identity", {"resource_group": rg, "name": spec.identity_name})
        items: list[tuple[str, str, dict[str, Any]]] = []
        if identity is not None:
            principal = (identity.get("properties") or {}).get("principalId", "")
            items.append(("role assignment", "role_assignment", {
                "scope": container_scope, "name": arm_bodies.role_assignment_name(container_scope, principal)}))
            items.append(("federated credential", "federated_credential", {
                "resource_group": rg, "identity": spec.identity_name,
                "name": arm_bodies.federated_credential_name(spec)}))
        if cluster is not None:
            items.append(("AKS cluster", "cluster", {"resource_group": rg, "name": spec.name}))
        if identity is not None:
            items.append(("managed identity", "identity", {"resource_group": rg, "name": spec.identity_name}))
        storage_ref = {"resource_group": rg, "name": spec.storage_account_name}
        account = self.arm.get("storage_account", storage_ref)
        kept = []
        if account is not None:
            if delete_storage:
                items.append(("storage account (with every checkpoint)", "storage_account", storage_ref))
            else:
                kept.append({"what": "storage account and its checkpoints", "id":
                             arm_bodies.storage_account_id(self.arm.subscription, spec)})
        if not items and not kept:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {rg!r}, "
                                  "nor its identity or storage")
        return {"name": spec.name, "resourceGroup": rg, "delete": [
            {"step": title, "kind": kind, "ref": ref, "id": _resource_id(kind, ref, None, self.arm.subscription)}
            for title, kind, ref in items], "keep": kept}

    def delete(self, plan: dict[str, Any], *, no_wait: bool = False) -> AksClusterDeleted:
        deleted: list[DeletedResource] = []
        for item in plan["delete"]:
            self._progress(f"deleting {item['step']}" + (" - this takes several minutes" if item["kind"] == "cluster"
                                                         and not no_wait else ""))
            try:
                self.arm.delete(item["kind"], item["ref"], wait=not (no_wait and item["kind"] == "cluster"))
            except ArmError as ex:
                if ex.status != 404:
                    raise PlanFailed(f"delete {item['step']}", ex, [d["step"] for d in deleted]) from ex
            deleted.append({"step": item["step"], "id": item["id"]})
        return {"name": plan["name"], "resourceGroup": plan["resourceGroup"], "deleted": deleted,
                "kept": plan["keep"]}
