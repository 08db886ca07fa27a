"""backends.aks.describe: `job show|list` from the operator's status, the worker pods and the job's events."""
from __future__ import annotations

import pytest

from azext_elastictrain._format import job_show_table
from azext_elastictrain.backends.aks import describe as aj
from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec, SpecError
from tests.support import aks_objects as k
from tests.support.fake_kube import FakeKube

CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
SPEC = JobSpec(name="cifar", script="scripts/train_cifar10.py", min_nodes=1, max_nodes=3, nodes=2,
               nproc_per_node=1, script_args=("--steps", "1000"), checkpoint_interval=50, keep=3)
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
T0 = k.CREATED_EPOCH
GPU = [k.node(i) for i in range(3)]
NODES = GPU + [k.node(0, pool="system", spot=False)]


def _job(conditions=None, active=2, failed=0) -> dict:
    rendered = m.render_elastic_job(SPEC, CLUSTER, IMAGE, run_id="cifar-1a2b3c4d")
    return k.with_status(rendered, k.running("cifar") if conditions is None else conditions, active, failed)


def _event(offset, event, **fields):
    return {"time": T0 + offset, "event": event, "rank": 0, "node": k.name_of(GPU[0]), **fields}


EVENTS = [
    _event(-3600, "progress", step=900, world_size=3),  # an earlier job of the same name
    _event(20, "started", world_size=2, restart_count=0),
    _event(25, "restored", step=0, world_size=2),
    _event(60, "progress", step=100, world_size=2, samples_per_s=812.5, metrics={"loss": 1.9}),
    _event(61, "checkpoint", step=100),
    _event(90, "progress", step=150, world_size=2, samples_per_s=830.0, metrics={"loss": 1.7}),
]
PODS = [k.worker_pod("cifar", 0, k.name_of(GPU[0])), k.worker_pod("cifar", 1, k.name_of(GPU[1]), restarts=1)]


def test_show_renders_the_operator_status_pods_and_progress() -> None:
    shown = aj.describe_job(_job(), PODS, NODES, EVENTS, cluster="trainer")
    assert shown["state"] == "Running" and shown["type"] == "aks" and shown["cluster"] == "trainer"
    assert (shown["minNodes"], shown["maxNodes"], shown["nodeCount"], shown["nprocPerNode"]) == (1, 3, 2, 1)
    assert (shown["script"], shown["scriptArgs"]) == ("scripts/train_cifar10.py", ["--steps", "1000"])
    assert (shown["checkpointInterval"], shown["keep"], shown["rdzvId"]) == (50, 3, "cifar-1a2b3c4d")
    assert (shown["step"], shown["worldSize"], shown["samplesPerSecond"], shown["loss"]) == (150, 2, 830.0, 1.7)
    assert shown["lastCheckpointStep"] == 100 and shown["lastCheckpointTime"] == "2026-01-01T10:01:01Z"
    assert (shown["evictions"], shown["recoveries"]) == (0, 0)
    assert shown["nodes"] == [
        {"pod": "cifar-worker-0", "rank": 0, "node": k.name_of(GPU[0]), "pool": "gpu", "spot": True,
         "phase": "Running", "status": "Running", "alive": True, "restarts": 0, "reason": None,
         "started": k.CREATED},
        {"pod": "cifar-worker-1", "rank": 1, "node": k.name_of(GPU[1]), "pool": "gpu", "spot": True,
         "phase": "Running", "status": "Running", "alive": True, "restarts": 1, "reason": None,
         "started": k.CREATED},
    ]
    operator = shown["operator"]
    assert [(c["type"], c["status"]) for c in operator["conditions"]] == [("Created", "True"), ("Running", "True")]
    assert operator["replicaStatuses"] == {"Worker": {"active": 2}}
    assert operator["startTime"] == k.CREATED


def test_the_job_table_reads_an_aks_job_like_a_local_one() -> None:
    (row,) = job_show_table(aj.describe_job(_job(), PODS, NODES, EVENTS))
    assert (row["Name"], row["State"], row["Nodes"], row["MinMax"]) == ("cifar", "Running", "2/2", "1-3")
    assert (row["WorldSize"], row["Step"], row["SamplesPerSec"], row["LastCheckpoint"]) == (2, 150, "830.0", 100)


@pytest.mark.parametrize("conditions, finished, want", [
    (k.running("cifar"), False, "Running"),
    (k.restarting("cifar"), False, "Restarting"),
    (k.running("cifar")[:1], False, "Running"),  # Created only, but a worker already runs
    (k.running("cifar") + [{"type": "Failed", "status": "True", "reason": "ElasticJobFailed"}], False, "Failed"),
    (k.running("cifar"), True, "Succeeded"),  # a Worker-only job: the operator never says Succeeded
    # the operator's Succeeded (every worker exited 0) without the final event: a script that returned after a
    # stop, not a finished training
    (k.running("cifar") + [{"type": "Succeeded", "status": "True"}], False, "Failed"),
    (k.running("cifar") + [{"type": "Succeeded", "status": "True"}], True, "Succeeded"),
])
def test_state_comes_from_the_conditions_and_the_finished_event(conditions, finished, want) -> None:
    events = EVENTS + ([_event(120, "finished", step=1000)] if finished else [])
    assert aj.describe_job(_job(conditions), PODS, NODES, events)["state"] == want


def test_a_finished_event_a_later_world_trained_past_is_not_success() -> None:
    """An older runtime's done() after torchrun's SIGTERM wrote `finished` at step 150; the re-formed world
    trains on: the job is Running until the last world finishes."""
    early = EVENTS + [_event(91, "finished", step=150), _event(95, "started", world_size=2, restart_count=1),
                      _event(97, "restored", step=150, world_size=2), _event(99, "progress", step=160, world_size=2)]
    assert aj.describe_job(_job(), PODS, NODES, early)["state"] == "Running"
    done = early + [_event(130, "checkpoint", step=1000), _event(131, "finished", step=1000, total=1000)]
    assert aj.describe_job(_job(), PODS, NODES, done)["state"] == "Succeeded"


def test_a_job_the_operator_has_not_seen_yet_is_pending() -> None:
    job = _job()
    del job["status"]
    pending = [k.worker_pod("cifar", 0, None, phase="Pending")]
    shown = aj.describe_job(job, pending, NODES, [])
    assert shown["state"] == "Pending" and shown["operator"]["conditions"] == []
    assert shown["nodes"][0]["reason"] == "Unschedulable" and shown["nodes"][0]["spot"] is None


def test_a_job_whose_instance_disappeared_shows_the_lost_node_and_counts_the_eviction() -> None:
    # rank 1's VM was evicted: the node object is gone, the pod still names it until it is cleaned up
    # (status Unknown), and the operator's replacement for it waits for Spot capacity.
    evicted = k.worker_pod("cifar", 1, "aks-gpu-31415926-vmss000001", phase="Unknown")
    evicted["status"]["reason"] = "NodeLost"
    nodes = [n for n in NODES if k.name_of(n) != "aks-gpu-31415926-vmss000001"]
    shown = aj.describe_job(_job(k.restarting("cifar"), active=1), [PODS[0], evicted], nodes, EVENTS)
    lost = shown["nodes"][1]
    assert (lost["status"], lost["phase"], lost["alive"], lost["spot"], lost["pool"]) == (
        "NodeLost", "Unknown", False, None, None)
    assert shown["evictions"] == 1 and shown["state"] == "Restarting"
    (row,) = job_show_table(shown)
    assert row["Nodes"] == "1/2" and row["Evictions"] == 1

    replacement = k.worker_pod("cifar", 1, None, phase="Pending")
    shown = aj.describe_job(_job(k.running("cifar"), active=1), [PODS[0], replacement], nodes, EVENTS)
    assert shown["nodes"][1]["status"] == "Pending" and shown["nodes"][1]["node"] is None
    assert shown["evictions"] == 0  # the lost node is no longer to be seen: only a notice event records it


def test_a_preempt_notice_and_the_lost_node_count_as_one_eviction() -> None:
    lost_node = "aks-gpu-31415926-vmss000001"
    evicted = k.worker_pod("cifar", 1, lost_node, phase="Running")
    events = EVENTS + [_event(95, "preempted", step=160, source="scheduled_events", node=lost_node),
                       _event(140, "restored", step=160, world_size=1),
                       _event(150, "progress", step=170, world_size=1)]
    shown = aj.describe_job(_job(), [PODS[0], evicted], [n for n in NODES if k.name_of(n) != lost_node], events)
    assert (shown["evictions"], shown["recoveries"], shown["worldSize"]) == (1, 1, 1)


def test_a_node_that_stopped_reporting_is_not_alive() -> None:
    nodes = [k.node(0, ready=False)] + NODES[1:]
    shown = aj.describe_job(_job(), PODS, nodes, EVENTS)
    assert [w["alive"] for w in shown["nodes"]] == [False, True]


def test_events_that_cannot_be_read_are_said_and_do_not_fake_success() -> None:
    shown = aj.describe_job(_job(k.running("cifar") + [{"type": "Succeeded", "status": "True"}]), PODS, NODES,
                            [], events_error="cannot read the job's events")
    assert shown["state"] == "Unknown" and shown["eventsError"] == "cannot read the job's events"


# -- logs and delete -----------------------------------------------------------------------------------------

def test_logs_of_a_rank_come_from_its_pods_worker_container() -> None:
    assert aj.plan_logs(_job(), PODS, rank=1) == [
        {"pod": "cifar-worker-1", "container": "elasticjob-worker", "rank": 1, "node": k.name_of(GPU[1]),
         "phase": "Running"}]
    assert [p["pod"] for p in aj.plan_logs(_job(), PODS)] == ["cifar-worker-0", "cifar-worker-1"]


def test_logs_of_a_rank_that_does_not_exist_or_has_not_started_are_refused() -> None:
    with pytest.raises(aj.JobNotFound, match="job 'cifar' has no rank 5 \\(its ranks: 0, 1\\)"):
        aj.plan_logs(_job(), PODS, rank=5)
    with pytest.raises(SpecError, match="rank 0 of job 'cifar' is not scheduled yet"):
        aj.plan_logs(_job(), [k.worker_pod("cifar", 0, None, phase="Pending")], rank=0)


def test_delete_stops_the_workers_and_keeps_the_checkpoints() -> None:
    plan = aj.plan_delete(_job(), PODS)
    assert plan["object"] == {"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob", "name": "cifar",
                              "namespace": "elastictrain"}
    assert [s["pod"] for s in plan["stopped"]] == ["cifar-worker-0", "cifar-worker-1"]
    assert plan["checkpoints"] == "kept"


# -- over a KubeClient ---------------------------------------------------------------------------------------

@pytest.fixture()
def kube() -> FakeKube:
    fake = FakeKube().with_operator_crd()
    for obj in [*NODES, *PODS, k.worker_pod("bert", 0, k.name_of(GPU[2])),
                k.with_status(m.render_elastic_job(JobSpec(name="bert", script="t.py"), CLUSTER, IMAGE),
                              k.running("bert"), 1), _job()]:
        fake.seed(obj)
    return fake


def test_show_and_list_read_the_cluster_and_the_events(kube) -> None:
    read = {"cifar": EVENTS, "bert": []}.__getitem__
    shown = aj.show_job(kube, "cifar", read, cluster="trainer")
    assert shown["step"] == 150 and [w["pod"] for w in shown["nodes"]] == ["cifar-worker-0", "cifar-worker-1"]
    listed = aj.list_jobs(kube, read)
    assert [(j["name"], len(j["nodes"])) for j in listed] == [("bert", 1), ("cifar", 2)]


def test_show_of_an_unknown_job_names_the_jobs_there_are(kube) -> None:
    with pytest.raises(aj.JobNotFound, match="no job 'nope' in namespace 'elastictrain' \\(its jobs: bert, cifar\\)"):
        aj.show_job(kube, "nope", lambda name: [])


def test_show_says_when_the_events_cannot_be_read(kube) -> None:
    def unreadable(name):
        raise OSError("blob endpoint unreachable")

    shown = aj.show_job(kube, "cifar", unreadable)
    assert shown["state"] == "Running" and "blob endpoint unreachable" in shown["eventsError"]


def test_recovery_after_an_aks_eviction_reads_the_events_like_the_local_one() -> None:
    asked, gone = T0 + 92, T0 + 130
    # the runtime saves the notice's step (its checkpoint event says when that step ended)
    events = EVENTS + [_event(95, "preempted", step=160, source="scheduled_events"),
                       _event(96, "checkpoint", step=160, step_time=T0 + 94.5),
                       _event(140, "restored", step=160, world_size=1),
                       _event(152.5, "progress", step=170, world_size=1)]
    result = aj.follow_recovery_aks(lambda job: events, "cifar", gone, node=k.name_of(GPU[1]), requested_at=asked)
    assert result == {"node": k.name_of(GPU[1]), "resumedFromStep": 160, "worldSize": 1, "restoreSeconds": 10.0,
                      "recoverySeconds": 22.5, "stepsLost": 0, "kind": "evictionWithNotice", "lastStep": 160,
                      "outageSeconds": 58.0}  # from step 160 (ended at +94.5) to step 170 (+152.5)


def test_the_script_is_read_back_from_a_warm_entry_and_from_a_bare_one() -> None:
    """Jobs started before warm starts name the script right after torchrun's options; later ones after
    ``-m azext_elastictrain.runtime.warm``: job show reads both the same."""
    from azext_elastictrain.core import launch

    options = ["--nproc-per-node=1", "--nnodes=1:3"]
    cold = launch.worker_entry("train.py", ["--lr", "0.1"], warm=False)
    assert cold == ["--", "train.py", "--lr", "0.1"]
    before_the_separator = [(["-m", launch.WARM_START_MODULE, "train.py", "--lr", "0.1"], True),
                            (["train.py", "--lr", "0.1"], False)]
    for entry, warm in [(launch.worker_entry("train.py", ["--lr", "0.1"]), True), (cold, False),
                        *before_the_separator]:
        assert launch.script_of(entry) == ("train.py", ["--lr", "0.1"], warm)
        shown = aj._script_args([*options, *entry])  # pylint: disable=protected-access
        assert (shown["script"], shown["scriptArgs"], shown["warmStart"], shown["maxNodes"]) == (
            "train.py", ["--lr", "0.1"], warm, 3)
