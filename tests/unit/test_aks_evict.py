"""backends.aks.evict: plan from the cluster, evict through the compute layer, follow with --wait."""
from __future__ import annotations

import pytest

from azext_elastictrain._format import aks_eviction_table, eviction_table
from azext_elastictrain.backends.aks import evict as ae
from azext_elastictrain.core.errors import ArmError
from azext_elastictrain.core.aks.eviction import EvictionPlanError, EvictionTargetNotFound
from tests.support import aks_objects as k
from tests.support.fake_kube import FakeKube

GPU = [k.node(i) for i in range(3)]
SYSTEM = k.node(0, pool="system", spot=False)


class FakeCompute:
    """The compute layer: records each simulateEviction; evicted instances are gone (404) afterwards."""

    def __init__(self, gone=(), fail=None):
        self.evicted: list[tuple[str, str, str]] = []
        self.gone = set(gone)
        self.fail = fail

    def simulate_eviction(self, instance):
        key = (instance.resource_group, instance.vmss, instance.instance_id)
        if self.fail and instance.instance_id == self.fail.instance_id:
            raise self.fail.error
        if key in self.gone:
            raise ArmError(404, "NotFound", "The entity was not found in this Azure location.")
        self.evicted.append(key)
        self.gone.add(key)

    def vmss_instance(self, instance):
        key = (instance.resource_group, instance.vmss, instance.instance_id)
        return None if key in self.gone else {"instanceId": instance.instance_id}


@pytest.fixture()
def kube() -> FakeKube:
    fake = FakeKube()
    for obj in [*GPU, SYSTEM, k.worker_pod("cifar", 0, k.name_of(GPU[0])), k.worker_pod("cifar", 1, k.name_of(GPU[1]))]:
        fake.seed(obj)
    return fake


def test_a_rank_is_evicted_through_the_instance_behind_its_node(kube):
    compute = FakeCompute()
    plan = ae.plan(kube, job="cifar", rank=1, pools=["system", "gpu"])
    done = ae.evict(compute, plan, clock=lambda: 1767261600.25)
    assert compute.evicted == [(k.NODE_RG, k.GPU_VMSS, "1")]
    assert done[0]["node"] == k.name_of(GPU[1]) and done[0]["ranks"] == [1] and done[0]["state"] == ae.EVICTED
    assert done[0]["evictedAt"] == "2026-01-01T10:00:00.250Z"
    shown = ae.report("trainer", "ml-rg", plan, done)
    assert "requestedAt" not in shown["evictions"][0] and shown["type"] == "aks"
    assert eviction_table(shown) == aks_eviction_table(shown)
    assert list(aks_eviction_table(shown)[0].items())[:5] == [
        ("Node", k.name_of(GPU[1])), ("Pool", "gpu"), ("Vmss", k.GPU_VMSS), ("InstanceId", "1"), ("State", "Evicted")]


def test_an_instance_already_gone_counts_as_evicted(kube):
    compute = FakeCompute(gone={(k.NODE_RG, k.GPU_VMSS, "0")})
    done = ae.evict(compute, ae.plan(kube, node=k.name_of(GPU[0])))
    assert done[0]["state"] == ae.ALREADY_GONE and compute.evicted == []


def test_an_arm_error_half_way_says_what_was_evicted_before_it(kube):
    class Fail:
        instance_id = "1"
        error = ArmError(409, "OperationNotAllowed", "busy")

    compute = FakeCompute(fail=Fail())
    with pytest.raises(ae.EvictionFailed) as failed:
        ae.evict(compute, ae.plan(kube, pool="gpu", count=2))
    assert [e["node"] for e in failed.value.done] == [k.name_of(GPU[0])] and failed.value.error.status == 409


@pytest.mark.parametrize("selector, error", [
    ({"node": "aks-nope-000000"}, EvictionTargetNotFound),
    ({"node": k.name_of(SYSTEM)}, EvictionPlanError),
    ({"job": "nosuch"}, EvictionTargetNotFound),
    ({"job": "cifar", "rank": 7}, EvictionTargetNotFound),
    ({"pool": "gpu2", "pools": ["system", "gpu"]}, EvictionTargetNotFound),
    ({"node": k.name_of(GPU[0]), "job": "cifar"}, EvictionPlanError),
])
def test_bad_selectors_evict_nothing(kube, selector, error):
    compute = FakeCompute()
    with pytest.raises(error):
        ae.evict(compute, ae.plan(kube, **selector))
    assert compute.evicted == []


def test_wait_follows_the_node_out_and_the_job_back(kube):
    compute = FakeCompute()
    done = ae.evict(compute, ae.plan(kube, job="cifar", rank=0), clock=lambda: 1000.0)
    now = [1000.0]

    def sleep(seconds):  # the cloud node manager removes the node 40 s after the eviction was asked for
        now[0] += seconds
        if now[0] >= 1040:
            kube.delete("v1", "Node", k.name_of(GPU[0]))

    events = [{"event": "progress", "step": 300, "time": 990.0, "world_size": 2},
              {"event": "preempted", "step": 310, "time": 1010.0, "node": "n0", "source": "scheduled_events"},
              {"event": "restored", "step": 300, "time": 1060.0, "world_size": 1},
              {"event": "progress", "step": 301, "time": 1070.0, "world_size": 1}]
    ae.follow(kube, compute, done, lambda job: events, poll=5.0, clock=lambda: now[0], sleep=sleep)
    recovery = done[0]["recovery"]
    assert recovery["nodeGoneSeconds"] == 40.0 and recovery["instanceGone"] is True
    assert (recovery["job"], recovery["stepsLost"], recovery["resumedFromStep"], recovery["worldSize"]) == (
        "cifar", 10, 300, 1)
    assert recovery["recoverySeconds"] == 30.0


def test_wait_without_readable_events_still_follows_the_node_and_says_why(kube):
    compute = FakeCompute()
    done = ae.evict(compute, ae.plan(kube, node=k.name_of(GPU[1])), clock=lambda: 1000.0)
    kube.delete("v1", "Node", k.name_of(GPU[1]))
    ae.follow(kube, compute, done, None, events_error="no reader", clock=lambda: 1003.0)
    assert done[0]["recovery"] == {"nodeGoneAt": "1970-01-01T00:16:43.000Z", "nodeGoneSeconds": 3.0,
                                   "node": "Deleted", "instanceGone": True, "eventsError": "no reader"}


class Clock:
    """Simulated time: ``sleep`` advances it and lets the cluster act at the times a test gives."""

    def __init__(self, start: float, actions: dict[float, object]) -> None:
        self.now, self.actions = start, dict(actions)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for at in sorted(a for a in self.actions if a <= self.now):
            self.actions.pop(at)()


def test_wait_allows_an_eviction_that_takes_25_minutes_and_says_it_still_waits(kube):
    """Azure evicts within 30 minutes of simulateEviction: the default wait allows that, and says so as it goes."""
    compute, lines = FakeCompute(), []
    done = ae.evict(compute, ae.plan(kube, node=k.name_of(GPU[1])), clock=lambda: 1000.0)
    clock = Clock(1000.0, {1000.0 + 25 * 60: lambda: kube.delete("v1", "Node", k.name_of(GPU[1]))})
    ae.follow(kube, compute, done, None, clock=clock, sleep=clock.sleep, progress=lines.append)
    assert done[0]["recovery"]["nodeGoneSeconds"] == 1500.0 and done[0]["recovery"]["node"] == "Deleted"
    waiting = [line for line in lines if "still running" in line]
    assert len(waiting) >= 45, "a line every 30 s while it waits"
    assert "24m30s after the eviction was asked for" in waiting[-1] and "within 30 minutes" in waiting[-1]


def test_a_node_that_never_goes_ends_the_wait_with_what_to_look_at(kube):
    compute = FakeCompute()
    done = ae.evict(compute, ae.plan(kube, node=k.name_of(GPU[1])), clock=lambda: 1000.0)
    clock = Clock(1000.0, {})
    with pytest.raises(TimeoutError, match="still in service 40 minutes .* within 30 minutes.*kubectl get node"):
        ae.follow(kube, compute, done, None, clock=clock, sleep=clock.sleep)
    assert clock.now - 1000.0 >= ae.NODE_GONE_TIMEOUT


def _taint(kube, node: str, key: str, value: str | None, effect: str) -> None:
    found = kube.get("v1", "Node", node)
    found["spec"]["taints"] = [*found["spec"]["taints"], {"key": key, **({"value": value} if value else {}),
                                                          "effect": effect}]
    kube.seed(found)


def test_a_deallocated_node_is_followed_until_it_is_out_of_service(kube):
    """Eviction policy Deallocate: the VM stops and stays in the scale set, the node stays listed; the cloud
    provider taints it shutdown, then (its cache: up to 10 min) out of service, when PodGC deletes its pods."""
    node, lines = k.name_of(GPU[1]), []
    compute = FakeCompute()
    done = ae.evict(compute, ae.plan(kube, node=node), clock=lambda: 1000.0)
    compute.gone.clear()  # deallocated, not deleted: the instance is still there
    clock = Clock(1000.0, {
        1180.0: lambda: _taint(kube, node, ae.SHUTDOWN_TAINT, None, "NoSchedule"),
        1720.0: lambda: _taint(kube, node, ae.OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute")})
    ae.follow(kube, compute, done, None, clock=clock, sleep=clock.sleep, progress=lines.append)
    recovery = done[0]["recovery"]
    assert (recovery["node"], recovery["nodeGoneSeconds"], recovery["instanceGone"]) == ("Deallocated", 720.0, False)
    assert kube.get("v1", "Node", node) is not None
    assert any("was deallocated" in line and "up to 10 minutes" in line for line in lines)
    assert any("waiting for the out-of-service taint" in line for line in lines)
    assert lines[-1].endswith("was deallocated and is out of service (still listed) after 720s")


def test_dry_run_report_lists_the_targets():
    kube = FakeKube()
    kube.seed(GPU[2])
    plan = ae.plan(kube, pool="gpu")
    shown = ae.report("trainer", "ml-rg", plan, None)
    assert shown["dryRun"] is True and [t["instanceId"] for t in shown["targets"]] == ["2"]
    assert aks_eviction_table(shown)[0]["State"] == "would evict"
