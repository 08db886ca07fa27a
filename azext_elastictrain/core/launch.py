"""How a job's nodes are launched: torchrun's options, the rendezvous settings, each backend's figures (its
``LaunchProfile``), and the names of the environment the training runtime reads (core/settings.py writes a job's
settings under them and reads them back). The local backend (torchrun agents here) and the AKS backend (the
ElasticJob's worker container) both build their launch from these names, so the two cannot drift apart.

Pure and stdlib only: no knack, no azure.cli, no torch (the runtime may import it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

# -- the runtime's environment (azext_elastictrain.runtime reads these) ---------------------------------------
ENV_CHECKPOINT_URL = "ELASTICTRAIN_CHECKPOINT_URL"  # blob URL of the job's prefix
ENV_CHECKPOINT_CONTAINER_URL = "ELASTICTRAIN_CHECKPOINT_CONTAINER_URL"  # AKS: from the cluster's ConfigMap
ENV_KEEP = "ELASTICTRAIN_KEEP"
ENV_CHECKPOINT_INTERVAL_STEPS = "ELASTICTRAIN_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_INTERVAL_SECONDS = "ELASTICTRAIN_CHECKPOINT_INTERVAL_SECONDS"
# How often rank 0 writes a progress event (step, throughput) to the job's log. Local: 2 s, so that `job show`
# and the demo follow a short job closely; AKS: 10 s, each event one more block appended to blob storage.
ENV_PROGRESS_SECONDS = "ELASTICTRAIN_PROGRESS_SECONDS"
LOCAL_PROGRESS_SECONDS = 2.0
AKS_PROGRESS_SECONDS = 10.0
ENV_SCHEDULED_EVENTS_URL = "ELASTICTRAIN_SCHEDULED_EVENTS_URL"
ENV_VM_NAME = "ELASTICTRAIN_VM_NAME"
ENV_NODE_NAME = "ELASTICTRAIN_NODE_NAME"
ENV_PREEMPTION_STATE = "ELASTICTRAIN_PREEMPTION_STATE"
ENV_PREEMPTION_POLL_SECONDS = "ELASTICTRAIN_PREEMPTION_POLL_SECONDS"
# The memory tier (runtime/memory_tier.py): on by default, each completed step kept in node-local shared memory
# (the training thread copies the state; a thread of its own checksums and commits it); "off" turns it off.
# Where it lives: /dev/shm by default; on AKS a memory-backed emptyDir mounted there (core/aks/manifests.py).
ENV_MEMORY_TIER = "ELASTICTRAIN_MEMORY_TIER"
ENV_MEMORY_TIER_FORMER = "ELASTICTRAIN_MEMORY_RESCUE"  # its former name: still read, after the new one
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
# A job's mode without --recovery, per backend. A mode is the default only while it passes the battery of the
# scripts users write (tests/e2e/test_battery.py: plain SGD, an unseeded model, BatchNorm, clipping, an EMA, a
# generator and a counter in the state), compared with one uninterrupted run. Both modes pass it; locally
# in-process recovers faster (docs/benchmarks.md, goodput.py 600 s x 3: 0.98 against restart's 0.82). AKS keeps
# restart: its replica timeout is 30 s (AKS_REPLICA_TIMEOUT_SECONDS; 2 s locally), so a node that vanishes would
# cost about 30 s there in the in-process mode (unmeasured).
DEFAULT_RECOVERY = {"local": RECOVERY_IN_PROCESS, "aks": RECOVERY_RESTART}
# The job's nodes range, "MIN:MAX": the runtime refuses before training a data layout that some world the job may
# run at cannot serve (runtime/data.py ``ElasticSampler.check_worlds``), instead of failing at the scale-up.
ENV_NODES = "ELASTICTRAIN_NODES"


# In-process mode: the coordinator (torchft's Lighthouse) the node's workers ask for each step's quorum, as
# http://HOST:PORT (torchft's own variable: its Manager reads it), and the node's replica group id (local: the
# node's name; AKS: the pod's name). Each node is one replica group; its own workers are a torchrun --standalone
# world (RANK, WORLD_SIZE, MASTER_ADDR within the node).
ENV_COORDINATOR = "TORCHFT_LIGHTHOUSE"
ENV_REPLICA_ID = "ELASTICTRAIN_REPLICA_ID"
# The address the node's peers reach it at (torchft's Manager advertises a hostname to the coordinator, by default
# the machine's name, which another pod cannot resolve: a k8s-job pod's name is not a DNS name; a local node's
# machine name may not be loopback, where its gloo runs). The runtime serves a newcomer the state at it too.
# Local: 127.0.0.1; AKS: the pod's IP (downward API).
ENV_REPLICA_HOST = "ELASTICTRAIN_REPLICA_HOST"
# The job's secret, which the state server (runtime/peer_transfer.py) asks of every request: on AKS the value, from
# the job's Kubernetes Secret (key JOB_SECRET_KEY); locally a file of the job's own (mode 0600) named by the _FILE
# variable. The state a newcomer takes from a peer is the whole model: a pod the NetworkPolicy lets through (or a
# process of this machine) without the secret gets a 403.
ENV_JOB_SECRET = "ELASTICTRAIN_JOB_SECRET"
ENV_JOB_SECRET_FILE = "ELASTICTRAIN_JOB_SECRET_FILE"
JOB_SECRET_KEY = "state-secret"
COORDINATOR_PORT = 29510  # the coordinator's port on AKS (its Service); local: a free port of the machine
# The coordinator: python -m COORDINATOR_MODULE (runtime/coordinator.py, torchft's LighthouseServer).
COORDINATOR_MODULE = "azext_elastictrain.runtime.coordinator"
# Its settings: each is a wait in a re-form. torchft's defaults are made for jobs whose replicas rarely change (a
# 5 s heartbeat timeout). Measured with a torchft spike (docs/benchmarks.md: 0.31 s outage after a kill, 0.07 s
# for the survivors when a newcomer joins); scripts/bench/outage.py measures them in the product's own jobs.
# - join_timeout_ms: how long a new quorum waits for a node that is heard (heartbeating) but has not asked yet.
#   It must outlast a step: torchft's Lighthouse starts this wait at the first request of a round, and a newcomer
#   asks as it starts, mid-step for the others; once the wait is over, the Lighthouse forms the quorum the moment
#   a majority has asked at the step boundary, and the nodes that ask a millisecond later sit the step out, wait
#   for the next quorum past the wait again, and the job trains in alternating majorities from then on (seen with
#   the old 200 ms: a real 3-node job with 0.5 s steps trained every step as 2 of its 3 nodes, before a join and
#   after it; scripts/bench/coordination_scale.py: 8 simulated nodes never settled after a join). A node that is
#   gone stops being heard: the heartbeat timeout drops it, not this wait, so a long one costs a vanish nothing (the
#   survivors' step collective waits the replica timeout anyway) and a planned departure of 3 nodes or more the
#   heartbeat timeout (as one of 2 always did: below). It holds the others only for a node that is heard and late,
#   which they would wait for in the step's collective too. Local: 10 s (the local collective timeout); AKS: 30 s
#   (the AKS replica timeout; below the Manager's 60 s quorum timeout, runtime/replicas.py QUORUM_TIMEOUT).
# - quorum_tick_ms 50: how often a waiting quorum is looked at again: a step's quorum is never late by more.
# - heartbeat_timeout_ms: a node not heard from this long is out of the next quorum (torchft's Manager beats every
#   100 ms, and each quorum request counts as a beat). It is what a node gone without notice costs (2 nodes, AKS's
#   replica timeout: 0.60 s at 500 ms, 1.10 s at 1000 ms; docs/benchmarks.md). A planned departure does not wait
#   it: the Lighthouse has no call by which a node leaves, so the leaving node trains on without heartbeats until it
#   is dropped (runtime/handover.py). A needless drop costs the node a heal from a peer, not a restart.
#   500 ms on both backends, five beats lost in a row: 0 needless drops in 600 s under two CPU hogs on this 2-core
#   machine (rdzv_soak.py --seconds 600 --hogs 2 --in-process-heartbeat-ms 500; the quorum's watch, at the same
#   timeout, gave up one step's collective on a live node: one step discarded). AKS had 1000 ms until the handover,
#   when a notice, Spot's usual eviction, waited this timeout too: a short one bought little then beside the risk of
#   a needless drop, which on AKS sends a real model's state across the network. The beat that counts is the
#   torchft server's, a Rust thread that no GIL or Python stall holds up; five beats lost in a row on a cluster's
#   network is a stall, not a slow node (not measured on one here).
LOCAL_COORDINATOR_JOIN_TIMEOUT_MS = 10_000
AKS_COORDINATOR_JOIN_TIMEOUT_MS = 30_000
COORDINATOR_QUORUM_TICK_MS = 50
LOCAL_COORDINATOR_HEARTBEAT_TIMEOUT_MS = 500
AKS_COORDINATOR_HEARTBEAT_TIMEOUT_MS = 500
ENV_PREFIX = "ELASTICTRAIN_"  # a local node starts without the caller's ELASTICTRAIN_* settings
# The runtime's settings that no option of `job run` sets: a job's --env may give them (every other ELASTICTRAIN_
# name is the job's own, written from its options, and refused there). In-process mode: steps between two checks
# that the replicas are one (runtime/replica_check.py; a number, or "off": at changes of members only), and "off"
# to wait for a coordinator that does not answer instead of training on with the last quorum (runtime/replicas.py),
# and "on" to commit a step a node vanished from with the others' gradients instead of discarding it
# (runtime/salvage.py).
ENV_REPLICA_CHECK_STEPS = "ELASTICTRAIN_REPLICA_CHECK_STEPS"
ENV_COORDINATOR_COAST = "ELASTICTRAIN_COORDINATOR_COAST"
ENV_SALVAGE = "ELASTICTRAIN_SALVAGE"
ENV_SCRIPT_SETTINGS = (ENV_REPLICA_CHECK_STEPS, ENV_COORDINATOR_COAST, ENV_SALVAGE)
# How long a worker waits in one collective before it gives up (every process group of the job: the runtime's
# own, and the script's default group through runtime.collective_timeout()). A Spot VM evicted without notice
# vanishes without a FIN, so this timeout is the only way its peers learn; torch's default is 30 minutes.
# A timed-out worker fails, and torchrun re-forms the world without the vanished node. It must also cover the
# longest a healthy peer may lag in a collective: a slow step, a checkpoint's barrier, a rank that restores or
# uploads its part of a checkpoint slower than the others.
#
# Local: 10 s. Measured (docs/benchmarks.md, "A vanished peer"): a healthy 2-node job soaked 120 s under two CPU
# hogs with a checkpoint every 10 steps re-formed 0 times even at a 1 s timeout, so 10 s leaves a margin of 10x
# on this 2-core machine, and a vanished node costs about 10 s plus a re-form instead of 30 minutes.
# AKS: 60 s, not measured here: a margin for checkpoints of real models, whose parts a rank reads or writes over
# the network up to tens of seconds slower than its peers (a timeout there re-forms a healthy job).
ENV_COLLECTIVE_TIMEOUT = "ELASTICTRAIN_COLLECTIVE_TIMEOUT_SECONDS"
# Restart mode: how long a worker's runtime may go without hearing a peer's beat (in the job's store) before it
# takes the peer for gone and ends itself, so the job re-forms without a vanished node within this, whatever
# timeout the script's own process group has (runtime/peer_watch.py). "off" turns it off (then only the
# collective timeouts, and the script's, bound the wait). Not set by the launch: the runtime's default is the
# same on both backends, the rendezvous' own verdict on AKS (keep_alive_interval x keep_alive_max_attempt of
# AKS_RDZV_CONF: an agent silent that long is out of the rendezvous, so a re-form cannot come sooner). Only a
# process whose Python stops for this long is taken for gone: the beat has a thread of its own.
ENV_PEER_TIMEOUT = "ELASTICTRAIN_PEER_TIMEOUT_SECONDS"
PEER_TIMEOUT_SECONDS = 6.0
LOCAL_COLLECTIVE_TIMEOUT_SECONDS = 10.0
AKS_COLLECTIVE_TIMEOUT_SECONDS = 60.0
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = LOCAL_COLLECTIVE_TIMEOUT_SECONDS  # a script run outside a job
# In-process recovery mode: how long the cross-node collective (the gradients averaged across the nodes, each
# step) and the commit wait for a peer, set by the backend for in-process jobs only; torchft's TORCHFT_TIMEOUT_SEC
# overrides it. A vanished node costed this plus one step (10.08 s at 10 s, 3.08 s at 3 s) until the quorum's
# watch (ENV_REPLICA_HEARTBEAT_TIMEOUT below) gave the collective up on its silence; it now bounds a peer that is
# there but slow. A false timeout here costs one discarded step, not a re-form (the slow node keeps its
# heartbeats and stays in the quorum), so it can be far shorter than the restart mode's collective timeout.
# It also bounds a newcomer's admission: the others wait for it in the step it takes the state in, so a state
# that takes longer than this to send is not admitted (docs/runtime.md).
# Local: 2 s, so that a vanish costs under 3 s; measured: a soak under two CPU hogs on this 2-core machine
# (docs/runtime.md). AKS: 30 s, not measured here: real models' states cross a real network to a newcomer.
ENV_REPLICA_TIMEOUT = "ELASTICTRAIN_REPLICA_TIMEOUT_SECONDS"
# In-process mode: how long a participant of a quorum may go unheard by the others before they give up the step's
# collective on it (runtime/replica_watch.py), so that a vanished node costs this rather than the replica timeout,
# which stays long for a slow one. The coordinator's heartbeat timeout (the profile's), so the coordinator has
# dropped the node as the survivors give the step up, and their next quorum is ready.
ENV_REPLICA_HEARTBEAT_TIMEOUT = "ELASTICTRAIN_REPLICA_HEARTBEAT_TIMEOUT_SECONDS"
LOCAL_REPLICA_TIMEOUT_SECONDS = 2.0
AKS_REPLICA_TIMEOUT_SECONDS = 30.0

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


@dataclass(frozen=True)
class LaunchProfile:  # pylint: disable=too-many-instance-attributes  # one field per figure a backend differs in
    """What a backend's launch differs in, each figure chosen once above (the comments say why): a backend holds
    its profile (``LOCAL``, ``AKS``), and every site that launches a node, a pod or a coordinator, or picks a job's
    mode, asks it. Only the figures above name a backend; nothing else picks one of a pair by hand."""

    backend: str
    default_recovery: str  # a job's mode without --recovery (DEFAULT_RECOVERY)
    rdzv_conf: str  # torchrun's --rdzv-conf (restart mode)
    collective_timeout_seconds: float  # ENV_COLLECTIVE_TIMEOUT
    replica_timeout_seconds: float  # ENV_REPLICA_TIMEOUT (in-process mode)
    coordinator_heartbeat_timeout_ms: int  # the coordinator's --heartbeat-timeout-ms (in-process mode)
    progress_seconds: float  # ENV_PROGRESS_SECONDS
    coordinator_join_timeout_ms: int  # the coordinator's --join-timeout-ms (in-process mode)


LOCAL = LaunchProfile("local", DEFAULT_RECOVERY["local"], LOCAL_RDZV_CONF, LOCAL_COLLECTIVE_TIMEOUT_SECONDS,
                      LOCAL_REPLICA_TIMEOUT_SECONDS, LOCAL_COORDINATOR_HEARTBEAT_TIMEOUT_MS, LOCAL_PROGRESS_SECONDS,
                      LOCAL_COORDINATOR_JOIN_TIMEOUT_MS)
AKS = LaunchProfile("aks", DEFAULT_RECOVERY["aks"], AKS_RDZV_CONF, AKS_COLLECTIVE_TIMEOUT_SECONDS,
                    AKS_REPLICA_TIMEOUT_SECONDS, AKS_COORDINATOR_HEARTBEAT_TIMEOUT_MS, AKS_PROGRESS_SECONDS,
                    AKS_COORDINATOR_JOIN_TIMEOUT_MS)
PROFILES = {profile.backend: profile for profile in (LOCAL, AKS)}


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


def standalone_torchrun_options(*, nproc_per_node: int) -> list[str]:
    """torchrun's options for a node of an in-process job: the node is a world of its own (``--standalone``: a
    rendezvous on loopback, no etcd; it overrides any ``--rdzv-*`` option, the ElasticJob operator's prepended
    ones included, and ``--nnodes=1`` after theirs wins), and a worker that fails is restarted in place, from
    the node's memory or blob: the fallback when a worker cannot go on in process."""
    return ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={MAX_RESTARTS}"]


@dataclass(frozen=True)
class RecoveryMode:
    """A recovery mode as a launch sees it, answered once per mode (``MODES``; a job's is ``JobSpec.mode``): what
    each node runs and whether the job has a coordinator of its own. A launch asks the mode instead of branching on
    its name; the runtime's side of a mode is its loop (runtime/loops/)."""

    name: str
    coordinator: bool  # the job has a coordinator: a process of its own (local), a Deployment and a Service (AKS)
    rendezvous: bool  # the nodes meet in the job's rendezvous (etcd); else each node is a world of its own

    def node_world(self, *, nproc_per_node: int, rendezvous: list[str]) -> list[str]:
        """torchrun's options for one node: the backend's ``rendezvous`` options where the nodes meet in one, else
        those of a world of the node's own."""
        return rendezvous if self.rendezvous else standalone_torchrun_options(nproc_per_node=nproc_per_node)


MODES = {RECOVERY_RESTART: RecoveryMode(RECOVERY_RESTART, coordinator=False, rendezvous=True),
         RECOVERY_IN_PROCESS: RecoveryMode(RECOVERY_IN_PROCESS, coordinator=True, rendezvous=False)}


def coordinator_args(profile: LaunchProfile, *, bind: str, min_nodes: int) -> list[str]:
    """The coordinator's options (runtime/coordinator.py): where it listens, the fewest nodes a quorum takes
    (the job's --min-nodes: below it the workers wait, as a torchrun rendezvous waits for --nnodes MIN), and the
    backend's waits (its profile: how long a silent node stays in, how long a quorum waits for a late one)."""
    return [f"--bind={bind}", f"--min-replicas={min_nodes}",
            f"--join-timeout-ms={profile.coordinator_join_timeout_ms}",
            f"--quorum-tick-ms={COORDINATOR_QUORUM_TICK_MS}",
            f"--heartbeat-timeout-ms={profile.coordinator_heartbeat_timeout_ms}"]


# AKS: where a worker pod mounts the memory-backed emptyDir of the memory tier (core/aks/manifests.py).
MEMORY_TIER_MOUNT = "/var/run/elastictrain/memory"
NODE_LEAVING_FILE = MEMORY_TIER_MOUNT + "/node-leaving"  # in the pod's emptyDir: a new pod starts without it
