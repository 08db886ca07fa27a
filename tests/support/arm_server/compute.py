"""The ARM test server's Microsoft.Compute: Resource SKUs and Usage of the test regions, VMSS instances and
evictions."""
from __future__ import annotations

import copy
import re
import threading
import uuid
from typing import Any

from tests.support.arm_server.identity import SUBSCRIPTION
from tests.support.arm_server.routes import _TYPE, _error, _example_body


#: A real simulated eviction took ~3 minutes (Azure: within 30); a deallocated VM's node gets its out-of-service
#: taint up to 10 minutes after it stopped. The fake's delays keep these proportions (``node_gone_after`` scales).
EVICTION_TAKES, OUT_OF_SERVICE_AFTER = 180.0, 600.0


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


class ComputeFront:  # pylint: disable=too-few-public-methods
    """Compute: what a region offers (Resource SKUs, Usage), and the VMSS instances behind the nodes, evicted.
    A part of ArmServer: its state is the server's."""

    def reset_regions(self) -> None:
        """Every test region offers the GPU sizes of ``GPU_SIZES`` with Spot, unrestricted, and 100 Spot vCPUs; the
        subscription has registered encryption at host."""
        self.skus = {location: region_skus(location) for location in REGIONS}
        self.usages = {location: region_usages() for location in REGIONS}
        self.features = {"microsoft.compute/encryptionathost": "Registered"}
        #: Resource Graph's Spot eviction-rate bands: region -> lower-case size -> band (every Spot-capable size has
        #: one, as on Azure; a test drops one to see "unknown")
        self.spot_eviction_rates = {location: {"standard_nc4as_t4_v3": "0-5", "standard_nc24ads_a100_v4": "5-10",
                                               "standard_nc40ads_h100_v5": "10-15", "standard_nd96isr_h100_v5": "20+",
                                               "standard_nd96isr_h200_v5": "15-20"}
                                    for location in REGIONS}
        #: Resource Graph's latest Linux Spot prices in USD (the tests' own figures): region -> size -> price
        self.spot_prices_usd = {location: {"standard_nc4as_t4_v3": 0.0771, "standard_nc24ads_a100_v4": 0.7213,
                                           "standard_nc40ads_h100_v5": 1.3702, "standard_nd96isr_h100_v5": 19.2031,
                                           "standard_nd96isr_h200_v5": 21.9904}
                                for location in REGIONS}

    def sku(self, location: str, name: str) -> dict:
        """The Resource SKUs entry of a size in a region, for a test to restrict or change."""
        return next(s for s in self.skus[location] if s["name"].lower() == name.lower())

    def spot_quota(self, location: str) -> dict:
        return next(u for u in self.usages[location] if u["name"]["value"] == "lowPriorityCores")

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
