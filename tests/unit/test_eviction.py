"""core.aks.eviction: AKS nodes resolve to VMSS instances; plans pick Spot nodes only, and bad input evicts nothing."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from azext_elastictrain.core.aks import eviction as ev
from tests.support import aks_objects as k

SUB = k.SUBSCRIPTION
COMPUTE_EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "arm-examples"  # official, see its README


# -- providerID ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider_id, expected", [
    (f"azure:///subscriptions/{SUB}/resourceGroups/MC_ml-rg_trainer_eastus/providers/Microsoft.Compute/"
     "virtualMachineScaleSets/aks-gpu-31415926-vmss/virtualMachines/0",
     (SUB, "MC_ml-rg_trainer_eastus", "aks-gpu-31415926-vmss", "0")),
    # AKS writes the node resource group in lower case, and the path segments vary in case
    (f"azure:///subscriptions/{SUB}/resourcegroups/mc_ml-rg_trainer_eastus/providers/microsoft.compute/"
     "virtualmachinescalesets/aks-gpu-31415926-vmss/virtualmachines/17",
     (SUB, "mc_ml-rg_trainer_eastus", "aks-gpu-31415926-vmss", "17")),
    (f"AZURE:///SUBSCRIPTIONS/{SUB}/RESOURCEGROUPS/MC_RG_C_WESTEUROPE/PROVIDERS/MICROSOFT.COMPUTE/"
     "VIRTUALMACHINESCALESETS/aks-spot-1-vmss/VIRTUALMACHINES/1234",
     (SUB, "MC_RG_C_WESTEUROPE", "aks-spot-1-vmss", "1234")),
    # a custom node resource group (--node-resource-group) with dots and parentheses
    (f"azure:///subscriptions/{SUB}/resourceGroups/team.nodes(gpu)/providers/Microsoft.Compute/"
     "virtualMachineScaleSets/aks-gpu-1-vmss/virtualMachines/3",
     (SUB, "team.nodes(gpu)", "aks-gpu-1-vmss", "3")),
])
def test_aks_provider_ids_resolve_to_their_vmss_instance(provider_id, expected) -> None:
    instance = ev.parse_provider_id(provider_id)
    assert (instance.subscription, instance.resource_group, instance.vmss, instance.instance_id) == expected
    assert instance.resource_id.lower() == provider_id[len("azure://"):].lower()


def _example_vm_ids() -> list[str]:
    ids = set()
    for path in sorted(COMPUTE_EXAMPLES.rglob("VirtualMachineScaleSetVM_*.json")):
        body = json.loads(path.read_text(encoding="utf-8"))
        for response in body.get("responses", {}).values():
            payload = response.get("body") or {}
            for vm in payload.get("value", [payload]):
                if "/virtualMachines/" in str(vm.get("id")):
                    ids.add(vm["id"])
    return sorted(ids)


def test_the_vm_ids_of_the_official_vmss_examples_parse_as_provider_ids() -> None:
    ids = _example_vm_ids()
    assert ids, "the VMSS VM examples (List, Get) carry VM resource ids"
    for resource_id in ids:
        instance = ev.parse_provider_id("azure://" + resource_id)
        assert instance.resource_id == resource_id
        assert (instance.vmss, instance.instance_id) == ("myVirtualMachineScaleSet", "0")


@pytest.mark.parametrize("provider_id, says", [
    (f"azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/aks-vm-1",
     "standalone VM"),
    ("aws:///us-east-1a/i-0123456789abcdef0", "not an Azure VM"),
    ("kind://docker/kind/kind-worker", "not an Azure VM"),
    ("", "no providerID"),
    (None, "no providerID"),
    ("azure:///subscriptions//resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/v/"
     "virtualMachines/0", "does not understand"),
    (f"azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/v/"
     "virtualMachines/abc", "does not understand"),
    (f"azure:///subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/v/"
     "virtualMachines/0/extra", "does not understand"),
    (f"/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/v/"
     "virtualMachines/0", "without a scheme"),
    ("azure://garbage", "does not understand"),
])
def test_what_is_not_a_vmss_instance_is_refused_with_a_reason(provider_id, says) -> None:
    with pytest.raises(ev.ProviderIdError, match=says):
        ev.parse_provider_id(provider_id, "aks-x-0")


def test_scheduled_events_name_the_instance_vmss_underscore_id() -> None:
    instance = ev.parse_provider_id(k.provider_id(k.GPU_VMSS, 12))
    assert ev.scheduled_events_name(instance) == "aks-gpu-31415926-vmss_12"


def test_an_evicted_instance_is_no_longer_listed() -> None:
    class Vm:  # the SDK's VirtualMachineScaleSetVM, as far as it matters here
        def __init__(self, instance_id):
            self.instance_id = instance_id

    assert ev.instance_listed([Vm("0"), Vm("2")], "2")
    assert not ev.instance_listed([Vm("0")], "2")
    assert ev.instance_listed([{"instanceId": "0", "name": "myVirtualMachineScaleSet_0"}], "0")
    assert not ev.instance_listed([], "0")


# -- nodes and pods ------------------------------------------------------------------------------------------

def test_spot_comes_from_the_aks_priority_label() -> None:
    assert ev.is_spot(k.node(0)) and ev.node_priority(k.node(0)) == "Spot"
    system = k.node(0, pool="system", spot=False)
    assert not ev.is_spot(system) and ev.node_priority(system) == "Regular"
    assert ev.node_pool(system) == "system"


def test_a_workers_rank_comes_from_the_operators_labels_or_its_pod_name() -> None:
    pod = k.worker_pod("cifar", 3, "n")
    assert ev.worker_rank(pod) == 3 and ev.pod_job(pod) == "cifar"
    pod["metadata"]["labels"] = {"elastictrain.azure.com/job": "cifar"}  # labels lost: the name still says
    assert ev.worker_rank(pod) == 3
    pod["metadata"]["labels"] = {"training.kubeflow.org/job-name": "cifar",
                                 "training.kubeflow.org/replica-type": "worker",
                                 "training.kubeflow.org/replica-index": "5"}  # newer kubeflow/common
    assert ev.worker_rank(pod) == 5
    other = k.worker_pod("cifar", 1, "n")
    other["metadata"]["labels"]["replica-type"] = "master"
    assert ev.worker_rank(other) is None


# -- plans ---------------------------------------------------------------------------------------------------

GPU = [k.node(i) for i in range(3)]
SYSTEM = [k.node(0, pool="system", spot=False)]
NODES = GPU + SYSTEM
PODS = [k.worker_pod("cifar", 0, k.name_of(GPU[0])), k.worker_pod("cifar", 1, k.name_of(GPU[1])),
        k.worker_pod("bert", 0, k.name_of(GPU[1])), k.worker_pod("bert", 1, None, phase="Pending")]


def test_plan_by_node_names_its_instance_and_the_ranks_it_hits() -> None:
    plan = ev.plan_evictions(NODES, PODS, node=k.name_of(GPU[1]))
    (target,) = plan.to_dict()["targets"]
    assert target == {
        "node": "aks-gpu-31415926-vmss000001", "pool": "gpu", "subscription": SUB,
        "resourceGroup": k.NODE_RG, "vmss": k.GPU_VMSS, "instanceId": "1",
        "scheduledEventsName": f"{k.GPU_VMSS}_1",
        "pods": [{"pod": "bert-worker-0", "job": "bert", "rank": 0}, {"pod": "cifar-worker-1", "job": "cifar",
                                                                      "rank": 1}],
        "ranks": [0, 1],
    }
    assert plan.by == {"node": k.name_of(GPU[1])}


def test_plan_by_job_takes_every_node_its_workers_run_on() -> None:
    plan = ev.plan_evictions(NODES, PODS, job="cifar")
    assert [t.node for t in plan.targets] == [k.name_of(GPU[0]), k.name_of(GPU[1])]
    assert [t.instance.instance_id for t in plan.targets] == ["0", "1"]


def test_plan_by_rank_takes_the_node_of_that_worker() -> None:
    (target,) = ev.plan_evictions(NODES, PODS, job="cifar", rank=1).targets
    assert target.node == k.name_of(GPU[1]) and 1 in target.ranks


def test_plan_by_pool_takes_count_spot_nodes() -> None:
    plan = ev.plan_evictions(NODES, PODS, pool="gpu", count=2)
    assert [t.node for t in plan.targets] == [k.name_of(GPU[0]), k.name_of(GPU[1])]
    assert len(ev.plan_evictions(NODES, PODS, pool="gpu").targets) == 1  # count defaults to one
    picked = ev.plan_evictions(NODES, PODS, pool="gpu", count=2, rng=random.Random(7)).targets
    assert len({t.node for t in picked}) == 2 and {t.node for t in picked} <= {k.name_of(n) for n in GPU}


def test_a_node_with_no_training_is_still_evictable_and_hits_nothing() -> None:
    (target,) = ev.plan_evictions(NODES, PODS, node=k.name_of(GPU[2])).targets
    assert target.pods == () and target.ranks == ()


def _deallocated(node: dict) -> dict:
    """A node of a Deallocate pool after its eviction: still listed, its VM stopped (the cloud provider's taint)."""
    stopped = json.loads(json.dumps(node))
    stopped["spec"]["taints"].append({"key": "node.cloudprovider.kubernetes.io/shutdown", "effect": "NoSchedule"})
    return stopped


def test_a_deallocated_node_is_not_evicted_again() -> None:
    """Its VM is stopped: there is nothing left to evict, and by pool a running node is taken instead."""
    nodes = [_deallocated(GPU[0]), *GPU[1:], *SYSTEM]
    with pytest.raises(ev.EvictionPlanError, match="is already evicted: its VM was deallocated"):
        ev.plan_evictions(nodes, PODS, node=k.name_of(GPU[0]))
    assert [t.node for t in ev.plan_evictions(nodes, PODS, pool="gpu", count=2).targets] == [
        k.name_of(GPU[1]), k.name_of(GPU[2])]
    with pytest.raises(ev.EvictionPlanError, match="no running Spot node: its VMs were deallocated"):
        ev.plan_evictions([_deallocated(n) for n in GPU], PODS, pool="gpu")


def test_a_job_whose_node_is_already_gone_plans_what_is_left() -> None:
    pods = PODS + [k.worker_pod("cifar", 2, "aks-gpu-31415926-vmss000009")]  # its node was just evicted
    assert [t.node for t in ev.plan_evictions(NODES, pods, job="cifar").targets] == [
        k.name_of(GPU[0]), k.name_of(GPU[1])]
    with pytest.raises(ev.EvictionTargetNotFound, match="gone from the cluster"):
        ev.plan_evictions(NODES, pods, job="cifar", rank=2)


# -- bad input: an error that says what and how, nothing planned ---------------------------------------------

@pytest.mark.parametrize("ask, error, says", [
    (dict(node="aks-gpu-nope"), ev.EvictionTargetNotFound,
     "no node 'aks-gpu-nope' .*its nodes: aks-gpu-31415926-vmss000000"),
    (dict(node=k.name_of(SYSTEM[0])), ev.EvictionPlanError, "is a Regular \\(not Spot\\) node of pool 'system'"),
    (dict(job="nope"), ev.EvictionTargetNotFound, "no job 'nope' .*jobs with workers: bert, cifar"),
    (dict(job="cifar", rank=7), ev.EvictionTargetNotFound, "job 'cifar' has no rank 7 \\(its ranks: 0, 1\\)"),
    (dict(job="bert", rank=1), ev.EvictionPlanError,
     "rank 1 of job 'bert' is not on a node now \\(bert-worker-1: Pending\\)"),
    (dict(pool="gpu2"), ev.EvictionTargetNotFound, "no node pool 'gpu2' \\(its pools: gpu, system\\)"),
    (dict(pool="system"), ev.EvictionPlanError, "pool 'system' has no Spot nodes .*Regular"),
    (dict(pool="gpu", count=4), ev.EvictionPlanError, "--count 4: pool 'gpu' has 3 Spot node"),
    (dict(pool="gpu", count=0), ev.EvictionPlanError, "--count must be a whole number of at least 1"),
    (dict(job="cifar", rank=-1), ev.EvictionPlanError, "--rank must be a whole number of at least 0"),
    (dict(), ev.EvictionPlanError, "exactly one of --node"),
    (dict(node=k.name_of(GPU[0]), job="cifar"), ev.EvictionPlanError, "exactly one of .*got --node, --job"),
    (dict(node=k.name_of(GPU[0]), rank=0), ev.EvictionPlanError, "--rank picks a worker of a job"),
    (dict(job="cifar", count=1), ev.EvictionPlanError, "--count picks nodes of a pool"),
])
def test_bad_input_is_refused_before_anything_is_evicted(ask, error, says) -> None:
    with pytest.raises(error, match=says):
        ev.plan_evictions(NODES, PODS, **ask)


def test_errors_are_spec_errors_so_the_cli_maps_them_to_az_errors() -> None:
    from azext_elastictrain.core.spec import SpecError

    assert issubclass(ev.EvictionTargetNotFound, ev.EvictionPlanError)
    assert issubclass(ev.ProviderIdError, ev.EvictionPlanError)
    assert issubclass(ev.EvictionPlanError, SpecError)


def test_a_job_with_a_worker_on_a_regular_node_is_refused_as_a_whole() -> None:
    pods = PODS + [k.worker_pod("cifar", 2, k.name_of(SYSTEM[0]))]
    with pytest.raises(ev.EvictionPlanError, match="is a Regular"):
        ev.plan_evictions(NODES, pods, job="cifar")


def test_a_cluster_without_the_gpu_pool_is_refused() -> None:
    with pytest.raises(ev.EvictionTargetNotFound, match="no node pool 'gpu' \\(its pools: system\\)"):
        ev.plan_evictions(SYSTEM, [], pool="gpu")
    # ARM knows the pool, scaled to zero nodes: a different story
    with pytest.raises(ev.EvictionPlanError, match="pool 'gpu' has no nodes now"):
        ev.plan_evictions(SYSTEM, [], pool="gpu", pools=["system", "gpu"])


def test_a_spot_node_not_backed_by_a_scale_set_is_refused() -> None:
    vm_node = k.node(5, provider=f"azure:///subscriptions/{SUB}/resourceGroups/{k.NODE_RG}/providers/"
                     "Microsoft.Compute/virtualMachines/aks-gpu-vm-5")
    with pytest.raises(ev.ProviderIdError, match="node 'aks-gpu-31415926-vmss000005' is a standalone VM"):
        ev.plan_evictions([vm_node], [], node=k.name_of(vm_node))
