"""Errors every backend and client raises alike; ``_errors.py`` maps them (and each backend's own) to az errors.

Pure: no knack, no azure.cli, no SDK.
"""
from __future__ import annotations


class ArmError(Exception):
    """ARM answered with an error: ``status`` (HTTP), ``code`` and ``message`` from its error body.

    Raised by ``clients.arm`` (the SDK boundary), read by the AKS backend (a 404 is "not there")."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.status, self.code, self.message = status, code, message


class ClusterNotFound(LookupError):
    """No cluster of that name (local, or AKS in that resource group)."""


class JobNotFound(LookupError):
    """No job (or no rank, or no pod of it) of that name on the cluster."""


class EvictionError(RuntimeError):
    """An eviction could not be carried out, or the job did not recover from it in time."""


class CommandError(Exception):
    """A command cannot go on as asked; ``recommendation`` says how to fix it (the az error's second line)."""

    def __init__(self, message: str, recommendation: str | None = None) -> None:
        super().__init__(message)
        self.recommendation = recommendation


class OptionNotHere(CommandError):
    """An option that the chosen backend does not have (e.g. --rank on a local job): a usage error."""


class NotReached(CommandError):
    """A job ended, or time ran out, before it got where `job wait` was asked to wait for."""


class NotSupported(CommandError):
    """What was asked cannot be done on this cluster (e.g. evicting a cluster that has no Spot pool)."""
