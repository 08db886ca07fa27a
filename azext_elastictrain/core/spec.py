"""What users ask for: each spec is valid once built (``SpecError`` otherwise). Pure, but for ``check_local_script``."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from azext_elastictrain.core.constants import (
    CHECKPOINT_CONTAINER,
    TRAINING_NAMESPACE,
    TRAINING_SERVICE_ACCOUNT,
)
from azext_elastictrain.core.launch import (
    ENV_COORDINATOR, ENV_PREFIX, ENV_SCRIPT_SETTINGS, MODES, RECOVERY_IN_PROCESS, RECOVERY_MODES, RECOVERY_RESTART,
    TCP_STORE_WORKAROUND, LaunchProfile, RecoveryMode)
from azext_elastictrain.core.settings import DEFAULTS, RuntimeSettings

LOCAL_CLUSTER_DEFAULT = "local"
# The memory tier keeps two copies of each node's state (runtime/memory_tier.py): the default leaves room
# for a 4 GiB model + optimizer state. On AKS it is the sizeLimit of a memory-backed emptyDir, which counts
# against the pod's memory; a tier that does not fit turns itself off (the runtime logs it), blob stands.
DEFAULT_MEMORY_TIER = "8Gi"
MEMORY_TIER_OFF = "off"
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOCAL_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")


class SpecError(ValueError):
    """A spec that cannot be built: the message says what and how to fix it."""


@dataclass(frozen=True)
class LocalClusterSpec:
    """A cluster of real processes on this machine: etcd, Azurite, Scheduled Events."""

    name: str = LOCAL_CLUSTER_DEFAULT

    def __post_init__(self) -> None:
        if not _LOCAL_NAME.fullmatch(self.name or ""):
            raise SpecError(
                f"invalid local cluster name {self.name!r}: use 1-32 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )


@dataclass(frozen=True)
class JobSpec:  # pylint: disable=too-many-instance-attributes  # one field per user option
    """An elastic job: ``nodes`` torchrun agents (between ``min_nodes`` and ``max_nodes``) running ``script``.

    ``nodes`` defaults to ``max_nodes``. Valid once built (``SpecError`` otherwise). Where ``script`` is looked for
    is the backend's: a file of this machine (``check_local_script``) or a path inside the job's container image
    (``check_script_in_image``), which only the cluster can open.
    """

    name: str
    script: str
    min_nodes: int = 1
    max_nodes: int = 1
    nodes: int | None = None
    nproc_per_node: int = 1
    script_args: tuple[str, ...] = ()
    checkpoint_interval: int | None = None
    checkpoint_interval_seconds: float | None = None
    keep: int = DEFAULTS.keep
    # The memory tier: "off", or the node memory it may use (a Kubernetes quantity: on AKS the
    # sizeLimit of the memory-backed emptyDir it lives in).
    memory_tier: str = DEFAULT_MEMORY_TIER
    # Workers fork from the node's warm server, which imported torch once (runtime/warm.py); False: each
    # worker starts a new Python, as plain torchrun does.
    warm_start: bool = True
    # How the job survives a membership change (core.launch.RECOVERY_MODES): "restart" (torchrun restarts every
    # worker) or "in-process" (workers stay alive; a coordinator of the job's own holds a quorum each step).
    recovery: str = RECOVERY_RESTART
    # The training script's own environment, "KEY=VALUE" each (--env): on every node of either backend.
    env: tuple[str, ...] = ()

    @property
    def env_vars(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.env)

    @property
    def memory_tier_on(self) -> bool:
        return self.memory_tier != MEMORY_TIER_OFF

    @property
    def in_process(self) -> bool:
        return self.recovery == RECOVERY_IN_PROCESS

    @property
    def mode(self) -> RecoveryMode:
        """The recovery mode as the launch sees it (core/launch.py MODES)."""
        return MODES[self.recovery]

    def runtime_settings(self, profile: LaunchProfile) -> RuntimeSettings:
        """The job's runtime settings (core/settings.py): its options on the backend's figures (the launch profile),
        and what its ``--env`` gives of the settings no option sets (launch.ENV_SCRIPT_SETTINGS)."""
        given = RuntimeSettings.from_env({name: value for name, value in self.env_vars.items()
                                          if name in ENV_SCRIPT_SETTINGS})
        return replace(
            given, keep=self.keep, checkpoint_interval_steps=self.checkpoint_interval,
            checkpoint_interval_seconds=self.checkpoint_interval_seconds, memory_tier=self.memory_tier_on,
            recovery=self.recovery, nodes=(self.min_nodes, self.max_nodes),
            progress_seconds=profile.progress_seconds, collective_timeout_seconds=profile.collective_timeout_seconds,
            replica_timeout_seconds=profile.replica_timeout_seconds if self.in_process else None,
            replica_heartbeat_timeout_seconds=(profile.coordinator_heartbeat_timeout_ms / 1000 if self.in_process
                                               else None))

    @property
    def node_count(self) -> int:
        return self.max_nodes if self.nodes is None else self.nodes

    def node_names(self) -> list[str]:
        return [f"{self.name}-node-{i}" for i in range(self.node_count)]

    def __post_init__(self) -> None:
        from azext_elastictrain.core.layout import validate_job_name

        try:
            validate_job_name(self.name)
        except ValueError as ex:
            raise SpecError(str(ex)) from ex
        for flag, value in (("--min-nodes", self.min_nodes), ("--max-nodes", self.max_nodes),
                            ("--nproc-per-node", self.nproc_per_node)):
            _at_least_one(flag, value)
        if self.min_nodes > self.max_nodes:
            raise SpecError(f"--min-nodes {self.min_nodes} is more than --max-nodes {self.max_nodes}: "
                            "the job may shrink to min and grow to max, so min <= max")
        if self.nodes is not None:
            _at_least_one("--nodes", self.nodes)
            if not self.min_nodes <= self.nodes <= self.max_nodes:
                raise SpecError(f"--nodes {self.nodes} is outside --min-nodes {self.min_nodes} .. "
                                f"--max-nodes {self.max_nodes}: start between the two (default: max)")
        if self.checkpoint_interval is not None:
            _at_least_one("--checkpoint-interval", self.checkpoint_interval)
        if self.checkpoint_interval_seconds is not None and not 0 < self.checkpoint_interval_seconds < float("inf"):
            raise SpecError(f"--checkpoint-interval-seconds {self.checkpoint_interval_seconds:g} is not a number of "
                            "seconds above 0: e.g. --checkpoint-interval-seconds 600 saves to blob every 10 minutes")
        _at_least_one("--keep", self.keep)
        validate_memory_tier(self.memory_tier)
        if not self.script:
            raise SpecError("no training script: pass --script PATH")
        _check_env(self.env)
        if self.recovery not in RECOVERY_MODES:
            raise SpecError(f"unknown recovery mode {self.recovery!r}: use {' or '.join(RECOVERY_MODES)} "
                            f"({RECOVERY_IN_PROCESS}: workers outlive a membership change; {RECOVERY_RESTART}: "
                            "torchrun restarts every worker)")


def job_env(job: JobSpec, profile: LaunchProfile, *, coordinator: str | None = None) -> dict[str, str]:
    """The environment a job gives every node, the same on both backends (a local node's agent and an AKS worker
    pod): its settings, where its coordinator is (in process), and its ``--env``. The one place that writes a
    job-wide setting."""
    return {**job.runtime_settings(profile).to_env(),
            **({ENV_COORDINATOR: coordinator} if job.mode.coordinator and coordinator else {}),
            **TCP_STORE_WORKAROUND, "PYTHONUNBUFFERED": "1",
            **job.env_vars}


def check_local_script(script: str) -> None:
    """A local job's script is a file of this machine (the one look at the file system in this module)."""
    import os

    if not os.path.isfile(script):
        raise SpecError(f"training script {script!r} is not a file: pass the path of a Python script "
                        "that runs under torchrun (e.g. scripts/train_cifar10.py)")


def check_script_in_image(script: str) -> None:
    """A job's script on AKS is a path inside its image: only its form can be checked here."""
    if script.startswith("-") or any(c.isspace() for c in script):
        raise SpecError(f"training script {script!r} is not a path: pass the script's path inside "
                        "the image (e.g. /app/train_cifar10.py); its arguments go in --script-args")


def _check_env(env: tuple[str, ...]) -> None:
    """--env: KEY=VALUE items with names a shell and Kubernetes take, each once, none of the job's own (the
    runtime's settings without an option may be given: launch.ENV_SCRIPT_SETTINGS)."""
    seen: set[str] = set()
    for item in env:
        key, sep, _ = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise SpecError(f"--env {item!r} is not KEY=VALUE with a name of letters, digits and '_' (not starting "
                            "with a digit): e.g. --env NCCL_DEBUG=INFO")
        if key.startswith(ENV_PREFIX) and key not in ENV_SCRIPT_SETTINGS:
            raise SpecError(f"--env {key}: names starting with {ENV_PREFIX} are the job's own settings, set "
                            "from its options (e.g. --checkpoint-interval, --keep): use those (--env may give "
                            f"only {' and '.join(ENV_SCRIPT_SETTINGS)}, which no option sets)")
        if key in seen:
            raise SpecError(f"--env {key} is given twice: give each variable once")
        seen.add(key)
    try:  # what the runtime would refuse at its start, refused before anything starts
        RuntimeSettings.from_env({key: value for key, _, value in (item.partition("=") for item in env)
                                  if key in ENV_SCRIPT_SETTINGS})
    except ValueError as ex:
        raise SpecError(f"--env {ex}") from None


def validate_memory_tier(value: str) -> None:
    if value == MEMORY_TIER_OFF:
        return
    match = _QUANTITY.fullmatch(value or "")
    if not match or float(match[1]) <= 0:
        raise SpecError(f"--memory-tier {value!r} is neither 'off' nor a size: give the node memory the memory "
                        "tier may use as a Kubernetes quantity, twice the model and optimizer state or more "
                        "(e.g. 8Gi, 512Mi), or 'off'")


def _at_least_one(flag: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{flag} must be a whole number of at least 1, not {value!r}")


# --------------------------------------------------------------------------- clusters on Azure (AKS)

#: Which GPU sizes exist, take Spot and are open to the subscription differs by region and changes as Azure adds
#: and retires sizes: core.aks.preflight asks the region's Resource SKUs before create; the spec checks the form only.
DEFAULT_GPU_VM_SIZE = "Standard_NC4as_T4_v3"
DEFAULT_SYSTEM_VM_SIZE = "Standard_D4ds_v5"  # a local temp disk (150 GiB): room for an ephemeral OS disk
EVICTION_POLICIES = ("Delete", "Deallocate")
#: Said whenever a pool is asked for with eviction policy Deallocate (AKS's own docs: stopped-deallocated nodes
#: "count against your compute quota and can cause issues with cluster scaling or upgrading"; cloud-provider-azure:
#: a stopped VM's node stays, tainted shutdown, then out-of-service up to 10 minutes later).
DEALLOCATE_WARNING = (
    "--eviction-policy Deallocate: an evicted Spot node is stopped, not deleted. Its node stays in the cluster "
    "(NotReady, tainted shutdown, and out of service up to 10 minutes later, when its workers are replaced) and "
    "its cores keep counting against the region's Spot quota (lowPriorityCores), so the autoscaler may find no "
    "quota for a replacement until the stopped instances are deleted ('az vmss delete-instances'). Checkpoints "
    "live in blob storage: the kept disk saves nothing here. Leave the option out (Delete) unless you need it.")
STORAGE_SKUS = ("Standard_LRS", "Standard_ZRS", "Standard_GRS", "Standard_RAGRS", "Standard_GZRS", "Standard_RAGZRS",
                "Premium_LRS")
#: AKS's cluster auto-upgrade channels (ManagedClusterAutoUpgradeProfile.upgradeChannel) we offer: 'node-image' is
#: left out, the node image has its own channel (nodeOSUpgradeChannel, always NodeImage here).
UPGRADE_CHANNELS = ("patch", "stable", "rapid", "none")
DEFAULT_UPGRADE_CHANNEL = "patch"
NODE_OS_UPGRADE_CHANNEL = "NodeImage"
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
#: AKS refuses a maintenance window shorter than 4 hours (MaintenanceWindow.durationHours: 4-24).
MAINTENANCE_HOURS = (4, 24)
SYSTEM_POOL = "system"
GPU_POOL = "gpu"
#: A pool autoscales up to this many nodes at most (AKS: 1000 per pool).
MAX_POOL_NODES = 1000

# How jobs run on an AKS cluster: the ElasticJob operator, or a batch/v1 Indexed Job with no operator.
ENGINE_TORCHELASTIC = "torchelastic"
ENGINE_K8S_JOB = "k8s-job"
ENGINES = (ENGINE_TORCHELASTIC, ENGINE_K8S_JOB)
K8S_JOB_MIN_KUBERNETES = (1, 31)

_GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_AKS_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")
_RESOURCE_GROUP = re.compile(r"[-\w._()]{0,89}[-\w_()]", re.UNICODE)
_STORAGE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_VM_SIZE = re.compile(r"Standard_[A-Za-z0-9_]+")
#: Azure's GPU sizes are the N family (NC, ND, NG, NV): Standard_N<letter>...
_GPU_FAMILY = re.compile(r"Standard_N[A-Z]", re.IGNORECASE)


def unknown_location(spec: "ClusterSpec") -> str:
    """What a dry run shows for a location only the resource group's creation tells (no -l given)."""
    return f"<location of resource group {spec.resource_group}>"


def is_gpu_size_name(vm_size: str | None) -> bool:
    """Whether a size's name is of Azure's GPU family (for pools read back from ARM; no region lookup)."""
    return bool(vm_size and _GPU_FAMILY.match(vm_size))


_K8S_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")
_SUBNET_ID = re.compile(r"/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w._()]+/providers/Microsoft\.Network/"
                        r"virtualNetworks/[-\w.]+/subnets/[-\w.]+", re.IGNORECASE)
_WINDOW = re.compile(r"(?P<day>[A-Za-z]+)\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})\s+(?P<hours>\d{1,2})h?")
_LOCATION = re.compile(r"[a-z0-9]{2,40}")


def default_storage_account(resource_group: str, cluster: str, subscription: str = "") -> str:
    """A storage account name for the cluster: stable across re-runs, and different for everyone else.

    'et' + up to 14 letters/digits of the cluster name + 8 hex digits of a hash of the subscription, the resource
    group and the name. Storage account names are one namespace for the whole of Azure: without the subscription,
    everyone who copies the README's ``-g ... -n ...`` would get the same name, and the second anywhere in the
    world would fail with StorageAccountAlreadyTaken. (Without a subscription - clusters made before it was salted
    record their account's name in a tag - the hash is of the group and name only.)
    """
    import hashlib

    stem = re.sub(r"[^a-z0-9]", "", cluster.lower())[:14]
    salt = f"{subscription.lower()}/" if subscription else ""
    digest = hashlib.sha256(f"{salt}{resource_group.lower()}/{cluster.lower()}".encode()).hexdigest()[:8]
    return f"et{stem}{digest}"


#: Node label namespaces AKS refuses in a pool's labels (https://learn.microsoft.com/azure/aks/use-labels, "Reserved
#: system labels"), with its answers as users met them: ``kubernetes.azure.com`` ("The 'kubernetes.azure.com' prefix
#: is preserved by aks system labels", ams0/aks-nvme-ssd-provisioner#5) and, since Kubernetes 1.16, ``kubernetes.io``
#: and ``k8s.io`` except the prefixes and keys the kubelet may set (Azure/AKS#1937, aka.ms/aks-node-labels-116).
AKS_LABEL_DOMAIN = "kubernetes.azure.com"
KUBERNETES_LABEL_DOMAINS = ("kubernetes.io", "k8s.io")
KUBELET_LABEL_PREFIXES = ("kubelet.kubernetes.io", "node.kubernetes.io")
KUBELET_LABEL_KEYS = frozenset({
    "beta.kubernetes.io/arch", "beta.kubernetes.io/os", "beta.kubernetes.io/instance-type", "kubernetes.io/os",
    "kubernetes.io/arch", "kubernetes.io/hostname", "kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region",
    "failure-domain.kubernetes.io/zone", "failure-domain.kubernetes.io/region"})


def _in_domain(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith("." + parent)


def reserved_label(key: str) -> bool:
    """Whether AKS refuses a node label key of a user: under ``kubernetes.azure.com/``, or under ``kubernetes.io/``
    or ``k8s.io/`` outside what the kubelet may set."""
    domain, sep, _ = key.lower().partition("/")
    if not sep:
        return False
    if _in_domain(domain, AKS_LABEL_DOMAIN):
        return True
    if not any(_in_domain(domain, d) for d in KUBERNETES_LABEL_DOMAINS):
        return False
    return not (any(_in_domain(domain, p) for p in KUBELET_LABEL_PREFIXES) or key.lower() in KUBELET_LABEL_KEYS)


def spot_price(value: "str | float | int") -> float:
    """The Spot max price as AKS takes it: -1 (pay up to the on-demand price) or > 0 with <= 5 decimals."""
    from decimal import Decimal, InvalidOperation

    try:
        price = Decimal(str(value).strip())
    except InvalidOperation:
        price = None
    if price is None or not price.is_finite():
        raise SpecError(f"--max-price {value!r} is not a number: use -1 (up to the on-demand price) "
                        "or a price in US dollars per hour such as 0.25")
    if price == -1:
        return -1.0
    if price <= 0:
        raise SpecError(f"--max-price {value} must be -1 (up to the on-demand price) or more than 0")
    exponent = price.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > 5:
        raise SpecError(f"--max-price {value} has more than 5 decimals: Azure takes prices like 0.12345")
    return float(price)


@dataclass(frozen=True)
class ClusterSpec:  # pylint: disable=too-many-instance-attributes  # one field per user option
    """An AKS cluster for elastic training: CPU system pool, GPU Spot pool, storage, identity.

    ``location`` may be empty: the resource group's location is used (``with_location``).
    """

    name: str
    resource_group: str
    location: str = ""
    storage_account: str = ""
    container: str = CHECKPOINT_CONTAINER
    storage_sku: str = "Standard_LRS"
    identity: str = ""
    kubernetes_version: str = ""
    system_vm_size: str = DEFAULT_SYSTEM_VM_SIZE
    gpu_vm_size: str = DEFAULT_GPU_VM_SIZE
    min_count: int = 0
    max_count: int = 3
    max_price: "str | float" = -1
    eviction_policy: str = "Delete"
    node_labels: tuple[tuple[str, str], ...] = ()
    namespace: str = TRAINING_NAMESPACE
    service_account: str = TRAINING_SERVICE_ACCOUNT
    # The engine `job run` uses by default; k8s-job installs no operator (its jobs need nothing in the cluster).
    engine: str = ENGINE_TORCHELASTIC
    upgrade_channel: str = DEFAULT_UPGRADE_CHANNEL
    maintenance_window: str = ""  # "DAY HH:MM HOURS" in UTC; empty: AKS upgrades node images at any time
    storage_allow: tuple[str, ...] = ()  # subnet ids and IPv4 addresses/ranges; empty: the network stays open
    vnet_subnet: str = ""  # the subnet both pools' nodes use; empty: AKS makes a virtual network of its own
    api_server_authorized_ips: tuple[str, ...] = ()  # IPv4 addresses/ranges; empty: any address (Entra ID still)
    encryption_at_host: bool | None = None  # None: where the size and the subscription support it
    # Entra ID only (local accounts off, Azure RBAC) unless True: then Kubernetes RBAC with local accounts and
    # a client-certificate kubeconfig, as AKS makes without Entra ID integration.
    local_accounts: bool = False
    # Object id that gets 'Azure Kubernetes Service RBAC Cluster Admin' on the cluster (default: the signed-in one)
    admin_principal: str = ""
    # The subscription the cluster is in: salts the default storage account name (set by the backend, not an option)
    subscription: str = ""

    @property
    def storage_account_name(self) -> str:
        return self.storage_account or default_storage_account(self.resource_group, self.name, self.subscription)

    @property
    def identity_name(self) -> str:
        return self.identity or f"{self.name}-training"

    @property
    def dns_prefix(self) -> str:
        prefix = re.sub(r"[^A-Za-z0-9-]", "", self.name)[:54].strip("-")
        return prefix or "elastictrain"

    @property
    def spot_max_price(self) -> float:
        return spot_price(self.max_price)

    def checkpoint_url(self, blob_endpoint: str) -> str:
        """The checkpoint container under the storage account's blob endpoint (core.aks.arm_bodies.blob_endpoint)."""
        return f"{blob_endpoint.rstrip('/')}/{self.container}"

    @property
    def storage_allowed_subnets(self) -> list[str]:
        """The subnets that may reach the account: the nodes' own first (the training pods must)."""
        asked = [v for v in self.storage_allow if v.startswith("/")]
        nodes = [self.vnet_subnet] if self.vnet_subnet else []
        return nodes + [v for v in asked if v.lower() != self.vnet_subnet.lower()]

    @property
    def storage_allowed_ips(self) -> list[str]:
        """IPv4 addresses and ranges as Azure Storage takes them: it refuses /31 and /32 ranges, so their addresses."""
        import ipaddress

        ips = []
        for value in self.storage_allow:
            if not value.startswith("/"):
                network = ipaddress.ip_network(value, strict=False)
                ips += [str(a) for a in network] if network.prefixlen >= 31 else [str(network)]
        return ips

    def maintenance(self) -> "MaintenanceWindow | None":
        return parse_maintenance_window(self.maintenance_window) if self.maintenance_window else None

    def gpu_labels(self) -> dict[str, str]:
        labels = {"elastictrain.azure.com/pool": GPU_POOL, "accelerator": "nvidia"}
        labels.update(dict(self.node_labels))
        return labels

    def __post_init__(self) -> None:
        if not _AKS_NAME.fullmatch(self.name or ""):
            raise SpecError(f"invalid cluster name {self.name!r}: use 1-63 letters, digits, '-' and '_', "
                            "starting and ending with a letter or digit (AKS naming rules)")
        if not _RESOURCE_GROUP.fullmatch(self.resource_group or ""):
            raise SpecError(f"invalid resource group name {self.resource_group!r}: use 1-90 letters, digits, "
                            "'-', '_', '.', '(' and ')', not ending with '.'")
        if self.location and not _LOCATION.fullmatch(self.location) and self.location != unknown_location(self):
            raise SpecError(f"invalid location {self.location!r}: use a region name such as 'eastus' "
                            "('az account list-locations -o table')")
        if not _STORAGE_ACCOUNT.fullmatch(self.storage_account_name):
            raise SpecError(f"invalid storage account name {self.storage_account_name!r}: use 3-24 lowercase "
                            "letters and digits (storage naming rules)")
        if not re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", self.container or ""):
            raise SpecError(f"invalid container name {self.container!r}: use 3-63 lowercase letters, digits "
                            "and single '-', starting and ending with a letter or digit")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{2,127}", self.identity_name):
            raise SpecError(f"invalid identity name {self.identity_name!r}: use 3-128 letters, digits, '-' "
                            "and '_', starting with a letter or digit")
        if self.storage_sku not in STORAGE_SKUS:
            raise SpecError(f"unknown storage SKU {self.storage_sku!r}: use one of {', '.join(STORAGE_SKUS)}")
        if self.kubernetes_version and not _K8S_VERSION.fullmatch(self.kubernetes_version):
            raise SpecError(f"invalid Kubernetes version {self.kubernetes_version!r}: use e.g. 1.33 or 1.33.2 "
                            "('az aks get-versions -l LOCATION -o table')")
        if not _VM_SIZE.fullmatch(self.system_vm_size or ""):
            raise SpecError(f"invalid system pool VM size {self.system_vm_size!r}: use a size such as "
                            f"{DEFAULT_SYSTEM_VM_SIZE}")
        if not _VM_SIZE.fullmatch(self.gpu_vm_size or ""):
            raise SpecError(f"invalid GPU VM size {self.gpu_vm_size!r}: use a size name such as "
                            f"{DEFAULT_GPU_VM_SIZE} or Standard_ND96isr_H200_v5 ('az vm list-skus -l LOCATION "
                            "--resource-type virtualMachines -o table' lists a region's)")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise SpecError(f"unknown eviction policy {self.eviction_policy!r}: use Delete or Deallocate")
        for flag, count, least in (("--min-count", self.min_count, 0), ("--max-count", self.max_count, 1)):
            if not isinstance(count, int) or isinstance(count, bool) or not least <= count <= MAX_POOL_NODES:
                raise SpecError(f"{flag} must be a whole number from {least} to {MAX_POOL_NODES}, not {count!r}")
        if self.min_count > self.max_count:
            raise SpecError(f"--min-count {self.min_count} is more than --max-count {self.max_count}: the GPU "
                            "pool autoscales between the two, so min <= max")
        _ = self.spot_max_price  # validates: raises SpecError
        if self.upgrade_channel not in UPGRADE_CHANNELS:
            raise SpecError(f"unknown upgrade channel {self.upgrade_channel!r}: "
                            f"use one of {', '.join(UPGRADE_CHANNELS)}")
        self.maintenance()  # raises SpecError
        self._validate_network()
        for key, value in self.node_labels:
            if not re.fullmatch(r"([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", key) or \
                    not re.fullmatch(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?", value):
                raise SpecError(f"invalid node label {key}={value}: keys and values are Kubernetes label "
                                "names (letters, digits, '-', '_', '.'; up to 63 characters)")
            if reserved_label(key):
                raise SpecError(f"node label {key}={value}: the prefix {key.split('/')[0]}/ is reserved for AKS and "
                                "Kubernetes (AKS refuses the pool with a 400; of kubernetes.io only "
                                "node.kubernetes.io/ and kubelet.kubernetes.io/ are open): use a prefix of your own, "
                                "e.g. "
                                f"example.com/{key.split('/', 1)[1]}")
        if self.engine not in ENGINES:
            raise SpecError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if self.engine == ENGINE_K8S_JOB and self.kubernetes_version:
            check_engine_supported(self.engine, self.kubernetes_version)
        self._validate_access()

    def _validate_access(self) -> None:
        """--admin-principal; raises SpecError. With --local-accounts it names who gets the data role on the
        checkpoint container (there is no Kubernetes role to give through Entra ID)."""
        if self.admin_principal and not _GUID.fullmatch(self.admin_principal):
            raise SpecError(f"invalid --admin-principal {self.admin_principal!r}: give the Entra ID object id (a "
                            "GUID) of a user, group or service principal ('az ad signed-in-user show --query id')")

    def _validate_network(self) -> None:
        """--storage-allow, --vnet-subnet-id, --api-server-authorized-ips; raises SpecError."""
        for value in self.storage_allow:
            if not value.startswith("/"):
                _public_ipv4(value, "--storage-allow", "an IPv4 address or range (Azure Storage IP rules take "
                             "public IPv4 only) or the resource id of a subnet")
            elif not _SUBNET_ID.fullmatch(value):
                raise SpecError(f"--storage-allow {value!r} is not a subnet resource id: use /subscriptions/SUB/"
                                "resourceGroups/RG/providers/Microsoft.Network/virtualNetworks/VNET/subnets/SUBNET")
        if self.vnet_subnet and not _SUBNET_ID.fullmatch(self.vnet_subnet):
            raise SpecError(f"--vnet-subnet-id {self.vnet_subnet!r} is not a subnet resource id: use /subscriptions/"
                            "SUB/resourceGroups/RG/providers/Microsoft.Network/virtualNetworks/VNET/subnets/SUBNET")
        if self.storage_allow and not self.vnet_subnet:
            raise SpecError("--storage-allow closes the checkpoint storage account to all but what it lists, and the "
                            "cluster's nodes reach it from inside the region, where IP rules do not apply: without "
                            "--vnet-subnet-id (the nodes on a subnet of yours, with the Microsoft.Storage service "
                            "endpoint) the training pods could not read or write checkpoints. Pass --vnet-subnet-id, "
                            "or leave --storage-allow out to keep the account reachable (Entra ID only either way)")
        for value in self.api_server_authorized_ips:
            _public_ipv4(value, "--api-server-authorized-ips", "an IPv4 address or range in CIDR form")


def check_engine_supported(engine: str, kubernetes_version: str) -> None:
    """Refuses ``k8s-job`` on a cluster whose Job API lacks the fields it relies on."""
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    if engine != ENGINE_K8S_JOB:
        return
    match = re.match(r"v?(\d+)\.(\d+)", kubernetes_version or "")
    if not match or (int(match[1]), int(match[2])) < K8S_JOB_MIN_KUBERNETES:
        minimum = ".".join(map(str, K8S_JOB_MIN_KUBERNETES))
        raise SpecError(f"engine k8s-job needs Kubernetes {minimum} or later, and the cluster runs "
                        f"{kubernetes_version or 'an unknown version'}: podFailurePolicy with the DisruptionTarget "
                        f"condition is stable only from 1.31 (successPolicy and podReplacementPolicy are on by "
                        f"default from then). Upgrade the cluster (az aks upgrade) or use --engine torchelastic")


@dataclass(frozen=True)
class MaintenanceWindow:
    """A weekly window, in UTC, in which AKS may upgrade the node image (drains and replaces nodes)."""

    day: str
    start: str  # HH:MM
    hours: int


def parse_maintenance_window(text: str) -> MaintenanceWindow:
    """'Sunday 02:00 4' (or '4h'): day of the week, start time in UTC, duration in hours (4-24)."""
    found = _WINDOW.fullmatch((text or "").strip())
    day = next((d for d in WEEKDAYS if found and d.lower() == found["day"].lower()), None)
    if not found or day is None or int(found["hour"]) > 23 or int(found["minute"]) > 59:
        raise SpecError(f"--maintenance-window {text!r} is not 'DAY HH:MM HOURS': use e.g. 'Sunday 02:00 4' "
                        "(day of the week, start in UTC, duration in hours)")
    hours = int(found["hours"])
    low, high = MAINTENANCE_HOURS
    if not low <= hours <= high:
        raise SpecError(f"--maintenance-window lasts {hours} hours: AKS takes {low} to {high}")
    return MaintenanceWindow(day, f"{int(found['hour']):02d}:{found['minute']}", hours)


def _public_ipv4(value: str, flag: str, what: str) -> None:
    """An IPv4 address or range outside the ranges Azure refuses in IP rules (RFC 1918 private networks) and those
    no request from the internet comes from (loopback, link-local, 0.0.0.0/8, multicast)."""
    import ipaddress

    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        network = None
    if network is None or network.version != 4:
        raise SpecError(f"{flag} {value!r} is not {what}, e.g. 203.0.113.7 or 203.0.113.0/24")
    if any(network.overlaps(ipaddress.ip_network(r)) for r in _NOT_PUBLIC):
        raise SpecError(f"{flag} {value!r} is a private or local range: Azure matches the public address a "
                        "request comes from (for a home or office network: the address it has on the internet)")


#: RFC 1918 (refused by Azure Storage IP rules), loopback, link-local, "this network" and multicast.
_NOT_PUBLIC = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8",
               "224.0.0.0/4")
