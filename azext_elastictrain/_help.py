"""Help for every group and command, each with a runnable example."""
from knack.help_files import helps

helps["elastictrain"] = """
type: group
short-summary: Elastic, fault-tolerant PyTorch training on Azure Spot GPUs.
long-summary: |
    Train on cheap Spot GPUs without losing work to an eviction: checkpoints go to blob storage
    atomically and asynchronously, and jobs resume from the newest complete one.
"""

helps["elastictrain checkpoint"] = """
type: group
short-summary: Inspect and verify a job's checkpoints in blob storage.
long-summary: >
    Name the job by its checkpoint URL (--url), or, for a job on a local cluster, by
    --local [--cluster NAME] --job JOB: the URL and the local storage credentials then come from
    the cluster; for a job on AKS by -g RG -c CLUSTER --job JOB: the cluster's storage account,
    read with your az login (Entra ID; you need 'Storage Blob Data Reader' on its container).
    Exactly one of the three.
"""

helps["elastictrain checkpoint list"] = """
type: command
short-summary: List a job's checkpoints with their step, size and completeness.
long-summary: |
    A checkpoint is complete once its manifest is written (last, after every file). Incomplete
    ones are being written or were abandoned; damaged ones miss files or have wrong sizes.
examples:
  - name: List the checkpoints of job 'resnet' with your az login.
    text: az elastictrain checkpoint list --url https://mystore.blob.core.windows.net/checkpoints/resnet -o table
  - name: List the checkpoints of job 'resnet' on the local cluster.
    text: az elastictrain checkpoint list --local --job resnet -o table
  - name: List checkpoints in local Azurite by URL.
    text: az elastictrain checkpoint list --url http://127.0.0.1:10000/devstoreaccount1/checkpoints/resnet --connection-string "$AZURE_STORAGE_CONNECTION_STRING"
  - name: List the checkpoints of job 'resnet' on AKS cluster 'trainer' (its storage, your az login).
    text: az elastictrain checkpoint list -g ml-rg -c trainer --job resnet -o table
"""

helps["elastictrain checkpoint show"] = """
type: command
short-summary: Show one checkpoint, with its files, sizes and checksums.
examples:
  - name: Show the checkpoint of step 1200.
    text: az elastictrain checkpoint show --url https://mystore.blob.core.windows.net/checkpoints/resnet --step 1200
  - name: Show a checkpoint of job 'resnet' on the local cluster.
    text: az elastictrain checkpoint show --local --job resnet --step 100
  - name: Show a checkpoint of job 'resnet' on AKS cluster 'trainer'.
    text: az elastictrain checkpoint show -g ml-rg -c trainer --job resnet --step 1200
"""

helps["elastictrain checkpoint verify"] = """
type: command
short-summary: Read checkpoints back and check every file's size and SHA-256 checksum against its manifest.
examples:
  - name: Verify every complete checkpoint of a job.
    text: az elastictrain checkpoint verify --url https://mystore.blob.core.windows.net/checkpoints/resnet -o table
  - name: Verify one step.
    text: az elastictrain checkpoint verify --url https://mystore.blob.core.windows.net/checkpoints/resnet --step 1200
  - name: Verify the checkpoints of job 'resnet' on local cluster 'exp2'.
    text: az elastictrain checkpoint verify --local --cluster exp2 --job resnet -o table
  - name: Verify the checkpoints of job 'resnet' on AKS cluster 'trainer'.
    text: az elastictrain checkpoint verify -g ml-rg -c trainer --job resnet -o table
"""

helps["elastictrain checkpoint prune"] = """
type: command
short-summary: Delete old checkpoints, after showing the plan and asking for confirmation.
long-summary: |
    Never deletes the newest complete checkpoint, nor anything that may still be being written
    (newer than it, or touched in the last 10 minutes). Each checkpoint's manifest is deleted
    first, so a reader never sees a half-deleted checkpoint as complete.
examples:
  - name: Preview keeping only the newest 3 complete checkpoints.
    text: az elastictrain checkpoint prune --url https://mystore.blob.core.windows.net/checkpoints/resnet --keep-last 3 --dry-run -o table
  - name: Delete checkpoints older than a week and abandoned partial saves, without prompting.
    text: az elastictrain checkpoint prune --url https://mystore.blob.core.windows.net/checkpoints/resnet --older-than 7d --incomplete --yes
  - name: Preview pruning a local job's checkpoints to the newest 2.
    text: az elastictrain checkpoint prune --local --job resnet --keep-last 2 --dry-run
  - name: Preview pruning the checkpoints of job 'resnet' on AKS cluster 'trainer' to the newest 3.
    text: az elastictrain checkpoint prune -g ml-rg -c trainer --job resnet --keep-last 3 --dry-run -o table
"""

helps["elastictrain checkpoint download"] = """
type: command
short-summary: Download a complete checkpoint to a local folder, every file checked against its SHA-256.
long-summary: |
    The checkpoint lands in `<dest>/<step, 12 digits>/` as a plain PyTorch Distributed Checkpoint
    folder (.metadata, __*.distcp) plus its manifest.json: load it with
    torch.distributed.checkpoint (FileSystemReader), or turn it into one torch.save file with
    `python -m torch.distributed.checkpoint.format_utils dcp_to_torch <folder> model.pt`.
    Plain values (numbers, strings, lists) are there as their JSON text in uint8 tensors.
    Files are written to a hidden folder and moved into place once all are verified, so an
    interrupted or damaged download leaves nothing that looks complete.
examples:
  - name: Download the newest complete checkpoint of job 'resnet' with your az login.
    text: az elastictrain checkpoint download --url https://mystore.blob.core.windows.net/checkpoints/resnet --dest ./ckpt
  - name: Download step 1200 of job 'resnet' on the local cluster.
    text: az elastictrain checkpoint download --local --job resnet --step 1200 --dest ./ckpt -o table
  - name: Download the newest complete checkpoint of job 'resnet' on AKS cluster 'trainer'.
    text: az elastictrain checkpoint download -g ml-rg -c trainer --job resnet --dest ./ckpt
"""

helps["elastictrain cluster"] = """
type: group
short-summary: Create and manage the clusters elastic jobs run on.
long-summary: >
    On Azure (-g/--resource-group): an AKS cluster with a CPU system pool (etcd rendezvous, the
    TorchElastic operator) and an autoscaled GPU Spot pool, a private storage account for checkpoints
    reached with workload identity (no keys), and the Kubernetes components to run elastic jobs.
    --local runs the whole stack on this machine: real etcd (rendezvous, v2 API), real Azurite
    (checkpoint storage) and a local Azure Scheduled Events endpoint, as background processes on
    loopback ports.
"""

helps["elastictrain cluster create"] = """
type: command
short-summary: Create a cluster, or finish one that is partly there (idempotent).
long-summary: >
    On Azure the plan is, in order: the resource group (if missing); a StorageV2 account (HTTPS only,
    TLS 1.2, no public blob access, shared-key access off; its network closed to all but --storage-allow
    where given) and a private container for checkpoints; a user-assigned managed identity; the AKS
    cluster (system pool autoscaled 1-3, OIDC issuer and workload identity on, Entra ID only: Azure
    RBAC, local accounts off; node images upgraded
    weekly and Kubernetes by --upgrade-channel); the GPU Spot pool (taint sku=gpu:NoSchedule, autoscaled
    --min-count to --max-count); with --maintenance-window, the weekly window for AKS's upgrades; a
    federated credential for the training service account and a Storage Blob Data
    Contributor role assignment on the container; 'Azure Kubernetes Service RBAC Cluster Admin' on
    the cluster for you (or --admin-principal); then, through the Kubernetes API, the namespace,
    service account, NVIDIA device plugin, etcd, operator and settings. Each step first checks what is
    there: a re-run after a failure finishes the plan and changes nothing that is already right.
    The region's Resource SKUs decide each pool's OS disk (ephemeral, on the host, where the size has
    the room) and host encryption (where the size and the subscription support it).
    The CLI reaches the API server with your login's Entra ID token for the AKS server application
    (users, service principals and managed identities alike; no kubelogin), kept in memory. With
    --engine k8s-job no operator is installed: jobs run
    as batch/v1 Indexed Jobs (Kubernetes 1.31+), and 'job run' uses that engine by default.
examples:
  - name: Create a cluster on Azure with up to 4 T4 Spot nodes.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --max-count 4
  - name: Show every request the create would send, without sending any.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --dry-run
  - name: A100 Spot nodes at most $1.50 an hour, with a team label.
    text: az elastictrain cluster create -g ml-rg -n a100 --gpu-vm-size Standard_NC24ads_A100_v4 --max-price 1.5 --labels team=vision
  - name: A cluster whose jobs run as Kubernetes Indexed Jobs, with no operator installed.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --engine k8s-job
  - name: Zone-redundant checkpoints, AKS upgrades on Sundays 02:00-06:00 UTC only, the API server open to one address only.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --storage-sku Standard_ZRS --maintenance-window "Sunday 02:00 4" --api-server-authorized-ips 203.0.113.7
  - name: Nodes on your subnet, checkpoint storage reachable from it and from your address only.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --vnet-subnet-id /subscriptions/SUB/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes --storage-allow 203.0.113.7
  - name: Make a colleague's group the cluster's Kubernetes admins instead of you.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --admin-principal 00000000-0000-0000-0000-000000000000
  - name: Keep local accounts (client-certificate credentials, no Entra ID) - not recommended.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --local-accounts
  - name: Create it and use it with kubectl afterwards.
    text: az elastictrain cluster create -g ml-rg -n spot-train -l eastus --merge-kubeconfig
  - name: Start creating and return; wait; then finish the plan.
    text: |
        az elastictrain cluster create -g ml-rg -n spot-train -l eastus --no-wait
        az elastictrain cluster wait -g ml-rg -n spot-train --created
        az elastictrain cluster create -g ml-rg -n spot-train
  - name: Start the local cluster.
    text: az elastictrain cluster create --local
  - name: Start a second local cluster named 'exp2'.
    text: az elastictrain cluster create --local --name exp2 -o table
"""

helps["elastictrain cluster show"] = """
type: command
short-summary: Show a cluster and the health of each of its components.
long-summary: >
    On Azure: its pools (VM size, Spot priority, eviction policy, max price, node counts and
    autoscale bounds), storage, identity, and the health of etcd, the operator and the device plugin.
examples:
  - name: Show a cluster on Azure.
    text: az elastictrain cluster show -g ml-rg -n spot-train -o table
  - name: Is the local cluster healthy?
    text: az elastictrain cluster show --local -o table
"""

helps["elastictrain cluster list"] = """
type: command
short-summary: List clusters.
long-summary: Without --local, the AKS clusters this extension created in the subscription (or in -g).
examples:
  - name: List the clusters on Azure in a resource group.
    text: az elastictrain cluster list -g ml-rg -o table
  - name: List local clusters.
    text: az elastictrain cluster list --local -o table
"""

helps["elastictrain cluster wait"] = """
type: command
short-summary: Wait until an AKS cluster and its pools reach a state, e.g. after 'create --no-wait'.
examples:
  - name: Wait until the cluster is created.
    text: az elastictrain cluster wait -g ml-rg -n spot-train --created
  - name: Wait until it is deleted.
    text: az elastictrain cluster wait -g ml-rg -n spot-train --deleted
"""

helps["elastictrain cluster delete"] = """
type: command
short-summary: Delete a cluster, after confirmation.
long-summary: >
    On Azure: deletes the role assignment, the federated credential, the AKS cluster and the managed
    identity. The storage account and its checkpoints are KEPT unless --delete-storage; the resource
    group is kept. For a local cluster: stops the processes it started (checked by pid and start time,
    so no other process is touched) and removes its state, including its local checkpoints.
examples:
  - name: See what deleting a cluster on Azure would do.
    text: az elastictrain cluster delete -g ml-rg -n spot-train --dry-run
  - name: Delete it, keeping its checkpoints, without prompting.
    text: az elastictrain cluster delete -g ml-rg -n spot-train --yes
  - name: Delete it and its storage account with every checkpoint.
    text: az elastictrain cluster delete -g ml-rg -n spot-train --delete-storage
  - name: Later, delete a kept storage account that create was given by name.
    text: az elastictrain cluster delete -g ml-rg -n spot-train --delete-storage --storage-account mycheckpoints
  - name: See what deleting the local cluster would do.
    text: az elastictrain cluster delete --local --dry-run
  - name: Delete it without prompting.
    text: az elastictrain cluster delete --local --yes
"""

helps["elastictrain job"] = """
type: group
short-summary: Run and monitor elastic training jobs.
long-summary: >
    A job runs between --min-nodes and --max-nodes nodes: when a node is lost it re-forms with the
    nodes it has and resumes from the newest complete checkpoint; nodes that come back rejoin.
    --local runs each node as a torchrun agent on this machine, on a local cluster
    ('az elastictrain cluster create --local'). State, world size, step, throughput, checkpoints,
    evictions and recoveries come from the event log the job writes next to its checkpoints.
    -g RG -c CLUSTER runs it on an AKS cluster ('az elastictrain cluster create -g RG -n CLUSTER') as
    an ElasticJob of the TorchElastic operator: one worker pod per node on the GPU Spot pool.
"""

helps["elastictrain job run"] = """
type: command
short-summary: Start an elastic job - validate everything, then start its nodes in the background.
long-summary: >
    Each node is a torchrun agent that runs the script with the job's checkpoint URL, storage
    credentials and Scheduled Events endpoint in its environment (read by
    azext_elastictrain.runtime). Nothing starts unless everything is valid; if a node fails to
    start, the others are stopped again. Node logs: 'az elastictrain job logs'. With --recovery
    in-process (the default of local jobs) the job first gets a coordinator of its own (locally a
    process; on AKS a Deployment and Service on the system pool) and each node is a torchrun
    --standalone world that asks it for a quorum at every step: workers outlive a lost or added
    node. With --recovery restart (the default on AKS) the nodes rendezvous through the cluster's
    etcd (--nnodes=MIN:MAX) and torchrun re-forms the world when a node is lost or added: every
    worker restarts and resumes from memory, a peer or blob.
examples:
  - name: Train the example on 2 nodes that may shrink to 1, checkpointing every 25 steps.
    text: az elastictrain job run --local --name cifar --script scripts/train_cifar10.py --script-args "--steps 300 --step-delay 0.05" --min-nodes 1 --max-nodes 2 --checkpoint-interval 25
  - name: Start 2 of at most 4 nodes with 2 processes each on local cluster 'exp2'.
    text: az elastictrain job run --local --cluster exp2 --name big --script train.py --min-nodes 2 --max-nodes 4 --nodes 2 --nproc-per-node 2 -o table
  - name: On AKS cluster 'trainer', train on 2 to 4 GPU Spot nodes with 1 GPU each; the script is inside the image.
    text: az elastictrain job run -g ml-rg -c trainer -n cifar --image myregistry.azurecr.io/elastictrain:0.1.0 --script /app/train_cifar10.py --script-args "--steps 3000" --min-nodes 2 --max-nodes 4
  - name: Nodes with 4 GPUs and 4 training processes each.
    text: az elastictrain job run -g ml-rg -c trainer -n big --image myregistry.azurecr.io/elastictrain:0.1.0 --script /app/train.py --min-nodes 1 --max-nodes 2 --gpus-per-node 4 --nproc-per-node 4
  - name: On AKS, workers that keep running when a node is lost or added (a coordinator of the job's own; local jobs do by default); the script loops with ckpt.batches() or ckpt.steps(), as the README's train.py.
    text: az elastictrain job run -g ml-rg -c trainer -n readme --image myregistry.azurecr.io/elastictrain:0.1.0 --script /app/train.py --min-nodes 1 --max-nodes 2 --recovery in-process
  - name: A local job whose script loops by hand (calling ckpt.step()), so every worker restarts at a re-form (without --recovery it runs in restart too, with a warning).
    text: az elastictrain job run --local --name own-loop --script own_loop.py --min-nodes 1 --max-nodes 2 --recovery restart
  - name: Print the ElasticJob it would create; create nothing.
    text: az elastictrain job run -g ml-rg -c trainer -n cifar --image myregistry.azurecr.io/elastictrain:0.1.0 --script /app/train_cifar10.py --min-nodes 1 --max-nodes 2 --dry-run
"""

helps["elastictrain job list"] = """
type: command
short-summary: List the jobs of a cluster with their state, step and world size.
examples:
  - name: List the jobs on the local cluster.
    text: az elastictrain job list --local -o table
  - name: List the jobs on AKS cluster 'trainer'.
    text: az elastictrain job list -g ml-rg -c trainer -o table
"""

helps["elastictrain job show"] = """
type: command
short-summary: Show a job - state, world size, step, throughput, last checkpoint, evictions, recoveries, nodes.
long-summary: >
    State: Running while any node's agent runs; Succeeded once training finished; otherwise Failed
    (or Stopped, when deleting it). Evictions count Spot preemption notices plus nodes lost while
    the job runs on. Each time the job re-formed and restored after its first start is a recovery
    (it lost a node or a worker failed) or a scale-up (scaleUps: capacity came back and it grew).
    From the job's events, the same on both backends: each world the job formed runs from its
    restore to the last step it completed (every rank records that step, with its time, when
    training stops early). goodput is the share of rank-seconds (world size x seconds) spent on
    steps that ended in the final model. timeLost gives the other rank-seconds by cause - reforming
    (last completed step to the new world's start), restoring (start to restored checkpoint),
    stepsLost (steps trained past the step the next world resumed from, retrained), scaleUps (both
    gaps, when the new world is larger) and starting (first start to first restore); a gap counts
    the ranks of the world that forms after it. stepsLost (top level) is that count of steps.
    Step times between two recorded step boundaries are taken as evenly spaced.
    cost (on AKS; locally with --price-as SIZE -l REGION) - the job's node-hours (rankSeconds total
    / nprocPerNode) by the priority of the pool its workers run on, their cost at the size's current
    Linux Spot price (Azure Retail Prices API, retail list prices), the same node-hours at on-demand
    prices, saved (amount and %) and cost per goodput node-hour (cost / the node-hours of steps in
    the final model). A price that cannot be had is "unknown".
examples:
  - name: Show job 'cifar' on the local cluster.
    text: az elastictrain job show --local --name cifar
  - name: What job 'cifar' of the local cluster would have cost on Spot T4 nodes in East US.
    text: az elastictrain job show --local --name cifar --price-as Standard_NC4as_T4_v3 -l eastus --query cost
  - name: One line of it.
    text: az elastictrain job show --local --name cifar -o table
  - name: Show job 'cifar' on AKS cluster 'trainer' - the operator's conditions and each worker pod (node, Spot, phase, restarts).
    text: az elastictrain job show -g ml-rg -c trainer -n cifar
"""

helps["elastictrain job timeline"] = """
type: command
short-summary: A job's timeline - step and world size over time, checkpoints, notices, stops, scale-ups.
long-summary: >
    From the job's events (its current run), the same on a local cluster and on AKS. Times are
    seconds since the run's first event. worlds - each world the job formed, with its step
    boundaries as the ranks recorded them; worldSize - [time, size] changes, 0 while no world
    trains; checkpoints - [time, step] commits; notices - preemption notices; stops - where a world
    stopped, the step it had completed and how many steps the next one retrained; scaleUps - a
    larger world forming. With --output-file it also draws the picture (needs matplotlib). cost -
    as in 'job show' (on AKS, or with --price-as SIZE -l REGION), also written on the picture.
examples:
  - name: Draw job 'cifar' of the local cluster into timeline.png.
    text: az elastictrain job timeline --local --name cifar --output-file timeline.png
  - name: The series as JSON, of a job on AKS cluster 'trainer'.
    text: az elastictrain job timeline -g ml-rg -c trainer -n cifar -o json
"""

helps["elastictrain job logs"] = """
type: command
short-summary: Print the logs of a job's nodes (the agents' and the training processes' output).
examples:
  - name: The last 20 lines of every node.
    text: az elastictrain job logs --local --name cifar --tail 20
  - name: Follow node 0 until the job ends (Ctrl-C stops following, not the job).
    text: az elastictrain job logs --local --name cifar --node cifar-node-0 --follow
  - name: On AKS, the last 50 lines of rank 1.
    text: az elastictrain job logs -g ml-rg -c trainer -n cifar --rank 1 --tail 50
  - name: On AKS, follow one worker pod.
    text: az elastictrain job logs -g ml-rg -c trainer -n cifar --pod cifar-worker-0 --follow
"""

helps["elastictrain job wait"] = """
type: command
short-summary: Wait until a job reaches a state or a step; an error if it fails first or time runs out.
examples:
  - name: Wait up to 5 minutes for job 'cifar' to succeed.
    text: az elastictrain job wait --local --name cifar --state Succeeded --timeout 300
  - name: Wait until it trained 100 steps.
    text: az elastictrain job wait --local --name cifar --step 100
  - name: Wait until it trains with 2 ranks again after an eviction.
    text: az elastictrain job wait --local --name cifar --world-size 2 --timeout 120
  - name: On AKS, wait until job 'cifar' trains with 4 ranks.
    text: az elastictrain job wait -g ml-rg -c trainer -n cifar --world-size 4 --timeout 1800
"""

helps["elastictrain job delete"] = """
type: command
short-summary: Stop a job's nodes and remove it, after confirmation; its checkpoints are kept.
long-summary: >
    Stops every node's agent and all its descendants (checked by pid and start time; the training
    processes get SIGTERM first, on which they checkpoint), then removes the job's state and logs.
    The checkpoints and event log stay unless --delete-checkpoints: a new job of the same name
    resumes from them.
examples:
  - name: See what deleting job 'cifar' would do.
    text: az elastictrain job delete --local --name cifar --dry-run
  - name: Delete it without prompting, keeping its checkpoints.
    text: az elastictrain job delete --local --name cifar --yes
  - name: Delete it and its checkpoints.
    text: az elastictrain job delete --local --name cifar --delete-checkpoints --yes
  - name: On AKS, see what deleting job 'cifar' would stop.
    text: az elastictrain job delete -g ml-rg -c trainer -n cifar --dry-run
  - name: On AKS, delete it without prompting (the ElasticJob and its pods; the checkpoints stay).
    text: az elastictrain job delete -g ml-rg -c trainer -n cifar --yes
"""

helps["elastictrain sku"] = """
type: group
short-summary: Where to run - the GPU sizes a region offers as Spot, what they cost and how often they are evicted.
"""

helps["elastictrain sku list"] = """
type: command
short-summary: List the Spot-capable GPU sizes a region offers your subscription, cheapest per GPU first.
long-summary: |
    For each size: GPUs, vCPUs, the Linux Spot and pay-as-you-go price per hour (Azure Retail Prices API, public;
    kept a day in az's config folder), the Spot price per GPU-hour and saving, the Spot eviction-rate band of the
    last 28 days (Azure Resource Graph, SpotResources) and how many nodes the Spot vCPU quota left allows
    (lowPriorityCores); in JSON also latestSpotPriceUsd, the newest entry of Resource Graph's Spot price history. Sizes come from the region's Resource SKUs, as 'cluster create' checks them. A price or
    band that cannot be had shows as "unknown"; prices are retail list prices, not your agreement's.
examples:
    - name: The Spot GPU sizes of East US, as a table
      text: az elastictrain sku list -l eastus -o table
    - name: Only A100 sizes, priced in euros
      text: az elastictrain sku list -l westeurope --gpu A100 --currency EUR -o table
"""

helps["elastictrain evict"] = """
type: group
short-summary: Evict Spot nodes, to see a job survive it.
"""

helps["elastictrain evict simulate"] = """
type: command
short-summary: Evict nodes of a running job the way Azure evicts Spot VMs, and report the recovery.
long-summary: |
    On AKS (-g RG -c CLUSTER): name exactly one of --node NAME, --job JOB [--rank R] or
    --pool POOL [--count K]. Each node is resolved to its VMSS instance through its
    providerID, and Azure's simulateEviction is called on it in the cluster's node
    resource group: the VM gets the Spot notice and is deleted, and the node leaves the
    cluster. Only Spot nodes can be evicted. The result names each node, its scale set
    and instance id, and the pods and ranks it hit; --dry-run shows that and evicts
    nothing. With --wait it follows each node until it left the cluster and its VM is
    gone - or, in a pool with eviction policy Deallocate, until the stopped node still
    listed is tainted out of service and its pods go - then the jobs hit until they train
    again. Azure evicts within 30 minutes of the request (often ~3): the wait allows 40,
    saying every 30 s what it waits for.
    On the local cluster (--local --job JOB):
    Posts an Azure Scheduled Events Preempt for the node; the training runtime checkpoints the step
    the notice arrived at on every rank and acknowledges; then the node's agent and all its workers
    are killed (or when the notice runs out). With --notice-seconds 0 the node vanishes as an Azure
    VM evicted without notice does: its processes are frozen with their connections open (no peer is
    told), and killed once the job trains again without it (its peers notice by their collective
    timeout), at most 120 s later.
    With --wait it follows the job until it trains again and reports the recovery seconds (eviction
    to the first step at the smaller world size) and the steps lost. With --replace-after S, Spot
    capacity comes back S seconds after the eviction (with --wait: once the job recovered, at the
    earliest): a new node joins, and --wait follows the job back to its full world size.
    With --schedule --rate R --duration D (either cluster): chaos on purpose. A node of --job goes
    every 60/R seconds for D seconds, the first 60/R seconds in; locally --notice-share of them
    (exactly, the seed choosing which) get a --notice-seconds notice and capacity comes back
    --replace-after seconds after each; on AKS each is a simulateEviction with Azure's notice and
    the autoscaler brings capacity back. An eviction that would leave the job under its minimum
    number of nodes is skipped; one due while the one before is still followed comes right
    after it (atSeconds says when). Each eviction's recovery (seconds, steps lost, from the
    job's events) is printed as it comes, and the job's goodput at the end. --seed makes a schedule
    again; --dry-run prints it. Ctrl-C stops between steps: an eviction under way finishes, its
    capacity comes back at once (locally), and the report so far is printed.
examples:
  - name: Evict the newest node of job 'cifar' with Azure's 30 s notice and follow the recovery.
    text: az elastictrain evict simulate --local --job cifar --wait --yes -o table
  - name: Evict node cifar-node-0 without notice; capacity returns 5 s later; follow both.
    text: az elastictrain evict simulate --local --job cifar --node cifar-node-0 --notice-seconds 0 --replace-after 5 --wait --yes
  - name: Chaos for 10 minutes, one eviction a minute, half of them with a 30 s notice, capacity back after 30 s.
    text: az elastictrain evict simulate --local --job cifar --schedule --rate 1 --duration 600 --notice-share 0.5 --replace-after 30 --seed 7 --yes
  - name: Print the schedule those values make, and evict nothing.
    text: az elastictrain evict simulate --local --job cifar --schedule --rate 1 --duration 600 --seed 7 --dry-run -o table
  - name: On AKS, evict a Spot node of job 'cifar' every 10 minutes for an hour through simulateEviction.
    text: az elastictrain evict simulate -g ml-rg -c spot-train --job cifar --schedule --rate 0.1 --duration 3600 --yes -o table
  - name: On AKS, evict the Spot node of rank 1 of job 'cifar' and follow it out of the cluster.
    text: az elastictrain evict simulate -g ml-rg -c spot-train --job cifar --rank 1 --wait --yes -o table
  - name: On AKS, evict one Spot node by name.
    text: az elastictrain evict simulate -g ml-rg -c spot-train --node aks-gpu-31415926-vmss000001 --yes
  - name: On AKS, show which 2 nodes of pool 'gpu' would go, and evict nothing.
    text: az elastictrain evict simulate -g ml-rg -c spot-train --pool gpu --count 2 --dry-run -o table
  - name: On AKS, evict every node job 'cifar' runs on.
    text: az elastictrain evict simulate -g ml-rg -c spot-train --job cifar --yes
"""
