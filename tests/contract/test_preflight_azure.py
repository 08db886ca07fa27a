"""The region preflight of 'az elastictrain cluster create -g' through the real az against the ARM test server.

The server answers Resource SKUs and Usage from the official examples extended with GPU sizes; a test
changes what one region offers and checks, from the server's request log, that a refusal comes before any PUT.
"""
from __future__ import annotations

import json

import pytest

from tests.contract.conftest import CLOUD, AzureAz

SKUS = "/providers/microsoft.compute/skus"
USAGES = "/providers/microsoft.compute/locations/eastus/usages"


def _puts(arm) -> list[str]:
    return [path for method, path in arm.requests if method == "PUT"]


def _asked_the_region(requests: list[tuple[str, str]]) -> bool:
    paths = [path.split("?")[0].lower() for method, path in requests if method == "GET"]
    return any(p.endswith(SKUS) for p in paths) and any(p.endswith(USAGES) for p in paths)


def _not_offered(arm, size):
    arm.skus["eastus"] = [s for s in arm.skus["eastus"] if s["name"] != size]


def _no_spot(arm, size):
    caps = arm.sku("eastus", size)["capabilities"]
    next(c for c in caps if c["name"] == "LowPriorityCapable")["value"] = "False"


def _restricted(arm, size):
    arm.sku("eastus", size)["restrictions"] = [{
        "type": "Location", "values": ["eastus"], "restrictionInfo": {"locations": ["eastus"]},
        "reasonCode": "NotAvailableForSubscription"}]


@pytest.mark.parametrize("change, expected", [
    (_not_offered, "is not offered in region 'eastus'"),
    (_no_spot, "cannot run as Spot in region 'eastus'"),
    (_restricted, "is not available to this subscription in this region"),
])
def test_a_size_the_region_cannot_run_as_spot_is_refused_before_any_put(az, arm, group, change, expected):
    change(arm, "Standard_NC24ads_A100_v4")
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "pre1", "-l", "eastus",
                "--gpu-vm-size", "Standard_NC24ads_A100_v4", check=False)
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "--gpu-vm-size with a Spot-capable GPU size of eastus" in result.stderr
    assert "Standard_ND96isr_H200_v5" in result.stderr, "it names sizes that are Spot-capable GPU sizes there"
    assert _asked_the_region(arm.requests) and _puts(arm) == [], "the refusal must come before anything is created"


def test_a_current_size_is_accepted_and_short_spot_quota_is_a_warning_and_create_goes_on(az, arm, group):
    arm.expect.update(gpu_vm_size="Standard_ND96isr_H200_v5", max_count=2)
    arm.spot_quota("eastus").update(limit=100, currentValue=4)
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "pre2", "-l", "eastus",
                "--gpu-vm-size", "Standard_ND96isr_H200_v5", "--max-count", "2", "-o", "json", timeout=300)
    assert "WARNING: Spot vCPU quota in eastus is short: 96 of 100 free" in result.stderr
    assert "2 x 96 vCPUs" in result.stderr and "grow to 1 node(s)" in result.stderr
    pool = arm.find(f"/resourcegroups/{group}/providers/microsoft.containerservice/managedclusters/pre2/agentpools/gpu")
    assert pool["properties"]["vmSize"] == "Standard_ND96isr_H200_v5"
    first_put = next(i for i, (method, _) in enumerate(arm.requests) if method == "PUT")
    assert _asked_the_region(arm.requests[:first_put]), "the region checks come before the first PUT"


def test_a_dry_run_with_a_login_runs_the_region_checks_with_gets_only(az, arm, group):
    plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "pre3", "-l", "eastus", "--dry-run",
                   "--gpu-vm-size", "Standard_ND96isr_H200_v5", "--max-count", "1")
    on_host = {"osDiskType": "Ephemeral", "osDiskSizeGB": 128, "encryptionAtHost": True}
    plan["preflight"].pop("spotMarket")  # test_the_preflight_shows_prices_and_band_and_warns_of_a_low_max_price
    assert plan["preflight"] == {"location": "eastus", "gpuVmSize": "Standard_ND96isr_H200_v5", "vCPUs": 96,
                                 "spotVcpusNeeded": 96, "spotVcpusFree": 100, "warnings": [],
                                 "hardware": {"system": on_host, "gpu": on_host}}
    assert arm.writes() == [] and _asked_the_region(arm.requests)  # and the storage name's check (a POST that reads)


def test_a_dry_run_refuses_what_create_would(az, arm, group):
    _no_spot(arm, "Standard_NC4as_T4_v3")
    result = az("elastictrain", "cluster", "create", "-g", group, "-n", "pre4", "-l", "eastus", "--dry-run",
                check=False)
    assert result.returncode != 0 and "cannot run as Spot" in result.stderr and "Traceback" not in result.stderr


def test_a_dry_run_without_a_login_skips_the_region_checks_and_says_so(arm, arm_server, group, tmp_path):
    signed_out = AzureAz(tmp_path / "az-signed-out", arm_server)
    url = arm_server.url + "/"
    signed_out("cloud", "register", "--name", CLOUD, "--endpoint-resource-manager", url,
               "--endpoint-active-directory", url, "--endpoint-active-directory-resource-id", url,
               "--endpoint-active-directory-graph-resource-id", url, "--endpoint-management", url,
               "--suffix-storage-endpoint", "core.windows.net", "--skip-endpoint-discovery")
    signed_out("cloud", "set", "--name", CLOUD)
    arm.requests.clear()
    result = signed_out("elastictrain", "cluster", "create", "-g", group, "-n", "pre5", "-l", "eastus",
                        "--dry-run", "--gpu-vm-size", "Standard_ND96isr_H200_v5", "-o", "json")
    assert "Not logged in: the region preflight is skipped" in result.stderr
    plan = json.loads(result.stdout)
    assert "not logged in" in plan["preflight"]["skipped"]
    assert len(plan["arm"]) == 10 and arm.requests == [], "without a login nothing is asked"
    admin = next(r for r in plan["arm"] if r["step"] == "Kubernetes admin role")  # who: known once logged in
    assert admin["body"]["properties"]["principalId"].startswith("<object id of the signed-in identity")


def test_the_preflight_shows_prices_and_band_and_warns_of_a_low_max_price(az, arm, group):
    """The GPU size's Spot and on-demand price (Retail Prices front) and eviction band (Resource Graph) in the dry
    run and in create's progress; a --max-price below the Spot price is a warning (the pool would get no node)."""
    from azext_elastictrain.clients.prices import CACHE_FILE
    from azext_elastictrain.core.prices import PRICES_URL_ENV
    from tests.support.prices_server import PricesServer

    (az.config_dir / CACHE_FILE).unlink(missing_ok=True)
    with PricesServer() as front:
        env = {PRICES_URL_ENV: front.url}
        plan = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "pre6", "-l", "eastus", "--dry-run",
                       env=env)
        market = plan["preflight"]["spotMarket"]
        assert (market["vmSize"], market["spotPerHour"], market["onDemandPerHour"], market["currency"],
                market["evictionRate"]) == ("Standard_NC4as_T4_v3", 0.0789, 0.526, "USD", "0-5")
        assert plan["preflight"]["warnings"] == []
        low = az("elastictrain", "cluster", "create", "-g", group, "-n", "pre6", "-l", "eastus", "--dry-run",
                 "--max-price", "0.05", "-o", "json", env=env)
        assert "Standard_NC4as_T4_v3 in eastus: Spot 0.0789 USD/hour, on-demand 0.526 USD/hour, eviction rate " \
               "0-5% (last 28 days)" in low.stderr, low.stderr
        warning = "--max-price 0.05 is below the current Spot price of Standard_NC4as_T4_v3 in eastus (0.0789 USD/hour)"
        assert warning in low.stderr and warning in json.loads(low.stdout)["preflight"]["warnings"][0]
        assert front.violations == []
    (az.config_dir / CACHE_FILE).unlink(missing_ok=True)
    offline = az.json("elastictrain", "cluster", "create", "-g", group, "-n", "pre6", "-l", "eastus", "--dry-run",
                      "--max-price", "0.05", env={PRICES_URL_ENV: "http://127.0.0.1:9/api/retail/prices"})
    market = offline["preflight"]["spotMarket"]
    assert market["spotPerHour"] == "unknown" and "could not be read" in market["priceError"]
    assert offline["preflight"]["warnings"] == [], "an unknown price warns of nothing and blocks nothing"


def test_the_preflight_prices_a_size_typed_in_any_case_and_says_when_the_band_cannot_be_had(az, arm, group):
    """The Retail Prices API compares filter values case-sensitively: a size typed in other casing is priced as
    Resource SKUs spells it. A size Resource Graph has no band for is "unknown" with a warning saying so."""
    from azext_elastictrain.clients.prices import CACHE_FILE
    from azext_elastictrain.core.prices import PRICES_URL_ENV
    from tests.support.prices_server import PricesServer

    (az.config_dir / CACHE_FILE).unlink(missing_ok=True)
    del arm.spot_eviction_rates["eastus"]["standard_nc4as_t4_v3"]
    with PricesServer() as front:
        result = az("elastictrain", "cluster", "create", "-g", group, "-n", "pre7", "-l", "eastus", "--dry-run",
                    "--gpu-vm-size", "Standard_nc4as_t4_v3", "-o", "json", env={PRICES_URL_ENV: front.url})
        assert front.violations == []
    market = json.loads(result.stdout)["preflight"]["spotMarket"]
    assert (market["vmSize"], market["spotPerHour"], market["onDemandPerHour"], market["evictionRate"]) == (
        "Standard_NC4as_T4_v3", 0.0789, 0.526, "unknown")
    warning = ("The eviction rate of Standard_NC4as_T4_v3 in eastus is unknown: Resource Graph has no Spot "
               "eviction-rate band for Standard_NC4as_T4_v3 in eastus")
    assert warning in result.stderr and warning in json.loads(result.stdout)["preflight"]["warnings"][0]
