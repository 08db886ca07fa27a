"""Our ElasticJob under the TorchElastic controller's exit-code rule (tests/support/fake_operator.py, modelled on
pytorch/elastic and the kubeflow/common it pins): a worker that ends Failed with a retryable code is re-created,
one that failed for good is not, and the controller sees the code only on the container it knows by name."""
from __future__ import annotations

import pytest

from azext_elastictrain.core.aks import manifests as m
from azext_elastictrain.core.spec import JobSpec
from tests.support import aks_objects as k
from tests.support.fake_kube import FakeKube

CLUSTER = m.InClusterSpec(identity_client_id="3f2a1b4c-5d6e-4f70-8192-a3b4c5d6e7f8",
                          checkpoint_url="https://ckptstore01.blob.core.windows.net/checkpoints")
JOB = JobSpec(name="cifar", script="scripts/train_cifar10.py", min_nodes=1, max_nodes=3, nodes=2)
IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
NS = "elastictrain"
EJ = ("elastic.pytorch.org/v1alpha1", "ElasticJob")


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube().with_operator_crd()
    for index in range(3):
        kube.seed(k.node(index))
    kube.apply(m.render_elastic_job(JOB, CLUSTER, IMAGE, run_id="cifar-0001"))
    kube.operator.reconcile()  # creates the pods (the scheduler binds them)
    kube.operator.reconcile()  # their start requeues the job: the status counts them
    return kube


def _workers(kube: FakeKube) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in kube.list("v1", "Pod", NS, "job-name=cifar")}


def test_the_operator_runs_one_pod_per_replica_with_its_rendezvous_arguments_first(kube) -> None:
    pods = _workers(kube)
    assert sorted(pods) == ["cifar-worker-0", "cifar-worker-1"]
    assert all(p["status"]["phase"] == "Running" and p["spec"]["restartPolicy"] == "Never" for p in pods.values())
    (container,) = pods["cifar-worker-0"]["spec"]["containers"]
    assert container["args"][:4] == ["--rdzv_backend=etcd",
                                     "--rdzv_endpoint=elastictrain-etcd.elastictrain.svc.cluster.local:2379",
                                     "--rdzv_id=cifar", "--nnodes=1:3"]
    assert kube.operator.errors == {}, "the controller found the worker's port: no step failed"
    assert kube.get("v1", "Service", "cifar-worker-1", NS)["spec"]["ports"] == [
        {"name": "elasticjob-port", "port": 10291}]
    job = kube.get(*EJ, "cifar", NS)
    assert job["status"]["replicaStatuses"] == {"Worker": {"active": 2}}
    assert [(c["type"], c["status"]) for c in job["status"]["conditions"]] == [("Running", "True")]


@pytest.mark.parametrize("code, reason", [(137, "OOMKilled"), (143, "Error"), (130, "Error")])
def test_a_worker_failed_with_a_retryable_code_is_replaced(kube, code, reason) -> None:
    """OOMKilled (137), a SIGTERM that ended the pod (143): the controller deletes the Failed pod and the next step
    creates it again, so the job gets its worker back."""
    old = _workers(kube)["cifar-worker-1"]
    kube.jobs.exit("cifar-worker-1", NS, code, reason)
    kube.operator.reconcile()  # the controller reads the code, deletes the pod, counts it failed
    assert "cifar-worker-1" not in _workers(kube)
    assert kube.get(*EJ, "cifar", NS)["status"]["replicaStatuses"] == {"Worker": {"active": 1, "failed": 1}}
    kube.operator.reconcile()  # ... and creates it again, and the scheduler places it
    new = _workers(kube)["cifar-worker-1"]
    assert new["metadata"]["uid"] != old["metadata"]["uid"] and new["status"]["phase"] == "Running"
    kube.operator.reconcile()
    status = kube.get(*EJ, "cifar", NS)["status"]
    assert status["replicaStatuses"] == {"Worker": {"active": 2}}
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Running", "True")]


@pytest.mark.parametrize("code", [1, 139])
def test_a_worker_that_failed_for_good_is_not_replaced(kube, code) -> None:
    """torchrun exits 1 once it gave up (ChildFailedError); 139 is a segfault: both are permanent."""
    kube.jobs.exit("cifar-worker-1", NS, code)
    kube.operator.reconcile()
    kube.operator.reconcile()
    assert _workers(kube)["cifar-worker-1"]["status"]["phase"] == "Failed"
    assert kube.get(*EJ, "cifar", NS)["status"]["replicaStatuses"] == {"Worker": {"active": 1, "failed": 1}}


def test_the_operator_reads_the_exit_code_only_from_the_elasticjob_worker_container() -> None:
    """The model's own rule, shown on a job whose container has another name (as ours had): an OOMKilled worker
    stays Failed and the job short of a worker, forever; and without the named port no status is written."""
    kube = FakeKube().with_operator_crd()
    kube.seed(k.node(0))
    job = m.render_elastic_job(JOB, CLUSTER, IMAGE)
    (container,) = job["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    container["name"] = "worker"
    kube.apply(job)
    kube.operator.reconcile()
    kube.jobs.exit("cifar-worker-0", NS, 137, "OOMKilled")
    for _ in range(3):
        kube.operator.reconcile()
    assert _workers(kube)["cifar-worker-0"]["status"]["phase"] == "Failed"
    assert kube.operator.errors == {"cifar": "ReconcileServices error failed to find the port"}
    assert "status" not in kube.get(*EJ, "cifar", NS)
