"""Showing and listing clusters on Azure: `cluster show` (the Azure resources, and the health of what runs in the
cluster), `cluster list` (ours among the subscription's or group's clusters) and the state `cluster wait` polls.
What they share with create and delete: cluster.py.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from azext_elastictrain.backends.aks.cluster import IN_PROGRESS, ClusterClients, _Context, _provisioning_state
from azext_elastictrain.backends.views import AksCluster, AksPool, ClusterState
from azext_elastictrain.core.aks import arm_bodies
from azext_elastictrain.core.errors import ArmError, ClusterNotFound
from azext_elastictrain.core.spec import ENGINE_TORCHELASTIC, ClusterSpec

_HEALTH = {"ok": "Healthy", "degraded": "Degraded", "missing": "Missing", "unknown": "Unknown"}


class ClusterViews(ClusterClients):
    """Show, list and poll the elastic-training clusters on AKS."""

    def show(self, spec: ClusterSpec, *, health: bool = True) -> AksCluster:
        spec = replace(spec, subscription=spec.subscription or self.arm.subscription)
        ctx = _Context(spec, self.arm.subscription, self.arm.tenant)
        cluster = self.arm.get("cluster", {"resource_group": spec.resource_group, "name": spec.name})
        if cluster is None:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {spec.resource_group!r}")
        spec = ctx.spec = arm_bodies.spec_from_tags(spec, cluster)
        ctx.found["cluster"] = cluster
        for kind, ref in (("storage_account", {"resource_group": spec.resource_group,
                                               "name": spec.storage_account_name}),
                          ("identity", {"resource_group": spec.resource_group, "name": spec.identity_name})):
            ctx.found[kind] = self.arm.get(kind, ref)
        return self._describe(spec, cluster, ctx, health=health)

    def state(self, spec: ClusterSpec) -> ClusterState:
        """What ``cluster wait`` polls: the cluster's provisioning state, Succeeded only once its pools are."""
        cluster = self.arm.get("cluster", {"resource_group": spec.resource_group, "name": spec.name})
        if cluster is None:
            raise ClusterNotFound(f"no AKS cluster named {spec.name!r} in resource group {spec.resource_group!r}")
        states = [_provisioning_state(cluster)] + [
            (p.get("provisioningState") or "").lower() for p in (cluster.get("properties") or {}).get(
                "agentPoolProfiles") or []]
        combined = next((s for s in states if s in IN_PROGRESS or s == "failed"), states[0])
        return {"name": spec.name, "resourceGroup": spec.resource_group, "provisioningState": combined.title()}

    def list(self, resource_group: str | None) -> list[AksCluster]:
        rows = []
        for cluster in self.arm.list_clusters(resource_group):
            if arm_bodies.TAG not in (cluster.get("tags") or {}):
                continue  # not one of ours
            group = _resource_group_of(cluster.get("id", "")) or resource_group or ""
            spec = arm_bodies.spec_from_tags(ClusterSpec(name=cluster.get("name", ""), resource_group=group), cluster)
            rows.append(self._describe(spec, cluster, None, health=None))
        return rows

    def _describe(self, spec: ClusterSpec, cluster: dict[str, Any] | None, ctx: _Context | None,
                  health: bool | None) -> AksCluster:
        found = ctx.found if ctx else {}
        shown = describe_cluster(spec, cluster, found, self._checkpoint_url(spec, found.get("storage_account")))
        if health and ctx:
            found = self._health(spec, ctx)
            shown["health"] = _HEALTH.get(found["state"], found["state"])
            shown["components"] = found["components"]
        return shown

    def _health(self, spec: ClusterSpec, ctx: _Context) -> dict[str, Any]:
        """incluster.health, or every component 'unknown' (with why) where the cluster cannot be asked."""
        def unknown(reason: str) -> dict[str, Any]:
            names = ("elasticjob-crd", "etcd", "operator", "nvidia-device-plugin") \
                if spec.engine == ENGINE_TORCHELASTIC else ("etcd", "nvidia-device-plugin")
            return {"state": "unknown", "components": {name: {"state": "unknown", "reason": reason}
                                                       for name in names}}

        if _provisioning_state(ctx.found.get("cluster")) in IN_PROGRESS:
            return unknown("the cluster is still being provisioned")
        try:
            from azext_elastictrain.backends.aks import incluster

            return incluster.health(self._kube(spec), self._incluster_spec(ctx))
        except Exception as ex:  # pylint: disable=broad-exception-caught  # show must still show the Azure side
            from azext_elastictrain.clients.kube import KubeError

            reason = str(ex) if isinstance(ex, (KubeError, ArmError)) else type(ex).__name__
            return unknown(f"the Kubernetes API did not answer: {reason}")


def describe_cluster(spec: ClusterSpec, cluster: dict[str, Any] | None, found: dict[str, Any],
                     checkpoint_url: str) -> AksCluster:
    """The Azure side of `cluster show`: the cluster's ARM resource and those of ``found`` (storage account and
    identity, by kind), as far as they were read."""
    cluster = cluster or {}
    props = cluster.get("properties") or {}
    account = found.get("storage_account")
    identity = found.get("identity")
    shown: AksCluster = {
        "name": spec.name,
        "type": "aks",
        "resourceGroup": spec.resource_group,
        "location": cluster.get("location") or spec.location,
        "provisioningState": props.get("provisioningState"),
        "kubernetesVersion": props.get("currentKubernetesVersion") or props.get("kubernetesVersion"),
        "fqdn": props.get("fqdn"),
        "oidcIssuerUrl": (props.get("oidcIssuerProfile") or {}).get("issuerURL"),
        "workloadIdentity": ((props.get("securityProfile") or {}).get("workloadIdentity") or {}).get("enabled"),
        "upgrades": props.get("autoUpgradeProfile") or {},
        "apiServerAuthorizedIpRanges": (props.get("apiServerAccessProfile") or {}).get("authorizedIPRanges") or [],
        "entraId": bool((props.get("aadProfile") or {}).get("managed")),
        "azureRbac": bool((props.get("aadProfile") or {}).get("enableAzureRBAC")),
        "localAccounts": not props.get("disableLocalAccounts", False),
        "pools": [_pool(p) for p in props.get("agentPoolProfiles") or []],
        "storage": {"account": spec.storage_account_name, "container": spec.container,
                    "checkpointUrl": checkpoint_url},
        "identity": {"name": spec.identity_name},
        "engine": spec.engine,
    }
    if account:
        aprops = account.get("properties") or {}
        storage = shown["storage"]
        storage["provisioningState"] = aprops.get("provisioningState")
        storage["minimumTlsVersion"] = aprops.get("minimumTlsVersion")
        storage["supportsHttpsTrafficOnly"] = aprops.get("supportsHttpsTrafficOnly")
        storage["allowBlobPublicAccess"] = aprops.get("allowBlobPublicAccess")
        storage["allowSharedKeyAccess"] = aprops.get("allowSharedKeyAccess")
        shown["storage"]["sku"] = (account.get("sku") or {}).get("name")
        shown["storage"]["networkDefaultAction"] = (aprops.get("networkAcls") or {}).get("defaultAction")
    if identity:
        iprops = identity.get("properties") or {}
        shown["identity"].update({"clientId": iprops.get("clientId"), "principalId": iprops.get("principalId")})
    return shown


def _pool(profile: dict[str, Any]) -> AksPool:
    spot = (profile.get("scaleSetPriority") or "Regular") == "Spot"
    return {
        "name": profile.get("name"), "mode": profile.get("mode"), "vmSize": profile.get("vmSize"),
        "priority": profile.get("scaleSetPriority") or "Regular",
        "evictionPolicy": profile.get("scaleSetEvictionPolicy") if spot else None,
        "spotMaxPrice": profile.get("spotMaxPrice") if spot else None,
        "count": profile.get("count"), "minCount": profile.get("minCount"), "maxCount": profile.get("maxCount"),
        "autoscale": profile.get("enableAutoScaling"), "taints": profile.get("nodeTaints") or [],
        "labels": profile.get("nodeLabels") or {}, "provisioningState": profile.get("provisioningState"),
        "osDiskType": profile.get("osDiskType"), "encryptionAtHost": profile.get("enableEncryptionAtHost"),
    }


def _resource_group_of(resource_id: str) -> str:
    parts = resource_id.split("/")
    lowered = [p.lower() for p in parts]
    return parts[lowered.index("resourcegroups") + 1] if "resourcegroups" in lowered else ""
