"""Where clusters and jobs run: one contract (``base.Backend``), one package per place, imported only when chosen.

``local``: real etcd, Azurite and torchrun processes on this machine.
``aks``: a cluster on Azure (AKS, storage, identity) through ARM, Kubernetes and blob clients given to it.

Each factory imports its backend's module on first use, so loading the CLI imports none of them, and says which
``Backend`` it returns: the type checker holds each backend to the contract, method by method.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from azext_elastictrain.backends.aks.plans import AksClusterDeletion, AksJob, AksJobDeletion, AksSchedule
    from azext_elastictrain.backends.base import Backend
    from azext_elastictrain.backends.local.plans import LocalEviction, LocalJobDeletion, LocalSchedule
    from azext_elastictrain.core.aks.eviction import EvictionPlan
    from azext_elastictrain.core.ports import Arm, KubeClient
    from azext_elastictrain.core.spec import ClusterSpec, JobSpec, LocalClusterSpec

    LocalContract = Backend[LocalClusterSpec, None, JobSpec, LocalJobDeletion, LocalEviction, LocalSchedule]
    AksContract = Backend[ClusterSpec, AksClusterDeletion, AksJob, AksJobDeletion, EvictionPlan, AksSchedule]


def local_backend(state_root: Path, cluster: str) -> LocalContract:
    """The local cluster ``cluster``, its state under ``state_root`` (the az config dir's elastictrain/local)."""
    from azext_elastictrain.backends.local.backend import LocalBackend

    return LocalBackend(state_root, cluster)


def aks_backend(arm: Arm, resource_group: str | None, cluster: str | None, *, credential: Any = None,
                kube_connect: Callable[[bytes], KubeClient] | None = None,
                progress: Callable[[str], None] | None = None,
                spot_market: Callable[[str, str], dict[str, Any]] | None = None) -> AksContract:
    """The AKS cluster ``cluster`` of ``resource_group`` (None: every cluster of the subscription, for list)."""
    from azext_elastictrain.backends.aks.backend import AksBackend

    return AksBackend(arm, resource_group, cluster, credential=credential, kube_connect=kube_connect,
                      progress=progress, spot_market=spot_market)
