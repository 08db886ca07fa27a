"""core.aks.preflight on the Resource SKUs and Usage answers of the official examples (tests/data/arm-examples),
extended with GPU sizes as the ARM test server serves them (tests.support.arm_server.region_skus)."""
from __future__ import annotations

import pytest

from azext_elastictrain.core.aks import preflight
from azext_elastictrain.core.aks.preflight import PreflightError
from tests.support.arm_server import region_skus, region_usages


def skus(location: str = "eastus") -> list[dict]:
    return region_skus(location)


def entry(found: list[dict], name: str) -> dict:
    return next(s for s in found if s["name"] == name)


def quota(usages: list[dict], limit: int, used: int) -> list[dict]:
    for usage in usages:
        if usage["name"]["value"] == "lowPriorityCores":
            usage.update(limit=limit, currentValue=used)
    return usages


def test_the_official_example_is_read_as_azure_means_it():
    sizes = preflight.vm_sizes(region_skus("westus"), "westus")
    a0, a1 = sizes["standard_a0"], sizes["standard_a1"]
    assert (a0.vcpus, a0.spot_capable, a0.gpus, a0.zones) == (1, False, 0, ("2", "1"))
    assert (a1.vcpus, a1.spot_capable, a1.available) == (1, True, True)
    assert preflight.vm_sizes(region_skus("westus"), "eastus") == {}, "another region's SKUs are not this one's"


def test_a_current_size_the_region_has_passes_with_its_vcpus_and_quota():
    result = preflight.check("Standard_ND96isr_H200_v5", 1, "eastus", skus(), region_usages())
    assert (result.vcpus, result.spot_vcpus_needed, result.spot_vcpus_free, result.warnings) == (96, 96, 100, [])


def test_a_size_the_region_does_not_offer_is_refused_naming_ones_it_does():
    found = [s for s in skus() if s["name"] != "Standard_NC24ads_A100_v4"]
    with pytest.raises(PreflightError, match="'Standard_NC24ads_A100_v4' is not offered in region 'eastus'") as ex:
        preflight.check("Standard_NC24ads_A100_v4", 3, "eastus", found, region_usages())
    assert "Standard_NC4as_T4_v3" in ex.value.recommendation and "A100" not in ex.value.recommendation


def test_a_size_without_spot_is_refused_and_not_offered_instead():
    found = skus()
    caps = entry(found, "Standard_NC40ads_H100_v5")["capabilities"]
    next(c for c in caps if c["name"] == "LowPriorityCapable")["value"] = "False"
    with pytest.raises(PreflightError, match="cannot run as Spot.*LowPriorityCapable") as ex:
        preflight.check("Standard_NC40ads_H100_v5", 3, "eastus", found, region_usages())
    assert "NC40ads" not in ex.value.recommendation and "Standard_ND96isr_H200_v5" in ex.value.recommendation


def test_a_size_without_gpus_is_refused():
    with pytest.raises(PreflightError, match="has no GPU"):
        preflight.check("Standard_D4s_v5", 3, "eastus", skus(), region_usages())


@pytest.mark.parametrize("restriction, refused", [
    ({"type": "Location", "values": ["eastus"], "restrictionInfo": {"locations": ["eastus"]}}, True),
    ({"type": "Zone", "values": ["eastus"], "restrictionInfo": {"locations": ["eastus"], "zones": ["1", "2", "3"]}},
     True),
    ({"type": "Zone", "values": ["eastus"], "restrictionInfo": {"locations": ["eastus"], "zones": ["1"]}}, False),
])
def test_restricted_for_the_subscription_in_the_region_or_every_zone_is_refused(restriction, refused):
    found = skus()
    entry(found, "Standard_NC4as_T4_v3")["restrictions"] = [{**restriction, "reasonCode": "NotAvailableForSubscription"}]
    if refused:
        with pytest.raises(PreflightError, match="not available to this subscription.*NotAvailableForSubscription or QuotaId"):
            preflight.check("Standard_NC4as_T4_v3", 3, "eastus", found, region_usages())
    else:
        assert preflight.check("Standard_NC4as_T4_v3", 3, "eastus", found, region_usages()).warnings == []


def test_a_size_closed_to_the_subscriptions_offer_type_is_refused():
    found = skus()
    entry(found, "Standard_NC4as_T4_v3")["restrictions"] = [{
        "type": "Location", "values": ["eastus"], "restrictionInfo": {"locations": ["eastus"]}, "reasonCode": "QuotaId"}]
    with pytest.raises(PreflightError, match="not available to this subscription in this region"):
        preflight.check("Standard_NC4as_T4_v3", 3, "eastus", found, region_usages())


def test_sizes_are_matched_without_case_as_arm_does():
    assert preflight.check("standard_nc4as_t4_v3", 3, "EastUS", skus(), region_usages()).gpu_vm_size == \
        "Standard_NC4as_T4_v3"


def test_short_spot_quota_is_a_warning_with_how_to_get_more():
    result = preflight.check("Standard_NC24ads_A100_v4", 4, "eastus", skus(), quota(region_usages(), 60, 10))
    (warning,) = result.warnings
    assert "50 of 60 free" in warning and "4 x 24 vCPUs" in warning and "needs 96" in warning
    assert "grow to 2 node(s)" in warning and "lowPriorityCores" in warning and preflight.SPOT_QUOTA_DOCS in warning


def test_quota_exactly_enough_is_no_warning():
    assert preflight.check("Standard_NC4as_T4_v3", 3, "eastus", skus(), quota(region_usages(), 12, 0)).warnings == []


def test_no_spot_quota_entry_is_no_claim():
    result = preflight.check("Standard_NC4as_T4_v3", 3, "eastus", skus(), [])
    assert (result.spot_vcpus_free, result.warnings) == (None, [])
