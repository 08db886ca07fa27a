"""Clusters on Azure: what creating, showing and deleting one share, through an injectable ARM layer.

A cluster is created by cluster_create.py (the plan, its region preflight, its steps), shown and listed by
cluster_show.py and deleted by cluster_delete.py; each is a ``ClusterClients``: one command's ARM layer and
session, and what every one of them asks of the cluster (its Kubernetes client, the spec of what runs in it, its
checkpoint URL). ``_Context`` is what one command found of a cluster's resources, kind by kind.

The ARM layer (``Arm``) is these modules' one view of Azure: the CLI gives it one built on the SDK
clients (``azext_elastictrain.clients.arm``); tests give it the same against a local ARM server.
Kubernetes is reached through ``clients.kube`` and installed by ``backends.aks.incluster``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain.core.aks import arm_bodies
from azext_elastictrain.core.errors import ArmError
from azext_elastictrain.core.ports import Arm, KubeClient
from azext_elastictrain.core.spec import ClusterSpec

if TYPE_CHECKING:
    from azext_elastictrain.backends.aks.session import AksSession
    from azext_elastictrain.core.aks.manifests import InClusterSpec

IN_PROGRESS = {"creating", "updating", "upgrading", "scaling", "deleting", "accepted", "resolvingdns",
               "starting", "stopping", "migrating", "canceling"}
_ZERO_GUID = "00000000-0000-0000-0000-000000000000"


class PlanFailed(Exception):
    """A step failed; ``done`` lists what this run completed before it. A re-run finishes the plan."""

    def __init__(self, step: str, error: ArmError | Exception, done: list[str]) -> None:
        super().__init__(f"{step}: {error}")
        self.step, self.error, self.done = step, error, done


KINDS = ("resource_group", "storage_account", "container", "identity", "cluster", "agent_pool",
         "maintenance_configuration", "federated_credential", "role_assignment")


@dataclass
class _Context:  # pylint: disable=too-many-instance-attributes  # what the plan's steps read, one field each
    spec: ClusterSpec
    subscription: str
    tenant: str
    found: dict[str, Any] = field(default_factory=dict)  # kind -> the resource as ARM returned it
    placeholders: bool = False  # dry run: values only Azure knows become "<...>"
    hardware: arm_bodies.NodeHardware = field(default_factory=arm_bodies.NodeHardware)  # from the region preflight
    admin: tuple[str, str | None] | None = None  # who gets the cluster's Kubernetes admin role (Entra ID only)
    creator: tuple[str, str | None] | None = None  # who gets the data role on the checkpoint container

    def identity(self, key: str) -> str:
        value = ((self.found.get("identity") or {}).get("properties") or {}).get(key)
        return value or f"<{key} of identity {self.spec.identity_name}>"

    def issuer(self) -> str:
        props = (self.found.get("cluster") or {}).get("properties") or {}
        return (props.get("oidcIssuerProfile") or {}).get("issuerURL") or \
            f"<OIDC issuer URL of cluster {self.spec.name}>"


class ClusterClients:  # pylint: disable=too-few-public-methods  # each command's class adds its own methods
    """One command's ARM layer and session, and what creating, showing and deleting a cluster all ask of them."""

    def __init__(self, arm_client: Arm, *, kube_connect: Callable[[bytes], KubeClient] | None = None,
                 progress: Callable[[str], None] | None = None, session: AksSession | None = None) -> None:
        self.arm = arm_client
        self.session = session  # the command's AksSession, when it has one
        self._kube_connect = kube_connect
        self._progress = progress or (lambda message: None)

    def _incluster_spec(self, ctx: _Context) -> InClusterSpec:
        from azext_elastictrain.core.aks.manifests import InClusterSpec

        def guid(value: str) -> str:  # dry run: Azure assigns these ids; a zero GUID stands in for them
            return _ZERO_GUID if value.startswith("<") else value

        return InClusterSpec(namespace=ctx.spec.namespace, service_account=ctx.spec.service_account,
                             identity_client_id=guid(ctx.identity("clientId")),
                             tenant_id=guid(ctx.identity("tenantId")) if "identity" in ctx.found
                             else (ctx.tenant or None),
                             checkpoint_url=self._checkpoint_url(ctx.spec, ctx.found.get("storage_account")),
                             engine=ctx.spec.engine)

    def _checkpoint_url(self, spec: ClusterSpec, account: dict[str, Any] | None) -> str:
        return spec.checkpoint_url(arm_bodies.blob_endpoint(account, spec, self.arm.storage_suffix))

    def _kube(self, spec: ClusterSpec) -> KubeClient:
        """A Kubernetes client from the user credentials, which stay in memory: the command's session's where it
        is of this cluster (credentials fetched once per command)."""
        session = self.session
        if session is None or (session.resource_group, session.cluster) != (spec.resource_group, spec.name):
            from azext_elastictrain.backends.aks.session import AksSession

            session = AksSession(self.arm, spec.resource_group, spec.name, kube_connect=self._kube_connect,
                                 credential=self.session.credential if self.session else None)
        return session.kube()


def _provisioning_state(resource: dict[str, Any] | None) -> str:
    if not resource:
        return ""
    props = resource.get("properties") or {}
    return str(props.get("provisioningState") or resource.get("provisioningState") or "").lower()


def _resource_id(kind: str, ref: dict[str, Any], ctx: _Context | None, subscription: str = "") -> str:
    sub = ctx.subscription if ctx else subscription
    group = f"/subscriptions/{sub}/resourceGroups/{ref.get('resource_group', '')}"
    return {
        "resource_group": lambda: group,
        "storage_account": lambda: f"{group}/providers/Microsoft.Storage/storageAccounts/{ref.get('name')}",
        "container": lambda: (f"{group}/providers/Microsoft.Storage/storageAccounts/{ref.get('account')}"
                              f"/blobServices/default/containers/{ref.get('name')}"),
        "identity": lambda: f"{group}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/{ref.get('name')}",
        "cluster": lambda: f"{group}/providers/Microsoft.ContainerService/managedClusters/{ref.get('name')}",
        "agent_pool": lambda: (f"{group}/providers/Microsoft.ContainerService/managedClusters/{ref.get('cluster')}"
                               f"/agentPools/{ref.get('name')}"),
        "maintenance_configuration": lambda: (f"{group}/providers/Microsoft.ContainerService/managedClusters/"
                                              f"{ref.get('cluster')}/maintenanceConfigurations/{ref.get('name')}"),
        "federated_credential": lambda: (f"{group}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/"
                                         f"{ref.get('identity')}/federatedIdentityCredentials/{ref.get('name')}"),
        "role_assignment": lambda: f"{ref.get('scope')}/providers/Microsoft.Authorization/roleAssignments/"
                                   f"{ref.get('name')}",
    }[kind]()
