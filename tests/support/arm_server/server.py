"""The ARM test server itself: one HTTPS server, ARM's generic resource handling, and the fronts of each service."""
from __future__ import annotations

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

from tests.support.fake_kube import FakeKube
from tests.support.arm_server.aks import (
    AksFront, DEFAULT_MINOR, IMMUTABLE_POOL_FIELDS, _as_aks_keeps_a_pool, _downgrade, _is_cidr, _is_private,
    _resolve_version,
)
from tests.support.arm_server.authorization import AuthorizationFront
from tests.support.arm_server.compute import ComputeFront
from tests.support.arm_server.identity import (
    AKS_RBAC_CLUSTER_ADMIN, BLOB_DATA_CONTRIBUTOR, IDENTITY_HEADER, IdentityFront, SUBSCRIPTIONS, TENANT, _claims,
    _kube_ca, _pem, make_certificate,
)
from tests.support.arm_server.resource_graph import STALL_HEADER, ResourceGraphFront
from tests.support.arm_server.routes import (
    API_VERSIONS, LRO_POLLS, _PROVIDER, _TYPE, _arm_casing, _error, _kind, _same_value, _schema_problems, is_query,
)
from tests.support.arm_server.storage import StorageFront


class ArmServer(IdentityFront, StorageFront, AuthorizationFront, AksFront, ComputeFront, ResourceGraphFront):
    """See the package docstring. ``expect`` holds the values the test wants on the wire. One front per service it
    fakes (identity, storage, authorization, aks, compute, resource_graph), all on the state kept here."""

    def __init__(self, folder: Path) -> None:
        self.cert, self._key = make_certificate(folder)
        self.key = self._key  # for other local services behind the same trusted certificate (Azurite)
        self.resources: dict[str, dict] = {}  # lower-case id -> resource (wire format)
        self.operations: dict[str, dict] = {}
        self.lro_polls = LRO_POLLS  # InProgress answers before an operation's Succeeded (routes.py)
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
        done = record["polls"] > self.lro_polls
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
            stall = float(extra.pop(STALL_HEADER, 0) or 0)
            if stall:  # a service that does not answer in time (held here: the server's lock is not held)
                time.sleep(stall)
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
