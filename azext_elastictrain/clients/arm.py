"""ARM, the one place the CLI talks to it: ``AzureArm`` sends the bodies ``core.aks.arm_bodies`` built, verbatim,
through the azure-cli SDK clients (``_client_factory.cf_*``), and hands back what ARM answered in wire format (the SDKs'
own models differ between SDK generations; the JSON does not). SDK errors become ``core.errors.ArmError``.

SDK imports stay inside functions: loading the extension must not import azure.mgmt.
"""
from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any, Callable

from azext_elastictrain import _client_factory

if TYPE_CHECKING:
    from azext_elastictrain.core.aks.eviction import VmssInstance

#: Resource Graph's GA api-version the queries are sent with (Resources_Resources, 2022-10-01).
RESOURCE_GRAPH_API_VERSION = "2022-10-01"
#: The most pages of one query read (a page holds up to 1000 rows; ours ask for a few sizes of one region).
RESOURCE_GRAPH_PAGES = 5
#: Seconds to connect and to wait for an answer: a Spot band is never worth holding a command for long (Resource
#: Graph answers these small queries in well under a second).
RESOURCE_GRAPH_TIMEOUT = 10


def _raw(pipeline_response: Any, _deserialized: Any, _headers: Any) -> Any:
    """``cls=`` for SDK calls: the response body as ARM sent it (None when empty)."""
    text = pipeline_response.http_response.text()
    return json.loads(text) if text else None


def _body(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


class AzureArm:
    """The ``Arm`` of ``backends.aks.cluster`` on the azure-cli SDK clients of the command's subscription."""

    def __init__(self, cli_ctx: Any) -> None:
        from azure.cli.core._profile import Profile

        account = Profile(cli_ctx=cli_ctx).get_subscription(_client_factory.command_subscription(cli_ctx))
        self.subscription = account["id"]
        self.tenant = account.get("tenantId", "")
        self.storage_suffix = cli_ctx.cloud.suffixes.storage_endpoint  # the cloud's, as 'az cloud show' gives it
        self._cli_ctx = cli_ctx
        self._clients: dict[str, Any] = {}

    def _client(self, name: str) -> Any:
        if name not in self._clients:
            self._clients[name] = getattr(_client_factory, f"cf_{name}")(self._cli_ctx)
        return self._clients[name]

    # one entry per kind: (client, get, put, delete), each a function of (client, ref[, body])
    def _ops(self, kind: str) -> tuple[str, Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        return {
            "resource_group": ("resources",
                               lambda c, r, **k: c.resource_groups.get(r["resource_group"], **k),
                               lambda c, r, b, **k: c.resource_groups.create_or_update(r["resource_group"], b, **k),
                               lambda c, r, **k: c.resource_groups.begin_delete(r["resource_group"], **k)),
            "storage_account": ("storage",
                                lambda c, r, **k: c.storage_accounts.get_properties(r["resource_group"], r["name"],
                                                                                    **k),
                                lambda c, r, b, **k: c.storage_accounts.begin_create(r["resource_group"], r["name"], b,
                                                                                     **k),
                                lambda c, r, **k: c.storage_accounts.delete(r["resource_group"], r["name"], **k)),
            "container": ("storage",
                          lambda c, r, **k: c.blob_containers.get(r["resource_group"], r["account"], r["name"], **k),
                          lambda c, r, b, **k: c.blob_containers.create(r["resource_group"], r["account"], r["name"],
                                                                        b, **k),
                          lambda c, r, **k: c.blob_containers.delete(r["resource_group"], r["account"], r["name"],
                                                                     **k)),
            "identity": ("msi",
                         lambda c, r, **k: c.user_assigned_identities.get(r["resource_group"], r["name"], **k),
                         lambda c, r, b, **k: c.user_assigned_identities.create_or_update(
                             r["resource_group"], r["name"], b, **k),
                         lambda c, r, **k: c.user_assigned_identities.delete(r["resource_group"], r["name"], **k)),
            "federated_credential": ("msi",
                                     lambda c, r, **k: c.federated_identity_credentials.get(
                                         r["resource_group"], r["identity"], r["name"], **k),
                                     lambda c, r, b, **k: c.federated_identity_credentials.create_or_update(
                                         r["resource_group"], r["identity"], r["name"], b, **k),
                                     lambda c, r, **k: c.federated_identity_credentials.delete(
                                         r["resource_group"], r["identity"], r["name"], **k)),
            "cluster": ("containerservice",
                        lambda c, r, **k: c.managed_clusters.get(r["resource_group"], r["name"], **k),
                        lambda c, r, b, **k: c.managed_clusters.begin_create_or_update(
                            r["resource_group"], r["name"], b, **k),
                        lambda c, r, **k: c.managed_clusters.begin_delete(r["resource_group"], r["name"], **k)),
            "agent_pool": ("containerservice",
                           lambda c, r, **k: c.agent_pools.get(r["resource_group"], r["cluster"], r["name"], **k),
                           lambda c, r, b, **k: c.agent_pools.begin_create_or_update(
                               r["resource_group"], r["cluster"], r["name"], b, **k),
                           lambda c, r, **k: c.agent_pools.begin_delete(r["resource_group"], r["cluster"], r["name"],
                                                                        **k)),
            "maintenance_configuration": ("containerservice",
                                          lambda c, r, **k: c.maintenance_configurations.get(
                                              r["resource_group"], r["cluster"], r["name"], **k),
                                          lambda c, r, b, **k: c.maintenance_configurations.create_or_update(
                                              r["resource_group"], r["cluster"], r["name"], b, **k),
                                          lambda c, r, **k: c.maintenance_configurations.delete(
                                              r["resource_group"], r["cluster"], r["name"], **k)),
            "role_assignment": ("authorization",
                                lambda c, r, **k: c.role_assignments.get(r["scope"], r["name"], **k),
                                lambda c, r, b, **k: c.role_assignments.create(r["scope"], r["name"], b, **k),
                                lambda c, r, **k: c.role_assignments.delete(r["scope"], r["name"], **k)),
        }[kind]

    def get(self, kind: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        from azext_elastictrain.core.errors import ArmError

        client, get, _, _ = self._ops(kind)
        try:
            with _arm_errors():
                found: dict[str, Any] | None = get(self._client(client), ref, cls=_raw)
                return found
        except ArmError as ex:
            if ex.status == 404:
                return None
            raise

    def put(self, kind: str, ref: dict[str, Any], body: dict[str, Any], wait: bool = True) -> dict[str, Any] | None:
        client, _, put, _ = self._ops(kind)
        with _arm_errors():
            result = put(self._client(client), ref, _body(_writable(kind, body)), cls=_raw)
            if hasattr(result, "result"):  # a poller: long-running
                result = result.result() if wait else None
            answered: dict[str, Any] | None = result
            return answered

    def delete(self, kind: str, ref: dict[str, Any], wait: bool = True) -> None:
        client, _, _, delete = self._ops(kind)
        with _arm_errors():
            result = delete(self._client(client), ref)
            if wait and hasattr(result, "result"):
                result.result()

    def list_clusters(self, resource_group: str | None) -> list[dict[str, Any]]:
        client = self._client("containerservice")
        with _arm_errors():
            pages = (client.managed_clusters.list_by_resource_group(resource_group) if resource_group
                     else client.managed_clusters.list())
            return [_wire(cluster) for cluster in pages]

    def user_kubeconfig(self, resource_group: str, cluster: str) -> bytes:
        """The cluster user's kubeconfig: kept in memory, never logged."""
        client = self._client("containerservice")
        with _arm_errors():
            # logging_enable=False: az --debug would otherwise log the response, credentials and all
            result = client.managed_clusters.list_cluster_user_credentials(resource_group, cluster, cls=_raw,
                                                                           logging_enable=False)
        configs = (result or {}).get("kubeconfigs") or []
        if not configs:
            from azext_elastictrain.core.errors import ArmError

            raise ArmError(404, "NoCredentials", f"AKS returned no user credentials for cluster {cluster!r}")
        return base64.b64decode(configs[0]["value"])

    def signed_in_principal(self) -> tuple[str, str | None]:
        """The Entra ID object id of the login (user, service principal or managed identity) and its principal
        type, read from the claims of the login's ARM token ('az ad signed-in-user show' without Graph, and it
        works for service principals too). A delegated token (a ``scp`` claim) is a user's; an app token is a
        service principal's (managed identities are service principals)."""
        from azure.cli.core._profile import Profile

        from azext_elastictrain.core.errors import ArmError

        credential = Profile(cli_ctx=self._cli_ctx).get_login_credentials(subscription_id=self.subscription)[0]
        scope = self._cli_ctx.cloud.endpoints.active_directory_resource_id.rstrip("/") + "/.default"
        claims = _token_claims(credential.get_token(scope).token)
        if not claims.get("oid"):
            raise ArmError(401, "NoObjectId", "the login's token names no object id (oid claim): pass "
                                              "--admin-principal OBJECT_ID")
        return str(claims["oid"]), "User" if "scp" in claims else "ServicePrincipal"

    def storage_name_available(self, name: str) -> dict[str, Any]:
        """POST .../Microsoft.Storage/checkNameAvailability ('az storage account check-name'), in wire format:
        storage account names are one namespace for all of Azure."""
        client = self._client("storage")
        body = {"name": name, "type": "Microsoft.Storage/storageAccounts"}
        with _arm_errors():
            return client.storage_accounts.check_name_availability(_body(body), cls=_raw) or {}

    # -- the region preflight (core.aks.preflight): GETs on the compute provider -------------------------------------

    def resource_skus(self, location: str) -> list[dict[str, Any]]:
        """The Resource SKUs of ``location`` (what 'az vm list-skus -l' shows), in wire format."""
        client = self._compute(self.subscription)
        with _arm_errors():
            return [_wire(sku) for sku in client.resource_skus.list(filter=f"location eq '{location}'")]

    def usages(self, location: str) -> list[dict[str, Any]]:
        """The compute quotas and their use in ``location`` ('az vm list-usage -l'), in wire format."""
        client = self._compute(self.subscription)
        with _arm_errors():
            return [_wire(usage) for usage in client.usage.list(location)]

    def feature_state(self, namespace: str, feature: str) -> str:
        """The subscription's registration of a feature ('Registered', 'NotRegistered', ...); 'NotRegistered'
        where ARM does not know it."""
        from azext_elastictrain.core.errors import ArmError

        try:
            with _arm_errors():
                found = self._client("features").features.get(namespace, feature, cls=_raw)
        except ArmError as ex:
            if ex.status == 404:
                return "NotRegistered"
            raise
        return str(((found or {}).get("properties") or {}).get("state") or "NotRegistered")

    def _compute(self, subscription: str) -> Any:
        key = f"compute:{subscription.lower()}"
        if key not in self._clients:
            self._clients[key] = _client_factory.cf_compute(self._cli_ctx, subscription_id=subscription)
        return self._clients[key]

    # -- Resource Graph (Spot eviction rates): POST /providers/Microsoft.ResourceGraph/resources ------------------

    def resource_graph(self, query: str) -> list[dict[str, Any]]:
        """The rows of a tenant-scoped Resource Graph query (``resultFormat`` objectArray), pages followed by
        ``$skipToken``.

        Tenant scope (no ``subscriptions`` in the body; ``allowPartialScopes`` so that a tenant of more
        subscriptions than one query may span still answers): the ``SpotResources`` table belongs to no
        subscription, and a query scoped to one answers no row at all, without an error (grafana/grafana#103702:
        the same SpotResources query "NOT WORKING" with a subscription, "WORKING" without; the REST reference's
        "Basic tenant query" example sends the query alone). The token is the command subscription's tenant's.

        azure-cli has no Resource Graph SDK client (``az graph`` is an extension) and its ``send_raw_request``
        ('az rest') sets no timeout: the request is sent as it sends it (the login's ARM token, az's proxy and CA
        settings) with ``RESOURCE_GRAPH_TIMEOUT``. A timeout or a connection error is an ``OSError``
        (requests' exceptions are), an error status an ``ArmError``."""
        import requests
        from azure.cli.core._profile import Profile
        from azure.cli.core.util import should_disable_connection_verify

        from azext_elastictrain.core.errors import ArmError

        endpoints = self._cli_ctx.cloud.endpoints
        url = (f"{endpoints.resource_manager.rstrip('/')}/providers/Microsoft.ResourceGraph/resources"
               f"?api-version={RESOURCE_GRAPH_API_VERSION}")
        (token_type, token, _), _, _ = Profile(cli_ctx=self._cli_ctx).get_raw_token(
            endpoints.active_directory_resource_id, subscription=self.subscription)
        headers = {"Authorization": f"{token_type} {token}", "Content-Type": "application/json",
                   "User-Agent": "az-elastictrain"}
        rows: list[dict[str, Any]] = []
        options: dict[str, Any] = {"resultFormat": "objectArray", "allowPartialScopes": True}
        with requests.Session() as session:
            settings = session.merge_environment_settings(url, {}, None, not should_disable_connection_verify(), None)
            for _ in range(RESOURCE_GRAPH_PAGES):
                response = session.post(url, data=json.dumps({"query": query, "options": options}),
                                        headers=headers, timeout=RESOURCE_GRAPH_TIMEOUT, **settings)
                if not response.ok:
                    error = _json_or_empty(response).get("error") or {}
                    raise ArmError(response.status_code, error.get("code", ""),
                                   error.get("message", "") or f"HTTP {response.status_code} {response.reason}")
                answer = _json_or_empty(response)
                rows += [row for row in answer.get("data") or [] if isinstance(row, dict)]
                if not answer.get("$skipToken"):
                    break
                options = {**options, "$skipToken": answer["$skipToken"]}
        return rows

    # -- the VMSS instances behind AKS nodes (backends.aks.evict's Compute) -------------------------------

    def simulate_eviction(self, instance: VmssInstance) -> None:
        """POST .../virtualMachines/{id}/simulateEviction (204). ``instance``: a core.aks.eviction.VmssInstance."""
        client = self._compute(instance.subscription)
        with _arm_errors():
            client.virtual_machine_scale_set_vms.simulate_eviction(instance.resource_group, instance.vmss,
                                                                   instance.instance_id)

    def vmss_instance(self, instance: VmssInstance) -> dict[str, Any] | None:
        """The instance as ARM shows it, or None once it is gone (after an eviction with policy Delete)."""
        from azext_elastictrain.core.errors import ArmError

        client = self._compute(instance.subscription)
        try:
            with _arm_errors():
                found: dict[str, Any] | None = client.virtual_machine_scale_set_vms.get(
                    instance.resource_group, instance.vmss, instance.instance_id, cls=_raw)
                return found
        except ArmError as ex:
            if ex.status == 404:
                return None
            raise


class SignedOutArm:  # pylint: disable=too-few-public-methods  # the part of Arm a signed-out dry run uses
    """The ``Arm`` of a dry run without a login: names for the plan, no calls. ``signed_in`` False makes the
    plan skip the region preflight (and say so); any call is a bug, so it fails loudly."""

    subscription = "<subscription id: az login>"
    tenant = ""
    signed_in = False

    def __init__(self, cli_ctx: Any, reason: str | None = None) -> None:
        self.storage_suffix = cli_ctx.cloud.suffixes.storage_endpoint
        self.signed_out_reason = reason  # None: no login at all; else why the login's token could not be had

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"a dry run without a login cannot call ARM ({name})")


def logged_in(cli_ctx: Any) -> bool:
    """Whether az has an account to use (read from az's profile on disk: no request, no token)."""
    from azure.cli.core._profile import Profile

    return bool(Profile(cli_ctx=cli_ctx).load_cached_subscriptions())


def token_problem(cli_ctx: Any) -> str | None:
    """Why no ARM token can be had for the login (an expired refresh token, an unreachable identity endpoint,
    ...), or None when one can: a dry run then plans signed out and says why, instead of failing on the first GET."""
    from azure.cli.core._profile import Profile

    try:
        credential = Profile(cli_ctx=cli_ctx).get_login_credentials()[0]
        credential.get_token(cli_ctx.cloud.endpoints.active_directory_resource_id.rstrip("/") + "/.default")
    except Exception as ex:  # noqa: BLE001  # pylint: disable=broad-exception-caught  # any cause: say it, plan on
        text = str(ex).strip().splitlines()
        return f"{type(ex).__name__}: {text[0][:200]}" if text else type(ex).__name__
    return None


def _token_claims(token: str) -> dict[str, Any]:
    """The claims (payload) of a JWT access token, unverified: our own login's token, read for who we are."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims,
                                dict) else {}  # not a JWT (some clouds' tokens are opaque): the caller says what to do


def _json_or_empty(response: Any) -> dict[str, Any]:
    try:
        found = response.json() if response is not None else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


#: The SDK model of the kinds whose update is built from a GET (core.aks.arm_bodies.merged_update).
_MODELS = {"cluster": ("azure.mgmt.containerservice.models", "ManagedCluster"),
           "agent_pool": ("azure.mgmt.containerservice.models", "AgentPool")}


def _writable(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the fields the SDK model marks read-only (id, provisioningState, currentKubernetesVersion,
    identity.principalId, ...): an update merged onto what ARM answered carries them, and the SDK drops them the
    same way when ``az aks update`` PUTs the model it read."""
    if kind not in _MODELS:
        return body
    import importlib

    module, name = _MODELS[kind]
    writable: dict[str, Any] = getattr(importlib.import_module(module), name)(body).as_dict(exclude_readonly=True)
    return writable


def _wire(model: Any) -> dict[str, Any]:
    """An SDK model (either SDK generation) as wire-format JSON."""
    if isinstance(model, dict):
        return model
    wire: dict[str, Any] = (model.serialize(keep_readonly=True) if hasattr(model, "_attribute_map")  # msrest-style
                            else model.as_dict())
    return wire


class _arm_errors:  # noqa: N801  (a context manager, used like a function)
    """SDK errors -> ``ArmError`` with ARM's status, code and message (never the request or its token)."""

    def __enter__(self) -> "_arm_errors":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        from azure.core.exceptions import HttpResponseError

        from azext_elastictrain.core.errors import ArmError

        if isinstance(exc, HttpResponseError):
            error = getattr(exc, "error", None)
            code = getattr(error, "code", None) or ""
            message = getattr(error, "message", None) or exc.message or str(exc)
            raise ArmError(exc.status_code or 0, code, message.splitlines()[0] if message else "") from exc
