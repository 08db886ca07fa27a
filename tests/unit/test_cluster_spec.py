"""ClusterSpec: bad input is refused before any request, with a message that says how to fix it."""
from __future__ import annotations

import re

import pytest

from azext_elastictrain.core.spec import ClusterSpec, SpecError, default_storage_account, is_gpu_size_name, spot_price


def test_defaults_are_valid_and_name_a_current_spot_gpu():
    spec = ClusterSpec("spot-train", "ml-rg")
    assert spec.gpu_vm_size == "Standard_NC4as_T4_v3" and is_gpu_size_name(spec.gpu_vm_size)
    assert (spec.min_count, spec.max_count, spec.spot_max_price, spec.eviction_policy) == (0, 3, -1.0, "Delete")


@pytest.mark.parametrize("cluster", ["a", "My_Cluster-1", "x" * 63, "9lives"])
def test_aks_names_that_are_allowed(cluster):
    ClusterSpec(cluster, "rg")


@pytest.mark.parametrize("cluster", ["", "-lead", "trail-", "_x", "x" * 64, "has space", "dot.ted", "ü"])
def test_aks_names_that_are_refused(cluster):
    with pytest.raises(SpecError, match="invalid cluster name"):
        ClusterSpec(cluster, "rg")


@pytest.mark.parametrize("group", ["", "ends.", "x" * 91, "no/slash"])
def test_resource_group_names_that_are_refused(group):
    with pytest.raises(SpecError, match="invalid resource group name"):
        ClusterSpec("c", group)


@pytest.mark.parametrize("account", ["ab", "x" * 25, "Upper1", "with-dash", "under_score"])
def test_storage_account_names_that_are_refused(account):
    with pytest.raises(SpecError, match="invalid storage account name"):
        ClusterSpec("c", "rg", storage_account=account)


@pytest.mark.parametrize("group, cluster", [("rg", "c"), ("ML-RG", "A_Very-Long_Cluster-Name-" + "x" * 38)])
def test_default_storage_account_is_valid_stable_and_differs_per_cluster(group, cluster):
    name = default_storage_account(group, cluster)
    assert re.fullmatch(r"[a-z0-9]{3,24}", name)
    assert name == default_storage_account(group, cluster) == ClusterSpec(cluster, group).storage_account_name
    assert name != default_storage_account(group + "2", cluster) != default_storage_account(group, cluster + "2")


def test_a_current_gpu_size_is_accepted_without_a_list_the_region_decides():
    ClusterSpec("c", "rg", gpu_vm_size="Standard_ND96isr_H200_v5")  # core.aks.preflight checks the region


@pytest.mark.parametrize("size", ["NC6", "Standard_NC4as T4", ""])
def test_a_gpu_size_that_is_no_size_name_is_refused(size):
    with pytest.raises(SpecError, match="invalid GPU VM size.*Standard_NC4as_T4_v3"):
        ClusterSpec("c", "rg", gpu_vm_size=size)


def test_gpu_family_names():
    assert [is_gpu_size_name(s) for s in ("Standard_ND96isr_H200_v5", "Standard_NV36ads_A10_v5",
                                          "Standard_D4s_v5", None)] == [True, True, False, False]


@pytest.mark.parametrize("lo, hi, message", [(5, 2, "--min-count 5 is more than --max-count 2"),
                                             (-1, 2, "--min-count must be"), (0, 0, "--max-count must be"),
                                             (0, 1001, "--max-count must be")])
def test_autoscale_bounds(lo, hi, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        ClusterSpec("c", "rg", min_count=lo, max_count=hi)


@pytest.mark.parametrize("value, price", [("-1", -1.0), (-1, -1.0), ("0.5", 0.5), ("0.12345", 0.12345),
                                          ("3", 3.0), (" 1.00000 ", 1.0)])
def test_spot_prices_azure_takes(value, price):
    assert spot_price(value) == price


@pytest.mark.parametrize("value, message", [("0.123456", "more than 5 decimals"), ("0", "must be -1"),
                                            ("-0.5", "must be -1"), ("-2", "must be -1"), ("abc", "not a number"),
                                            ("nan", "not a number"), ("inf", "not a number")])
def test_spot_prices_azure_refuses(value, message):
    with pytest.raises(SpecError, match=message):
        ClusterSpec("c", "rg", max_price=value)


@pytest.mark.parametrize("field, value, message", [
    ("eviction_policy", "Stop", "unknown eviction policy"), ("storage_sku", "Standard_XYZ", "unknown storage SKU"),
    ("kubernetes_version", "latest", "invalid Kubernetes version"), ("location", "East US", "invalid location"),
    ("system_vm_size", "big", "invalid system pool VM size"), ("node_labels", (("bad key!", "v"),), "invalid node label"),
    ("engine", "volcano", "unknown engine 'volcano'"),
])
def test_other_fields(field, value, message):
    with pytest.raises(SpecError, match=message):
        ClusterSpec("c", "rg", **{field: value})


def test_k8s_job_clusters_need_kubernetes_1_31_when_a_version_is_asked():
    ClusterSpec("c", "rg", engine="k8s-job")  # AKS's default version is newer
    ClusterSpec("c", "rg", engine="k8s-job", kubernetes_version="1.31")
    ClusterSpec("c", "rg", kubernetes_version="1.30")  # the operator runs on it
    with pytest.raises(SpecError, match="needs Kubernetes 1.31 or later, and the cluster runs 1.30"):
        ClusterSpec("c", "rg", engine="k8s-job", kubernetes_version="1.30")


@pytest.mark.parametrize("fields, message", [
    ({"admin_principal": "alice@contoso.com"}, "invalid --admin-principal"),
])
def test_access_options_are_checked(fields, message):
    from azext_elastictrain.core.spec import ClusterSpec, SpecError

    with pytest.raises(SpecError, match=message):
        ClusterSpec("c1", "rg1", **fields)
    assert ClusterSpec("c1", "rg1", admin_principal="00000000-0000-0000-0000-000000000001")
