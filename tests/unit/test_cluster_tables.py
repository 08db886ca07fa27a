"""-o table rows for clusters: AKS clusters show their GPU Spot pool; local ones keep their columns."""
from __future__ import annotations

from azext_elastictrain._format import cluster_list_table, cluster_show_table

AKS = {"name": "spot-train", "type": "aks", "resourceGroup": "ml-rg", "location": "eastus",
       "provisioningState": "Succeeded", "storage": {"account": "etspottrain1234abcd"},
       "pools": [{"name": "system", "mode": "System", "priority": "Regular", "vmSize": "Standard_D4s_v5",
                  "count": 1, "minCount": 1, "maxCount": 3},
                 {"name": "gpu", "mode": "User", "priority": "Spot", "evictionPolicy": "Delete", "spotMaxPrice": -1,
                  "vmSize": "Standard_NC4as_T4_v3", "count": 0, "minCount": 0, "maxCount": 4}]}


def test_aks_show_row_has_health_per_component_and_the_spot_pool():
    shown = dict(AKS, health="Degraded", components={"etcd": {"state": "ok"}, "operator": {"state": "degraded"},
                                                     "nvidia-device-plugin": {"state": "ok"}})
    (row,) = cluster_show_table(shown)
    assert list(row) == ["Name", "ResourceGroup", "Location", "State", "Health", "Etcd", "Operator", "DevicePlugin",
                         "GpuSize", "Priority", "GpuNodes", "Storage"]
    assert (row["Health"], row["Operator"], row["Priority"], row["GpuNodes"]) == (
        "Degraded", "degraded", "Spot, Delete, on-demand cap", "0 (0-4)")


def test_aks_list_row_has_no_health_columns_and_shows_a_price_cap():
    pools = [dict(AKS["pools"][1], spotMaxPrice=0.35, evictionPolicy="Deallocate")]
    (row,) = cluster_list_table([dict(AKS, pools=pools)])
    assert "Health" not in row and row["Priority"] == "Spot, Deallocate, max $0.35/h"


def test_local_rows_are_unchanged():
    (row,) = cluster_list_table([{"name": "local", "type": "local", "health": "Healthy",
                                  "components": {"etcd": {"state": "running"}}}])
    assert list(row) == ["Name", "Type", "Health", "Etcd", "Azurite", "ScheduledEvents", "Created"]
