"""A local HTTPS Azure Resource Manager for contract tests, with a managed-identity endpoint and a Kubernetes API.

The real ``az`` (and the SDK clients inside it) talk to it exactly as to Azure:

* **ARM**: stateful per resource id; answers like the official x-ms-examples (reference/azure-rest-api-specs):
  status codes, bodies with read-only fields (ids, provisioningState, principalId, issuer URL, ...);
  long-running operations poll through ``Azure-AsyncOperation`` (AKS PUTs) or ``Location`` (storage create,
  AKS delete) with ``Retry-After: 1``, Succeeded at the first poll (``lro_polls``: InProgress that many times
  first).
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

The package, by what it fakes: ``identity`` (subscriptions, the login and its tokens, certificates), ``routes``
(resource kinds of paths, api-versions, official examples, SDK schemas), ``storage``, ``authorization``, ``aks``
(with each cluster's Kubernetes front), ``compute`` (what regions offer, VMSS instances, evictions),
``resource_graph``; ``server`` assembles ``ArmServer`` from their fronts.
"""
from tests.support.arm_server.aks import SPOT_LABEL, SPOT_TAINT
from tests.support.arm_server.compute import region_skus, region_usages
from tests.support.arm_server.identity import (
    ACCESS_TOKEN_SECRET, AKS_RBAC_CLUSTER_ADMIN, AKS_SERVER_APP, BLOB_DATA_CONTRIBUTOR, BLOB_DATA_OWNER,
    BLOB_DATA_READER, IDENTITY_HEADER, KUBE_TOKEN, LOGIN_OBJECT_ID, OTHER_SUBSCRIPTION, STATIC_CREDENTIAL_REFUSED,
    SUBSCRIPTION, SUBSCRIPTIONS, TENANT, _claims, make_certificate,
)
from tests.support.arm_server.routes import API_VERSIONS, is_query
from tests.support.arm_server.server import ArmServer

__all__ = [
    "ACCESS_TOKEN_SECRET", "AKS_RBAC_CLUSTER_ADMIN", "AKS_SERVER_APP", "API_VERSIONS", "ArmServer",
    "BLOB_DATA_CONTRIBUTOR", "BLOB_DATA_OWNER", "BLOB_DATA_READER", "IDENTITY_HEADER", "KUBE_TOKEN",
    "LOGIN_OBJECT_ID", "OTHER_SUBSCRIPTION", "SPOT_LABEL", "SPOT_TAINT", "STATIC_CREDENTIAL_REFUSED", "SUBSCRIPTION",
    "SUBSCRIPTIONS", "TENANT", "_claims", "is_query", "make_certificate", "region_skus", "region_usages",
]
