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
