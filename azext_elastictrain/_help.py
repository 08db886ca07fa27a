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
  - name: List checkpoints in local Azurite.
    text: az elastictrain checkpoint list --url http://127.0.0.1:10000/devstoreaccount1/checkpoints/resnet --connection-string "$AZURE_STORAGE_CONNECTION_STRING"
"""

helps["elastictrain checkpoint show"] = """
type: command
short-summary: Show one checkpoint, with its files, sizes and checksums.
examples:
  - name: Show the checkpoint of step 1200.
    text: az elastictrain checkpoint show --url https://mystore.blob.core.windows.net/checkpoints/resnet --step 1200
"""

helps["elastictrain checkpoint verify"] = """
type: command
short-summary: Read checkpoints back and check every file's size and SHA-256 checksum against its manifest.
examples:
  - name: Verify every complete checkpoint of a job.
    text: az elastictrain checkpoint verify --url https://mystore.blob.core.windows.net/checkpoints/resnet -o table
  - name: Verify one step.
    text: az elastictrain checkpoint verify --url https://mystore.blob.core.windows.net/checkpoints/resnet --step 1200
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
"""

helps["elastictrain cluster"] = """
type: group
short-summary: Create and manage the clusters elastic jobs run on.
long-summary: |
    --local runs the whole stack on this machine: real etcd (rendezvous, v2 API), real Azurite
    (checkpoint storage) and a local Azure Scheduled Events endpoint, as background processes on
    loopback ports.
"""

helps["elastictrain cluster create"] = """
type: command
short-summary: Create a cluster, or finish one that is partly there (idempotent).
examples:
  - name: Start the local cluster.
    text: az elastictrain cluster create --local
  - name: Start a second local cluster named 'exp2'.
    text: az elastictrain cluster create --local --name exp2 -o table
"""

helps["elastictrain cluster show"] = """
type: command
short-summary: Show a cluster and the health of each of its components.
examples:
  - name: Is the local cluster healthy?
    text: az elastictrain cluster show --local -o table
"""

helps["elastictrain cluster list"] = """
type: command
short-summary: List clusters.
examples:
  - name: List local clusters.
    text: az elastictrain cluster list --local -o table
"""

helps["elastictrain cluster delete"] = """
type: command
short-summary: Delete a cluster, after confirmation.
long-summary: |
    For a local cluster: stops the processes it started (checked by pid and start time, so no
    other process is touched) and removes its state, including its local checkpoints.
examples:
  - name: See what deleting the local cluster would do.
    text: az elastictrain cluster delete --local --dry-run
  - name: Delete it without prompting.
    text: az elastictrain cluster delete --local --yes
"""
