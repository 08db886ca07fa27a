"""One local cluster's home, bound to its name: where its jobs live and how its storage is reached.

A job is recorded in ``<state root>/<cluster>/jobs/<job>/job.json`` (record.py says what it holds), next to its
nodes' logs; one job-changing command at a time per cluster holds ``jobs/.lock``. The cluster's own record
(``cluster.json``, cluster.py) says where its etcd, Azurite and Scheduled Events listen: ``open_job`` reads it
once with the job's record, so one command step reads each file once and hands what it read on.

Every read and write of a job's files goes through here (the files themselves: state.py); starting, following
and stopping jobs (starting.py, following.py, stopping.py) and evicting their nodes (evict.py) are given a home.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from azext_elastictrain.backends.local.state import FileLock, read_state, write_state
from azext_elastictrain.clients.blob import EventReader
from azext_elastictrain.core.constants import CHECKPOINT_CONTAINER
from azext_elastictrain.core.errors import ClusterNotFound, JobNotFound
from azext_elastictrain.core.spec import LocalClusterSpec

if TYPE_CHECKING:
    from azext_elastictrain.backends.local.cluster import LocalClusters
    from azext_elastictrain.core.blobstore import BlobStore


class ClusterHome:
    """The jobs' folder of local cluster ``name`` of ``clusters`` (cluster.py's LocalClusters), and its storage."""

    def __init__(self, clusters: LocalClusters, name: str) -> None:
        self.clusters = clusters
        self.name = name

    # -- where things are ------------------------------------------------------------------------------------
    @property
    def jobs_dir(self) -> Path:
        return self.clusters.cluster_dir(self.name) / "jobs"

    def job_dir(self, job: str) -> Path:
        return self.jobs_dir / job

    def lock(self) -> FileLock:
        """One job-changing command at a time per cluster (two `job run`s of one name must not both start)."""
        return FileLock(self.jobs_dir / ".lock")

    # -- job records -----------------------------------------------------------------------------------------
    def job_names(self) -> list[str]:
        jobs = self.jobs_dir
        if not jobs.is_dir():
            return []
        return sorted(p.name for p in jobs.iterdir() if (p / "job.json").is_file())

    def load_job(self, job: str) -> dict[str, Any] | None:
        return read_state(self.job_dir(job) / "job.json", f"job {job!r}")

    def save_job(self, state: dict[str, Any]) -> None:
        write_state(self.job_dir(state["name"]) / "job.json", state)

    def jobs(self) -> list[dict[str, Any]]:
        """The record of every job of the cluster."""
        return [job for job in (self.load_job(j) for j in self.job_names()) if job]

    def _check_names(self, job: str) -> None:
        """The cluster's and the job's names become paths: never '..' or '/'."""
        from azext_elastictrain.core.layout import validate_job_name
        from azext_elastictrain.core.spec import SpecError

        LocalClusterSpec(self.name)
        try:
            validate_job_name(job)
        except ValueError as ex:
            raise SpecError(str(ex)) from ex

    def require_job(self, job: str) -> dict[str, Any]:
        """The job's record; SpecError, ClusterNotFound or JobNotFound, in that order."""
        self._check_names(job)
        if self.clusters.load(self.name) is None:
            raise ClusterNotFound(f"no local cluster named {self.name!r}")
        return self._recorded(job)

    def open_job(self, job: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The job's record and the cluster's connection, each file read once; refused as ``require_job``."""
        self._check_names(job)
        conn = self.connection()  # ClusterNotFound
        return self._recorded(job), conn

    def _recorded(self, job: str) -> dict[str, Any]:
        state = self.load_job(job)
        if state is None:
            raise JobNotFound(f"no job named {job!r} on local cluster {self.name!r}")
        return state

    # -- its storage -----------------------------------------------------------------------------------------
    def connection(self) -> dict[str, Any]:
        """Where the cluster's services listen, read from its record now (cluster.py: ``connection``)."""
        return self.clusters.connection(self.name)

    @staticmethod
    def checkpoint_url(job: str, conn: dict[str, Any]) -> str:
        """The blob URL of the job's prefix, as the cluster's storage is reached now."""
        return f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}/{job}"

    @staticmethod
    def event_reader(conn: dict[str, Any]) -> EventReader:
        return EventReader(f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}",
                           connection_string=conn["connection_string"])

    @staticmethod
    def job_store(conn: dict[str, Any]) -> BlobStore:
        from azext_elastictrain.core.blobstore import BlobStore

        return BlobStore.from_url(f"{conn['blob_endpoint']}/{CHECKPOINT_CONTAINER}",
                                  connection_string=conn["connection_string"], quick_retries=True)

    def checkpoint_location(self, job: str) -> tuple[str, str]:
        """The job's checkpoint URL and the connection string that reaches it (never to be printed)."""
        self._check_names(job)
        conn = self.connection()
        return self.checkpoint_url(job, conn), conn["connection_string"]
