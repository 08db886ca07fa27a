"""backends.aks.jobs: jobs on an AKS cluster over a fake Arm and FakeKube (no network)."""
from __future__ import annotations

import pytest

from azext_elastictrain.backends.aks.jobs import AksJobs, GpuPoolMissing, JobExists
from azext_elastictrain.backends.aks.session import AksSession, gpu_spot_pool
from azext_elastictrain.core.errors import ClusterNotFound, JobNotFound
from azext_elastictrain.core.spec import JobSpec, SpecError
from tests.support import aks_objects as k
from tests.support.fake_kube import FakeKube

IMAGE = "myregistry.azurecr.io/elastictrain:0.1.0"
SYSTEM = {"name": "system", "mode": "System", "vmSize": "Standard_D4s_v5"}
GPU = {"name": "gpu", "mode": "User", "vmSize": "Standard_NC4as_T4_v3", "scaleSetPriority": "Spot",
       "nodeTaints": ["sku=gpu:NoSchedule"]}
JOB = JobSpec(name="cifar", script="/app/train.py", min_nodes=1, max_nodes=2)


class FakeArm:
    subscription, tenant, storage_suffix = "sub", "tenant", "core.windows.net"

    def __init__(self, pools, blob="https://acct1.blob.core.windows.net/") -> None:
        self.cluster = {"name": "trainer", "tags": {"elastictrain": "1", "elastictrain-storage": "acct1"},
                        "properties": {"agentPoolProfiles": pools}}
        self.account = {"properties": {"primaryEndpoints": {"blob": blob}}}

    def get(self, kind, ref):
        if kind == "cluster":
            return self.cluster if ref["name"] == "trainer" else None
        return self.account if kind == "storage_account" and ref["name"] == "acct1" else None

    def user_kubeconfig(self, resource_group, cluster):
        return b"in memory"


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube().with_operator_crd()


def _jobs(kube, pools=(SYSTEM, GPU), blob="https://acct1.blob.core.windows.net/", cluster="trainer") -> AksJobs:
    return AksJobs(AksSession(FakeArm(list(pools), blob), "rg", cluster, kube_connect=lambda _: kube))


def test_the_gpu_pool_is_a_spot_pool_with_gpus() -> None:
    assert gpu_spot_pool({"properties": {"agentPoolProfiles": [SYSTEM, GPU]}}) == GPU
    regular_gpu = {**GPU, "scaleSetPriority": "Regular"}
    assert gpu_spot_pool({"properties": {"agentPoolProfiles": [SYSTEM, regular_gpu]}}) is None
    spot_cpu = {**GPU, "vmSize": "Standard_D4s_v5", "nodeTaints": []}
    assert gpu_spot_pool({"properties": {"agentPoolProfiles": [spot_cpu]}}) is None


def test_blobs_are_where_the_storage_account_says(kube) -> None:
    site = _jobs(kube, blob="https://127.0.0.1:10000/devstoreaccount1/").session.site()
    assert site.job_url("cifar") == "https://127.0.0.1:10000/devstoreaccount1/checkpoints/cifar"
    assert _jobs(kube).checkpoint_url("cifar") == \
        "https://acct1.blob.core.windows.net/checkpoints/cifar"
    sovereign = _jobs(kube, blob="https://acct1.blob.core.chinacloudapi.cn/").session.site()
    assert sovereign.job_url("cifar") == "https://acct1.blob.core.chinacloudapi.cn/checkpoints/cifar"


def test_an_unknown_cluster_is_not_found(kube) -> None:
    with pytest.raises(ClusterNotFound):
        _jobs(kube, cluster="other").session.site()


def test_run_applies_the_job_once_and_the_dry_run_nothing(kube) -> None:
    planned = _jobs(kube).plan_job(JOB, IMAGE, gpus_per_node=2)
    assert planned.request.job_object == planned.shown["object"]
    assert planned.shown["object"]["spec"]["replicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert kube.calls == []
    shown = _run(_jobs(kube))
    assert shown["state"] == "Pending" and ("apply", "ElasticJob", "elastictrain", "cifar") in kube.calls
    with pytest.raises(JobExists):
        _run(_jobs(kube))


def test_run_refuses_a_cluster_without_the_gpu_spot_pool(kube) -> None:
    with pytest.raises(GpuPoolMissing):
        _run(_jobs(kube, pools=[SYSTEM]))
    assert kube.calls == []


@pytest.mark.parametrize("script", ["", "--steps", "train.py --steps 3"])
def test_a_script_in_the_image_must_be_a_path(kube, script) -> None:
    with pytest.raises(SpecError):
        _jobs(kube).plan_job(JobSpec(name="cifar", script=script), IMAGE, gpus_per_node=1)


def _run(jobs: AksJobs) -> dict:
    return jobs.submit_job(jobs.plan_job(JOB, IMAGE, gpus_per_node=1).request)


def _seed(kube) -> None:
    _run(_jobs(kube))
    kube.seed(k.worker_pod("cifar", 0, "node-a"))
    kube.seed(k.worker_pod("cifar", 1, None, phase="Pending"))
    kube.set_logs("cifar-worker-0", "elastictrain", "a\nb\nc\n")


def test_logs_come_from_scheduled_workers_by_rank_or_pod(kube) -> None:
    _seed(kube)
    [(label, lines)] = _jobs(kube).log_streams("cifar", tail=2)
    assert label == "cifar-worker-0 (rank 0)" and list(lines) == ["b", "c"]
    [(_, lines)] = _jobs(kube).log_streams("cifar", pod="cifar-worker-0")
    assert list(lines) == ["a", "b", "c"]
    with pytest.raises(JobNotFound):
        _jobs(kube).log_streams("cifar", pod="cifar-worker-9")
    with pytest.raises(SpecError, match="not scheduled yet"):
        _jobs(kube).log_streams("cifar", rank=1)
    with pytest.raises(JobNotFound):
        _jobs(kube).log_streams("nosuchjob")


def test_delete_confirms_then_deletes_the_elastic_job_only(kube) -> None:
    _seed(kube)
    planned = _jobs(kube).plan_delete("cifar")
    assert planned.shown["dryRun"] and planned.shown["checkpoints"] == "kept"
    assert kube.get("elastic.pytorch.org/v1alpha1", "ElasticJob", "cifar", "elastictrain")
    _jobs(kube).delete(planned.request)
    assert kube.get("elastic.pytorch.org/v1alpha1", "ElasticJob", "cifar", "elastictrain") is None


def test_a_jobs_events_are_those_of_its_current_run(kube) -> None:
    _run(_jobs(kube))
    created = 1767225600.0  # FakeKube's creationTimestamp, 2026-01-01T00:00:00Z
    jobs = _jobs(kube)
    jobs.session.events = lambda: {"cifar": [{"time": created - 60, "event": "started"},  # an earlier run's
                                             {"time": created + 5, "event": "started"}]}.__getitem__
    assert jobs.job_events("cifar") == [{"time": created + 5, "event": "started"}]
    with pytest.raises(JobNotFound):
        jobs.job_events("nosuchjob")
