"""The ARM test server's identities: subscriptions, tenant, the login and its tokens, certificates."""
from __future__ import annotations

import base64
import datetime
import json
import uuid
from pathlib import Path
from typing import Any


SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"  # the login's default


OTHER_SUBSCRIPTION = "00000000-5555-6666-7777-888888888888"  # also in the login: what --subscription can pick


SUBSCRIPTIONS = (SUBSCRIPTION, OTHER_SUBSCRIPTION)


TENANT = "72f988bf-0000-4000-8000-000000000001"


IDENTITY_HEADER = "test-identity-header"


ACCESS_TOKEN_SECRET = "arm-access-token-signature-SECRET"  # base64url-encoded into the JWT's signature  # what a leak scan looks for


KUBE_TOKEN = "kube-user-token-SECRET-do-not-print"


#: The application every AKS API server of AKS-managed Entra ID accepts tokens for (the audience it checks).
AKS_SERVER_APP = "6dae42f8-4368-4678-94ff-3960e28e3630"


#: Azure's answer to listClusterAdminCredential (and other static credentials) on a cluster with local accounts
#: disabled (status 400, as reported from real clusters, e.g. hashicorp/terraform-provider-azurerm#15489).
STATIC_CREDENTIAL_REFUSED = ("Getting static credential is not allowed because this cluster is set to disable "
                             "local accounts.")


STORAGE_KEY = "c3RvcmFnZS1hY2NvdW50LWtleS1TRUNSRVQ="  # never asked for: shared keys are off


BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"


BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"


BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"


#: The built-in roles with blob data actions (Owner/Contributor of a subscription have none)
BLOB_DATA_ROLES = frozenset({BLOB_DATA_CONTRIBUTOR, BLOB_DATA_READER, BLOB_DATA_OWNER})


AKS_RBAC_CLUSTER_ADMIN = "b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b"  # Azure Kubernetes Service RBAC Cluster Admin


LOGIN_OBJECT_ID = "11111111-2222-3333-4444-555555555555"  # the oid of the managed identity az logs in with


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (SAN IP) and localhost: (cert.pem, key.pem)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _jwt(claims: dict) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    signature = base64.urlsafe_b64encode(ACCESS_TOKEN_SECRET.encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.{signature}"


def _claims(token: str) -> dict:
    """A JWT's payload, unverified (the test server issued it)."""
    try:
        part = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError, AttributeError):
        return {}


def _kube_ca():
    """The CA of the (one) Kubernetes cluster this server fronts: it signs local-account client certificates."""
    from tests.support.kube_apiserver import certificate

    return certificate("cluster-ca", None, None, ca=True)


def _signed_certificate(name: str, ca_key, ca_cert):
    from tests.support.kube_apiserver import certificate

    return certificate(name, ca_key, ca_cert)


def _pem(item) -> bytes:
    from tests.support.kube_apiserver import pem

    return pem(item)


class IdentityFront:  # pylint: disable=too-few-public-methods
    """The login: the managed-identity token endpoint, and the certificates of the clusters' local accounts.
    A part of ArmServer: its state is the server's."""

    def _token(self, headers: dict, query: dict) -> tuple[int, dict, Any]:
        if headers.get("x-identity-header") != IDENTITY_HEADER:
            return 401, {}, {"error": "missing X-IDENTITY-HEADER"}
        resource = query.get("resource", "")
        expires = int(datetime.datetime.now(datetime.timezone.utc).timestamp()) + 3600
        issued = expires - 3600 - 300  # nbf and iat: Azurite's OAuth check wants both
        token = _jwt({"aud": resource, "tid": TENANT, "nbf": issued, "iat": issued, "jti": str(uuid.uuid4()),
                      "oid": LOGIN_OBJECT_ID,
                      "appid": "66666666-7777-8888-9999-000000000000", "exp": expires,
                      "iss": f"https://sts.windows.net/{TENANT}/"})
        return 200, {}, {"access_token": token, "expires_on": str(expires), "resource": resource,
                         "token_type": "Bearer", "client_id": "66666666-7777-8888-9999-000000000000"}

    def client_certificate(self, name: str = "clusterAdmin") -> bytes:
        """A client certificate (and its key, PEM) of the cluster CA: what a local account presents."""
        key, cert = _signed_certificate(name, self._kube_ca_key, self._kube_ca)
        return _pem(cert) + _pem(key)
