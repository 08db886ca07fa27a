"""A local HTTPS Azure Resource Manager for contract tests, with a managed-identity endpoint and a Kubernetes API.

The real ``az`` (and the SDK clients inside it) talk to it exactly as to Azure:

* **ARM**: stateful per resource id; answers like the official x-ms-examples (reference/azure-rest-api-specs):
  status codes, bodies with read-only fields (ids, provisioningState, principalId, issuer URL, ...);
  long-running operations poll through ``Azure-AsyncOperation`` (AKS PUTs) or ``Location`` (storage create,
  AKS delete) with ``Retry-After: 1``, InProgress once, then Succeeded.
* **Checks** every request: method, path, the SDK's api-version for its provider, and body fields and values
  (Spot settings, taints, autoscale bounds, storage security settings, role and scope). A violation is
  recorded in ``violations`` (and answered 400 so the client fails loudly); tests assert there is none.
* **Faults**: ``fail_once(method, path_suffix, status, code)`` answers the next matching request with an
  ARM error body (400/409/...), to test error mapping and re-runs after a failure half-way.
* **Login**: ``/msi/token`` is an App Service style managed-identity endpoint (``IDENTITY_ENDPOINT`` +
  ``IDENTITY_HEADER``) whose token is a JWT with a ``tid`` claim; ``GET /subscriptions`` lists two (the first
  is the login's default, the other is for ``--subscription``).
* **Spot evictions**: the VMSS instances behind the AKS nodes live in the cluster's node resource group (list,
  get, ``simulateEviction``, shaped like the compute examples); ``seed_aks_training`` puts a cluster there
  with its nodes, VMs and a running ElasticJob. ``simulateEviction`` answers 204, the instance is gone at once
  (list drops it, get is 404) and, ``expect["node_gone_after"]`` seconds later, so are its Kubernetes node
  and the pods bound to it, as the cloud node manager and pod garbage collection do.
  A token for ``https://storage.azure.com`` passes Azurite's OAuth check: with ``blob_endpoint`` set to an
  HTTPS Azurite, the storage accounts' ``primaryEndpoints.blob`` send blob reads there.
* **Kubernetes**: ``listClusterUserCredential`` returns the kubeconfig AKS gives, whose server is
  ``/kube/<group>/<cluster>`` on this server (CA: this server's certificate). For an Entra ID-only cluster
  (``aadProfile.managed`` and ``disableLocalAccounts``) its user is the ``kubelogin`` exec plugin and
  ``listClusterAdminCredential`` is refused with Azure's error; for a local-accounts cluster the user is a client
  certificate (signed by the cluster CA this server trusts) and a token. The front is a REST server for
  ``tests.support.fake_kube`` (discovery, server-side apply, get, list, delete, logs) that authenticates as the
  API server of that cluster: an Entra ID-only one takes only a bearer JWT of this tenant whose audience is the
  AKS server application and that has not expired - a client certificate, a missing token or another audience is
  a 401 ``Status`` - and a local-accounts one its client certificate or static token. ``kube_token_uses`` makes
  every Entra ID token expire after that many requests (a token expiring in the middle of a command); each
  request is recorded in ``kube_requests`` with how it authenticated.

Everything listens on 127.0.0.1 and stops on ``close()``.
"""
from __future__ import annotations

import base64
import copy
import datetime
import itertools
import json
import re
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import kube_apiserver as kube_api
from tests.support.fake_kube import FakeKube

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

#: api-version each provider's SDK sends, as azure-cli 2.91 builds its clients (profile 'latest' or the SDK's
#: default where the profile has none). tests/unit/test_api_versions.py checks these against the SDKs.
API_VERSIONS = {
    "Microsoft.Resources": "2024-11-01",
    "Microsoft.Storage": "2025-08-01",
    "Microsoft.ManagedIdentity": "2024-11-30",
    "Microsoft.ContainerService": "2026-06-01",
    "Microsoft.Authorization": "2022-04-01",
    "subscriptions": "2022-12-01",
    "Microsoft.Compute": "2024-11-01",  # virtual_machine_scale_set_vms under azure-cli's compute profile
    "Microsoft.Compute/skus": "2019-04-01",  # resource_skus: the profile pins its own
    "Microsoft.Compute/usages": "2024-11-01",  # usage: the profile's default for compute
    "Microsoft.Features": "2021-07-01",  # features: azure-cli's profile for MGMT_RESOURCE_FEATURES
}
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
#: The built-in roles with blob data actions (Owner/Contributor of a subscription have none)
BLOB_DATA_ROLES = frozenset({BLOB_DATA_CONTRIBUTOR, BLOB_DATA_READER, BLOB_DATA_OWNER})
AKS_RBAC_CLUSTER_ADMIN = "b1ff04bb-8a4e-4dc4-8eb5-8693973ce19b"  # Azure Kubernetes Service RBAC Cluster Admin
LOGIN_OBJECT_ID = "11111111-2222-3333-4444-555555555555"  # the oid of the managed identity az logs in with
LRO_POLLS = 1  # InProgress answers before Succeeded (one shows the client polls; each costs a Retry-After: 1 s)


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


def _entra_only(cluster: dict) -> bool:
    props = cluster.get("properties") or {}
    return bool((props.get("aadProfile") or {}).get("managed") and props.get("disableLocalAccounts"))


def _kube_status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


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


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


def _error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


class ArmServer:
    """See the module docstring. ``expect`` holds the values the test wants on the wire."""

    def __init__(self, folder: Path) -> None:
        self.cert, self._key = make_certificate(folder)
        self.key = self._key  # for other local services behind the same trusted certificate (Azurite)
        self.resources: dict[str, dict] = {}  # lower-case id -> resource (wire format)
        self.operations: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path?query)
        self.violations: list[str] = []
        self.timeline: list[tuple[float, str, str]] = []
        self.expect: dict[str, Any] = {}
        self.reset_expect()
        self.kube = FakeKube()
        self.kube_requests: list[dict] = []  # method, path, cluster, auth ("token"/"certificate"/None), jti, status
        self.kube_token_uses: int | None = None  # an Entra ID token is refused after this many requests
        self.kube_watches: list[tuple[str, str]] = []  # (kind, name) of each watch asked for
        self._token_uses: dict[str, int] = {}
        self._kube_ca_key, self._kube_ca = _kube_ca()
        self.skus: dict[str, list[dict]] = {}  # location -> Resource SKUs entries (reset_regions)
        self.usages: dict[str, list[dict]] = {}  # location -> compute usages
        #: the subscription's preview features (Microsoft.Features): lower-case "namespace/name" -> state
        self.features: dict[str, str] = {}
        self.reset_regions()
        #: primaryEndpoints.blob of the storage accounts it creates (None: Azure's); tests point it at Azurite.
        #: ``{account}`` in it is replaced by the account's name (the blob front serves each account under its name)
        self.blob_endpoint: str | None = None
        self.blob_front: Any = None  # tests.support.blob_front.BlobFront where a test serves blob through it
        #: Storage account names held elsewhere in Azure (other subscriptions): one namespace for the whole cloud
        self.taken_storage_names: set[str] = set()
        #: principal id -> how many more role assignment PUTs for it Entra ID answers PrincipalNotFound
        self.principal_unknown: dict[str, int] = {}
        self._faults: list[tuple[str, str, int, str, str]] = []
        self._caller: str | None = None  # the object id in the token of the ARM request being handled
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self._key)
        # Kubernetes clients of local-account clusters present a certificate of the cluster CA; nothing else does
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cadata=_pem(self._kube_ca).decode())
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="arm-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ test controls

    def reset_expect(self) -> None:
        """What a create with no options sends in the test regions: the T4 pool (ephemeral OS disk: 176 GiB temp
        disk) and the D4ds_v5 system pool (150 GiB), host encryption on (sizes support it, feature registered)."""
        self.expect.clear()
        self.expect.update({"gpu_vm_size": "Standard_NC4as_T4_v3", "min_count": 0, "max_count": 3,
                            "spot_max_price": -1, "eviction_policy": "Delete", "storage_sku": "Standard_LRS",
                            "node_gone_after": 0.5, "upgrade_channel": "patch", "system_os_disk": "Ephemeral",
                            "gpu_os_disk": "Ephemeral", "encryption_at_host": True, "storage_default_action": "Allow"})

    def fail_once(self, method: str, path_suffix: str, status: int = 400, code: str = "BadRequest",
                  message: str = "injected failure") -> None:
        """Answer the next ``method`` request whose path ends with ``path_suffix`` with an ARM error."""
        self._faults.append((method.upper(), path_suffix.lower(), status, code, message))

    def autoscale(self, group: str, cluster: str, pool: str, count: int) -> None:
        """The cluster autoscaler sets a pool's node count within its bounds: in the cluster's profiles, and in
        the pool resource where the pool was made by an agent pool PUT."""
        with self._lock:
            cluster_id = f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/{cluster}"
            found = self.find(cluster_id)
            profiles = [p for p in found["properties"]["agentPoolProfiles"] if p["name"] == pool]
            resource = self.find(f"{cluster_id}/agentpools/{pool}")
            for props in profiles + ([resource["properties"]] if resource else []):
                assert props.get("enableAutoScaling") and props["minCount"] <= count <= props["maxCount"], props
                props["count"] = count

    def auto_upgrade(self, group: str, cluster: str, version: str) -> None:
        """AKS's auto-upgrade channel moved the cluster and its pools to ``version`` (a patch). AKS then answers the
        new patch in ``kubernetesVersion`` and ``orchestratorVersion`` too, not only in the current* fields, though
        "1.33" was asked (Azure/AKS#3573; Azure/terraform-azurerm-aks#335 for the pools)."""
        with self._lock:
            cluster_id = f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/{cluster}"
            found = self.find(cluster_id)
            found["properties"].update(kubernetesVersion=version, currentKubernetesVersion=version)
            pools = [r for rid, r in self.resources.items() if f"{cluster_id.lower()}/agentpools/" in rid]
            for props in [p["properties"] for p in pools] + found["properties"]["agentPoolProfiles"]:
                props.update(orchestratorVersion=version, currentOrchestratorVersion=version)

    def reset_regions(self) -> None:
        """Every test region offers the GPU sizes of ``GPU_SIZES`` with Spot, unrestricted, and 100 Spot vCPUs; the
        subscription has registered encryption at host."""
        self.skus = {location: region_skus(location) for location in REGIONS}
        self.usages = {location: region_usages() for location in REGIONS}
        self.features = {"microsoft.compute/encryptionathost": "Registered"}
        #: Resource Graph's Spot eviction-rate bands: region -> lower-case size -> band (the H200 has none)
        self.spot_eviction_rates = {location: {"standard_nc4as_t4_v3": "0-5", "standard_nc24ads_a100_v4": "5-10",
                                               "standard_nc40ads_h100_v5": "10-15", "standard_nd96isr_h100_v5": "20+"}
                                    for location in REGIONS}
        #: Resource Graph's latest Linux Spot prices in USD (the tests' own figures): region -> size -> price
        self.spot_prices_usd = {location: {"standard_nc4as_t4_v3": 0.0771, "standard_nc24ads_a100_v4": 0.7213}
                                for location in REGIONS}

    def sku(self, location: str, name: str) -> dict:
        """The Resource SKUs entry of a size in a region, for a test to restrict or change."""
        return next(s for s in self.skus[location] if s["name"].lower() == name.lower())

    def spot_quota(self, location: str) -> dict:
        return next(u for u in self.usages[location] if u["name"]["value"] == "lowPriorityCores")

    def client_certificate(self, name: str = "clusterAdmin") -> bytes:
        """A client certificate (and its key, PEM) of the cluster CA: what a local account presents."""
        key, cert = _signed_certificate(name, self._kube_ca_key, self._kube_ca)
        return _pem(cert) + _pem(key)

    def find(self, suffix: str) -> dict | None:
        return next((r for rid, r in self.resources.items() if rid.endswith(suffix.lower())), None)

    def writes(self) -> list[tuple[str, str]]:
        paths = [(m, p.split("?")[0]) for m, p in self.requests]
        return [(m, p) for m, p in paths if m in ("PUT", "POST", "DELETE", "PATCH") and "/operations/" not in p
                and not p.startswith("/kube") and not p.endswith("/listClusterUserCredential") and not is_query(p)
                and not p.lower().endswith("/checknameavailability")]  # POSTs that read

    @property
    def env(self) -> dict[str, str]:
        """What az needs: trust this server, and its managed-identity endpoint for 'az login --identity'."""
        return {"REQUESTS_CA_BUNDLE": str(self.cert), "IDENTITY_ENDPOINT": f"{self.url}/msi/token",
                "IDENTITY_HEADER": IDENTITY_HEADER, "MSI_ENDPOINT": "", "MSI_SECRET": ""}

    # ------------------------------------------------------------------ handling

    def handle(self, method: str, raw_path: str, headers: dict, body: bytes,
               peer: str | None = None) -> tuple[int, dict, Any]:
        with self._lock:
            self.requests.append((method, raw_path))
            self.timeline.append((time.monotonic(), method, raw_path))
            parts = urlsplit(raw_path)
            path, query = parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}
            if path.startswith("/kube/"):
                return self._kube_front(method, path[len("/kube"):], query, headers, body, peer)
            if path == "/msi/token":
                return self._token(headers, query)
            if path.startswith("/metadata/"):  # az cloud register asks; the test registers every endpoint
                return 404, {}, _error("NotFound", "no cloud metadata here")
            for i, (m, suffix, status, code, message) in enumerate(self._faults):
                if m == method and path.lower().endswith(suffix):
                    del self._faults[i]
                    return status, {}, _error(code, message)
            if not headers.get("authorization", "").startswith("Bearer "):
                return 401, {}, _error("AuthenticationFailed", "no bearer token")
            self._caller = _claims(headers["authorization"][len("Bearer "):]).get("oid")
            if path.startswith("/operations/"):
                return self._operation(path.split("/")[2])
            try:
                payload = json.loads(body) if body else None
            except ValueError:
                return self._violation(f"{method} {path}: body is not JSON")
            return self._arm(method, path, query, payload)

    def _violation(self, text: str) -> tuple[int, dict, Any]:
        self.violations.append(text)
        return 400, {}, _error("TestServerViolation", text)

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

    def _api_version(self, provider: str, query: dict, what: str) -> bool:
        want = API_VERSIONS[provider]
        if query.get("api-version") != want:
            self.violations.append(f"{what}: api-version {query.get('api-version')!r}, the SDK's is {want!r}")
            return False
        return True

    def _arm(self, method: str, path: str, query: dict, body: Any) -> tuple[int, dict, Any]:
        if path.rstrip("/").lower() == "/providers/microsoft.resourcegraph/resources":
            return self._resource_graph(method, query, body)
        if path.rstrip("/") == "/subscriptions" and method == "GET":
            self._api_version("subscriptions", query, "list subscriptions")
            return 200, {}, {"value": [self._subscription(sub) for sub in SUBSCRIPTIONS]}
        if path.rstrip("/") in {f"/subscriptions/{sub}" for sub in SUBSCRIPTIONS} and method == "GET":
            return 200, {}, self._subscription(path.rstrip("/").rsplit("/", 1)[1])
        if not any(path.lower().startswith(f"/subscriptions/{sub}/") for sub in SUBSCRIPTIONS):
            return self._violation(f"{method} {path}: not under a test subscription")
        kind = _kind(path)
        if kind is None:
            return self._violation(f"{method} {path}: no operation the extension should call")
        if kind == "feature":
            if not self._api_version("Microsoft.Features", query, f"{method} {path}"):
                return 400, {}, _error("InvalidApiVersionParameter", f"api-version {query.get('api-version')}")
            return self._feature(method, path)
        provider = _PROVIDER[kind]
        if not self._api_version(provider, query, f"{method} {path}"):
            return 400, {}, _error("InvalidApiVersionParameter", f"api-version {query.get('api-version')}")
        rid = path.rstrip("/")
        key = rid.lower()
        if kind in ("skus", "usages"):
            return self._region(kind, method, path, query)
        if kind == "storage_name":
            return self._storage_name(method, path, body)
        if kind.startswith("vmss_vm"):
            return self._vmss_vm(kind, method, rid)
        if kind.endswith("_list"):
            return self._list(kind, path)
        if kind in ("credentials", "admin_credentials"):
            return self._credentials(method, rid, admin=kind == "admin_credentials")
        if method == "GET":
            pending = next((op for op, r in self.operations.items() if r["id"] == key and not r.get("done")), None)
            if pending:  # Azure finishes on its own time, polled or not: a GET moves it along too
                self._operation(pending)
            found = self.resources.get(key)
            if found is None:
                code = "ResourceGroupNotFound" if kind == "resource_group" else "ResourceNotFound"
                return 404, {}, _error(code, f"The Resource '{rid}' was not found.")
            return 200, {}, found
        if method == "PUT":
            return self._put(kind, rid, body)
        if method == "DELETE":
            return self._delete(kind, rid)
        return self._violation(f"{method} {path}: method not expected")

    def _feature(self, method: str, path: str) -> tuple[int, dict, Any]:
        """Features_Get (Microsoft.Features): the subscription's registration state of a preview feature."""
        if method != "GET":
            return self._violation(f"{method} {path}: the extension only reads feature registrations")
        parts = path.rstrip("/").split("/")
        namespace, name = parts[-3], parts[-1]
        state = self.features.get(f"{namespace}/{name}".lower(), "NotRegistered")
        return 200, {}, {"properties": {"state": state}, "id": path.rstrip("/"),
                         "type": "Microsoft.Features/providers/features", "name": f"{namespace}/{name}"}

    def _subscription(self, sub: str) -> dict:
        return {"id": f"/subscriptions/{sub}", "subscriptionId": sub, "tenantId": TENANT,
                "displayName": f"elastictrain test {SUBSCRIPTIONS.index(sub) + 1}", "state": "Enabled",
                "subscriptionPolicies": {"locationPlacementId": "Public_2014-09-01", "quotaId": "Test",
                                         "spendingLimit": "Off"}, "authorizationSource": "RoleBased"}

    # ------------------------------------------------------------------ PUT: check, store, answer

    def _put(self, kind: str, rid: str, body: Any) -> tuple[int, dict, Any]:
        if not isinstance(body, dict):
            return self._violation(f"PUT {rid}: no JSON object body")
        unknown = _schema_problems(kind, body)
        if unknown:  # ARM's schema validation: 400 InvalidRequestContent, the client's bug
            return self._violation(f"PUT {rid}: " + "; ".join(unknown))
        refused = self._refusals(kind, rid, body)
        if refused:  # what Azure itself refuses (a 400 with its code): the command must show it, nothing more
            code, message = refused
            return 400, {}, _error(code, message)
        problems = self._check_body(kind, rid, body)
        if problems:
            return self._violation(f"PUT {rid}: " + "; ".join(problems))
        key = rid.lower()
        existing = self.resources.get(key)
        if kind == "storage_account" and existing is None and self._storage_name_holder(rid.rsplit("/", 1)[1]):
            name = rid.rsplit("/", 1)[1]  # Storage answers 409 for a name held anywhere in Azure
            return 409, {}, _error("StorageAccountAlreadyTaken", f"The storage account named {name} is already taken.")
        if kind == "role_assignment" and existing is None:
            refused = self._role_refusal(rid, body)
            if refused:
                return refused[0], {}, _error(refused[1], refused[2])
        downgrade = _downgrade(kind, body, existing)
        if downgrade:  # AKS never downgrades (rancher/rancher#24071 quotes its answer)
            return 400, {}, _error("OperationNotAllowed", downgrade)
        if kind == "agent_pool":
            cluster = self.resources.get(key.rsplit("/agentpools/", 1)[0])
            if cluster is None:
                return 404, {}, _error("ResourceNotFound", "the managed cluster does not exist")
            if cluster["properties"]["provisioningState"] != "Succeeded":
                return 409, {}, _error("OperationNotAllowed", "Operation is not allowed: another operation "
                                                              "(Creating) is in progress on the cluster")
        if kind == "cluster" and (body.get("properties") or {}).get("disableLocalAccounts") and not (
                (body.get("properties") or {}).get("aadProfile") or {}).get("managed"):
            return 400, {}, _error("BadRequest", "DisableLocalAccounts requires AKS-managed Azure Active Directory "
                                                 "integration (aadProfile.managed).")
        if kind == "agent_pool" and existing is not None:
            changed = [f for f in IMMUTABLE_POOL_FIELDS if not _same_value(
                (body.get("properties") or {}).get(f), existing["properties"].get(f))]
            if changed:
                return 400, {}, _error("PropertyChangeNotAllowed", f"Changing property {', '.join(changed)} is "
                                                                   "not allowed.")
        resource = self._materialize(kind, rid, body, existing)
        long_running = kind in ("cluster", "agent_pool", "storage_account")
        if long_running:
            resource["properties"]["provisioningState"] = "Creating" if existing is None else "Updating"
        self.resources[key] = resource
        if kind == "agent_pool":
            self._sync_pool(rid, resource)
        if not long_running:
            return (201 if existing is None else 200), {}, resource
        op = f"op{next(self._ids)}"
        self.operations[op] = {"id": key, "polls": 0, "kind": "put"}
        op_url = f"{self.url}/operations/{op}?api-version={API_VERSIONS[_PROVIDER[kind]]}"
        if kind == "storage_account":  # 202 + Location, like storage
            return 202, {"Location": op_url, "Retry-After": "1"}, None
        return (201 if existing is None else 200), {"Azure-AsyncOperation": op_url, "Retry-After": "1"}, resource

    def _operation(self, op: str) -> tuple[int, dict, Any]:
        record = self.operations.get(op)
        if record is None:
            return 404, {}, _error("NotFound", "no such operation")
        record["polls"] += 1
        resource = self.resources.get(record["id"])
        done = record["polls"] > LRO_POLLS
        record["done"] = done
        if done and record["kind"] == "put" and resource is not None:
            resource["properties"]["provisioningState"] = "Succeeded"
            if "/agentpools/" in record["id"]:
                self._sync_pool(resource["id"], resource)
            if "/managedclusters/" in record["id"] and "/agentpools/" not in record["id"]:
                for pool in resource["properties"].get("agentPoolProfiles", []):
                    pool["provisioningState"] = "Succeeded"
        if done and record["kind"] == "delete":
            self._remove(record["id"])
        if "/storageaccounts/" in record["id"] or record["kind"] == "delete":  # Location polling
            if not done:
                return 202, {"Location": f"{self.url}/operations/{op}", "Retry-After": "1"}, None
            return (200, {}, resource) if record["kind"] == "put" else (204, {}, None)
        return 200, {"Retry-After": "1"}, {"id": f"/operations/{op}", "name": op,
                                           "status": "Succeeded" if done else "InProgress",
                                           "startTime": "2026-01-01T00:00:00Z"}

    def _materialize(self, kind: str, rid: str, body: dict, existing: dict | None) -> dict:
        name = rid.rsplit("/", 1)[1]
        resource = copy.deepcopy(body)
        resource.update({"id": rid, "name": name, "type": _TYPE[kind]})
        props = resource.setdefault("properties", {})
        old = (existing or {}).get("properties", {})
        if kind == "resource_group":
            props["provisioningState"] = "Succeeded"
        elif kind == "storage_account":
            # Azure answers every rule list (empty where none was sent) and a state on each virtual network rule
            acls = props.setdefault("networkAcls", {"bypass": "AzureServices", "defaultAction": "Allow"})
            for key in ("virtualNetworkRules", "ipRules", "ipv6Rules", "resourceAccessRules"):
                acls.setdefault(key, [])
            for rule in acls["virtualNetworkRules"]:
                rule["state"] = "Succeeded"
            props.update({"provisioningState": "Succeeded", "creationTime": "2026-01-01T00:00:00Z",
                          "primaryEndpoints": {"blob": self.blob_endpoint.replace("{account}", name)
                                               if self.blob_endpoint else f"https://{name}.blob.core.windows.net/"},
                          "primaryLocation": resource.get("location")})
        elif kind == "identity":
            props.update({"clientId": old.get("clientId", str(uuid.uuid4())),
                          "principalId": old.get("principalId", str(uuid.uuid4())),
                          "tenantId": TENANT, "isolationScope": "None"})
        elif kind == "cluster":
            issuer = old.get("oidcIssuerProfile", {}).get("issuerURL") or \
                f"https://eastus.oic.prod-aks.azure.com/{TENANT}/{uuid.uuid4()}/"
            props["oidcIssuerProfile"] = {"enabled": True, "issuerURL": issuer}
            running = _resolve_version(props.get("kubernetesVersion"), old.get("currentKubernetesVersion"))
            props.update({"fqdn": f"{props.get('dnsPrefix')}-abcd1234.hcp.eastus.azmk8s.io",
                          "currentKubernetesVersion": running,
                          "kubernetesVersion": props.get("kubernetesVersion") or old.get("kubernetesVersion")
                          or DEFAULT_MINOR,
                          "nodeResourceGroup": f"MC_{rid.split('/')[4]}_{name}_{resource.get('location')}",
                          "maxAgentPools": 100})
            pools = {p["name"]: p for p in old.get("agentPoolProfiles", [])}
            for pool in props.get("agentPoolProfiles", []):
                _as_aks_keeps_a_pool(pool, pools.get(pool["name"]), running)
                pool["provisioningState"] = "Creating"
                pools[pool["name"]] = pool
            props["agentPoolProfiles"] = list(pools.values())
            # only fields of this api-version's schema: enablePodSecurityPolicy left the API (a GET -> PUT carries
            # back whatever ARM answers, so a field the service does not have would make its own update invalid)
            props.update({"powerState": {"code": "Running"}, "azurePortalFQDN": props["fqdn"]})
            if props.get("aadProfile"):  # as the example answers it: the tenant filled in, no admin groups
                props["aadProfile"] = {"adminGroupObjectIDs": None, "tenantID": TENANT, **props["aadProfile"]}
            resource["id"] = _arm_casing(rid)
            resource["identity"] = {"type": "SystemAssigned", "principalId": str(uuid.uuid4()), "tenantId": TENANT}
        elif kind == "agent_pool":
            cluster = self.resources.get(rid.lower().rsplit("/agentpools/", 1)[0]) or {}
            _as_aks_keeps_a_pool(props, old or None, (cluster.get("properties") or {}).get("currentKubernetesVersion"))
            resource["id"] = _arm_casing(rid)
        elif kind == "maintenance_configuration":
            window = props.get("maintenanceWindow") or {}
            # MaintenanceConfigurationsGet_MaintenanceWindow.json: AKS fills in the start date (today if not given)
            window.setdefault("startDate", (old.get("maintenanceWindow") or {}).get("startDate")
                              or datetime.date.today().isoformat())
            resource["id"] = _arm_casing(rid)
        elif kind == "role_assignment":
            props["scope"] = rid.split("/providers/Microsoft.Authorization/")[0]
            props["roleDefinitionId"] = props["roleDefinitionId"]
        return resource

    def _sync_pool(self, pool_id: str, pool: dict) -> None:
        """A cluster GET lists its pools too, as AKS does."""
        cluster = self.resources.get(pool_id.lower().rsplit("/agentpools/", 1)[0])
        if cluster is None:
            return
        profile = {"name": pool["name"], **copy.deepcopy(pool["properties"])}
        profiles = [p for p in cluster["properties"].get("agentPoolProfiles", []) if p["name"] != pool["name"]]
        cluster["properties"]["agentPoolProfiles"] = profiles + [profile]

    # ------------------------------------------------------------------ storage: one namespace for all of Azure

    def _storage_name_holder(self, name: str) -> str | None:
        """The id of the account holding ``name`` anywhere (this server's subscriptions), or "elsewhere"."""
        if name.lower() in self.taken_storage_names:
            return "elsewhere"
        return next((rid for rid, r in self.resources.items() if r["type"] == _TYPE["storage_account"]
                     and r["name"].lower() == name.lower()), None)

    def _storage_name(self, method: str, path: str, body: Any) -> tuple[int, dict, Any]:
        """StorageAccounts_CheckNameAvailability (POST, StorageAccountCheckNameAvailability.json): names are unique
        across Azure, so one held by any subscription - ours included - is not available."""
        if method != "POST":
            return self._violation(f"{method} {path}: checkNameAvailability is a POST")
        kind = "Microsoft.Storage/storageAccounts"
        if not isinstance(body, dict) or body.get("type") != kind or not body.get("name"):
            return self._violation(f"POST {path}: body {body!r} is not {{name, type: {kind}}}")
        name = str(body["name"])
        if not re.fullmatch(r"[a-z0-9]{3,24}", name):
            return 200, {}, {"nameAvailable": False, "reason": "AccountNameInvalid",
                             "message": f"{name} is not a valid storage account name. Storage account name must be "
                                        "between 3 and 24 characters in length and use numbers and lower-case "
                                        "letters only."}
        if self._storage_name_holder(name):
            return 200, {}, {"nameAvailable": False, "reason": "AlreadyExists",
                             "message": f"The storage account named {name} is already taken."}
        return 200, {}, {"nameAvailable": True}

    # ------------------------------------------------------------------ role assignments as Entra ID and ARM keep them

    def _role_refusal(self, rid: str, body: dict) -> tuple[int, str, str] | None:
        """What ARM answers a role assignment PUT it will not take: 409 RoleAssignmentExists where the principal
        holds the role at that scope under another name (azure-cli's AKS code counts it as done:
        acs/_roleassignments.py), 400 PrincipalNotFound while Entra ID has not replicated a new principal."""
        props = body.get("properties") or {}
        scope, _, name = rid.partition("/providers/Microsoft.Authorization/roleAssignments/")
        principal = str(props.get("principalId", ""))
        if self.principal_unknown.get(principal, 0) > 0:
            self.principal_unknown[principal] -= 1
            return 400, "PrincipalNotFound", (
                f"Principal {principal.replace('-', '')} does not exist in the directory {TENANT}. Check that you "
                "have the correct principal ID. If you are creating this principal and then immediately assigning "
                "a role, this error might be related to a replication delay. In this case, set the role assignment "
                "principalType property to a value, such as ServicePrincipal, User, or Group. See "
                "https://aka.ms/docs-principaltype")
        for key, found in self.resources.items():
            there = found.get("properties") or {}
            if (found["type"] == _TYPE["role_assignment"] and found["name"].lower() != name.lower()
                    and str(there.get("scope", "")).lower() == scope.lower()
                    and str(there.get("roleDefinitionId", "")).lower() == str(props.get("roleDefinitionId")).lower()
                    and str(there.get("principalId", "")).lower() == principal.lower()):
                return 409, "RoleAssignmentExists", "The role assignment already exists."
        return None

    def assign_role(self, scope: str, principal: str, role: str, name: str | None = None) -> str:
        """A role assignment made outside this tool (the portal, 'az role assignment create': a random name).
        Returns its id."""
        rid = f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name or uuid.uuid4()}"
        subscription = scope.split("/")[2]
        with self._lock:
            self.resources[rid.lower()] = {
                "id": rid, "name": rid.rsplit("/", 1)[1], "type": _TYPE["role_assignment"],
                "properties": {"scope": scope, "principalId": principal, "principalType": "ServicePrincipal",
                               "roleDefinitionId": f"/subscriptions/{subscription}/providers/Microsoft.Authorization/"
                                                   f"roleDefinitions/{role}"}}
        return rid

    def data_roles(self, principal: str, account: str, container: str) -> set[str]:
        """The built-in blob data roles ``principal`` holds on ``container`` of storage account ``account``: those
        assigned at the container, the account, its resource group or subscription (Azure RBAC inherits down)."""
        with self._lock:
            account_id = next((r["id"] for r in self.resources.values() if r["type"] == _TYPE["storage_account"]
                               and r["name"].lower() == account.lower()), None)
            if account_id is None:
                return set()
            target = f"{account_id}/blobServices/default/containers/{container}".lower()
            roles = set()
            for found in self.resources.values():
                props = found.get("properties") or {}
                scope = str(props.get("scope", "")).lower()
                if (found["type"] == _TYPE["role_assignment"] and str(props.get("principalId", "")).lower()
                        == principal.lower() and (target == scope or target.startswith(scope + "/"))):
                    role = str(props.get("roleDefinitionId", "")).rsplit("/", 1)[1].lower()
                    if role in BLOB_DATA_ROLES:
                        roles.add(role)
            return roles

    # ------------------------------------------------------------------ what Azure refuses

    def _refusals(self, kind: str, rid: str, body: dict) -> tuple[str, str] | None:
        """(code, message) of the 400 Azure answers for a body it will not take, as its docs and issues show."""
        props = body.get("properties") or {}
        if kind == "cluster":
            if "kubeDashboard" in {k for k in (props.get("addonProfiles") or {})}:  # terraform-provider-azurerm#13119
                return "AddonInvalid", "Kubernetes Dashboard addon is deprecated for Kubernetes version >= 1.19.0."
            upgrades = props.get("autoUpgradeProfile") or {}
            if upgrades.get("upgradeChannel") == "node-image" and upgrades.get("nodeOSUpgradeChannel") not in (
                    None, "NodeImage"):
                return "InvalidParameter", "nodeOSUpgradeChannel must be NodeImage with upgradeChannel node-image"
            for cidr in (props.get("apiServerAccessProfile") or {}).get("authorizedIPRanges") or []:
                if not _is_cidr(cidr):
                    return "InvalidParameter", f"authorizedIPRanges: {cidr!r} is not a valid IP range"
            for pool in props.get("agentPoolProfiles") or []:
                refused = self._pool_refusal(pool, body.get("location", ""))
                if refused:
                    return refused
        elif kind == "agent_pool":
            cluster = self.resources.get(rid.lower().rsplit("/agentpools/", 1)[0]) or {}
            return self._pool_refusal(props, cluster.get("location", ""))
        elif kind == "maintenance_configuration":
            return self._maintenance_refusal(rid, props)
        elif kind == "storage_account":
            acls = props.get("networkAcls") or {}
            for rule in acls.get("ipRules") or []:
                value = str(rule.get("value", ""))
                if not _is_cidr(value) or _is_private(value) or value.endswith(("/31", "/32")):
                    return "NetworkAclsValidationFailure", f"Validation of network acls failure: IP rule {value!r} " \
                                                           "is not a public IPv4 address or range (/30 or wider)"
            for rule in acls.get("virtualNetworkRules") or []:
                if not re.fullmatch(r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
                                    r"virtualNetworks/[^/]+/subnets/[^/]+", str(rule.get("id", "")), re.IGNORECASE):
                    return "NetworkAclsValidationFailure", f"virtual network rule {rule.get('id')!r} is no subnet"
        return None

    def _pool_refusal(self, pool: dict, location: str) -> tuple[str, str] | None:
        """AKS checks a pool's disk and host encryption against its size and the subscription."""
        size = next((s for s in self.skus.get(str(location).lower(), []) if s["name"].lower()
                     == str(pool.get("vmSize", "")).lower()), None)
        caps = {c["name"]: c["value"] for c in (size or {}).get("capabilities", [])}
        for key in pool.get("nodeLabels") or {}:
            if (key, (pool.get("nodeLabels") or {})[key]) == SPOT_LABEL and pool.get("scaleSetPriority") == "Spot":
                continue  # AKS's own label, carried by an update built from a GET (Azure/AKS#3152)
            refused = _reserved_label(key)
            if refused:
                return "BadRequest", refused
        max_pods = pool.get("maxPods")
        if max_pods is not None and not 10 <= max_pods <= 250:
            return "InvalidParameter", f"maxPods {max_pods} is outside 10-250"
        if pool.get("osDiskType") == "Ephemeral":
            room = max(int(caps.get("CachedDiskBytes", 0)) / 2**30, int(caps.get("MaxResourceVolumeMB", 0)) / 1024)
            disk = pool.get("osDiskSizeGB") or 128
            if caps.get("EphemeralOSDiskSupported") != "True" or disk > room:
                return "InvalidParameter", (f"OS disk of Ephemeral type with size {disk} GB is not supported for VM "
                                            f"size {pool.get('vmSize')}: its cache and temp disk hold {int(room)} GB")
        if pool.get("enableEncryptionAtHost"):
            if caps.get("EncryptionAtHostSupported") != "True":
                return "InvalidParameter", f"VM size {pool.get('vmSize')} does not support encryption at host"
            if self.features.get("microsoft.compute/encryptionathost") != "Registered":
                return "InvalidParameter", ("Subscription does not enable EncryptionAtHost (feature "
                                            "Microsoft.Compute/EncryptionAtHost is not registered)")
        return None

    def _maintenance_refusal(self, rid: str, props: dict) -> tuple[str, str] | None:
        name = rid.rsplit("/", 1)[1]
        if name not in ("default", "aksManagedAutoUpgradeSchedule", "aksManagedNodeOSUpgradeSchedule"):
            return "InvalidParameter", f"maintenance configuration name {name!r} is not one AKS knows"
        cluster = self.resources.get(rid.lower().rsplit("/maintenanceconfigurations/", 1)[0])
        if cluster is None:
            return "ResourceNotFound", "the managed cluster does not exist"
        channel = ((cluster["properties"].get("autoUpgradeProfile") or {}).get("nodeOSUpgradeChannel") or "None")
        if name == "aksManagedNodeOSUpgradeSchedule" and channel in ("None", "Unmanaged"):
            return "InvalidParameter", f"aksManagedNodeOSUpgradeSchedule needs a node OS upgrade channel (is {channel})"
        upgrades = (cluster["properties"].get("autoUpgradeProfile") or {}).get("upgradeChannel") or "none"
        if name == "aksManagedAutoUpgradeSchedule" and upgrades == "none":
            return "InvalidParameter", "aksManagedAutoUpgradeSchedule needs an upgrade channel (is none)"
        window = props.get("maintenanceWindow") or {}
        schedule = window.get("schedule") or {}
        weekly = schedule.get("weekly") or {}
        if len(schedule) != 1:
            return "InvalidParameter", "maintenanceWindow.schedule: exactly one of daily, weekly, absoluteMonthly, " \
                                       "relativeMonthly"
        if not 4 <= int(window.get("durationHours") or 0) <= 24:
            return "InvalidParameter", "maintenanceWindow.durationHours must be 4 to 24"
        if not re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d", str(window.get("startTime", ""))):
            return "InvalidParameter", "maintenanceWindow.startTime must be HH:mm"
        if window.get("utcOffset") is not None and not re.fullmatch(r"[+-](0\d|1[0-4]):[0-5]\d", window["utcOffset"]):
            return "InvalidParameter", "maintenanceWindow.utcOffset must be +HH:mm or -HH:mm"
        if "weekly" in schedule and (not 1 <= int(weekly.get("intervalWeeks") or 0) <= 4 or weekly.get("dayOfWeek")
                                     not in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday",
                                             "Sunday")):
            return "InvalidParameter", "weekly schedule: intervalWeeks 1-4 and a dayOfWeek"
        return None

    # ------------------------------------------------------------------ request checks

    def _check_body(self, kind: str, rid: str, body: dict) -> list[str]:
        e = self.expect
        props = body.get("properties") or {}
        wants: list[tuple[str, Any, Any]] = []  # (field, got, want)
        if kind in ("resource_group", "storage_account", "identity", "cluster"):
            wants.append(("location", bool(body.get("location")), True))
        if kind == "storage_account":
            wants += [("kind", body.get("kind"), "StorageV2"), ("sku.name", (body.get("sku") or {}).get("name"),
                                                                e["storage_sku"]),
                      ("supportsHttpsTrafficOnly", props.get("supportsHttpsTrafficOnly"), True),
                      ("minimumTlsVersion", props.get("minimumTlsVersion"), "TLS1_2"),
                      ("allowBlobPublicAccess", props.get("allowBlobPublicAccess"), False),
                      ("allowSharedKeyAccess", props.get("allowSharedKeyAccess"), False),
                      ("networkAcls.defaultAction", (props.get("networkAcls") or {}).get("defaultAction"),
                       e["storage_default_action"])]
        elif kind == "container":
            wants.append(("publicAccess", props.get("publicAccess"), "None"))
        elif kind == "cluster":
            pools = props.get("agentPoolProfiles") or []
            system = pools[0] if len(pools) == 1 else {}
            wants += [("oidcIssuerProfile.enabled", (props.get("oidcIssuerProfile") or {}).get("enabled"), True),
                      ("securityProfile.workloadIdentity.enabled",
                       ((props.get("securityProfile") or {}).get("workloadIdentity") or {}).get("enabled"), True),
                      ("networkProfile.networkPolicy (the etcd NetworkPolicy is enforced)",
                       (props.get("networkProfile") or {}).get("networkPolicy"), "cilium"),
                      ("agentPoolProfiles: one system pool", len(pools), 1),
                      ("system pool mode", system.get("mode"), "System"),
                      ("system pool autoscale", (system.get("enableAutoScaling"), system.get("minCount"),
                                                 system.get("maxCount")), (True, 1, 3)),
                      ("system pool priority", system.get("scaleSetPriority", "Regular"), "Regular"),
                      ("dnsPrefix", bool(props.get("dnsPrefix")), True),
                      ("autoUpgradeProfile", props.get("autoUpgradeProfile"),
                       {"upgradeChannel": e["upgrade_channel"], "nodeOSUpgradeChannel": "NodeImage"}),
                      ("system pool osDiskType", system.get("osDiskType"), e["system_os_disk"]),
                      ("system pool enableEncryptionAtHost", system.get("enableEncryptionAtHost"),
                       e["encryption_at_host"]),
                      ("identity.type", (body.get("identity") or {}).get("type") in ("SystemAssigned",
                                                                                     "UserAssigned"), True)]
            aad = props.get("aadProfile") or {}
            if e.get("local_accounts"):
                wants += [("disableLocalAccounts", props.get("disableLocalAccounts", False), False)]
            else:  # Entra ID only, the default (ManagedClustersCreate_UpdateWithEnableAzureRBAC.json's fields)
                wants += [("aadProfile.managed", aad.get("managed"), True),
                          ("aadProfile.enableAzureRBAC", aad.get("enableAzureRBAC"), True),
                          ("disableLocalAccounts", props.get("disableLocalAccounts"), True)]
        elif kind == "agent_pool":
            wants += [("mode", props.get("mode"), "User"), ("vmSize", props.get("vmSize"), e["gpu_vm_size"]),
                      ("scaleSetPriority", props.get("scaleSetPriority"), "Spot"),
                      ("scaleSetEvictionPolicy", props.get("scaleSetEvictionPolicy"), e["eviction_policy"]),
                      ("spotMaxPrice", props.get("spotMaxPrice"), e["spot_max_price"]),
                      ("enableAutoScaling", props.get("enableAutoScaling"), True),
                      ("minCount", props.get("minCount"), e["min_count"]),
                      ("maxCount", props.get("maxCount"), e["max_count"]),
                      ("count within bounds", e["min_count"] <= (props.get("count") or 0) <= e["max_count"], True),
                      ("nodeTaints has sku=gpu:NoSchedule", "sku=gpu:NoSchedule" in (props.get("nodeTaints") or []),
                       True),
                      ("nodeLabels", bool(props.get("nodeLabels")), True),
                      ("osDiskType", props.get("osDiskType"), e["gpu_os_disk"]),
                      ("enableEncryptionAtHost", props.get("enableEncryptionAtHost"), e["encryption_at_host"])]
        elif kind == "federated_credential":
            group = rid.lower().split("/providers/")[0]
            cluster = next((r for k, r in self.resources.items() if r["type"] == _TYPE["cluster"]
                            and k.startswith(group + "/")), None)
            issuer = ((cluster or {}).get("properties", {}).get("oidcIssuerProfile") or {}).get("issuerURL")
            wants += [("issuer", props.get("issuer"), issuer),
                      ("subject", props.get("subject"), "system:serviceaccount:elastictrain:elastictrain-training"),
                      ("audiences", props.get("audiences"), ["api://AzureADTokenExchange"])]
        elif kind == "role_assignment":
            scope, _, name = rid.partition("/providers/Microsoft.Authorization/roleAssignments/")
            group = rid.lower().split("/providers/")[0]
            role_base = (f"{rid[:rid.lower().index('/resourcegroups/')]}/providers/Microsoft.Authorization/"
                         "roleDefinitions/")
            wants.append(("name is a GUID", bool(re.fullmatch(r"[0-9a-f-]{36}", name)), True))
            if props.get("roleDefinitionId") == role_base + AKS_RBAC_CLUSTER_ADMIN:
                cluster = self.resources.get(scope.lower())
                cluster_scope = (r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.ContainerService/"
                                 r"managedClusters/[^/]+")
                wants += [("scope is an AKS cluster", bool(re.fullmatch(cluster_scope, scope)) and cluster is not None,
                           True),
                          ("the cluster has Azure RBAC", ((cluster or {}).get("properties", {}).get("aadProfile")
                                                          or {}).get("enableAzureRBAC"), True),
                          ("principalId", props.get("principalId"), e.get("admin_principal", self._caller)),
                          ("principalType", props.get("principalType"),
                           None if e.get("admin_principal") else "ServicePrincipal")]
            else:
                identity = next((r for k, r in self.resources.items() if r["type"] == _TYPE["identity"]
                                 and k.startswith(group + "/")), None)
                container_scope = (r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Storage/"
                                   r"storageAccounts/[a-z0-9]{3,24}/blobServices/default/containers/[a-z0-9-]{3,63}")
                workload = ((identity or {}).get("properties") or {}).get("principalId")
                creator = e.get("admin_principal", self._caller)  # the creator's own data role (job show, ...)
                wants += [("scope is the checkpoint container", bool(re.fullmatch(container_scope, scope)), True),
                          ("roleDefinitionId", props.get("roleDefinitionId"), role_base + BLOB_DATA_CONTRIBUTOR),
                          ("principalId is the workload identity or the creator",
                           props.get("principalId") in (workload, creator), True),
                          ("principalType", props.get("principalType"),
                           None if props.get("principalId") == e.get("admin_principal") else "ServicePrincipal")]
        return [f"{field} is {got!r}, expected {want!r}" for field, got, want in wants if got != want]

    # ------------------------------------------------------------------ the rest of ARM

    def _delete(self, kind: str, rid: str) -> tuple[int, dict, Any]:
        key = rid.lower()
        if key not in self.resources:
            return 204, {}, None
        if kind in ("cluster", "agent_pool"):
            self.resources[key]["properties"]["provisioningState"] = "Deleting"
            op = f"op{next(self._ids)}"
            self.operations[op] = {"id": key, "polls": 0, "kind": "delete"}
            return 202, {"Location": f"{self.url}/operations/{op}", "Retry-After": "1"}, None
        resource = self.resources[key]
        self._remove(key)
        return 200, {}, resource if kind == "role_assignment" else None

    def _remove(self, key: str) -> None:
        for rid in [r for r in self.resources if r == key or r.startswith(key + "/")]:
            del self.resources[rid]

    def _list(self, kind: str, path: str) -> tuple[int, dict, Any]:
        prefix = path.lower().split("/providers/")[0]
        items = [r for rid, r in self.resources.items() if r["type"] == _TYPE["cluster"] and rid.startswith(prefix)]
        return 200, {}, {"value": items}

    def _credentials(self, method: str, rid: str, admin: bool = False) -> tuple[int, dict, Any]:
        """listClusterUserCredential / listClusterAdminCredential, as AKS answers them: an Entra ID-only cluster's
        user kubeconfig runs kubelogin (exec, the format AKS gives from Kubernetes 1.24) and its admin one is
        refused; a local-accounts cluster's carries a client certificate of the cluster CA and a token."""
        what = "listClusterAdminCredential" if admin else "listClusterUserCredential"
        if method != "POST":
            return self._violation(f"{method} {rid}: {what} is a POST")
        cluster = self.resources.get(rid.lower().rsplit("/", 1)[0])
        if cluster is None:
            return 404, {}, _error("ResourceNotFound", "no such cluster")
        entra = _entra_only(cluster)
        if admin and entra:
            return 400, {}, _error("BadRequest", STATIC_CREDENTIAL_REFUSED)
        name, group = cluster["name"], rid.split("/")[4]
        ca = base64.b64encode(self.cert.read_bytes()).decode()
        user_name = f"cluster{'Admin' if admin else 'User'}_{group}_{name}"
        if entra:
            user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "kubelogin",
                             "args": ["get-token", "--environment", "AzurePublicCloud", "--server-id", AKS_SERVER_APP,
                                      "--client-id", "80faf920-1908-4b52-b5ef-a8e7bedfc67a", "--tenant-id", TENANT,
                                      "--login", "devicecode"],
                             "env": None, "installHint": "kubelogin is not installed ...",
                             "interactiveMode": "IfAvailable", "provideClusterInfo": False}}
        else:
            key, cert = _signed_certificate(user_name, self._kube_ca_key, self._kube_ca)
            user = {"client-certificate-data": base64.b64encode(_pem(cert)).decode(),
                    "client-key-data": base64.b64encode(_pem(key)).decode(), "token": KUBE_TOKEN}
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "preferences": {}, "current-context": name,
                      "clusters": [{"name": name, "cluster": {"server": f"{self.url}/kube/{group.lower()}/"
                                                                        f"{name.lower()}",
                                                              "certificate-authority-data": ca}}],
                      "users": [{"name": user_name, "user": user}],
                      "contexts": [{"name": name, "context": {"cluster": name, "user": user_name}}]}
        import yaml

        value = base64.b64encode(yaml.safe_dump(kubeconfig).encode()).decode()
        return 200, {}, {"kubeconfigs": [{"name": "clusterAdmin" if admin else "clusterUser", "value": value}]}

    def _kube_front(self, method: str, path: str, query: dict, headers: dict, body: bytes,
                    peer: str | None) -> tuple[int, dict, Any]:
        """/kube/<group>/<cluster>/<Kubernetes path>: authenticate as that cluster's API server, then serve."""
        group, _, rest = path.lstrip("/").partition("/")
        name, _, rest = rest.partition("/")
        cluster = next((r for r in self.resources.values() if r["type"] == _TYPE["cluster"]
                        and r["id"].lower().endswith(f"/resourcegroups/{group}/providers/microsoft.containerservice/"
                                                     f"managedclusters/{name}")), None)
        record = {"method": method, "path": "/" + rest, "cluster": name, "auth": None, "jti": None}
        self.kube_requests.append(record)
        if cluster is None:
            record["status"] = 404
            return 404, {}, _kube_status(404, "NotFound", f"no cluster {group}/{name}")
        bearer = headers.get("authorization", "")
        token = bearer[len("Bearer "):] if bearer.startswith("Bearer ") else None
        if _entra_only(cluster):
            claims = _claims(token) if token else {}
            record["jti"] = claims.get("jti")
            uses = self._token_uses[claims.get("jti")] = self._token_uses.get(claims.get("jti"), 0) + 1
            ok = (claims.get("aud") in (AKS_SERVER_APP, f"spn:{AKS_SERVER_APP}") and claims.get("tid") == TENANT
                  and claims.get("exp", 0) > time.time() and claims.get("oid")
                  and (self.kube_token_uses is None or uses <= self.kube_token_uses))
            record["auth"] = "token" if ok else None
        else:  # local accounts: the cluster CA's client certificate, or the kubeconfig's static token
            ok = bool(peer) or token == KUBE_TOKEN
            record["auth"] = "certificate" if peer else "token" if ok else None
        if not ok:
            record["status"] = 401
            return 401, {}, _kube_status(401, "Unauthorized", "Unauthorized")
        status, extra, payload = self._kube(method, "/" + rest, query, body)
        record["status"] = status
        return status, extra, payload

    # ------------------------------------------------------------------ Kubernetes

    def _kube(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, dict, Any]:
        """The cluster's API server (tests/support/kube_apiserver.py's) over ``kube``, and what the extension must
        never do: apply as another field manager, or force (taking fields over is the user's call)."""
        if method == "PATCH":
            what = f"kube apply {path.rsplit('/', 1)[-1]}"
            if query.get("fieldManager") != "elastictrain":
                self.violations.append(f"{what}: fieldManager {query.get('fieldManager')}")
            if "force" in query:
                self.violations.append(f"{what}: force={query['force']}")
        if method == "GET" and query.get("watch") in ("true", "True", "1"):
            self.kube_watches.append((_watched_kind(self.kube, path),
                                      (query.get("fieldSelector") or "").partition("metadata.name=")[2]))
        # a watch answers the object as it is (ADDED) and ends: an API server may end a watch at any time, and
        # this server holds one lock for every request
        status, payload = kube_api.answer(self.kube, method, path, query, body, watch_timeout=0)
        if not isinstance(payload, (dict, bytes)):
            payload = b"".join(payload)
        return status, {}, payload

    # ------------------------------------------------------------------ what a region offers (preflight)

    def _region(self, kind: str, method: str, path: str, query: dict) -> tuple[int, dict, Any]:
        """GET .../providers/Microsoft.Compute/skus?$filter=location eq 'X' (ResourceSkus_List) and
        GET .../providers/Microsoft.Compute/locations/X/usages (Usage_List), as their official examples."""
        if method != "GET":
            return self._violation(f"{method} {path}: {kind} is read with GET")
        if kind == "usages":
            location = path.rstrip("/").split("/")[-2].lower()
            return 200, {}, {"value": copy.deepcopy(self.usages.get(location, []))}
        asked = re.fullmatch(r"location eq '([^']+)'", query.get("$filter", ""))
        if not asked:  # every region's SKUs are a large answer: we always ask for one region
            return self._violation(f"GET {path}: no $filter=location eq '...' ({query.get('$filter')!r})")
        return 200, {}, {"value": copy.deepcopy(self.skus.get(asked[1].lower(), [])), "nextLink": None}

    # ------------------------------------------------------------------ Resource Graph: Spot eviction rates

    def _resource_graph(self, method: str, query: dict, body: Any) -> tuple[int, dict, Any]:
        """POST /providers/Microsoft.ResourceGraph/resources (Resources_Resources, api-version 2022-10-01): the
        body ``{"subscriptions", "query", "options"}``, the answer ``{"totalRecords", "count", "data",
        "facets", "resultTruncated"}`` with ``data`` an array of objects (``options.resultFormat``
        objectArray), as the REST reference's examples. Only the two ``SpotResources`` queries the extension
        sends are understood, each for one region and ``sku.name in~ (...)``, with the projections of the Spot docs'
        sample queries: type ``microsoft.compute/skuspotevictionrate/location`` -> ``{skuName, location,
        evictionRate}`` with Azure's bands ("0-5" ... "20+") from ``spot_eviction_rates``; type
        ``microsoft.compute/skuspotpricehistory/ostype/location`` (Linux) -> ``{skuName, location,
        latestSpotPriceUSD}`` from ``spot_prices_usd`` (each: lower-case region -> lower-case size -> value; a
        size without one has no row). Anything else is a 400, as a query Resource Graph cannot parse."""
        if method != "POST":
            return self._violation(f"{method} Resource Graph: queries are POSTed")
        if query.get("api-version") != "2022-10-01":
            return self._violation(f"Resource Graph: api-version {query.get('api-version')!r}, not 2022-10-01")
        body = body if isinstance(body, dict) else {}
        if not set(body.get("subscriptions") or []) <= set(SUBSCRIPTIONS) or not body.get("subscriptions"):
            return self._violation(f"Resource Graph: subscriptions {body.get('subscriptions')!r}")
        if (body.get("options") or {}).get("resultFormat") != "objectArray":
            return self._violation("Resource Graph: options.resultFormat is not objectArray")
        text = str(body.get("query") or "")
        head = (r"SpotResources \| where type =~ '(microsoft\.compute/[a-z/]+)' \| where location =~ '([a-z0-9]+)' "
                r"\| where sku\.name in~ \(([^)]*)\) ")
        rates = re.fullmatch(head + r"\| project skuName = tostring\(sku\.name\), location, evictionRate = "
                                    r"tostring\(properties\.evictionRate\)", text)
        prices = re.fullmatch(head + r"\| where properties\.osType =~ 'linux' \| project skuName = "
                                     r"tostring\(sku\.name\), location, latestSpotPriceUSD = "
                                     r"todouble\(properties\.spotPrices\[0\]\.priceUSD\)", text)
        if rates and rates[1] == "microsoft.compute/skuspotevictionrate/location":
            asked, column, table = rates, "evictionRate", self.spot_eviction_rates
        elif prices and prices[1] == "microsoft.compute/skuspotpricehistory/ostype/location":
            asked, column, table = prices, "latestSpotPriceUSD", self.spot_prices_usd
        else:
            return 400, {}, _error("BadRequest", f"Query is invalid: {text[:200]}")
        known = table.get(asked[2], {})
        rows = [{"skuName": size, "location": asked[2], column: known[size]}
                for size in re.findall(r"'([^']+)'", asked[3]) if size in known]
        return 200, {}, {"totalRecords": len(rows), "count": len(rows), "data": rows, "facets": [],
                         "resultTruncated": "false"}

    # ------------------------------------------------------------------ VMSS instances and Spot evictions

    def seed_aks_training(self, group: str, name: str, *, gpu_nodes: int = 3, gpu_pool: bool = True,
                          job: str = "cifar", workers: int = 2, lowercase_node_group: bool = True,
                          eviction_policy: str = "Delete") -> dict:
        """A running AKS cluster as create leaves it, with what only Azure and the cluster make: the VMSS
        instances of its pools and their Kubernetes nodes (Spot GPU nodes, one Regular system node), and an
        ElasticJob with ``workers`` worker pods on the first GPU nodes. Kubernetes nodes, pods and jobs of
        earlier tests are dropped (one fake Kubernetes serves every cluster). Returns the names used.

        AKS writes the node resource group in providerIDs in lower case (``mc_<rg>_<cluster>_<location>``);
        ARM names are case-insensitive, so both must lead to the same instance.
        """
        from tests.support import aks_objects as k

        with self._lock:
            location = "eastus"
            rid = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/Microsoft.ContainerService/"
                   f"managedClusters/{name}")
            node_group = f"MC_{group}_{name}_{location}"
            profiles = [{"name": "system", "mode": "System", "count": 1, "vmSize": "Standard_D4s_v5",
                         "scaleSetPriority": "Regular", "type": "VirtualMachineScaleSets",
                         "provisioningState": "Succeeded"}]
            if gpu_pool:
                profiles.append({"name": "gpu", "mode": "User", "count": gpu_nodes, "vmSize": "Standard_NC4as_T4_v3",
                                 "scaleSetPriority": "Spot", "scaleSetEvictionPolicy": eviction_policy,
                                 "spotMaxPrice": -1,
                                 "type": "VirtualMachineScaleSets", "provisioningState": "Succeeded"})
            self.resources[rid.lower()] = {
                "id": rid, "name": name, "type": _TYPE["cluster"], "location": location,
                "tags": {"elastictrain": "cluster"},
                "properties": {"provisioningState": "Succeeded", "nodeResourceGroup": node_group,
                               "agentPoolProfiles": profiles, "dnsPrefix": name}}
            for key in [key for key in self.kube.objects if key[1] in ("Node", "Pod", "ElasticJob")]:
                del self.kube.objects[key]
            self.kube.with_operator_crd()  # a cluster that trains was created by `cluster create`
            in_ids = node_group.lower() if lowercase_node_group else node_group
            vmss = {"system": k.SYSTEM_VMSS, "gpu": k.GPU_VMSS}
            nodes = [k.node(0, pool="system", spot=False,
                            provider=_provider_id(in_ids, k.SYSTEM_VMSS, 0))]
            nodes += [k.node(i, provider=_provider_id(in_ids, k.GPU_VMSS, i)) for i in range(gpu_nodes if gpu_pool else 0)]
            for node in nodes:
                self.kube.seed(node)
                pool = node["metadata"]["labels"]["agentpool"]
                instance = node["spec"]["providerID"].rsplit("/", 1)[1]
                self._seed_vm(node_group, vmss[pool], instance, location,
                              node["metadata"]["labels"]["node.kubernetes.io/instance-type"])
            gpu = [n["metadata"]["name"] for n in nodes[1:]]
            if job and gpu:
                self.kube.seed(k.with_status(_elastic_job(job, workers), k.running(job), active=workers))
                for index in range(workers):
                    self.kube.seed(k.worker_pod(job, index, gpu[index % len(gpu)]))
            return {"nodeResourceGroup": node_group, "gpuVmss": k.GPU_VMSS, "systemVmss": k.SYSTEM_VMSS,
                    "gpuNodes": gpu, "systemNode": nodes[0]["metadata"]["name"], "job": job}

    def _seed_vm(self, node_group: str, vmss: str, instance: str, location: str, size: str) -> None:
        rid = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{node_group}/providers/Microsoft.Compute/"
               f"virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")
        # the fields of the VirtualMachineScaleSetVM_Get/List examples that a VMSS VM always has
        self.resources[rid.lower()] = {
            "id": rid, "name": f"{vmss}_{instance}", "type": "Microsoft.Compute/virtualMachines",
            "instanceId": instance, "location": location, "sku": {"name": size, "tier": "Standard"},
            "properties": {"latestModelApplied": True, "vmId": str(uuid.uuid4()),
                           "hardwareProfile": {"vmSize": size}, "provisioningState": "Succeeded",
                           "osProfile": {"computerName": f"{vmss}{int(instance):06x}"}}}

    def _vmss_vm(self, kind: str, method: str, rid: str) -> tuple[int, dict, Any]:
        key = rid.lower()
        if kind == "vmss_vm_list":
            if method != "GET":
                return self._violation(f"{method} {rid}: listing VMSS VMs is a GET")
            items = [r for k, r in self.resources.items() if k.startswith(key + "/") and k.count("/") == key.count("/") + 1]
            return 200, {}, {"value": sorted(items, key=lambda r: int(r["instanceId"]))}
        if kind == "vmss_vm":
            if method != "GET":
                return self._violation(f"{method} {rid}: only GET is expected on a VMSS VM")
            found = self.resources.get(key)
            if found is None:
                return 404, {}, _error("NotFound", "The entity was not found in this Azure location.")
            return 200, {}, found
        # simulateEviction: POST, no body, 204 (VirtualMachineScaleSetVM_SimulateEviction.json)
        if method != "POST":
            return self._violation(f"{method} {rid}: simulateEviction is a POST")
        vm_key = key.rsplit("/", 1)[0]
        vm = self.resources.get(vm_key)
        if vm is None:
            return 404, {}, _error("NotFound", "The entity was not found in this Azure location.")
        provider = "azure://" + vm["id"]
        # ``node_gone_after`` stands for the minutes a real eviction takes (a recorded one: ~3 min; Azure: within
        # 30 min); the other delays scale with it.
        delay = float(self.expect.get("node_gone_after", 0.5))
        if self._eviction_policy(vm_key) == "Deallocate":
            # the instance stays, stopped (still counted against the Spot quota); the node stays listed
            vm["properties"]["instanceView"] = {"statuses": [
                {"code": "ProvisioningState/succeeded", "level": "Info", "displayStatus": "Provisioning succeeded"},
                {"code": "PowerState/deallocated", "level": "Info", "displayStatus": "VM deallocated"}]}
            self._later(delay, self._node_shut_down, provider)
            self._later(delay * (1 + OUT_OF_SERVICE_AFTER / EVICTION_TAKES), self._node_out_of_service, provider)
            return 204, {}, None
        del self.resources[vm_key]  # eviction policy Delete: the instance goes
        self._later(delay, self._node_gone, provider)
        return 204, {}, None

    @staticmethod
    def _later(delay: float, action, provider: str) -> None:
        timer = threading.Timer(delay, action, args=(provider,))
        timer.daemon = True
        timer.start()

    def _eviction_policy(self, vm_key: str) -> str:
        """The policy of the pool behind a VMSS instance: the cluster whose node resource group holds it, the pool
        its scale set is named after (aks-<pool>-<hash>-vmss)."""
        node_group, vmss = vm_key.split("/")[4], vm_key.split("/")[8]
        for resource in list(self.resources.values()):
            props = resource.get("properties") or {}
            if resource.get("type") == _TYPE["cluster"] and str(props.get("nodeResourceGroup")).lower() == node_group:
                for pool in props.get("agentPoolProfiles") or []:
                    if vmss.startswith(f"aks-{pool['name']}-"):
                        return pool.get("scaleSetEvictionPolicy") or "Delete"
        return "Delete"

    def _nodes_of(self, provider: str) -> list:
        return [key for key, obj in self.kube.objects.items() if key[1] == "Node" and
                str((obj.get("spec") or {}).get("providerID", "")).lower() == provider.lower()]

    def _node_shut_down(self, provider: str) -> None:
        """A deallocated VM's node (cloud-provider-azure, kubernetes-sigs/cloud-provider-azure#4521): NotReady, the
        node lifecycle controller's unreachable taints and the cloud provider's shutdown taint; it stays listed."""
        with self._lock:
            for key in self._nodes_of(provider):
                node = self.kube.objects[key]
                node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                                 "message": "Kubelet stopped posting node status."}]
                node["spec"]["taints"] = [*node["spec"].get("taints", []),
                                          {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                                          {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                                          {"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"}]
                self.kube.seed(node)

    def _node_out_of_service(self, provider: str) -> None:
        """Up to 10 minutes later (the cloud provider's instance cache) the out-of-service taint: PodGC then deletes
        the node's pods (Kubernetes non-graceful node shutdown), as it does those of a node that is gone."""
        with self._lock:
            for key in self._nodes_of(provider):
                node = self.kube.objects[key]
                node["spec"]["taints"] = [*node["spec"].get("taints", []), {
                    "key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]
                self.kube.seed(node)
                self.kube.jobs.node_gone(key[3])

    def _node_gone(self, provider: str) -> None:
        """The cloud node manager removes the node of a deleted VM; pod GC deletes the pods bound to it."""
        with self._lock:
            for key in self._nodes_of(provider):
                del self.kube.objects[key]
                self.kube.jobs.node_gone(key[3])


#: A real simulated eviction took ~3 minutes (Azure: within 30); a deallocated VM's node gets its out-of-service
#: taint up to 10 minutes after it stopped. The fake's delays keep these proportions (``node_gone_after`` scales).
EVICTION_TAKES, OUT_OF_SERVICE_AFTER = 180.0, 600.0

#: What AKS puts on every Spot pool on its own (reference/README: the Spot node pool facts); a PUT without
#: them gets them back, so a client comparing for equality sees drift that is not there.
SPOT_TAINT = "kubernetes.azure.com/scalesetpriority=spot:NoSchedule"
SPOT_LABEL = ("kubernetes.azure.com/scalesetpriority", "spot")
#: Pool fields a PUT on an existing pool may not change (AKS answers 400 with this code).
IMMUTABLE_POOL_FIELDS = ("vmSize", "scaleSetPriority", "scaleSetEvictionPolicy", "spotMaxPrice", "osType")


#: The minor a cluster gets where none is asked, and the patch AKS resolves a minor to (the newest it offers here).
DEFAULT_MINOR, NEWEST_PATCH = "1.33", 2


def _version(text: Any) -> tuple[int, ...] | None:
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(p) for p in match.groups() if p is not None) if match else None


def _resolve_version(asked: str | None, running: str | None) -> str:
    """The patch AKS runs for ``asked``: a patch as asked; a minor alias ("1.33") resolves to the patch it runs if
    that is of the minor, else the newest patch; nothing asked: what runs, else the default minor's newest patch."""
    wanted, have = _version(asked), _version(running)
    if wanted is None:
        return running or f"{DEFAULT_MINOR}.{NEWEST_PATCH}"
    if len(wanted) == 3:
        return str(asked)
    if have is not None and have[:2] == wanted:
        return str(running)
    return f"{wanted[0]}.{wanted[1]}.{NEWEST_PATCH}"


def _downgrade(kind: str, body: dict, existing: dict | None) -> str | None:
    """AKS's 400 OperationNotAllowed text for a PUT asking for a lower Kubernetes version than runs (a minor alias
    of the running minor is no downgrade). None where it is not one."""
    if existing is None or kind not in ("cluster", "agent_pool"):
        return None
    props, there = body.get("properties") or {}, existing.get("properties") or {}
    pairs = [("kubernetesVersion", props, there.get("currentKubernetesVersion"))] if kind == "cluster" else [
        ("orchestratorVersion", props, there.get("currentOrchestratorVersion"))]
    if kind == "cluster":
        running = {p["name"]: p for p in there.get("agentPoolProfiles") or []}
        pairs += [("orchestratorVersion", p, (running.get(p.get("name")) or {}).get("currentOrchestratorVersion"))
                  for p in props.get("agentPoolProfiles") or []]
    for key, holder, running_version in pairs:
        asked, have = _version(holder.get(key)), _version(running_version)
        if asked and have and have[:len(asked)] > asked:
            return (f"Downgrading Kubernetes version {running_version} to {holder.get(key)} is not allowed. Please see "
                    "https://aka.ms/aks-supported-k8s-ver for version details.")
    return None


def _as_aks_keeps_a_pool(pool: dict, existing: dict | None = None, cluster_version: str | None = None) -> None:
    """A pool profile as AKS stores it: its Spot taint and label added at creation, versions resolved to a patch
    release (answered in orchestratorVersion too: Azure/terraform-azurerm-aks#335), read-only fields
    (AgentPoolsGet.json: currentOrchestratorVersion, maxPods, nodeImageVersion).

    An update of an existing Spot pool takes the labels as sent: AKS has dropped its own
    ``kubernetes.azure.com/scalesetpriority`` label from a pool PUT that did not carry it (Azure/AKS#3152). Its Spot
    taint it keeps adding."""
    if pool.get("scaleSetPriority") == "Spot":
        taints = list(pool.get("nodeTaints") or [])
        pool["nodeTaints"] = taints + ([SPOT_TAINT] if SPOT_TAINT not in taints else [])
        if existing is None:
            pool["nodeLabels"] = {**(pool.get("nodeLabels") or {}), SPOT_LABEL[0]: SPOT_LABEL[1]}
    running = (existing or {}).get("currentOrchestratorVersion") or cluster_version
    version = _resolve_version(pool.get("orchestratorVersion"), running)
    pool.update({"currentOrchestratorVersion": version, "orchestratorVersion": version,
                 "powerState": {"code": "Running"}, "nodeImageVersion": "AKSUbuntu-2204gen2containerd-202511.07.0",
                 "kubeletDiskType": "OS", "osSKU": "Ubuntu",
                 "enableFIPS": False, "upgradeSettings": {"maxSurge": "10%"}, "eTag": uuid.uuid4().hex[:12]})
    # what the PUT left out, AKS's defaults (AgentPoolsGet.json; Managed where the size's cache is too small)
    for key, value in (("maxPods", 110), ("osDiskSizeGB", 128), ("osDiskType", "Managed"),
                       ("enableEncryptionAtHost", False)):
        pool.setdefault(key, value)


#: The SDK model each PUT body must fit (tests.support.sdk_schema): the generated models of the providers whose SDK
#: carries field visibility (azure-mgmt-containerservice, azure-mgmt-storage).
_SCHEMAS = {"cluster": ("azure.mgmt.containerservice.models", "ManagedCluster"),
            "agent_pool": ("azure.mgmt.containerservice.models", "AgentPool"),
            "maintenance_configuration": ("azure.mgmt.containerservice.models", "MaintenanceConfiguration"),
            "storage_account": ("azure.mgmt.storage.models", "StorageAccountCreateParameters"),
            "container": ("azure.mgmt.storage.models", "BlobContainer")}


def _schema_problems(kind: str, body: dict) -> list[str]:
    """Fields the SDK model of ``kind`` lacks or holds read-only: ARM refuses unknown properties (400)."""
    import importlib

    from tests.support.sdk_schema import problems

    if kind not in _SCHEMAS:
        return []
    module, name = _SCHEMAS[kind]
    return problems(body, getattr(importlib.import_module(module), name))


def _reserved_label(key: str) -> str | None:
    """AKS's answer to a user node label in a namespace it reserves, as users quote it: kubernetes.azure.com
    (ams0/aks-nvme-ssd-provisioner#5) and, from Kubernetes 1.16, kubernetes.io / k8s.io outside the kubelet's own
    prefixes and keys (Azure/AKS#1937)."""
    domain, sep, _ = key.lower().partition("/")
    if not sep:
        return None

    def under(parent: str) -> bool:
        return domain == parent or domain.endswith("." + parent)

    if under("kubernetes.azure.com"):
        return f"Invalid node label key {key}. The 'kubernetes.azure.com' prefix is preserved by aks system labels"
    allowed = {"beta.kubernetes.io/arch", "failure-domain.beta.kubernetes.io/zone",
               "failure-domain.beta.kubernetes.io/region", "failure-domain.kubernetes.io/region", "kubernetes.io/os",
               "kubernetes.io/arch", "beta.kubernetes.io/os", "failure-domain.kubernetes.io/zone",
               "kubernetes.io/hostname", "kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"}
    if (under("kubernetes.io") or under("k8s.io")) and not (
            under("kubelet.kubernetes.io") or under("node.kubernetes.io") or key.lower() in allowed):
        return ("For Kubernetes version greater than or equal to 1.16, node label keys in the 'kubernetes.io' or "
                "'k8s.io' namespace must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) "
                f"or be in the specifically allowed set ({', '.join(sorted(allowed))}). For more information, please "
                "check https://aka.ms/aks-node-labels-116.")
    return None


def _is_cidr(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _is_private(value: str) -> bool:
    import ipaddress

    network = ipaddress.ip_network(value, strict=False)
    return any(network.overlaps(ipaddress.ip_network(r)) for r in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def _arm_casing(rid: str) -> str:
    """AKS answers ids with ``resourcegroups`` in lower case (AgentPoolsList.json), not as the request had it."""
    return re.sub(r"/resourceGroups/", "/resourcegroups/", rid, flags=re.IGNORECASE)


EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "arm-examples"
REGIONS = ("eastus", "westus")
#: (name, vCPUs, GPUs): current GPU sizes (and the system pool's) as Resource SKUs lists them
GPU_SIZES = (("Standard_NC4as_T4_v3", 4, 1), ("Standard_NC24ads_A100_v4", 24, 1),
             ("Standard_NC40ads_H100_v5", 40, 1), ("Standard_ND96isr_H100_v5", 96, 8),
             ("Standard_ND96isr_H200_v5", 96, 8))
SYSTEM_SIZES = (("Standard_D4s_v5", 4, 0), ("Standard_D4ds_v5", 4, 0))
#: name -> (MaxResourceVolumeMB: the size's local temp disk as its size page gives it, EphemeralOSDiskSupported,
#: EncryptionAtHostSupported): what decides the pools' OS disk and host encryption. D4s_v5 has no temp disk.
DISKS = {"Standard_NC4as_T4_v3": (180224, True, True), "Standard_NC24ads_A100_v4": (65536, True, True),
         "Standard_NC40ads_H100_v5": (131072, True, True), "Standard_ND96isr_H100_v5": (1024000, True, True),
         "Standard_ND96isr_H200_v5": (1024000, True, True), "Standard_D4s_v5": (0, False, True),
         "Standard_D4ds_v5": (153600, True, True)}


def is_query(raw_path: str) -> bool:
    """A Resource Graph query: a POST that reads (a dry run may send it; it changes nothing)."""
    return urlsplit(raw_path).path.rstrip("/").lower() == "/providers/microsoft.resourcegraph/resources"


def _example_body(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())["responses"]["200"]["body"]


def region_skus(location: str) -> list[dict]:
    """The official ListAvailableResourceSkusForARegion example moved to ``location``, with GPU sizes added in
    the shape of its Spot-capable entry (capabilities vCPUs, GPUs, LowPriorityCapable, MaxResourceVolumeMB,
    EphemeralOSDiskSupported, and EncryptionAtHostSupported as real entries list it; zones 1-3)."""
    def moved(entry: dict) -> dict:
        entry = copy.deepcopy(entry)
        entry["locations"] = [location]
        for info in entry.get("locationInfo") or []:
            info["location"] = location
        return entry

    examples = [moved(e) for e in _example_body("ListAvailableResourceSkusForARegion.json")["value"]]
    spot_capable = next(e for e in examples if {"name": "LowPriorityCapable", "value": "True"} in e["capabilities"])
    added = []
    for name, vcpus, gpus in GPU_SIZES + SYSTEM_SIZES:
        entry = copy.deepcopy(spot_capable)
        temp_mb, ephemeral, host_encryption = DISKS[name]
        values = {"vCPUs": str(vcpus), "vCPUsAvailable": str(vcpus), "GPUs": str(gpus),
                  "MaxResourceVolumeMB": str(temp_mb), "EphemeralOSDiskSupported": str(ephemeral)}
        entry["capabilities"] = [{"name": c["name"], "value": values.get(c["name"], c["value"])}
                                 for c in entry["capabilities"]] + ([{"name": "GPUs", "value": str(gpus)}] if gpus else []) \
            + [{"name": "EncryptionAtHostSupported", "value": str(host_encryption)}]
        entry.update({"name": name, "size": name.split("_", 1)[1], "family": f"standard{name.split('_')[1][:2]}Family",
                      "restrictions": []})
        added.append(entry)
    return examples + added


def region_usages() -> list[dict]:
    """The official Usage_List example's entry shape, as the usages a subscription really has: the regional
    vCPUs and the Spot vCPUs (lowPriorityCores) with 100 free."""
    shape = _example_body("Usage_List_MinimumSet_Gen.json")["value"][0]
    return [{**shape, "currentValue": 0, "limit": 100,
             "name": {"value": value, "localizedValue": text}} for value, text in (
        ("cores", "Total Regional vCPUs"), ("lowPriorityCores", "Total Regional Low-priority vCPUs"))]


def _provider_id(node_group: str, vmss: str, instance: int) -> str:
    return (f"azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/{node_group}/providers/Microsoft.Compute/"
            f"virtualMachineScaleSets/{vmss}/virtualMachines/{instance}")


def _elastic_job(job: str, workers: int) -> dict:
    from azext_elastictrain.core import manifests as m
    from azext_elastictrain.core.spec import JobSpec

    cluster = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                              checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
    spec = JobSpec(name=job, script="scripts/train_cifar10.py", min_nodes=1, max_nodes=3, nodes=workers)
    return m.render_elastic_job(spec, cluster, "myregistry.azurecr.io/elastictrain:0.1.0")


def _watched_kind(kube: FakeKube, path: str) -> str | None:
    plural = path.rstrip("/").rsplit("/", 1)[-1]
    return next((k for v in kube.group_versions() for k in kube.kinds(v) if kube_api.plural_of(k) == plural), None)


_PATTERNS = [  # (kind, path regex after /subscriptions/{sub})
    ("storage_name", r"/providers/microsoft\.storage/checknameavailability"),
    ("skus", r"/providers/microsoft\.compute/skus"),
    ("usages", r"/providers/microsoft\.compute/locations/[^/]+/usages"),
    ("resource_group", r"/resourcegroups/[^/]+"),
    ("storage_account", r"/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+"),
    ("container", r"/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+/blobservices/default/"
                  r"containers/[^/]+"),
    ("identity", r"/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/[^/]+"),
    ("federated_credential", r"/resourcegroups/[^/]+/providers/microsoft\.managedidentity/userassignedidentities/"
                             r"[^/]+/federatedidentitycredentials/[^/]+"),
    ("cluster", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+"),
    ("cluster_list", r"(/resourcegroups/[^/]+)?/providers/microsoft\.containerservice/managedclusters"),
    ("agent_pool", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                   r"agentpools/[^/]+"),
    ("credentials", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                    r"listclusterusercredential"),
    ("maintenance_configuration", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/"
                                  r"[^/]+/maintenanceconfigurations/[^/]+"),
    ("feature", r"/providers/microsoft\.features/providers/[^/]+/features/[^/]+"),
    ("admin_credentials", r"/resourcegroups/[^/]+/providers/microsoft\.containerservice/managedclusters/[^/]+/"
                          r"listclusteradmincredential"),
    ("role_assignment", r"/.+/providers/microsoft\.authorization/roleassignments/[^/]+"),
    ("vmss_vm_list", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                     r"virtualmachines"),
    ("vmss_vm", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                r"virtualmachines/\d+"),
    ("vmss_vm_eviction", r"/resourcegroups/[^/]+/providers/microsoft\.compute/virtualmachinescalesets/[^/]+/"
                         r"virtualmachines/\d+/simulateeviction"),
]
_PROVIDER = {"resource_group": "Microsoft.Resources", "storage_account": "Microsoft.Storage",
             "storage_name": "Microsoft.Storage",
             "container": "Microsoft.Storage", "identity": "Microsoft.ManagedIdentity",
             "federated_credential": "Microsoft.ManagedIdentity", "cluster": "Microsoft.ContainerService",
             "cluster_list": "Microsoft.ContainerService", "agent_pool": "Microsoft.ContainerService",
             "credentials": "Microsoft.ContainerService", "admin_credentials": "Microsoft.ContainerService",
             "role_assignment": "Microsoft.Authorization",
             "maintenance_configuration": "Microsoft.ContainerService", "feature": "Microsoft.Features",
             "skus": "Microsoft.Compute/skus", "usages": "Microsoft.Compute/usages",
             "vmss_vm_list": "Microsoft.Compute", "vmss_vm": "Microsoft.Compute", "vmss_vm_eviction": "Microsoft.Compute"}
_TYPE = {"resource_group": "Microsoft.Resources/resourceGroups", "storage_account": "Microsoft.Storage/storageAccounts",
         "container": "Microsoft.Storage/storageAccounts/blobServices/containers",
         "identity": "Microsoft.ManagedIdentity/userAssignedIdentities",
         "federated_credential": "Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials",
         "cluster": "Microsoft.ContainerService/ManagedClusters",
         "agent_pool": "Microsoft.ContainerService/managedClusters/agentPools",
         "maintenance_configuration": "Microsoft.ContainerService/managedClusters/maintenanceConfigurations",
         "role_assignment": "Microsoft.Authorization/roleAssignments"}


def _kind(path: str) -> str | None:
    rest = path.lower().rstrip("/").split("/", 3)[3] if path.count("/") >= 3 else ""
    rest = "/" + rest
    for kind, pattern in _PATTERNS:
        if kind == "role_assignment":
            if re.fullmatch(pattern, rest) and "/resourcegroups/" in rest:
                return kind
        elif re.fullmatch(pattern, rest):
            return kind
    return None


def _handler(server: ArmServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            peer = dict(x[0] for x in cert["subject"]).get("commonName") if cert else None
            try:
                status, extra, payload = server.handle(self.command, self.path, headers, body, peer)
            except Exception as ex:  # noqa: BLE001  a bug in the test server: make it visible
                server.violations.append(f"test server error on {self.command} {self.path}: {ex!r}")
                status, extra, payload = 500, {}, _error("TestServerError", repr(ex))
            text = isinstance(payload, bytes)  # a pod's log
            data = payload if text else b"" if payload is None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{'text/plain' if text else 'application/json'}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-ms-request-id", str(uuid.uuid4()))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _serve

        def log_message(self, *args) -> None:  # quiet: the test reads server.requests
            pass

    return Handler
