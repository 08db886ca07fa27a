"""Entra ID-only clusters in the AKS backend: who becomes the Kubernetes admin, and the wait for that role to
reach the cluster (Azure documents up to 5 minutes), against a fake ARM and the in-memory Kubernetes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from azext_elastictrain.backends.aks.cluster import _Context
from azext_elastictrain.backends.aks.cluster_create import ClusterCreation
from azext_elastictrain.clients.kube import KubeError
from azext_elastictrain.core.spec import ClusterSpec
from tests.support.fake_kube import FakeKube

SPEC = ClusterSpec("c1", "rg1", "eastus")


class SignedIn:
    subscription, tenant, storage_suffix = "sub", "tenant", "core.windows.net"

    def __init__(self) -> None:
        self.asked = 0

    def signed_in_principal(self):
        self.asked += 1
        return "11111111-2222-3333-4444-555555555555", "User"

    def user_kubeconfig(self, resource_group, cluster):
        return b"in memory"


class RbacNotThereYet(FakeKube):
    """Kubernetes answering 403 to the first ``refusals`` applies, as before a role assignment propagated."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    def apply(self, obj: dict) -> dict:
        if self.refusals:
            self.refusals -= 1
            raise KubeError("apply failed: HTTP 403 Forbidden", status=403, reason="Forbidden")
        return super().apply(obj)


def _clusters(kube, arm=None, wait=5.0):
    return ClusterCreation(arm or SignedIn(), kube_connect=lambda _: kube, poll_seconds=0.01, rbac_wait=wait)


def test_the_creator_is_the_admin_unless_another_principal_is_named_and_nobody_with_local_accounts() -> None:
    arm = SignedIn()
    clusters = _clusters(FakeKube(), arm)
    assert clusters._admin(SPEC, True) == ("11111111-2222-3333-4444-555555555555", "User")
    other = "00000000-0000-0000-0000-00000000000a"
    assert clusters._admin(replace(SPEC, admin_principal=other), True) == (other, None)
    assert clusters._admin(replace(SPEC, local_accounts=True), True) is None
    assert clusters._admin(SPEC, False)[0].startswith("<") and arm.asked == 1  # a dry run without a login


def test_a_403_before_the_admin_role_reached_the_cluster_is_waited_out() -> None:
    kube = RbacNotThereYet(refusals=2)
    ctx = _Context(SPEC, "sub", "72f988bf-0000-4000-8000-000000000001", admin=("oid", "User"))
    applied = _clusters(kube)._install(ctx)
    assert applied and kube.refusals == 0 and kube.get("v1", "Namespace", "elastictrain") is not None


@pytest.mark.parametrize("admin", [("oid", "User"), None])
def test_a_403_that_lasts_is_an_error(admin) -> None:
    kube = RbacNotThereYet(refusals=10**6)
    ctx = _Context(SPEC, "sub", "72f988bf-0000-4000-8000-000000000001", admin=admin)
    with pytest.raises(KubeError) as caught:
        _clusters(kube, wait=0.05)._install(ctx)
    assert caught.value.status == 403
    if admin is None:  # no role was assigned by this create: nothing to wait for
        assert kube.refusals == 10**6 - 1


class _Session:
    def __init__(self, kube) -> None:
        self._kube = kube

    def kube(self):
        return self._kube

    def site(self):
        from types import SimpleNamespace

        return SimpleNamespace(spec=SimpleNamespace(namespace="elastictrain"))


class Watched(FakeKube):
    """A FakeKube that also watches: the job as it is, then (after ``change_after`` s) a change."""

    def __init__(self, change_after: float | None) -> None:
        super().__init__()
        self.with_operator_crd()
        self.change_after, self.watched = change_after, []

    def watch(self, api_version, kind, name, namespace=None, timeout=60.0):
        import time

        self.watched.append((kind, name, timeout))
        yield "ADDED", self.get(api_version, kind, name, namespace)
        if self.change_after is not None and self.change_after < timeout:
            time.sleep(self.change_after)
            yield "MODIFIED", self.get(api_version, kind, name, namespace)
        else:
            time.sleep(timeout)


@pytest.mark.parametrize("change_after, least, most", [(0.2, 0.15, 1.5), (None, 1.9, 4)])
def test_job_wait_sleeps_until_the_job_changes_or_the_interval_ends(change_after, least, most) -> None:
    import time

    from azext_elastictrain.backends.aks.jobs import AksJobs

    kube = Watched(change_after)
    kube.seed({"apiVersion": "elastic.pytorch.org/v1alpha1", "kind": "ElasticJob",
               "metadata": {"name": "cifar", "namespace": "elastictrain"}})
    started = time.monotonic()
    AksJobs(_Session(kube)).wait_for_change("cifar", 2.0)
    assert least <= time.monotonic() - started <= most
    assert kube.watched == [("ElasticJob", "cifar", 2.0)]
