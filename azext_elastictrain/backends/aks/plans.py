"""What the AKS backend's plans carry to their send step (``backends.base.Plan[R]``'s ``R``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azext_elastictrain.core.chaos import Schedule


@dataclass(frozen=True)
class AksJob:
    """The job's Kubernetes objects, in apply order: the job object (ElasticJob or batch/v1 Job) last."""

    objects: tuple[dict[str, Any], ...]

    @property
    def job_object(self) -> dict[str, Any]:
        return self.objects[-1]


@dataclass(frozen=True)
class AksJobDeletion:
    """The job object to delete (its pods go with it), k8s-job's headless Service of the same name, and an
    in-process job's coordinator objects (apiVersion, kind, name), deleted after the job."""

    api_version: str
    kind: str
    name: str
    namespace: str
    with_service: bool
    coordinator: tuple[tuple[str, str, str], ...] = ()
    guards: tuple[tuple[str, str, str], ...] = ()  # the workers' NetworkPolicy and Secret, deleted last


@dataclass(frozen=True)
class AksClusterDeletion:
    """The resources to delete in order, and those kept (``ClusterDeletion.delete_plan``'s plan)."""

    steps: dict[str, Any]


@dataclass(frozen=True)
class AksSchedule:
    job: str
    schedule: Schedule
    min_nodes: int
    pools: tuple[str, ...]
