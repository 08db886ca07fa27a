"""One AKS cluster as one command reaches it: ARM, Kubernetes and blob storage, each resolved once.

A command builds one ``AksSession`` and every step reuses it: `job wait` polls the job every few seconds, but
asks ARM for the cluster, its storage account and the user credentials (``listClusterUserCredential``, an
audited action) once, opens one Kubernetes client and one blob client. The clients are injected, so tests give
it a fake ARM and a fake Kubernetes; the CLI gives it ``clients.arm.AzureArm`` and the command's login.

Blob storage (the job's events and checkpoints) is found the way Azure says, not by building a host name: the
storage account's ``primaryEndpoints.blob`` from ARM, plus the cluster's checkpoint container. That is right
for every cloud and DNS endpoint type, and it is also where a test points the reads at a local Azurite. The
reads are authenticated by the ``credential`` the caller gives (the CLI's login: Entra ID, never a key).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from azext_elastictrain.clients.blob import EventReader
from azext_elastictrain.core.aks.arm_bodies import blob_endpoint, spec_from_tags
from azext_elastictrain.core.errors import ClusterNotFound
from azext_elastictrain.core.ports import Arm, KubeClient
from azext_elastictrain.core.constants import GPU_TAINT
from azext_elastictrain.core.spec import ClusterSpec, is_gpu_size_name


@dataclass(frozen=True)
class ClusterSite:
    """What jobs need of a cluster: its names, where its blobs are, and its GPU Spot pool (None: none)."""

    spec: ClusterSpec
    container_url: str  # <primaryEndpoints.blob><container>, no trailing slash
    gpu_pool: dict[str, Any] | None
    pools: tuple[dict[str, Any], ...] = ()

    def job_url(self, job: str) -> str:
        return f"{self.container_url}/{job}"


def gpu_spot_pool(cluster: dict[str, Any]) -> dict[str, Any] | None:
    """The pool the workers need: Spot priority, and GPUs (a GPU size, or the GPU taint create puts on it)."""
    for pool in (cluster.get("properties") or {}).get("agentPoolProfiles") or []:
        spot = pool.get("scaleSetPriority") == "Spot"
        gpu = is_gpu_size_name(pool.get("vmSize")) or GPU_TAINT in (pool.get("nodeTaints") or [])
        if spot and gpu:
            found: dict[str, Any] = pool
            return found
    return None


class AksSession:  # pylint: disable=too-many-instance-attributes  # clients resolved once per command
    """The cluster ``resource_group``/``cluster`` for one command; ``close()`` it (or use it in ``with``)."""

    def __init__(self, arm: Arm, resource_group: str, cluster: str, *, credential: Any = None,
                 kube_connect: Callable[[bytes], KubeClient] | None = None) -> None:
        self.arm, self.resource_group, self.cluster = arm, resource_group, cluster
        self._credential, self._kube_connect = credential, kube_connect
        self._found: dict[str, Any] | None = None
        self._site: ClusterSite | None = None
        self._kube: KubeClient | None = None
        self._events: EventReader | None = None

    @property
    def credential(self) -> Any:
        """The login's token credential the command resolved (for another session of the same command)."""
        return self._credential

    def managed_cluster(self) -> dict[str, Any]:
        """The AKS cluster as ARM shows it (asked once); ClusterNotFound where there is none."""
        if self._found is None:
            found = self.arm.get("cluster", {"resource_group": self.resource_group, "name": self.cluster})
            if found is None:
                raise ClusterNotFound(f"no AKS cluster named {self.cluster!r} in resource group "
                                      f"{self.resource_group!r}")
            self._found = found
        return self._found

    def site(self) -> ClusterSite:
        """The cluster as jobs see it: its names, its blob container's URL and its pools (asked once)."""
        if self._site is None:
            found = self.managed_cluster()
            spec = spec_from_tags(ClusterSpec(name=self.cluster, resource_group=self.resource_group,
                                              subscription=self.arm.subscription), found)
            account = self.arm.get("storage_account", {"resource_group": self.resource_group,
                                                       "name": spec.storage_account_name})
            container_url = spec.checkpoint_url(blob_endpoint(account, spec, self.arm.storage_suffix))
            pools = tuple((found.get("properties") or {}).get("agentPoolProfiles") or [])
            self._site = ClusterSite(spec, container_url, gpu_spot_pool(found), pools)
        return self._site

    def kube(self) -> KubeClient:
        """The cluster's Kubernetes API: its address and CA from the user kubeconfig (fetched once, kept in
        memory), reached with the login's Entra ID token (or, on a local-accounts cluster, the kubeconfig's own
        credentials)."""
        if self._kube is None:
            kubeconfig = self.arm.user_kubeconfig(self.resource_group, self.cluster)
            if self._kube_connect is not None:
                self._kube = self._kube_connect(kubeconfig)
            else:
                from azext_elastictrain.clients.kube import connect

                self._kube = connect(kubeconfig, credential=self._credential)
        return self._kube

    def events(self) -> EventReader:
        """Job name -> its events in the cluster's blob storage, over one client, read with the login."""
        if self._events is None:
            self._events = EventReader(self.site().container_url, credential=self._credential,
                                       grant=self.grant_command)
        return self._events

    def grant_command(self) -> str:
        """The exact 'az role assignment create' that gives the login the data role the CLI's blob reads need on
        the cluster's checkpoint container (what a 403 from blob tells the user to run)."""
        from azext_elastictrain.core.aks.arm_bodies import container_id, role_assignment_command

        try:
            principal = self.arm.signed_in_principal()[0]
        except Exception:  # pylint: disable=broad-exception-caught  # the command still helps: az finds the id
            principal = "$(az ad signed-in-user show --query id -o tsv)"
        return role_assignment_command(principal, container_id(self.arm.subscription, self.site().spec))

    def close(self) -> None:
        close = getattr(self._kube, "close", None)  # the official client holds a connection pool and files
        if close is not None:
            close()
        self._kube = None
        if self._events is not None:
            self._events.close()
            self._events = None

    def __enter__(self) -> "AksSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
