"""The ARM test server's Microsoft.ContainerService: what AKS refuses and changes, credentials, the Kubernetes front."""
from __future__ import annotations

import base64
import copy
import re
import time
import uuid
from typing import Any

from tests.support import kube_apiserver as kube_api
from tests.support.fake_kube import FakeKube
from tests.support.arm_server.compute import _provider_id
from tests.support.arm_server.identity import (
    AKS_SERVER_APP, KUBE_TOKEN, STATIC_CREDENTIAL_REFUSED, SUBSCRIPTION, TENANT, _claims, _pem, _signed_certificate,
)
from tests.support.arm_server.routes import _TYPE, _error


def _entra_only(cluster: dict) -> bool:
    props = cluster.get("properties") or {}
    return bool((props.get("aadProfile") or {}).get("managed") and props.get("disableLocalAccounts"))


def _kube_status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


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


def _elastic_job(job: str, workers: int) -> dict:
    from azext_elastictrain.core.aks import manifests as m
    from azext_elastictrain.core.spec import JobSpec

    cluster = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                              checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
    spec = JobSpec(name=job, script="scripts/train_cifar10.py", min_nodes=1, max_nodes=3, nodes=workers)
    return m.render_elastic_job(spec, cluster, "myregistry.azurecr.io/elastictrain:0.1.0")


def _watched_kind(kube: FakeKube, path: str) -> str | None:
    plural = path.rstrip("/").rsplit("/", 1)[-1]
    return next((k for v in kube.group_versions() for k in kube.kinds(v) if kube_api.plural_of(k) == plural), None)


class AksFront:  # pylint: disable=too-few-public-methods
    """AKS: clusters and agent pools as AKS changes them, their credentials, and each cluster's Kubernetes API.
    A part of ArmServer: its state is the server's."""

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

    def _sync_pool(self, pool_id: str, pool: dict) -> None:
        """A cluster GET lists its pools too, as AKS does."""
        cluster = self.resources.get(pool_id.lower().rsplit("/agentpools/", 1)[0])
        if cluster is None:
            return
        profile = {"name": pool["name"], **copy.deepcopy(pool["properties"])}
        profiles = [p for p in cluster["properties"].get("agentPoolProfiles", []) if p["name"] != pool["name"]]
        cluster["properties"]["agentPoolProfiles"] = profiles + [profile]

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
