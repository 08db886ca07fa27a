"""How a job's nodes are launched: torchrun's options, the rendezvous settings, and the environment the
training runtime reads. The local backend (torchrun agents here) and the AKS backend (the ElasticJob's worker
container) both build their launch from these names, so the two cannot drift apart.

Pure and stdlib only: no knack, no azure.cli, no torch (the runtime may import it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from azext_elastictrain.core.spec import JobSpec

# -- the runtime's environment (azext_elastictrain.runtime reads these) ---------------------------------------
ENV_CHECKPOINT_URL = "ELASTICTRAIN_CHECKPOINT_URL"  # blob URL of the job's prefix
ENV_CHECKPOINT_CONTAINER_URL = "ELASTICTRAIN_CHECKPOINT_CONTAINER_URL"  # AKS: from the cluster's ConfigMap
ENV_KEEP = "ELASTICTRAIN_KEEP"
ENV_CHECKPOINT_INTERVAL_STEPS = "ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_INTERVAL_SECONDS = "ELASTICTRAIN_CHECKPOINT_INTERVAL_SECONDS"
ENV_PROGRESS_SECONDS = "ELASTICTRAIN_PROGRESS_SECONDS"
ENV_SCHEDULED_EVENTS_URL = "ELASTICTRAIN_SCHEDULED_EVENTS_URL"
ENV_VM_NAME = "ELASTICTRAIN_VM_NAME"
ENV_NODE_NAME = "ELASTICTRAIN_NODE_NAME"
ENV_PREEMPTION_STATE = "ELASTICTRAIN_PREEMPTION_STATE"
ENV_PREEMPTION_POLL_SECONDS = "ELASTICTRAIN_PREEMPTION_POLL_SECONDS"
# The memory tier (runtime/rescue.py): on by default, each completed step kept in node-local shared memory
# (the training thread copies the state; a thread of its own checksums and commits it); "off" turns it off.
# Where it lives: /dev/shm by default; on AKS a memory-backed emptyDir mounted there (core/manifests.py).
ENV_MEMORY_RESCUE = "ELASTICTRAIN_MEMORY_RESCUE"
ENV_MEMORY_DIR = "ELASTICTRAIN_MEMORY_DIR"
# A file that exists once the node itself is going (its pod deleted: a preStop hook makes it; a local node
# stopped: the backend does). A SIGTERM then is not a re-form the node survives, so the step is saved to blob
# rather than left in the node's memory.
ENV_NODE_LEAVING_FILE = "ELASTICTRAIN_NODE_LEAVING_FILE"
ENV_PREEMPTION_HOLD_SECONDS = "ELASTICTRAIN_PREEMPTION_HOLD_SECONDS"  # after acknowledging: wait for the VM to go
# Workers fork from a per-node process that imported torch once (runtime/warm.py); "off": each starts cold.
ENV_WARM_START = "ELASTICTRAIN_WARM_START"
ENV_WARM_DIR = "ELASTICTRAIN_WARM_DIR"  # where its sockets live (default: a folder of the user's own in TMPDIR)
ENV_WARM_IMPORTS = "ELASTICTRAIN_WARM_IMPORTS"  # more modules it imports up front, comma-separated
# How a job survives a membership change. "restart" (torchrun re-forms the world: every worker restarts and
# resumes from memory or blob) or "in-process" (workers stay alive; a per-step quorum through the job's
# coordinator drops a lost node and admits a newcomer, which takes the state from a live peer).
ENV_RECOVERY = "ELASTICTRAIN_RECOVERY"
RECOVERY_RESTART = "restart"
RECOVERY_IN_PROCESS = "in-process"
RECOVERY_MODES = (RECOVERY_RESTART, RECOVERY_IN_PROCESS)
# In-process mode: the coordinator (torchft's Lighthouse) the node's workers ask for each step's quorum, as
# http://HOST:PORT (torchft's own variable: its Manager reads it), and the node's replica group id (local: the
# node's name; AKS: the pod's name). Each node is one replica group; its own workers are a torchrun --standalone
# world (RANK, WORLD_SIZE, MASTER_ADDR within the node).
ENV_COORDINATOR = "TORCHFT_LIGHTHOUSE"
ENV_REPLICA_ID = "ELASTICTRAIN_REPLICA_ID"
COORDINATOR_PORT = 29510  # the coordinator's port on AKS (its Service); local: a free port of the machine
ENV_PREFIX = "ELASTICTRAIN_"  # a local node starts without the caller's ELASTICTRAIN_* settings

# torch 2.13: an elastic scale-up hangs when the rendezvous shares its TCP store with the workers.
TCP_STORE_WORKAROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# -- torchrun ------------------------------------------------------------------------------------------------
TORCHRUN_MODULE = "torch.distributed.run"
# etcd-v2 is torch's maintained etcd backend (``etcd`` is the legacy one the ElasticJob operator prepends;
# torchrun keeps the last value of an option, so ours wins).
RDZV_BACKEND = "etcd-v2"
# A worker that fails is restarted in place this many times before the node gives up: evictions make workers
# fail often in a long run, and each restart resumes from the newest checkpoint.
MAX_RESTARTS = 100

# A dead node is noticed after keep_alive_interval x keep_alive_max_attempt seconds, and a round closes
# last_call seconds after min nodes joined (torchrun's defaults: 5 x 3 s and 30 s).
#
# Local: measured side by side (scripts/bench/recovery.py, rdzv_soak.py), 1 s x 3 with a 2 s last call brings
# recovery after an eviction with notice from 9.9 s (2 s x 3, last call 3 s) to 6.7 s, and a 150 s soak under
# two CPU hogs re-formed a healthy job 0 times with either. etcd is the one source of truth for the rounds, so a
# late heartbeat costs a restart, never a split job.
LOCAL_RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=300"
# AKS: one step more margin than local: heartbeats cross a real network to etcd, and a needless re-form
# restarts every GPU worker of the job.
AKS_RDZV_CONF = "last_call_timeout=3,keep_alive_interval=2,keep_alive_max_attempt=3,join_timeout=300"


# torchrun runs this module as each worker (``-m``); it starts the script warm (runtime/warm.py).
WARM_START_MODULE = "azext_elastictrain.runtime.warm"


# Ends torchrun's options before the script. torchrun's parser (argparse, abbreviations allowed) reads every
# argument that looks like an option, the script's too: "--n 4096" is refused as an ambiguous abbreviation of
# --nnodes/--nproc-per-node before anything runs. After "--" argparse takes every argument as positional; the
# "--" itself goes with the script's name (argparse drops it there), so the script gets its arguments untouched,
# a "--" of its own included. Checked with torchrun 2.13 in tests/integration/test_script_args.py.
SCRIPT_SEPARATOR = "--"


def worker_entry(script: str, script_args: Iterable[str] = (), *, warm: bool = True) -> list[str]:
    """torchrun's last arguments, the same on both backends: the script (started warm unless told not to)
    behind the separator that ends torchrun's options, and its arguments."""
    return [*(["-m", WARM_START_MODULE] if warm else []), SCRIPT_SEPARATOR, script, *script_args]


def agent_module(*, warm: bool = True) -> list[str]:
    """What ``python`` runs as a node's agent: torchrun, or with warm starts torchrun behind runtime/warm.py's
    ``--agent`` (it starts the node's warm server, then becomes torchrun with the same arguments)."""
    return ["-m", WARM_START_MODULE, "--agent"] if warm else ["-m", TORCHRUN_MODULE]


def script_of(entry: list[str]) -> tuple[str | None, list[str], bool]:
    """The script, its arguments and whether it starts warm, back from torchrun's last arguments (those of
    worker_entry, or of a job launched before the separator)."""
    warm = entry[:2] == ["-m", WARM_START_MODULE]
    if warm:
        entry = entry[2:]
    if entry[:1] == [SCRIPT_SEPARATOR]:
        entry = entry[1:]
    return (entry[0], list(entry[1:]), warm) if entry else (None, [], warm)


def torchrun_options(*, rdzv_conf: str, nproc_per_node: int, rdzv_id: str | None = None) -> list[str]:
    """The torchrun options both backends pass (each adds where the rendezvous is and the node count)."""
    return [f"--rdzv-backend={RDZV_BACKEND}", f"--rdzv-conf={rdzv_conf}",
            *([f"--rdzv-id={rdzv_id}"] if rdzv_id else []),
            f"--nproc-per-node={nproc_per_node}", f"--max-restarts={MAX_RESTARTS}"]


# AKS: where a worker pod mounts the memory-backed emptyDir of the memory tier (core/manifests.py).
MEMORY_TIER_MOUNT = "/var/run/elastictrain/memory"
NODE_LEAVING_FILE = MEMORY_TIER_MOUNT + "/node-leaving"  # in the pod's emptyDir: a new pod starts without it


def runtime_env(*, keep: int, checkpoint_interval: int | None, memory_tier: bool = True) -> dict[str, str]:
    """The job-wide runtime settings every node gets (each backend adds where the checkpoints are)."""
    env = {ENV_KEEP: str(keep), **TCP_STORE_WORKAROUND, "PYTHONUNBUFFERED": "1"}
    if not memory_tier:
        env[ENV_MEMORY_RESCUE] = "off"
    if checkpoint_interval is not None:
        env[ENV_CHECKPOINT_INTERVAL_STEPS] = str(checkpoint_interval)
    return env


def job_env(job: JobSpec) -> dict[str, str]:
    """The environment a job's options give every node, the same on both backends (a local node's agent and an
    AKS worker pod): the runtime's settings. An option that reaches the training processes is added here."""
    from azext_elastictrain.core.spec import MEMORY_TIER_OFF

    return runtime_env(keep=job.keep, checkpoint_interval=job.checkpoint_interval,
                       memory_tier=job.memory_tier != MEMORY_TIER_OFF)
