"""Arguments: names in the user's words, every one with help."""
from __future__ import annotations

from typing import TYPE_CHECKING

from azure.cli.core.commands.parameters import get_enum_type, get_three_state_flag

if TYPE_CHECKING:
    from azext_elastictrain import ElasticTrainCommandsLoader


# pylint: disable-next=too-many-statements  # one statement per argument, as az does
def load_arguments(self: ElasticTrainCommandsLoader, _: str) -> None:
    from azext_elastictrain.core.eventlog.events import STATES as JOB_STATES  # pure, stdlib only: cheap
    from azext_elastictrain.core.launch import RECOVERY_MODES
    from azext_elastictrain.core.spec import ENGINES, STORAGE_SKUS, UPGRADE_CHANNELS

    with self.argument_context("elastictrain checkpoint") as c:
        c.argument(
            "url", options_list=["--url"],
            help="Blob URL of the job's checkpoint prefix: "
                 "`https://<account>.blob.core.windows.net/<container>/<job>`. "
                 "Pass either --url or --local --job.",
        )
        c.argument(
            "connection_string", options_list=["--connection-string"],
            help="Storage connection string (local Azurite or development), with --url. Defaults to "
                 "AZURE_STORAGE_CONNECTION_STRING; without either, your az login is used (Entra ID).",
        )
        c.argument("local", arg_type=get_three_state_flag(), options_list=["--local"],
                   help="The checkpoints of a job on a local cluster (with --job): the URL and credentials "
                        "come from the cluster. Instead of --url.")
        c.argument("cluster", options_list=["--cluster", "-c"],
                   help="With --local: the local cluster the job ran on (default: local). With -g: the AKS "
                        "cluster.")
        c.argument("job", options_list=["--job"],
                   help="With --local or -g/-c: the job whose checkpoints to use.")
        c.argument("step", type=int, options_list=["--step"], help="Training step of the checkpoint.")

    with self.argument_context("elastictrain checkpoint download") as c:
        c.argument("dest", options_list=["--dest"],
                   help="Folder to download into; the checkpoint lands in `<dest>/<step, 12 digits>/` "
                        "(an existing one is never overwritten).")
        c.argument("step", type=int, options_list=["--step"],
                   help="Training step of the checkpoint (default: the newest complete one).")

    with self.argument_context("elastictrain checkpoint prune") as c:
        c.argument("keep_last", type=int, options_list=["--keep-last"],
                   help="Keep the newest N complete checkpoints; delete older complete ones.")
        c.argument("older_than", options_list=["--older-than"],
                   help="Delete complete checkpoints older than this: 90s, 30m, 12h, 7d, 2w.")
        c.argument("incomplete", arg_type=get_three_state_flag(), options_list=["--incomplete"],
                   help="Also delete incomplete or damaged checkpoints older than the newest complete one "
                        "and untouched for 10 minutes (abandoned saves).")
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show what would be deleted and delete nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")

    with self.argument_context("elastictrain cluster") as c:
        c.argument("local", arg_type=get_three_state_flag(), options_list=["--local"],
                   help="A cluster on this machine: real etcd, Azurite and a Scheduled Events endpoint.")
        c.argument("name", options_list=["--name", "-n"],
                   help="Name of the cluster. Local: 1-32 lowercase letters, digits and '-' (default: local). "
                        "On Azure (with -g): the AKS cluster's name, 1-63 letters, digits, '-' and '_'.")
        # not resource_group_name_type: a configured default group must not turn --local commands into Azure ones
        c.argument("resource_group_name", options_list=["--resource-group", "-g"],
                   help="Resource group of a cluster on Azure (AKS). Without it, --local is needed.")
    with self.argument_context("elastictrain cluster create") as c:
        c.argument("location", options_list=["--location", "-l"],
                   help="Azure region, e.g. eastus. Default: the resource group's location "
                        "(needed when the group does not exist yet).")
        c.argument("storage_account", options_list=["--storage-account"],
                   help="Name of the checkpoint storage account: 3-24 lowercase letters and digits, unique in "
                        "Azure. Default: 'et' + the cluster name + a stable hash.")
        c.argument("storage_sku", arg_type=get_enum_type(STORAGE_SKUS), options_list=["--storage-sku"],
                   help="Redundancy of the checkpoint storage account (default: Standard_LRS). Standard_ZRS "
                        "keeps checkpoints through the loss of a zone of the region; the GZRS/GRS ones copy them "
                        "to a second region too (asynchronously, at about twice the price).")
        c.argument("kubernetes_version", options_list=["--kubernetes-version", "-k"],
                   help="Kubernetes version, e.g. 1.33 (default: the AKS default for the region).")
        c.argument("node_vm_size", options_list=["--node-vm-size"],
                   help="VM size of the CPU system pool (regular priority, autoscaled 1-3), which runs etcd "
                        "and the operator. Default: Standard_D4ds_v5 (its temp disk holds an ephemeral OS disk).")
        c.argument("gpu_vm_size", options_list=["--gpu-vm-size"],
                   help="VM size of the GPU Spot pool: a GPU size the region offers with Spot, checked "
                        "against the region's Resource SKUs before anything is created "
                        "(default: Standard_NC4as_T4_v3; e.g. Standard_ND96isr_H200_v5).")
        c.argument("min_count", type=int, options_list=["--min-count"],
                   help="Fewest GPU Spot nodes the autoscaler keeps (default 0: no cost while idle).")
        c.argument("max_count", type=int, options_list=["--max-count"],
                   help="Most GPU Spot nodes the autoscaler adds (default 3).")
        c.argument("max_price", options_list=["--max-price"],
                   help="Most you pay per GPU node and hour, in US dollars, with at most 5 decimals; "
                        "-1 (default): up to the on-demand price, evicted for capacity only.")
        c.argument("eviction_policy", arg_type=get_enum_type(["Delete", "Deallocate"]),
                   options_list=["--eviction-policy"],
                   help="What happens to an evicted Spot node: Delete (default; the node leaves the cluster, no "
                        "cost) or Deallocate (not recommended: the stopped node stays in the cluster, its cores "
                        "keep counting against the Spot quota and replacements may wait for quota).")
        c.argument("labels", nargs="+", options_list=["--labels"],
                   help="Extra Kubernetes labels for the GPU nodes, space-separated KEY=VALUE pairs.")
        c.argument("upgrade_channel", arg_type=get_enum_type(UPGRADE_CHANNELS), options_list=["--upgrade-channel"],
                   help="How AKS upgrades Kubernetes by itself: patch (default: the newest patch of the minor "
                        "version), stable, rapid, or none. Node images are upgraded weekly either way "
                        "(node OS channel NodeImage). An upgrade drains nodes; elastic jobs restart from their "
                        "last checkpoint, as after an eviction.")
        c.argument("maintenance_window", options_list=["--maintenance-window"],
                   help="A weekly window for AKS's upgrades (node images, and Kubernetes unless --upgrade-channel "
                        "none), in UTC: 'DAY HH:MM HOURS', e.g. 'Sunday 02:00 4' (4-24 hours). Default: AKS picks "
                        "the time.")
        c.argument("storage_allow", nargs="+", options_list=["--storage-allow"],
                   help="Close the checkpoint storage account's network to all but these: subnet resource ids and "
                        "public IPv4 addresses or ranges (e.g. your own). Needs --vnet-subnet-id, whose subnet is "
                        "allowed first (the nodes reach storage from inside the region, where IP rules do not "
                        "apply). Default: reachable from any network, Entra ID still required.")
        c.argument("vnet_subnet", options_list=["--vnet-subnet-id"],
                   help="Resource id of an existing subnet for both pools' nodes (with the Microsoft.Storage "
                        "service endpoint where --storage-allow is used). Default: AKS makes its own virtual "
                        "network.")
        c.argument("api_server_authorized_ips", nargs="+",
                   options_list=["--api-server-authorized-ips", "--api-server-ips"],
                   help="Public IPv4 addresses or ranges allowed to reach the Kubernetes API server, e.g. your "
                        "own. Default: any address (the API server still wants an Entra ID token).")
        c.argument("encryption_at_host", arg_type=get_three_state_flag(), options_list=["--encryption-at-host"],
                   help="Encrypt the nodes' temp disks, caches and disk traffic on the host. Default: on where the "
                        "VM size supports it and the subscription registered Microsoft.Compute/EncryptionAtHost; "
                        "true: required (an error otherwise); false: off.")
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Print the whole plan - every ARM request body and Kubernetes object - and call nothing.")
        c.argument("engine", arg_type=get_enum_type(ENGINES), options_list=["--engine"],
                   help="What runs the cluster's jobs by default ('job run --engine' overrides it). torchelastic "
                        "(default): installs the TorchElastic operator. k8s-job: batch/v1 Indexed Jobs, no "
                        "operator installed (Kubernetes 1.31+).")
        c.argument("merge_kubeconfig", arg_type=get_three_state_flag(), options_list=["--merge-kubeconfig"],
                   help="Also merge the cluster's user credentials into your kubeconfig (first file of "
                        "$KUBECONFIG, else ~/.kube/config) and make it the current context. Default: the "
                        "credentials stay in memory.")
        c.argument("local_accounts", arg_type=get_three_state_flag(), options_list=["--local-accounts"],
                   help="Keep AKS local accounts and leave Entra ID out: the credentials become client "
                        "certificates (unaudited, not revocable one by one). Default: Entra ID only - Azure RBAC "
                        "decides, local accounts are off, and the CLI uses your login's token.")
        c.argument("admin_principal", options_list=["--admin-principal"],
                   help="Object id of the user, group or service principal that gets 'Azure Kubernetes Service "
                        "RBAC Cluster Admin' on the cluster (not with --local-accounts) and 'Storage Blob Data "
                        "Contributor' on the checkpoint container. Default: the signed-in identity.")
    with self.argument_context("elastictrain cluster list") as c:
        c.argument("resource_group_name", options_list=["--resource-group", "-g"],
                   help="Only the AKS clusters of this resource group (default: the whole subscription).")
    with self.argument_context("elastictrain cluster delete") as c:
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show what would be stopped and removed; change nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")
        c.argument("delete_storage", arg_type=get_three_state_flag(), options_list=["--delete-storage"],
                   help="Also delete the storage account WITH EVERY CHECKPOINT in it. Default: it is kept.")
        c.argument("storage_account", options_list=["--storage-account"],
                   help="The cluster's storage account, where create was given --storage-account and the AKS "
                        "cluster (which records it) is already gone.")
    with self.argument_context("elastictrain cluster wait") as c:
        c.argument("resource_group_name", options_list=["--resource-group", "-g"],
                   help="Resource group of the AKS cluster.")
        c.argument("name", options_list=["--name", "-n"], help="Name of the AKS cluster.")

    with self.argument_context("elastictrain job") as c:
        c.argument("local", arg_type=get_three_state_flag(), options_list=["--local"],
                   help="A job on a local cluster: its nodes are torchrun agents on this machine.")
        c.argument("cluster", options_list=["--cluster", "-c"],
                   help="With --local: the local cluster the job runs on (default: local; create it with "
                        "'az elastictrain cluster create --local'). With -g: the AKS cluster.")
        c.argument("name", options_list=["--name", "-n"],
                   help="Name of the job: 1-63 lowercase letters, digits and '-' (a DNS label). "
                        "It names the job's checkpoint folder and its rendezvous.")
    with self.argument_context("elastictrain job run") as c:
        c.argument("script", options_list=["--script"],
                   help="Path of the training script each node runs under torchrun "
                        "(e.g. scripts/train_cifar10.py). On AKS: its path inside --image (e.g. /app/train.py).")
        c.argument("script_args", options_list=["--script-args"],
                   help='Arguments for the script, as one quoted string: --script-args "--steps 300 --lr 0.05". '
                        'A single option needs "=": --script-args="--steps".')
        c.argument("min_nodes", type=int, options_list=["--min-nodes"],
                   help="Fewest nodes the job trains with: below this it waits for nodes to come back.")
        c.argument("max_nodes", type=int, options_list=["--max-nodes"],
                   help="Most nodes the job trains with: nodes that come back rejoin up to this.")
        c.argument("nodes", type=int, options_list=["--nodes"],
                   help="Nodes to start, between --min-nodes and --max-nodes (default: --max-nodes).")
        c.argument("nproc_per_node", type=int, options_list=["--nproc-per-node"],
                   help="Training processes (ranks) per node, e.g. one per GPU.")
        c.argument("checkpoint_interval", type=int, options_list=["--checkpoint-interval"],
                   help="Checkpoint every this many steps (ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS). "
                        "Default: as the script says.")
        c.argument("checkpoint_interval_seconds", type=float,
                   options_list=["--checkpoint-interval-seconds", "--checkpoint-seconds"],
                   help="Also checkpoint to blob once this many seconds have passed since the last checkpoint "
                        "(ELASTICTRAIN_CHECKPOINT_INTERVAL_SECONDS), so that a job whose steps vary in length "
                        "loses at most this much work to a node that vanishes without notice and takes the "
                        "node's memory with it. Default: as the script says.")
        c.argument("keep", type=int, options_list=["--keep"],
                   help="Complete checkpoints to keep (default 3); older ones go once a newer one is committed.")
        c.argument("memory_tier", options_list=["--memory-tier"],
                   help="Node memory for the memory tier (each node keeps the last completed step, "
                        "twice: give twice the model + optimizer state or more), as a Kubernetes quantity, "
                        "e.g. 8Gi; or 'off'. On AKS the sizeLimit of a memory-backed emptyDir, which counts "
                        "against the pod's memory. Locally the tier uses /dev/shm; only 'off' matters there.")
        c.argument("warm_start", arg_type=get_three_state_flag(), options_list=["--warm-start"],
                   help="Start each worker by forking a per-node process that has imported torch and the "
                        "runtime once (seconds less without training at every re-form). false: every worker "
                        "starts a new Python, as plain torchrun does.")
        c.argument("env", nargs="+", options_list=["--env"],
                   help="Environment variables of the training script, as KEY=VALUE (space-separated; repeatable): "
                        "on every node, the same on AKS and locally, e.g. --env NCCL_DEBUG=INFO WANDB_MODE=offline. "
                        "Not for secrets: the values are kept in the job's record and its Kubernetes object. Names "
                        "starting with ELASTICTRAIN_ are the job's own settings and are refused, but for the "
                        "in-process mode's ELASTICTRAIN_REPLICA_CHECK_STEPS, ELASTICTRAIN_COORDINATOR_COAST and "
                        "ELASTICTRAIN_SALVAGE (docs/runtime.md).")
        c.argument("recovery", arg_type=get_enum_type(RECOVERY_MODES), options_list=["--recovery"],
                   help="How the job survives a node lost or added. in-process (the default of local jobs): the "
                        "workers keep running; a coordinator of the job's own (locally a process, on AKS a "
                        "Deployment on the system pool) holds a quorum each step, drops a lost node and admits a "
                        "newcomer, which takes the state from a live peer (torchft); the script loops with "
                        "ckpt.batches() or ckpt.steps(). restart (the default on AKS, until in-process is measured "
                        "there): torchrun restarts every worker, which resumes from memory, a peer or blob; without "
                        "--recovery, a local script that loops by hand (ckpt.step()) runs in it, with a warning.")
    with self.argument_context("elastictrain job logs") as c:
        c.argument("node", options_list=["--node"],
                   help="Only this node's log, e.g. myjob-node-0 (default: every node, lines prefixed by node).")
        c.argument("follow", arg_type=get_three_state_flag(), options_list=["--follow", "-f"],
                   help="Keep printing new lines until the job's nodes have all exited, --timeout passed, "
                        "or Ctrl-C.")
        c.argument("tail", type=int, options_list=["--tail"],
                   help="Print only the last N lines of each node's log (default: all).")
        c.argument("timeout", type=int, options_list=["--timeout"],
                   help="With --follow: stop following after this many seconds (default: until the job ends).")
    with self.argument_context("elastictrain job wait") as c:
        c.argument("state", arg_type=get_enum_type(list(JOB_STATES)), options_list=["--state"],
                   help="Wait until the job is in this state (default: Succeeded, unless --step is given).")
        c.argument("step", type=int, options_list=["--step"],
                   help="Wait until training reached this step.")
        c.argument("world_size", type=int, options_list=["--world-size"],
                   help="Wait until the job trains with this many ranks (e.g. after capacity came back).")
        c.argument("timeout", type=int, options_list=["--timeout"],
                   help="Give up after this many seconds, with an error.")
    with self.argument_context("elastictrain job timeline") as c:
        c.argument("output_file", options_list=["--output-file", "--file"],
                   help="Also draw the picture into this file (PNG, SVG or PDF, by its extension); its folder "
                        "must exist. Needs matplotlib in az's Python.")
    for command in ("show", "timeline"):
        with self.argument_context(f"elastictrain job {command}") as c:
            c.argument("price_as", options_list=["--price-as"],
                       help="Price the job's node-hours as Spot nodes of this VM size (with -l), e.g. "
                            "Standard_NC4as_T4_v3: what a local job would cost on Azure, or an AKS job on "
                            "another size. Default on AKS: the size and region of the GPU Spot pool.")
            c.argument("location", options_list=["--location", "-l"],
                       help="With --price-as: the region whose prices to use, e.g. eastus.")
            c.argument("currency", options_list=["--currency"],
                       help="Currency of the cost (an ISO code the Azure Retail Prices API supports, e.g. USD, "
                            "EUR). Default: USD.")
    with self.argument_context("elastictrain job delete") as c:
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show what would be stopped and removed; change nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")
        c.argument("delete_checkpoints", arg_type=get_three_state_flag(), options_list=["--delete-checkpoints"],
                   help="Also delete the job's checkpoints and event log from blob storage. "
                        "Default: they are kept, so a new job of the same name resumes from them.")

    with self.argument_context("elastictrain sku list") as c:
        c.argument("location", options_list=["--location", "-l"],
                   help="Azure region whose Spot-capable GPU sizes to list, e.g. eastus.")
        c.argument("gpu", options_list=["--gpu"],
                   help="Only sizes whose name has this text, e.g. T4, A100, H100 (case-insensitive).")
        c.argument("currency", options_list=["--currency"],
                   help="Currency of the prices (ISO code the Azure Retail Prices API supports, e.g. USD, EUR, "
                        "GBP, JPY). Default: USD.")

    with self.argument_context("elastictrain evict simulate") as c:
        c.argument("local", arg_type=get_three_state_flag(), options_list=["--local"],
                   help="Evict a node of a job on a local cluster.")
        c.argument("cluster", options_list=["--cluster", "-c"],
                   help="Name of the cluster: the AKS cluster (with -g), or the local cluster (with --local; "
                        "default: local).")
        c.argument("job", options_list=["--job"],
                   help="The job whose node(s) go. On AKS: every node its workers run on, or with --rank the one "
                        "of that worker.")
        c.argument("node", options_list=["--node"],
                   help="The node to evict. On AKS: a Kubernetes node name ('kubectl get nodes'). Local: see "
                        "'job show'; default: the newest.")
        c.argument("count", type=int, options_list=["--count"],
                   help="How many nodes to evict. On AKS: Spot nodes of --pool, by name (default 1). Local: newest "
                        "first.")
        c.argument("notice_seconds", type=float, options_list=["--notice-seconds"],
                   help="Local cluster: seconds of Preempt notice before the node goes (Azure gives at least 30; "
                        "default 30); 0: no notice (the node vanishes: frozen, killed once the job trains "
                        "again without it). The node goes as soon as the runtime acknowledges (its "
                        "checkpoint is durable). With --schedule: the notice of those evictions that get one.")
        c.argument("replace_after", type=float, options_list=["--replace-after"],
                   help="Spot capacity comes back: start a replacement node this many seconds after the eviction "
                        "(with --wait: after the job recovered, at the earliest). With --schedule: after each "
                        "eviction (default 30).")
        c.argument("wait", arg_type=get_three_state_flag(), options_list=["--wait"],
                   help="Follow the job until it trains again; report recovery seconds and steps lost. On AKS: "
                        "first until each evicted node left the cluster and its VM is gone, or, deallocated, is "
                        "out of service (up to 40 minutes, with progress) "
                        "(and, with --replace-after, the seconds until it trains at full size again).")
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="Show which nodes would go; change nothing.")
        c.argument("yes", arg_type=get_three_state_flag(), options_list=["--yes", "-y"],
                   help="Do not prompt for confirmation.")
        # not resource_group_name_type: a configured default group must not turn --local evictions into Azure ones
        c.argument("resource_group_name", options_list=["--resource-group", "-g"],
                   help="Resource group of the AKS cluster whose Spot nodes to evict (with -c). Without it, --local.")
        c.argument("rank", type=int, options_list=["--rank"],
                   help="AKS, with --job: the worker (replica index) whose node goes.")
        c.argument("pool", options_list=["--pool"],
                   help="AKS: evict --count Spot nodes of this node pool (e.g. gpu).")
        c.argument("schedule", arg_type=get_three_state_flag(), options_list=["--schedule"],
                   help="Evict nodes of --job at --rate for --duration instead of once: each eviction's recovery "
                        "is printed as it comes, the job's goodput at the end. Ctrl-C stops it (locally the "
                        "capacity of an eviction under way is given back first) and prints the report so far.")
        c.argument("rate", type=float, options_list=["--rate"],
                   help="With --schedule: evictions per minute, more than 0 (one every 60/RATE seconds, the first "
                        "60/RATE seconds in).")
        c.argument("duration", type=float, options_list=["--duration"],
                   help="With --schedule: seconds the schedule runs; at least one interval (60/RATE).")
        c.argument("notice_share", type=float, options_list=["--notice-share"],
                   help="With --schedule, local cluster: the share of evictions (0 to 1; default 0.5) that get a "
                        "--notice-seconds Preempt notice first; the others come without notice. On AKS every "
                        "simulated eviction gets Azure's notice.")
        c.argument("seed", type=int, options_list=["--seed"],
                   help="With --schedule: the seed that chooses which evictions get a notice and which node each "
                        "takes; the same seed makes the same schedule. Default: a new one, printed.")

    # Jobs and checkpoints on AKS: -g RG -c CLUSTER instead of --local.
    # not resource_group_name_type: a configured default group must not turn --local commands into Azure ones
    for group in ("elastictrain job", "elastictrain checkpoint"):
        with self.argument_context(group) as c:
            c.argument("resource_group_name", options_list=["--resource-group", "-g"],
                       help="Resource group of the AKS cluster (with -c/--cluster). Instead of --local.")
    with self.argument_context("elastictrain job run") as c:
        c.argument("image", options_list=["--image"],
                   help="On AKS: the container image the workers run, pinned by a version tag or digest (not "
                        ":latest), e.g. myregistry.azurecr.io/train:1.0; --script is a path inside it.")
        c.argument("gpus_per_node", type=int, options_list=["--gpus-per-node"],
                   help="On AKS: GPUs each worker pod requests (nvidia.com/gpu; default 1). --nproc-per-node "
                        "defaults to it.")
        c.argument("dry_run", arg_type=get_three_state_flag(), options_list=["--dry-run"],
                   help="On AKS: print the objects that would be created; create nothing.")
        c.argument("engine", arg_type=get_enum_type(ENGINES), options_list=["--engine"],
                   help="On AKS: what runs the job; default: the cluster's ('cluster create --engine', "
                        "torchelastic unless chosen). torchelastic: an ElasticJob of the TorchElastic operator. "
                        "k8s-job: a batch/v1 Indexed Job with a headless Service, no operator (Kubernetes 1.31+).")
    with self.argument_context("elastictrain job logs") as c:
        c.argument("rank", type=int, options_list=["--rank"],
                   help="On AKS: only the log of this worker (replica index, as 'job show' lists them).")
        c.argument("pod", options_list=["--pod"],
                   help="On AKS: only the log of this worker pod, e.g. myjob-worker-0.")
