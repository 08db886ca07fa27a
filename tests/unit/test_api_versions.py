"""The ARM test server checks the api-version each SDK client in azure-cli 2.91 really sends.

Builds each client the way _client_factory does (azure-cli's profile 'latest', else the SDK default) and
captures the request an operation would send, without a network, to compare with the server's table.
"""
from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.support.arm_server import API_VERSIONS

RG, NAME = "rg", "name"


class _Captured(Exception):
    pass


def _sent_api_version(resource_type: str, call) -> str:
    from azure.cli.core.profiles import ResourceType
    from azure.cli.core.profiles._shared import AZURE_API_PROFILES, SDKProfile, get_client_class
    from azure.core.credentials import AccessToken
    from azure.core.pipeline.transport import HttpTransport

    seen = {}

    class Transport(HttpTransport):
        def __enter__(self):
            return self

        def __exit__(self, *args):
            pass

        def open(self):
            pass

        def close(self):
            pass

        def send(self, request, **kwargs):
            seen["url"] = request.url
            raise _Captured()

    class Credential:
        def get_token(self, *scopes, **kwargs):
            return AccessToken("t", 2**31)

    rt = getattr(ResourceType, resource_type)
    version = AZURE_API_PROFILES["latest"][rt]
    kwargs = {}
    if isinstance(version, SDKProfile):
        kwargs["profile"] = version.profile  # as get_mgmt_service_client passes it
    elif version:
        kwargs["api_version"] = version
    client = get_client_class(rt)(Credential(), "00000000-0000-0000-0000-000000000000", transport=Transport(),
                                  **kwargs)
    with pytest.raises(_Captured):
        call(client)
    return parse_qs(urlsplit(seen["url"]).query)["api-version"][0]


@pytest.mark.parametrize("provider, resource_type, call", [
    ("Microsoft.Resources", "MGMT_RESOURCE_RESOURCES", lambda c: c.resource_groups.get(RG)),
    ("Microsoft.Storage", "MGMT_STORAGE", lambda c: c.storage_accounts.get_properties(RG, NAME)),
    ("Microsoft.Storage", "MGMT_STORAGE", lambda c: c.blob_containers.get(RG, NAME, NAME)),
    ("Microsoft.ManagedIdentity", "MGMT_MSI", lambda c: c.user_assigned_identities.get(RG, NAME)),
    ("Microsoft.ManagedIdentity", "MGMT_MSI", lambda c: c.federated_identity_credentials.get(RG, NAME, NAME)),
    ("Microsoft.ContainerService", "MGMT_CONTAINERSERVICE", lambda c: c.managed_clusters.get(RG, NAME)),
    ("Microsoft.ContainerService", "MGMT_CONTAINERSERVICE", lambda c: c.agent_pools.get(RG, NAME, NAME)),
    ("Microsoft.ContainerService", "MGMT_CONTAINERSERVICE",
     lambda c: c.maintenance_configurations.get(RG, NAME, "aksManagedNodeOSUpgradeSchedule")),
    ("Microsoft.Features", "MGMT_RESOURCE_FEATURES", lambda c: c.features.get("Microsoft.Compute", "EncryptionAtHost")),
    ("Microsoft.Authorization", "MGMT_AUTHORIZATION", lambda c: c.role_assignments.get("subscriptions/x", NAME)),
    ("Microsoft.Compute", "MGMT_COMPUTE", lambda c: c.virtual_machine_scale_set_vms.simulate_eviction(RG, NAME, "0")),
    ("Microsoft.Compute", "MGMT_COMPUTE", lambda c: list(c.virtual_machine_scale_set_vms.list(RG, NAME))),
    ("Microsoft.Compute", "MGMT_COMPUTE", lambda c: c.virtual_machine_scale_set_vms.get(RG, NAME, "0")),
    ("Microsoft.Compute/skus", "MGMT_COMPUTE", lambda c: list(c.resource_skus.list(filter="location eq 'eastus'"))),
    ("Microsoft.Compute/usages", "MGMT_COMPUTE", lambda c: list(c.usage.list("eastus"))),
])
def test_the_test_server_checks_the_api_version_the_sdk_sends(provider, resource_type, call):
    assert _sent_api_version(resource_type, call) == API_VERSIONS[provider]
