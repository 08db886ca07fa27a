"""Prices from the Retail Prices API (through its local front, tests/support/prices_server.py), eviction-rate
bands from Resource Graph rows, and what node-hours cost. The front answers over HTTP on loopback, so the
client's real request, paging and error handling run."""
from __future__ import annotations

import json
import socket

import pytest

from azext_elastictrain.clients.prices import CACHE_FILE, FAILURE_SECONDS, RetailPrices
from azext_elastictrain.core import prices
from tests.support.prices_server import PricesServer

T4, H200 = "Standard_NC4as_T4_v3", "Standard_ND96isr_H200_v5"


@pytest.fixture
def front(monkeypatch):
    with PricesServer(page_size=3) as server:  # 3 a page: a size's ~20 meters take several pages
        monkeypatch.setenv(prices.PRICES_URL_ENV, server.url)
        yield server
        assert server.violations == []


def test_spot_and_on_demand_are_the_linux_hourly_consumption_meters_across_pages(front, tmp_path):
    found = RetailPrices(tmp_path).price(T4, "eastus")
    # not Windows (0.9468), not Low Priority (0.1052), not dev/test, not a reservation, not the older Spot price,
    # not the Cloud Services meter (0.9994), not the newer $0 placeholder Spot meter
    assert (found.spot, found.on_demand, found.currency, found.error) == (0.0789, 0.526, "USD", None)
    assert len(front.requests) > 1, "the answer spans pages: NextPageLink was followed"
    assert all("%24skip" in r or "$skip" in r for r in front.requests[1:])


def test_the_filter_names_service_region_size_and_consumption():
    assert prices.retail_filter(T4, "EastUS") == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq 'Standard_NC4as_T4_v3' "
        "and priceType eq 'Consumption'")


def test_a_naive_filter_would_mix_windows_and_low_priority_meters(front):
    items = [i for i in front.items if i["armSkuName"] == T4 and i["armRegionName"] == "eastus"]
    spot_named = {i["retailPrice"] for i in items if "Spot" in i["meterName"]}
    assert len(spot_named) > 1, "the catalog has Windows and superseded Spot meters"
    assert prices.hourly_prices(items, T4, "eastus", "USD").spot == 0.0789


def test_cloud_services_and_zero_price_meters_are_not_the_vms_price(front):
    """Both carry the VM's armSkuName and serviceName 'Virtual Machines' (mattrobinsonsre/terrapod#932): the $0
    placeholder is the newest Spot meter, the Cloud Services one has no "Windows" in any name."""
    items = [i for i in front.items if i["armSkuName"] == T4 and i["armRegionName"] == "eastus"]
    assert {i["retailPrice"] for i in items if i["productName"].endswith("Cloud Services")} == {0.9994, 0.19988}
    zero = [i for i in items if i["retailPrice"] == 0]
    assert zero and max(i["effectiveStartDate"] for i in items) == zero[0]["effectiveStartDate"]
    found = prices.hourly_prices(items, T4, "eastus", "USD")
    assert (found.spot, found.on_demand) == (0.0789, 0.526)
    (row,) = prices.spot_offers([__import__("azext_elastictrain.core.aks.preflight", fromlist=["VmSize"]).VmSize(
        T4, 4, 1, True)], {T4.lower(): found}, {}, None)
    assert row["spotSavingPercent"] == 85.0, "not 100 % off a $0 meter"


@pytest.mark.parametrize("typed", ["standard_nc4as_t4_v3", "STANDARD_NC4AS_T4_V3", "Standard_NC4as_T4_v3"])
def test_the_size_is_asked_for_as_resource_skus_spells_it_whatever_the_case(front, tmp_path, typed):
    """Filter values are case-sensitive (the API's page): the front compares exactly, as Azure may."""
    found = RetailPrices(tmp_path).price(typed, "EastUS")
    assert (found.size, found.spot, found.on_demand) == (T4, 0.0789, 0.526)
    assert "Standard_NC4as_T4_v3" in __import__("urllib.parse").parse.unquote(front.requests[0])


def test_every_resource_skus_name_round_trips_through_the_spelling():
    from tests.support.arm_server.compute import region_skus

    names = {sku["name"] for sku in region_skus("eastus")} | {
        "Standard_ND96isr_MI300X_v5", "Standard_E4-2s_v3", "Standard_DS2_v2", "Standard_NV36ads_A10_v5",
        "Standard_NG32ads_V620_v1", "Standard_D2_v2_Promo", "Basic_A0", "Standard_HB176-24rs_v4", "Standard_B2ats_v2"}
    assert len(names) > 10
    for name in names:
        assert prices.arm_size_name(name.lower()) == name, name
        assert prices.arm_size_name(name.upper()) == name, name


def test_a_size_without_a_spot_meter_has_an_unknown_spot_price(front, tmp_path):
    front.drop_spot(H200)
    found = RetailPrices(tmp_path).price(H200, "eastus")
    assert found.spot is None and found.on_demand == 110.24 and found.error is None
    assert found.as_dict()["spotPerHour"] == "unknown"


def test_a_region_with_no_meters_is_unknown_not_an_error(front, tmp_path):
    found = RetailPrices(tmp_path).price(T4, "atlantis")
    assert (found.spot, found.on_demand, found.error) == (None, None, None)


def test_the_currency_is_asked_for_and_a_made_up_one_is_refused_before_any_request(front, tmp_path):
    found = RetailPrices(tmp_path, "eur").price(T4, "westus")
    assert found.currency == "EUR" and found.on_demand == round(0.526 * 1.1 * 0.92, 6)
    assert "currencyCode=%27EUR%27" in front.requests[0]
    asked = len(front.requests)
    with pytest.raises(prices.CurrencyError, match="'XYZ'"):
        RetailPrices(tmp_path, "XYZ")
    assert len(front.requests) == asked


def test_an_error_status_leaves_the_price_unknown_and_is_asked_again_after_a_short_while(front, tmp_path):
    now = [1_000_000.0]
    front.fail_next(500)
    found = RetailPrices(tmp_path, clock=lambda: now[0]).price(T4, "eastus")
    assert found.spot is None and found.error == "the Retail Prices API could not be read: HTTP 500"
    asked = len(front.requests)
    now[0] += 30
    again = RetailPrices(tmp_path, clock=lambda: now[0]).price(T4, "eastus")
    assert len(front.requests) == asked, "a command run again soon does not wait on the API again"
    assert again.spot is None and again.error.startswith("the Retail Prices API could not be read: HTTP 500 (30 s ago")
    now[0] += FAILURE_SECONDS
    assert RetailPrices(tmp_path, clock=lambda: now[0]).price(T4, "eastus").spot == 0.0789, "then asked again"
    assert len(front.requests) > asked


@pytest.mark.parametrize("kind, why", [("truncated", "the answer was cut short or garbled (IncompleteRead)"),
                                       ("status-line", "the answer was cut short or garbled (BadStatusLine)"),
                                       ("not-json", "the answer is not JSON"),
                                       ("not-items", "the answer is not the documented {Items: [...]} object")])
def test_an_answer_cut_short_or_garbled_on_the_wire_is_unknown_not_a_traceback(front, tmp_path, kind, why):
    front.garble_next(kind)
    found = RetailPrices(tmp_path).price(T4, "eastus")
    assert (found.spot, found.on_demand) == (None, None)
    assert found.error == f"the Retail Prices API could not be read: {why}"


def test_prices_are_cached_per_size_and_region_for_a_day(front, tmp_path):
    now = [1_000_000.0]
    client = RetailPrices(tmp_path, clock=lambda: now[0])
    client.prices([T4, H200], "eastus")
    asked = len(front.requests)
    cached = json.loads((tmp_path / CACHE_FILE).read_text())
    assert set(cached) == {"USD/eastus/standard_nc4as_t4_v3", "USD/eastus/standard_nd96isr_h200_v5"}
    now[0] += prices.CACHE_SECONDS - 60
    assert client.price(T4, "eastus").spot == 0.0789 and len(front.requests) == asked
    client.price(T4, "westus")
    assert len(front.requests) > asked, "another region is another cache entry"
    asked = len(front.requests)
    now[0] += 120  # a day old: asked again
    client.price(T4, "eastus")
    assert len(front.requests) > asked


def test_eviction_rates_keep_known_bands_by_lower_case_size():
    rows = [{"skuName": "standard_nc4as_t4_v3", "location": "eastus", "evictionRate": "0-5"},
            {"skuName": "Standard_NC24ads_A100_v4", "location": "eastus", "evictionRate": "20+"},
            {"skuName": "standard_x", "location": "eastus", "evictionRate": "n/a"}]
    assert prices.eviction_rates(rows) == {"standard_nc4as_t4_v3": "0-5", "standard_nc24ads_a100_v4": "20+"}
    query = prices.eviction_rate_query([T4], "EastUS")
    assert "skuspotevictionrate/location" in query and "'standard_nc4as_t4_v3'" in query and "'eastus'" in query


def test_the_latest_spot_price_is_the_price_historys_newest_usd_figure():
    query = prices.spot_price_history_query([T4], "eastus")
    assert "skuspotpricehistory/ostype/location" in query and "properties.osType =~ 'linux'" in query
    assert "todouble(properties.spotPrices[0].priceUSD)" in query
    rows = [{"skuName": "standard_nc4as_t4_v3", "location": "eastus", "latestSpotPriceUSD": 0.0771},
            {"skuName": "standard_x", "location": "eastus", "latestSpotPriceUSD": None}]
    assert prices.latest_spot_prices(rows) == {"standard_nc4as_t4_v3": 0.0771}


def test_job_cost_prices_node_hours_and_the_saving():
    price = prices.HourlyPrice(T4, "eastus", "USD", spot=0.1, on_demand=0.5)
    cost = prices.job_cost({"Spot": 10.0}, 8.0, price)
    assert (cost["cost"], cost["onDemandCost"], cost["saved"], cost["savedPercent"]) == (1.0, 5.0, 4.0, 80.0)
    assert cost["costPerGoodputHour"] == 0.125


def test_job_cost_with_an_unknown_price_says_unknown():
    price = prices.HourlyPrice(H200, "eastus", "USD", spot=None, on_demand=110.24)
    cost = prices.job_cost({"Spot": 2.0}, 1.0, price)
    assert cost["cost"] == cost["saved"] == cost["costPerGoodputHour"] == "unknown"
    assert cost["onDemandCost"] == 220.48


def test_the_tables_put_prices_and_cost_at_a_glance():
    from azext_elastictrain._format import job_show_table, sku_list_table
    from azext_elastictrain.core.aks.preflight import VmSize

    sizes = [VmSize("Standard_ND96isr_H100_v5", 96, 8, True), VmSize(H200, 96, 8, True), VmSize(T4, 4, 1, True)]
    rows = prices.spot_offers(sizes, {
        "standard_nd96isr_h100_v5": prices.HourlyPrice("Standard_ND96isr_H100_v5", "eastus", "USD", 19.664, 98.32),
        H200.lower(): prices.HourlyPrice(H200, "eastus", "USD", None, 110.24),
        T4.lower(): prices.HourlyPrice(T4, "eastus", "USD", 0.0789, 0.526)}, {T4.lower(): "0-5"}, 100)
    assert [r["name"] for r in rows] == [T4, "Standard_ND96isr_H100_v5", H200], "per GPU; unknown last"
    table = sku_list_table(rows)
    assert list(table[0].values()) == [T4, 1, 4, "0.0789", "0.5260", "0.0789", "85%", "0-5%", 25, "USD"]
    assert (table[1]["SpotPerGpuHour"], table[1]["EvictionRate"]) == ("2.4580", "unknown")
    assert (table[2]["SpotPerHour"], table[2]["SpotSaving"]) == ("unknown", "unknown")
    cost = prices.job_cost({"Spot": 2.0}, 1.0, prices.HourlyPrice(T4, "eastus", "USD", 0.0789, 0.526))
    (row,) = job_show_table({"name": "cifar", "state": "Succeeded", "cost": cost})
    assert (row["Cost"], row["SavedVsOnDemand"]) == ("0.157800 USD", "85%")
    assert "Cost" not in job_show_table({"name": "cifar", "state": "Succeeded"})[0]
