"""What users ask for, validated before anything is created. Pure, but for JobSpec looking that its script exists."""
from __future__ import annotations

import re
from dataclasses import dataclass

LOCAL_CLUSTER_DEFAULT = "local"

_LOCAL_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")


class SpecError(ValueError):
    """A spec that cannot be built: the message says what and how to fix it."""


@dataclass(frozen=True)
class LocalClusterSpec:
    """A cluster of real processes on this machine: etcd, Azurite, Scheduled Events."""

    name: str = LOCAL_CLUSTER_DEFAULT

    def validate(self) -> "LocalClusterSpec":
        if not _LOCAL_NAME.fullmatch(self.name or ""):
            raise SpecError(
                f"invalid local cluster name {self.name!r}: use 1-32 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return self


@dataclass(frozen=True)
class JobSpec:
    """An elastic job: ``nodes`` torchrun agents (between ``min_nodes`` and ``max_nodes``) running ``script``.

    ``nodes`` defaults to ``max_nodes``. ``script`` must be an existing file
    (checked by ``validate``, the one look at the file system here).
    """

    name: str
    script: str
    min_nodes: int = 1
    max_nodes: int = 1
    nodes: int | None = None
    nproc_per_node: int = 1
    script_args: tuple[str, ...] = ()
    checkpoint_interval: int | None = None
    keep: int = 3
    cluster: str = LOCAL_CLUSTER_DEFAULT

    @property
    def node_count(self) -> int:
        return self.max_nodes if self.nodes is None else self.nodes

    def node_names(self) -> list[str]:
        return [f"{self.name}-node-{i}" for i in range(self.node_count)]

    def validate(self) -> "JobSpec":
        import os

        from azext_elastictrain.core.layout import validate_job_name

        try:
            validate_job_name(self.name)
        except ValueError as ex:
            raise SpecError(str(ex)) from ex
        LocalClusterSpec(self.cluster).validate()
        for flag, value in (("--min-nodes", self.min_nodes), ("--max-nodes", self.max_nodes),
                            ("--nproc-per-node", self.nproc_per_node)):
            _at_least_one(flag, value)
        if self.min_nodes > self.max_nodes:
            raise SpecError(f"--min-nodes {self.min_nodes} is more than --max-nodes {self.max_nodes}: "
                            "the job may shrink to min and grow to max, so min <= max")
        if self.nodes is not None:
            _at_least_one("--nodes", self.nodes)
            if not self.min_nodes <= self.nodes <= self.max_nodes:
                raise SpecError(f"--nodes {self.nodes} is outside --min-nodes {self.min_nodes} .. "
                                f"--max-nodes {self.max_nodes}: start between the two (default: max)")
        if self.checkpoint_interval is not None:
            _at_least_one("--checkpoint-interval", self.checkpoint_interval)
        _at_least_one("--keep", self.keep)
        if not self.script:
            raise SpecError("no training script: pass --script PATH")
        if not os.path.isfile(self.script):
            raise SpecError(f"training script {self.script!r} is not a file: pass the path of a Python script "
                            "that runs under torchrun (e.g. scripts/train_cifar10.py)")
        return self


def _at_least_one(flag: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{flag} must be a whole number of at least 1, not {value!r}")
