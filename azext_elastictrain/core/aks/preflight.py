"""Preflight for an AKS cluster: can this region run the GPU Spot pool asked for? Pure: no network, no SDK.

Before anything is created, the answers of two read-only APIs decide:

* **Resource SKUs** (``Microsoft.Compute/skus``, what ``az vm list-skus`` shows): the GPU size exists in the
  region, supports Spot (capability ``LowPriorityCapable``) and is not restricted for the subscription
  (``restrictions`` with reason ``NotAvailableForSubscription``, for the location or for every zone it has).
  A size that fails is an error: AKS would accept the cluster and fail on the pool minutes later.
* **Usage** (``Microsoft.Compute/locations/{location}/usages``): the regional Spot vCPU quota
  (``lowPriorityCores``) left covers ``--max-count`` x the size's ``vCPUs``. Short is a warning, not an error:
  the pool is created and grows as far as the quota allows (the autoscaler's scale-ups beyond fail).

The same Resource SKUs entries tell what the node sizes' disks allow (``EphemeralOSDiskSupported``,
``CachedDiskBytes``, ``MaxResourceVolumeMB``, ``EncryptionAtHostSupported``): ``node_hardware`` turns them into the
pools' OS disk and host encryption. Encryption at host also needs the subscription's ``Microsoft.Compute/
EncryptionAtHost`` feature registered (Microsoft.Features), which the caller reads when a size supports it.

The caller fetches the lists (wire format, camelCase, as in the official examples) and passes them here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

#: Azure's page on raising the Spot vCPU quota (Quotas > Compute > "Total Regional Spot vCPUs").
SPOT_QUOTA_DOCS = "https://learn.microsoft.com/azure/quotas/spot-quota"
SPOT_QUOTA = "lowPriorityCores"
NOT_AVAILABLE = "NotAvailableForSubscription"
#: Restriction reasons that close a size to the subscription: not offered to it, or not to its offer type
#: (``QuotaId``: e.g. a free trial).
RESTRICTING_REASONS = frozenset({NOT_AVAILABLE.lower(), "quotaid"})
#: At most this many alternative sizes are named in an error.
ALTERNATIVES_SHOWN = 8


class PreflightError(ValueError):
    """The region cannot run the pool: ``str()`` says what and why, ``recommendation`` how to fix it."""

    def __init__(self, message: str, recommendation: str) -> None:
        super().__init__(message)
        self.recommendation = recommendation


@dataclass(frozen=True)
class VmSize:  # pylint: disable=too-many-instance-attributes  # the Resource SKU capabilities we read
    """A VM size as the Resource SKUs API describes it in one region."""

    name: str
    vcpus: int
    gpus: int
    spot_capable: bool
    zones: tuple[str, ...] = ()
    restricted_zones: tuple[str, ...] = ()
    location_restricted: bool = False
    ephemeral_os_disk: bool = False  # EphemeralOSDiskSupported
    cache_gib: float = 0.0  # CachedDiskBytes: the host cache an ephemeral OS disk can live in
    temp_disk_gib: float = 0.0  # MaxResourceVolumeMB: the local temp disk, the other place it can live
    encryption_at_host: bool = False  # EncryptionAtHostSupported

    @property
    def available(self) -> bool:
        """Not restricted for the subscription: in the region, and in at least one zone where it has zones."""
        if self.location_restricted:
            return False
        return not self.zones or bool(set(self.zones) - set(self.restricted_zones))


@dataclass
class PreflightResult:  # pylint: disable=too-many-instance-attributes  # what create needs from the region
    location: str
    gpu_vm_size: str
    vcpus: int
    spot_vcpus_needed: int
    spot_vcpus_free: int | None  # None: the Usage API does not list lowPriorityCores here
    warnings: list[str] = field(default_factory=list)
    gpu: VmSize | None = None  # the sizes as the region's Resource SKUs describe them
    system: VmSize | None = None  # None: the region does not list the system pool's size
    encryption_at_host_registered: bool | None = None  # None: not asked (no size supports it, or it is off)
    spot_market: dict[str, Any] | None = None  # the GPU size's prices and eviction band (clients.spot); None: not asked

    def as_dict(self) -> dict[str, Any]:
        shown = {"location": self.location, "gpuVmSize": self.gpu_vm_size, "vCPUs": self.vcpus,
                 "spotVcpusNeeded": self.spot_vcpus_needed, "spotVcpusFree": self.spot_vcpus_free,
                 "warnings": list(self.warnings)}
        if self.spot_market is not None:
            shown["spotMarket"] = self.spot_market
        return shown


def spot_market_line(offer: dict[str, Any]) -> str:
    """What the GPU size costs and how often it is evicted, as the preflight says it."""
    currency = offer.get("currency", "")
    band = offer.get("evictionRate") or "unknown"
    return (f"{offer.get('vmSize')} in {offer.get('location')}: Spot {offer.get('spotPerHour')} {currency}/hour, "
            f"on-demand {offer.get('onDemandPerHour')} {currency}/hour, eviction rate "
            f"{band + '%' if band != 'unknown' else 'unknown'} (last 28 days)")


def spot_band_warnings(offer: dict[str, Any]) -> list[str]:
    """An eviction-rate band that could not be had: said, so that "unknown" is not read as "no evictions"."""
    if offer.get("evictionRate") not in (None, "unknown") or not offer.get("evictionRateError"):
        return []
    return [f"The eviction rate of {offer.get('vmSize')} in {offer.get('location')} is unknown: "
            f"{offer['evictionRateError']}."]


def spot_price_warnings(offer: dict[str, Any], max_price: float) -> list[str]:
    """A --max-price below the current Spot price: the pool would never get a node (Azure allocates a Spot VM
    only while its price is at most the max price). -1 (pay up to on-demand) and an unknown price warn of
    nothing. Both are US dollars: Azure's max price is, and the preflight asks the prices in USD."""
    spot = offer.get("spotPerHour")
    if max_price == -1 or not isinstance(spot, (int, float)) or max_price >= spot:
        return []
    return [f"--max-price {max_price:g} is below the current Spot price of {offer.get('vmSize')} in "
            f"{offer.get('location')} ({spot:g} {offer.get('currency')}/hour): the GPU pool will get no node "
            "until the price falls below it. Raise --max-price, or pass -1 to pay up to the on-demand price."]


#: The OS disk size an ephemeral OS disk gets at most (AKS's usual default) and at least (the node image, the
#: container images of a GPU training job - CUDA images are several GiB - and their layers must fit).
OS_DISK_GIB = 128
MIN_EPHEMERAL_OS_DISK_GIB = 64
ENCRYPTION_AT_HOST_FEATURE = ("Microsoft.Compute", "EncryptionAtHost")
ENCRYPTION_AT_HOST_DOCS = "https://learn.microsoft.com/azure/aks/enable-host-encryption"


@dataclass(frozen=True)
class PoolHardware:
    """What a pool's size allows: its OS disk (None: AKS's default) and host encryption."""

    os_disk_type: str | None = None  # "Ephemeral" or "Managed"
    os_disk_gib: int | None = None
    encryption_at_host: bool | None = None  # None: not sent (AKS's default, off)

    def as_dict(self) -> dict[str, Any]:
        return {"osDiskType": self.os_disk_type, "osDiskSizeGB": self.os_disk_gib,
                "encryptionAtHost": self.encryption_at_host}


def os_disk(size: VmSize | None) -> tuple[str | None, int | None]:
    """An ephemeral OS disk where the size has one and a host cache or temp disk of at least
    ``MIN_EPHEMERAL_OS_DISK_GIB`` to hold it (AKS places it in the cache, else on the temp disk), sized to fit, at
    most ``OS_DISK_GIB``; else a managed disk. (None, None) where the size is not known (a dry run without login)."""
    if size is None:
        return None, None
    room = int(max(size.cache_gib, size.temp_disk_gib))
    if size.ephemeral_os_disk and room >= MIN_EPHEMERAL_OS_DISK_GIB:
        return "Ephemeral", min(OS_DISK_GIB, room)
    return "Managed", None


def pool_hardware(size: VmSize | None, encryption_at_host: bool | None, registered: bool | None) -> PoolHardware:
    """The pool's OS disk from its size; host encryption as asked (``encryption_at_host``), or where unasked (None)
    where the size supports it and the subscription has the feature registered."""
    disk_type, disk_gib = os_disk(size)
    if encryption_at_host is None:
        encryption = True if (size is not None and size.encryption_at_host and registered) else None
    else:
        encryption = encryption_at_host or None  # False: AKS's default, not sent
    return PoolHardware(disk_type, disk_gib, encryption)


def check_encryption_at_host(asked: bool | None, sizes: list[VmSize], registered: bool | None) -> list[str]:
    """Raise where host encryption is asked for (True) and a size or the subscription lacks it; the notes to show
    where it is left off by default (None) for want of the subscription's feature."""
    if asked is False:
        return []
    lacking = [s.name for s in sizes if not s.encryption_at_host]
    namespace, feature = ENCRYPTION_AT_HOST_FEATURE
    register = (f"'az feature register --namespace {namespace} --name {feature}', then 'az provider register -n "
                f"{namespace}' ({ENCRYPTION_AT_HOST_DOCS})")
    if asked:
        if lacking:
            raise PreflightError(f"--encryption-at-host: VM size(s) {', '.join(lacking)} do not support encryption "
                                 "at host (Resource SKUs: EncryptionAtHostSupported is not True)",
                                 "Pick sizes that support it, or leave --encryption-at-host out (it is then on "
                                 "where the size supports it).")
        if registered is False:
            raise PreflightError(f"--encryption-at-host: the subscription has not registered the feature "
                                 f"{namespace}/{feature}", f"Register it: {register}.")
        return []
    if registered is False and len(lacking) < len(sizes):
        return [f"Encryption at host stays off: the subscription has not registered {namespace}/{feature}. To "
                f"encrypt the nodes' temp disks and caches, register it: {register}, before creating the cluster "
                "(it cannot be turned on for an existing pool)."]
    return []


def vm_sizes(resource_skus: list[dict[str, Any]], location: str) -> dict[str, VmSize]:
    """The virtual machine sizes of ``location``, by lower-case name, from Resource SKUs entries."""
    sizes = {}
    for sku in resource_skus:
        if str(sku.get("resourceType", "")).lower() != "virtualmachines":
            continue
        if location.lower() not in [str(loc).lower() for loc in sku.get("locations") or []]:
            continue
        capabilities = {str(c.get("name", "")).lower(): str(c.get("value", "")) for c in sku.get("capabilities") or []}
        info: dict[str, Any] = next((i for i in sku.get("locationInfo") or []
                                     if str(i.get("location", "")).lower() == location.lower()), {})
        restricted_zones: set[str] = set()
        location_restricted = False
        for restriction in sku.get("restrictions") or []:
            if str(restriction.get("reasonCode", "")).lower() not in RESTRICTING_REASONS:
                continue
            if str(restriction.get("type", "")).lower() == "location":
                location_restricted = True
            elif str(restriction.get("type", "")).lower() == "zone":
                restricted_zones |= set((restriction.get("restrictionInfo") or {}).get("zones") or [])
        sizes[str(sku.get("name", "")).lower()] = VmSize(
            name=str(sku.get("name", "")), vcpus=_whole(capabilities.get("vcpus")),
            gpus=_whole(capabilities.get("gpus")),
            spot_capable=capabilities.get("lowprioritycapable", "").lower() == "true",
            zones=tuple(info.get("zones") or ()), restricted_zones=tuple(sorted(restricted_zones)),
            location_restricted=location_restricted,
            ephemeral_os_disk=capabilities.get("ephemeralosdisksupported", "").lower() == "true",
            cache_gib=_whole(capabilities.get("cacheddiskbytes")) / 2**30,
            temp_disk_gib=_whole(capabilities.get("maxresourcevolumemb")) / 1024,
            encryption_at_host=capabilities.get("encryptionathostsupported", "").lower() == "true")
    return sizes


def spot_gpu_sizes(sizes: dict[str, VmSize]) -> list[str]:
    """Sizes in the region with a GPU, Spot support and no restriction: what the user can pick instead."""
    return sorted(s.name for s in sizes.values() if s.gpus > 0 and s.spot_capable and s.available)


def check(gpu_vm_size: str, max_count: int, location: str, resource_skus: list[dict[str, Any]],
          usages: list[dict[str, Any]], *, system_vm_size: str = "") -> PreflightResult:
    """Raise PreflightError where the size cannot run a Spot pool in the region; warn where quota is short."""
    sizes = vm_sizes(resource_skus, location)
    result = _check_gpu(sizes, gpu_vm_size, max_count, location, usages)
    result.gpu = sizes[gpu_vm_size.lower()]
    result.system = sizes.get(system_vm_size.lower()) if system_vm_size else None
    return result


def _check_gpu(sizes: dict[str, VmSize], gpu_vm_size: str, max_count: int, location: str,
               usages: list[dict[str, Any]]) -> PreflightResult:
    size = sizes.get(gpu_vm_size.lower())
    instead = _instead(sizes, location)
    if size is None:
        raise PreflightError(f"GPU VM size {gpu_vm_size!r} is not offered in region {location!r} "
                             "(the Resource SKUs API does not list it there)", instead)
    if size.gpus <= 0:
        raise PreflightError(f"VM size {size.name!r} has no GPU (Resource SKUs: capability GPUs is "
                             f"{size.gpus}): the training pool needs NVIDIA GPUs", instead)
    if not size.spot_capable:
        raise PreflightError(f"GPU VM size {size.name!r} cannot run as Spot in region {location!r} "
                             "(Resource SKUs: LowPriorityCapable is not True)", instead)
    if not size.available:
        where = "in this region" if size.location_restricted else f"in any of its zones ({', '.join(size.zones)})"
        raise PreflightError(f"GPU VM size {size.name!r} is not available to this subscription {where} in "
                             f"region {location!r} (Resource SKUs: restriction {NOT_AVAILABLE} or QuotaId)",
                             instead + " Or ask Azure support to enable the size for the subscription.")
    return _quota(size, max_count, location, usages)


def _spot_usage(usages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((u for u in usages if str((u.get("name") or {}).get("value", "")).lower() == SPOT_QUOTA.lower()),
                None)


def spot_quota(usages: list[dict[str, Any]]) -> int | None:
    """The regional Spot vCPUs left (limit - current); None where the Usage API does not list them."""
    usage = _spot_usage(usages)
    return None if usage is None else int(usage.get("limit", 0)) - int(usage.get("currentValue", 0))


def _quota(size: VmSize, max_count: int, location: str, usages: list[dict[str, Any]]) -> PreflightResult:
    needed = max_count * size.vcpus
    usage = _spot_usage(usages) or {}
    free = spot_quota(usages)
    result = PreflightResult(location, size.name, size.vcpus, needed, free)
    if free is not None and free < needed:
        nodes = max(free, 0) // size.vcpus if size.vcpus else 0
        result.warnings.append(
            f"Spot vCPU quota in {location} is short: {max(free, 0)} of {usage.get('limit')} free, --max-count "
            f"{max_count} x {size.vcpus} vCPUs of {size.name} needs {needed}; the GPU pool can grow to {nodes} "
            f"node(s) only. Request more 'Total Regional Spot vCPUs' ({SPOT_QUOTA}) for {location}: "
            f"Azure portal > Quotas > Compute, or {SPOT_QUOTA_DOCS}; or lower --max-count.")
    return result


def _instead(sizes: dict[str, VmSize], location: str) -> str:
    names = spot_gpu_sizes(sizes)
    if not names:
        return (f"Region {location!r} offers no Spot-capable GPU size to this subscription: pick another region "
                "with -l ('az vm list-skus -l REGION --resource-type virtualMachines -o table').")
    shown = ", ".join(names[:ALTERNATIVES_SHOWN]) + (", ..." if len(names) > ALTERNATIVES_SHOWN else "")
    return (f"Pass --gpu-vm-size with a Spot-capable GPU size of {location}: {shown} "
            f"(all: 'az vm list-skus -l {location} --resource-type virtualMachines -o table').")


def _whole(text: str | None) -> int:
    try:
        return int(float(text or 0))
    except ValueError:
        return 0


def storage_name_refused(name: str, answer: dict[str, Any], *, chosen: bool) -> PreflightError:
    """The error for a storage account name ``checkNameAvailability`` refused (``answer``: its wire body). Names are
    one namespace for all of Azure: a name someone anywhere holds is taken for everyone."""
    reason = str(answer.get("reason") or "")
    said = str(answer.get("message") or "").strip()
    why = ("is taken: storage account names are unique across all of Azure, and another resource group or "
           "subscription holds it" if reason == "AlreadyExists" else f"cannot be used ({reason or 'refused'})")
    whose = "you chose" if chosen else "derived from the subscription, resource group and cluster name"
    return PreflightError(
        f"the storage account name {name!r} ({whose}) {why}" + (f": {said}" if said else "") + ". Nothing was created.",
        "Pass --storage-account NAME with a name of your own (3-24 lowercase letters and digits); "
        "'az storage account check-name --name NAME' tells whether it is free.")


class RegionApi(Protocol):
    """What the preflight reads through the backend's Arm (core.backends.aks.Arm has these)."""

    def get(self, kind: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        ...

    def resource_skus(self, location: str) -> list[dict[str, Any]]:
        ...

    def usages(self, location: str) -> list[dict[str, Any]]:
        ...

    def feature_state(self, namespace: str, feature: str) -> str:
        ...  # Microsoft.Features: e.g. "Registered"


def run(arm_client: RegionApi, gpu_vm_size: str, max_count: int, location: str, resource_group: str, *,
        system_vm_size: str = "", encryption_at_host: bool | None = None) -> PreflightResult | None:
    """Fetch the lists through the backend's Arm (GETs only) and ``check``. ``location`` empty: the resource
    group's; None when neither is known yet (the create then fails on the resource group, asking for -l).
    Where host encryption may be on (not ``False``) and a size supports it, the feature's registration is read."""
    if not location:
        group = arm_client.get("resource_group", {"resource_group": resource_group})
        location = (group or {}).get("location", "")
        if not location:
            return None
    result = check(gpu_vm_size, max_count, location, arm_client.resource_skus(location), arm_client.usages(location),
                   system_vm_size=system_vm_size)
    sizes = [s for s in (result.system, result.gpu) if s is not None]
    if encryption_at_host is not False and (encryption_at_host or any(s.encryption_at_host for s in sizes)):
        state = arm_client.feature_state(*ENCRYPTION_AT_HOST_FEATURE)
        result.encryption_at_host_registered = state.lower() == "registered"
    result.warnings += check_encryption_at_host(encryption_at_host, sizes, result.encryption_at_host_registered)
    return result
