"""The real az against a local HTTPS ARM: one server and one 'az login --identity' for the session.

Recipe (what works with azure-cli 2.91): a self-signed certificate for IP 127.0.0.1 trusted through
``REQUESTS_CA_BUNDLE``; ``az cloud register`` pointing every endpoint at the server; ``az login --identity``
against its App Service style managed-identity endpoint (``IDENTITY_ENDPOINT`` + ``IDENTITY_HEADER``),
whose token is a JWT with a ``tid`` claim; the server answers ``GET /subscriptions`` with one subscription.
Each test then works in a resource group of its own; the server's violations must stay empty.
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from harness import services as svc
from tests.support.arm_server import ArmServer
from tests.support.arm_server.routes import LRO_POLLS

CLOUD = "ElasticTrainTest"


class AzureAz(svc.AzCli):
    """The isolated az, logged in to the test server's cloud: every call gets the server's environment."""

    def __init__(self, config_dir: Path, server: ArmServer) -> None:
        super().__init__(config_dir)
        self.server = server

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return super().env({**self.server.env, **(extra or {})})


@pytest.fixture(scope="session")
def arm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArmServer]:
    server = ArmServer(tmp_path_factory.mktemp("arm-tls"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def azure_login(arm_server: ArmServer, tmp_path_factory: pytest.TempPathFactory) -> AzureAz:
    try:
        svc.check_dev_extension()
    except svc.ServiceNotFound as exc:
        pytest.fail(str(exc), pytrace=False)
    az = AzureAz(tmp_path_factory.mktemp("azure-config"), arm_server)
    url = arm_server.url + "/"
    az("cloud", "register", "--name", CLOUD, "--endpoint-resource-manager", url,
       "--endpoint-active-directory", url, "--endpoint-active-directory-resource-id", url,
       "--endpoint-active-directory-graph-resource-id", url, "--endpoint-management", url,
       "--suffix-storage-endpoint", "core.windows.net", "--suffix-keyvault-dns", ".vault.azure.net",
       "--skip-endpoint-discovery")
    az("cloud", "set", "--name", CLOUD)
    az("login", "--identity", timeout=120)
    return az


@pytest.fixture
def arm(arm_server: ArmServer) -> Iterator[ArmServer]:
    """The session's server with this test's records only; fails the test on any request violation."""
    arm_server.violations.clear()
    arm_server.requests.clear()
    saved = dict(arm_server.expect)
    yield arm_server
    arm_server.expect.clear()
    arm_server.expect.update(saved)
    arm_server._faults.clear()
    arm_server.lro_polls = LRO_POLLS
    arm_server.principal_unknown.clear()
    arm_server.taken_storage_names.clear()
    arm_server.reset_regions()
    assert arm_server.violations == [], "requests the server rejected:\n" + "\n".join(arm_server.violations)


@pytest.fixture
def az(azure_login: AzureAz, arm: ArmServer) -> AzureAz:  # noqa: ARG001  (arm: per-test records and checks)
    return azure_login


@pytest.fixture
def group() -> str:
    """A resource group name of this test's own."""
    return f"rg-{uuid.uuid4().hex[:10]}"


# Blob storage of the clusters: a real Azurite over HTTPS that takes bearer tokens (``--oauth basic``), behind
# the ARM server's certificate and a front that asks Azure RBAC as Azure storage does (tests.support.blob_front: a
# token whose principal holds no blob data role on the container gets 403); the server gives the clusters' storage
# accounts the front as ``primaryEndpoints.blob``, so az reads events and checkpoints with its login, as it reads
# Azure storage with Entra ID.
@pytest.fixture(scope="module")
def azurite(arm_server, tmp_path_factory):
    """Azurite behind the ARM server's certificate, admitting bearer tokens of principals with a data role; the
    clusters' blob endpoint (the front is ``arm_server.blob_front``, its refusals in ``denied``)."""
    from tests.support.blob_front import BlobFront

    with svc.start_azurite(tmp_path_factory.mktemp("azurite-oauth"), cert=arm_server.cert, key=arm_server.key,
                           oauth=True) as service:
        front = BlobFront(arm_server, service.blob_endpoint)
        arm_server.blob_endpoint = front.endpoint_template
        arm_server.blob_front = front
        try:
            yield service
        finally:
            arm_server.blob_endpoint, arm_server.blob_front = None, None
            front.close()


@pytest.fixture(scope="module")
def container(azurite, arm_server):
    """The clusters' checkpoint container, written to with the account key (the runtime's side)."""
    from azure.storage.blob import ContainerClient

    client = ContainerClient.from_connection_string(azurite.connection_string, "checkpoints",
                                                    connection_verify=str(arm_server.cert))
    client.create_container()
    yield client
    client.close()
