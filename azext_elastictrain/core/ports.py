"""The ports to the outside systems the backends call: what each backend needs from ARM, the VM scale sets behind
AKS nodes and Kubernetes, as Protocols of plain dicts (the services' wire format).

One az-free module, so that ``core`` and the backends name them without importing the CLI or an SDK; the real
implementations are ``clients.arm.AzureArm`` (ARM and Compute) and ``clients.kube.OfficialKubeClient``, the tests'
are fakes of these same interfaces. Errors: ``core.errors.ArmError`` (ARM, Compute), ``clients.kube.KubeError``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol

if TYPE_CHECKING:
    from azext_elastictrain.core.aks.eviction import VmssInstance


class Compute(Protocol):
    """The VMSS instances behind AKS nodes."""

    def simulate_eviction(self, instance: VmssInstance) -> None:
        """POST .../virtualMachines/{id}/simulateEviction; 204."""

    def vmss_instance(self, instance: VmssInstance) -> dict[str, Any] | None:
        """The instance, or None where it does not exist (404)."""


class Arm(Compute, Protocol):
    """Azure Resource Manager as the AKS backend needs it. ``kind``: one of ``backends.aks.cluster.KINDS``;
    ``ref``: its names.

    ``get`` returns the resource in wire format (camelCase) or None if it does not exist. ``put``/``delete`` with
    ``wait=False`` return once ARM accepted the request. Also a ``core.aks.preflight.RegionApi``.
    """

    subscription: str
    tenant: str
    storage_suffix: str  # the cloud's storage DNS suffix (core.windows.net in the public cloud)

    def get(self, kind: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        ...

    def put(self, kind: str, ref: dict[str, Any], body: dict[str, Any], wait: bool = True) -> dict[str, Any] | None:
        ...

    def delete(self, kind: str, ref: dict[str, Any], wait: bool = True) -> None:
        ...

    def list_clusters(self, resource_group: str | None) -> list[dict[str, Any]]:
        ...

    def user_kubeconfig(self, resource_group: str, cluster: str) -> bytes:
        ...

    def resource_skus(self, location: str) -> list[dict[str, Any]]:
        ...  # Microsoft.Compute/skus of the location

    def signed_in_principal(self) -> tuple[str, str | None]:
        ...  # (object id, User|ServicePrincipal) of the login

    def usages(self, location: str) -> list[dict[str, Any]]:
        ...  # Microsoft.Compute/locations/{location}/usages

    def feature_state(self, namespace: str, feature: str) -> str:
        ...  # Microsoft.Features: e.g. "Registered"

    def storage_name_available(self, name: str) -> dict[str, Any]:
        ...  # Microsoft.Storage/checkNameAvailability: {"nameAvailable", "reason", "message"}


class KubeClient(Protocol):
    """What the extension needs from a cluster. ``obj``s are plain dicts in the REST shape."""

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or update (server-side apply, field manager ``elastictrain``, no force); idempotent."""

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None where it (or its kind) does not exist."""

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        """Objects of a kind (all namespaces when ``namespace`` is None), each with apiVersion and kind."""

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete (dependents in the background); False where there was nothing to delete."""

    def pod_logs(self, name: str, namespace: str, container: str | None = None, follow: bool = False,
                 tail: int | None = None) -> Iterator[str]:
        """The lines of a pod's (container's) log, without their line ends; the last ``tail`` only when
        given. ``follow``: keep yielding new lines until the container exits. A missing pod raises
        ``clients.kube.KubeError`` (status 404) at the call, not at the first line."""

    def watch(self, api_version: str, kind: str, name: str, namespace: str | None = None,
              timeout: float = 60.0) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) for each change of one object until ``timeout`` seconds passed (the stream
        then ends); the first event is the object as it is (ADDED). Nothing where its kind is not served."""
