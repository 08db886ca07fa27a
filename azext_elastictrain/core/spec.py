"""What users ask for, validated before anything is created. Pure."""
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
