"""Client factories: each ``cf_*`` builds an SDK client the way azure-cli does (``get_mgmt_service_client``
with the profile's ResourceType, so the api-versions are azure-cli's). SDK imports stay inside functions.
The adapter over them that the AKS backend uses is ``clients.arm.AzureArm``.

The clients (whose class follows the profile's api-version) and knack's ``cli_ctx`` are Any here: the type checker
does not read the SDKs or knack (mypy.ini); ``clients.arm`` types what it takes from them.
"""
from __future__ import annotations

from typing import Any


def _mgmt_client(cli_ctx: Any, resource_type_name: str, **kwargs: Any) -> Any:
    from azure.cli.core.commands.client_factory import get_mgmt_service_client
    from azure.cli.core.profiles import ResourceType

    return get_mgmt_service_client(cli_ctx, getattr(ResourceType, resource_type_name), **kwargs)


def cf_resources(cli_ctx: Any, *_: Any) -> Any:
    return _mgmt_client(cli_ctx, "MGMT_RESOURCE_RESOURCES")


def cf_storage(cli_ctx: Any, *_: Any) -> Any:
    return _mgmt_client(cli_ctx, "MGMT_STORAGE")


def cf_msi(cli_ctx: Any, *_: Any) -> Any:
    return _mgmt_client(cli_ctx, "MGMT_MSI")


def cf_containerservice(cli_ctx: Any, *_: Any) -> Any:
    return _mgmt_client(cli_ctx, "MGMT_CONTAINERSERVICE")


def cf_features(cli_ctx: Any, *_: Any) -> Any:
    """Microsoft.Features: whether the subscription registered a preview feature (e.g. EncryptionAtHost)."""
    return _mgmt_client(cli_ctx, "MGMT_RESOURCE_FEATURES")


def cf_authorization(cli_ctx: Any, *_: Any) -> Any:
    return _mgmt_client(cli_ctx, "MGMT_AUTHORIZATION")


def cf_compute(cli_ctx: Any, *_: Any, subscription_id: str | None = None) -> Any:
    """The compute client (VMSS instances of AKS nodes) of ``subscription_id`` (default: the logged-in one)."""
    return _mgmt_client(cli_ctx, "MGMT_COMPUTE", **({"subscription_id": subscription_id} if subscription_id else {}))


def command_subscription(cli_ctx: Any) -> str:
    """The subscription az resolved for this command: ``--subscription`` where given, else the default.

    The SDK clients already use it (get_mgmt_service_client reads it); the ids and role scopes we build must too.
    """
    from azure.cli.core.commands.client_factory import get_subscription_id

    subscription: str = get_subscription_id(cli_ctx)
    return subscription
